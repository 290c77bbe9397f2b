// The tools in one process: parallel calls of one step under a token lease, the key handed
// to the tool, read-only tools recorded or passed through, an unknown outcome, a refused
// tool and an abandoned run surfaced as interrupts and typed errors, the 'error' way of
// stopping (and a graph without a checkpointer), and calls made outside the thread's attempt.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@/db node --test test/
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import { tool } from '@langchain/core/tools';
import { AIMessage } from '@langchain/core/messages';
import { fakeModel } from '@langchain/core/testing';
import { Command, END, MemorySaver, MessagesAnnotation, START, StateGraph } from '@langchain/langgraph';
import { EffectDidNotHappen, RunAbandoned, RunStopped, ToolRefused } from 'durable-ledger';
import { agentAttempt } from 'durable-ledger/agents';
import {
  idempotencyKey, invokeThread, ledgerInterrupts, ledgerTool, ledgerTools, recordedModel, recordedTool,
} from '../src/index.js';
import {
  admin, callOf, effectsOf, resolveCompleted, scriptedAgent, testLedger, threadConfig, toolMessages as answerOf, userSays,
} from './helpers.js';

const { ledger, close } = testLedger(6);
after(close);

/**
 * A graph of its own (scriptedAgent): a fake model that asks for `calls` in one step, then
 * answers "done".
 * @param {any[]} tools
 * @param {Array<{name: string, args: object}>} calls
 * @param {{checkpointer?: any, record?: boolean}} [opts]
 */
function agent(tools, calls, opts = {}) {
  return scriptedAgent(tools, (ms) => (ms[ms.length - 1].getType() === 'human'
    ? new AIMessage({ content: '', tool_calls: calls.map((c) => callOf(c.name, c.args)) })
    : new AIMessage('done')), opts);
}
const hello = userSays('go');

