// The gateway with the MCP SDK's own client, in front of the upstream test server
// (test/support/upstream-server.js), whose every call is counted by the effects server in
// this process: side-effecting tools through the ledger, read-only ones straight through,
// a client SIGKILLed in the middle of a call and a new one continuing the run, the gateway
// or the upstream killed in the middle of one (an unknown outcome: a pause for a person,
// then a replay), key fields and business keys, parallel calls.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@host/db node --test test/
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { startEffectsServer } from '../../test-support/effects-server.js';
import { spawnWorker } from '../../test-support/worker.js';
import { startGate } from './support/gate.js';
import {
  CLIENT, UPSTREAM, call, configFile, connect, effectsOf, newRun, printed, spawnGateway, sql, startGateway, testConfig,
  text, waitFor, withGateway,
} from './support/setup.js';

/** @type {Awaited<ReturnType<typeof startEffectsServer>>} */
let effects;
before(async () => { effects = await startEffectsServer(); });
after(async () => { await effects.close(); });

const PAY = { invoice: 'INV-9', amount: 4200 };
const MAIL = { to: 'ap@acme.example', subject: 'INV-9 paid' };

/** The effects the upstream made for a run's invoice or mail. */
const made = (op, pred = () => true) => effects.calls(op).filter(pred);

test('a side-effecting tool is called once through the ledger; a new session of the run replays it', async () => {
  await withGateway(testConfig({ effects: effects.url }), async (gw) => {
    const run = newRun('replay');
    const invoice = `INV-${run}`;
    const first = await connect(gw.url);
    const { tools } = await first.listTools();
    const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
    assert.deepEqual(Object.keys(byName).sort(), ['lookup_invoice', 'pay_invoice', 'send_email']);
    assert.deepEqual(byName.pay_invoice.inputSchema.required, ['invoice', 'amount'], 'the upstream schema is kept');
    assert.equal(byName.send_email.inputSchema.properties.idempotency_key, undefined,
      'the argument the gateway fills in is hidden from the client');
    assert.deepEqual(byName.send_email.inputSchema.required, ['to', 'subject']);
    assert.equal(byName.pay_invoice._meta['durable-ledger/side-effecting'], true);
    assert.equal(byName.lookup_invoice._meta['durable-ledger/side-effecting'], false);

    const paid = await call(first, 'pay_invoice', { invoice, amount: 4200 }, run);
    assert.equal(paid.isError, undefined, text(paid));
    assert.equal(paid._meta['durable-ledger/replayed'], false);
    assert.equal(paid._meta['durable-ledger/run'], run);
    const pays = made('pay', (c) => c.body.invoice === invoice);
    assert.equal(pays.length, 1);
    const [effect] = await effectsOf(run);
    assert.equal(effect.tool, 'bank.pay_invoice');
    assert.equal(effect.status, 'completed');
    assert.equal(pays[0].key, effect.key, 'the upstream got the ledger\'s key in _meta["durable-ledger/idempotency-key"]');
    const mailed = await call(first, 'send_email', { ...MAIL, subject: invoice }, run);
    const mail = made('email', (c) => c.body.subject === invoice);
    assert.equal(mail.length, 1);
    const keys = Object.fromEntries((await effectsOf(run)).map((e) => [e.tool, e.key]));
    assert.equal(mail[0].key, keys['bank.send_email'], 'the upstream got the key in its idempotency_key argument');
    await first.close();

    const again = await connect(gw.url); // a new session: a new attempt at the run
    const replayed = await call(again, 'pay_invoice', { invoice, amount: 4200 }, run);
    const remailed = await call(again, 'send_email', { ...MAIL, subject: invoice }, run);
    assert.equal(replayed._meta['durable-ledger/replayed'], true);
    assert.equal(remailed._meta['durable-ledger/replayed'], true);
    assert.deepEqual(replayed.content, paid.content, 'the recorded answer');
    assert.deepEqual(replayed.structuredContent, paid.structuredContent);
    assert.deepEqual(remailed.content, mailed.content);
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1, 'not sent upstream again');
    assert.equal(made('email', (c) => c.body.subject === invoice).length, 1);

    // in one session, the same call again is another call ("again", not "twice")
    const twice = await call(again, 'pay_invoice', { invoice, amount: 4200 }, run);
    assert.equal(twice._meta['durable-ledger/replayed'], false);
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 2);
    await again.close();
  });
});

