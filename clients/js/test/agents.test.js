// durable-ledger/agents, the core of the agent-framework adapters (adapters/),
// against a real server: DURABLE_LEDGER_DSN (a superuser connection to a
// database with durable_ledger; DURABLE_LEDGER_ADMIN_DSN, when set, is where
// the ledger's tables are read, as test/target.js says).  A "framework" here is
// a function that catches its tools' errors and goes on, as the real ones do.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import {
  DivergencePaused, Ledger, EffectDidNotHappen, EffectFailed, EffectPaused, LedgerError, RunAbandoned, RunStopped,
} from '../src/index.js';
import {
  agentAttempt, callKey, currentAttempt, currentStop, guardedTool, isStableCallId, noteStableCallIds, recordedCall,
  stopOf, toolError, ToolCallStopped,
} from '../src/agents.js';

const dsn = process.env.DURABLE_LEDGER_DSN;
if (!dsn) throw new Error('set DURABLE_LEDGER_DSN to a superuser connection string of a database with durable_ledger');
const adminDsn = process.env.DURABLE_LEDGER_ADMIN_DSN || dsn;

let pool;
let ledger;
let admin;
before(async () => {
  pool = new pg.Pool({ connectionString: dsn, max: 4 });
  ledger = new Ledger(pool, { consoleWarn: false });
  admin = new pg.Client({ connectionString: adminDsn });
  await admin.connect();
});
after(async () => {
  await admin.end();
  await pool.end();
});

const unique = (name) => `agents-${name}-${randomUUID()}`;
const status = async (key) =>
  (await admin.query('SELECT status::text FROM durable_ledger.effects WHERE key = $1', [key])).rows[0]?.status;

/** A framework's tool step: the tool's error becomes a message, and the loop goes on. */
async function swallowing(fn) {
  try {
    return { output: await fn() };
  } catch (err) {
    return { error: toolError(err) };
  }
}

test('a tool call executes once in its attempt and replays in the next; the run and ledger come from agentAttempt', async () => {
  const run = unique('replay');
  let calls = 0;
  const pay = () => guardedTool({ tool: 'pay', args: { invoice: 'INV-1' }, perform: (key) => ({ n: ++calls, key }) });
  const first = await agentAttempt(ledger, run, async () => {
    assert.deepEqual(currentAttempt(), { ledger, run });
    return pay();
  });
  assert.equal(first.n, 1);
  assert.match(first.key, /^[0-9a-f]{64}$/);
  const again = await agentAttempt(ledger, run, pay);
  assert.deepEqual(again, first, 'the recorded result, not a new call');
  assert.equal(calls, 1);
  assert.equal(currentAttempt(), null, 'outside any attempt');
});

test('a pause the framework swallowed is thrown by agentAttempt at its end; the model got a ToolCallStopped', async () => {
  const run = unique('pause');
  let key;
  await agentAttempt(ledger, run, () => swallowing(() => guardedTool({
    tool: 'pay', args: {}, perform: (k) => { key = k; throw new Error('socket hang up'); },
  }))).catch(() => {});
  assert.equal(await status(key), 'started');
  let seen;
  const err = await agentAttempt(ledger, run, async () => {
    seen = await swallowing(() => guardedTool({ tool: 'pay', args: {}, perform: () => assert.fail('performed') }));
    assert.equal(currentStop()?.kind, 'paused', 'currentStop() says so while the attempt goes on');
    return 'the framework finished';
  }).then(() => null, (e) => e);
  assert.ok(err instanceof EffectPaused, `EffectPaused: ${err}`);
  assert.equal(err.key, key);
  assert.ok(seen.error instanceof ToolCallStopped);
  assert.equal(seen.error.stop.kind, 'paused');
  assert.match(seen.error.message, /^This call was not performed: the ledger paused it because an earlier attempt began it/);
  assert.match(seen.error.stop.forPerson, new RegExp(`resolves effect ${key}`));
});

test('an unknown outcome: RunStopped at the end, the tool\'s error its cause; later calls of the attempt stop too', async () => {
  const run = unique('unknown');
  const outcomes = [];
  const err = await agentAttempt(ledger, run, async () => {
    outcomes.push(await swallowing(() => guardedTool({ tool: 'pay', args: {}, perform: () => { throw new Error('timeout'); } })));
    outcomes.push(await swallowing(() => guardedTool({ tool: 'mail', args: {}, perform: () => assert.fail('performed') })));
  }).then(() => null, (e) => e);
  assert.ok(err instanceof RunStopped, `${err}`);
  assert.equal(err.cause.message, 'timeout');
  assert.match(err.message, /^the outcome of pay \(effect [0-9a-f]{64}\) is unknown: the tool threw \(timeout\)/);
  assert.equal(outcomes[0].error.stop.kind, 'unknown');
  assert.equal(outcomes[0].error.cause.message, 'timeout');
  assert.equal(outcomes[1].error.stop.kind, 'stopped', 'the next call was refused by the stopped attempt');
});

