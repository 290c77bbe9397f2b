-- approvals: a call that needs a person's approval before it executes.
-- An admin names which calls of a registered tool need one, by a jsonpath
-- predicate on their args (set_approval(tool, condition, changed_by, note);
-- NULL: none).  Such a call records its intent awaiting_approval and pauses
-- (approval_requested, notified), listed in unresolved; an approver -- a
-- member of durable_ledger_approver, not the role or login that made the
-- call -- approves it (the next call of its key executes it, once, as its
-- attempt) or rejects it (failed; it replays as failed, a business key
-- too).  The approval binds to the key: other args are another call.
\set VERBOSITY terse

CREATE ROLE regress_ap_worker LOGIN IN ROLE durable_ledger_worker;
CREATE ROLE regress_ap_alice LOGIN IN ROLE durable_ledger_approver;
CREATE ROLE regress_ap_both LOGIN IN ROLE durable_ledger_worker, durable_ledger_approver;
SELECT tool FROM durable_ledger.register_tool('ap_refund', 'regress');

-- ===================================================================
-- the registry: set_approval
-- ===================================================================
SELECT tool, approval FROM durable_ledger.set_approval('ap_refund', 'strict $.amount > 100', 'ops', 'refunds over 100');
SELECT detail FROM durable_ledger.audit_log WHERE event = 'tool_changed'
 AND detail ->> 'tool' = 'ap_refund' ORDER BY id DESC LIMIT 1;
-- change_tool keeps it
SELECT tool, approval, divergence FROM durable_ledger.change_tool('ap_refund', 'ops', divergence => 'warn');
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_sqlstate($$SELECT durable_ledger.set_approval('ap_nobody', 'true', 'ops')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_approval('ap_refund', 'true', NULL)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_approval('ap_refund', '$.amount >', 'ops')$$);
-- lax mode takes a missing (misspelt) field for false: refused; so is what fails on any args
SELECT regress_sqlstate($$SELECT durable_ledger.set_approval('ap_refund', '$.amout > 100', 'ops')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_approval('ap_refund', 'strict $.amount > $limit', 'ops')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_approval('ap_refund', 'strict $.x > 1 && $.items[0 to $n] starts with "a"', 'ops')$$);
SELECT count(*) - :audit_rows AS audit_rows_written FROM durable_ledger.audit_log;
-- only admins set it; only approvers give verdicts
SELECT has_function_privilege('durable_ledger_worker', 'durable_ledger.set_approval(text,jsonpath,text,text)', 'EXECUTE') AS worker_sets,
       has_function_privilege('durable_ledger_admin', 'durable_ledger.set_approval(text,jsonpath,text,text)', 'EXECUTE') AS admin_sets,
       has_function_privilege('durable_ledger_admin', 'durable_ledger.approve_effect(text,text,text)', 'EXECUTE') AS admin_approves,
       has_function_privilege('durable_ledger_worker', 'durable_ledger.approve_effect(text,text,text)', 'EXECUTE') AS worker_approves,
       has_function_privilege('durable_ledger_approver', 'durable_ledger.approve_effect(text,text,text)', 'EXECUTE') AS approver_approves,
       has_function_privilege('durable_ledger_approver', 'durable_ledger.reject_effect(text,text,text)', 'EXECUTE') AS approver_rejects,
       has_table_privilege('durable_ledger_approver', 'durable_ledger.unresolved', 'SELECT') AS approver_sees_unresolved,
       has_table_privilege('durable_ledger_approver', 'durable_ledger.audit_log', 'SELECT') AS approver_reads_audit;

-- ===================================================================
-- a call under the limit executes; one over it waits for an approver
-- ===================================================================
SET SESSION AUTHORIZATION regress_ap_worker;
SELECT durable_ledger.acquire_run('ap-1');
SELECT decision, status, attempt, reason FROM durable_ledger.begin_effect('ap-1', 'ap_refund', '{"order": 1, "amount": 50}');
SELECT key AS k_big, decision, status, attempt, occurrence, downstream_key IS NOT NULL AS has_downstream_key, reason
  FROM durable_ledger.begin_effect('ap-1', 'ap_refund', '{"order": 2, "amount": 500}') \gset
