// The Ledger, the client's one class: every side effect goes through
// begin_effect (the intent is recorded and committed before the effect), then
// complete_effect or fail_effect (call-flow.js; the ledger's decisions as
// control flow in decisions.js).
//
// Every call belongs to an attempt, which keeps other workers off the run with
// one of two kinds of lease: a session lease (attempt(), acquireRun():
// session-attempts.js) or a token lease (tokenAttempt(): token-attempts.js).
// The attempt a call belongs to is the one whose function made it
// (attempts.js); an attempt that hit a pause, an unknown outcome, an abandoned
// run, a refused tool or a lost lease is stopped (stops.js).  The server's
// WARNINGs and NOTICEs of the ledger's statements are emitted as 'notice'
// events (notices.js).

import { EventEmitter } from 'node:events';
import { attemptContext, boundAttempt } from './attempts.js';
import { callKey } from './call-key.js';
import { CallFlow } from './call-flow.js';
import { Connection } from './connection.js';
import { formatNotice } from './notices.js';
import { warnRenewalError } from './renewal.js';
import { SessionAttempts } from './session-attempts.js';
import { EFFECT_STATUS, HISTORY, beginStatement, checkModel, routed } from './statements.js';
import { Stops } from './stops.js';
import { describe } from './text.js';
import { TokenAttempts } from './token-attempts.js';

/** @typedef {import('./connection.js').Queryable} Queryable */
/** @typedef {import('./decisions.js').Decision} Decision */
/** @typedef {import('./notices.js').LedgerNotice} LedgerNotice */
/** @typedef {import('./token-lease.js').TokenLease} TokenLease */
/** @typedef {import('./types.js').BeginEffectOptions} BeginEffectOptions */
/** @typedef {import('./types.js').CallOptions} CallOptions */
/** @typedef {import('./types.js').ToolOptions} ToolOptions */
/** @typedef {import('./types.js').EffectRow} EffectRow */
/** @typedef {import('./types.js').HistoryRow} HistoryRow */
/** @typedef {import('./types.js').LedgerOptions} LedgerOptions */
/** @typedef {import('./types.js').TokenAttemptOptions} TokenAttemptOptions */
/** @typedef {import('./types.js').AttemptOptions} AttemptOptions */
/**
 * @template T
 * @typedef {import('./types.js').Recorded<T>} Recorded
 */
/**
 * @template T
 * @typedef {import('./types.js').GuardedCall<T>} GuardedCall
 */
/**
 * @template T
 * @typedef {import('./types.js').RecordedCall<T>} RecordedCall
 */
/**
 * @template T
 * @typedef {import('./types.js').LocalCall<T>} LocalCall
 */

/**
 * The events of a Ledger, for its EventEmitter methods (on, once, off, emit, ...): 'notice',
 * and the two every EventEmitter emits.
 * @typedef {object} LedgerEvents
 * @property {[notice: LedgerNotice]} notice  a WARNING or NOTICE of one of the Ledger's
 *   statements, or what the client itself must warn about
 * @property {[event: string | symbol, listener: (...args: any[]) => void]} newListener
 * @property {[event: string | symbol, listener: (...args: any[]) => void]} removeListener
 */

