// The adapter in one process: replays that call nothing, parallel calls of one turn,
// read-only tools (recorded, or passed through), what the model and the app see of a
// stop (an unknown outcome, a pause, a refused tool, an abandoned run), a recorded
// refusal, streamed runs recorded and replayed, the run taken from the RunContext, the
// model provider, and the options the adapter refuses.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { Agent, Runner, ToolCallError, setTracingDisabled, tool } from '@openai/agents';
import { ScriptedModel, assistantMessage, functionCall, modelResponder } from '@openai/agents/testing';
import { z } from 'zod';
import {
  EffectDidNotHappen, EffectPaused, LedgerError, RunAbandoned, RunStopped, ToolRefused,
} from 'durable-ledger';
import { startEffectsServer, makeEffect } from '../../test-support/effects-server.js';
import {
  agentAttempt, currentStop, ledgerModel, ledgerModelProvider, ledgerTool, LedgerModel, requestArgs,
} from '../src/index.js';
import { invoiceAgent, outputText, PROMPT, resultsOf } from './invoice-agent.js';
import { effectsOf, eventsOf, rejection, runId, withLedger } from './target.js';

setTracingDisabled(true);
/** @type {Awaited<ReturnType<typeof startEffectsServer>>} */
let effects;
before(async () => { effects = await startEffectsServer(); });
after(async () => { await effects.close(); });

/**
 * A ScriptedModel of `turns` answers, each from the conversation: `calls` (a list of
 * [name, args]) until the first tool result, then a text quoting the results.
 * @param {Array<[string, Record<string, unknown>]>} calls
 * @param {number} [turns]
 */
function scripted(calls, turns = 4) {
  return new ScriptedModel(Array.from({ length: turns }, () => modelResponder((call) => {
    const results = resultsOf(call.request);
    if (results.length === 0) return calls.map(([name, args], i) => functionCall(name, args, { callId: `call_${i}` }));
    return [assistantMessage(`done: ${results.map((r) => `${r.name}=${outputText(r.output)}`).join('; ')}`)];
  })));
}

/** A Runner that keeps each tool's output (what the model gets). */
function runnerWithOutputs() {
  const runner = new Runner();
  /** @type {string[]} */
  const outputs = [];
  runner.on('agent_tool_end', (_c, _a, t, output) => outputs.push(`${t.name}: ${output}`));
  return { runner, outputs };
}

/** A unique tool name in the ledger (tools registered by a test are the database's). @param {string} name */
const unique = (name) => `${name}_${randomUUID().slice(0, 8)}`;

test('a rerun of a completed run replays every turn and tool: the model and the tools are not called', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('replay');
    const first = invoiceAgent(effects.url);
    const done = await agentAttempt(ledger, run, () => new Runner().run(first.agent, PROMPT));
    assert.equal(first.scripted.calls.length, 2);
    const rows = await effectsOf(admin, run);
    const made = () => effects.calls().filter((c) => rows.some((r) => r.downstream === c.key)).length;
    assert.equal(made(), 2);
    const again = invoiceAgent(effects.url);
    const replayed = await agentAttempt(ledger, run, () => new Runner().run(again.agent, PROMPT));
    assert.equal(replayed.finalOutput, done.finalOutput);
    assert.equal(again.scripted.calls.length, 0, 'no model call');
    assert.equal(made(), 2, 'no effect');
    assert.deepEqual(await eventsOf(admin, run, 'pay_invoice'), ['1:intent', '1:completed', '2:replay']);
  });
});