SELECT :'decision' AS decision, :'status' AS status, :'attempt' AS attempt, :'occurrence' AS occurrence, :'reason' AS reason;
-- asked again in the epoch: the same call, still waiting (no new key, no new request)
SELECT key = :'k_big' AS same_key, decision, status FROM durable_ledger.begin_effect('ap-1', 'ap_refund', '{"order": 2, "amount": 500}');
-- the worker cannot decide it: not an approver
SELECT regress_sqlstate(format($$SELECT durable_ledger.approve_effect(%L, 'me')$$, :'k_big'));
RESET SESSION AUTHORIZATION;
SELECT status, approval, approver FROM durable_ledger.effects WHERE key = :'k_big';
SELECT event, role_name, detail FROM durable_ledger.audit_log WHERE key = :'k_big' ORDER BY id;
SELECT status, left(reason, 18) AS reason, attempt, args FROM durable_ledger.unresolved WHERE key = :'k_big';

-- a condition that answers no boolean asks for an approval (a slip never lets a call through)
SELECT tool FROM durable_ledger.register_tool('ap_deploy', 'regress');
SELECT tool FROM durable_ledger.set_approval('ap_deploy', 'strict $.target', 'ops');
SET SESSION AUTHORIZATION regress_ap_worker;
SELECT decision, status FROM durable_ledger.begin_effect('ap-1', 'ap_deploy', '{"target": "production"}');
SELECT decision, status FROM durable_ledger.begin_effect('ap-1', 'ap_deploy', '{"other": 1}');
-- strict: args that lack the field the condition names wait too
SELECT decision, status FROM durable_ledger.begin_effect('ap-1', 'ap_refund', '{"order": 9, "amout": 5000}');
RESET SESSION AUTHORIZATION;

-- ===================================================================
-- the verdict: approved, by someone who did not make the call
-- ===================================================================
SELECT coalesce(max(id), 0) AS audit_mark FROM durable_ledger.audit_log \gset
SET SESSION AUTHORIZATION regress_ap_alice;
SELECT regress_sqlstate(format($$SELECT durable_ledger.approve_effect(%L, NULL)$$, :'k_big'));
SELECT regress_sqlstate($$SELECT durable_ledger.approve_effect('no-such-key', 'Alice')$$);
SELECT status, approval, approver, approval_note FROM durable_ledger.approve_effect(:'k_big', 'Alice', 'order 2 checked');
-- the same verdict again: no change; the other one: refused
SELECT status, approval, approver FROM durable_ledger.approve_effect(:'k_big', 'Alice');
SELECT regress_sqlstate(format($$SELECT durable_ledger.reject_effect(%L, 'Alice')$$, :'k_big'));
SELECT count(*) AS waiting FROM durable_ledger.unresolved WHERE key = :'k_big';
RESET SESSION AUTHORIZATION;
SELECT event, role_name, detail FROM durable_ledger.audit_log WHERE id > :audit_mark ORDER BY id;

-- the next call of the key executes it, once, as the attempt approved
SET SESSION AUTHORIZATION regress_ap_worker;
SELECT key = :'k_big' AS same_key, decision, status, attempt, downstream_key = :'k_big' AS provider_key_is_key, reason
  FROM durable_ledger.begin_effect('ap-1', 'ap_refund', '{"order": 2, "amount": 500}');
SELECT status, approval FROM durable_ledger.complete_effect(:'k_big', '{"refund": "re_2"}', 1);
-- the same call again is another refund (the next occurrence): its own approval
SELECT key <> :'k_big' AS new_key, decision, status, occurrence FROM durable_ledger.begin_effect('ap-1', 'ap_refund', '{"order": 2, "amount": 500}');
-- other args are another call: their own approval
SELECT key <> :'k_big' AS new_key, decision, status FROM durable_ledger.begin_effect('ap-1', 'ap_refund', '{"order": 2, "amount": 900}');
SELECT durable_ledger.release_run('ap-1');
RESET SESSION AUTHORIZATION;
SELECT status, approval, approver, result FROM durable_ledger.effects WHERE key = :'k_big';
SELECT event, detail FROM durable_ledger.audit_log WHERE key = :'k_big' AND event = 'intent' ORDER BY id;

-- ===================================================================
-- separation of duties: the role (or login) that made the call cannot approve it
-- ===================================================================
SET SESSION AUTHORIZATION regress_ap_both;
SELECT durable_ledger.acquire_run('ap-2');
SELECT key AS k_own, decision FROM durable_ledger.begin_effect('ap-2', 'ap_refund', '{"order": 3, "amount": 700}') \gset
SELECT regress_sqlstate(format($$SELECT durable_ledger.approve_effect(%L, 'Bob')$$, :'k_own'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.reject_effect(%L, 'Bob')$$, :'k_own'));
RESET SESSION AUTHORIZATION;

