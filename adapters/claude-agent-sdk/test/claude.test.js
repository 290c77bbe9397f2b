// The adapter through the Claude Agent SDK's own server object: custom tools made with
// ledgerTool() on an SDK MCP server (createSdkMcpServer(...).instance, connected in memory
// to an MCP client that plays Claude's part: the CLI and a model cannot run offline),
// with the session id as the run.  The story of the issue: a worker SIGKILLed in the
// middle of the payment of a step that also sends an e-mail; the session resumed: the
// e-mail replayed, the payment paused for a person; resolved, resumed again: replayed, the
// run finishes; each effect once on the effects server.  Then a completed session's
// replay, read-only tools, an abandoned run and a refused tool as typed errors, forks,
// abortOnStop, tools outside an attempt, and the MCP gateway for the session's MCP tools.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@host/db node --test test/
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { createSdkMcpServer } from '@anthropic-ai/claude-agent-sdk';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { EffectPaused, RunAbandoned, RunStopped, ToolRefused } from 'durable-ledger';
import { z } from 'zod';
import { ForkNotCarried, claudeAttempt, forkRun, gatewayServer, ledgerTool } from '../src/index.js';
import { makeEffect, startEffectsServer } from '../../test-support/effects-server.js';
import { spawnWorker } from '../../test-support/worker.js';
import { billingTools, invoiceScript, playScript } from './support/agent.js';
import { DSN, effectsOf, ledgerPool, printed, sql, text } from './support/setup.js';

const WORKER = fileURLToPath(new URL('./support/worker.js', import.meta.url));

/** @type {Awaited<ReturnType<typeof startEffectsServer>>} */
let effects;
/** @type {ReturnType<typeof ledgerPool>} */
let db;
before(async () => {
  effects = await startEffectsServer();
  db = ledgerPool();
});
after(async () => {
  await db.pool.end();
  await effects.close();
});

const count = (op, invoice) => effects.calls(op).filter((c) => JSON.stringify(c.body).includes(invoice)).length;

/** A worker on the session, run to its end. */
async function worker(spec, invoice) {
  const w = spawnWorker(WORKER, [JSON.stringify(spec), invoice], { DURABLE_LEDGER_DSN: DSN, EFFECTS_URL: effects.url });
  return w.exit;
}

test('a worker SIGKILLed mid-payment: the resumed session replays the e-mail and pauses the payment; resolved, it replays and the run finishes, each effect once', async () => {
  const session = randomUUID();
  const invoice = `INV-${session}`;
  const held = effects.hold('pay'); // the payment happens; its answer never comes
  const first = spawnWorker(WORKER, [JSON.stringify({ sessionId: session }), invoice],
    { DURABLE_LEDGER_DSN: DSN, EFFECTS_URL: effects.url });
  const payment = await held;
  await first.line(/^result send_email /m); // the other call of the step is done
  first.kill();
  assert.equal((await first.exit).signal, 'SIGKILL');
  assert.equal(count('pay', invoice), 1);
  assert.equal(count('email', invoice), 1);

  // the killed worker's token lease lives until its ttl: the on-call ends it
  await sql("SELECT durable_ledger.break_lease($1, 'on-call', 'the worker was killed')", [session]);
  const resumed = await worker({ resume: session }, invoice);
  assert.equal(resumed.code, 3, resumed.stdout + resumed.stderr);
  assert.match(resumed.stdout, /^stopped EffectPaused: /m, 'claudeAttempt throws the pause at its end');
  const paused = printed(resumed.stdout);
  assert.equal(paused.send_email._meta['durable-ledger/replayed'], true, 'the e-mail replayed');
  assert.equal(paused.lookup_invoice.isError, undefined, 'the recorded read replayed');
  assert.equal(paused.pay_invoice.isError, true);
  const stop = paused.pay_invoice._meta['durable-ledger/stop'];
  assert.equal(stop.kind, 'paused');
  const [{ key }] = await sql("SELECT key FROM durable_ledger.effects WHERE run = $1 AND tool = 'pay_invoice'", [session]);
  assert.equal(stop.key, key);
  assert.equal(payment.key, key, 'the handler got the ledger\'s key for the bank');
  assert.match(text(paused.pay_invoice), /the ledger paused it because an earlier attempt began it and nobody knows whether it took effect\. Do not call this tool again/);
  assert.match(text(paused.pay_invoice), new RegExp(`What a person must do: a person checks the downstream system for ${key} and resolves effect ${key}`));
  assert.equal(count('pay', invoice), 1);
  assert.equal(count('email', invoice), 1);
  assert.equal(count('lookup', invoice), 1);

  // the person asks the bank what it did under the key, and records it
  const [found] = effects.lookup(key);
  await sql("SELECT durable_ledger.resolve_effect($1, 'completed', $2::jsonb, 'on-call', 'the bank has it')",
    [key, JSON.stringify({ content: [{ type: 'text', text: `paid ${invoice}: ${found.id}` }] })]);
  const last = await worker({ resume: session }, invoice);
  assert.equal(last.code, 0, last.stdout + last.stderr);
  assert.match(last.stdout, /^finished$/m);
  const done = printed(last.stdout);
  assert.equal(done.pay_invoice._meta['durable-ledger/replayed'], true);
  assert.equal(text(done.pay_invoice), `paid ${invoice}: ${payment.id}`);
  assert.equal(count('pay', invoice), 1, 'paid once');
  assert.equal(count('email', invoice), 1, 'mailed once');
  assert.deepEqual((await effectsOf(session)).map((e) => [e.tool, e.status]),
    [['lookup_invoice', 'completed'], ['pay_invoice', 'completed'], ['send_email', 'completed']]);
});

