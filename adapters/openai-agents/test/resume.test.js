// Which call is which: a call keyed by the SDK's id for it (details.toolCall.callId) where
// that id comes from a saved RunState, by its occurrence in the attempt everywhere else
// unless the tool opts in to the ids of recorded turns (keyBy 'recorded-call-id').
//
// A saved RunState resumed after the SDK's needsApproval does not make the run's earlier
// calls again: keyed by occurrence, the approved call would be the resuming attempt's
// occurrence 1 and reach the first call of the run with the same arguments (the review's
// F2: a second payment a person approved replayed from the first, never made), or be
// judged a divergence when the tool was used before with other arguments (F3: a false
// pause).  So the approved call of a resumed state is keyed by its id (the state keeps
// it, whatever the prompt), by default.  The calls of a model turn ledgerModel recorded
// or replayed are keyed by their ids only with keyBy 'recorded-call-id': a rerun whose
// request changed (a date in the instructions) makes the turn anew with new ids, and
// keyed by them the payment of a crashed attempt would be made again; by default its
// occurrence reaches it (paused, or replayed).  A model the ledger does not record gives
// a call a new id whenever it is asked again: that call keeps its occurrence key.
//
// The ledger's call-id guard (begin_effect's call_id, 1.3): a new call id of a later
// attempt whose call equals an effect an earlier attempt of the run recorded is paused as
// a divergence (DivergencePaused) until a person says same (that effect's result is
// replayed) or distinct (performed once).  So an approved identical second payment waits
// for a person's distinct, and a model that names a payment anew after its answer was
// lost -- the run started over, or a recorded turn asked again under 'recorded-call-id'
// -- never pays twice (review 33e).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { Agent, RunState, Runner, setTracingDisabled } from '@openai/agents';
import { ScriptedModel, assistantMessage, functionCall, modelResponder } from '@openai/agents/testing';
import { z } from 'zod';
import { DivergencePaused, EffectDidNotHappen, EffectPaused, RunStopped } from 'durable-ledger';
import { callKey } from 'durable-ledger/agents';
import { ResumeNotMarked, agentAttempt, ledgerModel, ledgerTool, resumed } from '../src/index.js';
import { outputText, resultsOf } from './invoice-agent.js';
import { effectsOf, rejection, runId, withLedger } from './target.js';

setTracingDisabled(true);

/**
 * A saved RunState restored for `agent` (as another process would), its first interruption
 * approved by a person: on its own, or with `{ alwaysApprove: true }`.
 * @param {Agent<any, any>} agent @param {string} saved @param {{always?: boolean}} [options]
 */
async function approvedState(agent, saved, { always = false } = {}) {
  const state = await RunState.fromString(agent, saved);
  state.approve(state.getInterruptions()[0], always ? { alwaysApprove: true } : undefined);
  return state;
}

/**
 * A bank that keeps its payments, and can take one and never answer (the worker died in
 * the middle of it).
 */
function bank() {
  /** @type {Array<{invoice: string, amount: number, key: string}>} */
  const payments = [];
  return {
    payments,
    /** the next payment is made, and its answer lost */
    loseNextAnswer: false,
    /** the next payment of this invoice is made, and its answer lost */
    loseAnswerOf: /** @type {string | null} */ (null),
    /** the next payment is refused before anything is done */
    refuseNext: false,
    /** @param {{invoice: string, amount: number}} input @param {string} key */
    pay(input, key) {
      if (this.refuseNext) {
        this.refuseNext = false;
        throw new EffectDidNotHappen({ code: 'bank_busy' });
      }
      payments.push({ ...input, key });
      if (this.loseNextAnswer || this.loseAnswerOf === input.invoice) {
        this.loseNextAnswer = false;
        this.loseAnswerOf = null;
        throw new Error('connection reset by the bank');
      }
      return { paymentId: `P${payments.length}` };
    },
  };
}

/**
 * The accounts-payable agent of the review: `calls` are the model's tool calls, one per
 * turn (each turn's call id its own), then a text quoting the results.  `recorded`: the
 * model through ledgerModel.  `approval`: the SDK's needsApproval of the payment.
 * `keyBy`: the payment tool's.  `instructions`: the agent's (a date in them changes
 * every turn's request).
 * @param {ReturnType<typeof bank>} theBank
 * @param {{calls: Array<{invoice: string, amount: number}>, recorded: boolean,
 *   approval?: (input: {invoice: string, amount: number}) => boolean,
 *   callId?: (turn: number) => string, keyBy?: import('../src/index.js').KeyBy,
 *   instructions?: string}} options
 */