-- ===================================================================
-- rejected: failed, replayed as failed, never executed
-- ===================================================================
SET SESSION AUTHORIZATION regress_ap_alice;
SELECT status, approval, approver, error FROM durable_ledger.reject_effect(:'k_own', 'Alice', 'no such order');
SELECT status FROM durable_ledger.reject_effect(:'k_own', 'Alice');
SELECT regress_sqlstate(format($$SELECT durable_ledger.approve_effect(%L, 'Alice')$$, :'k_own'));
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_ap_both;
SELECT decision, status, error, reason FROM durable_ledger.begin_effect('ap-2', 'ap_refund', '{"order": 3, "amount": 700}');
SELECT durable_ledger.release_run('ap-2');
RESET SESSION AUTHORIZATION;
-- a person cannot make it again either
SELECT regress_sqlstate(format($$SELECT durable_ledger.retry_effect(%L, 1, 'ops')$$, :'k_own'));

-- ===================================================================
-- a business key: rejected replays as failed, in any run; an approved one
-- that failed asks again for its next attempt
-- ===================================================================
SET SESSION AUTHORIZATION regress_ap_worker;
SELECT durable_ledger.acquire_run('ap-3');
SELECT decision, status, attempt FROM durable_ledger.begin_effect('ap-3', 'ap_refund', '{"amount": 300}', business_key => 'AP-R1');
SELECT decision, status, attempt FROM durable_ledger.begin_effect('ap-3', 'ap_refund', '{"amount": 400}', business_key => 'AP-R2');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_ap_alice;
SELECT status FROM durable_ledger.reject_effect('AP-R1', 'Alice');
SELECT status FROM durable_ledger.approve_effect('AP-R2', 'Alice');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_ap_worker;
SELECT decision, status, attempt, reason FROM durable_ledger.begin_effect('ap-3', 'ap_refund', '{"amount": 300}', business_key => 'AP-R1');
SELECT decision, status, attempt, downstream_key FROM durable_ledger.begin_effect('ap-3', 'ap_refund', '{"amount": 400}', business_key => 'AP-R2');
SELECT status FROM durable_ledger.fail_effect('AP-R2', '{"bank": "declined"}', 1);
SELECT decision, status, attempt FROM durable_ledger.begin_effect('ap-3', 'ap_refund', '{"amount": 400}', business_key => 'AP-R2');
SELECT durable_ledger.release_run('ap-3');
-- another run, a later time: the rejection still replays
SELECT durable_ledger.acquire_run('ap-4');
SELECT decision, status FROM durable_ledger.begin_effect('ap-4', 'ap_refund', '{"amount": 300}', business_key => 'AP-R1');
SELECT durable_ledger.release_run('ap-4');
RESET SESSION AUTHORIZATION;
SELECT attempt, status, approval, approver FROM durable_ledger.effects WHERE key = 'AP-R2';
SELECT attempt, status FROM durable_ledger.past_attempts WHERE key = 'AP-R2';

-- ===================================================================
-- a later attempt of the run finds its call still waiting; what is not a
-- verdict is refused on a waiting call, and writes nothing
-- ===================================================================
SET SESSION AUTHORIZATION regress_ap_worker;
SELECT durable_ledger.acquire_run('ap-5');
SELECT key AS k_wait FROM durable_ledger.begin_effect('ap-5', 'ap_refund', '{"order": 5, "amount": 1000}') \gset
SELECT durable_ledger.release_run('ap-5');
SELECT durable_ledger.acquire_run('ap-5');
SELECT key = :'k_wait' AS same_key, decision, status FROM durable_ledger.begin_effect('ap-5', 'ap_refund', '{"order": 5, "amount": 1000}');
RESET SESSION AUTHORIZATION;
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_sqlstate(format($$SELECT durable_ledger.resolve_effect(%L, 'completed', '{}', 'ops')$$, :'k_wait'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.retry_effect(%L, 1, 'ops')$$, :'k_wait'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.reconcile_effect(%L, 1, false, '{}')$$, :'k_wait'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.fork_run('ap-5', 'ap-5-fork', %L, 'ops')$$, :'k_wait'));

