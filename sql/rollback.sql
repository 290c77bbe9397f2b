-- rollback: a begin_effect that is rolled back (whole transaction, ROLLBACK TO
-- SAVEPOINT, a PL/pgSQL exception block) leaves no effect row, no audit entry
-- and the occurrence counter as it was, so the next call gets the same
-- occurrence and key; a committed subtransaction (RELEASE SAVEPOINT) keeps its
-- count; the lease (a session lock) stays held after a rollback; and an
-- acquire_run that is rolled back restores the previous epoch and its counters
-- (or, when it took the lease, leaves the lock held and the next call starts
-- the epoch the rolled-back one would have been).
\set VERBOSITY terse

-- how many of this session's lease locks belong to a run (via its lock key)
CREATE FUNCTION pg_temp.my_locks(p_run text) RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*)
      FROM pg_locks l
     WHERE l.locktype = 'advisory' AND l.objsubid = 17484 AND l.granted
       AND l.pid = pg_backend_pid()
       AND ((l.classid::int8 << 32) | l.objid::int8) =
           (SELECT r.lock_key FROM durable_ledger.runs r WHERE r.run = p_run)
$$;

-- ===================================================================
-- a whole transaction rolled back
-- ===================================================================
BEGIN;
SELECT key AS rb1_k1, occurrence AS rb1_occ, decision AS rb1_decision
  FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}') \gset
SELECT :rb1_occ AS occurrence, :'rb1_decision' AS decision,
       :'rb1_k1' = durable_ledger.effect_key('rb-1', 'post', '{"msg": "hi"}', 1) AS is_occurrence_1;
SELECT count(*) AS effects_inside FROM durable_ledger.effects WHERE key = :'rb1_k1';
ROLLBACK;

-- no effect row, no audit entry, no run row
SELECT count(*) AS effects FROM durable_ledger.effects WHERE run = 'rb-1';
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log WHERE run = 'rb-1' OR key = :'rb1_k1';
SELECT count(*) AS runs FROM durable_ledger.runs WHERE run = 'rb-1';
-- the lock taken by the rolled-back call is still held (the lease is not
-- transactional); the runs row is gone, so look for the lock by pid and class
SELECT count(*) AS my_lease_locks FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND granted AND pid = pg_backend_pid();

-- the next call gets occurrence 1 and the same key again
SELECT key = :'rb1_k1' AS same_key, occurrence, decision, status
  FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}');
SELECT pg_temp.my_locks('rb-1') AS rb1_locks;
SELECT epochs FROM durable_ledger.runs WHERE run = 'rb-1';
SELECT a.event, e.occurrence, a.lease_epoch
  FROM durable_ledger.audit_log a LEFT JOIN durable_ledger.effects e USING (key)
 WHERE a.run = 'rb-1' ORDER BY a.id;

-- now the run is held: roll back a later call, the counter goes back
BEGIN;
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}');
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}');
ROLLBACK;
SELECT pg_temp.my_locks('rb-1') AS rb1_locks;
SELECT key = durable_ledger.effect_key('rb-1', 'post', '{"msg": "hi"}', 2) AS is_occurrence_2,
       occurrence, decision
  FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}');

-- ===================================================================
-- ROLLBACK TO SAVEPOINT
-- ===================================================================
BEGIN;
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}');
SAVEPOINT s1;
SELECT key AS rb1_k4, occurrence AS rb1_occ4
  FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}') \gset
SELECT :rb1_occ4 AS occurrence_in_savepoint;
-- another call in the savepoint, with other args
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "other"}');
ROLLBACK TO SAVEPOINT s1;
SELECT count(*) AS effects_after_rollback_to FROM durable_ledger.effects WHERE key = :'rb1_k4';
SELECT key = :'rb1_k4' AS same_key, occurrence, decision
  FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}');
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "other"}');
COMMIT;

-- ===================================================================
-- RELEASE SAVEPOINT: the subtransaction's calls count once committed
-- ===================================================================
BEGIN;
SAVEPOINT s2;
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}');
RELEASE SAVEPOINT s2;
COMMIT;
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}');

-- ...but not when the enclosing transaction rolls back
BEGIN;
SAVEPOINT s3;
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}');
RELEASE SAVEPOINT s3;
SAVEPOINT s4;
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}');
RELEASE SAVEPOINT s4;
ROLLBACK;
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}');

-- ===================================================================
-- an exception block in PL/pgSQL is a subtransaction too
-- ===================================================================
DO $$
DECLARE
    d durable_ledger.decision;
BEGIN
    BEGIN
        d := durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}');
        RAISE NOTICE 'inside the block: occurrence %', d.occurrence;
        RAISE EXCEPTION 'give up';
    EXCEPTION WHEN raise_exception THEN
        RAISE NOTICE 'rolled back: %', SQLERRM;
    END;
    d := durable_ledger.begin_effect('rb-1', 'post', '{"msg": "hi"}');
    RAISE NOTICE 'after the block: occurrence %', d.occurrence;
END
$$;

-- every occurrence exists exactly once, without gaps, and only committed
-- calls left audit entries
SELECT durable_ledger.canonical_args(args) AS args, count(*) AS effects,
       min(occurrence), max(occurrence), count(DISTINCT occurrence) AS distinct_occurrences,
       bool_and(key = durable_ledger.effect_key(run, tool, args, occurrence)) AS keys_match
  FROM durable_ledger.effects WHERE run = 'rb-1' GROUP BY 1 ORDER BY 1;
SELECT count(*) AS intents, count(DISTINCT key) AS keys
  FROM durable_ledger.audit_log WHERE run = 'rb-1' AND event = 'intent';
