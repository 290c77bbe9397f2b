// Where the tests' connections go (the JavaScript counterpart of
// clients/python/tests/target.py).
//
// DURABLE_LEDGER_DSN names the database the client talks to: a ledger, or the proxy of a
// sharded ledger (durable_ledger_proxy, docs/scale-out.md) whose one shard is then
// DURABLE_LEDGER_ADMIN_DSN, on the same cluster (roles are the cluster's).  What the tests
// read or lock in the ledger's own tables, and the backends they wait for or end, are
// found there; the client's calls go through DSN.  Without DURABLE_LEDGER_ADMIN_DSN both
// are DSN.  DURABLE_LEDGER_PGBOUNCER_DSN: a PgBouncer in transaction mode in front of
// DSN's database.  test/apps/031_js_client.pl runs the suite both ways.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';

export const DSN = process.env.DURABLE_LEDGER_DSN;
if (!DSN) {
  throw new Error('set DURABLE_LEDGER_DSN to a superuser connection string of a database with durable_ledger');
}
export const ADMIN_DSN = process.env.DURABLE_LEDGER_ADMIN_DSN || DSN;
/** The client talks to a proxy, whose shard is ADMIN_DSN. */
export const THROUGH_PROXY = ADMIN_DSN !== DSN;
export const BOUNCER_DSN = process.env.DURABLE_LEDGER_PGBOUNCER_DSN || null;

/**
 * Through a proxy, an error a shard returns ends the session leases the session holds on
 * it (PL/Proxy drops the failed call's connection at the next call, docs/scale-out.md): a
 * session attempt that must go on after one starts anew there.
 */
export const ERROR_ENDS_SESSION_LEASE = THROUGH_PROXY;

/** A postgresql:// URL with another database (a host may be a socket directory). */
export function dsnIn(url, database) {
  const at = url.match(/^(postgres(?:ql)?:\/\/[^/?]*\/)([^?]*)(.*)$/);
  assert.ok(at, `not a postgresql:// URL with a database: ${url}`);
  return `${at[1]}${encodeURIComponent(database)}${at[3]}`;
}

/** A postgresql:// URL with another user (node-postgres lets the URL's user win over `user`). */
export function dsnAs(url, user) {
  const at = url.match(/^(postgres(?:ql)?:\/\/)(?:[^@/?]*@)?(.*)$/);
  assert.ok(at, `not a postgresql:// URL: ${url}`);
  return `${at[1]}${encodeURIComponent(user)}@${at[2]}`;
}

/** The database the client's own connections are in (the proxy's, through one). */
export const CLIENT_DB = new pg.Client(DSN).database;

/**
 * The backend that holds `client`'s session on the ledger for `run`, as the ledger's
 * `leases.holder_pid` names it: the connection's own, or through a proxy, the shard's
 * process of PL/Proxy's connection (opened by this call if need be).  Through a pooler:
 * the one this statement reached.
 */
export async function ledgerBackend(client, run, throughProxy = THROUGH_PROXY) {
  const { rows: [r] } = await client.query(throughProxy
    ? 'SELECT durable_ledger_proxy.shard_backend($1) AS pid'
    : 'SELECT pg_backend_pid() AS pid WHERE $1::text IS NOT NULL', [run]);
  return Number(r.pid);
}

/**
 * Every backend of the ledger's cluster that serves `client`'s session: its own, and
 * through a proxy also the shard's (a closed session's leases end once all are gone).
 */
export async function sessionBackends(client) {
  const pids = [client.processID];
  if (THROUGH_PROXY) {
    const { rows } = await client.query('SELECT pid FROM durable_ledger_proxy.shard_backends()');
    pids.push(...rows.map((r) => Number(r.pid)));
  }
  return pids;
}

/**
 * Polls pg_stat_activity (on the admin's connection: the cluster of them all) until none
 * of `pids` is left; false if `patienceMs` passed first.
 */
export async function waitGone(admin, pids, patienceMs = 60_000) {
  const deadline = Date.now() + patienceMs;
  for (;;) {
    const { rows: [{ n }] } = await admin.query(
      'SELECT count(*)::int AS n FROM pg_stat_activity WHERE pid = ANY($1::int[])', [pids]);
    if (n === 0) return true;
    if (Date.now() > deadline) return false;
    await sleep(10);
  }
}

