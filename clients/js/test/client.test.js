// Tests of the durable-ledger client against a real server.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@host/db npm test
//
// The DSN must be a superuser connection (resolve_effect needs the admin role)
// to a database where `CREATE EXTENSION durable_ledger` has been run, or to the proxy
// of a sharded ledger (test/target.js says where the tests read the ledger's tables).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import {
  Ledger, LedgerError, EffectFailed, EffectPaused, EffectInProgress, EffectDidNotHappen, RunStopped,
  RunBusy, LeaseLostError, LedgerRefused, BusinessKeyConflict, InvalidArgument, ToolRefusedError,
} from '../src/index.js';
import {
  DSN as dsn, ADMIN_DSN, THROUGH_PROXY, ERROR_ENDS_SESSION_LEASE, dropLeases, ledgerBackend,
} from './target.js';

// What the tests read in the ledger's own tables, they read where those are (target.js):
// the client's database, or through a proxy, its shard's.
const admin = new pg.Client({ connectionString: ADMIN_DSN, application_name: 'durable-ledger js tests' });
before(() => admin.connect());
after(() => admin.end());

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

async function auditEvents(key) {
  const { rows } = await admin.query(
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
    assert.deepEqual(await auditEvents(key), ['intent', 'completed']);
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
    await ledger.releaseRun(run);
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
    assert.deepEqual(await auditEvents(key), ['intent', 'failed']);
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
    assert.deepEqual(await auditEvents(key), ['intent']);

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
    await ledger.acquireRun(run); // the next attempt
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

test('record(): a model call lost with its worker, or that threw, is made again by the next attempt, then replayed', async () => {
  const run = unique('record');
  const messages = [{ role: 'user', content: 'pay INV-9?' }];
  const calls = [];
  const model = (answer) => async () => { calls.push(answer); return { role: 'assistant', content: answer }; };
  const client = new pg.Client({ connectionString: dsn });
  await client.connect();
  client.on('error', () => {}); // its backend is terminated below, as a dead worker's
  const ledger = new Ledger(client);
  await ledger.acquireRun(run);
  assert.deepEqual(await ledger.record({ run, tool: 'model', args: { messages }, call: model('yes') }),
    { role: 'assistant', content: 'yes' });
  // a turn in flight when the worker dies: its connection ends, and the lease with it
  let entered;
  const inFlight = new Promise((resolve) => { entered = resolve; });
  void ledger.record({
    run, tool: 'model', args: { messages, turn: 2 }, call: () => { entered(); return new Promise(() => {}); },
  });
  await inFlight;
  const { rows: [{ pid }] } = await client.query('SELECT pg_backend_pid() AS pid');
  await admin.query('SELECT pg_terminate_backend($1, 10000)', [pid]);

  await withClient(async (_c, rerun) => {
    // the model fails: the error comes through, nothing is recorded, and the attempt
    // stops (a retry in it would act on an answer a replay does not see)
    const timeout = new Error('model timed out');
    await rerun.attempt(run, async () => {
      assert.deepEqual(await rerun.record({ run, tool: 'model', args: { messages }, call: model('SHOULD-NOT-BE-CALLED') }),
        { role: 'assistant', content: 'yes' });
      const err = await rerun.record({ run, tool: 'model', args: { messages, turn: 2 }, call: async () => { throw timeout; } })
        .then(() => assert.fail('expected the error'), (e) => e);
      assert.equal(err, timeout);
      const stopped = await rerun.record({ run, tool: 'model', args: { messages, turn: 2 }, call: model('SHOULD-NOT-BE-CALLED') })
        .then(() => assert.fail('expected RunStopped'), (e) => e);
      assert.ok(stopped instanceof RunStopped, `got ${stopped}`);
      assert.match(stopped.message, /no person is needed/);
      assert.doesNotMatch(stopped.message, /resolved/);
    });
    const turns = await rerun.attempt(run, async () => [
      await rerun.record({ run, tool: 'model', args: { messages }, call: model('SHOULD-NOT-BE-CALLED') }),
      await rerun.record({ run, tool: 'model', args: { messages, turn: 2 }, call: model('again') }),
    ]);
    assert.deepEqual(turns.map((t) => t.content), ['yes', 'again'],
      'the lost call is made again; the answered one is replayed');
    const { rows } = await admin.query(
      "SELECT status, attempt, safe_to_redo FROM durable_ledger.effects WHERE run = $1 AND args ? 'turn'", [run]);
    assert.deepEqual(rows, [{ status: 'completed', attempt: 3, safe_to_redo: true }],
      'made again as attempts 2 (threw) and 3, no pause');
    const { rows: [{ n }] } = await admin.query(
      'SELECT count(*)::int AS n FROM durable_ledger.unresolved WHERE run = $1', [run]);
    assert.equal(n, 0, 'nothing waits for a person');
    // a third attempt calls nothing
    await rerun.attempt(run, async () => {
      const turn = await rerun.record({ run, tool: 'model', args: { messages, turn: 2 }, call: model('SHOULD-NOT-BE-CALLED') });
      assert.equal(turn.content, 'again');
    });
    // a tool registered as side-effecting is never recorded as safe to redo
    const tool = unique('charge');
    await admin.query("SELECT durable_ledger.register_tool($1, 'js tests')", [tool]);
    const charge = counter('SHOULD-NOT-HAPPEN');
    await assert.rejects(rerun.attempt(run, () => rerun.record({ run, tool, args: {}, call: charge })), ToolRefusedError);
    assert.equal(charge.keys.length, 0);
  });
  assert.deepEqual(calls, ['yes', 'again']);
  await client.end().catch(() => {});
});

test('after resolve_effect a paused effect is replayed by the next attempt', async () => {
  const run = unique('resolve');
  const args = { invoice: 'INV-5' };
  let key;
  await withClient(async (_c, ledger) => {
    await ledger.acquireRun(run); // ends with the connection, unreleased: a crashed worker
    await ledger.guarded({
      run, tool: 'bank.pay', args, perform: (k) => { key = k; throw new Error('timeout'); },
    }).catch(() => {});
  });

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
    await ledgerA.acquireRun(runA);
    const a = ledgerA.guarded({
      run: runA, tool: 'shop.ship', args, businessKey,
      perform: async (key) => { began(key); await held; return { shipment: 's1' }; },
    });
    const keyA = await performing;
    assert.equal(keyA, `${businessKey}#1`, "a business key's provider key is the key and its attempt");

    await withClient(async (_cb, ledgerB) => {
      await ledgerB.acquireRun(runB);
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
    await ledger.acquireRun(run);
    await client.query('BEGIN');
    await assert.rejects(
      ledger.guarded({ run, tool: 'bank.pay', args: { n: 1 }, perform }),
      (e) => e instanceof LedgerError && /transaction/.test(e.message));
    await client.query('ROLLBACK');
    assert.equal(perform.keys.length, 0);
    const { rows } = await admin.query('SELECT count(*)::int AS n FROM durable_ledger.effects WHERE run = $1', [run]);
    assert.equal(rows[0].n, 0, 'nothing written');
  });
});

test('the transaction check also works for a client without getTransactionStatus()', async () => {
  const run = unique('tx-sql');
  await withClient(async (client) => {
    // a Queryable that only has query(): the check falls back to SQL
    const ledger = new Ledger({ query: (...a) => client.query(...a) });
    const perform = counter({ ok: true });
    await ledger.acquireRun(run);
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

  const { rows } = await admin.query(
    'SELECT tool, status FROM durable_ledger.effects WHERE run = $1 ORDER BY tool', [run]);
  assert.deepEqual(rows, [
    { tool: 'email.send', status: 'completed' },
    { tool: 'payments.charge', status: 'completed' },
  ], 'only the two side-effecting tools are in the ledger');
});

// ---------------------------------------------------- reports name their attempt

/** (event, attempt) of every audit row of key, in order. */
async function auditAttempts(key) {
  const { rows } = await admin.query(
    'SELECT event::text, attempt FROM durable_ledger.audit_log WHERE key = $1 ORDER BY id', [key]);
  return rows.map((r) => [r.event, r.attempt]);
}

/** Attempt 1 of business key `businessKey`: the bank declines, the client records it. */
async function declinedFirstAttempt(businessKey, args) {
  await withClient(async (_c, ledger) => {
    const run = unique('first');
    await ledger.acquireRun(run);
    await assert.rejects(ledger.guarded({
      run, tool: 'bank.pay', args, businessKey,
      perform: () => { throw new EffectDidNotHappen({ code: 'declined' }); },
    }), EffectFailed);
    const row = await ledger.effectStatus(businessKey);
    assert.deepEqual([row.attempt, row.status], [1, 'failed']);
  });
}

/** Resolves with the key once perform() is at the bank; rejects if the call ends first. */
function atTheBank(perform, call) {
  return Promise.race([perform.entered, call.then(
    (r) => assert.fail(`the call returned ${JSON.stringify(r)} before reaching the bank`),
    (e) => { throw e; })]);
}

/** A perform() that waits at the bank until go() is called, then returns or throws. */
function parked(outcome) {
  let entered;
  let go;
  const perform = async (key) => {
    perform.keys.push(key);
    entered(key);
    await perform.released;
    if (outcome instanceof Error) throw outcome;
    return outcome;
  };
  perform.keys = [];
  perform.entered = new Promise((resolve) => { entered = resolve; });
  perform.released = new Promise((resolve) => { go = resolve; });
  perform.go = go;
  return perform;
}

test('a retried business key: the report names attempt 2, so it lands there without the lease', async () => {
  // Attempt 1 was declined; attempt 2 is executed by another worker whose connection
  // loses the lease that began attempt 2 while the bank pays (a pooler resets it):
  // only the attempt number the report carries ties it to attempt 2.
  const businessKey = unique('INV');
  const args = { invoice: businessKey, amount: 70 };
  await declinedFirstAttempt(businessKey, args);
  await withClient(async (client, ledger) => {
    const run = unique('second');
    await ledger.acquireRun(run);
    const result = await ledger.guarded({
      run, tool: 'bank.pay', args, businessKey,
      perform: async () => {
        await dropLeases(client); // pg_advisory_unlock_all(): the lease is gone
        return { payment_id: 'pay_2' };
      },
    });
    assert.deepEqual(result, { payment_id: 'pay_2' });
    const row = await ledger.effectStatus(businessKey);
    assert.deepEqual([row.attempt, row.status, row.conflict, row.result],
      [2, 'completed', false, { payment_id: 'pay_2' }]);
    assert.deepEqual(await auditAttempts(businessKey),
      [['intent', 1], ['failed', 1], ['intent', 2], ['late_completion', 2]]);
  });

  // the same report without its attempt would not be applied: a flagged conflict
  const other = unique('INV');
  const otherArgs = { invoice: other, amount: 70 };
  await declinedFirstAttempt(other, otherArgs);
  await withClient(async (client, ledger) => {
    const raw = unique('raw');
    await client.query('SELECT durable_ledger.acquire_run($1)', [raw]); // (through a proxy: no implicit lease)
    const d = await ledger.beginEffect(raw, 'bank.pay', otherArgs, { businessKey: other });
    assert.deepEqual([d.decision, d.attempt], ['execute', 2]);
    await dropLeases(client);
    await client.query('SELECT durable_ledger.complete_effect($1, $2::jsonb)', [other, '{"payment_id": "x"}']);
    const row = await ledger.effectStatus(other);
    assert.deepEqual([row.attempt, row.conflict, row.result], [2, true, null]);
    assert.notEqual(row.status, 'completed');
  });
});

/**
 * Two attempts of one business key through one Ledger, run and lease.  Attempt 1
 * waits at the bank while the bank's webhook records it as declined (another
 * connection); the agent then retries, which executes attempt 2 under the same
 * lease, and it waits at the bank too; only then does attempt 1's own report
 * (firstOutcome: a refusal or a payment) arrive, on the connection that holds
 * the lease that began attempt 2.  Calls check(...) with what it needs.
 */
async function interleave(name, firstOutcome, check) {
  const businessKey = unique(name);
  const args = { invoice: businessKey, amount: 71 };
  const run = unique(name);
  await withClient(async (webhook) => withClient(async (client, ledger) => {
    const first = parked(firstOutcome);
    const second = parked({ payment_id: 'pay_2' });
    await ledger.acquireRun(run);
    const one = ledger.guarded({ run, tool: 'bank.pay', args, businessKey, perform: first });
    one.catch(() => {}); // awaited below
    try {
      assert.equal(await atTheBank(first, one), `${businessKey}#1`);
      await webhook.query('SELECT durable_ledger.fail_effect($1, $2::jsonb, 1)',
        [businessKey, '{"code": "declined"}']);
      const two = ledger.guarded({ run, tool: 'bank.pay', args, businessKey, perform: second });
      two.catch(() => {});
      try {
        // attempt 2 reaches the provider with a key of its own: a provider that keeps its
        // answer to a key would answer it with attempt 1's decline
        assert.equal(await atTheBank(second, two), `${businessKey}#2`);
        first.go();
        const firstError = await one.then(() => assert.fail('attempt 1 was accepted'), (e) => e);
        const afterFirst = await ledger.effectStatus(businessKey);
        await check({ ledger, businessKey, firstError, afterFirst, second, two });
      } finally {
        second.go();
        await two.catch(() => {});
      }
    } finally {
      first.go();
      await one.catch(() => {});
    }
  }));
}

test('a late refusal of attempt 1 never decides attempt 2 (same lease, attempt 2 in flight)', async () => {
  // Without its attempt, attempt 1's refusal would be applied to attempt 2 here (this
  // session holds the lease that began attempt 2): attempt 2, whose payment is in
  // flight, would be "failed", and a third attempt could pay again.
  await interleave('late-refusal', new EffectDidNotHappen({ code: 'declined' }),
    async ({ ledger, businessKey, firstError, afterFirst, second, two }) => {
      assert.ok(firstError instanceof EffectFailed, `got ${firstError}`); // on record: accepted
      assert.equal(firstError.replayed, false);
      assert.deepEqual(firstError.error, { code: 'declined' });
      assert.deepEqual([afterFirst.attempt, afterFirst.status, afterFirst.conflict, afterFirst.error],
        [2, 'started', false, null]);
      second.go();
      assert.deepEqual(await two, { payment_id: 'pay_2' });
      const row = await ledger.effectStatus(businessKey);
      assert.deepEqual([row.attempt, row.status, row.conflict, row.result],
        [2, 'completed', false, { payment_id: 'pay_2' }]);
      assert.deepEqual(await auditAttempts(businessKey),
        [['intent', 1], ['failed', 1], ['intent', 2], ['completed', 2]]);
      const { rows } = await admin.query(
        'SELECT attempt, status::text, error FROM durable_ledger.past_attempts WHERE key = $1', [businessKey]);
      assert.deepEqual(rows, [{ attempt: 1, status: 'failed', error: { code: 'declined' } }]);
    });
});

test('a late completion of a replaced attempt is kept as a conflict, never applied to attempt 2', async () => {
  // The bank did pay attempt 1, though the webhook said it declined: the client's
  // completion of attempt 1 arrives while attempt 2 is in flight.  Without its attempt
  // it would complete attempt 2 with attempt 1's payment; with it, it is evidence of a
  // double payment, kept as a conflict for a person.
  await interleave('late-completion', { payment_id: 'pay_1' },
    async ({ ledger, businessKey, firstError, afterFirst, second, two }) => {
      assert.ok(firstError instanceof LedgerError && !(firstError instanceof EffectFailed), `got ${firstError}`);
      assert.match(firstError.message, /did not accept the report \(complete_effect\)/);
      assert.deepEqual([afterFirst.attempt, afterFirst.status, afterFirst.conflict, afterFirst.result],
        [2, 'started', true, null]);
      const { rows } = await admin.query(
        "SELECT attempt, detail->'result' AS result FROM durable_ledger.audit_log WHERE key = $1 AND event = 'conflict'",
        [businessKey]);
      assert.deepEqual(rows, [{ attempt: 1, result: { payment_id: 'pay_1' } }]);
      second.go();
      await assert.rejects(two, LedgerError); // the key stays flagged for a person
      const row = await ledger.effectStatus(businessKey);
      assert.equal(row.attempt, 2);
      assert.notDeepEqual(row.result, { payment_id: 'pay_1' });
      assert.equal(row.conflict, true);
      const { rows: [u] } = await admin.query(
        'SELECT count(*)::int AS n FROM durable_ledger.unresolved WHERE key = $1', [businessKey]);
      assert.equal(u.n, 1);
    });
});

test('a lease wait ends by itself with RunBusy naming the holder; SQLSTATEs come as named errors', async () => {
  const run = unique('wait');
  const holder = new pg.Client({ connectionString: dsn, application_name: 'worker-7' });
  await holder.connect();
  try {
    const held = new Ledger(holder);
    assert.equal(await held.acquireRun(run), true);
    const pid = await ledgerBackend(holder, run); // the lease's holder: through a proxy, its shard's backend
    await withClient(async (client, ledger) => {
      await client.query("SET durable_ledger.lease_wait_timeout = '300ms'");
      const started = Date.now();
      const err = await ledger.acquireRun(run).then(() => assert.fail('acquired a held run'), (e) => e);
      assert.ok(Date.now() - started >= 250, 'the wait lasted the timeout');
      assert.ok(err instanceof RunBusy, `got ${err}`);
      assert.equal(err.sqlstate, '55P03');
      assert.equal(err.cause?.code, '55P03');
      assert.match(err.message, new RegExp(`run "${run}"`));
      assert.match(err.message, new RegExp(`Backend ${pid} held it: application "worker-7"`));

      // named errors for the ledger's other SQLSTATEs; the caller's own errors untouched
      const other = unique('named');
      const invoice = unique('INV');
      const invalidArgument = async () => {
        const invalid = await ledger.guarded({ run: other, tool: '', args: {},
          perform: async () => assert.fail('performed') }).then(() => null, (e) => e);
        assert.ok(invalid instanceof InvalidArgument, `got ${invalid}`);
      };
      await ledger.attempt(other, async () => {
        await ledger.guarded({ run: other, tool: 'bank.pay', args: { amount: 1 }, businessKey: invoice,
          perform: async () => ({ ok: 1 }) });
        const conflict = await ledger.guarded({ run: other, tool: 'bank.pay', args: { amount: 2 },
          businessKey: invoice, perform: async () => assert.fail('performed') }).then(() => null, (e) => e);
        assert.ok(conflict instanceof BusinessKeyConflict && conflict instanceof LedgerRefused, `got ${conflict}`);
        assert.equal(conflict.sqlstate, '23505');
        // the hint says what is true: reworded free text wants key fields; a new key pays again
        assert.match(conflict.hint, /key_fields/);
        assert.match(conflict.hint, /new business key\s+would perform the operation again/);
        assert.ok(conflict.message.includes(conflict.hint), 'the hint is in the message');
        if (ERROR_ENDS_SESSION_LEASE) {
          // through a proxy the shard's error ended the session lease (target.js): the
          // attempt stops at its next call, which performs nothing; a new attempt goes on
          await assert.rejects(ledger.guarded({ run: other, tool: 'mail.send', args: {},
            perform: async () => assert.fail('performed') }), LeaseLostError);
          return;
        }
        await invalidArgument();
      });
      if (ERROR_ENDS_SESSION_LEASE) await ledger.attempt(other, invalidArgument);
    });
    await held.releaseRun(run);
  } finally {
    await holder.end();
  }
});

test('a branch left over from an ended attempt never acts in the next; a second attempt is refused', async () => {
  // helper-25's findings: a Promise.race whose losing branch calls the bank after its
  // attempt timed out used to count as occurrence 2 of the retry (a second payment);
  // a job delivered twice to one process shared one lease epoch.
  const run = unique('leftover');
  const args = { invoice: 'INV-9', amount: 42 };
  await withClient(async (_c, ledger) => {
    const pay = counter({ payment_id: 'pay_1' });
    let go;
    const later = new Promise((resolve) => { go = resolve; });
    let leftover;
    await assert.rejects(ledger.attempt(run, () => {
      leftover = (async () => { await later; return ledger.guarded({ run, tool: 'bank.pay', args, perform: pay }); })();
      leftover.catch(() => {});
      return Promise.race([leftover, new Promise((_, reject) => setTimeout(() => reject(new Error('timeout')), 100))]);
    }), /timeout/);
    const result = await ledger.attempt(run, async () => {
      const paid = await ledger.guarded({ run, tool: 'bank.pay', args, perform: pay });
      go();
      await assert.rejects(leftover, LeaseLostError);
      // and a second attempt at the run while this one is open
      await assert.rejects(ledger.attempt(run, () => assert.fail('two attempts at one run')), /already open/);
      await assert.rejects(ledger.acquireRun(run), /already open/);
      await assert.rejects(ledger.releaseRun(run), /inside its ledger.attempt/); // nor released under its feet
      return paid;
    });
    assert.deepEqual(result, { payment_id: 'pay_1' });
    assert.equal(pay.keys.length, 1, 'paid more than once');
  });
});

test('two acquireRuns at once on one Ledger: one is refused; a clean refusal does not stop an attempt', async () => {
  // helper-26: both acquireRuns passed the check before either's reply and shared one
  // lease epoch; a named refusal of begin_effect (23505) stopped a token attempt as if
  // its outcome were unknown.
  const run = unique('acq-race');
  await withClient(async (_c, ledger) => {
    const pay = counter({ payment_id: 'pay_1' });
    const outcomes = await Promise.allSettled([ledger.acquireRun(run), ledger.acquireRun(run)]);
    assert.deepEqual(outcomes.map((o) => o.status).sort(), ['fulfilled', 'rejected']);
    assert.match(String(outcomes.find((o) => o.status === 'rejected').reason), /already open/);
    await ledger.guarded({ run, tool: 'bank.pay', args: { invoice: 1 }, perform: pay });
    assert.equal(pay.keys.length, 1);
    await ledger.releaseRun(run);
  });
  const invoice = unique('INV');
  await withClient(async (_c, ledger) => {
    const setup = unique('setup');
    await ledger.attempt(setup, () => ledger.guarded({ run: setup, tool: 'bank.pay', args: { amount: 1 },
      businessKey: invoice, perform: async () => ({ ok: 1 }) }));
    const other = unique('refused');
    await ledger.tokenAttempt(other, { ttl: 30 }, async () => {
      await assert.rejects(ledger.guarded({ run: other, tool: 'bank.pay', args: { amount: 2 }, businessKey: invoice,
        perform: async () => assert.fail('performed') }), BusinessKeyConflict);
      assert.deepEqual(await ledger.guarded({ run: other, tool: 'mail.send', args: { to: 'ap' },
        perform: async () => ({ sent: 1 }) }), { sent: 1 });
    });
  });
});

test("ledger.local(): directly its write commits with its outcome; through a proxy it is refused before the write (0A000)", async () => {
  // local.test.js tests local effects on a ledger.  Through a proxy of a sharded ledger
  // (target.js) one cannot be begun: its write could not commit in one transaction with
  // its intent and outcome (docs/scale-out.md: begin it on the run's shard).
  const run = unique('local');
  const writes = [];
  const write = async (client, key) => {
    writes.push(key);
    const { rows: [r] } = await client.query('SELECT txid_current()::text AS tx');
    return { tx: r.tx };
  };
  const outcome = await withClient((_c, ledger) => ledger.tokenAttempt(run, { ttl: 30 }, () =>
    ledger.local({ run, tool: 'db.write', args: { n: 1 }, write }))).then((r) => r, (e) => e);
  const { rows } = await admin.query(
    'SELECT status::text AS status, local FROM durable_ledger.effects WHERE run = $1', [run]);
  if (THROUGH_PROXY) {
    assert.ok(outcome instanceof Error, `got ${JSON.stringify(outcome)}`);
    assert.equal(outcome.sqlstate ?? outcome.code, '0A000', `got ${outcome}`);
    assert.match(outcome.message, /a local effect cannot be begun through the proxy/);
    assert.match(outcome.hint, /on the run's shard/);
    assert.deepEqual(writes, [], 'the write was not made');
    assert.deepEqual(rows, [], 'nothing was recorded on the shard');
  } else {
    assert.ok(!(outcome instanceof Error), `got ${outcome?.stack ?? outcome}`);
    assert.equal(writes.length, 1);
    assert.deepEqual(rows, [{ status: 'completed', local: true }]);
  }
});
