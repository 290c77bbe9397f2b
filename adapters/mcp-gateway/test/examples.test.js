// The README's example, run as a user would: its two js blocks under "## Example" (the
// upstream bank server and the program that starts the gateway in front of it and pays
// through it twice, from two sessions of one run), written into build/ of this package,
// where the package itself, the MCP SDK and pg resolve; run twice on one run.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { randomUUID } from 'node:crypto';
import { DSN, effectsOf } from './support/setup.js';

/** Runs a node script in `cwd`; resolves with its exit code and output. */
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

test("the README's example: the bank is paid once, the agent's second session gets the recorded answer, a second process pays nothing", async () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const section = readme.slice(readme.indexOf('## Example'), readme.indexOf('## Running it'));
  const blocks = [...section.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);
  assert.equal(blocks.length, 2, 'the bank server and the program');
  const dir = fileURLToPath(new URL('../build/example/', import.meta.url));
  mkdirSync(dir, { recursive: true });
  writeFileSync(`${dir}bank-server.mjs`, blocks[0]);
  writeFileSync(`${dir}pay.mjs`, blocks[1]);
  const run = `mcp-readme-${randomUUID()}`;
  const first = await node(['pay.mjs', run], dir, { DATABASE_URL: DSN });
  assert.equal(first.code, 0, `exit code 0; stdout: ${first.stdout}; stderr: ${first.stderr}`);
  assert.equal((first.stderr.match(/^bank: paying 4200 for INV-9 \(key [0-9a-f]{12}\.\.\.\)$/gm) ?? []).length, 1,
    first.stderr);
  const lines = [...first.stdout.matchAll(/^(the agent|the agent after a crash): (.*) (\{.*\})$/gm)];
  assert.equal(lines.length, 2, first.stdout);
  assert.equal(lines[1][2], lines[0][2], 'the same answer');
  assert.match(lines[0][2], /paid INV-9, payment pay-[0-9a-f]{8}/);
  assert.equal(JSON.parse(lines[0][3])['durable-ledger/replayed'], false);
  assert.equal(JSON.parse(lines[1][3])['durable-ledger/replayed'], true);
  const again = await node(['pay.mjs', run], dir, { DATABASE_URL: DSN });
  assert.equal(again.code, 0, again.stderr);
  assert.doesNotMatch(again.stderr, /bank: paying/);
  assert.deepEqual([...again.stdout.matchAll(/^the agent[^:]*: (.*) \{/gm)].map((m) => m[1]), [lines[0][2], lines[0][2]]);
  assert.deepEqual((await effectsOf(run)).map((e) => [e.tool, e.status]), [['bank.pay_invoice', 'completed']]);
});
