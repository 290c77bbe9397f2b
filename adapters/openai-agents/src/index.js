// durable-ledger-openai-agents: at-most-once function tools for the OpenAI
// Agents SDK for JavaScript (@openai/agents), through the durable_ledger
// PostgreSQL extension.  A translation onto the adapters' shared core,
// durable-ledger/agents, which says what a call means:
//
//   ledgerTool({...})          the SDK's tool({...}) whose execution goes through the
//                              ledger: guardedTool (a side effect: the provider's
//                              idempotency key in execute's details), recordedCall (a
//                              read), or nothing (readOnly: 'pass'); a call that stopped
//                              the run becomes the tool's error text for the model (the
//                              SDK's errorFunction), and agentAttempt throws it at its end
//   ledgerModel(model)         a Model whose getResponse and getStreamedResponse are
//                              recorded (recordedCall): a rerun of the run gets the very
//                              answers the first one got, without calling the model
//   ledgerModelProvider(p)     the same for every model a ModelProvider hands out
//                              (new Runner({ modelProvider: ledgerModelProvider(p) }))
//   resumed(state)             a saved RunState whose interrupted calls are marked as
//                              theirs (use it on every resume; needed after an alwaysApprove)
//
// Which call is which: a tool call is keyed by its occurrence in the attempt (the core's
// default: a rerun after a crash makes the calls again, in order, whatever ids the model
// gives them), except where the SDK's id for it (callKey) comes from a saved RunState,
// the same whatever the model would say if asked again: a call a person approved or
// rejected in a resumed state (on its own or with alwaysApprove alike: the SDK binds the
// decision to the call's id), the interrupted calls of a state handed to resumed(state).
// A side effect an alwaysApprove let through, nobody having decided on it, is refused in an
// attempt that did not call resumed(state) (ResumeNotMarked).  The ids of a
// turn ledgerModel recorded key its calls only with ledgerTool's keyBy 'recorded-call-id':
// they come back only while a rerun asks the model the very same (a date in the
// instructions, a changed tool list: a new turn, new ids, and a second payment).
//
// The run: the SDK keeps no durable run id of its own (a RunState carries no id, a
// trace is new on every run()), so the app names it: agentAttempt(ledger, run, () =>
// run(agent, input)), re-exported here; the tools and the model find it there.  A
// tool may take it from the RunContext's context instead (option `run`); it must name
// an agentAttempt that is open.

import { tool, Usage } from '@openai/agents';
import {
  agentAttempt, currentAttempt, currentStop, describe, guardedTool, isStableCallId, noteStableCallIds, recordedCall, stopOf,
  toolError, ToolCallStopped,
} from 'durable-ledger/agents';
import { EffectFailed, EffectInProgress, LedgerError } from 'durable-ledger';

export { agentAttempt, currentAttempt, currentStop, stopOf, toolError, ToolCallStopped };

/** @typedef {import('durable-ledger').Happened | import('durable-ledger').NotHappened | null | undefined} Finding */
/**
 * A tool's lookup at the provider (durable-ledger's Reconcile): what it says of the effect
 * given to it under `downstreamKey`, or null when it cannot tell.  Spelled out here: the
 * client's typedef, named through it, makes tsc refer to a file of the client the package
 * does not export (TS2742).
 * @typedef {(downstreamKey: string, args: any) => Finding | Promise<Finding>} Reconcile
 */
/** @typedef {import('@openai/agents').Model} Model */
/** @typedef {import('@openai/agents').ModelProvider} ModelProvider */
/** @typedef {import('@openai/agents').ModelRequest} ModelRequest */
/** @typedef {import('@openai/agents').ModelResponse} ModelResponse */
/** @typedef {import('@openai/agents').StreamEvent} StreamEvent */
/** @typedef {import('@openai/agents').UnknownContext} UnknownContext */
/** @typedef {import('@openai/agents').ToolInputParameters} ToolInputParameters */
/** @typedef {NonNullable<Parameters<import('@openai/agents').FunctionTool<any, any, any>['invoke']>[2]>} ToolCallDetails */

/**
 * @template Context
 * @typedef {import('@openai/agents').RunContext<Context>} RunContext
 */
