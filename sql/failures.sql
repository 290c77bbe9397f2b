-- failures: fail_effect turns a started effect into failed; a derived key's
-- failure is replayed by the next epoch (never executed again), so a run that
-- failed at occurrence 1 and succeeded at occurrence 2 replays onto both in
-- order; an equal repeated report changes nothing; a report that contradicts
-- the record (fail after complete, complete after fail, another result or
-- error) is never applied and never lost: WARNING, status unchanged, conflict
-- flag, audit 'conflict' row with what it said, listed in unresolved; and
-- begin_effect on a flagged effect pauses.
\set VERBOSITY terse


-- ===================================================================
-- started -> failed
-- ===================================================================
SELECT durable_ledger.effect_key('fail-1', 'charge_card', '{"card": "4242", "amount": 10}', 1) AS f1,
       durable_ledger.effect_key('fail-1', 'charge_card', '{"card": "4242", "amount": 10}', 2) AS f2 \gset

SELECT key = :'f1' AS is_f1, decision, status, occurrence
  FROM durable_ledger.begin_effect('fail-1', 'charge_card', '{"card": "4242", "amount": 10}');
SELECT left(key, 12) AS key, status, result, error, completed_at IS NOT NULL AS has_completed_at, conflict
  FROM durable_ledger.fail_effect(:'f1', '{"code": "card_declined"}');

SELECT completed_at AS f1_completed_at FROM durable_ledger.effects WHERE key = :'f1' \gset
SELECT count(*) AS f1_audit_rows FROM durable_ledger.audit_log WHERE key = :'f1' \gset

-- the same failure reported again: success, no change, no audit row, no warning
SELECT status, error, conflict FROM durable_ledger.fail_effect(:'f1', '{"code": "card_declined"}');
SELECT status, error, conflict, completed_at = :'f1_completed_at' AS completed_at_unchanged
  FROM durable_ledger.effects WHERE key = :'f1';
SELECT count(*) = :f1_audit_rows AS no_new_audit_row FROM durable_ledger.audit_log WHERE key = :'f1';

-- the run retries the call: that is the next occurrence, with its own key
SELECT key = :'f2' AS is_f2, decision, status, occurrence
  FROM durable_ledger.begin_effect('fail-1', 'charge_card', '{"card": "4242", "amount": 10}');
SELECT status, result FROM durable_ledger.complete_effect(:'f2', '{"charge": "ch-2"}');

-- ===================================================================
-- the next epoch replays the failure, then the success: nothing executes
-- ===================================================================
SELECT durable_ledger.release_run('fail-1');
SELECT key = :'f1' AS is_f1, decision, status, occurrence, attempt, result, error, reason
  FROM durable_ledger.begin_effect('fail-1', 'charge_card', '{"card": "4242", "amount": 10}');
SELECT key = :'f2' AS is_f2, decision, status, occurrence, attempt, result, error,
       reason IS NOT NULL AS has_reason
  FROM durable_ledger.begin_effect('fail-1', 'charge_card', '{"card": "4242", "amount": 10}');

-- once more with acquire_run on the held run
SELECT durable_ledger.acquire_run('fail-1');
SELECT occurrence, decision, status, result, error
  FROM durable_ledger.begin_effect('fail-1', 'charge_card', '{"card": "4242", "amount": 10}');
SELECT occurrence, decision, status, result, error
  FROM durable_ledger.begin_effect('fail-1', 'charge_card', '{"card": "4242", "amount": 10}');

-- two intents in all, one failure, one completion; the replays follow
SELECT event, occurrence, detail, a.lease_epoch
  FROM durable_ledger.audit_log a LEFT JOIN durable_ledger.effects e USING (key)
 WHERE a.run = 'fail-1' AND a.key IS NOT NULL ORDER BY a.id;
SELECT left(key, 12) AS key, occurrence, status, result, error, attempt
  FROM durable_ledger.effects WHERE run = 'fail-1' ORDER BY occurrence;

-- a NULL error is allowed, and an equal NULL error again is no change
SELECT durable_ledger.effect_key('fail-1', 'charge_card', '{"card": "4242", "amount": 99}', 1) AS f3 \gset
SELECT decision FROM durable_ledger.begin_effect('fail-1', 'charge_card', '{"card": "4242", "amount": 99}');
SELECT status, error FROM durable_ledger.fail_effect(:'f3', NULL);
SELECT status, error, conflict FROM durable_ledger.fail_effect(:'f3', NULL);
SELECT event, detail FROM durable_ledger.audit_log WHERE key = :'f3' ORDER BY id;

