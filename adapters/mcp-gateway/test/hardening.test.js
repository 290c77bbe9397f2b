// What an adversarial review of the gateway found (issue 33, review 33b), each a test that
// fails without its fix: an upstream's invalid params after its effect (F1), DNS rebinding
// (F2), a session's id shown to another session or made its run's name (F3), a stale session
// taking its run back (F4), two tools of one name in the ledger (F5), a client's own
// durable-ledger/* _meta passed upstream (F6, in gateway.test.js's read-only test), and a
// client that gives up on a slow call and retries it in its session (F7).
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@host/db node --test test/
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { startEffectsServer } from '../../test-support/effects-server.js';
import { Gateway, parseConfig } from '../src/index.js';
import { startGate } from './support/gate.js';
import {
  UPSTREAM, call, connect, effectsOf, ledgerPool, newRun, sql, startGateway, testConfig, text, until, withGateway,
} from './support/setup.js';

/** @type {Awaited<ReturnType<typeof startEffectsServer>>} */
let effects;
before(async () => { effects = await startEffectsServer(); });
after(async () => { await effects.close(); });

/** The effects the upstream made. */
const made = (op, pred = () => true) => effects.calls(op).filter(pred);
/** The kind of a result's stop, or null. @param {any} r */
const stopKind = (r) => r._meta?.['durable-ledger/stop']?.kind ?? null;

test('F1: an upstream\'s invalid params (-32602) is no promise that nothing was done: by default an unknown outcome, never made again; arguments that do not match the input schema are refused before the ledger', async () => {
  await withGateway(testConfig({ effects: effects.url }), async (gw) => {
    const run = newRun('invalid-after');
    const invoice = `INV-${run}`;
    const client = await connect(gw.url);
    // the upstream pays, then answers -32602 (an older SDK McpServer's output validation)
    const first = await call(client, 'pay_invoice', { invoice, amount: 10, memo: 'invalid after paying' }, run);
    assert.equal(first.isError, true);
    assert.equal(stopKind(first), 'unknown', text(first));
    assert.doesNotMatch(text(first), /nothing was done/);
    // the model tries again: answered with the stop, the upstream is not asked again
    const again = await call(client, 'pay_invoice', { invoice, amount: 10, memo: 'invalid after paying' }, run);
    assert.ok(stopKind(again), text(again));
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1, 'paid once');
    assert.deepEqual((await effectsOf(run)).map((e) => e.status), ['started'], 'the intent, its outcome unknown');
    await client.close();

    // invalid arguments by the tool's own schema: refused by the gateway, nothing recorded or sent
    const run2 = newRun('invalid-args');
    const c2 = await connect(gw.url);
    for (const args of [{ invoice, amount: 'lots' }, { amount: 5 }]) {
      const refused = await call(c2, 'pay_invoice', args, run2);
      assert.equal(refused.isError, true);
      assert.equal(stopKind(refused), null, 'not a stop: the model may correct its arguments');
      assert.match(text(refused), /^This call was not performed: its arguments do not match the input schema of pay_invoice: /);
    }
    assert.deepEqual(await effectsOf(run2), []);
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1);
    const ok = await call(c2, 'pay_invoice', { invoice: `${invoice}-2`, amount: 5 }, run2);
    assert.equal(ok.isError, undefined, text(ok));
    await c2.close();
  });
});

/**
 * A raw POST to the gateway with the headers given (a browser's, a rebound name's).
 * @param {string} url
 * @param {object} body
 * @param {Record<string, string>} headers
 * @returns {Promise<{status: number, headers: http.IncomingHttpHeaders, body: string}>}
 */
