-- decisions: begin_effect answers execute for a new call, replay (with the recorded
-- result) once it completed, and pause once its lease ended without a completion;
-- effect_status already says unknown before any later attempt; complete_effect
-- returns the effects row, a retried equal completion changes nothing, and a
-- completion of an unknown effect is accepted and audited as late.
-- (in_progress needs a business key shared across runs: see business_keys.)
\set VERBOSITY terse


-- ===================================================================
-- execute: a call never seen before
-- ===================================================================
SELECT durable_ledger.effect_key('dec-1', 'send_email', '{"to": "a@example.com"}', 1) AS k1 \gset

SELECT left(key, 12) AS key, key = :'k1' AS key_is_derived,
       decision, status, occurrence, attempt, result, error, reason
  FROM durable_ledger.begin_effect('dec-1', 'send_email', '{"to": "a@example.com"}',
                                   meta => '{"trace": "t-1"}');

-- the intent is recorded before the effect, with its lease epoch
SELECT left(key, 12) AS key, run, tool, args, business_key, occurrence, attempt, status,
       result, error, meta, lease_epoch, holder_pid = pg_backend_pid() AS held_by_me,
       completed_at IS NULL AS not_completed, resolved_by, resolution_note, conflict
  FROM durable_ledger.effects WHERE key = :'k1';

-- under the live lease, effect_status says started (it may be in flight)
SELECT status FROM durable_ledger.effect_status(:'k1');
SELECT count(*) AS unresolved FROM durable_ledger.unresolved WHERE run = 'dec-1';

-- a key never seen: no row, no error
SELECT count(*) AS rows_for_unseen_key FROM durable_ledger.effect_status('no-such-key');

-- ===================================================================
-- complete_effect returns the effect's row
-- ===================================================================
SELECT left(key, 12) AS key, run, tool, status, result, error, occurrence, attempt,
       completed_at IS NOT NULL AS has_completed_at, conflict
  FROM durable_ledger.complete_effect(:'k1', '{"message_id": "m-42"}');

SELECT completed_at AS c1_completed_at FROM durable_ledger.effects WHERE key = :'k1' \gset
SELECT count(*) AS k1_audit_rows FROM durable_ledger.audit_log WHERE key = :'k1' \gset

-- a retried completion with an equal result (another spelling of the same JSON)
-- succeeds, returns the row and changes nothing: no audit row, no new timestamp
SELECT status, result, conflict
  FROM durable_ledger.complete_effect(:'k1', '{ "message_id" : "m-42" }');
SELECT completed_at = :'c1_completed_at' AS completed_at_unchanged, status, result, conflict
  FROM durable_ledger.effects WHERE key = :'k1';
SELECT count(*) = :k1_audit_rows AS no_new_audit_row
  FROM durable_ledger.audit_log WHERE key = :'k1';

-- ===================================================================
-- replay: a new lease epoch (release, then begin again) maps onto the same
-- key and gets the recorded result; the effect is not started again
-- ===================================================================
SELECT durable_ledger.release_run('dec-1');

SELECT left(key, 12) AS key, key = :'k1' AS same_key,
       decision, status, occurrence, attempt, result, error, reason
  FROM durable_ledger.begin_effect('dec-1', 'send_email', '{"to": "a@example.com"}');

-- and again with acquire_run while this session already holds the run
SELECT durable_ledger.acquire_run('dec-1');
SELECT key = :'k1' AS same_key, decision, status, occurrence, attempt, result, error,
       reason IS NOT NULL AS has_reason
  FROM durable_ledger.begin_effect('dec-1', 'send_email', '{"to": "a@example.com"}');

-- the replays changed nothing on the effect
SELECT status, result, attempt, lease_epoch, completed_at = :'c1_completed_at' AS completed_at_unchanged
  FROM durable_ledger.effects WHERE key = :'k1';

-- three epochs, one intent, one completion, two replays
SELECT epochs FROM durable_ledger.runs WHERE run = 'dec-1';
SELECT event, left(key, 12) AS key, detail, lease_epoch
  FROM durable_ledger.audit_log WHERE run = 'dec-1' ORDER BY id;

