// durable-ledger: the Node.js client of the durable_ledger PostgreSQL extension.
//
// Every side effect goes through begin_effect (the intent is recorded and
// committed before the effect), then complete_effect or fail_effect.  The
// extension decides; this module only turns its decisions into control flow:
//
//   execute      -> perform(key), then complete_effect(key, result, attempt) -> result
//   replay       -> the recorded result (or EffectFailed for a recorded failure)
//   pause        -> EffectPaused   (an earlier attempt's outcome is unknown)
//   in_progress  -> EffectInProgress (another live lease is performing it)
//
// Unknown outcomes are never guessed: an error from perform() that is not an
// EffectDidNotHappen leaves the effect "started", and the next attempt pauses
// until a person resolves it (durable_ledger.resolve_effect).
//
// Every report names the attempt of the effect that begin_effect executed: a
// business key is executed again after a failure (attempt 2, 3, ...), and a
// report must decide the attempt it is about and no other, whichever session
// holds the lease by the time it arrives.

/**
 * @typedef {object} Queryable  A node-postgres Client or PoolClient (anything with query()).
 * @property {(text: string, values?: unknown[]) => Promise<{rows: any[]}>} query
 * @property {() => string | null} [getTransactionStatus]  pg >= 8.21: 'I', 'T' or 'E'
 */

/**
 * @typedef {object} Decision  A row of durable_ledger.decision.
 * @property {string} key
 * @property {'execute'|'replay'|'pause'|'in_progress'} decision
 * @property {'started'|'completed'|'failed'|'unknown'} status
 * @property {number|null} occurrence
 * @property {number} attempt
 * @property {unknown} result
 * @property {unknown} error
 * @property {string|null} reason
 */

/** Base class of every error this module raises about a ledger decision. */
export class LedgerError extends Error {
  /**
   * @param {string} message
   * @param {{key?: string|null, decision?: string|null, reason?: string|null, cause?: unknown}} [fields]
   */
  constructor(message, { key = null, decision = null, reason = null, cause } = {}) {
    super(message, cause === undefined ? undefined : { cause });
    this.name = new.target.name;
    /** @type {string|null} the effect's idempotency key */
    this.key = key;
    /** @type {string|null} begin_effect's decision that led here */
    this.decision = decision;
    /** @type {string|null} the ledger's one-sentence explanation */
    this.reason = reason;
  }
}

/**
 * The effect is recorded as failed: either perform() threw EffectDidNotHappen
 * just now (replayed = false), or an earlier attempt's recorded failure was
 * replayed (replayed = true).  Nothing happened downstream.  To try again, call
 * again (the next occurrence gets a new key) or start a new run.
 */
export class EffectFailed extends LedgerError {
  /**
   * @param {string} message
   * @param {{key: string, decision: string, reason?: string|null, error?: unknown, replayed: boolean, cause?: unknown}} fields
   */
  constructor(message, { key, decision, reason = null, error = null, replayed, cause }) {
    super(message, { key, decision, reason, cause });
    /** @type {unknown} the recorded error (JSON) */
    this.error = error;
    /** @type {boolean} true when an earlier attempt's failure was replayed */
    this.replayed = replayed;
  }
}

/**
 * begin_effect answered `pause`: an earlier attempt recorded the intent but
 * never reported an outcome (or a contradicting report awaits a person).
 * Stop the run; a person checks the downstream system and calls
 * durable_ledger.resolve_effect(key, ...); the next attempt then replays.
 */
export class EffectPaused extends LedgerError {}

/**
 * begin_effect answered `in_progress`: another live lease is performing this
 * very business key right now.  Do not perform it; ask again later.
 */
export class EffectInProgress extends LedgerError {}

/**
 * A guarded call on a run whose current attempt already hit an unknown
 * outcome (perform threw something other than EffectDidNotHappen) or a pause.
 * Continuing in the same attempt would be unsafe: the ledger counts a repeated
 * call as the next occurrence, with a new key, so a retry would execute again.
 * End the attempt; start a new one (acquireRun, or attempt()) when it has been
 * resolved.  `key` is the effect that stopped the run.
 */