SELECT count(*) - :audit_rows AS audit_rows_written FROM durable_ledger.audit_log;
-- a report on a call that never executed contradicts it: kept for a person, and no verdict then
SET SESSION AUTHORIZATION regress_ap_worker;
SELECT status, conflict FROM durable_ledger.complete_effect(:'k_wait', '{"refund": "?"}', 1);
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_ap_alice;
SELECT regress_sqlstate(format($$SELECT durable_ledger.approve_effect(%L, 'Alice')$$, :'k_wait'));
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_ap_worker;
SELECT decision, status, left(reason, 30) AS reason FROM durable_ledger.begin_effect('ap-5', 'ap_refund', '{"order": 5, "amount": 1000}');
SELECT durable_ledger.release_run('ap-5');
RESET SESSION AUTHORIZATION;
-- a person who resolves that report settles the request: no verdict is taken after it
SELECT status, approval FROM durable_ledger.resolve_effect(:'k_wait', 'completed', '{"refund": "re_5"}', 'ops', 'the bank shows it');
SET SESSION AUTHORIZATION regress_ap_alice;
SELECT regress_sqlstate(format($$SELECT durable_ledger.approve_effect(%L, 'Alice')$$, :'k_wait'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.reject_effect(%L, 'Alice')$$, :'k_wait'));
RESET SESSION AUTHORIZATION;
SELECT status, result, error FROM durable_ledger.effects WHERE key = :'k_wait';
-- a call of a tool that needs no approval has none to give
SELECT regress_sqlstate(format($$SELECT durable_ledger.approve_effect(%L, 'Alice')$$,
       (SELECT key FROM durable_ledger.effects WHERE run = 'ap-1' AND args ->> 'amount' = '50')));

-- ===================================================================
-- key fields leave the amount out of the key: an approval of one amount
-- does not execute another
-- ===================================================================
SELECT tool FROM durable_ledger.register_tool('ap_pay', 'regress', key_fields => '{order}');
SELECT tool FROM durable_ledger.set_approval('ap_pay', 'strict $.amount > 100', 'ops');
SET SESSION AUTHORIZATION regress_ap_worker;
SELECT durable_ledger.acquire_run('ap-7');
SELECT key AS k_pay, decision, status FROM durable_ledger.begin_effect('ap-7', 'ap_pay', '{"order": 7, "amount": 150}') \gset
SELECT decision, status FROM durable_ledger.begin_effect('ap-7', 'ap_pay', '{"order": 70, "amount": 150}', business_key => 'AP-P70');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_ap_alice;
SELECT status FROM durable_ledger.approve_effect(:'k_pay', 'Alice', '150 is fine');
SELECT status FROM durable_ledger.approve_effect('AP-P70', 'Alice', '150 is fine');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_ap_worker;
SELECT durable_ledger.release_run('ap-7');
SELECT durable_ledger.acquire_run('ap-7');
SELECT key = :'k_pay' AS same_key, decision, status, reason FROM durable_ledger.begin_effect('ap-7', 'ap_pay', '{"order": 7, "amount": 99999}');
SELECT decision, status FROM durable_ledger.begin_effect('ap-7', 'ap_pay', '{"order": 70, "amount": 99999}', business_key => 'AP-P70');
SELECT durable_ledger.release_run('ap-7');
-- another run, the same business key and other args: paused too
SELECT durable_ledger.acquire_run('ap-8');
SELECT decision, status FROM durable_ledger.begin_effect('ap-8', 'ap_pay', '{"order": 70, "amount": 99999}', business_key => 'AP-P70');
-- the args approved execute, once
SELECT decision, status FROM durable_ledger.begin_effect('ap-8', 'ap_pay', '{"order": 70, "amount": 150}', business_key => 'AP-P70');
SELECT durable_ledger.release_run('ap-8');
SELECT durable_ledger.acquire_run('ap-7');
SELECT decision, status FROM durable_ledger.begin_effect('ap-7', 'ap_pay', '{"order": 7, "amount": 150}');
SELECT durable_ledger.release_run('ap-7');
RESET SESSION AUTHORIZATION;
SELECT args, status FROM durable_ledger.effects WHERE key IN (:'k_pay', 'AP-P70') ORDER BY key;

