// Reconcilers: a paused effect whose outcome is unknown (its worker was lost
// mid-call), settled from the provider's own record.  A tool given
// `reconcile(downstreamKey, args)` -- a lookup at the provider by the key the
// lost attempt gave it -- returns a Happened (the record: the effect's
// result) or a NotHappened (the provider's answer: the next attempt is made
// under a new provider key), or null when the provider cannot tell.  The
// finding is recorded with reconcile_effect (for a tool an admin made
// reconcilable, once its grace has passed); the call is then asked again.
// Anything else leaves the pause for a person.

import { jsonParam } from './statements.js';
import { describe } from './text.js';

/** The provider's record shows the effect happened: `evidence` becomes its result. */
export class Happened {
  /** @param {unknown} evidence  the provider's record (JSON) */
  constructor(evidence) {
    /** @readonly */
    this.evidence = evidence;
  }
}

/** The provider has no record of it: `evidence` (its answer) becomes the attempt's error, and
 * the call is made again as the next attempt, under a new provider key. */
export class NotHappened {
  /** @param {unknown} evidence  the provider's answer (JSON) */
  constructor(evidence) {
    /** @readonly */
    this.evidence = evidence;
  }
}

/**
 * A tool's lookup at the provider: what it says of the effect given to it under
 * `downstreamKey`, or null (undefined) when it cannot tell.
 * @typedef {(downstreamKey: string, args: any) =>
 *   Happened | NotHappened | null | undefined | Promise<Happened | NotHappened | null | undefined>} Reconcile
 */

/** Whether the tool's grace has passed, by the server's clock: the lookup must come after it. */
export const RECONCILE_DUE =
  'SELECT f AS reconcilable_from, f <= pg_catalog.clock_timestamp() AS due ' +
  'FROM durable_ledger.reconcilable_from($1::text, $2::integer) f';

export const RECONCILE_EFFECT =
  'SELECT * FROM durable_ledger.reconcile_effect($1::text, $2::integer, $3::boolean, $4::jsonb)';

/**
 * A pause for an effect whose outcome is unknown: what a reconciler may settle.
 * @param {import('./decisions.js').Decision} d
 */
export function reconcilable(d) {
  return d.decision === 'pause' && d.status === 'unknown' && d.downstream_key != null;
}

/**
 * Asks the provider; the finding, or null (it cannot tell, it threw, it answered
 * something else: each told to `warn`).
 * @param {Reconcile} reconcile
 * @param {import('./decisions.js').Decision} d
 * @param {unknown} args
 * @param {(message: string) => void} warn
 * @returns {Promise<Happened | NotHappened | null>}
 */
export async function askProvider(reconcile, d, args, warn) {
  let found;
  try {
    found = await reconcile(/** @type {string} */ (d.downstream_key), args);
  } catch (err) {
    warn(`its reconcile() threw (${describe(/** @type {any} */ (err)?.message ?? err)}): the pause is left ` +
      'for a person');
    return null;
  }
  if (found instanceof Happened || found instanceof NotHappened) return found;
  if (found != null) {
    warn('its reconcile() returned neither a Happened, a NotHappened nor null: the pause is left for a person');
  }
  return null;
}

/**
 * reconcile_effect of the paused attempt, with the provider's finding.
 * @param {import('./decisions.js').Decision} d
 * @param {Happened | NotHappened} found
 * @returns {unknown[]}
 */
export function reconcileParams(d, found) {
  return [d.key, d.attempt, found instanceof Happened, jsonParam(found.evidence)];
}
