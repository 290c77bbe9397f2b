// The runs of one MCP session and their attempts.  A session's first side-effecting call
// of a run opens an attempt at it (agentAttempt: a token lease, renewed while the
// attempt is open); the session's later calls of that run are calls of that attempt, so
// the ledger counts them in order ("again" is a new occurrence, never a replay).  The
// attempt ends -- its calls in flight finish and are recorded, then its lease is
// released -- when the session closes, when a call of it stopped the run (a pause, an
// unknown outcome, an abandoned run, a refused tool: the session answers every later call
// of the run with that stop), or when another session of this gateway continues the run
// (a client reconnecting after a crash): the newer session takes it over, and the older
// one's later calls of the run are refused (their session lost the run).  A gateway that
// dies leaves its leases to expire after their ttl.

import { AsyncLocalStorage } from 'node:async_hooks';
import { RunBusy } from 'durable-ledger';
import { agentAttempt, stopOf } from 'durable-ledger/agents';

/** @typedef {import('durable-ledger').Ledger} Ledger */
/** @typedef {import('durable-ledger/agents').Stop} Stop */
/** @typedef {<R>(fn: () => R) => R} Snapshot */

/**
 * One run in one session: its open attempt, or why the session may not call it any more.
 */
class Slot {
  /**
   * @param {SessionRuns} session
   * @param {string} run
   */
  constructor(session, run) {
    this.session = session;
    this.run = run;
    /** @type {Promise<Snapshot> | null} the attempt being opened, then open: runs code in it */
    this.attempt = null;
    /** @type {(() => void) | null} ends the open attempt's function */
    this.release = null;
    /** @type {Promise<void> | null} settles when the attempt has ended (its lease released) */
    this.ended = null;
    /** @type {Stop | null} why the session's calls of the run are refused */
    this.stop = null;
  }

  /** Ends the open attempt, if any; resolves once it has ended. */
  end() {
    this.release?.();
    this.release = null;
    this.attempt = null;
    return this.ended ?? Promise.resolve();
  }
}

/** A call of a run its session may call no more: `stop` says why. */
export class RunStopped extends Error {
  /** @param {Stop} stop */
  constructor(stop) {
    super(stop.forModel);
    this.name = 'RunStopped';
    this.stop = stop;
  }
}

/** What the gateway's runs share across its sessions. */
export class RunRegistry {
  /**
   * @param {Ledger} ledger
   * @param {{ttl: number, holder: string | null, leaseWait: number}} lease
   */
  constructor(ledger, lease) {
    this.ledger = ledger;
    this.lease = lease;
    /** @type {Map<string, Slot>} the slot of each run an attempt of this gateway holds */
    this.holders = new Map();
  }
}

/** The runs one MCP session has called. */
export class SessionRuns {
  /**
   * @param {RunRegistry} registry
   * @param {string} label  the session's public name, for the lease's holder name and messages
   *   (never an HTTP session's id)
   */
  constructor(registry, label) {
    this.registry = registry;
    this.label = label;
    /** @type {Map<string, Slot>} */
    this.slots = new Map();
    this.closed = false;
  }

  /**
   * Why the session may not call `run` (a stop), or null.
   * @param {string} run
   * @returns {Stop | null}
   */
  stopOf(run) {
    return this.slots.get(run)?.stop ?? null;
  }

  /**
   * Runs `fn` in the session's attempt at `run`, opening one first when none is open.
   * Throws what opening it threw (RunBusy once leaseWait has passed, RunAbandoned, the
   * ledger's errors), or a LedgerError-free Error when the session is closed.
   * @template T
   * @param {string} run
   * @param {() => Promise<T>} fn
   * @returns {Promise<T>}
   */
  async call(run, fn) {
    if (this.closed) throw new Error(`the MCP session ${this.label} is closed`);
    let slot = this.slots.get(run);
    if (!slot) {
      slot = new Slot(this, run);
      this.slots.set(run, slot);
    }
    // a stopped slot never opens again: a session that lost its run to a newer one (or
    // whose call stopped it) must not take it back
    if (slot.stop) throw new RunStopped(slot.stop);
    slot.attempt ??= this.#open(slot);
    let inAttempt;
    try {
      inAttempt = await slot.attempt;
    } catch (err) {
      if (slot.attempt !== null) slot.attempt = null;
      throw err;
    }
    if (slot.stop) throw new RunStopped(slot.stop);
    return inAttempt(fn);
  }

  /**
   * The session's calls of `run` are refused from now on with `stop` (the first one
   * stays), and its attempt ends (its calls in flight first).
   * @param {string} run
   * @param {Stop} stop
   */
  stopRun(run, stop) {
    const slot = this.slots.get(run);
    if (!slot) return;
    slot.stop ??= stop;
    slot.end().catch(() => {});
  }

  /**
   * Opens an attempt at the slot's run: takes the run over from another session of this
   * gateway that holds it; waits up to leaseWait for another worker's lease.
   * @param {Slot} slot
   * @returns {Promise<Snapshot>}
   */
  async #open(slot) {
    const { registry } = this;
    const { run } = slot;
    const other = registry.holders.get(run);
    if (other && other !== slot) {
      // A newer session continues the run (a client reconnecting after a crash): the older
      // session's attempt ends -- its calls in flight are recorded first -- and its later
      // calls of the run are refused.
      other.stop ??= lostTo(run);
      await other.end().catch(() => {});
    }
    const deadline = Date.now() + registry.lease.leaseWait * 1000;
    for (;;) {
      try {
        return await this.#attempt(slot);
      } catch (err) {
        if (!(err instanceof RunBusy) || Date.now() >= deadline) throw err;
        await new Promise((resolve) => { setTimeout(resolve, Math.min(500, Math.max(50, deadline - Date.now()))); });
      }
    }
  }

  /**
   * One agentAttempt at the slot's run, held open until the slot ends it.
   * @param {Slot} slot
   * @returns {Promise<Snapshot>}
   */
  #attempt(slot) {
    const { registry } = this;
    const { ttl, holder } = registry.lease;
    return new Promise((resolve, reject) => {
      /** @type {Promise<void>} */
      const held = new Promise((release) => { slot.release = () => release(); });
      let opened = false;
      const done = agentAttempt(registry.ledger, slot.run, { ttl, holder: holder ?? `mcp-gateway ${this.label}` },
        async () => {
          opened = true;
          registry.holders.set(slot.run, slot);
          resolve(AsyncLocalStorage.snapshot());
          await held;
        });
      slot.ended = done.then(() => {}, (err) => {
        if (!opened) {
          reject(err);
          const stop = stopOf(err);
          if (stop) slot.stop ??= stop; // an abandoned run
        }
        // otherwise the stop a call met was answered to that call already
      }).finally(() => {
        if (registry.holders.get(slot.run) === slot) registry.holders.delete(slot.run);
      });
    });
  }

  /** Ends every attempt of the session; resolves once they have ended. */
  async close() {
    this.closed = true;
    await Promise.all([...this.slots.values()].map((slot) => slot.end()));
  }
}

/**
 * The stop of a session whose run another session took over.  It never names that session:
 * an HTTP session's id is its credential.
 * @param {string} run
 * @returns {Stop}
 */
function lostTo(run) {
  return {
    kind: 'lease-lost',
    key: null,
    forModel: 'This call was not performed: another session continues this run now. Do not call this tool ' +
      'again in this session.',
    forPerson: `nothing: run ${run} was continued by another session of this gateway; this session's calls of ` +
      'it are refused',
    error: null,
  };
}
