// The token attempts of a Ledger (tokenAttempt()): take_lease, the function
// run in the attempt's async context with the lease renewed, release_lease at
// the end.  Each statement is a transaction of its own, so that the calls of
// one attempt may land on different backends (a pg.Pool, PgBouncer in
// transaction mode).

import { Attempt, attemptAlreadyOpen, attemptContext, runIn } from './attempts.js';
import { RunBusy } from './errors.js';
import { renew } from './renewal.js';
import { RUN_ABANDONED, abandoned } from './sqlstates.js';
import { RELEASE_LEASE, TAKE_LEASE } from './statements.js';
import { grantedLease, loseLease } from './token-lease.js';

/** @typedef {import('./connection.js').Connection} Connection */
/** @typedef {import('./token-lease.js').TokenLease} TokenLease */

/** The token attempts one Ledger has open. */
export class TokenAttempts {
  /** @param {Connection} connection */
  constructor(connection) {
    this.#connection = connection;
  }

  #connection;
  /** @type {Map<string, Attempt>} the open token attempts of this Ledger, by run */
  #attempts = new Map();
  /** @type {Set<string>} runs whose tokenAttempt is taking its lease */
  #opening = new Set();

  /**
   * Whether this Ledger has a token attempt open at `run`.
   * @param {string} run
   */
  has(run) {
    return this.#attempts.has(run);
  }

  /**
   * One attempt at `run` under a token lease (Ledger.tokenAttempt, its options checked).
   * When fn settles, the attempt ends: calls of it that have not begun yet throw
   * LeaseLost, and the calls in flight finish (their outcome is reported)
   * before the lease is released.
   * @template T
   * @param {object} ledger  the Ledger of the attempt
   * @param {string} run
   * @param {{ttl: number, holder: string|null, onRenewalError: (err: unknown, lease: TokenLease) => void, model?: string|null}} options
   * @param {(lease: TokenLease) => T | Promise<T>} fn
   * @returns {Promise<T>}
   */
  async run(ledger, run, { ttl, holder, onRenewalError, model = null }, fn) {
    if (this.#attempts.has(run) || this.#opening.has(run)) throw attemptAlreadyOpen(run);
    this.#opening.add(run);
    /** @type {Attempt} */
    let attempt;
    try {
      let r;
      try {
        [r] = await this.#connection.statement(`take_lease of ${run}`, TAKE_LEASE, [run, ttl, holder],
          { statement: 'take_lease', run });
      } catch (err) {
        if (/** @type {any} */ (err)?.code === RUN_ABANDONED) throw abandoned(run, err);
        throw err;
      }
      if (r.token === null) {
        throw new RunBusy(`run ${run} is held by a live lease (another worker's attempt)`);
      }
      const lease = grantedLease({
        run, token: r.token, epoch: Number(r.epoch), expiresAt: r.expires_at, holder: r.holder, ttl,
      });
      attempt = new Attempt(ledger, lease);
      attempt.model = model;
      this.#attempts.set(run, attempt);
    } finally {
      this.#opening.delete(run);
    }
    const { lease } = attempt;

    const renewal = renew(this.#connection, lease, onRenewalError);
    /** @type {T|undefined} */
    let result;
    let failed = false;
    /** @type {unknown} */
    let error;
    try {
      result = await runIn(attemptContext, attempt, () => fn(lease));
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
        const [r] = await this.#connection.statement(`release_lease of ${run}`, RELEASE_LEASE, [lease.token],
          { statement: 'release_lease', run });
        if (!r.released) {
          loseLease(lease, null, `the token lease on run ${run} (epoch ${lease.epoch}) was no longer live ` +
            'at the end of the attempt (it expired or was broken)');
        }
      } catch (releaseErr) {
        // fn's error matters more; the lease expires by itself
        if (!failed) throw releaseErr;
      }
    }
    if (failed) throw error;
    lease.check();
    return /** @type {T} */ (result);
  }
}
