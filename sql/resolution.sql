-- resolution: resolve_effect turns an unknown effect (or a started one whose
-- lease ended) into completed with its result or failed with the value as its
-- error, stores resolved_by and the note, audits 'resolved' with both, and the
-- next epoch replays the decision; resolving a flagged conflict clears the flag
-- and takes it off unresolved; a resolved business-key failure is executed
-- again; a live lease, an unflagged completed/failed effect, a bad outcome, a
-- NULL or empty resolved_by and an unknown key are errors that write nothing.
\set VERBOSITY terse


-- ===================================================================
-- unknown -> completed
-- ===================================================================
SELECT durable_ledger.effect_key('res-1', 'wire_transfer', '{"amount": 500}', 1) AS r1 \gset
SELECT decision FROM durable_ledger.begin_effect('res-1', 'wire_transfer', '{"amount": 500}');
SELECT durable_ledger.release_run('res-1');
SELECT decision, status FROM durable_ledger.begin_effect('res-1', 'wire_transfer', '{"amount": 500}');

SELECT left(key, 12) AS key, status, result, error, resolved_by, resolution_note, conflict,
       completed_at IS NOT NULL AS has_completed_at
  FROM durable_ledger.resolve_effect(:'r1', 'completed', '{"transfer": "tr-500"}', 'alice',
                                     'bank statement shows the transfer');
SELECT status, result, error, resolved_by, resolution_note, conflict
  FROM durable_ledger.effects WHERE key = :'r1';
SELECT event, detail, role_name = current_user AS by_current_user
  FROM durable_ledger.audit_log WHERE key = :'r1' AND event = 'resolved' ORDER BY id;
SELECT count(*) AS unresolved FROM durable_ledger.unresolved WHERE run = 'res-1';

-- the next epoch replays the resolved result
SELECT durable_ledger.acquire_run('res-1');
SELECT key = :'r1' AS is_r1, decision, status, occurrence, result, error
  FROM durable_ledger.begin_effect('res-1', 'wire_transfer', '{"amount": 500}');

-- ===================================================================
-- unknown -> failed: the value is stored as the error, and is replayed
-- ===================================================================
SELECT durable_ledger.effect_key('res-2', 'wire_transfer', '{"amount": 600}', 1) AS r2 \gset
SELECT decision FROM durable_ledger.begin_effect('res-2', 'wire_transfer', '{"amount": 600}');
SELECT durable_ledger.release_run('res-2');
SELECT decision, status FROM durable_ledger.begin_effect('res-2', 'wire_transfer', '{"amount": 600}');

SELECT left(key, 12) AS key, status, result, error, resolved_by, resolution_note, conflict
  FROM durable_ledger.resolve_effect(:'r2', 'failed', '{"reason": "never reached the bank"}', 'bob');
SELECT event, detail FROM durable_ledger.audit_log WHERE key = :'r2' AND event = 'resolved' ORDER BY id;

SELECT durable_ledger.acquire_run('res-2');
SELECT key = :'r2' AS is_r2, decision, status, occurrence, result, error
  FROM durable_ledger.begin_effect('res-2', 'wire_transfer', '{"amount": 600}');
-- the run may call again: that is occurrence 2, executed
SELECT occurrence, decision, status
  FROM durable_ledger.begin_effect('res-2', 'wire_transfer', '{"amount": 600}');

-- failed with a NULL value: no error recorded
SELECT durable_ledger.effect_key('res-2', 'wire_transfer', '{"amount": 601}', 1) AS r2b \gset
SELECT decision FROM durable_ledger.begin_effect('res-2', 'wire_transfer', '{"amount": 601}');
SELECT durable_ledger.acquire_run('res-2');
SELECT status, result, error, resolved_by, resolution_note
  FROM durable_ledger.resolve_effect(:'r2b', 'failed', NULL, 'bob', NULL);

