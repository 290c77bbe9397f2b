-- occurrences: "again" is not "twice".  Identical calls in one lease epoch get
-- occurrences 1, 2, ... with distinct keys; a new epoch (begin after release,
-- acquire_run, also while the session already holds the run) restarts at 1 and
-- maps onto the same keys in order; different tools or args count separately;
-- 1,000 calls take the run's lock once; effect_key recomputes every stored key.
\set VERBOSITY terse

-- ===================================================================
-- two identical calls in one epoch: occurrence 1 and 2, two keys
-- ===================================================================
SELECT key AS o1, occurrence AS o1_occurrence, decision AS o1_decision
  FROM durable_ledger.begin_effect('occ-1', 'charge', '{"amount": 5}') \gset
SELECT key AS o2, occurrence AS o2_occurrence, decision AS o2_decision
  FROM durable_ledger.begin_effect('occ-1', 'charge', '{"amount": 5}') \gset
SELECT :o1_occurrence AS o1_occurrence, :'o1_decision' AS o1_decision,
       :o2_occurrence AS o2_occurrence, :'o2_decision' AS o2_decision;

SELECT :'o1' <> :'o2' AS distinct_keys,
       :'o1' = durable_ledger.effect_key('occ-1', 'charge', '{"amount": 5}', 1) AS o1_is_occurrence_1,
       :'o2' = durable_ledger.effect_key('occ-1', 'charge', '{"amount": 5}', 2) AS o2_is_occurrence_2;
SELECT left(key, 12) AS key, occurrence, status, lease_epoch
  FROM durable_ledger.effects WHERE run = 'occ-1' ORDER BY occurrence;

SELECT status, result FROM durable_ledger.complete_effect(:'o1', '{"charge": "ch-1"}');
SELECT status, result FROM durable_ledger.complete_effect(:'o2', '{"charge": "ch-2"}');

-- ===================================================================
-- a new epoch with acquire_run while this session holds the run: the
-- counter restarts at 1 and the replay maps onto the same keys, in order
-- ===================================================================
SELECT durable_ledger.acquire_run('occ-1');
SELECT key = :'o1' AS is_o1, decision, status, occurrence, result
  FROM durable_ledger.begin_effect('occ-1', 'charge', '{"amount": 5}');
SELECT key = :'o2' AS is_o2, decision, status, occurrence, result
  FROM durable_ledger.begin_effect('occ-1', 'charge', '{"amount": 5}');
-- a third identical call is new: occurrence 3, executed
SELECT key AS o3, occurrence AS o3_occurrence, decision AS o3_decision
  FROM durable_ledger.begin_effect('occ-1', 'charge', '{"amount": 5}') \gset
SELECT :o3_occurrence AS o3_occurrence, :'o3_decision' AS o3_decision,
       :'o3' = durable_ledger.effect_key('occ-1', 'charge', '{"amount": 5}', 3) AS o3_is_occurrence_3;
SELECT status FROM durable_ledger.complete_effect(:'o3', '{"charge": "ch-3"}');

-- ===================================================================
-- a new epoch after release_run, through acquire_run and through an
-- implicit begin_effect: the same sequence again
-- ===================================================================
SELECT durable_ledger.release_run('occ-1');
SELECT durable_ledger.acquire_run('occ-1');
SELECT occurrence, decision, result FROM durable_ledger.begin_effect('occ-1', 'charge', '{"amount": 5}');
SELECT occurrence, decision, result FROM durable_ledger.begin_effect('occ-1', 'charge', '{"amount": 5}');
SELECT occurrence, decision, result FROM durable_ledger.begin_effect('occ-1', 'charge', '{"amount": 5}');
SELECT durable_ledger.release_run('occ-1');
SELECT occurrence, decision, result FROM durable_ledger.begin_effect('occ-1', 'charge', '{"amount": 5}');
SELECT occurrence, decision, result FROM durable_ledger.begin_effect('occ-1', 'charge', '{"amount": 5}');

-- four epochs; three effects, each started once
SELECT epochs FROM durable_ledger.runs WHERE run = 'occ-1';
SELECT left(key, 12) AS key, occurrence, status, result, lease_epoch
  FROM durable_ledger.effects WHERE run = 'occ-1' ORDER BY occurrence;
SELECT event, count(*) FROM durable_ledger.audit_log
 WHERE run = 'occ-1' GROUP BY event ORDER BY event;

-- ===================================================================
-- different tools and different args are counted separately; the same
-- canonical args (other key order, white space, number spelling) are the
-- same call
-- ===================================================================
SELECT calls.tool, calls.args AS args_as_written, occurrence, decision,
       key = durable_ledger.effect_key('occ-2', calls.tool, calls.args::jsonb, occurrence) AS key_matches
  FROM (VALUES (1, 'email', '{"to": "a", "cc": "b"}'),
               (2, 'email', '{"to": "c", "cc": "b"}'),
               (3, 'sms',   '{"to": "a", "cc": "b"}'),
               (4, 'email', '{ "cc":"b","to":"a" }'),
               (5, 'email', '{"to": "c", "cc": "b"}'),
               (6, 'email', '{"cc": "b", "to": "a", "to": "a"}')) AS calls(n, tool, args)
 CROSS JOIN LATERAL durable_ledger.begin_effect('occ-2', calls.tool, calls.args::jsonb)
 ORDER BY n;