/**
 * A Ledger is an EventEmitter: it emits 'notice' for every WARNING and NOTICE
 * the server sent on one of its statements (a LedgerNotice), and for what the
 * client itself must warn about (a session lock it could not end).  With no
 * 'notice' listener, it writes them with console.warn, unless constructed with
 * {consoleWarn: false}.
 * @extends {EventEmitter<LedgerEvents>}
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
   *   leases only (session-lease calls throw LedgerError).  A single client
   *   given to a Ledger must be dedicated to it: a statement of the ledger
   *   queued behind a tool's BEGIN would run inside the tool's transaction (the
   *   ledger then refuses to go on, see guarded()).
   * @param {LedgerOptions} [options]  consoleWarn: false -- notices nobody
   *   listens to are dropped instead of written with console.warn; routed: true
   *   -- the database is a proxy of a sharded ledger (durable_ledger_proxy): every
   *   call about a key (a report, a reconciliation, a status) names its run, so
   *   that the proxy sends it straight to the run's shard
   */
  constructor(client, { consoleWarn = true, routed: routedCalls = false } = {}) {
    super();
    if (!client || typeof client.query !== 'function') {
      throw new TypeError('new Ledger(client): client must be a node-postgres Client, PoolClient or Pool');
    }
    /** @type {Queryable} @readonly */
    this.client = client;
    this.#consoleWarn = consoleWarn;
    this.#routed = routedCalls;
    /** @param {LedgerNotice} notice */
    const notify = (notice) => this.#notify(notice);
    this.#connection = new Connection(client, notify);
    this.#stops = new Stops(client);
    this.#sessions = new SessionAttempts(this.#connection, this.#stops, notify);
    this.#tokens = new TokenAttempts(this.#connection);
    this.#calls = new CallFlow(this, this.#connection, this.#stops, this.#sessions, this.#tokens, notify,
      routedCalls);
  }

  #consoleWarn;
  #routed;
  /** @type {Connection} */
  #connection;
  /** @type {Stops} */
  #stops;
  /** @type {SessionAttempts} the session attempts this Ledger started */
  #sessions;
  /** @type {TokenAttempts} the token attempts this Ledger has open */
  #tokens;
  /** @type {CallFlow} its guarded() and record() calls */
  #calls;

  /**
   * Emits 'notice' (a listener that throws does not disturb the ledger: its
   * error becomes a process warning), or, with no listener, console.warn.
   * @param {LedgerNotice} notice
   */
  #notify(notice) {
    if (this.listenerCount('notice') > 0) {
      try {
        this.emit('notice', notice);
      } catch (err) {
        process.emitWarning(
          `a 'notice' listener of durable-ledger threw: ${describe(/** @type {any} */ (err)?.message ?? err)}`,
          'DurableLedgerWarning');
      }
    } else if (this.#consoleWarn) {
      console.warn(formatNotice(notice));
    }
  }

  /**
   * durable_ledger.begin_effect, as is (no transaction check, no control flow).
   * @param {string} run
   * @param {string} tool
   * @param {unknown} args
   * @param {BeginEffectOptions} [options]  lease: a token lease (or its token): the
   *   call belongs to that lease's epoch
   * @returns {Promise<Decision>}
   */
  async beginEffect(run, tool, args, { businessKey = null, meta, lease = null } = {}) {
    const token = lease == null ? null : typeof lease === 'string' ? lease : lease.token;
    const { rows } = await this.#connection.query(
      ...beginStatement(run, tool, args, businessKey, meta, token, false),
      { statement: 'begin_effect', run, tool });
    return rows[0];
  }

  /**
   * Runs one side effect at most once.
   *
   * Inside tokenAttempt(run, fn) (in fn, or in anything fn started: its async
   * context) the call belongs to that attempt and passes its token.  Once the
   * attempt has ended (fn settled), a call of it that had not begun yet throws
   * LeaseLost and performs nothing: a branch that outlives its attempt never
   * acts under a later attempt, nor under a session lease.  A call on a run
   * that this Ledger holds by a token attempt, made from outside that
   * attempt's async context, throws LedgerError; so does a call outside any
   * attempt (no implicit lease: every attempt starts with attempt(),
   * tokenAttempt() or acquireRun()), recording and performing nothing.
   * @template [T=unknown]
   * @param {GuardedCall<T>} call
   * @returns {Promise<Recorded<Awaited<T>>>} the result as recorded in the
   *   ledger (a JSON round trip of what perform returned; undefined becomes
   *   null), the same on a first run and on a replay.  The outcome is reported
   *   on the attempt that begin_effect executed.
   * @throws EffectFailed, EffectPaused (DivergencePaused for a call that
   *   diverges from the run's earlier attempts), EffectInProgress,
   *   RunAbandoned (55L02), ToolRefused (55L03), RunStopped, LeaseLost
   *   (PoolerDetected: a session attempt behind a transaction pooler),
   *   LedgerError, or perform's own error (outcome unknown: the next attempt
   *   pauses).  A pause, an unknown outcome, an abandoned run and a refused
   *   tool stop the attempt: its further calls throw RunStopped (RunAbandoned
   *   again for an abandoned run).
   */
  async guarded({ run, tool, args, perform, businessKey = null, callId = null, meta, reconcile = null }) {
    if (typeof perform !== 'function') {
      throw new TypeError('guarded(): perform must be a function (key) => result');
    }
    if (reconcile != null && typeof reconcile !== 'function') {
      throw new TypeError('guarded(): reconcile must be a function (downstreamKey, args) => finding');
    }
    if (callId != null && businessKey != null) {
      throw new TypeError('guarded(): a call has a businessKey or a callId, not both');
    }
    if (callId != null) {
      return this.#calls.call('guarded()', { run, tool, args, perform, businessKey: callKey(run, tool, callId),
        callId: true, meta, recorded: false, reconcile });
    }
    return this.#calls.call('guarded()', { run, tool, args, perform, businessKey, meta, recorded: false,
      reconcile });
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
   * get.)  Never use it for a side effect: a tool registered as
   * side-effecting is refused (ToolRefused).  Called inside an attempt, as
   * guarded() is.
   * @template [T=unknown]
   * @param {RecordedCall<T>} recorded
   * @returns {Promise<Recorded<Awaited<T>>>} the result as recorded in the ledger
   * @throws EffectFailed (call threw EffectDidNotHappen, now or replayed),
   *   EffectPaused, ToolRefused, RunStopped, LeaseLost, LedgerError, or
   *   call's own error.
   */
  async record({ run, tool, args, call, meta }) {
    if (typeof call !== 'function') {
      throw new TypeError('record(): call must be a function () => result');
    }
    return this.#calls.call('record()', {
      run, tool, args, perform: () => call(), businessKey: null, meta, recorded: true,
    });
  }

  /**
   * Performs a local effect -- a write in the ledger's own database -- at most
   * once per logical action, in one transaction with its intent and its
   * outcome (begin_local, extension 1.3): begin_local, write(client, key) in a
   * savepoint and the report are committed together or not at all, so the
   * effect is never unknown and never needs a person.  write returns: its
   * result is recorded and returned (as recorded); a later attempt replays it
   * without calling write.  write throws EffectDidNotHappen: its writes are
   * rolled back to the savepoint, the failure is committed, EffectFailed is
   * thrown.  write throws anything else: everything is rolled back, nothing is
   * recorded, the error is thrown and the attempt goes on (the same call again
   * executes it again: nothing of it happened).  The COMMIT's answer is lost:
   * it committed whole or not at all, and the attempt stops (RunStopped: no
   * person is needed; the next attempt replays or executes it).  A replayed
   * failure, a pause and work in progress are as in guarded().  write must do
   * nothing but SQL on `client`.  On a pg.Pool the transaction has a client of
   * its own; on a single client the Ledger's other statements wait for it.
   * Called inside an attempt, as guarded() is.
   * @template [T=unknown]
   * @param {LocalCall<T>} call
   * @returns {Promise<Recorded<Awaited<T>>>} the result as recorded in the ledger
   * @throws EffectFailed, EffectPaused, EffectInProgress, RunAbandoned,
   *   ToolRefused, RunStopped, LeaseLost, LedgerError, or write's own error
   *   (nothing recorded)
   */
  async local({ run, tool, args, write, businessKey = null, meta }) {
    if (typeof write !== 'function') {
      throw new TypeError('local(): write must be a function (client, key) => result');
    }
    return this.#calls.local({ run, tool, args, write, businessKey, meta });
  }

  /**
   * Wraps a side-effecting tool.  The returned function goes through guarded()
   * and calls fn(args, idempotencyKey) only on `execute`; it resolves to fn's
   * result as recorded (Recorded<R>), also on a replay.
   * @template [A=unknown], [R=unknown]
   * @param {string} name  the tool name recorded in the ledger
   * @param {(args: A, idempotencyKey: string) => R | Promise<R>} fn
   * @param {ToolOptions} [options]  reconcile(downstreamKey, args): the provider's lookup,
   *   asked about an effect of the tool whose outcome is unknown before EffectPaused is
   *   thrown (see guarded())
   * @returns {(run: string, args: A, options?: CallOptions) => Promise<Recorded<Awaited<R>>>}
   */
  tool(name, fn, { reconcile = null } = {}) {
    if (typeof fn !== 'function') throw new TypeError('tool(name, fn): fn must be a function');
    if (reconcile != null && typeof reconcile !== 'function') {
      throw new TypeError('tool(name, fn, {reconcile}): reconcile must be a function (downstreamKey, args) => finding');
    }
    return (run, args, { businessKey = null, meta } = {}) =>
      this.guarded({ run, tool: name, args, businessKey, meta, reconcile, perform: (key) => fn(args, key) });
  }

  /**
   * durable_ledger.acquire_run: takes the run's lease and starts a new attempt
   * (occurrence counters start again at 1).
   * @param {string} run
   * @param {{wait?: boolean}} [options]  wait: false returns false at once when another session holds it
   * @returns {Promise<boolean>}
   * @throws RunAbandoned when a person abandoned the run (nothing written; do not retry it)
   */
  async acquireRun(run, { wait = true } = {}) {
    return this.#sessions.acquireRun(run, wait);
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
    return this.#sessions.releaseRun(run);
  }

  /**
   * Why the attempt at `run` that the calling code belongs to is stopped, or null while it
   * goes on: the token attempt of this Ledger whose function made the call (its async
   * context), else its client's session attempt.  Once stopped (a pause, an unknown
   * outcome, a report that could not be recorded, an abandoned run, a refused tool, a lost
   * lease, a recorded call that threw), every further call of the attempt throws without
   * asking the database; a framework that turned the error of the call that stopped it
   * into a message learns here that the attempt must end.
   * @param {string} run
   * @returns {{key: string|null, reason: string} | null}  `key`: the effect that stopped it
   */
  attemptStop(run) {
    const stop = this.#stops.of(run, boundAttempt(attemptContext, this, run));
    return stop ? { key: stop.key, reason: stop.reason } : null;
  }

  /**
   * durable_ledger.effect_status: the effect's row, or null for a key never seen.
   * @param {string} key
   * @param {string|null} [run]  the effect's run, which a routed Ledger passes on (the
   *   proxy then asks only its shard); ignored otherwise
   * @returns {Promise<EffectRow|null>}
   */
  async effectStatus(key, run = null) {
    const [text, params] = routed(EFFECT_STATUS, [key], this.#routed ? run : null);
    const { rows } = await this.#connection.query(text, params, { statement: 'effect_status', key });
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
   * @returns {Promise<HistoryRow[]>}
   */
  async history(run) {
    const { rows } = await this.#connection.query(HISTORY, [run], { statement: 'history', run });
    return rows;
  }

  /**
   * One attempt at a run: acquire_run (a wait ends after lock_timeout, else
   * durable_ledger.lease_wait_timeout: RunBusy), fn(run) with its calls bound
   * to it, releaseRun(run) in finally once they have ended.  A run this Ledger
   * already holds is refused.
   * @template T
   * @overload
   * @param {string} run
   * @param {(run: string) => T | Promise<T>} fn
   * @returns {Promise<T>}
   */
  /**
   * @template T
   * @overload
   * @param {string} run
   * @param {AttemptOptions} options  model: the model that answers the attempt,
   *   put on every call as meta.model (extension 1.3)
   * @param {(run: string) => T | Promise<T>} fn
   * @returns {Promise<T>}
   */
  /**
   * @template T
   * @param {string} run
   * @param {AttemptOptions | ((run: string) => T | Promise<T>)} options
   * @param {(run: string) => T | Promise<T>} [fn]
   * @returns {Promise<T>}
   * @throws RunAbandoned when a person abandoned the run
   */
  async attempt(run, options, fn) {
    if (typeof options === 'function') [options, fn] = [{}, options];
    if (typeof fn !== 'function') throw new TypeError('attempt(run, [options,] fn): fn must be a function');
    const model = checkModel(options?.model);
    return this.#sessions.attempt(this, run, fn, model);
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
   * have not begun yet throw LeaseLost (a branch that outlived fn never
   * acts under the next attempt), and tokenAttempt waits for the calls in
   * flight to finish (their outcome is reported) before it releases the lease.
   *
   * A timer renews the lease every ttl / 3 until then, also during a long tool
   * or model call; a renewal that fails for another reason than a lost lease
   * is retried within a second (onRenewalError(err) hears of it; by default a
   * process warning).  A lost lease (55L01 from begin_effect or a renewal)
   * stops the attempt: the next guarded() call of it throws LeaseLost
   * without asking the database, lease.signal aborts, lease.check() throws, and
   * so does tokenAttempt() at its end if fn did not throw.  A call that was in
   * flight is not cut short: its outcome is reported (a report needs no lease).
   *
   * @template T
   * @overload
   * @param {string} run
   * @param {(lease: TokenLease) => T | Promise<T>} fn
   * @returns {Promise<T>}
   */
  /**
   * @template T
   * @overload
   * @param {string} run
   * @param {TokenAttemptOptions} options  ttl: seconds the lease lives without
   *   renewal (1 to 86400; default 300); holder: the worker's name in
   *   durable_ledger.leases
   * @param {(lease: TokenLease) => T | Promise<T>} fn
   * @returns {Promise<T>}
   */
  /**
   * @template T
   * @param {string} run
   * @param {TokenAttemptOptions | ((lease: TokenLease) => T | Promise<T>)} options
   * @param {(lease: TokenLease) => T | Promise<T>} [fn]
   * @returns {Promise<T>}
   * @throws RunBusy when a live lease of either kind holds the run (no waiting);
   *   RunAbandoned when a person abandoned the run (do not retry it); LeaseLost
   *   at the end when the lease was lost and fn did not throw
   */
  async tokenAttempt(run, options, fn) {
    if (typeof options === 'function') [options, fn] = [{}, options];
    if (typeof fn !== 'function') throw new TypeError('tokenAttempt(run, [options,] fn): fn must be a function');
    const { ttl = 300, holder = null, onRenewalError = warnRenewalError } = options ?? {};
    const model = checkModel(options?.model);
    if (typeof ttl !== 'number' || !Number.isFinite(ttl)) {
      throw new TypeError('tokenAttempt(): ttl must be a number of seconds');
    }
    return this.#tokens.run(this, run, { ttl, holder, onRenewalError, model }, fn);
  }
}