export class RunStopped extends LedgerError {}

/**
 * Throw this from perform() (or from a tool function) when the downstream API
 * definitively refused the call before changing anything.  `error` (any JSON
 * value) is recorded with fail_effect.  Only throw it when you know nothing
 * happened: any other error means "outcome unknown".
 */
export class EffectDidNotHappen extends Error {
  /**
   * @param {unknown} [error]  JSON-serializable description of the refusal
   * @param {string} [message]
   */
  constructor(error = null, message) {
    super(message ?? `the effect did not happen: ${describe(error)}`);
    this.name = 'EffectDidNotHappen';
    /** @type {unknown} */
    this.error = error;
  }
}

/** JSON text for a jsonb parameter; undefined becomes SQL NULL. */
function jsonParam(value) {
  if (value === undefined) return null;
  return JSON.stringify(value) ?? null;
}

/** JSON text for a recorded error: falls back to its text when it is not JSON. */
function errorParam(value) {
  if (value instanceof Error) value = { name: value.name, message: value.message };
  try {
    return jsonParam(value);
  } catch {
    return JSON.stringify(String(value));
  }
}

/** The ledger's reason as a sentence ending with a full stop. */
function sentence(text) {
  if (!text) return '';
  return /[.!?]$/.test(text) ? text : `${text}.`;
}

