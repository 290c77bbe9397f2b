// The AI SDK adapter against a real ledger (DURABLE_LEDGER_DSN: see support.js).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { generateText, simulateReadableStream, streamText, stepCountIs } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { EffectPaused, RunAbandoned, RunStopped, EffectDidNotHappen } from 'durable-ledger';
import {
  agentAttempt, durableTools, recordedModel, ToolCallStopped, idempotencyKey,
} from '../src/index.js';
import { billingModel, billingTools, runBilling } from './billing-agent.js';
import { cluster } from './support.js';

const db = cluster({ effects: true });

const unique = (name) => `ai-sdk-${name}-${randomUUID()}`;
const count = (op, run) => db.effects.calls(op).filter((c) => run === undefined || c.body?.run === run).length;

async function effectRows(run) {
  const { rows } = await db.admin.query(
    'SELECT tool, status::text, result FROM durable_ledger.effects WHERE run = $1 ORDER BY tool', [run]);
  return rows;
}

test('a run pays and e-mails once, in one step; a rerun replays it all and calls neither the model nor a tool', async () => {
  const run = unique('replay');
  const before = { pay: count('pay'), email: count('email'), lookup: count('lookup') };
  const first = await runBilling(db.ledger, run, db.effects.url);
  assert.match(first.result.text, /^Paid INV-7 \(pay-\d+\) and told the customer\.$/);
  assert.equal(first.modelCalls, 3, 'three turns: the lookup, the two calls of one step, the answer');
  const step2 = first.result.steps[1];
  assert.deepEqual(step2.toolCalls.map((c) => c.toolName).sort(), ['payInvoice', 'sendEmail'],
    'the payment and the e-mail are one step');
  assert.deepEqual({ pay: count('pay') - before.pay, email: count('email') - before.email,
    lookup: count('lookup') - before.lookup }, { pay: 1, email: 1, lookup: 1 });
  const pay = db.effects.calls('pay').at(-1);
  assert.match(pay.key, /^[0-9a-f]{64}$/, 'the payment carried the ledger\'s key downstream');
  assert.deepEqual((await effectRows(run)).map((r) => [r.tool, r.status]), [
    ['lookupInvoice', 'completed'], ['model.test.billing-clerk', 'completed'],
    ['model.test.billing-clerk', 'completed'], ['model.test.billing-clerk', 'completed'],
    ['payInvoice', 'completed'], ['sendEmail', 'completed'],
  ]);

  const again = await runBilling(db.ledger, run, db.effects.url);
  assert.equal(again.modelCalls, 0, 'every turn replayed');
  assert.equal(again.result.text, first.result.text);
  assert.deepEqual(again.result.steps[1].toolResults.map((r) => r.output),
    first.result.steps[1].toolResults.map((r) => r.output), 'the recorded outputs reach the model');
  assert.deepEqual({ pay: count('pay') - before.pay, email: count('email') - before.email,
    lookup: count('lookup') - before.lookup }, { pay: 1, email: 1, lookup: 1 }, 'nothing made again');
});