/**
 * @template {ToolInputParameters} TParameters
 * @typedef {import('@openai/agents').ToolExecuteArgument<TParameters>} ToolExecuteArgument
 */

/**
 * What a ledger tool's execute gets as its third argument: the SDK's details of the call,
 * and the ledger's.
 * @typedef {ToolCallDetails & {
 *   idempotencyKey: string | null,
 *   run: string | null,
 * }} LedgerToolCallDetails
 *   `idempotencyKey`: the provider's idempotency key of a side effect (the ledger's
 *   downstream key: hand it to the provider, which then performs the effect at most once
 *   too); null for a read (`readOnly`).  `run`: the ledger's run (null: no agentAttempt,
 *   with `readOnly: 'pass'` only).
 */

/**
 * How a ledger tool's call is identified (the AI SDK adapter's option, same names and meaning).
 * - `occurrence` (default): by its tool, canonical input and occurrence in the attempt (the
 *   ledger's derived key), except a call of a resumed RunState (one a person approved or
 *   rejected, per call or with alwaysApprove, or one resumed(state) marked), which is keyed
 *   by its id: the state keeps it.  A rerun after
 *   a crash reaches the first attempt's effects in order, whatever ids the model gives the
 *   calls this time.
 * - `recorded-call-id`: also a call of a model turn ledgerModel recorded or replayed in this
 *   attempt is keyed by its id (callKey(run, tool, id)).  Then a resumed state's later calls
 *   are their own calls, never another's; but only while every rerun asks the model the very
 *   same (the same instructions, tools, input): a turn made anew (a date in the
 *   instructions) gives its calls new ids, and they are performed again.
 * @typedef {'occurrence' | 'recorded-call-id'} KeyBy
 */

/**
 * The ledger's options of a tool, next to the SDK's own.
 * @template {ToolInputParameters} TParameters
 * @template Context
 * @template Result
 * @typedef {object} LedgerToolExtras
 * @property {(input: ToolExecuteArgument<TParameters>, runContext: RunContext<Context>,
 *   details: LedgerToolCallDetails) => Result | Promise<Result>} execute
 *   performs the call: for a side effect, give `details.idempotencyKey` to the provider.
 *   It runs only when the ledger says execute; a replay returns the recorded result
 *   without calling it.  Throw `EffectDidNotHappen` (from durable-ledger) only when the
 *   provider refused before doing anything; any other error leaves the outcome unknown
 *   (paused for a person on the next attempt).
 * @property {((runContext: RunContext<Context>, error: unknown, details?: ToolCallDetails) =>
 *   string | Promise<string>) | null} [errorFunction]  the text the model gets for an
 *   error that did not stop the run (a refusal recorded with EffectDidNotHappen, invalid
 *   input); a stop always gets the ledger's text (ToolCallStopped).  null: such an error
 *   fails the run (the SDK's meaning)
 * @property {string} [ledgerName]  the tool's name in the ledger (default: the SDK tool's name)
 * @property {boolean | 'record' | 'pass'} [readOnly]  false (default): a side effect,
 *   through guardedTool; true or 'record': a read whose answer reaches the model,
 *   recorded and replayed (recordedCall); 'pass': not through the ledger at all
 * @property {(input: ToolExecuteArgument<TParameters>) => string | null} [businessKey]
 *   the operation's identity across runs (an invoice number): the call is then that
 *   operation, whatever run makes it
 * @property {unknown} [meta]  stored with the intent (or a function of the input)
 * @property {Reconcile | null} [reconcile]  settles an unknown outcome from the provider's
 *   record (durable-ledger's reconcilers)
 * @property {(runContext: RunContext<Context>) => string | undefined} [run]  the run from
 *   the RunContext (the context the app gave run()); default, and when it returns
 *   undefined: the current agentAttempt's.  It must name an open agentAttempt
 * @property {KeyBy} [keyBy]  how a call is identified (default 'occurrence'; see KeyBy)
 */

