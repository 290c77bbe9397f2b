// The gateway's configuration file (JSON): the ledger, the upstream MCP servers and
// what the gateway must know of their tools.  parseConfig() checks every field and
// says which one is wrong, with its path in the file ("servers.bank.tools.pay.keyFields:
// ..."), before anything is started: a gateway that guessed at a misspelt flag could
// pass a payment straight through.  The schema, field by field, is in README.md
// ("The configuration file").

import { readFileSync } from 'node:fs';
import path from 'node:path';

/** The request `_meta` key that names the run of a call (README: "Which run a call belongs to"). */
export const RUN_META = 'durable-ledger/run';
/** The forwarded request's `_meta` key that carries the idempotency key upstream. */
export const KEY_META = 'durable-ledger/idempotency-key';
/** The `_meta` key of a request that names the call by the client's own, stable id for it. */
export const CALL_ID_META = 'durable-ledger/call-id';
/** The prefix of the gateway's own `_meta` keys: a client's are never forwarded upstream. */
export const META_PREFIX = 'durable-ledger/';
/**
 * The default upstream timeout (ms): clearly shorter than the MCP SDK client's default
 * request timeout (60 s), so that the gateway answers a slow call (its outcome unknown, a
 * stop) before the client gives up on it and retries it as a new call.
 */
export const DEFAULT_TIMEOUT = 50000;

/**
 * @typedef {object} ToolRule  what the configuration says of one upstream tool
 * @property {boolean} sideEffecting  its calls go through the ledger (else straight through)
 * @property {string[] | null} keyFields  the fields of its arguments that make a call this
 *   call: register_tool's key_fields, which an admin sets in the ledger (the gateway checks
 *   that the ledger agrees, and refuses a call whose arguments lack one)
 * @property {string | null} businessKey  a template of the call's business key, e.g.
 *   "invoice-{invoice}": the same operation across runs (null: none)
 * @property {string | null} idempotencyKeyArgument  the argument the idempotency key is
 *   put in, upstream (hidden from the client's schema)
 * @property {string} ledgerTool  the tool's name in the ledger
 */

/**
 * @typedef {object} ServerSpec  one upstream MCP server
 * @property {string} name  its name in the configuration (the key of `servers`)
 * @property {'stdio' | 'http'} transport
 * @property {string | null} command  stdio: the program
 * @property {string[]} args  stdio: its arguments
 * @property {Record<string, string>} env  stdio: environment variables added to the default ones
 * @property {string | null} cwd  stdio: its working directory
 * @property {string | null} url  http: the Streamable HTTP endpoint
 * @property {Record<string, string>} headers  http: headers sent with every request
 * @property {string} prefix  prepended to its tools' names as the gateway offers them
 * @property {number} timeout  milliseconds a call may take upstream before it times out
 * @property {boolean} sideEffectingByDefault  whether a tool the configuration does not list
 *   is side-effecting (true unless the file says otherwise: the safe default)
 * @property {string | null} idempotencyKeyArgument  the default of its tools' idempotencyKeyArgument
 * @property {number[]} refusedCodes  JSON-RPC error codes of an upstream answer that mean
 *   the call was refused before anything was done (recorded as failed, EffectDidNotHappen)
 * @property {Map<string, ToolRule>} tools  the rules of the tools it lists, by upstream name
 */

/**
 * @typedef {object} LedgerSpec
 * @property {string | null} connectionString  null: DURABLE_LEDGER_DSN, else DATABASE_URL,
 *   else node-postgres' PG* variables
 * @property {number} ttl  the token lease's seconds without renewal
 * @property {string | null} holder  the gateway's name in durable_ledger.leases
 * @property {number} leaseWait  seconds a call waits for a run another worker holds
 * @property {number} poolSize  the connections of its pg.Pool
 */

/**
 * @typedef {object} GatewayConfig
 * @property {LedgerSpec} ledger
 * @property {ServerSpec[]} servers
 * @property {number} sessionIdleTimeout  seconds after which an HTTP session without a
 *   request is closed (its attempts end, their leases released)
 * @property {string[]} allowOrigins  HTTP: the origins (scheme://host[:port]) whose requests
 *   (a browser's, with an Origin header) are served; a request with another Origin is refused
 * @property {string[]} allowHosts  HTTP: Host headers served besides the address the gateway
 *   listens on (and its loopback names): DNS-rebinding protection
 * @property {string | null} source  the file it was read from
 */

