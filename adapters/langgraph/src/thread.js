// Where the attempt opens: one agentAttempt of the ledger per invocation of a graph on
// a thread, its run the thread id.  invokeThread is that for graph.invoke; for
// graph.stream, consume the stream inside agentAttempt(ledger, runIdOf(config), fn), with
// durability 'sync' in its config (durabilityOf(config) says so).
//
// Durability, by decision: invokeThread runs the graph with durability 'sync' and refuses
// any other.  A tool call is keyed by its tool call's id (tools.js), which is stable only
// if the AI message that made it is in the checkpoint before the tool runs.  With 'async'
// (LangGraph's default: the checkpoint written in the background) or 'exit', a crash while
// a tool runs can find the model step not checkpointed; the resume asks the model again, a
// provider answers with new ids, and the call is made again under a new key: paid twice,
// with no pause (the review's p1).  recordedModel does not close that for a prompt that
// changed in between (a new system prompt deployed before the resume); 'sync' does.
import { LedgerError } from 'durable-ledger';
import { agentAttempt } from 'durable-ledger/agents';
import { runIdOf } from './tools.js';

/**
 * The config to run a thread's graph with: the caller's, with durability 'sync' (each step's
 * checkpoint written before the next step starts) unless it says so already.  Throws a
 * LedgerError for any other durability (or checkpointDuring): nothing was performed.
 * @template {import('@langchain/core/runnables').RunnableConfig} C
 * @param {C} config
 * @returns {C & {durability: 'sync'}}
 */
export function durabilityOf(config) {
  const c = /** @type {any} */ (config ?? {});
  if (c.checkpointDuring !== undefined && c.checkpointDuring !== null) {
    throw new LedgerError('durable-ledger-langgraph: the config sets checkpointDuring; a thread\'s graph runs with ' +
      'durability \'sync\' (leave both out: invokeThread sets it); nothing was performed');
  }
  const durability = c.durability ?? 'sync';
  if (durability !== 'sync') {
    throw new LedgerError(`durable-ledger-langgraph: durability '${durability}' is refused; a thread's graph runs with ` +
      'durability \'sync\' (leave it out: invokeThread sets it). A tool call is known by the id of the model\'s call, ' +
      'which a resume finds only if the model step was checkpointed before its tools ran: with \'async\' or \'exit\' a ' +
      'crash during a tool can lose that checkpoint, the resume asks the model again, and a provider\'s new ids make ' +
      'the call again (paid twice, no pause); nothing was performed');
  }
  return /** @type {any} */ ({ ...c, durability: 'sync' });
}

/**
 * graph.invoke(input, config) in an attempt at the thread's run (agentAttempt: a token
 * lease by default), with durability 'sync' (durabilityOf: another durability is refused
 * with a LedgerError, nothing performed).  Returns what invoke returned -- with
 * `__interrupt__` when a call interrupted the graph -- but throws, when a call stopped the
 * run, that call's error (EffectPaused, RunStopped for an unknown outcome, RunAbandoned,
 * ToolRefused, LeaseLost): the graph waits at an interrupt a person must act on
 * (ledgerInterrupts(await graph.getState(config)) says which), then the thread is resumed
 * with invokeThread(ledger, graph, new Command({ resume: ... }), config).  A config without
 * a thread_id, or with another durability, throws at once.
 * @template T
 * @param {import('durable-ledger').Ledger} ledger
 * @param {{invoke: (input: any, config?: any) => Promise<T>}} graph  a compiled graph (or agent)
 * @param {unknown} input  the input, a Command, or null (go on from the last checkpoint)
 * @param {import('@langchain/core/runnables').RunnableConfig} config  with configurable.thread_id
 * @param {import('durable-ledger/agents').AgentAttemptOptions} [options]
 * @returns {Promise<Awaited<T>>}
 */
export function invokeThread(ledger, graph, input, config, options = {}) {
  const run = runIdOf(config);
  const synced = durabilityOf(config);
  return agentAttempt(ledger, run, options, () => graph.invoke(input, synced));
}
