// Tests of the token-lease mode (ledger.tokenAttempt) against a real server:
// calls of one attempt on different connections and backends (two explicit
// connections, a pg.Pool, PgBouncer in transaction mode), renewal across a slow
// tool, a lease broken by an admin, lost while a tool runs, or expired, and the
// attempt that retries it.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@host/db \
//   DURABLE_LEDGER_PGBOUNCER_DSN=postgresql://postgres@host:6432/db npm test
//
// DURABLE_LEDGER_DSN must be a superuser connection (break_lease, pg_locks);
// DURABLE_LEDGER_PGBOUNCER_DSN the same database through PgBouncer with
// pool_mode = transaction (test/apps/031_js_client.pl starts one).  Through a proxy
// of a sharded ledger, the admin's reads and actions go to its shard (target.js).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import {
  Ledger, LedgerError, LeaseLostError, RunBusy, RunStopped, TokenLease, LEASE_LOST, InvalidArgument,
  EffectDidNotHappen, EffectFailed, EffectPaused,
} from '../src/index.js';
import { DSN as dsn, ADMIN_DSN, BOUNCER_DSN as bouncerDsn, THROUGH_PROXY, sessionBackends } from './target.js';

const needsBouncer = bouncerDsn ? {} : { skip: 'DURABLE_LEDGER_PGBOUNCER_DSN is not set' };

const unique = (name) => `js-token-${name}-${randomUUID()}`;

/** Connected clients, ended at the end of fn (whatever happens). */
async function withClients(n, fn, connectionString = dsn) {
  const clients = [];
  try {
    for (let i = 0; i < n; i += 1) {
      const c = new pg.Client({ connectionString, application_name: 'durable-ledger js token tests' });
      c.on('error', () => {}); // a terminated backend must not crash the test process
      await c.connect();
      clients.push(c);
    }
    return await fn(...clients);
  } finally {
    await Promise.all(clients.map((c) => c.end().catch(() => {})));
  }
}

/**
 * Like withClients, the first of them the admin's: on the ledger's own tables (target.js:
 * through a proxy, on its shard), the others the client's.
 */
async function withAdmin(n, fn) {
  return withClients(1, (admin) => withClients(n - 1, (...clients) => fn(admin, ...clients)), ADMIN_DSN);
}

async function withPool(options, fn) {
  const pool = new pg.Pool({ connectionString: dsn, application_name: 'durable-ledger js token tests', ...options });
  pool.on('error', () => {});
  try {
    return await fn(pool);
  } finally {
    await pool.end();
  }
}

/**
 * A Queryable over fixed connections, used in turn (the analogue of a pool that
 * hands out its connections round robin).  Records every statement with the
 * backend it ran on; `refuse(sql)` makes matching statements fail as if the
 * database could not be reached.
 */
function roundRobin(clients) {
  let next = 0;
  const q = {
    statements: [],
    refuse: null,
    /** the connection the next statement goes to */
    peek: () => clients[next],
    getTransactionStatus: () => clients[next].getTransactionStatus(),
    async query(text, values) {
      if (q.refuse && q.refuse(text)) throw new Error('the database cannot be reached (test)');
      const c = clients[next];
      next = (next + 1) % clients.length;
      q.statements.push({ text, pid: c.processID });
      return c.query(text, values);
    },
    /** Statements other than renewals. */
    calls() {
      return q.statements.filter((s) => !s.text.includes('renew_lease')).length;
    },
  };
  return q;
}

/** A perform() that records its keys, runs during(key) and returns result. */
function tool(result, during) {
  const perform = async (key) => {
    perform.keys.push(key);
    if (during) await during(key);
    return result;
  };
  perform.keys = [];
  return perform;
}

async function audit(admin, run, events = []) {
  const { rows } = await admin.query(
    `SELECT event::text, key, backend_pid, lease_epoch::int, detail FROM durable_ledger.audit_log
      WHERE run = $1 AND (cardinality($2::text[]) = 0 OR event::text = ANY($2)) ORDER BY id`,
    [run, events]);
  return rows;
}

async function effects(admin, run) {
  const { rows } = await admin.query(
    `SELECT tool, occurrence, status::text, lease_epoch::int AS epoch, key FROM durable_ledger.effects
      WHERE run = $1 ORDER BY created_at, occurrence`, [run]);
  return rows;
}

async function effectKey(admin, run, toolName, args, occurrence) {
  const { rows: [r] } = await admin.query(
    'SELECT durable_ledger.effect_key($1, $2, $3::jsonb, $4) AS key', [run, toolName, JSON.stringify(args), occurrence]);
  return r.key;
}

async function liveLeases(admin, run) {
  const { rows } = await admin.query(
    'SELECT kind::text, holder, lease_epoch::int AS epoch FROM durable_ledger.leases WHERE run = $1', [run]);
  return rows;
}

async function breakLease(admin, run, by = 'admin') {
  const { rows: [r] } = await admin.query('SELECT durable_ledger.break_lease($1, $2, NULL) AS broken', [run, by]);
  return r.broken;
}

/** Three side-effecting tools whose downstream systems record every call. */
function tools(ledger) {
  const sent = { 'bank.pay': [], 'mail.send': [], 'crm.note': [] };
  const t = { sent };
  for (const name of Object.keys(sent)) {
    t[name] = ledger.tool(name, async (args, key) => {
      sent[name].push(key);
      return { tool: name, n: sent[name].length, args };
    });
  }
  return t;
}

