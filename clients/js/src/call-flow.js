// One guarded() or record() call in the attempt it belongs to: the checks of
// its attempt, begin_effect (or begin_recorded), what the decision says
// (decisions.js), and on execute the effect performed and its outcome
// reported.  Unknown outcomes are never guessed: an error from perform() that
// is not an EffectDidNotHappen leaves the effect "started", and the next
// attempt pauses until a person resolves it (durable_ledger.resolve_effect).

import { attemptContext, boundAttempt, sessionContext } from './attempts.js';
import { commitSent, notCommitted } from './connection.js';
import { judge, refusedReport } from './decisions.js';
import { RECONCILE_DUE, RECONCILE_EFFECT, askProvider, reconcilable, reconcileParams } from './reconcile.js';
import { EffectDidNotHappen, EffectFailed, LeaseLost, LedgerError, RunAbandoned } from './errors.js';
import { guardedBegin } from './session-guard.js';
import { LEASE_LOST, RUN_ABANDONED, TOOL_REFUSED, abandoned, refused } from './sqlstates.js';
import { beginCall, errorParam, jsonParam, reportStatement, routed, withModel } from './statements.js';
import { describe } from './text.js';
import { loseLease } from './token-lease.js';


/**
 * Whether a statement's error is an ERROR a proxy of a sharded ledger raises after a call
 * that may have committed on its shard: class 08 (the shard was lost while the call ran)
 * or 57 (the call was canceled while the shard committed it) (docs/scale-out.md).  (A
 * named refusal -- named() -- carries the server's error as its cause.)
 * @param {any} err
 * @returns {boolean}
 */
function maybeCommitted(err) {
  const server = err?.sqlstate && err?.cause ? err.cause : err;
  return server?.severity === 'ERROR' && /^(08|57)/.test(server?.code ?? '');
}

/**
 * Whether a statement's error leaves it unknown if the statement committed: no ERROR from
 * the server at all (the connection broke, a FATAL), or one that may follow a commit.
 * @param {any} err
 * @returns {boolean}
 */
function outcomeUnknown(err) {
  const server = err?.sqlstate && err?.cause ? err.cause : err;
  return server?.severity !== 'ERROR' || maybeCommitted(err);
}
/** @typedef {import('./attempts.js').Attempt} Attempt */
/** @typedef {import('./connection.js').Connection} Connection */
/** @typedef {import('./decisions.js').Decision} Decision */
/** @typedef {import('./session-attempts.js').SessionAttempts} SessionAttempts */
/** @typedef {import('./stops.js').Stops} Stops */
/** @typedef {import('./token-attempts.js').TokenAttempts} TokenAttempts */
/**
 * A call's key, when not derived from its occurrence: a business key, which with
 * callId is a framework's id of the tool call (begin_effect's call_id).
 * @typedef {{businessKey: string|null, callId: boolean}} KeyOf
 */

/** The calls of one Ledger. */
export class CallFlow {
  /**
   * @param {object} ledger  the Ledger whose calls these are (its attempts are told apart by it)
   * @param {Connection} connection
   * @param {Stops} stops
   * @param {SessionAttempts} sessions
   * @param {TokenAttempts} tokens
   * @param {(notice: import('./notices.js').LedgerNotice) => void} notify  the Ledger's 'notice'
   * @param {boolean} [routedCalls]  calls about a key name their run (durable_ledger_proxy)
   */
  constructor(ledger, connection, stops, sessions, tokens, notify, routedCalls = false) {
    this.#routed = routedCalls;
    this.#ledger = ledger;
    this.#connection = connection;
    this.#stops = stops;
    this.#sessions = sessions;
    this.#tokens = tokens;
    this.#notify = notify;
  }

  #ledger;
  #routed;
  #notify;

  /**
   * A call about a key: with its run last through a proxy (see routed()).
   * @param {string} text
   * @param {unknown[]} params
   * @param {string} run
   */
  #about(text, params, run) {
    return routed(text, params, this.#routed ? run : null);
  }
  #connection;
  #stops;
  #sessions;
  #tokens;

