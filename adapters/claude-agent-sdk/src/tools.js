// The custom tools of a Claude Agent SDK agent, through the ledger.  A custom tool is an
// MCP tool of an in-process SDK MCP server (createSdkMcpServer with the SDK's tool()
// helper); ledgerTool() is tool() with the handler wrapped:
//
//   side-effecting (the default)  guardedTool: performed at most once per logical call, the
//       ledger's key handed to the handler (ctx.idempotencyKey) for its provider, the
//       recorded result returned on a replay without calling it;
//   readOnly: 'record'            recordedCall: a read made once, its answer replayed;
//   readOnly: 'pass'              called as is, outside the ledger.
//
// A call that stops the run (a pause, an unknown outcome, an abandoned run, a refused
// tool, a lost lease) answers with a tool error (isError) whose text tells the model not
// to call again and says what a person must do; the session's claudeAttempt throws the
// stop at its end.  The run is the session's: the handler finds it through the
// claudeAttempt it runs in (session.js).

import { tool } from '@anthropic-ai/claude-agent-sdk';
import { EffectFailed } from 'durable-ledger';
import { ToolCallStopped, currentAttempt, guardedTool, recordedCall, toolError } from 'durable-ledger/agents';
import { noteStop } from './context.js';

/** @typedef {import('@anthropic-ai/claude-agent-sdk').AnyZodRawShape} AnyZodRawShape */
/** @typedef {import('@modelcontextprotocol/sdk/types.js').CallToolResult} CallToolResult */
/** @typedef {import('@modelcontextprotocol/sdk/types.js').ToolAnnotations} ToolAnnotations */
/** @typedef {import('durable-ledger/agents').Stop} Stop */
/**
 * @template {AnyZodRawShape} S
 * @typedef {import('@anthropic-ai/claude-agent-sdk').InferShape<S>} InferShape
 */

/** The `_meta` keys the wrapper adds to a tool's result. */
export const RESULT_META = {
  replayed: 'durable-ledger/replayed',
  stop: 'durable-ledger/stop',
};

/**
 * What a wrapped handler gets besides its arguments.
 * @typedef {object} ToolContext
 * @property {string | null} idempotencyKey  the ledger's key of this call, for the provider
 *   (a side-effecting tool; null for a read-only one)
 * @property {string | null} run  the run (the session id); null for a 'pass' tool called
 *   outside any attempt
 * @property {unknown} extra  what the SDK gave the handler (the MCP request's extra: its
 *   `signal`, `_meta`, ...)
 */

/**
 * @template {AnyZodRawShape} S
 * @typedef {object} LedgerToolOptions
 * @property {false | 'record' | 'pass'} [readOnly]  false (default): the tool changes the
 *   world, its calls go through the ledger (guardedTool); 'record': a read whose answer is
 *   recorded and replayed, so a resumed session sees what the first saw (recordedCall);
 *   'pass': a read called as is, the ledger sees nothing of it
 * @property {string} [ledgerName]  the tool's name in the ledger (default: its name)
 * @property {(args: InferShape<S>) => string | null} [businessKey]  the call's business key:
 *   the same operation across runs (an invoice number), or null
 * @property {ToolAnnotations} [annotations]  the SDK's tool() extras
 * @property {string} [searchHint]
 * @property {boolean} [alwaysLoad]
 */

/**
 * A custom tool of the Claude Agent SDK whose handler goes through the ledger: the SDK's
 * own tool() with the handler wrapped (see the module's comment).  Put it in
 * createSdkMcpServer({tools}) -- or session.server({tools}) -- as any tool.
 * @template {AnyZodRawShape} S
 * @param {string} name
 * @param {string} description
 * @param {S} inputSchema  a zod raw shape, as tool() takes
 * @param {(args: InferShape<S>, ctx: ToolContext) => Promise<CallToolResult>} handler
 * @param {LedgerToolOptions<S>} [options]
 * @returns {import('@anthropic-ai/claude-agent-sdk').SdkMcpToolDefinition<S>}  the SDK's own type,
 *   not a local alias of it: TypeScript then relates it to the SDK's SdkMcpToolDefinition<any>
 *   (createSdkMcpServer's tools) by the alias's variance, as it does tool()'s result
 */
