// The scenario, the SDK's way: the invoice agent (test/invoice-agent.js: the
// SDK's ScriptedModel, wrapped by ledgerModel) pays an invoice and sends an e-mail, two
// tool calls in one turn, in a worker process (test/worker.js) that is SIGKILLed in the
// middle of the payment -- the bank got the request and never answered.  The app then
// does what it would: a new run() of the same run id, in a new process (the turns the
// ledger recorded replay, the model is not asked).  Each effect reaches the downstream
// system once; the payment's unknown outcome is paused and surfaced (the tool's output
// for the model, EffectPaused from agentAttempt); a person checks the bank and resolves
// it; the next run replays it and finishes; and a run of the completed run calls nothing.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { callKey } from 'durable-ledger/agents';
import { startEffectsServer } from '../../test-support/effects-server.js';
import { runNode, spawnWorker } from '../../test-support/worker.js';
import { DSN, effectsOf, runId, waitFor } from './target.js';

const workerScript = fileURLToPath(new URL('./worker.js', import.meta.url));
/** @type {Awaited<ReturnType<typeof startEffectsServer>>} */
let effects;
/** @type {pg.Client} */
let admin;

before(async () => {
  effects = await startEffectsServer();
  admin = new pg.Client({ connectionString: DSN });
  await admin.connect();
});
after(async () => {
  await admin.end();
  await effects.close();
});

/** Runs a worker on `run` to its end. @param {string} run */
const worker = (run) => runNode(workerScript, [run], { EFFECTS_URL: effects.url, DURABLE_LEDGER_DSN: DSN });

/** @param {string} stdout */
const modelCalls = (stdout) => Number(stdout.match(/^model calls: (\d+)$/m)?.[1]);

test('SIGKILL in the middle of a payment: each effect once, the unknown outcome paused, resolved by a person, replayed', async () => {
  const run = runId('crash');
  const pays = () => effects.calls('pay').filter((c) => c.body && /** @type {any} */ (c.body).invoice === 'INV-9');
  const before = { pay: effects.calls('pay').length, email: effects.calls('email').length };

  // 1. The first worker: the model asks for both calls in one turn; the bank keeps the
  // payment (it happened) and never answers; the e-mail is sent and recorded.
  const held = effects.hold('pay');
  const first = spawnWorker(workerScript, [run], { EFFECTS_URL: effects.url, DURABLE_LEDGER_DSN: DSN });
  const payment = await held;
  await waitFor(async () => (await effectsOf(admin, run)).find((e) => e.tool === 'send_email' && e.status === 'completed'),
    'the e-mail recorded as completed');
  first.kill();
  const killed = await first.exit;
  assert.equal(killed.signal, 'SIGKILL');
  assert.match(killed.stdout, /^paying INV-9 key=/m);
  assert.doesNotMatch(killed.stdout, /^paid /m, 'the payment never came back');
  assert.equal(effects.calls('pay').length, before.pay + 1);
  assert.equal(effects.calls('email').length, before.email + 1);
  let rows = await effectsOf(admin, run);
  assert.deepEqual(rows.map((e) => [e.tool, e.status]).sort(), [
    ['model.openai-agents', 'completed'], ['pay_invoice', 'started'], ['send_email', 'completed'],
  ]);
  const payRow = rows.find((e) => e.tool === 'pay_invoice');
  const payKey = payRow?.key;
  // keyed by its occurrence (keyBy's default), though the model's turn is recorded: a
  // rerun reaches it whatever id the model gives the call then (a changed request asks
  // the model anew); with keyBy 'recorded-call-id' it would be keyed by its id
  assert.doesNotMatch(String(payKey), /^call:/);
  assert.notEqual(payKey, callKey(run, 'pay_invoice', 'call_pay'));
  assert.equal(payment.key, payRow?.downstream, 'the bank got the ledger\'s key as its idempotency key');

  // The killed worker's token lease stays until its ttl: the on-call breaks it.
  const { rows: [broken] } = await admin.query("SELECT durable_ledger.break_lease($1, 'on-call', 'worker killed') AS b", [run]);
  assert.equal(broken.b, true);

  // 2. The app runs it again: the recorded turn replays (the model is not asked), the
  // payment is paused (its outcome is unknown), nothing is performed again.
  const second = await worker(run);
  assert.equal(second.code, 3, second.stdout + second.stderr);
  assert.match(second.stdout, new RegExp(`^stopped: EffectPaused key=${String(payKey).replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} `, 'm'), 'agentAttempt threw EffectPaused');
  assert.match(second.stdout, /^tool pay_invoice -> This call was not performed: the ledger paused it because an earlier attempt began it/m,
    'the tool\'s output says so (the model and the developer see it)');
  assert.match(second.stdout, /Do not call this tool again/);
  assert.equal(modelCalls(second.stdout), 0, 'the recorded turn replayed; the model was not asked');
  assert.doesNotMatch(second.stdout, /^(paying|emailing) /m, 'no tool was performed');
  assert.equal(effects.calls('pay').length, before.pay + 1);
  assert.equal(effects.calls('email').length, before.email + 1);
  rows = await effectsOf(admin, run);
  assert.equal(rows.find((e) => e.tool === 'pay_invoice')?.status, 'unknown');

  // 3. A person checks the bank under the idempotency key and resolves the payment
  // with what the bank reports.
  const found = effects.lookup(payment.key);
  assert.equal(found.length, 1, 'the bank has one payment under the key');
  await admin.query("SELECT durable_ledger.resolve_effect($1, 'completed', $2::jsonb, 'on-call', 'found at the bank')",
    [payKey, JSON.stringify(found[0])]);

  // 4. The next run replays the payment and the e-mail and finishes: the model is asked
  // once, for the turn after the tools.
  const third = await worker(run);
  assert.equal(third.code, 0, third.stdout + third.stderr);
  assert.doesNotMatch(third.stdout, /^(paying|emailing) /m);
  assert.match(third.stdout, new RegExp(`^final: done: pay_invoice=\\{"id":"${payment.id}"`, 'm'),
    'the model got the resolved result');
  assert.equal(modelCalls(third.stdout), 1);
  assert.equal(effects.calls('pay').length, before.pay + 1);
  assert.equal(effects.calls('email').length, before.email + 1);
  assert.equal(pays().filter((c) => c.key === payment.key).length, 1);

  // 5. A run of the completed run calls nothing, and ends the same.
  const fourth = await worker(run);
  assert.equal(fourth.code, 0, fourth.stdout + fourth.stderr);
  assert.equal(modelCalls(fourth.stdout), 0);
  assert.doesNotMatch(fourth.stdout, /^(paying|emailing) /m);
  assert.equal(fourth.stdout.match(/^final: .*$/m)?.[0], third.stdout.match(/^final: .*$/m)?.[0]);
  assert.equal(effects.calls('pay').length, before.pay + 1);
  assert.equal(effects.calls('email').length, before.email + 1);
  rows = await effectsOf(admin, run);
  assert.deepEqual(rows.map((e) => [e.tool, e.status]).sort(), [
    ['model.openai-agents', 'completed'], ['model.openai-agents', 'completed'],
    ['pay_invoice', 'completed'], ['send_email', 'completed'],
  ]);
});
