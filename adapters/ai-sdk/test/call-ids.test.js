// Which call is which (issue 33, the review's F7): a chat whose second user
// message asks for the same tool call again must perform it, while a retry of
// one request must not perform anything twice.  Two shapes do it: the run is
// one request (requestRun: the conversation and the user message it answers),
// with calls keyed by occurrence (the default); or the run is the conversation,
// with recordedModel and keyBy 'recorded-call-id' (a call keyed by the id of
// the recorded turn that made it).  And what keeps the default: a model that is
// not recorded gives new ids on a rerun, a prompt that changed makes new turns,
// and neither may pay twice.  DURABLE_LEDGER_DSN: a superuser connection to a
// database with durable_ledger.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { convertToModelMessages, generateText, simulateReadableStream, stepCountIs, streamText, tool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { z } from 'zod';
import { DivergencePaused, EffectDidNotHappen, EffectFailed, EffectPaused, RunStopped } from 'durable-ledger';
import {
  agentAttempt, durableTools, idempotencyKey, ledgerStopped, recordedModel, requestRun,
} from '../src/index.js';
import {
  answer, calling, cluster, lastToolOutput, streamAnswer, streamCalling, toolCall,
} from './support.js';

const db = cluster();
const unique = (name) => `ai-sdk-ids-${name}-${randomUUID()}`;

/** The reminder clerk: each user message asks for a reminder to ACME; then it says what came back. */
function reminderModel() {
  return new MockLanguageModelV4({
    provider: 'test', modelId: 'reminder-clerk',
    doGenerate: async ({ prompt }) => (prompt.at(-1).role === 'user'
      ? calling(toolCall('sendReminder', { customer: 'ACME' }))
      : answer(`sent: ${JSON.stringify(lastToolOutput(prompt))}`)),
  });
}

/** A mail server that sends whatever it is asked to (it deduplicates nothing). */
function mailer() {
  const sent = [];
  const tools = (options) => durableTools({
    sendReminder: tool({
      description: 'Sends a payment reminder', inputSchema: z.object({ customer: z.string() }),
      execute: async ({ customer }, o) => {
        sent.push({ customer, key: idempotencyKey(o) });
        return { reminder: sent.length };
      },
    }),
  }, options);
  return { sent, tools };
}

/** A bank's payInvoice through durableTools: `pay(input, options)` is its execute (a bank deduplicates nothing). */
const payTools = (pay, options) => durableTools({
  payInvoice: tool({
    description: 'Pays an invoice', inputSchema: z.object({ invoice: z.string(), amount: z.number() }), execute: pay,
  }),
}, options);

/** A chat's history as the AI SDK UI keeps it: UIMessages, each with its id. */
const userMessage = (text) => ({ id: `msg-${randomUUID()}`, role: 'user', parts: [{ type: 'text', text }] });
const assistantMessage = (text) => ({ id: `msg-${randomUUID()}`, role: 'assistant', parts: [{ type: 'text', text }] });

test('F7: a chat whose run is requestRun(chat, messages) sends the reminder the second user message asks for again; a retry of a request sends nothing', async () => {
  const chat = unique('chat');
  const { sent, tools: mailTools } = mailer();
  const tools = mailTools();
  const model = reminderModel();
  /** a chat server's route: one request, the user message it answers its run */
  const respond = (messages) => agentAttempt(db.ledger, requestRun(chat, messages), async () => generateText({
    model, tools, messages: await convertToModelMessages(messages), stopWhen: [stepCountIs(5), ledgerStopped()],
  }));
  const history = [userMessage('Remind ACME to pay.')];
  const first = await respond(history);
  assert.equal(first.text, 'sent: {"type":"json","value":{"reminder":1}}');
  history.push(assistantMessage(first.text), userMessage('A week later: still unpaid, remind ACME again.'));
  const second = await respond(history);
  assert.equal(second.text, 'sent: {"type":"json","value":{"reminder":2}}', 'the second reminder is performed');
  assert.equal(sent.length, 2);
  assert.notEqual(sent[0].key, sent[1].key, 'two reminders, two keys');

  // the client sends the second request again (its answer was lost): the same run, replayed
  const retried = await respond(history);
  assert.equal(retried.text, second.text, 'the recorded output reaches the model');
  assert.equal(sent.length, 2, 'a retry of the request sends nothing again');
  const { rows } = await db.admin.query(
    "SELECT run, status::text FROM durable_ledger.effects WHERE run LIKE 'request:%' AND run LIKE $1 ORDER BY created_at",
    [`%${chat}%`]);
  assert.deepEqual(rows.map((r) => r.run), [requestRun(chat, history.slice(0, 1)), requestRun(chat, history)]);
  assert.equal(requestRun(chat, history), `request:${JSON.stringify([chat, history[2].id])}`);
});

