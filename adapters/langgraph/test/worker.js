// A worker process of the LangGraph tests: one invocation of an agent on a thread,
// in the thread's attempt (invokeThread), with a PostgresSaver (its checkpoints
// outlive the process, as the ledger does) or a MemorySaver (they do not), and the
// tools' effects sent to the test's effects server, so that the test can SIGKILL it
// in the middle of a tool.
//
//   node test/worker.js <agent> <thread> <input> [saver]
//     agent  invoice: a graph of its own (a model node, LangGraph's ToolNode) whose model
//                     pays an invoice and e-mails its receipt, two tool calls in one step
//            flights: a Deep Agent (createDeepAgent) that searches flights (a read) and
//                     books one (a side effect)
//            subagent: the same, the booking delegated to a `task` subagent
//            fresh:    a graph of its own whose model is NOT recorded and gives each tool call a
//                      new random id each time it is asked (as a provider does); it pays
//                      an invoice.  With GATE_FILE in the environment, its first ask waits
//                      (polling) until that file exists, so that a test stalls the
//                      checkpoint store before the model step ends
//     input  start (the user's message), null (go on from the last checkpoint),
//            resume (Command({resume}) after a person acted)
//     saver  postgres (default) or memory
//   The config has no durability: invokeThread's ('sync') is the one tested.
//   Prints "durability: <what graph.invoke was given>", "model: <n> calls" after each model call, "result: <json>" (the final
//   messages) or "stopped: <error name>: <message>", and "interrupts: <json>".
import { existsSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { z } from 'zod';
import { tool } from '@langchain/core/tools';
import { AIMessage } from '@langchain/core/messages';
import { Command, MemorySaver } from '@langchain/langgraph';
import { PostgresSaver } from '@langchain/langgraph-checkpoint-postgres';
import { createDeepAgent } from 'deepagents';
import { Ledger } from 'durable-ledger';
import { makeEffect } from '../../test-support/effects-server.js';
import { idempotencyKey, invokeThread, ledgerInterrupts, ledgerTools, recordedModel } from '../src/index.js';
import { fakeAnswering, toolLoop } from './helpers.js';

const [agentKind, thread, inputKind, saverKind = 'postgres'] = process.argv.slice(2);
const dsn = /** @type {string} */ (process.env.DURABLE_LEDGER_DSN);
const effectsUrl = /** @type {string} */ (process.env.EFFECTS_URL);
const say = (/** @type {string} */ line) => process.stdout.write(`${line}\n`);

/**
 * A scripted model: what it answers depends on the conversation so far (so that each
 * process, starting its fake anew, answers the turn it is asked), and each answer says
 * which process gave it (`by`), so that a replayed turn shows whose answer it was.
 * @param {(messages: import('@langchain/core/messages').BaseMessage[]) => AIMessage} answer
 */
function scripted(answer) {
  const fake = fakeAnswering((messages) => {
    say(`model: ${fake.callCount} calls`);
    return answer(messages);
  });
  return fake;
}
const by = `worker ${process.pid}`;
/** @param {import('@langchain/core/messages').BaseMessage[]} ms */
const lastOf = (ms) => ms[ms.length - 1];
/** @param {import('@langchain/core/messages').BaseMessage[]} ms @param {string} name */
const answered = (ms, name) => ms.some((m) => m.getType() === 'tool' && m.name === name);

/**
 * A side-effecting tool: says `line`, then sends its args to the effects server's `op` with the
 * ledger's idempotency key.
 * @param {string} op @param {string} name @param {string} description @param {any} schema
 * @param {(args: any) => string} line
 */
const effectTool = (op, name, description, schema, line) => tool(async (args, config) => {
  say(line(args));
  return makeEffect(effectsUrl, op, args, idempotencyKey(config));
}, { name, description, schema });
const pay = effectTool('pay', 'pay_invoice', 'Pays an invoice.', z.object({ invoice: z.string(), amount: z.number() }),
  (a) => `paying ${a.invoice}`);
const sendEmail = effectTool('email', 'send_email', 'Sends an e-mail.', z.object({ to: z.string(), subject: z.string() }),
  (a) => `mailing ${a.to}`);
const searchFlights = tool(async ({ from, to }) => {
  say(`searching ${from}-${to}`);
  const found = await makeEffect(effectsUrl, 'search', { from, to }, `search-${process.pid}`);
  return { flights: [{ flight: 'TP1351', from, to, price: 189, seenBy: found.id }] };
}, {
  name: 'search_flights',
  description: 'Searches flights (changes nothing).',
  schema: z.object({ from: z.string(), to: z.string() }),
});
const bookFlight = effectTool('book', 'book_flight', 'Books a flight for a passenger.',
  z.object({ flight: z.string(), passenger: z.string() }), (a) => `booking ${a.flight}`);

const pool = new pg.Pool({ connectionString: dsn });
const ledger = new Ledger(pool);
/** @type {import('@langchain/langgraph').BaseCheckpointSaver} */
const checkpointer = saverKind === 'memory' ? new MemorySaver() : PostgresSaver.fromConnString(dsn);

/** @type {{invoke: (input: any, config?: any) => Promise<any>, getState: (config: any) => Promise<any>}} */
let graph;
let input;
if (agentKind === 'invoice') {
  const model = recordedModel(scripted((ms) => (lastOf(ms).getType() === 'human'
    ? new AIMessage({
      content: `paying INV-9 (${by})`,
      tool_calls: [
        { name: 'pay_invoice', args: { invoice: 'INV-9', amount: 4200 }, id: `call_pay_${process.pid}`, type: 'tool_call' },
        { name: 'send_email', args: { to: 'ap@example.com', subject: 'INV-9 paid' }, id: `call_mail_${process.pid}`, type: 'tool_call' },
      ],
    })
    : new AIMessage(`INV-9 is paid and its receipt sent (${by})`))));
  const tools = ledgerTools([pay, sendEmail]);
  const bound = model.bindTools(tools);
  graph = toolLoop(tools, (ms) => bound.invoke(ms), { checkpointer });
  input = { messages: [{ role: 'user', content: 'Pay invoice INV-9 (4200) and e-mail ap@example.com' }] };
} else if (agentKind === 'flights' || agentKind === 'subagent') {
  const delegate = agentKind === 'subagent';
  const model = recordedModel(scripted((ms) => {
    const human = ms.filter((m) => m.getType() === 'human');
    const inSubagent = delegate && human.length > 0 && String(human[human.length - 1].content).includes('Book TP1351');
    if (delegate && !inSubagent) {
      // the main agent: search, then delegate the booking to a subagent, then answer
      if (!answered(ms, 'search_flights')) {
        return new AIMessage({ content: '', tool_calls: [{ name: 'search_flights', args: { from: 'SFO', to: 'LIS' }, id: 'call_search', type: 'tool_call' }] });
      }
      if (!answered(ms, 'task')) {
        return new AIMessage({ content: '', tool_calls: [{ name: 'task', args: { subagent_type: 'general-purpose', description: 'Book TP1351 for Marta' }, id: 'call_task', type: 'tool_call' }] });
      }
      return new AIMessage(`Marta is booked on TP1351 (${by})`);
    }
    if (!delegate && !answered(ms, 'search_flights')) {
      return new AIMessage({ content: '', tool_calls: [{ name: 'search_flights', args: { from: 'SFO', to: 'LIS' }, id: 'call_search', type: 'tool_call' }] });
    }
    if (!answered(ms, 'book_flight')) {
      return new AIMessage({ content: '', tool_calls: [{ name: 'book_flight', args: { flight: 'TP1351', passenger: 'Marta' }, id: 'call_book', type: 'tool_call' }] });
    }
    return new AIMessage(`Booked TP1351 for Marta (${by})`);
  }));
  graph = createDeepAgent({
    model,
    tools: ledgerTools([searchFlights, bookFlight], { readOnly: ['search_flights'] }),
    systemPrompt: 'You book flights.',
    checkpointer,
  });
  input = { messages: [{ role: 'user', content: 'Book Marta on a flight from SFO to Lisbon' }] };
} else if (agentKind === 'fresh') {
  const gate = process.env.GATE_FILE;
  const model = scripted((ms) => (lastOf(ms).getType() === 'human'
    ? new AIMessage({
      content: `paying INV-9 (${by})`,
      tool_calls: [{ name: 'pay_invoice', args: { invoice: 'INV-9', amount: 4200 }, id: `call_${randomUUID()}`, type: 'tool_call' }],
    })
    : new AIMessage(`INV-9 is paid (${by})`)));
  const tools = ledgerTools([pay]);
  const bound = model.bindTools(tools);
  graph = toolLoop(tools, async (ms) => {
    if (gate && lastOf(ms).getType() === 'human') {
      say('gate: waiting');
      while (!existsSync(gate)) await new Promise((r) => setTimeout(r, 20));
    }
    return bound.invoke(ms);
  }, { checkpointer });
  input = { messages: [{ role: 'user', content: 'Pay invoice INV-9 (4200)' }] };
} else {
  throw new Error(`unknown agent ${agentKind}`);
}
// what LangGraph is given by invokeThread
const invoke = graph.invoke.bind(graph);
graph.invoke = (i, c) => {
  say(`durability: ${c?.durability}`);
  return invoke(i, c);
};

// no durability: invokeThread runs the graph with 'sync' (each step's checkpoint written
// before the next step starts, so that a kill in the tools step finds the model step
// checkpointed, its tool calls' ids with it)
const config = { configurable: { thread_id: thread } };
/** @param {any[]} messages */
const summary = (messages) => messages.map((m) => ({ type: m.getType(), name: m.name ?? null, content: m.content }));
const what = inputKind === 'start' ? input
  : inputKind === 'null' ? null
    : inputKind === 'resume' ? new Command({ resume: 'resolved' })
      : (() => { throw new Error(`unknown input ${inputKind}`); })();
try {
  const out = await invokeThread(ledger, graph, what, config, { ttl: 60, holder: `worker-${process.pid}` });
  say(`result: ${JSON.stringify(summary(out.messages))}`);
  say(`interrupts: ${JSON.stringify(ledgerInterrupts(out))}`);
} catch (err) {
  const e = /** @type {any} */ (err);
  say(`stopped: ${e?.name}: ${e?.message}`);
  const state = await graph.getState(config);
  say(`state: ${JSON.stringify(summary(state.values.messages ?? []))}`);
  say(`next: ${JSON.stringify(state.next)}`);
  say(`interrupts: ${JSON.stringify(ledgerInterrupts(state))}`);
}
await pool.end();
if ('end' in checkpointer && typeof checkpointer.end === 'function') await checkpointer.end();
