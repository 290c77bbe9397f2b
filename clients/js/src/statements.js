// The ledger's statements as this client sends them, and their parameters.
// (A session attempt's are wrapped in the guard of session-guard.js.)  Every
// statement is a transaction of its own; a call's run is always $1.

/**
 * JSON text for a jsonb parameter; undefined becomes SQL NULL.
 * @param {unknown} value
 * @returns {string|null}
 */
export function jsonParam(value) {
  if (value === undefined) return null;
  return JSON.stringify(value) ?? null;
}

/**
 * JSON text for a recorded error: falls back to its text when it is not JSON.
 * @param {unknown} value
 * @returns {string|null}
 */
export function errorParam(value) {
  if (value instanceof Error) value = { name: value.name, message: value.message };
  try {
    return jsonParam(value);
  } catch {
    return JSON.stringify(String(value));
  }
}

/**
 * meta with the attempt's model as meta.model (extension 1.3); a call's own
 * model in meta is kept.
 * @param {unknown} meta
 * @param {string|null} model
 * @returns {unknown}
 */
export function withModel(meta, model) {
  if (model === null || model === undefined) return meta;
  if (meta === null || meta === undefined) return { model };
  if (typeof meta !== 'object' || Array.isArray(meta)) {
    throw new TypeError('meta must be a JSON object to carry the attempt\'s model');
  }
  if (Object.prototype.hasOwnProperty.call(meta, 'model')) return meta;
  return { .../** @type {object} */ (meta), model };
}

/**
 * An attempt's model: a non-empty string, or null.
 * @param {unknown} model
 * @returns {string|null}
 */
export function checkModel(model) {
  if (model === null || model === undefined) return null;
  if (typeof model !== 'string' || model === '') {
    throw new TypeError('model must be a non-empty string naming the model that answers the attempt');
  }
  return model;
}

/**
 * The call that begins a call and its parameters (the run is $1):
 * begin_effect, for a call recorded as safe to redo (record(), never with a
 * business key) begin_recorded, for a local effect (local()) begin_local; with a token lease's token, or none (the
 * session's lease).
 * @param {string} run
 * @param {string} tool
 * @param {unknown} args
 * @param {string|null} businessKey
 * @param {unknown} meta
 * @param {string|null} token
 * @param {boolean} recorded
 * @param {boolean} [local]  begin_local: a local effect (local()), in the caller's transaction
 * @param {boolean} [callId]  businessKey is a framework's id of the tool call (call_id, 1.3)
 * @returns {[string, unknown[]]} the function call (no SELECT) and its parameters
 */
export function beginCall(run, tool, args, businessKey, meta, token, recorded, local = false, callId = false) {
  /** @type {unknown[]} */
  const params = recorded
    ? [run, tool, jsonParam(args), jsonParam(meta)]
    : [run, tool, jsonParam(args), businessKey ?? null, jsonParam(meta)];
  const types = recorded ? ['text', 'text', 'jsonb', 'jsonb'] : ['text', 'text', 'jsonb', 'text', 'jsonb'];
  if (token != null) {
    params.push(token);
    types.push('text');
  }
  let placeholders = types.map((type, i) => `$${i + 1}::${type}`).join(', ');
  if (callId) {
    // named, and only when true: a call without it is the same statement as before 1.3
    params.push(true);
    placeholders += `, call_id => $${params.length}::boolean`;
  }
  const fn = recorded ? 'begin_recorded' : local ? 'begin_local' : 'begin_effect';
  return [`durable_ledger.${fn}(${placeholders})`, params];
}

/**
 * beginCall as a statement of its own: SELECT * FROM the call.
 * @param {Parameters<typeof beginCall>} call
 * @returns {[string, unknown[]]}
 */
export function beginStatement(...call) {
  const [text, params] = beginCall(...call);
  return [`SELECT * FROM ${text}`, params];
}

/**
 * complete_effect or fail_effect ($1 key, $2 result or error, $3 the attempt it is about).
 * @param {'complete_effect'|'fail_effect'} fn
 */
export function reportStatement(fn) {
  // only the columns the report's judge, the caller and the notices read: each column of
  // the effect's row costs the client its parsing (its timestamps most)
  return `SELECT key, run, tool, status, attempt, result, error, conflict FROM durable_ledger.${fn}($1::text, $2::jsonb, $3::integer)`;
}

/**
 * A call about a key with the run as its last argument, when given: through
 * durable_ledger_proxy (a Ledger made with `routed: true`) it then goes
 * straight to the run's shard (docs/scale-out.md).  The call's closing
 * parenthesis must be the statement's last.
 * @param {string} text
 * @param {unknown[]} params
 * @param {string|null} run
 * @returns {[string, unknown[]]}
 */
export function routed(text, params, run) {
  if (run === null) return [text, params];
  const at = text.lastIndexOf(')');
  return [`${text.slice(0, at)}, run => $${params.length + 1}::text${text.slice(at)}`, [...params, run]];
}

/** take_lease($1 run, $2 ttl in seconds, $3 holder). */
export const TAKE_LEASE =
  'SELECT * FROM durable_ledger.take_lease($1::text, make_interval(secs => $2::double precision), $3::text)';

/** renew_lease($1 token): the new expiry. */
export const RENEW_LEASE = 'SELECT durable_ledger.renew_lease($1::text) AS expires_at';

/** release_lease($1 token): whether the lease was still live. */
export const RELEASE_LEASE = 'SELECT durable_ledger.release_lease($1::text) AS released';

/** effect_status($1 key). */
export const EFFECT_STATUS = 'SELECT * FROM durable_ledger.effect_status($1::text)';

/** history($1 run). */
export const HISTORY = 'SELECT * FROM durable_ledger.history($1::text)';
