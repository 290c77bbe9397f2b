// durable-ledger/agents: the core the agent-framework adapters share
// (adapters/: the AI SDK, LangGraph.js and Deep Agents, the OpenAI Agents SDK,
// the Claude Agent SDK, the MCP gateway).  Each adapter only translates: where
// its framework keeps the run id, how a tool's execution reaches guarded(),
// and how a stop becomes its framework's own outcome (a tool error, an
// interrupt, an MCP error result).  What a call means stays here, once:
//
//   agentAttempt(ledger, run, [options,] fn)  one attempt at a run, around the
//       framework's own invocation (generateText, graph.invoke, run(agent));
//       the tools called inside find their ledger and run through it.  A
//       framework turns a tool's error into a message for the model and goes
//       on, so the attempt remembers the first call that stopped the run (a
//       pause, an unknown outcome, an abandoned run, a refused tool, a lost
//       lease) and throws it at its end: the app always learns that a person
//       must act, or that the run must not be retried.
//   guardedTool({tool, args, perform, ...})  one side-effecting tool call.
//   recordedCall({tool, args, call, ...})  a model turn or a read, replayed.
//   callId (both)  the framework's own id of the tool call, for frameworks that
//       resume from a checkpoint instead of re-running from the start: the call
//       is then identified by its id (callKey), not by its occurrence.
//   noteStableCallIds(ids) / isStableCallId(id)  the ids of tool calls that a
//       recorded model turn made: they come back while a rerun asks the model the
//       very same (an adapter keys by them only on the app's opt-in).
//   stopOf(err)  what an error means for the run: a kind, a text for the model
//       (which must not call the tool again) and what a person must do.
//   toolError(err)  the error a framework shows the model: a ToolCallStopped
//       (its message the text for the model, its cause the ledger's error)
//       for a stop, else err itself.
//   currentStop()  the first stop of the current agentAttempt (a framework's
//       stop condition asks it to end the loop there).

import { AsyncLocalStorage } from 'node:async_hooks';
import {
  AwaitingApproval, BudgetExhausted, DivergencePaused, EffectDidNotHappen, EffectFailed, EffectPaused, LeaseLost,
  LedgerError, RunAbandoned, RunStopped, ToolRefused,
} from './errors.js';
import { callKey } from './call-key.js';
import { describe } from './text.js';

// a value as the text a model or a person reads (a string as it is, else its JSON): for the
// adapters' own wordings of a recorded error, the same the first time and replayed
export { describe };
// the business key of a tool call the framework names by an id (guardedTool's callId)
export { callKey };

/** @typedef {import('./ledger.js').Ledger} Ledger */
/** @typedef {import('./token-lease.js').TokenLease} TokenLease */

/**
 * What a stop means for the run.
 * - `paused`: the ledger paused the call for a person (an unknown outcome of an earlier
 *   attempt, a divergence, an approval, a budget); the run waits until they decide.
 * - `unknown`: the tool threw while performing: nobody knows whether the effect happened;
 *   the next attempt pauses it for a person.
 * - `stopped`: an earlier call of this attempt stopped the run; this one did nothing.
 * - `abandoned`: a person abandoned the run: never retry it.
 * - `refused`: the ledger refuses the tool (retired, or unregistered where it must be).
 * - `lease-lost`: the attempt's lease is gone; a new attempt replays what is done.
 * @typedef {'paused' | 'unknown' | 'stopped' | 'abandoned' | 'refused' | 'lease-lost'} StopKind
 */

/**
 * @typedef {object} Stop
 * @property {StopKind} kind
 * @property {string|null} key  the effect's idempotency key, when there is one (what
 *   resolve_effect takes)
 * @property {string|null} [downstreamKey]  the key its provider got, when known (a business
 *   key's names its attempt: `<key>#<attempt>`)
 * @property {string} forModel  a tool result for the model: what happened, and that it must
 *   not call the tool again
 * @property {string} forPerson  what a person must do before the run can go on
 * @property {unknown} error  the error the call threw
 */

