// One statement of the ledger on what a Ledger was given (a pg Client or
// PoolClient, or a pg.Pool), with the notices the server sent on it and the
// transaction status of the connection right after it.

import { collectNotices, ledgerNotice } from './notices.js';
import { LedgerError } from './errors.js';
import { named } from './sqlstates.js';

/**
 * A node-postgres Client, PoolClient or Pool: anything with query().  A pg.Pool serves
 * token leases only (each query may run on another connection).
 * @typedef {object} Queryable
 * @property {(text: string, values?: unknown[]) => Promise<{rows: any[]}>} query
 * @property {() => string | null} [getTransactionStatus]  pg >= 8.21: 'I' idle, 'T' in a
 *   transaction, 'E' in a failed transaction
 */

/**
 * What a statement's notices are told about the call: the ledger function, and what the
 * client knows of the call.
 * @typedef {{statement?: string, run?: string|null, tool?: string|null, key?: string|null}} CallInfo
 */

/**
 * Marks an error thrown because a ledger statement ran inside a transaction
 * that something else opened on the Ledger's connection: the statement did not
 * commit (it goes with that transaction).
 */
export const notCommitted = Symbol('notCommitted');

/**
 * Marks an error of the COMMIT of a transaction(): true, or 'rolled back' when the
 * server answered the COMMIT with ROLLBACK (the transaction had failed).
 */
export const commitSent = Symbol('commitSent');

/**
 * A statement inside a transaction(): its rows.
 * @typedef {(text: string, values?: unknown[], call?: CallInfo) => Promise<any[]>} InTransaction
 */

/**
 * A pg.Pool: each query() may run on another connection.
 * @param {any} q
 * @returns {boolean}
 */
export function isPool(q) {
  return typeof q.connect === 'function' && typeof q.totalCount === 'number';
}

/**
 * A transaction status that says the last statement did not commit on its own.
 * @param {string|null} status
 */
function inTransaction(status) {
  return status === 'T' || status === 'E';
}

/**
 * q.query(text, values), its errors as named() makes them.
 * @param {Queryable} q
 * @param {string} text
 * @param {unknown[]} values
 */
async function ledgerQuery(q, text, values) {
  try {
    return await q.query(text, values);
  } catch (err) {
    throw named(err);
  }
}

/** The statements of one Ledger on its client. */
export class Connection {
  /**
   * @param {Queryable} client
   * @param {(notice: import('./notices.js').LedgerNotice) => void} notify  hears every notice
   *   of a statement, once the statement has answered
   */
  constructor(client, notify) {
    this.client = client;
    this.notify = notify;
  }

  /**
   * @type {Promise<void>|null} the end of a transaction() that holds the single client.
   * Waited for in a loop written out where it is needed (`while (this.#held) await
   * this.#held`): with no transaction, that goes on without yielding, so that the
   * statement is queued on the client before anything else can claim it.
   */
  #held = null;