const rejection = (promise) => promise.then((v) => assert.fail(`resolved with ${JSON.stringify(v)}`), (e) => e);

/** How long a test waits for a state it polls for before it gives up. */
const PATIENCE_MS = 30_000;

/** Waits until check() is true, PATIENCE_MS at most (polling, not sleeping a fixed time). */
async function until(what, check) {
  const deadline = Date.now() + PATIENCE_MS;
  while (!(await check())) {
    if (Date.now() > deadline) assert.fail(`timed out waiting until ${what}`);
    await sleep(20);
  }
}

/** Whether the run's live token lease has expired by the server's clock. */
async function expired(admin, run) {
  const { rows: [r] } = await admin.query(
    `SELECT bool_and(expires_at <= clock_timestamp()) AS expired FROM durable_ledger.token_leases
      WHERE run = $1 AND released_at IS NULL`, [run]);
  return r.expired === true;
}

// ------------------------------------------------------- calls on many backends

test('one attempt on three connections: calls rotate backends, occurrences line up, the retry replays', async () => {
  const run = unique('three-connections');
  await withAdmin(4, async (admin, a, b, c) => {
    const q = roundRobin([a, b, c]); // two statements a call: the begins rotate over all three
    const ledger = new Ledger(q);
    const t = tools(ledger);
    const args = { invoice: 'INV-1', amount: 10 };
    const first = await ledger.tokenAttempt(run, { ttl: 30, holder: 'js-worker' }, async (lease) => {
      assert.ok(lease instanceof TokenLease);
      assert.deepEqual([lease.run, lease.epoch, lease.holder, lease.ttl], [run, 1, 'js-worker', 30]);
      assert.equal(typeof lease.token, 'string');
      assert.ok(!JSON.stringify(lease).includes(lease.token), 'the token is not serialised');
      assert.deepEqual(await liveLeases(admin, run), [{ kind: 'token', holder: 'js-worker', epoch: 1 }]);
      return [
        await t['bank.pay'](run, args),
        await t['bank.pay'](run, args), // again: occurrence 2
        await t['mail.send'](run, { to: 'a@example.com' }),
        await t['bank.pay'](run, { invoice: 'INV-2' }),
      ];
    });
    assert.deepEqual(first.map((r) => r.n), [1, 2, 1, 3]);

    const intents = await audit(admin, run, ['intent']);
    assert.equal(intents.length, 4);
    const pids = new Set(intents.map((r) => r.backend_pid));
    assert.equal(pids.size, 3, `the four begin_effect calls ran on ${[...pids]}`);
    const backends = (await Promise.all([a, b, c].map(sessionBackends))).flat(); // (through a proxy: their shard's too)
    const { rows: [locks] } = await admin.query(
      "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = ANY($1)",
      [backends]);
    assert.equal(locks.n, 0, 'a session lock was taken');
    assert.deepEqual(await effects(admin, run), [
      { tool: 'bank.pay', occurrence: 1, status: 'completed', epoch: 1, key: await effectKey(admin, run, 'bank.pay', args, 1) },
      { tool: 'bank.pay', occurrence: 2, status: 'completed', epoch: 1, key: await effectKey(admin, run, 'bank.pay', args, 2) },
      { tool: 'mail.send', occurrence: 1, status: 'completed', epoch: 1, key: await effectKey(admin, run, 'mail.send', { to: 'a@example.com' }, 1) },
      { tool: 'bank.pay', occurrence: 1, status: 'completed', epoch: 1, key: await effectKey(admin, run, 'bank.pay', { invoice: 'INV-2' }, 1) },
    ]);
    assert.deepEqual(await liveLeases(admin, run), [], 'released at the end');
    assert.equal((await audit(admin, run, ['lease_released'])).length, 1);

    // the retry: another worker, on a pg.Pool, replays it all in order
    await withPool({ max: 3 }, async (pool) => {
      const again = new Ledger(pool);
      const t2 = tools(again);
      const replayed = await again.tokenAttempt(run, { ttl: 30 }, async (lease) => {
        assert.equal(lease.epoch, 2);
        return [
          await t2['bank.pay'](run, args),
          await t2['bank.pay'](run, args),
          await t2['mail.send'](run, { to: 'a@example.com' }),
          await t2['bank.pay'](run, { invoice: 'INV-2' }),
        ];
      });
      assert.deepEqual(replayed, first);
      assert.deepEqual(t2.sent, { 'bank.pay': [], 'mail.send': [], 'crm.note': [] });
    });
    assert.equal((await audit(admin, run, ['replay'])).length, 4);
  });
});

test('a pg.Pool: the calls of one attempt use several of its connections', async () => {
  const run = unique('pool');
  await withAdmin(1, (admin) => withPool({ max: 3 }, async (pool) => {
    const ledger = new Ledger(pool);
    const t = tools(ledger);
    await ledger.tokenAttempt(run, { ttl: 30 }, async () => {
      // other work holds a connection of the pool while the tool runs: the
      // report, and the calls after it, go out on other connections
      const busy = [];
      await ledger.guarded({
        run, tool: 'bank.pay', args: { n: 1 },
        perform: async () => { busy.push(await pool.connect()); return { ok: 1 }; },
      });
      await t['mail.send'](run, { n: 2 });
      busy.push(await pool.connect());
      await t['crm.note'](run, { n: 3 });
      for (const c of busy) c.release();
    });
    const pids = new Set((await audit(admin, run, ['intent', 'completed'])).map((r) => r.backend_pid));
    assert.ok(pids.size > 1, `one backend only: ${[...pids]}`);
    assert.deepEqual((await effects(admin, run)).map((e) => [e.tool, e.status]),
      [['bank.pay', 'completed'], ['mail.send', 'completed'], ['crm.note', 'completed']]);
  }));
});

