// What the console reads from the ledger, always as the logged-in person:
// plain SQL on the extension's views and functions, never its tables' own
// writes.  What a page may offer is asked of PostgreSQL (has_function_privilege),
// never decided here.

// The functions behind the console's buttons, by the name the pages use.
export const FUNCTIONS = {
  resolve: 'durable_ledger.resolve_effect(text,text,jsonb,text,text,integer)',
  retry: 'durable_ledger.retry_effect(text,integer,text,text)',
  divergence: 'durable_ledger.resolve_divergence(text,text,text,text,text)',
  approve: 'durable_ledger.approve_effect(text,text,text)',
  reject: 'durable_ledger.reject_effect(text,text,text)',
  break_lease: 'durable_ledger.break_lease(text,text,text)',
  abandon: 'durable_ledger.abandon_run(text,text,text)',
  fork: 'durable_ledger.fork_run(text,text,text,text,text)',
  run_budget: 'durable_ledger.set_run_budget(text,text,text,text,integer,integer,integer)',
  register_tool: 'durable_ledger.register_tool(text,text,boolean,text,text[],text)',
  change_tool: 'durable_ledger.change_tool(text,text,boolean,text,text[],text)',
  retire_tool: 'durable_ledger.retire_tool(text,text,text)',
  unregistered_tools: 'durable_ledger.set_unregistered_tools(text,text,text)',
  unregistered_divergence: 'durable_ledger.set_unregistered_divergence(text,text,text)',
  history: 'durable_ledger.history(text)',
  verify_audit: 'durable_ledger.verify_audit(jsonb)',
  metrics_events: 'durable_ledger.metrics_events()',
};

// The views and tables the pages read.
const RELATIONS = {
  unresolved: 'durable_ledger.unresolved',
  effects: 'durable_ledger.effects',
  runs: 'durable_ledger.runs',
  audit_log: 'durable_ledger.audit_log',
  divergences: 'durable_ledger.divergences',
  leases: 'durable_ledger.leases',
  tools: 'durable_ledger.tools',
  policy: 'durable_ledger.policy',
  metrics: 'durable_ledger.metrics',
  run_budgets: 'durable_ledger.run_budgets',
  audit_heads: 'durable_ledger.audit_heads',
};

const privilegeQuery = (() => {
  // a name in the schema cannot even be looked up without USAGE on it (CASE:
  // the lookup is not made then; AND would not promise the order); a
  // function or relation that is not there (another version of the ledger)
  // is one the role may not use, not an error
  const usage = "pg_catalog.has_schema_privilege('durable_ledger', 'USAGE')";
  const parts = [];
  for (const [name, fn] of Object.entries(FUNCTIONS)) {
    parts.push(`CASE WHEN ${usage} THEN coalesce(pg_catalog.has_function_privilege(pg_catalog.to_regprocedure('${fn}'), 'EXECUTE'), false) ELSE false END AS "${name}"`);
  }
  for (const [name, rel] of Object.entries(RELATIONS)) {
    parts.push(`CASE WHEN ${usage} THEN coalesce(pg_catalog.has_table_privilege(pg_catalog.to_regclass('${rel}'), 'SELECT'), false) ELSE false END AS "read_${name}"`);
  }
  // the role may still log in: not dropped, LOGIN, its password not expired
  parts.push(`EXISTS (SELECT FROM pg_catalog.pg_roles r WHERE r.rolname = session_user AND r.rolcanlogin
                       AND (r.rolvaliduntil IS NULL OR r.rolvaliduntil > pg_catalog.now())) AS may_log_in`);
  // the role's name now (ALTER ROLE ... RENAME while logged in): what the
  // page shows and what an action records
  parts.push('session_user AS role');
  return `SELECT ${parts.join(',\n       ')}`;
})();

/** What this person's role may do and read, and whether it may still log in, as PostgreSQL says now. */
export async function privileges(session) {
  const { rows } = await session.query(privilegeQuery);
  return rows[0];
}

// What a person must do about a row of `unresolved`.
function kindOf(row) {
  if (row.status === null && row.may_duplicate !== null) return 'divergence';
  if (row.status === null) return 'budget';
  // a report flagged a call awaiting approval: no verdict is taken on it, a
  // person resolves it (its page offers the resolution)
  if (row.status === 'awaiting_approval' && !row.conflict) return 'approval';
  return 'effect';
}

export const QUEUE_LIMIT = 500;

/** What waits for a person, oldest first, and how much of it there is. */
export async function queue(session) {
  const { rows } = await session.query(
    `SELECT key, run, tool, status, conflict, reason, created_at, age, args, business_key,
            occurrence, attempt, lease_epoch, may_duplicate, run_abandoned_at, downstream_key,
            reconcile_grace::text AS reconcile_grace,
            pg_catalog.date_part('epoch', age)::bigint AS age_seconds,
            pg_catalog.count(*) OVER () AS total
       FROM durable_ledger.unresolved
      ORDER BY created_at, key
      LIMIT ${QUEUE_LIMIT}`);
  return {
    items: rows.map((row) => ({ ...row, kind: kindOf(row) })),
    total: rows.length ? Number(rows[0].total) : 0,
  };
}

