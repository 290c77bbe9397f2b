// What the LangGraph tests share: the cluster (DURABLE_LEDGER_DSN, a superuser: the
// tests act as the on-call person too), a wait for a condition (polled, never a fixed
// sleep), what a person does (break a dead worker's lease, resolve a paused effect with
// what the downstream system says it did), and the effects of a run.
import { fileURLToPath } from 'node:url';
import pg from 'pg';
import { PostgresSaver } from '@langchain/langgraph-checkpoint-postgres';
import { spawnWorker } from '../../test-support/worker.js';

export const DSN = process.env.DURABLE_LEDGER_DSN ?? 'postgresql://postgres@/postgres';
export const WORKER = fileURLToPath(new URL('./worker.js', import.meta.url));

/** @type {pg.Pool | null} */
let pool = null;
export function admin() {
  pool ??= new pg.Pool({ connectionString: DSN, max: 3 });
  return pool;
}
export async function closeAdmin() {
  if (pool) await pool.end();
  pool = null;
}

/** The PostgresSaver's tables, made once (the workers only use them). */
export async function setupCheckpoints() {
  const saver = PostgresSaver.fromConnString(DSN);
  try {
    await saver.setup();
  } finally {
    await saver.end();
  }
}

/**
 * Polls `check` until it returns a truthy value (returned), for at most `seconds`.
 * @template T
 * @param {() => Promise<T> | T} check
 * @param {string} what
 * @param {number} [seconds]
 * @returns {Promise<T>}
 */
export async function waitFor(check, what, seconds = 60) {
  const until = Date.now() + seconds * 1000;
  for (;;) {
    const got = await check();
    if (got) return got;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/** @param {string} run */
export async function effectsOf(run) {
  const { rows } = await admin().query(
    'SELECT key, tool, status::text AS status, result FROM durable_ledger.effects WHERE run = $1 ORDER BY created_at, key',
    [run]);
  return rows;
}

/** @param {string} run @param {string} tool */
export async function statusOf(run, tool) {
  const { rows } = await admin().query(
    'SELECT status::text AS status FROM durable_ledger.effects WHERE run = $1 AND tool = $2', [run, tool]);
  return rows.map((r) => r.status);
}

/** The on-call ends a killed worker's token lease (it would stay until its ttl). @param {string} run */
export async function breakLease(run) {
  const { rows } = await admin().query(
    "SELECT durable_ledger.break_lease($1, 'on-call', 'the worker was killed') AS broken", [run]);
  return rows[0].broken;
}

/**
 * A person resolves a paused effect as completed, with what the downstream system says it
 * did under the effect's idempotency key.
 * @param {string} key
 * @param {unknown} result
 */
export async function resolveCompleted(key, result) {
  await admin().query(
    "SELECT durable_ledger.resolve_effect($1, 'completed', $2::jsonb, 'on-call', 'checked the provider by its key')",
    [key, JSON.stringify(result)]);
}

/**
 * Runs a worker to its end.
 * @param {string[]} args
 * @param {Record<string, string>} env
 */
export async function runWorker(args, env) {
  const w = spawnWorker(WORKER, args, { DURABLE_LEDGER_DSN: DSN, ...env });
  const done = await w.exit;
  return { ...done, ...parsed(done.stdout) };
}

/** What a worker printed. @param {string} stdout */
export function parsed(stdout) {
  const result = stdout.match(/^result: (.*)$/m);
  const stopped = stdout.match(/^stopped: (.*)$/m);
  const interrupts = stdout.match(/^interrupts: (.*)$/m);
  const state = stdout.match(/^state: (.*)$/m);
  const next = stdout.match(/^next: (.*)$/m);
  return {
    result: result ? JSON.parse(result[1]) : null,
    stopped: stopped ? stopped[1] : null,
    interrupts: interrupts ? JSON.parse(interrupts[1]) : null,
    state: state ? JSON.parse(state[1]) : null,
    next: next ? JSON.parse(next[1]) : null,
    modelCalls: (stdout.match(/^model: /gm) ?? []).length,
  };
}
