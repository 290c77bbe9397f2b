// A session attempt (ledger.attempt, acquireRun) behind a transaction pooler is
// detected before anything is performed (extension 1.3): every begin of the
// attempt is made, in the same statement, only where the session that holds the
// attempt's lease is; a statement that reached another server connection, or one
// whose lease another attempt took over, throws PoolerDetected (the tool is not
// called, nothing is recorded) and stops the attempt; its end releases the lock
// where it is held (release_attempt), or says exactly what happens when it may not.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@host/db \
//   DURABLE_LEDGER_PGBOUNCER_DSN=postgresql://postgres@host:6432/db npm test
//
// DURABLE_LEDGER_DSN must be a superuser connection (it creates databases and a
// login role of its own); DURABLE_LEDGER_PGBOUNCER_DSN the same cluster through a
// PgBouncer with pool_mode = transaction and default_pool_size of 2 or more (its
// tests use a ledger of their own, so that the pool they steer is theirs alone).
// Through a proxy of a sharded ledger (target.js) that ledger is a proxy of its own in
// front of a shard of its own: the client's calls go through the proxy, the admin's
// reads to the shard, where a lease's holder is the shard's backend of PL/Proxy's
// connection (target.ledgerBackend), not the server connection the client reached.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { Ledger, LeaseLostError, LedgerError, PoolerDetected } from '../src/index.js';
import {
  BOUNCER_DSN as bouncerDsn, THROUGH_PROXY, dsnAs as asUser, dropLeases, ledgerBackend, withLedgerDatabase,
} from './target.js';

const needsBouncer = bouncerDsn ? {} : { skip: 'DURABLE_LEDGER_PGBOUNCER_DSN is not set' };

const APP = 'durable-ledger js pooler tests';
const unique = (name) => `js-pooler-${name}-${randomUUID()}`;
const DEADLINE_MS = 30_000;

async function connect(connectionString) {
  const c = new pg.Client({ connectionString, application_name: APP });
  c.on('error', () => {}); // a backend terminated by release_attempt must not crash the tests
  await c.connect();
  return c;
}

async function withClients(urls, fn) {
  const clients = [];
  try {
    for (const url of urls) clients.push(await connect(url));
    return await fn(...clients);
  } finally {
    await Promise.all(clients.map((c) => c.end().catch(() => {})));
  }
}

/**
 * A ledger of the test alone (target.withLedgerDatabase): {admin, direct, bounced} are
 * the URLs of its tables (through a proxy, its shard's), of a client's direct
 * connection (through a proxy, to the proxy), and through PgBouncer, when there is one
 * (a pool of its own, empty at the start).  Dropped afterwards.
 */
async function withDatabase(fn) {
  return withLedgerDatabase('js_pooler', ({ dsn, adminDsn, bouncerDsn: bounced }) =>
    fn({ admin: adminDsn, direct: dsn, bounced }));
}

/** Waits until check() is true, for DEADLINE_MS at most. */
async function until(what, check) {
  const deadline = Date.now() + DEADLINE_MS;
  for (;;) {
    if (await check()) return;
    if (Date.now() > deadline) assert.fail(`timed out waiting until ${what}`);
    await sleep(50);
  }
}

/** A tool that records its calls. */
function counter(result) {
  const perform = async (key) => {
    perform.keys.push(key);
    return result;
  };
  perform.keys = [];
  return perform;
}

/** Counts the statements a pg.Client sends (the Ledger's and anyone's). */
function counted(client) {
  const query = client.query.bind(client);
  client.sent = 0;
  client.query = (...args) => {
    client.sent += 1;
    return query(...args);
  };
  return client;
}

/** The backend whose session holds the run's lease, and its epoch; null when nothing holds it. */
async function holder(admin, run) {
  const { rows } = await admin.query(
    'SELECT holder_pid, lease_epoch::int AS epoch FROM durable_ledger.leases WHERE run = $1', [run]);
  return rows[0] ?? null;
}

