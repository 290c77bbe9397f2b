// A Claude Agent SDK session as a run of the ledger.  The run id is the session id: a new
// session's (chosen before query() starts it, so that the run is known before its first
// tool call), a resumed session's (`resume: id`: the same run, a new attempt, whose calls
// replay what the session's earlier attempts did), or a forked session's (`resume: id,
// forkSession: true`: a new session id, a new run, which must carry the source run's
// settled effects as the ledger's fork_run makes it -- an admin's function, forkRun()).
//
//   await claudeAttempt(ledger, { resume: sessionId }, async (session) => {
//     for await (const m of query({ prompt, options: { ...session.options, mcpServers: { billing } } })) ...
//   });

import { AsyncLocalStorage } from 'node:async_hooks';
import { randomUUID } from 'node:crypto';
import { createSdkMcpServer } from '@anthropic-ai/claude-agent-sdk';
import { agentAttempt, currentStop } from 'durable-ledger/agents';
import { sessionContext } from './context.js';

/** @typedef {import('durable-ledger').Ledger} Ledger */
/** @typedef {import('durable-ledger').TokenLease} TokenLease */
/** @typedef {import('durable-ledger/agents').Stop} Stop */
/** @typedef {import('@anthropic-ai/claude-agent-sdk').McpSdkServerConfigWithInstance} McpSdkServerConfigWithInstance */
/** @typedef {import('@anthropic-ai/claude-agent-sdk').McpStdioServerConfig} McpStdioServerConfig */

/**
 * Which session an attempt is at: the fields of the SDK's Options that say it (pass your
 * Options object itself, or these).
 * @typedef {object} SessionSpec
 * @property {string} [sessionId]  a new session's id (a UUID; default a new one); with
 *   forkSession, the fork's
 * @property {string} [resume]  the session to resume (its run goes on)
 * @property {boolean} [forkSession]  with resume: the session is forked into a new one (a
 *   new run, which must have been forked in the ledger first: forkRun)
 */

/**
 * @typedef {object} ClaudeAttemptOptions
 * @property {'token' | 'session'} [lease]  agentAttempt's lease (default 'token': parallel
 *   tool calls, a pg.Pool)
 * @property {number} [ttl]  a token lease's seconds without renewal
 * @property {string | null} [holder]  the worker's name in durable_ledger.leases
 * @property {string | null} [model]  the model that answers the session (meta.model of its calls)
 * @property {'carried' | 'fresh'} [fork]  for a forked session: 'carried' (default) refuses
 *   to run a fork whose run the ledger has not forked (ForkNotCarried); 'fresh' accepts a
 *   new run that carries nothing (its calls execute again, even those the source made)
 * @property {boolean} [abortOnStop]  abort `session.options.abortController` when a call
 *   stops the run, so that query() ends there rather than when the model ends its turn
 */

/**
 * A forked session whose run the ledger never forked: nothing was run.  An admin forks
 * the run (forkRun, or durable_ledger.fork_run) into a run id the ledger has not seen --
 * this one it has seen now -- and the app forks the session under that id.
 */
export class ForkNotCarried extends Error {
  /**
   * @param {string} run
   * @param {string} source
   */
  constructor(run, source) {
    super(`the forked session ${run} has a run the ledger never forked from ${source}: nothing was run. ` +
      `Fork the run first (forkRun(admin, {from: '${source}', to: <a new session id>, ...}), or ` +
      `durable_ledger.fork_run as an admin), then fork the session under that id; ${run} is used up. ` +
      "(Or pass {fork: 'fresh'}: a new run that carries nothing.)");
    this.name = 'ForkNotCarried';
    /** @readonly */
    this.run = run;
    /** @readonly */
    this.source = source;
  }
}

