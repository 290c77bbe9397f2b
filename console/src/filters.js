// Template filters.  Every value reaches the page through nunjucks'
// autoescape: these only format, they never mark anything safe.

/** A JSON value as indented text (escaped when rendered). */
function json(value) {
  if (value === undefined) return '';
  return JSON.stringify(value, null, 2);
}

/** A duration in seconds, as a person reads it. */
function age(seconds) {
  const s = Number(seconds);
  if (!Number.isFinite(s)) return '';
  if (s < 60) return `${Math.max(0, Math.round(s))} s`;
  if (s < 3600) return `${Math.round(s / 60)} min`;
  if (s < 86400) return `${(s / 3600).toFixed(1)} h`;
  return `${(s / 86400).toFixed(1)} d`;
}

/** A timestamp, to the second, in UTC. */
function ts(value) {
  if (!value) return '';
  const d = value instanceof Date ? value : new Date(value);
  return Number.isNaN(d.getTime()) ? String(value) : d.toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z');
}

/** The start of a long key, for a table cell (the full key is on its page). */
function short(value, n = 16) {
  const s = value === null || value === undefined ? '' : String(value);
  return s.length > n ? `${s.slice(0, n)}…` : s;
}

export function addFilters(env) {
  env.addFilter('json', json);
  env.addFilter('age', age);
  env.addFilter('ts', ts);
  env.addFilter('short', short);
  env.addFilter('url', (v) => encodeURIComponent(v ?? ''));
}