/** The configuration is wrong: `path` names the field, `message` says why. */
export class ConfigError extends Error {
  /**
   * @param {string} where  the field's path ("servers.bank.url"), or '' for the whole file
   * @param {string} message
   * @param {string | null} [source]
   */
  constructor(where, message, source = null) {
    super(`${source ? `${source}: ` : ''}${where ? `${where}: ` : ''}${message}`);
    this.name = 'ConfigError';
    /** @readonly */
    this.path = where;
  }
}

/**
 * Reads and checks a configuration file.
 * @param {string} file
 * @returns {GatewayConfig}
 * @throws {ConfigError}
 */
export function loadConfig(file) {
  let text;
  try {
    text = readFileSync(file, 'utf8');
  } catch (err) {
    throw new ConfigError('', `cannot read the configuration: ${/** @type {Error} */ (err).message}`, file);
  }
  let json;
  try {
    json = JSON.parse(text);
  } catch (err) {
    throw new ConfigError('', `not JSON: ${/** @type {Error} */ (err).message}`, file);
  }
  return parseConfig(json, { source: file, baseDir: path.dirname(path.resolve(file)) });
}

/**
 * Checks a configuration given as a value (what the file holds).
 * @param {unknown} json
 * @param {{source?: string | null, baseDir?: string}} [options]  baseDir: what relative
 *   `cwd`s are relative to (the file's folder; default the process's)
 * @returns {GatewayConfig}
 * @throws {ConfigError}
 */
export function parseConfig(json, { source = null, baseDir = process.cwd() } = {}) {
  const check = new Checker(source);
  const top = check.object(json, '', ['ledger', 'servers', 'sessionIdleTimeout', 'allowOrigins', 'allowHosts',
    '$schema', 'description']);
  const ledger = top.ledger === undefined ? {} : check.object(top.ledger, 'ledger',
    ['connectionString', 'ttl', 'holder', 'leaseWait', 'poolSize']);
  const servers = check.object(top.servers, 'servers');
  const names = Object.keys(servers);
  if (names.length === 0) throw new ConfigError('servers', 'name at least one upstream server', source);
  return {
    ledger: {
      connectionString: check.optionalString(ledger.connectionString, 'ledger.connectionString'),
      ttl: check.number(ledger.ttl, 'ledger.ttl', { min: 1, max: 86400, integer: true, fallback: 60 }),
      holder: check.optionalString(ledger.holder, 'ledger.holder'),
      leaseWait: check.number(ledger.leaseWait, 'ledger.leaseWait', { min: 0, max: 86400, fallback: 0 }),
      poolSize: check.number(ledger.poolSize, 'ledger.poolSize', { min: 1, max: 1000, integer: true, fallback: 10 }),
    },
    servers: names.map((name) => serverSpec(check, name, servers[name], baseDir)),
    sessionIdleTimeout: check.number(top.sessionIdleTimeout, 'sessionIdleTimeout',
      { min: 1, max: 7 * 86400, fallback: 900 }),
    allowOrigins: top.allowOrigins === undefined ? []
      : check.array(top.allowOrigins, 'allowOrigins').map((o, i) => origin(check, o, `allowOrigins[${i}]`)),
    allowHosts: top.allowHosts === undefined ? []
      : check.array(top.allowHosts, 'allowHosts').map((h, i) => check.string(h, `allowHosts[${i}]`).toLowerCase()),
    source,
  };
}

/**
 * @param {Checker} check
 * @param {string} name
 * @param {unknown} value
 * @param {string} baseDir
 * @returns {ServerSpec}
 */
