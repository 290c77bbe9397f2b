-- purge: purge_settled(older_than, purged_by, dry_run DEFAULT true, max_runs
-- DEFAULT 500) removes the effects of runs that are settled (every effect
-- completed or failed, none started, unknown or flagged, no divergence
-- waiting for a verdict), not held by a live lease, and quiet (nothing in
-- their audit log for older_than), with their replaced attempts, divergences
-- and token leases' counters; the runs' rows and the audit log stay.  A dry
-- run (the default) lists them and writes nothing.  A later call of a purged
-- run executes again.  (Other files' runs are purged too; only this file's
-- are shown.)
\set VERBOSITY terse

CREATE FUNCTION regress_pg_footprint() RETURNS text LANGUAGE sql AS $$
    SELECT format('%s/%s/%s/%s', (SELECT count(*) FROM durable_ledger.effects),
                  (SELECT count(*) FROM durable_ledger.audit_log),
                  (SELECT count(*) FROM durable_ledger.past_attempts),
                  (SELECT count(*) FROM durable_ledger.divergences)) $$;

-- settled: two payments completed
SELECT durable_ledger.acquire_run('pg-done');
SELECT count(durable_ledger.complete_effect(d.key, jsonb_build_object('paid', i)))
  FROM generate_series(1, 2) AS i, durable_ledger.begin_effect('pg-done', 'pg.pay', jsonb_build_object('invoice', i)) AS d;
SELECT durable_ledger.release_run('pg-done');
-- settled: a failure, and a business key that failed once and then completed
SELECT durable_ledger.acquire_run('pg-fail');
SELECT (durable_ledger.fail_effect(key, '{"declined": true}')).status
  FROM durable_ledger.begin_effect('pg-fail', 'pg.pay', '{"invoice": 3}');
SELECT (durable_ledger.fail_effect(key, '{"declined": true}', 1)).status
  FROM durable_ledger.begin_effect('pg-fail', 'pg.pay', '{"invoice": 4}', 'PG-BK-4');
SELECT (durable_ledger.complete_effect(key, '{"paid": 4}', attempt)).status
  FROM durable_ledger.begin_effect('pg-fail', 'pg.pay', '{"invoice": 4}', 'PG-BK-4');
SELECT durable_ledger.release_run('pg-fail');
-- not settled: an intent whose lease ended without a report
SELECT durable_ledger.acquire_run('pg-open');
SELECT decision FROM durable_ledger.begin_effect('pg-open', 'pg.pay', '{"invoice": 5}');
SELECT durable_ledger.release_run('pg-open');
-- not settled: a conflict
SELECT durable_ledger.acquire_run('pg-flag');
SELECT key AS flag_key FROM durable_ledger.begin_effect('pg-flag', 'pg.pay', '{"invoice": 6}') \gset
SELECT (durable_ledger.complete_effect(:'flag_key', '{"paid": 6}')).status;
SELECT (durable_ledger.fail_effect(:'flag_key', '{"declined": true}')).conflict;
SELECT durable_ledger.release_run('pg-flag');
-- settled but held: a live lease
SELECT durable_ledger.acquire_run('pg-held');
SELECT (durable_ledger.complete_effect(key, '{"paid": 7}')).status
  FROM durable_ledger.begin_effect('pg-held', 'pg.pay', '{"invoice": 7}');
-- not settled: a divergence waiting for its verdict
SELECT tool FROM durable_ledger.register_tool('pg.reg', 'maria');
SELECT durable_ledger.acquire_run('pg-div');
SELECT (durable_ledger.complete_effect(key, '{"paid": 8}')).status
  FROM durable_ledger.begin_effect('pg-div', 'pg.reg', '{"invoice": 8, "memo": "Thanks"}');
SELECT durable_ledger.acquire_run('pg-div');
SELECT key AS drifted, decision FROM durable_ledger.begin_effect('pg-div', 'pg.reg', '{"invoice": 8, "memo": "Thank you"}') \gset
SELECT :'decision' AS drifted_decision;
SELECT durable_ledger.release_run('pg-div');

