// durable-ledger: the Node.js client of the durable_ledger PostgreSQL extension.
//
// Every side effect goes through begin_effect (the intent is recorded and
// committed before the effect), then complete_effect or fail_effect.  The
// extension decides; this module only turns its decisions into control flow:
//
//   execute      -> perform(downstream_key), then complete_effect(key, result, attempt) -> result
//   replay       -> the recorded result (or EffectFailed for a recorded failure)
//   pause        -> EffectPaused   (an earlier attempt's outcome is unknown)
//                   DivergencePausedError, an EffectPaused (status null: the
//                   call diverges from the run's earlier attempts)
//   in_progress  -> EffectInProgress (another live lease is performing it)
//   55L02        -> RunAbandonedError (a person abandoned the run)
//   55L03        -> ToolRefusedError  (a retired or unregistered tool)
//
// Unknown outcomes are never guessed: an error from perform() that is not an
// EffectDidNotHappen leaves the effect "started", and the next attempt pauses
// until a person resolves it (durable_ledger.resolve_effect).
//
// Every report names the attempt of the effect that begin_effect executed: a
// business key is executed again after a failure (attempt 2, 3, ...), and a
// report must decide the attempt it is about and no other, whichever session
// holds the lease by the time it arrives.
//
// Two kinds of lease keep two workers off one run: a session lease (attempt():
// an advisory lock of the one connection that makes every call of the
// attempt), and a token lease (tokenAttempt(): a row with an expiry, renewed by
// a timer, whose calls may each land on another connection of a pg.Pool, or
// another backend behind PgBouncer in transaction mode).
//
// A call made inside tokenAttempt(run, fn) belongs to that attempt through
// fn's async context (AsyncLocalStorage), not through a lookup by run: a
// branch of fn that outlives the attempt (Promise.all whose other branch
// threw) can never act under the next attempt's token, nor fall back to a
// session lease.  The attempt's end waits for its calls in flight.
//
// A session attempt's begins are made only where its lease is: each statement
// checks, in the database, that it reached the session holding the attempt's
// epoch (session-guard.js); behind a transaction pooler it throws
// PoolerDetected before anything is called, and the attempt's end releases
// the lock where it is held.  The server's WARNINGs and NOTICEs of the
// ledger's statements are emitted as 'notice' events (notices.js).

import { AsyncLocalStorage } from 'node:async_hooks';
import { EventEmitter } from 'node:events';
import { NOTICE_CODES, collectNotices, formatNotice, ledgerNotice } from './notices.js';
import {
  ACQUIRE_ATTEMPT, END_ATTEMPT_ELSEWHERE, RELEASE_ATTEMPT, RELEASE_RUN, guardedBegin, missed,
} from './session-guard.js';

export { NOTICE_CODES };

/**
 * @typedef {object} Queryable  A node-postgres Client, PoolClient or Pool (anything with query()).
 * @property {(text: string, values?: unknown[]) => Promise<{rows: any[]}>} query
 * @property {() => string | null} [getTransactionStatus]  pg >= 8.21: 'I', 'T' or 'E'
 */

/** The SQLSTATE of a lost token lease: expired, released, superseded or unknown. */
export const LEASE_LOST = '55L01';

/** The SQLSTATE of a call of a run that a person abandoned (begin_effect, acquire_run, take_lease). */
export const RUN_ABANDONED = '55L02';

/** The SQLSTATE of a call that would execute a retired tool, or an unregistered one under `refuse`. */
export const TOOL_REFUSED = '55L03';

/** A pg.Pool: each query() may run on another connection. */
function isPool(q) {
  return typeof q.connect === 'function' && typeof q.totalCount === 'number';
}

/**
 * @typedef {object} Decision  A row of durable_ledger.decision.
 * @property {string} key
 * @property {'execute'|'replay'|'pause'|'in_progress'} decision
 * @property {'started'|'completed'|'failed'|'unknown'|null} status  null for a
 *   call paused because it diverges (nothing was recorded for it)
 * @property {number|null} occurrence
 * @property {number|null} attempt  null with a null status
 * @property {unknown} result
 * @property {unknown} error
 * @property {string|null} reason
 * @property {string|null} downstream_key  the key to give the provider: the
 *   effect's key, or a business key's with its attempt ("INV-9#2"); null when
 *   the call has no effect (a divergence pause)
 */

