// durable-ledger-ai-sdk: at-most-once tools for Vercel's AI SDK (`ai`, 7.x).
//
//   durableTools(tools, options)  the tools of a generateText / streamText /
//       ToolLoopAgent call, each execution through the ledger: a side-effecting
//       tool is performed at most once per logical call (its execute gets the
//       provider's idempotency key as options.idempotencyKey) and replayed from
//       the ledger on a rerun; a read-only one (options.readOnly) is recorded
//       and replayed, so that the model sees on a rerun what it saw.
//   recordedModel(model)  a language model whose turns are recorded: a rerun
//       gets the very answers of the first run and so asks for the same tool
//       calls, which the ledger replays.
//   ledgerStopped()  a stop condition (stopWhen) that ends the loop at the
//       step where a call stopped the run, instead of asking the model again.
//   requestRun(conversation, messages)  the run of one request of a chat: the
//       conversation and the id of the user message the request answers.
//   agentAttempt(ledger, run, fn)  (durable-ledger/agents) the attempt around
//       the call: the tools find their ledger and run there, and a call that
//       stopped the run is thrown at its end as the ledger's typed error.
//
// Which call is which.  A tool call is keyed by its occurrence in the attempt
// (the core's default): right for the AI SDK, which after a crash is called
// again from the start (a model asked again gives new tool call ids), so the
// run must be one request that a retry repeats (requestRun).  A conversation
// may be the run instead with keyBy 'recorded-call-id': a call that a turn of
// recordedModel made is keyed by its id (options.toolCallId, guardedTool's
// callId; a rerun replays the turn, ids and all), so that a later request that
// asks for the same call again does not replay the earlier one: the core's
// call-id guard pauses it once for a person (a later attempt, a new id, the
// call of an earlier effect: maybe that effect named anew), who says distinct
// (performed) or same (replayed).  A rerun replays only while it sends the very
// prompt (a turn made anew gives new ids, which that guard pauses), hence not
// the default.  A call the SDK executes
// because the request brings its approval (needsApproval) is keyed by its id
// under both: it comes from the conversation's history, the same on a retry,
// while the request's occurrences start at 1 again (approvedInHistory).

// The semantics are the core's (durable-ledger/agents): this module only
// translates the AI SDK's shapes.  A call that stopped the run (a pause, an
// unknown outcome, ...) throws a ToolCallStopped from execute: the AI SDK
// turns it into a tool-error part, which the model reads (not performed, do
// not call again) and the developer finds in the step's content.

import { wrapLanguageModel } from 'ai';
import { EffectFailed } from 'durable-ledger';
import {
  agentAttempt, currentAttempt, currentStop, describe, guardedTool, isStableCallId, noteStableCallIds, recordedCall, toolError,
} from 'durable-ledger/agents';

export { agentAttempt, currentAttempt, currentStop, stopOf, ToolCallStopped } from 'durable-ledger/agents';

/** @typedef {import('durable-ledger').Ledger} Ledger */
/** @typedef {import('ai').ToolSet} ToolSet */
/** @typedef {import('ai').Tool} Tool */
/** @typedef {import('ai').ToolExecutionOptions<any>} ToolExecutionOptions */
/** @typedef {import('ai').LanguageModel} LanguageModel */
/** @typedef {import('ai').StopCondition<any>} StopCondition */
/** @typedef {import('ai').LanguageModelMiddleware} Middleware */
/** @typedef {Parameters<NonNullable<Middleware['wrapGenerate']>>[0]['params']} CallOptions */
/** @typedef {Awaited<ReturnType<NonNullable<Middleware['wrapGenerate']>>>} GenerateResult */
/** @typedef {ReturnType<typeof wrapLanguageModel>} WrappedModel */

/**
 * The options of a tool's execution through the ledger: the AI SDK's, and the provider's
 * idempotency key of the call (the ledger's key; key#attempt for a business key).
 * @typedef {ToolExecutionOptions & {idempotencyKey: string}} DurableToolExecutionOptions
 */