function apAgent(theBank, {
  calls, recorded, approval = () => false, callId = (turn) => `call_${turn + 1}`, keyBy, instructions = 'Pay the invoices.',
}) {
  const pay = ledgerTool({
    name: 'pay_invoice',
    description: 'Pay an invoice',
    parameters: z.object({ invoice: z.string(), amount: z.number() }),
    needsApproval: async (_ctx, input) => approval(input),
    ...(keyBy ? { keyBy } : {}),
    execute: async (input, _ctx, details) => theBank.pay(input, /** @type {string} */ (details.idempotencyKey)),
  });
  const scripted = new ScriptedModel(Array.from({ length: 8 }, () => modelResponder((call) => {
    const n = resultsOf(call.request).length;
    if (n < calls.length) return [functionCall('pay_invoice', calls[n], { callId: callId(n) })];
    return [assistantMessage(`done: ${resultsOf(call.request).map((r) => outputText(r.output)).join(' ; ')}`)];
  })));
  const agent = new Agent({
    name: 'ap', instructions, tools: [pay], model: recorded ? ledgerModel(scripted) : scripted,
  });
  return { agent, scripted };
}

/** The keys of the run's payments, in the order they were begun. @param {import('pg').Client} admin @param {string} run */
const payKeys = async (admin, run) => (await effectsOf(admin, run)).filter((e) => e.tool === 'pay_invoice').map((e) => e.key);

/** A key of the ledger's derived kind (a call's occurrence), not a call id's. @param {string} key */
const occurrenceKey = (key) => assert.doesNotMatch(key, /^call:/, `${key}: an occurrence key`);

/**
 * `err` is the ledger's pause of a call under a new call id of a later attempt whose call
 * equals an effect an earlier attempt of the run recorded (`earlier`): a DivergencePaused
 * for its own key, nothing recorded under that key, and durable_ledger.divergences naming
 * the earlier effect, waiting for a person's verdict.
 * @param {import('pg').Client} admin @param {unknown} err @param {string} key @param {string} earlier
 */
async function assertDivergence(admin, err, key, earlier) {
  assert.ok(err instanceof DivergencePaused, String(err));
  assert.equal(err.key, key, 'paused under the new call\'s own key');
  assert.equal(err.tool, 'pay_invoice');
  const { rows } = await admin.query(
    'SELECT tool, occurrence, candidate_key, verdict FROM durable_ledger.divergences WHERE key = $1', [key]);
  assert.deepEqual(rows, [{ tool: 'pay_invoice', occurrence: 0, candidate_key: earlier, verdict: null }],
    'durable_ledger.divergences names the earlier effect');
  const effects = await admin.query('SELECT count(*)::int AS n FROM durable_ledger.effects WHERE key = $1', [key]);
  assert.equal(effects.rows[0].n, 0, 'nothing recorded under the paused key');
}

/**
 * A person's verdict on a paused call: 'same' (the earlier effect's outcome is replayed to
 * it) or 'distinct' (it is executed, once).
 * @param {import('pg').Client} admin @param {string} key @param {'same' | 'distinct'} verdict @param {string} note
 */
const resolveDivergence = (admin, key, verdict, note) => admin.query(
  "SELECT durable_ledger.resolve_divergence($1, $2, 'on-call', $3)", [key, verdict, note]);

test('F2: needsApproval (a duplicate-payment guard) and a second payment of INV-9 a person approved: the resumed state\'s call (keyed by its call id) is paused as a possible repeat of the first payment; the person says distinct and it is performed once', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('f2');
    const theBank = bank();
    const options = {
      calls: [{ invoice: 'INV-9', amount: 100 }, { invoice: 'INV-9', amount: 100 }],
      recorded: true,
      approval: (/** @type {{invoice: string}} */ input) => theBank.payments.some((p) => p.invoice === input.invoice),
    };
    const runner = new Runner();
    const first = await agentAttempt(ledger, run, () => runner.run(apAgent(theBank, options).agent, 'Pay INV-9 twice.'));
    assert.deepEqual(first.interruptions.map((i) => i.name), ['pay_invoice']);
    assert.equal(theBank.payments.length, 1);
    const saved = first.state.toString();
    const [before] = await payKeys(admin, run);
    occurrenceKey(before); // a recorded turn's call, by default
    const approvedKey = callKey(run, 'pay_invoice', 'call_2');

    // Another process: the state restored, the person approves the second payment.  The
    // SDK's approval is not the ledger's: in this later attempt the call, under a new call
    // id, equals the first payment, so the ledger pauses it for a person, performing nothing.
    const two = apAgent(theBank, options);
    const state = await approvedState(two.agent, saved);
    const paused = await rejection(agentAttempt(ledger, run, () => runner.run(two.agent, state)));
    await assertDivergence(admin, paused, approvedKey, before);
    assert.equal(theBank.payments.length, 1, 'not paid on the SDK\'s approval alone');

    // The person says it is another payment: the next resume of the state performs it, once.
    await resolveDivergence(admin, approvedKey, 'distinct', 'the customer owes INV-9 twice');
    const three = apAgent(theBank, options);
    const resolved = await approvedState(three.agent, saved);
    const done = await agentAttempt(ledger, run, () => runner.run(three.agent, resolved));
    assert.equal(theBank.payments.length, 2, 'the approved payment was made');
    assert.match(String(done.finalOutput), /P1.*P2/, 'the model got each payment\'s own result');
    assert.deepEqual(await payKeys(admin, run), [before, approvedKey], 'the approved call of the state: its id');
    assert.equal(new Set(theBank.payments.map((p) => p.key)).size, 2, 'each under its own idempotency key');

    // The process died before the app saved the new state: the same string resumed again
    // replays the approved payment.
    const four = apAgent(theBank, options);
    const again = await approvedState(four.agent, saved);
    const replayed = await agentAttempt(ledger, run, () => runner.run(four.agent, again));
    assert.equal(replayed.finalOutput, done.finalOutput);
    assert.equal(theBank.payments.length, 2, 'not paid a third time');
    assert.equal(four.scripted.calls.length, 0, 'the turn after it replayed too');
  });
});

