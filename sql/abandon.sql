-- abandon: abandon_run(run, abandoned_by, note) stops a run for good.  No
-- further begin_effect, acquire_run or take_lease of it (55L02), under either
-- kind of lease and in a session that holds it already; effects in flight
-- keep their status, for a person, and reports on them are still recorded;
-- the runs table, unresolved and history show it; admins only; audited.
\set VERBOSITY default

SELECT durable_ledger.acquire_run('ab-1');
SELECT (durable_ledger.complete_effect(key, '{"paid": 1}')).status
  FROM durable_ledger.begin_effect('ab-1', 'ab.pay', '{"invoice": 1}');
SELECT key AS in_flight FROM durable_ledger.begin_effect('ab-1', 'ab.pay', '{"invoice": 2}') \gset

SELECT durable_ledger.abandon_run('ab-1', 'maria', 'the customer cancelled');
SELECT abandoned_at BETWEEN now() - interval '1 minute' AND now() AS abandoned_now, abandoned_by, abandon_note
  FROM durable_ledger.runs WHERE run = 'ab-1';
SELECT event, detail, lease_epoch FROM durable_ledger.audit_log WHERE run = 'ab-1' AND event = 'run_abandoned';
-- abandoning it again changes nothing
SELECT durable_ledger.abandon_run('ab-1', 'ana');
SELECT count(*) AS abandonments FROM durable_ledger.audit_log WHERE event = 'run_abandoned';

-- the session that holds it can call nothing more, not even a replay; nothing is written
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('ab-1', 'ab.pay', '{"invoice": 3}')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('ab-1', 'ab.pay', '{"invoice": 1}')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('ab-1', 'ab.pay', '{"invoice": 4}', 'BK-AB-1')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.acquire_run('ab-1')$$);
SELECT count(*) = :audit_rows AS nothing_written FROM durable_ledger.audit_log;
-- the effect in flight keeps its status; its report is still recorded
SELECT status FROM durable_ledger.effect_status(:'in_flight');
SELECT status FROM durable_ledger.complete_effect(:'in_flight', '{"paid": 2}');
SELECT durable_ledger.release_run('ab-1');
-- nobody takes it again, with either kind of lease
SELECT regress_sqlstate($$SELECT durable_ledger.acquire_run('ab-1')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.acquire_run('ab-1', false)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.take_lease('ab-1', '1 minute')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('ab-1', 'ab.pay', '{"invoice": 1}')$$);
SELECT count(*) AS leases FROM durable_ledger.leases WHERE run = 'ab-1';
SELECT count(*) AS lease_locks FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 17484;

-- under a token lease: its next call is refused
SELECT (durable_ledger.take_lease('ab-2', '1 minute')).token AS t \gset
SELECT key AS tok_in_flight FROM durable_ledger.begin_effect('ab-2', 'ab.pay', '{"invoice": 1}', lease => :'t') \gset
SELECT durable_ledger.abandon_run('ab-2', 'maria');
SELECT regress_sqlstate(format($$SELECT durable_ledger.begin_effect('ab-2', 'ab.pay', '{"invoice": 2}', lease => %L)$$, :'t'));
-- its effect in flight waits for a person once its lease has ended, and says the run was abandoned
SELECT durable_ledger.release_lease(:'t');
SELECT key = :'tok_in_flight' AS in_flight, status, run_abandoned_at IS NOT NULL AS run_abandoned
  FROM durable_ledger.unresolved WHERE run = 'ab-2';

-- a call remembers that its run is open (cache.c): an abandonment in the
-- same transaction refuses the next call at once, and one rolled back is
-- forgotten
SELECT durable_ledger.acquire_run('ab-4');
SELECT decision FROM durable_ledger.begin_effect('ab-4', 'ab.pay', '{"invoice": 1}');
BEGIN;
SELECT durable_ledger.abandon_run('ab-4', 'maria');
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('ab-4', 'ab.pay', '{"invoice": 2}')$$);
ROLLBACK;
SELECT decision FROM durable_ledger.begin_effect('ab-4', 'ab.pay', '{"invoice": 2}');
SELECT durable_ledger.release_run('ab-4');

-- bad input and privileges
SELECT regress_sqlstate($$SELECT durable_ledger.abandon_run('never-seen', 'maria')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.abandon_run(NULL, 'maria')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.abandon_run('ab-3', NULL)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.abandon_run('ab-3', '')$$);
CREATE ROLE regress_ab_worker IN ROLE durable_ledger_worker;
SET ROLE regress_ab_worker;
SELECT durable_ledger.acquire_run('ab-3');
SELECT regress_sqlstate($$SELECT durable_ledger.abandon_run('ab-3', 'w')$$);
SELECT durable_ledger.release_run('ab-3');
RESET ROLE;
DROP ROLE regress_ab_worker;