test('a read-only tool passes straight through: every call reaches the upstream, untouched but for the gateway\'s own _meta keys, and the ledger records nothing', async () => {
  await withGateway(testConfig({ effects: effects.url }), async (gw) => {
    const run = newRun('read');
    const invoice = `INV-${run}`;
    const client = await connect(gw.url);
    // a client's own durable-ledger/* keys (a forged idempotency key) never reach the upstream
    const sent = { 'durable-ledger/run': run, 'durable-ledger/idempotency-key': 'forged', 'acme/trace': 'abc' };
    const meta = { 'acme/trace': 'abc' };
    const answers = [];
    for (let i = 0; i < 3; i += 1) {
      answers.push(await client.callTool({ name: 'lookup_invoice', arguments: { invoice }, _meta: sent }));
    }
    assert.equal(made('lookup', (c) => c.body.invoice === invoice).length, 3, 'each call reached the upstream');
    for (const a of answers) {
      assert.equal(a._meta, undefined, 'the upstream answer as it came');
      assert.deepEqual(a.structuredContent, { invoice, amount: 4200, meta }, 'the client\'s _meta as it came');
    }
    assert.deepEqual(await sql('SELECT count(*)::int AS n FROM durable_ledger.effects WHERE run = $1', [run]), [{ n: 0 }]);
    assert.deepEqual(await sql('SELECT count(*)::int AS n FROM durable_ledger.audit_log WHERE run = $1', [run]), [{ n: 0 }],
      'no attempt either');
    await client.close();
  });
});

test('a client SIGKILLed in the middle of a step; a new client continuing the run replays both calls, sending nothing upstream again', async () => {
  const gate = await startGate();
  const gw = await startGateway(testConfig({ effects: effects.url, gate: gate.url, gateOps: ['pay'] }));
  try {
    const run = newRun('client-crash');
    const invoice = `INV-${run}`;
    const step = JSON.stringify([
      { name: 'pay_invoice', arguments: { invoice, amount: 4200 } },
      { name: 'send_email', arguments: { ...MAIL, subject: invoice } },
    ]);
    const client = spawnWorker(CLIENT, [gw.url, run, step]);
    await gate.arrived('pay'); // the payment happened upstream; its answer waits
    await client.line(/^result send_email /m); // the other call of the step is answered
    client.kill();
    const { signal } = await client.exit;
    assert.equal(signal, 'SIGKILL');
    assert.doesNotMatch((await client.exit).stdout, /result pay_invoice/, 'killed before the payment was answered');
    gate.open('pay'); // the upstream answers now: the gateway records it for nobody

    const next = spawnWorker(CLIENT, [gw.url, run, step]); // a new client, a new session, the same run
    const { code, stdout, stderr } = await next.exit;
    assert.equal(code, 0, stderr);
    const results = printed(stdout);
    assert.equal(results.pay_invoice._meta['durable-ledger/replayed'], true, stdout);
    assert.equal(results.send_email._meta['durable-ledger/replayed'], true, stdout);
    assert.match(text(results.pay_invoice), new RegExp(`paid ${invoice}: pay-`));
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1, 'paid once');
    assert.equal(made('email', (c) => c.body.subject === invoice).length, 1, 'mailed once');
    assert.deepEqual((await effectsOf(run)).map((e) => [e.tool, e.status]),
      [['bank.pay_invoice', 'completed'], ['bank.send_email', 'completed']]);
  } finally {
    await gw.close();
    await gate.close();
  }
});