/** One effect, as it is now and as `unresolved` judges it, with its events. */
export async function effect(session, key, can) {
  const { rows } = await session.query('SELECT * FROM durable_ledger.effects WHERE key = $1', [key]);
  if (!rows.length) return null;
  const found = { effect: rows[0], waiting: null, events: [] };
  const waiting = await session.query(
    `SELECT status, reason, downstream_key, reconcile_grace::text AS reconcile_grace,
            pg_catalog.date_part('epoch', age)::bigint AS age_seconds
       FROM durable_ledger.unresolved WHERE key = $1 AND status IS NOT NULL`, [key]);
  found.waiting = waiting.rows[0] ?? null;
  if (can.read_audit_log) {
    const events = await session.query(
      `SELECT id, logged_at, event, attempt, lease_epoch, role_name, application_name, detail
         FROM durable_ledger.audit_log WHERE key = $1 ORDER BY id`, [key]);
    found.events = events.rows;
  }
  return found;
}

/** A drifted call and the earlier effect it may duplicate. */
export async function divergence(session, key) {
  const { rows } = await session.query('SELECT * FROM durable_ledger.divergences WHERE key = $1', [key]);
  if (!rows.length) return null;
  const candidate = await session.query(
    'SELECT * FROM durable_ledger.effects WHERE key = $1', [rows[0].candidate_key]);
  return { divergence: rows[0], candidate: candidate.rows[0] ?? null };
}

/** A run: its row, its timeline (history), its effects, budgets and live lease. */
export async function run(session, runId, can) {
  const found = { run: null, history: [], effects: [], budgets: [], leases: [] };
  if (can.read_runs) {
    const { rows } = await session.query('SELECT * FROM durable_ledger.runs WHERE run = $1', [runId]);
    found.run = rows[0] ?? null;
  }
  if (can.history) {
    const { rows } = await session.query(
      'SELECT * FROM durable_ledger.history($1) ORDER BY id LIMIT 2000', [runId]);
    found.history = rows;
  }
  if (can.read_effects && can.read_audit_log) {
    const { rows } = await session.query(
      `SELECT key, tool, args, business_key, occurrence, attempt, status, result, error,
              lease_epoch, created_at, completed_at, resolved_by, conflict, approval
         FROM durable_ledger.effects
        WHERE run = $1
          -- found through the audit log's index on run (effects has none of
          -- its own on run alone: it would cost every write)
          AND key IN (SELECT key FROM durable_ledger.audit_log WHERE run = $1 AND key IS NOT NULL)
        ORDER BY created_at, key LIMIT 2000`, [runId]);
    // a started effect whose lease has ended is unknown, as unresolved judges it
    const judged = can.read_unresolved ? new Map((await session.query(
      'SELECT key, status FROM durable_ledger.unresolved WHERE run = $1 AND status IS NOT NULL', [runId])).rows
      .map((r) => [r.key, r.status])) : new Map();
    found.effects = rows.map((e) => ({ ...e, status: judged.get(e.key) ?? e.status }));
  }
  if (can.read_run_budgets) {
    const { rows } = await session.query(
      'SELECT * FROM durable_ledger.run_budgets WHERE run = $1 ORDER BY tool', [runId]);
    found.budgets = rows;
  }
  if (can.read_leases) {
    const { rows } = await session.query('SELECT * FROM durable_ledger.leases WHERE run = $1', [runId]);
    found.leases = rows;
  }
  return found;
}

export async function leases(session) {
  const { rows } = await session.query(
    'SELECT * FROM durable_ledger.leases ORDER BY since NULLS FIRST, run LIMIT 2000');
  return rows;
}

export async function tools(session, can) {
  const found = { tools: [], policy: null };
  if (can.read_tools) {
    found.tools = (await session.query(
      `SELECT tool, side_effecting, divergence, key_fields, note, registered_by, registered_at,
              changed_by, changed_at, retired_by, retired_at, reconcile_grace::text AS reconcile_grace,
              approval::text AS approval, max_executions, max_in_window, budget_window::text AS budget_window
         FROM durable_ledger.tools ORDER BY tool`)).rows;
  }
  if (can.read_policy) {
    found.policy = (await session.query('SELECT * FROM durable_ledger.policy')).rows[0] ??
      { unregistered_tools: 'allow', unregistered_divergence: 'pause' };
  }
  return found;
}

export async function metrics(session, can) {
  const found = { now: null, events: [] };
  if (can.read_metrics) found.now = (await session.query('SELECT * FROM durable_ledger.metrics')).rows[0];
  if (can.metrics_events) {
    found.events = (await session.query('SELECT * FROM durable_ledger.metrics_events() ORDER BY event')).rows;
  }
  return found;
}

/** The audit chains' heads and what verify_audit finds (given heads kept outside, or none). */
export async function audit(session, can, keptHeads) {
  const found = { heads: [], problems: null };
  if (can.read_audit_heads) {
    found.heads = (await session.query(
      'SELECT chain, chain_seq, id, logged_at, row_hash FROM durable_ledger.audit_heads ORDER BY chain')).rows;
  }
  if (can.verify_audit && keptHeads !== undefined) {
    found.problems = (await session.query(
      'SELECT * FROM durable_ledger.verify_audit($1::jsonb)', [keptHeads || null])).rows;
  }
  return found;
}