test('F3: the tool used before the interruption with other arguments: the approved call is performed, not paused as a divergence', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('f3');
    const theBank = bank();
    const options = {
      calls: [{ invoice: 'INV-8', amount: 10 }, { invoice: 'INV-10', amount: 900 }],
      recorded: true,
      approval: (/** @type {{amount: number}} */ input) => input.amount >= 500,
    };
    const runner = new Runner();
    const first = await agentAttempt(ledger, run, () => runner.run(apAgent(theBank, options).agent, 'Pay.'));
    assert.deepEqual(first.interruptions.map((i) => i.name), ['pay_invoice']);
    const two = apAgent(theBank, options);
    const state = await approvedState(two.agent, first.state.toString());
    const done = await agentAttempt(ledger, run, () => runner.run(two.agent, state));
    assert.match(String(done.finalOutput), /P1.*P2/);
    assert.deepEqual(theBank.payments.map((p) => p.invoice), ['INV-8', 'INV-10']);
    assert.deepEqual((await effectsOf(admin, run)).filter((e) => e.tool === 'pay_invoice').map((e) => e.status),
      ['completed', 'completed']);
  });
});

test('a model the ledger does not record: the approved call of the resumed state is keyed by its id, the model\'s other calls by their occurrence; the approved second payment of INV-9 waits for a person\'s distinct, and once made with its answer lost it is paused on the next resume', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('plain-approval');
    const theBank = bank();
    const options = {
      calls: [{ invoice: 'INV-9', amount: 100 }, { invoice: 'INV-9', amount: 100 }],
      recorded: false,
      approval: (/** @type {{invoice: string}} */ input) => theBank.payments.some((p) => p.invoice === input.invoice),
    };
    const runner = new Runner();
    const first = await agentAttempt(ledger, run, () => runner.run(apAgent(theBank, options).agent, 'Pay INV-9 twice.'));
    const saved = first.state.toString();
    const [firstKey] = await payKeys(admin, run);
    assert.doesNotMatch(firstKey, /^call:/, 'a call of a model not recorded keeps its occurrence key');
    const approvedKey = callKey(run, 'pay_invoice', 'call_2');

    // The approved payment, a new call id in a later attempt equal to the first payment:
    // paused as a possible repeat of it until a person says it is another payment.
    const two = apAgent(theBank, options);
    const approved = await approvedState(two.agent, saved);
    const diverged = await rejection(agentAttempt(ledger, run, () => runner.run(two.agent, approved)));
    await assertDivergence(admin, diverged, approvedKey, firstKey);
    assert.equal(theBank.payments.length, 1);
    await resolveDivergence(admin, approvedKey, 'distinct', 'a second payment of INV-9 is due');

    // The approved payment is made, and the worker dies before the bank's answer.
    theBank.loseNextAnswer = true;
    const three = apAgent(theBank, options);
    const state = await approvedState(three.agent, saved);
    const lost = await rejection(agentAttempt(ledger, run, () => runner.run(three.agent, state)));
    assert.ok(lost instanceof RunStopped, String(lost));
    assert.equal(theBank.payments.length, 2);
    assert.deepEqual(await payKeys(admin, run), [firstKey, approvedKey]);

    // The app resumes the saved state again (approved again): the same call, paused.
    const four = apAgent(theBank, options);
    const again = await approvedState(four.agent, saved);
    const paused = await rejection(agentAttempt(ledger, run, () => runner.run(four.agent, again)));
    assert.ok(paused instanceof EffectPaused && !(paused instanceof DivergencePaused), String(paused));
    assert.equal(paused.key, approvedKey);
    assert.equal(theBank.payments.length, 2, 'not paid again');

    // A person finds it at the bank and resolves it; the next resume replays it.
    await admin.query("SELECT durable_ledger.resolve_effect($1, 'completed', $2::jsonb, 'on-call', 'found at the bank')",
      [approvedKey, JSON.stringify({ paymentId: 'P2' })]);
    const five = apAgent(theBank, options);
    const last = await approvedState(five.agent, saved);
    const done = await agentAttempt(ledger, run, () => runner.run(five.agent, last));
    assert.match(String(done.finalOutput), /P1.*P2/);
    assert.equal(theBank.payments.length, 2);
  });
});

