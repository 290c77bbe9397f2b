// make bench, section "clients": the JavaScript client's own CPU per guarded
// call.  RUNS runs (CONCURRENCY at a time), each a token attempt of three
// guarded calls on a pg.Pool (take_lease and release_lease included), the
// tools doing nothing; prints one JSON line: calls, this process's CPU seconds
// (user + system, process.cpuUsage) and the wall time.  The server's CPU is not
// in it: it is another process.
//   node bench/client_cpu.mjs DSN RUNS CONCURRENCY
import { createRequire } from 'node:module';

const require = createRequire(new URL('../clients/js/package.json', import.meta.url));
const pg = require('pg');
const { Ledger } = await import(new URL('../clients/js/src/index.js', import.meta.url));

const [dsn, runsArg = '2000', concurrencyArg = '8'] = process.argv.slice(2);
const runs = Number(runsArg);
const concurrency = Number(concurrencyArg);
const pool = new pg.Pool({ connectionString: dsn, max: concurrency });
const ledger = new Ledger(pool, { consoleWarn: false });
const tag = `${process.pid}-${Date.now()}`;

async function oneRun(i) {
  const run = `bench-js-${tag}-${i}`;
  await ledger.tokenAttempt(run, { ttl: 60 }, async () => {
    await ledger.guarded({ run, tool: 'lookup', args: { customer: i }, perform: () => ({ ok: true }) });
    await ledger.guarded({ run, tool: 'pay', args: { invoice: i, amount: 4200 }, perform: (key) => ({ id: key.slice(0, 8) }) });
    await ledger.guarded({ run, tool: 'mail', args: { to: `c${i}@example.com` }, perform: () => ({ sent: true }) });
  });
}

async function drive(first, count) {
  let next = first;
  const worker = async () => {
    while (next < first + count) await oneRun(next++);
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
}

await drive(0, Math.min(200, runs)); // warm-up: the JIT, the pool's connections
const cpu = process.cpuUsage();
const wall = process.hrtime.bigint();
await drive(1_000_000, runs);
const used = process.cpuUsage(cpu);
const elapsed = Number(process.hrtime.bigint() - wall) / 1e9;
await pool.end();
console.log(JSON.stringify({ client: 'js', calls: runs * 3, cpu_seconds: (used.user + used.system) / 1e6, wall_seconds: elapsed }));
