-- business_keys: a business key is the effect's key itself (no occurrence,
-- attempt 1), shared across runs: a second run gets replay after completion,
-- pause when the first lease ended without one, in_progress while the first
-- lease is live (held by a second session through dblink), never a second
-- execute; another tool or other canonical args under the same key is an error
-- that writes nothing; a failed business key is executed again with attempt
-- n+1; the key is 1 to 255 characters and not 64 lowercase hex digits.
\set VERBOSITY terse


-- ===================================================================
-- the key is the business key; occurrence NULL, attempt 1
-- ===================================================================
SELECT key, decision, status, occurrence, attempt, result, error, reason
  FROM durable_ledger.begin_effect('bk-1', 'pay_invoice', '{"invoice": "INV-1001", "amount": 120}',
                                   'INV-1001');
SELECT key, run, tool, args, business_key, occurrence, attempt, status, lease_epoch
  FROM durable_ledger.effects WHERE key = 'INV-1001';
SELECT status, result FROM durable_ledger.complete_effect('INV-1001', '{"payment": "p-1"}');

-- ===================================================================
-- replay: another run beginning a completed business key gets its result
-- (also with the same args in another key order and number spelling)
-- ===================================================================
SELECT key, decision, status, occurrence, attempt, result, error, reason
  FROM durable_ledger.begin_effect('bk-2', 'pay_invoice', '{"invoice": "INV-1001", "amount": 120}',
                                   'INV-1001');
SELECT key, decision, status, occurrence, attempt, result
  FROM durable_ledger.begin_effect('bk-2', 'pay_invoice', '{"amount": 1.2e2, "invoice": "INV-1001"}',
                                   'INV-1001');
SELECT key, decision, status, occurrence, attempt, result
  FROM durable_ledger.begin_effect('bk-2', 'pay_invoice', '{ "amount" : 120.00 , "invoice" : "INV-1001" }',
                                   'INV-1001');
-- still one effect, performed once, by the first run
SELECT key, run, status, attempt, result FROM durable_ledger.effects WHERE key = 'INV-1001';
SELECT event, run, detail FROM durable_ledger.audit_log WHERE key = 'INV-1001' ORDER BY id;

-- ===================================================================
-- another tool, or other canonical args, under the same business key is an
-- error naming the key; nothing is written
-- ===================================================================
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_try($$SELECT durable_ledger.begin_effect('bk-2', 'refund_invoice',
       '{"invoice": "INV-1001", "amount": 120}', 'INV-1001')$$) AS other_tool;
SELECT regress_try($$SELECT durable_ledger.begin_effect('bk-2', 'pay_invoice',
       '{"invoice": "INV-1001", "amount": 121}', 'INV-1001')$$) AS other_args;
SELECT regress_try($$SELECT durable_ledger.begin_effect('bk-2', 'pay_invoice',
       '{"invoice": "INV-1001", "amount": "120"}', 'INV-1001')$$) AS number_as_string;
SELECT regress_try($$SELECT durable_ledger.begin_effect('bk-2', 'pay_invoice',
       '{"invoice": "INV-1001", "amount": 120, "memo": null}', 'INV-1001')$$) AS extra_member;
SELECT count(*) = :audit_rows AS nothing_written FROM durable_ledger.audit_log;
SELECT key, run, tool, args, status, attempt, result FROM durable_ledger.effects WHERE key = 'INV-1001';
-- the SQLSTATE, shown by psql itself
\set VERBOSITY default
SELECT durable_ledger.begin_effect('bk-2', 'refund_invoice', '{"invoice": "INV-1001", "amount": 120}', 'INV-1001');
\set VERBOSITY terse

-- ===================================================================
-- pause: the first run's lease ended without a completion
-- ===================================================================
SELECT key, decision, status FROM durable_ledger.begin_effect('bk-1', 'ship_order', '{"order": 2}', 'ORDER-2');
SELECT durable_ledger.release_run('bk-1');
SELECT key, status FROM durable_ledger.effect_status('ORDER-2');
SELECT key, decision, status, occurrence, attempt, result, error, reason
  FROM durable_ledger.begin_effect('bk-2', 'ship_order', '{"order": 2}', 'ORDER-2');
