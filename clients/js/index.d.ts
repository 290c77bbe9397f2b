// Type declarations for durable-ledger (hand-written; the package is plain ES modules).

import { EventEmitter } from 'node:events';

/**
 * Anything with node-postgres' query(): a pg Client or PoolClient (session and token
 * leases), or a pg.Pool (token leases only: each query may run on another connection).
 */
export interface Queryable {
  query(text: string, values?: unknown[]): Promise<{ rows: any[] }>;
  /** pg >= 8.21: 'I' idle, 'T' in a transaction, 'E' in a failed transaction. */
  getTransactionStatus?(): string | null;
}

/** The SQLSTATE of a lost token lease: expired, released, superseded or unknown. */
export const LEASE_LOST: '55L01';

/** The SQLSTATE of a call of a run that a person abandoned (begin_effect, acquire_run, take_lease). */
export const RUN_ABANDONED: '55L02';

/** The SQLSTATE of a call that would execute a retired tool, or an unregistered one under `refuse`. */
export const TOOL_REFUSED: '55L03';

/** The SQLSTATEs of the ledger's own WARNINGs (extension 1.3), as LedgerNotice.code. */
export const NOTICE_CODES: {
  /** a call executed although it diverges from the run's earlier attempts (divergence policy `warn`) */
  readonly DIVERGENCE: '01L01';
  /** a call of a tool nobody registered (set_unregistered_tools('warn')) */
  readonly UNREGISTERED: '01L02';
  /** a report kept as a conflict, the effect flagged for a person */
  readonly CONFLICT: '01L03';
  /** a report kept as superseded (a recorded call made again; nobody is needed) */
  readonly SUPERSEDED: '01L04';
};

/**
 * What the ledger's 'notice' event carries: a WARNING or NOTICE the server sent on one
 * of the Ledger's statements (origin 'server'), or one the client itself must give
 * (origin 'client': a session lock it could not end, code 42501).
 */
export interface LedgerNotice {
  origin: 'server' | 'client';
  /** 'WARNING', 'NOTICE', ... */
  severity: string | null;
  /** The SQLSTATE: 01L01 divergence (warn), 01L02 unregistered tool (warn), 01L03 conflict, 01L04 superseded report. */
  code: string | null;
  message: string;
  detail: string | null;
  hint: string | null;
  /** The ledger function of the statement: begin_effect, begin_recorded, complete_effect, fail_effect, ... */
  statement: string | null;
  run: string | null;
  tool: string | null;
  /** The call's own key (a begin's decision row), or the reported effect's; null when not known. */
  key: string | null;
  /** 01L01: the effect that the call may duplicate (named in the DETAIL). */
  mayDuplicate?: string | null;
  /** origin 'client', 42501: the backend that still holds the attempt's session lock. */
  pid?: number;
  /** origin 'client', 42501: the epoch of that lease. */
  epoch?: number;
}

export interface LedgerOptions {
  /** false: notices nobody listens to ('notice') are dropped instead of written with console.warn. Default true. */
  consoleWarn?: boolean;
}

/**
 * What a value becomes when the ledger records it (a JSON round trip), which guarded(),
 * record() and tools resolve to, on a first run and on a replay alike: a Date becomes its
 * ISO string (anything with toJSON, what that returns), undefined and functions become
 * null (in an object they are left out), other values keep their shape.
 */
export type Recorded<T> =
  0 extends 1 & T ? any
  : unknown extends T ? unknown
  : T extends string | number | boolean | null ? T
  : T extends bigint ? never
  : T extends undefined | symbol | ((...args: any[]) => unknown) ? null
  : T extends { toJSON(...args: any[]): infer J } ? Recorded<J>
  : T extends readonly unknown[] ? { -readonly [I in keyof T]: Recorded<T[I]> }
  : T extends object ? { -readonly [K in keyof T as RecordedKey<T, K>]: Recorded<Exclude<T[K], undefined>> }
  : unknown;

