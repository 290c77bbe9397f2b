// Tests of the durable-ledger client against a real server.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@host/db npm test
//
// The DSN must be a superuser connection (resolve_effect needs the admin role)
// to a database where `CREATE EXTENSION durable_ledger` has been run.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import {
  Ledger, LedgerError, EffectFailed, EffectPaused, EffectInProgress, EffectDidNotHappen, RunStopped,
} from '../src/index.js';

const dsn = process.env.DURABLE_LEDGER_DSN;
if (!dsn) {
  throw new Error('set DURABLE_LEDGER_DSN to a superuser connection string of a database with durable_ledger');
}

const unique = (name) => `js-${name}-${randomUUID()}`;
const HEX64 = /^[0-9a-f]{64}$/;

/** Runs fn(client, ledger) on a fresh connection (a new session, so a new lease epoch). */
async function withClient(fn) {
  const client = new pg.Client({ connectionString: dsn, application_name: 'durable-ledger js tests' });
  await client.connect();
  try {
    return await fn(client, new Ledger(client));
  } finally {
    await client.end();
  }
}

/** A perform() that counts its calls and returns a fixed result. */
function counter(result) {
  const perform = async (key) => {
    perform.keys.push(key);
    return result;
  };
  perform.keys = [];
  return perform;
}

async function auditEvents(client, key) {
  const { rows } = await client.query(
    'SELECT event FROM durable_ledger.audit_log WHERE key = $1 ORDER BY id', [key]);
  return rows.map((r) => r.event);
}

test('execute: performs once with the key, completes, returns and records the result', async () => {
  const run = unique('execute');
  await withClient(async (client, ledger) => {
    const perform = counter({ payment_id: 'pay_1', amount: 4200 });
    const args = { invoice: 'INV-1', amount: 4200 };
    const result = await ledger.attempt(run, () =>
      ledger.guarded({ run, tool: 'bank.pay', args, perform, meta: { model: 'test' } }));

    assert.deepEqual(result, { payment_id: 'pay_1', amount: 4200 });
    assert.equal(perform.keys.length, 1);
    const [key] = perform.keys;
    assert.match(key, HEX64);
    const { rows: [k] } = await client.query(
      "SELECT durable_ledger.effect_key($1, 'bank.pay', $2::jsonb, 1) AS key", [run, JSON.stringify(args)]);
    assert.equal(key, k.key, 'the key passed downstream is the derived key of occurrence 1');

    const row = await ledger.effectStatus(key);
    assert.equal(row.status, 'completed');
    assert.deepEqual(row.result, { payment_id: 'pay_1', amount: 4200 });
    assert.deepEqual(row.meta, { model: 'test' });
    assert.deepEqual(await auditEvents(client, key), ['intent', 'completed']);
    assert.equal(await ledger.effectStatus('never-seen-key'), null);
  });
});

test('the result is returned as recorded: a first run and a replay see the same value', async () => {
  const run = unique('json');
  const perform = async () => ({ at: new Date(0), skipped: undefined, n: 1.5 });
  const nothing = async () => undefined;
  const first = await withClient((_c, ledger) => ledger.attempt(run, async () => [
    await ledger.guarded({ run, tool: 'crm.note', args: { a: 1 }, perform }),
    await ledger.guarded({ run, tool: 'crm.ping', args: null, perform: nothing }),
  ]));
  assert.deepEqual(first, [{ at: '1970-01-01T00:00:00.000Z', n: 1.5 }, null]);
  const again = await withClient((_c, ledger) => ledger.attempt(run, async () => [
    await ledger.guarded({ run, tool: 'crm.note', args: { a: 1 }, perform }),
    await ledger.guarded({ run, tool: 'crm.ping', args: null, perform: nothing }),
  ]));
  assert.deepEqual(again, first);
});

test('replay: a new attempt returns the recorded result without performing', async () => {
  const run = unique('replay');
  const args = { to: 'ACME', amount: 4200 };
  const first = counter({ payment_id: 'pay_2' });
  await withClient((_c, ledger) =>
    ledger.attempt(run, () => ledger.guarded({ run, tool: 'bank.pay', args, perform: first })));
  assert.equal(first.keys.length, 1);

  const again = counter({ payment_id: 'SHOULD-NOT-HAPPEN' });
  const result = await withClient((_c, ledger) =>
    ledger.attempt(run, () => ledger.guarded({ run, tool: 'bank.pay', args, perform: again })));
  assert.deepEqual(result, { payment_id: 'pay_2' });
  assert.equal(again.keys.length, 0, 'perform must not be called on replay');
});