-- ===================================================================
-- pause: a started effect whose lease ended without a completion
-- ===================================================================
SELECT durable_ledger.effect_key('dec-2', 'create_ticket', '{"title": "disk full"}', 1) AS k2 \gset

SELECT key = :'k2' AS key_is_derived, decision, status, occurrence
  FROM durable_ledger.begin_effect('dec-2', 'create_ticket', '{"title": "disk full"}');
SELECT durable_ledger.release_run('dec-2');

-- before any later attempt: the table still holds the intent as started, but
-- effect_status (and unresolved) report that nobody knows the outcome
SELECT status AS stored_status FROM durable_ledger.effects WHERE key = :'k2';
SELECT left(key, 12) AS key, status FROM durable_ledger.effect_status(:'k2');
SELECT left(key, 12) AS key, status, conflict, reason IS NOT NULL AS has_reason
  FROM durable_ledger.unresolved WHERE run = 'dec-2' ORDER BY key;

-- the next attempt pauses: it is not executed again
SELECT left(key, 12) AS key, key = :'k2' AS same_key,
       decision, status, occurrence, attempt, result, error, reason
  FROM durable_ledger.begin_effect('dec-2', 'create_ticket', '{"title": "disk full"}');
SELECT status AS stored_status FROM durable_ledger.effects WHERE key = :'k2';

-- and every later attempt pauses too, until somebody resolves it
SELECT durable_ledger.acquire_run('dec-2');
SELECT key = :'k2' AS same_key, decision, status, occurrence, attempt, result, error,
       reason IS NOT NULL AS has_reason
  FROM durable_ledger.begin_effect('dec-2', 'create_ticket', '{"title": "disk full"}');

-- a lease also ends when the holding session ends without releasing (a
-- crashed worker): a second session begins an effect and disconnects
SELECT dblink_connect('worker', 'dbname=' || current_database());
SELECT * FROM dblink('worker', $$SELECT key, decision FROM durable_ledger.begin_effect('dec-4',
                               'create_ticket', '{"title": "fan noise"}')$$) AS t(key text, decision text) \gset w_
SELECT :'w_decision' AS decision,
       :'w_key' = durable_ledger.effect_key('dec-4', 'create_ticket', '{"title": "fan noise"}', 1) AS key_is_derived;
SELECT set_config('dec.w_pid', holder_pid::text, false) IS NOT NULL AS pid_noted
  FROM durable_ledger.effects WHERE key = :'w_key';
-- while that session lives, its effect may be in flight
SELECT status FROM durable_ledger.effect_status(:'w_key');
SELECT dblink_disconnect('worker');
-- wait (polling pg_locks, at most 60 s) until the ending backend has let go
-- of its lease lock
DO $$
BEGIN
    FOR i IN 1..6000 LOOP
        EXIT WHEN NOT EXISTS (SELECT 1 FROM pg_locks
                               WHERE pid = current_setting('dec.w_pid')::int
                                 AND locktype = 'advisory' AND objsubid = 17484);
        PERFORM pg_sleep(0.01);
    END LOOP;
END
$$;
SELECT count(*) AS worker_lease_locks FROM pg_locks
 WHERE pid = current_setting('dec.w_pid')::int AND locktype = 'advisory' AND objsubid = 17484;
SELECT status AS stored_status FROM durable_ledger.effects WHERE key = :'w_key';
SELECT status FROM durable_ledger.effect_status(:'w_key');
SELECT status, conflict FROM durable_ledger.unresolved WHERE key = :'w_key';
SELECT decision, status, occurrence FROM durable_ledger.begin_effect('dec-4', 'create_ticket', '{"title": "fan noise"}');

-- ===================================================================
-- a completion that arrives for an unknown effect is accepted, as late
-- ===================================================================
SELECT left(key, 12) AS key, status, result, error, completed_at IS NOT NULL AS has_completed_at, conflict
  FROM durable_ledger.complete_effect(:'k2', '{"ticket": 17}');
SELECT event, detail FROM durable_ledger.audit_log
 WHERE key = :'k2' AND event IN ('completed', 'late_completion') ORDER BY id;
