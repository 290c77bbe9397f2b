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
//   agentAttempt(ledger, run, fn)  (durable-ledger/agents) the attempt around
//       the call: the tools find their ledger and run there, and a call that
//       stopped the run is thrown at its end as the ledger's typed error.
//
// The semantics are the core's (durable-ledger/agents): this module only
// translates the AI SDK's shapes.  A call that stopped the run (a pause, an
// unknown outcome, ...) throws a ToolCallStopped from execute: the AI SDK
// turns it into a tool-error part, which the model reads (not performed, do
// not call again) and the developer finds in the step's content.

import { wrapLanguageModel } from 'ai';
import { agentAttempt, currentStop, guardedTool, recordedCall, toolError } from 'durable-ledger/agents';

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
  if (typeof execute !== 'function') return tool;
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
    try {
      if (options.readOnly) {
        return await recordedCall({
          ledger, run, tool: ledgerName, args: input, meta,
          call: () => lastValue(execute.call(tool, input, callOptions)),
        });
      }
      return await guardedTool({
        ledger, run, tool: ledgerName, args: input, meta, businessKey: businessKey?.(input) ?? null,
        perform: (key) => lastValue(execute.call(tool, input, { ...callOptions, idempotencyKey: key })),
      });
    } catch (err) {
      throw toolError(err);
    }
  };
  return /** @type {T} */ ({ ...tool, execute: durableExecute });
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
