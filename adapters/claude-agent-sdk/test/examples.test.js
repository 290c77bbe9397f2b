// The README's example, run as a user would: its first js block under "## Example" (the
// tools of a session through the SDK's own server object, a session and then the session
// resumed), written into build/ of this package, where the package itself, the SDKs, zod
// and pg resolve; run twice on one session.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { randomUUID } from 'node:crypto';
import { readmeBlocks } from '../../test-support/readme.js';
import { runNode } from '../../test-support/worker.js';
import { DSN, effectsOf } from './support/setup.js';

const dir = fileURLToPath(new URL('../build/example/', import.meta.url));
/** Runs the example in `dir` on a session. @param {string} session */
const node = (session) => runNode('pay.mjs', [session], { DATABASE_URL: DSN }, { cwd: dir });

test("the README's example: the bank is paid once, the resumed session gets the recorded answer, a second process pays nothing", async () => {
  const [block] = readmeBlocks(new URL('../README.md', import.meta.url), '## Example', '### With query()');
  assert.ok(block, 'the README has a js block under "## Example"');
  mkdirSync(dir, { recursive: true });
  writeFileSync(`${dir}pay.mjs`, block);
  const session = randomUUID();
  const first = await node(session);
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
  const again = await node(session);
  assert.equal(again.code, 0, again.stderr);
  assert.doesNotMatch(again.stdout, /bank: paying/);
  assert.deepEqual((await effectsOf(session)).map((e) => [e.tool, e.status]), [['pay_invoice', 'completed']]);
});