SELECT count(*) AS unresolved FROM durable_ledger.unresolved WHERE run = 'dec-2';

-- the next attempt replays it
SELECT durable_ledger.acquire_run('dec-2');
SELECT key = :'k2' AS same_key, decision, status, occurrence, attempt, result, error
  FROM durable_ledger.begin_effect('dec-2', 'create_ticket', '{"title": "disk full"}');

SELECT event, left(key, 12) AS key, detail, lease_epoch
  FROM durable_ledger.audit_log WHERE run = 'dec-2' ORDER BY id;

-- ===================================================================
-- a late completion of a started effect whose lease was released (no later
-- attempt marked it unknown yet) is accepted and audited as late as well
-- ===================================================================
SELECT durable_ledger.effect_key('dec-3', 'refund', '{"order": 9}', 1) AS k3 \gset
SELECT decision FROM durable_ledger.begin_effect('dec-3', 'refund', '{"order": 9}');
SELECT durable_ledger.release_run('dec-3');
SELECT status, result FROM durable_ledger.complete_effect(:'k3', '{"refund": "r-9"}');
SELECT event, detail FROM durable_ledger.audit_log
 WHERE key = :'k3' ORDER BY id;

-- while the lease is live, a completion is on time (event completed, no detail)
-- (a run of its own: a later attempt of dec-3 calling refund with other args
-- would diverge from its first, and pause)
SELECT durable_ledger.effect_key('dec-3b', 'refund', '{"order": 10}', 1) AS k4 \gset
SELECT decision FROM durable_ledger.begin_effect('dec-3b', 'refund', '{"order": 10}');
SELECT status FROM durable_ledger.complete_effect(:'k4', NULL);
SELECT event, detail FROM durable_ledger.audit_log
 WHERE key = :'k4' ORDER BY id;
-- a NULL result is a result (the effect returned nothing): replayed as such
SELECT durable_ledger.release_run('dec-3b');
SELECT decision, status, result, error
  FROM durable_ledger.begin_effect('dec-3b', 'refund', '{"order": 10}');

-- completing a key that does not exist is an error, and writes nothing
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_try($$SELECT durable_ledger.complete_effect('no-such-key', '{}')$$);
SELECT count(*) = :audit_rows AS nothing_written FROM durable_ledger.audit_log;
SELECT count(*) AS effects_rows FROM durable_ledger.effects WHERE key = 'no-such-key';

-- ===================================================================
-- a paused call does not use up its occurrence: asking again in the same
-- epoch asks about the same effect (pause, then its outcome once resolved),
-- so an agent that retries after a pause can never execute a second payment
-- ===================================================================
SELECT decision FROM durable_ledger.begin_effect('dec-5', 'pay', '{"invoice": 55}');
SELECT durable_ledger.release_run('dec-5');
SELECT durable_ledger.acquire_run('dec-5');
SELECT decision, status, occurrence FROM durable_ledger.begin_effect('dec-5', 'pay', '{"invoice": 55}');
SELECT decision, status, occurrence FROM durable_ledger.begin_effect('dec-5', 'pay', '{"invoice": 55}');
SELECT status FROM durable_ledger.resolve_effect(
    durable_ledger.effect_key('dec-5', 'pay', '{"invoice": 55}', 1), 'completed', '{"payment": "p55"}', 'regress');
SELECT decision, status, occurrence, result FROM durable_ledger.begin_effect('dec-5', 'pay', '{"invoice": 55}');
-- only a call after that is a second one
SELECT decision, occurrence FROM durable_ledger.begin_effect('dec-5', 'pay', '{"invoice": 55}');
SELECT durable_ledger.release_run('dec-5');

-- ===================================================================
-- clean up: release every lease this file took
-- ===================================================================
SELECT durable_ledger.release_run('dec-1') AS dec1, durable_ledger.release_run('dec-2') AS dec2,
       durable_ledger.release_run('dec-3b') AS dec3b,
       durable_ledger.release_run('dec-4') AS dec4;
SELECT count(*) AS leases_left FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid();

