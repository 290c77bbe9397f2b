// Reconcilers in the JS client (tool(name, fn, {reconcile}), guarded({reconcile})) against a
// real server: a worker lost mid-payment leaves the outcome unknown; the next attempt asks
// the provider by the lost attempt's downstream key, records what it said
// (reconcile_effect), and goes on without a person -- a completion replays, "no such
// payment" pays again under a new provider key, anything else pauses.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@host/db node --test test/reconcile.test.js
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { Ledger, EffectPaused, Happened, NotHappened } from '../src/index.js';
import { DSN as dsn, ADMIN_DSN } from './target.js';

// the ledger's own tables are read where they are (target.js)
const admin = new pg.Client({ connectionString: ADMIN_DSN, application_name: 'durable-ledger js tests' });
before(() => admin.connect());
after(() => admin.end());

const unique = (name) => `js-${name}-${randomUUID()}`;

async function withClient(fn) {
  const client = new pg.Client({ connectionString: dsn, application_name: 'durable-ledger js tests' });
  await client.connect();
  try {
    return await fn(client, new Ledger(client, { consoleWarn: false }));
  } finally {
    await client.end();
  }
}

/** A provider that pays under an idempotency key and answers lookups by it. */
class Bank {
  payments = new Map();
  lookups = [];
  pay = async (args, key) => {
    const payment = { payment_id: `pay-${this.payments.size + 1}`, amount: args.amount };
    this.payments.set(key, payment);
    return payment;
  };
  lookup = async (key) => {
    this.lookups.push(key);
    return this.payments.has(key) ? new Happened(this.payments.get(key))
      : new NotHappened({ lookup: 'no payment with that key', key });
  };
}

/** A tool of the test's own, registered, reconcilable after grace (null: not at all). */
async function reconcilableTool(grace = '0') {
  const tool = unique('bank.pay');
  await withClient(async (client) => {
    await client.query("SELECT durable_ledger.register_tool($1, 'js-test')", [tool]);
    if (grace !== null) await client.query("SELECT durable_ledger.set_reconcile($1, $2, 'js-test')", [tool, grace]);
  });
  return tool;
}

/** A worker calls the bank and is lost before it records the answer; the bank paid or not. */
async function lostMidPayment(run, tool, bank, args, { paid }) {
  let key;
  await withClient(async (_client, ledger) => {
    await ledger.acquireRun(run);
    await assert.rejects(ledger.guarded({
      run, tool, args,
      perform: async (k) => {
        key = k;
        if (paid) await bank.pay(args, k);
        throw new Error('the worker was lost before the answer arrived');
      },
    }));
  }); // the connection ends: the lease with it
  return key;
}

async function events(key) {
  return (await admin.query(
    "SELECT event FROM durable_ledger.audit_log WHERE key = $1 AND event NOT IN ('lease_acquired', 'lease_released') ORDER BY id",
    [key])).rows.map((r) => r.event);
}

async function effect(run) {
  const { rows } = await admin.query('SELECT * FROM durable_ledger.effects WHERE run = $1', [run]);
  assert.equal(rows.length, 1);
  return rows[0];
}

test('the bank paid: the next attempt records its record and replays it', async () => {
  const run = unique('paid');
  const tool = await reconcilableTool();
  const bank = new Bank();
  const key = await lostMidPayment(run, tool, bank, { amount: 10 }, { paid: true });
  const result = await withClient(async (_c, ledger) => {
    const pay = ledger.tool(tool, bank.pay, { reconcile: bank.lookup });
    return ledger.attempt(run, () => pay(run, { amount: 10 }));
  });
  assert.deepEqual(result, { payment_id: 'pay-1', amount: 10 });
  assert.equal(bank.payments.size, 1, 'paid twice');
  assert.deepEqual(bank.lookups, [key]);
  const row = await effect(run);
  assert.deepEqual([row.status, row.attempt, row.resolved_by], ['completed', 1, null]);
  assert.deepEqual(await events(key), ['intent', 'pause', 'reconciled', 'replay']);
});

