// Tests of the client against the runs people steer (extension 1.2): a drifted
// replay paused as a divergence (DivergencePausedError), an abandoned run
// (RunAbandonedError), a retired or unregistered tool (ToolRefusedError), and
// ledger.history(run).
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@host/db npm test
//
// The DSN must be a superuser connection to a database with the extension at
// version 1.2 (or to a proxy of a sharded ledger: target.js): the tests register
// and retire tools, resolve divergences, abandon runs and create login roles of
// their own (dropped again).  Every test uses runs and tool names of its own, so
// that the tools registry, which is the database's, stays out of the other tests'
// way.  What they read in the ledger's tables is read where those are (target.js).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import {
  Ledger, LedgerError, EffectPaused, EffectFailed, EffectDidNotHappen, RunStopped,
  DivergencePausedError, RunAbandonedError, ToolRefusedError, RUN_ABANDONED, TOOL_REFUSED, PermissionDenied,
  DivergencePaused, AwaitingApproval, BudgetExhausted,
} from '../src/index.js';
import { DSN as dsn, ADMIN_DSN, dsnAs as asUser, withLedgerDatabase } from './target.js';

const APP = 'durable-ledger js steering tests';
const HISTORY_COLUMNS = ['id', 'logged_at', 'lease_epoch', 'event', 'key', 'tool', 'args', 'attempt',
  'outcome', 'detail', 'role_name', 'application_name'];

const unique = (name) => `js-steer-${name}-${randomUUID()}`;
/** A tool of one test alone: the registry is the database's. */
const toolName = (name) => `${name}.${randomUUID().slice(0, 12)}`;

/** The DSN with another user (node-postgres lets the URL's user win over `user`). */
const dsnAs = (user) => asUser(dsn, user);

/** The ledger's own tables, read where they are (target.js). */
const tables = new pg.Client({ connectionString: ADMIN_DSN, application_name: APP });
before(() => tables.connect());
after(() => tables.end());

/** Runs fn(...clients) on fresh connections (new sessions), ended afterwards. */
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

async function withPool(fn) {
  const pool = new pg.Pool({ connectionString: dsn, application_name: APP, max: 2 });
  pool.on('error', () => {});
  try {
    return await fn(pool);
  } finally {
    await pool.end();
  }
}

/**
 * Login roles made for a test (with the given ledger roles and role settings),
 * dropped (settings reset) by `drop()`.
 */
function roles(admin) {
  const made = [];
  return {
    async make(grants, settings = {}) {
      const role = `dl_jstest_${randomUUID().replace(/-/g, '').slice(0, 16)}`;
      await admin.query(`CREATE ROLE ${role} LOGIN`);
      made.push({ role, settings: Object.keys(settings) });
      for (const g of grants) await admin.query(`GRANT ${g} TO ${role}`);
      for (const [name, value] of Object.entries(settings)) {
        await admin.query(`ALTER ROLE ${role} SET ${name} = ${admin.escapeLiteral(value)}`);
      }
      return role;
    },
    async drop() {
      for (const { role, settings } of made.reverse()) {
        for (const name of settings) await admin.query(`ALTER ROLE ${role} RESET ${name}`);
        await admin.query(`DROP ROLE ${role}`);
      }
    },
  };
}

/** A downstream system that performs what it is asked and remembers it. */
function bank() {
  const calls = [];
  return {
    calls,
    tool(ledger, name) {
      return ledger.tool(name, (args, key) => {
        calls.push({ tool: name, args, key });
        return { paid: args, n: calls.length };
      });
    },
  };
}

async function register(admin, tool) {
  await admin.query("SELECT durable_ledger.register_tool($1, 'test')", [tool]);
}

async function effectKeys(admin, run) {
  const { rows } = await admin.query(
    'SELECT key FROM durable_ledger.effects WHERE run = $1 ORDER BY created_at', [run]);
  return rows.map((r) => r.key);
}

async function unresolved(admin, run) {
  const { rows } = await admin.query(
    'SELECT key, tool, status, may_duplicate FROM durable_ledger.unresolved WHERE run = $1', [run]);
  return rows;
}

