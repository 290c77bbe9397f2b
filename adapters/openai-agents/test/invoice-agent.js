// The agent of the tests: it pays an invoice and e-mails accounts payable, two tool
// calls in one turn, against the effects server (adapters/test-support), its model
// the SDK's own ScriptedModel (@openai/agents/testing) wrapped by ledgerModel.  The
// model answers from the conversation (modelResponder), not from its position in the
// script, since a rerun replays the turns the ledger recorded without asking it: no
// tool result yet -> the two calls; tool results -> a final text that quotes them.
import { Agent } from '@openai/agents';
import { ScriptedModel, assistantMessage, functionCall, modelResponder } from '@openai/agents/testing';
import { z } from 'zod';
import { makeEffect } from '../../test-support/effects-server.js';
import { ledgerModel, ledgerTool } from '../src/index.js';

export const PROMPT = 'Pay invoice INV-9 (4200) and tell accounts payable.';

/** The text of a function_call_result's output. @param {any} output */
export function outputText(output) {
  if (typeof output === 'string') return output;
  if (output?.type === 'text') return output.text;
  return JSON.stringify(output);
}

/** The function call results of a request's input. @param {any} request */
export function resultsOf(request) {
  return Array.isArray(request.input) ? request.input.filter((i) => i.type === 'function_call_result') : [];
}

/**
 * The scripted model: four answers at most (a call beyond them throws
 * UnexpectedModelCallError), each read from the conversation.
 */
function invoiceModel() {
  const respond = (/** @type {any} */ call) => {
    const results = resultsOf(call.request);
    if (results.length === 0) {
      return [
        functionCall('pay_invoice', { invoice: 'INV-9', amount: 4200 }, { callId: 'call_pay' }),
        functionCall('send_email', { to: 'ap@acme.test', subject: 'INV-9 paid' }, { callId: 'call_email' }),
      ];
    }
    return [assistantMessage(`done: ${results.map((r) => `${r.name}=${outputText(r.output)}`).join('; ')}`)];
  };
  return new ScriptedModel(Array.from({ length: 4 }, () => modelResponder(respond)));
}

/**
 * The two tools, on the effects server at `url`.
 * @param {string} url
 * @param {{log?: (line: string) => void, needsApproval?: boolean, payName?: string}} [options]
 */
function invoiceTools(url, { log = () => {}, needsApproval = false, payName } = {}) {
  const pay = ledgerTool({
    name: 'pay_invoice',
    description: 'Pay an invoice',
    parameters: z.object({ invoice: z.string(), amount: z.number() }),
    needsApproval,
    ...(payName ? { ledgerName: payName } : {}),
    execute: async (input, _ctx, details) => {
      log(`paying ${input.invoice} key=${details.idempotencyKey}`);
      const receipt = await makeEffect(url, 'pay', input, /** @type {string} */ (details.idempotencyKey));
      log(`paid ${receipt.id}`);
      return receipt;
    },
  });
  const email = ledgerTool({
    name: 'send_email',
    description: 'Send an e-mail',
    parameters: z.object({ to: z.string(), subject: z.string() }),
    execute: async (input, _ctx, details) => {
      log(`emailing ${input.to} key=${details.idempotencyKey}`);
      const receipt = await makeEffect(url, 'email', input, /** @type {string} */ (details.idempotencyKey));
      log(`emailed ${receipt.id}`);
      return receipt;
    },
  });
  return { pay, email };
}

/**
 * The agent: the two tools and the recorded scripted model.
 * @param {string} url
 * @param {{log?: (line: string) => void, needsApproval?: boolean, payName?: string}} [options]
 */
export function invoiceAgent(url, options = {}) {
  const scripted = invoiceModel();
  const { pay, email } = invoiceTools(url, options);
  const agent = new Agent({
    name: 'accounts-payable',
    instructions: 'You pay invoices and tell accounts payable.',
    tools: [pay, email],
    model: ledgerModel(scripted),
  });
  return { agent, scripted };
}