test('the bank has no record: the payment is made again under key#2, never the old key', async () => {
  const run = unique('not-paid');
  const tool = await reconcilableTool();
  const bank = new Bank();
  const key = await lostMidPayment(run, tool, bank, { amount: 20 }, { paid: false });
  const result = await withClient(async (_c, ledger) => ledger.attempt(run, () =>
    ledger.guarded({ run, tool, args: { amount: 20 }, perform: (k) => bank.pay({ amount: 20 }, k),
      reconcile: bank.lookup })));
  assert.equal(result.amount, 20);
  assert.deepEqual([...bank.payments.keys()], [`${key}#2`]);
  const row = await effect(run);
  assert.deepEqual([row.status, row.attempt], ['completed', 2]);
  assert.deepEqual(await events(key), ['intent', 'pause', 'reconciled', 'intent', 'completed']);
});

test('a provider that cannot tell, a lookup that throws, a grace not passed, a tool nobody made reconcilable: paused', async () => {
  const bank = new Bank();
  const cases = [
    // [tool, reconcile, whether the client tells why (a provider that cannot tell is no news)]
    [await reconcilableTool(), async (k) => { bank.lookups.push(k); return null; }, false],
    [await reconcilableTool(), async (k) => { bank.lookups.push(k); throw new Error('lookup API down'); }, true],
    [await reconcilableTool('1 hour'), bank.lookup, true],
    [await reconcilableTool(null), bank.lookup, true],
  ];
  for (const [tool, reconcile, told] of cases) {
    const run = unique('paused');
    const key = await lostMidPayment(run, tool, bank, { amount: 30 }, { paid: false });
    const notices = [];
    const err = await withClient(async (_c, ledger) => {
      ledger.on('notice', (n) => notices.push(n));
      return ledger.attempt(run, () => ledger.guarded({ run, tool, args: { amount: 30 },
        perform: (k) => bank.pay({ amount: 30 }, k), reconcile })).then(() => assert.fail('expected a pause'), (e) => e);
    });
    assert.ok(err instanceof EffectPaused, `got ${err}`);
    assert.equal(err.key, key);
    assert.equal((await effect(run)).status, 'unknown');
    assert.ok(!bank.payments.has(`${key}#2`));
    assert.ok(!(await events(key)).includes('reconciled'));
    assert.equal(notices.some((n) => n.origin === 'client' && n.statement === 'reconcile_effect'), told,
      'the client says why it did not settle it');
  }
  // before the grace, or for a tool nobody made reconcilable, the provider is not even asked
  assert.equal(bank.lookups.length, 2);
});

test('a token attempt on a pool reconciles', async () => {
  const run = unique('token');
  const tool = await reconcilableTool();
  const bank = new Bank();
  const key = await lostMidPayment(run, tool, bank, { amount: 50 }, { paid: true });
  const pool = new pg.Pool({ connectionString: dsn, max: 2 });
  try {
    const ledger = new Ledger(pool, { consoleWarn: false });
    const result = await ledger.tokenAttempt(run, { ttl: 30 }, () =>
      ledger.guarded({ run, tool, args: { amount: 50 }, perform: (k) => bank.pay({ amount: 50 }, k),
        reconcile: bank.lookup }));
    assert.equal(result.payment_id, 'pay-1');
  } finally {
    await pool.end();
  }
  assert.equal(bank.payments.size, 1);
  assert.deepEqual((await events(key)).slice(-2), ['reconciled', 'replay']);
});

test('a finding the ledger cannot record stops the attempt at the pause', async () => {
  // reconcile_effect fails (evidence PostgreSQL cannot store, 22P05; a lost connection is
  // the same): the pause stands, and the attempt goes no further
  const run = unique('unstorable');
  const tool = await reconcilableTool();
  const bank = new Bank();
  const key = await lostMidPayment(run, tool, bank, { amount: 60 }, { paid: true });
  const mails = [];
  const [first, second] = await withClient(async (_c, ledger) => ledger.attempt(run, async () => {
    const failed = await ledger.guarded({ run, tool, args: { amount: 60 },
      perform: (k) => bank.pay({ amount: 60 }, k),
      reconcile: async () => new Happened({ memo: 'paid\u0000' }) }).then(() => null, (e) => e);
    const next = await ledger.guarded({ run, tool: 'mail.send', args: { to: 'customer' },
      perform: async () => { mails.push('sent'); } }).then(() => null, (e) => e);
    return [failed, next];
  }).catch((e) => [e, null]));
  assert.ok(first instanceof Error && first.code === '22P05', `got ${first}`);
  assert.ok(second instanceof Error, 'the attempt went on past the pause');
  assert.match(second.message, new RegExp(key));
  assert.deepEqual(mails, []);
  assert.equal(bank.payments.size, 1);
  assert.equal((await effect(run)).status, 'unknown');
});
