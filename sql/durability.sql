-- durability: a transaction that wrote the ledger commits with synchronous_commit at
-- least "on" (the extension raises it at pre-commit, for that commit only, announced by
-- a DEBUG1 message), whatever the session or the transaction asked for, also when it was
-- lowered after the call; "on" and stronger settings (remote_apply) are left alone, a
-- transaction that wrote nothing to the ledger is left alone, and the session's own
-- setting is unchanged afterwards. PREPARE TRANSACTION of a ledger write is refused (0A000).
-- (terse: the DEBUG1 message text is what is asserted; it is the only DEBUG1 output here)
\set VERBOSITY terse

-- ==== synchronous_commit = off for the transaction: raised at COMMIT ====
BEGIN;
SET LOCAL synchronous_commit = off;
SELECT decision FROM durable_ledger.begin_effect('dur-1', 'pay', '{"n": 1}');
SET LOCAL client_min_messages = debug1;
COMMIT;
SHOW synchronous_commit;

-- ==== off for the whole session: raised for each ledger commit, the session keeps off ====
SET synchronous_commit = off;
SET client_min_messages = debug1;
-- autocommit
SELECT decision FROM durable_ledger.begin_effect('dur-1', 'pay', '{"n": 2}');
SHOW synchronous_commit;
-- explicit transaction
BEGIN;
SELECT decision FROM durable_ledger.begin_effect('dur-1', 'pay', '{"n": 3}');
SHOW synchronous_commit;
COMMIT;
SHOW synchronous_commit;
-- completion, failure and resolution are ledger writes too
SELECT key AS k_pay2 FROM durable_ledger.effect_status(durable_ledger.effect_key('dur-1', 'pay', '{"n": 2}', 1)) \gset
SELECT status FROM durable_ledger.complete_effect(:'k_pay2', '{"ok": true}');
SELECT key AS k_pay3 FROM durable_ledger.effect_status(durable_ledger.effect_key('dur-1', 'pay', '{"n": 3}', 1)) \gset
SELECT status FROM durable_ledger.fail_effect(:'k_pay3', '{"code": 402}');
-- a contradicting report is kept as a conflict: a ledger write
SELECT status, conflict FROM durable_ledger.complete_effect(:'k_pay3', '{"ok": true}');
SELECT status, conflict FROM durable_ledger.resolve_effect(:'k_pay3', 'failed', '{"code": 402}', 'regress-reviewer');
SHOW synchronous_commit;

-- ==== lowered again after the call, inside the transaction: still raised at COMMIT ====
SET synchronous_commit = on;
BEGIN;
SELECT decision FROM durable_ledger.begin_effect('dur-1', 'pay', '{"n": 4}');
SET LOCAL synchronous_commit = off;
COMMIT;
SHOW synchronous_commit;

-- ==== the weaker levels local and remote_write are raised as well ====
BEGIN;
SET LOCAL synchronous_commit = local;
SELECT decision FROM durable_ledger.begin_effect('dur-1', 'pay', '{"n": 5}');
COMMIT;
BEGIN;
SET LOCAL synchronous_commit = remote_write;
SELECT decision FROM durable_ledger.begin_effect('dur-1', 'pay', '{"n": 6}');
COMMIT;

-- ==== already on, or stronger: left alone (no message) ====
BEGIN;
SET LOCAL synchronous_commit = on;
SELECT decision FROM durable_ledger.begin_effect('dur-1', 'pay', '{"n": 7}');
COMMIT;
SET synchronous_commit = remote_apply;
SELECT decision FROM durable_ledger.begin_effect('dur-1', 'pay', '{"n": 8}');
BEGIN;
SELECT decision FROM durable_ledger.begin_effect('dur-1', 'pay', '{"n": 9}');
COMMIT;
SHOW synchronous_commit;
BEGIN;
SET LOCAL synchronous_commit = on;
SELECT decision FROM durable_ledger.begin_effect('dur-1', 'pay', '{"n": 10}');
SET LOCAL synchronous_commit = remote_apply;
COMMIT;