/** Base class of every error this module raises about a ledger decision. */
export class LedgerError extends Error {
  /**
   * @param {string} message
   * @param {{key?: string|null, decision?: string|null, reason?: string|null, cause?: unknown}} [fields]
   */
  constructor(message, { key = null, decision = null, reason = null, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    /** @type {string|null} the effect's idempotency key */
    this.key = key;
    /** @type {string|null} begin_effect's decision that led here */
    this.decision = decision;
    /** @type {string|null} the ledger's one-sentence explanation */
    this.reason = reason;
  }
}

/**
 * The effect is recorded as failed: either perform() threw EffectDidNotHappen
 * just now (replayed = false), or an earlier attempt's recorded failure was
 * replayed (replayed = true).  Nothing happened downstream.  To try again, call
 * again (the next occurrence gets a new key) or start a new run.
 */
export class EffectFailed extends LedgerError {
  /**
   * @param {string} message
   * @param {{key: string, decision: string, reason?: string|null, error?: unknown, replayed: boolean, cause?: unknown}} fields
   */
  constructor(message, { key, decision, reason = null, error = null, replayed, cause }) {
    super(message, { key, decision, reason, cause });
    /** @type {unknown} the recorded error (JSON) */
    this.error = error;
    /** @type {boolean} true when an earlier attempt's failure was replayed */
    this.replayed = replayed;
  }
}

/**
 * begin_effect answered `pause`: an earlier attempt recorded the intent but
 * never reported an outcome (or a contradicting report awaits a person).
 * Stop the run; a person checks the downstream system (asking it about
 * downstreamKey: the key, or key#attempt for a business key) and calls
 * durable_ledger.resolve_effect(key, ...); the next attempt then replays.
 */
export class EffectPaused extends LedgerError {
  /** @param {string} message @param {object} [fields] */
  constructor(message, fields = {}) {
    super(message, fields);
    /** @type {string|null} the key the provider was given; null when not asked */
    this.downstreamKey = fields.downstream_key ?? null;
  }
}

/**
 * begin_effect answered `pause` with no status: this call diverges from the
 * run's earlier attempts.  Its tool is registered with the divergence policy
 * `pause`, this is a later attempt, and the call would have executed (its key
 * is new) while an effect of the tool that an earlier attempt recorded has not
 * been replayed yet: it may be that effect again with drifted arguments (a
 * reworded memo).  Nothing was performed or recorded; the ledger lists it in
 * durable_ledger.unresolved (`may_duplicate`, also named in `reason`).
 * It is an EffectPaused, and stops the attempt like any pause.  A person
 * decides with durable_ledger.resolve_divergence(key, 'same' | 'distinct',
 * resolved_by, note): `same` -- the next attempt gets that earlier effect's
 * recorded outcome; `distinct` -- the next attempt executes the call.
 * `key` is the drifted call's own key; `run` and `tool` name the call.
 */
export class DivergencePausedError extends EffectPaused {
  /**
   * @param {string} message
   * @param {{key: string, run: string, tool: string, reason?: string|null, cause?: unknown}} fields
   */
  constructor(message, { key, run, tool, reason = null, cause }) {
    super(message, { key, decision: 'pause', reason, cause });
    /** @type {string} */
    this.run = run;
    /** @type {string} */
    this.tool = tool;
  }
}

/**
 * begin_effect answered `in_progress`: another live lease is performing this
 * very business key right now.  Do not perform it; ask again later.
 */
export class EffectInProgress extends LedgerError {}

/**
 * A guarded call on a run whose current attempt already hit an unknown
 * outcome (perform threw something other than EffectDidNotHappen) or a pause.
 * Continuing in the same attempt would be unsafe: the ledger counts a repeated
 * call as the next occurrence, with a new key, so a retry would execute again.
 * End the attempt; start a new one (acquireRun, or attempt()) when it has been
 * resolved.  `key` is the effect that stopped the run.
 */
export class RunStopped extends LedgerError {}

/**
 * A person abandoned the run (durable_ledger.abandon_run): SQLSTATE 55L02 from
 * begin_effect, acquire_run or take_lease.  Nothing was performed or written.
 * The attempt stops (every further call of it throws this again without asking
 * the database), and a new attempt (attempt(), acquireRun(), tokenAttempt())
 * throws it at its start.  Do NOT retry the run: it is stopped for good.  Drop
 * the job; to redo part of it, an admin forks it into a new run
 * (durable_ledger.fork_run), and that run is what gets retried.  `run` names
 * the run; `key` and `decision` are null; `cause` is the server's error.
 */
export class RunAbandonedError extends LedgerError {
  /**
   * @param {string} message
   * @param {{run: string, reason?: string|null, cause?: unknown}} fields
   */
  constructor(message, { run, reason = null, cause }) {
    super(message, { key: null, decision: null, reason: reason ?? message, cause });
    /** @type {string} */
    this.run = run;
  }
}

/**
 * The ledger refuses to execute the tool: SQLSTATE 55L03 from begin_effect.
 * The tool is retired (durable_ledger.retire_tool), or nobody registered it and
 * the database runs with the ledger refuses tools nobody registered (set_unregistered_tools('refuse', ...)).  Nothing
 * was recorded or performed.  The attempt stops (the run cannot make this
 * call): further calls of it throw RunStopped.  An admin registers the tool
 * (again), or the run is changed; then a new attempt may go on.  What a
 * retired tool recorded earlier still replays.  `run` and `tool` name the
 * call; `key` and `decision` are null; `cause` is the server's error.
 */
export class ToolRefusedError extends LedgerError {
  /**
   * @param {string} message
   * @param {{run: string, tool: string, reason?: string|null, cause?: unknown}} fields
   */
  constructor(message, { run, tool, reason = null, cause }) {
    super(message, { key: null, decision: null, reason: reason ?? message, cause });
    /** @type {string} */
    this.run = run;
    /** @type {string} */
    this.tool = tool;
  }
}

/**
 * Another worker holds the run: tokenAttempt() found it held by a live lease of
 * either kind (take_lease never waits), or a wait for its lease ended (SQLSTATE
 * 55P03, after lock_timeout, else durable_ledger.lease_wait_timeout, 5 s by
 * default: the message names the holder's backend, application and since when),
 * or a session lease was asked of a run a token lease holds.  Try again later.
 */
export class RunBusy extends LedgerError {
  /** @param {string} message @param {object} [fields] */
  constructor(message, fields = {}) {
    super(message, fields);
    /** @type {string|null} 55P03 when the ledger said so */
    this.sqlstate = fields.sqlstate ?? null;
    /** @type {string|null} the server's detail (who holds the run) */
    this.detail = fields.detail ?? null;
  }
}

/**
 * The ledger refused the statement with a SQLSTATE of its list (README,
 * "Errors"), writing nothing: sqlstate, detail, hint; the pg error is cause.
 */
export class LedgerRefused extends LedgerError {
  /** @param {string} message @param {object} fields */
  constructor(message, { sqlstate, detail = null, hint = null, cause } = {}) {
    super(message, { reason: message, cause });
    /** @type {string} */
    this.sqlstate = sqlstate;
    /** @type {string|null} */
    this.detail = detail;
    /** @type {string|null} */
    this.hint = hint;
  }
}
/** 22004, 22023: a NULL where a value is required, or a value out of its domain. */
export class InvalidArgument extends LedgerRefused {}
/**
 * 23505: a business key begun again with another tool or other args; nothing written.  The same
 * operation with reworded free text (a memo) wants key_fields on its tool (register_tool,
 * change_tool: the call then replays); a new business key would perform it again (the hint says
 * which applies).
 */
export class BusinessKeyConflict extends LedgerRefused {}
/** 42704: the key, tool, run or divergence named is not in the ledger. */
export class NotFound extends LedgerRefused {}
/** 42710: fork_run into a run the ledger has seen. */
export class RunExists extends LedgerRefused {}
/** 55000: not in the state the call needs (also a session lease lost behind the ledger's back). */
export class WrongState extends LedgerRefused {}
/** 40001: a concurrent change under REPEATABLE READ or SERIALIZABLE: retry the call. */
export class ConcurrentChange extends LedgerRefused {}
/** 25006: a writing call on a hot standby or in a read-only transaction. */
export class ReadOnlyLedger extends LedgerRefused {}
/** 53400: more leases in one session than durable_ledger.max_leases_per_session. */
export class TooManyLeases extends LedgerRefused {}
/** 42501: a grant is missing: durable_ledger_worker (calls), durable_ledger_auditor (history), durable_ledger_admin. */
export class PermissionDenied extends LedgerRefused {}

const GRANT_HINT = "The ledger's functions are granted to its roles: durable_ledger_worker " +
  '(begin, complete, fail, effect_status, leases), durable_ledger_auditor (history, the tables and ' +
  'views), durable_ledger_admin (resolve, break_lease, the tools registry, purges); e.g. ' +
  'GRANT durable_ledger_worker TO your_login_role.';

const REFUSALS = {
  '22004': InvalidArgument, '22023': InvalidArgument, '23505': BusinessKeyConflict,
  '42704': NotFound, '42710': RunExists, '55000': WrongState, '40001': ConcurrentChange,
  '25006': ReadOnlyLedger, '53400': TooManyLeases, '42501': PermissionDenied,
};

/**
 * The named error for an error of a ledger statement, or the error itself:
 * RunBusy for 55P03, a LedgerRefused for the ledger's other SQLSTATEs.
 * 55L01-55L03 are left to the callers, which know the run, tool and attempt.
 */
function named(err) {
  const Refusal = err?.code === '55P03' ? RunBusy : REFUSALS[err?.code];
  if (!Refusal) return err;
  // a permission error names no role: say which ones the ledger grants
  const hint = err.hint ?? (Refusal === PermissionDenied ? GRANT_HINT : null);
  const text = [err.message, err.detail, hint].filter(Boolean).join('  ');
  if (Refusal === RunBusy) {
    return new RunBusy(text, { reason: err.message, cause: err, sqlstate: err.code, detail: err.detail ?? null });
  }
  return new Refusal(`${text} (SQLSTATE ${err.code})`,
    { sqlstate: err.code, detail: err.detail ?? null, hint, cause: err });
}

/** q.query(text, values), its errors as named() makes them. */
async function ledgerQuery(q, text, values) {
  try {
    return await q.query(text, values);
  } catch (err) {
    throw named(err);
  }
}

/**
 * The token lease of this attempt is gone: it expired, an admin broke it, or it
 * was released or superseded (SQLSTATE 55L01 from begin_effect or renew_lease).
 * The attempt must stop: from the moment the client knows, every further call of
 * the attempt throws this without asking the database, and tokenAttempt() throws
 * it at its end if fn did not.  Nothing is lost: a call that was in flight had
 * its outcome reported (a report needs no lease), a begin_effect refused with
 * 55L01 wrote nothing, and the next attempt (a new tokenAttempt) replays what
 * was completed.  Another worker may hold the run by now.
 */
export class LeaseLostError extends LedgerError {
  /**
   * @param {string} message
   * @param {{run: string, epoch: number, reason?: string|null, cause?: unknown}} fields
   */
  constructor(message, { run, epoch, reason = null, cause }) {
    super(message, { key: null, decision: null, reason: reason ?? message, cause });
    /** @type {string} the run of the lost attempt */
    this.run = run;
    /** @type {number} the lease epoch (the attempt) that was lost */
    this.epoch = epoch;
  }
}

/**
 * A session attempt (attempt(), acquireRun()) whose statement reached another
 * server connection than the one whose session holds the attempt's lease, or
 * one whose lease of the run another attempt has taken over since: a
 * transaction pooler (PgBouncer with pool_mode = transaction, a pooled
 * endpoint) is between the client and the database, and a session lease
 * cannot work through it.  The call was not made (the database checked in the
 * same statement, before calling): nothing was performed or recorded.  The
 * attempt stops, like on any lost lease: every further call of it throws this
 * again without asking the database; the attempt's end releases its lock where
 * it is held (release_attempt).  Use tokenAttempt() behind a transaction
 * pooler (or connect directly, or through session pooling).  `pid` is the
 * attempt's backend, `reachedPid` the one the statement reached, and
 * `reachedEpoch` the epoch that backend's session holds the run at (null:
 * none).  The same name as the Python client's.
 */
export class PoolerDetected extends LeaseLostError {
  /**
   * @param {string} message
   * @param {{run: string, epoch: number, pid: number, reachedPid: number, reachedEpoch: number|null,
   *          reason?: string|null, cause?: unknown}} fields
   */
  constructor(message, { run, epoch, pid, reachedPid, reachedEpoch = null, reason = null, cause }) {
    super(message, { run, epoch, reason, cause });
    /** @type {number} the backend whose session holds the attempt's lease */
    this.pid = pid;
    /** @type {number} the backend the statement reached */
    this.reachedPid = reachedPid;
    /** @type {number|null} the epoch that backend's session holds the run at; null when none */
    this.reachedEpoch = reachedEpoch;
  }
}

const lose = Symbol('lose');

/**
 * The token attempts a piece of code runs in: tokenAttempt() runs its function
 * with this store extended by its attempt, and every promise, timer and
 * callback created inside inherits it.  The store is an array of Attempt.
 * @type {AsyncLocalStorage<ReadonlyArray<Attempt>>}
 */
const attemptContext = new AsyncLocalStorage();

/**
 * The calls of an attempt in flight (internal), and whether it has ended: a
 * call of it that has not begun when its function settled is refused.
 */
class Calls {
  /** @param {Ledger} ledger @param {string} run */
  constructor(ledger, run) {
    this.ledger = ledger;
    this.run = run;
    /** true once fn has settled: calls not yet begun are refused */
    this.ended = false;
    /** calls past their checks and not yet settled */
    this.inflight = 0;
    /** @type {Array<() => void>} */
    this.waiters = [];
  }