test('a payment whose outcome is unknown: the model reads that it was not settled, the loop ends, the app gets a RunStopped; the next attempt pauses; resolved, it replays', async () => {
  const run = unique('unknown');
  const steps = [];
  const err = await runBilling(db.ledger, run, db.effects.url, {
    failPayment: () => new Error('connection reset by the bank'), steps,
  }).then(() => null, (e) => e);
  assert.equal(steps.length, 2, 'the loop ended at the step of the payment');
  const toolError = steps[1].content.find((p) => p.type === 'tool-error');
  assert.ok(toolError.error instanceof ToolCallStopped, 'the model is shown a ToolCallStopped');
  assert.match(toolError.error.message, /^The tool payInvoice failed while it was being performed: nobody knows yet whether it took effect\. Do not call this tool again/);
  assert.equal(toolError.error.stop.kind, 'unknown');
  assert.ok(err instanceof RunStopped, `agentAttempt throws RunStopped: ${err}`);
  assert.equal(err.cause?.message, 'connection reset by the bank', 'the tool\'s error is its cause');
  assert.match(err.message, /the outcome of payInvoice \(effect [0-9a-f]{64}\) is unknown/);
  const [pay] = (await effectRows(run)).filter((r) => r.tool === 'payInvoice');
  assert.equal(pay.status, 'started', 'nothing is guessed: the intent stays without an outcome');

  // the next attempt: the recorded turns replay, the payment pauses, the model is not asked again
  const model = billingModel();
  const paused = await runBilling(db.ledger, run, db.effects.url, { model }).then(() => null, (e) => e);
  assert.ok(paused instanceof EffectPaused, `then EffectPaused: ${paused}`);
  assert.equal(model.doGenerateCalls.length, 0, 'ledgerStopped ended the loop at the paused step');

  // a person finds no payment at the bank, and says so: it did not happen; the next attempt pays
  await db.admin.query(
    "SELECT durable_ledger.resolve_effect($1, 'failed', '{\"bank\": \"no such payment\"}', 'on-call', 'checked the bank')",
    [paused.key]);
  const payments = count('pay');
  const done = await runBilling(db.ledger, run, db.effects.url);
  assert.match(done.result.text, /^Could not pay INV-7: /, 'the failure the person recorded reaches the model');
  assert.equal(count('pay'), payments, 'a payment resolved as failed is replayed as such, not made again');
});

test('the other call of the paused step: sent at most once by each attempt, exactly once in all', async () => {
  const run = unique('step');
  const emails = count('email');
  // attempt 1: the payment's outcome is unknown; the e-mail, in parallel, may or may not
  // have begun before the stop
  await runBilling(db.ledger, run, db.effects.url, { failPayment: () => new Error('timeout') }).catch(() => {});
  assert.ok(count('email') - emails <= 1);
  // attempt 2: the payment pauses
  const err = await runBilling(db.ledger, run, db.effects.url).then(() => null, (e) => e);
  assert.ok(err instanceof EffectPaused, `${err}`);
  assert.ok(count('email') - emails <= 1);
  await db.admin.query(
    "SELECT durable_ledger.resolve_effect($1, 'failed', '{\"bank\": \"none\"}', 'on-call', 'no payment')", [err.key]);
  // attempt 3 finishes the run: the e-mail replayed or sent now, never twice
  const { result } = await runBilling(db.ledger, run, db.effects.url);
  assert.match(result.text, /^Could not pay INV-7/);
  assert.equal(count('email') - emails, 1, 'the e-mail happened exactly once over the three attempts');
  const again = await runBilling(db.ledger, run, db.effects.url);
  assert.equal(again.modelCalls, 0);
  assert.equal(count('email') - emails, 1);
});

test('a refusal the tool reports (EffectDidNotHappen) is the model\'s to handle: recorded, no stop', async () => {
  const run = unique('refused');
  const { result } = await runBilling(db.ledger, run, db.effects.url, {
    failPayment: () => new EffectDidNotHappen({ declined: 'insufficient funds' }),
  });
  assert.match(result.text, /^Could not pay INV-7: /, 'the loop went on: the model answered');
  const errorPart = result.steps[1].content.find((p) => p.type === 'tool-error');
  assert.equal(errorPart.toolName, 'payInvoice');
  assert.ok(!(errorPart.error instanceof ToolCallStopped), 'not a stop');
  const [pay] = (await effectRows(run)).filter((r) => r.tool === 'payInvoice');
  assert.equal(pay.status, 'failed');
});

test('an abandoned run: agentAttempt throws RunAbandoned, nothing is called', async () => {
  const run = unique('abandoned');
  await agentAttempt(db.ledger, run, () => null); // the run is in the ledger
  await db.admin.query("SELECT durable_ledger.abandon_run($1, 'on-call', 'customer cancelled')", [run]);
  const model = billingModel();
  const lookups = count('lookup');
  const err = await runBilling(db.ledger, run, db.effects.url, { model }).then(() => null, (e) => e);
  assert.ok(err instanceof RunAbandoned, `RunAbandoned: ${err}`);
  assert.equal(model.doGenerateCalls.length, 0);
  assert.equal(count('lookup'), lookups);
});