-- ==== transactions that wrote nothing to the ledger: left alone ====
SET synchronous_commit = off;
CREATE TEMP TABLE dur_other (x int);
BEGIN;
INSERT INTO dur_other VALUES (1);
SELECT count(*) AS effects FROM durable_ledger.effects WHERE run = 'dur-1';
SELECT durable_ledger.canonical_args('{"a": 1.0}'), durable_ledger.effect_key('dur-1', 'pay', '{}', 1) IS NOT NULL AS has_key;
SELECT status FROM durable_ledger.effect_status(:'k_pay2');
COMMIT;
SELECT count(*) AS rows FROM durable_ledger.effect_status('dur-no-such-key');
-- a ledger write that was rolled back does not leak into the next transaction
BEGIN;
SELECT decision FROM durable_ledger.begin_effect('dur-1', 'pay', '{"n": 11}');
ROLLBACK;
BEGIN;
INSERT INTO dur_other VALUES (2);
COMMIT;
BEGIN;
SELECT decision FROM durable_ledger.begin_effect('dur-1', 'pay', '{"n": 12}');
SELECT 1 / 0;
ROLLBACK;
INSERT INTO dur_other VALUES (3);
SHOW synchronous_commit;
RESET client_min_messages;
RESET synchronous_commit;
SHOW synchronous_commit;

-- everything that reported execute above is there
SELECT args->'n' AS n, status FROM durable_ledger.effects WHERE run = 'dur-1' ORDER BY (args->>'n')::int;

-- ==== PREPARE TRANSACTION of a ledger write is refused ====
\set VERBOSITY default
SELECT current_setting('max_prepared_transactions')::int > 0 AS prepared_transactions_enabled;
BEGIN;
SELECT decision, occurrence FROM durable_ledger.begin_effect('dur-2', 'pay', '{}');
PREPARE TRANSACTION 'regress_dur_prepare';
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'regress_dur_prepare';
-- the transaction was rolled back: no effect, and the occurrence counter is where it was
SELECT count(*) AS effects FROM durable_ledger.effects WHERE run = 'dur-2';
SELECT decision, occurrence FROM durable_ledger.begin_effect('dur-2', 'pay', '{}');
-- a complete_effect cannot be prepared either
SELECT key AS k_dur2 FROM durable_ledger.effect_status(durable_ledger.effect_key('dur-2', 'pay', '{}', 1)) \gset
BEGIN;
SELECT status FROM durable_ledger.complete_effect(:'k_dur2', '{"ok": 1}');
PREPARE TRANSACTION 'regress_dur_prepare';
SELECT status FROM durable_ledger.effect_status(:'k_dur2');
\set VERBOSITY default
BEGIN;
SELECT decision FROM durable_ledger.begin_effect('dur-2', 'mail', '{}');
PREPARE TRANSACTION 'regress_dur_prepare';
-- nor a transaction that only replayed: its occurrence count must roll back with
-- it, which a prepared transaction's outcome cannot tell us (ROLLBACK PREPARED
-- would otherwise leave the count advanced, and the same call would execute anew)
SELECT status FROM durable_ledger.complete_effect(:'k_dur2', '{"ok": 1}');
SELECT durable_ledger.release_run('dur-2');
BEGIN;
SELECT decision, occurrence FROM durable_ledger.begin_effect('dur-2', 'pay', '{}');
PREPARE TRANSACTION 'regress_dur_prepare';
SELECT decision, occurrence FROM durable_ledger.begin_effect('dur-2', 'pay', '{}');
-- nor an acquire_run alone
BEGIN;
SELECT durable_ledger.acquire_run('dur-2');
PREPARE TRANSACTION 'regress_dur_prepare';
\set VERBOSITY default
-- a transaction that did not write the ledger can be prepared (also by a session holding a lease)
BEGIN;
SELECT count(*) AS effects FROM durable_ledger.effects WHERE run = 'dur-2';
PREPARE TRANSACTION 'regress_dur_prepare_ok';
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid = 'regress_dur_prepare_ok';
ROLLBACK PREPARED 'regress_dur_prepare_ok';
SELECT count(*) AS prepared FROM pg_prepared_xacts WHERE gid LIKE 'regress_dur%';

SELECT durable_ledger.release_run('dur-1') AS released, durable_ledger.release_run('dur-2') AS released;
DROP TABLE dur_other;
