// Where the ledger is: a postgresql:// URL without credentials, or libpq's
// environment (PGHOST, PGPORT, PGDATABASE), which node-postgres reads itself.
import { parse } from 'pg-connection-string';

export function parseTarget(url) {
  if (!url) return {};
  let parsed;
  try {
    parsed = parse(url);
  } catch (err) {
    throw new Error(`--database: not a postgresql:// URL (${err.message})`);
  }
  if (parsed.user || parsed.password) {
    throw new Error('--database must not name a user or password: the console has no account of its own; each person logs in as their role');
  }
  const target = {};
  if (parsed.host) target.host = parsed.host;
  if (parsed.port) target.port = Number(parsed.port);
  if (parsed.database) target.database = parsed.database;
  if (parsed.ssl) target.ssl = parsed.ssl;
  return target;
}