-- ===================================================================
-- a started effect whose lease ended can be resolved before any later
-- attempt marked it unknown
-- ===================================================================
SELECT durable_ledger.effect_key('res-3', 'send_letter', '{"to": "x"}', 1) AS r3 \gset
SELECT decision FROM durable_ledger.begin_effect('res-3', 'send_letter', '{"to": "x"}');
SELECT durable_ledger.release_run('res-3');
SELECT status AS stored_status FROM durable_ledger.effects WHERE key = :'r3';
SELECT status, result, resolved_by
  FROM durable_ledger.resolve_effect(:'r3', 'completed', NULL, 'carol', 'posted on Monday');
SELECT detail->>'previous_status' AS previous_status FROM durable_ledger.audit_log
 WHERE key = :'r3' AND event = 'resolved';
SELECT decision, status, result FROM durable_ledger.begin_effect('res-3', 'send_letter', '{"to": "x"}');

-- ===================================================================
-- a flagged conflict: resolving clears the flag and the unresolved entry
-- ===================================================================
SELECT durable_ledger.effect_key('res-4', 'send_sms', '{"to": "+1"}', 1) AS r4 \gset
SELECT decision FROM durable_ledger.begin_effect('res-4', 'send_sms', '{"to": "+1"}');
SELECT status FROM durable_ledger.complete_effect(:'r4', '{"sid": "S1"}');
SELECT status, conflict FROM durable_ledger.fail_effect(:'r4', '{"code": "undelivered"}');
SELECT left(key, 12) AS key, status, conflict FROM durable_ledger.unresolved WHERE run = 'res-4';

SELECT status, result, error, resolved_by, resolution_note, conflict
  FROM durable_ledger.resolve_effect(:'r4', 'completed', '{"sid": "S1"}', 'dave', 'carrier confirms delivery');
SELECT count(*) AS unresolved FROM durable_ledger.unresolved WHERE run = 'res-4';
SELECT detail FROM durable_ledger.audit_log WHERE key = :'r4' AND event = 'resolved' ORDER BY id;
-- no longer a pause: the next epoch replays
SELECT durable_ledger.acquire_run('res-4');
SELECT decision, status, result FROM durable_ledger.begin_effect('res-4', 'send_sms', '{"to": "+1"}');

-- a flagged failure resolved as failed: the flag is cleared, the failure replayed
SELECT durable_ledger.effect_key('res-4', 'send_sms', '{"to": "+2"}', 1) AS r4b \gset
SELECT decision FROM durable_ledger.begin_effect('res-4', 'send_sms', '{"to": "+2"}');
SELECT status FROM durable_ledger.fail_effect(:'r4b', '{"code": "blocked"}');
SELECT status, conflict FROM durable_ledger.complete_effect(:'r4b', '{"sid": "S2"}');
SELECT status, result, error, conflict
  FROM durable_ledger.resolve_effect(:'r4b', 'failed', '{"code": "blocked"}', 'dave');
SELECT durable_ledger.acquire_run('res-4');
SELECT occurrence, decision, status FROM durable_ledger.begin_effect('res-4', 'send_sms', '{"to": "+1"}');
SELECT occurrence, decision, status, error FROM durable_ledger.begin_effect('res-4', 'send_sms', '{"to": "+2"}');

-- ===================================================================
-- a business key resolved as failed is executed again by the next begin
-- ===================================================================
SELECT decision, attempt FROM durable_ledger.begin_effect('res-5', 'issue_refund', '{"order": 77}', 'REFUND-77');
SELECT durable_ledger.release_run('res-5');
SELECT decision, status FROM durable_ledger.begin_effect('res-6', 'issue_refund', '{"order": 77}', 'REFUND-77');
SELECT key, status, error, resolved_by
  FROM durable_ledger.resolve_effect('REFUND-77', 'failed', '{"reason": "provider has no such refund"}', 'erin');
SELECT key, decision, status, attempt, error
  FROM durable_ledger.begin_effect('res-6', 'issue_refund', '{"order": 77}', 'REFUND-77');

