// The command line (bin/durable-ledger-mcp-gateway.js):
//
//   durable-ledger-mcp-gateway --config gateway.json                 stdio (one session)
//   durable-ledger-mcp-gateway --config gateway.json --run RUN       ... whose calls default to run RUN
//   durable-ledger-mcp-gateway --config gateway.json --http [HOST:]PORT    Streamable HTTP at /mcp
//       [--allow-origin ORIGIN]... [--allow-host HOST[:PORT]]...    browsers' origins and other Host
//                                                                    headers it serves (DNS rebinding)
//   durable-ledger-mcp-gateway --config gateway.json --check         lists the tools and what the gateway
//                                                                    does with each; exit 1 on a warning
//   durable-ledger-mcp-gateway --config gateway.json --registry-sql  the register_tool statements an
//                                                                    admin runs for the configured tools

import { parseArgs } from 'node:util';
import pg from 'pg';
import { Ledger } from 'durable-ledger';
import { Checker, ConfigError, loadConfig, origin } from './config.js';
import { Gateway } from './gateway.js';
import { serveHttp, serveStdio } from './serve.js';

/** @typedef {import('./config.js').GatewayConfig} GatewayConfig */

const USAGE = 'usage: durable-ledger-mcp-gateway --config FILE [--http [HOST:]PORT [--allow-origin ORIGIN]... ' +
  '[--allow-host HOST[:PORT]]... | --run RUN | --check | --registry-sql]';

/**
 * A Ledger on a pg.Pool for the configuration (token leases: every call may use another
 * connection): ledger.connectionString, else DURABLE_LEDGER_DSN, else DATABASE_URL, else
 * node-postgres' PG* variables.
 * @param {GatewayConfig} config
 * @returns {{ledger: Ledger, pool: pg.Pool}}
 */
export function openLedger(config) {
  const connectionString = config.ledger.connectionString ?? process.env.DURABLE_LEDGER_DSN ??
    process.env.DATABASE_URL ?? undefined;
  const pool = new pg.Pool({ connectionString, max: config.ledger.poolSize, application_name: 'durable-ledger-mcp-gateway' });
  pool.on('error', () => {}); // an idle connection that broke: the next statement gets another
  return { ledger: new Ledger(pool), pool };
}

/**
 * The statements an admin runs to register the configured tools in the ledger's registry
 * (side-effecting ones with their key fields; read-only ones as such, for the review).
 * @param {GatewayConfig} config
 * @param {string} [by]  registered_by
 * @returns {string}
 */
export function registrySql(config, by = 'mcp-gateway') {
  const q = (/** @type {string} */ s) => `'${s.replace(/'/g, "''")}'`;
  const lines = [];
  for (const server of config.servers) {
    for (const [tool, rule] of server.tools) {
      const options = [`side_effecting => ${rule.sideEffecting}`];
      if (rule.keyFields) options.push(`key_fields => ${q(`{${rule.keyFields.map((f) => `"${f.replace(/["\\]/g, '\\$&')}"`).join(',')}}`)}`);
      options.push(`note => ${q(`MCP gateway: server ${server.name}, tool ${tool}`)}`);
      lines.push(`SELECT durable_ledger.register_tool(${q(rule.ledgerTool)}, ${q(by)}, ${options.join(', ')});`);
    }
  }
  return lines.join('\n');
}

/**
 * Runs the command line; resolves with the exit code.
 * @param {string[]} argv
 * @returns {Promise<number>}
 */
export async function main(argv) {
  let values;
  try {
    ({ values } = parseArgs({
      args: argv,
      options: {
        config: { type: 'string', short: 'c' },
        http: { type: 'string' },
        'allow-origin': { type: 'string', multiple: true },
        'allow-host': { type: 'string', multiple: true },
        run: { type: 'string' },
        check: { type: 'boolean' },
        'registry-sql': { type: 'boolean' },
        help: { type: 'boolean', short: 'h' },
      },
    }));
  } catch (err) {
    console.error(`${/** @type {Error} */ (err).message}\n${USAGE}`);
    return 2;
  }
  if (values.help) {
    console.log(USAGE);
    return 0;
  }
  if (!values.config) {
    console.error(USAGE);
    return 2;
  }
  let config;
  /** @type {string[]} */
  let allowOrigins;
  try {
    const check = new Checker('--allow-origin');
    allowOrigins = (values['allow-origin'] ?? []).map((o) => origin(check, o, ''));
  } catch (err) {
    console.error(`durable-ledger-mcp-gateway: ${/** @type {Error} */ (err).message}`);
    return 2;
  }
  if ((values['allow-origin'] || values['allow-host']) && values.http === undefined) {
    console.error(`--allow-origin and --allow-host are for --http\n${USAGE}`);
    return 2;
  }
  try {
    config = loadConfig(values.config);
  } catch (err) {
    if (err instanceof ConfigError) {
      console.error(`durable-ledger-mcp-gateway: ${err.message}`);
      return 2;
    }
    throw err;
  }
  if (values['registry-sql']) {
    console.log(registrySql(config));
    return 0;
  }
  const { ledger, pool } = openLedger(config);
  /** @type {Gateway} */
  let gateway;
  try {
    gateway = await Gateway.start(config, { ledger });
  } catch (err) {
    console.error(`durable-ledger-mcp-gateway: ${/** @type {Error} */ (err).message}`);
    await pool.end().catch(() => {});
    return 1;
  }
  try {
    if (values.check) {
      for (const e of gateway.tools.values()) {
        console.log(`${e.name}\t${e.rule.sideEffecting ? `through the ledger as ${e.rule.ledgerTool}` +
          (e.rule.keyFields ? ` (key fields ${e.rule.keyFields.join(', ')})` : '') : 'straight through (read-only)'}`);
      }
      return gateway.warnings.length === 0 ? 0 : 1;
    }
    if (values.http !== undefined) {
      const m = values.http.match(/^(?:(.*):)?(\d+)$/);
      if (!m) {
        console.error(`--http: [HOST:]PORT\n${USAGE}`);
        return 2;
      }
      const served = await serveHttp(gateway, { host: m[1] || '127.0.0.1', port: Number(m[2]), allowOrigins,
        allowHosts: values['allow-host'] ?? [] });
      console.log(`durable-ledger-mcp-gateway: listening on ${served.url}`);
      await new Promise((resolve) => {
        process.once('SIGTERM', resolve);
        process.once('SIGINT', resolve);
      });
      await served.close();
      return 0;
    }
    const ended = serveStdio(gateway, { run: values.run ?? process.env.DURABLE_LEDGER_RUN ?? null });
    await Promise.race([ended, new Promise((resolve) => {
      process.once('SIGTERM', resolve);
      process.once('SIGINT', resolve);
    })]);
    return 0;
  } finally {
    await gateway.close();
    await pool.end().catch(() => {});
  }
}
