// durable-ledger-claude-agent-sdk: the custom tools of a Claude Agent SDK agent -- MCP tools
// of an in-process SDK MCP server -- through the durable_ledger ledger, with the session id
// as the run.  The modules, each importing only those below it:
//
//   session.js  claudeAttempt(): one attempt at a session's run around query(); forkRun(),
//               the ledger's fork of a forked session's run; gatewayServer(), the MCP gateway
//               for the session's tools reached over MCP
//   tools.js    ledgerTool(): the SDK's tool() with its handler through the ledger
//   context.js  the claudeAttempt a handler runs in (abortOnStop)

export { ledgerTool, stopResult, asToolResult, RESULT_META } from './tools.js';
export {
  claudeAttempt, ClaudeSession, ForkNotCarried, forkRun, gatewayServer, gatewayRun, sessionRun,
} from './session.js';

/** @typedef {import('./tools.js').ToolContext} ToolContext */
/**
 * @template {import('@anthropic-ai/claude-agent-sdk').AnyZodRawShape} S
 * @typedef {import('./tools.js').LedgerToolOptions<S>} LedgerToolOptions
 */
/** @typedef {import('./session.js').SessionSpec} SessionSpec */
/** @typedef {import('./session.js').ClaudeAttemptOptions} ClaudeAttemptOptions */
