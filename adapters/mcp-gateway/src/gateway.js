// The gateway: the tools of its upstream servers offered as its own, each call of a
// side-effecting one made through the ledger (guardedTool, in the session's attempt at
// the call's run), each call of a read-only one passed straight through.
//
//   const gateway = await Gateway.start(config, { ledger });
//   const session = gateway.session();                 one per MCP connection
//   await gateway.server(session).connect(transport);  a low-level MCP Server for it
//   ...
//   await session.close(); await gateway.close();

import { randomUUID } from 'node:crypto';
import { Server } from '@modelcontextprotocol/sdk/server/index.js';
import {
  CallToolRequestSchema, ErrorCode, ListToolsRequestSchema, McpError,
} from '@modelcontextprotocol/sdk/types.js';
import {
  EffectDidNotHappen, EffectFailed, EffectInProgress, LedgerError, LedgerRefused, RunBusy,
} from 'durable-ledger';
import { ToolCallStopped, guardedTool, toolError } from 'durable-ledger/agents';
import { CALL_ID_META, KEY_META, META_PREFIX, RUN_META, ruleOf } from './config.js';
import { RunRegistry, RunStopped, SessionRuns } from './runs.js';
import { Upstream } from './upstream.js';

/** @typedef {import('durable-ledger').Ledger} Ledger */
/** @typedef {import('durable-ledger/agents').Stop} Stop */
/** @typedef {import('./config.js').GatewayConfig} GatewayConfig */
/** @typedef {import('./config.js').ToolRule} ToolRule */
/** @typedef {import('@modelcontextprotocol/sdk/types.js').Tool} Tool */
/** @typedef {import('@modelcontextprotocol/sdk/types.js').CallToolResult} CallToolResult */
/** @typedef {import('@modelcontextprotocol/sdk/types.js').CallToolRequest} CallToolRequest */
/** @typedef {import('@modelcontextprotocol/sdk/types.js').ServerRequest} ServerRequest */
/** @typedef {import('@modelcontextprotocol/sdk/types.js').ServerNotification} ServerNotification */
/**
 * @typedef {import('@modelcontextprotocol/sdk/shared/protocol.js').RequestHandlerExtra<ServerRequest, ServerNotification>} Extra
 */

/**
 * The MCP SDK's own JSON Schema validator (ajv, which the SDK depends on: no dependency of
 * the gateway's), imported by a name TypeScript does not follow: its declarations do not
 * compile without skipLibCheck.
 * @typedef {{getValidator(schema: object): (input: unknown) => {valid: boolean, errorMessage?: string}}} SchemaValidator
 */
const AJV_PROVIDER = '@modelcontextprotocol/sdk/validation/ajv';
/** @type {new () => SchemaValidator} */
const AjvJsonSchemaValidator = (await import(AJV_PROVIDER)).AjvJsonSchemaValidator;

/** The `_meta` keys the gateway adds to the results of side-effecting tools. */
export const RESULT_META = {
  run: 'durable-ledger/run',
  replayed: 'durable-ledger/replayed',
  stop: 'durable-ledger/stop',
};

/**
 * One tool the gateway offers.
 * @typedef {object} Entry
 * @property {string} name  its name as the gateway offers it (the server's prefix + the upstream name)
 * @property {Upstream} upstream
 * @property {Tool} tool  as the upstream server lists it
 * @property {ToolRule} rule
 * @property {((args: unknown) => string | null) | null} check  what is wrong with a call's
 *   arguments by the tool's input schema (as the gateway lists it), or null; null: no check
 *   (a schema the validator cannot compile)
 */

/** An MCP session of the gateway: its runs and the run of a call that names none. */
export class GatewaySession {
  /**
   * @param {Gateway} gateway
   * @param {string} defaultRun  the run of a call whose request names none
   */
  constructor(gateway, defaultRun) {
    this.gateway = gateway;
    /**
     * the session's public name (the lease's holder, the ledger's records, messages): not
     * derived from an HTTP session's Mcp-Session-Id, its only credential, which the gateway
     * neither keeps here nor shows anyone
     */
    this.name = `session-${randomUUID()}`;
    this.defaultRun = defaultRun;
    this.runs = new SessionRuns(gateway.registry, this.name);
    /**
     * @type {Map<string, Promise<CallToolResult>>} side-effecting calls the client cancelled
     * while they ran (its request timed out), by what the call was: the session's next
     * identical call is answered with that call's answer instead of being made again
     */
    this.cancelled = new Map();
    /** when a request of the session arrived last (Date.now()) */
    this.lastRequest = Date.now();
    /** calls of the session in flight */
    this.inflight = 0;
  }