/** The keys of T that JSON keeps: not symbols, not functions, not always undefined. */
type RecordedKey<T, K extends keyof T> =
  K extends symbol ? never
  : [T[K]] extends [undefined | symbol | ((...args: any[]) => unknown)] ? never
  : K;

export type DecisionWord = 'execute' | 'replay' | 'pause' | 'in_progress';
export type EffectStatusWord = 'started' | 'completed' | 'failed' | 'unknown';

/** A row of durable_ledger.decision, as begin_effect returns it. */
export interface Decision {
  key: string;
  decision: DecisionWord;
  /**
   * The effect's status after the call; null for a call paused because it diverges from
   * the run's earlier attempts (decision `pause`: nothing was recorded for it).
   */
  status: EffectStatusWord | null;
  occurrence: number | null;
  /**
   * 1; for a business key, n+1 after n recorded failures; null with a null status.
   * guarded() names it in its report (complete_effect / fail_effect), so the report
   * decides this attempt only.
   */
  attempt: number | null;
  result: unknown;
  error: unknown;
  reason: string | null;
  /**
   * The key to give the provider: the effect's key, or for a business key the key and
   * its attempt ("INV-9#2"), so that a provider that keeps its answers to a key sees a
   * business key's next attempt as a new request; null when the call has no effect.
   */
  downstream_key: string | null;
}

/** A row of durable_ledger.effects, as effect_status returns it. */
export interface EffectRow {
  key: string;
  run: string;
  tool: string;
  args: unknown;
  business_key: boolean;
  occurrence: number | null;
  attempt: number;
  status: EffectStatusWord;
  result: unknown;
  error: unknown;
  meta: unknown;
  /** bigint: node-postgres returns it as a string */
  lease_epoch: string;
  holder_pid: number;
  created_at: Date;
  completed_at: Date | null;
  resolved_by: string | null;
  resolution_note: string | null;
  conflict: boolean;
  /** In a forked run (extension 1.2): the effect of the source run it carries. */
  forked_from?: string | null;
}

/**
 * A row of durable_ledger.history(run) (extension 1.2): one audit event of the run.
 * node-postgres returns the bigint columns (id, lease_epoch) as strings.
 */
export interface HistoryRow {
  id: string;
  logged_at: Date;
  /** The attempt (lease epoch) the event belongs to; null for an event outside any. */
  lease_epoch: string | null;
  /**
   * lease_acquired, lease_released, lease_broken, intent, replay, pause, in_progress,
   * completed, late_completion, failed, late_failure, resolved, conflict, divergence,
   * divergence_resolved, run_abandoned, run_forked, ...
   */
  event: string;
  key: string | null;
  tool: string | null;
  args: unknown;
  /** The attempt of the key the event concerns. */
  attempt: number | null;
  /** The result or error the event concerns. */
  outcome: unknown;
  detail: unknown;
  role_name: string | null;
  application_name: string | null;
}

export interface CallOptions {
  /** An operation identity shared across runs (invoice number, order id). */
  businessKey?: string | null;
  /** Free JSON stored with the intent (model, prompt version, trace id...). */
  meta?: unknown;
}

export interface BeginEffectOptions extends CallOptions {
  /** A token lease (or its token): the call belongs to that lease's epoch, no session lock. */
  lease?: TokenLease | string | null;
}

export interface TokenAttemptOptions {
  /** Seconds the lease lives without renewal: 1 to 86400 (the server checks). Default 300. */
  ttl?: number;
  /** The worker's name, shown in durable_ledger.leases. */
  holder?: string | null;
  /**
   * Hears of a renewal that failed for another reason than a lost lease (it is retried
   * within a second). Default: a process warning (DurableLedgerWarning).
   */
  onRenewalError?: (err: unknown, lease: TokenLease) => void;
}

