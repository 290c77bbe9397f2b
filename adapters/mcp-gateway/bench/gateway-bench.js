// make bench's gateway section (bench/bench.py --only gateway): the latency a tool call
// gains through the gateway.  An MCP client (the SDK's own) calls the bench upstream
// (bench/upstream.js, stdio) directly, and through the gateway's bin (stdio, which runs the
// upstream as its own child): a side-effecting tool (begin_effect and complete_effect, one
// transaction each, under the session's token lease) and a read-only one (passed
// straight through).  For scale, a fourth side makes the ledger's part alone: the same
// begin_effect and complete_effect from this process (the JavaScript client's guarded()
// under a token lease, on a pg.Pool), no MCP.  The sides run interleaved, round by round,
// each round a new connection (and through the gateway a new session and run) making calls
// one after another for --seconds; every call's latency is kept.  Prints one JSON line: p50
// and p99 (ms) and calls/s of each side, over all rounds.
//
//   node bench/gateway-bench.js --dsn postgresql://postgres@/db?host=... [--seconds 5] [--rounds 5]
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parseArgs } from 'node:util';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { Ledger } from 'durable-ledger';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport, getDefaultEnvironment } from '@modelcontextprotocol/sdk/client/stdio.js';

const { values } = parseArgs({
  options: {
    dsn: { type: 'string' },
    seconds: { type: 'string', default: '5' },
    rounds: { type: 'string', default: '5' },
  },
});
if (!values.dsn) throw new Error('--dsn postgresql://... (a database with durable_ledger)');
const seconds = Number(values.seconds);
const rounds = Number(values.rounds);
const upstream = fileURLToPath(new URL('./upstream.js', import.meta.url));
const bin = fileURLToPath(new URL('../bin/durable-ledger-mcp-gateway.js', import.meta.url));
const config = path.join(mkdtempSync(path.join(tmpdir(), 'gateway-bench-')), 'gateway.json');
writeFileSync(config, JSON.stringify({
  ledger: { connectionString: values.dsn, ttl: 60, poolSize: 4 },
  servers: {
    bench: {
      command: process.execPath,
      args: [upstream],
      tools: { pay: { sideEffecting: true }, lookup: { sideEffecting: false } },
    },
  },
}));

/** @param {string[]} command */
async function connect(command) {
  const client = new Client({ name: 'gateway-bench', version: '1.0.0' });
  await client.connect(new StdioClientTransport({
    command: process.execPath, args: command, env: getDefaultEnvironment(), stderr: 'inherit',
  }));
  return client;
}

/**
 * One round of one side: a new connection, calls one after another for `seconds`.
 * @param {string[]} command
 * @param {string} tool
 * @param {number[]} latencies  every call's milliseconds are added
 */
async function round(command, tool, latencies) {
  const client = await connect(command);
  const run = `gateway-bench-${randomUUID()}`;
  for (let i = 0; i < 20; i += 1) { // warm-up: the connection, the lease, the plans
    await client.callTool({ name: tool, arguments: { invoice: `warm-${i}`, amount: i }, _meta: { 'durable-ledger/run': run } });
  }
  const end = performance.now() + seconds * 1000;
  let n = 0;
  while (performance.now() < end) {
    const t0 = performance.now();
    const r = await client.callTool({ name: tool, arguments: { invoice: `INV-${n}`, amount: n }, _meta: { 'durable-ledger/run': run } });
    latencies.push(performance.now() - t0);
    if (r.isError) throw new Error(`${tool}: ${JSON.stringify(r)}`);
    n += 1;
  }
  await client.close();
}

/**
 * One round of the ledger's part alone: guarded() calls one after another in one token
 * attempt, as the gateway makes them (a perform that answers at once).
 * @param {number[]} latencies
 */
async function ledgerRound(latencies) {
  const pool = new pg.Pool({ connectionString: values.dsn, max: 4 });
  const ledger = new Ledger(pool, { consoleWarn: false });
  const run = `gateway-bench-ledger-${randomUUID()}`;
  await ledger.tokenAttempt(run, { ttl: 60 }, async () => {
    for (let i = 0; i < 20; i += 1) {
      await ledger.guarded({ run, tool: 'bench.pay', args: { invoice: `warm-${i}` }, perform: async () => ({}) });
    }
    const end = performance.now() + seconds * 1000;
    let n = 0;
    while (performance.now() < end) {
      const t0 = performance.now();
      await ledger.guarded({ run, tool: 'bench.pay', args: { invoice: `INV-${n}`, amount: n }, perform: async () => ({}) });
      latencies.push(performance.now() - t0);
      n += 1;
    }
  });
  await pool.end();
}

const sides = {
  direct: { command: [upstream], tool: 'pay', ms: /** @type {number[]} */ ([]) },
  gateway_effect: { command: [bin, '--config', config], tool: 'pay', ms: /** @type {number[]} */ ([]) },
  gateway_read: { command: [bin, '--config', config], tool: 'lookup', ms: /** @type {number[]} */ ([]) },
  ledger_only: { command: null, tool: null, ms: /** @type {number[]} */ ([]) },
};
for (let r = 0; r < rounds; r += 1) {
  for (const side of Object.values(sides)) {
    if (side.command) await round(side.command, /** @type {string} */ (side.tool), side.ms);
    else await ledgerRound(side.ms);
  }
}
/** @param {number[]} xs @param {number} q */
const quantile = (xs, q) => {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))];
};
const out = Object.fromEntries(Object.entries(sides).map(([name, s]) => [name, {
  calls: s.ms.length,
  per_second: s.ms.length / (rounds * seconds),
  p50: quantile(s.ms, 0.5),
  p99: quantile(s.ms, 0.99),
}]));
console.log(JSON.stringify(out));
