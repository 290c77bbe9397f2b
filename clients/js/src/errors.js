// The errors the client raises, named as the Python client names its exceptions
// (clients/python/durable_ledger/errors.py), so that a run's logs, alerts and
// runbooks say the same in both languages.
//
// The names durable-ledger 1.2 gave four of them -- DivergencePausedError,
// RunAbandonedError, ToolRefusedError, LeaseLostError -- are kept as deprecated
// aliases: the same class objects, so `err instanceof LeaseLostError` still
// holds; only err.name (the class's name) is the new one.
//
// Where the clients differ, they differ in what they throw, not only in its
// name, and so keep their own classes: the JavaScript client throws RunStopped
// for every further call of a stopped attempt, where the Python client raises
// EffectPaused (and AttemptStopped after a recorded call); and plain LedgerError
// where the Python client has OutcomeNotRecorded (a report the ledger did not
// take) and LedgerUsageError (a call outside an attempt, inside a transaction).
//
// A subclass that narrows a field LedgerError sets (`key` is always a string
// on an EffectFailed, null on a RunAbandoned) says so with a bare `this.key;`
// under its JSDoc type: tsc reads it as a declaration, for the generated
// types; at run time it does nothing.

import { describe } from './text.js';

/**
 * @typedef {object} LedgerErrorFields
 * @property {string|null} [key]  the effect's idempotency key
 * @property {string|null} [decision]  begin_effect's decision that led here
 * @property {string|null} [reason]  the ledger's one-sentence explanation
 * @property {unknown} [cause]
 */

/** Base class of every error this module raises about a ledger decision. */
export class LedgerError extends Error {
  /**
   * @param {string} message
   * @param {LedgerErrorFields} [fields]
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
    /** @type {string} the effect's idempotency key */
    this.key; // (declared for the types)
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
  /**
   * @param {string} message
   * @param {LedgerErrorFields & {downstream_key?: string|null}} [fields]  a decision row will do
   */
  constructor(message, fields = {}) {
    super(message, fields);
    /** @type {string} the effect's idempotency key */
    this.key; // (declared for the types)
    /**
     * The key the provider was given (the key, or key#attempt for a business key): what to
     * ask it about; null when the client stopped the run without asking the database.
     * @type {string|null}
     * @readonly
     */
    this.downstreamKey = fields.downstream_key ?? null;
  }
}

/**
 * begin_effect answered `pause` with status `awaiting_approval`: this call
 * needs an approver's approval before it executes, and was not performed.
 * An admin made calls like this one (its tool, args matching a condition)
 * wait for a person (durable_ledger.set_approval).  The intent is recorded;
 * durable_ledger.unresolved lists it and the ledger notified
 * durable_ledger_attention.  It is an EffectPaused and stops the attempt like
 * any pause.  An approver (a member of durable_ledger_approver, never the role
 * or login that made the call) decides with durable_ledger.approve_effect(key,
 * approved_by, note): the next attempt's same call executes it, once; or with
 * reject_effect: the call replays as EffectFailed.  The approval is of exactly
 * these args: a call with other args asks for its own.
 */
export class AwaitingApproval extends EffectPaused {}

/**
 * A budget the ledger holds stops this call (extension 1.3): not performed,
 * and nothing recorded for it but the pause.  An admin gave the call's tool a
 * budget per run (durable_ledger.set_budget: at most N executions, or M within
 * a window), or every run a budget of attempts (set_attempts_budget), and this
 * call would pass it: a loop that calls again and again, each call reworded
 * and so new to the ledger, stops here.  begin_effect answered `pause` with a
 * reason that begins "budget:"; durable_ledger.unresolved lists it and the
 * ledger notified durable_ledger_attention.  It is an EffectPaused and stops
 * the attempt like any pause.  A person raises the run's budget
 * (durable_ledger.set_run_budget): the next attempt's call then executes; or
 * abandons the run.  `run` and `tool` name the call.
 */
