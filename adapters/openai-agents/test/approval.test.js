// The SDK's human approval (needsApproval) and the ledger.  The SDK asks its question
// before the tool is invoked, so before the ledger sees the call: the run ends with an
// interruption, the app saves the RunState as a string, and later restores it,
// approves, and runs it again -- the approved call then goes through the ledger once,
// and the other call of the turn, which ran before the interruption, is not invoked
// again.  A resume that is repeated (the process died after the effect, before the app
// saved the new state) replays the effect.  The ledger's own approval (set_approval) is
// another one, held by the database and given by an approver role: it comes after the
// SDK's, as a pause (AwaitingApproval) the tool's output and agentAttempt surface.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { RunState, Runner, setTracingDisabled } from '@openai/agents';
import { AwaitingApproval } from 'durable-ledger';
import { startEffectsServer } from '../../test-support/effects-server.js';
import { agentAttempt } from '../src/index.js';
import { invoiceAgent, PROMPT } from './invoice-agent.js';
import { DSN, dsnAs, effectsOf, eventsOf, roles, runId, withLedger } from './target.js';

setTracingDisabled(true);
/** @type {Awaited<ReturnType<typeof startEffectsServer>>} */
let effects;
before(async () => { effects = await startEffectsServer(); });
after(async () => { await effects.close(); });

/** The effects server's requests under the run's keys. @param {Array<{downstream: string}>} rows @param {string} op */
const madeFor = (rows, op) => effects.calls(op).filter((c) => rows.some((r) => r.downstream === c.key));

test('needsApproval: the state saved as a string, restored and approved; the approved tool runs once through the ledger, the other is not run again', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('approval');
    const runner = new Runner();

    // Attempt 1: the model asks for both calls; the SDK holds the payment for approval
    // (the ledger never sees it), the e-mail is performed.
    const one = invoiceAgent(effects.url, { needsApproval: true });
    const asked = await agentAttempt(ledger, run, () => runner.run(one.agent, PROMPT));
    assert.deepEqual(asked.interruptions.map((i) => i.name), ['pay_invoice']);
    let rows = await effectsOf(admin, run);
    assert.deepEqual(rows.map((e) => [e.tool, e.status]).sort(),
      [['model.openai-agents', 'completed'], ['send_email', 'completed']], 'the ledger has not seen the payment');
    assert.equal(madeFor(rows, 'email').length, 1);
    const saved = asked.state.toString();

    // Attempt 2, as another process would: a new agent, the state restored from the
    // string and approved.  The payment is performed once; the model is asked for the
    // next turn only; the e-mail is not invoked again (no event of it in this attempt).
    const two = invoiceAgent(effects.url, { needsApproval: true });
    const state = await RunState.fromString(two.agent, saved);
    const [pending] = state.getInterruptions();
    assert.equal(pending.name, 'pay_invoice');
    state.approve(pending);
    const done = await agentAttempt(ledger, run, () => runner.run(two.agent, state));
    assert.match(String(done.finalOutput), /^done: /);
    assert.equal(two.scripted.calls.length, 1, 'the model was asked for the turn after the tools only');
    rows = await effectsOf(admin, run);
    const pay = rows.find((e) => e.tool === 'pay_invoice');
    assert.equal(pay?.status, 'completed');
    assert.equal(madeFor(rows, 'pay').length, 1, 'paid once');
    assert.equal(madeFor(rows, 'email').length, 1, 'e-mailed once');
    assert.deepEqual(await eventsOf(admin, run, 'send_email'), ['1:intent', '1:completed'],
      'the e-mail, which ran before the interruption, was not invoked again on resume');

    // The process died before the app saved the finished state: the app resumes from the
    // same string again.  The ledger replays the payment and the recorded turn.
    const three = invoiceAgent(effects.url, { needsApproval: true });
    const again = await RunState.fromString(three.agent, saved);
    again.approve(again.getInterruptions()[0]);
    const replayed = await agentAttempt(ledger, run, () => runner.run(three.agent, again));
    assert.equal(replayed.finalOutput, done.finalOutput);
    assert.equal(three.scripted.calls.length, 0, 'the model was not asked');
    rows = await effectsOf(admin, run);
    assert.equal(madeFor(rows, 'pay').length, 1, 'still paid once');
    assert.equal(madeFor(rows, 'email').length, 1);
    const payEvents = await eventsOf(admin, run, 'pay_invoice');
    assert.deepEqual(payEvents.filter((e) => !e.endsWith(':replay')), ['2:intent', '2:completed']);
    assert.ok(payEvents.includes('3:replay'), payEvents.join(' '));

    // A run from scratch (no saved state): the recorded turn replays, the SDK asks its
    // question again (its approvals live in the RunState, not in the ledger), and the
    // e-mail replays; nothing is performed.
    const four = invoiceAgent(effects.url, { needsApproval: true });
    const fresh = await agentAttempt(ledger, run, () => runner.run(four.agent, PROMPT));
    assert.deepEqual(fresh.interruptions.map((i) => i.name), ['pay_invoice']);
    assert.equal(four.scripted.calls.length, 0);
    rows = await effectsOf(admin, run);
    assert.equal(madeFor(rows, 'pay').length, 1);
    assert.equal(madeFor(rows, 'email').length, 1);
  });
});