// ------------------------------------------------------------------ divergence

test('a drifted replay of a registered tool throws DivergencePausedError and stops the attempt; resolved as the same, it replays', async () => {
  const run = unique('drift');
  const payTool = toolName('t.pay');
  const mailTool = toolName('t.mail');
  const b = bank();
  await withClients(4, async (admin, c1, c2, c3) => {
    await register(admin, payTool);

    const first = new Ledger(c1);
    const receipt = await first.attempt(run, () => b.tool(first, payTool)(run, { invoice: 1, memo: 'a' }));
    assert.equal(b.calls.length, 1);
    const [earlier] = await effectKeys(tables, run);

    // Attempt 2: the model reworded the memo.  The call is not performed.
    const second = new Ledger(c2);
    const pay = b.tool(second, payTool);
    const mail = b.tool(second, mailTool);
    let drift;
    await second.attempt(run, async () => {
      drift = await pay(run, { invoice: 1, memo: 'b' }).then(
        () => assert.fail('the drifted call was performed'), (err) => err);
      assert.ok(drift instanceof DivergencePausedError, `got ${drift?.stack ?? drift}`);
      assert.ok(drift instanceof EffectPaused); // existing handlers of pauses catch it
      assert.ok(drift instanceof LedgerError);
      // the Python client's name; DivergencePausedError (its name in 1.2) is the same class
      assert.ok(drift instanceof DivergencePaused);
      assert.equal(drift.name, 'DivergencePaused');
      assert.equal(drift.decision, 'pause');
      assert.equal(drift.run, run);
      assert.equal(drift.tool, payTool);
      assert.match(drift.key, /^[0-9a-f]{64}$/);
      assert.notEqual(drift.key, earlier);
      assert.ok(drift.reason.includes(earlier), drift.reason); // the effect it may duplicate
      assert.match(drift.message, /resolve_divergence/);

      // The attempt stops there: no further call of it performs anything.
      for (const [call, args] of [[pay, { invoice: 1, memo: 'b' }], [pay, { invoice: 1, memo: 'a' }],
        [mail, { to: 'ap@example.com' }]]) {
        await assert.rejects(call(run, args), (err) => {
          assert.ok(err instanceof RunStopped, `got ${err?.stack ?? err}`);
          assert.equal(err.key, drift.key);
          return true;
        });
      }
    });
    assert.equal(b.calls.length, 1, JSON.stringify(b.calls));
    assert.deepEqual(await effectKeys(tables, run), [earlier]);
    assert.deepEqual(await unresolved(tables, run),
      [{ key: drift.key, tool: payTool, status: null, may_duplicate: earlier }]);

    // A person says it is the same payment: a new attempt gets the recorded result.
    await admin.query("SELECT durable_ledger.resolve_divergence($1, 'same', 'test')", [drift.key]);
    const third = new Ledger(c3);
    const again = await third.attempt(run, () => b.tool(third, payTool)(run, { invoice: 1, memo: 'b' }));
    assert.deepEqual(again, receipt);
    assert.equal(b.calls.length, 1, JSON.stringify(b.calls));
    assert.deepEqual(await unresolved(tables, run), []);
  });
});

test('a divergence in a token attempt on a pg.Pool; resolved as distinct, the next attempt executes it', async () => {
  const run = unique('drift-token');
  const payTool = toolName('t.pay');
  const b = bank();
  await withClients(1, (admin) => withPool(async (pool) => {
    await register(admin, payTool);
    const ledger = new Ledger(pool);
    const pay = b.tool(ledger, payTool);
    await ledger.tokenAttempt(run, { ttl: 60 }, () => pay(run, { invoice: 1, memo: 'a' }));
    let drift;
    await ledger.tokenAttempt(run, { ttl: 60 }, async () => {
      drift = await pay(run, { invoice: 1, memo: 'b' }).then(
        () => assert.fail('the drifted call was performed'), (err) => err);
      assert.ok(drift instanceof DivergencePausedError, `got ${drift?.stack ?? drift}`);
      await assert.rejects(pay(run, { invoice: 2, memo: 'c' }), RunStopped);
    });
    assert.equal(b.calls.length, 1);
    assert.equal(drift.run, run);
    assert.equal(drift.tool, payTool);

    await admin.query("SELECT durable_ledger.resolve_divergence($1, 'distinct', 'test')", [drift.key]);
    await ledger.tokenAttempt(run, { ttl: 60 }, () => pay(run, { invoice: 1, memo: 'b' }));
    assert.deepEqual(b.calls.map((c) => c.args.memo), ['a', 'b']);
    assert.equal(b.calls[1].key, drift.key);
  }));
});