test('through PgBouncer in transaction mode: one client, calls on several backends', needsBouncer, async () => {
  const run = unique('pgbouncer');
  await withAdmin(1, async (admin) => {
    // make PgBouncer open three server connections (three transactions at once)
    const warm = await withClients(3, async (...cs) => {
      await Promise.all(cs.map((c) => c.query('BEGIN')));
      const pids = await Promise.all(cs.map(async (c) => (await c.query('SELECT pg_backend_pid() AS pid')).rows[0].pid));
      await Promise.all(cs.map((c) => c.query('COMMIT')));
      return pids;
    }, bouncerDsn);
    assert.equal(new Set(warm).size, 3, 'PgBouncer did not open three server connections');

    const results = await withClients(1, async (client) => {
      const ledger = new Ledger(client); // one client connection, shared with the renewal timer
      const t = tools(ledger);
      return ledger.tokenAttempt(run, { ttl: 2 }, async (lease) => {
        const out = [];
        for (let i = 0; i < 8; i += 1) {
          out.push(await t[['bank.pay', 'mail.send'][i % 2]](run, { i: Math.floor(i / 4) }));
          if (i === 3) await sleep(1500); // renewals go through PgBouncer too
        }
        assert.ok(lease.renewals >= 1, `renewals: ${lease.renewals}`);
        return out;
      });
    }, bouncerDsn);
    const pids = (await audit(admin, run, ['intent'])).map((r) => r.backend_pid);
    assert.ok(new Set(pids).size > 1, `PgBouncer sent every call to one backend: ${pids}`);
    assert.deepEqual((await effects(admin, run)).map((e) => [e.tool, e.occurrence]), [
      ['bank.pay', 1], ['mail.send', 1], ['bank.pay', 2], ['mail.send', 2],
      ['bank.pay', 1], ['mail.send', 1], ['bank.pay', 2], ['mail.send', 2]]);
    assert.deepEqual(await liveLeases(admin, run), []);

    // the retry, on a pg.Pool through PgBouncer, replays everything
    const pool = new pg.Pool({ connectionString: bouncerDsn, max: 2 });
    try {
      const ledger = new Ledger(pool);
      const t = tools(ledger);
      const replayed = await ledger.tokenAttempt(run, { ttl: 30 }, async () => {
        const out = [];
        for (let i = 0; i < 8; i += 1) out.push(await t[['bank.pay', 'mail.send'][i % 2]](run, { i: Math.floor(i / 4) }));
        return out;
      });
      assert.deepEqual(replayed, results);
      assert.deepEqual(t.sent, { 'bank.pay': [], 'mail.send': [], 'crm.note': [] });
    } finally {
      await pool.end();
    }
  });
});

// ------------------------------------------------------------------ renewal

test('renewal keeps a 2 s lease alive across a 5 s tool; the completion and the next call work', async () => {
  const run = unique('renewal');
  await withAdmin(2, async (admin, client) => {
    const ledger = new Ledger(client); // one connection for the calls and the renewals
    const seen = {};
    const slow = tool({ payment_id: 'p1' }, async () => {
      await sleep(3500);
      const { rows: [r] } = await admin.query(
        "SELECT (durable_ledger.take_lease($1, '1 minute')).token IS NOT NULL AS taken", [run]);
      seen.takenElsewhere = r.taken;
      seen.live = await liveLeases(admin, run);
      await sleep(1500);
    });
    let lease;
    await ledger.tokenAttempt(run, { ttl: 2 }, async (l) => {
      lease = l;
      const takenAt = l.expiresAt;
      assert.deepEqual(await ledger.guarded({ run, tool: 'bank.pay', args: { amount: 5 }, perform: slow }),
        { payment_id: 'p1' });
      assert.equal(seen.takenElsewhere, false, 'another worker took the run mid-payment');
      assert.deepEqual(seen.live, [{ kind: 'token', holder: null, epoch: 1 }]);
      assert.ok(l.renewals >= 5, `renewals: ${l.renewals}`);
      assert.ok(l.expiresAt - takenAt > 3000, `expiry moved by ${l.expiresAt - takenAt} ms`);
      const next = tool({ message_id: 'm1' });
      assert.deepEqual(await ledger.guarded({ run, tool: 'mail.send', args: { to: 'x' }, perform: next }),
        { message_id: 'm1' });
      assert.equal(next.keys.length, 1);
    });
    assert.equal(lease.lost, null);
    assert.equal(lease.signal.aborted, false);
    assert.deepEqual((await effects(admin, run)).map((e) => [e.tool, e.status, e.epoch]),
      [['bank.pay', 'completed', 1], ['mail.send', 'completed', 1]]);
    assert.deepEqual((await audit(admin, run)).map((r) => r.event),
      ['lease_acquired', 'intent', 'completed', 'intent', 'completed', 'lease_released']);
    const renewals = lease.renewals;
    await sleep(1000);
    assert.equal(lease.renewals, renewals, 'the renewals stopped with the attempt');
  });
});

// --------------------------------------------------------------- lost lease