function serverSpec(check, name, value, baseDir) {
  const at = `servers.${name}`;
  if (!/^[A-Za-z0-9_.-]+$/.test(name)) {
    throw new ConfigError(at, 'a server\'s name is letters, digits, "_", "-" and "." (it names its tools in the ledger)',
      check.source);
  }
  const s = check.object(value, at, ['command', 'args', 'env', 'cwd', 'url', 'headers', 'prefix', 'timeout',
    'sideEffectingByDefault', 'idempotencyKeyArgument', 'refusedCodes', 'tools', 'description']);
  if ((s.command === undefined) === (s.url === undefined)) {
    throw new ConfigError(at, 'give either "command" (a stdio server) or "url" (a Streamable HTTP server)',
      check.source);
  }
  const transport = s.command !== undefined ? 'stdio' : 'http';
  if (transport === 'stdio') {
    for (const f of ['url', 'headers']) {
      if (s[f] !== undefined) throw new ConfigError(`${at}.${f}`, 'only for a server with "url"', check.source);
    }
  } else {
    for (const f of ['args', 'env', 'cwd']) {
      if (s[f] !== undefined) throw new ConfigError(`${at}.${f}`, 'only for a server with "command"', check.source);
    }
  }
  const url = check.optionalString(s.url, `${at}.url`);
  if (url !== null) {
    let parsed;
    try {
      parsed = new URL(url);
    } catch {
      throw new ConfigError(`${at}.url`, `not a URL: ${JSON.stringify(url)}`, check.source);
    }
    if (parsed.protocol !== 'http:' && parsed.protocol !== 'https:') {
      throw new ConfigError(`${at}.url`, 'an http: or https: URL', check.source);
    }
  }
  const cwd = check.optionalString(s.cwd, `${at}.cwd`);
  const idempotencyKeyArgument = check.optionalString(s.idempotencyKeyArgument, `${at}.idempotencyKeyArgument`);
  const sideEffectingByDefault = check.boolean(s.sideEffectingByDefault, `${at}.sideEffectingByDefault`, true);
  // -32602 (invalid params) is not a default: an older SDK McpServer threw it after the
  // handler had run (its output failed the outputSchema), and a handler may throw it after
  // its effect; the gateway checks the arguments against the tool's inputSchema itself
  const refusedCodes = s.refusedCodes === undefined ? [-32601]
    : check.array(s.refusedCodes, `${at}.refusedCodes`).map((c, i) =>
      check.number(c, `${at}.refusedCodes[${i}]`, { integer: true, min: -2147483648, max: 2147483647 }));
  const rules = s.tools === undefined ? {} : check.object(s.tools, `${at}.tools`);
  /** @type {Map<string, ToolRule>} */
  const tools = new Map();
  for (const [tool, ruleValue] of Object.entries(rules)) {
    const rat = `${at}.tools.${tool}`;
    const r = check.object(ruleValue, rat, ['sideEffecting', 'keyFields', 'businessKey', 'idempotencyKeyArgument',
      'ledgerTool', 'description']);
    const sideEffecting = check.boolean(r.sideEffecting, `${rat}.sideEffecting`, true);
    const keyFields = r.keyFields === undefined ? null
      : check.array(r.keyFields, `${rat}.keyFields`).map((f, i) => check.string(f, `${rat}.keyFields[${i}]`));
    if (keyFields !== null) {
      if (keyFields.length === 0) {
        throw new ConfigError(`${rat}.keyFields`, 'name at least one field, or leave keyFields out (the whole ' +
          'arguments make the call)', check.source);
      }
      if (new Set(keyFields).size !== keyFields.length) {
        throw new ConfigError(`${rat}.keyFields`, 'a field is named twice', check.source);
      }
    }
    const businessKey = check.optionalString(r.businessKey, `${rat}.businessKey`);
    if (businessKey !== null && !/\{[^{}]+\}/.test(businessKey)) {
      throw new ConfigError(`${rat}.businessKey`, 'a template with at least one {field} of the arguments ' +
        '(e.g. "invoice-{invoice}"): a constant would make every call the same operation', check.source);
    }
    const keyArg = r.idempotencyKeyArgument === undefined ? idempotencyKeyArgument
      : check.optionalString(r.idempotencyKeyArgument, `${rat}.idempotencyKeyArgument`);
    const ledgerTool = check.optionalString(r.ledgerTool, `${rat}.ledgerTool`) ?? `${name}.${tool}`;
    if (ledgerTool.length > 255) throw new ConfigError(`${rat}.ledgerTool`, 'at most 255 characters', check.source);
    if (!sideEffecting) {
      for (const f of ['keyFields', 'businessKey', 'idempotencyKeyArgument']) {
        if (r[f] !== undefined) {
          throw new ConfigError(`${rat}.${f}`, 'only for a side-effecting tool (a read-only one passes straight ' +
            'through, the ledger sees none of its calls)', check.source);
        }
      }
    }
    tools.set(tool, { sideEffecting, keyFields, businessKey, idempotencyKeyArgument: keyArg, ledgerTool });
  }
  return {
    name,
    transport,
    command: check.optionalString(s.command, `${at}.command`),
    args: s.args === undefined ? [] : check.array(s.args, `${at}.args`).map((a, i) => check.string(a, `${at}.args[${i}]`)),
    env: s.env === undefined ? {} : check.stringRecord(s.env, `${at}.env`),
    cwd: cwd === null ? null : path.resolve(baseDir, cwd),
    url,
    headers: s.headers === undefined ? {} : check.stringRecord(s.headers, `${at}.headers`),
    prefix: check.optionalString(s.prefix, `${at}.prefix`) ?? '',
    timeout: check.number(s.timeout, `${at}.timeout`, { min: 1, max: 86400000, integer: true, fallback: DEFAULT_TIMEOUT }),
    sideEffectingByDefault,
    idempotencyKeyArgument,
    refusedCodes,
    tools,
  };
}

