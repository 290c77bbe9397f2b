// Serving the gateway to MCP clients: over stdio (one session: the process's stdin and
// stdout, as an agent host starts an MCP server) or Streamable HTTP (one session per
// client, each with its own Server and transport; sessions without a request for
// sessionIdleTimeout seconds are closed).

import { randomUUID } from 'node:crypto';
import http from 'node:http';
import { isIP } from 'node:net';
import { hostname, networkInterfaces } from 'node:os';
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
  const session = gateway.session(run);
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
 *
 * DNS-rebinding protection: a request is served only when its Host header names the
 * address the gateway listens on (host:port; on a loopback address also localhost,
 * 127.0.0.1 and [::1] with that port; on a wildcard address the machine's name and
 * addresses) or one of `allowHosts`, and when it has no Origin header (not a browser's) or
 * an Origin of `allowOrigins` -- else 403, before any session is made.  Otherwise a web page
 * whose name resolves to 127.0.0.1 could call the gateway's paying tools.
 * @param {Gateway} gateway
 * @param {{port?: number, host?: string, allowOrigins?: string[], allowHosts?: string[]}} [options]
 *   allowOrigins, allowHosts: added to the configuration's
 * @returns {Promise<HttpGateway>}
 */
export async function serveHttp(gateway, { port = 0, host = '127.0.0.1', allowOrigins = [], allowHosts = [] } = {}) {
  const origins = new Set([...(gateway.config.allowOrigins ?? []), ...allowOrigins].map((o) => o.toLowerCase()));
  /** @type {Set<string>} the Host headers served (filled once the port is known) */
  const hosts = new Set();
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
    const refused = refusal(req, hosts, origins);
    if (refused) {
      res.writeHead(403, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ jsonrpc: '2.0', error: { code: -32000, message: refused }, id: null }));
      return;
    }
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
    const session = gateway.session();
    const transport = new StreamableHTTPServerTransport({
      sessionIdGenerator: () => sid,
      // the SDK's own check too (the gateway's, above, comes first and also checks Origin
      // when no origin is allowed)
      enableDnsRebindingProtection: true,
      allowedHosts: [...hosts],
      allowedOrigins: [...origins],
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
  for (const h of servedHosts(host, address.port, [...(gateway.config.allowHosts ?? []), ...allowHosts])) hosts.add(h);
  return {
    url: `http://${hostPort(host, address.port)}/mcp`,
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
 * `host:port` as a Host header says it ([::1]:port for an IPv6 address).
 * @param {string} host
 * @param {number} port
 */
function hostPort(host, port) {
  return isIP(host) === 6 ? `[${host}]:${port}` : `${host}:${port}`;
}

/**
 * The Host headers a gateway listening on host:port serves.
 * @param {string} host
 * @param {number} port
 * @param {string[]} extra  allowHosts: "name" (any port) or "name:port"
 * @returns {string[]}
 */
function servedHosts(host, port, extra) {
  const names = new Set([host.toLowerCase()]);
  const loopback = ['127.0.0.1', 'localhost', '::1'];
  if (loopback.includes(host.toLowerCase()) || host.startsWith('127.')) for (const n of loopback) names.add(n);
  if (host === '0.0.0.0' || host === '::') {
    for (const n of loopback) names.add(n);
    names.add(hostname().toLowerCase());
    for (const list of Object.values(networkInterfaces())) {
      for (const a of list ?? []) names.add(a.address.toLowerCase());
    }
  }
  const served = [...names].map((n) => hostPort(n, port));
  for (const e of extra) {
    const h = e.toLowerCase();
    served.push(/:\d+$/.test(h) && !/^[^[]*:.*:/.test(h) ? h : hostPort(h.replace(/^\[|\]$/g, ''), port));
  }
  return served;
}

/**
 * Why a request is refused (DNS rebinding: a Host that is not the gateway's; a browser's
 * Origin that is not allowed), or null.
 * @param {http.IncomingMessage} req
 * @param {Set<string>} hosts
 * @param {Set<string>} origins
 * @returns {string | null}
 */
function refusal(req, hosts, origins) {
  const host = req.headers.host?.toLowerCase();
  if (!host || !hosts.has(host)) {
    return `Forbidden: the Host header ${JSON.stringify(req.headers.host ?? '')} is not this gateway's ` +
      '(give it with --allow-host, or allowHosts in the configuration)';
  }
  const origin = req.headers.origin;
  if (origin !== undefined && !origins.has(origin.toLowerCase())) {
    return `Forbidden: the Origin ${JSON.stringify(origin)} is not allowed ` +
      '(give it with --allow-origin, or allowOrigins in the configuration)';
  }
  return null;
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
