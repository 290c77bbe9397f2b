// The AI SDK adapter across a crash: a worker process is SIGKILLed in the
// middle of the payment (the bank got it, the worker never heard back); the
// run is resumed the way an AI SDK app resumes -- the same run, a new
// generateText -- and every external effect happens exactly once: the
// unknown payment pauses for a person, who checks the bank and resolves it;
// the next resume replays it and finishes.  DURABLE_LEDGER_DSN: a superuser
// connection to a database with durable_ledger.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { fileURLToPath } from 'node:url';
import { spawnWorker } from '../../test-support/worker.js';
import { cluster, dsn } from './support.js';

const workerScript = fileURLToPath(new URL('./worker.js', import.meta.url));
const db = cluster({ effects: true });

/** Polls until `query` returns a row whose `ok` is true (a condition, never a fixed sleep). */
async function waitFor(query, params, what) {
  const deadline = Date.now() + 60_000;
  for (;;) {
    const { rows } = await db.admin.query(query, params);
    if (rows[0]?.ok) return;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((resolve) => setImmediate(resolve));
  }
}

const worker = (run) => spawnWorker(workerScript, [run], { DURABLE_LEDGER_DSN: dsn, EFFECTS_URL: db.effects.url });

test('a worker SIGKILLed mid-payment: the resume pauses the payment; resolved from the bank\'s record, the next resume replays it; each effect once', async () => {
  const run = `ai-sdk-crash-${randomUUID()}`;
  const held = db.effects.hold('pay');
  const first = worker(run);
  const payment = await held; // the bank has the payment; its answer never comes
  // the e-mail of the same step is recorded before the worker dies, so that
  // what follows does not depend on which of the two the kill caught first
  await waitFor(`SELECT bool_or(status = 'completed') AS ok FROM durable_ledger.effects
                  WHERE run = $1 AND tool = 'sendEmail'`, [run], 'the e-mail to be recorded');
  first.kill();
  const died = await first.exit;
  assert.equal(died.signal, 'SIGKILL');

  // the dead worker's token lease: the on-call ends it rather than wait for its ttl
  const { rows: [broken] } = await db.admin.query(
    "SELECT durable_ledger.break_lease($1, 'on-call', 'worker killed') AS ok", [run]);
  assert.equal(broken.ok, true, 'the dead worker held the run');

  const second = worker(run);
  const paused = await second.exit;
  assert.equal(paused.code, 3, `the resume stops at the pause: ${paused.stdout}${paused.stderr}`);
  const [, key, downstream] = paused.stdout.match(/^paused: ([0-9a-f]{64}) (\S+)$/m);
  assert.equal(downstream, payment.key, 'the pause names the key the bank was given');
  assert.equal(db.effects.calls('pay').length, 1, 'the payment was not made again');
  assert.equal(db.effects.calls('email').length, 1, 'the e-mail was not sent again');

  // a person asks the bank about that key, and records what it says
  const [record] = db.effects.lookup(downstream);
  assert.equal(record.id, payment.id);
  await db.admin.query("SELECT durable_ledger.resolve_effect($1, 'completed', $2::jsonb, 'on-call', 'the bank has it')",
    [key, JSON.stringify(record)]);

  const third = worker(run);
  const done = await third.exit;
  assert.equal(done.code, 0, `${done.stdout}${done.stderr}`);
  assert.match(done.stdout, new RegExp(`^done: Paid INV-7 \\(${payment.id}\\) and told the customer\\.$`, 'm'),
    'the resolved payment reaches the model as the tool\'s output');
  assert.match(done.stdout, /^model calls: 1$/m, 'only the last turn is new; the others replay');
  assert.deepEqual([db.effects.calls('pay').length, db.effects.calls('email').length, db.effects.calls('lookup').length],
    [1, 1, 1], 'each external effect exactly once');
  const { rows: unresolved } = await db.admin.query(
    'SELECT count(*)::int AS n FROM durable_ledger.unresolved WHERE run = $1', [run]);
  assert.equal(unresolved[0].n, 0, 'nothing is left for a person');
});
