// The gateway as its users start it: the bin over stdio (an agent host starting an MCP
// server; a client SIGKILLed in the middle of a call, the gateway finishing and recording
// it before it exits), --check, --registry-sql; and the configuration's errors, each
// naming its field.
import { test, after, before } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { startEffectsServer } from '../../test-support/effects-server.js';
import { spawnWorker } from '../../test-support/worker.js';
import { ConfigError, parseConfig, registrySql } from '../src/index.js';
import { DEFAULT_REQUEST_TIMEOUT_MSEC } from '@modelcontextprotocol/sdk/shared/protocol.js';
import { startGate } from './support/gate.js';
import { BIN, CLIENT, DSN, configFile, effectsOf, newRun, printed, sql, testConfig } from './support/setup.js';

/** @type {Awaited<ReturnType<typeof startEffectsServer>>} */
let effects;
before(async () => { effects = await startEffectsServer(); });
after(async () => { await effects.close(); });

test('over stdio: a client SIGKILLed mid-call leaves the gateway to record the call and end its lease; the next client replays', async () => {
  const gate = await startGate();
  try {
    const file = configFile(testConfig({ effects: effects.url, gate: gate.url, gateOps: ['pay'] }));
    const run = newRun('stdio-crash');
    const invoice = `INV-${run}`;
    const step = JSON.stringify([
      { name: 'pay_invoice', arguments: { invoice, amount: 4200 } },
      { name: 'send_email', arguments: { to: 'ap@acme.example', subject: invoice } },
    ]);
    const client = spawnWorker(CLIENT, [`stdio:${file}`, run, step], { DURABLE_LEDGER_DSN: DSN });
    await gate.arrived('pay');
    await client.line(/^result send_email /m);
    client.kill(); // the gateway, its child, sees its stdin end
    gate.open('pay'); // the upstream answers the dead client's payment
    // the client's stderr is the gateway's too: it closes once the gateway has exited
    const { signal, stderr: said } = await client.exit;
    assert.equal(signal, 'SIGKILL');
    assert.doesNotMatch(said, /Error/, 'the gateway exited without an error');
    assert.deepEqual(await sql("SELECT status::text AS status FROM durable_ledger.effects WHERE run = $1 AND tool = 'bank.pay_invoice'",
      [run]), [{ status: 'completed' }], 'the gateway recorded the payment before it exited');
    // a new gateway process: it gets the run at once (the old one released its lease)
    const next = spawnWorker(CLIENT, [`stdio:${file}`, run, step], { DURABLE_LEDGER_DSN: DSN });
    const { code, stdout, stderr } = await next.exit;
    assert.equal(code, 0, stderr);
    const results = printed(stdout);
    assert.equal(results.pay_invoice._meta['durable-ledger/replayed'], true, stdout);
    assert.equal(results.send_email._meta['durable-ledger/replayed'], true, stdout);
    assert.equal(effects.calls('pay').filter((c) => c.body.invoice === invoice).length, 1);
    assert.equal(effects.calls('email').filter((c) => c.body.subject === invoice).length, 1);
    assert.deepEqual((await effectsOf(run)).map((e) => e.status), ['completed', 'completed']);
  } finally {
    await gate.close();
  }
});

test('--check lists each tool and what the gateway does with it; a registry that disagrees exits 1', () => {
  const file = configFile(testConfig({ effects: effects.url, pay: { keyFields: ['invoice', 'amount'], ledgerTool: `bank.pay-${newRun('check')}` } }));
  const r = spawnSync(process.execPath, [BIN, '--config', file, '--check'], {
    env: { ...process.env, DURABLE_LEDGER_DSN: DSN }, encoding: 'utf8',
  });
  assert.equal(r.status, 1, r.stderr);
  assert.match(r.stdout, /^pay_invoice\tthrough the ledger as bank\.pay-mcp-check-\S+ \(key fields invoice, amount\)$/m);
  assert.match(r.stdout, /^send_email\tthrough the ledger as bank\.send_email$/m);
  assert.match(r.stdout, /^lookup_invoice\tstraight through \(read-only\)$/m);
  assert.match(r.stderr, /the ledger has no key fields for it/);
});