test('the gateway SIGKILLed in the middle of a payment: the run pauses with a tool error saying what a person must do; once resolved, it replays', async () => {
  const file = configFile(testConfig({ effects: effects.url, ttl: 300 }));
  const run = newRun('gateway-crash');
  const invoice = `INV-${run}`;
  const held = effects.hold('pay'); // the payment happens; its answer never comes
  const gateway = await spawnGateway(file);
  const client = await connect(gateway.url);
  const step = Promise.allSettled([
    call(client, 'pay_invoice', { invoice, amount: 4200 }, run),
    call(client, 'send_email', { ...MAIL, subject: invoice }, run),
  ]);
  const payment = await held;
  await waitFor("SELECT status::text AS status FROM durable_ledger.effects WHERE run = $1 AND tool = 'bank.send_email'",
    [run], (rows) => rows[0]?.status === 'completed'); // the e-mail of the step is done
  gateway.kill();
  await gateway.exit;
  await client.close().catch(() => {}); // its calls fail: their connection is gone
  await step;

  const restarted = await spawnGateway(file);
  try {
    let again = await connect(restarted.url);
    const busy = await call(again, 'pay_invoice', { invoice, amount: 4200 }, run);
    assert.equal(busy.isError, true);
    assert.match(text(busy), /held by another worker/, 'the dead gateway\'s lease lives until its ttl');
    assert.equal(busy._meta['durable-ledger/stop'], undefined, 'not a stop: try later');
    // the on-call ends the dead gateway's lease rather than wait for its ttl
    await sql("SELECT durable_ledger.break_lease($1, 'on-call', 'the gateway was killed')", [run]);

    const paused = await call(again, 'pay_invoice', { invoice, amount: 4200 }, run);
    assert.equal(paused.isError, true);
    const stop = paused._meta['durable-ledger/stop'];
    assert.equal(stop.kind, 'paused');
    const [{ key }] = await sql("SELECT key FROM durable_ledger.effects WHERE run = $1 AND tool = 'bank.pay_invoice'", [run]);
    assert.equal(stop.key, key);
    assert.match(text(paused), /Do not call this tool again/);
    assert.match(text(paused), new RegExp(`What a person must do: a person checks the downstream system for ${key} and resolves effect ${key} \\(durable_ledger\\.resolve_effect`));
    const stopped = await call(again, 'send_email', { ...MAIL, subject: invoice }, run);
    assert.equal(stopped._meta['durable-ledger/stop'].kind, 'paused', 'the session\'s run stays stopped');
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1);
    assert.equal(made('email', (c) => c.body.subject === invoice).length, 1);
    await again.close();

    // the person asks the bank what it did under the key, and records it
    const [found] = effects.lookup(key);
    assert.equal(found.id, payment.id);
    await sql("SELECT durable_ledger.resolve_effect($1, 'completed', $2::jsonb, 'on-call', 'the bank has it')",
      [key, JSON.stringify({ payment: found.id })]);

    again = await connect(restarted.url); // the run resumed in a new session
    const [replayed, remailed] = await Promise.all([
      call(again, 'pay_invoice', { invoice, amount: 4200 }, run),
      call(again, 'send_email', { ...MAIL, subject: invoice }, run),
    ]);
    assert.equal(replayed.isError, undefined, text(replayed));
    assert.equal(replayed._meta['durable-ledger/replayed'], true);
    assert.deepEqual(JSON.parse(text(replayed)), { payment: found.id }, 'what the person recorded, as text');
    assert.equal(remailed._meta['durable-ledger/replayed'], true);
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1, 'paid once');
    assert.equal(made('email', (c) => c.body.subject === invoice).length, 1, 'mailed once');
    await again.close();
  } finally {
    restarted.kill();
    await restarted.exit;
  }
});

test('the upstream SIGKILLed in the middle of a payment: the call answers that its outcome is unknown; the next attempt pauses; resolved, it replays', async () => {
  await withGateway(testConfig({ effects: effects.url }), async (gw) => {
    const run = newRun('upstream-crash');
    const invoice = `INV-${run}`;
    const held = effects.hold('pay');
    const client = await connect(gw.url);
    const answer = call(client, 'pay_invoice', { invoice, amount: 4200 }, run);
    const payment = await held;
    process.kill(payment.body.pid, 'SIGKILL'); // the upstream server's process
    const unknown = await answer;
    assert.equal(unknown.isError, true);
    assert.equal(unknown._meta['durable-ledger/stop'].kind, 'unknown');
    assert.match(text(unknown), /nobody knows yet whether it took effect/);
    assert.match(text(unknown), /What a person must do: the outcome of bank\.pay_invoice \(effect [0-9a-f]{64}\) is unknown/);
    const later = await call(client, 'pay_invoice', { invoice, amount: 4200 }, run);
    assert.equal(later._meta['durable-ledger/stop'].kind, 'unknown', 'the session\'s run stays stopped: not sent again');
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1);
    await client.close();

    const next = await connect(gw.url); // the upstream is started again for this call
    const paused = await call(next, 'pay_invoice', { invoice, amount: 4200 }, run);
    assert.equal(paused._meta['durable-ledger/stop'].kind, 'paused');
    const key = paused._meta['durable-ledger/stop'].key;
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1, 'not sent upstream again');
    await next.close();
    await sql("SELECT durable_ledger.resolve_effect($1, 'completed', $2::jsonb, 'on-call', 'found at the bank')",
      [key, JSON.stringify({ content: [{ type: 'text', text: `paid ${invoice}: ${payment.id}` }] })]);
    const last = await connect(gw.url);
    const replayed = await call(last, 'pay_invoice', { invoice, amount: 4200 }, run);
    assert.equal(replayed._meta['durable-ledger/replayed'], true);
    assert.equal(text(replayed), `paid ${invoice}: ${payment.id}`, 'a result recorded as a tool result is one');
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1);
    await last.close();
  });
});

