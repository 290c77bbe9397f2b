#!/usr/bin/env node
// durable-ledger-console: starts the operator console.  It holds no database
// account: each person logs in with their own PostgreSQL role.
import { readFileSync } from 'node:fs';
import { parseArgs } from 'node:util';
import { buildApp, httpsOrigin } from '../src/app.js';
import { parseTarget } from '../src/target.js';

const usage = `usage: durable-ledger-console [options]
  --database URL     where the ledger is, without a user or password:
                     postgresql://host:port/dbname, or for a Unix socket
                     postgresql:///dbname?host=/var/run/postgresql&port=5432
                     (default: PGHOST, PGPORT, PGDATABASE, as libpq reads them);
                     a host that is not a Unix socket or loopback needs
                     ?sslmode=verify-full (and sslrootcert=FILE for a private CA)
  --listen ADDRESS   the address to serve on (default 127.0.0.1: loopback only)
  --port N           the port (default 8484; 0: any free one)
  --tls-cert FILE    serve https with this certificate chain (PEM) ...
  --tls-key FILE     ... and its key; required for any address but loopback
  --public-origin URL  the https:// origin people use when a TLS-terminating
                     proxy forwards to the console on loopback, e.g.
                     https://console.example (forms must come from it; the
                     cookies are Secure)
  --idle-minutes N   log a person out after N idle minutes (default 15)
  --login-limit N    failed logins per client address and user name a minute
                     (default 10)
  --allow-superuser  let superusers log in (by default they may not)`;

let opts;
try {
  ({ values: opts } = parseArgs({
    options: {
      database: { type: 'string' },
      listen: { type: 'string', default: '127.0.0.1' },
      port: { type: 'string', default: '8484' },
      'tls-cert': { type: 'string' },
      'tls-key': { type: 'string' },
      'public-origin': { type: 'string' },
      'idle-minutes': { type: 'string', default: '15' },
      'login-limit': { type: 'string', default: '10' },
      'allow-superuser': { type: 'boolean', default: false },
      help: { type: 'boolean', default: false },
    },
  }));
} catch (err) {
  console.error(`${err.message}\n${usage}`);
  process.exit(2);
}
if (opts.help) {
  console.log(usage);
  process.exit(0);
}

const loopback = ['127.0.0.1', '::1', 'localhost'].includes(opts.listen);
const tls = opts['tls-cert'] || opts['tls-key'];
if (tls && !(opts['tls-cert'] && opts['tls-key'])) {
  console.error('--tls-cert and --tls-key go together');
  process.exit(2);
}
if (!loopback && !tls) {
  console.error(`refusing to serve ${opts.listen} over plain http: passwords would cross the network in clear.\n` +
    'Give --tls-cert and --tls-key (or put the console behind a TLS proxy on loopback): see docs/console.md');
  process.exit(2);
}

let publicOrigin;
if (opts['public-origin'] !== undefined) {
  try {
    publicOrigin = httpsOrigin(opts['public-origin']);
  } catch (err) {
    console.error(err.message);
    process.exit(2);
  }
}

// a number that is not one would turn a safety off (NaN: no idle timeout, no limit)
function positive(name, { integer = false } = {}) {
  const n = Number(opts[name]);
  if (!(n > 0) || (integer && !Number.isInteger(n))) {
    console.error(`--${name} must be a positive ${integer ? 'whole ' : ''}number, not "${opts[name]}"`);
    process.exit(2);
  }
  return n;
}
const idleMinutes = positive('idle-minutes');
const loginLimit = positive('login-limit', { integer: true });
const port = Number(opts.port);
if (!Number.isInteger(port) || port < 0 || port > 65535) {
  console.error(`--port must be a port number, not "${opts.port}"`);
  process.exit(2);
}

let target;
try {
  target = parseTarget(opts.database);
} catch (err) {
  console.error(err.message);
  process.exit(2);
}

const app = await buildApp({
  target,
  idleTimeoutMs: idleMinutes * 60 * 1000,
  loginLimit,
  allowSuperuser: opts['allow-superuser'],
  https: tls ? { cert: readFileSync(opts['tls-cert']), key: readFileSync(opts['tls-key']) } : undefined,
  publicOrigin,
  logger: { level: 'warn' },
});
const address = await app.listen({ host: opts.listen, port });
console.log(`durable_ledger console: ${address}`);
for (const signal of ['SIGINT', 'SIGTERM']) {
  process.on(signal, () => app.close().then(() => process.exit(0)));
}
