// Tool approvals (needsApproval) and the requests that continue an answer (issue 33,
// the re-review's A1).  A request that brings a tool approval is a new attempt: its
// occurrences start at 1 while the calls of the earlier requests are not made again
// (the SDK reads their results from the messages).  So (1) a call the SDK executes
// from the approval is keyed by its tool call id, which comes from the conversation's
// history (the same each time the request is sent again), not by its occurrence; and
// (2) requestRun names each continuation its own run, so that a call the continuation
// asks for again (a receipt after each instalment) is not the earlier one's replay.
// DURABLE_LEDGER_DSN: a superuser connection to a database with durable_ledger.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import {
  convertToModelMessages, generateText, readUIMessageStream, simulateReadableStream, stepCountIs, streamText, tool,
} from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { z } from 'zod';
import { DivergencePaused } from 'durable-ledger';
import { callKey } from 'durable-ledger/agents';
import { agentAttempt, durableTools, idempotencyKey, ledgerStopped, requestRun } from '../src/index.js';
import { answer, calling, cluster, streamAnswer, streamCalling, toolCall } from './support.js';

const db = cluster();
const results = (messages, toolName) => messages.filter((m) => m.role === 'tool').flatMap((m) => m.content)
  .filter((p) => p.type === 'tool-result' && p.toolName === toolName);
const effects = async (run) => (await db.pool.query(
  'SELECT key, tool, status::text, result FROM durable_ledger.effects WHERE run = $1 ORDER BY created_at', [run])).rows;

/** A bank that pays whatever it is asked to (it deduplicates nothing); payInvoice waits for the user's approval. */
function bank() {
  const paid = [];
  const receipts = [];
  const tools = durableTools({
    payInvoice: tool({
      description: 'Pays an instalment of an invoice',
      inputSchema: z.object({ invoice: z.string(), amount: z.number() }),
      needsApproval: true,
      execute: async (input, o) => {
        paid.push(idempotencyKey(o));
        return { paymentId: `PAY-${paid.length}`, ...input };
      },
    }),
    sendReceipt: tool({
      description: 'Mails the customer a receipt for the latest payment',
      inputSchema: z.object({ invoice: z.string() }),
      execute: async (input, o) => {
        receipts.push(idempotencyKey(o));
        return { receipt: receipts.length };
      },
    }),
  });
  return { paid, receipts, tools };
}

/** The divergences of a run, as a person reads them. */
const divergences = async (run) => (await db.admin.query(
  'SELECT key, tool, occurrence, candidate_key, verdict FROM durable_ledger.divergences WHERE run = $1 ORDER BY key',
  [run])).rows;

