// A token lease: a row with an expiry, renewed by a timer (renewal.js), whose
// token goes with every call of the attempt, so that its calls may each land
// on another connection of a pg.Pool, or another backend behind PgBouncer in
// transaction mode.

import { LeaseLost } from './errors.js';

/**
 * The AbortController behind each lease's signal (the client's own: see loseLease()).
 * @type {WeakMap<object, AbortController>}
 */
const controllers = new WeakMap();

/**
 * @typedef {{run: string, token: string, epoch: number, expiresAt: Date, holder: string|null, ttl: number}} LeaseFields
 */

/**
 * One attempt at a run under a token lease: what tokenAttempt() hands to its
 * function.  `token` is the capability itself (whoever has it acts for the
 * lease); it is a getter, so that logging the lease does not print it.
 */
export class TokenLease {
  #token;

  /**
   * Private: an application gets its leases from tokenAttempt() (grantedLease()).
   * @private
   * @param {LeaseFields} fields
   */
  constructor({ run, token, epoch, expiresAt, holder, ttl }) {
    controllers.set(this, new AbortController());
    /** @type {string} @readonly */
    this.run = run;
    this.#token = token;
    /** @type {number} the attempt's lease epoch @readonly */
    this.epoch = epoch;
    /** @type {Date} the expiry as of the last renewal (the server's clock decides) */
    this.expiresAt = expiresAt;
    /** @type {string|null} @readonly */
    this.holder = holder;
    /** @type {number} seconds the lease lives without renewal @readonly */
    this.ttl = ttl;
    /** @type {number} renewals that succeeded so far */
    this.renewals = 0;
    /** @type {LeaseLost|null} why the lease is lost, once it is; null while it is held */
    this.lost = null;
  }

  /**
   * The capability itself: whoever has it acts for the lease.  Not serialised by JSON.stringify.
   * @returns {string}
   */
  get token() {
    return this.#token;
  }

  /**
   * Aborted (with the LeaseLost as its reason) when the lease is found
   * lost: pass it to a model call or a fetch so that it stops with the attempt.
   * @returns {AbortSignal}
   */
  get signal() {
    return /** @type {AbortController} */ (controllers.get(this)).signal;
  }

  /** Throws LeaseLost when the lease is known to be lost. */
  check() {
    if (this.lost) {
      throw new LeaseLost(this.lost.message, {
        run: this.run, epoch: this.epoch, reason: this.lost.reason, cause: this.lost,
      });
    }
  }

}

/**
 * Records the loss of `lease` (once), aborts its signal; returns the LeaseLost.
 * @param {TokenLease} lease
 * @param {any} err  what told the client (a 55L01 error), or null
 * @param {string} [message]
 * @returns {LeaseLost}
 */
export function loseLease(lease, err, message) {
  if (!lease.lost) {
    const detail = err?.detail ? `: ${String(err.detail).replace(/\.$/, '')}` : '';
    const what = message ?? `${err?.message ?? err} (lease epoch ${lease.epoch})${detail}`;
    lease.lost = new LeaseLost(
      `${what}; this attempt stops here, and a new one (tokenAttempt) replays what it completed`,
      { run: lease.run, epoch: lease.epoch, cause: err ?? undefined });
    /** @type {AbortController} */ (controllers.get(lease)).abort(lease.lost);
  }
  return lease.lost;
}

/**
 * The TokenLease of a lease that take_lease granted.  (The constructor is
 * private to the client, which calls it through this cast.)
 * @param {LeaseFields} fields
 * @returns {TokenLease}
 */
export function grantedLease(fields) {
  const Lease = /** @type {new (fields: LeaseFields) => TokenLease} */ (/** @type {unknown} */ (TokenLease));
  return new Lease(fields);
}