SELECT key, run, status, attempt FROM durable_ledger.effects WHERE key = 'ORDER-2';
-- the first run's next attempt pauses as well
SELECT key, decision, status FROM durable_ledger.begin_effect('bk-1', 'ship_order', '{"order": 2}', 'ORDER-2');
-- a reconciler asks the provider about the key it was given
SELECT key, status, attempt, downstream_key FROM durable_ledger.unresolved WHERE key = 'ORDER-2';
SELECT downstream_key FROM durable_ledger.begin_effect('bk-1', 'ship_order', '{"order": 2}', 'ORDER-2');

-- ===================================================================
-- in_progress: a second session holds the first run's lease and is
-- performing the effect right now
-- ===================================================================
SELECT dblink_connect('other', 'dbname=' || current_database());
SELECT * FROM dblink('other', $$SELECT decision, status FROM durable_ledger.begin_effect('bk-3', 'ship_order',
                                '{"order": 3}', 'ORDER-3')$$) AS t(decision text, status text);
SELECT run, holder_pid <> pg_backend_pid() AS held_by_other_session
  FROM durable_ledger.leases WHERE run = 'bk-3';

SELECT key, decision, status, occurrence, attempt, result, error, reason
  FROM durable_ledger.begin_effect('bk-2', 'ship_order', '{"order": 3}', 'ORDER-3');
-- asking again while it is still in flight: the same answer, nothing changed
SELECT key, decision, status FROM durable_ledger.begin_effect('bk-2', 'ship_order', '{"order": 3}', 'ORDER-3');
SELECT key, run, status, attempt FROM durable_ledger.effects WHERE key = 'ORDER-3';
SELECT key, status FROM durable_ledger.effect_status('ORDER-3');
SELECT count(*) AS unresolved FROM durable_ledger.unresolved WHERE key = 'ORDER-3';

-- the other session completes it: now a replay
SELECT * FROM dblink('other', $$SELECT status, result FROM durable_ledger.complete_effect('ORDER-3',
                                '{"shipment": "s-3"}')$$) AS t(status text, result jsonb);
SELECT key, decision, status, occurrence, attempt, result, error
  FROM durable_ledger.begin_effect('bk-2', 'ship_order', '{"order": 3}', 'ORDER-3');
SELECT event, run, detail FROM durable_ledger.audit_log WHERE key = 'ORDER-3' ORDER BY id;

-- the other session's lease ends, and with it any started effect of its run
SELECT * FROM dblink('other', $$SELECT decision FROM durable_ledger.begin_effect('bk-3', 'ship_order',
                                '{"order": 4}', 'ORDER-4')$$) AS t(decision text);
SELECT key, decision, status FROM durable_ledger.begin_effect('bk-2', 'ship_order', '{"order": 4}', 'ORDER-4');
SELECT * FROM dblink('other', $$SELECT durable_ledger.release_run('bk-3')$$) AS t(released boolean);
SELECT dblink_disconnect('other');
SELECT key, decision, status FROM durable_ledger.begin_effect('bk-2', 'ship_order', '{"order": 4}', 'ORDER-4');

-- ===================================================================
-- a late report cannot land on a later attempt: a report that names no
-- attempt, from a session that does not hold the lease of the business
-- key's current attempt (the second), is kept as a conflict, not applied
-- (sql/attempts has every rule of reports and attempts)
-- ===================================================================
SELECT dblink_connect('late', 'dbname=' || current_database());
SELECT * FROM dblink('late', $$SELECT decision FROM durable_ledger.begin_effect('bk-late-1', 'pay',
                                '{"invoice": 77}', 'INV-LATE')$$) AS t(decision text);
SELECT dblink_disconnect('late');
DO $$ BEGIN
  FOR i IN 1..1200 LOOP
    EXIT WHEN NOT EXISTS (SELECT 1 FROM durable_ledger.leases WHERE run = 'bk-late-1');
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
SELECT status FROM durable_ledger.resolve_effect('INV-LATE', 'failed', '{"bank": "nothing"}', 'regress');
SELECT decision, attempt FROM durable_ledger.begin_effect('bk-late-2', 'pay', '{"invoice": 77}', 'INV-LATE');
SELECT dblink_connect('late', 'dbname=' || current_database());
SELECT * FROM dblink('late', $$SELECT status || ' ' || conflict FROM durable_ledger.fail_effect('INV-LATE', '"declined"')$$)
    AS t(after text);
