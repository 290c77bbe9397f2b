// A call that stopped the run, the LangGraph way: an interrupt() of the tool's
// task, so that the checkpoint never records a "not performed" message as the
// tool's answer.  The graph stops at that step; the app learns it from
// agentAttempt (which throws the stop at its end) and from the state's
// __interrupt__; a person acts (resolves the effect, registers the tool, ...);
// the app resumes the thread (Command({resume}), or invoke(null)), and the tool
// runs again from its top: the ledger replays what the person resolved, or
// executes what may now be executed, or stops again -- another interrupt.
import { interrupt, isGraphInterrupt } from '@langchain/langgraph';
import { ToolCallStopped, toolError } from 'durable-ledger/agents';

/** What every interrupt of this adapter carries, so that an app tells them from its own. */
export const LEDGER_INTERRUPT = 'durable_ledger';

/**
 * The value of an interrupt raised for a stopped call (JSON: it is checkpointed).
 * @typedef {object} LedgerInterrupt
 * @property {'durable_ledger'} type
 * @property {import('durable-ledger/agents').StopKind} kind  what stopped the run (stopOf)
 * @property {string} tool  the tool's name in the ledger
 * @property {string} run  the ledger's run (the thread id)
 * @property {string|null} key  the effect's key in the ledger (what resolve_effect takes), when
 *   there is one
 * @property {string|null} downstreamKey  the idempotency key the provider got for it (the
 *   effect's key, or for a tool call keyed by its id or a business key, that key and its
 *   attempt: `<key>#1`), when known
 * @property {string} forPerson  what a person must do before the thread is resumed
 * @property {string|null} toolCallId  the model's id of the tool call
 * @property {string} checkpointNs  the checkpoint namespace the call ran in ('' at the top)
 */

/**
 * How a stopped call ends the tool: 'interrupt' (default: LangGraph's interrupt(), which
 * needs a checkpointer; without one the ToolCallStopped is thrown) or 'error' (the
 * ToolCallStopped is thrown: a ToolNode makes it an error message for the model and goes
 * on, and agentAttempt throws the stop at its end).
 * @typedef {'interrupt' | 'error'} OnStop
 */

/**
 * Runs `call` (a guardedTool or recordedCall); a call that stopped the run becomes an
 * interrupt of the current task (or a ToolCallStopped, see OnStop).  Any other error is
 * the tool's own and comes through (an EffectFailed: the recorded refusal, for the model).
 * @template T
 * @param {() => Promise<T>} call
 * @param {{tool: string, run: string, onStop: OnStop, toolCallId: string | null,
 *   config: import('@langchain/core/runnables').RunnableConfig | undefined,
 *   effectKey?: () => string}} ctx  effectKey: the key of this call's effect, for an unknown outcome
 *   whose stop names none (the client stopped the attempt at begin_effect, before a key came back)
 * @returns {Promise<T>}
 */
export async function stopAsInterrupt(call, ctx) {
  try {
    return await call();
  } catch (err) {
    if (isGraphInterrupt(err)) throw err;
    const stopped = toolError(err);
    if (!(stopped instanceof ToolCallStopped)) throw err;
    if (ctx.onStop === 'error') throw stopped;
    const { stop } = stopped;
    // the stop names the effect's key (what resolve_effect takes) and, when known, the
    // provider's (a business key's names its attempt)
    const key = stop.kind === 'unknown' && stop.key === null ? ctx.effectKey?.() ?? null : stop.key;
    /** @type {LedgerInterrupt} */
    const value = {
      type: LEDGER_INTERRUPT,
      kind: stop.kind,
      tool: ctx.tool,
      run: ctx.run,
      key,
      downstreamKey: stop.downstreamKey ?? null,
      forPerson: forPerson(stop, ctx.tool, key),
      toolCallId: ctx.toolCallId,
      checkpointNs: ctx.config?.configurable?.checkpoint_ns ?? '',
    };
    // interrupt() throws the GraphInterrupt, unless this task was resumed: then it returns
    // the resume value of an earlier interrupt of the task -- but the call is still
    // stopped (the ledger said so just now), so ask again: the next one throws.
    for (let asked = 0; asked < 10000; asked += 1) {
      try {
        interrupt(value);
      } catch (e) {
        if (isGraphInterrupt(e)) throw e;
        if (/** @type {any} */ (e)?.lc_error_code === 'MISSING_CHECKPOINTER') throw stopped;
        throw e;
      }
    }
    throw stopped;
  }
}