test('alwaysApprove approves every call of the tool, so it does not say where a call comes from: resumed(state) marks the interrupted calls of the state (the approved repeat of INV-9 paused for a person\'s distinct first)', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('always');
    const theBank = bank();
    const options = {
      calls: [{ invoice: 'INV-9', amount: 100 }, { invoice: 'INV-9', amount: 100 }],
      recorded: true,
      approval: (/** @type {{invoice: string}} */ input) => theBank.payments.some((p) => p.invoice === input.invoice),
    };
    const runner = new Runner();
    const first = await agentAttempt(ledger, run, () => runner.run(apAgent(theBank, options).agent, 'Pay INV-9 twice.'));
    const saved = first.state.toString();
    const [before] = await payKeys(admin, run);
    occurrenceKey(before);
    const interruptedKey = callKey(run, 'pay_invoice', 'call_2');
    /** the saved state restored for a new agent, approved with alwaysApprove, run marked */
    const resume = async () => {
      const two = apAgent(theBank, options);
      const state = await approvedState(two.agent, saved, { always: true });
      assert.throws(() => resumed(state), /inside agentAttempt/);
      return agentAttempt(ledger, run, () => runner.run(two.agent, resumed(state)));
    };
    const paused = await rejection(resume());
    await assertDivergence(admin, paused, interruptedKey, before);
    assert.equal(theBank.payments.length, 1);
    await resolveDivergence(admin, interruptedKey, 'distinct', 'a second payment of INV-9 is due');

    const done = await resume();
    assert.match(String(done.finalOutput), /P1.*P2/);
    assert.equal(theBank.payments.length, 2);
    const [, interrupted] = await payKeys(admin, run);
    assert.equal(interrupted, interruptedKey, 'the state\'s interrupted call: its id');
    await assert.rejects(agentAttempt(ledger, run, () => resumed(/** @type {any} */ ({}))), /must be a RunState/);
  });
});

/**
 * The run of the alwaysApprove tests: two payments, INV-1 then INV-2 (one a turn), each
 * needing a person's approval, the model's ids a provider's (new on every ask).  Its first
 * attempt, interrupted at INV-1, is saved; `resume(mark)` restores that state for a new
 * agent, approves the interruption with alwaysApprove and runs it in an attempt (marked with
 * resumed(state) when `mark`).
 * @param {import('durable-ledger').Ledger} ledger @param {string} run @param {ReturnType<typeof bank>} theBank
 */
async function alwaysApproveRun(ledger, run, theBank) {
  let asked = 0;
  const options = {
    calls: [{ invoice: 'INV-1', amount: 100 }, { invoice: 'INV-2', amount: 200 }],
    recorded: false,
    approval: () => true,
    callId: () => `call_${(asked += 1)}`,
  };
  const runner = new Runner();
  const first = await agentAttempt(ledger, run, () => runner.run(apAgent(theBank, options).agent, 'Pay.'));
  const saved = first.state.toString();
  /** @param {boolean} mark */
  const resume = async (mark) => {
    const { agent } = apAgent(theBank, options);
    const state = await approvedState(agent, saved, { always: true });
    return agentAttempt(ledger, run, () => runner.run(agent, mark ? resumed(state) : state));
  };
  return { first, resume };
}

test('alwaysApprove and a model the ledger does not record: a call the model makes after the resume (a new id, approved by the standing approval) keeps its occurrence key, so a crash in it is paused when the state is resumed again', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('always-plain');
    const theBank = bank();
    const { first, resume } = await alwaysApproveRun(ledger, run, theBank);
    assert.deepEqual(first.interruptions.map((i) => i.name), ['pay_invoice']);
    theBank.loseAnswerOf = 'INV-2';
    const lost = await rejection(resume(true));
    assert.ok(lost instanceof RunStopped, String(lost));
    assert.deepEqual(theBank.payments.map((p) => p.invoice), ['INV-1', 'INV-2']);
    const [interrupted, later] = await payKeys(admin, run);
    assert.equal(interrupted, callKey(run, 'pay_invoice', 'call_1'), 'the state\'s call: its id');
    assert.doesNotMatch(later, /^call:/, 'the model\'s new call: its occurrence');

    const paused = await rejection(resume(true));
    assert.ok(paused instanceof EffectPaused, String(paused));
    assert.equal(paused.key, later, 'the model gave the call another id; its occurrence reached the lost payment');
    assert.deepEqual(theBank.payments.map((p) => p.invoice), ['INV-1', 'INV-2'], 'not paid twice');
  });
});