function describe(value) {
  if (typeof value === 'string') return value;
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

// Runs stopped in their current attempt, per client (a lease belongs to the
// session, so every Ledger on one client shares this): run -> {key, reason}.
/** @type {WeakMap<object, Map<string, {key: string, reason: string}>>} */
const stoppedRuns = new WeakMap();

export class Ledger {
  /**
   * @param {Queryable} client  a connected pg Client or PoolClient.  A lease is a
   *   session lock: use the same client for a whole attempt, and never a
   *   connection behind a transaction-pooling PgBouncer.
   */
  constructor(client) {
    if (!client || typeof client.query !== 'function') {
      throw new TypeError('new Ledger(client): client must be a node-postgres Client or PoolClient');
    }
    this.client = client;
    if (!stoppedRuns.has(client)) stoppedRuns.set(client, new Map());
    /** @type {Map<string, {key: string, reason: string}>} */
    this.#stopped = stoppedRuns.get(client);
  }

  #stopped;

  #stop(run, key, reason) {
    this.#stopped.set(run, { key, reason });
  }

  /**
   * Refuses to begin an effect inside an open transaction: the intent must be
   * committed before the effect is performed.
   */
  async #assertNoOpenTransaction() {
    const c = this.client;
    let inTransaction;
    if (typeof c.getTransactionStatus === 'function') {
      const s = c.getTransactionStatus();
      inTransaction = s === 'T' || s === 'E';
    } else {
      // In autocommit, a statement's transaction starts with the statement.
      const { rows } = await c.query('SELECT now() <> statement_timestamp() AS in_transaction');
      inTransaction = rows[0].in_transaction;
    }
    if (inTransaction) {
      throw new LedgerError(
        'guarded() must not run inside an open transaction: the intent has to be committed ' +
          'before the effect is performed.  COMMIT or ROLLBACK first, or call ' +
          'durable_ledger.begin_effect yourself if the effect is a write in the same transaction.'
      );
    }
  }

  /**
   * durable_ledger.begin_effect, as is.
   * @param {string} run
   * @param {string} tool
   * @param {unknown} args
   * @param {{businessKey?: string|null, meta?: unknown}} [options]
   * @returns {Promise<Decision>}
   */
  async beginEffect(run, tool, args, { businessKey = null, meta } = {}) {
    const { rows } = await this.client.query(
      'SELECT * FROM durable_ledger.begin_effect($1::text, $2::text, $3::jsonb, $4::text, $5::jsonb)',
      [run, tool, jsonParam(args), businessKey ?? null, jsonParam(meta)]
    );
    return rows[0];
  }

  /**
   * Runs one side effect at most once.
   * @template T
   * @param {{run: string, tool: string, args: unknown,
   *          perform: (key: string) => T | Promise<T>,
   *          businessKey?: string|null, meta?: unknown}} call
   * @returns {Promise<any>} the result as recorded in the ledger (a JSON round
   *   trip of what perform returned; undefined becomes null), the same on a
   *   first run and on a replay.
   */
  async guarded({ run, tool, args, perform, businessKey = null, meta }) {
    if (typeof perform !== 'function') {
      throw new TypeError('guarded(): perform must be a function (key) => result');
    }
    const stop = this.#stopped.get(run);
    if (stop) {
      throw new RunStopped(
        `run ${run} is stopped in this attempt: ${stop.reason}  End the attempt; once the ` +
          'effect is resolved, a new attempt (acquireRun or attempt()) replays it.',
        { key: stop.key, decision: null, reason: stop.reason }
      );
    }
    await this.#assertNoOpenTransaction();
    const d = await this.beginEffect(run, tool, args, { businessKey, meta });
    const where = `${tool} (key ${d.key})`;

    switch (d.decision) {
      case 'execute':
        break;
      case 'replay':
        if (d.status === 'completed') return d.result;
        if (d.status === 'failed') {
          throw new EffectFailed(`${where} failed in an earlier attempt (replayed): ${describe(d.error)}`, {
            key: d.key, decision: d.decision, reason: d.reason, error: d.error, replayed: true,
          });
        }
        throw new LedgerError(`${where}: replay with unexpected status ${d.status}`, d);
      case 'pause':
        this.#stop(run, d.key, `${where} is paused.`);
        throw new EffectPaused(
          `${where} is paused: ${sentence(d.reason)}  A person must resolve it ` +
            '(durable_ledger.resolve_effect) before the run can go on.',
          d
        );
      case 'in_progress':
        throw new EffectInProgress(`${where} is in progress elsewhere: ${sentence(d.reason)}`, d);
      default:
        throw new LedgerError(`${where}: unexpected decision ${d.decision}`, d);
    }

    // execute: the intent is committed; perform the effect with the key.
    let result;
    try {
      result = await perform(d.key);
    } catch (err) {
      if (err instanceof EffectDidNotHappen) {
        const json = errorParam(err.error);
        const row = await this.#report(run, 'fail_effect', d.key, d.attempt, json, where);
        throw new EffectFailed(`${where} did not happen: ${err.message}`, {
          key: d.key, decision: d.decision, reason: err.message,
          // the row is a later attempt's when one replaced ours: ours is what we sent
          error: row.attempt === d.attempt ? row.error : JSON.parse(json ?? 'null'),
          replayed: false, cause: err,
        });
      }
      // Outcome unknown: never guess.  The effect stays "started"; the next
      // attempt pauses until a person resolves it; this one must not go on.
      this.#stop(run, d.key, `the outcome of ${where} is unknown (${describe(err?.message ?? err)}).`);
      throw err;
    }

    let resultJson;
    try {
      resultJson = jsonParam(result);
    } catch (err) {
      this.#stop(run, d.key, `${where} happened but its result could not be recorded.`);
      throw new LedgerError(
        `${where} happened but its result cannot be stored as JSON (${err.message}); ` +
          'it stays "started", and the next attempt pauses until a person resolves it',
        { key: d.key, decision: d.decision, cause: err }
      );
    }
    const row = await this.#report(run, 'complete_effect', d.key, d.attempt, resultJson, where);
    return row.result;
  }

  /**
   * complete_effect / fail_effect on `attempt`, the attempt of the effect that
   * begin_effect executed; anything but an accepted report stops the run.
   */
  async #report(run, fn, key, attempt, json, where) {
    let row;
    try {
      ({ rows: [row] } = await this.client.query(
        `SELECT * FROM durable_ledger.${fn}($1::text, $2::jsonb, $3::integer)`, [key, json, attempt]));
    } catch (err) {
      this.#stop(run, key, `${where} could not be recorded (${fn}: ${err.message}).`);
      throw err;
    }
    const wanted = fn === 'complete_effect' ? 'completed' : 'failed';
    // When a later attempt replaced ours (someone else recorded ours as failed
    // meanwhile, and the key was executed again), the row is that later
    // attempt's, which our report never changes: a failure the ledger already
    // had for our attempt is on record; anything else was kept as a conflict.
    const accepted = row.attempt === attempt
      ? !row.conflict && row.status === wanted
      : !row.conflict && fn === 'fail_effect';
    if (!accepted) {
      const now = row.attempt === attempt
        ? row.status
        : `at attempt ${row.attempt} (this report was on attempt ${attempt}), ${row.status}`;
      this.#stop(run, key, `${where}: the ledger did not accept the report (${fn}).`);
      throw new LedgerError(
        `${where}: the ledger did not accept the report (${fn}); the effect is ${now}` +
          `${row.conflict ? ' and flagged as a conflict' : ''}.  A person must look at it ` +
          '(durable_ledger.unresolved).',
        { key, decision: 'execute', reason: 'contradicting report' }
      );
    }
    return row;
  }

  /**
   * Wraps a side-effecting tool.  The returned function goes through guarded()
   * and calls fn(args, idempotencyKey) only on `execute`.
   * @template A, R
   * @param {string} name  the tool name recorded in the ledger
   * @param {(args: A, idempotencyKey: string) => R | Promise<R>} fn
   * @returns {(run: string, args: A, options?: {businessKey?: string|null, meta?: unknown}) => Promise<any>}
   */
  tool(name, fn) {
    if (typeof fn !== 'function') throw new TypeError('tool(name, fn): fn must be a function');
    return (run, args, { businessKey = null, meta } = {}) =>
      this.guarded({ run, tool: name, args, businessKey, meta, perform: (key) => fn(args, key) });
  }

  /**
   * durable_ledger.acquire_run: takes the run's lease and starts a new attempt
   * (occurrence counters start again at 1).
   * @param {string} run
   * @param {{wait?: boolean}} [options]  wait: false returns false at once when another session holds it
   * @returns {Promise<boolean>}
   */
  async acquireRun(run, { wait = true } = {}) {
    const { rows } = await this.client.query(
      'SELECT durable_ledger.acquire_run($1::text, $2::boolean) AS ok', [run, wait]);
    if (rows[0].ok) this.#stopped.delete(run); // a new attempt starts
    return rows[0].ok;
  }

  /**
   * durable_ledger.release_run: ends this session's lease on the run.
   * @param {string} run
   * @returns {Promise<boolean>} false when this session did not hold it
   */
  async releaseRun(run) {
    const { rows } = await this.client.query(
      'SELECT durable_ledger.release_run($1::text) AS ok', [run]);
    this.#stopped.delete(run); // the attempt is over
    return rows[0].ok;
  }

  /**
   * durable_ledger.effect_status: the effect's row, or null for a key never seen.
   * @param {string} key
   * @returns {Promise<object|null>}
   */
  async effectStatus(key) {
    const { rows } = await this.client.query(
      'SELECT * FROM durable_ledger.effect_status($1::text)', [key]);
    return rows[0] ?? null;
  }

  /**
   * One attempt at a run: acquire_run (waiting, honouring lock_timeout),
   * fn(run), release_run in finally.
   * @template T
   * @param {string} run
   * @param {(run: string) => T | Promise<T>} fn
   * @returns {Promise<T>}
   */
  async attempt(run, fn) {
    await this.acquireRun(run);
    let failed = false;
    try {
      return await fn(run);
    } catch (err) {
      failed = true;
      throw err;
    } finally {
      try {
        await this.releaseRun(run);
      } catch (releaseErr) {
        // The original error matters more; a broken connection ends the lease anyway.
        if (!failed) throw releaseErr;
      }
    }
  }
}
