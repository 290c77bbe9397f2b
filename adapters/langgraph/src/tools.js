// LangChain tools through the ledger, for LangGraph's ToolNode, createAgent and Deep
// Agents: ledgerTool (a side effect: at most once, replayed), recordedTool (a read:
// recorded, replayed), ledgerTools (a list of both).  Each wrapped tool keeps its name,
// description and schema; it runs its call in the agentAttempt of its thread (the run
// id is the thread id), hands the ledger's idempotency key to the tool it wraps
// (idempotencyKey(config)), returns the recorded output to the model, and turns a call
// that stopped the run into an interrupt (stops.js).
//
// Which call is which: a call is keyed by its tool call's id (config.toolCall.id: the
// ToolNodes of LangGraph and of createAgent / Deep Agents invoke each tool with the tool
// call of a checkpointed AI message), never by its occurrence in the attempt.  LangGraph
// resumes a thread from its checkpoint without making the thread's earlier calls again,
// and retries a node inside one attempt: an occurrence would reach another call's effect
// (a resume) or be a new one (a retry).  A call without a tool call id and without a
// business key is refused, performing nothing (see withoutToolCall).
import { tool } from '@langchain/core/tools';
import { ToolMessage } from '@langchain/core/messages';
import { EffectFailed, LedgerError } from 'durable-ledger';
import { callKey, currentAttempt, guardedTool, recordedCall } from 'durable-ledger/agents';
import { stopAsInterrupt } from './stops.js';

/** Where a wrapped tool hands the ledger's key to the tool it wraps: config.configurable[KEY]. */
export const IDEMPOTENCY_KEY = 'durable_ledger_idempotency_key';

/** @typedef {import('@langchain/core/runnables').RunnableConfig} RunnableConfig */
/** @typedef {import('@langchain/core/tools').StructuredToolInterface} StructuredToolInterface */
/** @typedef {import('@langchain/core/tools').DynamicStructuredTool} DynamicStructuredTool */
/** @typedef {import('./stops.js').OnStop} OnStop */

/**
 * @typedef {object} LedgerToolOptions
 * @property {string} [name]  the tool's name in the ledger (default: the tool's own name)
 * @property {(args: any) => string | null} [businessKey]  an operation's identity across runs
 *   (an invoice number): then the same operation is the same effect whatever the run
 * @property {((downstreamKey: string, args: unknown) => import('durable-ledger').Happened |
 *   import('durable-ledger').NotHappened | null | undefined | Promise<import('durable-ledger').Happened |
 *   import('durable-ledger').NotHappened | null | undefined>) | null} [reconcile]  asks the provider what
 *   happened under the key of an unknown outcome (the client's reconcilers)
 * @property {OnStop} [onStop]  'interrupt' (default) or 'error'
 */

/**
 * @typedef {object} RecordedToolOptions
 * @property {string} [name]  the tool's name in the ledger (default: the tool's own name)
 * @property {OnStop} [onStop]  'interrupt' (default) or 'error'
 */

/**
 * @typedef {object} LedgerToolsOptions
 * @property {string[]} [readOnly]  the names of the tools that change nothing (reads)
 * @property {'record' | 'pass'} [reads]  what becomes of them: 'record' (default: made once,
 *   recorded, replayed, so that a rerun sees what the first run saw) or 'pass' (left as they are)
 * @property {Record<string, (args: any) => string | null>} [businessKeys]  by tool name
 * @property {OnStop} [onStop]  'interrupt' (default) or 'error'
 */

/**
 * The ledger's idempotency key of the call a wrapped tool is performing, from the config
 * the tool was given (its second argument): pass it to the provider.
 * @param {RunnableConfig | undefined} config
 * @returns {string}
 */
export function idempotencyKey(config) {
  const key = config?.configurable?.[IDEMPOTENCY_KEY];
  if (typeof key !== 'string') {
    throw new LedgerError('idempotencyKey(config): this tool call is not performed by ledgerTool(): ' +
      'there is no idempotency key in its config');
  }
  return key;
}

/**
 * The ledger's run of a graph's thread: its thread_id (config.configurable.thread_id).
 * @param {RunnableConfig | undefined} config
 * @returns {string}
 */
export function runIdOf(config) {
  const thread = config?.configurable?.thread_id;
  if (thread === undefined || thread === null || thread === '') {
    throw new TypeError('durable-ledger-langgraph: the config has no configurable.thread_id: the thread id is ' +
      'the ledger\'s run id (give the graph a checkpointer and a thread_id)');
  }
  return String(thread);
}

/**
 * The agentAttempt a tool call of this config runs in: the current one, which must be the
 * thread's own.
 * @param {RunnableConfig | undefined} config
 * @param {string} name
 */