  /** Ends the session's attempts (their calls in flight are recorded first). */
  close() {
    this.gateway.sessions.delete(this);
    return this.runs.close();
  }
}

export class Gateway {
  /**
   * @param {GatewayConfig} config
   * @param {Ledger} ledger  a Ledger on a pg.Pool (token leases), as a worker role
   * @param {Upstream[]} upstreams
   */
  constructor(config, ledger, upstreams) {
    this.config = config;
    this.ledger = ledger;
    this.upstreams = upstreams;
    this.registry = new RunRegistry(ledger, config.ledger);
    /** @type {Map<string, Entry>} the tools it offers, by name */
    this.tools = new Map();
    /** @type {string[]} what the gateway found wrong but not fatal (also written to stderr) */
    this.warnings = [];
    /** @type {Set<GatewaySession>} */
    this.sessions = new Set();
    /** @type {Set<Server>} the servers of its sessions (told when the tools change) */
    this.servers = new Set();
  }

  /**
   * Connects to every upstream server, lists their tools and checks the ledger's registry
   * against the configuration's key fields.
   * @param {GatewayConfig} config
   * @param {{ledger: Ledger, warn?: (message: string) => void}} options
   * @returns {Promise<Gateway>}
   */
  static async start(config, { ledger, warn = (m) => console.error(`durable-ledger-mcp-gateway: ${m}`) }) {
    /** @type {Gateway} */
    let gateway;
    const upstreams = config.servers.map((spec) => new Upstream(spec, {
      onToolsChanged: () => { gateway.refreshTools().catch((err) => gateway.#warn(String(err?.message ?? err))); },
    }));
    gateway = new Gateway(config, ledger, upstreams);
    gateway.#warnTo = warn;
    try {
      await gateway.refreshTools();
      await gateway.checkRegistry();
    } catch (err) {
      await gateway.close();
      throw err;
    }
    return gateway;
  }

  /** @type {(message: string) => void} */
  #warnTo = () => {};

  /** @param {string} message */
  #warn(message) {
    this.warnings.push(message);
    this.#warnTo(message);
  }

  /**
   * Lists the tools of every upstream server again and makes them the gateway's.
   * Two servers offering one name is an error (give one a prefix).
   */
  async refreshTools() {
    const lists = await Promise.all(this.upstreams.map(async (u) => [u, await u.listTools()]));
    /** @type {Map<string, Entry>} */
    const tools = new Map();
    /** @type {Map<string, Entry>} the side-effecting tools by their name in the ledger */
    const ledgerNames = new Map();
    for (const [upstream, list] of /** @type {Array<[Upstream, Tool[]]>} */ (lists)) {
      for (const tool of list) {
        const name = `${upstream.spec.prefix}${tool.name}`;
        const taken = tools.get(name);
        if (taken) {
          throw new Error(`the tool ${name} is offered by the upstream servers ${taken.upstream.name} and ` +
            `${upstream.name}: give one of them a "prefix" in the configuration`);
        }
        const rule = ruleOf(upstream.spec, tool.name);
        const entry = { name, upstream, tool, rule, check: rule.sideEffecting ? this.#checker(name, tool, rule) : null };
        if (rule.sideEffecting) {
          // two tools of one name in the ledger would replay each other's calls
          const same = ledgerNames.get(rule.ledgerTool);
          if (same) {
            throw new Error(`the tools ${same.name} (server ${same.upstream.name}, tool ${same.tool.name}) and ${name} ` +
              `(server ${upstream.name}, tool ${tool.name}) have one name in the ledger, ${rule.ledgerTool}: ` +
              'their calls would replay each other\'s; give one of them a "ledgerTool" in the configuration ' +
              '(or rename a server)');
          }
          ledgerNames.set(rule.ledgerTool, entry);
        }
        tools.set(name, entry);
      }
      for (const listed of upstream.spec.tools.keys()) {
        if (!list.some((t) => t.name === listed) && !this.warnings.some((w) => w.includes(`"${listed}"`))) {
          this.#warn(`servers.${upstream.name}.tools names "${listed}", which the server does not offer`);
        }
      }
    }
    const changed = this.tools.size > 0;
    this.tools = tools;
    if (changed) {
      for (const server of this.servers) server.sendToolListChanged().catch(() => {});
    }
  }

  /**
   * Checks, for each side-effecting tool, that the ledger's registry names the key fields
   * the configuration names (register_tool's key_fields: the ledger derives a call's key
   * from them), by asking effect_key -- a worker's function -- how keys of probe arguments
   * differ.  A difference is a warning, with the statement an admin runs.
   * @returns {Promise<string[]>} the warnings it gave
   */
  async checkRegistry() {
    const found = [];
    for (const entry of this.tools.values()) {
      if (!entry.rule.sideEffecting) continue;
      const problem = await registryProblem(this.ledger, entry.rule);
      if (problem) {
        const message = `the ledger's tool ${entry.rule.ledgerTool} (${entry.name}): ${problem}`;
        found.push(message);
        this.#warn(message);
      }
    }
    return found;
  }

  /** The tools as the gateway offers them. @returns {Tool[]} */
  listTools() {
    return [...this.tools.values()].map((e) => ({
      ...e.tool,
      name: e.name,
      inputSchema: listedSchema(e.tool, e.rule),
      _meta: { ...(e.tool._meta ?? {}), 'durable-ledger/side-effecting': e.rule.sideEffecting },
    }));
  }

  /** @type {SchemaValidator | null} */
  #validator = null;

  /**
   * The check of a side-effecting tool's arguments against its input schema (as listed),
   * made before its intent is recorded: arguments the upstream would refuse as invalid
   * params are refused here, nothing recorded, nothing sent -- so that an upstream's
   * -32602 need not mean "nothing was done" (a handler may throw it after its effect).
   * @param {string} name
   * @param {Tool} tool
   * @param {ToolRule} rule
   * @returns {Entry['check']}
   */
  #checker(name, tool, rule) {
    this.#validator ??= new AjvJsonSchemaValidator();
    try {
      const validate = this.#validator.getValidator(/** @type {any} */ (listedSchema(tool, rule)));
      return (args) => {
        const r = validate(args);
        return r.valid ? null : (r.errorMessage ?? 'invalid');
      };
    } catch (err) {
      this.#warn(`the input schema of ${name} cannot be compiled (${/** @type {Error} */ (err).message}): its ` +
        'calls\' arguments are not checked before they are sent upstream');
      return null;
    }
  }