/** One attempt at a run under a token lease: what tokenAttempt() hands to its function. */
export class TokenLease {
  private constructor();
  readonly run: string;
  /** The capability itself: whoever has it acts for the lease. Not serialised by JSON.stringify. */
  readonly token: string;
  /** The attempt's lease epoch. */
  readonly epoch: number;
  /** The expiry as of the last renewal (the server's clock decides). */
  expiresAt: Date;
  readonly holder: string | null;
  /** Seconds the lease lives without renewal. */
  readonly ttl: number;
  /** Renewals that succeeded so far. */
  renewals: number;
  /** Why the lease is lost, once it is; null while it is held. */
  lost: LeaseLostError | null;
  /** Aborted, with the LeaseLostError as its reason, when the lease is found lost. */
  readonly signal: AbortSignal;
  /** Throws LeaseLostError when the lease is known to be lost. */
  check(): void;
}

export interface GuardedCall<T> extends CallOptions {
  run: string;
  tool: string;
  /** Any JSON value; key order, white space and number spelling do not matter. */
  args: unknown;
  /** Performs the effect; pass `key` downstream as the idempotency key. */
  perform: (key: string) => T | Promise<T>;
}

/** A call that is harmless to make again (a model's turn, a read): Ledger.record(). */
export interface RecordedCall<T> {
  run: string;
  /** Its name, e.g. "model". */
  tool: string;
  /** Its JSON input (the messages so far); key order and white space do not matter. */
  args: unknown;
  /** Makes the call; its result is recorded, and replayed instead of calling again. */
  call: () => T | Promise<T>;
  /** Free JSON stored with the intent (model name, prompt version). */
  meta?: unknown;
}

/** Base class of every error raised about a ledger decision. */
export class LedgerError extends Error {
  constructor(
    message: string,
    fields?: { key?: string | null; decision?: string | null; reason?: string | null; cause?: unknown }
  );
  key: string | null;
  decision: string | null;
  reason: string | null;
}

/** The effect is recorded as failed (now, or replayed from an earlier attempt). Nothing happened. */
export class EffectFailed extends LedgerError {
  constructor(
    message: string,
    fields: { key: string; decision: string; reason?: string | null; error?: unknown; replayed: boolean; cause?: unknown }
  );
  key: string;
  /** The recorded error (JSON). */
  error: unknown;
  /** true when an earlier attempt's recorded failure was replayed. */
  replayed: boolean;
}

/** `pause`: an earlier attempt's outcome is unknown; a person must resolve_effect it. */
export class EffectPaused extends LedgerError {
  key: string;
  /** The key the provider was given (the key, or key#attempt for a business key): what to ask it about; null when the client stopped the run without asking the database. */
  readonly downstreamKey: string | null;
}

/**
 * `pause` with a null status: the call diverges from the run's earlier attempts (it may be
 * an effect they recorded, made again with drifted arguments). Nothing was performed or
 * recorded; it is listed in durable_ledger.unresolved (`may_duplicate`). An EffectPaused:
 * the attempt stops like on any pause. A person decides with
 * durable_ledger.resolve_divergence(key, 'same' | 'distinct', resolved_by, note); the next
 * attempt then replays the earlier effect's outcome (same) or executes the call (distinct).
 */
export class DivergencePausedError extends EffectPaused {
  constructor(
    message: string,
    fields: { key: string; run: string; tool: string; reason?: string | null; cause?: unknown }
  );
  /** The drifted call's own key: the one to pass to resolve_divergence. */
  key: string;
  decision: 'pause';
  run: string;
  tool: string;
}

/**
 * SQLSTATE 55L02: a person abandoned the run (abandon_run). Nothing was performed or
 * written. The attempt stops (further calls throw this again without asking the database),
 * and a new attempt (attempt(), acquireRun(), tokenAttempt()) throws it at its start.
 * Do not retry the run: it is stopped for good (an admin may fork it into a new run).
 */
export class RunAbandonedError extends LedgerError {
  constructor(message: string, fields: { run: string; reason?: string | null; cause?: unknown });
  key: null;
  decision: null;
  run: string;
}

