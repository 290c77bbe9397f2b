// Type-checked by `npm run typecheck` (tsc --noEmit --strict): what an agent runtime in
// TypeScript writes against the package's declarations, with node-postgres' own types.
// Not run: tsc proves that the declarations accept real pg objects and give the types
// an application relies on.
import pg from 'pg';
import {
  Ledger, LedgerError, EffectPaused, DivergencePausedError, RunAbandonedError, ToolRefusedError,
  LeaseLostError, PoolerDetected, NOTICE_CODES, type Decision, type LedgerNotice, type Recorded, type TokenLease,
  DivergencePaused, RunAbandoned, ToolRefused, LeaseLost, RunStopped,
} from 'durable-ledger';

async function agent(pool: pg.Pool, client: pg.Client): Promise<void> {
  // a dedicated client: session leases; a pool: token leases
  const session = new Ledger(client);
  const pooled = new Ledger(pool);

  const paid: unknown = await session.attempt('run-1', (run: string) =>
    session.guarded({
      run, tool: 'bank.pay', args: { invoice: 'INV-9', amount: 4200 },
      perform: async (key: string) => ({ payment_id: `pay_${key.slice(0, 8)}` }),
    }));

  const sendMail = pooled.tool('mail.send', async (args: { to: string }, key: string) => ({ sent: args.to, key }));
  await pooled.tokenAttempt('run-2', async (lease: TokenLease) => {
    const [a, b] = await Promise.all([
      sendMail('run-2', { to: 'ap@acme.example' }),
      sendMail('run-2', { to: 'ar@globex.example' }),
    ]);
    return [a, b, lease];
  });

  // results are typed as recorded (a JSON round trip)
  const receipt: { payment_id: string; at: string } = await session.guarded({
    run: 'run-1', tool: 'bank.pay', args: {}, perform: () => ({ payment_id: 'p', at: new Date(), skipped: undefined }),
  });
  const turn: Recorded<{ role: 'assistant'; content: string }> = await session.record({
    run: 'run-1', tool: 'model', args: {}, call: async () => ({ role: 'assistant' as const, content: 'yes' }),
  });
  const sent: { sent: string; key: string } = await sendMail('run-2', { to: 'x' });
  void [receipt, turn, sent];

  // notices: an event, or console.warn when nobody listens (off with consoleWarn: false)
  session.on('notice', (n: LedgerNotice) => {
    if (n.code === NOTICE_CODES.DIVERGENCE) console.log(n.key, n.mayDuplicate, n.run, n.tool);
  });
  const quiet = new Ledger(client, { consoleWarn: false });
  void quiet;

  const decision: Decision = await session.beginEffect('run-3', 'bank.pay', { invoice: 1 });
  const status: string | null = decision.status;
  void status;
  void paid;

  try {
    await session.guarded({ run: 'run-4', tool: 'bank.pay', args: {}, perform: () => 1 });
  } catch (e) {
    if (e instanceof PoolerDetected) { const p: number = e.reachedPid; const l: LeaseLostError = e; void [p, l]; }
    else if (e instanceof DivergencePausedError) { const k: string | null = e.key; void k; }
    else if (e instanceof EffectPaused || e instanceof RunAbandonedError || e instanceof ToolRefusedError
             || e instanceof LeaseLostError || e instanceof LedgerError) { /* stop the attempt */ }
    else throw e;
  }

  // the errors by the Python client's names; the names of 1.2 are the same classes (and types)
  try {
    await session.guarded({ run: 'run-5', tool: 'bank.pay', args: {}, perform: () => 1 });
  } catch (e) {
    if (e instanceof DivergencePaused) {
      const old: DivergencePausedError = e; const pause: EffectPaused = e; const d: 'pause' = e.decision;
      void [old, pause, d, e.run, e.tool];
    } else if (e instanceof RunAbandoned) {
      const old: RunAbandonedError = e; const key: null = e.key; const reason: string = e.reason; void [old, key, reason];
    } else if (e instanceof ToolRefused) {
      const old: ToolRefusedError = e; const tool: string = e.tool; void [old, tool];
    } else if (e instanceof LeaseLost) {
      const old: LeaseLostError = e; const epoch: number | null = e.epoch; void [old, epoch];
    } else if (e instanceof RunStopped) {
      const key: string | null = e.key; void key;
    }
  }
}
void agent;