test('a completed session resumed calls nothing: its tools replay their recorded answers, in one attempt with parallel calls', async () => {
  const session = randomUUID();
  const invoice = `INV-${session}`;
  const first = await worker({ sessionId: session }, invoice);
  assert.equal(first.code, 0, first.stdout + first.stderr);
  assert.match(first.stdout, new RegExp(`^session ${session}$`, 'm'));
  const epochs = await sql("SELECT DISTINCT lease_epoch FROM durable_ledger.audit_log WHERE run = $1 AND event = 'intent'",
    [session]);
  assert.equal(epochs.length, 1, 'the step\'s two calls in one attempt');
  const again = await worker({ resume: session }, invoice);
  assert.equal(again.code, 0, again.stderr);
  const before = printed(first.stdout);
  const after = printed(again.stdout);
  for (const tool of ['pay_invoice', 'send_email']) {
    assert.equal(after[tool]._meta['durable-ledger/replayed'], true, tool);
    assert.deepEqual(after[tool].content, before[tool].content, tool);
  }
  assert.deepEqual(after.lookup_invoice.content, before.lookup_invoice.content);
  assert.equal(count('pay', invoice), 1);
  assert.equal(count('email', invoice), 1);
  assert.equal(count('lookup', invoice), 1, 'the recorded read is replayed, not made again');
});

test("a read-only tool: 'record' is made once and replayed, 'pass' is called every time and the ledger sees nothing of it", async () => {
  const session = randomUUID();
  const before = effects.calls('status').length;
  for (let i = 0; i < 2; i += 1) {
    await claudeAttempt(db.ledger, i === 0 ? { sessionId: session } : { resume: session }, async (s) => {
      const server = s.server({ name: 'billing', tools: billingTools(effects.url) });
      const [status, lookup] = await playScript(server,
        [[{ name: 'bank_status', arguments: {} }, { name: 'lookup_invoice', arguments: { invoice: `INV-${session}` } }]]);
      assert.match(text(status.result), /^bank up/);
      assert.match(text(lookup.result), /^INV-.*: 4200 USD, open/);
    });
  }
  assert.equal(effects.calls('status').length - before, 2);
  assert.equal(count('lookup', `INV-${session}`), 1);
  assert.deepEqual((await effectsOf(session)).map((e) => e.tool), ['lookup_invoice']);
});