/**
 * ledgerTool's options: the SDK's tool() options (no outputSchema) with the ledger's.
 * @template {ToolInputParameters} TParameters
 * @template Context
 * @template Result
 * @typedef {Omit<import('@openai/agents').ToolOptions<TParameters, Context>,
 *   'execute' | 'errorFunction' | 'outputSchema' | 'parameters'>
 *   & { parameters: TParameters }
 *   & LedgerToolExtras<TParameters, Context, Result>} LedgerToolOptions
 */

/** The SDK's own text for a tool's error (its default errorFunction). */
const SDK_DEFAULT_ERROR = 'An error occurred while running the tool. Please try again.';

/**
 * A function tool of the OpenAI Agents SDK whose every execution goes through the ledger
 * (the SDK's `tool()`, built with these options): a side effect is performed at most once
 * per logical call, its result recorded; a replay (a rerun of the run, a resume) returns
 * the recorded result to the model without calling `execute`; an unknown outcome is
 * paused for a person, never performed again.  A call that stops the run (a pause, an
 * unknown outcome, an abandoned run, a refused tool, a lost lease) is shown to the model
 * as the tool's output (the SDK's errorFunction: not performed, do not call again), and
 * the enclosing agentAttempt throws it at its end.  Call the agent inside
 * `agentAttempt(ledger, run, () => run(agent, input))`.
 *
 * `needsApproval` is the SDK's own: its approval comes first, in the app, before the
 * ledger sees the call; an approved call then goes through the ledger like any other,
 * keyed by its id when the RunState that carries it is resumed (stableCallId).  `keyBy`:
 * see KeyBy.
 * @template {ToolInputParameters} [TParameters=undefined]
 * @template [Context=UnknownContext]
 * @template [Result=unknown]
 * @param {LedgerToolOptions<TParameters, Context, Result>} options
 * @returns {import('@openai/agents').FunctionTool<Context, TParameters, Result>}
 */
export function ledgerTool(options) {
  if (typeof options !== 'object' || options === null) throw new TypeError('ledgerTool(options): options must be an object');
  const {
    execute, errorFunction, ledgerName, readOnly = false, businessKey, meta, reconcile, run: runOf,
    keyBy = 'occurrence', ...sdkOptions
  } = options;
  if (typeof execute !== 'function') throw new TypeError('ledgerTool(): execute must be a function');
  if ('outputSchema' in sdkOptions && /** @type {any} */ (sdkOptions).outputSchema !== undefined) {
    throw new TypeError('ledgerTool(): outputSchema is not supported (a stopped call answers the model with text)');
  }
  const kind = readOnly === true ? 'record' : readOnly === false ? 'effect' : readOnly;
  if (kind !== 'effect' && kind !== 'record' && kind !== 'pass') {
    throw new TypeError("ledgerTool(): readOnly must be true, false, 'record' or 'pass'");
  }
  if (kind === 'effect' && sdkOptions.timeoutMs !== undefined) {
    // The SDK's timeout answers the model while the effect goes on: the model calls the
    // tool again, and the next occurrence is a second effect.
    throw new TypeError('ledgerTool(): timeoutMs is refused for a side effect: a timed-out call may still take ' +
      'effect while the model is told to try again; pass details.signal to the provider instead');
  }
  if (businessKey !== undefined && typeof businessKey !== 'function') {
    throw new TypeError('ledgerTool(): businessKey must be a function (input) => string | null');
  }
  if (runOf !== undefined && typeof runOf !== 'function') {
    throw new TypeError('ledgerTool(): run must be a function (runContext) => string | undefined');
  }
  if (keyBy !== 'occurrence' && keyBy !== 'recorded-call-id') {
    throw new TypeError("ledgerTool(): keyBy must be 'occurrence' or 'recorded-call-id'");
  }
  const byRecordedId = keyBy === 'recorded-call-id';

  /** @type {import('@openai/agents').FunctionTool<Context, TParameters, Result>} */
  let built;
  /**
   * @param {any} input
   * @param {RunContext<Context> | undefined} runContext
   * @param {ToolCallDetails | undefined} details
   */
  const ledgerExecute = async (input, runContext, details) => {
    const context = /** @type {RunContext<Context>} */ (runContext);
    const named = runOf ? runOf(context) : undefined;
    const run = named ?? currentAttempt()?.run ?? null;
    /** @param {string | null} key */
    const detailsFor = (key) => /** @type {LedgerToolCallDetails} */ ({ ...details, idempotencyKey: key, run });
    if (kind === 'pass') return execute(input, context, detailsFor(null));
    const base = {
      tool: ledgerName ?? built.name,
      args: input === undefined ? null : input,
      meta: typeof meta === 'function' ? meta(input) : meta,
      ...(named !== undefined ? { run: named } : {}),
    };
    // The SDK's id of the call, when it is stable (stableCallId): the call is then keyed by
    // it, else by its occurrence in the attempt.
    const callId = stableCallId(built.name, context, details, byRecordedId, kind === 'effect');
    if (kind === 'record') {
      return recordedCall({ ...base, callId, call: () => execute(input, context, detailsFor(null)) });
    }
    return guardedTool({
      ...base,
      callId,
      // a refused call keyed by its id is that refusal again (the core's replayFailure):
      // its id comes back only when a rerun replays the turn or a saved state is resumed
      // again, after which the model may have tried again under another id and paid
      replayFailure: true,
      businessKey: businessKey ? businessKey(input) : null,
      reconcile: reconcile ?? null,
      perform: (key) => execute(input, context, detailsFor(key)),
    });
  };

  built = /** @type {any} */ (tool(/** @type {any} */ ({
    ...sdkOptions,
    execute: ledgerExecute,
    errorFunction: ledgerErrorFunction(errorFunction),
  })));
  return built;
}