/** One attempt at a session's run: what the app's function gets. */
export class ClaudeSession {
  /**
   * @param {{run: string, sessionId: string, resume: string | null, fork: boolean, lease: TokenLease | null,
   *   abortController: AbortController | null, inAttempt: <R>(fn: () => R) => R}} fields
   */
  constructor({ run, sessionId, resume, fork, lease, abortController, inAttempt }) {
    /** @readonly the run: the session id */
    this.run = run;
    /** @readonly the session's id (a fork's own) */
    this.sessionId = sessionId;
    /** @readonly the attempt's token lease (null under a session lease) */
    this.lease = lease;
    /**
     * The SDK Options that make query() run this session: spread them into yours
     * (`{ sessionId }`, `{ resume }`, or `{ resume, forkSession: true, sessionId }`; with
     * abortOnStop, `abortController`).
     * @readonly
     * @type {{sessionId?: string, resume?: string, forkSession?: boolean, abortController?: AbortController}}
     */
    this.options = {
      ...(resume === null ? { sessionId } : { resume }),
      ...(fork ? { forkSession: true, sessionId } : {}),
      ...(abortController ? { abortController } : {}),
    };
    this.#inAttempt = inAttempt;
  }

  #inAttempt;

  /** The first call of this attempt that stopped the run, or null. @returns {Stop | null} */
  get stop() {
    return this.#inAttempt(() => currentStop());
  }

  /**
   * createSdkMcpServer() whose tools' handlers run in this attempt whatever context the
   * SDK calls them from (the Claude Code CLI's messages reach them through the query's
   * own stream).  Make one per query(): an MCP server instance serves one connection.
   * @param {{name: string, version?: string, instructions?: string, alwaysLoad?: boolean, tools?: Array<import('@anthropic-ai/claude-agent-sdk').SdkMcpToolDefinition<any>>}} options
   * @returns {McpSdkServerConfigWithInstance}
   */
  server(options) {
    const inAttempt = this.#inAttempt;
    return createSdkMcpServer({
      ...options,
      tools: (options.tools ?? []).map((t) => ({
        ...t,
        handler: (/** @type {any} */ args, /** @type {unknown} */ extra) => inAttempt(() => t.handler(args, extra)),
      })),
    });
  }
}

/**
 * The run a session spec names, and the session id query() is to use.
 * @param {SessionSpec} spec
 * @returns {{run: string, sessionId: string, resume: string | null, fork: boolean}}
 */
export function sessionRun(spec) {
  const { sessionId, resume, forkSession = false } = spec ?? {};
  if (forkSession && !resume) throw new TypeError('forkSession needs resume: the session it forks');
  if (resume && sessionId && !forkSession) {
    throw new TypeError('sessionId with resume names another session only with forkSession (the SDK\'s rule)');
  }
  if (resume && !forkSession) return { run: resume, sessionId: resume, resume, fork: false };
  const id = sessionId ?? randomUUID();
  return { run: id, sessionId: id, resume: resume ?? null, fork: forkSession };
}

/**
 * One attempt at a Claude Agent SDK session's run, around the app's query(): the core's
 * agentAttempt (a token lease by default), in which the tools made by ledgerTool() find
 * their ledger and run.  Returns what fn returns; throws at its end the first call that
 * stopped the run (EffectPaused, RunAbandoned, ToolRefused, LeaseLost; an unknown
 * outcome as RunStopped), even when the model went on after the tool error.
 * @template T
 * @param {Ledger} ledger
 * @param {SessionSpec} spec
 * @param {ClaudeAttemptOptions | ((session: ClaudeSession) => T | Promise<T>)} options
 * @param {(session: ClaudeSession) => T | Promise<T>} [fn]
 * @returns {Promise<Awaited<T>>}
 * @throws ForkNotCarried, RunBusy, and what agentAttempt throws
 */
export async function claudeAttempt(ledger, spec, options, fn) {
  if (typeof options === 'function') [options, fn] = [{}, options];
  if (typeof fn !== 'function') throw new TypeError('claudeAttempt(ledger, spec, [options,] fn): fn must be a function');
  const { lease = 'token', ttl, holder, model, fork = 'carried', abortOnStop = false } = options ?? {};
  if (fork !== 'carried' && fork !== 'fresh') throw new TypeError("claudeAttempt(): fork must be 'carried' or 'fresh'");
  const body = /** @type {(session: ClaudeSession) => T | Promise<T>} */ (fn);
  const { run, sessionId, resume, fork: forked } = sessionRun(spec);
  const abortController = abortOnStop ? new AbortController() : null;
  return agentAttempt(ledger, run, { lease, ttl, holder, model }, async (held) => {
    if (forked && fork === 'carried' && await epochOf(ledger, run, held) === 1) {
      throw new ForkNotCarried(run, /** @type {string} */ (resume));
    }
    return sessionContext.run(abortController, () => {
      const inAttempt = AsyncLocalStorage.snapshot();
      return body(new ClaudeSession({ run, sessionId, resume, fork: forked, lease: held, abortController, inAttempt }));
    });
  });
}