test('review 33c (o1): one saved state resumed twice, approved one way then the other (alwaysApprove without resumed(), then per call; and the reverse): the interrupted call has one key, its id, so a payment whose answer was lost is paused, never made twice', async () => {
  for (const [firstWay, secondWay] of [['always', 'once'], ['once', 'always']]) {
    await withLedger(async ({ ledger, admin }) => {
      const run = runId(`o1-${firstWay}`);
      const theBank = bank();
      let asked = 0;
      // a provider's ids (new on every ask); every payment needs a person's approval
      const options = {
        calls: [{ invoice: 'INV-9', amount: 100 }], recorded: false, approval: () => true, callId: () => `call_${(asked += 1)}`,
      };
      const runner = new Runner();
      const first = await agentAttempt(ledger, run, () => runner.run(apAgent(theBank, options).agent, 'Pay INV-9.'));
      const saved = first.state.toString();
      const interruptedKey = callKey(run, 'pay_invoice', 'call_1');
      /** the saved state restored and approved `way`, with no resumed(): @param {string} way */
      const resume = async (way) => {
        const { agent } = apAgent(theBank, options);
        const state = await approvedState(agent, saved, { always: way === 'always' });
        return agentAttempt(ledger, run, () => runner.run(agent, state));
      };
      theBank.loseNextAnswer = true;
      const lost = await rejection(resume(firstWay));
      assert.ok(lost instanceof RunStopped, String(lost));
      assert.deepEqual(await payKeys(admin, run), [interruptedKey], `${firstWay}: the state's call, by its id`);

      const paused = await rejection(resume(secondWay));
      assert.ok(paused instanceof EffectPaused, `${firstWay} then ${secondWay}: ${paused}`);
      assert.equal(paused.key, interruptedKey, 'the same effect, whatever the approval');
      assert.equal(theBank.payments.length, 1, `${firstWay} then ${secondWay}: paid once`);
      assert.deepEqual(await payKeys(admin, run), [interruptedKey]);

      // approved, saved and restored (the decision travels with the state): still that effect
      const { agent } = apAgent(theBank, options);
      const approved = await approvedState(agent, saved, { always: secondWay === 'always' });
      const restored = await RunState.fromString(agent, approved.toString());
      const again = await rejection(agentAttempt(ledger, run, () => runner.run(agent, restored)));
      assert.ok(again instanceof EffectPaused, String(again));
      assert.equal(again.key, interruptedKey);
      assert.equal(theBank.payments.length, 1);
    });
  }
});

for (const lost of /** @type {const} */ (['the app\'s result', 'the bank\'s answer'])) {
  test(`review 33e: alwaysApprove, the payment made, ${lost} lost, the run started over from the same input: the model names the payment anew and the new approval lets it through -- paid twice before the call-id guard; now paused as a divergence naming the first payment, and a person's same gives the model that payment's result`, async () => {
    await withLedger(async ({ ledger, admin }) => {
      const run = runId('startover');
      const theBank = bank();
      let asked = 0;
      // a provider's ids (new on every ask); every payment needs a person's approval
      const options = {
        calls: [{ invoice: 'INV-9', amount: 100 }], recorded: false, approval: () => true, callId: () => `call_${(asked += 1)}`,
      };
      const runner = new Runner();
      /** the run from the start: the model asked, its payment waiting for approval; the state saved */
      const fromTheStart = async () => {
        const first = await agentAttempt(ledger, run, () => runner.run(apAgent(theBank, options).agent, 'Pay INV-9.'));
        assert.deepEqual(first.interruptions.map((i) => i.name), ['pay_invoice']);
        const saved = first.state.toString();
        /** the saved state restored, approved with alwaysApprove, and run */
        return async () => {
          const { agent } = apAgent(theBank, options);
          const state = await approvedState(agent, saved, { always: true });
          return agentAttempt(ledger, run, () => runner.run(agent, state));
        };
      };
      const paidKey = callKey(run, 'pay_invoice', 'call_1');
      const resume = await fromTheStart();
      if (lost === 'the bank\'s answer') {
        theBank.loseNextAnswer = true;
        assert.ok(await rejection(resume()) instanceof RunStopped);
      } else {
        assert.match(String((await resume()).finalOutput), /P1/, 'paid; the app crashed before it kept the result');
      }
      assert.equal(theBank.payments.length, 1);
      assert.deepEqual(await payKeys(admin, run), [paidKey]);

      // No saved state to go on from: the app starts the run over from the same input and
      // approves again.  The model, asked again, names the payment anew.
      const again = await fromTheStart();
      assert.equal(asked, 2, 'the model was asked again, and gave the payment a new id');
      const newKey = callKey(run, 'pay_invoice', 'call_2');
      const paused = await rejection(again());
      await assertDivergence(admin, paused, newKey, paidKey);
      assert.equal(theBank.payments.length, 1, 'not paid twice');

      // A person: it is the payment made before (found at the bank, when its answer was lost).
      if (lost === 'the bank\'s answer') {
        await admin.query("SELECT durable_ledger.resolve_effect($1, 'completed', $2::jsonb, 'on-call', 'found at the bank')",
          [paidKey, JSON.stringify({ paymentId: 'P1' })]);
      }
      await resolveDivergence(admin, newKey, 'same', 'the payment made before the crash');
      for (let i = 0; i < 2; i += 1) {
        const done = await again();
        assert.match(String(done.finalOutput), /P1/, 'the model got the first payment\'s result');
        assert.doesNotMatch(String(done.finalOutput), /P2/);
      }
      assert.equal(theBank.payments.length, 1, 'paid once');
      assert.deepEqual(await payKeys(admin, run), [paidKey]);
    });
  });
}

/**
 * The ResumeNotMarked a run failed with (the SDK's ToolCallError carries a tool's error).
 * @param {any} err
 * @returns {ResumeNotMarked}
 */
function refusal(err) {
  const inner = err instanceof ResumeNotMarked ? err : err?.error;
  assert.ok(inner instanceof ResumeNotMarked, String(err));
  return inner;
}

/**
 * An agent whose first turn makes two payments (INV-1, INV-2; ids call_1, call_2), both
 * waiting for a person's approval, then says what it got.
 * @param {ReturnType<typeof bank>} theBank
 */
