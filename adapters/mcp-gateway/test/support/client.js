// An MCP client in a process of its own (the tests SIGKILL it in the middle of a call):
// connects to the gateway at URL -- or starts one over stdio, "stdio:CONFIG" (the gateway's
// bin with --config CONFIG, as an agent host starts an MCP server) --, makes the calls of one
// step at once in RUN, and prints each result as a line "result NAME JSON".  A call's "meta"
// is more of its _meta (its own id: {"durable-ledger/call-id": "call_1"}).
//
//   node client.js URL RUN '[{"name": "pay_invoice", "arguments": {...}, "meta"?: {...}}, ...]'
import { fileURLToPath } from 'node:url';
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';

const [url, run, calls] = process.argv.slice(2);
const client = new Client({ name: 'gateway-test-client', version: '1.0.0' });
const bin = fileURLToPath(new URL('../../bin/durable-ledger-mcp-gateway.js', import.meta.url));
await client.connect(url.startsWith('stdio:')
  ? new StdioClientTransport({ command: process.execPath, args: [bin, '--config', url.slice(6)], env: /** @type {Record<string, string>} */ (process.env), stderr: 'inherit' })
  : new StreamableHTTPClientTransport(new URL(url)));
console.log('connected');
await Promise.all(JSON.parse(calls).map(async (c) => {
  const result = await client.callTool({ name: c.name, arguments: c.arguments, _meta: { 'durable-ledger/run': run, ...(c.meta ?? {}) } });
  console.log(`result ${c.name} ${JSON.stringify(result)}`);
}));
await client.close();
