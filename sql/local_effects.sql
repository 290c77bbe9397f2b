-- local_effects: an effect that is a write in the ledger's own database,
-- made in the same transaction as its intent and its outcome
-- (begin_local(run, tool, args, business_key, meta, lease), the same
-- decisions as begin_effect).  The transaction commits only once the effect
-- is completed or failed: its intent, the tool's writes and its outcome
-- commit together or not at all, so a local effect is never unknown.  An
-- error, a ROLLBACK or a COMMIT without the outcome leave nothing; a later
-- attempt replays what committed.
\set VERBOSITY terse

CREATE TABLE shop_orders (id serial PRIMARY KEY, run text, item text CHECK (item <> 'bad'));
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset

-- ===================================================================
-- intent, write and completion in one transaction
-- ===================================================================
BEGIN;
SELECT key AS k1, decision, status, occurrence, attempt
  FROM durable_ledger.begin_local('lo-1', 'shop.order', '{"item": "tea"}') \gset
\echo :decision :status :occurrence :attempt
-- inside the transaction the intent is there, started, and local
SELECT status, local FROM durable_ledger.effects WHERE key = :'k1';
INSERT INTO shop_orders (run, item) VALUES ('lo-1', 'tea');
SELECT status, result FROM durable_ledger.complete_effect(:'k1', '{"order": "tea"}', 1);
COMMIT;
SELECT status, result, local, safe_to_redo FROM durable_ledger.effects WHERE key = :'k1';
SELECT run, item FROM shop_orders ORDER BY id;
-- the audit log has its intent and its completion, in that order
SELECT event FROM durable_ledger.audit_log WHERE key = :'k1' ORDER BY id;
-- never unsettled, never listed for a person
SELECT count(*) FROM durable_ledger.unsettled WHERE key = :'k1';
SELECT count(*) FROM durable_ledger.unresolved WHERE key = :'k1';

-- the run's next attempt replays it: the tool is not called again
SELECT durable_ledger.release_run('lo-1');
BEGIN;
SELECT decision, status, result FROM durable_ledger.begin_local('lo-1', 'shop.order', '{"item": "tea"}');
COMMIT;
-- and so does begin_effect of the same call: the key is the call's, however begun
SELECT durable_ledger.release_run('lo-1');
SELECT decision, result FROM durable_ledger.begin_effect('lo-1', 'shop.order', '{"item": "tea"}');
SELECT durable_ledger.release_run('lo-1');

-- ===================================================================
-- a COMMIT without the outcome fails, and rolls everything back
-- ===================================================================
BEGIN;
SELECT key AS k2, decision FROM durable_ledger.begin_local('lo-2', 'shop.order', '{"item": "jam"}') \gset
\echo :decision
INSERT INTO shop_orders (run, item) VALUES ('lo-2', 'jam');
COMMIT;
SELECT count(*) AS effects, (SELECT count(*) FROM shop_orders WHERE run = 'lo-2') AS orders
  FROM durable_ledger.effects WHERE key = :'k2';
-- outside a transaction block the begin commits alone: refused the same way
SELECT decision FROM durable_ledger.begin_local('lo-2', 'shop.order', '{"item": "jam"}');
SELECT count(*) FROM durable_ledger.effects WHERE run = 'lo-2';
-- nothing was recorded, so the call executes, as occurrence 1 and attempt 1
BEGIN;
SELECT key = :'k2' AS same_key, decision, occurrence, attempt
  FROM durable_ledger.begin_local('lo-2', 'shop.order', '{"item": "jam"}');
INSERT INTO shop_orders (run, item) VALUES ('lo-2', 'jam');
SELECT status FROM durable_ledger.complete_effect(:'k2', '{"order": "jam"}', 1);
COMMIT;
SELECT count(*) FROM shop_orders WHERE run = 'lo-2';
SELECT durable_ledger.release_run('lo-2');

-- ===================================================================
-- an error in the tool's writes, or a ROLLBACK: nothing is recorded
-- ===================================================================
BEGIN;
SELECT key AS k3, decision FROM durable_ledger.begin_local('lo-3', 'shop.order', '{"item": "bad"}') \gset
INSERT INTO shop_orders (run, item) VALUES ('lo-3', 'bad');
COMMIT;
SELECT count(*) FROM durable_ledger.effects WHERE run = 'lo-3';
BEGIN;
SELECT decision FROM durable_ledger.begin_local('lo-3', 'shop.order', '{"item": "bad"}');
ROLLBACK;
SELECT count(*) FROM durable_ledger.effects WHERE run = 'lo-3';
SELECT durable_ledger.release_run('lo-3');

