-- session_attempts: a session attempt that knows its epoch (1.3).
-- session_epoch(run) says which epoch of the run this session holds (NULL:
-- none).  A client asks it in the very statement of each call, and calls
-- only while it is the attempt's own: through a transaction pooler a
-- statement may reach another server connection, or one whose session a
-- later attempt took over, and then nothing is called.  release_attempt(run,
-- epoch) ends the attempt's lease wherever it is held: released by this
-- session, or the holding backend terminated (pg_terminate_backend's rule
-- for the calling role), audited as lease_broken; never a later attempt's.
\set VERBOSITY default

CREATE FUNCTION regress_sa_backend_gone(p int) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    FOR i IN 1..1200 LOOP
        PERFORM pg_stat_clear_snapshot();
        IF NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = p)
           AND NOT EXISTS (SELECT 1 FROM pg_locks WHERE pid = p) THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN false;
END
$fn$;

-- ===================================================================
-- session_epoch
-- ===================================================================
SELECT durable_ledger.session_epoch('sa-1') IS NULL AS not_held;
SELECT durable_ledger.acquire_run('sa-1');
SELECT durable_ledger.session_epoch('sa-1') AS epoch;
-- a new attempt of the same run is the next epoch
SELECT durable_ledger.acquire_run('sa-1');
SELECT durable_ledger.session_epoch('sa-1') AS epoch;
-- begin_effect's implicit lease has an epoch too
SELECT decision FROM durable_ledger.begin_effect('sa-2', 'pay', '{"n": 1}');
SELECT durable_ledger.session_epoch('sa-2') AS epoch;
-- released: none; the lock dropped behind the ledger's back: none
SELECT durable_ledger.release_run('sa-2');
SELECT durable_ledger.session_epoch('sa-2') IS NULL AS released;
SELECT pg_advisory_unlock_all();
SELECT durable_ledger.session_epoch('sa-1') IS NULL AS lost;
SELECT durable_ledger.release_run('sa-1') AS released_a_lost_lease;
-- a token lease is no session's
SELECT (durable_ledger.take_lease('sa-3', '1 minute')).token AS t \gset
SELECT durable_ledger.session_epoch('sa-3') IS NULL AS token_lease_is_no_session_lease;
SELECT durable_ledger.release_lease(:'t');
-- another session's lease is not this one's
SELECT dblink_connect('holder', 'dbname=' || current_database());
SELECT * FROM dblink('holder', $$SELECT durable_ledger.acquire_run('sa-4')$$) AS t(ok boolean);
SELECT * FROM dblink('holder', $$SELECT durable_ledger.session_epoch('sa-4')$$) AS t(epoch bigint);
SELECT durable_ledger.session_epoch('sa-4') IS NULL AS not_here;
-- it writes nothing and needs no writable transaction
BEGIN READ ONLY;
SELECT durable_ledger.session_epoch('sa-4') IS NULL AS read_only_ok;
COMMIT;
SELECT regress_sqlstate($$SELECT durable_ledger.session_epoch(NULL)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.session_epoch('')$$);

-- ===================================================================
-- the clients' guard: the call is made only when the statement reaches the
-- session of the attempt's epoch (CASE evaluates the call only then)
-- ===================================================================
SELECT durable_ledger.acquire_run('sa-5');
SELECT durable_ledger.session_epoch('sa-5') AS e5 \gset
SELECT (g.d).decision, g.epoch
  FROM (SELECT durable_ledger.session_epoch('sa-5') AS epoch,
               CASE WHEN durable_ledger.session_epoch('sa-5') = :e5
                    THEN durable_ledger.begin_effect('sa-5', 'pay', '{"n": 5}') END AS d
        OFFSET 0) g;
-- another epoch (a later attempt took the session over): nothing is called
SELECT durable_ledger.acquire_run('sa-5');
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT (g.d).decision IS NULL AS not_called, g.epoch = :e5 + 1 AS later_epoch
  FROM (SELECT durable_ledger.session_epoch('sa-5') AS epoch,
               CASE WHEN durable_ledger.session_epoch('sa-5') = :e5
                    THEN durable_ledger.begin_effect('sa-5', 'pay', '{"n": 6}') END AS d
        OFFSET 0) g;
-- a session that holds no lease of the run: nothing is called, no lease is taken
SELECT (g.d).decision IS NULL AS not_called, g.epoch IS NULL AS no_epoch
  FROM (SELECT durable_ledger.session_epoch('sa-6') AS epoch,
               CASE WHEN durable_ledger.session_epoch('sa-6') = 1
                    THEN durable_ledger.begin_effect('sa-6', 'pay', '{"n": 6}') END AS d
        OFFSET 0) g;
SELECT count(*) = :audit_rows AS nothing_written FROM durable_ledger.audit_log;
SELECT count(*) AS sa6_leases FROM durable_ledger.leases WHERE run = 'sa-6';
SELECT durable_ledger.release_run('sa-5');

-- ===================================================================
-- release_attempt
-- ===================================================================
-- held by this session: released, as release_run
SELECT durable_ledger.acquire_run('sa-7');
SELECT durable_ledger.release_attempt('sa-7', durable_ledger.session_epoch('sa-7')) AS released;
SELECT durable_ledger.session_epoch('sa-7') IS NULL AS released;
SELECT event FROM durable_ledger.audit_log WHERE run = 'sa-7' ORDER BY id;
-- held by another backend (the server connection a pooler gave the client
-- first): that backend is terminated, the run is free, audited
SELECT pid AS holder_pid FROM dblink('holder', 'SELECT pg_backend_pid()') AS t(pid int) \gset
SELECT * FROM dblink('holder', $$SELECT durable_ledger.acquire_run('sa-4')$$) AS t(ok boolean);
SELECT epoch AS e4 FROM dblink('holder', $$SELECT durable_ledger.session_epoch('sa-4')$$) AS t(epoch bigint) \gset
SELECT key AS k4 FROM dblink('holder', $$SELECT key FROM durable_ledger.begin_effect('sa-4', 'pay', '{"n": 4}')$$)
    AS t(key text) \gset