-- ===================================================================
-- a run's row in durable_ledger.runs is gone (deleted, or not restored)
-- while its effects remain: its next lease continues after the highest
-- epoch the audit log names (an epoch number is never used twice), and the
-- calls recorded in epoch 1 get decisions (replay, pause), never a unique
-- violation
-- ===================================================================
SELECT decision FROM durable_ledger.begin_effect('dec-norun', 'pay', '{"invoice": 61}');
SELECT status FROM durable_ledger.complete_effect(
    durable_ledger.effect_key('dec-norun', 'pay', '{"invoice": 61}', 1), '{"payment": "p61"}');
SELECT decision FROM durable_ledger.begin_effect('dec-norun', 'pay', '{"invoice": 62}');
SELECT durable_ledger.release_run('dec-norun');
DELETE FROM durable_ledger.runs WHERE run = 'dec-norun';
SELECT decision, status, occurrence, result FROM durable_ledger.begin_effect('dec-norun', 'pay', '{"invoice": 61}');
SELECT decision, status, occurrence FROM durable_ledger.begin_effect('dec-norun', 'pay', '{"invoice": 62}');
SELECT epochs FROM durable_ledger.runs WHERE run = 'dec-norun';
SELECT durable_ledger.release_run('dec-norun');

-- the same for a run whose lease epochs were token leases: after three
-- epochs and its row deleted, the next take_lease starts epoch 4 (the
-- highest the log names, not its first or its count of rows)
SELECT durable_ledger.release_lease((durable_ledger.take_lease('dec-norun-tok')).token) AS released
  FROM generate_series(1, 3);
SELECT count(*) AS lease_rows, max(lease_epoch) AS highest
  FROM durable_ledger.audit_log WHERE run = 'dec-norun-tok';
DELETE FROM durable_ledger.runs WHERE run = 'dec-norun-tok';
SELECT epoch, durable_ledger.release_lease(token) AS released
  FROM durable_ledger.take_lease('dec-norun-tok');
SELECT epochs, lease_kind, released_at IS NOT NULL AS released
  FROM durable_ledger.runs WHERE run = 'dec-norun-tok';

-- without an index beginning with the audit log's run (dropped, or being
-- rebuilt), a new run is still started, its epoch found by a query
BEGIN;
DROP INDEX durable_ledger.audit_log_run_idx;
SELECT (durable_ledger.take_lease('dec-noidx-1')).epoch AS token_epoch;
SELECT durable_ledger.acquire_run('dec-noidx-2') AS acquired;
SELECT decision FROM durable_ledger.begin_effect('dec-noidx-3', 'pay', '{}');
-- and a run whose row is gone still continues after its highest logged epoch
DELETE FROM durable_ledger.runs WHERE run = 'dec-norun-tok';
SELECT epoch, durable_ledger.release_lease(token) AS released
  FROM durable_ledger.take_lease('dec-norun-tok');
SELECT durable_ledger.release_run('dec-noidx-2') AS r2, durable_ledger.release_run('dec-noidx-3') AS r3;
ROLLBACK;

-- an index beginning with the log's run that compares runs otherwise than
-- the column does (an administrator's, case-insensitive) is not used: a new
-- run 'dec-ci' starts at epoch 1, not after the epochs of 'DEC-CI'
BEGIN;
CREATE COLLATION regress_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
CREATE INDEX regress_audit_run_ci ON durable_ledger.audit_log (run COLLATE regress_ci, lease_epoch);
DROP INDEX durable_ledger.audit_log_run_idx;
SELECT durable_ledger.release_lease((durable_ledger.take_lease('DEC-CI')).token) AS released
  FROM generate_series(1, 2);
SELECT epoch, durable_ledger.release_lease(token) AS released
  FROM durable_ledger.take_lease('dec-ci');
-- with the extension's index there too (made again, so with the higher OID)
CREATE INDEX audit_log_run_idx ON durable_ledger.audit_log (run);
SELECT epoch, durable_ledger.release_lease(token) AS released
  FROM durable_ledger.take_lease('Dec-Ci');
ROLLBACK;