test('a lease broken by an admin: the next call throws LeaseLostError, nothing more goes out, the retry replays', async () => {
  const run = unique('broken');
  await withAdmin(3, async (admin, a, b) => {
    const q = roundRobin([a, b]);
    const ledger = new Ledger(q);
    const first = tool({ payment_id: 'p1' });
    const never = tool({ should: 'not happen' });
    let lease;
    let sent;
    const atEnd = await rejection(ledger.tokenAttempt(run, { ttl: 30 }, async (l) => {
      lease = l;
      assert.deepEqual(await ledger.guarded({ run, tool: 'bank.pay', args: { n: 1 }, perform: first }),
        { payment_id: 'p1' });
      assert.equal(await breakLease(admin, run), true);
      const lost = await rejection(ledger.guarded({ run, tool: 'mail.send', args: { n: 2 }, perform: never }));
      assert.ok(lost instanceof LeaseLostError, `got ${lost}`);
      assert.ok(lost instanceof LedgerError);
      assert.deepEqual([lost.run, lost.epoch, lost.key, lost.decision], [run, 1, null, null]);
      assert.match(lost.message, /expired/);
      assert.equal(lost.cause?.code, LEASE_LOST);
      assert.equal(l.lost, lost);
      assert.equal(l.signal.aborted, true);
      assert.equal(l.signal.reason, lost);
      // from now on nothing goes out
      sent = q.calls();
      for (const name of ['mail.send', 'crm.note']) {
        await assert.rejects(ledger.guarded({ run, tool: name, args: { n: 3 }, perform: never }), LeaseLostError);
      }
      assert.throws(() => l.check(), LeaseLostError);
      assert.equal(q.calls(), sent);
      // fn goes on after catching it: tokenAttempt throws it at the end
    }));
    assert.ok(atEnd instanceof LeaseLostError, `got ${atEnd}`);
    assert.equal(q.calls(), sent, 'a call went out after the lease was lost (a release, say)');
    assert.equal(never.keys.length, 0);
    assert.deepEqual((await effects(admin, run)).map((e) => [e.tool, e.status]), [['bank.pay', 'completed']]);
    const broken = await audit(admin, run, ['lease_broken']);
    assert.equal(broken.length, 1);
    assert.equal(broken[0].detail.broken_by, 'admin');
    assert.deepEqual(await audit(admin, run, ['lease_released']), []);

    // the retry replays what the first attempt completed, and goes on
    const retry = tool({ should: 'not happen' });
    const next = tool({ message_id: 'm1' });
    await ledger.tokenAttempt(run, { ttl: 30 }, async (l) => {
      assert.equal(l.epoch, 2);
      assert.deepEqual(await ledger.guarded({ run, tool: 'bank.pay', args: { n: 1 }, perform: retry }),
        { payment_id: 'p1' });
      assert.deepEqual(await ledger.guarded({ run, tool: 'mail.send', args: { n: 2 }, perform: next }),
        { message_id: 'm1' });
    });
    assert.deepEqual([retry.keys.length, next.keys.length], [0, 1]);
    assert.deepEqual((await effects(admin, run)).map((e) => [e.tool, e.status, e.epoch]),
      [['bank.pay', 'completed', 1], ['mail.send', 'completed', 2]]);
    assert.equal(lease.lost instanceof LeaseLostError, true);
  });
});

test('a lease lost while a tool runs: the signal aborts, the outcome is reported, then the attempt stops', async () => {
  const run = unique('lost-in-flight');
  await withAdmin(1, (admin) => withPool({ max: 2 }, async (pool) => {
    const ledger = new Ledger(pool);
    const never = tool({ should: 'not happen' });
    let lease;
    const inFlight = tool({ payment_id: 'p1' }, async () => {
      await admin.query("SELECT durable_ledger.break_lease($1, 'oncall', 'hung?')", [run]);
      // a model call or a fetch given lease.signal would stop here; this one just waits for it
      await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('the renewal never noticed')), PATIENCE_MS);
        lease.signal.addEventListener('abort', () => { clearTimeout(timer); resolve(); }, { once: true });
      });
    });
    const err = await rejection(ledger.tokenAttempt(run, { ttl: 2 }, async (l) => {
      lease = l;
      // the call in flight is not cut short: its outcome is reported and returned
      assert.deepEqual(await ledger.guarded({ run, tool: 'bank.pay', args: { n: 1 }, perform: inFlight }),
        { payment_id: 'p1' });
      assert.ok(l.lost instanceof LeaseLostError);
      await ledger.guarded({ run, tool: 'mail.send', args: { n: 2 }, perform: never });
    }));
    assert.ok(err instanceof LeaseLostError, `got ${err}`);
    assert.equal(never.keys.length, 0);
    assert.deepEqual((await effects(admin, run)).map((e) => [e.tool, e.occurrence, e.status]),
      [['bank.pay', 1, 'completed']]);
    assert.deepEqual((await audit(admin, run)).map((r) => r.event),
      ['lease_acquired', 'intent', 'lease_broken', 'late_completion']);
  }));
});