test('two calls of one turn run in parallel under the token lease, and each is recorded', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('parallel');
    let started = 0;
    /** @type {() => void} */
    let bothStarted = () => {};
    const barrier = new Promise((resolve) => { bothStarted = () => resolve(undefined); });
    const make = (/** @type {string} */ name) => ledgerTool({
      name, description: name, parameters: z.object({ n: z.number() }),
      execute: async (input, _ctx, details) => {
        started += 1;
        if (started === 2) bothStarted();
        // Each waits for the other: they must be running at the same time (a timer
        // fails the test instead of hanging it if they were made one after another).
        let timer;
        await Promise.race([barrier, new Promise((_, reject) => {
          timer = setTimeout(() => reject(new Error(`${name} ran alone`)), 30_000);
        })]).finally(() => clearTimeout(timer));
        return makeEffect(effects.url, name, input, /** @type {string} */ (details.idempotencyKey));
      },
    });
    const model = scripted([['left', { n: 1 }], ['right', { n: 2 }]]);
    const agent = new Agent({ name: 'p', tools: [make('left'), make('right')], model: ledgerModel(model) });
    const result = await agentAttempt(ledger, run, () => new Runner().run(agent, 'go'));
    assert.match(String(result.finalOutput), /left=.*right=/);
    const rows = await effectsOf(admin, run);
    assert.deepEqual(rows.filter((e) => e.tool !== 'model.openai-agents').map((e) => [e.tool, e.status]).sort(),
      [['left', 'completed'], ['right', 'completed']]);
    assert.equal(effects.calls('left').filter((c) => rows.some((r) => r.downstream === c.key)).length, 1);
    assert.equal(effects.calls('right').filter((c) => rows.some((r) => r.downstream === c.key)).length, 1);
  });
});

test("read-only tools: 'record' is recorded and replayed, 'pass' runs every time and the ledger never sees it", async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('reads');
    const looked = { recorded: 0, passed: 0 };
    const recordedName = unique('crm_lookup');
    const tools = () => [
      ledgerTool({
        name: 'lookup', ledgerName: recordedName, description: 'a read', parameters: z.object({ id: z.string() }),
        readOnly: true,
        execute: async ({ id }, _ctx, details) => {
          looked.recorded += 1;
          assert.equal(details.idempotencyKey, null);
          assert.equal(details.run, run);
          return { id, seen: looked.recorded };
        },
      }),
      ledgerTool({
        name: 'clock', description: 'a read not worth recording', parameters: z.object({}), readOnly: 'pass',
        execute: async (_input, _ctx, details) => {
          looked.passed += 1;
          assert.equal(details.run, run);
          return 'noon';
        },
      }),
    ];
    const agent = () => new Agent({ name: 'r', tools: tools(), model: ledgerModel(scripted([['lookup', { id: 'c1' }], ['clock', {}]])) });
    const first = await agentAttempt(ledger, run, () => new Runner().run(agent(), 'look'));
    const second = await agentAttempt(ledger, run, () => new Runner().run(agent(), 'look'));
    assert.deepEqual(looked, { recorded: 1, passed: 2 });
    assert.equal(second.finalOutput, first.finalOutput);
    const rows = await effectsOf(admin, run);
    assert.deepEqual(rows.filter((e) => e.tool === recordedName).map((e) => e.result), [{ id: 'c1', seen: 1 }]);
    assert.equal(rows.filter((e) => e.tool === 'clock').length, 0);
  });
});

