// The re-review of issue 33 (review33c), in-process findings:
//   F1  invokeThread runs the graph with durability 'sync' and refuses another: with
//       'async' (LangGraph's default) a crash during a tool could lose the model step's
//       checkpoint, the resume asked the model again and its new call ids paid twice (the
//       crash itself: crash.test.js, "review33c F1: an unrecorded model ...");
//   F2  a call its provider refused, after which the model paid under another id, was paid
//       again when the thread was started over (the refused call's key made again): a later
//       attempt now replays the refusal;
//   F3  fork_run does not carry a thread's calls (keyed by their tool call ids): the
//       abandoned run's interrupt no longer tells a person to fork it.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@/db node --test test/
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { z } from 'zod';
import { tool } from '@langchain/core/tools';
import { AIMessage } from '@langchain/core/messages';
import { EffectDidNotHappen, LedgerError, RunAbandoned } from 'durable-ledger';
import { durabilityOf, idempotencyKey, invokeThread, ledgerInterrupts, ledgerTools } from '../src/index.js';
import { admin, callOf, effectsOf, scriptedAgent, testLedger, threadConfig, userSays as input } from './helpers.js';

const { ledger, close } = testLedger(4);
after(close);

/**
 * One process's agent (its model, its graph, its MemorySaver: scriptedAgent): a fake whose
 * every tool call has a new random id, as a provider gives, its turns recorded unless
 * `record` is false.
 * @param {any[]} tools
 * @param {(ms: any[]) => AIMessage} answer
 * @param {boolean} [record]
 */
const processAgent = (tools, answer, record = true) => scriptedAgent(tools, answer, { record }).graph;

test('F1: invokeThread runs the graph with durability \'sync\' (the caller\'s \'sync\' kept); \'async\', \'exit\' and checkpointDuring are refused before anything runs', async () => {
  /** @type {any[]} */
  const seen = [];
  const graph = { invoke: async (/** @type {any} */ _i, /** @type {any} */ c) => { seen.push(c); return { messages: [] }; } };
  const thread = `lg-r33c-dur-${randomUUID()}`;
  await invokeThread(ledger, graph, null, { configurable: { thread_id: thread } });
  await invokeThread(ledger, graph, null, { configurable: { thread_id: thread }, durability: 'sync', tags: ['t'] });
  assert.deepEqual(seen.map((c) => c.durability), ['sync', 'sync']);
  assert.deepEqual(seen[1].tags, ['t'], 'the rest of the config is the caller\'s');
  for (const config of [
    { configurable: { thread_id: thread }, durability: 'async' },
    { configurable: { thread_id: thread }, durability: 'exit' },
    { configurable: { thread_id: thread }, checkpointDuring: true },
  ]) {
    assert.throws(() => invokeThread(ledger, graph, null, /** @type {any} */ (config)),
      (/** @type {any} */ e) => e instanceof LedgerError && /durability 'sync'/.test(e.message) && /nothing was performed/.test(e.message));
  }
  assert.equal(seen.length, 2, 'a refused config never reached the graph');
  assert.deepEqual(durabilityOf({ configurable: { thread_id: 'x' } }), { configurable: { thread_id: 'x' }, durability: 'sync' });
});