  enter() {
    this.inflight += 1;
  }

  leave() {
    this.inflight -= 1;
    if (this.inflight === 0) {
      for (const wake of this.waiters.splice(0)) wake();
    }
  }

  /** Resolves once no call of the attempt is in flight. */
  idle() {
    if (this.inflight === 0) return Promise.resolve();
    return new Promise((resolve) => this.waiters.push(resolve));
  }
}

/**
 * One token attempt of a Ledger (internal): its lease, its calls, and whether
 * it is stopped (after an unknown outcome, a pause, an abandoned run or a
 * refused tool).
 */
class Attempt extends Calls {
  /** @param {Ledger} ledger @param {TokenLease} lease */
  constructor(ledger, lease) {
    super(ledger, lease.run);
    this.lease = lease;
    /** @type {{key: string|null, reason: string, error: (() => Error)|null}|null} */
    this.stopped = null;
  }
}

/**
 * The session attempts a piece of code runs in: attempt() runs its function
 * with this store extended by its Calls, as tokenAttempt() does with
 * attemptContext.
 * @type {AsyncLocalStorage<ReadonlyArray<Calls>>}
 */
const sessionContext = new AsyncLocalStorage();

/**
 * Marks an error thrown because a ledger statement ran inside a transaction
 * that something else opened on the Ledger's connection: the statement did not
 * commit (it goes with that transaction).
 */
const notCommitted = Symbol('notCommitted');

/**
 * One attempt at a run under a token lease: what tokenAttempt() hands to its
 * function.  `token` is the capability itself (whoever has it acts for the
 * lease); it is a getter, so that logging the lease does not print it.
 */
export class TokenLease {
  #token;
  #controller = new AbortController();

  /** @param {{run: string, token: string, epoch: number, expiresAt: Date, holder: string|null, ttl: number}} fields */
  constructor({ run, token, epoch, expiresAt, holder, ttl }) {
    /** @type {string} */
    this.run = run;
    this.#token = token;
    /** @type {number} the attempt's lease epoch */
    this.epoch = epoch;
    /** @type {Date} the expiry as of the last renewal (the server's clock decides) */
    this.expiresAt = expiresAt;
    /** @type {string|null} */
    this.holder = holder;
    /** @type {number} seconds the lease lives without renewal */
    this.ttl = ttl;
    /** @type {number} renewals that succeeded so far */
    this.renewals = 0;
    /** @type {LeaseLostError|null} why the lease is lost, once it is */
    this.lost = null;
  }

  /** @returns {string} */
  get token() {
    return this.#token;
  }

  /**
   * Aborted (with the LeaseLostError as its reason) when the lease is found
   * lost: pass it to a model call or a fetch so that it stops with the attempt.
   * @returns {AbortSignal}
   */
  get signal() {
    return this.#controller.signal;
  }

  /** Throws LeaseLostError when the lease is known to be lost. */
  check() {
    if (this.lost) {
      throw new LeaseLostError(this.lost.message, {
        run: this.run, epoch: this.epoch, reason: this.lost.reason, cause: this.lost,
      });
    }
  }

