// The session attempts of a Ledger (attempt(), acquireRun()): a session lease
// is an advisory lock of the one connection that makes every call of the
// attempt.  Each statement of the attempt checks, in the database, that it
// reached the session holding the attempt's epoch (session-guard.js): behind a
// transaction pooler a call throws PoolerDetected before anything is called,
// and the attempt's end releases the lock where it is held.

import { Calls, attemptAlreadyOpen, runIn, sessionContext } from './attempts.js';
import { isPool } from './connection.js';
import { LeaseLost, LedgerError, PoolerDetected } from './errors.js';
import { ACQUIRE_ATTEMPT, END_ATTEMPT_ELSEWHERE, RELEASE_ATTEMPT, RELEASE_RUN, missed } from './session-guard.js';
import { RUN_ABANDONED, abandoned } from './sqlstates.js';

/** @typedef {import('./connection.js').Connection} Connection */
/** @typedef {import('./stops.js').Stops} Stops */
/** @typedef {import('./notices.js').LedgerNotice} LedgerNotice */

/**
 * The lease of a session attempt: its epoch (bigint, as text) and the backend
 * whose session holds it.
 * @typedef {{epoch: string|null, pid: number}} SessionLease
 */

/** The session attempts one Ledger started, and the runs it holds. */
export class SessionAttempts {
  /**
   * @param {Connection} connection
   * @param {Stops} stops
   * @param {(notice: LedgerNotice) => void} notify
   */
  constructor(connection, stops, notify) {
    this.#connection = connection;
    this.#stops = stops;
    this.#notify = notify;
  }

  #connection;
  #stops;
  #notify;
  /**
   * @type {Map<string, SessionLease>} the session attempts this Ledger started
   *   (attempt(), acquireRun()), by run
   */
  #leases = new Map();
  /** @type {Map<string, Calls>} runs with an open attempt() */
  #sessions = new Map();
  /** @type {Set<string>} runs whose acquireRun is under way */
  #acquiring = new Set();
  /** @type {Set<string>} runs this Ledger holds by an explicit acquireRun() */
  #held = new Set();

  /**
   * A session lease needs one connection for the whole attempt: not a pool.
   * @param {string} what
   */
  sessionOnly(what) {
    if (isPool(this.#connection.client)) {
      throw new LedgerError(
        `${what} needs a session lease, which belongs to one connection for the whole attempt; ` +
          'this Ledger was given a pg.Pool: run the attempt in ledger.tokenAttempt(run, fn)');
    }
  }

  /**
   * The lease of the session attempt this Ledger started at `run`, if any.
   * @param {string} run
   */
  lease(run) {
    return this.#leases.get(run);
  }

  /**
   * The model of the attempt() open at `run`, or null.
   * @param {string} run
   * @returns {string|null}
   */
  modelOf(run) {
    return this.#sessions.get(run)?.model ?? null;
  }

  /**
   * Whether an attempt() at `run` is open.
   * @param {string} run
   */
  isOpen(run) {
    return this.#sessions.has(run);
  }

  /**
   * Whether this Ledger holds `run` by an explicit acquireRun().
   * @param {string} run
   */
  isHeld(run) {
    return this.#held.has(run);
  }

  /**
   * Claims the run for one attempt of this Ledger before its acquire_run goes
   * out (synchronously: two at once, a job delivered twice, would share one
   * lease epoch).
   * @param {string} run
   */
  #reserve(run) {
    if (this.#sessions.has(run) || this.#held.has(run) || this.#acquiring.has(run)) {
      throw attemptAlreadyOpen(run);
    }
    this.#acquiring.add(run);
  }

  /**
   * acquireRun(): reserves the run, then acquire_run.
   * @param {string} run
   * @param {boolean} wait
   * @returns {Promise<boolean>}
   */
  async acquireRun(run, wait) {
    this.sessionOnly('acquireRun()');
    this.#reserve(run);
    try {
      return await this.#acquire(run, wait);
    } finally {
      this.#acquiring.delete(run);
    }
  }