SELECT count(*) AS intents_without_effect
  FROM durable_ledger.audit_log a
 WHERE a.run = 'rb-1' AND a.event = 'intent'
   AND NOT EXISTS (SELECT 1 FROM durable_ledger.effects e WHERE e.key = a.key);
SELECT epochs FROM durable_ledger.runs WHERE run = 'rb-1';
SELECT pg_temp.my_locks('rb-1') AS rb1_locks;

-- ===================================================================
-- a rolled-back acquire_run on a held run: the previous epoch comes back
-- with its counters
-- ===================================================================
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-2', 'sync', '{"id": 1}');
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-2', 'sync', '{"id": 1}');
SELECT epochs FROM durable_ledger.runs WHERE run = 'rb-2';

BEGIN;
SELECT durable_ledger.acquire_run('rb-2');
SELECT epochs FROM durable_ledger.runs WHERE run = 'rb-2';
-- the new epoch starts at 1, and finds occurrence 1 of the previous epoch
-- unknown (its lease, epoch 1, ended with the new attempt)
SELECT occurrence, decision, status FROM durable_ledger.begin_effect('rb-2', 'sync', '{"id": 1}');
ROLLBACK;

SELECT pg_temp.my_locks('rb-2') AS rb2_locks;
SELECT epochs, released_at IS NULL AS not_released FROM durable_ledger.runs WHERE run = 'rb-2';
-- epoch 1 is live again: its effects are in flight, not unknown
SELECT occurrence, status FROM durable_ledger.effects WHERE run = 'rb-2' ORDER BY occurrence;
SELECT x.occurrence, e.status AS effect_status
  FROM durable_ledger.effects x CROSS JOIN LATERAL durable_ledger.effect_status(x.key) e
 WHERE x.run = 'rb-2' ORDER BY x.occurrence;
SELECT count(*) AS unresolved FROM durable_ledger.unresolved WHERE run = 'rb-2';
-- and its counter continues where it was: occurrence 3 in epoch 1
SELECT occurrence, decision, status,
       key = durable_ledger.effect_key('rb-2', 'sync', '{"id": 1}', 3) AS is_occurrence_3
  FROM durable_ledger.begin_effect('rb-2', 'sync', '{"id": 1}');
SELECT occurrence, status, lease_epoch FROM durable_ledger.effects WHERE run = 'rb-2' ORDER BY occurrence;
SELECT event, lease_epoch FROM durable_ledger.audit_log
 WHERE run = 'rb-2' AND event IN ('lease_acquired', 'pause') ORDER BY id;

-- the same with ROLLBACK TO SAVEPOINT
BEGIN;
SAVEPOINT s5;
SELECT durable_ledger.acquire_run('rb-2');
SELECT occurrence FROM durable_ledger.begin_effect('rb-2', 'sync', '{"id": 1}');
ROLLBACK TO SAVEPOINT s5;
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-2', 'sync', '{"id": 1}');
COMMIT;
SELECT epochs FROM durable_ledger.runs WHERE run = 'rb-2';

-- a committed acquire_run does start a new epoch (the contrast)
SELECT durable_ledger.acquire_run('rb-2');
SELECT epochs FROM durable_ledger.runs WHERE run = 'rb-2';
SELECT occurrence, decision, status FROM durable_ledger.begin_effect('rb-2', 'sync', '{"id": 1}');

-- ===================================================================
-- a rolled-back acquire_run that took the lease: the lock stays held, the
-- epoch does not exist, and the next call starts it, counting from 1
-- ===================================================================
BEGIN;
SELECT durable_ledger.acquire_run('rb-3');
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-3', 'sync', '{"id": 2}');
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-3', 'sync', '{"id": 2}');
ROLLBACK;

SELECT count(*) AS runs FROM durable_ledger.runs WHERE run = 'rb-3';
SELECT count(*) AS effects FROM durable_ledger.effects WHERE run = 'rb-3';
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log WHERE run = 'rb-3';
-- three locks: rb-1, rb-2 and the one the rolled-back acquire_run took for rb-3
SELECT count(*) AS my_lease_locks FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND granted AND pid = pg_backend_pid();

SELECT occurrence, decision, status,
       key = durable_ledger.effect_key('rb-3', 'sync', '{"id": 2}', 1) AS is_occurrence_1
  FROM durable_ledger.begin_effect('rb-3', 'sync', '{"id": 2}');
SELECT occurrence, decision FROM durable_ledger.begin_effect('rb-3', 'sync', '{"id": 2}');
SELECT epochs, released_at IS NULL AS not_released FROM durable_ledger.runs WHERE run = 'rb-3';
SELECT pg_temp.my_locks('rb-3') AS rb3_locks;
SELECT event, lease_epoch FROM durable_ledger.audit_log
 WHERE run = 'rb-3' AND event = 'lease_acquired' ORDER BY id;

-- a rolled-back acquire_run after the run was released: the lock is held
-- again, and the next call starts the next epoch
SELECT durable_ledger.release_run('rb-3');
SELECT pg_temp.my_locks('rb-3') AS rb3_locks;
BEGIN;
SELECT durable_ledger.acquire_run('rb-3');
ROLLBACK;
SELECT pg_temp.my_locks('rb-3') AS rb3_locks;
SELECT epochs, released_at IS NULL AS not_released FROM durable_ledger.runs WHERE run = 'rb-3';
SELECT occurrence, decision, status FROM durable_ledger.begin_effect('rb-3', 'sync', '{"id": 2}');
SELECT epochs, released_at IS NULL AS not_released FROM durable_ledger.runs WHERE run = 'rb-3';

-- ===================================================================
-- clean up: release every lease this file took
-- ===================================================================
SELECT durable_ledger.release_run('rb-1') AS rb1, durable_ledger.release_run('rb-2') AS rb2,
       durable_ledger.release_run('rb-3') AS rb3;
SELECT count(*) AS leases_left FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid();
