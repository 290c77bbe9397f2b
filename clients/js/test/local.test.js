// Local effects in the JS client (ledger.local({run, tool, args, write})) against a real
// server: a write in the ledger's own database, made in one transaction with its intent
// and its outcome (begin_local), so that they commit together or not at all.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@host/db node --test test/local.test.js
//
// Not through a proxy of a sharded ledger: a local effect cannot be begun there (0A000,
// docs/scale-out.md: begin it on the run's shard); client.test.js tests that refusal,
// and test/apps/031_js_client.pl leaves this file out of its run through a proxy.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { Ledger, EffectDidNotHappen, EffectFailed, EffectPaused, RunStopped } from '../src/index.js';
import { DSN as dsn, THROUGH_PROXY } from './target.js';

if (THROUGH_PROXY) {
  throw new Error('local.test.js runs on a ledger, not through a proxy (DURABLE_LEDGER_ADMIN_DSN is set): ' +
    'a local effect cannot be begun through a proxy');
}

const ORDERS = 'durable_ledger_jstest_orders';
const admin = new pg.Client({ connectionString: dsn });

before(async () => {
  await admin.connect();
  await admin.query(`CREATE TABLE IF NOT EXISTS ${ORDERS} (id serial PRIMARY KEY, run text, item text, ledger_key text)`);
  // a constraint checked at COMMIT, which a test uses to end its backend right there
  await admin.query(`
    CREATE OR REPLACE FUNCTION ${ORDERS}_end_backend() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
      IF NEW.item = 'end the backend at commit' THEN
        PERFORM pg_terminate_backend(pg_backend_pid());
        PERFORM pg_sleep(30);  -- the signal ends it meanwhile
      END IF;
      RETURN NULL;
    END $$`);
  await admin.query(`DROP TRIGGER IF EXISTS end_backend ON ${ORDERS}`);
  await admin.query(`CREATE CONSTRAINT TRIGGER end_backend AFTER INSERT ON ${ORDERS}
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ${ORDERS}_end_backend()`);
});
after(() => admin.end());

const unique = () => `js-local-${randomUUID()}`;

/** A write that places an order of `item`; its id is the result. */
const order = (run, item, then = null) => async (client, key) => {
  const { rows } = await client.query(`INSERT INTO ${ORDERS} (run, item, ledger_key) VALUES ($1, $2, $3) RETURNING id`,
    [run, item, key]);
  if (then) then();
  return { order: rows[0].id, item };
};

async function orders(run) {
  return (await admin.query(`SELECT item FROM ${ORDERS} WHERE run = $1 ORDER BY id`, [run])).rows.map((r) => r.item);
}

async function effects(run) {
  return (await admin.query(
    'SELECT occurrence, attempt, status::text AS status, local FROM durable_ledger.effects WHERE run = $1 ORDER BY created_at',
    [run])).rows;
}

async function withPool(fn) {
  const pool = new pg.Pool({ connectionString: dsn, max: 2 });
  pool.on('error', () => {}); // a backend the test ends
  try {
    return await fn(new Ledger(pool, { consoleWarn: false }));
  } finally {
    await pool.end();
  }
}

test('the write and its outcome commit together, and replay', async () => {
  const run = unique();
  await withPool(async (ledger) => {
    let writes = 0;
    const write = order(run, 'tea', () => writes++);
    const first = await ledger.tokenAttempt(run, {}, () =>
      ledger.local({ run, tool: 'shop.order', args: { item: 'tea' }, write }));
    assert.equal(first.item, 'tea');
    assert.deepEqual(await effects(run), [{ occurrence: 1, attempt: 1, status: 'completed', local: true }]);
    const again = await ledger.tokenAttempt(run, {}, () =>
      ledger.local({ run, tool: 'shop.order', args: { item: 'tea' }, write }));
    assert.deepEqual(again, first);
    assert.equal(writes, 1);
    assert.deepEqual(await orders(run), ['tea']);
  });
});

