// What the LangGraph tests share: the cluster (DURABLE_LEDGER_DSN, a superuser: the
// tests act as the on-call person too), a wait for a condition (polled, never a fixed
// sleep), what a person does (break a dead worker's lease, resolve a paused effect with
// what the downstream system says it did), the effects of a run, the workers
// (test/worker.js), and the agents of the tests: a scripted fake model and a graph of its
// own around it (a model node, LangGraph's ToolNode).
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { fakeModel } from '@langchain/core/testing';
import { END, MemorySaver, MessagesAnnotation, START, StateGraph } from '@langchain/langgraph';
import { ToolNode } from '@langchain/langgraph/prebuilt';
import { PostgresSaver } from '@langchain/langgraph-checkpoint-postgres';
import { Ledger } from 'durable-ledger';
import { runNode, spawnWorker } from '../../test-support/worker.js';
import { recordedModel } from '../src/index.js';

export const DSN = process.env.DURABLE_LEDGER_DSN ?? 'postgresql://postgres@/postgres';
export const WORKER = fileURLToPath(new URL('./worker.js', import.meta.url));

/** @type {pg.Pool | null} */
let pool = null;
export function admin() {
  pool ??= new pg.Pool({ connectionString: DSN, max: 3 });
  return pool;
}
export async function closeAdmin() {
  if (pool) await pool.end();
  pool = null;
}

/**
 * A test file's Ledger, on a pool of its own (`max` connections; no console warnings), and
 * what ends it and the admin pool: `after(close)`.
 * @param {number} max
 */
export function testLedger(max) {
  const pool = new pg.Pool({ connectionString: DSN, max });
  const close = async () => {
    await pool.end();
    await closeAdmin();
  };
  return { ledger: new Ledger(pool, { consoleWarn: false }), close };
}

/** The PostgresSaver's tables, made once (the workers only use them). */
export async function setupCheckpoints() {
  const saver = PostgresSaver.fromConnString(DSN);
  try {
    await saver.setup();
  } finally {
    await saver.end();
  }
}

/**
 * Polls `check` until it returns a truthy value (returned), for at most `seconds`.
 * @template T
 * @param {() => Promise<T> | T} check
 * @param {string} what
 * @param {number} [seconds]
 * @returns {Promise<T>}
 */