  /**
   * acquire_run, with the epoch of the lease it took and the backend that holds
   * it, which every guarded statement of the attempt checks (session-guard.js).
   * @param {string} run
   * @param {boolean} wait
   * @returns {Promise<boolean>}
   */
  async #acquire(run, wait) {
    let r;
    try {
      [r] = await this.#connection.statement(`acquire_run of ${run}`, ACQUIRE_ATTEMPT, [run, wait],
        { statement: 'acquire_run', run });
    } catch (err) {
      const e = /** @type {any} */ (err);
      if (e?.code === RUN_ABANDONED) throw abandoned(run, err);
      if (e?.code === '42883' && /session_epoch/.test(e?.message ?? '')) {
        throw new LedgerError('a session attempt needs the durable_ledger extension at version 1.3 or later ' +
          '(durable_ledger.session_epoch() is missing): ALTER EXTENSION durable_ledger UPDATE', { cause: err });
      }
      throw err;
    }
    if (r.acquired) {
      this.#stops.clear(run); // a new attempt starts
      this.#held.add(run);
      this.#leases.set(run, { epoch: r.epoch === null ? null : String(r.epoch), pid: r.pid });
    }
    return r.acquired;
  }

  /**
   * One attempt at a run: acquire_run (a wait ends after lock_timeout, else
   * durable_ledger.lease_wait_timeout: RunBusy), fn(run) with its calls bound
   * to it (sessionContext), ledger.releaseRun(run) in finally once they have
   * ended.  A run this Ledger already holds is refused.
   * @template T
   * @param {{releaseRun(run: string): Promise<boolean>}} ledger  the Ledger of the attempt
   * @param {string} run
   * @param {(run: string) => T | Promise<T>} fn
   * @param {string|null} [model]  the attempt's model (meta.model of its calls)
   * @returns {Promise<T>}
   */
  async attempt(ledger, run, fn, model = null) {
    this.sessionOnly('attempt()');
    this.#reserve(run);
    const session = new Calls(ledger, run);
    session.model = model;
    this.#sessions.set(run, session);
    try {
      await this.#acquire(run, true);
    } catch (err) {
      this.#sessions.delete(run);
      throw err;
    } finally {
      this.#acquiring.delete(run);
    }
    let failed = false;
    try {
      return await runIn(sessionContext, session, () => fn(run));
    } catch (err) {
      failed = true;
      throw err;
    } finally {
      // no call of the attempt begins from now on; those in flight finish first
      session.ended = true;
      await session.idle();
      this.#sessions.delete(run);
      try {
        await ledger.releaseRun(run);
      } catch (releaseErr) {
        // The original error matters more; a broken connection ends the lease anyway.
        if (!failed) throw releaseErr;
      }
    }
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
    this.sessionOnly('releaseRun()');
    if (this.#sessions.has(run)) {
      // its calls would go on under an implicit lease, in a new epoch
      throw new LedgerError(`releaseRun(${run}) inside its ledger.attempt(run, fn): the attempt releases ` +
        'the run when fn has settled');
    }
    this.#held.delete(run);
    const lease = this.#leases.get(run);
    this.#leases.delete(run);
    const call = { statement: 'release_run', run };
    if (!lease) {
      const [r] = await this.#connection.statement(`release_run of ${run}`, RELEASE_RUN, [run], call);
      this.#stops.clear(run); // the attempt is over
      return r.ok;
    }
    const stop = this.#stops.of(run, null);
    const [r] = await this.#connection.statement(`release_run of ${run}`, RELEASE_ATTEMPT, [run, lease.epoch],
      call);
    this.#stops.clear(run); // the attempt is over
    if (r.released !== null) return r.released;
    // The statement found no lease of the attempt where it ran.
    const how = missed(lease, r.pid, r.epoch);
    const outcome = await this.#endElsewhere(run, lease, r.pid);
    const ended = outcome === 'ended';
    if (how === 'lost') return ended;
    if (stop?.error?.() instanceof PoolerDetected) return ended; // a call of the attempt said so already
    const detected = new PoolerDetected(
      `run ${run}: the release of this attempt's lease (epoch ${Number(lease.epoch)}, held by backend ` +
        `${lease.pid}) reached ${r.pid !== lease.pid ? `another server connection (backend ${r.pid})` :
          `that connection after another attempt (epoch ${Number(r.epoch)}) had taken the lease over`}: ` +
        'a transaction pooler (PgBouncer with pool_mode = transaction, or a pooled endpoint) is between this ' +
        'client and the database, and a session lease cannot work through it.  ' +
        ({ ended: 'The lease was ended where it was held (release_attempt).  ',
          over: 'The lease was over already.  ',
          left: "The lease stays held where it is (this role may not end it: see the 'notice').  " })[outcome] +
        'Behind a transaction pooler use ledger.tokenAttempt(run, opts, fn).',
      { run, epoch: Number(lease.epoch), pid: lease.pid, reachedPid: r.pid,
        reachedEpoch: r.epoch === null ? null : Number(r.epoch),
        reason: 'a transaction pooler is between the client and the database' });
    throw detected;
  }

  /**
   * release_attempt(run, epoch): ends the attempt's session lease wherever it
   * is held, so that the lock is not left on a pooled server connection where
   * other clients would meet it: 'ended', or 'over' when no live session lease
   * held the run at that epoch any more.  When the role may not end the backend
   * that holds it (42501), a 'notice' says exactly what happens instead: 'left'.
   * @param {string} run
   * @param {SessionLease} lease
   * @param {number} reachedPid
   * @returns {Promise<'ended'|'over'|'left'>}
   */
  async #endElsewhere(run, lease, reachedPid) {
    if (lease.epoch === null) return 'over';
    try {
      const [r] = await this.#connection.statement(`release_attempt of ${run}`, END_ATTEMPT_ELSEWHERE,
        [run, lease.epoch], { statement: 'release_attempt', run });
      return r.ended ? 'ended' : 'over';
    } catch (err) {
      if (/** @type {any} */ (err)?.sqlstate !== '42501') throw err;
      const epoch = Number(lease.epoch);
      this.#notify({
        origin: 'client',
        severity: 'WARNING',
        code: '42501',
        message: `the session lease of run ${run} (epoch ${epoch}) stays held by server connection ` +
          `${lease.pid} (its backend pid) until that connection closes, or until an admin runs ` +
          `durable_ledger.break_lease('${run}', ...): this client's statement reached backend ${reachedPid}, ` +
          'and its role may not terminate the backend that holds the lock (pg_terminate_backend\'s rule)',
        detail: 'Until then every client that a transaction pooler hands that server connection meets the ' +
          'lock; PgBouncer closes it after server_lifetime, or after server_idle_timeout once idle.',
        hint: `Ask an admin to run SELECT durable_ledger.break_lease('${run}', 'name', 'leaked through a ` +
          "transaction pooler'); behind a transaction pooler use ledger.tokenAttempt().",
        statement: 'release_attempt',
        run,
        tool: null,
        key: null,
        pid: lease.pid,
        epoch,
      });
      return 'left';
    }
  }

  /**
   * A guarded statement of the session attempt at `run` that found no lease of
   * the attempt where it ran (nothing was called): PoolerDetected when it
   * reached another backend, or one whose lease of the run is another
   * attempt's; LeaseLost when the attempt's own backend lost the lock
   * (DISCARD ALL, pg_advisory_unlock_all(), a pooler's reset).  The attempt
   * stops: its further calls throw the same without asking the database.
   * @param {string} run
   * @param {SessionLease} lease
   * @param {number} pid  the backend the statement reached
   * @param {string|null} epoch  that backend's epoch of the run
   * @param {string|null} tool
   * @returns {LeaseLost}
   */
  missedLease(run, lease, pid, epoch, tool) {
    const make = () => {
      const theirs = epoch === null ? null : Number(epoch);
      const mine = lease.epoch === null ? null : Number(lease.epoch);
      if (missed(lease, pid, epoch) === 'pooler') {
        const where = pid !== lease.pid
          ? `reached another server connection (backend ${pid}) than the one whose session holds this ` +
            `attempt's lease (backend ${lease.pid}, epoch ${mine})`
          : `reached the server connection of this attempt's lease (backend ${pid}), whose lease of the run ` +
            `another attempt (epoch ${theirs}) has taken over since this attempt's (epoch ${mine}) began`;
        return new PoolerDetected(
          `run ${run}: ${tool ? `the call of ${tool}` : 'the statement'} ${where}: a transaction pooler ` +
            '(PgBouncer with pool_mode = transaction, or a pooled endpoint) is between this client and the ' +
            'database, and a session lease cannot work through it.  Nothing was performed or recorded, and ' +
            'this attempt stops.  Behind a transaction pooler use ledger.tokenAttempt(run, opts, fn) (or ' +
            'connect directly, or through session pooling).',
          { run, epoch: mine, pid: lease.pid, reachedPid: pid, reachedEpoch: theirs,
            reason: 'a transaction pooler is between the client and the database' });
      }
      return new LeaseLost(
        `run ${run}: the lease of this attempt (epoch ${mine}) was lost: this session's lock on the run was ` +
          "released behind the ledger's back (DISCARD ALL, pg_advisory_unlock_all() or a pooler resetting the " +
          'connection).  Nothing was performed or recorded, and this attempt stops; a new attempt ' +
          '(ledger.attempt()) replays what it completed.',
        { run, epoch: mine, reason: 'the session lease was lost' });
    };
    const err = make();
    this.#stops.stop(run, null, err.message, null, make);
    return err;
  }
}