  /**
   * A new MCP session.
   * @param {string | null} [defaultRun]  the run of its calls that name none in `_meta`
   *   (default `mcp-session-<a new UUID>`: never derived from an HTTP session's id, its
   *   credential)
   */
  session(defaultRun = null) {
    const session = new GatewaySession(this, defaultRun ?? `mcp-session-${randomUUID()}`);
    this.sessions.add(session);
    return session;
  }

  /**
   * A low-level MCP Server for one session (one connection: an MCP Server serves one at a
   * time), which lists the gateway's tools and calls them in `session`.
   * @param {GatewaySession} session
   * @returns {Server}
   */
  server(session) {
    const server = new Server({ name: 'durable-ledger-mcp-gateway', version: '1.3.0' },
      { capabilities: { tools: { listChanged: true } } });
    server.setRequestHandler(ListToolsRequestSchema, async () => {
      session.lastRequest = Date.now();
      return { tools: this.listTools() };
    });
    server.setRequestHandler(CallToolRequestSchema, (request, extra) => this.callTool(session, request, extra));
    this.servers.add(server);
    const closed = server.onclose;
    server.onclose = () => {
      this.servers.delete(server);
      closed?.();
    };
    return server;
  }

  /**
   * One tools/call of a session.
   * @param {GatewaySession} session
   * @param {CallToolRequest} request
   * @param {Extra} extra
   * @returns {Promise<CallToolResult>}
   */
  async callTool(session, request, extra) {
    session.lastRequest = Date.now();
    session.inflight += 1;
    try {
      return await this.#callTool(session, request, extra);
    } finally {
      session.inflight -= 1;
      session.lastRequest = Date.now();
    }
  }