/**
 * The second request of a conversation run asks for the very call the first made: a later
 * attempt, a new call id, the same arguments -- the ledger cannot tell it from the first call
 * named anew (a model asked again after a lost answer), so it pauses it as a divergence,
 * nothing sent; the divergence names the first call's effect.  Returns the paused call's key.
 */
async function pausedAsDivergence(attempt, run, sent) {
  const paused = await attempt().then(() => null, (e) => e);
  assert.ok(paused instanceof DivergencePaused, `the repeated call pauses: ${paused}`);
  assert.equal(sent.length, 1, 'nothing sent while it waits for a person');
  const { rows: [first] } = await db.admin.query(
    "SELECT key FROM durable_ledger.effects WHERE run = $1 AND tool = 'sendReminder'", [run]);
  const { rows } = await db.admin.query(
    'SELECT key, occurrence, candidate_key, verdict FROM durable_ledger.divergences WHERE run = $1', [run]);
  assert.deepEqual(rows, [{ key: paused.key, occurrence: 0, candidate_key: first.key, verdict: null }],
    'the divergence names the earlier reminder');
  return paused.key;
}

test('F7: the conversation as the run, with recordedModel and keyBy "recorded-call-id": the repeated reminder pauses once for a person, who says distinct: performed; a rerun of the second request replays it', async () => {
  const conversation = unique('conversation');
  const { sent, tools: mailTools } = mailer();
  const tools = mailTools({ keyBy: 'recorded-call-id' });
  const messages = [];
  let last;
  const turn = (model) => agentAttempt(db.ledger, conversation, () => generateText({
    model: recordedModel(model), tools, messages, stopWhen: [stepCountIs(5), ledgerStopped()],
  }));
  for (const text of ['Remind ACME to pay.', 'A week later: still unpaid, remind ACME again.']) {
    messages.push({ role: 'user', content: text });
    if (sent.length === 1) {
      // a later request (a later attempt) asks for the same reminder under a new id
      const key = await pausedAsDivergence(() => turn(reminderModel()), conversation, sent);
      await db.admin.query("SELECT durable_ledger.resolve_divergence($1, 'distinct', 'on-call')", [key]);
    }
    last = await turn(reminderModel());
    messages.push(...last.response.messages);
  }
  assert.equal(sent.length, 2, 'reminders actually sent: 2');
  assert.match(last.text, /"reminder":2/);
  const { rows } = await db.admin.query(
    "SELECT key FROM durable_ledger.effects WHERE run = $1 AND tool = 'sendReminder' ORDER BY created_at",
    [conversation]);
  assert.equal(rows.length, 2);
  for (const r of rows) assert.match(r.key, /^call:\[".*","sendReminder","call_[0-9a-f-]{36}"\]$/);

  // the second request again (as after a crash): its turns replay, ids and all, and so does the reminder
  messages.splice(messages.findLastIndex((m) => m.role === 'user') + 1);
  const model = reminderModel();
  const again = await turn(model);
  assert.equal(model.doGenerateCalls.length, 0, 'every turn replayed');
  assert.match(again.text, /"reminder":2/);
  assert.equal(sent.length, 2, 'nothing sent again');
});