/**
 * What the interrupt tells a person.  Not the tool's own error: the interrupt is
 * checkpointed (and a LangGraph server hands it to its clients), and a provider's error
 * may carry what must not be kept there (an account, a URL with its token); the app has
 * it, unkept, as the error invokeThread threw (RunStopped's cause, or the read's error).
 * The other stops' words are the ledger's, not the tool's.
 * @param {import('durable-ledger/agents').Stop} stop
 * @param {string} tool
 * @param {string | null} key  the effect's key
 * @returns {string}
 */
function forPerson(stop, tool, key) {
  if (stop.kind === 'unknown') {
    return `the outcome of ${tool} (effect ${key ?? 'not known'}) is unknown: nobody knows whether it took effect ` +
      '(why is in the error the app got, a RunStopped and its cause; it is not kept in the checkpoint). A person checks the ' +
      'downstream system by the key and resolves it (durable_ledger.resolve_effect, or the console), then the thread ' +
      'is resumed.';
  }
  if (stop.kind === 'stopped' && stop.forPerson.startsWith('nothing:')) {
    return `nothing: the call ${tool} failed and nothing was recorded (its error is what the app got); resume the ` +
      'thread and it is made again.';
  }
  if (stop.kind === 'abandoned') {
    // not the core's "fork it into a new run": fork_run carries derived keys only, and a
    // thread's calls are keyed by their tool call ids (business keys of the run), so a fork
    // of the thread would make every call again
    return 'nothing: the run is abandoned and must not be resumed. Do not fork it (durable_ledger.fork_run does not ' +
      'carry its calls, keyed by their tool call ids: a forked thread makes them again); to redo part of it, start a ' +
      'new thread that tells the model what this one did, and give an operation that must never be made twice ' +
      'whatever the thread a business key (ledgerTools(tools, { businessKeys })), which every run replays.';
  }
  return stop.forPerson;
}

/**
 * Whether `value` is the value of an interrupt this adapter raised.
 * @param {unknown} value
 * @returns {value is LedgerInterrupt}
 */
export function isLedgerInterrupt(value) {
  return typeof value === 'object' && value !== null && /** @type {any} */ (value).type === LEDGER_INTERRUPT;
}

/**
 * The ledger's interrupts a graph is waiting on: from what invoke() returned (its
 * `__interrupt__`) or from graph.getState(config) (its tasks' interrupts, subgraphs' too
 * when asked with {subgraphs: true}).
 * @param {unknown} resultOrState
 * @returns {LedgerInterrupt[]}
 */
export function ledgerInterrupts(resultOrState) {
  /** @type {LedgerInterrupt[]} */
  const found = [];
  /** @param {unknown} list */
  const take = (list) => {
    if (!Array.isArray(list)) return;
    for (const i of list) if (isLedgerInterrupt(i?.value)) found.push(i.value);
  };
  /** @param {any} s */
  const walk = (s) => {
    if (!s || typeof s !== 'object') return;
    take(s.__interrupt__);
    take(s.interrupts);
    if (Array.isArray(s.tasks)) {
      for (const t of s.tasks) {
        take(t.interrupts);
        walk(t.state);
      }
    }
  };
  walk(resultOrState);
  const seen = new Set();
  return found.filter((i) => {
    const id = JSON.stringify([i.key, i.tool, i.toolCallId, i.checkpointNs, i.kind]);
    if (seen.has(id)) return false;
    seen.add(id);
    return true;
  });
}