/**
 * @typedef {object} DurableToolsOptions
 * @property {Ledger} [ledger]  default: the current agentAttempt's
 * @property {(options: ToolExecutionOptions) => string} [run]  the run of a call (from its
 *   options.context, say); default: the current agentAttempt's
 * @property {ReadonlyArray<string>} [readOnly]  tools that change nothing: recorded and
 *   replayed (record()), never paused; default none: every tool is a side effect
 * @property {Record<string, string>} [names]  the ledger's name of a tool (default: its key
 *   in the record, e.g. "payInvoice")
 * @property {Record<string, (input: any) => string | null>} [businessKey]  a tool's business
 *   key from its input (an operation identity across runs: an invoice number)
 * @property {(name: string, input: unknown) => unknown} [meta]  free JSON stored with each
 *   intent
 * @property {KeyBy} [keyBy]  how a call is identified (default 'occurrence'; see KeyBy)
 */

/**
 * How a tool call is identified in the ledger.  Under both, a call the SDK executes because
 * the request brings its approval (needsApproval) is identified by its tool call id, which
 * comes from the conversation's history, the same on a retry (README: Tool approvals).
 * - `occurrence` (default): by its tool, canonical input and occurrence in the attempt.  A
 *   rerun of the run (a new attempt) reaches the effects of the earlier attempts in order,
 *   whatever ids the model gives its calls; a call asked for again in a later attempt is a
 *   replay.  The run must be one request that a retry repeats from its start (requestRun).
 * - `recorded-call-id`: a call that a turn of recordedModel, in this run, made (or
 *   replayed) is identified by its tool call id (callKey(run, tool, id)); others by their
 *   occurrence.  The run may be a conversation: a later request's call is new (its turn
 *   made a new id); one that repeats an earlier effect of the run (tool and input) pauses
 *   once for a person (DivergencePaused; resolve_divergence: distinct performs it, same
 *   replays it).  Replays only while every rerun sends the very prompt of the attempt it
 *   repeats (no clock in the system prompt): a turn made anew makes new ids, and its calls
 *   that repeat earlier effects pause the same way.  A call that failed (EffectDidNotHappen, or resolved
 *   as failed) is replayed as failed, as under occurrence keys.
 * @typedef {'occurrence' | 'recorded-call-id'} KeyBy
 */

/**
 * The idempotency key of the call `execute` was given by durableTools: pass it downstream
 * (typed access to options.idempotencyKey).
 * @param {ToolExecutionOptions} options
 * @returns {string}
 */
export function idempotencyKey(options) {
  const key = /** @type {Partial<DurableToolExecutionOptions>} */ (options).idempotencyKey;
  if (typeof key !== 'string') {
    throw new TypeError('idempotencyKey(options): this execution did not come through durableTools');
  }
  return key;
}

/**
 * The tools of a call, each execution through the ledger (see the module's comment).
 * A tool with no execute (a client-side tool) is kept as it is.
 * @template {ToolSet} TOOLS
 * @param {TOOLS} tools
 * @param {DurableToolsOptions} [options]
 * @returns {TOOLS}
 */
export function durableTools(tools, options = {}) {
  const readOnly = new Set(options.readOnly ?? []);
  checkKeyBy(options.keyBy);
  for (const name of readOnly) {
    if (!Object.hasOwn(tools, name)) throw new TypeError(`durableTools(): readOnly names no tool "${name}"`);
  }
  /** @type {Record<string, Tool>} */
  const wrapped = {};
  for (const [name, tool] of Object.entries(tools)) {
    wrapped[name] = durableTool(name, tool, { ...options, readOnly: readOnly.has(name) });
  }
  return /** @type {TOOLS} */ (wrapped);
}

/**
 * One tool through the ledger, under `name` (see durableTools).
 * @template {Tool} T
 * @param {string} name
 * @param {T} tool
 * @param {Omit<DurableToolsOptions, 'readOnly'> & {readOnly?: boolean}} [options]
 * @returns {T}
 */
