// The agent of the AI SDK adapter's tests: the AI SDK's own mock model
// (MockLanguageModelV4 from ai/test) scripted as a function of the prompt, so
// that every process -- a first worker, the one that resumes after a SIGKILL --
// gets the same answers for the same conversation: look the invoice up (a
// read-only tool), then pay it and e-mail the customer (two tool calls in one
// step), then say what was done.  The tools make their effects on the test's
// effects server (adapters/test-support), which counts them.
import { generateText, stepCountIs, tool } from 'ai';
import { MockLanguageModelV4 } from 'ai/test';
import { z } from 'zod';
import { makeEffect } from '../../test-support/effects-server.js';
import { agentAttempt, durableTools, idempotencyKey, ledgerStopped, recordedModel } from '../src/index.js';

/** The tool results the prompt holds so far, by tool name. */
function toolResults(prompt) {
  const results = {};
  for (const message of prompt) {
    if (message.role !== 'tool') continue;
    for (const part of message.content) {
      if (part.type === 'tool-result') results[part.toolName] = part.output;
    }
  }
  return results;
}

const usage = {
  inputTokens: { total: 10, noCache: 10, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 5, text: 5, reasoning: 0 },
};

/** @param {string} toolName @param {unknown} input @param {string} id */
const call = (toolName, input, id) => ({ type: 'tool-call', toolCallId: id, toolName, input: JSON.stringify(input) });

/** A mock model that plays the billing clerk: the answer depends only on the prompt. */
export function billingModel() {
  return new MockLanguageModelV4({
    provider: 'test', modelId: 'billing-clerk',
    doGenerate: async ({ prompt }) => {
      const results = toolResults(prompt);
      if (!results.lookupInvoice) {
        return { content: [call('lookupInvoice', { invoice: 'INV-7' }, 'call-1')],
          finishReason: { unified: 'tool-calls', raw: 'tool_calls' }, usage, warnings: [] };
      }
      if (!results.payInvoice && !results.sendEmail) {
        const { customer, amount } = results.lookupInvoice.value;
        return { content: [
          call('payInvoice', { invoice: 'INV-7', amount }, 'call-2'),
          call('sendEmail', { to: customer, subject: 'INV-7 is paid' }, 'call-3'),
        ], finishReason: { unified: 'tool-calls', raw: 'tool_calls' }, usage, warnings: [] };
      }
      const pay = results.payInvoice;
      const text = pay.type === 'json' ? `Paid INV-7 (${pay.value.id}) and told the customer.`
        : `Could not pay INV-7: ${pay.value}`;
      return { content: [{ type: 'text', text }], finishReason: { unified: 'stop', raw: 'stop' }, usage, warnings: [] };
    },
  });
}

/** The clerk's tools, their effects on the effects server at `url`. */
export function billingTools(url, { failPayment = null } = {}) {
  return {
    lookupInvoice: tool({
      description: 'Looks an invoice up',
      inputSchema: z.object({ invoice: z.string() }),
      execute: async ({ invoice }) => {
        await makeEffect(url, 'lookup', { invoice }, 'none');
        return { invoice, customer: 'ap@example.com', amount: 4200 };
      },
    }),
    payInvoice: tool({
      description: 'Pays an invoice',
      inputSchema: z.object({ invoice: z.string(), amount: z.number() }),
      execute: async (input, options) => {
        if (failPayment) throw failPayment();
        return makeEffect(url, 'pay', input, idempotencyKey(options));
      },
    }),
    sendEmail: tool({
      description: 'Sends an e-mail',
      inputSchema: z.object({ to: z.string(), subject: z.string() }),
      execute: async (input, options) => makeEffect(url, 'email', input, idempotencyKey(options)),
    }),
  };
}

/**
 * One attempt at the run: the clerk's loop, its model turns recorded, its tools through the
 * ledger (the lookup recorded, the payment and the e-mail side effects).  Resolves with the
 * generateText result and the number of model calls made (not replayed); `steps` gets
 * every finished step, also of an attempt that throws.
 */
export async function runBilling(ledger, run, url, { failPayment = null, model = billingModel(), steps = [] } = {}) {
  const result = await agentAttempt(ledger, run, { ttl: 60 }, () => generateText({
    model: recordedModel(model),
    tools: durableTools(billingTools(url, { failPayment }), { readOnly: ['lookupInvoice'] }),
    prompt: 'Pay invoice INV-7 and e-mail the customer.',
    stopWhen: [stepCountIs(5), ledgerStopped()],
    onStepFinish: (step) => { steps.push(step); },
  }));
  return { result, modelCalls: model.doGenerateCalls.length };
}