test('two calls of one step run in parallel under the token lease, each gets the ledger\'s key, and a rerun of the thread replays both', async () => {
  const thread = `lg-par-${randomUUID()}`;
  let started = 0;
  /** @type {() => void} */
  let release = () => {};
  const bothStarted = new Promise((resolve) => { release = () => resolve(undefined); });
  /** @type {Record<string, string>} */
  const keys = {};
  const made = { a: 0, b: 0 };
  const make = (/** @type {'a' | 'b'} */ name) => tool(async (_args, config) => {
    made[name] += 1;
    keys[name] = idempotencyKey(config);
    started += 1;
    if (started === 2) release();
    // the other call of the step must be running meanwhile (else the step cannot end)
    const waited = await Promise.race([bothStarted.then(() => true),
      new Promise((r) => setTimeout(() => r(false), 30000).unref())]);
    if (!waited) throw new EffectDidNotHappen({ error: `${name} ran alone: the calls were not parallel` });
    return { done: name };
  }, { name: `par_${name}`, description: name, schema: z.object({ n: z.number() }) });
  const tools = ledgerTools([make('a'), make('b')]);
  const { graph } = agent(tools, [{ name: 'par_a', args: { n: 1 } }, { name: 'par_b', args: { n: 2 } }], { record: true });
  const out = await invokeThread(ledger, graph, hello, threadConfig(thread));
  assert.deepEqual(answerOf(out, 'par_a').map((m) => JSON.parse(m.content)), [{ done: 'a' }]);
  assert.deepEqual(answerOf(out, 'par_b').map((m) => JSON.parse(m.content)), [{ done: 'b' }]);
  const rows = await effectsOf(thread);
  assert.deepEqual(rows.filter((r) => r.tool.startsWith('par_')).map((r) => [r.tool, r.status, r.key]).sort(),
    [['par_a', 'completed', keys.a.replace(/#1$/, '')], ['par_b', 'completed', keys.b.replace(/#1$/, '')]],
    'the tools got the effects\' keys (a tool call\'s key and its attempt)');

  // the same thread run again from its start with a new checkpointer: all replayed
  const again = agent(tools, [{ name: 'par_b', args: { n: 2 } }, { name: 'par_a', args: { n: 1 } }], { record: true });
  const out2 = await invokeThread(ledger, again.graph, hello, threadConfig(thread));
  assert.equal(again.fake.callCount, 0, 'the model turns were replayed');
  assert.deepEqual(made, { a: 1, b: 1 }, 'nothing was made again');
  assert.deepEqual(out2.messages.map((/** @type {any} */ m) => m.content), out.messages.map((/** @type {any} */ m) => m.content));
});

test('a read-only tool is recorded (replayed to a later attempt that makes its tool call again) or passed through (called each time, not in the ledger)', async () => {
  const thread = `lg-read-${randomUUID()}`;
  const seen = { recorded: 0, passed: 0 };
  const read = (/** @type {'recorded' | 'passed'} */ name) => tool(async () => {
    seen[name] += 1;
    return { answer: `${name} ${seen[name]}` };
  }, { name: `read_${name}`, description: name, schema: z.object({}) });
  const [recorded] = ledgerTools([read('recorded')], { readOnly: ['read_recorded'] });
  const passedRaw = read('passed');
  const [passed] = ledgerTools([passedRaw], { readOnly: ['read_passed'], reads: 'pass' });
  assert.equal(passed, passedRaw, 'passed through: the tool itself');
  const calls = [{ name: 'read_recorded', args: {} }, { name: 'read_passed', args: {} }];
  // the model's turns recorded: the thread started over gets the same tool calls (their ids)
  const first = await invokeThread(ledger, agent([recorded, passed], calls, { record: true }).graph, hello, threadConfig(thread));
  const second = await invokeThread(ledger, agent([recorded, passed], calls, { record: true }).graph, hello, threadConfig(thread));
  assert.deepEqual(seen, { recorded: 1, passed: 2 });
  assert.equal(answerOf(second, 'read_recorded')[0].content, answerOf(first, 'read_recorded')[0].content,
    'the later attempt saw what the first saw');
  assert.equal(JSON.parse(answerOf(second, 'read_passed')[0].content).answer, 'passed 2');
  assert.deepEqual((await effectsOf(thread)).map((r) => r.tool).filter((t) => !t.startsWith('model.')), ['read_recorded']);
  assert.throws(() => ledgerTools([passedRaw], { readOnly: ['nope'] }), /not one of the tools/);
});

test('a tool that throws leaves its outcome unknown: an interrupt, RunStopped from the attempt; resolved by a person, the resume replays it', async () => {
  const thread = `lg-unknown-${randomUUID()}`;
  let calls = 0;
  const charge = ledgerTool(tool(async () => {
    calls += 1;
    throw new Error('the bank timed out');
  }, { name: 'charge_card', description: 'charges', schema: z.object({ amount: z.number() }) }));
  const { graph } = agent([charge], [{ name: 'charge_card', args: { amount: 7 } }]);
  const config = threadConfig(thread);
  const err = await invokeThread(ledger, graph, hello, config).then(() => null, (e) => e);
  assert.ok(err instanceof RunStopped, String(err));
  assert.match(err.message, /outcome of charge_card .* is unknown/);
  const state = await graph.getState(config);
  const [stop] = ledgerInterrupts(state);
  assert.equal(stop.kind, 'unknown');
  assert.equal(stop.tool, 'charge_card');
  assert.deepEqual(state.next, ['tools']);
  assert.equal(calls, 1);

  await resolveCompleted(/** @type {string} */ (stop.key), { charged: 7, found: 'by the on-call' });
  const out = await invokeThread(ledger, graph, new Command({ resume: 'resolved' }), config);
  assert.deepEqual(JSON.parse(answerOf(out, 'charge_card')[0].content), { charged: 7, found: 'by the on-call' });
  assert.equal(calls, 1, 'the tool was not called again');
  assert.deepEqual(ledgerInterrupts(out), []);
});

test('a refused tool is an interrupt and a ToolRefused; once an admin registers it anew, the resume performs it once', async () => {
  const thread = `lg-refused-${randomUUID()}`;
  const name = `lg.refused.${randomUUID()}`;
  await admin().query("SELECT durable_ledger.register_tool($1, 'admin')", [name]);
  await admin().query("SELECT durable_ledger.retire_tool($1, 'admin', 'test')", [name]);
  let calls = 0;
  const ship = ledgerTool(tool(async () => {
    calls += 1;
    return 'shipped';
  }, { name: 'ship_order', description: 'ships', schema: z.object({ order: z.string() }) }), { name });
  const { graph } = agent([ship], [{ name: 'ship_order', args: { order: 'A1' } }]);
  const config = threadConfig(thread);
  const err = await invokeThread(ledger, graph, hello, config).then(() => null, (e) => e);
  assert.ok(err instanceof ToolRefused, String(err));
  const state = await graph.getState(config);
  assert.deepEqual(ledgerInterrupts(state).map((i) => [i.kind, i.tool]), [['refused', name]]);
  assert.equal(answerOf(state.values, 'ship_order').length, 0);
  assert.equal(calls, 0);

  await admin().query("SELECT durable_ledger.register_tool($1, 'admin')", [name]);
  const out = await invokeThread(ledger, graph, new Command({ resume: 'registered' }), config);
  assert.equal(answerOf(out, 'ship_order')[0].content, 'shipped');
  assert.equal(calls, 1);
});

test("onStop 'error', and a graph without a checkpointer: the stop is a tool error for the model (not performed, do not call again) and the attempt throws it at its end", async () => {
  const name = `lg.retired.${randomUUID()}`;
  await admin().query("SELECT durable_ledger.register_tool($1, 'admin')", [name]);
  await admin().query("SELECT durable_ledger.retire_tool($1, 'admin', 'test')", [name]);
  let calls = 0;
  const inner = tool(async () => {
    calls += 1;
    return 'done';
  }, { name: 'retired_tool', description: 'retired', schema: z.object({}) });
  for (const [how, tools, checkpointer] of /** @type {const} */ ([
    ['onStop error', [ledgerTool(inner, { name, onStop: 'error' })], new MemorySaver()],
    ['no checkpointer', [ledgerTool(inner, { name })], null],
  ])) {
    const { graph } = agent([...tools], [{ name: 'retired_tool', args: {} }], { checkpointer });
    /** @type {any} */
    let out = null;
    const run = `lg-error-${randomUUID()}`;
    // without a checkpointer there is no thread: the tools take the attempt's run
    const err = await agentAttempt(ledger, run, async () => {
      out = await graph.invoke(hello, checkpointer ? threadConfig(run) : {});
      return out;
    }).then(() => null, (e) => e);
    assert.ok(err instanceof ToolRefused, `${how}: ${err}`);
    const [msg] = answerOf(out, 'retired_tool');
    assert.match(String(msg.content), /not performed: the ledger refuses this tool\. Do not call this tool again/, how);
    assert.equal(out.messages.at(-1).content, 'done', `${how}: the model was told and ended its turn`);
  }
  assert.equal(calls, 0);
});

test('a tool called outside the thread\'s attempt, or in the attempt of another run, performs nothing', async () => {
  let calls = 0;
  const send = ledgerTool(tool(async () => {
    calls += 1;
    return 'sent';
  }, { name: 'send_fax', description: 'faxes', schema: z.object({}) }));
  const outside = await agent([send], [{ name: 'send_fax', args: {} }]).graph.invoke(hello, threadConfig(`lg-out-${randomUUID()}`));
  assert.match(String(answerOf(outside, 'send_fax')[0].content), /no agentAttempt is open around the graph/);
  const thread = `lg-mismatch-${randomUUID()}`;
  const other = await agentAttempt(ledger, `${thread}-other`, () =>
    agent([send], [{ name: 'send_fax', args: {} }]).graph.invoke(hello, threadConfig(thread)));
  assert.match(String(answerOf(other, 'send_fax')[0].content), /the run id must be the thread id/);
  assert.equal(calls, 0);
  assert.throws(() => invokeThread(ledger, agent([send], []).graph, hello, { configurable: {} }), /no configurable\.thread_id/);
});

test('an abandoned run: the next invocation of its thread throws RunAbandoned and calls nothing', async () => {
  const thread = `lg-abandon-${randomUUID()}`;
  let calls = 0;
  const book = recordedTool(tool(async () => {
    calls += 1;
    return 'looked';
  }, { name: 'look_up', description: 'reads', schema: z.object({}) }));
  const { graph } = agent([book], [{ name: 'look_up', args: {} }]);
  await invokeThread(ledger, graph, hello, threadConfig(thread));
  assert.equal(calls, 1);
  await admin().query("SELECT durable_ledger.abandon_run($1, 'on-call', 'test')", [thread]);
  const err = await invokeThread(ledger, agent([book], [{ name: 'look_up', args: {} }]).graph, hello,
    threadConfig(thread)).then(() => null, (e) => e);
  assert.ok(err instanceof RunAbandoned, String(err));
  assert.equal(calls, 1);
});

test('a read that throws stops the attempt (nothing for a person): an interrupt of kind stopped, the read\'s error from the attempt; the resume makes the read again', async () => {
  const thread = `lg-readfail-${randomUUID()}`;
  let calls = 0;
  const quote = recordedTool(tool(async () => {
    calls += 1;
    if (calls === 1) throw new Error('the quote service is down');
    return { price: 189 };
  }, { name: 'get_quote', description: 'reads a price', schema: z.object({ flight: z.string() }) }));
  const { graph } = agent([quote], [{ name: 'get_quote', args: { flight: 'TP1351' } }]);
  const config = threadConfig(thread);
  const err = await invokeThread(ledger, graph, hello, config).then(() => null, (e) => e);
  assert.match(String(err?.message), /the quote service is down/);
  const state = await graph.getState(config);
  assert.deepEqual(ledgerInterrupts(state).map((i) => [i.kind, i.tool]), [['stopped', 'get_quote']]);
  assert.match(ledgerInterrupts(state)[0].forPerson, /^nothing: /);
  assert.equal(answerOf(state.values, 'get_quote').length, 0, 'no error message recorded as the read\'s answer');
  const out = await invokeThread(ledger, graph, new Command({ resume: true }), config);
  assert.deepEqual(JSON.parse(answerOf(out, 'get_quote')[0].content), { price: 189 });
  assert.equal(calls, 2);
});

test('a model turn that throws ends the invocation with its error; invoke(null) asks the model again and goes on', async () => {
  const thread = `lg-modelfail-${randomUUID()}`;
  const fake = fakeModel().respond(new Error('rate limited')).respond(new AIMessage('hello again'));
  const model = recordedModel(fake);
  const graph = new StateGraph(MessagesAnnotation)
    .addNode('agent', async (state) => ({ messages: [await model.invoke(state.messages)] }))
    .addEdge(START, 'agent')
    .addEdge('agent', END)
    .compile({ checkpointer: new MemorySaver() });
  const config = threadConfig(thread);
  const err = await invokeThread(ledger, graph, hello, config).then(() => null, (e) => e);
  assert.match(String(err?.message), /rate limited/);
  const out = await invokeThread(ledger, graph, null, config);
  assert.equal(out.messages.at(-1).content, 'hello again');
  assert.equal(fake.callCount, 2);
  assert.deepEqual((await effectsOf(thread)).map((r) => `${r.tool}:${r.status}`), ['model.fake-model-builder:completed']);
});
