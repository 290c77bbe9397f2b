// The upstream MCP server of the gateway's tests: a bank and a mailer whose every tool
// call is one request to the effects server (adapters/test-support/effects-server.js,
// EFFECTS_URL), so that the test's process counts every call the upstream got, across
// kills of the gateway and of this server.  stdio by default; --http PORT serves
// Streamable HTTP at /mcp (one session per client), printing "listening on URL".
//
//   pay_invoice {invoice, amount, memo?}  POST /pay with the idempotency key of the
//       request's _meta["durable-ledger/idempotency-key"]; amount <= 0 is refused with
//       JSON-RPC invalid params (nothing done); memo "invalid after paying" pays, then
//       answers JSON-RPC invalid params (as an older SDK McpServer did when a handler's
//       answer failed its outputSchema)
//   send_email {to, subject, idempotency_key}  POST /email with the key of its argument
//   lookup_invoice {invoice}  POST /lookup (a read); answers the request's _meta as it came
//
// GATE_URL and GATE_OPS=pay,email: after making the effect, the tool waits at the
// test's gate (test/support/gate.js) before it answers.  TOOL_PREFIX: put before every
// tool's name it lists (and taken off the names it is called by).
import http from 'node:http';
import { randomUUID } from 'node:crypto';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import {
  CallToolRequestSchema, ErrorCode, ListToolsRequestSchema, McpError, isInitializeRequest,
} from '@modelcontextprotocol/sdk/types.js';
import { makeEffect } from '../../../test-support/effects-server.js';

const EFFECTS_URL = process.env.EFFECTS_URL;
const GATE_URL = process.env.GATE_URL;
const GATE_OPS = new Set((process.env.GATE_OPS ?? '').split(',').filter(Boolean));
if (!EFFECTS_URL) throw new Error('EFFECTS_URL is not set');
const TOOL_PREFIX = process.env.TOOL_PREFIX ?? '';

const TOOLS = [
  {
    name: 'pay_invoice',
    description: 'Pay an invoice',
    inputSchema: {
      type: 'object',
      properties: { invoice: { type: 'string' }, amount: { type: 'number' }, memo: { type: 'string' } },
      required: ['invoice', 'amount'],
    },
  },
  {
    name: 'send_email',
    description: 'Send an e-mail',
    inputSchema: {
      type: 'object',
      properties: { to: { type: 'string' }, subject: { type: 'string' }, idempotency_key: { type: 'string' } },
      required: ['to', 'subject', 'idempotency_key'],
    },
  },
  {
    name: 'lookup_invoice',
    description: 'Look an invoice up',
    inputSchema: { type: 'object', properties: { invoice: { type: 'string' } }, required: ['invoice'] },
    annotations: { readOnlyHint: true },
  },
];

async function effect(op, body, key) {
  const call = await makeEffect(EFFECTS_URL, op, { ...body, pid: process.pid }, key);
  if (GATE_URL && GATE_OPS.has(op)) await fetch(`${GATE_URL}/${op}`);
  return call;
}

function server() {
  const s = new Server({ name: 'bank', version: '1.0.0' }, { capabilities: { tools: {} } });
  s.setRequestHandler(ListToolsRequestSchema, async () => ({
    tools: TOOLS.map((t) => ({ ...t, name: `${TOOL_PREFIX}${t.name}` })),
  }));
  s.setRequestHandler(CallToolRequestSchema, async ({ params }) => {
    const args = params.arguments ?? {};
    const meta = params._meta ?? {};
    switch (params.name.startsWith(TOOL_PREFIX) ? params.name.slice(TOOL_PREFIX.length) : params.name) {
      case 'pay_invoice': {
        if (!(args.amount > 0)) throw new McpError(ErrorCode.InvalidParams, 'amount must be positive');
        const key = meta['durable-ledger/idempotency-key'] ?? 'none';
        const call = await effect('pay', { invoice: args.invoice, amount: args.amount, memo: args.memo ?? null }, key);
        if (args.memo === 'invalid after paying') {
          throw new McpError(ErrorCode.InvalidParams, 'Output validation error: Tool pay_invoice has an output schema ' +
            'but no structured content was provided');
        }
        return {
          content: [{ type: 'text', text: `paid ${args.invoice}: ${call.id}` }],
          structuredContent: { payment: call.id, key },
        };
      }
      case 'send_email': {
        const call = await effect('email', { to: args.to, subject: args.subject }, args.idempotency_key ?? 'none');
        return { content: [{ type: 'text', text: `sent to ${args.to}: ${call.id}` }], structuredContent: { email: call.id } };
      }
      case 'lookup_invoice': {
        await effect('lookup', { invoice: args.invoice }, 'none');
        return {
          content: [{ type: 'text', text: `${args.invoice}: 4200 USD, open` }],
          structuredContent: { invoice: args.invoice, amount: 4200, meta },
        };
      }
      default:
        throw new McpError(ErrorCode.InvalidParams, `Unknown tool: ${params.name}`);
    }
  });
  return s;
}

const port = process.argv[2] === '--http' ? Number(process.argv[3] ?? 0) : null;
if (port === null) {
  await server().connect(new StdioServerTransport());
  process.stdin.on('end', () => process.exit(0));
  process.stdin.on('close', () => process.exit(0));
} else {
  const sessions = new Map();
  const httpServer = http.createServer(async (req, res) => {
    const chunks = [];
    for await (const c of req) chunks.push(c);
    const body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString('utf8')) : undefined;
    const sid = req.headers['mcp-session-id'];
    let transport = sid ? sessions.get(sid) : undefined;
    if (!transport) {
      if (!isInitializeRequest(body)) { res.writeHead(400).end(); return; }
      transport = new StreamableHTTPServerTransport({
        sessionIdGenerator: () => randomUUID(),
        onsessioninitialized: (id) => { sessions.set(id, transport); },
      });
      await server().connect(transport);
    }
    await transport.handleRequest(req, res, body);
  });
  httpServer.listen(port, '127.0.0.1', () => {
    console.log(`listening on http://127.0.0.1:${httpServer.address().port}/mcp`);
  });
}