function post(url, body, headers) {
  const u = new URL(url);
  return new Promise((resolve, reject) => {
    const req = http.request({
      host: u.hostname, port: u.port, path: u.pathname, method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', ...headers },
    }, (res) => {
      let data = '';
      res.on('data', (c) => { data += c; });
      res.on('end', () => resolve({ status: res.statusCode ?? 0, headers: res.headers, body: data }));
    });
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
}

const INITIALIZE = {
  jsonrpc: '2.0', id: 1, method: 'initialize',
  params: { protocolVersion: '2025-06-18', capabilities: {}, clientInfo: { name: 'page', version: '1' } },
};

test('F2: DNS rebinding: a request whose Host is not the gateway\'s, or whose Origin is not allowed, is refused before any session is made', async () => {
  await withGateway({ ...testConfig({ effects: effects.url }), allowOrigins: ['http://console.example:3000'] }, async (gw) => {
    const { port } = new URL(gw.url);
    const sessions = () => gw.http.sessions.size;
    // a page at http://attacker.example:<port> whose name now resolves to 127.0.0.1
    const rebound = await post(gw.url, INITIALIZE,
      { host: `attacker.example:${port}`, origin: `http://attacker.example:${port}` });
    assert.equal(rebound.status, 403, rebound.body);
    assert.match(JSON.parse(rebound.body).error.message, /Host header "attacker\.example:\d+" is not this gateway's/);
    // the right Host, but a browser page of another origin
    const page = await post(gw.url, INITIALIZE, { host: `localhost:${port}`, origin: 'http://evil.example' });
    assert.equal(page.status, 403, page.body);
    assert.match(JSON.parse(page.body).error.message, /the Origin "http:\/\/evil\.example" is not allowed/);
    assert.equal(sessions(), 0, 'no session was made');
    // the gateway's own names, without an Origin (not a browser) or with an allowed one
    for (const headers of [{ host: `127.0.0.1:${port}` }, { host: `localhost:${port}` },
      { host: `localhost:${port}`, origin: 'http://console.example:3000' }]) {
      const ok = await post(gw.url, INITIALIZE, headers);
      assert.equal(ok.status, 200, `${JSON.stringify(headers)}: ${ok.body}`);
      assert.ok(ok.headers['mcp-session-id']);
    }
    // a session's later requests are checked too
    const sid = /** @type {string} */ ((await post(gw.url, INITIALIZE, { host: `127.0.0.1:${port}` })).headers['mcp-session-id']);
    const h = { 'mcp-session-id': sid, 'mcp-protocol-version': '2025-06-18' };
    await post(gw.url, { jsonrpc: '2.0', method: 'notifications/initialized' }, { ...h, host: `127.0.0.1:${port}` });
    const payment = {
      jsonrpc: '2.0', id: 2, method: 'tools/call',
      params: { name: 'pay_invoice', arguments: { invoice: `INV-${newRun('rebind')}`, amount: 999 } },
    };
    const before = made('pay').length;
    const refused = await post(gw.url, payment, { ...h, host: `attacker.example:${port}`, origin: 'http://attacker.example' });
    assert.equal(refused.status, 403);
    assert.equal(made('pay').length, before, 'nothing paid');
    // the SDK client, from the gateway's own address, still works
    const client = await connect(gw.url);
    const run = newRun('rebind-ok');
    assert.equal((await call(client, 'pay_invoice', { invoice: `INV-${run}`, amount: 1 }, run)).isError, undefined);
    await client.close();
  });
});

test('F3: no session is shown another session\'s id (its credential), and a session\'s own run is not named after its id', async () => {
  await withGateway(testConfig({ effects: effects.url }), async (gw) => {
    const run = newRun('lost');
    const a = await connect(gw.url);
    const b = await connect(gw.url);
    const ids = [a, b].map((c) => /** @type {any} */ (c.transport).sessionId);
    assert.ok(ids.every((id) => typeof id === 'string' && id.length > 0));
    assert.equal((await call(a, 'pay_invoice', { invoice: `INV-${run}-a`, amount: 1 }, run)).isError, undefined);
    // the client reconnected: it makes its call again (replayed), from a new session
    const tookOver = await call(b, 'pay_invoice', { invoice: `INV-${run}-a`, amount: 1 }, run);
    assert.equal(tookOver._meta['durable-ledger/replayed'], true, text(tookOver));
    const lost = await call(a, 'pay_invoice', { invoice: `INV-${run}-a2`, amount: 1 }, run);
    assert.equal(stopKind(lost), 'lease-lost');
    assert.match(lost._meta['durable-ledger/stop'].forPerson, /another session of this gateway/);
    // the session's default run (no run in _meta)
    const own = await b.callTool({ name: 'pay_invoice', arguments: { invoice: `INV-${run}-own`, amount: 1 } });
    const ownRun = own._meta['durable-ledger/run'];
    assert.match(ownRun, /^mcp-session-/);
    const seen = [JSON.stringify(lost), ownRun,
      JSON.stringify(await sql('SELECT meta FROM durable_ledger.effects WHERE run IN ($1, $2)', [run, ownRun])),
      JSON.stringify(await sql('SELECT holder FROM durable_ledger.leases WHERE run IN ($1, $2)', [run, ownRun]))];
    for (const id of ids) {
      for (const s of seen) assert.ok(!s.includes(id), `the session id ${id} is in ${s}`);
    }
    await a.close();
    await b.close();
  });
});

test('F4: a session that lost its run to a newer one never takes it back, even with a call that was on its way when it lost', async () => {
  await withGateway(testConfig({ effects: effects.url }), async (gw) => {
    const run = newRun('takeback');
    const invoice = `INV-${run}`;
    const upstream = /** @type {any} */ (gw.gateway.tools.get('send_email')).upstream;
    const real = upstream.client.bind(upstream);
    /** @type {Promise<void> | null} */
    let hold = null;
    let held = false;
    /** @type {() => void} */
    let release = () => {};
    // the stale session's next call waits for its upstream (connecting again, say)
    upstream.client = () => {
      if (!hold) return real();
      const h = hold;
      hold = null;
      held = true;
      return h.then(real);
    };
    const a = await connect(gw.url);
    assert.equal((await call(a, 'pay_invoice', { invoice, amount: 1 }, run)).isError, undefined);
    hold = new Promise((resolve) => { release = resolve; });
    const stale = call(a, 'send_email', { to: 'ap@acme.example', subject: invoice }, run);
    await until(() => held, 'the stale session\'s call to wait for its upstream');
    const b = await connect(gw.url); // the client, reconnected: it re-runs its step, replayed
    const replayed = await call(b, 'pay_invoice', { invoice, amount: 1 }, run);
    assert.equal(replayed._meta['durable-ledger/replayed'], true, text(replayed));
    release();
    assert.equal(stopKind(await stale), 'lease-lost');
    const next = await call(b, 'pay_invoice', { invoice: `${invoice}-b2`, amount: 1 }, run);
    assert.equal(next.isError, undefined, `the live session keeps the run: ${text(next)}`);
    assert.equal(made('email', (c) => c.body.subject === invoice).length, 0);
    assert.equal(made('pay', (c) => c.body.invoice === `${invoice}-b2`).length, 1);
    await a.close();
    await b.close();
  });
});

test('F5: two side-effecting tools with one name in the ledger (server "bank.x" + tool "pay_invoice", server "bank" + tool "x.pay_invoice") are refused at start, naming both', async () => {
  const { pool, ledger } = ledgerPool();
  const server = (env) => ({ command: process.execPath, args: [UPSTREAM], env: { EFFECTS_URL: effects.url, ...env } });
  try {
    await assert.rejects(Gateway.start(parseConfig({
      servers: { 'bank.x': server({}), bank: server({ TOOL_PREFIX: 'x.' }) },
    }), { ledger, warn: () => {} }), (err) => {
      assert.match(err.message, /the tools pay_invoice \(server bank\.x, tool pay_invoice\) and x\.pay_invoice \(server bank, tool x\.pay_invoice\) have one name in the ledger, bank\.x\.pay_invoice/);
      assert.match(err.message, /give one of them a "ledgerTool"/);
      return true;
    });
    // read-only tools are not in the ledger: no clash
    const gateway = await Gateway.start(parseConfig({
      servers: { 'bank.x': { ...server({}), sideEffectingByDefault: false }, bank: { ...server({ TOOL_PREFIX: 'x.' }), sideEffectingByDefault: false } },
    }), { ledger, warn: () => {} });
    assert.equal(gateway.tools.size, 6);
    await gateway.close();
  } finally {
    await pool.end();
  }
});

/**
 * Makes a call and gives up on it once its payment reached the upstream (paid, not answered
 * yet): what the SDK client's request timeout does, cancel it.  Resolves once the gateway
 * has heard of the cancellation.
 * @param {Awaited<ReturnType<typeof startGateway>>} gw
 * @param {Awaited<ReturnType<typeof startGate>>} gate  holding 'pay'
 * @param {import('@modelcontextprotocol/sdk/client/index.js').Client} client
 * @param {any} params
 */
async function giveUpWhilePaying(gw, gate, client, params) {
  const gaveUp = new AbortController();
  const first = client.callTool(params, undefined, { signal: gaveUp.signal });
  await gate.arrived('pay');
  gaveUp.abort();
  await assert.rejects(first);
  await until(() => [...gw.gateway.sessions].some((s) => s.cancelled.size > 0), 'the gateway to hear of the cancellation');
}

test('F7: a client that gives up on a slow payment (its request timed out) and makes the call again in its session gets that payment\'s answer, not a second payment', async () => {
  const gate = await startGate();
  const gw = await startGateway(testConfig({ effects: effects.url, gate: gate.url, gateOps: ['pay'] }));
  try {
    const run = newRun('timeout');
    const invoice = `INV-${run}`;
    const client = await connect(gw.url);
    const params = { name: 'pay_invoice', arguments: { invoice, amount: 7 }, _meta: { 'durable-ledger/run': run } };
    await giveUpWhilePaying(gw, gate, client, params);
    const retry = client.callTool(params);
    gate.open('pay');
    const answer = await retry;
    assert.equal(answer.isError, undefined, text(answer));
    assert.equal(answer._meta['durable-ledger/replayed'], true);
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1, 'paid once');
    assert.deepEqual((await effectsOf(run)).map((e) => e.status), ['completed']);
    // a later identical call of the session is another call again (the cancelled one was answered)
    const later = await client.callTool(params);
    assert.equal(later._meta['durable-ledger/replayed'], false);
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 2);
    await client.close();
  } finally {
    await gw.close();
    await gate.close();
  }
});

test('F7 with a business key: after a cancelled payment, a call of the same key with other arguments is not answered from it (the ledger refuses it)', async () => {
  const gate = await startGate();
  const gw = await startGateway(testConfig({ effects: effects.url, gate: gate.url, gateOps: ['pay'], pay: { businessKey: 'invoice-{invoice}' } }));
  try {
    const run = newRun('timeout-bkey');
    const invoice = `INV-${run}`;
    const client = await connect(gw.url);
    const call7 = { name: 'pay_invoice', arguments: { invoice, amount: 7 }, _meta: { 'durable-ledger/run': run } };
    await giveUpWhilePaying(gw, gate, client, call7);
    gate.open('pay');
    const other = await client.callTool({ ...call7, arguments: { invoice, amount: 700 } });
    assert.equal(other.isError, true, text(other));
    assert.match(text(other), /already used by a different call/);
    assert.deepEqual(made('pay', (c) => c.body.invoice === invoice).map((c) => c.body.amount), [7], '700 never paid');
    // the cancelled call made again is still answered from it
    const again = await client.callTool(call7);
    assert.equal(again.isError, undefined, text(again));
    assert.equal(again._meta['durable-ledger/replayed'], true);
    assert.equal(made('pay', (c) => c.body.invoice === invoice).length, 1);
    await client.close();
  } finally {
    await gw.close();
    await gate.close();
  }
});