test('replay: args with another key order and number spelling map onto the same key', async () => {
  const run = unique('canonical');
  const first = counter({ ok: 1 });
  await withClient((_c, ledger) => ledger.attempt(run, () =>
    ledger.guarded({ run, tool: 'bank.pay', args: { invoice: 'INV-9', amount: 4200, currency: 'USD' }, perform: first })));

  const again = counter({ ok: 'SHOULD-NOT-HAPPEN' });
  const result = await withClient(async (client, ledger) => {
    await ledger.acquireRun(run);
    const args = { currency: 'USD', amount: 4200, invoice: 'INV-9' }; // another key order
    const r = await ledger.guarded({ run, tool: 'bank.pay', args, perform: again });
    // another number spelling (JavaScript would print 4200.00 as 4200): straight SQL
    await ledger.acquireRun(run);
    const d = await client.query(
      `SELECT * FROM durable_ledger.begin_effect($1, 'bank.pay',
         '{"currency":"USD","amount":4200.00,"invoice":"INV-9"}'::jsonb)`, [run]);
    assert.equal(d.rows[0].decision, 'replay');
    assert.equal(d.rows[0].key, first.keys[0]);
    await ledger.releaseRun(run);
    return r;
  });
  assert.deepEqual(result, { ok: 1 });
  assert.equal(again.keys.length, 0);
});

test('EffectDidNotHappen: fail_effect is recorded and EffectFailed is thrown', async () => {
  const run = unique('fail');
  await withClient(async (client, ledger) => {
    let key;
    const err = await ledger.attempt(run, () => ledger.guarded({
      run, tool: 'bank.pay', args: { invoice: 'INV-3' },
      perform: async (k) => {
        key = k;
        throw new EffectDidNotHappen({ code: 'card_declined' }, 'the bank declined the card');
      },
    })).then(() => assert.fail('expected EffectFailed'), (e) => e);

    assert.ok(err instanceof EffectFailed, `got ${err}`);
    assert.ok(err instanceof LedgerError);
    assert.equal(err.replayed, false);
    assert.equal(err.key, key);
    assert.equal(err.decision, 'execute');
    assert.deepEqual(err.error, { code: 'card_declined' });
    assert.ok(err.cause instanceof EffectDidNotHappen);

    const row = await ledger.effectStatus(key);
    assert.equal(row.status, 'failed');
    assert.deepEqual(row.error, { code: 'card_declined' });
    assert.deepEqual(await auditEvents(client, key), ['intent', 'failed']);
  });
});

test('replay of a failure: a new attempt throws EffectFailed (replayed) without performing', async () => {
  const run = unique('fail-replay');
  let key;
  await withClient((_c, ledger) => ledger.attempt(run, () => ledger.guarded({
    run, tool: 'mail.send', args: { to: 'x@example.com' },
    perform: (k) => { key = k; throw new EffectDidNotHappen({ status: 422 }); },
  })).catch((e) => assert.ok(e instanceof EffectFailed)));

  const again = counter('SHOULD-NOT-HAPPEN');
  const err = await withClient((_c, ledger) => ledger.attempt(run, () =>
    ledger.guarded({ run, tool: 'mail.send', args: { to: 'x@example.com' }, perform: again })))
    .then(() => assert.fail('expected EffectFailed'), (e) => e);
  assert.ok(err instanceof EffectFailed, `got ${err}`);
  assert.equal(err.replayed, true);
  assert.equal(err.decision, 'replay');
  assert.equal(err.key, key);
  assert.deepEqual(err.error, { status: 422 });
  assert.equal(again.keys.length, 0);
});

test('unknown outcome: the error is rethrown, nothing is guessed, the next attempt pauses', async () => {
  const run = unique('unknown');
  const args = { invoice: 'INV-4', amount: 10 };
  const boom = new Error('socket hang up');
  let key;
  await withClient(async (client, ledger) => {
    await ledger.acquireRun(run);
    const err = await ledger.guarded({
      run, tool: 'bank.pay', args, perform: async (k) => { key = k; throw boom; },
    }).then(() => assert.fail('expected the error'), (e) => e);
    assert.equal(err, boom, 'the original error is rethrown as is');

    const row = await ledger.effectStatus(key);
    assert.equal(row.status, 'started', 'no fail_effect: the outcome is unknown');
    assert.deepEqual(await auditEvents(client, key), ['intent']);

    // Retrying in the same attempt would be the next occurrence (a new key): refused.
    const retry = counter('SHOULD-NOT-HAPPEN');
    const stopped = await ledger.guarded({ run, tool: 'bank.pay', args, perform: retry })
      .then(() => assert.fail('expected RunStopped'), (e) => e);
    assert.ok(stopped instanceof RunStopped, `got ${stopped}`);
    assert.equal(stopped.key, key);
    assert.equal(retry.keys.length, 0);
    // the client ends without releasing: like a crashed worker
  });

  await withClient(async (_c, ledger) => {
    const again = counter('SHOULD-NOT-HAPPEN');
    const err = await ledger.guarded({ run, tool: 'bank.pay', args, perform: again })
      .then(() => assert.fail('expected EffectPaused'), (e) => e);
    assert.ok(err instanceof EffectPaused, `got ${err}`);
    assert.ok(err instanceof LedgerError);
    assert.equal(err.key, key);
    assert.equal(err.decision, 'pause');
    assert.match(err.reason, /unknown/);
    assert.match(err.message, /resolve_effect/);
    assert.equal(again.keys.length, 0);
    assert.equal((await ledger.effectStatus(key)).status, 'unknown');
    // and the paused attempt cannot go on (a retry would be occurrence 2: a new key)
    await assert.rejects(ledger.guarded({ run, tool: 'bank.pay', args, perform: again }), RunStopped);
    assert.equal(again.keys.length, 0);
    await ledger.releaseRun(run);
  });
});