-- a next attempt asks with its own args, and records them (the attempt it
-- replaces keeps its own): a business key after a failure, a derived key
-- after retry_effect
SET SESSION AUTHORIZATION regress_ap_worker;
SELECT durable_ledger.acquire_run('ap-9');
SELECT decision, status FROM durable_ledger.begin_effect('ap-9', 'ap_pay', '{"order": 90, "amount": 50}', business_key => 'AP-P90');
SELECT status FROM durable_ledger.fail_effect('AP-P90', '{"bank": "declined"}', 1);
SELECT decision, status, attempt FROM durable_ledger.begin_effect('ap-9', 'ap_pay', '{"order": 90, "amount": 50000}', business_key => 'AP-P90');
SELECT key AS k_retry, decision FROM durable_ledger.begin_effect('ap-9', 'ap_pay', '{"order": 91, "amount": 50}') \gset
SELECT status FROM durable_ledger.fail_effect(:'k_retry', '{"bank": "declined"}', 1);
SELECT durable_ledger.release_run('ap-9');
RESET SESSION AUTHORIZATION;
SELECT status FROM durable_ledger.retry_effect(:'k_retry', 1, 'ops', 'the card was replaced');
SET SESSION AUTHORIZATION regress_ap_worker;
SELECT durable_ledger.acquire_run('ap-9');
SELECT decision, status, attempt FROM durable_ledger.begin_effect('ap-9', 'ap_pay', '{"order": 91, "amount": 90000}');
RESET SESSION AUTHORIZATION;
SELECT key = :'k_retry' AS retried, attempt, status, args FROM durable_ledger.unresolved WHERE run = 'ap-9' ORDER BY 1;
SELECT key = :'k_retry' AS retried, attempt, args FROM durable_ledger.past_attempts WHERE key IN ('AP-P90', :'k_retry') ORDER BY 1;
SELECT detail -> 'args' AS asked FROM durable_ledger.audit_log
 WHERE event = 'approval_requested' AND key IN ('AP-P90', :'k_retry') ORDER BY id;
SET SESSION AUTHORIZATION regress_ap_alice;
SELECT status, attempt FROM durable_ledger.approve_effect('AP-P90', 'Alice');
SELECT status, attempt FROM durable_ledger.approve_effect(:'k_retry', 'Alice');
RESET SESSION AUTHORIZATION;
SET SESSION AUTHORIZATION regress_ap_worker;
SELECT decision, status, attempt FROM durable_ledger.begin_effect('ap-9', 'ap_pay', '{"order": 90, "amount": 50000}', business_key => 'AP-P90');
SELECT decision, status, attempt FROM durable_ledger.begin_effect('ap-9', 'ap_pay', '{"order": 91, "amount": 90000}');
SELECT durable_ledger.release_run('ap-9');
RESET SESSION AUTHORIZATION;
-- history shows each attempt with the args it was called with
SELECT event, attempt, args FROM durable_ledger.history('ap-9')
 WHERE key = 'AP-P90' AND event IN ('intent', 'failed', 'approval_requested') ORDER BY id;

-- removing the condition: calls execute again without one; what waits still waits
SELECT tool, approval FROM durable_ledger.set_approval('ap_deploy', NULL, 'ops');
SET SESSION AUTHORIZATION regress_ap_worker;
SELECT durable_ledger.acquire_run('ap-6');
SELECT decision, status FROM durable_ledger.begin_effect('ap-6', 'ap_deploy', '{"target": "staging"}');
SELECT durable_ledger.release_run('ap-6');
RESET SESSION AUTHORIZATION;
SELECT status, count(*) FROM durable_ledger.effects WHERE tool = 'ap_deploy' GROUP BY 1 ORDER BY 1;

-- a row set to wait by hand, with no request recorded, takes no verdict
SELECT key AS k_hand FROM durable_ledger.effects WHERE run = 'ap-6' AND tool = 'ap_deploy' LIMIT 1 \gset
UPDATE durable_ledger.effects SET status = 'awaiting_approval', approval = NULL WHERE key = :'k_hand';
SET SESSION AUTHORIZATION regress_ap_alice;
SELECT regress_sqlstate(format($$SELECT durable_ledger.approve_effect(%L, 'Alice')$$, :'k_hand'));
RESET SESSION AUTHORIZATION;
SELECT status, approval, approver FROM durable_ledger.effects WHERE key = :'k_hand';

DROP OWNED BY regress_ap_worker, regress_ap_alice, regress_ap_both;
DROP ROLE regress_ap_worker;
DROP ROLE regress_ap_alice;
DROP ROLE regress_ap_both;