test('F7 with streamText: the ids of a recorded stream\'s tool calls key them too (the repeat pauses as a divergence; distinct: performed)', async () => {
  const conversation = unique('stream');
  const { sent, tools: mailTools } = mailer();
  const tools = mailTools({ keyBy: 'recorded-call-id' });
  const streaming = () => new MockLanguageModelV4({
    provider: 'test', modelId: 'streamer',
    doStream: async ({ prompt }) => {
      const chunks = prompt.at(-1).role === 'user'
        ? streamCalling(toolCall('sendReminder', { customer: 'ACME' }))
        : streamAnswer(`sent: ${JSON.stringify(lastToolOutput(prompt))}`);
      return { stream: simulateReadableStream({ chunks }) };
    },
  });
  const messages = [];
  const turn = () => agentAttempt(db.ledger, conversation, async () => {
    const result = streamText({ model: recordedModel(streaming()), tools, messages,
      stopWhen: [stepCountIs(5), ledgerStopped()] });
    await result.consumeStream();
    return result.response;
  });
  for (const text of ['Remind ACME to pay.', 'Remind ACME again.']) {
    messages.push({ role: 'user', content: text });
    if (sent.length === 1) {
      const key = await pausedAsDivergence(turn, conversation, sent);
      assert.match(key, /^call:\[".*","sendReminder","call_[0-9a-f-]{36}"\]$/, 'keyed by the recorded stream\'s call id');
      await db.admin.query("SELECT durable_ledger.resolve_divergence($1, 'distinct', 'on-call')", [key]);
    }
    const response = await turn();
    messages.push(...response.messages);
  }
  assert.equal(sent.length, 2, 'the second request\'s reminder is performed');
  const { rows } = await db.admin.query(
    "SELECT key FROM durable_ledger.effects WHERE run = $1 AND tool = 'sendReminder'", [conversation]);
  for (const r of rows) assert.match(r.key, /^call:\[".*","sendReminder","call_[0-9a-f-]{36}"\]$/);
});

for (const keyBy of ['occurrence', 'recorded-call-id']) {
  test(`keyBy ${keyBy}: a model that is not recorded gives its call a new id on the rerun; the payment whose outcome is unknown still pauses, never paid twice`, async () => {
    const run = unique(`unrecorded-${keyBy}`);
    const payments = [];
    let bankDown = true;
    const tools = payTools(async (input, o) => {
      payments.push(idempotencyKey(o));
      if (bankDown) throw new Error('connection reset by the bank'); // the payment may have gone through
      return { paid: true };
    }, { keyBy });
    const model = new MockLanguageModelV4({
      doGenerate: async ({ prompt }) => (prompt.at(-1).role === 'user'
        ? calling(toolCall('payInvoice', { invoice: 'INV-9', amount: 4200 }))
        : answer('done')),
    });
    const attempt = () => agentAttempt(db.ledger, run, () => generateText({
      model, tools, prompt: 'Pay INV-9.', stopWhen: [stepCountIs(5), ledgerStopped()],
    }));
    const first = await attempt().then(() => null, (e) => e);
    assert.ok(first instanceof RunStopped, `${first}`);
    bankDown = false;
    const second = await attempt().then(() => null, (e) => e);
    assert.ok(second instanceof EffectPaused, `the rerun pauses: ${second}`);
    assert.equal(model.doGenerateCalls.length, 2, 'the model was asked again: a new call id');
    assert.notEqual(model.doGenerateCalls[0], model.doGenerateCalls[1]);
    assert.equal(payments.length, 1, 'not paid again');
    assert.equal(second.downstreamKey, payments[0], 'the pause names the key the bank was given');
  });
}

