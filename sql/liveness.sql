-- liveness: whether the lease that started an effect is still live is a
-- question about now.  Under REPEATABLE READ it is answered with a fresh
-- snapshot, not the transaction's old one (effect_status, resolve_effect and
-- begin_effect see a lease that ended after the snapshot as ended).  The
-- leases view shows auditors the holder's backend state, application and
-- client address, which pg_stat_activity hides from them.
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

SELECT * FROM dblink('w', $$SELECT durable_ledger.release_run('live-1')$$) AS t(released boolean);
SELECT dblink_disconnect('w');
SELECT durable_ledger.release_run('live-2');
DROP ROLE regress_live_auditor;