SELECT occurrence, decision FROM durable_ledger.begin_effect('occ-2', 'pay', '{"amount": 1}');
SELECT occurrence, decision FROM durable_ledger.begin_effect('occ-2', 'pay', '{"amount": 1.0}');
SELECT occurrence, decision FROM durable_ledger.begin_effect('occ-2', 'pay', '{"amount": 10e-1}');
SELECT occurrence, decision FROM durable_ledger.begin_effect('occ-2', 'pay', '{"amount": 2}');

SELECT tool, canonical, count(*) AS calls, max(occurrence) AS last_occurrence
  FROM (SELECT tool, durable_ledger.canonical_args(args) AS canonical, occurrence
          FROM durable_ledger.effects WHERE run = 'occ-2') e
 GROUP BY tool, canonical ORDER BY tool, canonical;

-- the same call in another run is another effect, counted from 1
SELECT occurrence, decision,
       key <> durable_ledger.effect_key('occ-2', 'pay', '{"amount": 1}', 1) AS other_key
  FROM durable_ledger.begin_effect('occ-2b', 'pay', '{"amount": 1}');

-- ===================================================================
-- 1,000 calls on one run take the lock once: one release_run frees it
-- ===================================================================
DO $$
DECLARE
    d durable_ledger.decision;
BEGIN
    FOR i IN 1..1000 LOOP
        d := durable_ledger.begin_effect('occ-3', 'poll', '{"queue": "q"}');
        IF d.occurrence <> i OR d.decision <> 'execute' THEN
            RAISE EXCEPTION 'call % got occurrence % and decision %', i, d.occurrence, d.decision;
        END IF;
    END LOOP;
END
$$;
-- and a few more, each in its own transaction
SELECT occurrence, decision FROM durable_ledger.begin_effect('occ-3', 'poll', '{"queue": "q"}');
SELECT occurrence, decision FROM durable_ledger.begin_effect('occ-3', 'poll', '{"queue": "q"}');

SELECT count(*) AS effects, count(DISTINCT key) AS keys, min(occurrence), max(occurrence),
       count(*) FILTER (WHERE key = durable_ledger.effect_key(run, tool, args, occurrence)) AS keys_recomputed,
       count(DISTINCT lease_epoch) AS epochs
  FROM durable_ledger.effects WHERE run = 'occ-3';
SELECT count(*) FILTER (WHERE event = 'lease_acquired') AS lease_acquired,
       count(*) FILTER (WHERE event = 'intent') AS intents
  FROM durable_ledger.audit_log WHERE run = 'occ-3';

-- this session holds the run's lock (one lock), and after one release nothing
SELECT count(*) AS my_occ3_locks
  FROM pg_locks l JOIN durable_ledger.runs r
    ON r.lock_key = ((l.classid::int8 << 32) | l.objid::int8)
 WHERE l.locktype = 'advisory' AND l.objsubid = 17484 AND l.granted
   AND l.pid = pg_backend_pid() AND r.run = 'occ-3';
SELECT count(*) AS leases_shown FROM durable_ledger.leases WHERE run = 'occ-3';
SELECT durable_ledger.release_run('occ-3');
SELECT count(*) AS my_occ3_locks
  FROM pg_locks l JOIN durable_ledger.runs r
    ON r.lock_key = ((l.classid::int8 << 32) | l.objid::int8)
 WHERE l.locktype = 'advisory' AND l.objsubid = 17484
   AND l.pid = pg_backend_pid() AND r.run = 'occ-3';
SELECT count(*) AS leases_shown FROM durable_ledger.leases WHERE run = 'occ-3';
-- a second release finds nothing to release
SELECT durable_ledger.release_run('occ-3');

-- ===================================================================
-- effect_key equals every stored derived key of this file
-- ===================================================================
SELECT run, count(*) AS effects,
       bool_and(key = durable_ledger.effect_key(run, tool, args, occurrence)) AS all_keys_match
  FROM durable_ledger.effects WHERE run IN ('occ-1', 'occ-2', 'occ-2b', 'occ-3')
 GROUP BY run ORDER BY run;

-- ===================================================================
-- clean up: release every lease this file took
-- ===================================================================
SELECT durable_ledger.release_run('occ-1') AS occ1, durable_ledger.release_run('occ-2') AS occ2,
       durable_ledger.release_run('occ-2b') AS occ2b;
SELECT count(*) AS leases_left FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid();