-- ===================================================================
-- a recorded failure commits with the transaction, and is replayed
-- ===================================================================
BEGIN;
SELECT key AS k4 FROM durable_ledger.begin_local('lo-4', 'shop.order', '{"item": "gone"}') \gset
SELECT status, error FROM durable_ledger.fail_effect(:'k4', '{"out_of_stock": true}', 1);
COMMIT;
SELECT durable_ledger.release_run('lo-4');
BEGIN;
SELECT decision, status, error FROM durable_ledger.begin_local('lo-4', 'shop.order', '{"item": "gone"}');
COMMIT;
SELECT durable_ledger.release_run('lo-4');

-- ===================================================================
-- savepoints: what the row says at COMMIT counts
-- ===================================================================
-- a begin rolled back to a savepoint left nothing to report
BEGIN;
SAVEPOINT s;
SELECT decision FROM durable_ledger.begin_local('lo-5', 'shop.order', '{"item": "pen"}');
ROLLBACK TO s;
COMMIT;
SELECT count(*) FROM durable_ledger.effects WHERE run = 'lo-5';
-- a completion rolled back to a savepoint leaves the effect without an outcome
BEGIN;
SELECT key AS k5 FROM durable_ledger.begin_local('lo-5', 'shop.order', '{"item": "pen"}') \gset
SAVEPOINT s;
SELECT status FROM durable_ledger.complete_effect(:'k5', '{"order": "pen"}', 1);
ROLLBACK TO s;
COMMIT;
SELECT count(*) FROM durable_ledger.effects WHERE run = 'lo-5';
-- begun and completed in a released savepoint: committed
BEGIN;
SAVEPOINT s;
SELECT decision FROM durable_ledger.begin_local('lo-5', 'shop.order', '{"item": "pen"}');
SELECT status FROM durable_ledger.complete_effect(:'k5', '{"order": "pen"}', 1);
RELEASE s;
COMMIT;
SELECT status FROM durable_ledger.effects WHERE key = :'k5';
SELECT durable_ledger.release_run('lo-5');

-- ===================================================================
-- the lease ended in the transaction: unknown is no outcome either
-- ===================================================================
BEGIN;
SELECT key AS k6 FROM durable_ledger.begin_local('lo-6', 'shop.order', '{"item": "ink"}') \gset
SELECT durable_ledger.release_run('lo-6');
SELECT decision FROM durable_ledger.begin_effect('lo-6', 'shop.other', '{}');
SELECT status FROM durable_ledger.effects WHERE key = :'k6';
COMMIT;
SELECT count(*) FROM durable_ledger.effects WHERE run = 'lo-6';

-- ===================================================================
-- two local effects in one transaction: each needs its outcome
-- ===================================================================
BEGIN;
SELECT key AS k7a FROM durable_ledger.begin_local('lo-7', 'shop.order', '{"item": "a"}') \gset
SELECT key AS k7b FROM durable_ledger.begin_local('lo-7', 'shop.order', '{"item": "b"}') \gset
SELECT status FROM durable_ledger.complete_effect(:'k7a', '{"order": "a"}', 1);
COMMIT;
SELECT count(*) FROM durable_ledger.effects WHERE run = 'lo-7';
BEGIN;
SELECT decision FROM durable_ledger.begin_local('lo-7', 'shop.order', '{"item": "a"}');
SELECT decision FROM durable_ledger.begin_local('lo-7', 'shop.order', '{"item": "b"}');
SELECT status FROM durable_ledger.complete_effect(:'k7a', '{"order": "a"}', 1);
SELECT status FROM durable_ledger.complete_effect(:'k7b', '{"order": "b"}', 1);
COMMIT;
SELECT count(*) FROM durable_ledger.effects WHERE run = 'lo-7' AND status = 'completed';
SELECT durable_ledger.release_run('lo-7');