test('a model not recorded sees the stop: an unknown outcome, then the pause on the next attempt; agentAttempt throws each', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('seen');
    const payName = unique('bank.pay');
    const pay = ledgerTool({
      name: 'pay_invoice', ledgerName: payName, description: 'Pay', parameters: z.object({ invoice: z.string() }),
      execute: async () => { throw new Error('connection reset by the bank'); },
    });
    // A plain ScriptedModel, not through the ledger: it is asked again after the tool.
    const model = scripted([['pay_invoice', { invoice: 'INV-9' }]]);
    const agent = new Agent({ name: 'u', tools: [pay], model });
    const { runner, outputs } = runnerWithOutputs();
    /** @type {unknown[]} */
    const stopsSeen = [];
    runner.on('agent_tool_end', () => stopsSeen.push(currentStop()?.kind));

    const unknown = await rejection(agentAttempt(ledger, run, () => runner.run(agent, 'pay')));
    assert.ok(unknown instanceof RunStopped, String(unknown));
    assert.equal(unknown.reason, 'outcome unknown');
    assert.match(unknown.message, /is unknown: the tool threw \(connection reset by the bank\)/);
    assert.deepEqual(stopsSeen, ['unknown'], 'currentStop() names it inside the attempt');
    assert.match(outputs[0], new RegExp(`^pay_invoice: The tool ${payName} failed while it was being performed: nobody knows yet`));
    const seen = resultsOf(model.calls[1].request).map((r) => outputText(r.output));
    assert.match(seen[0], /nobody knows yet whether it took effect\. Do not call this tool again/, 'the model saw it');

    const paused = await rejection(agentAttempt(ledger, run, () => runner.run(agent, 'pay')));
    assert.ok(paused instanceof EffectPaused, String(paused));
    assert.match(outputs[1], /^pay_invoice: This call was not performed: the ledger paused it/);
    assert.match(outputText(resultsOf(model.calls[3].request)[0].output), /paused it because an earlier attempt began it/);
    assert.deepEqual((await effectsOf(admin, run)).map((e) => [e.tool, e.status]), [[payName, 'unknown']]);
  });
});

test('a refusal the tool records (EffectDidNotHappen) is text for the model and does not stop the run; replayed as such', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('refusal');
    let tried = 0;
    const make = () => ledgerTool({
      name: 'charge', ledgerName: unique('card.charge'), description: 'Charge', parameters: z.object({ amount: z.number() }),
      execute: async () => { tried += 1; throw new EffectDidNotHappen({ code: 'card_declined' }); },
    });
    const charge = make();
    const agent = new Agent({ name: 'c', tools: [charge], model: ledgerModel(scripted([['charge', { amount: 5 }]])) });
    const { runner, outputs } = runnerWithOutputs();
    const result = await agentAttempt(ledger, run, () => runner.run(agent, 'charge'));
    assert.equal(outputs[0], 'charge: This call failed and nothing was done: {"code":"card_declined"}');
    assert.match(String(result.finalOutput), /card_declined/);
    const again = await agentAttempt(ledger, run, () => runner.run(agent, 'charge'));
    assert.equal(outputs[1], outputs[0], 'the same text on the replay');
    assert.equal(again.finalOutput, result.finalOutput, 'so the next turn replays too');
    assert.equal(tried, 1);
    assert.ok((await effectsOf(admin, run)).some((e) => e.status === 'failed'));
  });
});

test('a refused tool and an abandoned run surface as the typed error, the tool\'s output telling the model', async () => {
  await withLedger(async ({ ledger, admin }) => {
    // Refused: the tool is retired.
    const retired = unique('bank.pay');
    await admin.query("SELECT durable_ledger.register_tool($1, 'test')", [retired]);
    await admin.query("SELECT durable_ledger.retire_tool($1, 'test', 'replaced')", [retired]);
    let paid = 0;
    const pay = (/** @type {string} */ name) => ledgerTool({
      name: 'pay_invoice', ledgerName: name, description: 'Pay', parameters: z.object({ invoice: z.string() }),
      execute: async () => { paid += 1; return 'paid'; },
    });
    let { runner, outputs } = runnerWithOutputs();
    const refusedRun = runId('refused');
    const agent = new Agent({ name: 'x', tools: [pay(retired)], model: ledgerModel(scripted([['pay_invoice', { invoice: 'INV-9' }]])) });
    const refused = await rejection(agentAttempt(ledger, refusedRun, () => runner.run(agent, 'pay')));
    assert.ok(refused instanceof ToolRefused, String(refused));
    assert.match(outputs[0], /^pay_invoice: This call was not performed: the ledger refuses this tool\./);

    // Abandoned: a person abandons the run while it runs (here: from a tool of the
    // first turn); the payment of the next turn is not performed.
    const run = runId('abandoned');
    const abandon = tool({
      name: 'escalate', description: 'x', parameters: z.object({}),
      execute: async () => {
        await admin.query("SELECT durable_ledger.abandon_run($1, 'on-call', 'customer cancelled')", [run]);
        return 'escalated';
      },
    });
    let turn = 0;
    const model = new ScriptedModel(Array.from({ length: 3 }, () => modelResponder(() => {
      turn += 1;
      if (turn === 1) return [functionCall('escalate', {}, { callId: 'e1' })];
      if (turn === 2) return [functionCall('pay_invoice', { invoice: 'INV-9' }, { callId: 'p1' })];
      return [assistantMessage('stopped')];
    })));
    ({ runner, outputs } = runnerWithOutputs());
    const two = new Agent({ name: 'y', tools: [abandon, pay(unique('bank.pay'))], model });
    const abandoned = await rejection(agentAttempt(ledger, run, () => runner.run(two, 'pay')));
    assert.ok(abandoned instanceof RunAbandoned, String(abandoned));
    assert.match(outputs.join('\n'), /^pay_invoice: This call was not performed: a person abandoned this run\./m);
    assert.equal(paid, 0);
    const again = await rejection(agentAttempt(ledger, run, () => runner.run(two, 'pay')));
    assert.ok(again instanceof RunAbandoned, 'a new attempt is refused at once');
  });
});