test('keyBy "recorded-call-id": the payment of a recorded turn whose outcome is unknown pauses on the rerun (the turn replays, its id with it); resolved, it replays', async () => {
  const run = unique('recorded-unknown');
  const payments = [];
  let bankDown = true;
  const tools = payTools(async (input, o) => {
    payments.push(idempotencyKey(o));
    if (bankDown) throw new Error('timeout');
    return { paid: payments.length };
  }, { keyBy: 'recorded-call-id' });
  const model = new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => (prompt.at(-1).role === 'user'
      ? calling(toolCall('payInvoice', { invoice: 'INV-9', amount: 4200 }))
      : answer(`paid: ${JSON.stringify(lastToolOutput(prompt))}`)),
  });
  const attempt = () => agentAttempt(db.ledger, run, () => generateText({
    model: recordedModel(model), tools, prompt: 'Pay INV-9.', stopWhen: [stepCountIs(5), ledgerStopped()],
  }));
  assert.ok(await attempt().then(() => null, (e) => e) instanceof RunStopped);
  bankDown = false;
  const paused = await attempt().then(() => null, (e) => e);
  assert.ok(paused instanceof EffectPaused, `${paused}`);
  assert.equal(model.doGenerateCalls.length, 1, 'the turn was replayed');
  assert.match(paused.key, /^call:\[/, 'keyed by the recorded call id');
  assert.equal(payments.length, 1);
  await db.admin.query("SELECT durable_ledger.resolve_effect($1, 'completed', '{\"paid\": 1}', 'on-call', 'bank has it')",
    [paused.key]);
  const done = await attempt();
  assert.equal(done.text, 'paid: {"type":"json","value":{"paid":1}}');
  assert.equal(payments.length, 1, 'paid once');
});

test('keyBy "recorded-call-id": a payment the bank refused, then the model\'s second try that it took; a rerun replays both, exactly as they were, and pays nothing', async () => {
  const run = unique('refused');
  const payments = [];
  let refuse = true;
  const tools = payTools(async () => {
    if (refuse) {
      refuse = false; // the bank would take it now
      throw new EffectDidNotHappen({ declined: 'insufficient funds' });
    }
    payments.push(1);
    return { paid: payments.length };
  }, { keyBy: 'recorded-call-id' });
  const clerk = () => new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => {
      if (prompt.at(-1).role === 'user') return calling(toolCall('payInvoice', { invoice: 'INV-9', amount: 4200 }));
      const out = lastToolOutput(prompt);
      if (out.type === 'error-text' && !/retry/.test(JSON.stringify(prompt))) {
        // it tries once more, and says so in its text
        return calling({ type: 'text', text: 'I will retry.' }, toolCall('payInvoice', { invoice: 'INV-9', amount: 4200 }));
      }
      return answer(`result: ${JSON.stringify(out)}`);
    },
  });
  const attempt = (model) => agentAttempt(db.ledger, run, () => generateText({
    model: recordedModel(model), tools, prompt: 'Pay INV-9.', stopWhen: [stepCountIs(5), ledgerStopped()],
  }));
  const first = await attempt(clerk());
  assert.equal(first.steps[0].content.find((p) => p.type === 'tool-error').error.message,
    'payInvoice did not happen: {"declined":"insufficient funds"}');
  assert.equal(first.text, 'result: {"type":"json","value":{"paid":1}}');
  assert.equal(payments.length, 1);

  const model = clerk();
  const again = await attempt(model);
  assert.equal(again.steps[0].content.find((p) => p.type === 'tool-error').error.message,
    'payInvoice did not happen: {"declined":"insufficient funds"}', 'the refusal replayed, in the very words');
  assert.equal(model.doGenerateCalls.length, 0, 'so every turn replayed');
  assert.equal(again.text, first.text);
  assert.equal(payments.length, 1, 'the refused call was not made again: paid once');
});