test('a tool nobody registered, reworded on a retry, pauses by default (1.3); an honest replay never pauses; recorded calls are never paused for drift', async () => {
  // the default is the database's: a fresh install in a ledger of this test alone
  const run = unique('unregistered-drift');
  const b = bank();
  const answers = [];
  const model = (answer) => () => { answers.push(answer); return { say: answer }; };
  await withLedgerDatabase('js_steer', ({ dsn: url, adminDsn }) => withClients(1, (admin) =>
    withClients(3, async (c1, c2, c3) => {
      const { rows: [policy] } = await admin.query(
        'SELECT count(*)::int AS set FROM durable_ledger.policy');
      assert.equal(policy.set, 0, 'nothing set: the defaults');
      const agent = (ledger, memo, turn) => ledger.attempt(run, async () => {
        const note = await ledger.record({ run, tool: 'llm.turn', args: { turn }, call: model(`turn ${turn}`) });
        return b.tool(ledger, 'mail.send')(run, { to: 'ap@example.com', body: `${note.say}: ${memo}` });
      });
      const first = new Ledger(c1);
      const sent = await agent(first, 'paid', 1);
      // an honest replay: the same calls, replayed, nothing performed, no pause
      assert.deepEqual(await agent(new Ledger(c2), 'paid', 1), sent);
      assert.deepEqual(answers, ['turn 1']);
      assert.equal(b.calls.length, 1);
      // the retry's model asks otherwise (a recorded call with new args is made, never
      // paused) and rewords the email: the email pauses instead of going out twice
      const third = new Ledger(c3);
      const drift = await agent(third, 'paid, thanks', 2).then(
        () => assert.fail('the reworded call of an unregistered tool was performed'), (err) => err);
      assert.ok(drift instanceof DivergencePausedError, `got ${drift?.stack ?? drift}`);
      assert.equal(drift.tool, 'mail.send');
      assert.deepEqual(answers, ['turn 1', 'turn 2'], 'the recorded call with new args was made');
      assert.equal(b.calls.length, 1, JSON.stringify(b.calls));
      const { rows } = await admin.query(
        'SELECT tool, may_duplicate FROM durable_ledger.unresolved WHERE run = $1', [run]);
      const [earlier] = (await admin.query(
        "SELECT key FROM durable_ledger.effects WHERE run = $1 AND tool = 'mail.send'", [run])).rows;
      assert.deepEqual(rows, [{ tool: 'mail.send', may_duplicate: earlier.key }]);
    }, url), adminDsn));
});

// --------------------------------------------------------------------- abandon

