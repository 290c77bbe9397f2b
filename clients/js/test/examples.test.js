// The README's first program (its first js block, "A first run"), run as a user
// would, twice on one run; and the TypeScript agent-loop example
// (examples/agent-loop.ts), compiled with tsc as a TypeScript user would, then run
// against a real server, directly and through PgBouncer in transaction mode: a worker is
// killed (SIGKILL) mid-run with its parallel tool calls done, a new worker replays them
// (asked for in another order) and performs the rest; every effect reaches the
// downstream systems once, and the ledger shows it.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@host/db \
//   DURABLE_LEDGER_PGBOUNCER_DSN=postgresql://postgres@host:6432/db npm test
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { DSN as dsn, ADMIN_DSN, BOUNCER_DSN as bouncerDsn } from './target.js';

const needsBouncer = bouncerDsn ? {} : { skip: 'DURABLE_LEDGER_PGBOUNCER_DSN is not set' };
const root = fileURLToPath(new URL('..', import.meta.url));
const compiled = fileURLToPath(new URL('../build/examples/agent-loop.js', import.meta.url));

before(() => {
  const tscPath = fileURLToPath(new URL('../node_modules/.bin/tsc', import.meta.url));
  // the example compiles against the package's declarations, generated from src/ (npm run build)
  const build = spawnSync(tscPath, ['-p', 'tsconfig.build.json'], { cwd: root, encoding: 'utf8' });
  assert.equal(build.status, 0, `tsc generates the declarations from src/: ${build.stdout}${build.stderr}`);
  const tsc = spawnSync(tscPath, ['-p', 'tsconfig.examples.json'], { cwd: root, encoding: 'utf8' });
  assert.equal(tsc.status, 0, `tsc compiles the example: ${tsc.stdout}${tsc.stderr}`);
});

/** Runs a node script; resolves with its exit code and output. */
function node(args, env = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, { env: { ...process.env, ...env } });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { err += d; });
    child.on('error', reject);
    child.on('close', (c) => resolve({ code: c, stdout: out, stderr: err }));
  });
}

test("the README's first program: it pays once, its retry replays, and a second process on the run pays nothing", async () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const section = readme.slice(readme.indexOf('## A first run'));
  const block = section.match(/```js\n([\s\S]*?)```/);
  assert.ok(block, 'the README has a first js block under "A first run"');
  // in the package's folder, where 'durable-ledger' (the package itself) and 'pg' resolve
  const dir = fileURLToPath(new URL('../build/', import.meta.url));
  mkdirSync(dir, { recursive: true });
  const script = `${dir}first-run.mjs`;
  writeFileSync(script, block[1]);
  const run = `js-first-run-${randomUUID()}`;
  const first = await node([script, run], { DATABASE_URL: dsn });
  assert.equal(first.code, 0, `exit code 0; stdout: ${first.stdout}; stderr: ${first.stderr}`);
  assert.equal(first.stderr, '', 'no warning');
  assert.equal((first.stdout.match(/^bank: paying 4200 for INV-9 /gm) ?? []).length, 1, first.stdout);
  const receipts = [...first.stdout.matchAll(/^(?:first attempt|a retry): (.*)$/gm)].map((m) => m[1]);
  assert.equal(receipts.length, 2, first.stdout);
  assert.equal(receipts[1], receipts[0], 'the retry got the recorded receipt');
  const again = await node([script, run], { DATABASE_URL: dsn });
  assert.equal(again.code, 0, `exit code 0; stderr: ${again.stderr}`);
  assert.doesNotMatch(again.stdout, /bank: paying/);
  assert.deepEqual([...again.stdout.matchAll(/^(?:first attempt|a retry): (.*)$/gm)].map((m) => m[1]),
    [receipts[0], receipts[0]]);
  const admin = new pg.Client({ connectionString: ADMIN_DSN }); // the ledger's tables (target.js)
  await admin.connect();
  try {
    const { rows } = await admin.query(
      'SELECT tool, status::text AS status FROM durable_ledger.effects WHERE run = $1 ORDER BY tool', [run]);
    assert.deepEqual(rows, [{ tool: 'bank.pay', status: 'completed' }, { tool: 'llm.plan', status: 'completed' }]);
  } finally {
    await admin.end();
  }
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
  const admin = new pg.Client({ connectionString: ADMIN_DSN }); // the ledger's tables (target.js)
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