  /**
   * @param {GatewaySession} session
   * @param {CallToolRequest} request
   * @param {Extra} extra
   * @returns {Promise<CallToolResult>}
   */
  async #callTool(session, request, extra) {
    const { params } = request;
    let entry = this.tools.get(params.name);
    if (!entry) {
      await this.refreshTools();
      entry = this.tools.get(params.name);
      if (!entry) throw new McpError(ErrorCode.InvalidParams, `Unknown tool: ${params.name}`);
    }
    const meta = params._meta ?? {};
    // the client's _meta goes upstream, but never a key of the gateway's own
    // ("durable-ledger/..."): a client must not hand the upstream a run or an idempotency
    // key of its choosing
    const forwarded = Object.fromEntries(Object.entries(meta)
      .filter(([k]) => k !== 'progressToken' && !k.startsWith(META_PREFIX)));
    const { progressToken } = meta;
    /** @type {import('@modelcontextprotocol/sdk/shared/protocol.js').RequestOptions} */
    const options = progressToken === undefined ? {} : {
      onprogress: (p) => {
        extra.sendNotification({ method: 'notifications/progress', params: { ...p, progressToken } }).catch(() => {});
      },
      resetTimeoutOnProgress: true,
    };
    const upstreamParams = { name: entry.tool.name, ...(params.arguments ? { arguments: params.arguments } : {}) };

    if (!entry.rule.sideEffecting) {
      // straight through: the client's arguments and _meta as they came (its progress
      // token relayed; the gateway's own keys taken out), the server's answer as it came,
      // and its cancellation
      return entry.upstream.callTool({ ...upstreamParams, _meta: forwarded }, { ...options, signal: extra.signal });
    }