  /** Records the loss (once), aborts the signal; returns the LeaseLostError. */
  [lose](err, message) {
    if (!this.lost) {
      const detail = err?.detail ? `: ${String(err.detail).replace(/\.$/, '')}` : '';
      const what = message ?? `${err?.message ?? err} (lease epoch ${this.epoch})${detail}`;
      this.lost = new LeaseLostError(
        `${what}; this attempt stops here, and a new one (tokenAttempt) replays what it completed`,
        { run: this.run, epoch: this.epoch, cause: err ?? undefined });
      this.#controller.abort(this.lost);
    }
    return this.lost;
  }
}

/**
 * Throw this from perform() (or from a tool function) when the downstream API
 * definitively refused the call before changing anything.  `error` (any JSON
 * value) is recorded with fail_effect.  Only throw it when you know nothing
 * happened: any other error means "outcome unknown".
 */
export class EffectDidNotHappen extends Error {
  /**
   * @param {unknown} [error]  JSON-serializable description of the refusal
   * @param {string} [message]
   */
  constructor(error = null, message) {
    super(message ?? `the effect did not happen: ${describe(error)}`);
    this.name = 'EffectDidNotHappen';
    /** @type {unknown} */
    this.error = error;
  }
}

/** JSON text for a jsonb parameter; undefined becomes SQL NULL. */
function jsonParam(value) {
  if (value === undefined) return null;
  return JSON.stringify(value) ?? null;
}

/**
 * The call that begins a call and its parameters (the run is $1):
 * begin_effect, or for a call recorded as safe to redo (record(), never with a
 * business key) begin_recorded; with a token lease's token, or none (the
 * session's lease).
 */
function beginCall(run, tool, args, businessKey, meta, token, recorded) {
  const params = recorded
    ? [run, tool, jsonParam(args), jsonParam(meta)]
    : [run, tool, jsonParam(args), businessKey ?? null, jsonParam(meta)];
  const types = recorded ? ['text', 'text', 'jsonb', 'jsonb'] : ['text', 'text', 'jsonb', 'text', 'jsonb'];
  if (token != null) {
    params.push(token);
    types.push('text');
  }
  const placeholders = types.map((type, i) => `$${i + 1}::${type}`).join(', ');
  return [`durable_ledger.${recorded ? 'begin_recorded' : 'begin_effect'}(${placeholders})`, params];
}

/** beginCall as a statement of its own: SELECT * FROM the call. */
function beginStatement(...call) {
  const [text, params] = beginCall(...call);
  return [`SELECT * FROM ${text}`, params];
}

/** JSON text for a recorded error: falls back to its text when it is not JSON. */
function errorParam(value) {
  if (value instanceof Error) value = { name: value.name, message: value.message };
  try {
    return jsonParam(value);
  } catch {
    return JSON.stringify(String(value));
  }
}

/** The ledger's reason as a sentence ending with a full stop. */
function sentence(text) {
  if (!text) return '';
  return /[.!?]$/.test(text) ? text : `${text}.`;
}

function describe(value) {
  if (typeof value === 'string') return value;
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

// Runs stopped in their current session-lease attempt, per client (a session
// lease belongs to the session, so every Ledger on one client shares this):
// run -> {key, reason, error}: its further calls throw RunStopped, or error()
// when given.  A token attempt keeps its own (Attempt.stopped).
/** @type {WeakMap<object, Map<string, {key: string|null, reason: string, error: (() => Error)|null}>>} */
const stoppedRuns = new WeakMap();

/** The server's message and detail as one sentence. */
function serverMessage(err) {
  const detail = err?.detail ? `: ${String(err.detail).replace(/\.$/, '')}` : '';
  return `${err?.message ?? err}${detail}`;
}

/** RunAbandonedError for a 55L02 refusal of a call of `run`. */
/**
 * A second attempt at a run this Ledger holds (a job delivered twice to one
 * process): a session lease belongs to the one connection and would not keep
 * the two apart; they would count their calls in one epoch.
 */
function attemptAlreadyOpen(run) {
  return new LedgerError(`an attempt at run ${run} is already open in this Ledger: end it (or ` +
    'release the run) before starting another; a second attempt would share its lease epoch');
}

function abandoned(run, err) {
  const reason = serverMessage(err);
  return new RunAbandonedError(
    `${reason} (SQLSTATE 55L02).  This attempt stops here, and the run must not be retried: ` +
      'it is stopped for good.',
    { run, reason, cause: err });
}

/** A transaction status that says the last statement did not commit on its own. */
function inTransaction(status) {
  return status === 'T' || status === 'E';
}

/**
 * A Ledger is an EventEmitter: it emits 'notice' for every WARNING and NOTICE
 * the server sent on one of its statements (see LedgerNotice in index.d.ts),
 * and for what the client itself must warn about (a session lock it could not
 * end).  With no 'notice' listener, it writes them with console.warn, unless
 * constructed with {consoleWarn: false}.
 */
export class Ledger extends EventEmitter {
  /**
   * @param {Queryable} client  a connected pg Client or PoolClient, or a pg.Pool.
   *   A session lease (attempt(), acquireRun()) is a session lock: use the same
   *   client for a whole attempt, and never a connection behind a
   *   transaction-pooling PgBouncer (a statement that reaches another server
   *   connection throws PoolerDetected, before anything is called).  A token
   *   lease (tokenAttempt()) works on any of them: each statement is a
   *   transaction of its own, on whatever connection.  A pg.Pool serves token
   *   leases only.  A single client given to a Ledger must be dedicated to it:
   *   a statement of the ledger queued behind a tool's BEGIN would run inside
   *   the tool's transaction (the ledger then refuses to go on, see guarded()).
   * @param {{consoleWarn?: boolean}} [options]  consoleWarn: false -- notices
   *   nobody listens to are dropped instead of written with console.warn
   */
  constructor(client, { consoleWarn = true } = {}) {
    super();
    if (!client || typeof client.query !== 'function') {
      throw new TypeError('new Ledger(client): client must be a node-postgres Client, PoolClient or Pool');
    }
    this.client = client;
    this.#consoleWarn = consoleWarn;
    if (!stoppedRuns.has(client)) stoppedRuns.set(client, new Map());
    /** @type {Map<string, {key: string|null, reason: string, error: (() => Error)|null}>} */
    this.#stopped = stoppedRuns.get(client);
  }

  #stopped;
  #consoleWarn;
  /**
   * @type {Map<string, {epoch: string|null, pid: number}>} the session attempts
   *   this Ledger started (attempt(), acquireRun()), by run: the epoch of their
   *   lease (bigint, as text) and the backend whose session holds it
   */
  #sessionLeases = new Map();
  /** @type {Map<string, Attempt>} the open token attempts of this Ledger, by run */
  #attempts = new Map();
  /** @type {Map<string, Calls>} runs with an open attempt() */
  #sessions = new Map();
  /** @type {Set<string>} runs whose acquireRun is under way */
  #acquiring = new Set();
  /** @type {Set<string>} runs whose tokenAttempt is taking its lease */
  #opening = new Set();
  /** @type {Set<string>} runs this Ledger holds by an explicit acquireRun() */
  #sessionHeld = new Set();

  /**
   * Stops `run` in its current attempt (the token attempt, or the session's):
   * its further calls throw RunStopped, or `error()` when given.
   */
  #stop(run, key, reason, attempt = null, error = null) {
    if (attempt) {
      attempt.stopped ??= { key, reason, error };
    } else if (!this.#stopped.has(run)) {
      this.#stopped.set(run, { key, reason, error });
    }
  }

  /**
   * #stop for a recorded call (record()), or a side effect's: a recorded
   * call's needs no person (the next attempt replays it or makes it again),
   * which the RunStopped of its further calls says.
   */
  #stopCall(recorded, run, key, reason, attempt) {
    if (!recorded) {
      this.#stop(run, key, reason, attempt);
      return;
    }
    this.#stop(run, key, reason, attempt, () => new RunStopped(
      `run ${run} is stopped in this attempt: ${reason}  End the attempt: no person is needed; a ` +
        'new attempt (attempt() or tokenAttempt()) replays the recorded call or makes it again.',
      { key, decision: null, reason }));
  }

  /** The session attempt (attempt()) of this Ledger at `run` the calling code runs in, if any. */
  #boundSession(run) {
    const store = sessionContext.getStore();
    if (!store) return null;
    for (let i = store.length - 1; i >= 0; i -= 1) {
      if (store[i].ledger === this && store[i].run === run) return store[i];
    }
    return null;
  }

  /** The token attempt of this Ledger at `run` that the calling code runs in, if any. */
  #boundAttempt(run) {
    const store = attemptContext.getStore();
    if (!store) return null;
    for (let i = store.length - 1; i >= 0; i -= 1) {
      if (store[i].ledger === this && store[i].run === run) return store[i];
    }
    return null;
  }

  /** A session lease needs one connection for the whole attempt: not a pool. */
  #sessionOnly(what) {
    if (isPool(this.client)) {
      throw new LedgerError(
        `${what} needs a session lease, which belongs to one connection for the whole attempt; ` +
          'this Ledger was given a pg.Pool: run the attempt in ledger.tokenAttempt(run, fn)');
    }
  }

  /**
   * One statement of the ledger, and the transaction status of its connection
   * right after its own reply ('I' idle, 'T' inside a transaction, 'E' inside
   * a failed one; null when the connection cannot tell).  On a pg.Pool the
   * statement runs on a client checked out for it alone.  On a single client,
   * node-postgres runs queued queries one at a time, and the status read right
   * after the reply is the one of this statement's ReadyForQuery (the next
   * queued query's reply comes in a later I/O event).
   * @returns {Promise<{rows: any[], status: string|null}>}
   */
  async #query(text, values, call = {}) {
    const q = this.client;
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
   * Passes on the notices the server sent on one statement: `call` says what
   * the ledger knows of it ({statement, run, tool, key}); a begin's key is its
   * decision row's.
   */
  #notices(messages, call, row) {
    for (const msg of messages) {
      const key = call.key ?? (typeof row?.key === 'string' ? row.key : null);
      this.#notify(ledgerNotice(msg, { ...call, key }));
    }
  }

  /**
   * Emits 'notice' (a listener that throws does not disturb the ledger: its
   * error becomes a process warning), or, with no listener, console.warn.
   */
  #notify(notice) {
    if (this.listenerCount('notice') > 0) {
      try {
        this.emit('notice', notice);
      } catch (err) {
        process.emitWarning(`a 'notice' listener of durable-ledger threw: ${describe(err?.message ?? err)}`,
          'DurableLedgerWarning');
      }
    } else if (this.#consoleWarn) {
      console.warn(formatNotice(notice));
    }
  }

  /**
   * #query(), refusing a statement that ran inside a transaction something else
   * opened on the connection: it did not commit.  `what` names it in the error.
   */
  async #statement(what, text, values, call) {
    const { rows, status } = await this.#query(text, values, call);
    if (inTransaction(status)) {
      const err = new LedgerError(
        `${what} ran inside a transaction that something else opened on this Ledger's connection ` +
          `(transaction status ${status}): it is not committed, it goes with that transaction.  ` +
          'The connection given to a Ledger must be dedicated to it: tools must not run their own ' +
          'transactions on it (give the Ledger a pg.Pool, or the tools a client of their own).',
        { reason: 'the ledger statement ran inside another transaction' });
      err[notCommitted] = true;
      throw err;
    }
    return rows;
  }

  /**
   * Refuses to begin an effect inside an open transaction: the intent must be
   * committed before the effect is performed.  (A pg.Pool runs every query on an
   * idle connection, outside any transaction.)  A transaction opened by a query
   * still queued on the client is not seen here; #statement() finds it after
   * begin_effect's reply.
   */
  async #assertNoOpenTransaction() {
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

  /**
   * durable_ledger.begin_effect, as is.
   * @param {string} run
   * @param {string} tool
   * @param {unknown} args
   * @param {{businessKey?: string|null, meta?: unknown, lease?: TokenLease|string|null}} [options]
   *   lease: a token lease (or its token): the call belongs to that lease's epoch
   * @returns {Promise<Decision>}
   */
  async beginEffect(run, tool, args, { businessKey = null, meta, lease = null } = {}) {
    const token = lease == null ? null : typeof lease === 'string' ? lease : lease.token;
    const { rows } = await this.#query(...beginStatement(run, tool, args, businessKey, meta, token, false),
      { statement: 'begin_effect', run, tool });
    return rows[0];
  }

  /**
   * begin_effect for guarded(): in the token attempt's epoch when there is one.
   * A lost lease (55L01) stops the attempt; an error that leaves unknown
   * whether the statement committed (the connection broke, a FATAL) stops the
   * run in this attempt: its intent may be recorded under a lease that is
   * still live, and the same call again would be the next occurrence.  So does
   * a begin_effect that ran inside another transaction on the connection:
   * whether its intent is recorded depends on that transaction.
   */
  async #begin(attempt, run, tool, args, businessKey, meta, recorded) {
    const statement = recorded ? 'begin_recorded' : 'begin_effect';
    const call = beginCall(run, tool, args, businessKey, meta, attempt ? attempt.lease.token : null, recorded);
    // A session attempt's call is made only where its lease is (session-guard.js).
    const lease = attempt ? null : this.#sessionLeases.get(run);
    let text;
    let params;
    if (lease) {
      params = [...call[1], lease.epoch];
      text = guardedBegin(call[0], params.length);
    } else {
      [text, params] = [`SELECT * FROM ${call[0]}`, call[1]];
    }
    try {
      const [row] = await this.#statement(`${statement} of ${tool}`, text, params, { statement, run, tool });
      if (lease && row.key === null) throw this.#missedLease(run, lease, row.guard_pid, row.guard_epoch, tool);
      return row;
    } catch (err) {
      if (err instanceof LeaseLostError) throw err;
      if (attempt && err?.code === LEASE_LOST) throw attempt.lease[lose](err);
      if (err?.code === RUN_ABANDONED) {
        // Nothing was written; the run is stopped for good.
        const stopped = abandoned(run, err);
        this.#stop(run, null, stopped.reason, attempt,
          () => new RunAbandonedError(stopped.message, { run, reason: stopped.reason, cause: err }));
        throw stopped;
      }
      if (err?.code === TOOL_REFUSED) {
        // Nothing was recorded; the run cannot make this call, so the attempt stops.
        const reason = serverMessage(err);
        this.#stop(run, null, `the ledger refused tool ${tool} (${reason}); nothing was performed.`, attempt);
        throw new ToolRefusedError(
          `${reason} (SQLSTATE 55L03).  Nothing was recorded or performed; this attempt stops here ` +
            '(the run cannot make this call): an admin registers the tool, then a new attempt may go on.',
          { run, tool, reason, cause: err });
      }
      if (err?.[notCommitted]) {
        this.#stopCall(recorded, run, null, `begin_effect of ${tool} ran inside another transaction on the ` +
          "Ledger's connection; whether its intent is recorded depends on that transaction, and " +
          'the effect was not performed.', attempt);
      } else if (attempt && (err?.sqlstate && err?.cause ? err.cause : err)?.severity !== 'ERROR') {
        // (a named refusal -- named() -- carries the server's error as its cause)
        this.#stopCall(recorded, run, null, `begin_effect of ${tool} failed with the outcome of the statement ` +
          `unknown (${describe(err?.message ?? err)}); a new attempt finds out whether its intent was recorded.`,
        attempt);
      }
      throw err;
    }
  }

  /**
   * A guarded statement of the session attempt at `run` that found no lease of
   * the attempt where it ran (nothing was called): PoolerDetected when it
   * reached another backend, or one whose lease of the run is another
   * attempt's; LeaseLostError when the attempt's own backend lost the lock
   * (DISCARD ALL, pg_advisory_unlock_all(), a pooler's reset).  The attempt
   * stops: its further calls throw the same without asking the database.
   */
  #missedLease(run, lease, pid, epoch, tool) {
    const make = () => {
      const theirs = epoch === null ? null : Number(epoch);
      const mine = lease.epoch === null ? null : Number(lease.epoch);
      if (missed(lease, pid, epoch) === 'pooler') {
        const where = pid !== lease.pid
          ? `reached another server connection (backend ${pid}) than the one whose session holds this ` +
            `attempt's lease (backend ${lease.pid}, epoch ${mine})`
          : `reached the server connection of this attempt's lease (backend ${pid}), whose lease of the run ` +
            `another attempt (epoch ${theirs}) has taken over since this attempt's (epoch ${mine}) began`;
        return new PoolerDetected(
          `run ${run}: ${tool ? `the call of ${tool}` : 'the statement'} ${where}: a transaction pooler ` +
            '(PgBouncer with pool_mode = transaction, or a pooled endpoint) is between this client and the ' +
            'database, and a session lease cannot work through it.  Nothing was performed or recorded, and ' +
            'this attempt stops.  Behind a transaction pooler use ledger.tokenAttempt(run, opts, fn) (or ' +
            'connect directly, or through session pooling).',
          { run, epoch: mine, pid: lease.pid, reachedPid: pid, reachedEpoch: theirs,
            reason: 'a transaction pooler is between the client and the database' });
      }
      return new LeaseLostError(
        `run ${run}: the lease of this attempt (epoch ${mine}) was lost: this session's lock on the run was ` +
          "released behind the ledger's back (DISCARD ALL, pg_advisory_unlock_all() or a pooler resetting the " +
          'connection).  Nothing was performed or recorded, and this attempt stops; a new attempt ' +
          '(ledger.attempt()) replays what it completed.',
        { run, epoch: mine, reason: 'the session lease was lost' });
    };
    const err = make();
    this.#stop(run, null, err.message, null, make);
    return err;
  }

  /**
   * Runs one side effect at most once.
   *
   * Inside tokenAttempt(run, fn) (in fn, or in anything fn started: its async
   * context) the call belongs to that attempt and passes its token.  Once the
   * attempt has ended (fn settled), a call of it that had not begun yet throws
   * LeaseLostError and performs nothing: a branch that outlives its attempt
   * never acts under a later attempt, nor under a session lease.  A call on a
   * run that this Ledger holds by a token attempt, made from outside that
   * attempt's async context, throws LedgerError; so does a call outside any
   * attempt (no implicit lease: every attempt starts with attempt(),
   * tokenAttempt() or acquireRun()), recording and performing nothing.
   * @template T
   * @param {{run: string, tool: string, args: unknown,
   *          perform: (key: string) => T | Promise<T>,
   *          businessKey?: string|null, meta?: unknown}} call
   * @returns {Promise<any>} the result as recorded in the ledger (a JSON round
   *   trip of what perform returned; undefined becomes null), the same on a
   *   first run and on a replay (Recorded<T> in index.d.ts).
   * @throws EffectFailed, EffectPaused (DivergencePausedError for a call that
   *   diverges from the run's earlier attempts), EffectInProgress,
   *   RunAbandonedError (55L02), ToolRefusedError (55L03), RunStopped,
   *   LeaseLostError (PoolerDetected: a session attempt behind a transaction
   *   pooler), LedgerError, or perform's own error.  A pause, an unknown
   *   outcome, an abandoned run and a refused tool stop the attempt: its further
   *   calls throw RunStopped (RunAbandonedError again for an abandoned run).
   */
  async guarded({ run, tool, args, perform, businessKey = null, meta }) {
    if (typeof perform !== 'function') {
      throw new TypeError('guarded(): perform must be a function (key) => result');
    }
    return this.#call('guarded()', { run, tool, args, perform, businessKey, meta, recorded: false });
  }

  /**
   * Makes a call that is harmless to make again -- a model's turn, a read --
   * once per logical action, and returns its result: recorded and replayed
   * like an effect (begin_recorded), so that a replayed run sees the very
   * answers the model gave and makes the same tool calls.  Unlike guarded(),
   * an unknown outcome needs no person: if call() throws (other than
   * EffectDidNotHappen, which records a failure), nothing is recorded and the
   * attempt stops (further calls throw RunStopped, which says so); the next
   * attempt makes the call again (the effect's attempt 2), as it does when
   * the worker dies during the call.  (A retry inside the attempt would act on
   * an answer that the replay, which makes the lost call again first, may not
   * get.)  Never use it for a
   * side effect: a tool registered as side-effecting is refused
   * (ToolRefusedError).  Called inside an attempt, as guarded() is.
   * @template T
   * @param {{run: string, tool: string, args: unknown, call: () => T | Promise<T>,
   *          meta?: unknown}} recorded
   * @returns {Promise<any>} the result as recorded in the ledger
   */
  async record({ run, tool, args, call, meta }) {
    if (typeof call !== 'function') {
      throw new TypeError('record(): call must be a function () => result');
    }
    return this.#call('record()', {
      run, tool, args, perform: () => call(), businessKey: null, meta, recorded: true,
    });
  }

  /** guarded() or record(), in the attempt the call belongs to. */
  async #call(what, { run, tool, args, perform, businessKey, meta, recorded }) {
    const attempt = this.#boundAttempt(run);
    let session = null;
    if (attempt) {
      if (attempt.ended) {
        throw new LeaseLostError(
          `run ${run}: this call belongs to the token attempt of epoch ${attempt.lease.epoch}, which has ` +
            'ended (its function settled while this branch was still running); nothing was begun.  ' +
            'A branch must not outlive its attempt: await every branch (Promise.allSettled), or stop it ' +
            'with lease.signal',
          { run, epoch: attempt.lease.epoch, reason: 'the attempt has ended' });
      }
      attempt.lease.check();
    } else if (this.#attempts.has(run)) {
      throw new LedgerError(
        `${what} on run ${run} was called from outside the token attempt that this Ledger holds on it ` +
          "(not from tokenAttempt()'s function, nor from anything it started): it is not performed.  " +
          'Make the call inside the attempt\'s function.');
    } else {
      this.#sessionOnly(`${what} outside tokenAttempt()`);
      session = this.#boundSession(run);
      if (!session && this.#sessions.has(run)) {
        throw new LedgerError(
          `${what} on run ${run} was called from outside the attempt that this Ledger holds on it ` +
            "(not from attempt()'s function, nor from anything it started): it is not performed.  " +
            'Make the call inside the attempt\'s function.');
      }
      if (session?.ended) {
        throw new LeaseLostError(
          `run ${run}: this call belongs to a session attempt that has ended (its function settled while ` +
            'this branch was still running); nothing was begun.  A branch must not outlive its attempt: ' +
            'await every branch (Promise.allSettled)',
          { run, epoch: null, reason: 'the attempt has ended' });
      }
      if (!session && !this.#sessionHeld.has(run)) {
        throw new LedgerError(
          `${what} on run ${run} outside an attempt: nothing was recorded or performed.  Start each ` +
            'attempt at a run (the first, a retry, a redelivery) with ledger.attempt(run, fn) (or ' +
            'ledger.tokenAttempt(run, opts, fn) on a pool, or acquireRun()): a new attempt replays what an ' +
            'earlier one did, where continuing an attempt it did not start would count the retried calls ' +
            'as new ones and perform them again.');
      }
    }
    const stop = attempt ? attempt.stopped : this.#stopped.get(run);
    if (stop?.error) throw stop.error();
    if (stop) {
      throw new RunStopped(
        `run ${run} is stopped in this attempt: ${stop.reason}  End the attempt; once the ` +
          'effect is resolved, a new attempt (acquireRun, attempt() or tokenAttempt()) replays it.',
        { key: stop.key, decision: null, reason: stop.reason }
      );
    }
    const calls = attempt ?? session;
    calls?.enter();
    try {
      return await this.#guarded(attempt, run, tool, args, perform, businessKey, meta, recorded);
    } finally {
      calls?.leave();
    }
  }

  async #guarded(attempt, run, tool, args, perform, businessKey, meta, recorded) {
    await this.#assertNoOpenTransaction();
    const d = await this.#begin(attempt, run, tool, args, businessKey, meta, recorded);
    const where = `${tool} (key ${d.key})`;

    switch (d.decision) {
      case 'execute':
        break;
      case 'replay':
        if (d.status === 'completed') return d.result;
        if (d.status === 'failed') {
          throw new EffectFailed(`${where} failed in an earlier attempt (replayed): ${describe(d.error)}`, {
            key: d.key, decision: d.decision, reason: d.reason, error: d.error, replayed: true,
          });
        }
        throw new LedgerError(`${where}: replay with unexpected status ${d.status}`, d);
      case 'pause':
        if (d.status === null) {
          // Nothing was recorded for the call: it diverges from the run's earlier
          // attempts and waits for resolve_divergence.  It stops the attempt like any pause.
          this.#stop(run, d.key, `${where} diverges from the run's earlier attempts and is paused.`, attempt);
          throw new DivergencePausedError(
            `${where} is paused: ${sentence(d.reason)}  A person must decide with ` +
              'durable_ledger.resolve_divergence (same or distinct) before the run can go on.',
            { key: d.key, run, tool, reason: d.reason });
        }
        this.#stop(run, d.key, `${where} is paused.`, attempt);
        throw new EffectPaused(
          `${where} is paused: ${sentence(d.reason)}  A person must resolve it ` +
            '(durable_ledger.resolve_effect) before the run can go on.',
          d
        );
      case 'in_progress':
        throw new EffectInProgress(`${where} is in progress elsewhere: ${sentence(d.reason)}`, d);
      default:
        throw new LedgerError(`${where}: unexpected decision ${d.decision}`, d);
    }

    // execute: the intent is committed; perform the effect with the key.
    let result;
    try {
      // the provider's key: the effect's, or a business key's with its attempt ("INV-9#2")
      result = await perform(d.downstream_key ?? d.key);
    } catch (err) {
      if (err instanceof EffectDidNotHappen) {
        const json = errorParam(err.error);
        const row = await this.#report(attempt, run, 'fail_effect', d.key, d.attempt, json, where, recorded,
          tool);
        throw new EffectFailed(`${where} did not happen: ${err.message}`, {
          key: d.key, decision: d.decision, reason: err.message,
          // the row is a later attempt's when one replaced ours: ours is what we sent
          error: row.attempt === d.attempt ? row.error : JSON.parse(json ?? 'null'),
          replayed: false, cause: err,
        });
      }
      // A recorded call's is made again by the next attempt: nothing for a
      // person.  But this attempt stops: what it did next (with a retried
      // call's other answer) would not be what a replay sees, which makes
      // the lost call again first.
      if (recorded) {
        this.#stopCall(true, run, d.key, `the recorded call ${where} threw (${describe(err?.message ?? err)}) ` +
          'and nothing was recorded.', attempt);
        throw err;
      }
      // Outcome unknown: never guess.  The effect stays "started"; the next
      // attempt pauses until a person resolves it; this one must not go on.
      this.#stop(run, d.key, `the outcome of ${where} is unknown (${describe(err?.message ?? err)}).`, attempt);
      throw err;
    }

    let resultJson;
    try {
      resultJson = jsonParam(result);
    } catch (err) {
      this.#stopCall(recorded, run, d.key, `${where} happened but its result could not be recorded.`, attempt);
      throw new LedgerError(
        `${where} happened but its result cannot be stored as JSON (${err.message}); ` +
          (recorded
            ? 'nothing was recorded, and the next attempt makes the recorded call again'
            : 'it stays "started", and the next attempt pauses until a person resolves it'),
        { key: d.key, decision: d.decision, cause: err }
      );
    }
    const row = await this.#report(attempt, run, 'complete_effect', d.key, d.attempt, resultJson, where,
      recorded, tool);
    return row.result;
  }

  /**
   * complete_effect / fail_effect on `attempt`, the attempt of the effect that
   * begin_effect executed; anything but an accepted report stops the run (in
   * `owner`, the token attempt of the call, or the session's).  A report needs
   * no token: it goes out on any connection, also after the lease was lost.
   */
  async #report(owner, run, fn, key, attempt, json, where, recorded, tool) {
    let row;
    try {
      [row] = await this.#statement(`${fn} of ${where}`,
        `SELECT * FROM durable_ledger.${fn}($1::text, $2::jsonb, $3::integer)`, [key, json, attempt],
        { statement: fn, run, tool, key });
    } catch (err) {
      this.#stopCall(recorded, run, key, `${where} could not be recorded (${fn}: ${err.message}).`, owner);
      throw err;
    }
    const wanted = fn === 'complete_effect' ? 'completed' : 'failed';
    // When a later attempt replaced ours (someone else recorded ours as failed
    // meanwhile, and the key was executed again), the row is that later
    // attempt's, which our report never changes: a failure the ledger already
    // had for our attempt is on record; anything else was kept as a conflict.
    // (A recorded call's attempt is replaced only when it was lost: the ledger
    // kept our report, whatever it said, as superseded.)
    const accepted = row.attempt === attempt
      ? !row.conflict && row.status === wanted
      : !row.conflict && fn === 'fail_effect' && !recorded;
    if (!accepted) {
      const now = row.attempt === attempt
        ? row.status
        : `at attempt ${row.attempt} (this report was on attempt ${attempt}), ${row.status}`;
      const superseded = recorded && row.attempt !== attempt && !row.conflict;
      this.#stopCall(superseded, run, key, `${where}: the ledger did not accept the report (${fn}).`, owner);
      if (superseded) {
        // a recorded call made again by a later attempt (ours lost its lease):
        // the ledger kept our report as superseded; nothing for a person
        throw new LedgerError(
          `${where}: a later attempt made the recorded call again (this attempt's lease ended): the ` +
            `effect is ${now}; this report was kept in the audit log as superseded, and this attempt stops.`,
          { key, decision: 'execute', reason: 'superseded report' });
      }
      throw new LedgerError(
        `${where}: the ledger did not accept the report (${fn}); the effect is ${now}` +
          `${row.conflict ? ' and flagged as a conflict' : ''}.  A person must look at it ` +
          '(durable_ledger.unresolved).',
        { key, decision: 'execute', reason: 'contradicting report' }
      );
    }
    return row;
  }

  /**
   * Wraps a side-effecting tool.  The returned function goes through guarded()
   * and calls fn(args, idempotencyKey) only on `execute`.
   * @template A, R
   * @param {string} name  the tool name recorded in the ledger
   * @param {(args: A, idempotencyKey: string) => R | Promise<R>} fn
   * @returns {(run: string, args: A, options?: {businessKey?: string|null, meta?: unknown}) => Promise<any>}
   *   resolves to fn's result as recorded (Recorded<R> in index.d.ts)
   */
  tool(name, fn) {
    if (typeof fn !== 'function') throw new TypeError('tool(name, fn): fn must be a function');
    return (run, args, { businessKey = null, meta } = {}) =>
      this.guarded({ run, tool: name, args, businessKey, meta, perform: (key) => fn(args, key) });
  }

  /**
   * durable_ledger.acquire_run: takes the run's lease and starts a new attempt
   * (occurrence counters start again at 1).
   * @param {string} run
   * @param {{wait?: boolean}} [options]  wait: false returns false at once when another session holds it
   * @returns {Promise<boolean>}
   * @throws RunAbandonedError when a person abandoned the run (nothing written; do not retry it)
   */
  async acquireRun(run, { wait = true } = {}) {
    this.#sessionOnly('acquireRun()');
    this.#reserve(run);
    try {
      return await this.#acquire(run, wait);
    } finally {
      this.#acquiring.delete(run);
    }
  }

  /**
   * Claims the run for one attempt of this Ledger before its acquire_run goes
   * out (synchronously: two at once, a job delivered twice, would share one
   * lease epoch).
   */
  #reserve(run) {
    if (this.#sessions.has(run) || this.#sessionHeld.has(run) || this.#acquiring.has(run)) {
      throw attemptAlreadyOpen(run);
    }
    this.#acquiring.add(run);
  }

  /**
   * acquire_run, with the epoch of the lease it took and the backend that holds
   * it, which every guarded statement of the attempt checks (session-guard.js).
   */
  async #acquire(run, wait) {
    let r;
    try {
      [r] = await this.#statement(`acquire_run of ${run}`, ACQUIRE_ATTEMPT, [run, wait],
        { statement: 'acquire_run', run });
    } catch (err) {
      if (err?.code === RUN_ABANDONED) throw abandoned(run, err);
      if (err?.code === '42883' && /session_epoch/.test(err?.message ?? '')) {
        throw new LedgerError('a session attempt needs the durable_ledger extension at version 1.3 or later ' +
          '(durable_ledger.session_epoch() is missing): ALTER EXTENSION durable_ledger UPDATE', { cause: err });
      }
      throw err;
    }
    if (r.acquired) {
      this.#stopped.delete(run); // a new attempt starts
      this.#sessionHeld.add(run);
      this.#sessionLeases.set(run, { epoch: r.epoch === null ? null : String(r.epoch), pid: r.pid });
    }
    return r.acquired;
  }

  /**
   * durable_ledger.release_run: ends this session's lease on the run.  For an
   * attempt this Ledger started, only where the lease is: when the statement
   * reached another server connection (a transaction pooler), or one whose
   * lease another attempt took over, release_attempt(run, epoch) ends the
   * attempt's lease wherever it is held (terminating the backend that holds
   * it, as the role may; else a 'notice' says how long the lock stays), and
   * PoolerDetected is thrown, unless a call of the attempt threw it already.
   * @param {string} run
   * @returns {Promise<boolean>} false when this session did not hold it
   */
  async releaseRun(run) {
    this.#sessionOnly('releaseRun()');
    if (this.#sessions.has(run)) {
      // its calls would go on under an implicit lease, in a new epoch
      throw new LedgerError(`releaseRun(${run}) inside its ledger.attempt(run, fn): the attempt releases ` +
        'the run when fn has settled');
    }
    this.#sessionHeld.delete(run);
    const lease = this.#sessionLeases.get(run);
    this.#sessionLeases.delete(run);
    const call = { statement: 'release_run', run };
    if (!lease) {
      const [r] = await this.#statement(`release_run of ${run}`, RELEASE_RUN, [run], call);
      this.#stopped.delete(run); // the attempt is over
      return r.ok;
    }
    const stop = this.#stopped.get(run);
    const [r] = await this.#statement(`release_run of ${run}`, RELEASE_ATTEMPT, [run, lease.epoch], call);
    this.#stopped.delete(run); // the attempt is over
    if (r.released !== null) return r.released;
    // The statement found no lease of the attempt where it ran.
    const how = missed(lease, r.pid, r.epoch);
    const outcome = await this.#endElsewhere(run, lease, r.pid);
    const ended = outcome === 'ended';
    if (how === 'lost') return ended;
    if (stop?.error?.() instanceof PoolerDetected) return ended; // a call of the attempt said so already
    const detected = new PoolerDetected(
      `run ${run}: the release of this attempt's lease (epoch ${Number(lease.epoch)}, held by backend ` +
        `${lease.pid}) reached ${r.pid !== lease.pid ? `another server connection (backend ${r.pid})` :
          `that connection after another attempt (epoch ${Number(r.epoch)}) had taken the lease over`}: ` +
        'a transaction pooler (PgBouncer with pool_mode = transaction, or a pooled endpoint) is between this ' +
        'client and the database, and a session lease cannot work through it.  ' +
        ({ ended: 'The lease was ended where it was held (release_attempt).  ',
          over: 'The lease was over already.  ',
          left: "The lease stays held where it is (this role may not end it: see the 'notice').  " })[outcome] +
        'Behind a transaction pooler use ledger.tokenAttempt(run, opts, fn).',
      { run, epoch: Number(lease.epoch), pid: lease.pid, reachedPid: r.pid,
        reachedEpoch: r.epoch === null ? null : Number(r.epoch),
        reason: 'a transaction pooler is between the client and the database' });
    throw detected;
  }

  /**
   * release_attempt(run, epoch): ends the attempt's session lease wherever it
   * is held, so that the lock is not left on a pooled server connection where
   * other clients would meet it: 'ended', or 'over' when no live session lease
   * held the run at that epoch any more.  When the role may not end the backend
   * that holds it (42501), a 'notice' says exactly what happens instead: 'left'.
   */
  async #endElsewhere(run, lease, reachedPid) {
    if (lease.epoch === null) return 'over';
    try {
      const [r] = await this.#statement(`release_attempt of ${run}`, END_ATTEMPT_ELSEWHERE, [run, lease.epoch],
        { statement: 'release_attempt', run });
      return r.ended ? 'ended' : 'over';
    } catch (err) {
      if (err?.sqlstate !== '42501') throw err;
      const epoch = Number(lease.epoch);
      this.#notify({
        origin: 'client',
        severity: 'WARNING',
        code: '42501',
        message: `the session lease of run ${run} (epoch ${epoch}) stays held by server connection ` +
          `${lease.pid} (its backend pid) until that connection closes, or until an admin runs ` +
          `durable_ledger.break_lease('${run}', ...): this client's statement reached backend ${reachedPid}, ` +
          'and its role may not terminate the backend that holds the lock (pg_terminate_backend\'s rule)',
        detail: 'Until then every client that a transaction pooler hands that server connection meets the ' +
          'lock; PgBouncer closes it after server_lifetime, or after server_idle_timeout once idle.',
        hint: `Ask an admin to run SELECT durable_ledger.break_lease('${run}', 'name', 'leaked through a ` +
          "transaction pooler'); behind a transaction pooler use ledger.tokenAttempt().",
        statement: 'release_attempt',
        run,
        tool: null,
        key: null,
        pid: lease.pid,
        epoch,
      });
      return 'left';
    }
  }

  /**
   * durable_ledger.effect_status: the effect's row, or null for a key never seen.
   * @param {string} key
   * @returns {Promise<object|null>}
   */
  async effectStatus(key) {
    const { rows } = await this.#query('SELECT * FROM durable_ledger.effect_status($1::text)', [key],
      { statement: 'effect_status', key });
    return rows[0] ?? null;
  }

  /**
   * durable_ledger.history: the run's timeline, one object per audit event,
   * oldest first, with the columns id, logged_at, lease_epoch, event, key,
   * tool, args, attempt, outcome, detail, role_name, application_name
   * (node-postgres returns the bigint columns id and lease_epoch as strings).
   * An empty array for a run the ledger never saw.  Needs the
   * durable_ledger_auditor role (or admin): a worker role alone gets
   * PermissionDenied (42501).  Needs the extension at version 1.2.  On a
   * pg.Pool it runs on a connection of the pool, like any call.
   * @param {string} run
   * @returns {Promise<object[]>}
   */
  async history(run) {
    const { rows } = await this.#query('SELECT * FROM durable_ledger.history($1::text)', [run],
      { statement: 'history', run });
    return rows;
  }

  /**
   * One attempt at a run: acquire_run (a wait ends after lock_timeout, else
   * durable_ledger.lease_wait_timeout: RunBusy), fn(run) with its calls bound
   * to it (sessionContext), release_run in finally once they have ended.  A run
   * this Ledger already holds is refused.
   * @template T
   * @param {string} run
   * @param {(run: string) => T | Promise<T>} fn
   * @returns {Promise<T>}
   */
  async attempt(run, fn) {
    this.#sessionOnly('attempt()');
    this.#reserve(run);
    const session = new Calls(this, run);
    this.#sessions.set(run, session);
    try {
      await this.#acquire(run, true);
    } catch (err) {
      this.#sessions.delete(run);
      throw err;
    } finally {
      this.#acquiring.delete(run);
    }
    let failed = false;
    try {
      return await sessionContext.run([...(sessionContext.getStore() ?? []), session], () => fn(run));
    } catch (err) {
      failed = true;
      throw err;
    } finally {
      // no call of the attempt begins from now on; those in flight finish first
      session.ended = true;
      await session.idle();
      this.#sessions.delete(run);
      try {
        await this.releaseRun(run);
      } catch (releaseErr) {
        // The original error matters more; a broken connection ends the lease anyway.
        if (!failed) throw releaseErr;
      }
    }
  }

  /**
   * One attempt at a run under a token lease, on a pg.Pool or a pooled
   * connection (PgBouncer in transaction mode): take_lease(run, ttl, holder),
   * fn(lease), release_lease at the end.
   *
   * Every guarded() call (and every tool()) on `run` through this Ledger made
   * by fn, or by anything fn started (its async context: promises, timers),
   * belongs to this attempt and passes its token to begin_effect; each
   * statement is a transaction of its own, so consecutive calls may land on
   * different backends.  When fn settles, the attempt ends: calls of it that
   * have not begun yet throw LeaseLostError (a branch that outlived fn never
   * acts under the next attempt), and tokenAttempt waits for the calls in
   * flight to finish (their outcome is reported) before it releases the lease.
   *
   * A timer renews the lease every ttl / 3 until then, also during a long tool
   * or model call; a renewal that fails for another reason than a lost lease
   * is retried within a second (onRenewalError(err) hears of it; by default a
   * process warning).  A lost lease (55L01 from begin_effect or a renewal)
   * stops the attempt: the next guarded() call of it throws LeaseLostError
   * without asking the database, lease.signal aborts, lease.check() throws, and
   * so does tokenAttempt() at its end if fn did not throw.  A call that was in
   * flight is not cut short: its outcome is reported (a report needs no lease).
   *
   * @template T
   * @param {string} run
   * @param {{ttl?: number, holder?: string|null, onRenewalError?: (err: unknown) => void}
   *         | ((lease: TokenLease) => T | Promise<T>)} options
   *   ttl: seconds the lease lives without renewal (1 to 86400; default 300);
   *   holder: the worker's name in durable_ledger.leases
   * @param {(lease: TokenLease) => T | Promise<T>} [fn]
   * @returns {Promise<T>}
   * @throws RunBusy when a live lease of either kind holds the run (no waiting);
   *   RunAbandonedError when a person abandoned the run (do not retry it)
   */
  async tokenAttempt(run, options, fn) {
    if (typeof options === 'function') [options, fn] = [{}, options];
    if (typeof fn !== 'function') throw new TypeError('tokenAttempt(run, [options,] fn): fn must be a function');
    const { ttl = 300, holder = null, onRenewalError = warnRenewalError } = options ?? {};
    if (typeof ttl !== 'number' || !Number.isFinite(ttl)) {
      throw new TypeError('tokenAttempt(): ttl must be a number of seconds');
    }
    if (this.#attempts.has(run) || this.#opening.has(run)) throw attemptAlreadyOpen(run);
    this.#opening.add(run);
    let attempt;
    try {
      let r;
      try {
        [r] = await this.#statement(`take_lease of ${run}`,
          'SELECT * FROM durable_ledger.take_lease($1::text, make_interval(secs => $2::double precision), $3::text)',
          [run, ttl, holder], { statement: 'take_lease', run });
      } catch (err) {
        if (err?.code === RUN_ABANDONED) throw abandoned(run, err);
        throw err;
      }
      if (r.token === null) {
        throw new RunBusy(`run ${run} is held by a live lease (another worker's attempt)`);
      }
      const lease = new TokenLease({
        run, token: r.token, epoch: Number(r.epoch), expiresAt: r.expires_at, holder: r.holder, ttl,
      });
      attempt = new Attempt(this, lease);
      this.#attempts.set(run, attempt);
    } finally {
      this.#opening.delete(run);
    }
    const { lease } = attempt;

    const renewal = this.#renew(lease, onRenewalError);
    let result;
    let failed = false;
    let error;
    try {
      const outer = attemptContext.getStore() ?? [];
      result = await attemptContext.run([...outer, attempt], () => fn(lease));
    } catch (err) {
      failed = true;
      error = err;
    }
    // The attempt ends: its calls that have not begun are refused from now on;
    // those in flight finish first (the lease is still renewed meanwhile).
    attempt.ended = true;
    await attempt.idle();
    await renewal.stop();
    this.#attempts.delete(run);
    if (!lease.lost) {
      try {
        const [r] = await this.#statement(`release_lease of ${run}`,
          'SELECT durable_ledger.release_lease($1::text) AS released', [lease.token],
          { statement: 'release_lease', run });
        if (!r.released) {
          lease[lose](null, `the token lease on run ${run} (epoch ${lease.epoch}) was no longer live ` +
            'at the end of the attempt (it expired or was broken)');
        }
      } catch (releaseErr) {
        // fn's error matters more; the lease expires by itself
        if (!failed) throw releaseErr;
      }
    }
    if (failed) throw error;
    lease.check();
    return result;
  }

  /** The renewal timer of a token attempt; stop() ends it and waits for a renewal in flight. */
  #renew(lease, onRenewalError) {
    const every = (lease.ttl * 1000) / 3;
    let stopped = false;
    let timer = null;
    let inFlight = Promise.resolve();
    const schedule = (ms) => {
      timer = setTimeout(tick, ms);
      timer.unref?.();
    };
    const tick = () => {
      timer = null;
      inFlight = (async () => {
        let wait = every;
        try {
          const [r] = await this.#statement(`renew_lease of ${lease.run}`,
            'SELECT durable_ledger.renew_lease($1::text) AS expires_at', [lease.token],
            { statement: 'renew_lease', run: lease.run });
          if (stopped) return;
          lease.expiresAt = r.expires_at;
          lease.renewals += 1;
        } catch (err) {
          if (stopped) return;
          if (err?.code === LEASE_LOST) {
            lease[lose](err);
            return;
          }
          wait = Math.min(every, 1000);
          try {
            onRenewalError(err, lease);
          } catch {
            // a listener's failure must not stop the renewals
          }
        }
        if (!stopped) schedule(wait);
      })();
    };
    // The timer is created outside any attempt's context: a renewal is no call of the attempt.
    attemptContext.exit(() => schedule(every));
    return {
      stop: async () => {
        stopped = true;
        if (timer) clearTimeout(timer);
        await inFlight;
      },
    };
  }
}

function warnRenewalError(err, lease) {
  process.emitWarning(
    `could not renew the token lease on run ${lease.run} (retrying): ${describe(err?.message ?? err)}`,
    'DurableLedgerWarning');
}