/**
 * The lease epoch of this attempt: 1 when the ledger had never seen the run (a fork it did
 * not make: a forked run's first attempt is its epoch 2).
 * @param {Ledger} ledger
 * @param {string} run
 * @param {TokenLease | null} held
 * @returns {Promise<number>}
 */
async function epochOf(ledger, run, held) {
  if (held) return held.epoch;
  const { rows: [r] } = await ledger.client.query('SELECT durable_ledger.session_epoch($1) AS epoch', [run]);
  return Number(r.epoch);
}

/**
 * Forks a session's run into the run of its fork, as the ledger's fork_run does (an
 * admin's function: the app's admin connection, or a person with SQL or the console):
 * the new run carries the source run's settled effects up to `upTo`, so that the forked
 * session's calls of them replay instead of executing again.  Before the fork's first
 * claudeAttempt.  Returns how many effects it carries.
 * @param {{query: (text: string, params: unknown[]) => Promise<{rows: any[]}>}} admin  a
 *   node-postgres Client or Pool as a member of durable_ledger_admin
 * @param {{from: string, to: string, upTo?: string, forkedBy: string, note?: string | null}} fork
 *   from: the source session id; to: the fork's session id (a new UUID); upTo: the last
 *   effect key it carries (default: the last the source run began under a derived key)
 * @returns {Promise<number>}
 */
export async function forkRun(admin, { from, to, upTo, forkedBy, note = null }) {
  let last = upTo;
  if (last === undefined) {
    const { rows } = await admin.query(
      `SELECT e.key FROM durable_ledger.effects e
        WHERE e.key IN (SELECT a.key FROM durable_ledger.audit_log a WHERE a.run = $1 AND a.key IS NOT NULL)
          AND e.run = $1 AND NOT e.business_key
        ORDER BY e.created_at DESC, e.key DESC LIMIT 1`, [from]);
    if (rows.length === 0) throw new Error(`forkRun: run ${from} has no effect to carry`);
    last = /** @type {string} */ (rows[0].key);
  }
  const { rows: [r] } = await admin.query('SELECT durable_ledger.fork_run($1, $2, $3, $4, $5) AS carried',
    [from, to, last, forkedBy, note]);
  return Number(r.carried);
}

/**
 * The Claude Agent SDK's mcpServers entry of the MCP gateway (durable-ledger-mcp-gateway)
 * for this session's tools it reaches over MCP: the CLI starts the gateway over stdio with
 * `--run <session run>/<name>` -- a run of its own next to the session's (an attempt holds
 * a run alone, and the session's is held by claudeAttempt) that a resumed session
 * continues and a forked one forks with it.
 * @param {ClaudeSession} session
 * @param {{name: string, config: string, command?: string, args?: string[], env?: Record<string, string>}} options
 *   config: the gateway's configuration file; command and args: how to start the gateway
 *   (default `npx durable-ledger-mcp-gateway`); env: added to the gateway's environment
 *   (its DURABLE_LEDGER_DSN: the CLI gives a server only what it is given)
 * @returns {McpStdioServerConfig}
 */
export function gatewayServer(session, { name, config, command = 'npx', args = ['durable-ledger-mcp-gateway'], env = {} }) {
  return {
    type: 'stdio',
    command,
    args: [...args, '--config', config, '--run', gatewayRun(session.run, name)],
    env,
  };
}

/**
 * The run of a session's gateway server `name`.
 * @param {string} run  the session's run
 * @param {string} name
 */
export function gatewayRun(run, name) {
  return `${run}/mcp/${name}`;
}