-- a business key first tried by a run that is not settled, then completed by
-- another: purging the second removes the key with its whole record, its
-- first attempt too (the first run's audit rows keep what it did), so that
-- the key can be used again
SELECT durable_ledger.acquire_run('pg-bk-a');
SELECT (durable_ledger.fail_effect(key, '{"declined": true}', attempt)).status
  FROM durable_ledger.begin_effect('pg-bk-a', 'pg.pay', '{"invoice": 10}', 'PG-BK-10');
SELECT decision FROM durable_ledger.begin_effect('pg-bk-a', 'pg.mail', '{"to": "ap"}');
SELECT durable_ledger.release_run('pg-bk-a');
SELECT durable_ledger.acquire_run('pg-bk-b');
SELECT (durable_ledger.complete_effect(key, '{"paid": 10}', attempt)).status
  FROM durable_ledger.begin_effect('pg-bk-b', 'pg.pay', '{"invoice": 10}', 'PG-BK-10');
SELECT durable_ledger.release_run('pg-bk-b');
-- ... and the other way round: a settled run that made the first attempt of
-- a business key another run's attempt is still performing -- purging it
-- keeps that attempt with the key's effect (its record, for late reports)
SELECT durable_ledger.acquire_run('pg-bk-x');
SELECT (durable_ledger.complete_effect(key, '{"sent": 1}')).status
  FROM durable_ledger.begin_effect('pg-bk-x', 'pg.mail', '{"to": "x"}');
SELECT (durable_ledger.fail_effect(key, '{"declined": true}', attempt)).status
  FROM durable_ledger.begin_effect('pg-bk-x', 'pg.pay', '{"invoice": 12}', 'PG-BK-12');
SELECT durable_ledger.release_run('pg-bk-x');
SELECT durable_ledger.acquire_run('pg-bk-y');
SELECT decision, attempt FROM durable_ledger.begin_effect('pg-bk-y', 'pg.pay', '{"invoice": 12}', 'PG-BK-12');
SELECT durable_ledger.release_run('pg-bk-y');
-- a business key failed by a run whose lease is still live, then completed by
-- another run: purging the second would let the first, still in the same
-- attempt, ask about the key again, find nothing and pay again; so the second
-- is kept while a run it shares an effect with holds a live lease
SELECT durable_ledger.acquire_run('pg-bk-l');
SELECT (durable_ledger.fail_effect(key, '{"declined": true}', attempt)).status
  FROM durable_ledger.begin_effect('pg-bk-l', 'pg.pay', '{"invoice": 15}', 'PG-BK-15');
SELECT durable_ledger.acquire_run('pg-bk-m');
SELECT (durable_ledger.complete_effect(key, '{"paid": 15}', attempt)).status
  FROM durable_ledger.begin_effect('pg-bk-m', 'pg.pay', '{"invoice": 15}', 'PG-BK-15');
SELECT durable_ledger.release_run('pg-bk-m');

-- nothing is quiet for an hour yet
SELECT count(*) AS quiet_for_an_hour FROM durable_ledger.purge_settled('1 hour', 'maria') WHERE run LIKE 'pg-%';
-- a dry run (the default) lists the settled, quiet, unheld runs and writes nothing
SELECT regress_pg_footprint() AS before \gset
SELECT run, effects, past_attempts, divergences
  FROM durable_ledger.purge_settled('0', 'maria') WHERE run LIKE 'pg-%' ORDER BY run;
SELECT regress_pg_footprint() = :'before' AS dry_run_wrote_nothing;

-- the divergence gets its verdict: that run is settled too
SELECT verdict FROM durable_ledger.resolve_divergence(:'drifted', 'distinct', 'maria', 'a new payment');
SELECT (durable_ledger.complete_effect(key, '{"paid": 9}')).status
  FROM durable_ledger.begin_effect('pg-div', 'pg.reg', '{"invoice": 8, "memo": "Thank you"}');
SELECT durable_ledger.release_run('pg-div');

-- purge, at most one run per call
SELECT count(*) AS one_run FROM durable_ledger.purge_settled('0', 'maria', false, 1);
SELECT count(*) > 0 AS the_rest FROM durable_ledger.purge_settled('0', 'maria', false);
SELECT count(*) AS nothing_left FROM durable_ledger.purge_settled('0', 'maria', false) WHERE run LIKE 'pg-%';
-- what is gone, what stays
SELECT run, count(*) AS effects_left FROM durable_ledger.effects WHERE run LIKE 'pg-%' GROUP BY run ORDER BY run;
SELECT count(*) AS bk_past_attempts FROM durable_ledger.past_attempts WHERE key = 'PG-BK-4';
SELECT key, attempt, run, status FROM durable_ledger.past_attempts WHERE key = 'PG-BK-12';
SELECT key, attempt, run, status FROM durable_ledger.past_attempts WHERE key = 'PG-BK-15';
SELECT decision, status, attempt
  FROM durable_ledger.begin_effect('pg-bk-l', 'pg.pay', '{"invoice": 15}', 'PG-BK-15');
SELECT count(*) AS bk10_past_attempts FROM durable_ledger.past_attempts WHERE key = 'PG-BK-10';
SELECT run, event, attempt FROM durable_ledger.audit_log WHERE key = 'PG-BK-10' AND run = 'pg-bk-a' ORDER BY id;
-- used again: a new operation, executed, its failure retried, never 23505
SELECT decision, attempt, (durable_ledger.fail_effect(key, '{"declined": "again"}', attempt)).status
  FROM durable_ledger.begin_effect('pg-bk-c', 'pg.pay', '{"invoice": 10}', 'PG-BK-10');
SELECT decision, attempt, (durable_ledger.complete_effect(key, '{"paid": "10 again"}', attempt)).status
  FROM durable_ledger.begin_effect('pg-bk-c', 'pg.pay', '{"invoice": 10}', 'PG-BK-10');
SELECT key, attempt, run, status FROM durable_ledger.past_attempts WHERE key = 'PG-BK-10';
SELECT durable_ledger.release_run('pg-bk-c');
SELECT count(*) AS pg_div_divergences FROM durable_ledger.divergences WHERE run = 'pg-div';
SELECT count(*) AS runs_kept FROM durable_ledger.runs WHERE run LIKE 'pg-%';
-- audited: one row per run and one per call, with the name and the counts
SELECT run, detail - 'older_than' AS detail FROM durable_ledger.audit_log
 WHERE event = 'purged' AND run LIKE 'pg-%' ORDER BY run;
SELECT count(*) > 0 AS summaries, bool_and(detail ->> 'purged_by' = 'maria') AS named
  FROM durable_ledger.audit_log WHERE event = 'purged' AND run IS NULL;
SELECT event FROM durable_ledger.history('pg-done') ORDER BY id DESC LIMIT 1;
SELECT count(*) AS problems FROM durable_ledger.verify_audit();
-- a later attempt of a purged run executes its calls again (the horizon)
SELECT durable_ledger.acquire_run('pg-done');
SELECT decision FROM durable_ledger.begin_effect('pg-done', 'pg.pay', '{"invoice": 1}');
SELECT durable_ledger.release_run('pg-done');
SELECT durable_ledger.release_run('pg-held');
SELECT durable_ledger.release_run('pg-bk-l');

-- evidence filed under no run that has effects, for an effect still open: a
-- business key failed at attempt 1 (run pg-ev-a, no effect of its own now),
-- in flight at attempt 2 (run pg-ev-b), with two contradicting reports, each
-- the first row of its session's hash chain (so that nothing earlier keeps
-- it): one on attempt 1 (filed under pg-ev-a) and one that names no attempt
-- (run NULL); and a live lease on a run that has made no call yet (its
-- lease_acquired row, the first of another chain)
SELECT durable_ledger.acquire_run('pg-ev-a');
SELECT (durable_ledger.fail_effect(key, '{"declined": true}', attempt)).status
  FROM durable_ledger.begin_effect('pg-ev-a', 'pg.pay', '{"invoice": 11}', 'PG-EV');