SELECT dblink_disconnect('late');
SELECT status, attempt, conflict, run FROM durable_ledger.effects WHERE key = 'INV-LATE';
SELECT decision FROM durable_ledger.begin_effect('bk-late-3', 'pay', '{"invoice": 77}', 'INV-LATE');
SELECT event, run, lease_epoch, attempt, detail->>'report' AS report,
       detail->>'current_attempt' AS current_attempt
  FROM durable_ledger.audit_log WHERE key = 'INV-LATE' AND event = 'conflict';
SELECT durable_ledger.release_run('bk-late-2'), durable_ledger.release_run('bk-late-3');

-- ===================================================================
-- a failed business key is executed again by the next begin_effect, with
-- attempt n+1 (whichever run asks)
-- ===================================================================
SELECT durable_ledger.acquire_run('bk-1');
SELECT key, decision, status, attempt
  FROM durable_ledger.begin_effect('bk-1', 'pay_invoice', '{"invoice": "INV-1004"}', 'INV-1004');
SELECT status, error FROM durable_ledger.fail_effect('INV-1004', '{"code": "insufficient_funds"}');

SELECT key, decision, status, occurrence, attempt, result, error, reason
  FROM durable_ledger.begin_effect('bk-2', 'pay_invoice', '{"invoice": "INV-1004"}', 'INV-1004');
SELECT key, run, status, attempt, result, error FROM durable_ledger.effects WHERE key = 'INV-1004';
-- (this session also holds bk-1, which began attempt 1: its report names the attempt)
SELECT status, error FROM durable_ledger.fail_effect('INV-1004', '{"code": "card_expired"}', 2);
-- the same run asking again in the same epoch also gets the next attempt
SELECT key, decision, status, attempt, error
  FROM durable_ledger.begin_effect('bk-2', 'pay_invoice', '{"invoice": "INV-1004"}', 'INV-1004');
-- (this lease began attempts 2 and 3: its report names the attempt)
SELECT status, attempt, result FROM durable_ledger.complete_effect('INV-1004', '{"payment": "p-4"}', 3);
-- once completed, it is replayed: attempt 3 is the one that happened
SELECT key, decision, status, attempt, result, error
  FROM durable_ledger.begin_effect('bk-1', 'pay_invoice', '{"invoice": "INV-1004"}', 'INV-1004');
-- both errors are kept in the audit log
SELECT event, run, detail FROM durable_ledger.audit_log WHERE key = 'INV-1004' ORDER BY id;

-- ===================================================================
-- the business key itself: 1 to 255 characters, not 64 lowercase hex digits
-- ===================================================================
SELECT length(key) AS key_length, decision, occurrence
  FROM durable_ledger.begin_effect('bk-4', 'tag', '{"n": 1}', repeat('k', 255));
-- characters, not bytes: 255 times chr(233) (U+00E9, two bytes in UTF-8) is accepted
SELECT length(key) AS key_length, decision, occurrence
  FROM durable_ledger.begin_effect('bk-4', 'tag', '{"n": 2}', repeat(chr(233), 255));
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_try($$SELECT durable_ledger.begin_effect('bk-4', 'tag', '{"n": 3}', repeat('k', 256))$$) AS too_long;
SELECT regress_try($$SELECT durable_ledger.begin_effect('bk-4', 'tag', '{"n": 3}', repeat(chr(233), 256))$$) AS too_long_multibyte;
SELECT regress_try($$SELECT durable_ledger.begin_effect('bk-4', 'tag', '{"n": 3}', '')$$) AS empty;
SELECT regress_try($$SELECT durable_ledger.begin_effect('bk-4', 'tag', '{"n": 3}',
       encode(sha256('x'), 'hex'))$$) AS lowercase_hex_64;
SELECT regress_try($$SELECT durable_ledger.begin_effect('bk-4', 'tag', '{"n": 3}',
       durable_ledger.effect_key('bk-4', 'tag', '{"n": 3}', 1))$$) AS a_derived_key;
