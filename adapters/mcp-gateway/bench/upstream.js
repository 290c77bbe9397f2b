// The upstream of the gateway's bench: an MCP server over stdio whose tools answer at
// once and do nothing, so that what is measured is the path of a call, not a tool.
//   pay {invoice, amount}   (the gateway's configuration makes it side-effecting)
//   lookup {invoice}        (read-only)
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { CallToolRequestSchema, ListToolsRequestSchema } from '@modelcontextprotocol/sdk/types.js';

const schema = { type: 'object', properties: { invoice: { type: 'string' }, amount: { type: 'number' } } };
const server = new Server({ name: 'bench-upstream', version: '1.0.0' }, { capabilities: { tools: {} } });
server.setRequestHandler(ListToolsRequestSchema, async () => ({
  tools: [{ name: 'pay', inputSchema: schema }, { name: 'lookup', inputSchema: schema }],
}));
server.setRequestHandler(CallToolRequestSchema, async ({ params }) => ({
  content: [{ type: 'text', text: `${params.name} ${params.arguments?.invoice ?? ''}` }],
}));
await server.connect(new StdioServerTransport());
process.stdin.on('end', () => process.exit(0));