/**
 * @typedef {object} AgentAttemptOptions
 * @property {'token' | 'session'} [lease]  the attempt's lease: 'token' (default: a pg.Pool,
 *   PgBouncer in transaction mode, parallel tool calls) or 'session' (one dedicated client)
 * @property {number} [ttl]  a token lease's seconds without renewal (tokenAttempt's; 300)
 * @property {string | null} [holder]  the worker's name in durable_ledger.leases (token lease)
 * @property {string | null} [model]  the model that answers the attempt (meta.model of its calls)
 */

/** One agentAttempt: its ledger and run, and the first call that stopped it. */
class AgentRun {
  /**
   * @param {Ledger} ledger
   * @param {string} run
   */
  constructor(ledger, run) {
    this.ledger = ledger;
    this.run = run;
    /** @type {Stop|null} */
    this.stop = null;
    /** the tool call ids of the model turns recorded or replayed in this attempt */
    this.stableCallIds = new Set();
    /** the keys of the calls keyed by their ids that this attempt began (replayFailure) */
    this.begunCallKeys = new Set();
  }
}

/** @type {AsyncLocalStorage<ReadonlyArray<AgentRun>>} */
const agentContext = new AsyncLocalStorage();

/**
 * The stop each error thrown by guardedTool or recordedCall meant (an unknown outcome is
 * known only there: the tool's own error says nothing of it).
 * @type {WeakMap<object, Stop>}
 */
const stopsThrown = new WeakMap();

/**
 * Remembers what `err` meant, in the agentAttempt `state` too (its first stop).
 * @param {unknown} err
 * @param {Stop | null} stop
 * @param {AgentRun | null} state
 */
function noteStop(err, stop, state) {
  if (!stop) return;
  if (state) state.stop ??= stop;
  if (typeof err === 'object' && err !== null) stopsThrown.set(err, stop);
}

/**
 * The innermost agentAttempt the calling code runs in ({ledger, run}), or null.
 * @returns {{ledger: Ledger, run: string} | null}
 */
export function currentAttempt() {
  const store = agentContext.getStore();
  const inner = store?.[store.length - 1];
  return inner ? { ledger: inner.ledger, run: inner.run } : null;
}

/**
 * The agentAttempt a call of (ledger, run) belongs to, either given: the innermost one that
 * matches, or the innermost one when neither is given.
 * @param {Ledger | undefined} ledger
 * @param {string | undefined} run
 * @returns {AgentRun | null}
 */
function boundRun(ledger, run) {
  const store = agentContext.getStore() ?? [];
  for (let i = store.length - 1; i >= 0; i -= 1) {
    if ((ledger === undefined || store[i].ledger === ledger) && (run === undefined || store[i].run === run)) {
      return store[i];
    }
  }
  return null;
}

/**
 * One attempt at `run` around a framework's invocation: a token attempt (default) or a
 * session attempt of `ledger`, in which the adapters' tools and recorded model calls find
 * their ledger and run.  Returns what fn returns; but when a call stopped the run (see
 * stopOf) -- even if the framework turned its error into a message and went on -- throws
 * that call's error at the end (an unknown outcome: a RunStopped whose cause is the tool's
 * error), so the app learns that a person must act, or that the run must not be retried.
 * @template T
 * @overload
 * @param {Ledger} ledger
 * @param {string} run
 * @param {(lease: TokenLease | null) => T | Promise<T>} fn
 * @returns {Promise<Awaited<T>>}
 */
/**
 * @template T
 * @overload
 * @param {Ledger} ledger
 * @param {string} run
 * @param {AgentAttemptOptions} options
 * @param {(lease: TokenLease | null) => T | Promise<T>} fn
 * @returns {Promise<Awaited<T>>}
 */