test('key fields: the ledger\'s registry is checked against the configuration, and a reworded memo replays the payment', async () => {
  const ledgerTool = `bank.pay-${newRun('kf')}`;
  const json = testConfig({ effects: effects.url, pay: { keyFields: ['invoice', 'amount'], ledgerTool } });
  await withGateway(json, async (gw) => {
    assert.equal(gw.warnings.length, 1, gw.warnings.join('\n'));
    assert.match(gw.warnings[0], new RegExp(`the ledger has no key fields for it; the configuration names \\{invoice,amount\\}: an admin runs SELECT durable_ledger\\.register_tool\\('${ledgerTool}', '<name>', key_fields => '\\{invoice,amount\\}'\\)`));
  });
  await sql("SELECT durable_ledger.register_tool($1, 'maria', key_fields => '{invoice}')", [ledgerTool]);
  await withGateway(json, async (gw) => {
    assert.match(gw.warnings.join('\n'), /the ledger's key fields leave out amount/);
  });
  await sql("SELECT durable_ledger.change_tool($1, 'maria', key_fields => '{invoice,amount}')", [ledgerTool]);
  await withGateway(json, async (gw) => {
    assert.deepEqual(gw.warnings, [], 'the ledger agrees');
    const run = newRun('memo');
    const invoice = `INV-${run}`;
    let client = await connect(gw.url);
    const lacking = await call(client, 'pay_invoice', { invoice }, run);
    assert.equal(lacking.isError, true);
    assert.match(text(lacking), /lack amount/);
    const paid = await call(client, 'pay_invoice', { invoice, amount: 4200, memo: 'Thanks' }, run);
    assert.equal(paid._meta['durable-ledger/replayed'], false);
    await client.close();
    client = await connect(gw.url);
    const reworded = await call(client, 'pay_invoice', { invoice, amount: 4200, memo: 'Thank you!' }, run);
    assert.equal(reworded._meta['durable-ledger/replayed'], true, 'the same call: its key fields are the same');
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1);
    await client.close();
  });
});

test('a business key: the same invoice paid in another run replays the first payment', async () => {
  await withGateway(testConfig({ effects: effects.url, pay: { businessKey: 'pay-{invoice}' } }), async (gw) => {
    const invoice = `INV-${newRun('bk')}`;
    const client = await connect(gw.url);
    const first = await call(client, 'pay_invoice', { invoice, amount: 4200 }, newRun('bk-a'));
    const second = await call(client, 'pay_invoice', { invoice, amount: 4200 }, newRun('bk-b'));
    assert.equal(first._meta['durable-ledger/replayed'], false);
    assert.equal(second._meta['durable-ledger/replayed'], true);
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1);
    assert.deepEqual(await sql('SELECT count(*)::int AS n FROM durable_ledger.effects WHERE key = $1', [`pay-${invoice}`]),
      [{ n: 1 }]);
    await client.close();
  });
});

test('an upstream refusal (invalid params, where refusedCodes says the server refuses with it before doing anything) is recorded as failed and replayed; the run goes on', async () => {
  await withGateway(testConfig({ effects: effects.url, server: { refusedCodes: [-32601, -32602] } }), async (gw) => {
    const run = newRun('refused');
    const invoice = `INV-${run}`;
    let client = await connect(gw.url);
    const refused = await call(client, 'pay_invoice', { invoice, amount: -1 }, run);
    assert.equal(refused.isError, true);
    assert.match(text(refused), /was refused, nothing was done: amount must be positive \(MCP error -32602\)/);
    assert.equal(refused._meta['durable-ledger/stop'], undefined, 'not a stop');
    const paid = await call(client, 'pay_invoice', { invoice, amount: 4200 }, run);
    assert.equal(paid.isError, undefined, text(paid));
    await client.close();
    assert.deepEqual((await effectsOf(run)).map((e) => e.status).sort(), ['completed', 'failed']);
    client = await connect(gw.url);
    const again = await call(client, 'pay_invoice', { invoice, amount: -1 }, run);
    assert.match(text(again), /refused, nothing was done \(as recorded earlier\)/);
    await client.close();
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1);
  });
});