/**
 * SQLSTATE 55L03: the ledger refuses to execute the tool: it is retired, or nobody
 * registered it and the ledger refuses tools nobody registered (set_unregistered_tools('refuse', ...)). Nothing was recorded or
 * performed. The attempt stops (further calls throw RunStopped): an admin registers the
 * tool, then a new attempt may go on. What a retired tool recorded still replays.
 */
export class ToolRefusedError extends LedgerError {
  constructor(message: string, fields: { run: string; tool: string; reason?: string | null; cause?: unknown });
  key: null;
  decision: null;
  run: string;
  tool: string;
}

/** `in_progress`: another live lease is performing this business key right now. */
export class EffectInProgress extends LedgerError {
  key: string;
}

/**
 * A guarded call on a run whose current attempt already hit an unknown outcome or a pause.
 * Going on would be unsafe (a repeated call is the next occurrence, with a new key, and would
 * execute). End the attempt; once resolved, a new attempt (acquireRun / attempt()) replays it.
 * `key` is the effect that stopped the run.
 */
export class RunStopped extends LedgerError {
  /** null when a token attempt stopped because a begin_effect's outcome is unknown. */
  key: string | null;
}

/** tokenAttempt(): a live lease of either kind holds the run (take_lease never waits). */
export class RunBusy extends LedgerError {
  /** 55P03 when a lease wait ended or a token lease holds the run; null from tokenAttempt(). */
  readonly sqlstate: string | null;
  /** The server's detail: who holds the run (backend, application, since when). */
  readonly detail: string | null;
}

/** The ledger refused the statement with a SQLSTATE of its list and wrote nothing. */
export class LedgerRefused extends LedgerError {
  readonly sqlstate: string;
  readonly detail: string | null;
  readonly hint: string | null;
}
/** 22004, 22023 */
export class InvalidArgument extends LedgerRefused {}
/**
 * 23505: a business key begun again with another tool or other args; nothing written. The same
 * operation with reworded free text wants key_fields on its tool (register_tool / change_tool:
 * the call then replays); a new business key would perform it again. `hint` says which applies.
 */
export class BusinessKeyConflict extends LedgerRefused {}
/** 42704 */
export class NotFound extends LedgerRefused {}
/** 42710 */
export class RunExists extends LedgerRefused {}
/** 55000 (also a session lease lost behind the ledger's back) */
export class WrongState extends LedgerRefused {}
/** 40001: retry the call */
export class ConcurrentChange extends LedgerRefused {}
/** 25006 */
export class ReadOnlyLedger extends LedgerRefused {}
/** 53400 */
export class TooManyLeases extends LedgerRefused {}
/** 42501: grant durable_ledger_worker, durable_ledger_auditor or durable_ledger_admin */
export class PermissionDenied extends LedgerRefused {}

/**
 * The token lease of this attempt is gone (SQLSTATE 55L01: expired, broken by an admin,
 * released, superseded), or the call belongs to a token attempt that has ended (its fn
 * settled while the call's branch was still running: nothing was begun). The attempt stops:
 * every further call throws this without asking the database; a call that was in flight had
 * its outcome reported; the next attempt (a new tokenAttempt) replays what was completed.
 */
export class LeaseLostError extends LedgerError {
  constructor(message: string, fields: { run: string; epoch: number; reason?: string | null; cause?: unknown });
  key: null;
  decision: null;
  /** The run of the lost attempt. */
  run: string;
  /** The lease epoch (the attempt) that was lost. */
  epoch: number;
}

/**
 * A session attempt (attempt(), acquireRun()) whose statement reached another server
 * connection than the one whose session holds the attempt's lease, or one whose lease of
 * the run another attempt has taken over since: a transaction pooler (PgBouncer with
 * pool_mode = transaction, a pooled endpoint) is between the client and the database.
 * The call was not made (the database checked in the same statement): nothing was
 * performed or recorded. The attempt stops like on any lost lease (further calls throw
 * this without asking the database); its end releases the lock where it is held
 * (release_attempt). Use tokenAttempt() behind a transaction pooler. The same name as the
 * Python client's.
 */
