// The ledger's answers to a call, as control flow.  The extension decides;
// this module only turns its decisions into what guarded() does:
//
//   execute      -> perform(downstream_key), then complete_effect(key, result, attempt) -> result
//   replay       -> the recorded result (or EffectFailed for a recorded failure)
//   pause        -> EffectPaused   (an earlier attempt's outcome is unknown)
//                   DivergencePaused, an EffectPaused (status null: the
//                   call diverges from the run's earlier attempts)
//                   AwaitingApproval, an EffectPaused (status awaiting_approval:
//                   the call waits for an approver; nothing was performed)
//   in_progress  -> EffectInProgress (another live lease is performing it)
//
// (begin_effect's refusals are errors, not decisions: call-flow.js makes
// 55L02 a RunAbandoned, a person abandoned the run, and 55L03 a ToolRefused,
// a retired or unregistered tool.)  This module also
// judges the answer to a report (complete_effect, fail_effect), which
// names the attempt of the effect that begin_effect executed: a business key
// is executed again after a failure (attempt 2, 3, ...), and a report must
// decide the attempt it is about and no other, whichever session holds the
// lease by the time it arrives.

import { AwaitingApproval, BudgetExhausted, DivergencePaused, EffectFailed, EffectInProgress, EffectPaused, LedgerError } from './errors.js';

// A budget's pause says so first (docs/reference.md, "Budgets").
const BUDGET_REASON = 'budget:';
import { describe, sentence } from './text.js';

/** @typedef {'execute' | 'replay' | 'pause' | 'in_progress'} DecisionWord */
/** @typedef {'started' | 'completed' | 'failed' | 'unknown' | 'awaiting_approval' | 'approved'} EffectStatusWord */

/**
 * A row of durable_ledger.decision, as begin_effect returns it.
 * @typedef {object} Decision
 * @property {string} key
 * @property {DecisionWord} decision
 * @property {EffectStatusWord | null} status  the effect's status after the call; null for a
 *   call paused because it diverges from the run's earlier attempts (decision `pause`:
 *   nothing was recorded for it)
 * @property {number | null} occurrence
 * @property {number | null} attempt  1; for a business key, n+1 after n recorded failures; null
 *   with a null status.  guarded() names it in its report (complete_effect / fail_effect), so
 *   the report decides this attempt only.
 * @property {unknown} result
 * @property {unknown} error
 * @property {string | null} reason
 * @property {string | null} downstream_key  the key to give the provider: the effect's key, or
 *   for a business key the key and its attempt ("INV-9#2"), so that a provider that keeps its
 *   answers to a key sees a business key's next attempt as a new request; null when the call
 *   has no effect (a divergence pause)
 */

/**
 * What guarded() does with begin_effect's decision `d` about the call of
 * `tool` in `run` (`where` names it in messages): {execute: true} to perform
 * it, {execute: false, result} for a replayed completion; it throws for
 * anything else, after stop(key, reason) for a pause, which stops the attempt.
 * @param {Decision} d
 * @param {{run: string, tool: string, where: string, stop: (key: string, reason: string) => void}} call
 * @returns {{execute: true} | {execute: false, result: unknown}}
 */
export function judge(d, { run, tool, where, stop }) {
  switch (d.decision) {
    case 'execute':
      return { execute: true };
    case 'replay':
      if (d.status === 'completed') return { execute: false, result: d.result };
      if (d.status === 'failed') {
        throw new EffectFailed(`${where} failed in an earlier attempt (replayed): ${describe(d.error)}`, {
          key: d.key, decision: d.decision, reason: d.reason, error: d.error, replayed: true,
        });
      }
      throw new LedgerError(`${where}: replay with unexpected status ${d.status}`, d);
    case 'pause':
      if ((d.reason ?? '').startsWith(BUDGET_REASON)) {
        // a budget stops the call (extension 1.3): nothing was performed
        stop(d.key, `${where} is paused by a budget.`);
        throw new BudgetExhausted(
          `${where} is paused: ${sentence(d.reason)}  It was not performed; a person raises the ` +
            'run\'s budget (durable_ledger.set_run_budget) or abandons the run.',
          { key: d.key, run, tool, reason: d.reason });
      }
      if (d.status === null) {
        // Nothing was recorded for the call: it diverges from the run's earlier
        // attempts and waits for resolve_divergence.  It stops the attempt like any pause.
        stop(d.key, `${where} diverges from the run's earlier attempts and is paused.`);
        throw new DivergencePaused(
          `${where} is paused: ${sentence(d.reason)}  A person must decide with ` +
            'durable_ledger.resolve_divergence (same or distinct) before the run can go on.',
          { key: d.key, run, tool, reason: d.reason });
      }
      if (d.status === 'awaiting_approval') {
        stop(d.key, `${where} awaits an approver.`);
        throw new AwaitingApproval(
          `${where} awaits an approver: ${sentence(d.reason)}  It was not performed; an approver ` +
            '(durable_ledger.approve_effect or reject_effect) decides before the run can go on.',
          d
        );
      }
      stop(d.key, `${where} is paused.`);
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
}

/**
 * Whether the ledger took a report (complete_effect or fail_effect `fn` on
 * `attempt` of `key`), judged by the row it answered: null when it did, else
 * the LedgerError to throw, and whether the report was kept as superseded (a
 * recorded call made again by a later attempt: nothing for a person).
 * @param {any} row  the effect's row after the report
 * @param {{fn: 'complete_effect'|'fail_effect', key: string, attempt: number|null, where: string, recorded: boolean}} report
 * @returns {{superseded: boolean, error: LedgerError} | null}
 */
export function refusedReport(row, { fn, key, attempt, where, recorded }) {
  const wanted = fn === 'complete_effect' ? 'completed' : 'failed';
  // When a later attempt replaced ours (someone else recorded ours as failed
  // meanwhile, and the key was executed again), the row is that later
  // attempt's, which our report never changes: a failure the ledger already
  // had for our attempt is on record; anything else was kept as a conflict.
  // (A recorded call's attempt is replaced only when it was lost: the ledger
  // kept our report, whatever it said, as superseded.)
  const accepted = row.attempt === attempt
    ? !row.conflict && row.status === wanted
    : !row.conflict && fn === 'fail_effect' && !recorded;
  if (accepted) return null;
  const now = row.attempt === attempt
    ? row.status
    : `at attempt ${row.attempt} (this report was on attempt ${attempt}), ${row.status}`;
  const superseded = recorded && row.attempt !== attempt && !row.conflict;
  if (superseded) {
    // a recorded call made again by a later attempt (ours lost its lease):
    // the ledger kept our report as superseded; nothing for a person
    return {
      superseded,
      error: new LedgerError(
        `${where}: a later attempt made the recorded call again (this attempt's lease ended): the ` +
          `effect is ${now}; this report was kept in the audit log as superseded, and this attempt stops.`,
        { key, decision: 'execute', reason: 'superseded report' }),
    };
  }
  return {
    superseded,
    error: new LedgerError(
      `${where}: the ledger did not accept the report (${fn}); the effect is ${now}` +
        `${row.conflict ? ' and flagged as a conflict' : ''}.  A person must look at it ` +
        '(durable_ledger.unresolved).',
      { key, decision: 'execute', reason: 'contradicting report' }
    ),
  };
}