function attemptFor(config, name) {
  const attempt = currentAttempt();
  if (!attempt) {
    throw new LedgerError(`tool ${name}: no agentAttempt is open around the graph: invoke it with ` +
      'invokeThread(ledger, graph, input, config), or inside agentAttempt(ledger, threadId, fn); nothing was performed');
  }
  const thread = config?.configurable?.thread_id;
  if (thread !== undefined && thread !== null && String(thread) !== attempt.run) {
    throw new LedgerError(`tool ${name} runs on thread ${thread}, but the agentAttempt around it is for ` +
      `run ${attempt.run}: the run id must be the thread id; nothing was performed`);
  }
  return attempt;
}

/**
 * The id of the tool call a wrapped tool was invoked with (config.toolCall.id: given by
 * LangGraph's ToolNode, createAgent's and Deep Agents', or by a ToolCall object passed to
 * invoke()), or null.
 * @param {RunnableConfig | undefined} config
 * @returns {string | null}
 */
function toolCallIdOf(config) {
  const id = /** @type {any} */ (config)?.toolCall?.id;
  return typeof id === 'string' && id !== '' ? id : null;
}

/**
 * The error of a wrapped tool invoked without a tool call id (and, for a side effect, without
 * a business key): nothing performed.  Under LangGraph, a node's retry policy runs the node
 * again in the same attempt and a thread's resume runs it again in a new one, so a call known
 * only by its place in the attempt would be a second payment (a retry) or reach another call's
 * effect (a resume).
 * @param {string} name
 * @param {boolean} sideEffect
 */
function withoutToolCall(name, sideEffect) {
  return new LedgerError(`tool ${name} was invoked without a tool call id${sideEffect ? ' and without a business key' : ''}; ` +
    'nothing was performed. A LangGraph node that is retried or resumed runs again, and such a call cannot be told from a ' +
    `new one. Invoke it with a tool call whose id stays the same each time the node runs for this call: tool.invoke({ id, ` +
    `name: '${name}', args, type: 'tool_call' }, config), its id kept in the graph's state (not a new random one)` +
    (sideEffect ? ', or give the tool a businessKey (ledgerTool(tool, { businessKey: (args) => ... }))'
      : ', or call the read without the ledger (ledgerTools(..., { reads: \'pass\' }))'));
}

/**
 * What the tool call records with its intent (meta): where in the graph it was made.
 * @param {RunnableConfig | undefined} config
 * @param {string | null} callId  toolCallIdOf(config)
 */
function whereFrom(config, callId) {
  return {
    thread_id: config?.configurable?.thread_id ?? null,
    checkpoint_ns: config?.configurable?.checkpoint_ns ?? '',
    tool_call_id: callId,
  };
}

/**
 * Invokes the wrapped tool with the call's config (without its tool call, so that it
 * answers its output rather than a ToolMessage), the key in its configurable.
 * @param {StructuredToolInterface} inner
 * @param {unknown} input
 * @param {RunnableConfig | undefined} config
 * @param {string | null} key
 */
async function callInner(inner, input, config, key) {
  const { toolCall: _ignored, ...rest } = /** @type {RunnableConfig & {toolCall?: unknown}} */ (config ?? {});
  const configurable = key === null ? rest.configurable : { ...rest.configurable, [IDEMPOTENCY_KEY]: key };
  const out = await inner.invoke(/** @type {any} */ (input), { ...rest, configurable });
  return ToolMessage.isInstance(out) ? out.content : out;
}

/**
 * The wrapped tool's fields: the inner tool's name, description and schema.
 * @param {StructuredToolInterface} inner
 * @param {(input: any, config: RunnableConfig) => Promise<any>} fn
 * @returns {DynamicStructuredTool}
 */
function sameTool(inner, fn) {
  const fields = {
    name: inner.name,
    description: inner.description,
    schema: /** @type {any} */ (inner.schema),
    returnDirect: inner.returnDirect,
  };
  return /** @type {DynamicStructuredTool} */ (/** @type {unknown} */ (
    tool(/** @type {any} */ (fn), /** @type {any} */ (fields))));
}

/**
 * A call that did not happen (EffectFailed: its provider refused it, or a person resolved it
 * as not done) told the model in words that depend on the recorded refusal only: the same
 * when it is made and when a later attempt replays it.  The model's next turn is recorded by
 * its prompt (recordedModel), the tool's message included: a thread started over must ask it
 * the very same prompt to get the recorded answer, and the calls whose ids it holds, back --
 * other words (the client's replay says it differently) would be a new turn, new ids, and the
 * payment the model made after the refusal made again.
 * @template T
 * @param {string} name
 * @param {Promise<T>} call
 * @returns {Promise<T>}
 */
