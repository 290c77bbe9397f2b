// The README's example, run as a user would: its first js block under "## Example" (the
// tools of a session through the SDK's own server object, a session and then the session
// resumed), written into build/ of this package, where the package itself, the SDKs, zod
// and pg resolve; run twice on one session.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { randomUUID } from 'node:crypto';
import { DSN, effectsOf } from './support/setup.js';

/** Runs a node script; resolves with its exit code and output. */
function node(args, cwd, env = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, { cwd, env: { ...process.env, ...env } });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { err += d; });
    child.on('error', reject);
    child.on('close', (c) => resolve({ code: c, stdout: out, stderr: err }));
  });
}

test("the README's example: the bank is paid once, the resumed session gets the recorded answer, a second process pays nothing", async () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const section = readme.slice(readme.indexOf('## Example'), readme.indexOf('### With query()'));
  const block = section.match(/```js\n([\s\S]*?)```/);
  assert.ok(block, 'the README has a js block under "## Example"');
  const dir = fileURLToPath(new URL('../build/example/', import.meta.url));
  mkdirSync(dir, { recursive: true });
  writeFileSync(`${dir}pay.mjs`, block[1]);
  const session = randomUUID();
  const first = await node(['pay.mjs', session], dir, { DATABASE_URL: DSN });
  assert.equal(first.code, 0, `exit code 0; stdout: ${first.stdout}; stderr: ${first.stderr}`);
  assert.equal(first.stderr, '', 'no warning');
  assert.equal((first.stdout.match(/^bank: paying 4200 for INV-9 \(key [0-9a-f]{12}\.\.\.\)$/gm) ?? []).length, 1,
    first.stdout);
  const lines = [...first.stdout.matchAll(/^(session|resumed): (.*) (\{.*\})$/gm)];
  assert.deepEqual(lines.map((l) => l[1]), ['session', 'resumed'], first.stdout);
  assert.equal(lines[1][2], lines[0][2], 'the same answer');
  assert.match(lines[0][2], /paid INV-9, payment pay-[0-9a-f]{8}/);
  assert.equal(JSON.parse(lines[0][3])['durable-ledger/replayed'], false);
  assert.equal(JSON.parse(lines[1][3])['durable-ledger/replayed'], true);
  const again = await node(['pay.mjs', session], dir, { DATABASE_URL: DSN });
  assert.equal(again.code, 0, again.stderr);
  assert.doesNotMatch(again.stdout, /bank: paying/);
  assert.deepEqual((await effectsOf(session)).map((e) => [e.tool, e.status]), [['pay_invoice', 'completed']]);
});
