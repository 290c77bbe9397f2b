// A chat model whose turns are recorded in the ledger (recordedCall): the model is
// asked once per turn of a run, and a later attempt that asks the same turn again --
// a node re-run after a crash whose checkpoint was not written, a subagent run again
// from its start, the whole graph run again after the checkpointer lost the thread --
// gets the recorded answer, so that it makes the very tool calls the first attempt
// made, and the ledger replays them.  Works wherever a chat model instance goes: a
// model node of your own, createReactAgent, createAgent, createDeepAgent.
import { createHash, randomUUID } from 'node:crypto';
import { BaseChatModel } from '@langchain/core/language_models/chat_models';
import { AIMessage } from '@langchain/core/messages';
import { currentAttempt, isStableCallId, noteStableCallIds, recordedCall } from 'durable-ledger/agents';

/** @typedef {import('@langchain/core/messages').BaseMessage} BaseMessage */
/** @typedef {import('@langchain/core/language_models/chat_models').BaseChatModelCallOptions} BaseChatModelCallOptions */

/**
 * @typedef {object} RecordedModelOptions
 * @property {string} [name]  the turns' tool name in the ledger (default "model.<the model's
 *   type>", e.g. "model.anthropic")
 */

/**
 * A message's tool calls as JSON: their names, arguments and ids.
 * @param {any[]} calls
 */
function toolCallsOf(calls) {
  return calls.map((tc) => ({ name: tc.name, args: tc.args, id: tc.id ?? null }));
}

/**
 * A message as it enters the ledger's key: what the model reads of it, without the ids and
 * metadata that differ from one run to the next (a message's id, usage, timings).
 * @param {BaseMessage} m
 */
function canonical(m) {
  /** @type {Record<string, unknown>} */
  const c = { type: m.getType(), content: m.content };
  if (m.name) c.name = m.name;
  const calls = /** @type {any} */ (m).tool_calls;
  if (Array.isArray(calls) && calls.length > 0) c.tool_calls = toolCallsOf(calls);
  const callId = /** @type {any} */ (m).tool_call_id;
  if (callId) c.tool_call_id = callId;
  return c;
}

/**
 * The recorded call's args for a turn: the prompt's digest (the key: the same prompt is
 * the same turn), its length, its last message (for a person reading the ledger) and the
 * tools the model was given.
 * @param {BaseMessage[]} messages
 * @param {string[]} tools
 */
export function turnArgs(messages, tools) {
  const prompt = messages.map(canonical);
  return {
    prompt_sha256: createHash('sha256').update(JSON.stringify(prompt)).digest('hex'),
    messages: prompt.length,
    last: prompt.at(-1) ?? null,
    tools,
  };
}

/**
 * An AI message as JSON, for the ledger.
 * @param {BaseMessage} m
 */
function stored(m) {
  const ai = /** @type {any} */ (m);
  return {
    content: ai.content,
    id: ai.id ?? null,
    name: ai.name ?? null,
    tool_calls: toolCallsOf(ai.tool_calls ?? []),
    invalid_tool_calls: ai.invalid_tool_calls ?? [],
    additional_kwargs: ai.additional_kwargs ?? {},
    response_metadata: ai.response_metadata ?? {},
    usage_metadata: ai.usage_metadata ?? null,
  };
}

/**
 * The AI message a recorded turn answers.
 * @param {any} r
 * @returns {AIMessage}
 */
function restored(r) {
  return new AIMessage({
    content: r.content,
    ...(r.id ? { id: r.id } : {}),
    ...(r.name ? { name: r.name } : {}),
    tool_calls: r.tool_calls.map((/** @type {any} */ tc) => ({ ...tc, id: tc.id ?? undefined, type: 'tool_call' })),
    invalid_tool_calls: r.invalid_tool_calls,
    additional_kwargs: r.additional_kwargs,
    response_metadata: r.response_metadata,
    ...(r.usage_metadata ? { usage_metadata: r.usage_metadata } : {}),
  });
}

/**
 * The turns asked in the current agentAttempt, by run: prompt digest -> the answer's promise.
 * A prompt asked again in one attempt (a model node retried by its retry policy, two tasks
 * asking the very same) gets the answer of its first ask, so that no prompt is ever recorded
 * twice in a run (occurrence 2): a turn is its prompt, whichever attempt asks it, and a rerun
 * or resume that asks it gets that one answer -- the tool calls (and ids) that were acted on.
 * Each entry is the attempt's: a marker noted among its stable call ids (noteStableCallIds)
 * says whether the current attempt is the one that made it.
 * @type {Map<string, {marker: string, turns: Map<string, Promise<any>>}>}
 */
