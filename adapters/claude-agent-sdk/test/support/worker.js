// A worker process of the adapter's tests (SIGKILLed in the middle of a tool): one
// attempt at a Claude Agent SDK session -- claudeAttempt with the session spec given --
// whose custom tools (agent.js) are served by session.server() and called by the scripted
// stand-in for Claude.  Prints "session ID", "result NAME JSON" for each call, then
// "finished", or "stopped NAME: MESSAGE" (exit 3) when claudeAttempt threw a stop.
//
//   node worker.js '{"sessionId": "..."}' INVOICE     (or {"resume": "..."})
import pg from 'pg';
import { Ledger } from 'durable-ledger';
import { claudeAttempt } from '../../src/index.js';
import { billingTools, invoiceScript, playScript } from './agent.js';

const [spec, invoice] = process.argv.slice(2);
const pool = new pg.Pool({ connectionString: process.env.DURABLE_LEDGER_DSN, max: 4 });
const ledger = new Ledger(pool, { consoleWarn: false });
try {
  await claudeAttempt(ledger, JSON.parse(spec), { ttl: 300, holder: `claude-worker-${process.pid}` }, async (session) => {
    console.log(`session ${session.sessionId}`);
    const billing = session.server({ name: 'billing', version: '1.0.0', tools: billingTools(process.env.EFFECTS_URL) });
    await playScript(billing, invoiceScript(invoice), (name, result) => {
      console.log(`result ${name} ${JSON.stringify(result)}`);
    });
  });
  console.log('finished');
} catch (err) {
  console.log(`stopped ${err.name}: ${err.message}`);
  process.exitCode = 3;
} finally {
  await pool.end();
}