test('an outcome that could not be recorded (a result JSON cannot hold) stops the attempt: RunStopped, the effect left started', async () => {
  const run = unique('unrecorded');
  let key;
  const err = await agentAttempt(ledger, run, () => swallowing(() => guardedTool({
    tool: 'pay', args: {}, perform: (k) => { key = k; return { amount: 10n }; },
  }))).then(() => null, (e) => e);
  assert.ok(err instanceof RunStopped, `${err}`);
  assert.ok(err.cause instanceof LedgerError);
  assert.match(err.message, /happened but its result could not be recorded/);
  assert.equal(await status(key), 'started', 'nothing guessed: the next attempt pauses it');
});

test('a recorded call that threw: agentAttempt throws its error; no person needed, the next attempt makes it again', async () => {
  const run = unique('recorded');
  let calls = 0;
  const turn = () => recordedCall({ tool: 'model', args: { prompt: 'hi' }, call: () => {
    calls += 1;
    if (calls === 1) throw new Error('provider 503');
    return { text: 'hello' };
  } });
  const err = await agentAttempt(ledger, run, () => swallowing(turn)).then(() => null, (e) => e);
  assert.equal(err?.message, 'provider 503');
  const { output } = await agentAttempt(ledger, run, () => swallowing(turn));
  assert.deepEqual(output, { text: 'hello' });
  assert.equal(calls, 2);
});

test('a refusal the tool reports and a bad argument stop nothing: the framework goes on, agentAttempt returns', async () => {
  const run = unique('no-stop');
  const result = await agentAttempt(ledger, run, async () => {
    const refused = await swallowing(() => guardedTool({
      tool: 'pay', args: {}, perform: () => { throw new EffectDidNotHappen({ declined: true }); },
    }));
    assert.ok(refused.error instanceof EffectFailed, 'the refusal itself, for the model');
    assert.equal(stopOf(refused.error), null);
    const bad = await swallowing(() => guardedTool({ tool: '', args: {}, perform: () => assert.fail('performed') }));
    assert.ok(bad.error instanceof LedgerError && !(bad.error instanceof ToolCallStopped), `${bad.error}`);
    const ok = await swallowing(() => guardedTool({ tool: 'mail', args: {}, perform: () => 'sent' }));
    return ok.output;
  });
  assert.equal(result, 'sent');
});

test('an abandoned run: RunAbandoned from agentAttempt, nothing performed; a session lease works the same', async () => {
  const run = unique('abandoned');
  await agentAttempt(ledger, run, () => guardedTool({ tool: 'pay', args: {}, perform: () => 1 }));
  await admin.query("SELECT durable_ledger.abandon_run($1, 'on-call', 'cancelled')", [run]);
  await assert.rejects(agentAttempt(ledger, run, () => assert.fail('ran')), RunAbandoned);
  const client = new pg.Client({ connectionString: dsn });
  await client.connect();
  try {
    const session = new Ledger(client, { consoleWarn: false });
    await assert.rejects(agentAttempt(session, run, { lease: 'session' }, () => assert.fail('ran')), RunAbandoned);
    const other = unique('session');
    assert.equal(await agentAttempt(session, other, { lease: 'session' },
      () => guardedTool({ tool: 'pay', args: {}, perform: () => 'paid' })), 'paid');
  } finally {
    await client.end();
  }
});

test('calls bind to the innermost attempt of their run; none open: refused, nothing performed', async () => {
  const outer = unique('outer');
  const inner = unique('inner');
  const runs = await agentAttempt(ledger, outer, async () => {
    const a = await guardedTool({ tool: 'which', args: {}, perform: () => currentAttempt().run });
    const b = await agentAttempt(ledger, inner, () => guardedTool({ tool: 'which', args: {}, perform: () => currentAttempt().run }));
    const c = await guardedTool({ run: outer, tool: 'which', args: { n: 2 }, perform: () => 'named' });
    return [a, b, c];
  });
  assert.deepEqual(runs, [outer, inner, 'named']);
  await assert.rejects(guardedTool({ tool: 'x', args: {}, perform: () => assert.fail('performed') }),
    /no agentAttempt is open here/);
  await assert.rejects(agentAttempt(ledger, outer, { lease: 'lock' }, () => 1), /lease must be 'token' or 'session'/);
});