export class PoolerDetected extends LeaseLostError {
  constructor(
    message: string,
    fields: {
      run: string; epoch: number; pid: number; reachedPid: number; reachedEpoch?: number | null;
      reason?: string | null; cause?: unknown;
    }
  );
  /** The backend whose session holds the attempt's lease. */
  pid: number;
  /** The backend the statement reached. */
  reachedPid: number;
  /** The epoch that backend's session holds the run at; null when none. */
  reachedEpoch: number | null;
}

/** Throw from perform() when the downstream API definitively refused before changing anything. */
export class EffectDidNotHappen extends Error {
  constructor(error?: unknown, message?: string);
  /** JSON recorded with fail_effect. */
  error: unknown;
}

/**
 * A Ledger is an EventEmitter: 'notice' carries every WARNING and NOTICE the server sent on
 * one of its statements (and what the client itself must warn about), as a LedgerNotice.
 * With no 'notice' listener they are written with console.warn, unless the Ledger was made
 * with {consoleWarn: false}.
 */
export class Ledger extends EventEmitter {
  /**
   * @param client a connected pg Client or PoolClient, or a pg.Pool. A session lease is a
   *   session lock: use the same client for a whole attempt; never a transaction-pooling
   *   PgBouncer (a statement that reaches another server connection throws PoolerDetected
   *   before anything is called). A token lease (tokenAttempt) works on any of them; a
   *   pg.Pool serves token leases only (session-lease calls throw LedgerError). A single
   *   client must be dedicated to the Ledger (tools must not run transactions on it): a
   *   ledger statement that ran inside another transaction on it is refused (LedgerError),
   *   its effect not performed.
   */
  constructor(client: Queryable, options?: LedgerOptions);
  readonly client: Queryable;

  on(event: 'notice', listener: (notice: LedgerNotice) => void): this;
  on(event: string | symbol, listener: (...args: any[]) => void): this;
  once(event: 'notice', listener: (notice: LedgerNotice) => void): this;
  once(event: string | symbol, listener: (...args: any[]) => void): this;
  addListener(event: 'notice', listener: (notice: LedgerNotice) => void): this;
  addListener(event: string | symbol, listener: (...args: any[]) => void): this;
  off(event: 'notice', listener: (notice: LedgerNotice) => void): this;
  off(event: string | symbol, listener: (...args: any[]) => void): this;
  removeListener(event: 'notice', listener: (notice: LedgerNotice) => void): this;
  removeListener(event: string | symbol, listener: (...args: any[]) => void): this;
  emit(event: 'notice', notice: LedgerNotice): boolean;
  emit(event: string | symbol, ...args: any[]): boolean;

  /** durable_ledger.begin_effect, as is (no transaction check, no control flow). */
  beginEffect(run: string, tool: string, args: unknown, options?: BeginEffectOptions): Promise<Decision>;

  /**
   * Runs one side effect at most once. Resolves to the result as recorded in the ledger
   * (a JSON round trip of what perform returned; undefined becomes null). The outcome is
   * reported on the attempt that begin_effect executed.
   * Inside tokenAttempt(run, ...) (in its fn's async context) the call belongs to that attempt
   * and passes the lease's token to begin_effect; once the attempt has ended, such a call
   * throws LeaseLostError and performs nothing. While a token attempt is open on the run, a
   * call from outside its async context throws LedgerError; so does a call outside any
   * attempt (attempt(), tokenAttempt() or acquireRun()): a Ledger takes no lease implicitly.
   * A pause, an unknown outcome, an abandoned run and a refused tool stop the attempt: its
   * further calls throw RunStopped (RunAbandonedError again for an abandoned run).
   * @throws EffectFailed, EffectPaused (DivergencePausedError for a call that diverges from
   *   the run's earlier attempts), EffectInProgress, RunAbandonedError (55L02),
   *   ToolRefusedError (55L03), RunStopped, LeaseLostError (PoolerDetected for a session
   *   attempt behind a transaction pooler), LedgerError, or perform's own error (outcome
   *   unknown: the next attempt pauses).
   */
  guarded<T = unknown>(call: GuardedCall<T>): Promise<Recorded<Awaited<T>>>;