/**
 * An origin as a browser sends it (scheme://host[:port], no path).
 * @param {Checker} check
 * @param {unknown} v
 * @param {string} at
 * @returns {string}
 */
export function origin(check, v, at) {
  const text = check.string(v, at);
  let url;
  try {
    url = new URL(text);
  } catch {
    throw new ConfigError(at, `not an origin (scheme://host[:port]): ${JSON.stringify(text)}`, check.source);
  }
  if (url.origin === 'null' || url.pathname !== '/' || url.search !== '' || url.hash !== '' || url.username !== '' ||
    text.endsWith('/')) {
    throw new ConfigError(at, `an origin is scheme://host[:port], nothing more: ${JSON.stringify(text)}`,
      check.source);
  }
  return url.origin;
}

/**
 * The rule of an upstream tool: the configuration's, or for a tool it does not list, the
 * server's default (side-effecting unless the server says sideEffectingByDefault: false).
 * @param {ServerSpec} server
 * @param {string} tool
 * @returns {ToolRule}
 */
export function ruleOf(server, tool) {
  return server.tools.get(tool) ?? {
    sideEffecting: server.sideEffectingByDefault,
    keyFields: null,
    businessKey: null,
    idempotencyKeyArgument: server.sideEffectingByDefault ? server.idempotencyKeyArgument : null,
    ledgerTool: `${server.name}.${tool}`,
  };
}

/** Checks values and names the field that is wrong. */
export class Checker {
  /** @param {string | null} source */
  constructor(source) {
    this.source = source;
  }

  /**
   * @param {unknown} v
   * @param {string} at
   * @param {string[]} [allowed]  the fields it may have (a misspelt one is an error)
   * @returns {Record<string, any>}
   */
  object(v, at, allowed) {
    if (typeof v !== 'object' || v === null || Array.isArray(v)) {
      throw new ConfigError(at, v === undefined ? 'missing (an object)' : 'must be an object', this.source);
    }
    if (allowed) {
      for (const k of Object.keys(v)) {
        if (!allowed.includes(k)) {
          throw new ConfigError(at ? `${at}.${k}` : k, `unknown field (known: ${allowed.join(', ')})`, this.source);
        }
      }
    }
    return /** @type {Record<string, any>} */ (v);
  }

  /**
   * @param {unknown} v
   * @param {string} at
   * @returns {unknown[]}
   */
  array(v, at) {
    if (!Array.isArray(v)) throw new ConfigError(at, 'must be an array', this.source);
    return v;
  }

  /**
   * @param {unknown} v
   * @param {string} at
   * @returns {string}
   */
  string(v, at) {
    if (typeof v !== 'string' || v === '') throw new ConfigError(at, 'must be a non-empty string', this.source);
    return v;
  }

  /**
   * @param {unknown} v
   * @param {string} at
   * @returns {string | null}
   */
  optionalString(v, at) {
    return v === undefined || v === null ? null : this.string(v, at);
  }

  /**
   * @param {unknown} v
   * @param {string} at
   * @param {boolean} fallback
   * @returns {boolean}
   */
  boolean(v, at, fallback) {
    if (v === undefined) return fallback;
    if (typeof v !== 'boolean') throw new ConfigError(at, 'must be true or false', this.source);
    return v;
  }

  /**
   * @param {unknown} v
   * @param {string} at
   * @param {{min?: number, max?: number, integer?: boolean, fallback?: number}} bounds
   * @returns {number}
   */
  number(v, at, { min = -Infinity, max = Infinity, integer = false, fallback } = {}) {
    if (v === undefined && fallback !== undefined) return fallback;
    if (typeof v !== 'number' || !Number.isFinite(v) || (integer && !Number.isInteger(v)) || v < min || v > max) {
      throw new ConfigError(at, `must be ${integer ? 'an integer' : 'a number'} from ${min} to ${max}`, this.source);
    }
    return v;
  }

  /**
   * @param {unknown} v
   * @param {string} at
   * @returns {Record<string, string>}
   */
  stringRecord(v, at) {
    const o = this.object(v, at);
    for (const [k, x] of Object.entries(o)) {
      if (typeof x !== 'string') throw new ConfigError(`${at}.${k}`, 'must be a string', this.source);
    }
    return /** @type {Record<string, string>} */ (o);
  }
}
