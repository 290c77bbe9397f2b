// The tests' database and helpers.  DURABLE_LEDGER_DSN: a superuser connection to a
// database with durable_ledger 1.3 (the tests resolve effects, break leases, register
// tools and make login roles of their own, which they drop).
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { Ledger } from 'durable-ledger';

export const DSN = process.env.DURABLE_LEDGER_DSN;
if (!DSN) throw new Error('set DURABLE_LEDGER_DSN to a superuser connection string of a database with durable_ledger');

/** A run id of its own for a test. @param {string} name */
export const runId = (name) => `oa-${name}-${randomUUID().slice(0, 8)}`;

/** What `promise` rejects with (the test fails if it resolves). @param {Promise<unknown>} promise */
export const rejection = (promise) => promise.then(() => assert.fail('it must throw'), (err) => err);

/** A postgresql:// URL with another user (node-postgres lets the URL's user win). @param {string} url @param {string} user */
export function dsnAs(url, user) {
  const at = url.match(/^(postgres(?:ql)?:\/\/)(?:[^@/?]*@)?(.*)$/);
  if (!at) throw new Error(`not a postgresql:// URL: ${url}`);
  return `${at[1]}${encodeURIComponent(user)}@${at[2]}`;
}

/**
 * A Ledger on a pg.Pool of its own (token leases), and the admin's client; both closed after fn.
 * @template T
 * @param {(ctx: {ledger: Ledger, admin: pg.Client, pool: pg.Pool}) => Promise<T>} fn
 * @param {{dsn?: string}} [options]
 */
export async function withLedger(fn, { dsn = DSN } = {}) {
  const pool = new pg.Pool({ connectionString: dsn, max: 4 });
  const admin = new pg.Client({ connectionString: DSN });
  await admin.connect();
  try {
    return await fn({ ledger: new Ledger(pool, { consoleWarn: false }), admin, pool });
  } finally {
    await admin.end();
    await pool.end();
  }
}

/**
 * The run's effects, [{key, downstream, tool, status, result}] in the order they were begun:
 * `downstream` the idempotency key the provider got (the key; for a business key, such as
 * a call keyed by its id, the key and its attempt, key#attempt).
 * @param {pg.Client} admin @param {string} run
 */
export async function effectsOf(admin, run) {
  const { rows } = await admin.query(
    `SELECT key, CASE WHEN business_key THEN key || '#' || attempt ELSE key END AS downstream, tool,
            status::text AS status, result
       FROM durable_ledger.effects WHERE run = $1 ORDER BY created_at, key`,
    [run]);
  return rows;
}

/** The run's history events of one tool. @param {pg.Client} admin @param {string} run @param {string} tool */
export async function eventsOf(admin, run, tool) {
  const { rows } = await admin.query(
    'SELECT lease_epoch::int AS epoch, event FROM durable_ledger.history($1) WHERE tool = $2 ORDER BY id', [run, tool]);
  return rows.map((r) => `${r.epoch}:${r.event}`);
}

/**
 * Polls `probe` until it returns a truthy value (a row, a count), at most `patienceMs`.
 * @template T
 * @param {() => Promise<T>} probe
 * @param {string} what
 * @param {number} [patienceMs]
 * @returns {Promise<T>}
 */
export async function waitFor(probe, what, patienceMs = 60_000) {
  const deadline = Date.now() + patienceMs;
  for (;;) {
    const found = await probe();
    if (found) return found;
    if (Date.now() > deadline) throw new Error(`gave up waiting for ${what}`);
    await sleep(50);
  }
}

/**
 * Login roles made for a test (with the given grants), dropped by drop().
 * @param {pg.Client} admin
 */
export function roles(admin) {
  /** @type {string[]} */
  const made = [];
  return {
    /** @param {string[]} grants */
    async make(grants) {
      const role = `dl_oatest_${randomUUID().replace(/-/g, '').slice(0, 16)}`;
      await admin.query(`CREATE ROLE ${role} LOGIN`);
      made.push(role);
      for (const g of grants) await admin.query(`GRANT ${g} TO ${role}`);
      return role;
    },
    async drop() {
      for (const role of made.reverse()) await admin.query(`DROP ROLE ${role}`);
    },
  };
}
