// The server's WARNINGs of ledger calls reach the application (extension 1.3):
// a Ledger emits 'notice' with a structured object ({severity, code, message,
// detail, hint, run, tool, key, ...}), and with no listener writes them with
// console.warn (unless {consoleWarn: false}); on a pg.Client and on a pg.Pool,
// leaving no listener behind on the connections.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@host/db npm test
//
// The DSN must be a superuser connection: the tests register tools, and set the
// unregistered-tools policy in a ledger of their own (it is the database's: through a
// proxy, a proxy of its own in front of a shard of its own, target.js).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { Ledger, LedgerError, NOTICE_CODES } from '../src/index.js';
import { DSN as dsn, withLedgerDatabase } from './target.js';

const APP = 'durable-ledger js notice tests';
const HEX64 = /^[0-9a-f]{64}$/;
const unique = (name) => `js-notice-${name}-${randomUUID()}`;
const toolName = (name) => `${name}.${randomUUID().slice(0, 12)}`;

async function withClients(n, fn, connectionString = dsn) {
  const clients = [];
  try {
    for (let i = 0; i < n; i += 1) {
      const c = new pg.Client({ connectionString, application_name: APP });
      c.on('error', () => {});
      await c.connect();
      clients.push(c);
    }
    return await fn(...clients);
  } finally {
    await Promise.all(clients.map((c) => c.end().catch(() => {})));
  }
}

/** The notices a Ledger emits. */
function listen(ledger) {
  const heard = [];
  ledger.on('notice', (n) => heard.push(n));
  return heard;
}

/** Replaces console.warn while fn runs; returns what it was called with. */
async function capturingConsoleWarn(fn) {
  const lines = [];
  const original = console.warn;
  console.warn = (...args) => { lines.push(args.join(' ')); };
  try {
    await fn();
  } finally {
    console.warn = original;
  }
  return lines;
}

/** Attempt 1 calls tool with memo 'a'; attempt 2, on another client, with memo 'b'. Returns the keys. */
async function rewordedRetry(first, second, run, tool) {
  const keys = [];
  const perform = async (key) => { keys.push(key); return { sent: keys.length }; };
  await first.attempt(run, () => first.guarded({ run, tool, args: { memo: 'a' }, perform }));
  await second.attempt(run, () => second.guarded({ run, tool, args: { memo: 'b' }, perform }));
  return keys;
}

test("a divergence warning (01L01) on a pg.Client: a 'notice' naming the call's key and the effect it may duplicate", async () => {
  const run = unique('warn');
  const tool = toolName('n.mail');
  await withClients(3, async (admin, c1, c2) => {
    await admin.query("SELECT durable_ledger.register_tool($1, 'js tests', divergence => 'warn')", [tool]);
    const first = new Ledger(c1);
    const second = new Ledger(c2);
    const heardFirst = listen(first);
    const heard = listen(second);
    const [earlier, drifted] = await rewordedRetry(first, second, run, tool);
    assert.equal(heardFirst.length, 0, 'the first attempt diverges from nothing');
    assert.match(drifted, HEX64);
    assert.notEqual(drifted, earlier, 'the reworded call executed, under a key of its own');
    assert.equal(heard.length, 1, JSON.stringify(heard));
    const [n] = heard;
    assert.equal(n.code, '01L01');
    assert.equal(n.code, NOTICE_CODES.DIVERGENCE);
    assert.equal(n.severity, 'WARNING');
    assert.equal(n.origin, 'server');
    assert.equal(n.statement, 'begin_effect');
    assert.equal(n.run, run);
    assert.equal(n.tool, tool);
    assert.equal(n.key, drifted, "the call's own key, from the decision row");
    assert.equal(n.mayDuplicate, earlier, 'the effect named in the DETAIL');
    assert.match(n.message, /diverges from the earlier attempts/);
    assert.match(n.detail, new RegExp(`may duplicate effect "${earlier}"`));
    assert.match(n.hint, /change_tool/); // the server's hint, as sent (what to do: since issue 27's messages)
    assert.equal(c2.listenerCount('notice'), 0, 'no listener is left on the client');
  });
});

test('the same divergence under set_unregistered_divergence(warn), and 01L02 under set_unregistered_tools(warn)', async () => {
  // both policies are the database's: a database of this test alone
  await withLedgerDatabase('js_notice', ({ dsn: url }) => withClients(3, async (admin, c1, c2) => {
    await admin.query("SELECT durable_ledger.set_unregistered_divergence('warn', 'js tests')");
    const run = unique('unregistered-warn');
    const first = new Ledger(c1);
    const second = new Ledger(c2);
    const heard = listen(second);
    const [earlier, drifted] = await rewordedRetry(first, second, run, 'mail.send');
    assert.deepEqual(heard.map((n) => [n.code, n.key, n.mayDuplicate, n.tool]),
      [['01L01', drifted, earlier, 'mail.send']]);

    await admin.query("SELECT durable_ledger.set_unregistered_tools('warn', 'js tests')");
    const other = unique('unregistered-tool');
    const third = new Ledger(c1);
    const told = listen(third);
    let key;
    await third.attempt(other, () => third.guarded({
      run: other, tool: 'crm.note', args: { n: 1 }, perform: async (k) => { key = k; return 1; },
    }));
    assert.deepEqual(told.map((n) => [n.code, n.severity, n.run, n.tool, n.key]),
      [['01L02', 'WARNING', other, 'crm.note', key]]);
    assert.equal(told[0].code, NOTICE_CODES.UNREGISTERED);
    assert.match(told[0].message, /tool "crm\.note" is not registered/);
    assert.match(told[0].hint, /register_tool/);
  }, url));
});