export async function waitFor(check, what, seconds = 60) {
  const until = Date.now() + seconds * 1000;
  for (;;) {
    const got = await check();
    if (got) return got;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** @param {string} run */
export async function effectsOf(run) {
  const { rows } = await admin().query(
    'SELECT key, tool, status::text AS status, result FROM durable_ledger.effects WHERE run = $1 ORDER BY created_at, key',
    [run]);
  return rows;
}

/** @param {string} run @param {string} tool */
export async function statusOf(run, tool) {
  const { rows } = await admin().query(
    'SELECT status::text AS status FROM durable_ledger.effects WHERE run = $1 AND tool = $2', [run, tool]);
  return rows.map((r) => r.status);
}

/** The on-call ends a killed worker's token lease (it would stay until its ttl). @param {string} run */
export async function breakLease(run) {
  const { rows } = await admin().query(
    "SELECT durable_ledger.break_lease($1, 'on-call', 'the worker was killed') AS broken", [run]);
  return rows[0].broken;
}

/**
 * A person resolves a paused effect as completed, with what the downstream system says it
 * did under the effect's idempotency key.
 * @param {string} key
 * @param {unknown} result
 */
export async function resolveCompleted(key, result) {
  await admin().query(
    "SELECT durable_ledger.resolve_effect($1, 'completed', $2::jsonb, 'on-call', 'checked the provider by its key')",
    [key, JSON.stringify(result)]);
}

/**
 * Starts a worker on the test's cluster (spawnWorker: a test may SIGKILL it).
 * @param {string[]} args
 * @param {Record<string, string>} env
 */
export function startWorker(args, env) {
  return spawnWorker(WORKER, args, { DURABLE_LEDGER_DSN: DSN, ...env });
}

/**
 * Runs a worker to its end.
 * @param {string[]} args
 * @param {Record<string, string>} env
 */
export async function runWorker(args, env) {
  const done = await runNode(WORKER, args, { DURABLE_LEDGER_DSN: DSN, ...env });
  return { ...done, ...parsed(done.stdout) };
}

/** What a worker printed. @param {string} stdout */
export function parsed(stdout) {
  const result = stdout.match(/^result: (.*)$/m);
  const stopped = stdout.match(/^stopped: (.*)$/m);
  const interrupts = stdout.match(/^interrupts: (.*)$/m);
  const state = stdout.match(/^state: (.*)$/m);
  const next = stdout.match(/^next: (.*)$/m);
  return {
    result: result ? JSON.parse(result[1]) : null,
    stopped: stopped ? stopped[1] : null,
    interrupts: interrupts ? JSON.parse(interrupts[1]) : null,
    state: state ? JSON.parse(state[1]) : null,
    next: next ? JSON.parse(next[1]) : null,
    modelCalls: (stdout.match(/^model: /gm) ?? []).length,
  };
}

/** @param {string} thread */
export const threadConfig = (thread) => ({ configurable: { thread_id: thread } });
/** A user's turn. @param {string} content */
export const userSays = (content) => ({ messages: [{ role: 'user', content }] });
/** A tool call with a new id, as a provider gives. @param {string} name @param {object} args */
export const callOf = (name, args) => ({ name, args, id: `call_${randomUUID()}`, type: /** @type {const} */ ('tool_call') });
/** The tool messages of a tool in what a graph returned. @param {any} out @param {string} name */
export const toolMessages = (out, name) => out.messages.filter((/** @type {any} */ m) => m.getType() === 'tool' && m.name === name);

/**
 * A fake chat model whose every turn (up to `times`) is `answer(messages)`, so that each
 * process, starting its fake anew, answers the turn it is asked.
 * @param {(messages: import('@langchain/core/messages').BaseMessage[]) => import('@langchain/core/messages').AIMessage} answer
 * @param {number} [times]
 */
export function fakeAnswering(answer, times = 20) {
  const fake = fakeModel();
  for (let i = 0; i < times; i += 1) fake.respond(answer);
  return fake;
}

/**
 * A graph of its own: a model node (`ask(messages)`, the turn's AI message), LangGraph's
 * ToolNode, and back to the model until its answer calls no tool.
 * @param {any[]} tools
 * @param {(messages: any[]) => Promise<any>} ask
 * @param {{checkpointer?: any, handleToolErrors?: boolean, toolsRetry?: object, agentRetry?: object}} [opts]
 *   checkpointer: a MemorySaver by default, none when null
 */
export function toolLoop(tools, ask, { checkpointer = new MemorySaver(), handleToolErrors = true, toolsRetry, agentRetry } = {}) {
  return new StateGraph(MessagesAnnotation)
    .addNode('agent', async (state) => ({ messages: [await ask(state.messages)] }), agentRetry ? { retryPolicy: agentRetry } : {})
    .addNode('tools', new ToolNode(tools, { handleToolErrors }), toolsRetry ? { retryPolicy: toolsRetry } : {})
    .addEdge(START, 'agent')
    .addConditionalEdges('agent', (state) => (/** @type {any} */ (state.messages.at(-1)).tool_calls?.length ? 'tools' : END))
    .addEdge('tools', 'agent')
    .compile(checkpointer ? { checkpointer } : {});
}

/**
 * One process's agent: a fake model answering `answer(messages)` (its turns recorded with
 * `record`), bound to the tools, in a toolLoop.
 * @param {any[]} tools
 * @param {(messages: any[]) => import('@langchain/core/messages').AIMessage} answer
 * @param {{record?: boolean} & Parameters<typeof toolLoop>[2]} [opts]
 */
export function scriptedAgent(tools, answer, { record = false, ...loop } = {}) {
  const fake = fakeAnswering(answer);
  const model = (record ? recordedModel(fake) : fake).bindTools(tools);
  return { graph: toolLoop(tools, (ms) => model.invoke(ms), loop), fake };
}