/**
 * Through a proxy, the test harness (031_js_client.pl, and withLedgerDatabase below)
 * makes this PL/Proxy function in the proxy's database: pg_advisory_unlock_all() on the
 * session's connection to every shard, what a pooler's reset (DISCARD ALL) of that
 * connection would do.  (The same SQL as clients/python/tests/target.py's.)
 */
export const UNLOCK_SHARDS = `
CREATE OR REPLACE FUNCTION public.unlock_shard_connections() RETURNS SETOF boolean
LANGUAGE plproxy AS $$
    CLUSTER 'durable_ledger_shards'; RUN ON ALL;
    SELECT true AS unlock_shard_connections FROM (SELECT pg_catalog.pg_advisory_unlock_all()) x;
$$`;

/**
 * Every session lease of `client`'s session dropped behind the ledger's back, as a
 * pooler's reset does: pg_advisory_unlock_all() where the session holds them.
 */
export async function dropLeases(client, throughProxy = THROUGH_PROXY) {
  await client.query(throughProxy ? 'SELECT public.unlock_shard_connections()' : 'SELECT pg_advisory_unlock_all()');
}

/** Runs fn(client) on a new connection to url, ended afterwards. */
async function withAdmin(url, fn) {
  const client = new pg.Client({ connectionString: url, application_name: 'durable-ledger js tests' });
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

/**
 * A ledger of the test alone (for what is the database's: the policy, a pooler's pool),
 * made like the suite's: a new database with the extension, and through a proxy, a
 * proxy database of its own in front of it, set up as 031_js_client.pl sets up the
 * suite's.  fn({dsn, adminDsn, bouncerDsn, throughProxy}): where the client's calls go,
 * where the ledger's tables are read, the client's database through PgBouncer (null
 * without one).  Dropped afterwards.
 */
export async function withLedgerDatabase(prefix, fn) {
  const name = `${prefix}_${randomUUID().replace(/-/g, '').slice(0, 12)}`;
  const shardDb = name;
  const proxyDb = THROUGH_PROXY ? `${name}_proxy` : null;
  const made = [];
  try {
    await withAdmin(ADMIN_DSN, (admin) => admin.query(`CREATE DATABASE ${shardDb}`));
    made.push(shardDb);
    const adminDsn = dsnIn(ADMIN_DSN, shardDb);
    await withAdmin(adminDsn, (admin) => admin.query('CREATE EXTENSION durable_ledger'));
    let dsn = adminDsn;
    if (proxyDb) {
      await withAdmin(ADMIN_DSN, (admin) => admin.query(`CREATE DATABASE ${proxyDb}`));
      made.unshift(proxyDb); // dropped first
      dsn = dsnIn(DSN, proxyDb);
      const { host, port } = new pg.Client(adminDsn);
      const quote = (s) => `'${String(s).replace(/\\/g, '\\\\').replace(/'/g, "\\'")}'`;
      const shard = `host=${quote(host)} port=${quote(port)} dbname=${quote(shardDb)}`;
      await withAdmin(dsn, async (admin) => {
        await admin.query('CREATE EXTENSION durable_ledger_proxy CASCADE');
        await admin.query(`CREATE SERVER durable_ledger_shards FOREIGN DATA WRAPPER plproxy
          OPTIONS (modular_mapping '1', p0 ${admin.escapeLiteral(shard)})`);
        await admin.query('CREATE USER MAPPING FOR PUBLIC SERVER durable_ledger_shards');
        await admin.query(`GRANT USAGE ON FOREIGN SERVER durable_ledger_shards
          TO durable_ledger_worker, durable_ledger_auditor, durable_ledger_admin, durable_ledger_approver`);
        await admin.query(UNLOCK_SHARDS);
      });
    }
    return await fn({
      dsn, adminDsn, bouncerDsn: BOUNCER_DSN ? dsnIn(BOUNCER_DSN, proxyDb ?? shardDb) : null,
      throughProxy: THROUGH_PROXY,
    });
  } finally {
    await withAdmin(ADMIN_DSN, async (admin) => {
      for (const db of made) await admin.query(`DROP DATABASE ${db} WITH (FORCE)`);
    });
  }
}
