// What the adapter's tests share: the ledger (DURABLE_LEDGER_DSN, a superuser: the tests
// resolve, break leases, abandon runs and fork them as a person and an admin would).
import pg from 'pg';
import { Ledger } from 'durable-ledger';

export const DSN = process.env.DURABLE_LEDGER_DSN;
if (!DSN) throw new Error('set DURABLE_LEDGER_DSN to a superuser connection string of a database with durable_ledger');

/** A pool and a Ledger on it, as a worker's. */
export function ledgerPool() {
  const pool = new pg.Pool({ connectionString: DSN, max: 4 });
  return { pool, ledger: new Ledger(pool, { consoleWarn: false }) };
}

/** A statement as a person or an admin (a superuser). */
export async function sql(query, params = []) {
  const client = new pg.Client({ connectionString: DSN });
  await client.connect();
  try {
    return (await client.query(query, params)).rows;
  } finally {
    await client.end();
  }
}

/** The effects of a run: tool and status, by tool. @param {string} run */
export function effectsOf(run) {
  return sql('SELECT tool, status::text AS status, key FROM durable_ledger.effects WHERE run = $1 ORDER BY tool', [run]);
}

/** The text of a tool's result. @param {any} result */
export const text = (result) => result.content.map((c) => c.text).join('\n');

/** The results a worker printed, by tool (the last of each). @param {string} stdout */
export function printed(stdout) {
  return Object.fromEntries([...stdout.matchAll(/^result (\S+) (.*)$/gm)].map((m) => [m[1], JSON.parse(m[2])]));
}
