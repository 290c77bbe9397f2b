// The agent of the adapter's tests: the custom tools of a Claude Agent SDK agent -- a bank
// and a mailer whose every call is a request to the effects server (EFFECTS_URL,
// adapters/test-support) -- on an in-process SDK MCP server, and a scripted stand-in for
// Claude that calls them as the Claude Code CLI does: an MCP client connected in memory to
// the server's own instance (createSdkMcpServer(...).instance; the CLI and a model cannot
// run offline).  Its script is a list of steps, each a set of tool calls made at once (two
// in one step, as a model's parallel tool use); a tool error that stops the run ends its
// turn, as the error tells it to.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { InMemoryTransport } from '@modelcontextprotocol/sdk/inMemory.js';
import { z } from 'zod';
import { EffectDidNotHappen } from 'durable-ledger';
import { ledgerTool } from '../../src/index.js';
import { makeEffect } from '../../../test-support/effects-server.js';

/**
 * The tools, against the effects server at `url`.
 * @param {string} url
 */
export function billingTools(url) {
  return [
    ledgerTool('pay_invoice', 'Pay an invoice', { invoice: z.string(), amount: z.number() },
      async ({ invoice, amount }, { idempotencyKey }) => {
        if (amount <= 0) throw new EffectDidNotHappen({ message: 'amount must be positive' });
        const paid = await makeEffect(url, 'pay', { invoice, amount }, /** @type {string} */ (idempotencyKey));
        return { content: [{ type: 'text', text: `paid ${invoice}: ${paid.id}` }] };
      }),
    ledgerTool('send_email', 'Send an e-mail', { to: z.string(), subject: z.string() },
      async ({ to, subject }, { idempotencyKey }) => {
        const sent = await makeEffect(url, 'email', { to, subject }, /** @type {string} */ (idempotencyKey));
        return { content: [{ type: 'text', text: `sent to ${to}: ${sent.id}` }] };
      }),
    ledgerTool('lookup_invoice', 'Look an invoice up', { invoice: z.string() },
      async ({ invoice }) => {
        const found = await makeEffect(url, 'lookup', { invoice }, 'none');
        return { content: [{ type: 'text', text: `${invoice}: 4200 USD, open (${found.id})` }] };
      }, { readOnly: 'record' }),
    ledgerTool('bank_status', 'The bank\'s status', {},
      async () => {
        const seen = await makeEffect(url, 'status', {}, 'none');
        return { content: [{ type: 'text', text: `bank up (${seen.id})` }] };
      }, { readOnly: 'pass' }),
  ];
}

/** The steps of the invoice story: look the invoice up, then pay it and mail the receipt at once. */
export function invoiceScript(invoice) {
  return [
    [{ name: 'lookup_invoice', arguments: { invoice } }],
    [{ name: 'pay_invoice', arguments: { invoice, amount: 4200 } },
      { name: 'send_email', arguments: { to: 'ap@acme.example', subject: `${invoice} paid` } }],
  ];
}

/**
 * Plays a script against an SDK MCP server as the CLI would: connects an MCP client to the
 * server's instance in memory, makes each step's calls at once, and stops after a step
 * with a tool error that stopped the run (its text says to end the turn).
 * @param {import('@anthropic-ai/claude-agent-sdk').McpSdkServerConfigWithInstance} server
 * @param {Array<Array<{name: string, arguments: object}>>} script
 * @param {(name: string, result: any) => void} [onResult]
 * @returns {Promise<Array<{name: string, result: any}>>}
 */
export async function playScript(server, script, onResult = () => {}) {
  const [clientSide, serverSide] = InMemoryTransport.createLinkedPair();
  await server.instance.connect(serverSide);
  const client = new Client({ name: 'scripted-claude', version: '1.0.0' });
  await client.connect(clientSide);
  const results = [];
  try {
    for (const step of script) {
      const answers = await Promise.all(step.map(async (call) => {
        const result = await client.callTool(call);
        onResult(call.name, result);
        return { name: call.name, result };
      }));
      results.push(...answers);
      if (answers.some((a) => a.result._meta?.['durable-ledger/stop'])) break; // "end your turn"
    }
  } finally {
    await client.close();
  }
  return results;
}
