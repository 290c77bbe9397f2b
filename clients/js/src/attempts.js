// Which attempt a call belongs to: the attempt whose function made it, through
// the function's async context (AsyncLocalStorage), not a lookup by run.  A
// branch of the function that outlives the attempt (Promise.all whose other
// branch threw) can never act under the next attempt's token, nor fall back to
// a session lease; and the attempt's end waits for its calls in flight.

import { AsyncLocalStorage } from 'node:async_hooks';
import { LedgerError } from './errors.js';

/**
 * Why an attempt stopped: its further calls throw RunStopped (with `key` and
 * `reason`), or error() when given.
 * @typedef {{key: string|null, reason: string, error: (() => Error)|null}} Stop
 */

/**
 * The calls of an attempt in flight (internal), and whether it has ended: a
 * call of it that has not begun when its function settled is refused.
 */
export class Calls {
  /**
   * @param {object} ledger  the Ledger the attempt is of
   * @param {string} run
   */
  constructor(ledger, run) {
    this.ledger = ledger;
    this.run = run;
    /** true once fn has settled: calls not yet begun are refused */
    this.ended = false;
    /** calls past their checks and not yet settled */
    this.inflight = 0;
    /** @type {Array<() => void>} */
    this.waiters = [];
    /** @type {string|null} the model that answers the attempt: meta.model of its calls (1.3) */
    this.model = null;
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

  /**
   * Resolves once no call of the attempt is in flight.
   * @returns {Promise<void>}
   */
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
export class Attempt extends Calls {
  /**
   * @param {object} ledger
   * @param {import('./token-lease.js').TokenLease} lease
   */
  constructor(ledger, lease) {
    super(ledger, lease.run);
    this.lease = lease;
    /** @type {Stop|null} */
    this.stopped = null;
  }
}

/**
 * The token attempts a piece of code runs in: tokenAttempt() runs its function
 * with this store extended by its attempt, and every promise, timer and
 * callback created inside inherits it.  The store is an array of Attempt.
 * @type {AsyncLocalStorage<ReadonlyArray<Attempt>>}
 */
export const attemptContext = new AsyncLocalStorage();

/**
 * The session attempts a piece of code runs in: attempt() runs its function
 * with this store extended by its Calls, as tokenAttempt() does with
 * attemptContext.
 * @type {AsyncLocalStorage<ReadonlyArray<Calls>>}
 */
export const sessionContext = new AsyncLocalStorage();

/**
 * The innermost attempt in `context` of `ledger` at `run` that the calling code runs in, if any.
 * @template {Calls} C
 * @param {AsyncLocalStorage<ReadonlyArray<C>>} context
 * @param {object} ledger
 * @param {string} run
 * @returns {C|null}
 */
export function boundAttempt(context, ledger, run) {
  const store = context.getStore();
  if (!store) return null;
  for (let i = store.length - 1; i >= 0; i -= 1) {
    if (store[i].ledger === ledger && store[i].run === run) return store[i];
  }
  return null;
}

/**
 * Runs fn in `context` extended by `calls`.
 * @template {Calls} C
 * @template T
 * @param {AsyncLocalStorage<ReadonlyArray<C>>} context
 * @param {C} calls
 * @param {() => T} fn
 * @returns {T}
 */
export function runIn(context, calls, fn) {
  return context.run([...(context.getStore() ?? []), calls], fn);
}

/**
 * A second attempt at a run this Ledger holds (a job delivered twice to one
 * process): a session lease belongs to the one connection and would not keep
 * the two apart; they would count their calls in one epoch.
 * @param {string} run
 */
export function attemptAlreadyOpen(run) {
  return new LedgerError(`an attempt at run ${run} is already open in this Ledger: end it (or ` +
    'release the run) before starting another; a second attempt would share its lease epoch');
}
