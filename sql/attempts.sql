-- attempts: reports name their attempt (v1.1).  A business key is executed
-- again after a failure (attempt 2, 3, ...), so a report must never decide a
-- later attempt than the one it is about: an attempt below the current one
-- never changes it (the same failure again is a no-op, anything else a
-- flagged conflict filed under that attempt's run and epoch); an attempt above
-- it, or below 1, is an error that writes nothing; a report that names no
-- attempt is applied only when it cannot be ambiguous (a derived key, a first
-- attempt, or the caller holding the very lease that started the current
-- attempt) and is otherwise kept as a flagged conflict.  The replaced attempts
-- are kept in durable_ledger.past_attempts; every audit row names its attempt.
\set VERBOSITY default

CREATE FUNCTION regress_attempt_footprint() RETURNS text LANGUAGE sql AS $$
    SELECT (SELECT count(*) FROM durable_ledger.audit_log) || '/' ||
           (SELECT count(*) FROM durable_ledger.past_attempts) || '/' ||
           (SELECT string_agg(key || ':' || status || ':' || attempt || ':' || conflict, ',' ORDER BY key)
              FROM durable_ledger.effects WHERE key LIKE 'ATT-%' OR run LIKE 'att-%')
$$;

-- ===================================================================
-- a derived key has one attempt: 1 (or no attempt) is it, anything else is
-- an error that writes nothing
-- ===================================================================
SELECT key AS k1 FROM durable_ledger.begin_effect('att-d', 'send_email', '{"to": "ana"}') \gset
SELECT regress_attempt_footprint() AS before \gset
SELECT durable_ledger.complete_effect(:'k1', '{"id": 1}', 2);
SELECT durable_ledger.complete_effect(:'k1', '{"id": 1}', 0);
SELECT durable_ledger.fail_effect(:'k1', '{"code": "x"}', -3);
SELECT regress_attempt_footprint() = :'before' AS nothing_written;
SELECT status, attempt, result FROM durable_ledger.complete_effect(:'k1', '{"id": 1}', 1);
-- repeated with and without the attempt: the same report, no change
SELECT status, conflict FROM durable_ledger.complete_effect(:'k1', '{"id": 1}', 1);
SELECT status, conflict FROM durable_ledger.complete_effect(:'k1', '{"id": 1}');
SELECT event, attempt, lease_epoch FROM durable_ledger.audit_log WHERE key = :'k1' ORDER BY id;
SELECT durable_ledger.release_run('att-d');

-- ===================================================================
-- a business key: attempt 1 fails in run att-a (this session); attempt 2 is
-- executed by run att-b in another session, which keeps its lease
-- ===================================================================
SELECT key, decision, attempt FROM durable_ledger.begin_effect('att-a', 'pay', '{"invoice": 1}', 'ATT-1');
SELECT status, attempt FROM durable_ledger.fail_effect('ATT-1', '{"code": "declined"}', 1);
SELECT dblink_connect('b', 'dbname=' || current_database());
SELECT * FROM dblink('b', $$SELECT key, decision, attempt
                              FROM durable_ledger.begin_effect('att-b', 'pay', '{"invoice": 1}', 'ATT-1')$$)
    AS t(key text, decision text, attempt int);
-- the failed attempt is kept, with the run and epoch that started it
SELECT key, attempt, run, lease_epoch, status, error, resolved_by,
       holder_pid = pg_backend_pid() AS started_here, replaced_at >= created_at AS replaced_after
  FROM durable_ledger.past_attempts WHERE key = 'ATT-1';
SELECT key, run, status, attempt, error, conflict FROM durable_ledger.effects WHERE key = 'ATT-1';

-- the same failure of attempt 1 again (a worker's retry after a network
-- error): a no-op that logs nothing, and attempt 2 goes on
SELECT regress_attempt_footprint() AS before \gset
SELECT status, attempt, run, conflict FROM durable_ledger.fail_effect('ATT-1', '{"code": "declined"}', 1);
SELECT regress_attempt_footprint() = :'before' AS nothing_written;

-- an attempt that does not exist yet: an error, nothing written
SELECT durable_ledger.complete_effect('ATT-1', '{"payment": "p1"}', 3);
SELECT regress_attempt_footprint() = :'before' AS nothing_written;

-- the same failure reported without its attempt, from this session, which
-- does not hold the lease that started attempt 2: it may concern attempt 1,
-- so it is never applied: a conflict, filed under no run and no attempt
SELECT status, attempt, run, conflict FROM durable_ledger.fail_effect('ATT-1', '{"code": "declined"}');
SELECT event, run, lease_epoch, attempt, detail
  FROM durable_ledger.audit_log WHERE key = 'ATT-1' AND event = 'conflict' ORDER BY id;
-- attempt 2 is in flight under att-b's live lease, and flagged: nobody
-- executes it again
SELECT decision, status, attempt FROM durable_ledger.begin_effect('att-c', 'pay', '{"invoice": 1}', 'ATT-1');

-- att-b reports attempt 2 by its number: applied (the flag stays for a person)
SELECT * FROM dblink('b', $$SELECT status, attempt, result, conflict
                              FROM durable_ledger.complete_effect('ATT-1', '{"payment": "p1"}', 2)$$)
    AS t(status text, attempt int, result jsonb, conflict boolean);
SELECT status FROM durable_ledger.resolve_effect('ATT-1', 'completed', '{"payment": "p1"}', 'regress',
                                                  'the bank shows one payment, p1, for attempt 2');
SELECT decision, status, attempt, result FROM durable_ledger.begin_effect('att-c', 'pay', '{"invoice": 1}', 'ATT-1');

-- a completion of attempt 1, which is recorded as failed: the operation may
-- have happened twice; kept as a conflict under attempt 1's run and epoch,
-- nothing else changed
SELECT status, attempt, result, conflict FROM durable_ledger.complete_effect('ATT-1', '{"payment": "p0"}', 1);
SELECT a.event, a.run, a.lease_epoch = p.lease_epoch AS attempt_1_epoch, a.attempt, a.detail
  FROM durable_ledger.audit_log a JOIN durable_ledger.past_attempts p ON p.key = a.key AND p.attempt = 1
 WHERE a.key = 'ATT-1' AND a.event = 'conflict' ORDER BY a.id DESC LIMIT 1;
SELECT decision, status, reason FROM durable_ledger.begin_effect('att-c', 'pay', '{"invoice": 1}', 'ATT-1');
SELECT status, resolved_by FROM durable_ledger.resolve_effect('ATT-1', 'completed', '{"payment": "p1"}', 'regress',
                                                               'p0 never existed: the bank declined attempt 1');
SELECT * FROM dblink('b', $$SELECT durable_ledger.release_run('att-b')$$) AS t(released boolean);

-- a failure of attempt 1 with another error: a contradiction like any other
SELECT status, conflict FROM durable_ledger.fail_effect('ATT-1', '{"code": "timeout"}', 1);
SELECT status FROM durable_ledger.resolve_effect('ATT-1', 'completed', '{"payment": "p1"}', 'regress');

-- every audit row of the key names the attempt it concerns
SELECT event, run, attempt FROM durable_ledger.audit_log WHERE key = 'ATT-1' ORDER BY id;

-- ===================================================================
-- a report that names no attempt is applied when it cannot be ambiguous
-- ===================================================================
-- a first attempt, reported by a session that holds no lease of its run
SELECT * FROM dblink('b', $$SELECT decision, attempt
                              FROM durable_ledger.begin_effect('att-e', 'pay', '{"invoice": 2}', 'ATT-2')$$)
    AS t(decision text, attempt int);
SELECT status, attempt, conflict FROM durable_ledger.complete_effect('ATT-2', '{"payment": "p2"}');
SELECT * FROM dblink('b', $$SELECT durable_ledger.release_run('att-e')$$) AS t(released boolean);

-- the holder of the very lease that started the current attempt, when this
-- session holds no lease of a run that started an earlier attempt of the key
-- (attempt 1 was att-f0's, in another session)
SELECT * FROM dblink('b', $$SELECT decision, attempt
                              FROM durable_ledger.begin_effect('att-f0', 'pay', '{"invoice": 3}', 'ATT-3')$$)
    AS t(decision text, attempt int);
SELECT * FROM dblink('b', $$SELECT status FROM durable_ledger.fail_effect('ATT-3', '"declined"', 1)$$)
    AS t(status text);
SELECT decision, attempt FROM durable_ledger.begin_effect('att-f', 'pay', '{"invoice": 3}', 'ATT-3');
SELECT status, attempt, conflict FROM durable_ledger.fail_effect('ATT-3', '"declined again"');
-- a lease that began two attempts cannot tell them apart: when it began
-- attempt 3 in the same epoch as attempt 2, a report that names no attempt
-- (a network retry of attempt 2's failure, say) may concern attempt 2
SELECT decision, attempt FROM durable_ledger.begin_effect('att-f', 'pay', '{"invoice": 3}', 'ATT-3');
SELECT status, attempt, conflict FROM durable_ledger.fail_effect('ATT-3', '"declined again"');
SELECT decision, status, attempt FROM durable_ledger.begin_effect('att-f2', 'pay', '{"invoice": 3}', 'ATT-3');
-- by number, attempt 3's own report lands on attempt 3
SELECT status, attempt, result, conflict FROM durable_ledger.complete_effect('ATT-3', '{"payment": "p3"}', 3);
SELECT status FROM durable_ledger.resolve_effect('ATT-3', 'completed', '{"payment": "p3"}', 'regress',
                                                  attempt => 3);
SELECT attempt, run, lease_epoch, error FROM durable_ledger.past_attempts WHERE key = 'ATT-3' ORDER BY attempt;
SELECT * FROM dblink('b', $$SELECT durable_ledger.release_run('att-f0')$$) AS t(released boolean);

-- a session that holds a lease of a run that started an earlier attempt of
-- the key cannot say which attempt it reports on (1.3; 1.1 applied it): one
-- session drives runs att-p and att-q, which share business key ATT-7; att-p's
-- attempt 1 failed, att-q began attempt 2; a report that names no attempt (a
-- retry of att-p's failure, say) is kept as a conflict, not applied to
-- attempt 2, and no third run executes attempt 3 while attempt 2 may be in flight
SELECT decision, attempt FROM durable_ledger.begin_effect('att-p', 'pay', '{"invoice": 7}', 'ATT-7');
SELECT status FROM durable_ledger.fail_effect('ATT-7', '"declined"', 1);
SELECT decision, attempt FROM durable_ledger.begin_effect('att-q', 'pay', '{"invoice": 7}', 'ATT-7');
SELECT status, attempt, conflict FROM durable_ledger.fail_effect('ATT-7', '"declined"');
SELECT * FROM dblink('b', $$SELECT decision || ' ' || status || ' ' || attempt
                              FROM durable_ledger.begin_effect('att-r', 'pay', '{"invoice": 7}', 'ATT-7')$$)
    AS t(third_run text);
SELECT * FROM dblink('b', $$SELECT durable_ledger.release_run('att-r')$$) AS t(released boolean);
-- named, the report is attempt 2's truth and is applied (the flag stays
-- until a person resolves it)
SELECT durable_ledger.release_run('att-p');
SELECT status, attempt, conflict FROM durable_ledger.fail_effect('ATT-7', '"declined at the bank"', 2);
SELECT durable_ledger.release_run('att-q');

-- ===================================================================
-- being the same backend, or holding some other lease, proves nothing
-- ===================================================================
-- attempt 2 started by this session under att-g's epoch 1, which it released
SELECT decision, attempt FROM durable_ledger.begin_effect('att-g', 'pay', '{"invoice": 4}', 'ATT-4');
SELECT status FROM durable_ledger.fail_effect('ATT-4', '"declined"', 1);
SELECT decision, attempt FROM durable_ledger.begin_effect('att-g', 'pay', '{"invoice": 4}', 'ATT-4');
SELECT durable_ledger.release_run('att-g');
SELECT status, attempt, conflict FROM durable_ledger.fail_effect('ATT-4', '"late"');
SELECT status, attempt, conflict, holder_pid = pg_backend_pid() AS started_by_this_backend
  FROM durable_ledger.effects WHERE key = 'ATT-4';
-- ... and again while holding att-g's next epoch, and another run's lease
SELECT durable_ledger.acquire_run('att-g'), durable_ledger.acquire_run('att-h');
SELECT status, attempt, conflict FROM durable_ledger.complete_effect('ATT-4', '{"payment": "p4"}');
SELECT count(*) AS conflicts, count(*) FILTER (WHERE attempt IS NULL AND run IS NULL) AS unattributed
  FROM durable_ledger.audit_log WHERE key = 'ATT-4' AND event = 'conflict';
-- no attempt 3 while attempt 2's outcome is unknown
SELECT decision, status, attempt FROM durable_ledger.begin_effect('att-g', 'pay', '{"invoice": 4}', 'ATT-4');
-- its worker's report with the attempt number is the truth about attempt 2
SELECT status, attempt, result, conflict FROM durable_ledger.complete_effect('ATT-4', '{"payment": "p4"}', 2);
SELECT event, attempt, detail->>'status_before' AS status_before
  FROM durable_ledger.audit_log WHERE key = 'ATT-4' AND event IN ('completed', 'late_completion');
SELECT durable_ledger.release_run('att-g'), durable_ledger.release_run('att-h');

-- ===================================================================
-- a delayed report of attempt 1 after attempt 2's lease ended (attempt 2's
-- outcome is unknown): it never turns attempt 2 into a failure, so no
-- attempt 3 is executed
-- ===================================================================
SELECT decision, attempt FROM durable_ledger.begin_effect('att-i', 'pay', '{"invoice": 5}', 'ATT-5');
SELECT status FROM durable_ledger.fail_effect('ATT-5', '"declined"', 1);
SELECT durable_ledger.release_run('att-i');
SELECT * FROM dblink('b', $$SELECT decision, attempt
                              FROM durable_ledger.begin_effect('att-j', 'pay', '{"invoice": 5}', 'ATT-5')$$)
    AS t(decision text, attempt int);
SELECT dblink_disconnect('b');
DO $$ BEGIN
  FOR i IN 1..1200 LOOP
    EXIT WHEN NOT EXISTS (SELECT 1 FROM durable_ledger.leases WHERE run = 'att-j');
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SELECT status FROM durable_ledger.effect_status('ATT-5');
SELECT status, attempt, conflict FROM durable_ledger.fail_effect('ATT-5', '"declined"', 1);
SELECT decision, status, attempt FROM durable_ledger.begin_effect('att-k', 'pay', '{"invoice": 5}', 'ATT-5');
SELECT status, attempt, conflict FROM durable_ledger.fail_effect('ATT-5', '"declined"');
SELECT decision, status, attempt FROM durable_ledger.begin_effect('att-k', 'pay', '{"invoice": 5}', 'ATT-5');
SELECT key, run, status, attempt, conflict FROM durable_ledger.unresolved WHERE key = 'ATT-5';
SELECT durable_ledger.release_run('att-k');

-- ===================================================================
-- a resolution names the attempt it was prepared for: a decision about
-- attempt 2 never lands on an attempt 3 begun meanwhile
-- ===================================================================
SELECT decision, attempt FROM durable_ledger.begin_effect('att-m', 'pay', '{"invoice": 6}', 'ATT-6');
SELECT status FROM durable_ledger.fail_effect('ATT-6', '"declined"', 1);
SELECT decision, attempt FROM durable_ledger.begin_effect('att-m', 'pay', '{"invoice": 6}', 'ATT-6', NULL);
SELECT durable_ledger.release_run('att-m');
-- a person reads unresolved: attempt 2 is unknown
SELECT key, status, attempt FROM durable_ledger.unresolved WHERE key = 'ATT-6';
-- meanwhile attempt 2's late failure arrives, and attempt 3 begins and dies
SELECT status FROM durable_ledger.fail_effect('ATT-6', '"declined late"', 2);
SELECT decision, attempt FROM durable_ledger.begin_effect('att-n', 'pay', '{"invoice": 6}', 'ATT-6');
SELECT durable_ledger.release_run('att-n');
-- the person's decision about attempt 2 is refused, nothing written
SELECT regress_attempt_footprint() AS before \gset
SELECT durable_ledger.resolve_effect('ATT-6', 'failed', '"bank: nothing"', 'regress', attempt => 2);
SELECT durable_ledger.resolve_effect('ATT-6', 'failed', '"bank: nothing"', 'regress', attempt => 4);
SELECT durable_ledger.resolve_effect('ATT-6', 'failed', '"bank: nothing"', 'regress', attempt => 0);
SELECT regress_attempt_footprint() = :'before' AS nothing_written;
-- decided again, for attempt 3
SELECT status, attempt, error FROM durable_ledger.resolve_effect('ATT-6', 'failed', '"bank: nothing"', 'regress',
                                                                  attempt => 3);
SELECT event, attempt, run FROM durable_ledger.audit_log WHERE key = 'ATT-6' AND event = 'resolved';

-- a report on a replaced attempt that is not on record (a ledger upgraded
-- from 1.0 whose log lacked it) is judged as a failed attempt
DELETE FROM durable_ledger.past_attempts WHERE key = 'ATT-3' AND attempt = 1;
SELECT status, attempt, conflict FROM durable_ledger.fail_effect('ATT-3', '"anything"', 1);
SELECT status, attempt, conflict FROM durable_ledger.complete_effect('ATT-3', '{"payment": "p3"}', 1);
SELECT run, lease_epoch, attempt FROM durable_ledger.audit_log
 WHERE key = 'ATT-3' AND event = 'conflict' ORDER BY id DESC LIMIT 1;

-- 1.0 callers: the two-argument calls keep working
SELECT status FROM durable_ledger.resolve_effect('ATT-3', 'completed', '{"payment": "p3"}', 'regress');
SELECT key AS k2 FROM durable_ledger.begin_effect('att-l', 'send_email', '{"to": "bo"}') \gset
SELECT status FROM durable_ledger.fail_effect(:'k2', NULL);
SELECT durable_ledger.release_run('att-l');

SELECT durable_ledger.release_run(r) FROM unnest(ARRAY['att-a', 'att-c', 'att-f', 'att-f2']) AS r;
SELECT count(*) AS leases_left FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid();
DROP FUNCTION regress_attempt_footprint();