SELECT durable_ledger.release_run('pg-ev-a');
SELECT dblink_connect('pg_ev', 'dbname=' || current_database());
SELECT * FROM dblink('pg_ev', $$SELECT decision || ' ' || attempt FROM durable_ledger.begin_effect('pg-ev-b',
                                 'pg.pay', '{"invoice": 11}', 'PG-EV')$$) AS t(d text);
SELECT * FROM dblink('pg_ev', $$SELECT durable_ledger.release_run('pg-ev-b')$$) AS t(released boolean);
SELECT dblink_connect('pg_ev_r1', 'dbname=' || current_database());
SELECT * FROM dblink('pg_ev_r1', $$SELECT conflict FROM durable_ledger.complete_effect('PG-EV', '{"paid": "maybe"}', 1)$$)
    AS t(conflict boolean);
SELECT dblink_connect('pg_ev_r2', 'dbname=' || current_database());
SELECT * FROM dblink('pg_ev_r2', $$SELECT conflict FROM durable_ledger.complete_effect('PG-EV', '{"paid": "who knows"}')$$)
    AS t(conflict boolean);
SELECT dblink_connect('pg_ev_live', 'dbname=' || current_database());
SELECT * FROM dblink('pg_ev_live', $$SELECT durable_ledger.acquire_run('pg-ev-live')$$) AS t(acquired boolean);
SELECT coalesce(run, '(none)') AS run, attempt, detail ->> 'result' AS result,
       chain_seq = 1 AS first_of_its_chain
  FROM durable_ledger.audit_log WHERE key = 'PG-EV' AND event = 'conflict' ORDER BY id;
