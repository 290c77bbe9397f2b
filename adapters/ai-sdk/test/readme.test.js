// The README's first program, run as a new user runs it: twice with one run id
// (the second pays nothing: the whole conversation replays), then with another; and
// its chat route, served three requests.  DURABLE_LEDGER_DSN: see support.js.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { tool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { z } from 'zod';
import { readmeBlocks } from '../../test-support/readme.js';
import { runNode } from '../../test-support/worker.js';
import { durableTools } from '../src/index.js';
import { answer, calling, cluster, dsn, toolCall } from './support.js';

const db = cluster();
const readme = new URL('../README.md', import.meta.url);
/** A script of the README's, run inside the package (build/ is ignored), where its own name and its dependencies resolve. */
const dir = fileURLToPath(new URL('../build/', import.meta.url));
const node = (script, run) => runNode(script, [run], { DATABASE_URL: dsn });

test("the README's first program pays once; run again, it replays and pays nothing", async () => {
  const [block] = readmeBlocks(readme, '## A first run', '## What each piece does');
  assert.ok(block, 'the README has a js block under "A first run"');
  mkdirSync(dir, { recursive: true });
  const script = `${dir}pay.mjs`;
  writeFileSync(script, block);
  const run = `ai-sdk-readme-${randomUUID()}`;
  const first = await node(script, run);
  assert.equal(first.code, 0, `${first.stdout}${first.stderr}`);
  assert.equal(first.stdout, 'bank: paying 4200 for INV-9\nPaid INV-9.\n');
  const again = await node(script, run);
  assert.equal(again.code, 0, `${again.stdout}${again.stderr}`);
  assert.equal(again.stdout, 'Paid INV-9.\n', 'the rerun replays: no payment');
  const other = await node(script, `${run}-2`);
  assert.equal(other.stdout, 'bank: paying 4200 for INV-9\nPaid INV-9.\n', 'another run pays');
});

test("the README's chat route: the run is the request, so the second message's reminder is sent, and a retried request sends nothing", async () => {
  const [block] = readmeBlocks(readme, '## Which call is which', '## When the ledger stops a call');
  assert.ok(block, 'the README has a chat route under "Which call is which"');
  mkdirSync(dir, { recursive: true });
  const script = `${dir}chat-route-${randomUUID()}.mjs`;
  writeFileSync(script, [
    "import { convertToModelMessages, generateText, stepCountIs } from 'ai';",
    "import { agentAttempt, ledgerStopped, requestRun } from 'durable-ledger-ai-sdk';",
    'const { ledger, model, tools } = globalThis.readmeChat;',
    block].join('\n'));

  const sent = [];
  globalThis.readmeChat = {
    ledger: db.ledger,
    tools: durableTools({
      sendReminder: tool({ description: 'Sends a payment reminder', inputSchema: z.object({ customer: z.string() }),
        execute: async ({ customer }) => { sent.push(customer); return { reminder: sent.length }; } }),
    }),
    model: new MockLanguageModelV4({ doGenerate: async ({ prompt }) => (prompt.at(-1).role === 'user'
      ? calling(toolCall('sendReminder', { customer: 'ACME' }))
      : answer(`sent ${JSON.stringify(prompt.at(-1).content[0].output.value)}`)) }),
  };
  try {
    const { POST } = await import(script);
    const chat = `ai-sdk-readme-chat-${randomUUID()}`;
    const user = (text) => ({ id: `m-${randomUUID()}`, role: 'user', parts: [{ type: 'text', text }] });
    const post = async (messages) => (await POST(new Request('http://app/api/chat', {
      method: 'POST', body: JSON.stringify({ id: chat, messages }) }))).json();
    const messages = [user('Remind ACME to pay.')];
    assert.deepEqual(await post(messages), { text: 'sent {"reminder":1}' });
    messages.push({ id: `a-${randomUUID()}`, role: 'assistant', parts: [{ type: 'text', text: 'sent' }] },
      user('Still unpaid: remind ACME again.'));
    assert.deepEqual(await post(messages), { text: 'sent {"reminder":2}' }, 'the second reminder is sent');
    assert.deepEqual(await post(messages), { text: 'sent {"reminder":2}' }, 'a retried request replays');
    assert.deepEqual(sent, ['ACME', 'ACME']);
  } finally {
    delete globalThis.readmeChat;
    rmSync(script, { force: true });
  }
});