test('after resolve_effect a paused effect is replayed by the next attempt', async () => {
  const run = unique('resolve');
  const args = { invoice: 'INV-5' };
  let key;
  await withClient((_c, ledger) => ledger.guarded({
    run, tool: 'bank.pay', args, perform: (k) => { key = k; throw new Error('timeout'); },
  }).catch(() => {}));

  await withClient(async (client, ledger) => {
    const perform = counter('SHOULD-NOT-HAPPEN');
    await assert.rejects(
      ledger.attempt(run, () => ledger.guarded({ run, tool: 'bank.pay', args, perform })),
      EffectPaused);

    await client.query(
      `SELECT durable_ledger.resolve_effect($1, 'completed', $2::jsonb, 'js-test', 'bank shows pay_5')`,
      [key, JSON.stringify({ payment_id: 'pay_5' })]);

    const result = await ledger.attempt(run, () => ledger.guarded({ run, tool: 'bank.pay', args, perform }));
    assert.deepEqual(result, { payment_id: 'pay_5' });
    assert.equal(perform.keys.length, 0);
  });
});

test('in_progress: a business key performed under another live lease throws EffectInProgress', async () => {
  const businessKey = unique('order');
  const args = { order: businessKey, amount: 99 };
  const runA = unique('bk-a');
  const runB = unique('bk-b');

  await withClient(async (_ca, ledgerA) => {
    let began;
    const performing = new Promise((resolve) => { began = resolve; });
    let finish;
    const held = new Promise((resolve) => { finish = resolve; });
    const a = ledgerA.guarded({
      run: runA, tool: 'shop.ship', args, businessKey,
      perform: async (key) => { began(key); await held; return { shipment: 's1' }; },
    });
    const keyA = await performing;
    assert.equal(keyA, businessKey, 'a business key is the key itself');

    await withClient(async (_cb, ledgerB) => {
      const other = counter('SHOULD-NOT-HAPPEN');
      const err = await ledgerB.guarded({ run: runB, tool: 'shop.ship', args, businessKey, perform: other })
        .then(() => assert.fail('expected EffectInProgress'), (e) => e);
      assert.ok(err instanceof EffectInProgress, `got ${err}`);
      assert.equal(err.key, businessKey);
      assert.equal(err.decision, 'in_progress');
      assert.ok(err.reason);
      assert.equal(other.keys.length, 0);

      finish();
      assert.deepEqual(await a, { shipment: 's1' });
      // in_progress does not stop the run: asking again later replays
      const later = await ledgerB.guarded({ run: runB, tool: 'shop.ship', args, businessKey, perform: other });
      assert.deepEqual(later, { shipment: 's1' });
      assert.equal(other.keys.length, 0);
      await ledgerB.releaseRun(runB);
    });
    await ledgerA.releaseRun(runA);
  });
});

test('tool(): passes the key as idempotency key; again is not twice; replays map in order', async () => {
  const run = unique('tool');
  const calls = [];
  const sendEmail = async (args, idempotencyKey) => {
    calls.push({ args, idempotencyKey });
    return { message_id: `msg_${calls.length}` };
  };

  const firstResults = await withClient(async (client, ledger) => {
    const send = ledger.tool('mail.send', sendEmail);
    const r = await ledger.attempt(run, async () => [
      await send(run, { to: 'a@example.com' }),
      await send(run, { to: 'a@example.com' }), // deliberately twice: occurrence 2
    ]);
    assert.equal(calls.length, 2);
    for (const [i, c] of calls.entries()) {
      assert.deepEqual(c.args, { to: 'a@example.com' });
      const { rows: [k] } = await client.query(
        "SELECT durable_ledger.effect_key($1, 'mail.send', $2::jsonb, $3) AS key",
        [run, JSON.stringify(c.args), i + 1]);
      assert.equal(c.idempotencyKey, k.key, `occurrence ${i + 1}'s key is passed downstream`);
      assert.equal((await ledger.effectStatus(c.idempotencyKey)).status, 'completed');
    }
    assert.notEqual(calls[0].idempotencyKey, calls[1].idempotencyKey);
    return r;
  });
  assert.deepEqual(firstResults, [{ message_id: 'msg_1' }, { message_id: 'msg_2' }]);

  const replayed = await withClient((_c, ledger) => {
    const send = ledger.tool('mail.send', sendEmail);
    return ledger.attempt(run, async () => [
      await send(run, { to: 'a@example.com' }),
      await send(run, { to: 'a@example.com' }),
    ]);
  });
  assert.deepEqual(replayed, firstResults);
  assert.equal(calls.length, 2, 'nothing is sent again');
});

