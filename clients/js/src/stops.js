// Runs stopped in their current attempt: after an unknown outcome, a pause, an
// abandoned run, a refused tool or a lost lease, every further call of the
// attempt throws without asking the database (the same call again would be the
// next occurrence, with a new key, and would execute).

import { RunStopped } from './errors.js';

/** @typedef {import('./attempts.js').Stop} Stop */
/** @typedef {import('./attempts.js').Attempt} Attempt */

// Runs stopped in their current session-lease attempt, per client (a session
// lease belongs to the session, so every Ledger on one client shares this):
// run -> {key, reason, error}: its further calls throw RunStopped, or error()
// when given.  A token attempt keeps its own (Attempt.stopped).
/** @type {WeakMap<object, Map<string, Stop>>} */
const stoppedRuns = new WeakMap();

/** The stopped runs of one Ledger: its token attempts', and its client's session attempts'. */
export class Stops {
  /** @param {object} client */
  constructor(client) {
    if (!stoppedRuns.has(client)) stoppedRuns.set(client, new Map());
    /** @type {Map<string, Stop>} */
    this.#session = /** @type {Map<string, Stop>} */ (stoppedRuns.get(client));
  }

  /** @type {Map<string, Stop>} */
  #session;

  /**
   * Stops `run` in its current attempt (the token attempt, or the session's):
   * its further calls throw RunStopped, or `error()` when given.
   * @param {string} run
   * @param {string|null} key
   * @param {string} reason
   * @param {Attempt|null} [attempt]
   * @param {(() => Error)|null} [error]
   */
  stop(run, key, reason, attempt = null, error = null) {
    if (attempt) {
      attempt.stopped ??= { key, reason, error };
    } else if (!this.#session.has(run)) {
      this.#session.set(run, { key, reason, error });
    }
  }

  /**
   * stop() for a recorded call (record()), or a side effect's: a recorded
   * call's needs no person (the next attempt replays it or makes it again),
   * which the RunStopped of its further calls says.
   * @param {boolean} recorded
   * @param {string} run
   * @param {string|null} key
   * @param {string} reason
   * @param {Attempt|null} attempt
   */
  stopCall(recorded, run, key, reason, attempt) {
    if (!recorded) {
      this.stop(run, key, reason, attempt);
      return;
    }
    this.stop(run, key, reason, attempt, () => new RunStopped(
      `run ${run} is stopped in this attempt: ${reason}  End the attempt: no person is needed; a ` +
        'new attempt (attempt() or tokenAttempt()) replays the recorded call or makes it again.',
      { key, decision: null, reason }));
  }

  /**
   * Why `run` is stopped in `attempt` (a token attempt), or in the session's attempt.
   * @param {string} run
   * @param {Attempt|null} attempt
   * @returns {Stop|null|undefined}
   */
  of(run, attempt) {
    return attempt ? attempt.stopped : this.#session.get(run);
  }

  /**
   * The session's attempt at `run` is over (released, or a new one started).
   * @param {string} run
   */
  clear(run) {
    this.#session.delete(run);
  }

  /**
   * Throws what a call of `run` throws when it is stopped in its attempt.
   * @param {string} run
   * @param {Attempt|null} attempt
   */
  check(run, attempt) {
    const stop = this.of(run, attempt);
    if (stop?.error) throw stop.error();
    if (stop) {
      throw new RunStopped(
        `run ${run} is stopped in this attempt: ${stop.reason}  End the attempt; once the ` +
          'effect is resolved, a new attempt (acquireRun, attempt() or tokenAttempt()) replays it.',
        { key: stop.key, decision: null, reason: stop.reason }
      );
    }
  }
}
