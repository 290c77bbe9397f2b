// Template filters.  Every value reaches the page through nunjucks'
// autoescape: these only format, they never mark anything safe.

import { JsonText } from './sessions.js';
import { encodeId } from './ids.js';

/**
 * A JSON value as indented text (escaped when rendered).  json and jsonb come
 * from PostgreSQL as their text (sessions.js): it is re-indented, never
 * parsed, so every number is shown as the ledger holds it.
 */
function json(value) {
  if (value === undefined) return '';
  if (value instanceof JsonText) return indentJson(value.text);
  return JSON.stringify(value, (k, v) => (v instanceof JsonText ? JSON.parse(v.text) : v), 2);
}

// JSON text as JSON.stringify(value, null, 2) would write it, with its
// strings and numbers exactly as they are in the text.
const TOKEN = /\s*("(?:[^"\\]|\\.)*"|[{}[\],:]|[^\s{}[\],:"]+)/gy;
export function indentJson(text) {
  let out = '';
  let depth = 0;
  let opened = false;  // the last token opened an object or array
  TOKEN.lastIndex = 0;
  const pad = () => '\n' + '  '.repeat(depth);
  for (;;) {
    const start = TOKEN.lastIndex;
    const m = TOKEN.exec(text);
    if (!m) {
      // anything but white space left over: not JSON text, shown as it came
      if (text.slice(start).trim() !== '') return text;
      break;
    }
    const t = m[1];
    if (t === '}' || t === ']') {
      depth -= 1;
      out += opened ? t : pad() + t;
      opened = false;
      continue;
    }
    if (opened) out += pad();
    opened = false;
    if (t === '{' || t === '[') {
      out += t;
      depth += 1;
      opened = true;
    } else if (t === ',') {
      out += ',' + pad();
    } else if (t === ':') {
      out += ': ';
    } else {
      out += t;
    }
  }
  return out;
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
  // a key, run or tool in a form field (ids.js): the console decodes it exactly
  env.addFilter('id', encodeId);
}