/** After the attempt: nothing holds the run, a direct worker takes it, and no advisory lock of `pid` is left. */
async function assertFree(admin, run, pid) {
  await until(`nothing holds run ${run}`, async () => (await holder(admin, run)) === null);
  const { rows: [{ ok }] } = await admin.query('SELECT durable_ledger.acquire_run($1, wait => false) AS ok', [run]);
  assert.equal(ok, true, 'a worker connecting directly takes the run');
  await admin.query('SELECT durable_ledger.release_run($1)', [run]);
  const { rows: [{ n }] } = await admin.query(
    "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND pid = $1", [pid]);
  assert.equal(n, 0, `backend ${pid} holds no advisory lock any more`);
}

async function effectCount(admin, run) {
  const { rows: [{ n }] } = await admin.query(
    'SELECT count(*)::int AS n FROM durable_ledger.effects WHERE run = $1', [run]);
  return n;
}

/**
 * Clients through PgBouncer, each in a transaction (which holds its server
 * connection), until one has the server connection whose session holds `run`'s lease
 * on backend `pid` (the leases view's holder: the server connection itself, or through
 * a proxy, the shard's backend of its connection there): returns it (pinned), that
 * server connection's pid (`server`: what the client's lease names) and the others,
 * which hold the other server connections.
 */
async function transactionsUntil(url, run, pid) {
  const others = [];
  for (let i = 0; i < 16; i += 1) {
    const c = await connect(url);
    await c.query('BEGIN');
    if (await ledgerBackend(c, run, THROUGH_PROXY) === pid) {
      const { rows: [r] } = await c.query('SELECT pg_backend_pid() AS pid');
      return { pinned: c, server: r.pid, others };
    }
    others.push(c);
  }
  throw new Error(`no transaction through PgBouncer landed on the server connection of backend ${pid}`);
}

async function endAll(clients) {
  await Promise.all(clients.map((c) => c.end().catch(() => {})));
}

test('through PgBouncer (transaction mode): a call that reaches another server connection throws PoolerDetected before the tool runs; the run is free afterwards', needsBouncer, async () => {
  await withDatabase(({ admin: tables, bounced }) => withClients([tables, bounced], async (admin, viaPooler) => {
    const run = unique('elsewhere');
    const ledger = new Ledger(counted(viaPooler));
    const pay = counter({ paid: 1 });
    let caught;
    let lease;
    let pinned;
    let server;
    const others = [];
    try {
      await assert.rejects(ledger.attempt(run, async () => {
        lease = await holder(admin, run);
        assert.ok(lease, 'the attempt holds the run');
        // another client's transaction occupies the attempt's server connection:
        // the attempt's next statement must go to another one
        const held = await transactionsUntil(bounced, run, lease.holder_pid);
        pinned = held.pinned;
        server = held.server; // the attempt's server connection (through a proxy, not the holder)
        others.push(...held.others);
        for (const o of held.others) await o.query('COMMIT');
        caught = await ledger.guarded({ run, tool: 'bank.pay', args: { invoice: 'INV-9' }, perform: pay })
          .then(() => assert.fail('the call was made'), (e) => e);
        // the attempt stops: a further call throws without asking the database
        const sent = viaPooler.sent;
        await assert.rejects(ledger.record({ run, tool: 'model', args: {}, call: pay }), PoolerDetected);
        assert.equal(viaPooler.sent, sent, 'a stopped attempt asks the database nothing');
        throw caught;
      }), PoolerDetected);
    } finally {
      await endAll([...(pinned ? [pinned] : []), ...others]);
    }
    assert.ok(caught instanceof PoolerDetected, `got ${caught?.stack ?? caught}`);
    assert.ok(caught instanceof LeaseLostError, 'a PoolerDetected is a LeaseLostError');
    assert.ok(caught instanceof LedgerError);
    assert.equal(caught.name, 'PoolerDetected');
    assert.equal(caught.run, run);
    assert.equal(caught.epoch, lease.epoch);
    assert.equal(caught.pid, server);
    assert.notEqual(caught.reachedPid, server);
    assert.equal(caught.reachedEpoch, null);
    assert.match(caught.message, /another server connection/);
    assert.match(caught.message, /transaction pooler/);
    assert.match(caught.message, /pool_mode = transaction/);
    assert.match(caught.message, /tokenAttempt/);
    assert.deepEqual(pay.keys, [], 'the tool was not called');
    assert.equal(await effectCount(admin, run), 0, 'nothing was recorded');

    // the end of the attempt ended the lease where it was held: the pooled
    // server connection that had it (through a proxy, its connection to the shard)
    // was terminated, and audited
    await assertFree(admin, run, lease.holder_pid);
    const { rows } = await admin.query(
      "SELECT detail->>'broken_by' AS by, (detail->>'holder_pid')::int AS pid FROM durable_ledger.audit_log " +
        "WHERE run = $1 AND event = 'lease_broken'", [run]);
    assert.deepEqual(rows, [{ by: 'release_attempt', pid: lease.holder_pid }]);
  }));
});