/**
 * @template T
 * @param {Ledger} ledger
 * @param {string} run
 * @param {AgentAttemptOptions | ((lease: TokenLease | null) => T | Promise<T>)} options
 * @param {(lease: TokenLease | null) => T | Promise<T>} [fn]
 * @returns {Promise<Awaited<T>>}
 * @throws what a stopping call threw (EffectPaused, RunAbandoned, ToolRefused, LeaseLost,
 *   RunStopped), RunBusy when another worker holds the run, or fn's own error
 */
export async function agentAttempt(ledger, run, options, fn) {
  if (typeof options === 'function') [options, fn] = [{}, options];
  if (typeof fn !== 'function') throw new TypeError('agentAttempt(ledger, run, [options,] fn): fn must be a function');
  const { lease = 'token', ttl, holder, model } = options ?? {};
  if (lease !== 'token' && lease !== 'session') {
    throw new TypeError("agentAttempt(): lease must be 'token' or 'session'");
  }
  const state = new AgentRun(ledger, run);
  const body = (/** @type {TokenLease | null} */ held) =>
    agentContext.run([...(agentContext.getStore() ?? []), state], () => fn(held));
  /** @type {Awaited<T>} */
  let result;
  try {
    result = await (lease === 'token'
      ? ledger.tokenAttempt(run, { ttl, holder, model }, (held) => body(held))
      : ledger.attempt(run, { model }, () => body(null)));
  } catch (err) {
    throw state.stop ? thrownFor(state.stop) : err;
  }
  if (state.stop) throw thrownFor(state.stop);
  return result;
}

/**
 * What agentAttempt throws for a stop: the call's own error, or for an unknown outcome a
 * RunStopped that names the effect, with the tool's error as its cause.
 * @param {Stop} stop
 * @returns {unknown}
 */
function thrownFor(stop) {
  if (stop.kind !== 'unknown') return stop.error;
  return new RunStopped(stop.forPerson, { key: stop.key, reason: 'outcome unknown', cause: stop.error });
}

/**
 * @template T
 * @typedef {object} ToolCallSpec
 * @property {string} tool  the tool's name in the ledger
 * @property {unknown} args  its JSON input
 * @property {(key: string) => T | Promise<T>} perform  performs the effect; `key` is the provider's
 *   idempotency key
 * @property {Ledger} [ledger]  default: the current agentAttempt's
 * @property {string} [run]  default: the current agentAttempt's
 * @property {string | null} [businessKey]
 * @property {string | null} [callId]  the framework's id of this tool call, when it is kept
 *   across the framework's own resume (a checkpointed tool call, a recorded model turn's):
 *   the call is keyed by it (callKey: a business key of the run, tool and id) instead of by
 *   its occurrence, so a resume that does not re-make the run's earlier calls, or a
 *   framework's retry of the call, reaches this call's effect and no other
 * @property {boolean | 'earlier-attempts'} [replayFailure]  with callId: a call whose effect
 *   failed (its provider refused it, or a person resolved it as not done) is replayed as that
 *   failure (EffectFailed, replayed) rather than made again, as a call keyed by its occurrence
 *   is -- for a framework that re-runs or resumes past a failure the model has seen (it may
 *   have tried again under another id, and paid); 'earlier-attempts': only a failure an
 *   earlier attempt recorded, while a retry of the call inside this attempt (a graph node's
 *   retry policy, before the model saw anything) makes it again.  Without it a failed call
 *   keyed by its id is made again by the next call of that id.  One effect_status more per
 *   call.
 * @property {unknown} [meta]
 * @property {import('./reconcile.js').Reconcile | null} [reconcile]
 */

/**
 * Notes, in the current agentAttempt, the ids of the tool calls a model turn made that the
 * ledger recorded (or replayed): a rerun of the run replays that turn, so its calls come back
 * with the same ids, and a tool may be keyed by them (isStableCallId).
 * @param {Iterable<string>} ids
 */
