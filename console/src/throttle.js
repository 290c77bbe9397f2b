// Failed logins, counted per client address and user name over a minute: a
// password is guessed no faster than the limit, and a stranger's failures for
// one name (or their requests without a form token) lock nobody else out.
// Every login request, good or bad, is also limited per address by
// @fastify/rate-limit, more generously (app.js).
const WINDOW_MS = 60 * 1000;

export class LoginThrottle {
  constructor(limit) {
    this.limit = limit;
    this.failures = new Map();  // "address\0user" -> { count, since }
  }

  key(address, user) {
    return `${address}\u0000${user.toLowerCase()}`;
  }

  /** Milliseconds until this address may try this user again; 0: now. */
  wait(address, user) {
    const entry = this.failures.get(this.key(address, user));
    if (!entry || Date.now() - entry.since > WINDOW_MS) return 0;
    return entry.count >= this.limit ? WINDOW_MS - (Date.now() - entry.since) : 0;
  }

  failed(address, user) {
    const key = this.key(address, user);
    const entry = this.failures.get(key);
    if (!entry || Date.now() - entry.since > WINDOW_MS) this.failures.set(key, { count: 1, since: Date.now() });
    else entry.count += 1;
    if (this.failures.size > 10000) this.forgetOld();
  }

  succeeded(address, user) {
    this.failures.delete(this.key(address, user));
  }

  forgetOld() {
    const now = Date.now();
    for (const [key, entry] of this.failures) if (now - entry.since > WINDOW_MS) this.failures.delete(key);
  }
}
