// The client's sentences: values and the server's errors as text for its messages.

/**
 * A value as text for a message: a string as is, anything else as JSON (or
 * String() when it is not JSON).
 * @param {unknown} value
 * @returns {string}
 */
export function describe(value) {
  if (typeof value === 'string') return value;
  try {
    return JSON.stringify(value) ?? String(value);
  } catch {
    return String(value);
  }
}

/**
 * The ledger's reason as a sentence ending with a full stop.
 * @param {string|null|undefined} text
 * @returns {string}
 */
export function sentence(text) {
  if (!text) return '';
  return /[.!?]$/.test(text) ? text : `${text}.`;
}

/**
 * The server's message and detail as one sentence.
 * @param {any} err  an error of a statement (node-postgres' DatabaseError), or anything thrown
 * @returns {string}
 */
export function serverMessage(err) {
  const detail = err?.detail ? `: ${String(err.detail).replace(/\.$/, '')}` : '';
  return `${err?.message ?? err}${detail}`;
}
