// A scripted agent (a fixed list of tool calls, no LLM) with two side-effecting
// tools and one read-only tool, run twice against durable_ledger:
//
//   1. a first worker runs the script: the charge and the e-mail happen;
//   2. the worker "restarts" (a new connection = a new lease epoch) and runs
//      the same script again: both side effects are replayed from the ledger,
//      nothing is performed twice.  The read-only tool bypasses the ledger and
//      simply runs again.
//
//   DURABLE_LEDGER_DSN=postgresql://user@host/db node clients/js/examples/agent-loop.js [run-id] [--token-lease]
//
// With --token-lease each worker runs its attempt on a pg.Pool under a token
// lease instead of a session lease: every ledger call may use another
// connection, so the DSN may point at PgBouncer in transaction mode.
//
// The database needs `CREATE EXTENSION durable_ledger` and a role with
// durable_ledger_worker.
import pg from 'pg';
import { Ledger, LedgerError } from 'durable-ledger';

const dsn = process.env.DURABLE_LEDGER_DSN;
if (!dsn) {
  console.error('set DURABLE_LEDGER_DSN to a connection string of a database with durable_ledger');
  process.exit(2);
}
const tokenLease = process.argv.includes('--token-lease');
const run = process.argv.slice(2).find((a) => !a.startsWith('--')) ?? `agent-loop-${Date.now()}-${process.pid}`;

// ---- Downstream systems (in memory; they outlive the workers, like a real bank) ----

const short = (key) => `${key.slice(0, 12)}…`;

const bank = {
  charges: new Map(), // idempotency key -> charge: the bank's own dedup
  calls: 0,
  charge({ customer, amount, currency }, idempotencyKey) {
    this.calls += 1;
    console.log(`      bank: charging ${amount} ${currency} to ${customer} (idempotency key ${short(idempotencyKey)})`);
    if (!this.charges.has(idempotencyKey)) {
      this.charges.set(idempotencyKey, { id: `ch_${this.charges.size + 1}`, amount, currency });
    }
    return this.charges.get(idempotencyKey);
  },
};

const mailer = {
  sent: [],
  send({ to, template, vars }, idempotencyKey) {
    console.log(`      mail: sending "${template}" to ${to} (idempotency key ${short(idempotencyKey)})`);
    this.sent.push({ to, template, vars, idempotencyKey });
    return { message_id: `msg_${this.sent.length}` };
  },
};

const crm = {
  lookups: 0,
  lookup({ customer }) {
    this.lookups += 1;
    return { customer, name: 'Ada Lovelace', email: 'ada@example.com', plan: 'pro' };
  },
};

// ---- The agent ----

// The script an LLM might have produced: each step may use earlier results.
const script = [
  { tool: 'crm.lookup', args: () => ({ customer: 'cus_42' }) },
  { tool: 'payments.charge', args: () => ({ customer: 'cus_42', amount: 4200, currency: 'USD' }) },
  {
    tool: 'email.send',
    args: (r) => ({ to: r[0].email, template: 'receipt', vars: { charge: r[1].id, amount: r[1].amount } }),
  },
  { tool: 'crm.lookup', args: () => ({ customer: 'cus_42' }) },
];

async function worker(label) {
  console.log(`${label}: run ${run}${tokenLease ? ' (token lease, on a pool)' : ''}`);
  // A session lease needs one connection for the attempt; a token lease takes a pool.
  const client = tokenLease
    ? new pg.Pool({ connectionString: dsn, max: 3, application_name: 'agent-loop example' })
    : new pg.Client({ connectionString: dsn, application_name: 'agent-loop example' });
  if (!tokenLease) await client.connect();
  try {
    const ledger = new Ledger(client);
    let performed = false; // set when a side-effecting tool really runs
    const tools = {
      'payments.charge': ledger.tool('payments.charge', (args, key) => {
        performed = true;
        return bank.charge(args, key);
      }),
      'email.send': ledger.tool('email.send', (args, key) => {
        performed = true;
        return mailer.send(args, key);
      }),
      // read-only: a plain function, no ledger
      'crm.lookup': async (_run, args) => crm.lookup(args),
    };
    const readOnly = new Set(['crm.lookup']);
    const results = [];
    const agent = async () => {
      for (const [i, step] of script.entries()) {
        const args = step.args(results);
        performed = false;
        const result = await tools[step.tool](run, args);
        results.push(result);
        const how = readOnly.has(step.tool) ? 'read-only' : performed ? 'executed' : 'replayed';
        console.log(`  step ${i + 1} ${step.tool} [${how}] ${JSON.stringify(args)} -> ${JSON.stringify(result)}`);
      }
    };
    if (tokenLease) {
      await ledger.tokenAttempt(run, { ttl: 30, holder: label }, async (lease) => {
        console.log(`  token lease: epoch ${lease.epoch}, renewed every ${lease.ttl / 3} s while the attempt runs`);
        await agent();
      });
    } else {
      await ledger.attempt(run, agent);
    }
    return results;
  } finally {
    await client.end();
  }
}

try {
  const first = await worker('first worker');
  console.log('-- the worker restarts: same run, new connection (a new lease epoch) --');
  const second = await worker('second worker');
  const same = JSON.stringify(first) === JSON.stringify(second);
  console.log(`the second worker saw ${same ? 'the same' : 'DIFFERENT'} results as the first`);
  console.log(
    `downstream calls: bank ${bank.calls}, mail ${mailer.sent.length}, ` +
      `crm ${crm.lookups} (read-only tools bypass the ledger)`
  );
  if (!same || bank.calls !== 1 || mailer.sent.length !== 1) process.exitCode = 1;
} catch (err) {
  if (err instanceof LedgerError) console.error(`${err.name}: ${err.message}`);
  else console.error(err);
  process.exitCode = 1;
}