test('an abandoned run throws RunAbandonedError on the next call and on a new attempt; nothing performed', async () => {
  const run = unique('abandon');
  const payTool = toolName('t.pay');
  const b = bank();
  await withClients(3, async (admin, c1, c2) => {
    const ledger = new Ledger(c1);
    const pay = b.tool(ledger, payTool);
    await ledger.attempt(run, async () => {
      await pay(run, { invoice: 1 });
      const { rows } = await admin.query(
        "SELECT durable_ledger.abandon_run($1, 'test', 'wrong customer') AS done", [run]);
      assert.equal(rows[0].done, true);
      await assert.rejects(pay(run, { invoice: 2 }), (err) => {
        assert.ok(err instanceof RunAbandonedError, `got ${err?.stack ?? err}`);
        assert.ok(err instanceof LedgerError);
        assert.equal(err.run, run);
        assert.equal(err.key, null);
        assert.equal(err.cause?.code, RUN_ABANDONED);
        assert.match(err.message, /abandoned/);
        assert.match(err.message, /must not be retried/);
        return true;
      });
      // the attempt stays stopped, without asking the database
      await assert.rejects(pay(run, { invoice: 1 }), RunAbandonedError);
    });
    assert.deepEqual(b.calls.map((c) => c.args), [{ invoice: 1 }]);

    // a new attempt, in each way one starts
    await assert.rejects(ledger.attempt(run, () => assert.fail('an attempt of an abandoned run began')),
      RunAbandonedError);
    await assert.rejects(ledger.acquireRun(run), RunAbandonedError);
    const fresh = new Ledger(c2); // a call outside an attempt is refused before anything
    await assert.rejects(b.tool(fresh, payTool)(run, { invoice: 3 }), /outside an attempt/);
    await withPool(async (pool) => {
      await assert.rejects(
        new Ledger(pool).tokenAttempt(run, { ttl: 60 }, () => assert.fail('a token attempt of an abandoned run began')),
        RunAbandonedError);
    });
    assert.equal(b.calls.length, 1);
    assert.equal((await effectKeys(tables, run)).length, 1);
  });
});

test('a run abandoned during a token attempt: RunAbandonedError, and the attempt stops', async () => {
  const run = unique('abandon-token');
  const b = bank();
  await withClients(1, (admin) => withPool(async (pool) => {
    const ledger = new Ledger(pool);
    const pay = b.tool(ledger, toolName('t.pay'));
    await assert.rejects(ledger.tokenAttempt(run, { ttl: 60 }, async () => {
      await pay(run, { invoice: 1 });
      await admin.query("SELECT durable_ledger.abandon_run($1, 'test')", [run]);
      await assert.rejects(pay(run, { invoice: 2 }), RunAbandonedError);
      await pay(run, { invoice: 3 }); // throws again: the attempt is stopped
    }), RunAbandonedError);
    assert.deepEqual(b.calls.map((c) => c.args), [{ invoice: 1 }]);
    assert.equal((await effectKeys(tables, run)).length, 1);
  }));
});

// --------------------------------------------------------------- refused tools

test('a retired tool throws ToolRefusedError, performs nothing and stops the attempt; its record still replays', async () => {
  const run = unique('retired');
  const faxTool = toolName('t.fax');
  const mailTool = toolName('t.mail');
  const b = bank();
  await withClients(3, async (admin, c1, c2) => {
    await register(admin, faxTool);
    const first = new Ledger(c1);
    const sent = await first.attempt(run, () => b.tool(first, faxTool)(run, { to: '+1 555 0100' }));
    await admin.query("SELECT durable_ledger.retire_tool($1, 'test', 'no more faxes')", [faxTool]);

    const second = new Ledger(c2);
    const fax = b.tool(second, faxTool);
    const mail = b.tool(second, mailTool);
    await second.attempt(run, async () => {
      assert.deepEqual(await fax(run, { to: '+1 555 0100' }), sent); // what it recorded replays
      await assert.rejects(fax(run, { to: '+1 555 0199' }), (err) => {
        assert.ok(err instanceof ToolRefusedError, `got ${err?.stack ?? err}`);
        assert.ok(err instanceof LedgerError);
        assert.ok(!(err instanceof EffectPaused));
        assert.equal(err.run, run);
        assert.equal(err.tool, faxTool);
        assert.equal(err.key, null);
        assert.equal(err.cause?.code, TOOL_REFUSED);
        assert.match(err.message, /retired/);
        return true;
      });
      // the attempt stops: another tool's call is not performed either
      await assert.rejects(mail(run, { to: 'ap@example.com' }), (err) => {
        assert.ok(err instanceof RunStopped, `got ${err?.stack ?? err}`);
        assert.match(err.message, /refused/);
        return true;
      });
    });
    assert.equal(b.calls.length, 1, JSON.stringify(b.calls));
    assert.equal((await effectKeys(tables, run)).length, 1);
  });
});