-- a failure reported for an effect whose lease ended is accepted, as late
SELECT durable_ledger.effect_key('fail-1', 'charge_card', '{"card": "4242", "amount": 98}', 1) AS f4 \gset
SELECT decision FROM durable_ledger.begin_effect('fail-1', 'charge_card', '{"card": "4242", "amount": 98}');
SELECT durable_ledger.release_run('fail-1');
SELECT status, error FROM durable_ledger.fail_effect(:'f4', '{"code": "timeout_before_send"}');
SELECT event, detail FROM durable_ledger.audit_log WHERE key = :'f4' ORDER BY id;

-- failing a key that does not exist is an error, and writes nothing
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_try($$SELECT durable_ledger.fail_effect('no-such-key', '{}')$$);
SELECT count(*) = :audit_rows AS nothing_written FROM durable_ledger.audit_log;

-- ===================================================================
-- fail after complete: a conflict
-- ===================================================================
SELECT durable_ledger.effect_key('fail-2', 'send_sms', '{"to": "+100"}', 1) AS c2 \gset
SELECT decision FROM durable_ledger.begin_effect('fail-2', 'send_sms', '{"to": "+100"}');
SELECT status FROM durable_ledger.complete_effect(:'c2', '{"sid": "SM1"}');
SELECT completed_at AS c2_completed_at FROM durable_ledger.effects WHERE key = :'c2' \gset

SELECT left(key, 12) AS key, status, result, error, conflict
  FROM durable_ledger.fail_effect(:'c2', '{"code": "timeout"}');
SELECT status, result, error, conflict, completed_at = :'c2_completed_at' AS completed_at_unchanged
  FROM durable_ledger.effects WHERE key = :'c2';
SELECT event, detail FROM durable_ledger.audit_log WHERE key = :'c2' AND event = 'conflict' ORDER BY id;
SELECT left(key, 12) AS key, status, conflict, reason IS NOT NULL AS has_reason
  FROM durable_ledger.unresolved WHERE run = 'fail-2' ORDER BY key;

-- ===================================================================
-- complete after fail: a conflict
-- ===================================================================
SELECT durable_ledger.effect_key('fail-3', 'send_sms', '{"to": "+200"}', 1) AS c3 \gset
SELECT decision FROM durable_ledger.begin_effect('fail-3', 'send_sms', '{"to": "+200"}');
SELECT status FROM durable_ledger.fail_effect(:'c3', '{"code": "invalid_number"}');

SELECT left(key, 12) AS key, status, result, error, conflict
  FROM durable_ledger.complete_effect(:'c3', '{"sid": "SM2"}');
SELECT status, result, error, conflict FROM durable_ledger.effects WHERE key = :'c3';
SELECT event, detail FROM durable_ledger.audit_log WHERE key = :'c3' AND event = 'conflict' ORDER BY id;
SELECT left(key, 12) AS key, status, conflict
  FROM durable_ledger.unresolved WHERE run = 'fail-3' ORDER BY key;

-- ===================================================================
-- complete with another result after complete: a conflict; the equal one is not
-- ===================================================================
SELECT durable_ledger.effect_key('fail-4', 'send_sms', '{"to": "+300"}', 1) AS c4 \gset
SELECT decision FROM durable_ledger.begin_effect('fail-4', 'send_sms', '{"to": "+300"}');
SELECT status FROM durable_ledger.complete_effect(:'c4', '{"sid": "SM3"}');
SELECT status, result, conflict FROM durable_ledger.complete_effect(:'c4', '{"sid": "SM3"}');
SELECT count(*) AS conflicts FROM durable_ledger.audit_log WHERE key = :'c4' AND event = 'conflict';

SELECT left(key, 12) AS key, status, result, error, conflict
  FROM durable_ledger.complete_effect(:'c4', '{"sid": "SM4"}');
SELECT status, result, conflict FROM durable_ledger.effects WHERE key = :'c4';
SELECT event, detail FROM durable_ledger.audit_log WHERE key = :'c4' AND event = 'conflict' ORDER BY id;
-- a NULL result contradicts a recorded result too
SELECT status, result, conflict FROM durable_ledger.complete_effect(:'c4', NULL);
SELECT count(*) AS conflicts FROM durable_ledger.audit_log WHERE key = :'c4' AND event = 'conflict';

