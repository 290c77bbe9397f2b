-- reconcile: an unknown outcome settled from the provider's own record.
-- An admin makes a registered tool reconcilable with a grace
-- (set_reconcile(tool, grace, changed_by, note); NULL: a person decides).  A
-- worker that finds an effect of it unknown asks the provider by the
-- attempt's downstream key and, once the grace has passed since the ledger
-- found the outcome unknown, records what it said:
-- reconcile_effect(key, attempt, happened, evidence).  Happened: completed,
-- evidence its result, replayed from then on.  Did not happen: failed,
-- evidence its error, and the next call executes the next attempt under a
-- new provider key (key#attempt).  Audited as 'reconciled' with the worker's
-- role.  The same finding again changes nothing; one that contradicts the
-- record is kept as a conflict for a person.  Too early, a tool not
-- reconcilable, a started or flagged effect, another attempt and bad input
-- are errors that write nothing.
\set VERBOSITY terse

SELECT tool FROM durable_ledger.register_tool('rc_pay', 'regress');
SELECT tool FROM durable_ledger.register_tool('rc_manual', 'regress');

-- ===================================================================
-- the registry: set_reconcile
-- ===================================================================
SELECT tool, reconcile_grace FROM durable_ledger.set_reconcile('rc_pay', '1 hour', 'ops', 'the bank answers lookups by key');
SELECT detail FROM durable_ledger.audit_log WHERE event = 'tool_changed'
 AND detail ->> 'tool' = 'rc_pay' ORDER BY id DESC LIMIT 1;
-- change_tool keeps it; so does the tool's own row
SELECT tool, reconcile_grace, divergence FROM durable_ledger.change_tool('rc_pay', 'ops', divergence => 'warn');
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_sqlstate($$SELECT durable_ledger.set_reconcile('rc_nobody', '1 minute', 'ops')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_reconcile('rc_pay', '-1 second', 'ops')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_reconcile('rc_pay', '1 minute', NULL)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_reconcile(NULL, '1 minute', 'ops')$$);
SELECT tool FROM durable_ledger.register_tool('rc_retired', 'regress');
SELECT tool FROM durable_ledger.retire_tool('rc_retired', 'regress');
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_sqlstate($$SELECT durable_ledger.set_reconcile('rc_retired', '1 minute', 'ops')$$);
SELECT count(*) - :audit_rows AS audit_rows_written FROM durable_ledger.audit_log;

-- ===================================================================
-- a worker was lost mid-payment: the next call pauses, unknown
-- ===================================================================
SELECT durable_ledger.effect_key('rc-1', 'rc_pay', '{"amount": 10}', 1) AS k1 \gset
SELECT decision FROM durable_ledger.begin_effect('rc-1', 'rc_pay', '{"amount": 10}');
SELECT durable_ledger.release_run('rc-1');
SELECT decision, status, attempt, downstream_key = key AS provider_key
  FROM durable_ledger.begin_effect('rc-1', 'rc_pay', '{"amount": 10}');
SELECT durable_ledger.release_run('rc-1');
-- unresolved says a reconciler may settle it, and after what grace
SELECT key = :'k1' AS listed, status, reconcile_grace, downstream_key = key AS provider_key
  FROM durable_ledger.unresolved WHERE run = 'rc-1';

-- reconcilable_from says when (a worker asks the provider after it): the
-- moment the outcome was found unknown, plus the grace
SELECT durable_ledger.reconcilable_from(:'k1', 1)
       = (SELECT logged_at + interval '1 hour' FROM durable_ledger.audit_log
           WHERE key = :'k1' AND event = 'pause') AS found_plus_grace,
       durable_ledger.reconcilable_from(:'k1', 2) IS NULL AS not_for_another_attempt;
-- too early: the grace counts from when the outcome was found unknown
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regexp_replace(regress_sqlstate(format($$SELECT durable_ledger.reconcile_effect(%L, 1, false, '{"found": false}')$$, :'k1')),
                      'from .*', 'from (the time)');
SELECT status, execute_again FROM durable_ledger.effects WHERE key = :'k1';
SELECT count(*) - :audit_rows AS audit_rows_written FROM durable_ledger.audit_log;

-- a grace of a second: once the server's clock has passed it, it may
SELECT tool FROM durable_ledger.set_reconcile('rc_pay', '1 second', 'ops');
DO $$
DECLARE
    found_at timestamptz := (SELECT logged_at FROM durable_ledger.audit_log
                              WHERE key = durable_ledger.effect_key('rc-1', 'rc_pay', '{"amount": 10}', 1)
                                AND event = 'pause' ORDER BY id LIMIT 1);
BEGIN
    WHILE pg_catalog.clock_timestamp() < found_at + interval '1 second' LOOP
        PERFORM pg_catalog.pg_sleep(0.05);
    END LOOP;
END
$$;

-- the provider had it: completed, its record the result
SELECT status, result, error, execute_again, resolved_by, conflict, completed_at IS NOT NULL AS has_completed_at
  FROM durable_ledger.reconcile_effect(:'k1', 1, true, '{"payment": "pay-1", "source": "bank lookup"}');
SELECT event, attempt, detail, role_name = current_user AS by_current_user
  FROM durable_ledger.audit_log WHERE key = :'k1' AND event = 'reconciled';
SELECT count(*) AS unresolved FROM durable_ledger.unresolved WHERE run = 'rc-1';
SELECT durable_ledger.reconcilable_from(:'k1', 1) IS NULL AS settled_not_reconcilable;
SELECT count(*) AS unsettled FROM durable_ledger.unsettled WHERE key = :'k1';
-- the same finding again (a second reconciler, a retry): no change, no row
SELECT status, result FROM durable_ledger.reconcile_effect(:'k1', 1, true, '{"payment": "pay-1", "seen": 2}');
SELECT count(*) AS reconciled_rows FROM durable_ledger.audit_log WHERE key = :'k1' AND event = 'reconciled';
-- the next call replays it
SELECT decision, status, result FROM durable_ledger.begin_effect('rc-1', 'rc_pay', '{"amount": 10}');
SELECT durable_ledger.release_run('rc-1');

-- ===================================================================
-- the provider had no record: failed, and made again as attempt 2 under
-- a new provider key, once
-- ===================================================================
SELECT tool FROM durable_ledger.set_reconcile('rc_pay', '0', 'ops');
SELECT durable_ledger.effect_key('rc-2', 'rc_pay', '{"amount": 20}', 1) AS k2 \gset
SELECT decision FROM durable_ledger.begin_effect('rc-2', 'rc_pay', '{"amount": 20}');
SELECT durable_ledger.release_run('rc-2');
SELECT decision, status FROM durable_ledger.begin_effect('rc-2', 'rc_pay', '{"amount": 20}');
SELECT durable_ledger.release_run('rc-2');
SELECT status, result, error, execute_again, resolved_by
  FROM durable_ledger.reconcile_effect(:'k2', 1, false, '{"lookup": "no payment with that key"}');
-- asked again: no change
SELECT status, error FROM durable_ledger.reconcile_effect(:'k2', 1, false, '{"lookup": "still none"}');
SELECT decision, status, attempt, reason, downstream_key = key || '#2' AS new_provider_key
  FROM durable_ledger.begin_effect('rc-2', 'rc_pay', '{"amount": 20}');
SELECT attempt, status, error FROM durable_ledger.past_attempts WHERE key = :'k2';
SELECT status, attempt FROM durable_ledger.complete_effect(:'k2', '{"payment": "pay-2"}', 2);
SELECT durable_ledger.acquire_run('rc-2');
SELECT decision, status, attempt FROM durable_ledger.begin_effect('rc-2', 'rc_pay', '{"amount": 20}');
-- a late finding about attempt 1 that it did not happen changes nothing
SELECT status, attempt, conflict FROM durable_ledger.reconcile_effect(:'k2', 1, false, '{"lookup": "none"}');
-- that it happened after all: the payment may have happened twice; kept
-- for a person, under attempt 1
SELECT status, attempt, conflict FROM durable_ledger.reconcile_effect(:'k2', 1, true, '{"payment": "pay-1-late"}');
SELECT event, attempt, detail ->> 'why' AS why, detail ->> 'report' AS report, detail -> 'result' AS result
  FROM durable_ledger.audit_log WHERE key = :'k2' AND event = 'conflict';
SELECT durable_ledger.release_run('rc-2');
SELECT d.decision, d.status, d.attempt, e.conflict
  FROM durable_ledger.begin_effect('rc-2', 'rc_pay', '{"amount": 20}') d
  JOIN durable_ledger.effects e USING (key);
SELECT durable_ledger.release_run('rc-2');

-- ===================================================================
-- evidence that an earlier attempt happened after all is kept whatever the
-- effect is doing now: here attempt 2 is in flight, under a live lease
-- ===================================================================
SELECT durable_ledger.effect_key('rc-10', 'rc_pay', '{"amount": 100}', 1) AS k10 \gset
SELECT decision FROM durable_ledger.begin_effect('rc-10', 'rc_pay', '{"amount": 100}');
SELECT durable_ledger.release_run('rc-10');
SELECT decision FROM durable_ledger.begin_effect('rc-10', 'rc_pay', '{"amount": 100}');
SELECT durable_ledger.release_run('rc-10');
SELECT status FROM durable_ledger.reconcile_effect(:'k10', 1, false, '{"lookup": "none"}');
SELECT decision, attempt FROM durable_ledger.begin_effect('rc-10', 'rc_pay', '{"amount": 100}');
SELECT status, attempt, conflict FROM durable_ledger.reconcile_effect(:'k10', 1, true, '{"payment": "pay-10-late"}');
SELECT detail -> 'result' AS kept FROM durable_ledger.audit_log WHERE key = :'k10' AND event = 'conflict';
SELECT durable_ledger.release_run('rc-10');

-- ===================================================================
-- a business key: its next attempt is key#2 as after any failure
-- ===================================================================
SELECT decision, attempt, downstream_key FROM durable_ledger.begin_effect('rc-3', 'rc_pay', '{"invoice": 3}', 'RC-INV-3');
SELECT durable_ledger.release_run('rc-3');
SELECT decision, status FROM durable_ledger.begin_effect('rc-3', 'rc_pay', '{"invoice": 3}', 'RC-INV-3');
SELECT downstream_key FROM durable_ledger.unresolved WHERE key = 'RC-INV-3';
SELECT status FROM durable_ledger.reconcile_effect('RC-INV-3', 1, false, '{"lookup": "none"}');
SELECT decision, attempt, downstream_key, reason FROM durable_ledger.begin_effect('rc-3', 'rc_pay', '{"invoice": 3}', 'RC-INV-3');
SELECT durable_ledger.release_run('rc-3');

-- ===================================================================
-- a finding that contradicts a person's decision is kept for a person
-- ===================================================================
SELECT durable_ledger.effect_key('rc-4', 'rc_pay', '{"amount": 40}', 1) AS k4 \gset
SELECT decision FROM durable_ledger.begin_effect('rc-4', 'rc_pay', '{"amount": 40}');
SELECT durable_ledger.release_run('rc-4');
SELECT decision FROM durable_ledger.begin_effect('rc-4', 'rc_pay', '{"amount": 40}');
SELECT durable_ledger.release_run('rc-4');
SELECT status FROM durable_ledger.resolve_effect(:'k4', 'completed', '{"payment": "pay-4"}', 'alice', 'seen at the bank', 1);
SELECT status, conflict FROM durable_ledger.reconcile_effect(:'k4', 1, false, '{"lookup": "none"}');
SELECT reason FROM durable_ledger.unresolved WHERE key = :'k4';
-- flagged, it waits for a person: no reconciler may settle it; a finding
-- that agrees with the recorded completion changes nothing
SELECT durable_ledger.reconcilable_from(:'k4', 1) IS NULL AS flagged_not_reconcilable;
SELECT status, conflict FROM durable_ledger.reconcile_effect(:'k4', 1, true, '{"payment": "pay-4"}');
SELECT count(*) AS conflict_rows FROM durable_ledger.audit_log WHERE key = :'k4' AND event = 'conflict';

-- ===================================================================
-- the grace is a fixed length, whatever the session's time zone: days of
-- 24 hours (200 days cross a change of daylight saving time in New York)
-- ===================================================================
SELECT tool FROM durable_ledger.set_reconcile('rc_pay', '200 days', 'ops');
SELECT durable_ledger.effect_key('rc-11', 'rc_pay', '{"amount": 110}', 1) AS k11 \gset
SELECT decision FROM durable_ledger.begin_effect('rc-11', 'rc_pay', '{"amount": 110}');
SELECT durable_ledger.release_run('rc-11');
SELECT decision FROM durable_ledger.begin_effect('rc-11', 'rc_pay', '{"amount": 110}');
SELECT durable_ledger.release_run('rc-11');
SET TimeZone = 'America/New_York';
SELECT extract(epoch FROM durable_ledger.reconcilable_from(:'k11', 1)
               - (SELECT logged_at FROM durable_ledger.audit_log WHERE key = :'k11' AND event = 'pause'))
       = 200 * 86400 AS two_hundred_days_of_24_hours;
RESET TimeZone;
-- and in range: at most a year; a grace that counts to nothing is none
SELECT regress_sqlstate($$SELECT durable_ledger.set_reconcile('rc_pay', '1000000 years', 'ops')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_reconcile('rc_pay', '367 days', 'ops')$$);
SELECT reconcile_grace FROM durable_ledger.set_reconcile('rc_pay', '1 day -24 hours', 'ops');
SELECT tool FROM durable_ledger.set_reconcile('rc_pay', '0', 'ops');

-- ===================================================================
-- a business key used again after purge_settled removed its first life:
-- the grace counts from when its new life was found unknown, not from the
-- earlier life's pause still in the audit log
-- ===================================================================
SELECT tool FROM durable_ledger.set_reconcile('rc_pay', '1 hour', 'ops');
SELECT decision FROM durable_ledger.begin_effect('rc-12', 'rc_pay', '{"invoice": 12}', 'RC-INV-12');
SELECT durable_ledger.release_run('rc-12');
SELECT decision FROM durable_ledger.begin_effect('rc-12', 'rc_pay', '{"invoice": 12}', 'RC-INV-12');
SELECT durable_ledger.release_run('rc-12');
SELECT status FROM durable_ledger.resolve_effect('RC-INV-12', 'completed', '{"payment": "p12"}', 'alice', NULL, 1);
SELECT run, effects FROM durable_ledger.purge_settled('0', 'ops', dry_run => false) WHERE run = 'rc-12';
SELECT count(*) AS earlier_life_pauses FROM durable_ledger.audit_log
 WHERE key = 'RC-INV-12' AND event = 'pause';
SELECT decision, attempt FROM durable_ledger.begin_effect('rc-13', 'rc_pay', '{"invoice": 12}', 'RC-INV-12');
SELECT durable_ledger.release_run('rc-13');
SELECT decision, status FROM durable_ledger.begin_effect('rc-13', 'rc_pay', '{"invoice": 12}', 'RC-INV-12');
SELECT durable_ledger.release_run('rc-13');
SELECT durable_ledger.reconcilable_from('RC-INV-12', 1)
       = (SELECT max(logged_at) + interval '1 hour' FROM durable_ledger.audit_log
           WHERE key = 'RC-INV-12' AND event = 'pause') AS from_the_new_life;
SELECT left(regress_sqlstate($$SELECT durable_ledger.reconcile_effect('RC-INV-12', 1, false, '{}')$$), 5)
       AS too_early;
SELECT tool FROM durable_ledger.set_reconcile('rc_pay', '0', 'ops');

-- ===================================================================
-- refusals: each writes nothing
-- ===================================================================
-- started under this session's live lease: its worker reports
SELECT durable_ledger.effect_key('rc-7', 'rc_pay', '{"amount": 70}', 1) AS k7 \gset
SELECT decision FROM durable_ledger.begin_effect('rc-7', 'rc_pay', '{"amount": 70}');
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_sqlstate(format($$SELECT durable_ledger.reconcile_effect(%L, 1, true, '{}')$$, :'k7'));
SELECT durable_ledger.reconcilable_from(:'k7', 1) IS NULL AS started_not_reconcilable;
-- ended, but not yet found unknown: a call finds it so first
SELECT durable_ledger.release_run('rc-7');
SELECT regress_sqlstate(format($$SELECT durable_ledger.reconcile_effect(%L, 1, true, '{}')$$, :'k7'));
SELECT count(*) - :audit_rows AS audit_rows_written FROM durable_ledger.audit_log;
-- a tool nobody made reconcilable
SELECT durable_ledger.effect_key('rc-5', 'rc_manual', '{"n": 5}', 1) AS k5 \gset
SELECT decision FROM durable_ledger.begin_effect('rc-5', 'rc_manual', '{"n": 5}');
SELECT durable_ledger.release_run('rc-5');
SELECT decision FROM durable_ledger.begin_effect('rc-5', 'rc_manual', '{"n": 5}');
SELECT durable_ledger.release_run('rc-5');
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT durable_ledger.reconcilable_from(:'k5', 1) IS NULL AS tool_not_reconcilable;
SELECT regress_sqlstate(format($$SELECT durable_ledger.reconcile_effect(%L, 1, true, '{}')$$, :'k5'));
-- and once the tool is no longer reconcilable
SELECT tool, reconcile_grace FROM durable_ledger.set_reconcile('rc_pay', NULL, 'ops', 'the lookup API is down');
SELECT durable_ledger.effect_key('rc-6', 'rc_pay', '{"amount": 60}', 1) AS k6 \gset
SELECT decision FROM durable_ledger.begin_effect('rc-6', 'rc_pay', '{"amount": 60}');
SELECT durable_ledger.release_run('rc-6');
SELECT decision FROM durable_ledger.begin_effect('rc-6', 'rc_pay', '{"amount": 60}');
SELECT durable_ledger.release_run('rc-6');
SELECT reconcile_grace FROM durable_ledger.unresolved WHERE key = :'k6';
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_sqlstate(format($$SELECT durable_ledger.reconcile_effect(%L, 1, true, '{}')$$, :'k6'));
SELECT tool FROM durable_ledger.set_reconcile('rc_pay', '0', 'ops');
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
-- another attempt; bad input
SELECT regress_sqlstate(format($$SELECT durable_ledger.reconcile_effect(%L, 2, true, '{}')$$, :'k6'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.reconcile_effect(%L, 0, true, '{}')$$, :'k6'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.reconcile_effect(%L, NULL, true, '{}')$$, :'k6'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.reconcile_effect(%L, 1, NULL, '{}')$$, :'k6'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.reconcile_effect(%L, 1, true, NULL)$$, :'k6'));
SELECT regress_sqlstate($$SELECT durable_ledger.reconcile_effect(NULL, 1, true, '{}')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.reconcile_effect('no-such-key', 1, true, '{}')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.reconcilable_from(NULL, 1)$$);
SELECT regress_sqlstate(format($$SELECT durable_ledger.reconcilable_from(%L, NULL)$$, :'k6'));
SELECT durable_ledger.reconcilable_from('no-such-key', 1) IS NULL AS unknown_key_not_reconcilable;
SELECT durable_ledger.reconcilable_from(:'k6', 1) <= clock_timestamp() AS k6_due;
SELECT count(*) - :audit_rows AS audit_rows_written FROM durable_ledger.audit_log;

-- rolled back, a reconcile leaves nothing
BEGIN;
SELECT status FROM durable_ledger.reconcile_effect(:'k6', 1, false, '{"lookup": "none"}');
ROLLBACK;
SELECT status, execute_again FROM durable_ledger.effects WHERE key = :'k6';
SELECT count(*) AS reconciled_rows FROM durable_ledger.audit_log WHERE key = :'k6' AND event = 'reconciled';

-- ===================================================================
-- who may: a worker reconciles (its role is in the audit row); an auditor
-- may not; set_reconcile is an admin's
-- ===================================================================
CREATE ROLE regress_rc_worker;
GRANT durable_ledger_worker TO regress_rc_worker;
CREATE ROLE regress_rc_auditor;
GRANT durable_ledger_auditor TO regress_rc_auditor;
SET ROLE regress_rc_auditor;
SELECT regress_sqlstate(format($$SELECT durable_ledger.reconcile_effect(%L, 1, false, '{}')$$, :'k6'));
RESET ROLE;
SET ROLE regress_rc_worker;
SELECT regress_sqlstate($$SELECT durable_ledger.set_reconcile('rc_pay', '0', 'mallory')$$);
SELECT status, execute_again FROM durable_ledger.reconcile_effect(:'k6', 1, false, '{"lookup": "none"}');
RESET ROLE;
SELECT role_name, detail ->> 'happened' AS happened FROM durable_ledger.audit_log
 WHERE key = :'k6' AND event = 'reconciled';
-- a reconciled effect is told from a resolved one: the audit row's event,
-- and nobody named in the effect's row
SELECT event, count(*) FROM durable_ledger.audit_log
 WHERE run LIKE 'rc-%' AND event IN ('reconciled', 'resolved') GROUP BY event ORDER BY event;
DROP ROLE regress_rc_worker;
DROP ROLE regress_rc_auditor;
