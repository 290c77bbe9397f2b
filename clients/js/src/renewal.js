// The renewal of a token lease: a timer renews it every ttl / 3 while its
// attempt runs, also during a long tool or model call.  A renewal that fails
// for another reason than a lost lease is retried within a second; a lost
// lease (55L01) is recorded on the lease, which stops the attempt.

import { attemptContext } from './attempts.js';
import { LEASE_LOST } from './sqlstates.js';
import { RENEW_LEASE } from './statements.js';
import { describe } from './text.js';
import { loseLease } from './token-lease.js';

/** @typedef {import('./token-lease.js').TokenLease} TokenLease */
/** @typedef {import('./connection.js').Connection} Connection */

/**
 * By default a renewal that failed is a process warning.
 * @param {unknown} err
 * @param {TokenLease} lease
 */
export function warnRenewalError(err, lease) {
  process.emitWarning(
    `could not renew the token lease on run ${lease.run} (retrying): ${describe(/** @type {any} */ (err)?.message ?? err)}`,
    'DurableLedgerWarning');
}

/**
 * Starts the renewal timer of a token attempt; stop() ends it and waits for a renewal in flight.
 * @param {Connection} connection
 * @param {TokenLease} lease
 * @param {(err: unknown, lease: TokenLease) => void} onRenewalError
 * @returns {{stop: () => Promise<void>}}
 */
export function renew(connection, lease, onRenewalError) {
  const every = (lease.ttl * 1000) / 3;
  let stopped = false;
  /** @type {ReturnType<typeof setTimeout>|null} */
  let timer = null;
  /** @type {Promise<void>} */
  let inFlight = Promise.resolve();
  /** @param {number} ms */
  const schedule = (ms) => {
    timer = setTimeout(tick, ms);
    timer.unref?.();
  };
  const tick = () => {
    timer = null;
    inFlight = (async () => {
      let wait = every;
      try {
        const [r] = await connection.statement(`renew_lease of ${lease.run}`, RENEW_LEASE, [lease.token],
          { statement: 'renew_lease', run: lease.run });
        if (stopped) return;
        lease.expiresAt = r.expires_at;
        lease.renewals += 1;
      } catch (err) {
        if (stopped) return;
        if (/** @type {any} */ (err)?.code === LEASE_LOST) {
          loseLease(lease, err);
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