SELECT chain_seq = 1 AS first_of_its_chain FROM durable_ledger.audit_log WHERE run = 'pg-ev-live';

-- the audit log's horizon: purge_audit removes old rows of runs with no effect
-- left, a prefix of each hash chain, anchored; kept heads still check out
SELECT jsonb_agg(h) AS heads FROM durable_ledger.audit_heads h \gset
SELECT count(*) AS audit_before FROM durable_ledger.audit_log \gset
SELECT sum(audit_rows) > 0 AS would_remove FROM durable_ledger.purge_audit('0', 'maria');
SELECT count(*) = :audit_before AS dry_run_wrote_nothing FROM durable_ledger.audit_log;
SELECT sum(audit_rows) > 0 AS removed FROM durable_ledger.purge_audit('0', 'maria', false);
SELECT count(*) < :audit_before AS fewer_rows FROM durable_ledger.audit_log;
SELECT count(*) > 0 AS anchors, bool_and(purged_by = 'maria') AS named FROM durable_ledger.audit_anchors;
-- what the ledger still needs stays: the rows of runs with effects
SELECT a.run, count(*) > 0 AS rows_kept FROM durable_ledger.audit_log a
 WHERE a.run IN ('pg-open', 'pg-flag', 'pg-held', 'pg-done') GROUP BY a.run ORDER BY a.run;
-- ... and, whatever their run column says, the evidence of what is still open:
-- every row about the flagged business key (its contradicting reports filed
-- under no run, or under a run with no effect left), and the live lease's
SELECT coalesce(run, '(none)') AS run, event, attempt FROM durable_ledger.audit_log
 WHERE key = 'PG-EV' ORDER BY id;
SELECT event FROM durable_ledger.audit_log WHERE run = 'pg-ev-live' ORDER BY id;
SELECT * FROM dblink('pg_ev_live', $$SELECT durable_ledger.release_run('pg-ev-live')$$) AS t(released boolean);
SELECT dblink_disconnect('pg_ev'), dblink_disconnect('pg_ev_r1'), dblink_disconnect('pg_ev_r2'),
       dblink_disconnect('pg_ev_live');
SELECT count(*) AS problems FROM durable_ledger.verify_audit();
SELECT count(*) AS problems_against_kept_heads FROM durable_ledger.verify_audit(:'heads');
SELECT event, detail ->> 'purged_by' AS purged_by, (detail ->> 'audit_rows')::int > 0 AS counted
  FROM durable_ledger.audit_log WHERE event = 'audit_purged';
-- ... an anchor written by hand, to hide rows deleted by hand, is not trusted
BEGIN;
ALTER TABLE durable_ledger.audit_log DISABLE TRIGGER audit_log_append_only;
SELECT chain AS oc, min(chain_seq) AS first_seq FROM durable_ledger.audit_log
 WHERE run = 'pg-open' GROUP BY chain ORDER BY chain LIMIT 1 \gset
CREATE TEMP TABLE gone AS
  SELECT * FROM durable_ledger.audit_log WHERE chain = :oc AND chain_seq <= :first_seq;
DELETE FROM durable_ledger.audit_log WHERE chain = :oc AND chain_seq <= :first_seq;
INSERT INTO durable_ledger.audit_anchors
SELECT chain, chain_seq, row_hash, now(), 'nobody' FROM gone ORDER BY chain_seq DESC LIMIT 1
    ON CONFLICT (chain) DO UPDATE SET chain_seq = EXCLUDED.chain_seq, row_hash = EXCLUDED.row_hash,
                                      purged_by = EXCLUDED.purged_by;