/**
 * The SDK's id of a tool call (`details.toolCall.callId`) when the call is keyed by it,
 * else null (the call is then keyed by its occurrence):
 *   - a call of a saved RunState that is resumed, whatever the prompt: one a person
 *     decided on, in whatever way (`state.approve(item)`, `state.approve(item, {
 *     alwaysApprove: true })`: the SDK binds the decision to this id, decidedByAPerson),
 *     or one whose state the app handed to `resumed(state)`: the state keeps the id, the
 *     model is not asked for it again.  So the way a person approved a call, or whether
 *     the app called resumed(), never changes its key;
 *   - a side effect let through by an alwaysApprove and decided on by nobody, in an
 *     attempt that did not call resumed(state): refused (ResumeNotMarked), for it may be
 *     an interrupted call of the state (approved along with another of the tool's calls)
 *     or the model's new call, whose keys differ;
 *   - with keyBy 'recorded-call-id' only, a call of a model turn the ledger recorded or
 *     replayed in this attempt (ledgerModel notes them): a rerun that asks the very same
 *     replays the turn, ids and all.  Not by default: a rerun whose request changed (a date
 *     in the instructions, another tool list) makes the turn anew, with new ids, and keyed
 *     by them the calls would be performed again where their occurrence replays them.
 * An id the model made afresh (a model the ledger does not record) is never one.
 * @param {string} toolName  the SDK tool's name (its approvals are filed under it)
 * @param {RunContext<any> | undefined} context
 * @param {ToolCallDetails | undefined} details
 * @param {boolean} byRecordedId  keyBy 'recorded-call-id'
 * @param {boolean} isEffect  a side effect: a call it cannot place is refused (ResumeNotMarked)
 * @returns {string | null}
 */
function stableCallId(toolName, context, details, byRecordedId, isEffect) {
  const id = /** @type {any} */ (details)?.toolCall?.callId;
  if (typeof id !== 'string' || id === '') return null;
  if (isStableCallId(RESUMED + id) || decidedByAPerson(context, id) || approvedOnItsOwn(toolName, context, id)) return id;
  if (byRecordedId && isStableCallId(id)) return id;
  if (isEffect && !isStableCallId(RESUMED_ATTEMPT) && standingApproval(toolName, context)) {
    // Let through by an alwaysApprove, and no person decided on it: an interrupted call of a
    // resumed state approved with another (its id is the key), or a call the model made after
    // the resume (its occurrence is).  Only resumed(state) says which; keyed by a guess, the
    // next resume of the same state, approved another way, would be another effect.
    throw new ResumeNotMarked(toolName, id);
  }
  return null;
}

