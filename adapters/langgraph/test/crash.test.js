// Workers SIGKILLed in the middle of a tool, and their threads resumed the LangGraph
// way: from the PostgresSaver's checkpoint (invoke(null), then Command({resume}) after a
// person resolved the paused effect), or -- a MemorySaver lost with its process -- by
// starting the thread over, when the ledger replays the recorded model turns and tools.
// Each effect reaches the downstream system once (counted by the effects server, in
// this process); the unknown outcome is paused as an interrupt, and the checkpoint
// records no answer of the tool until the person resolved it.
//
//   DURABLE_LEDGER_DSN=postgresql://postgres@/db node --test test/
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startEffectsServer } from '../../test-support/effects-server.js';
import {
  admin, breakLease, closeAdmin, effectsOf, resolveCompleted, runWorker, setupCheckpoints, startWorker, statusOf, waitFor,
} from './helpers.js';

before(setupCheckpoints);
after(closeAdmin);

/** @param {any[]} messages @param {string} name */
const toolAnswers = (messages, name) => messages.filter((m) => m.type === 'tool' && m.name === name);

test('invoice: two tool calls in one step, the worker SIGKILLed mid-payment; the thread resumed from its checkpoint pauses the payment as an interrupt, a person resolves it, the resume replays it: each effect once', async () => {
  const effects = await startEffectsServer();
  const run = `lg-invoice-${randomUUID()}`;
  const env = { EFFECTS_URL: effects.url };
  try {
    const held = effects.hold('pay');
    const first = startWorker(['invoice', run, 'start'], env);
    const payment = await held; // the bank got it: the payment happened, its answer never comes
    await waitFor(async () => (await statusOf(run, 'send_email'))[0] === 'completed', 'the e-mail, the other call of the step');
    first.kill();
    assert.equal((await first.exit).signal, 'SIGKILL');
    assert.equal(effects.calls('pay').length, 1);
    assert.equal(effects.calls('email').length, 1);
    assert.deepEqual(await statusOf(run, 'pay_invoice'), ['started'], 'the intent was recorded before the payment');
    assert.equal(await breakLease(run), true, 'the on-call broke the dead worker\'s token lease');

    // LangGraph's resume: invoke(null) runs the tools step again from its checkpoint
    const second = await runWorker(['invoice', run, 'null'], env);
    assert.match(second.stopped ?? '', /^EffectPaused: /, second.stdout + second.stderr);
    assert.equal(second.modelCalls, 0, 'the model step was checkpointed: no model call');
    assert.equal(second.interrupts.length, 1, JSON.stringify(second.interrupts));
    const [pause] = second.interrupts;
    assert.equal(pause.type, 'durable_ledger');
    assert.equal(pause.kind, 'paused');
    assert.equal(pause.tool, 'pay_invoice');
    assert.equal(pause.run, run);
    assert.equal(pause.downstreamKey, payment.key, 'the interrupt names the key the bank got');
    assert.equal(pause.key, payment.key.replace(/#1$/, ''), '... and the effect\'s (the tool call\'s: keyed by its id)');
    assert.match(pause.key, /^call:\["lg-invoice-[^"]+","pay_invoice","call_pay_\d+"\]$/);
    assert.match(pause.forPerson, /resolve/);
    assert.deepEqual(second.next, ['tools'], 'the graph waits at the tools step');
    assert.deepEqual(toolAnswers(second.state, 'pay_invoice'), [], 'the checkpoint records no answer of the paused tool');
    assert.equal(effects.calls('pay').length, 1, 'nothing was paid again');
    assert.equal(effects.calls('email').length, 1, 'the e-mail was replayed, not sent again');

    // a person checks the bank by the key and resolves the effect, then the app resumes
    const [atBank] = effects.lookup(/** @type {string} */ (pause.downstreamKey));
    assert.ok(atBank, 'the bank has the payment under the key');
    await resolveCompleted(pause.key, atBank);
    const third = await runWorker(['invoice', run, 'resume'], env);
    assert.equal(third.stopped, null, third.stdout + third.stderr);
    assert.deepEqual(third.interrupts, []);
    const [paid] = toolAnswers(third.result, 'pay_invoice');
    assert.deepEqual(JSON.parse(paid.content), atBank, 'the model got the resolved result');
    const [mailed] = toolAnswers(third.result, 'send_email');
    assert.equal(JSON.parse(mailed.content).id, 'email-1');
    assert.match(third.result.at(-1).content, /^INV-9 is paid and its receipt sent/);
    assert.equal(third.modelCalls, 1, 'one model call: the turn after the tools');
    assert.equal(effects.calls('pay').length, 1, 'paid once');
    assert.equal(effects.calls('email').length, 1, 'mailed once');
    assert.deepEqual((await effectsOf(run)).map((e) => `${e.tool}:${e.status}`).sort(),
      ['model.fake-model-builder:completed', 'model.fake-model-builder:completed', 'pay_invoice:completed',
        'send_email:completed']);
  } finally {
    await effects.close();
  }
});

test('the seeds\' story as a Deep Agent: search flights (a read), book the flight, crash mid-booking, resume the same thread: booked once', async () => {
  const effects = await startEffectsServer();
  const run = `lg-flights-${randomUUID()}`;
  const env = { EFFECTS_URL: effects.url };
  try {
    const held = effects.hold('book');
    const first = startWorker(['flights', run, 'start'], env);
    const booking = await held;
    first.kill();
    assert.equal((await first.exit).signal, 'SIGKILL');
    assert.equal(effects.calls('search').length, 1);
    assert.equal(effects.calls('book').length, 1);
    await breakLease(run);

    const second = await runWorker(['flights', run, 'null'], env);
    assert.match(second.stopped ?? '', /^EffectPaused: /, second.stdout + second.stderr);
    assert.deepEqual(second.interrupts.map((i) => [i.kind, i.tool, i.downstreamKey]), [['paused', 'book_flight', booking.key]]);
    assert.deepEqual(toolAnswers(second.state, 'book_flight'), []);
    assert.equal(effects.calls('book').length, 1);

    // the person resumes before resolving: the tool asks again (another interrupt)
    const early = await runWorker(['flights', run, 'resume'], env);
    assert.match(early.stopped ?? '', /^EffectPaused: /, early.stdout + early.stderr);
    assert.deepEqual(early.interrupts.map((i) => [i.kind, i.downstreamKey]), [['paused', booking.key]]);
    assert.deepEqual(toolAnswers(early.state, 'book_flight'), []);

    await resolveCompleted(second.interrupts[0].key, effects.lookup(booking.key)[0]);
    const third = await runWorker(['flights', run, 'resume'], env);
    assert.equal(third.stopped, null, third.stdout + third.stderr);
    assert.equal(JSON.parse(toolAnswers(third.result, 'book_flight')[0].content).id, 'book-1');
    assert.match(third.result.at(-1).content, /^Booked TP1351 for Marta/);
    assert.equal(effects.calls('book').length, 1, 'booked once');
    assert.equal(effects.calls('search').length, 1, 'searched once');
    const rows = await effectsOf(run);
    assert.deepEqual(rows.filter((e) => !e.tool.startsWith('model.')).map((e) => `${e.tool}:${e.status}`),
      ['search_flights:completed', 'book_flight:completed']);
  } finally {
    await effects.close();
  }
});

test('a MemorySaver lost with its process: the thread started over replays the recorded model turns and tools, pauses the payment, and after the person resolved it finishes; a completed thread started over calls nothing', async () => {
  const effects = await startEffectsServer();
  const run = `lg-memory-${randomUUID()}`;
  const env = { EFFECTS_URL: effects.url };
  try {
    const held = effects.hold('pay');
    const first = startWorker(['invoice', run, 'start', 'memory'], env);
    const payment = await held;
    await waitFor(async () => (await statusOf(run, 'send_email'))[0] === 'completed', 'the e-mail');
    first.kill();
    const firstOut = await first.exit;
    const firstAnswer = firstOut.stdout.match(/^model: 1 calls$/m);
    assert.ok(firstAnswer, 'the first worker asked its model once');
    await breakLease(run);

    // the checkpoints died with the process: the app starts the thread over
    const second = await runWorker(['invoice', run, 'start', 'memory'], env);
    assert.match(second.stopped ?? '', /^EffectPaused: /, second.stdout + second.stderr);
    assert.equal(second.modelCalls, 0, 'the model turn was replayed from the ledger');
    assert.deepEqual(second.interrupts.map((i) => [i.kind, i.tool, i.downstreamKey]), [['paused', 'pay_invoice', payment.key]]);
    assert.match(second.state[1].content, new RegExp(`^paying INV-9 \\(worker ${first.child.pid}\\)$`),
      'the first worker\'s answer, replayed');
    assert.equal(effects.calls('pay').length, 1);
    assert.equal(effects.calls('email').length, 1);

    await resolveCompleted(second.interrupts[0].key, effects.lookup(payment.key)[0]);
    const third = await runWorker(['invoice', run, 'start', 'memory'], env);
    assert.equal(third.stopped, null, third.stdout + third.stderr);
    assert.equal(third.modelCalls, 1, 'only the turn after the tools was asked');
    assert.equal(effects.calls('pay').length, 1);
    assert.equal(effects.calls('email').length, 1);
    const final = third.result.at(-1).content;

    // the run is complete: started over once more, everything is replayed
    const fourth = await runWorker(['invoice', run, 'start', 'memory'], env);
    assert.equal(fourth.stopped, null, fourth.stdout + fourth.stderr);
    assert.equal(fourth.modelCalls, 0, 'no model call');
    assert.deepEqual(fourth.result, third.result, 'the same conversation, replayed');
    assert.equal(fourth.result.at(-1).content, final);
    assert.equal(effects.calls('pay').length, 1);
    assert.equal(effects.calls('email').length, 1);
  } finally {
    await effects.close();
  }
});

test('Deep Agents: the booking delegated to a `task` subagent (its tools run under a nested checkpoint namespace, on the thread\'s run), the worker killed mid-booking, the thread resumed: paused as an interrupt of the parent, resolved, booked once', async () => {
  const effects = await startEffectsServer();
  const run = `lg-subagent-${randomUUID()}`;
  const env = { EFFECTS_URL: effects.url };
  try {
    const held = effects.hold('book');
    const first = startWorker(['subagent', run, 'start'], env);
    const booking = await held;
    first.kill();
    await first.exit;
    await breakLease(run);

    const second = await runWorker(['subagent', run, 'null'], env);
    assert.match(second.stopped ?? '', /^EffectPaused: /, second.stdout + second.stderr);
    assert.deepEqual(second.interrupts.map((i) => [i.kind, i.tool, i.downstreamKey]), [['paused', 'book_flight', booking.key]]);
    assert.match(second.interrupts[0].checkpointNs, /^tools:[^|]+\|tools:/, 'raised in the subagent\'s namespace');
    assert.equal(second.modelCalls, 0, 'the subagent\'s turns were replayed or checkpointed: no model call');
    assert.deepEqual(toolAnswers(second.state, 'task'), [], 'the parent records no answer of the task');
    assert.equal(effects.calls('book').length, 1);

    await resolveCompleted(second.interrupts[0].key, effects.lookup(booking.key)[0]);
    const third = await runWorker(['subagent', run, 'resume'], env);
    assert.equal(third.stopped, null, third.stdout + third.stderr);
    assert.match(toolAnswers(third.result, 'task')[0].content, /^Booked TP1351 for Marta/);
    assert.match(third.result.at(-1).content, /^Marta is booked on TP1351/);
    assert.equal(effects.calls('book').length, 1, 'booked once');
    assert.equal(effects.calls('search').length, 1, 'searched once');
    const { rows } = await admin().query(
      "SELECT meta->>'checkpoint_ns' AS ns FROM durable_ledger.effects WHERE run = $1 AND tool = 'book_flight'", [run]);
    assert.match(rows[0].ns, /\|/, 'the ledger keeps where in the graph the call was made');
  } finally {
    await effects.close();
  }
});

test('review33c F1: an unrecorded model (a new id each time it is asked), the checkpoint store stalled as the model step ends, the worker SIGKILLed mid-payment: with invokeThread\'s durability (the config sets none) the resume finds the call in the checkpoint and pauses it: paid once', async () => {
  const effects = await startEffectsServer();
  const run = `lg-stall-${randomUUID()}`;
  const gate = join(mkdtempSync(join(tmpdir(), 'lg-gate-')), 'open');
  const env = { EFFECTS_URL: effects.url };
  const locker = await admin().connect();
  let locked = false;
  const unlock = async () => {
    if (locked) await locker.query('COMMIT');
    locked = false;
  };
  try {
    const held = effects.hold('pay');
    const first = startWorker(['fresh', run, 'start'], { ...env, GATE_FILE: gate });
    const [, durability] = await first.line(/^durability: (\S+)$/m);
    await first.line(/^gate: waiting$/m);
    // the thread's input is checkpointed (step 0: the model node next); then the store
    // stalls (a lock on its tables, as a VACUUM FULL, a DDL, a saturated pool or a slow
    // network would make it) while the model step ends
    await waitFor(async () => (await admin().query(
      "SELECT 1 FROM checkpoints WHERE thread_id = $1 AND metadata->>'step' = '0'", [run])).rowCount, 'the step 0 checkpoint');
    await locker.query('BEGIN');
    locked = true;
    await locker.query('LOCK TABLE checkpoints, checkpoint_writes, checkpoint_blobs IN SHARE MODE');
    writeFileSync(gate, '');
    if (durability === 'sync') {
      // LangGraph writes the model step's checkpoint before the tools step starts: the
      // writer waits on the lock, and the tool cannot run until the store comes back
      await waitFor(async () => (await admin().query(
        "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query ILIKE '%checkpoint%' AND pid <> $1",
        [(await locker.query('SELECT pg_backend_pid() AS pid')).rows[0].pid])).rowCount, 'the checkpoint write waiting on the lock');
      assert.equal(effects.calls('pay').length, 0, 'nothing paid with the model step not checkpointed');
      assert.deepEqual(await statusOf(run, 'pay_invoice'), [], '... nor begun');
      await unlock();
    } // else ('async', LangGraph's default): the tool runs while the model step's checkpoint waits
    const payment = await held; // the bank got it; its answer never comes
    first.kill();
    assert.equal((await first.exit).signal, 'SIGKILL');
    await unlock();
    assert.equal(await breakLease(run), true);

    const second = await runWorker(['fresh', run, 'null'], env);
    assert.equal(effects.calls('pay').length, 1, `paid once (the bank got ${JSON.stringify(effects.calls('pay').map((c) => c.key))})`);
    assert.match(second.stopped ?? '', /^EffectPaused: /, second.stdout + second.stderr);
    assert.equal(second.modelCalls, 0, 'the model was not asked again: its step was in the checkpoint');
    assert.equal(second.interrupts.length, 1, JSON.stringify(second.interrupts));
    assert.equal(second.interrupts[0].kind, 'paused');
    assert.equal(second.interrupts[0].downstreamKey, payment.key, 'the paused call is the one the bank got');
    assert.equal(durability, 'sync', 'invokeThread gave the graph durability \'sync\'');
  } finally {
    await unlock().catch(() => undefined);
    locker.release();
    await effects.close();
  }
});