test('a streamed run is recorded and replayed: the rerun streams the recorded text without asking the model; a plain run replays it too', async () => {
  await withLedger(async ({ ledger }) => {
    const run = runId('stream');
    const runStreamed = async (/** @type {Agent<any, any>} */ agent) => agentAttempt(ledger, run, async () => {
      const streamed = await new Runner().run(agent, PROMPT, { stream: true });
      /** @type {string[]} */
      const deltas = [];
      for await (const event of streamed) {
        if (event.type === 'raw_model_stream_event' && event.data.type === 'output_text_delta') deltas.push(event.data.delta);
      }
      await streamed.completed;
      return { deltas, final: streamed.finalOutput };
    });
    const first = invoiceAgent(effects.url);
    const live = await runStreamed(first.agent);
    assert.equal(first.scripted.calls.length, 2);
    assert.ok(first.scripted.calls.every((c) => c.streamed), 'the model was asked for streams');
    assert.match(String(live.final), /^done: pay_invoice=/);
    assert.equal(live.deltas.join(''), live.final);

    const second = invoiceAgent(effects.url);
    const replayed = await runStreamed(second.agent);
    assert.equal(second.scripted.calls.length, 0, 'the rerun did not ask the model');
    assert.equal(replayed.final, live.final);
    assert.equal(replayed.deltas.join(''), live.final, 'the recorded text was streamed');

    const third = invoiceAgent(effects.url);
    const plain = await agentAttempt(ledger, run, () => new Runner().run(third.agent, PROMPT));
    assert.equal(third.scripted.calls.length, 0);
    assert.equal(plain.finalOutput, live.final);
  });
});

test('the run from the RunContext: a tool may name it from the context the app gave run(); it must be the open attempt\'s', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('context');
    /** @type {Array<string | null>} */
    const runs = [];
    const send = ledgerTool({
      name: 'send_email', ledgerName: unique('mail.send'), description: 'Send', parameters: z.object({ to: z.string() }),
      run: (ctx) => /** @type {{ledgerRun: string}} */ (ctx.context).ledgerRun,
      execute: async (_input, _ctx, details) => { runs.push(details.run); return 'sent'; },
    });
    const agent = new Agent({ name: 'm', tools: [send], model: scripted([['send_email', { to: 'a@b.test' }]]) });
    const ok = await agentAttempt(ledger, run, () => new Runner().run(agent, 'mail', { context: { ledgerRun: run } }));
    assert.match(String(ok.finalOutput), /send_email=sent/);
    assert.deepEqual(runs, [run]);
    assert.equal((await effectsOf(admin, run)).length, 1);

    const other = runId('context-other');
    const wrong = await rejection(agentAttempt(ledger, other, () =>
      new Runner().run(agent, 'mail', { context: { ledgerRun: run } })));
    // the SDK fails the run with its ToolCallError around the ledger's error
    assert.ok(wrong instanceof ToolCallError && wrong.error instanceof LedgerError, String(wrong));
    assert.match(wrong.error.message, /no agentAttempt is open here/);
    assert.deepEqual(runs, [run], 'nothing was performed');
  });
});