test("through PgBouncer: a second client's attempt took the run over on the attempt's server connection: PoolerDetected, the later attempt untouched", needsBouncer, async () => {
  await withDatabase(({ admin: tables, bounced }) => withClients([tables, bounced], async (admin, viaPooler) => {
    const run = unique('taken-over');
    const ledger = new Ledger(viaPooler);
    const pay = counter({ paid: 1 });
    let caught;
    let lease;
    let server;
    const held = [];
    try {
      await assert.rejects(ledger.attempt(run, async () => {
        lease = await holder(admin, run);
        // the job delivered twice: a second worker's transaction is handed the
        // same server connection, and its acquire_run takes the run there (a new
        // epoch: the session holds the lock already)
        const { pinned, others, ...at } = await transactionsUntil(bounced, run, lease.holder_pid);
        server = at.server; // the attempt's server connection (through a proxy, not the holder)
        held.push(pinned, ...others);
        const { rows: [r] } = await pinned.query('SELECT durable_ledger.acquire_run($1, wait => false) AS ok', [run]);
        assert.equal(r.ok, true);
        await pinned.query('COMMIT'); // the only idle server connection: the attempt's next statement goes there
        caught = await ledger.guarded({ run, tool: 'bank.pay', args: { invoice: 'INV-9' }, perform: pay })
          .then(() => assert.fail('the call was made'), (e) => e);
        throw caught;
      }), PoolerDetected);
      assert.equal(caught.pid, server);
      assert.equal(caught.reachedPid, server, 'the statement reached the same server connection');
      assert.equal(caught.reachedEpoch, lease.epoch + 1, "whose lease is the second worker's attempt");
      assert.match(caught.message, new RegExp(`another attempt \\(epoch ${lease.epoch + 1}\\)`));
      assert.match(caught.message, /tokenAttempt/);
      assert.deepEqual(pay.keys, []);
      assert.equal(await effectCount(admin, run), 0);
      // release_attempt never touches a later attempt: the second worker's lease is
      // still there (it leaked through the pooler itself)
      assert.deepEqual(await holder(admin, run), { holder_pid: lease.holder_pid, epoch: lease.epoch + 1 });
      const { rows } = await admin.query("SELECT 1 FROM durable_ledger.audit_log WHERE run = $1 AND event = 'lease_broken'", [run]);
      assert.equal(rows.length, 0);
    } finally {
      await endAll(held);
    }
    await admin.query("SELECT durable_ledger.break_lease($1, 'js tests', 'the scenario leaked it')", [run]);
    await assertFree(admin, run, lease.holder_pid);
  }));
});