/**
 * A call let through by an `alwaysApprove` in an attempt that did not mark the state it
 * resumes (resumed(state)): refused, before the ledger or the tool is touched; it fails the
 * run (it is not the model's to handle).  Resume the state as
 * `agentAttempt(ledger, run, () => runner.run(agent, resumed(state)))`.
 */
export class ResumeNotMarked extends TypeError {
  /**
   * @param {string} toolName
   * @param {string} callId
   */
  constructor(toolName, callId) {
    super(`${toolName} call ${callId} is approved by an alwaysApprove, not by a decision on this call: it may be ` +
      'an interrupted call of the resumed RunState (keyed by its id) or a new call of the model (keyed by its ' +
      'occurrence), and only resumed(state) tells them apart. Resume the state as ' +
      'agentAttempt(ledger, run, () => runner.run(agent, resumed(state))); nothing was done');
    this.name = 'ResumeNotMarked';
    /** @readonly */
    this.toolName = toolName;
    /** @readonly */
    this.callId = callId;
  }
}

/**
 * Whether a person approved or rejected this very call, in whatever way: the SDK binds the
 * id of every call that `state.approve(item)` / `state.approve(item, { alwaysApprove: true })`
 * / `state.reject(...)` was given (RunContext's approval invocations, saved with the RunState
 * and restored with it); a call the standing approval of an alwaysApprove lets through later
 * is not bound.  Such a call is an interruption of a saved state: its id is the state's.
 * The SDK keeps the bindings private (0.20): they are read from its RunState serialization
 * of the context, any agent named alike.
 * @param {RunContext<any> | undefined} context
 * @param {string} id
 * @returns {boolean}
 */
function decidedByAPerson(context, id) {
  const serialize = /** @type {any} */ (context)?._toJSONForRunState;
  if (typeof serialize !== 'function') return false;
  try {
    const json = serialize.call(context, { get: () => 'agent' });
    const bound = Array.isArray(json?.approvalInvocations) ? json.approvalInvocations : [];
    return bound.some((/** @type {any} */ entry) => entry?.invocations &&
      Object.prototype.hasOwnProperty.call(entry.invocations, id));
  } catch {
    return false;
  }
}

/**
 * Whether the tool stands approved for every call (an `alwaysApprove`): a call id nobody
 * was asked about is approved.
 * @param {string} toolName
 * @param {RunContext<any> | undefined} context
 * @returns {boolean}
 */
function standingApproval(toolName, context) {
  if (!context || typeof context.isToolApproved !== 'function') return false;
  try {
    return context.isToolApproved({ toolName, callId: '\u0000durable-ledger-no-such-call' }) === true;
  } catch {
    return false;
  }
}

/**
 * How resumed(state) notes an interrupted call's id in the attempt's stable ids
 * (noteStableCallIds), apart from the ids of ledgerModel's turns: a state's are keyed by
 * their id whatever keyBy says, a turn's only with keyBy 'recorded-call-id'.
 */
const RESUMED = '\u0000durable-ledger-openai-agents:resumed:';
/** Noted by resumed(state): this attempt resumes a state whose interrupted calls are marked. */
const RESUMED_ATTEMPT = '\u0000durable-ledger-openai-agents:resumed-attempt';

/**
 * Whether a person approved this very call (the SDK's per-call approval, restored with
 * its RunState): the call is approved, and a call id nobody was ever asked about is not
 * (an `alwaysApprove` approves every call of the tool, the model's new ones too, so it says
 * nothing of where this call comes from).  decidedByAPerson knows such a call already; this
 * is for where the SDK's binding cannot be read: an SDK without `_toJSONForRunState`, or a
 * state saved with its approval by an SDK whose RunState schema (before 1.18) kept no binding.
 * @param {string} toolName
 * @param {RunContext<any> | undefined} context
 * @param {string} id
 * @returns {boolean}
 */
function approvedOnItsOwn(toolName, context, id) {
  if (!context || typeof context.isToolApproved !== 'function') return false;
  try {
    return context.isToolApproved({ toolName, callId: id }) === true &&
      context.isToolApproved({ toolName, callId: `${id}\u0000durable-ledger-no-such-call` }) !== true;
  } catch {
    return false;
  }
}