test('A1: two instalments approved in two continuations of one request (one run): the second, an identical call under a new id in a later attempt, pauses once for a person, who says distinct; each paid, each its own key (its tool call id); a retried continuation replays', async () => {
  const { paid, tools } = bank();
  // the clerk: one instalment of INV-9 per turn until two are paid, then says what came back
  const model = new MockLanguageModelV4({
    provider: 'test', modelId: 'clerk',
    doGenerate: async ({ prompt }) => {
      const done = results(prompt, 'payInvoice');
      if (done.length < 2) return calling(toolCall('payInvoice', { invoice: 'INV-9', amount: 100 }));
      return answer(`both paid: ${done.map((p) => p.output.value.paymentId).join(', ')}`);
    },
  });
  const run = requestRun(`chat-${randomUUID()}`, `msg-${randomUUID()}`); // the user message of the request
  const respond = (messages) => agentAttempt(db.ledger, run, () => generateText({
    model, tools, messages, stopWhen: [stepCountIs(10), ledgerStopped()] }));
  let messages = [{ role: 'user', content: 'Pay INV-9 in two instalments of 100.' }];
  let sentLast;
  let reply;
  let pauses = 0;
  for (let request = 1; request <= 4; request += 1) {
    sentLast = messages;
    reply = await respond(messages).catch((e) => e);
    if (reply instanceof DivergencePaused) {
      // the second instalment: the first one's call again (tool and input), under a new id, in a later
      // attempt of the run -- to the ledger, maybe the first one named anew: nothing paid, a person decides
      pauses += 1;
      assert.equal(paid.length, 1, 'nothing paid while it waits for a person');
      const first = (await effects(run)).filter((r) => r.tool === 'payInvoice');
      assert.deepEqual(await divergences(run), [{ key: reply.key, tool: 'payInvoice', occurrence: 0,
        candidate_key: first[0].key, verdict: null }], 'the divergence names the first instalment');
      await db.admin.query("SELECT durable_ledger.resolve_divergence($1, 'distinct', 'ap-clerk')", [reply.key]);
      reply = await respond(messages); // the continuation sent again: the same run, the call now performed
    }
    const asks = reply.content.filter((p) => p.type === 'tool-approval-request');
    messages = [...messages, ...reply.responseMessages];
    if (asks.length === 0) break;
    // the user approves: the chat is sent again, with the approval (the same user message: the same run)
    messages.push({ role: 'tool', content: asks.map((a) => ({ type: 'tool-approval-response', approvalId: a.approvalId, approved: true })) });
  }
  assert.equal(pauses, 1, 'one pause, for the second instalment');
  assert.equal(reply.text, 'both paid: PAY-1, PAY-2', 'each instalment got its own payment');
  assert.equal(paid.length, 2, 'the bank paid twice');
  assert.notEqual(paid[0], paid[1], 'two payments, two keys');
  const calls = results(messages, 'payInvoice').map((p) => p.toolCallId);
  const rows = await effects(run);
  assert.deepEqual(rows.map((r) => r.key), calls.map((id) => callKey(run, 'payInvoice', id)),
    'each approved payment is keyed by its tool call id');
  assert.equal((await divergences(run))[0].verdict, 'distinct');

  // the last continuation sent again (its answer was lost): the approved call replays, nothing is paid
  const again = await respond(sentLast);
  assert.equal(again.text, 'both paid: PAY-1, PAY-2');
  assert.equal(paid.length, 2, 'a retried continuation pays nothing');
  assert.equal((await effects(run)).length, 2);
  assert.equal((await divergences(run)).length, 1, 'and pauses nothing');
});

test('the guard: a continuation paid, its answer lost, the request regenerated (the same run) -- the model asks anew, the user approves the new call: it pauses, nothing paid twice; the person\'s same gives the model the first payment', async () => {
  const { paid, tools } = bank();
  // the clerk pays INV-9 once, then says what came back
  const model = new MockLanguageModelV4({
    provider: 'test', modelId: 'clerk',
    doGenerate: async ({ prompt }) => {
      const done = results(prompt, 'payInvoice');
      if (done.length === 0) return calling(toolCall('payInvoice', { invoice: 'INV-9', amount: 4200 }));
      return answer(`paid: ${done.map((p) => p.output.value.paymentId).join(', ')}`);
    },
  });
  const run = requestRun(`chat-${randomUUID()}`, `msg-${randomUUID()}`);
  const respond = (messages) => agentAttempt(db.ledger, run, () => generateText({
    model, tools, messages, stopWhen: [stepCountIs(10), ledgerStopped()] }));
  const user = [{ role: 'user', content: 'Pay INV-9.' }];
  /** the request, then its continuation with the user's approval of the call it asks for */
  const approved = async () => {
    const ask = await respond(user);
    const asks = ask.content.filter((p) => p.type === 'tool-approval-request');
    assert.equal(asks.length, 1);
    return [...user, ...ask.responseMessages, { role: 'tool', content: asks.map((a) => ({
      type: 'tool-approval-response', approvalId: a.approvalId, approved: true })) }];
  };
  const firstContinuation = await approved();
  const first = await respond(firstContinuation);
  assert.equal(first.text, 'paid: PAY-1');
  assert.equal(paid.length, 1);
  // its answer never reached the user (a cut stream, a closed tab): the user regenerates the answer;
  // the model, asked again, names the payment anew, and the user approves it again
  const secondContinuation = await approved();
  const [firstId, secondId] = [firstContinuation, secondContinuation].map((m) => m.at(-2).content
    .find((p) => p.type === 'tool-call').toolCallId);
  assert.notEqual(firstId, secondId, 'a new tool call id');
  const paused = await respond(secondContinuation).catch((e) => e);
  assert.ok(paused instanceof DivergencePaused, `the approved call pauses: ${paused}`);
  assert.equal(paused.key, callKey(run, 'payInvoice', secondId), 'the new call, keyed by its id');
  assert.equal(paid.length, 1, 'not paid again');
  assert.deepEqual(await divergences(run), [{ key: paused.key, tool: 'payInvoice', occurrence: 0,
    candidate_key: callKey(run, 'payInvoice', firstId), verdict: null }],
  'the divergence names the first payment (a call-id key: under a business key it would have replayed or paid)');
  // a person sees it is the same payment: its outcome is the new call's
  await db.admin.query("SELECT durable_ledger.resolve_divergence($1, 'same', 'ap-clerk')", [paused.key]);
  const done = await respond(secondContinuation);
  assert.equal(done.text, 'paid: PAY-1', 'the model reads the first payment\'s result');
  assert.equal(paid.length, 1, 'paid once');
  assert.deepEqual((await effects(run)).filter((r) => r.status !== 'completed'), []);
});