  /**
   * guarded() or record(), in the attempt the call belongs to.
   * @param {string} what
   * @param {{run: string, tool: string, args: unknown, perform: (key: string) => unknown,
   *          businessKey: string|null, callId?: boolean, meta: unknown, recorded: boolean,
   *          reconcile?: import('./reconcile.js').Reconcile | null}} call
   * @returns {Promise<any>}
   */
  async call(what, { run, tool, args, perform, businessKey, callId = false, meta, recorded, reconcile = null }) {
    const { attempt, calls } = this.#enter(what, run);
    try {
      return await this.#guarded(attempt, run, tool, args, perform, { businessKey, callId }, meta, recorded,
        reconcile);
    } finally {
      calls?.leave();
    }
  }

  /**
   * local(), in the attempt the call belongs to.
   * @param {{run: string, tool: string, args: unknown, write: (client: any, key: string) => unknown,
   *          businessKey: string|null, meta: unknown}} call
   * @returns {Promise<any>}
   */
  async local({ run, tool, args, write, businessKey, meta }) {
    const { attempt, calls } = this.#enter('local()', run);
    try {
      return await this.#local(attempt, run, tool, args, write, businessKey, meta);
    } finally {
      calls?.leave();
    }
  }

  /**
   * The checks of a call's attempt: the token attempt it belongs to (checked live), or
   * the session's; refused outside any attempt, or from outside the one that holds the
   * run, or once the attempt has stopped.  The attempt is entered: leave() `calls` after.
   * @param {string} what
   * @param {string} run
   * @returns {{attempt: Attempt|null, calls: {leave(): void}|null}}
   */
  #enter(what, run) {
    const attempt = boundAttempt(attemptContext, this.#ledger, run);
    let session = null;
    if (attempt) {
      if (attempt.ended) {
        throw new LeaseLost(
          `run ${run}: this call belongs to the token attempt of epoch ${attempt.lease.epoch}, which has ` +
            'ended (its function settled while this branch was still running); nothing was begun.  ' +
            'A branch must not outlive its attempt: await every branch (Promise.allSettled), or stop it ' +
            'with lease.signal',
          { run, epoch: attempt.lease.epoch, reason: 'the attempt has ended' });
      }
      attempt.lease.check();
    } else if (this.#tokens.has(run)) {
      throw new LedgerError(
        `${what} on run ${run} was called from outside the token attempt that this Ledger holds on it ` +
          "(not from tokenAttempt()'s function, nor from anything it started): it is not performed.  " +
          'Make the call inside the attempt\'s function.');
    } else {
      this.#sessions.sessionOnly(`${what} outside tokenAttempt()`);
      session = boundAttempt(sessionContext, this.#ledger, run);
      if (!session && this.#sessions.isOpen(run)) {
        throw new LedgerError(
          `${what} on run ${run} was called from outside the attempt that this Ledger holds on it ` +
            "(not from attempt()'s function, nor from anything it started): it is not performed.  " +
            'Make the call inside the attempt\'s function.');
      }
      if (session?.ended) {
        throw new LeaseLost(
          `run ${run}: this call belongs to a session attempt that has ended (its function settled while ` +
            'this branch was still running); nothing was begun.  A branch must not outlive its attempt: ' +
            'await every branch (Promise.allSettled)',
          { run, epoch: null, reason: 'the attempt has ended' });
      }
      if (!session && !this.#sessions.isHeld(run)) {
        throw new LedgerError(
          `${what} on run ${run} outside an attempt: nothing was recorded or performed.  Start each ` +
            'attempt at a run (the first, a retry, a redelivery) with ledger.attempt(run, fn) (or ' +
            'ledger.tokenAttempt(run, opts, fn) on a pool, or acquireRun()): a new attempt replays what an ' +
            'earlier one did, where continuing an attempt it did not start would count the retried calls ' +
            'as new ones and perform them again.');
      }
    }
    this.#stops.check(run, attempt);
    const calls = attempt ?? session;
    calls?.enter();
    return { attempt, calls: calls ?? null };
  }

  /**
   * One local effect in its attempt: begin_local, the write (in a savepoint)
   * and its report in one transaction, committed at the end, so they are
   * recorded together or not at all.  What begin_local found for a pause is
   * committed before the pause is thrown.  A write that throws (other than
   * EffectDidNotHappen) rolls everything back: nothing happened, and the
   * attempt goes on.  A COMMIT whose answer was lost stops the attempt (no
   * person is needed: the next attempt replays or executes the effect).
   * @param {Attempt|null} attempt
   * @param {string} run
   * @param {string} tool
   * @param {unknown} args
   * @param {(client: any, key: string) => unknown} write
   * @param {string|null} businessKey
   * @param {unknown} meta
   */
  async #local(attempt, run, tool, args, write, businessKey, meta) {
    await this.#connection.assertNoOpenTransaction();
    const [text, params, lease] = this.#beginText(attempt, run, tool, args, { businessKey, callId: false }, meta,
      false, true);
    /** @type {string|null} */
    let key = null;
    /** @type {{result?: unknown, answer?: unknown}} */
    let after;
    try {
      after = await this.#connection.transaction(async (tx, client) => {
        let d;
        try {
          [d] = await tx(text, params, { statement: 'begin_local', run, tool });
        } catch (err) {
          throw this.#beginRefused(err, attempt, run, tool, false, true);
        }
        if (lease && d.key === null) throw this.#sessions.missedLease(run, lease, d.guard_pid, d.guard_epoch, tool);
        key = d.key;
        const where = `${tool} (key ${d.key})`;
        let decided;
        try {
          decided = judge(d, { run, tool, where, stop: (k, reason) => this.#stops.stop(run, k, reason, attempt) });
        } catch (answer) {
          return { answer };  // what begin_local wrote (an effect found unknown) commits
        }
        if (!decided.execute) return { result: decided.result };
        return this.#localWrite(tx, client, attempt, run, tool, d, write, where);
      });
    } catch (e) {
      const err = /** @type {any} */ (e);
      // (a COMMIT the server answered with ROLLBACK, or with an ERROR, committed nothing)
      const answered = err?.[commitSent] === 'rolled back' ||
        (err?.sqlstate && err?.cause ? err.cause : err)?.severity === 'ERROR';
      if (err?.[commitSent] && key !== null && !answered) {
        this.#stops.stopCall(true, run, key, `the commit of local effect ${tool} (key ${key}) was sent and its ` +
          `answer lost (${describe(err?.message ?? err)}); it committed whole or not at all.`, attempt);
      }
      throw err;
    }
    if ('answer' in after) throw after.answer;
    return after.result;
  }

  /**
   * The write of a local effect in a savepoint, then its report, in the open
   * transaction: the result as recorded, or the EffectFailed to throw once the
   * failure is committed.
   * @param {import('./connection.js').InTransaction} tx
   * @param {any} client
   * @param {Attempt|null} attempt
   * @param {string} run
   * @param {string} tool
   * @param {Decision} d
   * @param {(client: any, key: string) => unknown} write
   * @param {string} where
   * @returns {Promise<{result?: unknown, answer?: unknown}>}
   */
  async #localWrite(tx, client, attempt, run, tool, d, write, where) {
    await tx('SAVEPOINT durable_ledger_local');
    let result;
    /** @type {EffectDidNotHappen|null} */
    let refusal = null;
    try {
      result = await write(client, d.downstream_key ?? d.key);
      await tx('RELEASE SAVEPOINT durable_ledger_local');
    } catch (err) {
      if (!(err instanceof EffectDidNotHappen)) throw err;
      refusal = err;
      await tx('ROLLBACK TO SAVEPOINT durable_ledger_local');
    }
    const fn = refusal ? 'fail_effect' : 'complete_effect';
    const json = refusal ? errorParam(refusal.error) : jsonParam(result);
    const [row] = await tx(...this.#about(reportStatement(fn), [d.key, json, d.attempt], run),
      { statement: fn, run, tool, key: d.key });
    const refused = refusedReport(row, { fn, key: d.key, attempt: d.attempt, where, recorded: false });
    if (refused) throw refused.error;
    if (!refusal) return { result: row.result };
    return {
      answer: new EffectFailed(`${where} did not happen: ${refusal.message}`, {
        key: d.key, decision: d.decision, reason: refusal.message, error: row.error, replayed: false,
        cause: refusal,
      }),
    };
  }

  /**
   * One call in its attempt: begin, then what the decision says (decisions.js);
   * on execute, perform and report.
   * @param {Attempt|null} attempt
   * @param {string} run
   * @param {string} tool
   * @param {unknown} args
   * @param {(key: string) => unknown} perform
   * @param {KeyOf} key
   * @param {unknown} meta
   * @param {boolean} recorded
   * @param {import('./reconcile.js').Reconcile | null} reconcile
   */
  async #guarded(attempt, run, tool, args, perform, key, meta, recorded, reconcile) {
    await this.#connection.assertNoOpenTransaction();
    let d = await this.#begin(attempt, run, tool, args, key, meta, recorded);
    if (reconcile && !recorded && reconcilable(d)) {
      let settled;
      try {
        settled = await this.#reconciled(run, tool, args, d, reconcile);
      } catch (err) {
        // the pause stands (a lost connection, an error of reconcile_effect): the attempt stops at it
        this.#stops.stop(run, d.key, `${tool} (key ${d.key}) is paused.`, attempt);
        throw err;
      }
      if (settled) d = await this.#begin(attempt, run, tool, args, key, meta, recorded);  // replays, or executes again
    }
    const where = `${tool} (key ${d.key})`;
    const decided = judge(d, { run, tool, where, stop: (key, reason) => this.#stops.stop(run, key, reason, attempt) });
    if (!decided.execute) return decided.result;

    // execute: the intent is committed; perform the effect with the key.
    let result;
    try {
      // the provider's key: the effect's, or a business key's with its attempt ("INV-9#2")
      result = await perform(d.downstream_key ?? d.key);
    } catch (err) {
      if (err instanceof EffectDidNotHappen) {
        const json = errorParam(err.error);
        const row = await this.#report(attempt, run, 'fail_effect', d.key, d.attempt, json, where, recorded,
          tool);
        throw new EffectFailed(`${where} did not happen: ${err.message}`, {
          key: d.key, decision: d.decision, reason: err.message,
          // the row is a later attempt's when one replaced ours: ours is what we sent
          error: row.attempt === d.attempt ? row.error : JSON.parse(json ?? 'null'),
          replayed: false, cause: err,
        });
      }
      // A recorded call's is made again by the next attempt: nothing for a
      // person.  But this attempt stops: what it did next (with a retried
      // call's other answer) would not be what a replay sees, which makes
      // the lost call again first.
      if (recorded) {
        this.#stops.stopCall(true, run, d.key, `the recorded call ${where} threw ` +
          `(${describe(/** @type {any} */ (err)?.message ?? err)}) and nothing was recorded.`, attempt);
        throw err;
      }
      // Outcome unknown: never guess.  The effect stays "started"; the next
      // attempt pauses until a person resolves it; this one must not go on.
      this.#stops.stop(run, d.key,
        `the outcome of ${where} is unknown (${describe(/** @type {any} */ (err)?.message ?? err)}).`, attempt);
      throw err;
    }

    let resultJson;
    try {
      resultJson = jsonParam(result);
    } catch (err) {
      this.#stops.stopCall(recorded, run, d.key, `${where} happened but its result could not be recorded.`,
        attempt);
      throw new LedgerError(
        `${where} happened but its result cannot be stored as JSON (${/** @type {any} */ (err).message}); ` +
          (recorded
            ? 'nothing was recorded, and the next attempt makes the recorded call again'
            : 'it stays "started", and the next attempt pauses until a person resolves it'),
        { key: d.key, decision: d.decision, cause: err }
      );
    }
    const row = await this.#report(attempt, run, 'complete_effect', d.key, d.attempt, resultJson, where,
      recorded, tool);
    return row.result;
  }

  /**
   * Asks the provider about a paused effect whose outcome is unknown
   * (`reconcile`), once reconcilable_from says the tool's grace has passed,
   * and records its finding (reconcile_effect, which needs no
   * lease); true when it was recorded, and the call is to be asked again.  A
   * refusal (55000: before the tool's grace, a tool nobody made reconcilable)
   * leaves the pause, as does a provider that cannot tell: both are told as a
   * 'notice'.
   * @param {string} run
   * @param {string} tool
   * @param {unknown} args
   * @param {Decision} d
   * @param {import('./reconcile.js').Reconcile} reconcile
   */
  async #reconciled(run, tool, args, d, reconcile) {
    /** @param {string} message  @param {string|null} [code] */
    const warn = (message, code = null) => this.#notify({
      origin: 'client', severity: 'WARNING', code, message: `${tool} (key ${d.key}): ${message}`,
      detail: null, hint: null, statement: 'reconcile_effect', run, tool, key: d.key,
    });
    // the lookup comes after the tool's grace: one made earlier may miss a request still in flight
    const [due] = await this.#connection.statement(`reconcilable_from of ${tool} (key ${d.key})`,
      ...this.#about(RECONCILE_DUE, [d.key, d.attempt], run), { statement: 'reconcilable_from', run, tool, key: d.key });
    if (due.reconcilable_from === null) {
      warn('it is not reconciled by workers (its tool is not reconcilable, or the effect changed): the pause is ' +
        'left for a person');
      return false;
    }
    if (!due.due) {
      warn(`it may be reconciled from ${due.reconcilable_from.toISOString()} (its tool's grace): the pause ` +
        'stands until a later attempt');
      return false;
    }
    const found = await askProvider(reconcile, d, args, warn);
    if (!found) return false;
    try {
      await this.#connection.statement(`reconcile_effect of ${tool} (key ${d.key})`,
        ...this.#about(RECONCILE_EFFECT, reconcileParams(d, found), run),
        { statement: 'reconcile_effect', run, tool, key: d.key });
    } catch (e) {
      const err = /** @type {any} */ (e);
      if (err?.sqlstate !== '55000') throw err;
      warn(`the provider's finding was not recorded (${describe(err.reason ?? err.message)}): the pause ` +
        'stands', '55000');
      return false;
    }
    return true;
  }

  /**
   * begin_effect for guarded(): in the token attempt's epoch when there is one.
   * A lost lease (55L01) stops the attempt; an error that leaves unknown
   * whether the statement committed (the connection broke, a FATAL) stops the
   * run in this attempt: its intent may be recorded under a lease that is
   * still live, and the same call again would be the next occurrence.  So does
   * a begin_effect that ran inside another transaction on the connection:
   * whether its intent is recorded depends on that transaction.
   * @param {Attempt|null} attempt
   * @param {string} run
   * @param {string} tool
   * @param {unknown} args
   * @param {KeyOf} key
   * @param {unknown} meta
   * @param {boolean} recorded
   * @returns {Promise<Decision>}
   */
  async #begin(attempt, run, tool, args, key, meta, recorded) {
    const statement = recorded ? 'begin_recorded' : 'begin_effect';
    const [text, params, lease] = this.#beginText(attempt, run, tool, args, key, meta, recorded, false);
    try {
      const [row] = await this.#connection.statement(`${statement} of ${tool}`, text, params,
        { statement, run, tool });
      if (lease && row.key === null) throw this.#sessions.missedLease(run, lease, row.guard_pid, row.guard_epoch, tool);
      return row;
    } catch (e) {
      throw this.#beginRefused(e, attempt, run, tool, recorded);
    }
  }

  /**
   * The statement that begins a call, and the session lease it is guarded by: in
   * the token attempt's epoch when there is one, else made only where the
   * session's lease is (session-guard.js).
   * @param {Attempt|null} attempt
   * @param {string} run
   * @param {string} tool
   * @param {unknown} args
   * @param {KeyOf} key
   * @param {unknown} meta
   * @param {boolean} recorded
   * @param {boolean} local
   * @returns {[string, unknown[], any]}
   */
  #beginText(attempt, run, tool, args, key, meta, recorded, local) {
    const model = attempt ? attempt.model : this.#sessions.modelOf(run);
    const call = beginCall(run, tool, args, key.businessKey, withModel(meta, model),
      attempt ? attempt.lease.token : null, recorded, local, key.callId);
    const lease = attempt ? null : this.#sessions.lease(run);
    if (lease) {
      const params = [...call[1], lease.epoch];
      return [guardedBegin(call[0], params.length), params, lease];
    }
    return [`SELECT * FROM ${call[0]}`, call[1], null];
  }

  /**
   * What a begin's error means for the attempt (see #begin): the error to throw.
   * `local`: begin_local, inside a transaction that has not committed, so a
   * lost connection left nothing recorded and stops nothing.
   * @param {unknown} e
   * @param {Attempt|null} attempt
   * @param {string} run
   * @param {string} tool
   * @param {boolean} recorded
   * @param {boolean} [local]
   * @returns {unknown}
   */
  #beginRefused(e, attempt, run, tool, recorded, local = false) {
    const err = /** @type {any} */ (e);
    if (err instanceof LeaseLost) return err;
    if (attempt && err?.code === LEASE_LOST) return loseLease(attempt.lease, err);
    if (err?.code === RUN_ABANDONED) {
      // Nothing was written; the run is stopped for good.
      const stopped = abandoned(run, err);
      this.#stops.stop(run, null, stopped.reason, attempt,
        () => new RunAbandoned(stopped.message, { run, reason: stopped.reason, cause: err }));
      return stopped;
    }
    if (err?.code === TOOL_REFUSED) {
      // Nothing was recorded; the run cannot make this call, so the attempt stops.
      const refusal = refused(run, tool, err);
      this.#stops.stop(run, null, `the ledger refused tool ${tool} (${refusal.reason}); nothing was performed.`,
        attempt);
      return refusal;
    }
    if (local) return err;
    if (err?.[notCommitted]) {
      this.#stops.stopCall(recorded, run, null, `begin_effect of ${tool} ran inside another transaction on ` +
        "the Ledger's connection; whether its intent is recorded depends on that transaction, and " +
        'the effect was not performed.', attempt);
    } else if (attempt ? outcomeUnknown(err) : maybeCommitted(err)) {
      // (a session attempt whose connection broke has lost its lease with it)
      this.#stops.stopCall(recorded, run, null, `begin_effect of ${tool} failed with the outcome of the ` +
        `statement unknown (${describe(err?.message ?? err)}); a new attempt finds out whether its intent ` +
        'was recorded.', attempt);
    }
    return err;
  }

  /**
   * complete_effect / fail_effect on `attempt`, the attempt of the effect that
   * begin_effect executed; anything but an accepted report stops the run (in
   * `owner`, the token attempt of the call, or the session's).  A report needs
   * no token: it goes out on any connection, also after the lease was lost.
   * @param {Attempt|null} owner
   * @param {string} run
   * @param {'complete_effect'|'fail_effect'} fn
   * @param {string} key
   * @param {number|null} attempt
   * @param {string|null} json
   * @param {string} where
   * @param {boolean} recorded
   * @param {string} tool
   * @returns {Promise<any>} the effect's row
   */
  async #report(owner, run, fn, key, attempt, json, where, recorded, tool) {
    let row;
    try {
      [row] = await this.#connection.statement(`${fn} of ${where}`,
        ...this.#about(reportStatement(fn), [key, json, attempt], run), { statement: fn, run, tool, key });
    } catch (err) {
      this.#stops.stopCall(recorded, run, key,
        `${where} could not be recorded (${fn}: ${/** @type {any} */ (err).message}).`, owner);
      throw err;
    }
    const refusal = refusedReport(row, { fn, key, attempt, where, recorded });
    if (refusal) {
      this.#stops.stopCall(refusal.superseded, run, key, `${where}: the ledger did not accept the report (${fn}).`,
        owner);
      throw refusal.error;
    }
    return row;
  }
}
