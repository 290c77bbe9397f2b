// Which call is which (the review of issue 33): a tool call is keyed by its tool call's id,
// not by its occurrence in the attempt, so that LangGraph's own resume (Command({resume})
// after an interrupt, a new invokeThread for the next user turn) and its own retry (a node's
// retryPolicy) reach the right effect:
//   F1  a resume after an unknown outcome reached an earlier identical call's effect (its
//       result to the model, the unknown outcome passed as a success);
//   F4  a second user turn paying another invoice was paused as a divergence;
//   F5  a recorded read replayed the first turn's answer in every later turn;
//   F6  a node's retryPolicy paid twice: (a) a node of one's own calling pay.invoke(args)
//       (now refused: it has no tool call id), (b) the prebuilt ToolNode with a retryPolicy;
// and a model node retried after its turn was recorded, whose second answer's calls were
// performed while a rerun replayed the first answer's (paid twice); the interrupt's key.
// The extension's call-id guard (1.3): a new tool call id of a later invocation whose call
// equals an effect an earlier one made pauses as a divergence -- a thread started over whose
// model names the payment anew ("asked again"), and a later turn's deliberate identical
// payment (F1), which a person's 'distinct' makes.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@/db node --test test/
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import { tool } from '@langchain/core/tools';
import { AIMessage } from '@langchain/core/messages';
import { Annotation, Command, END, MemorySaver, MessagesAnnotation, START, StateGraph } from '@langchain/langgraph';
import { DivergencePaused, EffectDidNotHappen, RunStopped } from 'durable-ledger';
import { idempotencyKey, invokeThread, ledgerInterrupts, ledgerTools, recordedModel } from '../src/index.js';
import {
  admin, callOf, effectsOf, fakeAnswering, resolveCompleted, scriptedAgent, testLedger, threadConfig, toolLoop,
  toolMessages, userSays as say,
} from './helpers.js';

const { ledger, close } = testLedger(6);
after(close);

/** @param {any} out @param {string} name */
const answers = (out, name) => toolMessages(out, name).map((/** @type {any} */ m) => m.content);
const retry = { maxAttempts: 3, initialInterval: 1, jitter: false, logWarning: false };