    const run = runOf(meta, session);
    const callId = callIdOf(meta);
    const { rule } = entry;
    const args = params.arguments ?? {};
    const missing = (rule.keyFields ?? []).filter((f) => !Object.hasOwn(args, f));
    if (missing.length > 0) {
      return errorResult(`This call was not performed: its arguments lack ${missing.join(', ')}, which make ` +
        `a call of ${entry.name} this call. Call it again with ${missing.length > 1 ? 'them' : 'it'}.`);
    }
    let businessKey = null;
    if (rule.businessKey !== null) {
      try {
        businessKey = fillTemplate(rule.businessKey, args);
      } catch (err) {
        return errorResult(`This call was not performed: ${/** @type {Error} */ (err).message}.`);
      }
    }
    if (entry.check) {
      const wrong = entry.check(args);
      if (wrong !== null) {
        return errorResult(`This call was not performed: its arguments do not match the input schema of ` +
          `${entry.name}: ${wrong}. Call it again with arguments that do.`);
      }
    }
    const before = session.runs.stopOf(run);
    if (before) return stopResult(before, run);
    // The client's retry of a call it cancelled while it ran (its request timed out: the
    // MCP SDK client's default is 60 s) is answered with that call's answer, not made again.
    // (the arguments too with a business key: another call of the key is the ledger's to refuse)
    // (named so only once a call was cancelled: not on every call's path)
    const what = () => JSON.stringify([run, entry.name, callId, businessKey, canonical(keyArgs(rule, args))]);
    const retried = session.cancelled.size > 0 ? what() : null;
    const cancelled = retried === null ? undefined : session.cancelled.get(retried);
    if (cancelled) {
      session.cancelled.delete(/** @type {string} */ (retried));
      const earlier = await cancelled;
      // answered from that call: it was performed once, for the request the client gave up on
      return earlier._meta?.[RESULT_META.replayed] === false
        ? { ...earlier, _meta: { ...earlier._meta, [RESULT_META.replayed]: true } } : earlier;
    }
    const answer = this.#sideEffecting(session, entry, run, callId, businessKey, args, forwarded, options);
    const onAbort = () => { session.cancelled.set(what(), answer); };
    extra.signal.addEventListener('abort', onAbort, { once: true });
    try {
      return await answer;
    } finally {
      extra.signal.removeEventListener('abort', onAbort);
    }
  }

  /**
   * A side-effecting call made through the ledger in the session's attempt at `run`; never
   * rejects (an error is a tool error).
   * @param {GatewaySession} session
   * @param {Entry} entry
   * @param {string} run
   * @param {string | null} callId
   * @param {string | null} businessKey
   * @param {Record<string, unknown>} args
   * @param {Record<string, unknown>} forwarded
   * @param {import('@modelcontextprotocol/sdk/shared/protocol.js').RequestOptions} options
   * @returns {Promise<CallToolResult>}
   */
  async #sideEffecting(session, entry, run, callId, businessKey, args, forwarded, options) {
    const { rule } = entry;
    try {
      // connected before the intent is recorded: a server that cannot be reached is not an
      // unknown outcome
      await entry.upstream.client();
    } catch (err) {
      return errorResult(`This call was not performed: ${/** @type {Error} */ (err).message}. Try again later.`);
    }
    let performed = false;
    try {
      const result = await session.runs.call(run, () => {
        const stopped = session.runs.stopOf(run);
        if (stopped) throw new StoppedBefore(stopped);
        return guardedTool({
          tool: rule.ledgerTool,
          args,
          businessKey,
          callId: businessKey === null ? callId : null,
          meta: { mcp: { server: entry.upstream.name, tool: entry.tool.name, session: session.name, ...(callId ? { call_id: callId } : {}) } },
          perform: async (key) => {
            const upstreamArgs = rule.idempotencyKeyArgument ? { ...args, [rule.idempotencyKeyArgument]: key } : args;
            let answer;
            try {
              answer = await entry.upstream.callTool({
                name: entry.tool.name,
                arguments: upstreamArgs,
                _meta: { ...forwarded, [RUN_META]: run, [KEY_META]: key },
              }, options); // never the client's signal: a call begun is seen to its end
            } catch (err) {
              throw refusedBefore(err, entry.upstream.spec.refusedCodes) ?? err;
            }
            performed = true;
            return answer;
          },
        });
      });
      const recorded = asToolResult(result);
      return { ...recorded, _meta: { ...(recorded._meta ?? {}), [RESULT_META.run]: run, [RESULT_META.replayed]: !performed } };
    } catch (err) {
      if (err instanceof StoppedBefore || err instanceof RunStopped) return stopResult(err.stop, run);
      const shown = toolError(err);
      if (shown instanceof ToolCallStopped) {
        session.runs.stopRun(run, shown.stop);
        return stopResult(shown.stop, run);
      }
      return errorResult(failureText(err, entry.name), { [RESULT_META.run]: run });
    }
  }

  /** Closes every session (their attempts end), then the upstream servers. */
  async close() {
    await Promise.all([...this.sessions].map((s) => s.close()));
    await Promise.all(this.upstreams.map((u) => u.close().catch(() => {})));
  }
}

/** A call of a run its session may call no more (thrown inside the attempt, answered outside). */
class StoppedBefore extends Error {
  /** @param {Stop} stop */
  constructor(stop) {
    super(stop.forModel);
    this.stop = stop;
  }
}

/**
 * The run of a call: `_meta["durable-ledger/run"]` of its request, else its session's.
 * @param {Record<string, unknown>} meta
 * @param {GatewaySession} session
 * @returns {string}
 */
function runOf(meta, session) {
  const run = meta[RUN_META];
  if (run === undefined || run === null) return session.defaultRun;
  if (typeof run !== 'string' || run === '' || run.length > 512) {
    throw new McpError(ErrorCode.InvalidParams,
      `_meta["${RUN_META}"] must be the run's id: a string of 1 to 512 characters`);
  }
  return run;
}

