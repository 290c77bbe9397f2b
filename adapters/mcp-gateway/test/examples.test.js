// The README's example, run as a user would: its two js blocks under "## Example" (the
// upstream bank server and the program that starts the gateway in front of it and pays
// through it twice, from two sessions of one run), written into build/ of this package,
// where the package itself, the MCP SDK and pg resolve; run twice on one run.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { randomUUID } from 'node:crypto';
import { readmeBlocks } from '../../test-support/readme.js';
import { runNode } from '../../test-support/worker.js';
import { DSN, effectsOf } from './support/setup.js';

const dir = fileURLToPath(new URL('../build/example/', import.meta.url));
/** Runs the program in `dir` (where it finds bank-server.mjs) on a run. @param {string} run */
const node = (run) => runNode('pay.mjs', [run], { DATABASE_URL: DSN }, { cwd: dir });

test("the README's example: the bank is paid once, the agent's second session gets the recorded answer, a second process pays nothing", async () => {
  const blocks = readmeBlocks(new URL('../README.md', import.meta.url), '## Example', '## Running it');
  assert.equal(blocks.length, 2, 'the bank server and the program');
  mkdirSync(dir, { recursive: true });
  writeFileSync(`${dir}bank-server.mjs`, blocks[0]);
  writeFileSync(`${dir}pay.mjs`, blocks[1]);
  const run = `mcp-readme-${randomUUID()}`;
  const first = await node(run);
  assert.equal(first.code, 0, `exit code 0; stdout: ${first.stdout}; stderr: ${first.stderr}`);
  assert.equal((first.stderr.match(/^bank: paying 4200 for INV-9 \(key [0-9a-f]{12}\.\.\.\)$/gm) ?? []).length, 1,
    first.stderr);
  const lines = [...first.stdout.matchAll(/^(the agent|the agent after a crash): (.*) (\{.*\})$/gm)];
  assert.equal(lines.length, 2, first.stdout);
  assert.equal(lines[1][2], lines[0][2], 'the same answer');
  assert.match(lines[0][2], /paid INV-9, payment pay-[0-9a-f]{8}/);
  assert.equal(JSON.parse(lines[0][3])['durable-ledger/replayed'], false);
  assert.equal(JSON.parse(lines[1][3])['durable-ledger/replayed'], true);
  const again = await node(run);
  assert.equal(again.code, 0, again.stderr);
  assert.doesNotMatch(again.stderr, /bank: paying/);
  assert.deepEqual([...again.stdout.matchAll(/^the agent[^:]*: (.*) \{/gm)].map((m) => m[1]), [lines[0][2], lines[0][2]]);
  assert.deepEqual((await effectsOf(run)).map((e) => [e.tool, e.status]), [['bank.pay_invoice', 'completed']]);
});