-- ===================================================================
-- errors: nothing is written
-- ===================================================================
SELECT durable_ledger.effect_key('res-7', 'send_letter', '{"to": "y"}', 1) AS r7 \gset
SELECT decision FROM durable_ledger.begin_effect('res-7', 'send_letter', '{"to": "y"}');
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT md5(string_agg(e::text, '|' ORDER BY key)) AS effects_before
  FROM durable_ledger.effects e WHERE run LIKE 'res-%' \gset

-- its lease is live (this session's current epoch): the worker will report
SELECT regress_try(format($$SELECT durable_ledger.resolve_effect(%L, 'completed', '{}', 'alice')$$, :'r7')) AS live_lease;
-- completed, or failed, without a flag: nothing to resolve
SELECT regress_try(format($$SELECT durable_ledger.resolve_effect(%L, 'failed', NULL, 'alice')$$, :'r1')) AS completed_unflagged;
SELECT regress_try(format($$SELECT durable_ledger.resolve_effect(%L, 'completed', '{}', 'alice')$$, :'r2')) AS failed_unflagged;
SELECT regress_try(format($$SELECT durable_ledger.resolve_effect(%L, 'completed', '{}', 'alice')$$, :'r4')) AS flag_already_cleared;
-- a bad outcome, a missing or empty name, an unknown key
SELECT regress_try(format($$SELECT durable_ledger.resolve_effect(%L, 'done', '{}', 'alice')$$, :'r7')) AS bad_outcome;
SELECT regress_try(format($$SELECT durable_ledger.resolve_effect(%L, 'unknown', '{}', 'alice')$$, :'r7')) AS outcome_unknown;
SELECT regress_try(format($$SELECT durable_ledger.resolve_effect(%L, 'Completed', '{}', 'alice')$$, :'r7')) AS outcome_case;
SELECT regress_try(format($$SELECT durable_ledger.resolve_effect(%L, NULL, '{}', 'alice')$$, :'r7')) AS null_outcome;
SELECT regress_try(format($$SELECT durable_ledger.resolve_effect(%L, 'completed', '{}', NULL)$$, :'r7')) AS null_resolved_by;
SELECT regress_try(format($$SELECT durable_ledger.resolve_effect(%L, 'completed', '{}', '')$$, :'r7')) AS empty_resolved_by;
SELECT regress_try($$SELECT durable_ledger.resolve_effect(NULL, 'completed', '{}', 'alice')$$) AS null_key;
SELECT regress_try($$SELECT durable_ledger.resolve_effect('no-such-key', 'completed', '{}', 'alice')$$) AS unknown_key;

SELECT count(*) = :audit_rows AS no_audit_row_written FROM durable_ledger.audit_log;
SELECT md5(string_agg(e::text, '|' ORDER BY key)) = :'effects_before' AS no_effect_changed
  FROM durable_ledger.effects e WHERE run LIKE 'res-%';
SELECT status, resolved_by FROM durable_ledger.effects WHERE key = :'r7';

-- the error codes, as psql shows them
\set VERBOSITY default
SELECT durable_ledger.resolve_effect(:'r7', 'completed', '{}', 'alice');
SELECT durable_ledger.resolve_effect(:'r1', 'completed', '{}', 'alice');
SELECT durable_ledger.resolve_effect(:'r7', 'done', '{}', 'alice');
SELECT durable_ledger.resolve_effect(:'r7', 'completed', '{}', NULL);
SELECT durable_ledger.resolve_effect(:'r7', 'completed', '{}', '');
SELECT durable_ledger.resolve_effect('no-such-key', 'completed', '{}', 'alice');
\set VERBOSITY terse

-- once its lease ends, the same effect can be resolved
SELECT durable_ledger.release_run('res-7');
SELECT status, resolved_by FROM durable_ledger.resolve_effect(:'r7', 'completed', '{"letter": 1}', 'alice');

-- ===================================================================
-- clean up: release every lease this file took
-- ===================================================================
SELECT durable_ledger.release_run('res-1') AS res1, durable_ledger.release_run('res-2') AS res2,
       durable_ledger.release_run('res-3') AS res3, durable_ledger.release_run('res-4') AS res4,
       durable_ledger.release_run('res-6') AS res6;
SELECT count(*) AS leases_left FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid();
