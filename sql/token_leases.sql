-- token_leases: a lease that is a row, for workers behind transaction poolers.
-- take_lease starts a new attempt (epoch) when no live lease of either kind
-- holds the run, and returns NULL at once otherwise; its token carries the
-- calls of the attempt (begin_effect(..., lease => token)), whose occurrences
-- are counted in rows that roll back with the call; renew_lease extends it,
-- release_lease ends it, break_lease expires it; a lease that is expired
-- (the server's clock), released, superseded or unknown fails its calls with
-- SQLSTATE 55L01, writing nothing.  A session lease and a token lease never
-- hold one run at once.  Bad input is refused (22004, 22023) and writes
-- nothing; workers take leases, admins break them.
\set VERBOSITY default

CREATE FUNCTION regress_token_footprint(r text) RETURNS text LANGUAGE sql AS $$
    SELECT format('effects=%s audit=%s epochs=%s tokens=%s calls=%s',
                  (SELECT count(*) FROM durable_ledger.effects WHERE run = r),
                  (SELECT count(*) FROM durable_ledger.audit_log WHERE run = r),
                  (SELECT epochs FROM durable_ledger.runs WHERE run = r),
                  (SELECT count(*) FROM durable_ledger.token_leases WHERE run = r),
                  (SELECT coalesce(sum(calls), 0) FROM durable_ledger.token_lease_calls WHERE run = r))
$$;

-- an error with its SQLSTATE; a moment of the server's clock in its detail is masked
CREATE FUNCTION regress_error(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text; det text;
BEGIN
    EXECUTE stmt;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT, det = PG_EXCEPTION_DETAIL;
    RETURN st || ': ' || msg || coalesce(E'\n' || nullif(
           regexp_replace(det, '\d{4}-\d\d-\d\d \d\d:\d\d:\d\d(\.\d+)?[-+]\d\d(:\d\d)?', '<moment>', 'g'), ''), '');
END $$;

-- ===================================================================
-- take_lease: a new attempt, with a token that only its hash is stored of
-- ===================================================================
SELECT (l).run, (l).epoch, length((l).token) AS token_chars,
       (l).expires_at BETWEEN now() + interval '59 seconds' AND clock_timestamp() + interval '61 seconds' AS expires_in_a_minute,
       (l).holder
  FROM (SELECT durable_ledger.take_lease('tok-1', '1 minute', 'worker-7') AS l) s;
SELECT (durable_ledger.take_lease('tok-1')) IS NULL AS held_already;
SELECT run, epoch, holder, ttl, released_at IS NULL AS unreleased,
       length(token_sha256) AS sha256_bytes
  FROM durable_ledger.token_leases WHERE run = 'tok-1';
SELECT epochs, lease_kind FROM durable_ledger.runs WHERE run = 'tok-1';
SELECT event, lease_epoch, detail->>'kind' AS kind, detail->>'holder' AS holder, detail->>'ttl' AS ttl
  FROM durable_ledger.audit_log WHERE run = 'tok-1' ORDER BY id;
SELECT run, kind, lease_epoch, holder, holder_pid, liveness, expires_at > now() AS expires_later
  FROM durable_ledger.leases WHERE run = 'tok-1';

-- the calls of the attempt carry its token; identical calls count 1, 2, ...
SELECT (durable_ledger.take_lease('tok-2', '1 minute')).token AS t2 \gset
SELECT decision, occurrence, attempt, key = durable_ledger.effect_key('tok-2', 'pay', '{"n": 1}', 1) AS derived
  FROM durable_ledger.begin_effect('tok-2', 'pay', '{"n": 1}', lease => :'t2');
SELECT decision, occurrence FROM durable_ledger.begin_effect('tok-2', 'pay', '{"n": 1}', lease => :'t2');
-- rolled back, at top level and at a savepoint: the counter is as it was
BEGIN;
SELECT decision, occurrence FROM durable_ledger.begin_effect('tok-2', 'pay', '{"n": 1}', lease => :'t2');
ROLLBACK;
BEGIN;
SAVEPOINT s;
SELECT decision, occurrence FROM durable_ledger.begin_effect('tok-2', 'pay', '{"n": 1}', lease => :'t2');
ROLLBACK TO s;
SELECT decision, occurrence FROM durable_ledger.begin_effect('tok-2', 'pay', '{"n": 1}', lease => :'t2');
COMMIT;
SELECT calls FROM durable_ledger.token_lease_calls WHERE run = 'tok-2';
-- what is stored of the token and of the calls counted: SHA-256 of their bytes
SELECT token_sha256 = sha256(convert_to(:'t2', 'UTF8')) AS token_hashed
  FROM durable_ledger.token_leases WHERE run = 'tok-2';
SELECT call = sha256(convert_to('pay', 'UTF8') || '\x00'::bytea ||
                     convert_to(durable_ledger.canonical_args('{"n": 1}'), 'UTF8')) AS call_hashed
  FROM durable_ledger.token_lease_calls WHERE run = 'tok-2';
-- the session takes no lease lock for them
SELECT count(*) AS session_locks FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid();
-- a report needs no token; an effect of a live token lease is in flight
SELECT status FROM durable_ledger.complete_effect(durable_ledger.effect_key('tok-2', 'pay', '{"n": 1}', 1), '{"ok": 1}', 1);
SELECT status FROM durable_ledger.effect_status(durable_ledger.effect_key('tok-2', 'pay', '{"n": 1}', 2));
SELECT count(*) AS unresolved FROM durable_ledger.unresolved WHERE run = 'tok-2';
SELECT decision, reason FROM durable_ledger.begin_effect('tok-2b', 'ship', '{"o": 1}', 'TOK-BK');
SELECT durable_ledger.release_run('tok-2b');

-- renewal extends it, from now, by the given ttl or its own
SELECT durable_ledger.renew_lease(:'t2', '2 hours') > clock_timestamp() + interval '119 minutes' AS renewed_two_hours;
SELECT durable_ledger.renew_lease(:'t2') < clock_timestamp() + interval '61 seconds' AS renewed_by_own_ttl;

-- ===================================================================
-- one run, one live lease of either kind
-- ===================================================================
SELECT durable_ledger.acquire_run('tok-2', wait => false) AS acquired;
SELECT regress_token_footprint('tok-2') AS before \gset
SELECT regress_error($$SELECT durable_ledger.acquire_run('tok-2')$$);
\set VERBOSITY terse
SELECT decision FROM durable_ledger.begin_effect('tok-2', 'pay', '{"n": 9}');
\set VERBOSITY default
SELECT regress_token_footprint('tok-2') = :'before' AS nothing_written;
SELECT count(*) AS session_locks FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid();
-- and the other way: a session lease holds tok-3
SELECT durable_ledger.acquire_run('tok-3');
SELECT durable_ledger.take_lease('tok-3') IS NULL AS refused;
SELECT durable_ledger.release_run('tok-3');
SELECT (durable_ledger.take_lease('tok-3', '1 minute')).epoch AS next_epoch;

-- the session that holds a run (also a lock kept after a rolled-back
-- acquisition, with no epoch) cannot take a token lease on it
BEGIN;
SELECT durable_ledger.acquire_run('tok-3b');
ROLLBACK;
SELECT count(*) AS session_locks FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND mode = 'ExclusiveLock' AND pid = pg_backend_pid();
SELECT durable_ledger.take_lease('tok-3b') IS NULL AS refused;
SELECT durable_ledger.acquire_run('tok-3b');
SELECT durable_ledger.take_lease('tok-3b') IS NULL AS refused;
SELECT durable_ledger.release_run('tok-3b');
-- a session whose lease was lost takes a token lease on the run: its own
-- transaction's take_lease lock is no session lease, so its calls without
-- the token are refused, never executed under the lost epoch
SELECT durable_ledger.acquire_run('tok-3c');
SELECT pg_advisory_unlock_all();
BEGIN;
SELECT (durable_ledger.take_lease('tok-3c', '1 minute')).epoch AS token_epoch;
SELECT regress_error($$SELECT durable_ledger.begin_effect('tok-3c', 'pay', '{"n": 1}')$$);
SELECT count(*) AS session_locks FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND mode = 'ExclusiveLock' AND pid = pg_backend_pid();
SELECT count(*) AS leases, count(*) FILTER (WHERE kind = 'session') AS session_leases
  FROM durable_ledger.leases WHERE run = 'tok-3c';
ROLLBACK;
SELECT durable_ledger.release_run('tok-3c') AS released_lost;

-- ===================================================================
-- a lease that is no longer held: 55L01, nothing written
-- ===================================================================
-- (taken for a minute, and shortened to a second once its call is in: a lease
-- taken for a second could expire before the call on a loaded machine)
SELECT (durable_ledger.take_lease('tok-4', '1 minute')).token AS t4 \gset
SELECT decision FROM durable_ledger.begin_effect('tok-4', 'pay', '{"n": 1}', lease => :'t4');
SELECT durable_ledger.renew_lease(:'t4', '1 second') IS NOT NULL AS shortened;
DO $$ BEGIN
  WHILE (SELECT expires_at >= clock_timestamp() FROM durable_ledger.token_leases WHERE run = 'tok-4') LOOP
    PERFORM pg_sleep(0.1);
  END LOOP;
END $$;
SELECT regress_token_footprint('tok-4') AS before \gset
SELECT regress_error(format($$SELECT durable_ledger.begin_effect('tok-4', 'pay', '{"n": 2}', lease => %L)$$, :'t4'));
SELECT regress_error(format('SELECT durable_ledger.renew_lease(%L)', :'t4'));
SELECT durable_ledger.release_lease(:'t4') AS released;
SELECT regress_token_footprint('tok-4') = :'before' AS nothing_written;
-- its effect in flight is unknown now, and its late report is late
SELECT status FROM durable_ledger.effect_status(durable_ledger.effect_key('tok-4', 'pay', '{"n": 1}', 1));
SELECT status, reason FROM durable_ledger.unresolved WHERE run = 'tok-4';
SELECT status FROM durable_ledger.complete_effect(durable_ledger.effect_key('tok-4', 'pay', '{"n": 1}', 1), '{"ok": 1}', 1);
SELECT event FROM durable_ledger.audit_log WHERE run = 'tok-4' ORDER BY id DESC LIMIT 1;
-- the next lease supersedes it: the old token says so; the next attempt replays
SELECT (durable_ledger.take_lease('tok-4', '1 minute')).token AS t4b \gset
SELECT regress_error(format($$SELECT durable_ledger.begin_effect('tok-4', 'pay', '{"n": 1}', lease => %L)$$, :'t4'));
SELECT decision, result FROM durable_ledger.begin_effect('tok-4', 'pay', '{"n": 1}', lease => :'t4b');
-- released
SELECT durable_ledger.release_lease(:'t4b') AS released, durable_ledger.release_lease(:'t4b') AS again;
SELECT regress_error(format($$SELECT durable_ledger.begin_effect('tok-4', 'pay', '{"n": 3}', lease => %L)$$, :'t4b'));
SELECT event, detail->>'kind' AS kind FROM durable_ledger.audit_log
 WHERE run = 'tok-4' AND event LIKE 'lease%' ORDER BY id;
-- never issued
SELECT regress_error($$SELECT durable_ledger.begin_effect('tok-4', 'pay', '{"n": 3}', lease => 'not-a-token')$$);
SELECT regress_error($$SELECT durable_ledger.renew_lease('not-a-token')$$);
SELECT durable_ledger.release_lease('not-a-token') AS released;
-- another run's token
SELECT regress_error(format($$SELECT durable_ledger.begin_effect('tok-5', 'pay', '{"n": 1}', lease => %L)$$, :'t2'));

-- ===================================================================
-- break_lease expires a token lease at once, audited; nothing terminated
-- ===================================================================
CREATE ROLE regress_token_admin NOLOGIN;
GRANT durable_ledger_admin TO regress_token_admin;
SET ROLE regress_token_admin;
SELECT durable_ledger.break_lease('tok-2', 'oncall.kim', 'worker gone quiet') AS broken;
SELECT durable_ledger.break_lease('tok-2', 'oncall.kim') AS broken_again;
RESET ROLE;
SELECT regress_error(format($$SELECT durable_ledger.begin_effect('tok-2', 'pay', '{"n": 1}', lease => %L)$$, :'t2'));
SELECT event, lease_epoch, role_name, detail->>'kind' AS kind, detail->>'broken_by' AS broken_by,
       detail->>'terminated' AS terminated
  FROM durable_ledger.audit_log WHERE run = 'tok-2' AND event = 'lease_broken';
SELECT count(*) AS live_token_leases FROM durable_ledger.leases WHERE run = 'tok-2';
DROP ROLE regress_token_admin;

-- ===================================================================
-- bad input: a clear error, nothing written
-- ===================================================================
SELECT regress_token_footprint('tok-6') AS before \gset
SELECT regress_error($$SELECT durable_ledger.take_lease(NULL)$$);
SELECT regress_error($$SELECT durable_ledger.take_lease('')$$);
SELECT regress_error($$SELECT durable_ledger.take_lease('tok-6', NULL)$$);
SELECT regress_error($$SELECT durable_ledger.take_lease('tok-6', '999 milliseconds')$$);
SELECT regress_error($$SELECT durable_ledger.take_lease('tok-6', '1 day 1 second')$$);
SELECT regress_error($$SELECT durable_ledger.take_lease('tok-6', '-5 minutes')$$);
SELECT regress_error($$SELECT durable_ledger.renew_lease(NULL)$$);
SELECT regress_error($$SELECT durable_ledger.renew_lease('')$$);
SELECT regress_error(format($$SELECT durable_ledger.renew_lease(%L, '0 seconds')$$, :'t2'));
SELECT regress_error($$SELECT durable_ledger.release_lease(NULL)$$);
SELECT regress_error($$SELECT durable_ledger.begin_effect('tok-6', 'pay', '{}', lease => '')$$);
SELECT regress_token_footprint('tok-6') = :'before' AS nothing_written;
-- a ttl is a duration: months (of no fixed length) are refused, also when
-- days take them back; days and times may offset each other
SELECT regress_error($$SELECT durable_ledger.take_lease('tok-6', '1000 years -359999 days')$$);
SELECT regress_error($$SELECT durable_ledger.take_lease('tok-6', '1 mon -29 days')$$);
SELECT regress_error($$SELECT durable_ledger.take_lease('tok-6', '-1 year 361 days')$$);
SELECT regress_error(format($$SELECT durable_ledger.renew_lease(%L, '1 mon')$$, :'t2'));
-- ... and one too long for 64 bits of microseconds is refused, not wrapped
-- around (213,503,982 days and an hour are 2^64 microseconds and an hour)
SELECT regress_error($$SELECT durable_ledger.take_lease('tok-6', '213503982 days 01:00:00')$$);
SELECT regress_error($$SELECT durable_ledger.take_lease('tok-6', '-213503982 days 23:00:00')$$);
SELECT regress_error(format($$SELECT durable_ledger.renew_lease(%L, '213503982 days 01:00:00')$$, :'t2'));
SELECT regress_token_footprint('tok-6') = :'before' AS nothing_written;
SELECT (l).expires_at - now() BETWEEN interval '59 minutes' AND interval '61 minutes' AS one_hour
  FROM (SELECT durable_ledger.take_lease('tok-6b', '1 day -23 hours') AS l) s;
-- the bounds themselves are accepted
SELECT (durable_ledger.take_lease('tok-6', '1 second')).epoch AS one_second;
SELECT (durable_ledger.take_lease('tok-7', '1 day')).epoch AS one_day;

-- ===================================================================
-- privileges: workers take, renew and release; auditors read; PUBLIC nothing
-- ===================================================================
SELECT f, has_function_privilege('durable_ledger_worker', f, 'EXECUTE') AS worker,
       has_function_privilege('durable_ledger_auditor', f, 'EXECUTE') AS auditor,
       has_function_privilege('public', f, 'EXECUTE') AS public
  FROM unnest(ARRAY['durable_ledger.take_lease(text,interval,text)',
                    'durable_ledger.renew_lease(text,interval)',
                    'durable_ledger.release_lease(text)']) AS f;
SELECT t, has_table_privilege('durable_ledger_auditor', t, 'SELECT') AS auditor_reads,
       has_table_privilege('durable_ledger_worker', t, 'SELECT') AS worker_reads,
       has_table_privilege('durable_ledger_admin', t, 'UPDATE') AS admin_writes
  FROM unnest(ARRAY['durable_ledger.token_leases', 'durable_ledger.token_lease_calls']) AS t;

-- clean up
DROP FUNCTION regress_token_footprint(text);
DROP FUNCTION regress_error(text);