test('an abandoned run and a refused tool surface as the typed errors claudeAttempt throws', async () => {
  const session = randomUUID();
  const invoice = `INV-${session}`;
  await claudeAttempt(db.ledger, { sessionId: session }, async (s) => {
    await playScript(s.server({ name: 'billing', tools: billingTools(effects.url) }),
      [[{ name: 'pay_invoice', arguments: { invoice, amount: 4200 } }]]);
  });
  await sql("SELECT durable_ledger.abandon_run($1, 'maria', 'the customer cancelled')", [session]);
  await assert.rejects(claudeAttempt(db.ledger, { resume: session }, () => assert.fail('not run')),
    (err) => err instanceof RunAbandoned);

  // a tool an admin retired: the model gets a tool error, the app a ToolRefused
  const other = randomUUID();
  const retired = `fax.send-${other}`;
  const fax = ledgerTool('send_fax', 'Send a fax', { to: z.string() }, async ({ to }, { idempotencyKey }) => {
    await makeEffect(effects.url, 'fax', { to }, /** @type {string} */ (idempotencyKey));
    return { content: [{ type: 'text', text: 'sent' }] };
  }, { ledgerName: retired });
  await sql("SELECT durable_ledger.register_tool($1, 'maria')", [retired]);
  await sql("SELECT durable_ledger.retire_tool($1, 'maria', 'nobody has a fax')", [retired]);
  /** @type {any[]} */
  let results = [];
  await assert.rejects(claudeAttempt(db.ledger, { sessionId: other }, async (s) => {
    results = await playScript(s.server({ name: 'office', tools: [fax] }),
      [[{ name: 'send_fax', arguments: { to: `+1-555-${other}` } }]]);
    return 'the model ended its turn';
  }), (err) => err instanceof ToolRefused);
  assert.equal(results[0].result._meta['durable-ledger/stop'].kind, 'refused');
  assert.match(text(results[0].result), /the ledger refuses this tool/);
  assert.equal(effects.calls('fax').filter((c) => c.body.to.includes(other)).length, 0);
});

test('an unknown outcome: the handler threw; the model is told, claudeAttempt throws RunStopped, the next attempt pauses', async () => {
  const session = randomUUID();
  const invoice = `INV-${session}`;
  const flaky = ledgerTool('pay_invoice', 'Pay', { invoice: z.string(), amount: z.number() }, async () => {
    throw new Error('socket hang up'); // after the bank got it, or not: nobody knows
  });
  let results = [];
  await assert.rejects(claudeAttempt(db.ledger, { sessionId: session }, async (s) => {
    results = await playScript(s.server({ name: 'billing', tools: [flaky] }),
      [[{ name: 'pay_invoice', arguments: { invoice, amount: 4200 } }]]);
  }), (err) => err instanceof RunStopped && /outcome of pay_invoice \(effect [0-9a-f]{64}\) is unknown/.test(err.message));
  assert.equal(results[0].result._meta['durable-ledger/stop'].kind, 'unknown');
  assert.match(text(results[0].result), /nobody knows yet whether it took effect/);
  await assert.rejects(claudeAttempt(db.ledger, { resume: session }, async (s) => {
    await playScript(s.server({ name: 'billing', tools: [flaky] }),
      [[{ name: 'pay_invoice', arguments: { invoice, amount: 4200 } }]]);
  }), (err) => err instanceof EffectPaused);
});

test('a forked session: the ledger\'s fork carries the settled effects, whose calls replay in the fork; a fork the ledger never made runs nothing', async () => {
  const source = randomUUID();
  const invoice = `INV-${source}`;
  const first = await worker({ sessionId: source }, invoice);
  assert.equal(first.code, 0, first.stderr);

  const fork = randomUUID();
  const carried = await forkRun(db.pool, { from: source, to: fork, forkedBy: 'maria', note: 'try another wording' });
  assert.equal(carried, 3);
  await claudeAttempt(db.ledger, { resume: source, forkSession: true, sessionId: fork }, async (s) => {
    assert.equal(s.run, fork);
    assert.deepEqual(s.options, { resume: source, forkSession: true, sessionId: fork });
    const results = await playScript(s.server({ name: 'billing', tools: billingTools(effects.url) }), invoiceScript(invoice));
    assert.ok(results.filter((r) => r.name !== 'lookup_invoice').every((r) => r.result._meta['durable-ledger/replayed']),
      JSON.stringify(results));
  });
  assert.equal(count('pay', invoice), 1, 'the fork paid nothing again');

  const unforked = randomUUID();
  await assert.rejects(claudeAttempt(db.ledger, { resume: source, forkSession: true, sessionId: unforked },
    () => assert.fail('not run')), (err) => err instanceof ForkNotCarried && err.run === unforked);
  const fresh = randomUUID();
  await claudeAttempt(db.ledger, { resume: source, forkSession: true, sessionId: fresh }, { fork: 'fresh' }, async (s) => {
    await playScript(s.server({ name: 'billing', tools: billingTools(effects.url) }),
      [[{ name: 'pay_invoice', arguments: { invoice, amount: 4200 } }]]);
  });
  assert.equal(count('pay', invoice), 2, "a fresh fork carries nothing: it pays again, as the app said");
});

