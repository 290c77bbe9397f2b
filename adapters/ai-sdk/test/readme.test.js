// The README's first program, run as a new user runs it: twice with one run id
// (the second pays nothing: the whole conversation replays), then with another.
// DURABLE_LEDGER_DSN: a database with durable_ledger.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
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

test("the README's chat route: the run is the request, so the second message's reminder is sent, and a retried request sends nothing", async () => {
  const { randomUUID: uuid } = await import('node:crypto');
  const pg = (await import('pg')).default;
  const { tool } = await import('ai');
  const { MockLanguageModelV4 } = await import('ai/test');
  const { z } = await import('zod');
  const { Ledger } = await import('durable-ledger');
  const { durableTools } = await import('../src/index.js');
  const readme = readFileSync(new URL('../README.md', import.meta.url), 'utf8');
  const block = readme.slice(readme.indexOf('## Which call is which')).match(/```js\n([\s\S]*?)```/);
  assert.ok(block, 'the README has a chat route under "Which call is which"');
  const dir = fileURLToPath(new URL('../build/', import.meta.url));
  mkdirSync(dir, { recursive: true });
  const script = `${dir}chat-route-${uuid()}.mjs`;
  writeFileSync(script, [
    "import { convertToModelMessages, generateText, stepCountIs } from 'ai';",
    "import { agentAttempt, ledgerStopped, requestRun } from 'durable-ledger-ai-sdk';",
    'const { ledger, model, tools } = globalThis.readmeChat;',
    block[1]].join('\n'));

  const pool = new pg.Pool({ connectionString: dsn, max: 4 });
  const sent = [];
  const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
    outputTokens: { total: 1, text: 1, reasoning: 0 } };
  globalThis.readmeChat = {
    ledger: new Ledger(pool, { consoleWarn: false }),
    tools: durableTools({
      sendReminder: tool({ description: 'Sends a payment reminder', inputSchema: z.object({ customer: z.string() }),
        execute: async ({ customer }) => { sent.push(customer); return { reminder: sent.length }; } }),
    }),
    model: new MockLanguageModelV4({ doGenerate: async ({ prompt }) => (prompt.at(-1).role === 'user'
      ? { content: [{ type: 'tool-call', toolCallId: `call_${uuid()}`, toolName: 'sendReminder', input: '{"customer":"ACME"}' }],
        finishReason: { unified: 'tool-calls', raw: undefined }, usage, warnings: [] }
      : { content: [{ type: 'text', text: `sent ${JSON.stringify(prompt.at(-1).content[0].output.value)}` }],
        finishReason: { unified: 'stop', raw: undefined }, usage, warnings: [] }) }),
  };
  try {
    const { POST } = await import(script);
    const chat = `ai-sdk-readme-chat-${uuid()}`;
    const user = (text) => ({ id: `m-${uuid()}`, role: 'user', parts: [{ type: 'text', text }] });
    const post = async (messages) => (await POST(new Request('http://app/api/chat', {
      method: 'POST', body: JSON.stringify({ id: chat, messages }) }))).json();
    const messages = [user('Remind ACME to pay.')];
    assert.deepEqual(await post(messages), { text: 'sent {"reminder":1}' });
    messages.push({ id: `a-${uuid()}`, role: 'assistant', parts: [{ type: 'text', text: 'sent' }] },
      user('Still unpaid: remind ACME again.'));
    assert.deepEqual(await post(messages), { text: 'sent {"reminder":2}' }, 'the second reminder is sent');
    assert.deepEqual(await post(messages), { text: 'sent {"reminder":2}' }, 'a retried request replays');
    assert.deepEqual(sent, ['ACME', 'ACME']);
  } finally {
    delete globalThis.readmeChat;
    rmSync(script, { force: true });
    await pool.end();
  }
});