test('record(): a lease broken mid-call, the call made again elsewhere: the late answer or refusal is superseded, not recorded', async () => {
  for (const outcome of ['answer', 'refusal']) {
    const run = unique(`record-${outcome}`);
    await withAdmin(2, (admin, other) => withPool({ max: 2 }, async (pool) => {
      const ledger = new Ledger(pool);
      const err = await rejection(ledger.tokenAttempt(run, { ttl: 30 }, () => ledger.record({
        run, tool: 'model', args: { turn: 1 },
        call: async () => {
          await admin.query("SELECT durable_ledger.break_lease($1, 'oncall', 'hung?')", [run]);
          const elsewhere = new Ledger(other);
          const again = await elsewhere.attempt(run, () => elsewhere.record({
            run, tool: 'model', args: { turn: 1 }, call: () => ({ content: 'second' }) }));
          assert.deepEqual(again, { content: 'second' });
          if (outcome === 'refusal') throw new EffectDidNotHappen({ code: 'content_policy' });
          return { content: 'first' };
        },
      })));
      assert.ok(err instanceof LedgerError && !(err instanceof EffectFailed), `got ${err}`);
      assert.match(err.message, /superseded/);
      assert.doesNotMatch(err.message, /person/);
      assert.deepEqual((await audit(admin, run)).map((r) => r.event).filter((e) => e === 'superseded_report'),
        ['superseded_report']);
      const { rows: [{ n }] } = await admin.query(
        'SELECT count(*)::int AS n FROM durable_ledger.unresolved WHERE run = $1', [run]);
      assert.equal(n, 0);
    }));
  }
});

test('an expired lease: renewals that cannot get through, then LeaseLostError', async () => {
  // (a ttl of 5 s, so that the intent surely goes out before the expiry; the tool
  // waits for the expiry by the server's clock)
  const run = unique('expired');
  await withAdmin(3, async (admin, a, b) => {
    const q = roundRobin([a, b]);
    const ledger = new Ledger(q);
    const never = tool({ should: 'not happen' });
    const renewalErrors = [];
    let lease;
    const err = await rejection(ledger.tokenAttempt(run, {
      ttl: 5, onRenewalError: (e) => renewalErrors.push(e),
    }, async (l) => {
      lease = l;
      q.refuse = (text) => text.includes('renew_lease');
      assert.deepEqual(await ledger.guarded({
        run, tool: 'bank.pay', args: { n: 1 },
        perform: tool({ payment_id: 'p1' }, () => until('the lease expires', () => expired(admin, run))),
      }), { payment_id: 'p1' });
      await ledger.guarded({ run, tool: 'mail.send', args: { n: 2 }, perform: never });
    }));
    assert.ok(err instanceof LeaseLostError, `got ${err}`);
    assert.match(err.message, /has expired/);
    assert.equal(lease.lost, err);
    assert.ok(renewalErrors.length >= 1, 'onRenewalError was not called');
    assert.equal(never.keys.length, 0);
    assert.deepEqual((await effects(admin, run)).map((e) => [e.tool, e.status]), [['bank.pay', 'completed']]);
    assert.deepEqual((await audit(admin, run)).map((r) => r.event), ['lease_acquired', 'intent', 'late_completion']);

    q.refuse = null;
    await ledger.tokenAttempt(run, { ttl: 30 }, async (l) => {
      assert.equal(l.epoch, 2);
      assert.deepEqual(await ledger.guarded({ run, tool: 'bank.pay', args: { n: 1 }, perform: never }),
        { payment_id: 'p1' });
    });
    assert.equal(never.keys.length, 0);
  });
});

test('a begin_effect whose outcome is unknown (the connection died) stops the attempt', async () => {
  const run = unique('uncertain');
  await withAdmin(3, async (admin, a, b) => {
    const q = roundRobin([a, b]);
    const ledger = new Ledger(q);
    const never = tool({ should: 'not happen' });
    let sent;
    const err = await rejection(ledger.tokenAttempt(run, { ttl: 30 }, async () => {
      // the connection the next statement will use is terminated
      const victim = q.peek();
      // (the client learns of its connection's end asynchronously: wait for it)
      const ended = new Promise((resolve) => victim.once('end', resolve));
      await admin.query('SELECT pg_terminate_backend($1)', [victim.processID]);
      await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error('the terminated connection never ended')), PATIENCE_MS);
        ended.then(() => { clearTimeout(timer); resolve(); });
      });
      const died = await rejection(ledger.guarded({ run, tool: 'bank.pay', args: { n: 1 }, perform: never }));
      assert.ok(!(died instanceof LedgerError), `got ${died}`);
      sent = q.calls();
      await ledger.guarded({ run, tool: 'bank.pay', args: { n: 1 }, perform: never });
    }));
    assert.ok(err instanceof RunStopped, `got ${err}`);
    assert.match(err.message, /outcome of the statement unknown/);
    assert.equal(q.calls(), sent + 1, 'only the release went out');
    assert.equal(never.keys.length, 0);
  });
  // nothing was recorded: the next attempt executes it
  await withPool({ max: 2 }, async (pool) => {
    const ledger = new Ledger(pool);
    const once = tool({ payment_id: 'p1' });
    await ledger.tokenAttempt(run, { ttl: 30 }, async () => {
      assert.deepEqual(await ledger.guarded({ run, tool: 'bank.pay', args: { n: 1 }, perform: once }),
        { payment_id: 'p1' });
    });
    assert.equal(once.keys.length, 1);
  });
});

// ---------------------------------------------- the calls of an attempt

/** A promise and the function that resolves it. */
function deferred() {
  let resolve;
  const promise = new Promise((r) => { resolve = r; });
  return { promise, resolve };
}

/** Session locks (the ledger's lock class) held by the backends that serve a client's session (target.js). */
async function sessionLocks(admin, client) {
  const { rows: [r] } = await admin.query(
    "SELECT count(*)::int AS n FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = ANY($1)",
    [await sessionBackends(client)]);
  return r.n;
}