-- ===================================================================
-- a business key, and a token lease
-- ===================================================================
BEGIN;
SELECT key, decision, attempt FROM durable_ledger.begin_local('lo-8', 'shop.refund', '{"order": 7}', 'REFUND-7');
SELECT status FROM durable_ledger.complete_effect('REFUND-7', '{"refunded": 7}', 1);
COMMIT;
-- another run with the same business key replays it
BEGIN;
SELECT decision, result FROM durable_ledger.begin_local('lo-9', 'shop.refund', '{"order": 7}', 'REFUND-7');
COMMIT;
SELECT durable_ledger.release_run('lo-8');
SELECT durable_ledger.release_run('lo-9');
SELECT token AS tok FROM durable_ledger.take_lease('lo-10', '1 minute', 'regress') \gset
BEGIN;
SELECT key AS k10, decision FROM durable_ledger.begin_local('lo-10', 'shop.order', '{"item": "cup"}', lease => :'tok') \gset
\echo :decision
SELECT status FROM durable_ledger.complete_effect(:'k10', '{"order": "cup"}', 1);
COMMIT;
SELECT status, local FROM durable_ledger.effects WHERE key = :'k10';
-- a token lease's occurrence counter rolls back with a refused commit
BEGIN;
SELECT occurrence FROM durable_ledger.begin_local('lo-10', 'shop.order', '{"item": "cup"}', lease => :'tok');
COMMIT;
BEGIN;
SELECT occurrence, decision FROM durable_ledger.begin_local('lo-10', 'shop.order', '{"item": "cup"}', lease => :'tok');
ROLLBACK;
SELECT durable_ledger.release_lease(:'tok');

-- ===================================================================
-- reports of this transaction that contradict each other are no outcome
-- ===================================================================
BEGIN;
SELECT key AS k12 FROM durable_ledger.begin_local('lo-12', 'shop.order', '{"item": "mug"}') \gset
SELECT status, conflict FROM durable_ledger.complete_effect(:'k12', '{"order": "mug"}', 1);
SELECT status, conflict FROM durable_ledger.fail_effect(:'k12', '{"out_of_stock": true}', 1);
COMMIT;
-- nothing was recorded, nothing waits for a person
SELECT count(*) AS effects, (SELECT count(*) FROM durable_ledger.unsettled WHERE key = :'k12') AS unsettled
  FROM durable_ledger.effects WHERE key = :'k12';
SELECT durable_ledger.release_run('lo-12');

-- ===================================================================
-- that an attempt was local stays in the audit log after the next one
-- ===================================================================
BEGIN;
SELECT decision, attempt FROM durable_ledger.begin_local('lo-13', 'shop.refund', '{"order": 13}', 'REFUND-13');
SELECT status FROM durable_ledger.fail_effect('REFUND-13', '{"declined": true}', 1);
COMMIT;
SELECT decision, attempt FROM durable_ledger.begin_effect('lo-14', 'shop.refund', '{"order": 13}', 'REFUND-13');
SELECT attempt, local FROM durable_ledger.effects WHERE key = 'REFUND-13';
SELECT event, attempt, detail FROM durable_ledger.audit_log
 WHERE key = 'REFUND-13' AND event = 'intent' ORDER BY id;
SELECT status FROM durable_ledger.complete_effect('REFUND-13', '{"refunded": 13}', 2);
SELECT durable_ledger.release_run('lo-13');
SELECT durable_ledger.release_run('lo-14');

-- ===================================================================
-- bad input writes nothing, as begin_effect's
-- ===================================================================
SELECT count(*) AS before FROM durable_ledger.effects \gset
SELECT regress_sqlstate($$SELECT durable_ledger.begin_local(NULL, 'shop.order', '{}')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.begin_local('lo-11', '', '{}')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.begin_local('lo-11', 'shop.order', NULL)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.begin_local('lo-11', 'shop.order', '{}', lease => 'no-such-token')$$);
SELECT count(*) - :before AS written FROM durable_ledger.effects;
-- privileges: a worker's function, no one else's
SELECT has_function_privilege('durable_ledger_worker',
       'durable_ledger.begin_local(text, text, jsonb, text, jsonb, text)', 'EXECUTE') AS worker,
       has_function_privilege('public',
       'durable_ledger.begin_local(text, text, jsonb, text, jsonb, text)', 'EXECUTE') AS public;

DROP TABLE shop_orders;