test('an abandoned run is a stop: the tool error says never to retry it, and nothing is sent upstream', async () => {
  await withGateway(testConfig({ effects: effects.url }), async (gw) => {
    const run = newRun('abandoned');
    const invoice = `INV-${run}`;
    let client = await connect(gw.url);
    await call(client, 'pay_invoice', { invoice, amount: 4200 }, run);
    await client.close();
    await sql("SELECT durable_ledger.abandon_run($1, 'maria', 'customer cancelled')", [run]);
    client = await connect(gw.url);
    const refused = await call(client, 'send_email', { ...MAIL, subject: invoice }, run);
    assert.equal(refused.isError, true);
    assert.equal(refused._meta['durable-ledger/stop'].kind, 'abandoned');
    assert.match(text(refused), /a person abandoned this run/);
    assert.equal(made('email', (c) => c.body.subject === invoice).length, 0);
    // a read-only tool still passes
    const read = await call(client, 'lookup_invoice', { invoice }, run);
    assert.equal(read.isError, undefined);
    await client.close();
  });
});

test('parallel calls of one step in one session share its attempt; a session without a run in _meta has its own', async () => {
  await withGateway(testConfig({ effects: effects.url }), async (gw) => {
    const run = newRun('parallel');
    const client = await connect(gw.url);
    const invoices = [1, 2, 3, 4].map((i) => `INV-${run}-${i}`);
    const answers = await Promise.all(invoices.map((invoice) => call(client, 'pay_invoice', { invoice, amount: 10 }, run)));
    assert.ok(answers.every((a) => a._meta['durable-ledger/replayed'] === false), JSON.stringify(answers));
    const epochs = await sql("SELECT DISTINCT lease_epoch FROM durable_ledger.audit_log WHERE run = $1 AND event = 'intent'", [run]);
    assert.equal(epochs.length, 1, 'one attempt');
    const own = await client.callTool({ name: 'pay_invoice', arguments: { invoice: `INV-${run}-own`, amount: 1 } });
    const sessionRun = own._meta['durable-ledger/run'];
    assert.match(sessionRun, /^mcp-session-[0-9a-f-]{36}$/);
    assert.equal((await effectsOf(sessionRun)).length, 1);
    await client.close();
  });
});

