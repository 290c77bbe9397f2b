// What the gateway's tests share: the ledger (DURABLE_LEDGER_DSN, a superuser: the tests
// resolve, break leases and register tools as a person and an admin would), a
// configuration in front of the upstream test server, a gateway in the test's process or
// in one of its own, and the MCP SDK's own client.
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { writeFileSync, mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { Ledger } from 'durable-ledger';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { Gateway, parseConfig, serveHttp } from '../../src/index.js';
import { spawnWorker } from '../../../test-support/worker.js';

export const DSN = process.env.DURABLE_LEDGER_DSN;
if (!DSN) throw new Error('set DURABLE_LEDGER_DSN to a superuser connection string of a database with durable_ledger');

export const UPSTREAM = fileURLToPath(new URL('./upstream-server.js', import.meta.url));
export const BIN = fileURLToPath(new URL('../../bin/durable-ledger-mcp-gateway.js', import.meta.url));
export const CLIENT = fileURLToPath(new URL('./client.js', import.meta.url));

/** A new run id. @param {string} what */
export const newRun = (what) => `mcp-${what}-${randomUUID()}`;

/**
 * The configuration of the tests' gateway: the upstream test server over stdio (or HTTP
 * at `url`), pay_invoice with its key in _meta, send_email with its key in an argument,
 * lookup_invoice read-only.
 * @param {{effects: string, gate?: string, gateOps?: string[], url?: string, pay?: object, ttl?: number,
 *   server?: object}} o  server: more fields of the server's configuration
 */
export function testConfig({ effects, gate, gateOps = [], url, pay = {}, ttl = 60, server: more = {} }) {
  const tools = {
    pay_invoice: { ...pay },
    send_email: { idempotencyKeyArgument: 'idempotency_key' },
    lookup_invoice: { sideEffecting: false },
  };
  const server = url ? { url, tools } : {
    command: process.execPath,
    args: [UPSTREAM],
    env: { EFFECTS_URL: effects, ...(gate ? { GATE_URL: gate, GATE_OPS: gateOps.join(',') } : {}) },
    tools,
  };
  return { ledger: { ttl }, servers: { bank: { ...server, ...more } } };
}

/** A pool and a Ledger on it, as the gateway's. */
export function ledgerPool() {
  const pool = new pg.Pool({ connectionString: DSN, max: 6 });
  return { pool, ledger: new Ledger(pool, { consoleWarn: false }) };
}

/**
 * A gateway in the test's process, served over HTTP.
 * @param {object} json  the configuration
 */
export async function startGateway(json) {
  const { pool, ledger } = ledgerPool();
  const warnings = [];
  const gateway = await Gateway.start(parseConfig(json), { ledger, warn: (m) => warnings.push(m) });
  const http = await serveHttp(gateway);
  return {
    gateway,
    url: http.url,
    http,
    warnings,
    async close() {
      await http.close();
      await gateway.close();
      await pool.end();
    },
  };
}

/**
 * Runs `fn` with a gateway in the test's process (startGateway), closed after it.
 * @template T
 * @param {object} json  the configuration
 * @param {(gw: Awaited<ReturnType<typeof startGateway>>) => Promise<T>} fn
 * @returns {Promise<T>}
 */
export async function withGateway(json, fn) {
  const gw = await startGateway(json);
  try {
    return await fn(gw);
  } finally {
    await gw.close();
  }
}

/** Writes a configuration file; returns its path. @param {object} json */
export function configFile(json) {
  const dir = mkdtempSync(path.join(tmpdir(), 'mcp-gateway-test-'));
  const file = path.join(dir, 'gateway.json');
  writeFileSync(file, JSON.stringify(json, null, 2));
  return file;
}

/**
 * A gateway in a process of its own, over HTTP: resolves once it listens.
 * @param {string} file  its configuration
 */
export async function spawnGateway(file) {
  const w = spawnWorker(BIN, ['--config', file, '--http', '127.0.0.1:0'], { DURABLE_LEDGER_DSN: DSN });
  const [, url] = await w.line(/listening on (http:\S+)/);
  return { ...w, url };
}

/** The MCP SDK's own client, connected to a gateway's URL (a new session). @param {string} url */
export async function connect(url) {
  const client = new Client({ name: 'gateway-test', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(url)));
  return client;
}

/**
 * Calls a tool in `run`.
 * @param {Client} client
 * @param {string} name
 * @param {object} args
 * @param {string} run
 * @param {object} [meta]
 * @returns {Promise<any>}
 */
export function call(client, name, args, run, meta = {}) {
  return client.callTool({ name, arguments: args, _meta: { 'durable-ledger/run': run, ...meta } });
}

/** The text of a tool's result. @param {any} result */
export const text = (result) => result.content.map((c) => c.text).join('\n');

/** The results a client (client.js) printed, by tool (the last of each). @param {string} stdout */
export function printed(stdout) {
  return Object.fromEntries([...stdout.matchAll(/^result (\S+) (.*)$/gm)].map((m) => [m[1], JSON.parse(m[2])]));
}

/** The ledger's rows, read as a person would (a superuser). */
export async function sql(query, params = []) {
  const client = new pg.Client({ connectionString: DSN });
  await client.connect();
  try {
    return (await client.query(query, params)).rows;
  } finally {
    await client.end();
  }
}

/** The effects of a run: tool and status, by tool. @param {string} run */
export function effectsOf(run) {
  return sql('SELECT tool, status::text AS status, key, result FROM durable_ledger.effects WHERE run = $1 ORDER BY tool',
    [run]);
}

/**
 * Waits until `check()` is true (a condition of the test's process), polling.
 * @param {() => boolean} check
 * @param {string} what
 */
export async function until(check, what) {
  for (let i = 0; !check(); i += 1) {
    assert.ok(i < 3000, `waited too long for ${what}`);
    await new Promise((resolve) => { setTimeout(resolve, 10); });
  }
}

/**
 * Waits until a row says so: polls `query` until `check` accepts its rows.
 * @param {string} query
 * @param {unknown[]} params
 * @param {(rows: any[]) => boolean} check
 */
export async function waitFor(query, params, check) {
  for (let i = 0; ; i += 1) {
    const rows = await sql(query, params);
    if (check(rows)) return rows;
    assert.ok(i < 600, `waited too long for ${query} ${JSON.stringify(params)}: ${JSON.stringify(rows)}`);
    await new Promise((resolve) => { setTimeout(resolve, 100); });
  }
}