  /**
   * A call that is harmless to make again (a model's turn, a read), made once per logical
   * action through begin_recorded: its result is recorded and replayed like an effect's. If
   * call() throws, nothing is recorded and the attempt stops (RunStopped afterwards); the
   * next attempt makes it again (attempt 2) instead of pausing, as when the worker dies
   * during it. A tool
   * registered as side-effecting is refused (ToolRefusedError).
   * @throws EffectFailed (call threw EffectDidNotHappen, now or replayed), EffectPaused,
   *   ToolRefusedError, RunStopped, LeaseLostError, LedgerError, or call's own error.
   */
  record<T = unknown>(call: RecordedCall<T>): Promise<Recorded<Awaited<T>>>;

  /**
   * Wraps a side-effecting tool: fn(args, idempotencyKey) runs only on `execute`. The
   * wrapped tool resolves to fn's result as recorded (Recorded<R>), also on a replay.
   */
  tool<A = unknown, R = unknown>(
    name: string,
    fn: (args: A, idempotencyKey: string) => R | Promise<R>
  ): (run: string, args: A, options?: CallOptions) => Promise<Recorded<Awaited<R>>>;

  /**
   * durable_ledger.acquire_run: takes the lease and starts a new attempt.
   * @throws RunAbandonedError when a person abandoned the run.
   */
  acquireRun(run: string, options?: { wait?: boolean }): Promise<boolean>;

  /**
   * durable_ledger.release_run: false when this session did not hold the run. For an
   * attempt this Ledger started, only where its lease is: a release that reached another
   * server connection (a transaction pooler) ends the lease where it is held
   * (release_attempt; a 'notice' says so when the role may not) and throws PoolerDetected,
   * unless a call of the attempt threw it already.
   */
  releaseRun(run: string): Promise<boolean>;

  /** durable_ledger.effect_status: the row, or null for a key never seen. */
  effectStatus(key: string): Promise<EffectRow | null>;

  /**
   * durable_ledger.history(run) (extension 1.2): the run's audit events, oldest first.
   * Needs the durable_ledger_auditor role (or admin): a worker role alone gets a
   * permission error (SQLSTATE 42501). On a pg.Pool it uses a connection of the pool.
   */
  history(run: string): Promise<HistoryRow[]>;

  /** acquireRun(run), fn(run), releaseRun(run) in finally; RunAbandonedError for an abandoned run. */
  attempt<T>(run: string, fn: (run: string) => T | Promise<T>): Promise<T>;

  /**
   * One attempt at a run under a token lease: take_lease, fn(lease) with the lease renewed
   * every ttl / 3, release_lease at the end. Every guarded() call on `run` made by fn or by
   * what fn started (its async context) passes the token; each statement is a transaction of
   * its own, on whatever connection. When fn settles the attempt ends: its calls not begun
   * yet throw LeaseLostError, and the calls in flight finish (reported) before the release.
   * @throws RunBusy when a live lease holds the run; RunAbandonedError when a person
   *   abandoned the run; LeaseLostError at the end when the lease was lost and fn did not
   *   throw.
   */
  tokenAttempt<T>(run: string, fn: (lease: TokenLease) => T | Promise<T>): Promise<T>;
  tokenAttempt<T>(
    run: string,
    options: TokenAttemptOptions,
    fn: (lease: TokenLease) => T | Promise<T>
  ): Promise<T>;
}