SELECT chain = :oc AS that_chain, problem FROM durable_ledger.verify_audit() WHERE problem LIKE 'an anchor%';
ROLLBACK;
-- ... a row deleted by hand is still refused
SELECT regress_sqlstate($$DELETE FROM durable_ledger.audit_log WHERE run = 'pg-open'$$);
-- the ledger goes on: a replay of what was kept, new rows linked behind the anchors
SELECT durable_ledger.acquire_run('pg-held');
SELECT decision FROM durable_ledger.begin_effect('pg-held', 'pg.pay', '{"invoice": 7}');
SELECT durable_ledger.release_run('pg-held');
SELECT count(*) AS problems_after FROM durable_ledger.verify_audit();
SELECT regress_sqlstate($$SELECT * FROM durable_ledger.purge_audit(NULL, 'maria', false)$$);
SELECT regress_sqlstate($$SELECT * FROM durable_ledger.purge_audit('-1 day', 'maria', false)$$);
SELECT regress_sqlstate($$SELECT * FROM durable_ledger.purge_audit('1 day', '', false)$$);

-- bad input writes nothing
SELECT regress_pg_footprint() AS before \gset
SELECT regress_sqlstate($$SELECT * FROM durable_ledger.purge_settled(NULL, 'maria', false)$$);
SELECT regress_sqlstate($$SELECT * FROM durable_ledger.purge_settled('-1 day', 'maria', false)$$);
SELECT regress_sqlstate($$SELECT * FROM durable_ledger.purge_settled('1 day', NULL, false)$$);
SELECT regress_sqlstate($$SELECT * FROM durable_ledger.purge_settled('1 day', '', false)$$);
SELECT regress_sqlstate($$SELECT * FROM durable_ledger.purge_settled('1 day', 'maria', NULL)$$);
SELECT regress_sqlstate($$SELECT * FROM durable_ledger.purge_settled('1 day', 'maria', false, 0)$$);
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT regress_sqlstate($$SELECT * FROM durable_ledger.purge_settled('1 day', 'maria', false)$$);
SELECT regress_sqlstate($$SELECT * FROM durable_ledger.purge_audit('1 day', 'maria', false)$$);
ROLLBACK;
SELECT regress_pg_footprint() = :'before' AS nothing_written;

-- quiet means nothing logged about the run's effects either: a business key
-- that another run replayed since the cutoff stays (its run's retry must
-- replay it, not pay again), though the run that made it has been quiet
-- (both times against the server's clock: the run made it at least 6 s
-- before the purge, the replay is less than 5 s before it)
SELECT durable_ledger.acquire_run('pg-q-a');
SELECT (durable_ledger.complete_effect(key, '{"paid": 13}', attempt)).status
  FROM durable_ledger.begin_effect('pg-q-a', 'pg.pay', '{"invoice": 13}', 'PG-BK-13');
SELECT durable_ledger.release_run('pg-q-a');
DO $$
DECLARE made timestamptz := (SELECT max(logged_at) FROM durable_ledger.audit_log WHERE run = 'pg-q-a');
BEGIN
    WHILE clock_timestamp() < made + interval '6 seconds' LOOP
        PERFORM pg_sleep(0.1);
    END LOOP;
END $$;
SELECT decision FROM durable_ledger.begin_effect('pg-q-c', 'pg.pay', '{"invoice": 13}', 'PG-BK-13');
SELECT durable_ledger.release_run('pg-q-c');
SELECT count(*) AS purged FROM durable_ledger.purge_settled('5 seconds', 'maria', false) WHERE run = 'pg-q-a';
SELECT decision, attempt FROM durable_ledger.begin_effect('pg-q-c', 'pg.pay', '{"invoice": 13}', 'PG-BK-13');
SELECT durable_ledger.release_run('pg-q-c');

-- admins only
CREATE ROLE regress_pg_worker IN ROLE durable_ledger_worker;
CREATE ROLE regress_pg_auditor IN ROLE durable_ledger_auditor;
SET ROLE regress_pg_worker;
SELECT regress_sqlstate($$SELECT * FROM durable_ledger.purge_settled('1 day', 'w')$$);
SELECT regress_sqlstate($$SELECT * FROM durable_ledger.purge_audit('1 day', 'w')$$);
SET ROLE regress_pg_auditor;
SELECT regress_sqlstate($$SELECT * FROM durable_ledger.purge_settled('1 day', 'a')$$);
RESET ROLE;
DROP ROLE regress_pg_worker, regress_pg_auditor;