export function durableTool(name, tool, options = {}) {
  const execute = tool.execute;
  checkKeyBy(options.keyBy);
  if (typeof execute !== 'function') return tool;
  const byCallId = options.keyBy === 'recorded-call-id';
  const ledgerName = options.names?.[name] ?? name;
  const businessKey = options.businessKey?.[name];
  /**
   * @param {unknown} input
   * @param {ToolExecutionOptions} callOptions
   */
  const durableExecute = async (input, callOptions) => {
    const ledger = options.ledger;
    const run = options.run?.(callOptions);
    const meta = options.meta?.(name, input);
    // keyed by its id where the request's messages hold the call and its approval (the SDK
    // executes it from the history: a continuation, whose occurrences start again at 1 while
    // the earlier calls are not made again), or where a recorded turn of this run made it
    const callId = approvedInHistory(callOptions)
      || (byCallId && inAttemptRun(ledger, run) && isStableCallId(callOptions.toolCallId))
      ? callOptions.toolCallId : null;
    try {
      if (options.readOnly) {
        return await recordedCall({
          ledger, run, tool: ledgerName, args: input, meta, callId,
          call: () => lastValue(execute.call(tool, input, callOptions)),
        });
      }
      const key = businessKey?.(input) ?? null;
      return await guardedTool({
        // a failed call keyed by its id is replayed as failed, as under occurrence keys: the
        // AI SDK makes no retry of a call, so its id comes again only on a rerun, after which
        // the model may have tried again under another id and paid (the core's replayFailure)
        ledger, run, tool: ledgerName, args: input, meta, callId, businessKey: key, replayFailure: true,
        perform: (k) => lastValue(execute.call(tool, input, { ...callOptions, idempotencyKey: k })),
      });
    } catch (err) {
      const shown = toolError(err);
      // the ledger's recorded failure, in the same words the first time and replayed (a read's
      // too: the model must read the same text on a rerun, or its next turn is made anew); not
      // an EffectFailed the tool's own code threw, which stopped the run (its outcome unknown)
      if (shown === err && callId !== null && err instanceof EffectFailed && !(err.cause instanceof EffectFailed)) {
        throw failed(ledgerName, err);
      }
      throw shown;
    }
  };
  return /** @type {T} */ ({ ...tool, execute: durableExecute });
}

/**
 * Whether the AI SDK executes this call because the request brought its approval: the call
 * is in the request's messages (an assistant message's tool-call part, with the
 * tool-approval-request of that call) and the last message, a tool message, approves it and
 * holds no result of it -- the very test of the SDK's collectToolApprovals.  Such a call was
 * made by a turn of an earlier request, and its id comes from the conversation's history,
 * the same each time the request is sent again: the call is keyed by it.  A call of a turn
 * of this request is never there (execute's messages do not hold the response that made the
 * call), even when a model gives its calls ids an earlier turn gave.
 * @param {ToolExecutionOptions} options
 * @returns {boolean}
 */
function approvedInHistory(options) {
  const id = options.toolCallId;
  /** @type {ReadonlyArray<any>} */
  const messages = Array.isArray(options.messages) ? options.messages : [];
  const last = messages.at(-1);
  if (typeof id !== 'string' || last?.role !== 'tool' || !Array.isArray(last.content)) return false;
  if (last.content.some((/** @type {any} */ p) => p?.type === 'tool-result' && p.toolCallId === id)) return false;
  const approved = new Set(last.content
    .filter((/** @type {any} */ p) => p?.type === 'tool-approval-response' && p.approved === true)
    .map((/** @type {any} */ p) => p.approvalId));
  if (approved.size === 0) return false;
  let requested = false;
  let called = false;
  for (const message of messages) {
    if (message?.role !== 'assistant' || !Array.isArray(message.content)) continue;
    for (const p of message.content) {
      if (p?.type === 'tool-approval-request' && p.toolCallId === id && approved.has(p.approvalId)) requested = true;
      if (p?.type === 'tool-call' && p.toolCallId === id) called = true;
    }
  }
  return requested && called;
}

/** @param {unknown} keyBy */
function checkKeyBy(keyBy) {
  if (keyBy !== undefined && keyBy !== 'occurrence' && keyBy !== 'recorded-call-id') {
    throw new TypeError("durableTools(): keyBy must be 'occurrence' or 'recorded-call-id'");
  }
}

/**
 * The failure of a call keyed by its id as the model reads it, the same the first time
 * and replayed: the tool and the recorded error.
 * @param {string} tool
 * @param {EffectFailed} err  the ledger's (its cause)
 * @returns {EffectFailed}
 */
function failed(tool, err) {
  const text = describe(err.error);
  return new EffectFailed(`${tool} did not happen: ${text}`, {
    key: /** @type {string} */ (err.key), decision: err.decision ?? 'replay', error: err.error, replayed: err.replayed, cause: err,
  });
}