test('a branch that outlives its attempt never acts in the retry: the e-mail goes once', async () => {
  // Promise.all with two branches: one throws, which ends the attempt while the
  // other waits for a model; the job is retried in the same process, and the
  // leftover branch wakes up during the retry.
  const run = unique('leftover-branch');
  await withAdmin(1, (admin) => withPool({ max: 3 }, async (pool) => {
    const ledger = new Ledger(pool);
    const t = tools(ledger);
    const model = deferred();
    let leftover;
    const first = await rejection(ledger.tokenAttempt(run, { ttl: 30 }, async () => {
      await Promise.all([
        (leftover = (async () => {
          await model.promise;
          return t['mail.send'](run, { to: 'a@example.com' });
        })()),
        (async () => { throw new Error('crm lookup: 503'); })(),
      ]);
    }));
    assert.match(first.message, /crm lookup: 503/);
    leftover.catch(() => {});

    const again = await ledger.tokenAttempt(run, { ttl: 30 }, async (lease) => {
      assert.equal(lease.epoch, 2);
      model.resolve(); // the leftover branch of attempt 1 goes on now
      const stale = await rejection(leftover);
      assert.ok(stale instanceof LeaseLostError, `got ${stale}`);
      assert.deepEqual([stale.run, stale.epoch], [run, 1]);
      assert.match(stale.message, /has ended/);
      assert.equal(lease.lost, null, "the stale call did not touch this attempt's lease");
      return t['mail.send'](run, { to: 'a@example.com' }); // this attempt's own call
    });
    assert.equal(again.n, 1);
    assert.equal(t.sent['mail.send'].length, 1, 'the e-mail was sent twice');
    assert.deepEqual((await effects(admin, run)).map((e) => [e.tool, e.occurrence, e.epoch, e.status]),
      [['mail.send', 1, 2, 'completed']]);
  }));
});

test('a leftover branch on one pg.Client never falls back to a session lease', async () => {
  // One client (as to PgBouncer): a branch that outlives the attempt, with no
  // retry, used to take an implicit session lease on whatever backend it hit.
  const run = unique('no-session-fallback');
  await withAdmin(2, async (admin, client) => {
    const ledger = new Ledger(client);
    const t = tools(ledger);
    const model = deferred();
    let leftover;
    await rejection(ledger.tokenAttempt(run, { ttl: 30 }, async () => {
      leftover = (async () => {
        await model.promise;
        return t['mail.send'](run, { to: 'a@example.com' });
      })();
      leftover.catch(() => {});
      throw new Error('crm lookup: 503');
    }));
    model.resolve();
    const stale = await rejection(leftover);
    assert.ok(stale instanceof LeaseLostError, `got ${stale}`);
    assert.equal(stale.epoch, 1);
    // a call outside any attempt on this Ledger: no implicit session lease either
    const outside = await rejection(t['mail.send'](run, { to: 'b@example.com' }));
    assert.ok(outside instanceof LedgerError && !(outside instanceof LeaseLostError), `got ${outside}`);
    assert.match(outside.message, /outside an attempt/);
    assert.deepEqual(t.sent['mail.send'], []);
    assert.equal(await sessionLocks(admin, client), 0, 'a session lock was taken');
    assert.deepEqual(await liveLeases(admin, run), []);
    assert.deepEqual(await effects(admin, run), []);
    // an explicit session attempt is still possible on this Ledger
    await ledger.attempt(run, () => t['mail.send'](run, { to: 'c@example.com' }));
    assert.equal(t.sent['mail.send'].length, 1);
  });
});

test('a call from outside the attempt\'s async context is refused while the attempt is open', async () => {
  const run = unique('outside-context');
  await withAdmin(1, (admin) => withPool({ max: 2 }, async (pool) => {
    const ledger = new Ledger(pool);
    const t = tools(ledger);
    const gate = deferred();
    // created before the attempt: its continuation runs in the outer context
    const outside = gate.promise.then(() => t['bank.pay'](run, { n: 1 }));
    outside.catch(() => {});
    await ledger.tokenAttempt(run, { ttl: 30 }, async () => {
      gate.resolve();
      const err = await rejection(outside);
      assert.ok(err instanceof LedgerError && !(err instanceof LeaseLostError), `got ${err}`);
      assert.match(err.message, /outside the token attempt/);
      // the attempt's own calls go on
      assert.equal((await t['bank.pay'](run, { n: 1 })).n, 1);
    });
    assert.equal(t.sent['bank.pay'].length, 1);
    assert.deepEqual((await effects(admin, run)).map((e) => [e.tool, e.occurrence, e.status]),
      [['bank.pay', 1, 'completed']]);
  }));
});

test('the end of an attempt waits for its calls in flight: their outcome is recorded, then the release', async () => {
  const run = unique('in-flight-at-end');
  await withAdmin(1, (admin) => withPool({ max: 3 }, async (pool) => {
    const sent = [];
    const q = { query: (text, values) => { sent.push(text); return pool.query(text, values); } };
    const ledger = new Ledger(q);
    const inPerform = deferred();
    const bank = deferred();
    const pay = tool({ payment_id: 'p1' }, async () => { inPerform.resolve(); await bank.promise; });
    let branch;
    let settled = false;
    const ending = ledger.tokenAttempt(run, { ttl: 30 }, async () => {
      branch = ledger.guarded({ run, tool: 'bank.pay', args: { n: 1 }, perform: pay });
      branch.catch(() => {});
      await inPerform.promise;
      throw new Error('the other branch failed');
    }).finally(() => { settled = true; });
    ending.catch(() => {});
    await inPerform.promise;
    // let fn's rejection and everything it triggers run (microtasks, then this turn's I/O)
    await new Promise((resolve) => setImmediate(resolve));
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(settled, false, 'tokenAttempt settled while a call of it was in flight');
    assert.ok(!sent.some((s) => s.includes('release_lease')), 'the lease was released under a call in flight');
    assert.deepEqual(await liveLeases(admin, run), [{ kind: 'token', holder: null, epoch: 1 }]);
    bank.resolve();
    assert.deepEqual(await branch, { payment_id: 'p1' });
    assert.match((await rejection(ending)).message, /the other branch failed/);
    assert.deepEqual((await audit(admin, run)).map((r) => r.event),
      ['lease_acquired', 'intent', 'completed', 'lease_released']);
    assert.deepEqual(await liveLeases(admin, run), []);
  }));
});