test('a client that continues its run names each call by its own id (_meta["durable-ledger/call-id"]): a repeat of the same payment in a later session pauses once for a person, who says it is another payment; a call made again replays its own answer', async () => {
  await withGateway(testConfig({ effects: effects.url }), async (gw) => {
    const run = newRun('call-id');
    const invoice = `INV-${run}`;
    const pays = () => made('pay', (c) => c.body.invoice === invoice).length;
    const keyOf = (id) => `call:${JSON.stringify([run, 'bank.pay_invoice', id])}`;
    const first = await connect(gw.url);
    const one = await call(first, 'pay_invoice', { invoice, amount: 10 }, run, { 'durable-ledger/call-id': 'toolu_1' });
    assert.equal(one._meta['durable-ledger/replayed'], false, text(one));
    await first.close();

    // a later session continues the run (it does not make toolu_1 again): the model pays the
    // same invoice a second time, under a new id -- on purpose, or because it was asked again
    // after a lost answer: the gateway cannot tell, so the call pauses as a divergence, nothing
    // sent upstream, and the tool error says what a person must do
    let later = await connect(gw.url);
    const paused = await call(later, 'pay_invoice', { invoice, amount: 10 }, run, { 'durable-ledger/call-id': 'toolu_2' });
    assert.equal(paused.isError, true, text(paused));
    assert.equal(paused._meta['durable-ledger/replayed'], undefined, 'neither performed nor replayed');
    assert.equal(paused._meta['durable-ledger/run'], run);
    const stop = paused._meta['durable-ledger/stop'];
    assert.equal(stop.kind, 'paused');
    assert.equal(stop.key, keyOf('toolu_2'));
    assert.match(text(paused), /the ledger paused it because it may repeat an earlier call, worded differently or named anew/);
    assert.match(text(paused), /Do not call this tool again/);
    assert.ok(text(paused).includes(`What a person must do: a person decides whether effect ${keyOf('toolu_2')} ` +
      'repeats an earlier one (durable_ledger.resolve_divergence)'), text(paused));
    assert.equal(pays(), 1, 'not sent upstream');
    assert.deepEqual(await sql(`SELECT occurrence, candidate_key, verdict FROM durable_ledger.divergences
      WHERE run = $1 AND key = $2`, [run, keyOf('toolu_2')]),
    [{ occurrence: 0, candidate_key: keyOf('toolu_1'), verdict: null }], 'the divergence names the earlier payment');
    assert.deepEqual((await effectsOf(run)).map((e) => e.key), [keyOf('toolu_1')], 'nothing recorded for toolu_2');
    await later.close();

    // a person says it is another payment: the next session's toolu_2 is performed, once
    await sql("SELECT durable_ledger.resolve_divergence($1, 'distinct', 'maria')", [keyOf('toolu_2')]);
    later = await connect(gw.url);
    const two = await call(later, 'pay_invoice', { invoice, amount: 10 }, run, { 'durable-ledger/call-id': 'toolu_2' });
    assert.equal(two._meta['durable-ledger/replayed'], false, text(two));
    assert.equal(pays(), 2);
    // a call the client makes again (its retry, or a resume that re-makes it) replays its own answer
    const oneAgain = await call(later, 'pay_invoice', { invoice, amount: 10 }, run, { 'durable-ledger/call-id': 'toolu_1' });
    assert.equal(oneAgain._meta['durable-ledger/replayed'], true);
    assert.deepEqual(oneAgain.content, one.content);
    const twoAgain = await call(later, 'pay_invoice', { invoice, amount: 10 }, run, { 'durable-ledger/call-id': 'toolu_2' });
    assert.equal(twoAgain._meta['durable-ledger/replayed'], true);
    assert.deepEqual(twoAgain.content, two.content);
    assert.equal(pays(), 2, 'nothing sent upstream again');
    const keys = (await effectsOf(run)).map((e) => e.key).sort();
    assert.deepEqual(keys, [keyOf('toolu_1'), keyOf('toolu_2')].sort(), 'keyed by the calls\' ids');

    // a call id that is not one is refused, nothing sent
    await assert.rejects(call(later, 'pay_invoice', { invoice, amount: 10 }, run, { 'durable-ledger/call-id': 7 }),
      /durable-ledger\/call-id.*must be the call's own id/);
    assert.equal(pays(), 2);
    await later.close();

    // in a later session yet, a third id pauses too; a person who says 'same' gives it the
    // earlier payment's answer, nothing sent upstream
    later = await connect(gw.url);
    const third = await call(later, 'pay_invoice', { invoice, amount: 10 }, run, { 'durable-ledger/call-id': 'toolu_3' });
    assert.equal(third._meta['durable-ledger/stop'].kind, 'paused', text(third));
    await later.close();
    const [{ candidate_key: earlier }] = await sql('SELECT candidate_key FROM durable_ledger.divergences WHERE key = $1',
      [keyOf('toolu_3')]);
    assert.ok([keyOf('toolu_1'), keyOf('toolu_2')].includes(earlier), earlier);
    await sql("SELECT durable_ledger.resolve_divergence($1, 'same', 'maria')", [keyOf('toolu_3')]);
    later = await connect(gw.url);
    const replayed = await call(later, 'pay_invoice', { invoice, amount: 10 }, run, { 'durable-ledger/call-id': 'toolu_3' });
    assert.equal(replayed._meta['durable-ledger/replayed'], true, text(replayed));
    assert.deepEqual(replayed.content, (earlier === keyOf('toolu_1') ? one : two).content, 'the earlier payment\'s answer');
    assert.equal(pays(), 2, 'paid twice: the two a person said were two');
    await later.close();
  });
});

test('asked again: a client crashed after the upstream was paid; reconnected, its model names the payment anew (a new call id, the same arguments) -- paused, not paid again; a person\'s \'same\' gives it the first payment\'s answer', async () => {
  const gate = await startGate();
  const gw = await startGateway(testConfig({ effects: effects.url, gate: gate.url, gateOps: ['pay'] }));
  try {
    const run = newRun('asked-again');
    const invoice = `INV-${run}`;
    const pays = () => made('pay', (c) => c.body.invoice === invoice).length;
    const keyOf = (id) => `call:${JSON.stringify([run, 'bank.pay_invoice', id])}`;
    const args = { invoice, amount: 4200 };
    const client = spawnWorker(CLIENT, [gw.url, run,
      JSON.stringify([{ name: 'pay_invoice', arguments: args, meta: { 'durable-ledger/call-id': 'call_A' } }])]);
    await gate.arrived('pay'); // the bank paid; its answer waits
    client.kill();
    assert.equal((await client.exit).signal, 'SIGKILL');
    assert.doesNotMatch((await client.exit).stdout, /result pay_invoice/, 'the client never saw the answer');
    gate.open('pay'); // the gateway records the payment for nobody
    const [paid] = await waitFor('SELECT key, status::text AS status, result FROM durable_ledger.effects WHERE run = $1',
      [run], (rows) => rows[0]?.status === 'completed');
    assert.equal(paid.key, keyOf('call_A'));
    assert.equal(pays(), 1);

    // the host starts the turn over: its model, asked again, names the payment anew
    let again = await connect(gw.url);
    const paused = await call(again, 'pay_invoice', args, run, { 'durable-ledger/call-id': 'call_B' });
    assert.equal(paused.isError, true, text(paused));
    assert.equal(paused._meta['durable-ledger/stop'].kind, 'paused');
    assert.equal(paused._meta['durable-ledger/stop'].key, keyOf('call_B'));
    assert.match(text(paused), /may repeat an earlier call, worded differently or named anew/);
    assert.match(text(paused), /\(durable_ledger\.resolve_divergence\)/);
    assert.equal(pays(), 1, 'the upstream is not paid again');
    assert.deepEqual(await sql(`SELECT lease_epoch, occurrence, candidate_key, verdict FROM durable_ledger.divergences
      WHERE run = $1`, [run]), [{ lease_epoch: '2', occurrence: 0, candidate_key: keyOf('call_A'), verdict: null }],
    'a new call id in the second attempt, judged against the first attempt\'s payment');
    await again.close();

    await sql("SELECT durable_ledger.resolve_divergence($1, 'same', 'maria')", [keyOf('call_B')]);
    again = await connect(gw.url);
    const replayed = await call(again, 'pay_invoice', args, run, { 'durable-ledger/call-id': 'call_B' });
    assert.equal(replayed.isError, undefined, text(replayed));
    assert.equal(replayed._meta['durable-ledger/replayed'], true);
    assert.match(text(replayed), new RegExp(`paid ${invoice}: pay-`));
    assert.deepEqual(replayed.content, paid.result.content, 'the first payment\'s answer');
    assert.equal(pays(), 1, 'paid once');
    await again.close();
  } finally {
    await gw.close();
    await gate.close();
  }
});

test('an upstream over Streamable HTTP: a side-effecting call made once with the key in its _meta and replayed in a new session; a read-only one straight through', async () => {
  const upstream = spawnWorker(UPSTREAM, ['--http', '0'], { EFFECTS_URL: effects.url });
  const [, url] = await upstream.line(/listening on (http:\S+)/);
  const gw = await startGateway(testConfig({ effects: effects.url, url }));
  try {
    const run = newRun('http-upstream');
    const invoice = `INV-${run}`;
    const first = await connect(gw.url);
    const paid = await call(first, 'pay_invoice', { invoice, amount: 5 }, run);
    assert.equal(paid._meta['durable-ledger/replayed'], false, text(paid));
    const [effect] = await effectsOf(run);
    const pays = made('pay', (c) => c.body.invoice === invoice);
    assert.equal(pays.length, 1);
    assert.equal(pays[0].key, effect.key, 'the ledger\'s key reached the HTTP upstream in _meta');
    const looked = await call(first, 'lookup_invoice', { invoice }, run, { trace: 't-1' });
    assert.equal(looked._meta?.['durable-ledger/replayed'], undefined, 'a read is not the ledger\'s');
    await first.close();
    const again = await connect(gw.url);
    const replayed = await call(again, 'pay_invoice', { invoice, amount: 5 }, run);
    assert.equal(replayed._meta['durable-ledger/replayed'], true);
    assert.deepEqual(replayed.content, paid.content);
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1, 'not sent upstream again');
    assert.equal(made('lookup', (c) => c.body.invoice === invoice).length, 1);
    assert.deepEqual((await effectsOf(run)).map((e) => e.tool), ['bank.pay_invoice'], 'the read left nothing in the ledger');
    await again.close();
  } finally {
    await gw.close();
    upstream.kill();
    await upstream.exit;
  }
});
