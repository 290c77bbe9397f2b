-- leases: a run's lease is a session-level advisory lock in the extension's own lock
-- class (17484): no-wait acquisition of a run held elsewhere returns false, a waiting one
-- honours lock_timeout (55P03), neither writes anything; every acquire_run starts a new
-- epoch; a lease lost behind the ledger's back (DISCARD ALL, pg_advisory_unlock_all)
-- makes the next call fail naming the run (55000) until acquire_run; applications' own
-- advisory locks do not collide; max_leases_per_session bounds a session (53400); a
-- session that ends frees its lease and leaves its started effect unknown; break_lease
-- ends the holding backend and is audited.
\set VERBOSITY default

-- (helpers live in public, not pg_temp: DISCARD ALL below would drop temporary ones)
-- waits until a backend has gone (bounded: about 60 s), polling instead of sleeping
CREATE FUNCTION public.regress_lease_backend_gone(p int) RETURNS boolean
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

-- what the ledger holds about one run: rows in effects, runs, audit_log, and its epochs
CREATE FUNCTION public.regress_lease_footprint(r text) RETURNS text
LANGUAGE sql AS $fn$
    SELECT format('effects=%s runs=%s audit=%s epochs=%s',
                  (SELECT count(*) FROM durable_ledger.effects WHERE run = r),
                  (SELECT count(*) FROM durable_ledger.runs WHERE run = r),
                  (SELECT count(*) FROM durable_ledger.audit_log WHERE run = r),
                  (SELECT epochs FROM durable_ledger.runs WHERE run = r))
$fn$;