/**
 * Marks the calls a saved RunState will run when it is resumed -- its interruptions, the
 * calls a person approved or rejected -- as the calls they are, so that each is keyed by its
 * id (the state keeps it) rather than by its occurrence in the resuming attempt: `await
 * agentAttempt(ledger, run, () => runner.run(agent, resumed(state)))`.  A call a person
 * approved or rejected needs it not (the SDK binds the decision to its id, per call or
 * alwaysApprove alike); a call approved along with it by an `{ alwaysApprove: true }` (two
 * interrupted calls of one tool, one approved so) does, and so does every later call an
 * alwaysApprove lets through: without resumed(state), the ledger cannot tell the one from
 * the other and refuses the call (ResumeNotMarked).  Use it on every resume.  Call it
 * inside the agentAttempt; it returns the state.
 * @template {{ getInterruptions(): Array<{ rawItem?: unknown }> }} S
 * @param {S} state  a RunState (`RunState.fromString(agent, saved)`, or a result's `state`)
 * @returns {S}
 */
export function resumed(state) {
  if (!state || typeof state.getInterruptions !== 'function') {
    throw new TypeError('resumed(state): state must be a RunState');
  }
  if (!currentAttempt()) throw new TypeError('resumed(state): call it inside agentAttempt(ledger, run, () => ...)');
  noteStableCallIds([
    ...callIdsOf(state.getInterruptions().map((item) => item.rawItem)).map((id) => RESUMED + id), RESUMED_ATTEMPT,
  ]);
  return state;
}

/**
 * The call ids of a model's output items (its function calls, and the SDK's other calls).
 * @param {unknown} items
 * @returns {string[]}
 */
function callIdsOf(items) {
  if (!Array.isArray(items)) return [];
  /** @type {string[]} */
  const ids = [];
  for (const item of items) {
    const id = /** @type {any} */ (item)?.callId;
    if (typeof id === 'string' && id !== '') ids.push(id);
  }
  return ids;
}

/**
 * The SDK's errorFunction of a ledger tool: the ledger's text for a call that stopped
 * the run; for other errors the app's errorFunction, or a text of our own for what the
 * ledger recorded (a refusal, another worker's call in progress), or the SDK's default
 * text; an error of the ledger's use (no agentAttempt, a refused statement) fails the run.
 * @template Context
 * @param {((runContext: RunContext<Context>, error: unknown, details?: ToolCallDetails) =>
 *   string | Promise<string>) | null | undefined} own
 * @returns {(runContext: RunContext<Context>, error: unknown, details?: ToolCallDetails) => Promise<string>}
 */
function ledgerErrorFunction(own) {
  return async (runContext, error, details) => {
    const shown = toolError(error);
    if (shown instanceof ToolCallStopped) return shown.message;
    if (error instanceof ResumeNotMarked) throw error;
    if (own === null) throw error;
    if (own) return own(runContext, error, details);
    if (error instanceof EffectFailed) {
      // the same text on a replay: the turn after it must be the one recorded
      return `This call failed and nothing was done: ${describe(error.error)}`;
    }
    if (error instanceof EffectInProgress) {
      return 'This operation is being performed right now by another worker; its result is not known yet. ' +
        'Do not call the tool again now.';
    }
    if (error instanceof LedgerError) throw error;
    return SDK_DEFAULT_ERROR;
  };
}

/**
 * @typedef {object} LedgerModelOptions
 * @property {string} [tool]  the model turns' name in the ledger (default
 *   'model.openai-agents', or 'model.openai-agents.<name>' through ledgerModelProvider)
 * @property {(request: ModelRequest) => unknown} [args]  what identifies a turn (default:
 *   requestArgs: the instructions, the input so far, the tools' and handoffs' names, the
 *   output type and the settings): a turn with the same args in a later attempt is
 *   replayed
 */

/**
 * What identifies a model turn in the ledger (the recorded call's args): the request
 * without what changes from one process to the next (its abort signal, its tracing, the
 * runner's internals) or cannot be JSON (a retry policy), and the tools by name.
 * @param {ModelRequest} request
 * @returns {Record<string, unknown>}
 */
