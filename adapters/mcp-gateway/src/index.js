// durable-ledger-mcp-gateway: an MCP server in front of other MCP servers, which passes
// every call of a side-effecting tool through the durable_ledger ledger and every call of
// a read-only tool straight through.  The modules, each importing only those below it:
//
//   main.js      the command line (bin/durable-ledger-mcp-gateway.js): config, ledger, serving
//   serve.js     serving it over stdio (one session) or Streamable HTTP (a session per client)
//   gateway.js   the gateway: its tools, a Server per session, one call through the ledger
//   runs.js      a session's runs and their attempts (token leases), taken over on reconnect
//   upstream.js  the gateway's MCP client to one upstream server
//   config.js    the configuration file, checked field by field

export { Gateway, GatewaySession, RESULT_META, stopResult } from './gateway.js';
export { serveStdio, serveHttp } from './serve.js';
export { loadConfig, parseConfig, ruleOf, ConfigError, RUN_META, KEY_META } from './config.js';
export { registrySql, openLedger, main } from './main.js';
export { Upstream } from './upstream.js';

/** @typedef {import('./config.js').GatewayConfig} GatewayConfig */
/** @typedef {import('./config.js').ServerSpec} ServerSpec */
/** @typedef {import('./config.js').ToolRule} ToolRule */
/** @typedef {import('./config.js').LedgerSpec} LedgerSpec */
/** @typedef {import('./serve.js').HttpGateway} HttpGateway */
