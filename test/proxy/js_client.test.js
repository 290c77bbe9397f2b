// The JavaScript client (clients/js) against durable_ledger_proxy and three
// shards (test/apps/060_proxy.pl): the README's first run on every shard, a
// worker killed mid-payment resolved by a person through the proxy, parallel
// calls of token attempts through a pg.Pool, and what `routed: true` changes.
// PROXY_URL: the proxy database as agent (a worker); ONCALL_URL as oncall (an
// admin); SHARD_URLS: the shards' ledger databases, '|'-separated, p0 first.
import assert from 'node:assert/strict';
import { createHash, randomUUID } from 'node:crypto';
import { createRequire } from 'node:module';
import { spawn } from 'node:child_process';
import { once } from 'node:events';
import { fileURLToPath } from 'node:url';
import { test } from 'node:test';
import { EffectPaused, Ledger, RunStopped } from '../../clients/js/src/index.js';

// node-postgres as the client has it (clients/js/node_modules)
const pg = createRequire(new URL('../../clients/js/package.json', import.meta.url))('pg');

const proxyUrl = process.env.PROXY_URL;
const oncallUrl = process.env.ONCALL_URL;
const shardUrls = (process.env.SHARD_URLS ?? '').split('|').filter(Boolean);
if (!proxyUrl || !oncallUrl || shardUrls.length === 0) throw new Error('set PROXY_URL, ONCALL_URL and SHARD_URLS');

/** docs/scale-out.md's routing, from its words (test/proxy/test_proxy.py has the same). */
function shardIndex(run) {
  let key = run;
  const open = run.indexOf('{');
  if (open >= 0) {
    const close = run.indexOf('}', open + 1);
    if (close > open + 1) key = run.slice(open + 1, close);
  }
  const h = createHash('sha256').update(key, 'utf8').digest().readInt32BE(0);
  return Math.abs(h) % shardUrls.length;
}

const tag = randomUUID().slice(0, 8);
/** A new run id on shard i. */
function runOn(i, prefix) {
  for (let n = 0; ; n++) {
    const run = `${prefix}-${tag}-${n}`;
    if (shardIndex(run) === i) return run;
  }
}

async function withClient(url, fn) {
  const client = new pg.Client(url);
  await client.connect();
  try {
    return await fn(client);
  } finally {
    await client.end();
  }
}

const shardRows = (i, sql, params) => withClient(shardUrls[i], async (c) => (await c.query(sql, params)).rows);

/** A closed proxy session's connection to the shard, and its lease, end asynchronously. */
async function leaseGone(run) {
  const i = shardIndex(run);
  for (const deadline = Date.now() + 60000; ;) {
    const [{ n }] = await shardRows(i,
      "SELECT count(*)::int AS n FROM durable_ledger.leases WHERE run = $1 AND kind = 'session'", [run]);
    if (n === 0) return;
    assert.ok(Date.now() < deadline, `the lease of ${run} never ended`);
    await new Promise((resolve) => setTimeout(resolve, 10));
  }
}

test('the first run pays once per run on every shard, the retry replays', async () => {
  const paid = [];
  for (let i = 0; i < shardUrls.length; i++) {
    const run = runOn(i, 'js-first');
    const receipts = await withClient(proxyUrl, async (client) => {
      const ledger = new Ledger(client, { routed: true });
      const pay = ledger.tool('bank.pay', async (args, key) => {
        paid.push(key);
        return { paymentId: `pay-${key.slice(0, 8)}` };
      });
      const agent = () => ledger.attempt(run, async () => {
        const plan = await ledger.record({ run, tool: 'llm.plan', args: { i }, call: async () => ({ amount: 100 + i }) });
        return pay(run, { invoice: `INV-${i}`, amount: plan.amount });
      });
      return [await agent(), await agent()];
    });
    assert.deepEqual(receipts[0], receipts[1]);
    const rows = await shardRows(i, 'SELECT tool, status FROM durable_ledger.effects WHERE run = $1 ORDER BY created_at', [run]);
    assert.deepEqual(rows.map((r) => `${r.tool} ${r.status}`), ['llm.plan completed', 'bank.pay completed'],
      `the run's effects are on its shard p${i}`);
  }
  assert.equal(paid.length, shardUrls.length, 'one payment per run');
});