export function requestArgs(request) {
  const { retry, ...settings } = request.modelSettings ?? {};
  return {
    instructions: request.systemInstructions ?? null,
    prompt: request.prompt ?? null,
    input: request.input,
    previousResponseId: request.previousResponseId ?? null,
    conversationId: request.conversationId ?? null,
    tools: (request.tools ?? []).map((t) => t.name),
    handoffs: (request.handoffs ?? []).map((h) => h.toolName),
    outputType: request.outputType ?? null,
    modelSettings: settings,
  };
}

/**
 * A Model whose turns go through the ledger (recordedCall): the first attempt asks the
 * model and records its answer; a later attempt that reaches the same turn (the same
 * instructions and input so far) gets the recorded answer back without asking, so the
 * model "makes" the same tool calls, which the ledger replays (by their occurrence, or by
 * the ids the turn gave them with ledgerTool's keyBy 'recorded-call-id').  Streamed and plain
 * calls record the same thing (the response), so either replays the other; a replayed
 * stream is the response's text and its end (`response_started`, `output_text_delta`
 * per text, `response_done`), not the provider's raw events.  A failed model call stops
 * the attempt (the SDK's retries of it are refused): the next attempt makes it again.
 * @implements {Model}
 */
export class LedgerModel {
  /**
   * @param {Model} model
   * @param {LedgerModelOptions} [options]
   */
  constructor(model, options = {}) {
    if (!model || typeof model.getResponse !== 'function') throw new TypeError('LedgerModel: model must be a Model');
    /** @readonly */
    this.model = model;
    /** @readonly */
    this.tool = options.tool ?? 'model.openai-agents';
    /** @readonly */
    this.argsOf = options.args ?? requestArgs;
    /** @readonly */
    this.supportsPromptModelSelection = model.supportsPromptModelSelection;
  }

  /**
   * @param {ModelRequest} request
   * @returns {Promise<ModelResponse>}
   */
  async getResponse(request) {
    const recorded = await recordedCall({
      tool: this.tool,
      args: this.argsOf(request),
      call: async () => /** @type {RecordedResponse} */ (await this.model.getResponse(request)),
    });
    // recorded (or replayed): a rerun gets these very calls back, with their ids
    noteStableCallIds(callIdsOf(recorded?.output));
    return responseOf(recorded);
  }

  /**
   * @param {ModelRequest} request
   * @returns {AsyncIterable<StreamEvent>}
   */
  async* getStreamedResponse(request) {
    /** @type {Channel<StreamEvent>} */
    const channel = new Channel();
    /** @type {(v: 'live') => void} */
    let began = () => {};
    /** @type {Promise<'live'>} */
    const live = new Promise((resolve) => { began = resolve; });
    const model = this.model;
    const recorded = recordedCall({
      tool: this.tool,
      args: this.argsOf(request),
      call: async () => {
        began('live');
        /** @type {RecordedResponse | null} */
        let done = null;
        try {
          for await (const event of model.getStreamedResponse(request)) {
            if (event.type === 'response_done') {
              const r = /** @type {any} */ (event).response;
              done = {
                usage: r.usage, output: r.output, responseId: r.id,
                ...(r.requestId !== undefined ? { requestId: r.requestId } : {}),
                ...(r.providerData !== undefined ? { providerData: r.providerData } : {}),
              };
            }
            channel.push(event);
          }
        } catch (err) {
          channel.fail(err);
          throw err;
        }
        if (!done) {
          const err = new Error('the model\'s stream ended without a response_done event');
          channel.fail(err);
          throw err;
        }
        channel.end();
        return done;
      },
    });
    const first = await Promise.race([live, recorded]);
    if (first === 'live') {
      yield* channel;
      // its record: a report the ledger did not take fails the turn; one it took makes
      // the turn's call ids stable (the SDK runs the tools after the stream's end)
      noteStableCallIds(callIdsOf((await recorded)?.output));
      return;
    }
    noteStableCallIds(callIdsOf(first?.output));
    yield* replayedStream(responseOf(first));
  }

  /**
   * @param {import('@openai/agents').ModelRetryAdviceRequest} args
   */
  getRetryAdvice(args) {
    return this.model.getRetryAdvice?.(args);
  }
}