export function noteStableCallIds(ids) {
  const state = boundRun(undefined, undefined);
  if (!state) return;
  for (const id of ids) if (typeof id === 'string' && id !== '') state.stableCallIds.add(id);
}

/**
 * Whether a recorded model turn of the current agentAttempt made the tool call `id`
 * (noteStableCallIds).
 * @param {string | null | undefined} id
 * @returns {boolean}
 */
export function isStableCallId(id) {
  return typeof id === 'string' && (boundRun(undefined, undefined)?.stableCallIds.has(id) ?? false);
}

/**
 * One side-effecting tool call through the ledger (guarded()), in the current
 * agentAttempt unless `ledger` and `run` say otherwise: performed at most once, its
 * result as recorded (a replay returns it without calling perform).  A call that stops the
 * run is remembered by its agentAttempt (thrown at its end), then its error is thrown.
 * @template T
 * @param {ToolCallSpec<T>} spec
 * @returns {Promise<import('./types.js').Recorded<Awaited<T>>>}
 */
export async function guardedTool(spec) {
  const { ledger, run, state } = resolve(spec, 'guardedTool');
  const businessKey = spec.businessKey ?? (spec.callId != null ? callKey(run, spec.tool, spec.callId) : null);
  const byId = spec.callId != null && spec.businessKey == null ? /** @type {string} */ (businessKey) : null;
  const retriedHere = byId !== null && (state?.begunCallKeys.has(byId) ?? false);
  if (byId !== null) state?.begunCallKeys.add(byId);
  if (spec.replayFailure && byId !== null && !state?.stop
    && !(spec.replayFailure === 'earlier-attempts' && retriedHere)) {
    // (a stopped attempt: guarded() says so, performing nothing)
    const key = byId;
    const row = await ledger.effectStatus(key, run);
    // a contradicted failure (flagged) is for a person: begin_effect pauses it
    if (row?.status === 'failed' && !row.conflict) {
      throw new EffectFailed(`${spec.tool} (call ${spec.callId}) did not happen (replayed): ${describe(row.error)}`, {
        key, decision: 'replay', reason: null, error: row.error, replayed: true,
      });
    }
  }
  /** the key of a perform that threw: its outcome is unknown */
  const threw = { key: /** @type {string|null} */ (null), downstreamKey: /** @type {string|null} */ (null) };
  try {
    return await ledger.guarded({
      run, tool: spec.tool, args: spec.args, meta: spec.meta,
      ...(byId !== null ? { callId: /** @type {string} */ (spec.callId) } : { businessKey }),
      reconcile: spec.reconcile ?? null,
      perform: async (key) => {
        try {
          return await spec.perform(key);
        } catch (err) {
          if (!(err instanceof EffectDidNotHappen)) {
            // the effect's key (what resolve_effect takes), and the provider's: a business
            // key's provider key names its attempt (key#attempt)
            threw.key = businessKey ?? key;
            threw.downstreamKey = key;
          }
          throw err;
        }
      },
    });
  } catch (err) {
    noteStop(err, stopOf(err, threw.key !== null
      ? { tool: spec.tool, key: threw.key, downstreamKey: threw.downstreamKey ?? threw.key } : undefined)
      ?? stoppedByClient(err, ledger, run, spec.tool, false), state);
    throw err;
  }
}

/**
 * @template T
 * @typedef {object} RecordedCallSpec
 * @property {string} tool  e.g. "model.<provider>.<id>"
 * @property {unknown} args  its JSON input (the prompt so far)
 * @property {() => T | Promise<T>} call
 * @property {Ledger} [ledger]
 * @property {string} [run]
 * @property {string | null} [callId]  the framework's id of the call, kept across its own
 *   resume (see ToolCallSpec): recorded with the args ({args, call_id}), so each call is its
 *   own record whatever the occurrence
 * @property {unknown} [meta]
 */

