// The console's buttons: each is one call of a ledger function, made on the
// person's own connection.  Nothing here checks a privilege or a state: the
// function does (42501 for a role that may not, 55000 for an attempt that a
// later one replaced, ...), and its error is what the person is shown.  Form
// fields are passed as text and cast by PostgreSQL, so bad input gets
// PostgreSQL's own error (22P02 for JSON that is not JSON) and writes nothing.

/** The console's own refusal: the page showed another state than the ledger's now. */
export class StalePage extends Error {}

/** The console's own refusal: a field naming a key, run or tool did not decode (ids.js). */
export class BadForm extends Error {}

const text = (v) => (v === undefined || v === null || String(v).trim() === '' ? null : String(v));
const required = (v) => (v === undefined || v === null ? '' : String(v));

// The name a function records (resolved_by, broken_by, ...): the logged-in
// role, and the name the person typed when it says more than the role does.
export function recordedName(role, typed) {
  const name = text(typed)?.trim();
  return !name || name === role ? role : `${name} (${role})`;
}

// key_fields of change_tool: blank keeps them, "{}" means none (the whole
// args), else a comma-separated list
function keyFields(v) {
  const s = text(v);
  if (s === null) return null;
  if (s.trim() === '{}') return [];
  return s.split(',').map((f) => f.trim());
}

function sameAttempt(f, rows) {
  const now = rows[0]?.attempt;
  if (String(now) !== String(f.attempt)) {
    throw new StalePage(`the page showed attempt ${f.attempt} of this call; the ledger has attempt ${now} now, ` +
      'which is another call: nothing was decided');
  }
}

const bool = (v) => (text(v) === null ? null : v === 'true' || v === 'on');

/**
 * Each action: its SQL, its arguments from the form and the person's name,
 * what to say when it is done, and `ids`: the form fields that name a key, a
 * run or a tool, which the pages encode (ids.js) and the console decodes
 * before anything runs.
 */