function twoAtOnce(theBank) {
  const pay = ledgerTool({
    name: 'pay_invoice',
    description: 'Pay an invoice',
    parameters: z.object({ invoice: z.string(), amount: z.number() }),
    needsApproval: async () => true,
    execute: async (input, _ctx, details) => theBank.pay(input, /** @type {string} */ (details.idempotencyKey)),
  });
  const scripted = new ScriptedModel(Array.from({ length: 4 }, () => modelResponder((call) => {
    if (resultsOf(call.request).length === 0) {
      return [
        functionCall('pay_invoice', { invoice: 'INV-1', amount: 100 }, { callId: 'call_1' }),
        functionCall('pay_invoice', { invoice: 'INV-2', amount: 200 }, { callId: 'call_2' }),
      ];
    }
    return [assistantMessage(`done: ${resultsOf(call.request).map((r) => outputText(r.output)).join(' ; ')}`)];
  })));
  return new Agent({ name: 'ap', instructions: 'Pay the invoices.', tools: [pay], model: scripted });
}

test('two interrupted calls of a tool, one approved with alwaysApprove (which approves the other along with it, nobody deciding on it): without resumed(state) the other is refused (ResumeNotMarked), with it both are keyed by their ids; a per-call resume of the same state replays both', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('siblings');
    const theBank = bank();
    const runner = new Runner();
    const first = await agentAttempt(ledger, run, () => runner.run(twoAtOnce(theBank), 'Pay INV-1 and INV-2.'));
    assert.deepEqual(first.interruptions.map((i) => i.name), ['pay_invoice', 'pay_invoice']);
    const saved = first.state.toString();
    /** @param {boolean} mark */
    const alwaysResume = async (mark) => {
      const agent = twoAtOnce(theBank);
      const state = await approvedState(agent, saved, { always: true });
      return agentAttempt(ledger, run, () => runner.run(agent, mark ? resumed(state) : state));
    };

    const refused = refusal(await rejection(alwaysResume(false)));
    assert.equal(refused.callId, 'call_2');
    assert.match(refused.message, /resumed\(state\)/);
    assert.ok(!theBank.payments.some((p) => p.invoice === 'INV-2'), 'the unplaced call was not made');
    for (const key of await payKeys(admin, run)) assert.equal(key, callKey(run, 'pay_invoice', 'call_1'));

    const done = await alwaysResume(true);
    assert.match(String(done.finalOutput), /P\d.*P\d/);
    assert.deepEqual(await payKeys(admin, run), [callKey(run, 'pay_invoice', 'call_1'), callKey(run, 'pay_invoice', 'call_2')]);

    // the same saved state, each call approved on its own, without resumed(): both replay
    const agent = twoAtOnce(theBank);
    const state = await RunState.fromString(agent, saved);
    for (const item of state.getInterruptions()) state.approve(item);
    const replayed = await agentAttempt(ledger, run, () => runner.run(agent, state));
    assert.equal(replayed.finalOutput, done.finalOutput);
    assert.deepEqual(theBank.payments.map((p) => p.invoice).sort(), ['INV-1', 'INV-2'], 'each paid once');
  });
});

test('alwaysApprove without resumed(state): a later call the standing approval lets through is refused (ResumeNotMarked), before the ledger or the bank; the resume with resumed(state) then pays it once', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('always-unmarked');
    const theBank = bank();
    const { resume } = await alwaysApproveRun(ledger, run, theBank);
    const refused = refusal(await rejection(resume(false)));
    assert.equal(refused.callId, 'call_2');
    assert.deepEqual(theBank.payments.map((p) => p.invoice), ['INV-1'], 'the decided call was made, the other not');
    assert.deepEqual(await payKeys(admin, run), [callKey(run, 'pay_invoice', 'call_1')]);

    const done = await resume(true);
    assert.match(String(done.finalOutput), /P1.*P2/);
    assert.deepEqual(theBank.payments.map((p) => p.invoice), ['INV-1', 'INV-2']);
    const [interrupted, later] = await payKeys(admin, run);
    assert.equal(interrupted, callKey(run, 'pay_invoice', 'call_1'));
    occurrenceKey(later);
  });
});

test('a crash-rerun with a model the ledger does not record: the model gives the call a new id, which is keyed by its occurrence -- paused, then replayed, never paid twice', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('plain-rerun');
    const theBank = bank();
    let asked = 0;
    // a provider's ids: new on every ask
    const fresh = () => apAgent(theBank, {
      calls: [{ invoice: 'INV-9', amount: 100 }], recorded: false, callId: () => `call_${(asked += 1)}`,
    });
    const runner = new Runner();
    theBank.loseNextAnswer = true;
    const lost = await rejection(agentAttempt(ledger, run, () => runner.run(fresh().agent, 'Pay INV-9.')));
    assert.ok(lost instanceof RunStopped, String(lost));
    const [key] = await payKeys(admin, run);
    assert.doesNotMatch(key, /^call:/);

    const paused = await rejection(agentAttempt(ledger, run, () => runner.run(fresh().agent, 'Pay INV-9.')));
    assert.ok(paused instanceof EffectPaused, String(paused));
    assert.equal(paused.key, key, 'the rerun\'s call (a new id) reached the first call\'s effect');
    assert.equal(theBank.payments.length, 1);

    await admin.query("SELECT durable_ledger.resolve_effect($1, 'completed', $2::jsonb, 'on-call', 'found at the bank')",
      [key, JSON.stringify({ paymentId: 'P1' })]);
    for (let i = 0; i < 2; i += 1) {
      const done = await agentAttempt(ledger, run, () => runner.run(fresh().agent, 'Pay INV-9.'));
      assert.match(String(done.finalOutput), /P1/);
    }
    assert.equal(theBank.payments.length, 1, 'replayed, never paid twice');
    assert.ok(asked >= 4, 'each rerun asked the model, which gave a new id');
    assert.deepEqual(await payKeys(admin, run), [key]);
  });
});