-- ===================================================================
-- fail with another error after fail: a conflict
-- ===================================================================
SELECT durable_ledger.effect_key('fail-5', 'send_sms', '{"to": "+400"}', 1) AS c5 \gset
SELECT decision FROM durable_ledger.begin_effect('fail-5', 'send_sms', '{"to": "+400"}');
SELECT status FROM durable_ledger.fail_effect(:'c5', '{"code": "blocked"}');
SELECT left(key, 12) AS key, status, result, error, conflict
  FROM durable_ledger.fail_effect(:'c5', '{"code": "rate_limited"}');
SELECT event, detail FROM durable_ledger.audit_log WHERE key = :'c5' AND event = 'conflict' ORDER BY id;

-- every contradicted effect is listed for a person, with its recorded status
SELECT run, status, conflict FROM durable_ledger.unresolved
 WHERE run IN ('fail-1', 'fail-2', 'fail-3', 'fail-4', 'fail-5') ORDER BY run;

-- ===================================================================
-- begin_effect on a flagged effect pauses, whatever its recorded status
-- ===================================================================
SELECT durable_ledger.acquire_run('fail-2');
SELECT key = :'c2' AS is_c2, decision, status, occurrence, attempt, result, error, reason
  FROM durable_ledger.begin_effect('fail-2', 'send_sms', '{"to": "+100"}');
SELECT durable_ledger.acquire_run('fail-3');
SELECT key = :'c3' AS is_c3, decision, status, occurrence, result, error, reason IS NOT NULL AS has_reason
  FROM durable_ledger.begin_effect('fail-3', 'send_sms', '{"to": "+200"}');
SELECT durable_ledger.acquire_run('fail-4');
SELECT key = :'c4' AS is_c4, decision, status, occurrence, result, error, reason IS NOT NULL AS has_reason
  FROM durable_ledger.begin_effect('fail-4', 'send_sms', '{"to": "+300"}');
SELECT durable_ledger.acquire_run('fail-5');
SELECT key = :'c5' AS is_c5, decision, status, occurrence, result, error, reason IS NOT NULL AS has_reason
  FROM durable_ledger.begin_effect('fail-5', 'send_sms', '{"to": "+400"}');
SELECT run, event, detail FROM durable_ledger.audit_log
 WHERE run IN ('fail-2', 'fail-3', 'fail-4', 'fail-5') AND event = 'pause' ORDER BY id;

-- a flagged business key pauses too, instead of being executed again
SELECT decision FROM durable_ledger.begin_effect('fail-6', 'book_room', '{"room": 12}', 'BOOKING-12');
SELECT status FROM durable_ledger.complete_effect('BOOKING-12', '{"booking": "b-12"}');
SELECT status, conflict FROM durable_ledger.fail_effect('BOOKING-12', '{"code": "no_such_booking"}');
SELECT key, decision, status, attempt, reason IS NOT NULL AS has_reason
  FROM durable_ledger.begin_effect('fail-7', 'book_room', '{"room": 12}', 'BOOKING-12');
SELECT decision FROM durable_ledger.begin_effect('fail-6', 'book_room', '{"room": 13}', 'BOOKING-13');
SELECT status FROM durable_ledger.fail_effect('BOOKING-13', '{"code": "full"}');
SELECT status, conflict FROM durable_ledger.complete_effect('BOOKING-13', '{"booking": "b-13"}');
SELECT key, decision, status, attempt, reason IS NOT NULL AS has_reason
  FROM durable_ledger.begin_effect('fail-7', 'book_room', '{"room": 13}', 'BOOKING-13');
SELECT key, status, attempt, conflict FROM durable_ledger.effects
 WHERE key IN ('BOOKING-12', 'BOOKING-13') ORDER BY key;

-- ===================================================================
-- clean up: release every lease this file took
-- ===================================================================
SELECT durable_ledger.release_run('fail-2') AS fail2,
       durable_ledger.release_run('fail-3') AS fail3, durable_ledger.release_run('fail-4') AS fail4,
       durable_ledger.release_run('fail-5') AS fail5, durable_ledger.release_run('fail-6') AS fail6,
       durable_ledger.release_run('fail-7') AS fail7;
SELECT count(*) AS leases_left FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid();