test('A1 with useChat\'s messages: requestRun names each continuation; the receipt each instalment asks for is sent each time, the approved payment keyed by its id; a retried continuation replays', async () => {
  const { paid, receipts, tools } = bank();
  const justPaid = (prompt) => prompt.at(-1).role === 'tool' && prompt.at(-1).content.some((p) => p.type === 'tool-result' && p.toolName === 'payInvoice');
  const chunks = (prompt) => {
    const call = (toolName, input) => streamCalling(toolCall(toolName, input));
    if (justPaid(prompt)) return call('sendReceipt', { invoice: 'INV-9' });
    const done = results(prompt, 'payInvoice');
    if (done.length < 2) return call('payInvoice', { invoice: 'INV-9', amount: 100 });
    const text = `paid ${done.map((p) => p.output.value.paymentId).join(', ')}; receipts ${
      results(prompt, 'sendReceipt').map((p) => p.output.value.receipt).join(', ')}`;
    return streamAnswer(text);
  };
  const model = new MockLanguageModelV4({
    provider: 'test', modelId: 'clerk',
    doStream: async ({ prompt }) => ({ stream: simulateReadableStream({ chunks: chunks(prompt) }) }),
  });
  const chat = `chat-${randomUUID()}`;
  /** the chat route: streams the answer as UIMessage chunks, read here as useChat does */
  const post = async (messages) => {
    const run = requestRun(chat, messages);
    const message = await agentAttempt(db.ledger, run, async () => {
      const result = streamText({ model, tools, messages: await convertToModelMessages(messages),
        stopWhen: [stepCountIs(10), ledgerStopped()] });
      const continued = messages.at(-1).role === 'assistant' ? messages.at(-1) : undefined;
      let last;
      for await (const m of readUIMessageStream({ message: structuredClone(continued),
        stream: result.toUIMessageStream({ originalMessages: messages }) })) last = m;
      return last;
    });
    return { run, history: [...messages.filter((m) => m.id !== message.id), message] };
  };
  /** the user approves every call waiting for approval (useChat's addToolApprovalResponse) */
  const approve = (history) => history.map((m) => (m.role !== 'assistant' ? m : { ...m,
    parts: m.parts.map((p) => (p.state === 'approval-requested'
      ? { ...p, state: 'approval-responded', approval: { ...p.approval, approved: true } } : p)) }));
  const waiting = (history) => history.at(-1).parts.filter((p) => p.state === 'approval-requested').length;

  let history = [{ id: `msg-${randomUUID()}`, role: 'user', parts: [{ type: 'text', text: 'Pay INV-9 in two instalments of 100, a receipt for each.' }] }];
  const runs = [];
  let sent;
  for (let request = 1; request <= 4; request += 1) {
    sent = history;
    const out = await post(history);
    runs.push(out.run);
    history = out.history;
    if (waiting(history) === 0) break;
    history = approve(history);
  }
  const text = history.at(-1).parts.filter((p) => p.type === 'text').map((p) => p.text).join('');
  assert.equal(text, 'paid PAY-1, PAY-2; receipts 1, 2');
  assert.equal(paid.length, 2, 'two payments');
  assert.equal(receipts.length, 2, 'two receipts: the second continuation\'s is not the first one\'s replay');
  assert.equal(runs.length, 3);
  assert.equal(new Set(runs).size, 3, 'the request and its two continuations: three runs');
  assert.equal(runs[0], `request:${JSON.stringify([chat, history[0].id])}`);
  const pays = history.at(-1).parts.filter((p) => p.type === 'tool-payInvoice');
  assert.equal(runs[1], `request:${JSON.stringify([chat, history[0].id, pays[0].toolCallId])}`,
    'a continuation: the request and the last tool call of the answer it continues');
  const second = await effects(runs[2]);
  assert.deepEqual(second.map((r) => r.tool), ['payInvoice', 'sendReceipt']);
  assert.equal(second[0].key, callKey(runs[2], 'payInvoice', pays[1].toolCallId), 'the approved payment: keyed by its id');

  // the last continuation sent again (its stream was cut): the same run, replayed
  const again = await post(sent);
  assert.equal(again.run, runs[2]);
  assert.equal(again.history.at(-1).parts.filter((p) => p.type === 'text').map((p) => p.text).join(''),
    'paid PAY-1, PAY-2; receipts 1, 2');
  assert.equal(paid.length, 2, 'nothing paid again');
  assert.equal(receipts.length, 2, 'nothing mailed again');
});