test('ledgerModelProvider records the turns of an agent that names its model, under the model\'s name', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('provider');
    /** @type {Array<string | undefined>} */
    const asked = [];
    const model = scripted([['pay_invoice', { invoice: 'INV-9', amount: 4200 }], ['send_email', { to: 'ap@acme.test', subject: 'x' }]]);
    const provider = ledgerModelProvider({ getModel: (name) => { asked.push(name); return model; } });
    const { agent } = invoiceAgent(effects.url);
    const named = agent.clone({ model: 'scripted-1' });
    const result = await agentAttempt(ledger, run, () => new Runner({ modelProvider: provider }).run(named, PROMPT));
    assert.match(String(result.finalOutput), /^done: /);
    assert.ok(asked.includes('scripted-1'));
    const turns = (await effectsOf(admin, run)).filter((e) => e.tool.startsWith('model.'));
    assert.deepEqual(turns.map((e) => e.tool), ['model.openai-agents.scripted-1', 'model.openai-agents.scripted-1']);
    assert.ok(ledgerModel(ledgerModel(model)) instanceof LedgerModel);
    assert.equal(ledgerModel(ledgerModel(model)).model, model, 'a LedgerModel is not wrapped twice');
  });
});

test("a turn's args: the request without its signal, tracing and retry policy, the tools by name", () => {
  const args = requestArgs(/** @type {any} */ ({
    systemInstructions: 'be brief', input: 'hi', modelSettings: { temperature: 0, retry: { policy: () => true } },
    tools: [{ type: 'function', name: 'pay_invoice', parameters: {} }], handoffs: [{ toolName: 'transfer_to_b' }],
    outputType: 'text', tracing: true, signal: new AbortController().signal, _internal: { x: 1 },
  }));
  assert.deepEqual(args, {
    instructions: 'be brief', prompt: null, input: 'hi', previousResponseId: null, conversationId: null,
    tools: ['pay_invoice'], handoffs: ['transfer_to_b'], outputType: 'text', modelSettings: { temperature: 0 },
  });
});

test('what the adapter refuses: a timeout on a side effect, an output schema, a bad readOnly; a tool outside agentAttempt fails the run', async () => {
  const base = { name: 't', description: 't', parameters: z.object({}), execute: async () => 'x' };
  assert.throws(() => ledgerTool({ ...base, timeoutMs: 1000 }), /timeoutMs is refused for a side effect/);
  assert.doesNotThrow(() => ledgerTool({ ...base, timeoutMs: 1000, readOnly: true }));
  assert.throws(() => ledgerTool(/** @type {any} */ ({ ...base, outputSchema: z.object({ a: z.string() }) })), /outputSchema/);
  assert.throws(() => ledgerTool(/** @type {any} */ ({ ...base, readOnly: 'maybe' })), /readOnly must be/);
  assert.throws(() => ledgerTool(/** @type {any} */ ({ ...base, execute: undefined })), /execute must be a function/);

  const agent = new Agent({ name: 'o', tools: [ledgerTool(base)], model: scripted([['t', {}]]) });
  const err = await rejection(new Runner().run(agent, 'go'));
  assert.ok(err instanceof ToolCallError && err.error instanceof LedgerError, String(err));
  assert.match(err.error.message, /no agentAttempt is open here/);
  const recorded = new Agent({ name: 'o2', tools: [], model: ledgerModel(scripted([])) });
  assert.ok(await rejection(new Runner().run(recorded, 'go')) instanceof LedgerError, 'nor may a recorded model');
});
