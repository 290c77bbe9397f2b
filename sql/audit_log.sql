-- audit_log: every ledger event is logged, in order, with run, key, event, detail, the
-- calling role as after SET ROLE, the session user, the backend pid and the lease epoch;
-- UPDATE, DELETE, TRUNCATE (and MERGE) on the log are refused (42501), for its owner too.
\set VERBOSITY default

CREATE ROLE regress_audit_worker NOLOGIN;
GRANT durable_ledger_worker TO regress_audit_worker;
CREATE ROLE regress_audit_admin NOLOGIN;
GRANT durable_ledger_admin TO regress_audit_admin;


SET ROLE regress_audit_worker;
SELECT current_user, session_user = current_user AS is_session_user;

-- epoch 1: three calls, one completed, one failed, one left started
SELECT durable_ledger.acquire_run('audit-1') AS acquired;
SELECT key AS k_pay, decision FROM durable_ledger.begin_effect('audit-1', 'pay', '{"amount": 5}') \gset
SELECT status, result FROM durable_ledger.complete_effect(:'k_pay', '{"ok": true}');
-- the same completion again: no change, no event
SELECT status, result FROM durable_ledger.complete_effect(:'k_pay', '{"ok": true}');
SELECT key AS k_mail FROM durable_ledger.begin_effect('audit-1', 'mail', '{"to": "x"}') \gset
SELECT status, error FROM durable_ledger.fail_effect(:'k_mail', '{"code": 550}');
SELECT key AS k_sms FROM durable_ledger.begin_effect('audit-1', 'sms', '{"to": "y"}') \gset
SELECT durable_ledger.release_run('audit-1') AS released;

-- epoch 2: the same three calls are answered from the record
SELECT durable_ledger.acquire_run('audit-1') AS acquired;
SELECT decision, status, result, error FROM durable_ledger.begin_effect('audit-1', 'pay', '{"amount": 5}');
SELECT decision, status, result, error FROM durable_ledger.begin_effect('audit-1', 'mail', '{"to": "x"}');
SELECT decision, status FROM durable_ledger.begin_effect('audit-1', 'sms', '{"to": "y"}');
-- a report for the unknown effect arrives late
SELECT status, result FROM durable_ledger.complete_effect(:'k_sms', '{"sent": 1}');
-- reports that contradict the record: kept as conflicts, WARNING, nothing applied
SELECT status, result, conflict FROM durable_ledger.complete_effect(:'k_pay', '{"ok": false}');
SELECT status, error, conflict FROM durable_ledger.fail_effect(:'k_sms', '{"code": "never sent"}');
SELECT durable_ledger.release_run('audit-1') AS released;

-- a business key in flight under a live lease of another run: in_progress
SELECT key AS k_bk, decision FROM durable_ledger.begin_effect('audit-2', 'invoice', '{"n": 7}', business_key => 'audit-inv-7') \gset
SELECT decision, status FROM durable_ledger.begin_effect('audit-3', 'invoice', '{"n": 7}', business_key => 'audit-inv-7');
-- its lease ends; a late failure report comes in after that
SELECT durable_ledger.release_run('audit-2') AS released, durable_ledger.release_run('audit-3') AS released;
SELECT status, error FROM durable_ledger.fail_effect(:'k_bk', '{"code": "declined"}');
RESET ROLE;

-- an admin (after SET ROLE) resolves the conflict
SET ROLE regress_audit_admin;
SELECT status, result, conflict, resolved_by, resolution_note
  FROM durable_ledger.resolve_effect(:'k_pay', 'completed', '{"ok": true}', 'regress-reviewer', 'PSP shows one charge');
RESET ROLE;

-- The whole log of these runs, in order.
SELECT row_number() OVER (ORDER BY a.id) AS seq, a.run,
       CASE a.key WHEN :'k_pay' THEN 'k_pay' WHEN :'k_mail' THEN 'k_mail' WHEN :'k_sms' THEN 'k_sms'
                  ELSE a.key END AS key,
       a.event, a.lease_epoch, a.role_name, a.detail
  FROM durable_ledger.audit_log a
 WHERE a.run IN ('audit-1', 'audit-2', 'audit-3')
 ORDER BY a.id;