const asked = new Map();
/** How many runs' turns are kept (the oldest are forgotten first). */
const ASKED_RUNS = 1000;

/**
 * The current agentAttempt's turns (empty when it asked none yet), or null outside one.
 * @returns {Map<string, Promise<any>> | null}
 */
function attemptTurns() {
  const attempt = currentAttempt();
  if (!attempt) return null;
  const entry = asked.get(attempt.run);
  if (entry && isStableCallId(entry.marker)) return entry.turns;
  const marker = `durable-ledger-langgraph:turns:${randomUUID()}`;
  noteStableCallIds([marker]);
  const turns = new Map();
  asked.delete(attempt.run);
  asked.set(attempt.run, { marker, turns });
  if (asked.size > ASKED_RUNS) asked.delete(/** @type {string} */ (asked.keys().next().value));
  return turns;
}

/**
 * A chat model whose every turn goes through the ledger as a recorded call of the
 * current agentAttempt (recordedCall): made once, recorded, replayed.  bindTools() binds
 * the tools to the model it wraps and keeps recording.
 */
class RecordedChatModel extends BaseChatModel {
  /**
   * @param {import('@langchain/core/runnables').Runnable<any, any, any>} model  a chat model (or one
   *   with tools bound)
   * @param {RecordedModelOptions & {toolNames?: string[]}} [options]
   */
  constructor(model, options = {}) {
    super({});
    /** the model asked for the turns that are not recorded yet */
    this.model = model;
    const type = typeof (/** @type {any} */ (model)._llmType) === 'function'
      ? /** @type {any} */ (model)._llmType() : model.getName();
    /** the turns' tool name in the ledger */
    this.recordName = options.name ?? `model.${type}`;
    /** @type {string[]} the names of the tools bound to the model */
    this.toolNames = options.toolNames ?? [];
  }

  /** @returns {string} the model's type, as LangChain names it */
  _llmType() {
    return 'durable-ledger-recorded';
  }

  /**
   * @param {any[]} tools
   * @param {any} [kwargs]
   * @returns {any}
   */
  bindTools(tools, kwargs) {
    const inner = /** @type {any} */ (this.model);
    if (typeof inner.bindTools !== 'function') throw new TypeError(`the model ${this.recordName} cannot bind tools`);
    return new RecordedChatModel(inner.bindTools(tools, kwargs), {
      name: this.recordName,
      toolNames: [...this.toolNames, ...tools.map((t) => String(t?.name ?? t?.function?.name ?? ''))],
    });
  }

  /**
   * @param {BaseMessage[]} messages
   * @param {this['ParsedCallOptions']} options
   * @param {unknown} [_runManager]
   * @returns {Promise<import('@langchain/core/outputs').ChatResult>}
   */
  async _generate(messages, options, _runManager) {
    const args = turnArgs(messages, this.toolNames);
    const turns = attemptTurns();
    const id = `${this.recordName}\u0000${args.prompt_sha256}\u0000${JSON.stringify(args.tools)}`;
    let answer = turns?.get(id);
    if (!answer) {
      answer = recordedCall({
        tool: this.recordName,
        args,
        // the wrapped model's own callbacks are none: the turn is reported once, by this
        // model's run, on a first run and on a replay alike (stream mode "messages" too)
        call: async () => stored(await this.model.invoke(messages, { ...options, callbacks: [] })),
      });
      turns?.set(id, answer);
    }
    const message = restored(await answer);
    return { generations: [{ text: message.text, message }] };
  }
}

/**
 * `model` with its turns recorded in the ledger: a chat model whose every turn goes
 * through the ledger as a recorded call of the current agentAttempt (recordedCall), made
 * once, recorded, replayed; its bindTools() binds the tools to `model` and keeps recording.
 * (Typed as its base class: tsc's declarations of a JavaScript subclass of BaseChatModel
 * lose its _llmType.)
 * @param {import('@langchain/core/runnables').Runnable<any, any, any>} model  a chat model
 * @param {RecordedModelOptions} [options]
 * @returns {BaseChatModel}
 */
export function recordedModel(model, options = {}) {
  return new RecordedChatModel(model, options);
}