/**
 * A ModelResponse as the ledger records it (JSON).
 * @typedef {Omit<ModelResponse, 'usage'> & {usage: unknown}} RecordedResponse
 */

/**
 * The recorded response as the SDK wants it (its usage a Usage again).
 * @param {any} recorded
 * @returns {ModelResponse}
 */
function responseOf(recorded) {
  return { ...recorded, usage: new Usage(recorded?.usage ?? undefined) };
}

/**
 * The stream of a replayed response: its start, its texts, its end.
 * @param {ModelResponse} response
 * @returns {Generator<StreamEvent>}
 */
function* replayedStream(response) {
  yield { type: 'response_started' };
  for (const item of response.output) {
    const message = /** @type {any} */ (item);
    if (message.type !== 'message' || message.role !== 'assistant' || !Array.isArray(message.content)) continue;
    for (const part of message.content) {
      if (part?.type === 'output_text' && typeof part.text === 'string') {
        yield { type: 'output_text_delta', delta: part.text, ...(message.id ? { itemId: message.id } : {}) };
      }
    }
  }
  yield /** @type {StreamEvent} */ ({
    type: 'response_done',
    response: {
      id: response.responseId ?? 'durable-ledger-replayed',
      ...(response.requestId !== undefined ? { requestId: response.requestId } : {}),
      usage: JSON.parse(JSON.stringify(response.usage)),
      output: response.output,
      ...(response.providerData !== undefined ? { providerData: response.providerData } : {}),
    },
  });
}

/**
 * An async queue of one producer and one consumer: the live events of a streamed call.
 * @template T
 */
class Channel {
  constructor() {
    /** @type {T[]} */
    this.items = [];
    this.done = false;
    /** @type {{error: unknown} | null} */
    this.failed = null;
    /** @type {(() => void) | null} */
    this.wake = null;
  }

  /** @param {T} item */
  push(item) {
    this.items.push(item);
    this.#notify();
  }

  end() {
    this.done = true;
    this.#notify();
  }

  /** @param {unknown} error */
  fail(error) {
    this.failed = { error };
    this.#notify();
  }

  #notify() {
    const wake = this.wake;
    this.wake = null;
    wake?.();
  }

  /** @returns {AsyncGenerator<T>} */
  async* [Symbol.asyncIterator]() {
    for (;;) {
      if (this.items.length) {
        yield /** @type {T} */ (this.items.shift());
        continue;
      }
      if (this.failed) throw this.failed.error;
      if (this.done) return;
      await new Promise((resolve) => { this.wake = () => resolve(undefined); });
    }
  }
}

/**
 * Wraps a Model so that its turns are recorded and replayed (LedgerModel); a LedgerModel
 * is returned as it is.
 * @param {Model} model
 * @param {LedgerModelOptions} [options]
 * @returns {LedgerModel}
 */
export function ledgerModel(model, options) {
  return model instanceof LedgerModel ? model : new LedgerModel(model, options);
}

/**
 * @typedef {object} LedgerModelProviderOptions
 * @property {(modelName: string | undefined) => string} [tool]  the turns' name in the
 *   ledger for a model name (default 'model.openai-agents.<name>', or '.default')
 * @property {(request: ModelRequest) => unknown} [args]  see LedgerModelOptions
 */

/**
 * A ModelProvider whose every model is a LedgerModel: `new Runner({ modelProvider:
 * ledgerModelProvider(new OpenAIProvider()) })` records the turns of every agent that
 * names its model (an agent given a Model instance bypasses the provider: wrap that
 * model with ledgerModel).
 * @param {ModelProvider} provider
 * @param {LedgerModelProviderOptions} [options]
 * @returns {ModelProvider}
 */
export function ledgerModelProvider(provider, options = {}) {
  if (!provider || typeof provider.getModel !== 'function') {
    throw new TypeError('ledgerModelProvider(provider): provider must be a ModelProvider');
  }
  const toolOf = options.tool ?? ((name) => `model.openai-agents.${name || 'default'}`);
  return {
    async getModel(modelName) {
      const model = await provider.getModel(modelName);
      return ledgerModel(model, { tool: toolOf(modelName), args: options.args });
    },
  };
}
