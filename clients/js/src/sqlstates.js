// The SQLSTATEs of the ledger (docs/reference.md, "Errors") and the errors of
// this client they become.

import {
  BusinessKeyConflict, ConcurrentChange, InvalidArgument, NotFound, PermissionDenied, ReadOnlyLedger, RunAbandoned,
  RunBusy, RunExists, TooManyLeases, ToolRefused, WrongState,
} from './errors.js';
import { serverMessage } from './text.js';

/** The SQLSTATE of a lost token lease: expired, released, superseded or unknown. */
export const LEASE_LOST = '55L01';

/** The SQLSTATE of a call of a run that a person abandoned (begin_effect, acquire_run, take_lease). */
export const RUN_ABANDONED = '55L02';

/** The SQLSTATE of a call that would execute a retired tool, or an unregistered one under `refuse`. */
export const TOOL_REFUSED = '55L03';

const GRANT_HINT = "The ledger's functions are granted to its roles: durable_ledger_worker " +
  '(begin, complete, fail, effect_status, leases), durable_ledger_auditor (history, the tables and ' +
  'views), durable_ledger_admin (resolve, break_lease, the tools registry, purges); e.g. ' +
  'GRANT durable_ledger_worker TO your_login_role.';

/** @type {Record<string, typeof InvalidArgument>} */
const REFUSALS = {
  '22004': InvalidArgument, '22023': InvalidArgument, '23505': BusinessKeyConflict,
  '42704': NotFound, '42710': RunExists, '55000': WrongState, '40001': ConcurrentChange,
  '25006': ReadOnlyLedger, '53400': TooManyLeases, '42501': PermissionDenied,
};

/**
 * The named error for an error of a ledger statement, or the error itself:
 * RunBusy for 55P03, a LedgerRefused for the ledger's other SQLSTATEs.
 * 55L01-55L03 are left to the callers, which know the run, tool and attempt.
 * @param {any} err  what the statement threw
 * @returns {any}
 */
export function named(err) {
  const Refusal = err?.code === '55P03' ? RunBusy : REFUSALS[err?.code];
  if (!Refusal) return err;
  // a permission error names no role: say which ones the ledger grants
  const hint = err.hint ?? (Refusal === PermissionDenied ? GRANT_HINT : null);
  const text = [err.message, err.detail, hint].filter(Boolean).join('  ');
  if (Refusal === RunBusy) {
    return new RunBusy(text, { reason: err.message, cause: err, sqlstate: err.code, detail: err.detail ?? null });
  }
  return new Refusal(`${text} (SQLSTATE ${err.code})`,
    { sqlstate: err.code, detail: err.detail ?? null, hint, cause: err });
}

/**
 * RunAbandoned for a 55L02 refusal of a call of `run`.
 * @param {string} run
 * @param {unknown} err  the server's error
 */
export function abandoned(run, err) {
  const reason = serverMessage(err);
  return new RunAbandoned(
    `${reason} (SQLSTATE 55L02).  This attempt stops here, and the run must not be retried: ` +
      'it is stopped for good.',
    { run, reason, cause: err });
}

/**
 * ToolRefused for a 55L03 refusal of a call of `tool` in `run`.
 * @param {string} run
 * @param {string} tool
 * @param {unknown} err  the server's error
 */
export function refused(run, tool, err) {
  const reason = serverMessage(err);
  return new ToolRefused(
    `${reason} (SQLSTATE 55L03).  Nothing was recorded or performed; this attempt stops here ` +
      '(the run cannot make this call): an admin registers the tool, then a new attempt may go on.',
    { run, tool, reason, cause: err });
}
