// Where the ledger is: a postgresql:// URL without credentials, or libpq's
// environment (PGHOST, PGPORT, PGDATABASE, PGSSLMODE), which node-postgres
// reads itself.  A person's password goes to that address (as a SCRAM proof:
// sessions.js refuses to send it otherwise), so anything but a Unix socket or
// loopback must be reached over TLS with the server's certificate and name
// verified (sslmode=verify-full): else whoever answers there could relay the
// SCRAM exchange and then act as the person.
import { parse } from 'pg-connection-string';

export function parseTarget(url, env = process.env) {
  let target = {};
  if (url) {
    let parsed;
    try {
      parsed = parse(url);
    } catch (err) {
      throw new Error(`--database: not a postgresql:// URL (${err.message})`);
    }
    if (parsed.user || parsed.password) {
      throw new Error('--database must not name a user or password: the console has no account of its own; each person logs in as their role');
    }
    if (parsed.host) target.host = parsed.host;
    if (parsed.port) target.port = Number(parsed.port);
    if (parsed.database) target.database = parsed.database;
    if (parsed.ssl) target.ssl = parsed.ssl;
    // node-postgres reads PGHOST and PGSSLMODE for what the URL leaves out
    const sslmode = parsed.ssl === false ? 'disable' : parsed.sslmode ?? env.PGSSLMODE;
    requireVerifiedTls(parsed.host || env.PGHOST, sslmode, parsed.uselibpqcompat);
  } else {
    requireVerifiedTls(env.PGHOST, env.PGSSLMODE);
    target = {};
  }
  return target;
}

/** A host that is this machine: a Unix socket's directory, or loopback. */
export function isLocalHost(host) {
  const h = String(host ?? 'localhost');
  if (h.startsWith('/')) return true;
  return h === 'localhost' || h === '::1' || h === '[::1]' || /^127\.\d{1,3}\.\d{1,3}\.\d{1,3}$/.test(h);
}

function requireVerifiedTls(host, sslmode, libpqCompat) {
  if (isLocalHost(host || undefined)) return;
  if (sslmode !== 'verify-full') {
    throw new Error(`the ledger's address ${host} (--database, or PGHOST) is neither a Unix socket nor loopback: ` +
      'the console connects to it only over TLS ' +
      'that verifies the server\'s certificate and name (add ?sslmode=verify-full to the URL, and sslrootcert=FILE ' +
      'for a private CA; or PGSSLMODE=verify-full): see docs/console.md');
  }
  if (libpqCompat !== undefined && libpqCompat !== 'true') {
    throw new Error('--database: uselibpqcompat must be true or absent');
  }
}