/**
 * The client's own id of the call, `_meta["durable-ledger/call-id"]`, or null: a client
 * that keeps its tool calls' ids across its own resume (a checkpointed tool call) names
 * the call by it, and the gateway keys the call by it instead of by its occurrence
 * (guardedTool's callId), so that a client that continues a run rather than re-running it
 * reaches each call's own effect.
 * @param {Record<string, unknown>} meta
 * @returns {string | null}
 */
function callIdOf(meta) {
  const id = meta[CALL_ID_META];
  if (id === undefined || id === null) return null;
  if (typeof id !== 'string' || id === '' || id.length > 255) {
    throw new McpError(ErrorCode.InvalidParams,
      `_meta["${CALL_ID_META}"] must be the call's own id, kept across the client's resume: a string of 1 to 255 characters`);
  }
  return id;
}

/**
 * An upstream error that says the call was refused before anything was done: a JSON-RPC
 * error answer with one of `codes` (the server's refusedCodes; by default method not found), or a
 * request the client never sent (not connected).  Anything else leaves the outcome unknown.
 * @param {unknown} err
 * @param {number[]} codes
 * @returns {EffectDidNotHappen | null}
 */
function refusedBefore(err, codes) {
  if (err instanceof McpError && codes.includes(err.code)) {
    // the upstream's message already says "MCP error <code>: ", and the client's error again
    const message = err.message.replace(/^(MCP error -?\d+: )+/, '');
    return new EffectDidNotHappen({ code: err.code, message, data: err.data ?? null },
      `the upstream server refused the call (MCP error ${err.code}): ${message}`);
  }
  if (err instanceof Error && err.message === 'Not connected') {
    return new EffectDidNotHappen({ message: 'the upstream server was not connected: the call was not sent' });
  }
  return null;
}

/**
 * What a tool's error says to the model when it is not a stop.
 * @param {unknown} err
 * @param {string} tool
 * @returns {string}
 */
function failureText(err, tool) {
  if (err instanceof EffectFailed) {
    const recorded = /** @type {any} */ (err.error);
    const why = typeof recorded?.message === 'string'
      ? `${recorded.message}${typeof recorded.code === 'number' ? ` (MCP error ${recorded.code})` : ''}`
      : JSON.stringify(recorded);
    return `The call of ${tool} was refused, nothing was done${err.replayed ? ' (as recorded earlier)' : ''}: ${why}`;
  }
  if (err instanceof RunBusy) {
    return `This call was not performed: the run is held by another worker right now (${err.message}). ` +
      'Try again later.';
  }
  if (err instanceof EffectInProgress) {
    return `This call was not performed: another worker is performing this operation right now. Ask again later.`;
  }
  if (err instanceof LedgerRefused) return `This call was not performed: the ledger refused it: ${err.message}`;
  if (err instanceof LedgerError) return `This call was not performed: ${err.message}`;
  return `This call was not performed: the gateway failed: ${/** @type {any} */ (err)?.message ?? String(err)}`;
}

/**
 * A recorded result as a tool's result: what the upstream answered, or what a person
 * recorded when they resolved the call (any JSON: shown as its text).
 * @param {unknown} recorded
 * @returns {CallToolResult}
 */
function asToolResult(recorded) {
  if (typeof recorded === 'object' && recorded !== null && Array.isArray(/** @type {any} */ (recorded).content)) {
    return /** @type {CallToolResult} */ (recorded);
  }
  return { content: [{ type: 'text', text: JSON.stringify(recorded) }] };
}

/**
 * A tool error result.
 * @param {string} text
 * @param {Record<string, unknown>} [meta]
 * @returns {CallToolResult}
 */
function errorResult(text, meta) {
  return { isError: true, content: [{ type: 'text', text }], ...(meta ? { _meta: meta } : {}) };
}

/**
 * The answer to a call that stopped the run: a tool error that tells the model not to call
 * again and says what a person must do (in its text and in `_meta`).
 * @param {Stop} stop
 * @param {string} run
 * @returns {CallToolResult}
 */
export function stopResult(stop, run) {
  return errorResult(`${stop.forModel}\n\nWhat a person must do: ${stop.forPerson}.`, {
    [RESULT_META.run]: run,
    [RESULT_META.stop]: { kind: stop.kind, key: stop.key, forPerson: stop.forPerson },
  });
}

