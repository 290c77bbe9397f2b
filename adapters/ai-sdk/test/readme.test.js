// The README's first program, run as a new user runs it: twice with one run id
// (the second pays nothing: the whole conversation replays), then with another.
// DURABLE_LEDGER_DSN: a database with durable_ledger.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';

const dsn = process.env.DURABLE_LEDGER_DSN;
if (!dsn) throw new Error('set DURABLE_LEDGER_DSN to a connection string of a database with durable_ledger');

function node(args) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, { env: { ...process.env, DATABASE_URL: dsn } });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => { stdout += d; });
    child.stderr.on('data', (d) => { stderr += d; });
    child.on('error', reject);
    child.on('close', (code) => resolve({ code, stdout, stderr }));
  });
}

test("the README's first program pays once; run again, it replays and pays nothing", async () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const block = readme.slice(readme.indexOf('## A first run')).match(/```js\n([\s\S]*?)```/);
  assert.ok(block, 'the README has a js block under "A first run"');
  // inside the package (build/ is ignored), where its own name and its dependencies resolve
  const dir = fileURLToPath(new URL('../build/', import.meta.url));
  mkdirSync(dir, { recursive: true });
  const script = `${dir}pay.mjs`;
  writeFileSync(script, block[1]);
  const run = `ai-sdk-readme-${randomUUID()}`;
  const first = await node([script, run]);
  assert.equal(first.code, 0, `${first.stdout}${first.stderr}`);
  assert.equal(first.stdout, 'bank: paying 4200 for INV-9\nPaid INV-9.\n');
  const again = await node([script, run]);
  assert.equal(again.code, 0, `${again.stdout}${again.stderr}`);
  assert.equal(again.stdout, 'Paid INV-9.\n', 'the rerun replays: no payment');
  const other = await node([script, `${run}-2`]);
  assert.equal(other.stdout, 'bank: paying 4200 for INV-9\nPaid INV-9.\n', 'another run pays');
});