test('a retired tool: the model reads the refusal, the app gets ToolRefused, the payment is not made', async () => {
  const run = unique('retired');
  const tool = `payInvoice`;
  const names = { payInvoice: `retired-pay-${randomUUID()}` };
  await db.admin.query("SELECT durable_ledger.register_tool($1, 'ops')", [names.payInvoice]);
  await db.admin.query("SELECT durable_ledger.retire_tool($1, 'ops', 'replaced')", [names.payInvoice]);
  const payments = count('pay');
  const model = billingModel();
  const err = await agentAttempt(db.ledger, run, () => generateText({
    model: recordedModel(model),
    tools: durableTools(billingTools(db.effects.url), { readOnly: ['lookupInvoice'], names }),
    prompt: 'Pay invoice INV-7 and e-mail the customer.',
    stopWhen: stepCountIs(5),
  })).then(() => null, (e) => e);
  assert.equal(err?.name, 'ToolRefused', `${err}`);
  assert.equal(count('pay'), payments, `${tool} was not performed`);
});

test('streamText: the turns are recorded as streams and replayed as streams', async () => {
  const run = unique('stream');
  const chunks = [
    { type: 'stream-start', warnings: [] },
    { type: 'response-metadata', id: 'r-1', modelId: 'streamer', timestamp: new Date(0) },
    { type: 'text-start', id: 't' },
    { type: 'text-delta', id: 't', delta: 'All ' },
    { type: 'text-delta', id: 't', delta: 'done.' },
    { type: 'text-end', id: 't' },
    { type: 'finish', finishReason: { unified: 'stop', raw: 'stop' },
      usage: { inputTokens: { total: 3 }, outputTokens: { total: 2 } } },
  ];
  const streaming = () => new MockLanguageModelV4({
    provider: 'test', modelId: 'streamer',
    doStream: async () => ({ stream: simulateReadableStream({ chunks }) }),
  });
  const once = async (model) => agentAttempt(db.ledger, run, async () => {
    const result = streamText({ model: recordedModel(model), prompt: 'Say you are done.' });
    let text = '';
    for await (const delta of result.textStream) text += delta;
    return { text, response: await result.response };
  });
  const first = streaming();
  const a = await once(first);
  assert.equal(a.text, 'All done.');
  assert.equal(first.doStreamCalls.length, 1);
  const second = streaming();
  const b = await once(second);
  assert.equal(second.doStreamCalls.length, 0, 'the recorded stream is replayed');
  assert.equal(b.text, 'All done.');
  assert.ok(b.response.timestamp instanceof Date, 'a replayed timestamp is a Date again');
  assert.equal(b.response.timestamp.getTime(), 0);
});

test('durableTools refuses a readOnly name that is no tool; a tool without execute is kept; the key needs durableTools', async () => {
  assert.throws(() => durableTools(billingTools(db.effects.url), { readOnly: ['lookup'] }), /readOnly names no tool "lookup"/);
  const clientSide = { description: 'asks the user', inputSchema: billingTools(db.effects.url).sendEmail.inputSchema };
  assert.equal(durableTools({ ask: clientSide }).ask, clientSide);
  assert.throws(() => idempotencyKey({ toolCallId: 'x', messages: [] }), /did not come through durableTools/);
});

test('outside agentAttempt a durable tool refuses, and performs nothing', async () => {
  const tools = durableTools(billingTools(db.effects.url));
  const payments = count('pay');
  await assert.rejects(tools.payInvoice.execute({ invoice: 'INV-7', amount: 1 }, { toolCallId: 'x', messages: [] }),
    /no agentAttempt is open here/);
  assert.equal(count('pay'), payments);
});
