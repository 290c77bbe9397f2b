// What an app writes with the adapter (tsc --noEmit --strict, tsconfig.json): the
// tools' inputs and details are typed from their zod parameters, the wrapped model is
// a Model, and agentAttempt returns what run() returns.
import pg from 'pg';
import { Agent, RunState, Runner, type Model, type RunResult } from '@openai/agents';
import { ScriptedModel } from '@openai/agents/testing';
import { Ledger, EffectPaused } from 'durable-ledger';
import { z } from 'zod';
import {
  agentAttempt, ledgerTool, ledgerModel, ledgerModelProvider, resumed, ResumeNotMarked, ToolCallStopped, type KeyBy, type LedgerToolCallDetails,
} from 'durable-ledger-openai-agents';

const payInvoice = ledgerTool({
  name: 'pay_invoice',
  description: 'Pay an invoice',
  parameters: z.object({ invoice: z.string(), amount: z.number() }),
  businessKey: (input) => `pay-${input.invoice}`,
  execute: async (input, _runContext, details) => {
    const amount: number = input.amount;
    const key: string | null = details.idempotencyKey;
    return { paid: input.invoice, amount, key };
  },
});
const lookup = ledgerTool({
  name: 'lookup_invoice',
  description: 'Look an invoice up',
  parameters: z.object({ invoice: z.string() }),
  readOnly: true,
  keyBy: 'recorded-call-id', // the app keeps every rerun's request the very same
  execute: async ({ invoice }) => ({ invoice, amount: 4200 }),
});
const inContext = ledgerTool<z.ZodObject<{ to: z.ZodString }>, { runId: string }>({
  name: 'send_email',
  description: 'Send an email',
  parameters: z.object({ to: z.string() }),
  needsApproval: true,
  run: (runContext) => runContext.context.runId,
  execute: async ({ to }, runContext, details: LedgerToolCallDetails) => `sent to ${to} in ${runContext.context.runId} (${details.run})`,
});

const model: Model = ledgerModel(new ScriptedModel([]));
const agent = new Agent({ name: 'ap', instructions: 'pay', tools: [payInvoice, lookup], model });
const emailer = new Agent<{ runId: string }>({ name: 'mail', tools: [inContext], model });
const runner = new Runner({ modelProvider: ledgerModelProvider({ getModel: () => new ScriptedModel([]) }) });

export async function main(ledger: Ledger): Promise<string | undefined> {
  try {
    const result: RunResult<any, any> = await agentAttempt(ledger, 'run-1', () => runner.run(agent, 'pay INV-9'));
    await agentAttempt(ledger, 'run-2', { lease: 'token', ttl: 60 }, () =>
      runner.run(emailer, 'mail', { context: { runId: 'run-2' } }));
    return result.finalOutput as string | undefined;
  } catch (err) {
    if (err instanceof EffectPaused) return err.key ?? undefined;
    if (err instanceof ToolCallStopped) return err.stop.forPerson;
    throw err;
  }
}
void main(new Ledger(new pg.Pool()));

// A saved state resumed, its calls approved for the rest of the run: resumed(state) is
// the state, so run() takes it as it takes a RunState.
export async function resume(ledger: Ledger, saved: string): Promise<unknown> {
  const state = await RunState.fromString(agent, saved);
  for (const item of state.getInterruptions()) state.approve(item, { alwaysApprove: true });
  const result = await agentAttempt(ledger, 'run-1', () => runner.run(agent, resumed(state)));
  return result.finalOutput;
}

// a resume that did not mark its state, refused: the SDK's ToolCallError carries it
export function unmarkedCall(err: unknown): string | null {
  const inner = err instanceof ResumeNotMarked ? err : (err as { error?: unknown } | null)?.error;
  return inner instanceof ResumeNotMarked ? `${inner.toolName} ${inner.callId}` : null;
}

const keyBy: KeyBy = 'occurrence';
void keyBy;

// Misuses tsc must reject (it fails if a marked line compiles).
ledgerTool({
  name: 'typed',
  description: 'typed input',
  parameters: z.object({ amount: z.number() }),
  execute: async (input, _ctx, details) => {
    // @ts-expect-error the amount is a number
    const amount: string = input.amount;
    // @ts-expect-error the key may be null (a read)
    const key: string = details.idempotencyKey;
    return { amount, key };
  },
});
ledgerTool({
  name: 'bad',
  description: 'a bad option',
  parameters: z.object({}),
  // @ts-expect-error readOnly is a boolean, 'record' or 'pass'
  readOnly: 'maybe',
  execute: async () => 'x',
});
ledgerTool({
  name: 'bad-key',
  description: 'a bad keyBy',
  parameters: z.object({}),
  // @ts-expect-error keyBy is 'occurrence' or 'recorded-call-id'
  keyBy: 'call-id',
  execute: async () => 'x',
});
// @ts-expect-error execute is required
ledgerTool({ name: 'none', description: 'no execute', parameters: z.object({}) });
// @ts-expect-error resumed() takes a RunState, not its string
resumed('{"saved": true}');
