// The claudeAttempt a tool's handler runs in, for what the adapter adds to the core's
// agentAttempt: a stop ends the query when the app asked for it (abortOnStop).

import { AsyncLocalStorage } from 'node:async_hooks';

/** @typedef {import('durable-ledger/agents').Stop} Stop */

/**
 * What a claudeAttempt hears of its calls.
 * @typedef {{onStop: (stop: Stop) => void}} SessionHooks
 */

/** @type {AsyncLocalStorage<SessionHooks>} */
export const sessionContext = new AsyncLocalStorage();

/**
 * Tells the claudeAttempt the calling code runs in (if any) that a call stopped the run.
 * @param {Stop} stop
 */
export function noteStop(stop) {
  sessionContext.getStore()?.onStop(stop);
}