test("the ledger's approval (set_approval) after the SDK's: AwaitingApproval surfaced, an approver role approves in the database, the resumed state pays once", async () => {
  await withLedger(async ({ admin }) => {
    const people = roles(admin);
    const payName = `bank.pay_${randomUUID().slice(0, 8)}`;
    try {
      await admin.query("SELECT durable_ledger.register_tool($1, 'test')", [payName]);
      await admin.query("SELECT durable_ledger.set_approval($1, 'strict $.amount > 1000', 'finance', 'rule 7')", [payName]);
      const worker = await people.make(['durable_ledger_worker']);
      await withLedger(async ({ ledger }) => {
        const run = runId('ledger-approval');
        const runner = new Runner();
        const one = invoiceAgent(effects.url, { needsApproval: true, payName });
        const asked = await agentAttempt(ledger, run, () => runner.run(one.agent, PROMPT));
        assert.deepEqual(asked.interruptions.map((i) => i.name), ['pay_invoice']);

        // The app's user approves in the SDK; the app saves the approved state.
        const two = invoiceAgent(effects.url, { needsApproval: true, payName });
        const state = await RunState.fromString(two.agent, asked.state.toString());
        state.approve(state.getInterruptions()[0]);
        const approved = state.toString();
        /** @type {string[]} */
        const outputs = [];
        runner.on('agent_tool_end', (_c, _a, tool, output) => outputs.push(`${tool.name}: ${output}`));
        const waiting = await agentAttempt(ledger, run, () => runner.run(two.agent, state)).then(
          () => assert.fail('agentAttempt must throw'), (err) => err);
        assert.ok(waiting instanceof AwaitingApproval, String(waiting));
        assert.match(outputs.join('\n'), /^pay_invoice: This call was not performed: the ledger paused it because it needs a person's approval/m);
        let rows = await effectsOf(admin, run);
        const pay = rows.find((e) => e.tool === payName);
        assert.equal(pay?.key, waiting.key);
        assert.equal(pay?.status, 'awaiting_approval');
        assert.equal(madeFor(rows, 'pay').length, 0, 'nothing was paid');

        // The worker's role may not approve its own call; an approver does.
        await withLedger(async ({ pool }) => {
          await assert.rejects(pool.query("SELECT durable_ledger.approve_effect($1, 'me')", [waiting.key]),
            (err) => /** @type {any} */ (err).code === '42501');
        }, { dsn: dsnAs(DSN, worker) });
        await admin.query("SELECT durable_ledger.approve_effect($1, 'Ana', 'checked with the supplier')", [waiting.key]);

        // The approved state, restored again (no SDK question: its approval is in the
        // state), pays once.
        const three = invoiceAgent(effects.url, { needsApproval: true, payName });
        const resumed = await RunState.fromString(three.agent, approved);
        assert.equal(resumed.getInterruptions().length, 1);
        const done = await agentAttempt(ledger, run, () => runner.run(three.agent, resumed));
        assert.match(String(done.finalOutput), /^done: .*pay_invoice=\{"id":"pay-/);
        rows = await effectsOf(admin, run);
        assert.equal(rows.find((e) => e.tool === payName)?.status, 'completed');
        assert.equal(madeFor(rows, 'pay').length, 1, 'paid once');
        assert.equal(madeFor(rows, 'email').length, 1, 'e-mailed once');
      }, { dsn: dsnAs(DSN, worker) });
    } finally {
      await people.drop();
    }
  });
});