export class BudgetExhausted extends EffectPaused {
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
export class DivergencePaused extends EffectPaused {
  /**
   * @param {string} message
   * @param {{key: string, run: string, tool: string, reason?: string|null, cause?: unknown}} fields
   */
  constructor(message, { key, run, tool, reason = null, cause }) {
    super(message, { key, decision: 'pause', reason, cause });
    /** @type {string} the drifted call's own key: the one to pass to resolve_divergence */
    this.key; // (declared for the types)
    /** @type {'pause'} */
    this.decision; // (declared for the types)
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
export class EffectInProgress extends LedgerError {
  /**
   * @param {string} message
   * @param {LedgerErrorFields} [fields]  a decision row will do
   */
  constructor(message, fields) {
    super(message, fields);
    /** @type {string} the effect's idempotency key */
    this.key; // (declared for the types)
  }
}

/**
 * A guarded call on a run whose current attempt already hit an unknown
 * outcome (perform threw something other than EffectDidNotHappen) or a pause.
 * Continuing in the same attempt would be unsafe: the ledger counts a repeated
 * call as the next occurrence, with a new key, so a retry would execute again.
 * End the attempt; start a new one (acquireRun, or attempt()) when it has been
 * resolved.  `key` is the effect that stopped the run (null when a token
 * attempt stopped because a begin_effect's outcome is unknown).
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
export class RunAbandoned extends LedgerError {
  /**
   * @param {string} message
   * @param {{run: string, reason?: string|null, cause?: unknown}} fields
   */
  constructor(message, { run, reason = null, cause }) {
    super(message, { key: null, decision: null, reason: reason ?? message, cause });
    /** @type {null} */
    this.key; // (declared for the types)
    /** @type {null} */
    this.decision; // (declared for the types)
    /** @type {string} the server's message */
    this.reason; // (declared for the types)
    /** @type {string} */
    this.run = run;
  }
}

/**
 * The ledger refuses to execute the tool: SQLSTATE 55L03 from begin_effect.
 * The tool is retired (durable_ledger.retire_tool), or nobody registered it and
 * the ledger refuses tools nobody registered (set_unregistered_tools('refuse',
 * ...)).  Nothing was recorded or performed.  The attempt stops (the run
 * cannot make this call): further calls of it throw RunStopped.  An admin
 * registers the tool (again), or the run is changed; then a new attempt may go
 * on.  What a retired tool recorded earlier still replays.  `run` and `tool`
 * name the call; `key` and `decision` are null; `cause` is the server's error.
 */
export class ToolRefused extends LedgerError {
  /**
   * @param {string} message
   * @param {{run: string, tool: string, reason?: string|null, cause?: unknown}} fields
   */
  constructor(message, { run, tool, reason = null, cause }) {
    super(message, { key: null, decision: null, reason: reason ?? message, cause });
    /** @type {null} */
    this.key; // (declared for the types)
    /** @type {null} */
    this.decision; // (declared for the types)
    /** @type {string} the server's message */
    this.reason; // (declared for the types)
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
  /**
   * @param {string} message
   * @param {LedgerErrorFields & {sqlstate?: string|null, detail?: string|null}} [fields]
   */
  constructor(message, fields = {}) {
    super(message, fields);
    /**
     * 55P03 when a lease wait ended or a token lease holds the run; null from tokenAttempt().
     * @type {string|null}
     * @readonly
     */
    this.sqlstate = fields.sqlstate ?? null;
    /**
     * The server's detail: who holds the run (backend, application, since when).
     * @type {string|null}
     * @readonly
     */
    this.detail = fields.detail ?? null;
  }
}

/**
 * The ledger refused the statement with a SQLSTATE of its list (README,
 * "Errors"), writing nothing: sqlstate, detail, hint; the pg error is cause.
 */
export class LedgerRefused extends LedgerError {
  /**
   * @param {string} message
   * @param {{sqlstate: string, detail?: string|null, hint?: string|null, cause?: unknown}} fields
   */
  constructor(message, { sqlstate, detail = null, hint = null, cause } = /** @type {any} */ ({})) {
    super(message, { reason: message, cause });
    /** @type {string} the message */
    this.reason; // (declared for the types)
    /** @type {string} @readonly */
    this.sqlstate = sqlstate;
    /** @type {string|null} @readonly */
    this.detail = detail;
    /** @type {string|null} @readonly */
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

/**
 * The lease of this attempt is gone.  The token lease expired, an admin broke
 * it, or it was released or superseded (SQLSTATE 55L01 from begin_effect or
 * renew_lease); or a session lease was dropped behind the ledger's back on the
 * attempt's own connection (DISCARD ALL, pg_advisory_unlock_all(): the call
 * found that its session holds no lease of the run, and called nothing); or
 * the call belongs to an attempt that has ended (its function settled while
 * the call's branch was still running: nothing was begun).  The attempt must
 * stop: from the moment the client knows, every further call of the attempt
 * throws this without asking the database, and tokenAttempt() throws it at its
 * end if fn did not.  Nothing is lost: a call that was in flight had its
 * outcome reported (a report needs no lease), a begin_effect refused with
 * 55L01 wrote nothing, and the next attempt (a new tokenAttempt) replays what
 * was completed.  Another worker may hold the run by now.
 */
export class LeaseLost extends LedgerError {
  /**
   * @param {string} message
   * @param {{run: string, epoch: number|null, reason?: string|null, cause?: unknown}} fields
   */
  constructor(message, { run, epoch, reason = null, cause }) {
    super(message, { key: null, decision: null, reason: reason ?? message, cause });
    /** @type {null} */
    this.key; // (declared for the types)
    /** @type {null} */
    this.decision; // (declared for the types)
    /** @type {string} what happened */
    this.reason; // (declared for the types)
    /** @type {string} the run of the lost attempt */
    this.run = run;
    /**
     * The lease epoch (the attempt) that was lost; null where the client does not know it
     * (a call of a session attempt that has ended).
     * @type {number|null}
     */
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
 * none).
 */
export class PoolerDetected extends LeaseLost {
  /**
   * @param {string} message
   * @param {{run: string, epoch: number|null, pid: number, reachedPid: number, reachedEpoch?: number|null,
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

/**
 * Throw this from perform() (or from a tool function) when the downstream API
 * definitively refused the call before changing anything.  `error` (any JSON
 * value) is recorded with fail_effect.  Only throw it when you know nothing
 * happened: any other error means "outcome unknown".  Not a LedgerError: it is
 * what your code tells the ledger.
 */
export class EffectDidNotHappen extends Error {
  /**
   * @param {unknown} [error]  JSON-serializable description of the refusal
   * @param {string} [message]
   */
  constructor(error = null, message) {
    super(message ?? `the effect did not happen: ${describe(error)}`);
    this.name = 'EffectDidNotHappen';
    /** @type {unknown} JSON recorded with fail_effect */
    this.error = error;
  }
}

// The names of durable-ledger 1.2, kept for code written against them: each
// is the class above itself (a value for instanceof, a type for annotations).

/**
 * Deprecated: the name of DivergencePaused in durable-ledger 1.2 (the same class).
 * @deprecated Use DivergencePaused, the Python client's name.
 * @typedef {DivergencePaused} DivergencePausedError
 */
/**
 * The name of DivergencePaused in durable-ledger 1.2: the same class, so `instanceof` works with either.
 * @deprecated Use DivergencePaused, the Python client's name.
 */
export const DivergencePausedError = DivergencePaused;

/**
 * Deprecated: the name of RunAbandoned in durable-ledger 1.2 (the same class).
 * @deprecated Use RunAbandoned, the Python client's name.
 * @typedef {RunAbandoned} RunAbandonedError
 */
/**
 * The name of RunAbandoned in durable-ledger 1.2: the same class, so `instanceof` works with either.
 * @deprecated Use RunAbandoned, the Python client's name.
 */
export const RunAbandonedError = RunAbandoned;

/**
 * Deprecated: the name of ToolRefused in durable-ledger 1.2 (the same class).
 * @deprecated Use ToolRefused, the Python client's name.
 * @typedef {ToolRefused} ToolRefusedError
 */
/**
 * The name of ToolRefused in durable-ledger 1.2: the same class, so `instanceof` works with either.
 * @deprecated Use ToolRefused, the Python client's name.
 */
export const ToolRefusedError = ToolRefused;

/**
 * Deprecated: the name of LeaseLost in durable-ledger 1.2 (the same class).
 * @deprecated Use LeaseLost, the Python client's name.
 * @typedef {LeaseLost} LeaseLostError
 */
/**
 * The name of LeaseLost in durable-ledger 1.2: the same class, so `instanceof` works with either.
 * @deprecated Use LeaseLost, the Python client's name.
 */
export const LeaseLostError = LeaseLost;