test('callId: a call keyed by its framework id reaches its own effect in a resume that does not re-make the earlier calls (no occurrence shift), and a retry of it in one attempt never performs twice', async () => {
  const run = unique('callid');
  const bank = [];
  const pay = (callId, invoice, outcome = 'ok') => guardedTool({
    tool: 'pay', args: { invoice }, callId,
    perform: (key) => {
      bank.push(callId);
      if (outcome === 'refused') throw new EffectDidNotHappen('declined');
      if (outcome === 'crash') throw new Error('the bank timed out');
      return { paid: invoice, callId, key };
    },
  });
  // attempt 1: call-1 pays INV-9; call-2 pays INV-9 again (a second, deliberate payment) and
  // its outcome is unknown
  let shown;
  await assert.rejects(agentAttempt(ledger, run, async () => {
    const first = await pay('call-1', 'INV-9');
    assert.equal(first.callId, 'call-1');
    shown = (await swallowing(() => pay('call-2', 'INV-9', 'crash'))).error;
    assert.ok(shown instanceof ToolCallStopped);
  }), (err) => {
    // the effect's key, which resolve_effect takes -- not the provider's (key#attempt)
    assert.ok(err instanceof RunStopped);
    assert.equal(err.key, callKey(run, 'pay', 'call-2'));
    return true;
  });
  assert.equal(shown.stop.key, callKey(run, 'pay', 'call-2'));
  assert.equal(shown.stop.downstreamKey, `${callKey(run, 'pay', 'call-2')}#1`);
  assert.ok(shown.stop.forPerson.includes(`${callKey(run, 'pay', 'call-2')}#1`), shown.stop.forPerson);
  // attempt 2, a checkpoint resume: only call-2 is made again -- it pauses, it does not get
  // call-1's payment as an occurrence-keyed call would
  await assert.rejects(agentAttempt(ledger, run, () => pay('call-2', 'INV-9')), EffectPaused);
  const key2 = callKey(run, 'pay', 'call-2');
  assert.equal(await status(key2), 'unknown');
  await admin.query(`SELECT durable_ledger.resolve_effect($1, 'completed', '{"paid": "INV-9", "callId": "call-2", "by": "bank"}', 'on-call')`, [key2]);
  // attempt 3: a new call (call-3) of the tool the earlier attempts used executes at once
  // (its id is new: no divergence to judge), call-2 replays what the person recorded, and a
  // framework's retry of call-3 (same id) replays it; a refused call-4 is made again by its retry
  await agentAttempt(ledger, run, async () => {
    assert.equal((await pay('call-2', 'INV-9')).by, 'bank');
    const third = await pay('call-3', 'INV-10');
    assert.deepEqual(await pay('call-3', 'INV-10'), third, 'a retry of the same call replays it');
    await assert.rejects(pay('call-4', 'INV-11', 'refused'), EffectFailed);
    assert.equal((await pay('call-4', 'INV-11')).paid, 'INV-11', 'a refused call, retried, is made again');
  });
  assert.deepEqual(bank, ['call-1', 'call-2', 'call-3', 'call-4', 'call-4']);
  const keys = (await admin.query(
    `SELECT key, status::text FROM durable_ledger.effects WHERE run = $1 ORDER BY key`, [run])).rows;
  assert.deepEqual(keys.map((r) => r.key), ['call-1', 'call-2', 'call-3', 'call-4'].map((id) => callKey(run, 'pay', id)).sort());
  assert.ok(keys.every((r) => r.status === 'completed'));
  // the key: readable, unambiguous, and short enough for any run
  assert.equal(callKey('r/1', 'pay', 'c'), 'call:["r/1","pay","c"]');
  assert.notEqual(callKey('r', '1/pay', 'c'), callKey('r/1', 'pay', 'c'));
  assert.match(callKey('r'.repeat(190), 'pay', 'c'), /^call:sha256:[0-9a-f]{64}$/, 'room for the provider\'s #attempt');
});