SELECT count(*) = :audit_rows AS nothing_written FROM durable_ledger.audit_log;
SELECT count(*) AS effects FROM durable_ledger.effects WHERE run = 'bk-4';
-- what is not exactly 64 lowercase hex digits is an ordinary business key
SELECT key, decision, occurrence
  FROM durable_ledger.begin_effect('bk-4', 'tag', '{"n": 4}', upper(encode(sha256('x'), 'hex')));
SELECT length(key) AS key_length, decision
  FROM durable_ledger.begin_effect('bk-4', 'tag', '{"n": 5}', left(encode(sha256('x'), 'hex'), 63));
SELECT length(key) AS key_length, decision
  FROM durable_ledger.begin_effect('bk-4', 'tag', '{"n": 6}', encode(sha256('x'), 'hex') || '0');
SELECT count(*) AS effects, bool_and(business_key AND occurrence IS NULL) AS all_business
  FROM durable_ledger.effects WHERE run = 'bk-4';

-- ===================================================================
-- the key to give the provider (downstream_key): a derived key itself; a
-- business key with its attempt, so that a provider that keeps its answer to a
-- key (a cached decline) sees the next attempt as a new request; a replay
-- names the attempt that completed
-- ===================================================================
SELECT key = downstream_key AS derived_is_itself
  FROM durable_ledger.begin_effect('bk-5', 'tag', '{"n": 1}');
SELECT key, decision, attempt, downstream_key
  FROM durable_ledger.begin_effect('bk-5', 'pay', '{"invoice": "INV-DK"}', 'INV-DK');
SELECT status FROM durable_ledger.fail_effect('INV-DK', '{"code": "declined"}', 1);
SELECT key, decision, attempt, downstream_key
  FROM durable_ledger.begin_effect('bk-5', 'pay', '{"invoice": "INV-DK"}', 'INV-DK');
SELECT status FROM durable_ledger.complete_effect('INV-DK', '{"payment_id": "p-2"}', 2);
SELECT key, decision, attempt, downstream_key
  FROM durable_ledger.begin_effect('bk-5', 'pay', '{"invoice": "INV-DK"}', 'INV-DK');

-- ===================================================================
-- a business key begun again with reworded args (a memo a model rewrote):
-- refused, nothing written, and the hint says what is true -- the same
-- operation wants key fields on its tool (then it replays), a new key would
-- perform it again.  With key fields, args that differ only outside them are
-- the same call; other key field values are a different operation.
-- ===================================================================
SELECT decision, (durable_ledger.complete_effect(key, '{"payment_id": "p-m1"}', attempt)).status
  FROM durable_ledger.begin_effect('bk-6', 'memo.pay', '{"invoice": "INV-M", "memo": "Thanks"}', 'INV-M');
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
\set VERBOSITY default
SELECT decision FROM durable_ledger.begin_effect('bk-6', 'memo.pay', '{"invoice": "INV-M", "memo": "Thank you"}', 'INV-M');
\set VERBOSITY terse
SELECT count(*) = :audit_rows AS nothing_written FROM durable_ledger.audit_log;
-- the admin names the fields that identify the operation: the call replays
SELECT key_fields FROM durable_ledger.register_tool('memo.pay', 'regress', key_fields => '{invoice}');
SELECT decision, result FROM durable_ledger.begin_effect('bk-6', 'memo.pay', '{"invoice": "INV-M", "memo": "Thank you"}', 'INV-M');
-- another value of a key field is another operation: the other hint
\set VERBOSITY default
SELECT decision FROM durable_ledger.begin_effect('bk-6', 'memo.pay', '{"invoice": "INV-N", "memo": "Thanks"}', 'INV-M');
\set VERBOSITY terse
SELECT count(*) AS effects FROM durable_ledger.effects WHERE key = 'INV-M';
SELECT count(*) AS divergences FROM durable_ledger.divergences WHERE run = 'bk-6';

-- ===================================================================
-- clean up: release every lease this file took
-- ===================================================================
SELECT durable_ledger.release_run('bk-1') AS bk1, durable_ledger.release_run('bk-2') AS bk2,
       durable_ledger.release_run('bk-4') AS bk4, durable_ledger.release_run('bk-5') AS bk5,
       durable_ledger.release_run('bk-6') AS bk6;
SELECT count(*) AS leases_left FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid();