test('on a session attempt on one client, whose other statements wait for the transaction', async () => {
  const run = unique();
  const client = new pg.Client({ connectionString: dsn });
  await client.connect();
  try {
    const ledger = new Ledger(client, { consoleWarn: false });
    await ledger.attempt(run, async () => {
      // a parallel call of the same attempt: its statements wait for the local transaction
      const [placed, sent] = await Promise.all([
        ledger.local({ run, tool: 'shop.order', args: { item: 'jam' }, write: order(run, 'jam') }),
        ledger.guarded({ run, tool: 'mail.send', args: { to: 'a' }, perform: async () => ({ sent: true }) }),
      ]);
      assert.equal(placed.item, 'jam');
      assert.deepEqual(sent, { sent: true });
    });
    assert.equal(client.getTransactionStatus?.() ?? 'I', 'I');
  } finally {
    await client.end();
  }
  const rows = await effects(run);
  assert.deepEqual(rows.map((r) => [r.status, r.local]).sort(), [['completed', false], ['completed', true]]);
});

test('a refusal rolls the write back and records the failure; another error leaves nothing', async () => {
  const run = unique();
  await withPool(async (ledger) => {
    let tries = 0;
    await ledger.tokenAttempt(run, {}, async () => {
      await assert.rejects(ledger.local({
        run, tool: 'shop.order', args: { item: 'ink' },
        write: order(run, 'ink', () => { throw new EffectDidNotHappen({ out_of_stock: true }); }),
      }), (err) => err instanceof EffectFailed && !err.replayed);
      await assert.rejects(ledger.local({
        run, tool: 'shop.order', args: { item: 'cup' },
        write: order(run, 'cup', () => { if (++tries === 1) throw new Error("the tool's bug"); }),
      }), /the tool's bug/);
      // nothing happened: the same call in the same attempt is occurrence 1 again
      await ledger.local({ run, tool: 'shop.order', args: { item: 'cup' }, write: order(run, 'cup') });
    });
    assert.deepEqual(await orders(run), ['cup']);
    assert.deepEqual((await effects(run)).map((r) => [r.occurrence, r.status]), [[1, 'failed'], [1, 'completed']]);
    await ledger.tokenAttempt(run, {}, () => assert.rejects(ledger.local({
      run, tool: 'shop.order', args: { item: 'ink' }, write: order(run, 'ink'),
    }), (err) => err instanceof EffectFailed && err.replayed && err.error.out_of_stock === true));
  });
});

test('a pause commits what begin_local found', async () => {
  const run = unique();
  await withPool(async (ledger) => {
    await assert.rejects(ledger.tokenAttempt(run, {}, () => ledger.guarded({
      run, tool: 'shop.order', args: { item: 'pen' }, perform: async () => { throw new Error('died'); },
    })), /died/);
    let writes = 0;
    await assert.rejects(ledger.tokenAttempt(run, {}, () => ledger.local({
      run, tool: 'shop.order', args: { item: 'pen' }, write: order(run, 'pen', () => writes++),
    })), EffectPaused);
    assert.equal(writes, 0);
    assert.deepEqual((await effects(run)).map((r) => [r.status, r.local]), [['unknown', false]]);
    const { rows } = await admin.query('SELECT count(*)::int AS n FROM durable_ledger.unresolved WHERE run = $1', [run]);
    assert.equal(rows[0].n, 1);
  });
});

test('a commit whose answer is lost stops the attempt; the next attempt executes once', async () => {
  const run = unique();
  await withPool(async (ledger) => {
    await ledger.tokenAttempt(run, {}, async () => {
      await assert.rejects(ledger.local({
        run, tool: 'shop.order', args: { item: 'x' }, write: order(run, 'end the backend at commit'),
      }), (err) => !(err instanceof EffectFailed));
      await assert.rejects(ledger.local({
        run, tool: 'shop.order', args: { item: 'x' }, write: order(run, 'y'),
      }), RunStopped);
    }).catch((err) => { if (!(err instanceof RunStopped)) throw err; });
    assert.deepEqual(await effects(run), []);
    await ledger.tokenAttempt(run, {}, () =>
      ledger.local({ run, tool: 'shop.order', args: { item: 'x' }, write: order(run, 'y') }));
    assert.deepEqual(await orders(run), ['y']);
    assert.deepEqual((await effects(run)).map((r) => r.status), ['completed']);
  });
});
