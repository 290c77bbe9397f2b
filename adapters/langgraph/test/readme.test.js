// The README's example (its ts block under "## Example"), compiled as a TypeScript user
// would (tsc --strict, against the package's own declarations: the package resolves by
// its name here) and run twice on one thread: the first process books, the second --
// its MemorySaver new, the thread started over -- replays the model's turns and the
// booking, and answers the same.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { randomUUID } from 'node:crypto';
import { runNode } from '../../test-support/worker.js';
import { DSN, closeAdmin, effectsOf } from './helpers.js';

const root = fileURLToPath(new URL('..', import.meta.url));
const tsc = fileURLToPath(new URL('../node_modules/.bin/tsc', import.meta.url));

before(() => {
  const build = spawnSync(tsc, ['-p', 'tsconfig.build.json'], { cwd: root, encoding: 'utf8' });
  assert.equal(build.status, 0, `tsc generates the declarations: ${build.stdout}${build.stderr}`);
});
after(closeAdmin);

test("the README's example compiles under tsc --strict, books once, and a second process on the thread replays it", async () => {
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const block = readme.slice(readme.indexOf('## Example')).match(/```ts\n([\s\S]*?)```/);
  assert.ok(block, 'the README has a ts block under "## Example"');
  mkdirSync(`${root}build`, { recursive: true });
  writeFileSync(`${root}build/example.ts`, block[1]);
  const compiled = spawnSync(tsc, ['-p', 'tsconfig.example.json'], { cwd: root, encoding: 'utf8' });
  assert.equal(compiled.status, 0, `tsc --strict compiles the example: ${compiled.stdout}${compiled.stderr}`);
  const thread = `lg-readme-${randomUUID()}`;
  const run = () => runNode(`${root}build/example.js`, [thread], { DATABASE_URL: DSN }, { cwd: root });
  const first = await run();
  assert.equal(first.code, 0, first.stdout + first.stderr);
  // the key is the tool call's (the thread, the tool, the call's id) and its attempt
  assert.match(first.stdout, new RegExp(`^airline: booking TP1351 \\(key call:\\["${thread}","book_flight","[^"]+"\\]#1\\)$`, 'm'));
  assert.match(first.stdout, /^agent: Booked TP1351\.$/m);
  const second = await run();
  assert.equal(second.code, 0, second.stdout + second.stderr);
  assert.doesNotMatch(second.stdout, /airline: booking/, 'the second process books nothing');
  assert.match(second.stdout, /^agent: Booked TP1351\.$/m);
  const rows = await effectsOf(thread);
  assert.deepEqual(rows.filter((r) => r.tool === 'book_flight').map((r) => r.status), ['completed']);
  assert.equal(rows.filter((r) => r.tool.startsWith('model.')).length, 2, 'the two model turns, recorded');
});
