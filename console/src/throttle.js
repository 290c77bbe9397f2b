// Failed logins, counted per client address and user name over a minute: a
// password is guessed no faster than the limit, and a stranger's failures for
// one name (or their requests without a form token) lock nobody else out.
// A login PostgreSQL has not answered yet counts as a failure until it does:
// guesses sent at once are refused beyond the limit, not all checked.
// Every login request, good or bad, is also limited per address by
// @fastify/rate-limit, more generously (app.js).
const WINDOW_MS = 60 * 1000;
// what a refusal for logins still in flight asks the person to wait
const IN_FLIGHT_WAIT_MS = 1000;
// PostgreSQL reads at most NAMEDATALEN - 1 bytes of a user name (it cuts the
// rest off): names that differ only after them are one role
const NAME_BYTES = 63;

export class LoginThrottle {
  constructor(limit) {
    this.limit = limit;
    this.failures = new Map();  // key -> { count, since }
    this.inFlight = new Map();  // key -> logins begun, not yet answered
  }

  key(address, user) {
    const name = Buffer.from(String(user), 'utf8').subarray(0, NAME_BYTES).toString('latin1');
    return `${address}\u0000${name.replace(/[A-Z]/g, (c) => c.toLowerCase())}`;
  }

  failedNow(key) {
    const entry = this.failures.get(key);
    return !entry || Date.now() - entry.since > WINDOW_MS ? null : entry;
  }

  /**
   * Begins a login of this user from this address: 0 and a token for
   * finished(), or the milliseconds to wait (failures and logins in flight
   * reach the limit).
   */
  begin(address, user) {
    const key = this.key(address, user);
    const entry = this.failedNow(key);
    const failed = entry?.count ?? 0;
    const flying = this.inFlight.get(key) ?? 0;
    if (failed + flying >= this.limit) {
      const wait = failed >= this.limit ? WINDOW_MS - (Date.now() - entry.since) : IN_FLIGHT_WAIT_MS;
      return { wait: Math.max(wait, 1), key: null };
    }
    this.inFlight.set(key, flying + 1);
    return { wait: 0, key };
  }

  /** The login begun with this key was answered: `ok`, or a failure. */
  finished(key, ok) {
    const flying = (this.inFlight.get(key) ?? 1) - 1;
    if (flying > 0) this.inFlight.set(key, flying);
    else this.inFlight.delete(key);
    if (ok) {
      this.failures.delete(key);
      return;
    }
    const entry = this.failedNow(key);
    if (!entry) this.failures.set(key, { count: 1, since: Date.now() });
    else entry.count += 1;
    if (this.failures.size > 10000) this.forgetOld();
  }

  forgetOld() {
    const now = Date.now();
    for (const [key, entry] of this.failures) if (now - entry.since > WINDOW_MS) this.failures.delete(key);
  }
}