export function ledgerTool(name, description, inputSchema, handler, options = {}) {
  const { readOnly = false, ledgerName = name, businessKey, annotations, searchHint, alwaysLoad } = options;
  if (readOnly !== false && readOnly !== 'record' && readOnly !== 'pass') {
    throw new TypeError(`ledgerTool(${name}): readOnly must be false, 'record' or 'pass'`);
  }
  /** @type {(args: InferShape<S>, extra: unknown) => Promise<CallToolResult>} */
  const wrapped = async (args, extra) => {
    const attempt = currentAttempt();
    if (readOnly === 'pass') return handler(args, { idempotencyKey: null, run: attempt?.run ?? null, extra });
    if (!attempt) {
      return errorResult(`This call of ${name} was not performed: no ledger attempt is open for this session. ` +
        '(For the developer: run query() inside claudeAttempt(), or make the server with session.server().)');
    }
    const { run } = attempt;
    try {
      if (readOnly === 'record') {
        const answer = await recordedCall({ tool: ledgerName, args, call: () => handler(args, { idempotencyKey: null, run, extra }) });
        return asToolResult(answer);
      }
      let performed = false;
      const answer = await guardedTool({
        tool: ledgerName,
        args,
        businessKey: businessKey?.(args) ?? null,
        perform: async (key) => {
          const result = await handler(args, { idempotencyKey: key, run, extra });
          performed = true;
          return result;
        },
      });
      const result = asToolResult(answer);
      return { ...result, _meta: { ...(result._meta ?? {}), [RESULT_META.replayed]: !performed } };
    } catch (err) {
      const shown = toolError(err);
      if (shown instanceof ToolCallStopped) {
        noteStop();
        return stopResult(shown.stop);
      }
      if (err instanceof EffectFailed) {
        return errorResult(`The call of ${name} was refused, nothing was done${err.replayed ? ' (as recorded earlier)' : ''}: ` +
          `${describe(err.error)}`);
      }
      return errorResult(`This call of ${name} was not performed: ${/** @type {any} */ (err)?.message ?? String(err)}`);
    }
  };
  return tool(name, description, inputSchema, wrapped,
    { ...(annotations ? { annotations } : {}), ...(searchHint ? { searchHint } : {}), ...(alwaysLoad ? { alwaysLoad } : {}) });
}

/**
 * The answer to a call that stopped the run: a tool error telling the model that nothing
 * was done and not to call again, and what a person must do (in its text and `_meta`).
 * @param {Stop} stop
 * @returns {CallToolResult}
 */
export function stopResult(stop) {
  return {
    isError: true,
    content: [{ type: 'text', text: `${stop.forModel}\n\nWhat a person must do: ${stop.forPerson}.` }],
    _meta: { [RESULT_META.stop]: { kind: stop.kind, key: stop.key, forPerson: stop.forPerson } },
  };
}

/**
 * A recorded result as a tool result: what the handler returned, or what a person recorded
 * when they resolved the call (any other JSON: its text).
 * @param {unknown} recorded
 * @returns {CallToolResult}
 */
export function asToolResult(recorded) {
  if (typeof recorded === 'object' && recorded !== null && Array.isArray(/** @type {any} */ (recorded).content)) {
    return /** @type {CallToolResult} */ (recorded);
  }
  return { content: [{ type: 'text', text: JSON.stringify(recorded) }] };
}

/**
 * @param {string} text
 * @returns {CallToolResult}
 */
function errorResult(text) {
  return { isError: true, content: [{ type: 'text', text }] };
}

/** @param {unknown} v */
function describe(v) {
  const message = /** @type {any} */ (v)?.message;
  return typeof message === 'string' ? message : JSON.stringify(v);
}
