// durable-ledger: the Node.js client of the durable_ledger PostgreSQL extension.
//
// Every side effect goes through begin_effect (the intent is recorded and
// committed before the effect), then complete_effect or fail_effect.  The
// extension decides; the client only turns its decisions into control flow.
// This module is the package's public API; the modules it re-exports, each
// importing only those below it:
//
//   ledger.js            the Ledger: guarded(), record(), tool(), the attempts
//   call-flow.js         one guarded call: begin, the tool, the report
//   token-attempts.js    tokenAttempt(): take_lease, the attempt, release_lease
//   renewal.js           a token lease's renewal timer
//   session-attempts.js  attempt(), acquireRun(), releaseRun(): session leases
//   session-guard.js     the statements that check a session lease where they run
//   reconcile.js         a paused unknown outcome settled from the provider's record
//   decisions.js         begin_effect's decisions and the reports' answers as control flow
//   stops.js             attempts stopped after a pause, an unknown outcome, a lost lease
//   attempts.js          which attempt a call belongs to (its async context)
//   token-lease.js       TokenLease, what tokenAttempt() hands to its function
//   connection.js        one statement on a Client or a Pool, its notices, its transaction
//   notices.js           the server's WARNINGs and NOTICEs as 'notice' events
//   statements.js        the ledger's statements and their parameters
//   sqlstates.js         the ledger's SQLSTATEs and the errors they become
//   errors.js            the errors, named as the Python client's
//   text.js              values and server errors as text for messages
//   types.js             the public types that have no code of their own
//
// The type declarations (types/*.d.ts, package.json "types") are generated
// from the JSDoc of these modules by `npm run build` (tsc, which also checks
// the code against its JSDoc): see docs/reference.md, "Types".

export { Ledger } from './ledger.js';
export { TokenLease } from './token-lease.js';
export { NOTICE_CODES } from './notices.js';
export { Happened, NotHappened } from './reconcile.js';
export { LEASE_LOST, RUN_ABANDONED, TOOL_REFUSED } from './sqlstates.js';
export {
  LedgerError, EffectFailed, EffectPaused, DivergencePaused, AwaitingApproval, BudgetExhausted, EffectInProgress, RunStopped, RunAbandoned, ToolRefused,
  RunBusy, LeaseLost, PoolerDetected, LedgerRefused, InvalidArgument, BusinessKeyConflict, NotFound, RunExists,
  WrongState, ConcurrentChange, ReadOnlyLedger, TooManyLeases, PermissionDenied, EffectDidNotHappen,
  // deprecated: the names of durable-ledger 1.2, the same classes
  DivergencePausedError, RunAbandonedError, ToolRefusedError, LeaseLostError,
} from './errors.js';

// The public types (for TypeScript; nothing at run time).
/** @typedef {import('./connection.js').Queryable} Queryable */
/** @typedef {import('./notices.js').LedgerNotice} LedgerNotice */
/** @typedef {import('./ledger.js').LedgerEvents} LedgerEvents */
/** @typedef {import('./decisions.js').Decision} Decision */
/** @typedef {import('./decisions.js').DecisionWord} DecisionWord */
/** @typedef {import('./decisions.js').EffectStatusWord} EffectStatusWord */
/** @typedef {import('./types.js').EffectRow} EffectRow */
/** @typedef {import('./types.js').HistoryRow} HistoryRow */
/** @typedef {import('./types.js').CallOptions} CallOptions */
/** @typedef {import('./types.js').ToolOptions} ToolOptions */
/** @typedef {import('./reconcile.js').Reconcile} Reconcile */
/** @typedef {import('./types.js').BeginEffectOptions} BeginEffectOptions */
/** @typedef {import('./types.js').TokenAttemptOptions} TokenAttemptOptions */
/** @typedef {import('./types.js').LedgerOptions} LedgerOptions */
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
