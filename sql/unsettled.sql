-- unsettled: durable_ledger.unsettled holds exactly the keys of the effects
-- that are started (but recorded calls, which begin_recorded executes again),
-- unknown or flagged, through every write the ledger makes
-- (intent, completion, failure, unknown, conflict, resolution, a business
-- key's next attempt, a fork); the unresolved view reads it instead of every
-- effect (what that saves is measured by make bench, which prints the plan:
-- plans of tables this small are not the plans of a large ledger).  Runs
-- after the other files: the first check covers every effect they left
-- behind.
\set VERBOSITY terse

-- the keys unsettled should hold, against the keys it holds: no difference
CREATE VIEW regress_unsettled_drift AS
SELECT 'missing' AS drift, e.key FROM durable_ledger.effects e
 WHERE (e.status = 'unknown' OR e.conflict OR (e.status = 'started' AND NOT e.safe_to_redo))
   AND NOT EXISTS (SELECT FROM durable_ledger.unsettled u
                    WHERE u.key = e.key AND u.created_at = e.created_at)
UNION ALL
SELECT 'stale', u.key FROM durable_ledger.unsettled u
 WHERE NOT EXISTS (SELECT FROM durable_ledger.effects e
                    WHERE e.key = u.key AND e.created_at = u.created_at
                      AND (e.status = 'unknown' OR e.conflict OR (e.status = 'started' AND NOT e.safe_to_redo)));

-- what the earlier files left: many effects, some unsettled, no drift
SELECT count(*) > 100 AS many_effects,
       (SELECT count(*) FROM durable_ledger.unsettled) > 5 AS some_unsettled
  FROM durable_ledger.effects;
SELECT * FROM regress_unsettled_drift;

-- ===================================================================
-- each transition, one key at a time
-- ===================================================================
CREATE FUNCTION regress_is_unsettled(k text) RETURNS boolean LANGUAGE sql
AS $$ SELECT EXISTS (SELECT FROM durable_ledger.unsettled u JOIN durable_ledger.effects e
                       ON e.key = u.key AND e.created_at = u.created_at WHERE u.key = k) $$;

-- intent: in; completion: out
SELECT key AS u1 FROM durable_ledger.begin_effect('uns-1', 'pay', '{"n": 1}') \gset
SELECT regress_is_unsettled(:'u1') AS after_intent;
SELECT status, regress_is_unsettled(:'u1') AS after_completion
  FROM durable_ledger.complete_effect(:'u1', '{"ok": true}');

-- a contradicting report: flagged, in again; the resolution takes it out
SELECT regress_try(format($$SELECT durable_ledger.fail_effect(%L, '{"code": "late"}')$$, :'u1')) AS contradicting_report;
SELECT conflict, regress_is_unsettled(:'u1') AS after_conflict
  FROM durable_ledger.effects WHERE key = :'u1';
SELECT conflict, regress_is_unsettled(:'u1') AS after_resolution
  FROM durable_ledger.resolve_effect(:'u1', 'completed', '{"ok": true}', 'alice', 'the bank paid');

-- failure: out
SELECT key AS u2 FROM durable_ledger.begin_effect('uns-1', 'pay', '{"n": 2}') \gset
SELECT status, regress_is_unsettled(:'u2') AS after_failure
  FROM durable_ledger.fail_effect(:'u2', '{"code": "declined"}');

-- a lease that ended: started, then unknown when the next attempt looks; in
-- until a person resolves it
SELECT key AS u3 FROM durable_ledger.begin_effect('uns-1', 'pay', '{"n": 3}') \gset
SELECT durable_ledger.release_run('uns-1');
SELECT regress_is_unsettled(:'u3') AS lease_ended;
SELECT decision, status, regress_is_unsettled(:'u3') AS unknown_in
  FROM durable_ledger.begin_effect('uns-1', 'pay', '{"n": 3}');
SELECT count(*) AS listed FROM durable_ledger.unresolved WHERE key = :'u3';
SELECT durable_ledger.release_run('uns-1');
SELECT status, regress_is_unsettled(:'u3') AS after_resolution
  FROM durable_ledger.resolve_effect(:'u3', 'failed', '{"code": "never sent"}', 'alice', NULL);

-- a business key: its failure out, its next attempt in, its completion out
SELECT durable_ledger.acquire_run('uns-2');
SELECT decision, attempt, regress_is_unsettled('UNS-INV-1') AS first_attempt
  FROM durable_ledger.begin_effect('uns-2', 'pay', '{"invoice": 1}', 'UNS-INV-1');
SELECT status, regress_is_unsettled('UNS-INV-1') AS failed
  FROM durable_ledger.fail_effect('UNS-INV-1', '{"code": "declined"}', 1);
SELECT decision, attempt, regress_is_unsettled('UNS-INV-1') AS next_attempt
  FROM durable_ledger.begin_effect('uns-2', 'pay', '{"invoice": 1}', 'UNS-INV-1');
SELECT status, regress_is_unsettled('UNS-INV-1') AS completed
  FROM durable_ledger.complete_effect('UNS-INV-1', '{"ok": true}', 2);
SELECT durable_ledger.release_run('uns-2');

-- a rolled-back intent leaves nothing behind
BEGIN;
SELECT key AS u4 FROM durable_ledger.begin_effect('uns-3', 'pay', '{"n": 4}') \gset
SELECT regress_is_unsettled(:'u4') AS in_the_transaction;
ROLLBACK;
SELECT regress_is_unsettled(:'u4') AS after_rollback;

-- a fork carries settled effects only: nothing unsettled for them
SELECT durable_ledger.fork_run('uns-1', 'uns-1-fork', :'u2', 'alice', 'again from u2');
SELECT count(*) AS carried, count(*) FILTER (WHERE regress_is_unsettled(key)) AS carried_unsettled
  FROM durable_ledger.effects WHERE run = 'uns-1-fork';

-- an administrator's BEFORE ROW trigger that changes created_at: unsettled
-- has the value stored
CREATE FUNCTION regress_round_created_at() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.created_at := date_trunc('second', NEW.created_at) - interval '1 hour'; RETURN NEW; END $$;
CREATE TRIGGER regress_round_created_at BEFORE INSERT ON durable_ledger.effects
    FOR EACH ROW EXECUTE FUNCTION regress_round_created_at();
SELECT key AS u5 FROM durable_ledger.begin_effect('uns-4', 'pay', '{"n": 5}') \gset
SELECT regress_is_unsettled(:'u5') AS trigger_changed_created_at;
SELECT durable_ledger.release_run('uns-4');
SELECT count(*) AS listed_after_lease_ended FROM durable_ledger.unresolved WHERE key = :'u5';
DROP TRIGGER regress_round_created_at ON durable_ledger.effects;
DROP FUNCTION regress_round_created_at();

-- a row left behind by a writer that did not keep unsettled (a backend still
-- running an older library while the extension was updated): a later
-- contradicting report is flagged and kept, not lost to a duplicate key
SELECT key AS u6 FROM durable_ledger.begin_effect('uns-5', 'pay', '{"n": 6}') \gset
SELECT status FROM durable_ledger.complete_effect(:'u6', '{"ok": true}');
INSERT INTO durable_ledger.unsettled SELECT created_at, key FROM durable_ledger.effects WHERE key = :'u6';
SELECT regress_try(format($$SELECT durable_ledger.fail_effect(%L, '{"code": "late"}')$$, :'u6')) AS report_on_a_left_row;
SELECT conflict, regress_is_unsettled(:'u6') AS listed,
       (SELECT count(*) FROM durable_ledger.audit_log WHERE key = :'u6' AND event = 'conflict') AS conflicts_logged
  FROM durable_ledger.effects WHERE key = :'u6';
SELECT status FROM durable_ledger.resolve_effect(:'u6', 'completed', '{"ok": true}', 'alice', NULL);

-- a BEFORE ROW trigger that skips the removal: the report fails and writes nothing
SELECT key AS u7 FROM durable_ledger.begin_effect('uns-5', 'pay', '{"n": 7}') \gset
CREATE FUNCTION regress_skip() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;
CREATE TRIGGER regress_skip BEFORE DELETE ON durable_ledger.unsettled
    FOR EACH ROW EXECUTE FUNCTION regress_skip();
SELECT regress_try(format($$SELECT durable_ledger.complete_effect(%L, '{"ok": true}')$$, :'u7')) AS skipped_removal;
SELECT status, regress_is_unsettled(:'u7') AS still_listed FROM durable_ledger.effects WHERE key = :'u7';
DROP TRIGGER regress_skip ON durable_ledger.unsettled;
DROP FUNCTION regress_skip();
SELECT status, regress_is_unsettled(:'u7') AS listed FROM durable_ledger.complete_effect(:'u7', '{"ok": true}');

-- a BEFORE ROW trigger that changes the row unsettled is given: the effect
-- would be hidden from unresolved, so the call fails and writes nothing
CREATE FUNCTION regress_shift() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.created_at := date_trunc('second', NEW.created_at) - interval '1 hour'; RETURN NEW; END $$;
CREATE TRIGGER regress_shift BEFORE INSERT ON durable_ledger.unsettled
    FOR EACH ROW EXECUTE FUNCTION regress_shift();
SELECT regress_try($$SELECT durable_ledger.begin_effect('uns-5', 'pay', '{"n": 8}')$$) AS shifted_row;
SELECT count(*) AS recorded FROM durable_ledger.effects WHERE run = 'uns-5' AND args = '{"n": 8}';
DROP TRIGGER regress_shift ON durable_ledger.unsettled;
DROP FUNCTION regress_shift();

-- ... and one on effects that changes the key a call derived (or its business
-- key): the effect would be found by no call (executed again) and listed
-- nowhere, so the call fails and writes nothing
CREATE FUNCTION regress_rekey() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN NEW.key := NEW.key || '-x'; RETURN NEW; END $$;
CREATE TRIGGER regress_rekey BEFORE INSERT ON durable_ledger.effects
    FOR EACH ROW EXECUTE FUNCTION regress_rekey();
SELECT regress_try($$SELECT durable_ledger.begin_effect('uns-5', 'pay', '{"n": 9}')$$) AS rekeyed;
SELECT regress_try($$SELECT durable_ledger.begin_effect('uns-5', 'pay', '{"n": 9}', business_key => 'BK-REKEY')$$) AS rekeyed_business_key;
SELECT count(*) AS recorded FROM durable_ledger.effects WHERE run = 'uns-5' AND args = '{"n": 9}';
-- ... also when a fork carries an effect into a new run
SELECT regress_try(format($$SELECT durable_ledger.fork_run('uns-1', 'uns-1-rekeyed', %L, 'alice', NULL)$$, :'u2')) AS rekeyed_fork;
SELECT count(*) AS forked FROM durable_ledger.effects WHERE run = 'uns-1-rekeyed';
DROP TRIGGER regress_rekey ON durable_ledger.effects;
-- ... and on an update (a report, a resolution, a next attempt)
SELECT key AS u10 FROM durable_ledger.begin_effect('uns-5', 'pay', '{"n": 10}') \gset
CREATE TRIGGER regress_rekey BEFORE UPDATE ON durable_ledger.effects
    FOR EACH ROW EXECUTE FUNCTION regress_rekey();
SELECT regress_try(format($$SELECT durable_ledger.complete_effect(%L, '{"ok": true}')$$, :'u10')) AS rekeyed_report;
SELECT status FROM durable_ledger.effects WHERE key = :'u10';
DROP TRIGGER regress_rekey ON durable_ledger.effects;
SELECT status FROM durable_ledger.complete_effect(:'u10', '{"ok": true}');
DROP FUNCTION regress_rekey();
SELECT durable_ledger.release_run('uns-5');

SELECT * FROM regress_unsettled_drift;

DROP VIEW regress_unsettled_drift;
DROP FUNCTION regress_is_unsettled(text);