-- a wrong epoch (an attempt that is over, or not begun) ends nothing
SELECT durable_ledger.release_attempt('sa-4', :e4 + 1) AS later_epoch,
       durable_ledger.release_attempt('sa-4', :e4 - 1) AS earlier_epoch;
SELECT count(*) AS leases FROM durable_ledger.leases WHERE run = 'sa-4';
SELECT durable_ledger.release_attempt('sa-4', :e4) AS ended;
SELECT regress_sa_backend_gone(:holder_pid) AS holder_gone;
SELECT count(*) AS leases FROM durable_ledger.leases WHERE run = 'sa-4';
SELECT event, lease_epoch = :e4 AS its_epoch, detail ->> 'broken_by' AS broken_by,
       (detail ->> 'holder_pid')::int = :holder_pid AS holder, detail -> 'terminated' AS terminated,
       role_name = current_user AS role_ok
  FROM durable_ledger.audit_log WHERE run = 'sa-4' AND event = 'lease_broken';
-- the effect it had begun waits for a person, as after any crash
SELECT status FROM durable_ledger.effect_status(:'k4');
SELECT durable_ledger.acquire_run('sa-4', wait => false) AS free;
-- ... and once over, nothing more is ended
SELECT durable_ledger.release_attempt('sa-4', :e4) AS ended_again;
SELECT durable_ledger.release_run('sa-4');
SELECT dblink_disconnect('holder');
-- a token lease is never ended this way
SELECT (l).token AS t8, (l).epoch AS e8
  FROM (SELECT durable_ledger.take_lease('sa-8', '1 minute') AS l OFFSET 0) s \gset
SELECT durable_ledger.release_attempt('sa-8', :e8) AS ended;
SELECT count(*) AS leases FROM durable_ledger.leases WHERE run = 'sa-8';
-- bad input
SELECT regress_sqlstate($$SELECT durable_ledger.release_attempt('sa-8', NULL)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.release_attempt(NULL, 1)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.release_attempt('sa-8', 0)$$);
BEGIN READ ONLY;
SELECT regress_sqlstate($$SELECT durable_ledger.release_attempt('sa-8', 1)$$);
ROLLBACK;
SELECT durable_ledger.release_lease(:'t8');

-- ===================================================================
-- release_attempt follows pg_terminate_backend's rule for the caller: a
-- worker ends a backend of its own role; not another role's, nor a
-- superuser's (42501, nothing done, nothing logged)
-- ===================================================================
CREATE ROLE regress_sa_worker LOGIN IN ROLE durable_ledger_worker;
CREATE ROLE regress_sa_other LOGIN IN ROLE durable_ledger_worker;
SELECT dblink_connect('own', 'dbname=' || current_database() || ' user=regress_sa_worker');
SELECT dblink_connect('other', 'dbname=' || current_database() || ' user=regress_sa_other');
SELECT dblink_connect('su', 'dbname=' || current_database());
SELECT pid AS own_pid FROM dblink('own', 'SELECT pg_backend_pid()') AS t(pid int) \gset
SELECT pid AS other_pid FROM dblink('other', 'SELECT pg_backend_pid()') AS t(pid int) \gset
SELECT pid AS su_pid FROM dblink('su', 'SELECT pg_backend_pid()') AS t(pid int) \gset
SELECT * FROM dblink('own', $$SELECT durable_ledger.acquire_run('sa-own')$$) AS t(ok boolean);
SELECT * FROM dblink('other', $$SELECT durable_ledger.acquire_run('sa-other')$$) AS t(ok boolean);
SELECT * FROM dblink('su', $$SELECT durable_ledger.acquire_run('sa-su')$$) AS t(ok boolean);
SELECT max(lease_epoch) FILTER (WHERE run = 'sa-own') AS own_epoch,
       max(lease_epoch) FILTER (WHERE run = 'sa-other') AS other_epoch,
       max(lease_epoch) FILTER (WHERE run = 'sa-su') AS su_epoch,
       count(*) AS audit_rows
  FROM durable_ledger.audit_log \gset
SET ROLE regress_sa_worker;
SELECT regress_sqlstate(format($$SELECT durable_ledger.release_attempt('sa-other', %s)$$, :other_epoch));
SELECT regress_sqlstate(format($$SELECT durable_ledger.release_attempt('sa-su', %s)$$, :su_epoch));
RESET ROLE;
SELECT count(*) = :audit_rows AS nothing_logged FROM durable_ledger.audit_log;
SET ROLE regress_sa_worker;
SELECT durable_ledger.release_attempt('sa-own', :own_epoch) AS ended_own;
RESET ROLE;
SELECT regress_sa_backend_gone(:own_pid) AS own_gone;
SELECT run, count(*) AS leases FROM durable_ledger.leases
 WHERE run IN ('sa-own', 'sa-other', 'sa-su') GROUP BY run ORDER BY run;
SELECT dblink_disconnect('other');
SELECT dblink_disconnect('su');
SELECT regress_sa_backend_gone(:other_pid) AND regress_sa_backend_gone(:su_pid) AS others_gone;
DROP ROLE regress_sa_worker, regress_sa_other;
DROP FUNCTION regress_sa_backend_gone(int);