test('approvedInHistory: a call of this request whose id an earlier turn gave (a model reusing ids) is not taken for an approved one', async () => {
  // a mock-like model that names every call "call-1": the second request's call is new, performed
  const { receipts, tools } = bank();
  const model = new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => (prompt.at(-1).role === 'user'
      ? calling(toolCall('sendReceipt', { invoice: 'INV-9' }, 'call-1'))
      : answer('sent')),
  });
  const chat = `chat-${randomUUID()}`;
  const messages = [{ role: 'user', content: 'Mail the receipt.' }];
  const first = await agentAttempt(db.ledger, requestRun(chat, 'm1'), () => generateText({ model, tools, messages }));
  messages.push(...first.response.messages, { role: 'user', content: 'Mail it again.' });
  await agentAttempt(db.ledger, requestRun(chat, 'm2'), () => generateText({ model, tools, messages }));
  assert.equal(receipts.length, 2);
  const rows = await effects(requestRun(chat, 'm2'));
  assert.equal(rows.length, 1);
  assert.doesNotMatch(rows[0].key, /^call:/, 'keyed by its occurrence');
});

test('requestRun: a continuation (the assistant message sent again after the user message) is named by its last tool call', () => {
  const user = { id: 'm1', role: 'user', parts: [{ type: 'text', text: 'pay' }] };
  assert.equal(requestRun('c', [user]), 'request:["c","m1"]');
  assert.equal(requestRun('c', [user, { id: 'a1', role: 'assistant', parts: [{ type: 'text', text: 'hm' }] }]),
    'request:["c","m1"]', 'no tool call: the request itself');
  assert.equal(requestRun('c', [user, { id: 'a1', role: 'assistant', parts: [
    { type: 'step-start' }, { type: 'tool-payInvoice', toolCallId: 'call_a', state: 'output-available' },
    { type: 'step-start' }, { type: 'dynamic-tool', toolName: 'x', toolCallId: 'call_b', state: 'approval-responded' },
    { type: 'text', text: 'paying' }] }]), 'request:["c","m1","call_b"]');
  assert.equal(requestRun('c', [{ id: 'm0', role: 'user', parts: [] },
    { id: 'a0', role: 'assistant', parts: [{ type: 'tool-payInvoice', toolCallId: 'call_old' }] }, user]),
  'request:["c","m1"]', 'tool calls before the user message do not count');
});
