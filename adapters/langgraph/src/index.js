// durable-ledger-langgraph: at-most-once tools for LangGraph.js and Deep Agents, on the
// adapters' core (durable-ledger/agents).  Its modules:
//   tools.js   ledgerTool, recordedTool, ledgerTools, idempotencyKey, runIdOf
//   model.js   recordedModel: a chat model whose turns are recorded in the ledger
//   stops.js   a call that stopped the run as LangGraph's interrupt; ledgerInterrupts
//   thread.js  invokeThread: graph.invoke in the thread's agentAttempt
export { ledgerTool, recordedTool, ledgerTools, idempotencyKey, runIdOf, IDEMPOTENCY_KEY } from './tools.js';
export { recordedModel, turnArgs } from './model.js';
export { isLedgerInterrupt, ledgerInterrupts, LEDGER_INTERRUPT } from './stops.js';
export { invokeThread, durabilityOf } from './thread.js';

/** @typedef {import('./tools.js').LedgerToolOptions} LedgerToolOptions */
/** @typedef {import('./tools.js').RecordedToolOptions} RecordedToolOptions */
/** @typedef {import('./tools.js').LedgerToolsOptions} LedgerToolsOptions */
/** @typedef {import('./model.js').RecordedModelOptions} RecordedModelOptions */
/** @typedef {import('./stops.js').LedgerInterrupt} LedgerInterrupt */
/** @typedef {import('./stops.js').OnStop} OnStop */