/**
 * Fills a business key template ("invoice-{invoice}") from the call's arguments.
 * @param {string} template
 * @param {Record<string, unknown>} args
 * @returns {string}
 */
function fillTemplate(template, args) {
  return template.replace(/\{([^{}]+)\}/g, (_, field) => {
    const v = args[field];
    if (v === undefined || v === null || typeof v === 'object') {
      throw new Error(`its business key needs the argument ${field} (a string or a number)`);
    }
    return String(v);
  });
}

/**
 * A tool's input schema as the gateway lists it (without the argument it fills in).
 * @param {Tool} tool
 * @param {ToolRule} rule
 * @returns {Tool['inputSchema']}
 */
function listedSchema(tool, rule) {
  return rule.idempotencyKeyArgument ? hideArgument(tool.inputSchema, rule.idempotencyKeyArgument) : tool.inputSchema;
}

/**
 * The arguments that make a call this call: its key fields, else all of them.
 * @param {ToolRule} rule
 * @param {Record<string, unknown>} args
 * @returns {Record<string, unknown>}
 */
function keyArgs(rule, args) {
  return rule.keyFields ? Object.fromEntries(rule.keyFields.map((f) => [f, args[f]])) : args;
}

/**
 * A value as JSON with its objects' keys in order (the same arguments, the same text).
 * @param {unknown} v
 * @returns {string}
 */
function canonical(v) {
  if (Array.isArray(v)) return `[${v.map(canonical).join(',')}]`;
  if (typeof v === 'object' && v !== null) {
    return `{${Object.keys(v).sort().map((k) => `${JSON.stringify(k)}:${canonical(/** @type {any} */ (v)[k])}`).join(',')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}

/**
 * A JSON schema without one property (the idempotency key the gateway fills in).
 * @param {Tool['inputSchema']} schema
 * @param {string} name
 * @returns {Tool['inputSchema']}
 */
function hideArgument(schema, name) {
  const properties = { ...(schema.properties ?? {}) };
  delete properties[name];
  const required = schema.required?.filter((r) => r !== name);
  return { ...schema, properties, ...(required ? { required } : {}) };
}

/**
 * What differs between the configuration's key fields of a tool and the ledger's registry
 * (asked through effect_key, which derives keys from the registry's key fields), or null.
 * @param {Ledger} ledger
 * @param {ToolRule} rule
 * @returns {Promise<string | null>}
 */
async function registryProblem(ledger, rule) {
  const fields = rule.keyFields ?? [];
  const base = Object.fromEntries(fields.map((f) => [f, 'probe-1']));
  /** @param {Record<string, unknown>} args */
  const key = async (args) => {
    const { rows: [r] } = await ledger.client.query(
      'SELECT durable_ledger.effect_key($1, $2, $3::jsonb, 1) AS key',
      ['durable-ledger-mcp-gateway probe', rule.ledgerTool, JSON.stringify(args)]);
    return /** @type {string} */ (r.key);
  };
  const wanted = fields.length > 0 ? `{${fields.join(',')}}` : null;
  const fix = wanted
    ? `an admin runs SELECT durable_ledger.register_tool('${rule.ledgerTool}', '<name>', key_fields => '${wanted}') ` +
      `(change_tool if it is registered and no call of it is recorded yet)`
    : `the configuration names the ledger's key fields in keyFields, or an admin changes them`;
  let baseKey;
  try {
    baseKey = await key(base);
  } catch (err) {
    if (/** @type {any} */ (err)?.code === '22023') {
      return `the ledger names key fields the configuration does not (${wanted ?? 'none'}): ${fix}`;
    }
    throw err;
  }
  const withExtra = await key({ ...base, 'durable-ledger/probe': 1 });
  if (fields.length === 0) return null; // whole arguments on both sides (an error above otherwise)
  if (withExtra !== baseKey) return `the ledger has no key fields for it; the configuration names ${wanted}: ${fix}`;
  for (const f of fields) {
    if (await key({ ...base, [f]: 'probe-2' }) === baseKey) {
      return `the ledger's key fields leave out ${f}, which the configuration names: ${fix}`;
    }
  }
  return null;
}