test('F2: a refused payment the model then made under another id is paid once when the thread is started over (its MemorySaver lost): the refusal is replayed, not made again', async () => {
  const thread = `lg-r33c-f2-${randomUUID()}`;
  /** @type {string[]} */
  const bank = [];
  let bankUp = false; // the bank refuses the first request (a 503 before it changed anything)
  const tools = ledgerTools([tool(async ({ invoice, amount }, config) => {
    if (!bankUp) {
      bankUp = true;
      throw new EffectDidNotHappen({ error: '503 bank maintenance, nothing charged' });
    }
    bank.push(idempotencyKey(config));
    return { charged: amount, invoice, ref: `BANK-${bank.length}` };
  }, { name: 'pay_invoice', description: 'Pays an invoice.', schema: z.object({ invoice: z.string(), amount: z.number() }) })]);
  const answer = (/** @type {any[]} */ ms) => {
    const last = ms.at(-1);
    if (last.getType() === 'human' || (last.getType() === 'tool' && String(last.content).includes('503'))) {
      return new AIMessage({ content: '', tool_calls: [callOf('pay_invoice', { invoice: 'INV-9', amount: 4200 })] });
    }
    return new AIMessage('INV-9 is paid');
  };
  const config = threadConfig(thread);
  const first = await invokeThread(ledger, processAgent(tools, answer), input('Pay invoice INV-9 (4200)'), config);
  assert.equal(first.messages.at(-1).content, 'INV-9 is paid');
  assert.equal(bank.length, 1);

  // the process dies with its MemorySaver; the app starts the thread over (the README's way)
  const again = await invokeThread(ledger, processAgent(tools, answer), input('Pay invoice INV-9 (4200)'), config);
  assert.equal(again.messages.at(-1).content, 'INV-9 is paid');
  assert.equal(bank.length, 1, 'INV-9 charged once');
  const told = again.messages.filter((/** @type {any} */ m) => m.getType() === 'tool').map((/** @type {any} */ m) => String(m.content));
  const toldFirst = first.messages.filter((/** @type {any} */ m) => m.getType() === 'tool').map((/** @type {any} */ m) => String(m.content));
  assert.equal(told[0], toldFirst[0], 'the model is asked the prompt it was asked, so its recorded turn answers');
  assert.match(told[0], /^Error: pay_invoice did not happen \(nothing was done\): {"error":"503 bank maintenance, nothing charged"}/, 'the refused call is replayed as refused, in the words of its first refusal');
  assert.deepEqual((await effectsOf(thread)).filter((r) => r.tool === 'pay_invoice').map((r) => r.status).sort(),
    ['completed', 'failed']);
});

test('F3: an abandoned run\'s interrupt does not tell a person to fork the thread (fork_run does not carry calls keyed by their ids)', async () => {
  const thread = `lg-r33c-f3-${randomUUID()}`;
  let mailed = 0;
  const tools = ledgerTools([
    tool(async () => {
      // a person abandons the run while the payment is made
      await admin().query("SELECT durable_ledger.abandon_run($1, 'on-call', 'wrong customer')", [thread]);
      return { paid: true };
    }, { name: 'pay_invoice', description: 'pays', schema: z.object({ invoice: z.string() }) }),
    tool(async () => ({ sent: ++mailed }), { name: 'send_email', description: 'mails', schema: z.object({ to: z.string() }) }),
  ]);
  const graph = processAgent(tools, (ms) => {
    const last = ms.at(-1);
    if (last.getType() === 'human') return new AIMessage({ content: '', tool_calls: [callOf('pay_invoice', { invoice: 'INV-9' })] });
    if (last.name === 'pay_invoice') return new AIMessage({ content: '', tool_calls: [callOf('send_email', { to: 'ap@acme.test' })] });
    return new AIMessage('done');
  }, false); // (a recorded model's turn would meet the abandonment first: it ends the graph with its error)
  const config = threadConfig(thread);
  const err = await invokeThread(ledger, graph, input('pay INV-9, mail AP'), config).then(() => null, (e) => e);
  assert.ok(err instanceof RunAbandoned, String(err));
  assert.equal(mailed, 0);
  const stops = ledgerInterrupts(await graph.getState(config));
  assert.equal(stops.length, 1, JSON.stringify(stops));
  assert.equal(stops[0].kind, 'abandoned');
  assert.match(stops[0].forPerson, /Do not fork it \(durable_ledger\.fork_run does not carry its calls/);
  assert.match(stops[0].forPerson, /business key/);
  assert.doesNotMatch(stops[0].forPerson, /fork it into a new run/);
});