export const ACTIONS = {
  resolve: {
    ids: ['key'],
    sql: 'SELECT key, status, attempt FROM durable_ledger.resolve_effect($1, $2, $3::jsonb, $4, $5, $6::integer)',
    args: (f, name) => [required(f.key), required(f.outcome), text(f.result), name, text(f.note), text(f.attempt)],
    done: (f) => `Effect resolved as ${f.outcome} (attempt ${f.attempt}).`,
  },
  retry: {
    ids: ['key'],
    sql: 'SELECT key FROM durable_ledger.retry_effect($1, $2::integer, $3, $4)',
    args: (f, name) => [required(f.key), text(f.attempt), name, text(f.note)],
    done: (f) => `Attempt ${f.attempt} did not happen: the next call executes the next attempt.`,
  },
  divergence: {
    ids: ['key', 'same_as'],
    sql: 'SELECT key FROM durable_ledger.resolve_divergence($1, $2, $3, $4, $5)',
    args: (f, name) => [required(f.key), required(f.verdict), name, text(f.note), text(f.same_as)],
    done: (f) => `Divergence decided: ${f.verdict}.`,
  },
  // approve_effect and reject_effect take no attempt: the verdict is kept
  // only when the call it decided is the attempt the page showed (a business
  // key's later attempt may ask for other args); else it is rolled back
  approve: {
    ids: ['key'],
    sql: 'SELECT key, attempt FROM durable_ledger.approve_effect($1, $2, $3)',
    args: (f, name) => [required(f.key), name, text(f.note)],
    check: sameAttempt,
    done: (f) => `Approved attempt ${f.attempt}: the run's next call executes it, once.`,
  },
  reject: {
    ids: ['key'],
    sql: 'SELECT key, attempt FROM durable_ledger.reject_effect($1, $2, $3)',
    args: (f, name) => [required(f.key), name, text(f.note)],
    check: sameAttempt,
    done: (f) => `Rejected attempt ${f.attempt}: every call of it replays the rejection.`,
  },
  break_lease: {
    ids: ['run'],
    sql: 'SELECT durable_ledger.break_lease($1, $2, $3) AS broken',
    args: (f, name) => [required(f.run), name, text(f.note)],
    done: (f, rows) => (rows[0]?.broken ? `The lease of ${f.run} was broken.` : `Nobody held ${f.run}.`),
  },
  abandon: {
    ids: ['run'],
    sql: 'SELECT durable_ledger.abandon_run($1, $2, $3) AS abandoned',
    args: (f, name) => [required(f.run), name, text(f.note)],
    done: (f, rows) => (rows[0]?.abandoned ? `Run ${f.run} abandoned.` : `Run ${f.run} was abandoned already.`),
  },
  fork: {
    ids: ['run', 'up_to'],
    sql: 'SELECT durable_ledger.fork_run($1, $2, $3, $4, $5) AS carried',
    args: (f, name) => [required(f.run), required(f.new_run), required(f.up_to), name, text(f.note)],
    done: (f, rows) => `Run ${f.new_run} forked from ${f.run}, carrying ${rows[0]?.carried} effects.`,
    back: (f) => `/run?run=${encodeURIComponent(f.new_run)}`,
  },
  run_budget: {
    ids: ['run'],
    sql: 'SELECT durable_ledger.set_run_budget($1, $2, $3, $4, $5::integer, $6::integer, $7::integer)',
    args: (f, name) => [required(f.run), name, text(f.note), text(f.tool),
      text(f.max_executions), text(f.max_in_window), text(f.max_attempts)],
    done: (f) => `The budgets of run ${f.run} were set.`,
  },
  register_tool: {
    sql: 'SELECT tool FROM durable_ledger.register_tool($1, $2, $3, $4, $5, $6)',
    args: (f, name) => [required(f.tool), name, bool(f.side_effecting) ?? true, text(f.divergence),
      keyFields(f.key_fields), text(f.note)],
    done: (f) => `Tool ${f.tool} registered.`,
  },
  change_tool: {
    ids: ['tool'],
    sql: 'SELECT tool FROM durable_ledger.change_tool($1, $2, $3, $4, $5, $6)',
    args: (f, name) => [required(f.tool), name, bool(f.side_effecting), text(f.divergence),
      keyFields(f.key_fields), text(f.note)],
    done: (f) => `Tool ${f.tool} changed.`,
  },
  retire_tool: {
    ids: ['tool'],
    sql: 'SELECT tool FROM durable_ledger.retire_tool($1, $2, $3)',
    args: (f, name) => [required(f.tool), name, text(f.note)],
    done: (f) => `Tool ${f.tool} retired.`,
  },
  unregistered_tools: {
    sql: 'SELECT durable_ledger.set_unregistered_tools($1, $2, $3) AS previous',
    args: (f, name) => [required(f.setting), name, text(f.note)],
    done: (f, rows) => `Tools nobody registered: ${f.setting} (was ${rows[0]?.previous}).`,
  },
  unregistered_divergence: {
    sql: 'SELECT durable_ledger.set_unregistered_divergence($1, $2, $3) AS previous',
    args: (f, name) => [required(f.setting), name, text(f.note)],
    done: (f, rows) => `Drifted calls of tools nobody registered: ${f.setting} (was ${rows[0]?.previous}).`,
  },
};

// What a refusal means for the person, by SQLSTATE; PostgreSQL's own message follows.
const HINTS = {
  42501: 'Your role may not do this: PostgreSQL refused it (ask an administrator for the ledger role it needs).',
  55000: 'The ledger refused it in the state it is in now (a later attempt replaced the one the page showed, it was decided already, or its lease is live): the page shows it as it is now.',
  '22P02': 'A value is not valid (JSON fields must be JSON).',
  22023: 'A value is not valid.',
  22004: 'A required value is missing.',
  42704: 'There is no such key, run or tool (any more).',
  23505: 'It exists already.',
  '55L02': 'The run was abandoned.',
  '55P03': 'A lock was not granted in time: someone else is working on it. Try again.',
};

/** The message a person sees for an error of a ledger call. */
export function refusal(err) {
  if (err instanceof BadForm) {
    return { source: 'the console', code: null, hint: 'The form was not one of this console\'s pages: nothing was done.', message: err.message };
  }
  if (err instanceof StalePage) {
    return { source: 'the console', code: null, hint: 'The page showed another attempt: nothing was done. It shows the call as it is now.', message: err.message };
  }
  if (!err.code) return { source: 'the console', code: null, hint: 'The console could not do it.', message: err.message };
  return { source: 'PostgreSQL', code: err.code, hint: HINTS[err.code] ?? 'PostgreSQL refused it.', message: err.message };
}