// ------------------------------------------- one client shared with a tool

test('a begin_effect queued behind a tool\'s BEGIN on the shared client is not performed', async () => {
  // The tool's BEGIN is queued on the client before begin_effect: the intent
  // runs inside the tool's transaction and would vanish with its ROLLBACK.
  const run = unique('shared-begin');
  await withAdmin(2, async (admin, client) => {
    const ledger = new Ledger(client);
    const never = tool({ should: 'not happen' });
    await ledger.tokenAttempt(run, { ttl: 30 }, async () => {
      const begin = client.query('BEGIN'); // another tool's transaction
      const call = ledger.guarded({ run, tool: 'mail.send', args: { to: 'a' }, perform: never });
      await begin;
      const err = await rejection(call);
      await client.query('ROLLBACK');
      assert.ok(err instanceof LedgerError, `got ${err}`);
      assert.match(err.message, /ran inside a transaction that something else opened/);
      assert.match(err.message, /dedicated/);
      // the attempt stops: the intent's fate was that transaction's
      await assert.rejects(ledger.guarded({ run, tool: 'mail.send', args: { to: 'a' }, perform: never }),
        RunStopped);
    });
    assert.equal(never.keys.length, 0);
    const once = tool({ message_id: 'm1' });
    if (THROUGH_PROXY) {
      // through a proxy each call is a transaction of its own on the shard, committed when
      // it returns (docs/scale-out.md): the intent stands, never performed, and once the
      // lease ended the retry pauses it for a person instead of executing it
      assert.deepEqual((await effects(admin, run)).map((e) => [e.occurrence, e.epoch, e.status]),
        [[1, 1, 'started']], 'the intent was committed on the shard');
      await assert.rejects(ledger.tokenAttempt(run, { ttl: 30 }, () =>
        ledger.guarded({ run, tool: 'mail.send', args: { to: 'a' }, perform: once })), EffectPaused);
      assert.equal(once.keys.length, 0);
      assert.deepEqual((await effects(admin, run)).map((e) => [e.occurrence, e.epoch, e.status]),
        [[1, 1, 'unknown']]);
      return;
    }
    assert.deepEqual(await effects(admin, run), [], 'the intent went with the rollback');
    // the retry executes it once
    await ledger.tokenAttempt(run, { ttl: 30 }, () =>
      ledger.guarded({ run, tool: 'mail.send', args: { to: 'a' }, perform: once }));
    assert.equal(once.keys.length, 1);
    assert.deepEqual((await effects(admin, run)).map((e) => [e.occurrence, e.epoch, e.status]),
      [[1, 2, 'completed']]);
  });
});

test('a completion queued behind a tool\'s BEGIN on the shared client is not reported as recorded', async () => {
  const run = unique('shared-report');
  await withAdmin(2, async (admin, client) => {
    const ledger = new Ledger(client); // a session lease, this time
    await ledger.acquireRun(run);
    // while the e-mail is sent, another tool opens a transaction on the client
    const mail = tool({ message_id: 'm1' }, () => { client.query('BEGIN').catch(() => {}); });
    const err = await rejection(ledger.guarded({ run, tool: 'mail.send', args: { to: 'a' }, perform: mail }));
    await client.query('ROLLBACK');
    assert.ok(err instanceof LedgerError, `got ${err}`);
    assert.match(err.message, /complete_effect .* ran inside a transaction/);
    assert.equal(mail.keys.length, 1);
    // (through a proxy the completion was committed on the shard when it returned, whatever
    // the caller's transaction did: docs/scale-out.md; the attempt stops all the same)
    assert.deepEqual((await effects(admin, run)).map((e) => e.status), [THROUGH_PROXY ? 'completed' : 'started'],
      THROUGH_PROXY ? 'the completion was committed on the shard' : 'the completion went with the rollback');
    await assert.rejects(ledger.guarded({ run, tool: 'mail.send', args: { to: 'a' }, perform: mail }), RunStopped);
    assert.equal(mail.keys.length, 1);
  });
});

// -------------------------------------------------------- exclusion, usage