for (const keyBy of /** @type {const} */ (['occurrence', 'recorded-call-id'])) {
  test(`keyBy ${keyBy}: a recorded model, streamed or not, and a crash-rerun that asks the very same: the turn replays and reaches the same call (${keyBy === 'occurrence' ? 'its occurrence' : 'its id'})`, async () => {
    await withLedger(async ({ ledger, admin }) => {
      const run = runId(`recorded-rerun-${keyBy}`);
      const theBank = bank();
      const agentOf = () => apAgent(theBank, { calls: [{ invoice: 'INV-9', amount: 100 }], recorded: true, keyBy }).agent;
      const streamed = (/** @type {Agent<any, any>} */ agent) => agentAttempt(ledger, run, async () => {
        const result = await new Runner().run(agent, 'Pay INV-9.', { stream: true });
        for await (const _event of result); // eslint-disable-line no-unused-vars
        await result.completed;
        return result.finalOutput;
      });
      theBank.loseNextAnswer = true;
      const lost = await rejection(streamed(agentOf()));
      assert.ok(lost instanceof RunStopped, String(lost));
      const [key] = await payKeys(admin, run);
      if (keyBy === 'recorded-call-id') assert.equal(key, callKey(run, 'pay_invoice', 'call_1'), 'the live stream\'s call, keyed by its id');
      else occurrenceKey(key);

      const paused = await rejection(agentAttempt(ledger, run, () => new Runner().run(agentOf(), 'Pay INV-9.')));
      assert.ok(paused instanceof EffectPaused, String(paused));
      assert.equal(paused.key, key, 'the replayed turn\'s call');
      await admin.query("SELECT durable_ledger.resolve_effect($1, 'completed', $2::jsonb, 'on-call', 'found at the bank')",
        [key, JSON.stringify({ paymentId: 'P1' })]);
      assert.match(String(await streamed(agentOf())), /P1/, 'a replayed stream\'s call replays');
      assert.equal(theBank.payments.length, 1);
      assert.deepEqual(await payKeys(admin, run), [key]);
    });
  });

  test(`keyBy ${keyBy}: a refused call is replayed as refused, not made again: the model's retry under another id paid, and a rerun pays nothing more`, async () => {
    await withLedger(async ({ ledger, admin }) => {
      const run = runId(`refused-${keyBy}`);
      const theBank = bank();
      // the model pays INV-9; told the bank was busy, it tries again (another call, another id)
      const options = { calls: [{ invoice: 'INV-9', amount: 100 }, { invoice: 'INV-9', amount: 100 }], recorded: true, keyBy };
      theBank.refuseNext = true;
      const first = await agentAttempt(ledger, run, () => new Runner().run(apAgent(theBank, options).agent, 'Pay INV-9.'));
      assert.match(String(first.finalOutput), /bank_busy.*P1/);
      assert.equal(theBank.payments.length, 1);
      const rows = (await effectsOf(admin, run)).filter((e) => e.tool === 'pay_invoice');
      assert.deepEqual(rows.map((e) => e.status), ['failed', 'completed']);
      if (keyBy === 'recorded-call-id') {
        assert.deepEqual(rows.map((e) => e.key), [callKey(run, 'pay_invoice', 'call_1'), callKey(run, 'pay_invoice', 'call_2')]);
      } else {
        rows.forEach((e) => occurrenceKey(e.key));
      }

      // A rerun (the bank would take the payment now): the recorded turns replay, the
      // refusal with them, then the retry's payment.
      const again = apAgent(theBank, options);
      const rerun = await agentAttempt(ledger, run, () => new Runner().run(again.agent, 'Pay INV-9.'));
      assert.equal(rerun.finalOutput, first.finalOutput);
      assert.equal(again.scripted.calls.length, 0, 'every turn replayed');
      assert.equal(theBank.payments.length, 1, 'paid once');
    });
  });
}

/**
 * The app's agent on a given day: its instructions say the date, as many apps' do, so a
 * rerun on another day asks the model anew (another request), and the model -- a
 * provider's ids, new on every ask -- gives the payment a new call id.
 * @param {ReturnType<typeof bank>} theBank @param {import('../src/index.js').KeyBy} keyBy
 * @param {() => string} nextId
 */