-- leases this session holds (lock manager's view)
CREATE FUNCTION public.regress_lease_mine() RETURNS bigint
LANGUAGE sql AS $fn$
    SELECT count(*) FROM pg_locks
     WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid()
$fn$;

SELECT dblink_connect('other', 'dbname=' || current_database());
SELECT pid AS other_pid FROM dblink('other', 'SELECT pg_backend_pid()') AS t(pid int) \gset

-- ==== a run held by another session ====
SELECT * FROM dblink('other', $$SELECT durable_ledger.acquire_run('lease-1')$$) AS t(ok boolean);
SELECT run, holder_pid = :other_pid AS held_by_other, lease_epoch
  FROM durable_ledger.leases WHERE run = 'lease-1';
SELECT public.regress_lease_footprint('lease-1') AS before \gset
-- no wait: false at once, nothing written, no lock kept
SELECT durable_ledger.acquire_run('lease-1', wait => false) AS acquired;
SELECT durable_ledger.acquire_run('lease-1', false) AS acquired;
SELECT public.regress_lease_footprint('lease-1') = :'before' AS nothing_written, public.regress_lease_mine() AS my_leases;
-- waiting honours lock_timeout: 55P03, nothing written (terse: the detail names the
-- holder's pid, checked below)
\set VERBOSITY terse
SET lock_timeout = '100ms';
SELECT durable_ledger.begin_effect('lease-1', 'pay', '{}');
SELECT durable_ledger.acquire_run('lease-1');
SELECT durable_ledger.acquire_run('lease-1', wait => true);
BEGIN;
SELECT durable_ledger.begin_effect('lease-1', 'pay', '{}', business_key => 'lease-bk-1');
ROLLBACK;
RESET lock_timeout;
\set VERBOSITY default
-- without lock_timeout, durable_ledger.lease_wait_timeout bounds the wait (default 5 s,
-- not forever); the error names the run, the holder's backend, its application and since
-- when, and which setting ended the wait
SHOW durable_ledger.lease_wait_timeout;
SHOW lock_timeout;
SELECT since AS holder_since FROM durable_ledger.leases WHERE run = 'lease-1' \gset
CREATE FUNCTION public.regress_lease_wait_error(call text, holder int, since timestamptz)
RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE m text; d text; h text; t0 timestamptz := clock_timestamp();
BEGIN
    EXECUTE call;
    RETURN 'no error';
EXCEPTION WHEN lock_not_available THEN
    GET STACKED DIAGNOSTICS m = MESSAGE_TEXT, d = PG_EXCEPTION_DETAIL, h = PG_EXCEPTION_HINT;
    RETURN format(E'%s\n%s\n%s\nwaited at least 150 ms: %s', m,
                  replace(replace(d, 'Backend ' || holder || ' ', 'Backend <holder> '),
                          'since ' || since::text || ' ', 'since <acquired_at> '),
                  h, clock_timestamp() - t0 >= interval '150 ms');
END
$fn$;
SELECT dblink_exec('other', $$SET application_name = 'regress-holder'$$);
SET durable_ledger.lease_wait_timeout = '200ms';
SET datestyle = 'ISO, YMD';
SELECT public.regress_lease_wait_error($$SELECT durable_ledger.acquire_run('lease-1')$$,
                                       :other_pid, :'holder_since');
SELECT public.regress_lease_wait_error($$SELECT durable_ledger.begin_effect('lease-1', 'pay', '{}')$$,
                                       :other_pid, :'holder_since');
-- lock_timeout, when set, is the bound, and the error says so
SET lock_timeout = '150ms';
SELECT public.regress_lease_wait_error($$SELECT durable_ledger.acquire_run('lease-1')$$,
                                       :other_pid, :'holder_since');
RESET lock_timeout;
RESET durable_ledger.lease_wait_timeout;
RESET datestyle;
SELECT dblink_exec('other', $$RESET application_name$$);
SELECT public.regress_lease_footprint('lease-1') = :'before' AS nothing_written, public.regress_lease_mine() AS my_leases;
SELECT count(*) AS effects FROM durable_ledger.effects WHERE run = 'lease-1' OR key = 'lease-bk-1';
-- release_run: true, then false
SELECT * FROM dblink('other', $$SELECT durable_ledger.release_run('lease-1')$$) AS t(ok boolean);
SELECT * FROM dblink('other', $$SELECT durable_ledger.release_run('lease-1')$$) AS t(ok boolean);
SELECT count(*) AS leases FROM durable_ledger.leases WHERE run = 'lease-1';
-- a release by a session that never held the run is false too
SELECT durable_ledger.release_run('lease-1') AS released;

-- ==== every acquire_run starts a new epoch; counters restart at 1 ====
SELECT durable_ledger.acquire_run('lease-1', wait => false) AS acquired;
SELECT epochs, holder_pid = pg_backend_pid() AS mine, released_at IS NULL AS live
  FROM durable_ledger.runs WHERE run = 'lease-1';
SELECT key AS k_epoch2, decision, occurrence FROM durable_ledger.begin_effect('lease-1', 'pay', '{"n": 1}') \gset
SELECT :'decision' AS decision, :occurrence AS occurrence;
SELECT status FROM durable_ledger.complete_effect(:'k_epoch2', '{"ok": 1}');
SELECT decision, occurrence FROM durable_ledger.begin_effect('lease-1', 'pay', '{"n": 1}');
-- acquire again while holding: epoch 3, the same call is occurrence 1 again (a replay)
SELECT durable_ledger.acquire_run('lease-1') AS acquired;
SELECT epochs FROM durable_ledger.runs WHERE run = 'lease-1';
SELECT decision, occurrence, key = :'k_epoch2' AS same_key_as_epoch_2, result
  FROM durable_ledger.begin_effect('lease-1', 'pay', '{"n": 1}');
-- the lock was taken once: one lock, not one per acquisition
SELECT public.regress_lease_mine() AS my_leases;
SELECT event, lease_epoch, detail FROM durable_ledger.audit_log
 WHERE run = 'lease-1' AND event LIKE 'lease%' ORDER BY id;
-- the leases view shows the holder and the current epoch
SELECT run, holder_pid = pg_backend_pid() AS mine, lease_epoch, holder_role = current_user AS role_ok,
       application_name = current_setting('application_name') AS application_name_ok
  FROM durable_ledger.leases WHERE run = 'lease-1';

-- ==== the lock itself: advisory, class 17484, keyed by runs.lock_key ====
SELECT l.locktype, l.mode, l.granted, l.objsubid,
       ((l.classid::int8 << 32) | l.objid::int8) = r.lock_key AS key_matches,
       l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) AS this_database
  FROM pg_locks l
  JOIN durable_ledger.runs r ON r.run = 'lease-1'
 WHERE l.pid = pg_backend_pid() AND l.locktype = 'advisory';
-- an application's own advisory locks on the very same numbers do not collide with it
SELECT lock_key, (lock_key >> 32)::int4 AS hi,
       ((lock_key & x'ffffffff'::int8) - CASE WHEN (lock_key & x'ffffffff'::int8) >= 2147483648 THEN 4294967296 ELSE 0 END)::int4 AS lo
  FROM durable_ledger.runs WHERE run = 'lease-1' \gset
SELECT * FROM dblink('other', format('SELECT pg_try_advisory_lock(%s), pg_try_advisory_lock(%s, %s)', :lock_key, :hi, :lo))
  AS t(bigint_form boolean, int_pair_form boolean);
SELECT l.objsubid, ((l.classid::int8 << 32) | l.objid::int8) = :lock_key AS same_numbers, l.granted
  FROM pg_locks l
 WHERE l.locktype = 'advisory' AND l.pid IN (pg_backend_pid(), :other_pid)
 ORDER BY l.objsubid;
SELECT * FROM dblink('other', format('SELECT pg_advisory_unlock(%s), pg_advisory_unlock(%s, %s)', :lock_key, :hi, :lo))
  AS t(bigint_form boolean, int_pair_form boolean);
-- nor does unlocking them: this session never took them, and the lease stays
SELECT pg_advisory_unlock(:lock_key) AS unlocked;
SELECT public.regress_lease_mine() AS my_leases;
SELECT decision FROM durable_ledger.begin_effect('lease-1', 'mail', '{}');
-- the other way round: an application lock on the numbers does not block acquire_run
SELECT durable_ledger.release_run('lease-1') AS released;
SELECT * FROM dblink('other', format('SELECT pg_try_advisory_lock(%s), pg_try_advisory_lock(%s, %s)', :lock_key, :hi, :lo))
  AS t(bigint_form boolean, int_pair_form boolean);
SELECT durable_ledger.acquire_run('lease-1', wait => false) AS acquired;
SELECT durable_ledger.release_run('lease-1') AS released;
SELECT * FROM dblink('other', 'SELECT pg_advisory_unlock_all()') AS t(x text);

-- ==== reentrant: 1,000 calls on one run take the lock once; one release frees it ====
DO $$
BEGIN
    FOR i IN 1..1000 LOOP
        PERFORM durable_ledger.begin_effect('lease-r', 'tick', jsonb_build_object('i', i % 10));
    END LOOP;
END
$$;
SELECT count(*) AS effects, max(occurrence) AS max_occurrence, count(DISTINCT lease_epoch) AS epochs
  FROM durable_ledger.effects WHERE run = 'lease-r';
SELECT public.regress_lease_mine() AS my_leases;
SELECT durable_ledger.release_run('lease-r') AS released;
SELECT public.regress_lease_mine() AS my_leases;
SELECT count(*) AS leases FROM durable_ledger.leases WHERE run = 'lease-r';
SELECT event, count(*) FROM durable_ledger.audit_log
 WHERE run = 'lease-r' AND event LIKE 'lease%' GROUP BY event ORDER BY event;

-- ==== max_leases_per_session ====
SET durable_ledger.max_leases_per_session = 3;
SELECT durable_ledger.acquire_run('lease-m1') AS m1, durable_ledger.acquire_run('lease-m2') AS m2,
       durable_ledger.acquire_run('lease-m3') AS m3;
SELECT public.regress_lease_footprint('lease-m4') AS before \gset
SELECT durable_ledger.acquire_run('lease-m4');
SELECT durable_ledger.acquire_run('lease-m4', wait => false);
SELECT durable_ledger.begin_effect('lease-m4', 'pay', '{}');
SELECT public.regress_lease_footprint('lease-m4') = :'before' AS nothing_written, public.regress_lease_mine() AS my_leases;
\set VERBOSITY default
SELECT durable_ledger.acquire_run('lease-m4');
\set VERBOSITY default
-- a run already held does not count twice
SELECT durable_ledger.acquire_run('lease-m1') AS m1_again;
SELECT decision FROM durable_ledger.begin_effect('lease-m2', 'pay', '{}');
-- after a release there is room again
SELECT durable_ledger.release_run('lease-m3') AS released;
SELECT durable_ledger.acquire_run('lease-m4') AS m4;
-- leases lost behind the ledger's back hold no lock, so they do not count
-- against the limit; but they are remembered: their runs' next calls fail
-- instead of silently going on in a new epoch
SELECT pg_advisory_unlock_all();
SELECT durable_ledger.acquire_run('lease-m5') AS m5, durable_ledger.acquire_run('lease-m6') AS m6,
       durable_ledger.acquire_run('lease-m7') AS m7;
SELECT durable_ledger.begin_effect('lease-m1', 'pay', '{}');
SELECT r AS run, durable_ledger.release_run(r) AS released
  FROM unnest(ARRAY['lease-m1', 'lease-m2', 'lease-m4', 'lease-m5', 'lease-m6', 'lease-m7']) AS r;
-- a lost lease taken again in a transaction that rolls back does not bring the
-- lost attempt back: the next call starts a new epoch (and finds the lost
-- attempt's intent unknown), it never continues the lost one
SELECT durable_ledger.acquire_run('lease-lr') AS lr;
SELECT decision, occurrence FROM durable_ledger.begin_effect('lease-lr', 'pay', '{}');
SELECT pg_advisory_unlock_all();
BEGIN;
SELECT durable_ledger.acquire_run('lease-lr') AS lr;
ROLLBACK;
SELECT decision, status, occurrence FROM durable_ledger.begin_effect('lease-lr', 'pay', '{}');
SELECT epochs FROM durable_ledger.runs WHERE run = 'lease-lr';
SELECT durable_ledger.release_run('lease-lr');
-- the limit is for superusers to set
CREATE ROLE regress_lease_user NOLOGIN;
SET ROLE regress_lease_user;
SET durable_ledger.max_leases_per_session = 1000;
RESET ROLE;
DROP ROLE regress_lease_user;
RESET durable_ledger.max_leases_per_session;
SHOW durable_ledger.max_leases_per_session;
SELECT public.regress_lease_mine() AS my_leases;

-- ==== a lease dropped behind the ledger's back: DISCARD ALL ====
SELECT durable_ledger.acquire_run('lease-d') AS acquired;
SELECT key AS k_discard, decision FROM durable_ledger.begin_effect('lease-d', 'pay', '{}') \gset
SELECT :'decision' AS decision;
DISCARD ALL;
SELECT public.regress_lease_footprint('lease-d') AS before \gset
SELECT public.regress_lease_mine() AS my_leases;
-- the next call fails, naming the run, and writes nothing; it keeps failing
\set VERBOSITY default
SELECT durable_ledger.begin_effect('lease-d', 'mail', '{}');
\set VERBOSITY default
SELECT durable_ledger.begin_effect('lease-d', 'mail', '{}');
SELECT durable_ledger.begin_effect('lease-d', 'pay', '{}');
SELECT public.regress_lease_footprint('lease-d') = :'before' AS nothing_written, public.regress_lease_mine() AS my_leases;
-- the effect it started may or may not have happened: unknown
SELECT status FROM durable_ledger.effect_status(:'k_discard');
SELECT tool, status FROM durable_ledger.unresolved WHERE run = 'lease-d';
SELECT count(*) AS leases FROM durable_ledger.leases WHERE run = 'lease-d';
-- a new attempt: acquire_run works and starts epoch 2; the unknown effect pauses it
SELECT durable_ledger.acquire_run('lease-d') AS acquired;
SELECT epochs FROM durable_ledger.runs WHERE run = 'lease-d';
SELECT decision, status, occurrence, key = :'k_discard' AS same_key FROM durable_ledger.begin_effect('lease-d', 'pay', '{}');
SELECT decision, occurrence FROM durable_ledger.begin_effect('lease-d', 'mail', '{}');
SELECT durable_ledger.release_run('lease-d') AS released;

-- ==== likewise pg_advisory_unlock_all() ====
SELECT durable_ledger.acquire_run('lease-u') AS acquired;
SELECT key AS k_unlock FROM durable_ledger.begin_effect('lease-u', 'pay', '{}') \gset
SELECT pg_advisory_unlock_all();
SELECT public.regress_lease_footprint('lease-u') AS before \gset
\set VERBOSITY default
SELECT durable_ledger.begin_effect('lease-u', 'mail', '{}');
\set VERBOSITY default
SELECT public.regress_lease_footprint('lease-u') = :'before' AS nothing_written, public.regress_lease_mine() AS my_leases;
SELECT status FROM durable_ledger.effect_status(:'k_unlock');
SELECT durable_ledger.acquire_run('lease-u') AS acquired;
SELECT epochs FROM durable_ledger.runs WHERE run = 'lease-u';
SELECT decision, status FROM durable_ledger.begin_effect('lease-u', 'pay', '{}');
SELECT durable_ledger.release_run('lease-u') AS released;
-- a lost lease released explicitly is false, and the run can then be used afresh
SELECT durable_ledger.acquire_run('lease-u2') AS acquired;
SELECT pg_advisory_unlock_all();
SELECT durable_ledger.release_run('lease-u2') AS released;
SELECT decision, occurrence FROM durable_ledger.begin_effect('lease-u2', 'pay', '{}');
SELECT epochs FROM durable_ledger.runs WHERE run = 'lease-u2';
SELECT durable_ledger.release_run('lease-u2') AS released;

-- ==== a session that ends frees its lease; its started effect becomes unknown ====
SELECT * FROM dblink('other', $$SELECT durable_ledger.acquire_run('lease-e')$$) AS t(ok boolean);
SELECT key AS k_ended, decision
  FROM dblink('other', $$SELECT key, decision FROM durable_ledger.begin_effect('lease-e', 'pay', '{"n": 1}')$$)
       AS t(key text, decision text) \gset
SELECT :'decision' AS decision;
-- while it lives: started, in flight, not unresolved, not ours to take
SELECT status FROM durable_ledger.effect_status(:'k_ended');
SELECT count(*) AS unresolved FROM durable_ledger.unresolved WHERE run = 'lease-e';
SELECT durable_ledger.acquire_run('lease-e', wait => false) AS acquired;
SELECT holder_pid = :other_pid AS held_by_other FROM durable_ledger.leases WHERE run = 'lease-e';
SELECT dblink_disconnect('other');
SELECT public.regress_lease_backend_gone(:other_pid) AS other_gone;
SELECT count(*) AS leases FROM durable_ledger.leases WHERE run = 'lease-e';
SELECT status FROM durable_ledger.effect_status(:'k_ended');
SELECT key = :'k_ended' AS key_ok, tool, status, conflict FROM durable_ledger.unresolved WHERE run = 'lease-e';
-- the next attempt pauses on it
SELECT durable_ledger.acquire_run('lease-e', wait => false) AS acquired;
SELECT decision, status FROM durable_ledger.begin_effect('lease-e', 'pay', '{"n": 1}');
SELECT durable_ledger.release_run('lease-e') AS released;

-- ==== break_lease ends the holding backend, audited with the name ====
SELECT dblink_connect('victim', 'dbname=' || current_database());
SELECT pid AS victim_pid FROM dblink('victim', 'SELECT pg_backend_pid()') AS t(pid int) \gset
SELECT * FROM dblink('victim', $$SELECT durable_ledger.acquire_run('lease-b')$$) AS t(ok boolean);
SELECT key AS k_broken
  FROM dblink('victim', $$SELECT key FROM durable_ledger.begin_effect('lease-b', 'pay', '{}')$$) AS t(key text) \gset
SELECT holder_pid = :victim_pid AS held_by_victim FROM durable_ledger.leases WHERE run = 'lease-b';
SELECT durable_ledger.break_lease('lease-b', 'regress-operator', 'worker hung') AS broken;
SELECT public.regress_lease_backend_gone(:victim_pid) AS victim_gone;
SELECT count(*) AS leases FROM durable_ledger.leases WHERE run = 'lease-b';
SELECT status FROM durable_ledger.effect_status(:'k_broken');
SELECT event, lease_epoch, role_name = current_user AS role_ok,
       detail->>'broken_by' AS broken_by, detail->>'note' AS note, detail->'terminated' AS terminated,
       (detail->>'holder_pid')::int = :victim_pid AS holder_pid_ok
  FROM durable_ledger.audit_log WHERE run = 'lease-b' AND event = 'lease_broken';
-- nobody holds it now
SELECT durable_ledger.break_lease('lease-b', 'regress-operator') AS broken;
SELECT count(*) AS lease_broken_events FROM durable_ledger.audit_log WHERE run = 'lease-b' AND event = 'lease_broken';
SELECT dblink_disconnect('victim');

-- ==== break_lease follows pg_terminate_backend's rule: a superuser's session
-- ==== is ended only by a superuser (42501, nothing done, nothing logged)
\set VERBOSITY default
CREATE ROLE regress_lease_admin NOLOGIN;
GRANT durable_ledger_admin TO regress_lease_admin;
CREATE ROLE regress_lease_worker LOGIN;
GRANT durable_ledger_worker TO regress_lease_worker;
SELECT dblink_connect('su', 'dbname=' || current_database());
SELECT pid AS su_pid FROM dblink('su', 'SELECT pg_backend_pid()') AS t(pid int) \gset
SELECT * FROM dblink('su', $$SELECT durable_ledger.acquire_run('lease-su')$$) AS t(ok boolean);
SELECT dblink_connect('plain', 'dbname=' || current_database() || ' user=regress_lease_worker');
SELECT pid AS plain_pid FROM dblink('plain', 'SELECT pg_backend_pid()') AS t(pid int) \gset
SELECT * FROM dblink('plain', $$SELECT durable_ledger.acquire_run('lease-plain')$$) AS t(ok boolean);
SET ROLE regress_lease_admin;
SELECT durable_ledger.break_lease('lease-su', 'regress-admin', 'holder looks hung');
-- the admin ends an ordinary worker's lease
SELECT durable_ledger.break_lease('lease-plain', 'regress-admin', 'holder looks hung') AS broken;
RESET ROLE;
SELECT public.regress_lease_backend_gone(:plain_pid) AS plain_gone;
SELECT holder_pid = :su_pid AS superuser_still_holds FROM durable_ledger.leases WHERE run = 'lease-su';
SELECT run, count(*) AS broken_events FROM durable_ledger.audit_log
 WHERE run IN ('lease-su', 'lease-plain') AND event = 'lease_broken' GROUP BY run ORDER BY run;
-- a superuser ends the superuser's session
SELECT durable_ledger.break_lease('lease-su', 'regress-superuser', 'holder looks hung') AS broken;
SELECT public.regress_lease_backend_gone(:su_pid) AS su_gone;
SELECT count(*) AS leases FROM durable_ledger.leases WHERE run IN ('lease-su', 'lease-plain');
DROP ROLE regress_lease_admin;
DROP ROLE regress_lease_worker;
\set VERBOSITY default

-- ==== a session that lost more leases than it remembers (1,024) never
-- ==== silently starts a new epoch on one of them: the audit log remembers
-- 1,100 leases taken, and lost 50 at a time (in one transaction: past the
-- 1,000 runs a transaction may call by default, sql/hostile_input)
CREATE FUNCTION pg_temp.take_and_lose_leases(prefix text, runs int) RETURNS void
LANGUAGE plpgsql SET durable_ledger.max_runs_per_transaction = 1100 AS $$
BEGIN
    FOR i IN 1..runs LOOP
        PERFORM durable_ledger.acquire_run(prefix || i);
        IF i % 50 = 0 THEN
            PERFORM pg_advisory_unlock_all();
        END IF;
    END LOOP;
    PERFORM pg_advisory_unlock_all();
END
$$;
SELECT pg_temp.take_and_lose_leases('lost-', 1100);
SELECT public.regress_lease_footprint('lost-1') AS before \gset
\set VERBOSITY default
SELECT decision FROM durable_ledger.begin_effect('lost-1', 'pay', '{}');
SELECT decision FROM durable_ledger.begin_effect('lost-1100', 'pay', '{}');
\set VERBOSITY default
SELECT public.regress_lease_footprint('lost-1') = :'before' AS nothing_written, public.regress_lease_mine() AS my_leases;
-- releasing a lost lease ends it on record; the next call is a new attempt
SELECT durable_ledger.release_run('lost-1') AS released;
SELECT detail FROM durable_ledger.audit_log WHERE run = 'lost-1' ORDER BY id DESC LIMIT 1;
SELECT decision FROM durable_ledger.begin_effect('lost-1', 'pay', '{}');
-- so is acquire_run, for any of them
SELECT durable_ledger.acquire_run('lost-2') AS acquired;
SELECT decision FROM durable_ledger.begin_effect('lost-2', 'pay', '{}');
SELECT durable_ledger.release_run('lost-1') AND durable_ledger.release_run('lost-2') AS released;
-- a run this session never held is not lost
SELECT decision FROM durable_ledger.begin_effect('lost-new', 'pay', '{}');
SELECT durable_ledger.release_run('lost-new') AS released;
-- nor is a token lease this session took: its calls without the token are
-- refused as for any live token lease, and release_run leaves it alone
SELECT (durable_ledger.take_lease('lost-token', '1 minute')).token AS lost_token \gset
\set VERBOSITY terse
SELECT decision FROM durable_ledger.begin_effect('lost-token', 'pay', '{}');
\set VERBOSITY default
SELECT durable_ledger.release_run('lost-token') AS released;
SELECT r.released_at IS NULL AS unreleased, l.liveness,
       (SELECT count(*) FROM durable_ledger.audit_log a
         WHERE a.run = 'lost-token' AND a.event = 'lease_released') AS releases
  FROM durable_ledger.runs r JOIN durable_ledger.leases l USING (run) WHERE r.run = 'lost-token';
SELECT durable_ledger.release_lease(:'lost_token') AS released;
-- releasing every lost lease (false: none was held) ends each on record
SELECT count(*) FILTER (WHERE durable_ledger.release_run('lost-' || i)) AS released
  FROM generate_series(3, 1100) AS i;
SELECT count(*) AS lost_runs_unreleased FROM durable_ledger.runs
 WHERE run LIKE 'lost-%' AND released_at IS NULL;
-- acquire_run of a lost lease when more are lost than the session remembers:
-- making room forgets every lost one, that one too, and it is a new attempt
-- (it was forgotten a second time, and the backend crashed)
SELECT pg_temp.take_and_lose_leases('lost2-', 1030);
SELECT durable_ledger.acquire_run('lost2-1') AS acquired;
SELECT decision FROM durable_ledger.begin_effect('lost2-1', 'pay', '{}');
SELECT durable_ledger.release_run('lost2-1') AS released;
SELECT count(*) FILTER (WHERE durable_ledger.release_run('lost2-' || i)) AS released
  FROM generate_series(2, 1030) AS i;
SELECT count(*) AS lost_runs_unreleased FROM durable_ledger.runs
 WHERE run LIKE 'lost2-%' AND released_at IS NULL;

-- ==== clean up ====
SELECT public.regress_lease_mine() AS my_leases;
SELECT count(*) AS leases FROM durable_ledger.leases WHERE run LIKE 'lease-%';
DROP FUNCTION public.regress_lease_backend_gone(int);
DROP FUNCTION public.regress_lease_footprint(text);
DROP FUNCTION public.regress_lease_mine();

-- on a primary, the view's standby branch reads no row of runs: "on a
-- standby" is judged once per query (a one-time filter), not per row
DO $$
DECLARE
    line text;
    once boolean := false;
BEGIN
    FOR line IN EXECUTE 'EXPLAIN (COSTS OFF) SELECT * FROM durable_ledger.leases' LOOP
        once := once OR line LIKE '%One-Time Filter:%';
    END LOOP;
    IF NOT once THEN
        RAISE EXCEPTION 'the standby branch of durable_ledger.leases is judged per row';
    END IF;
END $$;