test("a report kept as a conflict (01L03): a 'notice' with the effect's key, then the report's LedgerError", async () => {
  const run = unique('conflict');
  await withClients(2, async (admin, c1) => {
    const ledger = new Ledger(c1);
    const heard = listen(ledger);
    let key;
    const err = await ledger.attempt(run, () => ledger.guarded({
      run, tool: 'bank.pay', args: { invoice: 'INV-1' },
      perform: async (k) => {
        key = k;
        // the bank's webhook records another outcome first
        await admin.query('SELECT durable_ledger.complete_effect($1, $2::jsonb, 1)', [k, '{"payment": "webhook"}']);
        return { payment: 'mine' };
      },
    })).then(() => assert.fail('the contradicting report was accepted'), (e) => e);
    assert.ok(err instanceof LedgerError, `got ${err?.stack ?? err}`);
    assert.match(err.message, /did not accept the report/);
    assert.equal(heard.length, 1, JSON.stringify(heard));
    assert.deepEqual([heard[0].code, heard[0].statement, heard[0].run, heard[0].tool, heard[0].key],
      [NOTICE_CODES.CONFLICT, 'complete_effect', run, 'bank.pay', key]);
    assert.match(heard[0].message, /contradicts its recorded outcome/);
    assert.match(heard[0].hint, /resolve_effect/);
  });
});

test('on a pg.Pool: the notice of a token attempt comes from the client checked out for it, which keeps no listener', async () => {
  const run = unique('pool');
  const tool = toolName('n.mail');
  await withClients(1, async (admin) => {
    await admin.query("SELECT durable_ledger.register_tool($1, 'js tests', divergence => 'warn')", [tool]);
    const pool = new pg.Pool({ connectionString: dsn, application_name: APP, max: 3 });
    pool.on('error', () => {});
    const connections = [];
    pool.on('connect', (c) => connections.push(c));
    try {
      const ledger = new Ledger(pool);
      const heard = listen(ledger);
      const keys = [];
      const send = ledger.tool(tool, async (args, key) => { keys.push(key); return { sent: keys.length }; });
      await ledger.tokenAttempt(run, { ttl: 30 }, () => send(run, { memo: 'a' }));
      await ledger.tokenAttempt(run, { ttl: 30 }, async () => {
        // a busy pool: the statements of the attempt on several of its clients
        const held = await pool.connect();
        try {
          await send(run, { memo: 'b' });
        } finally {
          held.release();
        }
      });
      assert.deepEqual(heard.map((n) => [n.code, n.run, n.tool, n.key, n.mayDuplicate]),
        [['01L01', run, tool, keys[1], keys[0]]]);
      assert.ok(connections.length >= 2, `the pool opened ${connections.length} clients`);
      for (const c of connections) assert.equal(c.listenerCount('notice'), 0, 'a pooled client keeps a listener');
    } finally {
      await pool.end();
    }
  });
});

test('with no listener a notice goes to console.warn, unless the Ledger was made with {consoleWarn: false}', async () => {
  const tool = toolName('n.mail');
  await withClients(5, async (admin, c1, c2, c3, c4) => {
    await admin.query("SELECT durable_ledger.register_tool($1, 'js tests', divergence => 'warn')", [tool]);
    const run = unique('console');
    let keys;
    const lines = await capturingConsoleWarn(async () => {
      keys = await rewordedRetry(new Ledger(c1), new Ledger(c2), run, tool);
    });
    assert.equal(lines.length, 1, JSON.stringify(lines));
    // (through a proxy, PL/Proxy's words come before the shard's: docs/scale-out.md)
    assert.match(lines[0], /^durable_ledger WARNING 01L01: .*call of tool ".*" diverges/);
    assert.ok(lines[0].includes(`key ${keys[1]}`), lines[0]);
    assert.ok(lines[0].includes(`may duplicate effect "${keys[0]}"`), lines[0]);
    assert.ok(lines[0].includes(`run ${run}`), lines[0]);

    const quiet = unique('quiet');
    const none = await capturingConsoleWarn(() =>
      rewordedRetry(new Ledger(c3, { consoleWarn: false }), new Ledger(c4, { consoleWarn: false }), quiet, tool));
    assert.deepEqual(none, []);
    // a listener replaces console.warn; one that throws does not disturb the call
    const loud = new Ledger(c3);
    loud.on('notice', () => { throw new Error('a broken listener'); });
    const warned = [];
    const onWarning = (w) => warned.push(w);
    process.on('warning', onWarning);
    try {
      const heard = await capturingConsoleWarn(() =>
        loud.attempt(quiet, () => loud.guarded({ run: quiet, tool, args: { memo: 'c' }, perform: async () => 3 })));
      assert.deepEqual(heard, []);
      await new Promise((resolve) => setImmediate(resolve)); // process warnings are emitted on the next tick
      assert.ok(warned.some((w) => /a 'notice' listener of durable-ledger threw: a broken listener/.test(w.message)),
        warned.map((w) => w.message).join('; '));
    } finally {
      process.off('warning', onWarning);
    }
  });
});