test('guarded() refuses to begin inside an open transaction', async () => {
  const run = unique('tx');
  await withClient(async (client, ledger) => {
    const perform = counter('SHOULD-NOT-HAPPEN');
    await client.query('BEGIN');
    await assert.rejects(
      ledger.guarded({ run, tool: 'bank.pay', args: { n: 1 }, perform }),
      (e) => e instanceof LedgerError && /transaction/.test(e.message));
    await client.query('ROLLBACK');
    assert.equal(perform.keys.length, 0);
    const { rows } = await client.query('SELECT count(*)::int AS n FROM durable_ledger.effects WHERE run = $1', [run]);
    assert.equal(rows[0].n, 0, 'nothing written');
  });
});

test('the transaction check also works for a client without getTransactionStatus()', async () => {
  const run = unique('tx-sql');
  await withClient(async (client) => {
    // a Queryable that only has query(): the check falls back to SQL
    const ledger = new Ledger({ query: (...a) => client.query(...a) });
    const perform = counter({ ok: true });
    await client.query('BEGIN');
    await assert.rejects(ledger.guarded({ run, tool: 't', args: {}, perform }), /transaction/);
    await client.query('ROLLBACK');
    assert.deepEqual(await ledger.guarded({ run, tool: 't', args: {}, perform }), { ok: true });
    assert.equal(perform.keys.length, 1);
    await ledger.releaseRun(run);
  });
});

test('attempt(): releases the lease at the end, also after an error', async () => {
  const run = unique('attempt');
  await withClient(async (_c, ledger) => {
    await withClient(async (_c2, other) => {
      await ledger.attempt(run, async () => {
        assert.equal(await other.acquireRun(run, { wait: false }), false, 'held during the attempt');
      });
      assert.equal(await other.acquireRun(run, { wait: false }), true, 'released after it');
      assert.equal(await other.releaseRun(run), true);

      await assert.rejects(ledger.attempt(run, async () => { throw new Error('agent crashed'); }), /agent crashed/);
      assert.equal(await other.acquireRun(run, { wait: false }), true, 'released after an error');
      assert.equal(await other.releaseRun(run), true);
    });
    assert.equal(await ledger.releaseRun(run), false, 'nothing left to release');
  });
});

test('the example agent loop runs: the first worker executes, the replayed one executes nothing', async () => {
  const run = unique('example');
  const script = fileURLToPath(new URL('../examples/agent-loop.js', import.meta.url));
  const { code, stdout, stderr } = await new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [script, run], { env: { ...process.env, DURABLE_LEDGER_DSN: dsn } });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { err += d; });
    child.on('error', reject);
    child.on('close', (c) => resolve({ code: c, stdout: out, stderr: err }));
  });
  assert.equal(code, 0, `exit code 0; stderr: ${stderr}`);
  const [first, second] = stdout.split('-- the worker restarts');
  assert.ok(second, `the output has two workers:\n${stdout}`);
  assert.equal((first.match(/bank: charging/g) ?? []).length, 1);
  assert.equal((first.match(/mail: sending/g) ?? []).length, 1);
  assert.match(first, /payments\.charge \[executed\]/);
  assert.match(first, /email\.send \[executed\]/);
  assert.doesNotMatch(second, /bank: charging|mail: sending|\[executed\]/);
  assert.match(second, /payments\.charge \[replayed\]/);
  assert.match(second, /email\.send \[replayed\]/);
  assert.match(second, /crm\.lookup \[read-only\]/);
  assert.match(stdout, /downstream calls: bank 1, mail 1, crm 4/);

  await withClient(async (client) => {
    const { rows } = await client.query(
      'SELECT tool, status FROM durable_ledger.effects WHERE run = $1 ORDER BY tool', [run]);
    assert.deepEqual(rows, [
      { tool: 'email.send', status: 'completed' },
      { tool: 'payments.charge', status: 'completed' },
    ], 'only the two side-effecting tools are in the ledger');
  });
});