/**
 * Whether a call of (ledger, run), either undefined for the current attempt's, is in the run
 * of the innermost agentAttempt: the one whose recorded turns noteStableCallIds noted.
 * @param {Ledger | undefined} ledger
 * @param {string | undefined} run
 * @returns {boolean}
 */
function inAttemptRun(ledger, run) {
  const attempt = currentAttempt();
  return attempt !== null && (ledger ?? attempt.ledger) === attempt.ledger && (run ?? attempt.run) === attempt.run;
}

/**
 * Notes the ids of the tool calls of a recorded (or replayed) model turn in the current
 * agentAttempt, when the turn was recorded in its run: a rerun replays the turn, so they
 * come back, and durableTools keys those calls by them.
 * @param {Ledger | undefined} ledger
 * @param {string | undefined} run
 * @param {ReadonlyArray<any> | undefined} parts  the turn's content, or its stream's parts
 */
function noteTurn(ledger, run, parts) {
  if (!inAttemptRun(ledger, run) || !Array.isArray(parts)) return;
  noteStableCallIds(parts.filter((p) => p?.type === 'tool-call').map((p) => p.toolCallId));
}

/**
 * The run of one request of a chat, for agentAttempt: the conversation and the id of the
 * user message the request answers (the last user message of `messages`, the AI SDK UI's
 * UIMessage[] whose messages have ids; or that id itself), as
 * `request:["<conversation>","<message id>"]`; and, for a request that continues an answer
 * (useChat sends the assistant message again, after the user message, with a tool approval
 * or a client-side tool's output), the id of the last tool call of that answer:
 * `request:["<conversation>","<message id>","<tool call id>"]`.  A retry of the request (the
 * same messages, sent again after a crash) is the same run and replays what the request did;
 * the next user message, or the next continuation, is another run, so a call it asks for
 * again is performed again.  Throws a TypeError when the last user message has no id (model
 * messages have none): name the request yourself, never by a guess.
 * @param {string} conversation  the chat's id
 * @param {string | ReadonlyArray<{role: string, id?: unknown, parts?: unknown}>} messages  the
 *   request's UIMessages, or the id of the user message it answers
 * @returns {string}
 */
export function requestRun(conversation, messages) {
  if (typeof conversation !== 'string' || conversation === '') {
    throw new TypeError('requestRun(conversation, messages): conversation must be a non-empty string');
  }
  let id = messages;
  /** @type {string | null} */
  let continues = null;
  if (Array.isArray(messages)) {
    let at = messages.length - 1;
    while (at >= 0 && messages[at]?.role !== 'user') at -= 1;
    if (at < 0) throw new TypeError('requestRun(conversation, messages): messages hold no user message');
    id = messages[at].id;
    continues = lastToolCallId(messages.slice(at + 1));
  }
  if (typeof id !== 'string' || id === '') {
    throw new TypeError('requestRun(conversation, messages): the user message the request answers has no id ' +
      '(UIMessages have one, model messages do not): pass the id of that message, or name the run yourself');
  }
  return `request:${JSON.stringify(continues === null ? [conversation, id] : [conversation, id, continues])}`;
}

/**
 * The id of the last tool call of UIMessages (a tool part: `tool-<name>` or `dynamic-tool`),
 * or null.
 * @param {ReadonlyArray<any>} messages
 * @returns {string | null}
 */
function lastToolCallId(messages) {
  /** @type {string | null} */
  let last = null;
  for (const message of messages) {
    if (!Array.isArray(message?.parts)) continue;
    for (const part of message.parts) {
      if (typeof part?.type === 'string' && (part.type.startsWith('tool-') || part.type === 'dynamic-tool')
        && typeof part.toolCallId === 'string' && part.toolCallId !== '') last = part.toolCallId;
    }
  }
  return last;
}

/**
 * What an execute returned: its value, or the last value of a stream of preliminary
 * results (the AI SDK's final output).  Only the final output is recorded and replayed.
 * @param {unknown} result
 * @returns {Promise<unknown>}
 */
async function lastValue(result) {
  const value = await result;
  if (value == null || typeof value !== 'object' || !(Symbol.asyncIterator in value)) return value;
  let last;
  for await (const item of /** @type {AsyncIterable<unknown>} */ (value)) last = item;
  return last;
}