test('keyBy "recorded-call-id": a tool whose own code throws an EffectFailed (another ledger\'s refusal, say) has an unknown outcome, never told to the model as "did not happen"; the rerun pauses it', async () => {
  const run = unique('own-effect-failed');
  const payments = [];
  const tools = payTools(async (input, o) => {
    payments.push(idempotencyKey(o));
    // the tool's own code: the payment went out, then a nested ledger call of the tool failed
    throw new EffectFailed('settlement did not happen: ledger of the bank', { key: 'bank-7', decision: 'execute', replayed: false });
  }, { keyBy: 'recorded-call-id' });
  const model = new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => (prompt.at(-1).role === 'user'
      ? calling(toolCall('payInvoice', { invoice: 'INV-9', amount: 4200 }))
      : answer('done')),
  });
  const steps = [];
  const attempt = () => agentAttempt(db.ledger, run, () => generateText({
    model: recordedModel(model), tools, prompt: 'Pay INV-9.', stopWhen: [stepCountIs(5), ledgerStopped()],
    onStepFinish: (step) => { steps.push(step); },
  }));
  const first = await attempt().then(() => null, (e) => e);
  assert.ok(first instanceof RunStopped, `the app learns the run stopped: ${first}`);
  const shown = steps[0].content.find((p) => p.type === 'tool-error').error;
  assert.equal(shown.name, 'ToolCallStopped', `the model reads the stop: ${shown.message}`);
  assert.equal(shown.stop.kind, 'unknown');
  assert.doesNotMatch(shown.message, /did not happen/, 'not told that the payment did not happen');
  assert.match(shown.message, /nobody knows yet whether it took effect/);
  const paused = await attempt().then(() => null, (e) => e);
  assert.ok(paused instanceof EffectPaused, `the rerun pauses it for a person: ${paused}`);
  assert.match(paused.key, /^call:\[/, 'keyed by the recorded call id');
  assert.equal(payments.length, 1, 'never made again');
});

test('keyBy "occurrence" (the default): a rerun whose prompt changed (a date in the system prompt) makes new turns with new ids, and the payment still replays', async () => {
  const run = unique('drift');
  const payments = [];
  const tools = payTools(async () => { payments.push(1); return { paid: payments.length }; });
  let crash = true;
  const model = new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => {
      if (prompt.at(-1).role === 'user') return calling(toolCall('payInvoice', { invoice: 'INV-1', amount: 4200 }));
      if (crash) throw new Error('the worker died'); // after the payment, before the answer
      return answer('paid');
    },
  });
  const attempt = (day) => agentAttempt(db.ledger, run, () => generateText({
    model: recordedModel(model), tools, system: `Today is ${day}.`, prompt: 'Pay INV-1.',
    stopWhen: [stepCountIs(5), ledgerStopped()],
  }));
  await assert.rejects(attempt('Monday'), /the worker died/);
  crash = false;
  const done = await attempt('Tuesday');
  assert.equal(done.text, 'paid');
  assert.equal(model.doGenerateCalls.length, 4, 'the Tuesday turns are new, with a new call id');
  assert.equal(payments.length, 1, 'paid once: the occurrence key reached Monday\'s payment');
});

test('requestRun names the request, never by a guess; keyBy is checked', () => {
  assert.equal(requestRun('chat-1', 'msg-7'), 'request:["chat-1","msg-7"]');
  assert.equal(requestRun('chat-1', [{ role: 'user', id: 'm1' }, { role: 'assistant', id: 'a1' }]),
    'request:["chat-1","m1"]', 'the last user message (an answer without tool calls continues nothing)');
  assert.throws(() => requestRun('chat-1', [{ role: 'user', content: 'hi' }]), /has no id/);
  assert.throws(() => requestRun('chat-1', [{ role: 'assistant', id: 'a1' }]), /no user message/);
  assert.throws(() => requestRun('', 'm1'), /conversation must be a non-empty string/);
  assert.throws(() => durableTools({}, { keyBy: 'id' }), /keyBy must be/);
});
