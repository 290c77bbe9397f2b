// The statements of a session attempt (attempt(), acquireRun()), each of which
// checks in the database, in the very statement, that it reached the session
// that holds the attempt's lease: through a transaction pooler (PgBouncer in
// pool_mode = transaction, a pooled endpoint) consecutive statements of one
// client land on different server connections, and a session lock stays on
// the one where it was taken, where other clients meet it.  The Python client
// sends the same statements.
//
//   start   acquire_run, with the epoch of the session's lease and its backend
//           pid, kept for the attempt;
//   begin   begin_effect / begin_recorded, called only (CASE) when the
//           statement's session holds the run at the attempt's epoch; its pid
//           and that session's epoch (asked once) come back in any case
//           (OFFSET 0 keeps each subquery, and so the call, evaluated once);
//   end     release_run under the same condition; when it did not hold,
//           release_attempt(run, epoch) ends the lease wherever it is held.
// Reports (complete_effect, fail_effect) name their attempt and need no guard.

/** acquire_run($1 run, $2 wait), and this session's epoch and pid: a.acquired, epoch, pid. */
export const ACQUIRE_ATTEMPT =
  'SELECT a.acquired, durable_ledger.session_epoch($1::text) AS epoch, pg_backend_pid() AS pid ' +
  'FROM (SELECT durable_ledger.acquire_run($1::text, $2::boolean) AS acquired OFFSET 0) a';

/**
 * The guarded form of a begin: `call` is the function call (its run is $1),
 * `epochParam` the placeholder number of the attempt's epoch.  Returns guard_pid,
 * guard_epoch and the decision's columns (all null when nothing was called).
 * @param {string} call
 * @param {number} epochParam
 * @returns {string}
 */
export function guardedBegin(call, epochParam) {
  return 'SELECT s.pid AS guard_pid, s.epoch AS guard_epoch, (g.d).* FROM (SELECT pg_backend_pid() AS pid, ' +
    'durable_ledger.session_epoch($1::text) AS epoch OFFSET 0) s, ' +
    `LATERAL (SELECT CASE WHEN s.epoch = $${epochParam}::bigint THEN ${call} END AS d OFFSET 0) g`;
}

/** release_run($1 run) when this session holds it at epoch $2: pid, epoch, released (null: it did not). */
export const RELEASE_ATTEMPT =
  'SELECT s.pid, s.epoch, g.released FROM (SELECT pg_backend_pid() AS pid, ' +
  'durable_ledger.session_epoch($1::text) AS epoch OFFSET 0) s, ' +
  'LATERAL (SELECT CASE WHEN s.epoch = $2::bigint THEN durable_ledger.release_run($1::text) END ' +
  'AS released OFFSET 0) g';

/** Ends the session lease of run $1 at epoch $2 wherever it is held (extension 1.3). */
export const END_ATTEMPT_ELSEWHERE = 'SELECT durable_ledger.release_attempt($1::text, $2::bigint) AS ended';

/** A plain release, for a run this Ledger did not start an attempt at. */
export const RELEASE_RUN = 'SELECT durable_ledger.release_run($1::text) AS ok';

/**
 * How a guarded statement that did nothing missed the attempt's lease:
 * 'pooler' when it reached another backend than the attempt's, or a session
 * whose lease of the run is another attempt's; 'lost' when it reached the
 * attempt's own backend, which holds the run no more.
 * @param {{pid: number, epoch: string|null}} lease  the attempt's
 * @param {number} pid  the backend the statement reached
 * @param {string|null} epoch  that backend's epoch of the run (null: none)
 * @returns {'pooler'|'lost'}
 */
export function missed(lease, pid, epoch) {
  if (pid !== lease.pid) return 'pooler';
  if (epoch !== null && String(epoch) !== String(lease.epoch)) return 'pooler';
  return 'lost';
}