/**
 * A call that is harmless to make again -- a model turn, a read -- through the ledger
 * (record()): made once, recorded, and replayed by a later attempt, so that a rerun sees
 * the very answers the first one saw.
 * @template T
 * @param {RecordedCallSpec<T>} spec
 * @returns {Promise<import('./types.js').Recorded<Awaited<T>>>}
 */
export async function recordedCall(spec) {
  const { ledger, run, state } = resolve(spec, 'recordedCall');
  try {
    const args = spec.callId != null ? { args: spec.args, call_id: spec.callId } : spec.args;
    return await ledger.record({ run, tool: spec.tool, args, call: spec.call, meta: spec.meta });
  } catch (err) {
    noteStop(err, stopOf(err) ?? stoppedByClient(err, ledger, run, spec.tool, true), state);
    throw err;
  }
}

/**
 * @param {{ledger?: Ledger, run?: string}} spec
 * @param {string} name
 * @returns {{ledger: Ledger, run: string, state: AgentRun | null}}
 */
function resolve(spec, name) {
  const state = boundRun(spec.ledger, spec.run);
  const ledger = spec.ledger ?? state?.ledger;
  const run = spec.run ?? state?.run;
  if (!ledger || run === undefined) {
    throw new LedgerError(`${name}(): no agentAttempt is open here, and no ledger and run were given: ` +
      'call the framework inside agentAttempt(ledger, run, fn)');
  }
  return { ledger, run, state };
}

/**
 * The error a framework shows the model for a call that stopped the run: its message is
 * what the model must know (not performed, do not call again), `stop` says what it means,
 * `cause` is the ledger's (or the tool's) error.
 */
export class ToolCallStopped extends Error {
  /** @param {Stop} stop */
  constructor(stop) {
    super(stop.forModel, { cause: stop.error });
    this.name = 'ToolCallStopped';
    /** @type {Stop} @readonly */
    this.stop = stop;
  }
}

/**
 * What a framework shows the model for an error of guardedTool or recordedCall: a
 * ToolCallStopped when it stopped the run (see stopOf: the tool's own error when its
 * outcome is unknown), else the error itself.
 * @param {unknown} err
 * @returns {unknown}
 */
export function toolError(err) {
  if (err instanceof ToolCallStopped) return err;
  const stop = (typeof err === 'object' && err !== null ? stopsThrown.get(err) : undefined) ?? stopOf(err);
  return stop ? new ToolCallStopped(stop) : err;
}

/**
 * The first stop of the innermost agentAttempt the calling code runs in, or null.
 * @returns {Stop | null}
 */
export function currentStop() {
  const store = agentContext.getStore();
  return store?.[store.length - 1]?.stop ?? null;
}

/** What every stop tells the model. */
const noRetry = 'Do not call this tool again and do not try another way to do the same: end your turn ' +
  'and say that the run waits for a person.';

/**
 * The stop of a call whose error stopOf does not know, when the ledger client stopped the
 * attempt with it (a report that could not be recorded, a begin_effect whose outcome is
 * unknown, a recorded call that threw), else null.
 * @param {unknown} err
 * @param {Ledger} ledger
 * @param {string} run
 * @param {string} tool
 * @param {boolean} recorded  a recorded call's: nothing for a person, the next attempt makes it again
 * @returns {Stop | null}
 */
function stoppedByClient(err, ledger, run, tool, recorded) {
  const stopped = ledger.attemptStop(run);
  if (!stopped) return null;
  if (recorded) {
    return {
      kind: 'stopped', key: stopped.key, error: err,
      forModel: `The call ${tool} failed, and this run stops here: a new attempt makes it again. ${noRetry}`,
      forPerson: `nothing: ${stopped.reason} A new attempt makes the call again.`,
    };
  }
  return {
    kind: 'unknown', key: stopped.key, error: err,
    forModel: `Nobody knows yet whether the tool ${tool} took effect. ${noRetry}`,
    forPerson: `${stopped.reason} The next attempt pauses what is not known for a person, who checks the ` +
      'downstream system and resolves it (durable_ledger.resolve_effect, or the console).',
  };
}