test('a worker killed mid-payment pauses the run until a person resolves it through the proxy', async () => {
  const run = runOn(1, 'js-killed');
  const worker = `
    import pg from 'pg';
    import { Ledger } from ${JSON.stringify(fileURLToPath(new URL('../../clients/js/src/index.js', import.meta.url)))};
    const client = new pg.Client(process.env.PROXY_URL);
    await client.connect();
    const ledger = new Ledger(client, { routed: true });
    await ledger.attempt(${JSON.stringify(run)}, () => ledger.guarded({
      run: ${JSON.stringify(run)}, tool: 'bank.pay', args: { invoice: 'INV-9', amount: 4200 },
      perform: () => process.kill(process.pid, 'SIGKILL') }));`;
  const child = spawn(process.execPath, ['--input-type=module', '-e', worker],
    { cwd: fileURLToPath(new URL('../../clients/js/', import.meta.url)), stdio: 'inherit' });
  const [, signal] = await once(child, 'exit');
  assert.equal(signal, 'SIGKILL', 'the worker died at the bank');
  await leaseGone(run);
  const bank = [];
  const attempt = (client) => {
    const ledger = new Ledger(client, { routed: true, consoleWarn: false });
    return ledger.attempt(run, () => ledger.guarded({
      run, tool: 'bank.pay', args: { invoice: 'INV-9', amount: 4200 }, perform: (key) => bank.push(key) }));
  };
  const paused = await withClient(proxyUrl, (client) => attempt(client).then(
    () => assert.fail('the call was not paused'), (err) => err));
  assert.ok(paused instanceof EffectPaused, `paused: ${paused}`);
  await withClient(oncallUrl, async (client) => {
    const { rows } = await client.query('SELECT shard FROM durable_ledger.unresolved WHERE key = $1', [paused.key]);
    assert.deepEqual(rows, [{ shard: 'p1' }]);
    await client.query(`SELECT durable_ledger.resolve_effect($1, 'completed', '{"paymentId": "pay_81"}', 'maria')`,
      [paused.key]);
  });
  await leaseGone(run);
  assert.deepEqual(await withClient(proxyUrl, attempt), { paymentId: 'pay_81' });
  assert.deepEqual(bank, [], 'the bank was never called again');
});

test('parallel calls of token attempts through a pool, on every shard', async () => {
  const pool = new pg.Pool({ connectionString: proxyUrl, max: 4 });
  try {
    const ledger = new Ledger(pool, { routed: true });
    const paid = [];
    const pay = ledger.tool('bank.pay', async (args, key) => {
      await new Promise((resolve) => setTimeout(resolve, 5));
      paid.push(key);
      return { key };
    });
    const runs = [0, 1, 2, 3, 4, 5].map((i) => runOn(i % shardUrls.length, `js-token${i}`));
    const agent = (run) => ledger.tokenAttempt(run, { ttl: 30 }, () =>
      Promise.all([pay(run, { invoice: 'A' }), pay(run, { invoice: 'B' })]));
    const first = await Promise.all(runs.map(agent));
    const again = await Promise.all(runs.map(agent));
    assert.deepEqual(again, first, 'the rerun replays every result');
    assert.equal(paid.length, 2 * runs.length);
  } finally {
    await pool.end();
  }
});

test('a routed report goes to its run\'s shard; an unrouted one is refused where the key is on two shards', async () => {
  const invoice = `TWICE-${tag}`;
  const results = [];
  for (const [i, routed] of [[0, true], [2, false]]) {
    const run = runOn(i, 'js-twice');
    results.push(await withClient(proxyUrl, (client) => {
      const ledger = new Ledger(client, { routed, consoleWarn: false });
      return ledger.attempt(run, () => ledger.guarded({
        run, tool: 'bank.pay', args: { amount: 5 }, businessKey: invoice, perform: (key) => ({ paid: key }) }));
    }).catch((err) => `${err.constructor.name} ${err.sqlstate ?? err.cause?.code}`));
  }
  assert.equal(results.length, 2);
  assert.deepEqual(results[0], { paid: `${invoice}#1` });
  assert.match(results[1], / 22023$/, 'the unrouted report is refused: the key is on two shards');
  const statuses = [];
  for (const i of [0, 2]) {
    const [row] = await shardRows(i, 'SELECT status FROM durable_ledger.effects WHERE key = $1', [invoice]);
    statuses.push(row.status);
  }
  assert.deepEqual(statuses, ['completed', 'started']);
});

test('a canceled call through the proxy stops the attempt as an unknown outcome', async () => {
  const run = runOn(0, 'js-canceled');
  const performed = [];
  const blocker = new pg.Client(shardUrls[0]);
  await blocker.connect();
  const worker = new pg.Client({ connectionString: proxyUrl, statement_timeout: 500 });
  await worker.connect();
  try {
    const ledger = new Ledger(worker, { routed: true, consoleWarn: false });
    const outcome = await ledger.attempt(run, async () => {
      await blocker.query('BEGIN');
      await blocker.query('LOCK TABLE durable_ledger.effects IN ACCESS EXCLUSIVE MODE');
      const first = await ledger.guarded({ run, tool: 'bank.pay', args: { n: 1 }, perform: (k) => performed.push(k) })
        .then(() => null, (err) => err);
      await blocker.query('ROLLBACK');
      assert.equal(first?.code ?? first?.cause?.code, '57014', `the first call was canceled: ${first}`);
      return ledger.guarded({ run, tool: 'bank.pay', args: { n: 2 }, perform: (k) => performed.push(k) });
    }).then(() => null, (err) => err);
    assert.ok(outcome instanceof RunStopped, `the attempt stopped at the canceled call: ${outcome}`);
    assert.deepEqual(performed, []);
    const rows = await shardRows(0, 'SELECT count(*)::int AS n FROM durable_ledger.effects WHERE run = $1', [run]);
    assert.equal(rows[0].n, 0, 'the canceled call wrote nothing, and no other was made');
  } finally {
    await worker.end();
    await blocker.end();
  }
});
