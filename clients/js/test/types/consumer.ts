// Type-checked by `npm run typecheck` (tsc --noEmit --strict): what an agent runtime in
// TypeScript writes against the package's declarations, with node-postgres' own types.
// Not run: tsc proves that the declarations accept real pg objects and give the types
// an application relies on.
import pg from 'pg';
import {
  Ledger, LedgerError, EffectPaused, DivergencePausedError, RunAbandonedError, ToolRefusedError,
  LeaseLostError, type Decision, type TokenLease,
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

  const decision: Decision = await session.beginEffect('run-3', 'bank.pay', { invoice: 1 });
  const status: string | null = decision.status;
  void status;
  void paid;

  try {
    await session.guarded({ run: 'run-4', tool: 'bank.pay', args: {}, perform: () => 1 });
  } catch (e) {
    if (e instanceof DivergencePausedError) { const k: string | null = e.key; void k; }
    else if (e instanceof EffectPaused || e instanceof RunAbandonedError || e instanceof ToolRefusedError
             || e instanceof LeaseLostError || e instanceof LedgerError) { /* stop the attempt */ }
    else throw e;
  }
}
void agent;
