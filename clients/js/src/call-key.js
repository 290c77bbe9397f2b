// The business key of a tool call that a framework names by its own id
// (guarded()'s callId, begin_effect's call_id).

import { createHash } from 'node:crypto';

/**
 * The business key of a tool call identified by the framework's id for it (guarded()'s
 * callId): the run, the tool and the id, as a JSON array after "call:" (readable, and no two
 * triples give one key), or its SHA-256 past 200 characters (room for the provider's key).
 * @param {string} run
 * @param {string} tool
 * @param {string} callId
 * @returns {string}
 */
export function callKey(run, tool, callId) {
  if (typeof callId !== 'string' || callId === '') throw new TypeError('callKey(): callId must be a non-empty string');
  const triple = JSON.stringify([run, tool, callId]);
  const key = `call:${triple}`;
  // a business key may have 255 characters, and the provider's key adds "#<attempt>":
  // kept within 200 (length counts UTF-16 units, never fewer than characters), so that
  // it fits what providers take (Stripe: 255)
  return key.length <= 200 ? key : `call:sha256:${createHash('sha256').update(triple).digest('hex')}`;
}