test('a pooler stand-in whose server connections log in as other roles: PoolerDetected, and a notice says what happens to a lock the role may not end', async () => {
  // acquire_run reaches a superuser's backend; every later statement reaches a
  // worker role's, which may not terminate a superuser's (release_attempt: 42501)
  await withDatabase(async ({ admin: tables, direct }) => {
    const role = `dl_jstest_${randomUUID().replace(/-/g, '').slice(0, 16)}`;
    await withClients([tables], async (admin) => {
      await admin.query(`CREATE ROLE ${role} LOGIN`);
      await admin.query(`GRANT durable_ledger_worker TO ${role}`);
    });
    try {
      await withClients([tables, direct, asUser(direct, role)], async (admin, home, away) => {
        const standIn = {
          query: (text, values) => (text.includes('acquire_run') ? home : away).query(text, values),
          getTransactionStatus: () => away.getTransactionStatus(),
        };
        const ledger = new Ledger(standIn);
        const heard = [];
        ledger.on('notice', (n) => heard.push(n));
        const run = unique('stand-in');
        const pay = counter({ paid: 1 });
        const { rows: [{ pid: homePid }] } = await home.query('SELECT pg_backend_pid() AS pid');
        await assert.rejects(ledger.attempt(run, () =>
          ledger.guarded({ run, tool: 'bank.pay', args: { invoice: 1 }, perform: pay })), (err) => {
          assert.ok(err instanceof PoolerDetected, `got ${err?.stack ?? err}`);
          assert.equal(err.pid, homePid);
          assert.equal(err.reachedPid, away.processID);
          return true;
        });
        assert.deepEqual(pay.keys, []);
        assert.equal(await effectCount(admin, run), 0);
        assert.equal(heard.length, 1, JSON.stringify(heard));
        const [n] = heard;
        assert.deepEqual([n.origin, n.severity, n.code, n.statement, n.run, n.pid],
          ['client', 'WARNING', '42501', 'release_attempt', run, homePid]);
        assert.match(n.message, new RegExp(`stays held by server connection ${homePid} .*until that connection closes`));
        assert.match(n.message, /break_lease/);
        assert.match(n.detail, /server_lifetime/);
        assert.match(n.detail, /server_idle_timeout/);
        // as it says: held until that connection closes (through a proxy, by its
        // connection to the shard)
        const held = await ledgerBackend(home, run, THROUGH_PROXY);
        assert.equal((await holder(admin, run)).holder_pid, held);
        await home.end();
        await assertFree(admin, run, held);
      });
    } finally {
      await withClients([tables], (admin) => admin.query(`DROP ROLE ${role}`));
    }
  });
});

test("a session lease lost on the attempt's own connection: LeaseLostError (not PoolerDetected) before the tool runs", async () => {
  await withDatabase(({ admin: tables, direct }) => withClients([tables, direct], async (admin, c) => {
    const run = unique('lost');
    const ledger = new Ledger(counted(c));
    const pay = counter({ paid: 1 });
    await ledger.acquireRun(run);
    assert.deepEqual(await ledger.guarded({ run, tool: 'bank.pay', args: { invoice: 1 }, perform: pay }), { paid: 1 });
    await dropLeases(c, THROUGH_PROXY); // pg_advisory_unlock_all(), behind the ledger's back
    const err = await ledger.guarded({ run, tool: 'mail.send', args: { to: 'ap' }, perform: pay })
      .then(() => assert.fail('the call was made'), (e) => e);
    assert.ok(err instanceof LeaseLostError && !(err instanceof PoolerDetected), `got ${err?.stack ?? err}`);
    assert.equal(err.run, run);
    assert.equal(err.epoch, 1);
    assert.match(err.message, /was lost/);
    const sent = c.sent;
    await assert.rejects(ledger.guarded({ run, tool: 'mail.send', args: { to: 'ap' }, perform: pay }), LeaseLostError);
    assert.equal(c.sent, sent, 'a stopped attempt asks the database nothing');
    assert.equal(pay.keys.length, 1);
    assert.equal(await effectCount(admin, run), 1, 'only the first call was recorded');
    assert.equal(await ledger.releaseRun(run), false, 'nothing was left to release');
    // a new attempt goes on, and replays what the first completed
    await ledger.attempt(run, async () => {
      assert.deepEqual(await ledger.guarded({ run, tool: 'bank.pay', args: { invoice: 1 }, perform: pay }), { paid: 1 });
    });
    assert.equal(pay.keys.length, 1);
  }));
});
