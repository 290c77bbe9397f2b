// The README's program ("A first run"), compiled with tsc --strict as a TypeScript app
// would and run twice on one run id against the database: one payment, two identical
// final outputs each time, nothing performed by the second process; and the package's
// declarations (generated from the JSDoc of src/) checked against a TypeScript consumer
// (test/types/consumer.ts, whose misuses marked @ts-expect-error must not compile).
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { runNode } from '../../test-support/worker.js';
import { DSN, runId } from './target.js';

const root = fileURLToPath(new URL('..', import.meta.url));
const tsc = fileURLToPath(new URL('../node_modules/.bin/tsc', import.meta.url));

before(() => {
  const build = spawnSync(tsc, ['-p', 'tsconfig.build.json'], { cwd: root, encoding: 'utf8' });
  assert.equal(build.status, 0, `tsc generates the declarations from src/: ${build.stdout}${build.stderr}`);
});

test('the declarations type-check a TypeScript consumer under --strict, and reject its marked misuses', () => {
  const check = spawnSync(tsc, ['-p', 'tsconfig.json'], { cwd: root, encoding: 'utf8' });
  assert.equal(check.status, 0, `${check.stdout}${check.stderr}`);
  const consumer = readFileSync(new URL('./types/consumer.ts', import.meta.url), 'utf8');
  assert.ok((consumer.match(/@ts-expect-error/g) ?? []).length >= 4, 'the consumer marks its misuses');
});

test("the README's first program: it pays once, its rerun replays; a second process on the run pays nothing", async () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const block = readme.slice(readme.indexOf('## A first run')).match(/```ts\n([\s\S]*?)```/);
  assert.ok(block, 'the README has a ts block under "A first run"');
  const dir = fileURLToPath(new URL('../build/readme/', import.meta.url));
  mkdirSync(dir, { recursive: true });
  writeFileSync(`${dir}first-run.ts`, block[1]);
  writeFileSync(`${dir}tsconfig.json`, JSON.stringify({
    compilerOptions: {
      strict: true, module: 'nodenext', moduleResolution: 'nodenext', target: 'es2022', types: ['node'],
      rootDir: '.', outDir: '.', skipLibCheck: true,
    },
    files: ['first-run.ts'],
  }));
  const compiled = spawnSync(tsc, ['-p', `${dir}tsconfig.json`], { cwd: dir, encoding: 'utf8' });
  assert.equal(compiled.status, 0, `tsc --strict compiles it: ${compiled.stdout}${compiled.stderr}`);

  const run = runId('readme');
  const first = await runNode(`${dir}first-run.js`, [run], { DATABASE_URL: /** @type {string} */ (DSN) });
  assert.equal(first.code, 0, `exit code 0; stdout: ${first.stdout}; stderr: ${first.stderr}`);
  assert.equal(first.stderr, '', 'no warning');
  assert.equal((first.stdout.match(/^bank: paying 4200 for INV-9 /gm) ?? []).length, 1, first.stdout);
  assert.match(first.stdout, /^first run: Paid INV-9\.\na rerun: Paid INV-9\.$/m);
  const again = await runNode(`${dir}first-run.js`, [run], { DATABASE_URL: /** @type {string} */ (DSN) });
  assert.equal(again.code, 0, `exit code 0; stderr: ${again.stderr}`);
  assert.doesNotMatch(again.stdout, /bank: paying/);
  assert.match(again.stdout, /^first run: Paid INV-9\.\na rerun: Paid INV-9\.$/m);
  const admin = new pg.Client({ connectionString: DSN });
  await admin.connect();
  try {
    const { rows } = await admin.query(
      'SELECT tool, status::text AS status FROM durable_ledger.effects WHERE run = $1 ORDER BY tool, created_at', [run]);
    assert.deepEqual(rows, [
      { tool: 'model.openai-agents', status: 'completed' }, { tool: 'model.openai-agents', status: 'completed' },
      { tool: 'pay_invoice', status: 'completed' },
    ]);
  } finally {
    await admin.end();
  }
});
