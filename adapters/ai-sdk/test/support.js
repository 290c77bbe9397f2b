// What the AI SDK adapter's tests share: the cluster (DURABLE_LEDGER_DSN, a superuser
// connection to a database with durable_ledger: the tests resolve, abandon and read the
// ledger's tables as a person would), opened for a test file and closed after it; and the
// answers of the AI SDK's mock model (MockLanguageModelV4 from ai/test), whole turns and
// stream chunks.
import { before, after } from 'node:test';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { Ledger } from 'durable-ledger';
import { startEffectsServer } from '../../test-support/effects-server.js';

export const dsn = process.env.DURABLE_LEDGER_DSN;
if (!dsn) throw new Error('set DURABLE_LEDGER_DSN to a superuser connection string of a database with durable_ledger');

/**
 * The cluster of a test file, open while its tests run: `pool` (a pg.Pool), `ledger` (a
 * Ledger on it), `admin` (a client of its own: a person); with `effects`, `effects` too
 * (the downstream system of adapters/test-support, which counts what really happened).
 * @param {{effects?: boolean}} [options]
 */
export function cluster({ effects = false } = {}) {
  /** @type {{pool: pg.Pool, ledger: Ledger, admin: pg.Client, effects: Awaited<ReturnType<typeof startEffectsServer>>}} */
  const db = /** @type {any} */ ({});
  before(async () => {
    db.pool = new pg.Pool({ connectionString: dsn, max: 4 });
    db.ledger = new Ledger(db.pool, { consoleWarn: false });
    db.admin = new pg.Client({ connectionString: dsn });
    await db.admin.connect();
    if (effects) db.effects = await startEffectsServer();
  });
  after(async () => {
    await db.effects?.close();
    await db.admin.end();
    await db.pool.end();
  });
  return db;
}

const usage = {
  inputTokens: { total: 1, noCache: 1, cacheRead: 0, cacheWrite: 0 },
  outputTokens: { total: 1, text: 1, reasoning: 0 },
};

/** A tool call of a model turn; its id by default a real provider's: new each time the model is asked. */
export const toolCall = (toolName, input, toolCallId = `call_${randomUUID()}`) => ({
  type: 'tool-call', toolCallId, toolName, input: JSON.stringify(input),
});
/** A turn that calls tools (its content: tool calls, and text if any). */
export const calling = (...content) => ({ content, finishReason: { unified: 'tool-calls', raw: undefined },
  usage, warnings: [] });
/** A turn that answers. */
export const answer = (text) => ({ content: [{ type: 'text', text }], finishReason: { unified: 'stop', raw: undefined },
  usage, warnings: [] });
/** The chunks of a streamed turn that calls tools. */
export const streamCalling = (...calls) => [{ type: 'stream-start', warnings: [] }, ...calls,
  { type: 'finish', finishReason: { unified: 'tool-calls', raw: undefined }, usage }];
/** The chunks of a streamed turn that answers. */
export const streamAnswer = (text) => [{ type: 'stream-start', warnings: [] }, { type: 'text-start', id: 't' },
  { type: 'text-delta', id: 't', delta: text }, { type: 'text-end', id: 't' },
  { type: 'finish', finishReason: { unified: 'stop', raw: undefined }, usage }];
/** The output of the last tool result of a prompt (its last message's). */
export const lastToolOutput = (prompt) => prompt.at(-1).content.find((p) => p.type === 'tool-result')?.output;
