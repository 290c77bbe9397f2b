// The TypeScript agent-loop example (examples/agent-loop.ts), compiled with tsc as a
// TypeScript user would, then run against a real server, directly and through PgBouncer
// in transaction mode: a worker is killed (SIGKILL) mid-run with its parallel tool calls
// done, a new worker replays them (asked for in another order) and performs the rest;
// every effect reaches the downstream systems once, and the ledger shows it.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@host/db \
//   DURABLE_LEDGER_PGBOUNCER_DSN=postgresql://postgres@host:6432/db npm test
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { randomUUID } from 'node:crypto';
import pg from 'pg';

const dsn = process.env.DURABLE_LEDGER_DSN;
if (!dsn) {
  throw new Error('set DURABLE_LEDGER_DSN to a superuser connection string of a database with durable_ledger');
}
const bouncerDsn = process.env.DURABLE_LEDGER_PGBOUNCER_DSN;
const needsBouncer = bouncerDsn ? {} : { skip: 'DURABLE_LEDGER_PGBOUNCER_DSN is not set' };
const root = fileURLToPath(new URL('..', import.meta.url));
const compiled = fileURLToPath(new URL('../build/examples/agent-loop.js', import.meta.url));

before(() => {
  const tsc = spawnSync(fileURLToPath(new URL('../node_modules/.bin/tsc', import.meta.url)),
    ['-p', 'tsconfig.examples.json'], { cwd: root, encoding: 'utf8' });
  assert.equal(tsc.status, 0, `tsc compiles the example: ${tsc.stdout}${tsc.stderr}`);
});

async function runExample(url) {
  const run = `ts-example-${randomUUID()}`;
  const { code, stdout, stderr } = await new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [compiled, url, run]);
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { err += d; });
    child.on('error', reject);
    child.on('close', (c) => resolve({ code: c, stdout: out, stderr: err }));
  });
  assert.equal(code, 0, `exit code 0; stdout: ${stdout}; stderr: ${stderr}`);
  assert.match(stdout, /killed before turn 3/);
  assert.match(stdout, /the first worker died \(SIGKILL\)/);
  assert.match(stdout, /^ok - /m);
  const admin = new pg.Client({ connectionString: dsn });
  await admin.connect();
  try {
    const effects = (await admin.query(
      `SELECT tool, status::text AS status, lease_epoch::int AS epoch FROM durable_ledger.effects
        WHERE run = $1 ORDER BY tool, status, lease_epoch`, [run])).rows;
    assert.deepEqual(effects.map((e) => `${e.tool} ${e.status} ${e.epoch}`), [
      'bank.pay completed 1', 'bank.pay completed 1', 'bank.pay failed 1',
      'mail.send completed 2', 'mail.send completed 2', 'mail.send completed 2',
    ]);
    const replays = (await admin.query(
      "SELECT count(*)::int AS n FROM durable_ledger.audit_log WHERE run = $1 AND event = 'replay'", [run])).rows[0].n;
    assert.equal(replays, 3, 'the second worker replayed the three payments');
  } finally {
    await admin.end();
  }
}

test('the TypeScript agent loop: a worker killed mid-run, the rerun replays its parallel calls', async () => {
  await runExample(dsn);
});

test('the TypeScript agent loop on a pg.Pool through PgBouncer in transaction mode', needsBouncer, async () => {
  await runExample(bouncerDsn);
});