test('--registry-sql prints the statements an admin runs; they register the tools', () => {
  const file = configFile(testConfig({ effects: effects.url, pay: { keyFields: ['invoice', 'amount'] } }));
  const r = spawnSync(process.execPath, [BIN, '--config', file, '--registry-sql'], { encoding: 'utf8' });
  assert.equal(r.status, 0, r.stderr);
  assert.equal(r.stdout.trim().split('\n').length, 3);
  assert.match(r.stdout, /^SELECT durable_ledger\.register_tool\('bank\.pay_invoice', 'mcp-gateway', side_effecting => true, key_fields => '\{"invoice","amount"\}', note => 'MCP gateway: server bank, tool pay_invoice'\);$/m);
  assert.match(r.stdout, /^SELECT durable_ledger\.register_tool\('bank\.lookup_invoice', 'mcp-gateway', side_effecting => false, /m);
  assert.equal(registrySql(parseConfig(testConfig({ effects: effects.url }))).split('\n').length, 3);
});

test('a configuration that is wrong is refused before anything starts, naming the field', () => {
  const bad = (json, pattern) => {
    assert.throws(() => parseConfig(json), (err) => err instanceof ConfigError && pattern.test(err.message),
      `${JSON.stringify(json)} -> ${pattern}`);
  };
  bad({}, /^servers: missing \(an object\)$/);
  bad({ servers: {} }, /^servers: name at least one upstream server$/);
  bad({ servers: { bank: {} } }, /^servers\.bank: give either "command" \(a stdio server\) or "url"/);
  bad({ servers: { bank: { command: 'x', url: 'http://a' } } }, /^servers\.bank: give either/);
  bad({ servers: { bank: { url: 'ftp://a' } } }, /^servers\.bank\.url: an http: or https: URL$/);
  bad({ servers: { bank: { url: 'http://a', args: [] } } }, /^servers\.bank\.args: only for a server with "command"$/);
  bad({ servers: { bank: { command: 'x', tools: { pay: { sideEfecting: false } } } } },
    /^servers\.bank\.tools\.pay\.sideEfecting: unknown field \(known: sideEffecting, /);
  bad({ servers: { bank: { command: 'x', tools: { pay: { sideEffecting: 'no' } } } } },
    /^servers\.bank\.tools\.pay\.sideEffecting: must be true or false$/);
  bad({ servers: { bank: { command: 'x', tools: { pay: { keyFields: [] } } } } }, /keyFields: name at least one field/);
  bad({ servers: { bank: { command: 'x', tools: { pay: { keyFields: ['a', 'a'] } } } } }, /keyFields: a field is named twice/);
  bad({ servers: { bank: { command: 'x', tools: { pay: { businessKey: 'constant' } } } } },
    /businessKey: a template with at least one \{field\}/);
  bad({ servers: { bank: { command: 'x', tools: { look: { sideEffecting: false, keyFields: ['a'] } } } } },
    /^servers\.bank\.tools\.look\.keyFields: only for a side-effecting tool/);
  bad({ ledger: { ttl: 0 }, servers: { bank: { command: 'x' } } }, /^ledger\.ttl: must be an integer from 1 to 86400$/);
  bad({ servers: { 'bank pay': { command: 'x' } } }, /^servers\.bank pay: a server's name is letters/);

  const file = configFile({});
  writeFileSync(file, '{ "servers": ');
  const r = spawnSync(process.execPath, [BIN, '--config', file], { encoding: 'utf8' });
  assert.equal(r.status, 2);
  assert.match(r.stderr, /gateway\.json: not JSON: /);

  const defaults = parseConfig({ servers: { bank: { command: 'x', tools: { look: { sideEffecting: false } } } } });
  const [bank] = defaults.servers;
  assert.equal(bank.sideEffectingByDefault, true, 'a tool nobody listed is side-effecting: the safe default');
  assert.equal(defaults.ledger.ttl, 60);
  assert.deepEqual(bank.refusedCodes, [-32601], 'invalid params (-32602) is no promise that nothing was done');
  assert.ok(bank.timeout < DEFAULT_REQUEST_TIMEOUT_MSEC,
    'the upstream timeout is shorter than the MCP SDK client\'s: the gateway answers a slow call first');
  assert.deepEqual(defaults.allowOrigins, []);
  bad({ allowOrigins: ['http://app.example/path'], servers: { bank: { command: 'x' } } },
    /^allowOrigins\[0\]: an origin is scheme:\/\/host\[:port\], nothing more/);
  bad({ allowOrigins: ['app.example'], servers: { bank: { command: 'x' } } }, /^allowOrigins\[0\]: not an origin/);
  assert.deepEqual(parseConfig({ allowOrigins: ['https://App.example:8443'], servers: { bank: { command: 'x' } } })
    .allowOrigins, ['https://app.example:8443']);
  const flag = spawnSync(process.execPath, [BIN, '--config', file, '--http', '0', '--allow-origin', 'https://x.example/a'],
    { encoding: 'utf8' });
  assert.equal(flag.status, 2);
  assert.match(flag.stderr, /--allow-origin: an origin is scheme/);
});
