// Serving the gateway to MCP clients: over stdio (one session: the process's stdin and
// stdout, as an agent host starts an MCP server) or Streamable HTTP (one session per
// client, each with its own Server and transport; sessions without a request for
// sessionIdleTimeout seconds are closed).

import { randomUUID } from 'node:crypto';
import http from 'node:http';
import { StdioServerTransport } from '@modelcontextprotocol/sdk/server/stdio.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { isInitializeRequest } from '@modelcontextprotocol/sdk/types.js';

/** @typedef {import('./gateway.js').Gateway} Gateway */
/** @typedef {import('./gateway.js').GatewaySession} GatewaySession */

/**
 * Serves one session over this process's stdin and stdout.  Resolves once the client has
 * gone (stdin ended) and the session's attempts have ended (their calls in flight recorded).
 * @param {Gateway} gateway
 * @param {{run?: string | null, stdin?: NodeJS.ReadableStream, stdout?: NodeJS.WritableStream}} [options]
 *   run: the run of the calls whose request names none (default mcp-session-<a new UUID>)
 * @returns {Promise<void>}
 */
export async function serveStdio(gateway, { run = null, stdin = process.stdin, stdout = process.stdout } = {}) {
  const label = `stdio-${randomUUID()}`;
  const session = gateway.session(label, run);
  const transport = new StdioServerTransport(/** @type {any} */ (stdin), /** @type {any} */ (stdout));
  // a client that died leaves a broken pipe: the answer is lost, the record is not
  stdout.on('error', () => {});
  const server = gateway.server(session);
  const gone = new Promise((resolve) => {
    stdin.once('end', resolve);
    stdin.once('close', resolve);
    server.onclose = () => resolve(undefined);
  });
  await server.connect(transport);
  await gone;
  await session.close();
  await server.close().catch(() => {});
}

/**
 * @typedef {object} HttpGateway
 * @property {string} url  the MCP endpoint (http://host:port/mcp)
 * @property {http.Server} server
 * @property {Map<string, {session: GatewaySession, transport: StreamableHTTPServerTransport}>} sessions
 * @property {() => Promise<void>} close  stops listening, closes every session
 */

/**
 * Serves the gateway over Streamable HTTP at /mcp.
 * @param {Gateway} gateway
 * @param {{port?: number, host?: string}} [options]
 * @returns {Promise<HttpGateway>}
 */
export async function serveHttp(gateway, { port = 0, host = '127.0.0.1' } = {}) {
  /** @type {HttpGateway['sessions']} */
  const sessions = new Map();

  /** @param {string} id */
  const closeSession = async (id) => {
    const s = sessions.get(id);
    if (!s) return;
    sessions.delete(id);
    await s.session.close();
  };

  const server = http.createServer((req, res) => {
    handle(req, res).catch((err) => {
      if (!res.headersSent) {
        res.writeHead(500, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32603, message: String(err?.message ?? err) }, id: null }));
      }
    });
  });

  /**
   * @param {http.IncomingMessage} req
   * @param {http.ServerResponse} res
   */
  async function handle(req, res) {
    const url = new URL(req.url ?? '/', 'http://gateway');
    if (url.pathname !== '/mcp') {
      res.writeHead(404).end();
      return;
    }
    const id = req.headers['mcp-session-id'];
    const known = typeof id === 'string' ? sessions.get(id) : undefined;
    if (known) {
      known.session.lastRequest = Date.now();
      await known.transport.handleRequest(req, res, req.method === 'POST' ? await body(req) : undefined);
      return;
    }
    if (id !== undefined) {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32001, message: 'Session not found' }, id: null }));
      return;
    }
    const parsed = req.method === 'POST' ? await body(req) : undefined;
    if (!isInitializeRequest(parsed)) {
      res.writeHead(400, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message: 'Bad Request: no session' }, id: null }));
      return;
    }
    // the session's id is chosen here, so that the session exists before its first request
    const sid = randomUUID();
    const session = gateway.session(sid);
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => sid,
      onsessioninitialized: () => { sessions.set(sid, { session, transport }); },
    });
    transport.onclose = () => {
      if (sessions.has(sid)) closeSession(sid).catch(() => {});
      else session.close().catch(() => {});
    };
    const mcp = gateway.server(session);
    await mcp.connect(transport);
    await transport.handleRequest(req, res, parsed);
    if (!sessions.has(sid)) await session.close(); // initialize failed
  }

  const sweep = setInterval(() => {
    const idle = gateway.config.sessionIdleTimeout * 1000;
    for (const [id, s] of sessions) {
      if (s.session.inflight === 0 && Date.now() - s.session.lastRequest > idle) {
        s.transport.close().catch(() => {});
        closeSession(id).catch(() => {});
      }
    }
  }, Math.min(60000, Math.max(1000, gateway.config.sessionIdleTimeout * 250)));
  sweep.unref();

  await new Promise((resolve) => server.listen(port, host, () => resolve(undefined)));
  const address = /** @type {import('node:net').AddressInfo} */ (server.address());
  return {
    url: `http://${host}:${address.port}/mcp`,
    server,
    sessions,
    close: async () => {
      clearInterval(sweep);
      await Promise.all([...sessions.keys()].map(async (id) => {
        const s = sessions.get(id);
        await s?.transport.close().catch(() => {});
        await closeSession(id);
      }));
      server.closeAllConnections();
      await new Promise((resolve) => server.close(() => resolve(undefined)));
    },
  };
}

/**
 * A request's JSON body.
 * @param {http.IncomingMessage} req
 * @returns {Promise<unknown>}
 */
async function body(req) {
  const chunks = [];
  for await (const chunk of req) chunks.push(chunk);
  const text = Buffer.concat(chunks).toString('utf8');
  if (text === '') return undefined;
  try {
    return JSON.parse(text);
  } catch {
    return text; // the transport answers a parse error
  }
}
