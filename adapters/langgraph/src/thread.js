// Where the attempt opens: one agentAttempt of the ledger per invocation of a graph on
// a thread, its run the thread id.  invokeThread is that for graph.invoke; for
// graph.stream, consume the stream inside agentAttempt(ledger, runIdOf(config), fn).
import { agentAttempt } from 'durable-ledger/agents';
import { runIdOf } from './tools.js';

/**
 * graph.invoke(input, config) in an attempt at the thread's run (agentAttempt: a token
 * lease by default).  Returns what invoke returned -- with `__interrupt__` when a call
 * interrupted the graph -- but throws, when a call stopped the run, that call's error
 * (EffectPaused, RunStopped for an unknown outcome, RunAbandoned, ToolRefused, LeaseLost):
 * the graph waits at an interrupt a person must act on (ledgerInterrupts(await
 * graph.getState(config)) says which), then the thread is resumed with
 * invokeThread(ledger, graph, new Command({ resume: ... }), config).
 * @template T
 * @param {import('durable-ledger').Ledger} ledger
 * @param {{invoke: (input: any, config?: any) => Promise<T>}} graph  a compiled graph (or agent)
 * @param {unknown} input  the input, a Command, or null (go on from the last checkpoint)
 * @param {import('@langchain/core/runnables').RunnableConfig} config  with configurable.thread_id
 * @param {import('durable-ledger/agents').AgentAttemptOptions} [options]
 * @returns {Promise<Awaited<T>>}
 */
export function invokeThread(ledger, graph, input, config, options = {}) {
  return agentAttempt(ledger, runIdOf(config), options, () => graph.invoke(input, config));
}
