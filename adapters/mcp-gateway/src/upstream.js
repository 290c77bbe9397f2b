// One upstream MCP server: the gateway's own MCP client to it (stdio: a child process
// the gateway starts; Streamable HTTP: a URL), its tools, and calls to them.  A server
// that went away (its process ended, its connection broke) is connected again on the
// next call or listing -- never in the middle of a call: a call whose connection broke
// has an unknown outcome, which the ledger keeps for a person.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport, getDefaultEnvironment } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema } from '@modelcontextprotocol/sdk/types.js';

/** @typedef {import('./config.js').ServerSpec} ServerSpec */
/** @typedef {import('@modelcontextprotocol/sdk/types.js').Tool} Tool */
/** @typedef {import('@modelcontextprotocol/sdk/types.js').CallToolResult} CallToolResult */
/** @typedef {import('@modelcontextprotocol/sdk/shared/protocol.js').RequestOptions} RequestOptions */

/** The gateway's name and version as its MCP clients tell upstream servers. */
const CLIENT_INFO = { name: 'durable-ledger-mcp-gateway', version: '1.3.0' };

export class Upstream {
  /**
   * @param {ServerSpec} spec
   * @param {{onToolsChanged?: () => void}} [hooks]
   */
  constructor(spec, hooks = {}) {
    this.spec = spec;
    this.#hooks = hooks;
  }

  #hooks;
  /** @type {Client | null} */
  #client = null;
  /** @type {Promise<Client> | null} */
  #connecting = null;
  /** @type {Tool[]} the tools it listed last */
  tools = [];

  get name() {
    return this.spec.name;
  }

  /**
   * The connected client, connecting first when there is none.
   * @returns {Promise<Client>}
   */
  client() {
    if (this.#client) return Promise.resolve(this.#client);
    this.#connecting ??= this.#connect().finally(() => { this.#connecting = null; });
    return this.#connecting;
  }

  /** @returns {Promise<Client>} */
  async #connect() {
    const { spec } = this;
    const client = new Client(CLIENT_INFO, { capabilities: {} });
    const transport = spec.transport === 'stdio'
      ? new StdioClientTransport({
        command: /** @type {string} */ (spec.command),
        args: spec.args,
        env: { ...getDefaultEnvironment(), ...spec.env },
        cwd: spec.cwd ?? undefined,
        stderr: 'inherit',
      })
      : new StreamableHTTPClientTransport(new URL(/** @type {string} */ (spec.url)),
        { requestInit: { headers: spec.headers } });
    client.onclose = () => {
      if (this.#client === client) this.#client = null;
    };
    client.onerror = () => {}; // a broken connection shows as onclose and as the calls' errors
    client.fallbackNotificationHandler = async (n) => {
      if (n.method === 'notifications/tools/list_changed') this.#hooks.onToolsChanged?.();
    };
    try {
      await client.connect(transport, { timeout: spec.timeout });
    } catch (err) {
      await client.close().catch(() => {});
      throw new Error(`upstream server ${spec.name}: cannot connect: ${/** @type {Error} */ (err).message}`,
        { cause: err });
    }
    this.#client = client;
    return client;
  }

  /**
   * Lists its tools (every page), and keeps them.
   * @returns {Promise<Tool[]>}
   */
  async listTools() {
    const client = await this.client();
    /** @type {Tool[]} */
    const tools = [];
    /** @type {string | undefined} */
    let cursor;
    do {
      const page = await client.listTools(cursor === undefined ? {} : { cursor }, { timeout: this.spec.timeout });
      tools.push(...page.tools);
      cursor = page.nextCursor;
    } while (cursor !== undefined);
    this.tools = tools;
    return tools;
  }

  /**
   * Calls one of its tools, on the client connected now (none: connect first).
   * @param {{name: string, arguments?: Record<string, unknown>, _meta?: Record<string, unknown>}} params
   * @param {RequestOptions} [options]
   * @returns {Promise<CallToolResult>}
   */
  async callTool(params, options = {}) {
    const client = await this.client();
    return /** @type {Promise<CallToolResult>} */ (client.request({ method: 'tools/call', params },
      CallToolResultSchema, { timeout: this.spec.timeout, ...options }));
  }

  /** Closes its client (a stdio server's process ends). */
  async close() {
    const client = this.#client ?? (this.#connecting ? await this.#connecting.catch(() => null) : null);
    this.#client = null;
    await client?.close();
  }
}