const datedAgent = (theBank, keyBy, nextId) => (/** @type {string} */ day) => apAgent(theBank, {
  calls: [{ invoice: 'INV-9', amount: 100 }], recorded: true, keyBy, callId: nextId,
  instructions: `Pay the invoices. Today is ${day}.`,
});

test('keyBy occurrence (the default) and ledgerModel: a crash in the middle of a payment, then a rerun whose instructions changed (a new date) and whose model gives the call a new id: the payment is paused, never made twice; resolved, it replays', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('dated');
    const theBank = bank();
    let asked = 0;
    const onDay = datedAgent(theBank, 'occurrence', () => `call_${(asked += 1)}`);
    const attempt = (/** @type {string} */ day) => {
      const { agent, scripted } = onDay(day);
      return { scripted, result: agentAttempt(ledger, run, () => new Runner().run(agent, 'Pay INV-9.')) };
    };
    theBank.loseNextAnswer = true;
    const lost = await rejection(attempt('Monday').result);
    assert.ok(lost instanceof RunStopped, String(lost));
    const [key] = await payKeys(admin, run);
    occurrenceKey(key);

    const tuesday = attempt('Tuesday');
    const paused = await rejection(tuesday.result);
    assert.ok(paused instanceof EffectPaused, String(paused));
    assert.equal(tuesday.scripted.calls.length, 1, 'the changed request asked the model again');
    assert.equal(asked, 2, 'which gave the payment a new call id');
    assert.equal(paused.key, key, 'its occurrence reached Monday\'s payment: paused for a person');
    assert.equal(theBank.payments.length, 1, 'not paid twice');

    await admin.query("SELECT durable_ledger.resolve_effect($1, 'completed', $2::jsonb, 'on-call', 'found at the bank')",
      [key, JSON.stringify({ paymentId: 'P1' })]);
    const done = await attempt('Wednesday').result;
    assert.match(String(done.finalOutput), /P1/, 'replayed');
    assert.equal(theBank.payments.length, 1, 'paid once');
    assert.deepEqual(await payKeys(admin, run), [key]);
  });
});

test('keyBy recorded-call-id: the same crash, rerun with the very same instructions, is paused (the turn replays, id and all); rerun with changed instructions, the model names the payment anew (its new id) -- paid twice before the call-id guard, now paused as a divergence naming Monday\'s payment, and a person\'s same gives it that payment\'s result', async () => {
  await withLedger(async ({ ledger, admin }) => {
    const run = runId('dated-ids');
    const theBank = bank();
    let asked = 0;
    const onDay = datedAgent(theBank, 'recorded-call-id', () => `call_${(asked += 1)}`);
    const attempt = (/** @type {string} */ day) => agentAttempt(ledger, run, () => new Runner().run(onDay(day).agent, 'Pay INV-9.'));
    theBank.loseNextAnswer = true;
    assert.ok(await rejection(attempt('Monday')) instanceof RunStopped);
    const monday = callKey(run, 'pay_invoice', 'call_1');
    assert.deepEqual(await payKeys(admin, run), [monday]);

    // the same request: the turn replays, id and all, and reaches Monday's payment
    const paused = await rejection(attempt('Monday'));
    assert.ok(paused instanceof EffectPaused && !(paused instanceof DivergencePaused), String(paused));
    assert.equal(paused.key, monday);
    assert.equal(theBank.payments.length, 1);

    // another date: a new turn, a new id, a new business key -- the second payment this
    // option used to risk; the ledger sees the same call under a new id in a later attempt
    const tuesday = callKey(run, 'pay_invoice', 'call_2');
    const diverged = await rejection(attempt('Tuesday'));
    await assertDivergence(admin, diverged, tuesday, monday);
    assert.equal(asked, 2, 'the changed request asked the model again, which named the call anew');
    assert.deepEqual(theBank.payments.map((p) => p.invoice), ['INV-9'], 'not paid twice');

    // A person finds Monday's payment at the bank, and says Tuesday's call is that payment.
    await admin.query("SELECT durable_ledger.resolve_effect($1, 'completed', $2::jsonb, 'on-call', 'found at the bank')",
      [monday, JSON.stringify({ paymentId: 'P1' })]);
    await resolveDivergence(admin, tuesday, 'same', 'Monday\'s payment, named anew');
    const done = await attempt('Tuesday');
    assert.match(String(done.finalOutput), /P1/, 'the model got the first payment\'s result');
    assert.doesNotMatch(String(done.finalOutput), /P2/);
    assert.deepEqual(theBank.payments.map((p) => p.invoice), ['INV-9'], 'paid once');
    assert.deepEqual(await payKeys(admin, run), [monday], 'nothing recorded under the new id');
  });
});

test('keyBy is checked', () => {
  const base = { name: 't', description: 'd', parameters: z.object({}), execute: async () => 'ok' };
  assert.throws(() => ledgerTool(/** @type {any} */ ({ ...base, keyBy: 'id' })), /keyBy must be 'occurrence' or 'recorded-call-id'/);
  assert.doesNotThrow(() => ledgerTool({ ...base, keyBy: 'recorded-call-id' }));
  assert.doesNotThrow(() => ledgerTool({ ...base, keyBy: 'occurrence' }));
});