test('callId: a new id whose call equals an effect of an earlier attempt pauses as a divergence (the model named it anew after a lost answer); same replays that effect, distinct performs it', async () => {
  const run = unique('callid-anew');
  const bank = [];
  const pay = (callId, invoice) => guardedTool({
    tool: 'pay', args: { invoice }, callId,
    perform: () => { bank.push(callId); return { paid: invoice, callId }; },
  });
  // attempt 1 pays INV-7 under call-a; in the same attempt a second id is a second call
  await agentAttempt(ledger, run, async () => {
    await pay('call-a', 'INV-7');
    await pay('call-b', 'INV-8');
  });
  // attempt 2: the answer was lost, the model asked again names the payment call-z
  let paused;
  await assert.rejects(agentAttempt(ledger, run, async () => {
    paused = (await swallowing(() => pay('call-z', 'INV-7'))).error;
  }), DivergencePaused);
  assert.ok(paused instanceof ToolCallStopped && paused.cause instanceof DivergencePaused, String(paused));
  assert.match(paused.cause.message, /new call id/);
  assert.match(paused.stop.forModel, /named anew/);
  assert.equal(paused.stop.key, callKey(run, 'pay', 'call-z'));
  const [row] = (await admin.query(
    'SELECT candidate_key FROM durable_ledger.divergences WHERE key = $1', [callKey(run, 'pay', 'call-z')])).rows;
  assert.equal(row.candidate_key, callKey(run, 'pay', 'call-a'));
  await admin.query(`SELECT durable_ledger.resolve_divergence($1, 'same', 'on-call')`, [callKey(run, 'pay', 'call-z')]);
  // attempt 3: call-z replays call-a's payment; a new id with other args is made; another
  // repeat of INV-8 pauses, and a person's distinct makes it
  await assert.rejects(agentAttempt(ledger, run, async () => {
    assert.deepEqual(await pay('call-z', 'INV-7'), { paid: 'INV-7', callId: 'call-a' });
    await pay('call-y', 'INV-9');
    await pay('call-x', 'INV-8');
  }), (err) => err instanceof DivergencePaused && err.key === callKey(run, 'pay', 'call-x'));
  await admin.query(`SELECT durable_ledger.resolve_divergence($1, 'distinct', 'on-call')`, [callKey(run, 'pay', 'call-x')]);
  await agentAttempt(ledger, run, () => pay('call-x', 'INV-8'));
  assert.deepEqual(bank, ['call-a', 'call-b', 'call-y', 'call-x']);
});

test('callId on a recorded call: each call id is its own record, whatever the occurrence; stable ids are those a recorded turn noted', async () => {
  const run = unique('callid-read');
  let reads = 0;
  const read = (callId) => recordedCall({ tool: 'order_status', args: { order: 'O-1' }, callId, call: () => ({ n: ++reads }) });
  await agentAttempt(ledger, run, async () => {
    assert.equal((await read('r-1')).n, 1);
    assert.equal(isStableCallId('r-1'), false);
    noteStableCallIds(['r-1', 'r-2']);
    assert.equal(isStableCallId('r-2'), true);
  });
  assert.equal(isStableCallId('r-2'), false, 'outside the attempt');
  await agentAttempt(ledger, run, async () => {
    assert.equal((await read('r-2')).n, 2, 'a later read is made, not the first one replayed');
    assert.equal((await read('r-1')).n, 1, 'the first is replayed');
    assert.equal(isStableCallId('r-1'), false, 'a new attempt notes its own');
  });
});

test('callId with replayFailure: a refused call keyed by its id is replayed as refused when its id comes again, not made again', async () => {
  const run = unique('callid-refusal');
  let calls = 0;
  const pay = (replayFailure) => guardedTool({
    tool: 'pay', args: { invoice: 'INV-1' }, callId: 'call-r', replayFailure,
    perform: () => {
      calls += 1;
      if (calls === 1) throw new EffectDidNotHappen({ declined: 'card' });
      return { paid: true };
    },
  });
  await agentAttempt(ledger, run, async () => {
    const first = await pay(true).catch((err) => err);
    assert.ok(first instanceof EffectFailed && !first.replayed);
  });
  await agentAttempt(ledger, run, async () => {
    const again = await pay(true).catch((err) => err);
    assert.ok(again instanceof EffectFailed, String(again));
    assert.equal(again.replayed, true);
    assert.deepEqual(again.error, { declined: 'card' });
    assert.equal(again.key, callKey(run, 'pay', 'call-r'));
    assert.equal(calls, 1, 'not made again');
    // without it, the same id is the framework's retry of that very call: made again
    assert.deepEqual(await pay(false), { paid: true });
    assert.equal(calls, 2);
  });
});

test("callId with replayFailure 'earlier-attempts': a retry inside the attempt makes a refused call again, a later attempt replays the refusal", async () => {
  const run = unique('callid-earlier');
  let calls = 0;
  const pay = () => guardedTool({
    tool: 'pay', args: { invoice: 'INV-2' }, callId: 'call-e', replayFailure: 'earlier-attempts',
    perform: () => {
      calls += 1;
      if (calls !== 2) throw new EffectDidNotHappen({ declined: calls });
      return { paid: calls };
    },
  });
  await agentAttempt(ledger, run, async () => {
    assert.ok((await pay().catch((err) => err)) instanceof EffectFailed);
    assert.deepEqual(await pay(), { paid: 2 }, "the framework's retry in this attempt makes it again");
  });
  const run2 = unique('callid-earlier-2');
  calls = 2;
  await agentAttempt(ledger, run2, async () => {
    assert.ok((await pay().catch((err) => err)) instanceof EffectFailed);
  });
  await agentAttempt(ledger, run2, async () => {
    const again = await pay().catch((err) => err);
    assert.ok(again instanceof EffectFailed && again.replayed, String(again));
    assert.deepEqual(again.error, { declined: 3 });
  });
  assert.equal(calls, 3, 'a later attempt replays the refusal the model saw');
});
