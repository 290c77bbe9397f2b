// A worker process of the crash test: one attempt at the run given, on a
// pg.Pool (a token lease), printing what happened; the test SIGKILLs it in
// the middle of the payment.
import pg from 'pg';
import { Ledger, EffectPaused } from 'durable-ledger';
import { runBilling } from './billing-agent.js';

const [run] = process.argv.slice(2);
const pool = new pg.Pool({ connectionString: process.env.DURABLE_LEDGER_DSN, max: 4 });
const ledger = new Ledger(pool, { consoleWarn: false });
try {
  const { result, modelCalls } = await runBilling(ledger, run, process.env.EFFECTS_URL);
  console.log(`done: ${result.text}`);
  console.log(`model calls: ${modelCalls}`);
} catch (err) {
  if (err instanceof EffectPaused) {
    console.log(`paused: ${err.key} ${err.downstreamKey}`);
    process.exitCode = 3;
  } else {
    console.log(`error: ${err.name}: ${err.message}`);
    process.exitCode = 1;
  }
} finally {
  await pool.end();
}
