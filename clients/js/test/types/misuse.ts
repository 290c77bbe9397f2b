// A negative type test, compiled by `npm run typecheck` (tsc --noEmit --strict) and by
// test/apps/033_js_package.pl: every line marked @ts-expect-error must be a type error
// (tsc fails on a marked line that is not one), so each misuse below is one the
// declarations catch. 033 also compiles it without the marks and counts the errors.
// Not run.
import pg from 'pg';
import { Ledger, TokenLease, type LedgerNotice, type RunAbandoned } from 'durable-ledger';

async function misuse(client: pg.Client): Promise<void> {
  const ledger = new Ledger(client);
  const send = ledger.tool('mail.send', async (args: { to: string }, key: string) => ({ sent: args.to, key }));

  // a wrapped tool resolves to what its function returns (as recorded): an object, not a number
  // @ts-expect-error
  const n: number = await send('run-1', { to: 'ap@acme.example' });
  // its args are the function's
  // @ts-expect-error
  await send('run-1', { to: 42 });
  // guarded() resolves to what perform returns
  // @ts-expect-error
  const s: string = await ledger.guarded({ run: 'run-1', tool: 'bank.pay', args: {}, perform: async () => ({ id: 1 }) });
  // record() too
  // @ts-expect-error
  const m: { role: string } = await ledger.record({ run: 'run-1', tool: 'model', args: {}, call: () => 'text' });
  // as recorded: a Date comes back as its ISO string, on a first run and on a replay
  const stamped = await ledger.guarded({ run: 'run-1', tool: 'crm.note', args: {}, perform: () => ({ at: new Date() }) });
  // @ts-expect-error
  const at: Date = stamped.at;
  // undefined is recorded as null
  // @ts-expect-error
  const nothing: undefined = await ledger.guarded({ run: 'run-1', tool: 'crm.ping', args: {}, perform: () => undefined });
  // a notice's code is a SQLSTATE (text)
  // @ts-expect-error
  ledger.on('notice', (notice: LedgerNotice) => { const code: number | null = notice.code; void code; });
  // the options
  // @ts-expect-error
  void new Ledger(client, { consoleWarn: 'no' });
  // a Ledger emits 'notice', not a misspelt event
  // @ts-expect-error
  ledger.on('notices', (notice: LedgerNotice) => { void notice; });
  // a TokenLease comes from tokenAttempt(): its constructor is the client's
  // @ts-expect-error
  void new TokenLease({ run: 'run-1', token: 't', epoch: 1, expiresAt: new Date(), holder: null, ttl: 60 });
  // an abandoned run's error is about the run, not an effect: it has no key
  // @ts-expect-error
  const keyOf = (err: RunAbandoned): string => err.key;
  void [n, s, m, at, nothing, keyOf];
}
void misuse;