test('F1: a resume after an unknown outcome reaches that call\'s own effect, not an identical earlier one; a later turn\'s identical call pauses once as a divergence, and a person\'s distinct makes it a new payment', async () => {
  const thread = `lg-f1-${randomUUID()}`;
  /** @type {string[]} */
  const bank = [];
  const pay = tool(async ({ invoice, amount }, config) => {
    bank.push(idempotencyKey(config));
    if (bank.length === 2) throw new Error('the bank timed out'); // the 2nd instalment: outcome unknown
    return { paymentId: `P${bank.length}`, invoice, amount };
  }, { name: 'pay_invoice', description: 'pays', schema: z.object({ invoice: z.string(), amount: z.number() }) });
  // pays INV-9 100 in two instalments (two steps, the same call), then answers
  const { graph } = scriptedAgent(ledgerTools([pay]), (ms) => {
    const turn = ms.slice(ms.findLastIndex((m) => m.getType() === 'human'));
    const paid = turn.filter((m) => m.getType() === 'tool').length;
    const wanted = String(turn[0].content).includes('two instalments') ? 2 : 1;
    return paid < wanted ? new AIMessage({ content: '', tool_calls: [callOf('pay_invoice', { invoice: 'INV-9', amount: 100 })] })
      : new AIMessage(`done: ${ms.at(-1).content}`);
  });
  const config = threadConfig(thread);
  const err = await invokeThread(ledger, graph, say('pay INV-9 in two instalments of 100'), config).then(() => null, (e) => e);
  assert.ok(err instanceof RunStopped, String(err));
  const [stop] = ledgerInterrupts(await graph.getState(config));
  assert.equal(stop.kind, 'unknown');

  // resumed before anyone resolved it: it interrupts again, nothing paid
  await admin().query("SELECT durable_ledger.break_lease($1, 'on-call', 'x')", [thread]);
  const early = await invokeThread(ledger, graph, new Command({ resume: 'early' }), config).then(() => null, (e) => e);
  assert.match(String(early?.name), /EffectPaused/);
  assert.equal(bank.length, 2);

  // the person found the 2nd instalment at the bank under its key
  await resolveCompleted(/** @type {string} */ (stop.key), { paymentId: 'P2-found', invoice: 'INV-9', amount: 100 });
  const out = await invokeThread(ledger, graph, new Command({ resume: 'resolved' }), config);
  assert.deepEqual(answers(out, 'pay_invoice').map((c) => JSON.parse(c).paymentId), ['P1', 'P2-found'],
    'the model is told what the person found, not the first instalment\'s result');
  assert.equal(bank.length, 2);

  // a new user turn: pay once more -- the first instalment's call (its tool, its arguments)
  // under a new id, in a later attempt: it may be that payment named anew (a model asked again
  // after its answer was lost), so it pauses once as a divergence, nothing paid
  const diverged = await invokeThread(ledger, graph, say('pay INV-9 100 once more'), config).then(() => null, (e) => e);
  assert.ok(diverged instanceof DivergencePaused, String(diverged));
  assert.equal(bank.length, 2, 'nothing paid while a person decides');
  const [pause] = ledgerInterrupts(await graph.getState(config));
  assert.equal(pause.kind, 'paused');
  assert.equal(pause.key, diverged.key);
  assert.match(pause.forPerson, /resolve_divergence/);
  assert.deepEqual((await admin().query(
    'SELECT key, occurrence, candidate_key, verdict FROM durable_ledger.divergences WHERE run = $1', [thread])).rows,
  [{ key: diverged.key, occurrence: 0, candidate_key: bank[0].replace(/#1$/, ''), verdict: null }],
  'the divergence names the first instalment, the effect whose key the bank got first');
  // the person: the customer did ask for a third payment -- distinct: it is a new payment (not
  // the first one replayed)
  await admin().query("SELECT durable_ledger.resolve_divergence($1, 'distinct', 'on-call', 'a third payment was asked for')",
    [diverged.key]);
  const more = await invokeThread(ledger, graph, new Command({ resume: 'distinct' }), config);
  assert.equal(JSON.parse(answers(more, 'pay_invoice').at(-1)).paymentId, 'P3');
  assert.equal(bank.length, 3);
  assert.equal(bank[2], `${diverged.key}#1`, 'paid under its own key');
  assert.deepEqual((await effectsOf(thread)).map((r) => r.status), ['completed', 'completed', 'completed']);
  // the interrupt: the effect's key (resolve_effect's), the key the bank got, and not the tool's error
  assert.equal(stop.downstreamKey, bank[1]);
  assert.equal(stop.downstreamKey, `${stop.key}#1`);
  assert.doesNotMatch(stop.forPerson, /timed out/, 'the tool\'s own error is not kept in the checkpoint');
  assert.match(err.message, /timed out/, 'the app has it');
  assert.equal(err.key, stop.key, 'the RunStopped names the effect\'s key, the interrupt\'s');
});

test('F1: an unknown outcome a person resolved as not happened reaches the model, on the resume, as a refusal (it did not happen), not made again; the model\'s new call is its own payment', async () => {
  const thread = `lg-f1b-${randomUUID()}`;
  /** @type {string[]} */
  const bank = [];
  const pay = tool(async (_a, config) => {
    bank.push(idempotencyKey(config));
    if (bank.length === 1) throw new Error('connection reset');
    return { paymentId: `P${bank.length}` };
  }, { name: 'pay_invoice', description: 'pays', schema: z.object({ invoice: z.string() }) });
  // the model pays, and pays again (a new call, a new id) when told the payment did not happen
  const { graph } = scriptedAgent(ledgerTools([pay]), (ms) => (ms.at(-1).getType() === 'human'
    || (ms.at(-1).getType() === 'tool' && /did not happen/.test(String(ms.at(-1).content)))
    ? new AIMessage({ content: '', tool_calls: [callOf('pay_invoice', { invoice: 'INV-3' })] })
    : new AIMessage(`done: ${ms.at(-1).content}`)));
  const config = threadConfig(thread);
  await invokeThread(ledger, graph, say('pay INV-3'), config).catch(() => null);
  const [stop] = ledgerInterrupts(await graph.getState(config));
  await admin().query("SELECT durable_ledger.break_lease($1, 'on-call', 'x')", [thread]);
  await admin().query("SELECT durable_ledger.resolve_effect($1, 'failed', '{\"bank\": \"no such payment\"}', 'on-call', 'checked')",
    [stop.key]);
  const out = await invokeThread(ledger, graph, new Command({ resume: 'resolved' }), config);
  const told = answers(out, 'pay_invoice');
  assert.equal(told.length, 2, JSON.stringify(told));
  assert.match(told[0], /did not happen/, 'the resumed call is told to the model as not made');
  assert.equal(JSON.parse(told[1]).paymentId, 'P2', 'the model\'s new call pays');
  assert.equal(bank.length, 2);
  assert.equal(bank[0], `${stop.key}#1`);
  assert.notEqual(bank[1].replace(/#\d+$/, ''), stop.key, 'under its own key: the refused call was not made again');
  assert.match(bank[1], /#1$/);
});

test('asked again: a thread started over with its checkpoints lost (same thread id), its unrecorded model naming the payment anew (a new tool call id): paused as a divergence, paid once; a person\'s same gives the model the first payment\'s result', async () => {
  const thread = `lg-askedagain-${randomUUID()}`;
  /** @type {string[]} */
  const bank = [];
  const tools = ledgerTools([tool(async ({ invoice, amount }, config) => {
    bank.push(idempotencyKey(config));
    return { paymentId: `P${bank.length}`, invoice, amount };
  }, { name: 'pay_invoice', description: 'pays', schema: z.object({ invoice: z.string(), amount: z.number() }) })]);
  // one process's agent: its model not recorded (each time it is asked, its calls have new
  // ids, as a provider's), its MemorySaver lost with it; `dies` when the process dies as the
  // model is asked after the payment (the answer lost)
  const processAgent = (/** @type {boolean} */ dies) => scriptedAgent(tools, (ms) => {
    if (ms.at(-1).getType() === 'human') {
      return new AIMessage({ content: '', tool_calls: [callOf('pay_invoice', { invoice: 'INV-9', amount: 100 })] });
    }
    if (dies) throw new Error('the worker died');
    return new AIMessage(`paid: ${JSON.parse(ms.at(-1).content).paymentId}`);
  }).graph;
  const config = threadConfig(thread);
  const died = await invokeThread(ledger, processAgent(true), say('pay INV-9 100'), config).then(() => null, (e) => e);
  assert.match(String(died?.message), /the worker died/);
  assert.equal(bank.length, 1, 'paid');
  const [paid] = await effectsOf(thread);
  assert.equal(bank[0], `${paid.key}#1`);

  // the app starts the thread over from its input: the model, asked again, names the call anew
  const graph = processAgent(false);
  const err = await invokeThread(ledger, graph, say('pay INV-9 100'), config).then(() => null, (e) => e);
  assert.ok(err instanceof DivergencePaused, String(err));
  assert.equal(bank.length, 1, 'not paid again');
  const [stop] = ledgerInterrupts(await graph.getState(config));
  assert.equal(stop.kind, 'paused');
  assert.equal(stop.key, err.key);
  assert.notEqual(stop.key, paid.key, 'the call is the model\'s new one');
  assert.match(stop.forPerson, /resolve_divergence/);
  assert.deepEqual((await admin().query(
    'SELECT key, tool, occurrence, candidate_key, verdict FROM durable_ledger.divergences WHERE run = $1', [thread])).rows,
  [{ key: stop.key, tool: 'pay_invoice', occurrence: 0, candidate_key: paid.key, verdict: null }],
  'a call id\'s divergence (occurrence 0) that names the payment made');
  // resumed before anyone decided: it interrupts again, nothing paid
  const early = await invokeThread(ledger, graph, new Command({ resume: 'early' }), config).then(() => null, (e) => e);
  assert.ok(early instanceof DivergencePaused, String(early));
  assert.equal(bank.length, 1);

  // the person checks the bank: one payment -- the same; the model is given its result
  const { rows: [verdict] } = await admin().query(
    "SELECT verdict, same_as FROM durable_ledger.resolve_divergence($1, 'same', 'on-call', 'the bank has one payment')",
    [stop.key]);
  assert.deepEqual(verdict, { verdict: 'same', same_as: paid.key });
  const out = await invokeThread(ledger, graph, new Command({ resume: 'same' }), config);
  assert.deepEqual(answers(out, 'pay_invoice').map((c) => JSON.parse(c)), [{ paymentId: 'P1', invoice: 'INV-9', amount: 100 }]);
  assert.equal(out.messages.at(-1).content, 'paid: P1');
  assert.equal(bank.length, 1, 'paid once');
  assert.deepEqual(ledgerInterrupts(out), []);
});

test('F4: a second user turn paying another invoice is performed, not paused as a divergence', async () => {
  const thread = `lg-f4-${randomUUID()}`;
  let paid = 0;
  const pay = tool(async ({ invoice }) => ({ paid: invoice, n: ++paid }),
    { name: 'pay_invoice', description: 'pays', schema: z.object({ invoice: z.string() }) });
  const { graph } = scriptedAgent(ledgerTools([pay]), (ms) => (ms.at(-1).getType() === 'human'
    ? new AIMessage({ content: '', tool_calls: [callOf('pay_invoice', { invoice: String(ms.at(-1).content).match(/INV-\d+/)?.[0] })] })
    : new AIMessage('done')));
  const config = threadConfig(thread);
  await invokeThread(ledger, graph, say('pay INV-8'), config);
  const out = await invokeThread(ledger, graph, say('now pay INV-10'), config);
  assert.deepEqual(answers(out, 'pay_invoice').map((c) => JSON.parse(c).paid), ['INV-8', 'INV-10']);
  assert.equal(paid, 2);
  assert.deepEqual(ledgerInterrupts(out), []);
});

test('F5: a recorded read in a later turn of the thread reads afresh; its own tool call run again is replayed', async () => {
  const thread = `lg-f5-${randomUUID()}`;
  let shipped = false;
  let reads = 0;
  const status = tool(async ({ order }) => {
    reads += 1;
    return { order, status: shipped ? 'shipped' : 'pending' };
  }, { name: 'order_status', description: 'reads', schema: z.object({ order: z.string() }) });
  const tools = ledgerTools([status], { readOnly: ['order_status'] });
  const answer = (/** @type {any[]} */ ms) => (ms.at(-1).getType() === 'human'
    ? new AIMessage({ content: '', tool_calls: [callOf('order_status', { order: 'A1' })] })
    : new AIMessage(`status: ${JSON.parse(ms.at(-1).content).status}`));
  const { graph } = scriptedAgent(tools, answer, { record: true });
  const config = threadConfig(thread);
  const ask = async () => (await invokeThread(ledger, graph, say('is A1 shipped?'), config)).messages.at(-1).content;
  assert.equal(await ask(), 'status: pending');
  shipped = true;
  assert.equal(await ask(), 'status: shipped');
  assert.equal(await ask(), 'status: shipped');
  assert.equal(reads, 3);

  // the thread started over (its checkpoints lost): the recorded turns come back with their
  // tool calls, and each read is replayed as it was read
  const again = scriptedAgent(tools, answer, { record: true });
  const first = await invokeThread(ledger, again.graph, say('is A1 shipped?'), config);
  assert.equal(first.messages.at(-1).content, 'status: pending');
  assert.equal(again.fake.callCount, 0);
  assert.equal(reads, 3);
});

test('F6b: the prebuilt ToolNode retried by its retryPolicy replays the payment and makes the refused e-mail again', async () => {
  const thread = `lg-f6b-${randomUUID()}`;
  /** @type {string[]} */
  const bank = [];
  let mailTries = 0;
  const tools = ledgerTools([
    tool(async (a, config) => {
      bank.push(idempotencyKey(config));
      return { paid: a.invoice };
    }, { name: 'pay_invoice', description: 'pays', schema: z.object({ invoice: z.string(), amount: z.number() }) }),
    tool(async () => {
      mailTries += 1;
      if (mailTries === 1) throw new EffectDidNotHappen({ error: '421 try later' });
      return 'sent';
    }, { name: 'send_email', description: 'mails', schema: z.object({ to: z.string() }) }),
  ]);
  const { graph } = scriptedAgent(tools, (ms) => (ms.at(-1).getType() === 'human'
    ? new AIMessage({ content: '', tool_calls: [callOf('pay_invoice', { invoice: 'INV-7', amount: 50 }), callOf('send_email', { to: 'ap@acme.test' })] })
    : new AIMessage('done')), { toolsRetry: retry, handleToolErrors: false });
  const out = await invokeThread(ledger, graph, say('pay INV-7, mail AP'), threadConfig(thread));
  assert.equal(bank.length, 1, 'paid once');
  assert.equal(mailTries, 2, 'the refused e-mail was made again by the retry');
  assert.deepEqual(answers(out, 'send_email'), ['sent']);
  assert.deepEqual((await effectsOf(thread)).map((r) => `${r.tool}:${r.status}`).sort(),
    ['pay_invoice:completed', 'send_email:completed']);
});

test('F6a: a node of one\'s own that invokes a ledger tool without a tool call is refused (nothing paid); with a tool call whose id is kept in the state, its retry pays once', async () => {
  /** @type {string[]} */
  const bank = [];
  const [pay] = ledgerTools([tool(async (a, config) => {
    bank.push(idempotencyKey(config));
    return { paid: a.invoice };
  }, { name: 'pay_invoice', description: 'pays', schema: z.object({ invoice: z.string(), amount: z.number() }) })]);
  const State = Annotation.Root({
    ...MessagesAnnotation.spec,
    paymentId: Annotation({ reducer: (_a, b) => b, default: () => '' }),
  });
  /** @param {(state: any, config: any) => Promise<unknown>} payIt */
  const settle = (payIt) => {
    let flaky = 0;
    return new StateGraph(State)
      .addNode('plan', () => ({ paymentId: `pay-${randomUUID()}` })) // an id made once, kept in the state
      .addNode('settle', async (state, config) => {
        await payIt(state, config);
        flaky += 1;
        if (flaky === 1) throw new Error('ECONNRESET writing the audit trail'); // after the payment
        return { messages: [new AIMessage('settled')] };
      }, { retryPolicy: retry })
      .addEdge(START, 'plan').addEdge('plan', 'settle').addEdge('settle', END)
      .compile({ checkpointer: new MemorySaver() });
  };
  const args = { invoice: 'INV-9', amount: 100 };

  const bare = settle((_s, config) => pay.invoke(args, config));
  const err = await invokeThread(ledger, bare, say('settle'), threadConfig(`lg-f6a-${randomUUID()}`)).then(() => null, (e) => e);
  assert.match(String(err?.message), /invoked without a tool call id and without a business key; nothing was performed/);
  assert.match(String(err?.message), /type: 'tool_call'/, 'it says how to call it');
  assert.equal(bank.length, 0);

  const thread = `lg-f6a-${randomUUID()}`;
  const withCall = settle((state, config) => pay.invoke({ id: state.paymentId, name: 'pay_invoice', args, type: 'tool_call' }, config));
  const out = await invokeThread(ledger, withCall, say('settle'), threadConfig(thread));
  assert.equal(out.messages.at(-1).content, 'settled');
  assert.equal(bank.length, 1, 'the retried node\'s call was replayed');
  assert.deepEqual((await effectsOf(thread)).map((r) => r.status), ['completed']);
});

test('a model node retried after its turn was recorded gets the same answer, so a rerun of the thread replays the calls that were made (paid once)', async () => {
  const thread = `lg-modelretry-${randomUUID()}`;
  let paid = 0;
  const tools = ledgerTools([tool(async () => ({ n: ++paid }),
    { name: 'pay_invoice', description: 'pays', schema: z.object({ invoice: z.string() }) })]);
  const build = () => {
    const fake = fakeAnswering((ms) => (ms.at(-1).getType() === 'human'
      ? new AIMessage({ content: '', tool_calls: [callOf('pay_invoice', { invoice: 'INV-5' })] })
      : new AIMessage('done')));
    const model = recordedModel(fake).bindTools(tools);
    let flaky = 0;
    const graph = toolLoop(tools, async (ms) => {
      const ai = await model.invoke(ms);
      flaky += 1;
      if (flaky === 1) throw new Error('ETIMEDOUT saving the trace'); // after the model answered
      return ai;
    }, { agentRetry: retry });
    return { graph, fake };
  };
  const first = build();
  await invokeThread(ledger, first.graph, say('pay INV-5'), threadConfig(thread));
  assert.equal(first.fake.callCount, 2, 'the retried node was answered from its first ask');
  assert.equal(paid, 1);
  // the thread started over: the turns and the payment are replayed
  const second = build();
  const out = await invokeThread(ledger, second.graph, say('pay INV-5'), threadConfig(thread));
  assert.equal(second.fake.callCount, 0);
  assert.equal(paid, 1, 'paid once');
  assert.equal(out.messages.at(-1).content, 'done');
});
