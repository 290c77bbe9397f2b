// An agent loop in TypeScript whose side-effecting tool calls go through durable_ledger.
//
// The shape of an LLM agent, with a scripted stand-in for the model (no network): the
// model reads the conversation and answers either with tool calls -- several at once,
// which the agent runs in parallel, as a model's parallel tool calls are -- or with a
// final answer. Its tools: lookupInvoice (read-only, not recorded), payInvoice and
// sendEmail (side effects, through the ledger). The bank and the mail server are files
// that record every call they receive and deduplicate nothing, so that what happened
// survives the worker.
//
// The example runs the agent as a worker process that is killed (SIGKILL) in the middle
// of its work, once the payments are made and before any email is sent, then runs a new
// worker on the same run id, as a queue that redelivers the job would. The model of the
// second worker asks for its parallel calls in another order (as real models do): every
// call the first worker completed is replayed from the ledger, the rest is performed, and
// the bank and the mail server see each effect once.
//
//   npm run example:ts -- postgresql://user@host/db      (compiles with tsc, then runs)
//
// Each attempt runs under a token lease on a pg.Pool (every call may use another
// connection), so the URL may point at PgBouncer in transaction mode. The killed worker's
// lease lives on until its ttl (5 s here) runs out: the new worker waits for it (RunBusy).
// The role needs durable_ledger_worker. Exit status 0 when every effect happened once.
import { spawnSync } from 'node:child_process';
import { appendFileSync, existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';
import pg from 'pg';
import { EffectDidNotHappen, EffectFailed, Ledger, RunBusy } from 'durable-ledger';

interface Invoice { vendor: string; amount: number; email: string; account: string }
type Args = Record<string, unknown>;
interface ToolCall { id: string; tool: 'lookupInvoice' | 'payInvoice' | 'sendEmail'; args: Args }
interface ToolMessage { role: 'tool'; call: string; content: any }
type Message = { role: 'user'; invoices: string[] } | ToolMessage;
type Turn = { toolCalls: ToolCall[] } | { final: string };

const BOOKS: Record<string, Invoice> = {
  'INV-201': { vendor: 'Acme Paper', amount: 420.0, email: 'billing@acme.example', account: 'DE89 3704 0044 0532 0130 00' },
  'INV-202': { vendor: 'Globex', amount: 1250.5, email: 'ar@globex.example', account: 'CLOSED-ACCOUNT' },
  'INV-203': { vendor: 'Initech', amount: 99.0, email: 'ap@initech.example', account: 'FR14 2004 1010 0505 0001 3M02 606' },
};

// ---- The outside world: a bank and a mail server that remember every call (in files) ----

class Downstream {
  constructor(readonly path: string) {}

  calls(): Args[] {
    if (!existsSync(this.path)) return [];
    return readFileSync(this.path, 'utf8').split('\n').filter(Boolean).map((l) => JSON.parse(l) as Args);
  }

  async call(what: Args): Promise<{ id: string }> {
    await sleep(10 + Math.random() * 90); // the network: replies come in any order
    appendFileSync(this.path, `${JSON.stringify(what)}\n`);
    return { id: `${basename(this.path).slice(0, 4)}-${this.calls().length}` };
  }
}

// ---- The model: a script that reads the conversation, like a model would ----

class ScriptedModel {
  async respond(messages: Message[]): Promise<Turn> {
    await sleep(50); // thinking
    const results = new Map<string, any>();
    for (const m of messages) if (m.role === 'tool') results.set(m.call, m.content);
    const first = messages[0];
    const invoices = first.role === 'user' ? first.invoices : [];
    // Turn 1: look every invoice up, in parallel.
    let calls: ToolCall[] = invoices.filter((i) => !results.has(`look-${i}`))
      .map((i) => ({ id: `look-${i}`, tool: 'lookupInvoice', args: { invoice: i } }));
    // Turn 2: pay every invoice, in parallel.
    if (!calls.length) {
      calls = invoices.filter((i) => !results.has(`pay-${i}`)).map((i) => {
        const facts = results.get(`look-${i}`) as Invoice;
        return { id: `pay-${i}`, tool: 'payInvoice', args: { invoice: i, amount: facts.amount, account: facts.account } };
      });
    }
    // Turn 3: tell each vendor what happened, in parallel.
    if (!calls.length) {
      calls = invoices.filter((i) => !results.has(`mail-${i}`)).map((i) => {
        const paid = results.get(`pay-${i}`);
        const subject = 'error' in paid ? `${i} could not be paid: please send new bank details` : `${i} paid: ${paid.id}`;
        return { id: `mail-${i}`, tool: 'sendEmail', args: { to: (results.get(`look-${i}`) as Invoice).email, subject } };
      });
    }
    if (!calls.length) return { final: `processed ${invoices.length} invoices` };
    return { toolCalls: calls.sort(() => Math.random() - 0.5) }; // in any order, as models do
  }
}

// ---- The agent: the usual loop, with the side-effecting tools through the ledger ----

function makeAgent(ledger: Ledger, run: string, bank: Downstream, mail: Downstream, crashBeforeTurn: number | null) {
  const payInvoice = ledger.tool('bank.pay', async (args: Args, idempotencyKey: string) => {
    if (String(args.account).startsWith('CLOSED')) {
      throw new EffectDidNotHappen({ code: 'account_closed' }); // refused before any money moved
    }
    return bank.call({ invoice: args.invoice, amount: args.amount, idempotency_key: idempotencyKey });
  });
  const sendEmail = ledger.tool('mail.send', async (args: Args, idempotencyKey: string) =>
    mail.call({ to: args.to, subject: args.subject, idempotency_key: idempotencyKey }));

  async function dispatch(call: ToolCall): Promise<ToolMessage> {
    let content: any;
    if (call.tool === 'lookupInvoice') {
      content = { ...BOOKS[String(call.args.invoice)] }; // read-only: straight to the books
    } else if (call.tool === 'payInvoice') {
      try {
        content = await payInvoice(run, call.args);
      } catch (err) {
        if (!(err instanceof EffectFailed)) throw err; // now, or replayed from the first worker
        content = { error: err.error };
      }
    } else {
      content = await sendEmail(run, call.args);
    }
    console.log(`  ${call.tool.padEnd(14)} ${JSON.stringify(call.args).slice(0, 60).padEnd(62)} -> ${JSON.stringify(content).slice(0, 50)}`);
    return { role: 'tool', call: call.id, content };
  }

  return async function loop(model: ScriptedModel, invoices: string[]): Promise<string> {
    const messages: Message[] = [{ role: 'user', invoices }];
    for (let turns = 1; turns < 100; turns += 1) {
      if (turns === crashBeforeTurn) {
        console.log(`  worker ${process.pid}: killed before turn ${turns}`);
        process.kill(process.pid, 'SIGKILL');
      }
      const turn = await model.respond(messages);
      if ('final' in turn) return turn.final;
      console.log(`  model asks for ${turn.toolCalls.length} calls at once: ${turn.toolCalls.map((c) => c.id).join(', ')}`);
      messages.push(...await Promise.all(turn.toolCalls.map(dispatch)));
    }
    throw new Error('the model never gave a final answer');
  };
}

async function worker(dsn: string, run: string, state: string, crashBeforeTurn: number | null): Promise<void> {
  const pool = new pg.Pool({ connectionString: dsn, max: 4, application_name: 'agent-loop-ts-example' });
  try {
    const ledger = new Ledger(pool);
    const loop = makeAgent(ledger, run, new Downstream(join(state, 'bank')), new Downstream(join(state, 'mail')), crashBeforeTurn);
    for (;;) {
      try {
        await ledger.tokenAttempt(run, { ttl: 5, holder: `worker-${process.pid}` }, async (lease) => {
          console.log(`== worker ${process.pid}: attempt (lease epoch ${lease.epoch})`);
          console.log(`  model: ${await loop(new ScriptedModel(), Object.keys(BOOKS))}`);
        });
        return;
      } catch (err) {
        if (!(err instanceof RunBusy)) throw err;
        console.log("  run busy: waiting for the previous worker's lease to run out");
        await sleep(1000);
      }
    }
  } finally {
    await pool.end();
  }
}

async function main(): Promise<number> {
  const [dsn = process.env.DURABLE_LEDGER_DSN, runArg, mode, state, crash] = process.argv.slice(2);
  if (!dsn) {
    console.error('usage: agent-loop.js postgresql://user@host/db [run-id]  (or set DURABLE_LEDGER_DSN)');
    return 2;
  }
  const run = runArg ?? `agent-loop-ts-${Date.now()}-${process.pid}`;
  if (mode === '--worker') {
    await worker(dsn, run, state, crash ? Number(crash) : null);
    return 0;
  }
  const dir = mkdtempSync(join(tmpdir(), 'agent-loop-'));
  try {
    const start = (...extra: string[]) => spawnSync(process.execPath,
      [fileURLToPath(import.meta.url), dsn, run, '--worker', dir, ...extra], { stdio: 'inherit' });
    console.log(`run ${run}: an agent pays ${Object.keys(BOOKS).join(', ')} and tells each vendor`);
    const first = start('3');
    console.log(`== the first worker died (${first.signal ?? `exit status ${first.status}`}); the job is redelivered`);
    const second = start();
    console.log(`== the second worker finished (exit status ${second.status})`);
    const payments = new Downstream(join(dir, 'bank')).calls();
    const emails = new Downstream(join(dir, 'mail')).calls();
    console.log(`== downstream: ${payments.length} payments (${payments.map((p) => p.invoice).join(', ')}), ${emails.length} emails`);
    const keys = [...payments, ...emails].map((c) => c.idempotency_key);
    const ok = first.signal === 'SIGKILL' && second.status === 0 && payments.length === 2 && emails.length === 3
      && new Set(keys).size === keys.length;
    console.log(ok ? 'ok - the first worker was killed mid-run, the second replayed what it had done; every effect happened once'
      : 'not ok - an effect is missing or happened twice');
    return ok ? 0 : 1;
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

process.exitCode = await main();
