// The server's WARNINGs and NOTICEs of ledger statements, for the application.
//
// node-postgres emits 'notice' on the client that received one.  A Ledger
// listens on a client only while one of its statements is out on it (on a
// pg.Pool: on the client checked out for the statement), so no listener is
// left behind, and it attributes each notice to its own statement: on one
// client, statements run one at a time in the order they were queued, so a
// notice belongs to the ledger statement that node-postgres is running
// (told by the query's values, when the client says which query is active),
// else to the oldest one still out.  The Ledger passes the notices of a
// statement on when the statement has answered, with what it knows of the call
// (run, tool, key: for a begin, the key of the decision row).

/**
 * What the ledger's 'notice' event carries: a WARNING or NOTICE the server sent on one
 * of the Ledger's statements (origin 'server'), or one the client itself must give
 * (origin 'client': a session lock it could not end, code 42501).
 * @typedef {object} LedgerNotice
 * @property {'server' | 'client'} origin
 * @property {string | null} severity  'WARNING', 'NOTICE', ...
 * @property {string | null} code  the SQLSTATE: 01L01 divergence (warn), 01L02 unregistered
 *   tool (warn), 01L03 conflict, 01L04 superseded report
 * @property {string} message
 * @property {string | null} detail
 * @property {string | null} hint
 * @property {string | null} statement  the ledger function of the statement: begin_effect,
 *   begin_recorded, complete_effect, fail_effect, ...
 * @property {string | null} run
 * @property {string | null} tool
 * @property {string | null} key  the call's own key (a begin's decision row), or the reported
 *   effect's; null when not known
 * @property {string | null} [mayDuplicate]  with code 01L01, the effect that the call may
 *   duplicate (named in the DETAIL)
 * @property {number} [pid]  origin 'client', 42501: the backend that still holds the
 *   attempt's session lock
 * @property {number} [epoch]  origin 'client', 42501: the epoch of that lease
 */

/** The SQLSTATEs of the ledger's own WARNINGs (extension 1.3), as LedgerNotice.code. */
export const NOTICE_CODES = Object.freeze({
  /** a call executed although it diverges from the run's earlier attempts (divergence policy `warn`) */
  DIVERGENCE: '01L01',
  /** a call of a tool nobody registered (set_unregistered_tools('warn')) */
  UNREGISTERED: '01L02',
  /** a report kept as a conflict, the effect flagged for a person */
  CONFLICT: '01L03',
  /** a report kept as superseded (a recorded call made again; nobody is needed) */
  SUPERSEDED: '01L04',
});

const MAY_DUPLICATE = /may duplicate effect "([0-9a-f]{64})"/;

/**
 * A client that emits node-postgres' 'notice' (a pg Client or PoolClient).
 * @typedef {{on: Function, removeListener: Function, _getActiveQuery?: () => any}} NoticeSource
 */

/** Listens on one client for the ledger statements out on it. */
class Router {
  /** @param {NoticeSource} client */
  constructor(client) {
    this.client = client;
    /** @type {Array<{values: unknown[], notices: any[]}>} oldest first */
    this.pending = [];
    /** @param {any} msg */
    this.listener = (msg) => this.route(msg);
  }

  /** @param {unknown[]} values */
  open(values) {
    const entry = { values, notices: [] };
    if (this.pending.length === 0) this.client.on('notice', this.listener);
    this.pending.push(entry);
    return entry;
  }

  /** @param {{values: unknown[], notices: any[]}} entry */
  close(entry) {
    const i = this.pending.indexOf(entry);
    if (i >= 0) this.pending.splice(i, 1);
    if (this.pending.length === 0) {
      this.client.removeListener('notice', this.listener);
      routers.delete(this.client);
    }
  }

  /** @param {any} msg */
  route(msg) {
    /** @type {{values: unknown[], notices: any[]} | undefined} */
    let target = this.pending[0];
    // node-postgres' active query, where it tells (pg 8): its values are the very
    // array the ledger passed; a notice of any other query is not the ledger's
    const active = typeof this.client._getActiveQuery === 'function' ? this.client._getActiveQuery() : undefined;
    if (active !== undefined) target = this.pending.find((e) => active && e.values === active.values);
    target?.notices.push(msg);
  }
}

/** @type {WeakMap<object, Router>} */
const routers = new WeakMap();

/**
 * Starts collecting the notices of one statement on `client` (its `values`
 * array identifies it); returns {notices, close()}: close() when the statement
 * has answered or failed.  A client that emits no events collects nothing.
 * @param {any} client
 * @param {unknown[]} values
 * @returns {{notices: any[], close: () => void}}
 */
export function collectNotices(client, values) {
  if (!client || typeof client.on !== 'function' || typeof client.removeListener !== 'function') {
    return { notices: [], close() {} };
  }
  let router = routers.get(client);
  if (!router) {
    router = new Router(client);
    routers.set(client, router);
  }
  const entry = router.open(values);
  return { notices: entry.notices, close: () => router.close(entry) };
}

/**
 * The structured notice for a node-postgres NoticeMessage of a ledger
 * statement.  `call` says what the ledger knows of the call: {statement, run,
 * tool, key}.
 * @param {any} msg
 * @param {{statement?: string|null, run?: string|null, tool?: string|null, key?: string|null}} [call]
 * @returns {LedgerNotice}
 */
export function ledgerNotice(msg, call = {}) {
  const detail = msg.detail ?? null;
  /** @type {LedgerNotice} */
  const notice = {
    origin: 'server',
    severity: msg.severity ?? null,
    code: msg.code ?? null,
    message: msg.message ?? '',
    detail,
    hint: msg.hint ?? null,
    statement: call.statement ?? null,
    run: call.run ?? null,
    tool: call.tool ?? null,
    key: call.key ?? null,
  };
  if (notice.code === NOTICE_CODES.DIVERGENCE) {
    notice.mayDuplicate = detail?.match(MAY_DUPLICATE)?.[1] ?? null;
  }
  return notice;
}

/**
 * One line for console.warn.
 * @param {LedgerNotice} n
 */
export function formatNotice(n) {
  const about = [n.run && `run ${n.run}`, n.tool && `tool ${n.tool}`, n.key && `key ${n.key}`]
    .filter(Boolean).join(', ');
  const parts = [`durable_ledger ${n.severity ?? 'NOTICE'}${n.code ? ` ${n.code}` : ''}: ${n.message}`];
  if (about) parts[0] += ` (${about})`;
  if (n.detail) parts.push(`DETAIL: ${n.detail}`);
  if (n.hint) parts.push(`HINT: ${n.hint}`);
  return parts.join('  ');
}
