// The claudeAttempt a tool's handler runs in, for what the adapter adds to the core's
// agentAttempt: a stop ends the query when the app asked for it (abortOnStop).

import { AsyncLocalStorage } from 'node:async_hooks';

/**
 * The abortController of the claudeAttempt the calling code runs in, when it was opened
 * with abortOnStop (else null).
 * @type {AsyncLocalStorage<AbortController | null>}
 */
export const sessionContext = new AsyncLocalStorage();

/** Tells the claudeAttempt the calling code runs in (if any) that a call stopped the run. */
export function noteStop() {
  sessionContext.getStore()?.abort(new Error('a tool call stopped the run (durable-ledger)'));
}