/**
 * What an error of a tool call means for the run, or null when it does not stop it (an
 * EffectFailed is the tool's recorded refusal, for the model to handle; an
 * EffectInProgress or a bad argument stops nothing).
 * @param {unknown} err
 * @param {{tool: string, key: string, downstreamKey?: string}} [unknownOutcome]  the call whose perform
 *   threw it: its effect's key and the key its provider got
 * @returns {Stop | null}
 */
export function stopOf(err, unknownOutcome) {
  const key = err instanceof LedgerError ? err.key : null;
  /**
   * @param {StopKind} kind
   * @param {string} forModel
   * @param {string} forPerson
   * @param {string|null} [stopKey]
   * @param {string|null} [downstreamKey]
   * @returns {Stop}
   */
  const stop = (kind, forModel, forPerson, stopKey = key, downstreamKey = err instanceof EffectPaused
    ? err.downstreamKey ?? null : null) => ({ kind, key: stopKey, downstreamKey, forModel, forPerson, error: err });
  if (unknownOutcome) {
    return stop('unknown',
      `The tool ${unknownOutcome.tool} failed while it was being performed: nobody knows yet whether ` +
        `it took effect. ${noRetry}`,
      `the outcome of ${unknownOutcome.tool} (effect ${unknownOutcome.key}) is unknown: the tool threw ` +
        `(${describe(/** @type {any} */ (err)?.message ?? err)}). The next attempt pauses it: a person checks ` +
        `the downstream system for ${unknownOutcome.downstreamKey ?? unknownOutcome.key} and resolves it ` +
        '(durable_ledger.resolve_effect, or the console).',
      unknownOutcome.key, unknownOutcome.downstreamKey ?? unknownOutcome.key);
  }
  if (err instanceof EffectPaused) {
    const why = err instanceof DivergencePaused ? 'it may repeat an earlier call, worded differently or named anew'
      : err instanceof AwaitingApproval ? 'it needs a person\'s approval'
        : err instanceof BudgetExhausted ? 'the run has used up its budget for this tool'
          : 'an earlier attempt began it and nobody knows whether it took effect';
    return stop('paused', `This call was not performed: the ledger paused it because ${why}. ${noRetry}`,
      err instanceof DivergencePaused
        ? `a person decides whether effect ${err.key} repeats an earlier one (durable_ledger.resolve_divergence)`
        : err instanceof AwaitingApproval
          ? `an approver approves or rejects effect ${err.key} (durable_ledger.approve_effect, reject_effect)`
          : err instanceof BudgetExhausted
            ? `a person raises the run's budget (durable_ledger.set_run_budget) or abandons the run`
            : `a person checks the downstream system for ${err.downstreamKey ?? err.key} and resolves ` +
              `effect ${err.key} (durable_ledger.resolve_effect, or the console)`);
  }
  if (err instanceof RunAbandoned) {
    return stop('abandoned', `This call was not performed: a person abandoned this run. ${noRetry}`,
      'nothing: the run is abandoned and must not be retried (fork it into a new run to redo part of it)');
  }
  if (err instanceof ToolRefused) {
    return stop('refused', `This call was not performed: the ledger refuses this tool. ${noRetry}`,
      'an admin registers the tool (durable_ledger.register_tool), then a new attempt');
  }
  if (err instanceof LeaseLost) {
    return stop('lease-lost', `This call was not performed: this worker lost the run. ${noRetry}`,
      'nothing: start a new attempt, which replays what is done');
  }
  if (err instanceof RunStopped) {
    return stop('stopped', `This call was not performed: an earlier call of this run stopped it. ${noRetry}`,
      'see the call that stopped the run');
  }
  return null;
}