test('an unregistered tool throws ToolRefusedError where the ledger refuses them', async () => {
  // set_unregistered_tools is the database's: a ledger of this test alone,
  // so that the other test files' unregistered tools are not refused meanwhile
  const run = unique('unregistered');
  const registered = toolName('t.pay');
  const unknown = toolName('t.unknown');
  const b = bank();
  await withLedgerDatabase('js_steer', ({ dsn: url, adminDsn }) => withClients(1, (own) =>
    withClients(1, async (admin) => {
      await register(admin, registered);
      const { rows } = await admin.query(
        "SELECT durable_ledger.set_unregistered_tools('refuse', 'js-test') AS previous");
      assert.equal(rows[0].previous, 'allow');
      const ledger = new Ledger(admin);
      await ledger.attempt(run, async () => {
        await assert.rejects(b.tool(ledger, unknown)(run, { invoice: 1 }), (err) => {
          assert.ok(err instanceof ToolRefusedError, `got ${err?.stack ?? err}`);
          assert.equal(err.tool, unknown);
          assert.match(err.message, /not registered/);
          return true;
        });
        await assert.rejects(b.tool(ledger, registered)(run, { invoice: 1 }), RunStopped);
      });
      assert.deepEqual(b.calls, []);
      assert.deepEqual(await effectKeys(own, run), []);
      // a registered tool executes under refuse, in a new attempt
      await ledger.attempt(run, () => b.tool(ledger, registered)(run, { invoice: 1 }));
      assert.deepEqual(b.calls.map((c) => c.tool), [registered]);
      assert.equal((await effectKeys(own, run)).length, 1);
    }, url), adminDsn));
});

// --------------------------------------------------------------------- history

test('history returns the events of a run in order, with tools, args and outcomes', async () => {
  const run = unique('history');
  const payTool = toolName('t.pay');
  const refundTool = toolName('t.refund');
  const b = bank();
  await withClients(2, async (admin, c1) => {
    const ledger = new Ledger(c1);
    const pay = b.tool(ledger, payTool);
    const refund = ledger.tool(refundTool, () => { throw new EffectDidNotHappen({ code: 'closed' }); });
    const receipt = await ledger.attempt(run, async () => {
      const r = await pay(run, { invoice: 1, amount: 10 });
      await assert.rejects(refund(run, { invoice: 1 }), EffectFailed);
      return r;
    });
    await ledger.attempt(run, async () => {
      assert.deepEqual(await pay(run, { invoice: 1, amount: 10 }), receipt);
    });

    const rows = await ledger.history(run);
    assert.ok(Array.isArray(rows));
    for (const row of rows) assert.deepEqual(Object.keys(row), HISTORY_COLUMNS);
    const ids = rows.map((r) => BigInt(r.id));
    assert.deepEqual(ids, [...ids].sort((x, y) => (x < y ? -1 : x > y ? 1 : 0)));
    assert.deepEqual(
      rows.map((r) => [Number(r.lease_epoch), r.event, r.tool, r.args, r.attempt, r.outcome]),
      [[1, 'lease_acquired', null, null, null, null],
        [1, 'intent', payTool, { invoice: 1, amount: 10 }, 1, null],
        [1, 'completed', payTool, { invoice: 1, amount: 10 }, 1, receipt],
        [1, 'intent', refundTool, { invoice: 1 }, 1, null],
        [1, 'failed', refundTool, { invoice: 1 }, 1, { code: 'closed' }],
        [1, 'lease_released', null, null, null, null],
        [2, 'lease_acquired', null, null, null, null],
        [2, 'replay', payTool, { invoice: 1, amount: 10 }, 1, receipt],
        [2, 'lease_released', null, null, null, null]]);
    const [payKey, refundKey] = await effectKeys(tables, run);
    assert.deepEqual(rows.filter((r) => r.tool === payTool).map((r) => r.key), [payKey, payKey, payKey]);
    assert.deepEqual(rows.filter((r) => r.tool === refundTool).map((r) => r.key), [refundKey, refundKey]);
    assert.ok(rows.every((r) => r.application_name === APP));
    assert.ok(rows.every((r) => r.logged_at instanceof Date));

    // on a pg.Pool, the same rows; a run never seen has none
    await withPool(async (pool) => {
      const pooled = new Ledger(pool);
      assert.deepEqual(await pooled.history(run), rows);
      assert.deepEqual(await pooled.history(`${run}-never`), []);
    });
  });
});