/**
 * A stop condition for generateText / streamText (stopWhen): true once a call of the
 * current agentAttempt stopped the run, so the loop ends at that step instead of asking
 * the model again (agentAttempt then throws the call's error).
 * @returns {StopCondition}
 */
export function ledgerStopped() {
  return () => currentStop() !== null;
}

/**
 * @typedef {object} RecordedModelOptions
 * @property {Ledger} [ledger]  default: the current agentAttempt's
 * @property {string} [run]  default: the current agentAttempt's
 * @property {string} [name]  the ledger's name of the model's turns; default
 *   "model.<provider>.<modelId>"
 */

/**
 * A language model whose turns go through the ledger as recorded calls (record()): the
 * first run's answers are recorded with the call's prompt and settings; a rerun that sends
 * the same gets them back without calling the model, so it asks for the same tool calls.
 * generateText's turns and streamText's (the stream's parts are recorded whole, then
 * replayed as a stream).  The raw request and response bodies are not recorded.
 * @param {LanguageModel} model  a model object (not a gateway id string)
 * @param {RecordedModelOptions} [options]
 * @returns {WrappedModel}
 */
export function recordedModel(model, options = {}) {
  if (typeof model !== 'object' || model === null) {
    throw new TypeError('recordedModel(model): model must be a language model object');
  }
  const inner = /** @type {Parameters<typeof wrapLanguageModel>[0]['model']} */ (model);
  const name = options.name ?? `model.${inner.provider}.${inner.modelId}`;
  /** @param {CallOptions} params */
  const args = (params) => ({
    prompt: params.prompt,
    tools: params.tools,
    toolChoice: params.toolChoice,
    responseFormat: params.responseFormat,
    maxOutputTokens: params.maxOutputTokens,
    temperature: params.temperature,
    topP: params.topP,
    topK: params.topK,
    stopSequences: params.stopSequences,
    seed: params.seed,
    providerOptions: params.providerOptions,
  });
  return wrapLanguageModel({
    model: inner,
    middleware: {
      specificationVersion: 'v4',
      wrapGenerate: async ({ doGenerate, params }) => {
        const recorded = await recordedCall({
          ledger: options.ledger, run: options.run, tool: name, args: args(params),
          call: async () => withoutBodies(await doGenerate()),
        });
        noteTurn(options.ledger, options.run, /** @type {any} */ (recorded)?.content);
        return /** @type {GenerateResult} */ (revive(recorded));
      },
      wrapStream: async ({ doStream, params }) => {
        const recorded = /** @type {{parts: unknown[], response?: unknown}} */ (await recordedCall({
          ledger: options.ledger, run: options.run, tool: name, args: { ...args(params), stream: true },
          call: async () => {
            const { stream, response } = await doStream();
            /** @type {unknown[]} */
            const parts = [];
            const reader = stream.getReader();
            for (;;) {
              const { done, value } = await reader.read();
              if (done) break;
              parts.push(value);
            }
            return { parts, response: response ? { headers: undefined, ...response } : undefined };
          },
        }));
        noteTurn(options.ledger, options.run, recorded.parts);
        const parts = recorded.parts.map(revive);
        return {
          stream: new ReadableStream({
            start(controller) {
              for (const part of parts) controller.enqueue(part);
              controller.close();
            },
          }),
          response: /** @type {any} */ (recorded.response ?? undefined),
        };
      },
    },
  });
}

/**
 * A generate result without what need not be recorded: the raw request and response
 * bodies and headers (large, and a replay does not need them).
 * @param {GenerateResult} result
 */
function withoutBodies(result) {
  const { request, response, ...rest } = result;
  return { ...rest, response: response ? { ...response, body: undefined, headers: undefined } : undefined };
}

/**
 * A recorded value as the AI SDK expects it: the Date a JSON round trip made a string
 * (response.timestamp, a stream's response-metadata part) is a Date again.
 * @param {any} value
 * @returns {any}
 */
function revive(value) {
  if (value == null || typeof value !== 'object') return value;
  if (value.type === 'response-metadata' && typeof value.timestamp === 'string') {
    return { ...value, timestamp: new Date(value.timestamp) };
  }
  if (value.response && typeof value.response.timestamp === 'string') {
    return { ...value, response: { ...value.response, timestamp: new Date(value.response.timestamp) } };
  }
  return value;
}
