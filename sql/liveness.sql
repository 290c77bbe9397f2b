-- liveness: whether the lease that started an effect is still live is a
-- question about now, and everyone gets one answer to it.  Under REPEATABLE
-- READ it is answered with a fresh snapshot, not the transaction's old one
-- (effect_status, resolve_effect and begin_effect see a lease that ended
-- after the snapshot as ended; effect_status reads the row as it is now too,
-- so a completed effect is never called unknown; the writers decide on a
-- row's latest committed version, locked, so a key or run recorded after the
-- snapshot is neither "does not exist" nor a unique violation).  The
-- session that holds a run answers as everyone else does, also for a lock it
-- holds without an epoch; unresolved calls a flagged effect unknown only when
-- its lease has ended.  The leases view shows auditors the holder's backend
-- state, application and client address of this database's lease holders,
-- which pg_stat_activity hides from them.
\set VERBOSITY default

SELECT dblink_connect('w', 'dbname=' || current_database());
SELECT pid AS w_pid FROM dblink('w', $$SET application_name = 'regress-worker';
                                     SELECT pg_backend_pid()$$) AS t(pid int) \gset
SELECT key AS k_live
  FROM dblink('w', $$SELECT key FROM durable_ledger.begin_effect('live-1', 'pay', '{"n": 1}')$$)
       AS t(key text) \gset
SELECT * FROM dblink('w', $$SELECT decision FROM durable_ledger.begin_effect('live-1', 'pay', '{"n": 2}', 'LIVE-BK')$$)
    AS t(decision text);

-- ===================================================================
-- REPEATABLE READ: the worker ends epoch 1 and takes epoch 2 of the same
-- run after this transaction's snapshot was taken; in that snapshot epoch 1
-- is current, unreleased and held by the worker's backend, which still holds
-- the run's lock: it would look live
-- ===================================================================
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT status FROM durable_ledger.effect_status(:'k_live');
SELECT * FROM dblink('w', $$SELECT durable_ledger.release_run('live-1'), durable_ledger.acquire_run('live-1')$$)
    AS t(released boolean, acquired boolean);
SELECT epochs, released_at IS NULL AS unreleased, holder_pid = :w_pid AS held_by_worker
  FROM durable_ledger.runs WHERE run = 'live-1';
SELECT status FROM durable_ledger.effect_status(:'k_live');
SAVEPOINT resolve;
SELECT status, resolved_by FROM durable_ledger.resolve_effect(:'k_live', 'failed', NULL, 'regress');
ROLLBACK TO resolve;
SELECT decision, status FROM durable_ledger.begin_effect('live-2', 'pay', '{"n": 2}', 'LIVE-BK');
COMMIT;
SELECT status FROM durable_ledger.effect_status(:'k_live');
SELECT key, status FROM durable_ledger.effects WHERE key = 'LIVE-BK';
SELECT durable_ledger.release_run('live-2');

-- ===================================================================
-- the leases view, read by an auditor
-- ===================================================================
CREATE ROLE regress_live_auditor NOLOGIN;
GRANT durable_ledger_auditor TO regress_live_auditor;
SET ROLE regress_live_auditor;
-- pg_stat_activity hides another role's session state from the auditor ...
SELECT state IS NULL AS state_hidden FROM pg_stat_activity WHERE pid = :w_pid;
-- ... the leases view does not
SELECT run, holder_pid = :w_pid AS held_by_worker, lease_epoch, application_name,
       backend_state, liveness
  FROM durable_ledger.leases WHERE run = 'live-1';
-- and lease_holder_activity() shows lease holders only, never their queries
SELECT count(*) AS not_holders FROM durable_ledger.lease_holder_activity() a
 WHERE NOT EXISTS (SELECT 1 FROM pg_locks l WHERE l.pid = a.pid AND l.locktype = 'advisory'
                                              AND l.objsubid = 17484 AND l.granted);
RESET ROLE;
SELECT has_function_privilege('durable_ledger_worker', 'durable_ledger.lease_holder_activity()', 'EXECUTE')
           AS worker_may_call;

-- ===================================================================
-- REPEATABLE READ: an effect completed after the snapshot is reported as
-- completed, not unknown; a report or a resolution is decided on the row's
-- latest committed version, locked, as under READ COMMITTED (a key recorded
-- after the snapshot is found); a run first leased after the snapshot goes
-- on from its latest epoch
-- ===================================================================
SELECT dblink_connect('w2', 'dbname=' || current_database());
SELECT key AS k_done
  FROM dblink('w2', $$SELECT key FROM durable_ledger.begin_effect('live-3', 'pay', '{"n": 3}')$$)
       AS t(key text) \gset
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT status FROM durable_ledger.effect_status(:'k_done');
SELECT * FROM dblink('w2', $$SELECT status FROM durable_ledger.complete_effect(
                               durable_ledger.effect_key('live-3', 'pay', '{"n": 3}', 1), '{"ok": 3}')$$)
    AS t(status text);
SELECT * FROM dblink('w2', $$SELECT durable_ledger.release_run('live-3')$$) AS t(released boolean);
SELECT status, result FROM durable_ledger.effect_status(:'k_done');
COMMIT;
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) >= 0 AS snapshot_taken FROM durable_ledger.effects;
SELECT * FROM dblink('w2', $$SELECT decision FROM durable_ledger.begin_effect('live-4', 'pay', '{"n": 4}', 'LIVE-BK4')$$)
    AS t(decision text);