test('history needs the auditor role', async () => {
  const run = unique('history-roles');
  await withClients(2, async (admin, c1) => {
    const made = roles(admin);
    try {
      const ledger = new Ledger(c1);
      await ledger.attempt(run, () => bank().tool(ledger, toolName('t.pay'))(run, { invoice: 1 }));
      const auditor = await made.make(['durable_ledger_auditor']);
      const worker = await made.make(['durable_ledger_worker']);
      await withClients(1, async (c) => {
        assert.deepEqual((await new Ledger(c).history(run)).map((r) => r.event),
          ['lease_acquired', 'intent', 'completed', 'lease_released']);
      }, dsnAs(auditor));
      await withClients(1, async (c) => {
        await assert.rejects(new Ledger(c).history(run),
          (err) => err instanceof PermissionDenied && err.sqlstate === '42501' && err.cause?.code === '42501' &&
            /durable_ledger_auditor \(history/.test(err.message));
      }, dsnAs(worker));
    } finally {
      await made.drop();
    }
  });
});

// ------------------------------------------------------------------ approvals (1.3)

test('a loop that rewords its email is stopped at the budget (BudgetExhausted), not at the fifteenth email; raised for the run, the next attempt sends one more; each call carries the attempt\'s model', async () => {
  const run = unique('budget');
  const emailTool = toolName('t.email');
  const b = bank();
  await withClients(2, async (admin, c1) => {
    await register(admin, emailTool);
    await admin.query("SELECT durable_ledger.set_budget($1, 3, 'test')", [emailTool]);
    const ledger = new Ledger(c1);
    const send = b.tool(ledger, emailTool);
    let stopped = null;
    await ledger.attempt(run, { model: 'model-a' }, async () => {
      for (let n = 1; n < 15; n += 1) {
        try {
          await send(run, { to: 'ann@example.com', body: `Welcome aboard! (try ${n})` });
        } catch (err) {
          stopped = err;
          break;
        }
      }
    });
    assert.equal(b.calls.length, 3);
    assert.ok(stopped instanceof BudgetExhausted, `got ${stopped?.stack ?? stopped}`);
    assert.ok(stopped instanceof EffectPaused);
    assert.equal(stopped.name, 'BudgetExhausted');
    assert.equal(stopped.tool, emailTool);
    assert.match(stopped.message, /its budget of 3 per run/);
    assert.deepEqual((await unresolved(tables, run)).map((r) => [r.tool, r.status]), [[emailTool, null]]);
    const { rows: models } = await tables.query(
      "SELECT meta ->> 'model' AS model FROM durable_ledger.effects WHERE run = $1", [run]);
    assert.deepEqual(models.map((r) => r.model), ['model-a', 'model-a', 'model-a']);

    await admin.query("SELECT durable_ledger.set_run_budget($1, 'ops', 'one more', tool => $2, max_executions => 4)",
      [run, emailTool]);
    await withPool(async (pool) => {
      const pooled = new Ledger(pool);
      const sendPooled = b.tool(pooled, emailTool);
      await pooled.tokenAttempt(run, { ttl: 60, model: 'model-b' }, async () => {
        for (let n = 1; n < 5; n += 1) {
          await sendPooled(run, { to: 'ann@example.com', body: `Welcome aboard! (try ${n})` });
        }
        await assert.rejects(sendPooled(run, { to: 'ann@example.com', body: 'Welcome! (5)' }),
          (err) => err instanceof BudgetExhausted);
      });
    });
    assert.equal(b.calls.length, 4);
    const { rows: changes } = await tables.query(
      "SELECT detail FROM durable_ledger.audit_log WHERE run = $1 AND event = 'model_changed'", [run]);
    assert.deepEqual(changes.map((r) => r.detail), [{ from: 'model-a', to: 'model-b' }]);
    await assert.rejects(ledger.attempt(run, { model: '' }, async () => {}), TypeError);
  });
});

test('a call that needs approval throws AwaitingApproval and stops the attempt; approved by another login, the next attempt performs it once; a rejected one replays as EffectFailed', async () => {
  const run = unique('approve');
  const rejectedRun = unique('reject');
  const refundTool = toolName('t.refund');
  const b = bank();
  await withClients(5, async (admin, c1, c2, c3, c4) => {
    const made = roles(admin);
    try {
      await register(admin, refundTool);
      await admin.query("SELECT durable_ledger.set_approval($1, 'strict $.amount > 100', 'test')", [refundTool]);

      const first = new Ledger(c1);
      const refund = b.tool(first, refundTool);
      let waiting;
      await first.attempt(run, async () => {
        await refund(run, { order: 1, amount: 50 }); // under the limit: performed at once
        waiting = await refund(run, { order: 2, amount: 500 }).then(
          () => assert.fail('a call that needs approval was performed'), (err) => err);
        assert.ok(waiting instanceof AwaitingApproval, `got ${waiting?.stack ?? waiting}`);
        assert.ok(waiting instanceof EffectPaused); // existing handlers of pauses catch it
        assert.equal(waiting.name, 'AwaitingApproval');
        assert.match(waiting.key, /^[0-9a-f]{64}$/);
        assert.match(waiting.message, /approve_effect/);
        await assert.rejects(refund(run, { order: 3, amount: 5 }),
          (err) => err instanceof RunStopped && err.key === waiting.key);
      });
      assert.deepEqual(b.calls.map((c) => c.args.order), [1]);
      assert.deepEqual(await unresolved(tables, run),
        [{ key: waiting.key, tool: refundTool, status: 'awaiting_approval', may_duplicate: null }]);

      // The role that made the call may not approve it; an approver may.
      await assert.rejects(admin.query("SELECT durable_ledger.approve_effect($1, 'me')", [waiting.key]),
        (err) => err.code === '42501');
      const approver = await made.make(['durable_ledger_approver']);
      await withClients(1, async (c) => {
        const { rows: [row] } = await c.query(
          "SELECT status, approval, approver FROM durable_ledger.approve_effect($1, 'Alice', 'order 2 checked')",
          [waiting.key]);
        assert.deepEqual(row, { status: 'approved', approval: 'approved', approver: 'Alice' });
      }, dsnAs(approver));
      assert.deepEqual(await unresolved(tables, run), []);

      // The next attempt replays order 1 and performs the approved order 2, once.
      const second = new Ledger(c2);
      await second.attempt(run, async () => {
        await b.tool(second, refundTool)(run, { order: 1, amount: 50 });
        await b.tool(second, refundTool)(run, { order: 2, amount: 500 });
      });
      const third = new Ledger(c3);
      await third.attempt(run, async () => {
        await b.tool(third, refundTool)(run, { order: 1, amount: 50 });
        await b.tool(third, refundTool)(run, { order: 2, amount: 500 });
      });
      assert.deepEqual(b.calls.map((c) => c.args.order), [1, 2]);

      // Rejected: the call is never performed; the next attempt gets EffectFailed.
      let asked;
      await first.attempt(rejectedRun, async () => {
        asked = await refund(rejectedRun, { order: 9, amount: 900 }).then(
          () => assert.fail('performed'), (err) => err);
        assert.ok(asked instanceof AwaitingApproval, `got ${asked?.stack ?? asked}`);
      });
      await withClients(1, async (c) => {
        await c.query("SELECT durable_ledger.reject_effect($1, 'Bob', 'no such order')", [asked.key]);
      }, dsnAs(approver));
      const fourth = new Ledger(c4);
      await fourth.attempt(rejectedRun, async () => {
        await assert.rejects(b.tool(fourth, refundTool)(rejectedRun, { order: 9, amount: 900 }),
          (err) => err instanceof EffectFailed && err.replayed === true);
      });
      assert.deepEqual(b.calls.map((c) => c.args.order), [1, 2]);
    } finally {
      await made.drop();
    }
  });
});
