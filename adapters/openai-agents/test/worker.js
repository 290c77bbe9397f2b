// A worker process of the crash test: one attempt at the run (agentAttempt, a token
// lease on a pg.Pool) around the SDK's run() of the invoice agent, printing what a
// developer sees -- each tool's start and output (the Runner's hooks), the effects as
// they are made, the final output or the typed error agentAttempt threw -- and how many
// times the scripted model was asked.
//   node test/worker.js <run>      (DURABLE_LEDGER_DSN, EFFECTS_URL)
import pg from 'pg';
import { Runner, setTracingDisabled } from '@openai/agents';
import { Ledger } from 'durable-ledger';
import { agentAttempt } from '../src/index.js';
import { invoiceAgent, PROMPT } from './invoice-agent.js';

setTracingDisabled(true);
const [run] = process.argv.slice(2);
const pool = new pg.Pool({ connectionString: process.env.DURABLE_LEDGER_DSN, max: 4 });
const ledger = new Ledger(pool, { consoleWarn: false });
const log = (/** @type {string} */ line) => process.stdout.write(`${line}\n`);
const { agent, scripted } = invoiceAgent(/** @type {string} */ (process.env.EFFECTS_URL), { log });
const runner = new Runner();
runner.on('agent_tool_start', (_ctx, _agent, tool) => log(`tool ${tool.name} called`));
runner.on('agent_tool_end', (_ctx, _agent, tool, output) => log(`tool ${tool.name} -> ${output}`));
let code = 0;
try {
  const result = await agentAttempt(ledger, run, { ttl: 60, holder: `worker-${process.pid}` },
    () => runner.run(agent, PROMPT));
  log(`final: ${result.finalOutput}`);
} catch (err) {
  const e = /** @type {any} */ (err);
  log(`stopped: ${e?.name} key=${e?.key ?? ''} ${e?.message}`);
  code = 3;
} finally {
  log(`model calls: ${scripted.calls.length}`);
  await pool.end();
}
process.exit(code);