SAVEPOINT s1;
SELECT status, attempt, result FROM durable_ledger.complete_effect('LIVE-BK4', '{"ok": 4}', 1);
ROLLBACK TO s1;
SELECT durable_ledger.resolve_effect('LIVE-BK4', 'failed', NULL, 'regress');
ROLLBACK;
SELECT * FROM dblink('w2', $$SELECT durable_ledger.release_run('live-4')$$) AS t(released boolean);
SELECT status FROM durable_ledger.complete_effect('LIVE-BK4', '{"ok": 4}', 1);
-- a run first leased after the snapshot
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT count(*) >= 0 AS snapshot_taken FROM durable_ledger.runs;
SELECT * FROM dblink('w2', $$SELECT durable_ledger.acquire_run('live-7') AND durable_ledger.release_run('live-7')$$)
    AS t(leased boolean);
SELECT decision FROM durable_ledger.begin_effect('live-7', 'pay', '{"n": 7}');
SELECT epochs FROM durable_ledger.runs WHERE run = 'live-7';
ROLLBACK;
SELECT durable_ledger.release_run('live-7');

-- ===================================================================
-- a lock this session holds without an epoch (its lease was lost, then
-- taken again in a transaction that rolled back): the run's recorded epoch is
-- judged the same way by this session and by everyone else
-- ===================================================================
SELECT durable_ledger.acquire_run('live-5');
SELECT decision FROM durable_ledger.begin_effect('live-5', 'pay', '{"n": 5}', 'LIVE-BK5');
SELECT pg_advisory_unlock_all();
BEGIN;
SELECT durable_ledger.acquire_run('live-5');
ROLLBACK;
SELECT status AS mine FROM durable_ledger.effect_status('LIVE-BK5');
SELECT * FROM dblink('w2', $$SELECT status FROM durable_ledger.effect_status('LIVE-BK5')$$) AS t(theirs text);
SELECT count(*) AS listed FROM durable_ledger.unresolved WHERE key = 'LIVE-BK5';
SELECT run, lease_epoch, holder_pid = pg_backend_pid() AS mine FROM durable_ledger.leases WHERE run = 'live-5';
-- its next attempt ends that epoch for everyone
SELECT durable_ledger.acquire_run('live-5');
SELECT status AS mine FROM durable_ledger.effect_status('LIVE-BK5');
SELECT * FROM dblink('w2', $$SELECT status FROM durable_ledger.effect_status('LIVE-BK5')$$) AS t(theirs text);
SELECT durable_ledger.release_run('live-5');

-- ===================================================================
-- a flagged effect in flight under a live lease is listed for a person (a
-- contradicting report about it), but not called unknown
-- ===================================================================
SELECT decision FROM durable_ledger.begin_effect('live-6', 'pay', '{"n": 6}', 'LIVE-BK6');
SELECT status FROM durable_ledger.fail_effect('LIVE-BK6', '"declined"', 1);
SELECT durable_ledger.release_run('live-6');
SELECT * FROM dblink('w2', $$SELECT decision FROM durable_ledger.begin_effect('live-6b', 'pay', '{"n": 6}', 'LIVE-BK6')$$)
    AS t(decision text);
SELECT status, attempt, conflict FROM durable_ledger.complete_effect('LIVE-BK6', '{"ok": "elsewhere"}', 1);
SELECT key, status, conflict FROM durable_ledger.unresolved WHERE key = 'LIVE-BK6';
SELECT status, conflict FROM durable_ledger.effect_status('LIVE-BK6');
SELECT * FROM dblink('w2', $$SELECT durable_ledger.release_run('live-6b')$$) AS t(released boolean);
SELECT dblink_disconnect('w2');

-- ===================================================================
-- lease_holder_activity() shows this database's lease holders only
-- ===================================================================
CREATE DATABASE regress_live_other;
SELECT dblink_connect('elsewhere', 'dbname=regress_live_other');
SELECT * FROM dblink('elsewhere', $$CREATE EXTENSION durable_ledger;
                                    SELECT durable_ledger.acquire_run('live-elsewhere')$$) AS t(ok boolean);
SELECT pid AS elsewhere_pid FROM dblink('elsewhere', 'SELECT pg_backend_pid()') AS t(pid int) \gset
SELECT count(*) AS holders_elsewhere FROM durable_ledger.lease_holder_activity() WHERE pid = :elsewhere_pid;
SELECT count(*) AS leases_elsewhere FROM durable_ledger.leases WHERE holder_pid = :elsewhere_pid;
SELECT dblink_disconnect('elsewhere');
-- (its backend ends after the disconnect returns: wait, at most 60 s, with a
-- fresh look at pg_stat_activity each time, or DROP DATABASE may find it there)
DO $$ BEGIN
  FOR i IN 1..1200 LOOP
    PERFORM pg_stat_clear_snapshot();
    EXIT WHEN NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = 'regress_live_other');
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
DROP DATABASE regress_live_other;

SELECT * FROM dblink('w', $$SELECT durable_ledger.release_run('live-1')$$) AS t(released boolean);
SELECT dblink_disconnect('w');
DROP ROLE regress_live_auditor;