test('one live lease of either kind; released at the end, also after an error', async () => {
  const run = unique('exclusion');
  await withAdmin(2, (admin, sessionClient) => withPool({ max: 2 }, (pool) => withPool({ max: 1 }, async (otherPool) => {
    const ledger = new Ledger(pool);
    const other = new Ledger(otherPool);
    const session = new Ledger(sessionClient);
    await ledger.tokenAttempt(run, { ttl: 30 }, async () => {
      await assert.rejects(other.tokenAttempt(run, () => assert.fail('two token leases on one run')), RunBusy);
      assert.equal(await session.acquireRun(run, { wait: false }), false);
      await assert.rejects(session.acquireRun(run),
        (e) => e instanceof RunBusy && e.sqlstate === '55P03' && /held by a token lease/.test(e.message));
      await assert.rejects(session.guarded({ run, tool: 't', args: {}, perform: tool(1) }),
        /outside an attempt/);
      await assert.rejects(ledger.tokenAttempt(run, () => assert.fail('two attempts at one run in one Ledger')),
        /already open/);
    });
    await assert.rejects(other.tokenAttempt(run, { ttl: 30 }, async () => { throw new Error('the agent crashed'); }),
      /the agent crashed/);
    assert.deepEqual(await liveLeases(admin, run), [], 'released after an error');
    await session.attempt(run, async () => {
      await assert.rejects(other.tokenAttempt(run, () => assert.fail('a token lease while a session holds the run')),
        RunBusy);
    });
    assert.equal((await audit(admin, run, ['lease_released'])).length, 3);
  })));
});

test('a Ledger on a pg.Pool refuses session leases; ttl is checked', async () => {
  const run = unique('usage');
  await withPool({ max: 1 }, async (pool) => {
    const ledger = new Ledger(pool);
    const never = tool(1);
    await assert.rejects(ledger.guarded({ run, tool: 't', args: {}, perform: never }), /tokenAttempt/);
    await assert.rejects(ledger.acquireRun(run), LedgerError);
    await assert.rejects(ledger.releaseRun(run), LedgerError);
    await assert.rejects(ledger.attempt(run, () => assert.fail('a session attempt on a pool')), LedgerError);
    assert.equal(never.keys.length, 0);
    assert.equal(await ledger.effectStatus('0'.repeat(64)), null);
    await ledger.tokenAttempt(run, () => ledger.guarded({ run, tool: 't', args: {}, perform: tool({ ok: 1 }) }));
    const { rows: [k] } = await pool.query("SELECT durable_ledger.effect_key($1, 't', '{}', 1) AS key", [run]);
    assert.equal((await ledger.effectStatus(k.key)).status, 'completed');
    await assert.rejects(ledger.tokenAttempt(run, { ttl: 0.5 }, () => assert.fail('a ttl below 1 s')),
      (e) => e instanceof InvalidArgument && e.sqlstate === '22023');
    await assert.rejects(ledger.tokenAttempt(run, { ttl: '5 minutes' }, () => {}), TypeError);
  });
});

test('the example agent loop with token leases through PgBouncer', needsBouncer, async () => {
  const run = unique('example');
  const script = fileURLToPath(new URL('../examples/agent-loop.js', import.meta.url));
  const { code, stdout, stderr } = await new Promise((resolve, reject) => {
    const child = spawn(process.execPath, [script, run, '--token-lease'],
      { env: { ...process.env, DURABLE_LEDGER_DSN: bouncerDsn } });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => { out += d; });
    child.stderr.on('data', (d) => { err += d; });
    child.on('error', reject);
    child.on('close', (c) => resolve({ code: c, stdout: out, stderr: err }));
  });
  assert.equal(code, 0, `exit code 0; stderr: ${stderr}`);
  const [first, second] = stdout.split('-- the worker restarts');
  assert.match(first, /token lease: epoch 1/);
  assert.match(second, /token lease: epoch 2/);
  assert.match(first, /payments\.charge \[executed\]/);
  assert.doesNotMatch(second, /bank: charging|mail: sending|\[executed\]/);
  assert.match(stdout, /downstream calls: bank 1, mail 1, crm 4/);
  await withAdmin(1, async (admin) => {
    assert.equal((await audit(admin, run, ['lease_released'])).length, 2);
  });
});

// Parallel tool calls (a model asking for several at once): their order is not stable
// between a run and its replay.  Distinct calls are distinct keys whatever their order
// (a key is the tool and the canonical args); calls that name their own operation carry
// a business key, also order-free.  The replay pays nothing twice.  (Identical calls in
// one turn are counted, occurrence 1, 2, ...: two payments; when they must be one, give
// them one business key — README, "Parallel tool calls".)
test('parallel tool calls replayed in another order pay nothing twice', async () => {
  const run = unique('parallel');
  const paid = [];
  await withPool({ max: 4 }, async (pool) => {
    const ledger = new Ledger(pool);
    const pay = ledger.tool('bank.pay', async (args) => {
      paid.push(args.invoice + (args.part ?? ''));
      await sleep(Math.random() * 20); // they finish in any order
      return { paid: args.invoice };
    });
    const calls = [
      () => pay(run, { invoice: 'INV-1' }),
      () => pay(run, { invoice: 'INV-2' }),
      () => pay(run, { invoice: 'INV-3' }),
      // two parts of one invoice, each naming its own operation with a business key
      () => pay(run, { invoice: 'INV-4', part: 'a' }, { businessKey: `${run}-INV-4-a` }),
      () => pay(run, { invoice: 'INV-4', part: 'b' }, { businessKey: `${run}-INV-4-b` }),
    ];
    await ledger.tokenAttempt(run, async () => Promise.all(calls.map((c) => c())));
    assert.equal(paid.length, 5, 'the first attempt performs every call once');
    // the worker restarts; the model asks again, in another order
    const results = await ledger.tokenAttempt(run, async () =>
      Promise.all([calls[4], calls[2], calls[0], calls[3], calls[1]].map((c) => c())));
    assert.equal(paid.length, 5, 'the replay performs nothing');
    assert.deepEqual(results.map((r) => r.paid), ['INV-4', 'INV-3', 'INV-1', 'INV-4', 'INV-2']);
  });
});