test('abortOnStop aborts the query\'s abortController at the first stop; a refusal is no stop', async () => {
  const session = randomUUID();
  const invoice = `INV-${session}`;
  await claudeAttempt(db.ledger, { sessionId: session }, { abortOnStop: true }, async (s) => {
    const controller = /** @type {AbortController} */ (s.options.abortController);
    assert.ok(controller instanceof AbortController);
    const [refused] = await playScript(s.server({ name: 'billing', tools: billingTools(effects.url) }),
      [[{ name: 'pay_invoice', arguments: { invoice, amount: -1 } }]]);
    assert.match(text(refused.result), /was refused, nothing was done: amount must be positive/);
    assert.equal(controller.signal.aborted, false);
    assert.equal(s.stop, null);
  });
  const other = randomUUID();
  await assert.rejects(claudeAttempt(db.ledger, { sessionId: other }, { abortOnStop: true }, async (s) => {
    await sql("SELECT durable_ledger.abandon_run($1, 'maria', 'stop it')", [other]);
    const [abandoned] = await playScript(s.server({ name: 'billing', tools: billingTools(effects.url) }),
      [[{ name: 'pay_invoice', arguments: { invoice: `INV-${other}`, amount: 1 } }]]);
    assert.equal(abandoned.result._meta['durable-ledger/stop'].kind, 'abandoned');
    assert.equal(s.options.abortController?.signal.aborted, true);
    assert.equal(s.stop?.kind, 'abandoned');
  }), (err) => err instanceof RunAbandoned);
});

test('tools on a plain createSdkMcpServer find the attempt they are called in; outside any, they answer that nothing was done', async () => {
  const session = randomUUID();
  const invoice = `INV-${session}`;
  const plain = () => createSdkMcpServer({ name: 'billing', tools: billingTools(effects.url) });
  const [outside] = await playScript(plain(), [[{ name: 'pay_invoice', arguments: { invoice, amount: 1 } }]]);
  assert.equal(outside.result.isError, true);
  assert.match(text(outside.result), /was not performed: no ledger attempt is open for this session/);
  await claudeAttempt(db.ledger, { sessionId: session }, async () => {
    const [inside] = await playScript(plain(), [[{ name: 'pay_invoice', arguments: { invoice, amount: 1 } }]]);
    assert.equal(inside.result._meta['durable-ledger/replayed'], false);
  });
  assert.equal(count('pay', invoice), 1);
});

test("gatewayServer: the session's MCP tools through the MCP gateway, in a run of their own next to the session's", async () => {
  const gatewayDir = new URL('../../mcp-gateway/', import.meta.url); // the gateway's folder in the repository
  const config = path.join(mkdtempSync(path.join(tmpdir(), 'claude-gateway-')), 'gateway.json');
  writeFileSync(config, JSON.stringify({
    servers: {
      bank: {
        command: process.execPath,
        args: [fileURLToPath(new URL('test/support/upstream-server.js', gatewayDir))],
        env: { EFFECTS_URL: effects.url },
        tools: { lookup_invoice: { sideEffecting: false }, send_email: { idempotencyKeyArgument: 'idempotency_key' } },
      },
    },
  }));
  const session = randomUUID();
  const invoice = `INV-${session}`;
  for (const spec of [{ sessionId: session }, { resume: session }]) {
    await claudeAttempt(db.ledger, spec, async (s) => {
      const entry = gatewayServer(s, {
        name: 'bank', config, command: process.execPath,
        args: [fileURLToPath(new URL('bin/durable-ledger-mcp-gateway.js', gatewayDir))], env: { DURABLE_LEDGER_DSN: DSN },
      });
      assert.equal(entry.type, 'stdio');
      // what the Claude Code CLI does with an mcpServers entry: start it, call its tools
      const client = new Client({ name: 'as-the-cli', version: '1.0.0' });
      await client.connect(new StdioClientTransport({ command: entry.command, args: entry.args, env: entry.env }));
      const paid = /** @type {any} */ (await client.callTool({ name: 'pay_invoice', arguments: { invoice, amount: 4200 } }));
      assert.equal(paid._meta['durable-ledger/run'], `${session}/mcp/bank`);
      assert.equal(paid._meta['durable-ledger/replayed'], 'resume' in spec);
      await client.close();
    });
  }
  assert.equal(count('pay', invoice), 1);
  assert.deepEqual((await effectsOf(`${session}/mcp/bank`)).map((e) => [e.tool, e.status]),
    [['bank.pay_invoice', 'completed']]);
});