async function sameRefusal(name, call) {
  try {
    return await call;
  } catch (err) {
    if (!(err instanceof EffectFailed)) throw err;
    const error = err.error;
    const told = typeof error === 'string' ? error : JSON.stringify(error ?? null);
    throw new EffectFailed(`${name} did not happen (nothing was done): ${told}`, {
      key: /** @type {string} */ (err.key), decision: /** @type {string} */ (err.decision), reason: err.reason ?? null,
      error, replayed: err.replayed, cause: err,
    });
  }
}

/**
 * A side-effecting tool through the ledger: each tool call (its id, config.toolCall.id, on its
 * thread: the run) is performed at most once, or each operation of a business key; the tool it
 * wraps gets the idempotency key (idempotencyKey(config)); a replay -- a node retried or re-run
 * after a crash, a resumed thread, the whole graph run again with its model turns recorded --
 * returns the recorded output without calling it; a call
 * that stops the run (a pause for a person, an unknown outcome, an abandoned run, a
 * refused tool, a lost lease) interrupts the graph (see OnStop), and its agentAttempt
 * throws the stop at its end.
 * @param {StructuredToolInterface} inner
 * @param {LedgerToolOptions} [options]
 * @returns {DynamicStructuredTool}
 */
export function ledgerTool(inner, options = {}) {
  const name = options.name ?? inner.name;
  const onStop = options.onStop ?? 'interrupt';
  return sameTool(inner, async (input, config) => {
    const attempt = attemptFor(config, inner.name);
    const businessKey = options.businessKey?.(input) ?? null;
    const callId = toolCallIdOf(config);
    if (businessKey === null && callId === null) throw withoutToolCall(inner.name, true);
    return stopAsInterrupt(() => sameRefusal(name, guardedTool({
      ledger: attempt.ledger,
      run: attempt.run,
      tool: name,
      args: input,
      businessKey,
      callId,
      // a call its provider refused (EffectDidNotHappen) is made again by a retry of the
      // node inside this attempt (its retryPolicy: the model has seen nothing yet), and
      // replayed as refused by a later attempt (a resume, the thread started over): the
      // model saw the refusal and may have made the payment under another id since
      replayFailure: 'earlier-attempts',
      reconcile: options.reconcile ?? null,
      meta: whereFrom(config, callId),
      perform: (key) => callInner(inner, input, config, key),
    })), {
      tool: name, run: attempt.run, onStop, config, toolCallId: callId,
      effectKey: () => businessKey ?? callKey(attempt.run, name, /** @type {string} */ (callId)),
    });
  });
}

/**
 * A tool that changes nothing (a read, a search) through the ledger: each tool call (its id)
 * made once, its output recorded, and replayed to every later attempt of the thread that
 * makes that tool call again, so that a rerun sees what the first run saw (a new tool call,
 * a later turn's, reads afresh).
 * @param {StructuredToolInterface} inner
 * @param {RecordedToolOptions} [options]
 * @returns {DynamicStructuredTool}
 */
export function recordedTool(inner, options = {}) {
  const name = options.name ?? inner.name;
  const onStop = options.onStop ?? 'interrupt';
  return sameTool(inner, async (input, config) => {
    const attempt = attemptFor(config, inner.name);
    const callId = toolCallIdOf(config);
    if (callId === null) throw withoutToolCall(inner.name, false);
    return stopAsInterrupt(() => recordedCall({
      ledger: attempt.ledger,
      run: attempt.run,
      tool: name,
      args: input,
      callId,
      meta: whereFrom(config, callId),
      call: () => callInner(inner, input, config, null),
    }), { tool: name, run: attempt.run, onStop, config, toolCallId: callId });
  });
}

/**
 * A list of tools through the ledger: each a ledgerTool, but those named in `readOnly`,
 * which are recorded (recordedTool) or left as they are (`reads: 'pass'`).
 * @param {StructuredToolInterface[]} tools
 * @param {LedgerToolsOptions} [options]
 * @returns {StructuredToolInterface[]}
 */
export function ledgerTools(tools, options = {}) {
  const readOnly = new Set(options.readOnly ?? []);
  const reads = options.reads ?? 'record';
  if (reads !== 'record' && reads !== 'pass') throw new TypeError("ledgerTools(): reads must be 'record' or 'pass'");
  const names = new Set(tools.map((t) => t.name));
  for (const n of readOnly) {
    if (!names.has(n)) throw new TypeError(`ledgerTools(): readOnly names ${n}, which is not one of the tools`);
  }
  return tools.map((t) => {
    if (!readOnly.has(t.name)) {
      return ledgerTool(t, { businessKey: options.businessKeys?.[t.name], onStop: options.onStop });
    }
    return reads === 'pass' ? t : recordedTool(t, { onStop: options.onStop });
  });
}