  /**
   * One statement of the ledger, and the transaction status of its connection
   * right after its own reply ('I' idle, 'T' inside a transaction, 'E' inside
   * a failed one; null when the connection cannot tell).  On a pg.Pool the
   * statement runs on a client checked out for it alone.  On a single client,
   * node-postgres runs queued queries one at a time, and the status read right
   * after the reply is the one of this statement's ReadyForQuery (the next
   * queued query's reply comes in a later I/O event).
   * @param {string} text
   * @param {unknown[]} [values]
   * @param {CallInfo} [call]
   * @returns {Promise<{rows: any[], status: string|null}>}
   */
  async query(text, values, call = {}) {
    const q = /** @type {any} */ (this.client);
    values = values ?? [];
    if (isPool(q)) {
      const c = await q.connect();
      let res;
      const heard = collectNotices(c, values); // on this checked-out client, for this statement alone
      try {
        res = await c.query(text, values);
      } catch (err) {
        heard.close();
        c.release(err); // like pool.query(): a client that failed a query is not reused
        this.#notices(heard.notices, call, null);
        throw named(err);
      }
      heard.close();
      const status = typeof c.getTransactionStatus === 'function' ? c.getTransactionStatus() : null;
      // A client that came back from the pool inside a transaction (someone
      // released it mid-transaction) is closed, which rolls that transaction
      // back, and this statement with it.
      c.release(inTransaction(status) ? new Error('a pooled client was inside a transaction') : undefined);
      this.#notices(heard.notices, call, res.rows[0]);
      return { rows: res.rows, status };
    }
    while (this.#held) await this.#held;
    const heard = collectNotices(q, values);
    let res;
    try {
      res = await ledgerQuery(q, text, values);
    } catch (err) {
      heard.close();
      this.#notices(heard.notices, call, null);
      throw err;
    }
    const status = typeof q.getTransactionStatus === 'function' ? q.getTransactionStatus() : null;
    heard.close();
    this.#notices(heard.notices, call, res.rows[0]);
    return { rows: res.rows, status };
  }

  /**
   * fn(tx, client) in one transaction on one connection: committed when fn
   * resolves, rolled back when it throws.  tx(text, values, call) runs a
   * statement in it (its rows, its errors named); `client` is the connection,
   * for the caller's own SQL.  On a pg.Pool the transaction has a client
   * checked out for it (one that broke is not reused); on a single client the
   * Ledger's other statements wait for its end.  An error of the COMMIT is
   * marked [commitSent]; so is a COMMIT the server answered with ROLLBACK (the
   * transaction had failed).
   * @template T
   * @param {(tx: InTransaction, client: any) => Promise<T>} fn
   * @returns {Promise<T>}
   */
  async transaction(fn) {
    const q = /** @type {any} */ (this.client);
    /** @type {any} */
    let c;
    /** @type {(err?: unknown) => void} */
    let release;
    if (isPool(q)) {
      c = await q.connect();
      release = (err) => c.release(err);
    } else {
      while (this.#held) await this.#held;
      c = q;
      /** @type {() => void} */
      let end = () => {};
      this.#held = new Promise((resolve) => { end = resolve; });
      release = () => {
        this.#held = null;
        end();
      };
    }
    /** @type {InTransaction} */
    const tx = async (text, values = [], call = {}) => {
      const heard = collectNotices(c, values);
      let res;
      try {
        res = await ledgerQuery(c, text, values);
      } finally {
        heard.close();
        this.#notices(heard.notices, call, res?.rows[0] ?? null);
      }
      return res.rows;
    };
    /** @type {unknown} */
    let broke;
    try {
      await ledgerQuery(c, 'BEGIN', []);
      let value;
      try {
        value = await fn(tx, c);
      } catch (err) {
        await c.query('ROLLBACK').catch((/** @type {unknown} */ e) => { broke = e; });
        throw err;
      }
      let res;
      try {
        res = await c.query('COMMIT');
      } catch (err) {
        broke = err;
        const e = /** @type {any} */ (named(err));
        e[commitSent] = true;
        throw e;
      }
      if (res.command === 'ROLLBACK') {
        const e = new LedgerError('the transaction had failed: its COMMIT rolled it back, and nothing of it ' +
          'was recorded', { reason: 'the COMMIT rolled the transaction back' });
        /** @type {any} */ (e)[commitSent] = 'rolled back';
        throw e;
      }
      return value;
    } finally {
      release(broke);
    }
  }

  /**
   * Passes on the notices the server sent on one statement: `call` says what
   * the ledger knows of it ({statement, run, tool, key}); a begin's key is its
   * decision row's.
   * @param {any[]} messages
   * @param {CallInfo} call
   * @param {any} row
   */
  #notices(messages, call, row) {
    for (const msg of messages) {
      const key = call.key ?? (typeof row?.key === 'string' ? row.key : null);
      this.notify(ledgerNotice(msg, { ...call, key }));
    }
  }

  /**
   * query(), refusing a statement that ran inside a transaction something else
   * opened on the connection: it did not commit.  `what` names it in the error.
   * @param {string} what
   * @param {string} text
   * @param {unknown[]} values
   * @param {CallInfo} call
   * @returns {Promise<any[]>} the rows
   */
  async statement(what, text, values, call) {
    const { rows, status } = await this.query(text, values, call);
    if (inTransaction(status)) {
      const err = new LedgerError(
        `${what} ran inside a transaction that something else opened on this Ledger's connection ` +
          `(transaction status ${status}): it is not committed, it goes with that transaction.  ` +
          'The connection given to a Ledger must be dedicated to it: tools must not run their own ' +
          'transactions on it (give the Ledger a pg.Pool, or the tools a client of their own).',
        { reason: 'the ledger statement ran inside another transaction' });
      /** @type {any} */ (err)[notCommitted] = true;
      throw err;
    }
    return rows;
  }

  /**
   * Refuses to begin an effect inside an open transaction: the intent must be
   * committed before the effect is performed.  (A pg.Pool runs every query on an
   * idle connection, outside any transaction.)  A transaction opened by a query
   * still queued on the client is not seen here; statement() finds it after
   * begin_effect's reply.
   */
  async assertNoOpenTransaction() {
    const c = this.client;
    if (isPool(c)) return;
    let open;
    if (typeof c.getTransactionStatus === 'function') {
      open = inTransaction(c.getTransactionStatus());
    } else {
      // In autocommit, a statement's transaction starts with the statement.
      const { rows } = await c.query('SELECT now() <> statement_timestamp() AS in_transaction');
      open = rows[0].in_transaction;
    }
    if (open) {
      throw new LedgerError(
        'guarded() must not run inside an open transaction: the intent has to be committed ' +
          'before the effect is performed.  COMMIT or ROLLBACK first, or call ' +
          'durable_ledger.begin_effect yourself if the effect is a write in the same transaction.'
      );
    }
  }
}