-- who and where: session user, backend pid, application name, client address of this session
SELECT count(*) AS events,
       count(*) FILTER (WHERE session_user_name = session_user) AS session_user_ok,
       count(*) FILTER (WHERE backend_pid = pg_backend_pid()) AS backend_pid_ok,
       count(*) FILTER (WHERE application_name = current_setting('application_name')) AS application_name_ok,
       count(*) FILTER (WHERE client_addr IS NOT DISTINCT FROM inet_client_addr()) AS client_addr_ok,
       count(*) FILTER (WHERE logged_at IS NOT NULL) AS logged_at_set
  FROM durable_ledger.audit_log
 WHERE run IN ('audit-1', 'audit-2', 'audit-3');
-- the role is the one after SET ROLE, never the session user or the function owner
SELECT role_name, count(*) AS events
  FROM durable_ledger.audit_log
 WHERE run IN ('audit-1', 'audit-2', 'audit-3')
 GROUP BY role_name
 ORDER BY role_name;
-- the log agrees with the effects table
SELECT CASE key WHEN :'k_pay' THEN 'k_pay' WHEN :'k_mail' THEN 'k_mail' WHEN :'k_sms' THEN 'k_sms'
                ELSE key END AS key,
       status, result, error, conflict, resolved_by
  FROM durable_ledger.effects
 WHERE run IN ('audit-1', 'audit-2', 'audit-3')
 ORDER BY 1;

-- Append-only, for the owner too (the test runs as the superuser who owns the table).
SELECT pg_get_userbyid(relowner) = current_user AS i_am_owner,
       (SELECT rolsuper FROM pg_roles WHERE rolname = current_user) AS i_am_superuser
  FROM pg_class WHERE oid = 'durable_ledger.audit_log'::regclass;
SELECT count(*) AS rows_before, md5(string_agg(a::text, ',' ORDER BY id)) AS content_before
  FROM durable_ledger.audit_log a \gset
UPDATE durable_ledger.audit_log SET event = 'completed' WHERE run = 'audit-1' AND event = 'conflict';
UPDATE durable_ledger.audit_log SET detail = NULL;
UPDATE durable_ledger.audit_log SET detail = NULL WHERE false;
DELETE FROM durable_ledger.audit_log WHERE run = 'audit-1';
DELETE FROM durable_ledger.audit_log;
TRUNCATE durable_ledger.audit_log;
TRUNCATE durable_ledger.audit_log CASCADE;
MERGE INTO durable_ledger.audit_log a USING (SELECT 1) s ON a.run = 'audit-1'
  WHEN MATCHED THEN DELETE;
-- in a transaction and a savepoint as well
BEGIN;
SAVEPOINT s;
DELETE FROM durable_ledger.audit_log WHERE run = 'audit-2';
ROLLBACK TO SAVEPOINT s;
UPDATE durable_ledger.audit_log SET role_name = 'someone else' WHERE run = 'audit-2';
COMMIT;
-- the error names the rule
\set VERBOSITY default
DELETE FROM durable_ledger.audit_log WHERE run = 'audit-1';
\set VERBOSITY default
-- the same as a role that is only an admin
SET ROLE regress_audit_admin;
DELETE FROM durable_ledger.audit_log WHERE run = 'audit-1';
UPDATE durable_ledger.audit_log SET detail = NULL WHERE run = 'audit-1';
TRUNCATE durable_ledger.audit_log;
RESET ROLE;
-- every row is still there, unchanged
SELECT count(*) = :rows_before AS same_count,
       md5(string_agg(a::text, ',' ORDER BY id)) = :'content_before' AS same_content
  FROM durable_ledger.audit_log a;
SELECT count(*) AS audit_1_events FROM durable_ledger.audit_log WHERE run = 'audit-1';

-- clean up (the effects stay: the ledger keeps its records)
DROP ROLE regress_audit_worker;
DROP ROLE regress_audit_admin;

