-- privileges: PUBLIC gets nothing; durable_ledger_worker may begin, complete, fail, ask
-- status, keys and canonical args, acquire and release, and nothing else (no resolve, no
-- break_lease, no direct table access); durable_ledger_auditor may only read the tables
-- and views; durable_ledger_admin is worker + auditor + resolve_effect + break_lease.
\set VERBOSITY default

CREATE ROLE regress_priv_nobody LOGIN;
CREATE ROLE regress_priv_worker LOGIN;
CREATE ROLE regress_priv_auditor LOGIN;
CREATE ROLE regress_priv_admin LOGIN;
GRANT durable_ledger_worker TO regress_priv_worker;
GRANT durable_ledger_auditor TO regress_priv_auditor;
GRANT durable_ledger_admin TO regress_priv_admin;

-- Runs a statement as the current role; returns 'ok' or the SQLSTATE of its error.
CREATE FUNCTION public.regress_priv_try(stmt text) RETURNS text
LANGUAGE plpgsql AS $fn$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE;
END
$fn$;

-- The privilege matrix, as the catalogs see it.
SELECT p.oid::regprocedure AS function,
       has_function_privilege('regress_priv_nobody', p.oid, 'EXECUTE') AS nobody,
       has_function_privilege('regress_priv_worker', p.oid, 'EXECUTE') AS worker,
       has_function_privilege('regress_priv_auditor', p.oid, 'EXECUTE') AS auditor,
       has_function_privilege('regress_priv_admin', p.oid, 'EXECUTE') AS admin
  FROM pg_proc p
 WHERE p.pronamespace = 'durable_ledger'::regnamespace
 ORDER BY p.proname;
SELECT c.relname, priv,
       has_table_privilege('regress_priv_nobody', c.oid, priv) AS nobody,
       has_table_privilege('regress_priv_worker', c.oid, priv) AS worker,
       has_table_privilege('regress_priv_auditor', c.oid, priv) AS auditor,
       has_table_privilege('regress_priv_admin', c.oid, priv) AS admin
  FROM pg_class c
 CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE']) AS priv
 WHERE c.relnamespace = 'durable_ledger'::regnamespace AND c.relkind IN ('r', 'v')
 ORDER BY c.relname, array_position(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE'], priv);
SELECT r AS role, has_schema_privilege(r, 'durable_ledger', 'USAGE') AS schema_usage,
       has_sequence_privilege(r, 'durable_ledger.audit_log_id_seq', 'USAGE') AS seq_usage,
       has_sequence_privilege(r, 'durable_ledger.audit_log_id_seq', 'UPDATE') AS seq_update
  FROM unnest(ARRAY['regress_priv_nobody', 'regress_priv_worker', 'regress_priv_auditor', 'regress_priv_admin']) AS r
 ORDER BY r;

-- ==== a role without grants: can call nothing, read nothing ====
SET ROLE regress_priv_nobody;
SELECT n, stmt, public.regress_priv_try(stmt) AS outcome
  FROM (VALUES
        (1, $$SELECT durable_ledger.begin_effect('priv-0', 'pay', '{}')$$),
        (2, $$SELECT durable_ledger.complete_effect('k', '{}')$$),
        (3, $$SELECT durable_ledger.fail_effect('k', '{}')$$),
        (4, $$SELECT durable_ledger.resolve_effect('k', 'failed', NULL, 'me')$$),
        (5, $$SELECT * FROM durable_ledger.effect_status('k')$$),
        (6, $$SELECT durable_ledger.effect_key('priv-0', 'pay', '{}', 1)$$),
        (7, $$SELECT durable_ledger.canonical_args('{}')$$),
        (8, $$SELECT durable_ledger.acquire_run('priv-0')$$),
        (9, $$SELECT durable_ledger.release_run('priv-0')$$),
        (10, $$SELECT durable_ledger.break_lease('priv-0', 'me')$$),
        (11, $$SELECT count(*) FROM durable_ledger.effects$$),
        (12, $$SELECT count(*) FROM durable_ledger.runs$$),
        (13, $$SELECT count(*) FROM durable_ledger.audit_log$$),
        (14, $$SELECT count(*) FROM durable_ledger.leases$$),
        (15, $$SELECT count(*) FROM durable_ledger.unresolved$$),
        (16, $$DELETE FROM durable_ledger.effects$$),
        (17, $$SELECT NULL::durable_ledger.decision$$)
       ) AS t(n, stmt)
 ORDER BY n;
RESET ROLE;
-- even with USAGE on the schema, the functions and tables themselves are not granted to PUBLIC
GRANT USAGE ON SCHEMA durable_ledger TO regress_priv_nobody;
SET ROLE regress_priv_nobody;
SELECT durable_ledger.canonical_args('{}');
SELECT durable_ledger.effect_key('priv-0', 'pay', '{}', 1);
SELECT durable_ledger.begin_effect('priv-0', 'pay', '{}');
SELECT durable_ledger.acquire_run('priv-0');
SELECT count(*) FROM durable_ledger.effects;
SELECT count(*) FROM durable_ledger.audit_log;
SELECT count(*) FROM durable_ledger.leases;
RESET ROLE;
REVOKE USAGE ON SCHEMA durable_ledger FROM regress_priv_nobody;
SELECT count(*) AS priv_0_rows FROM durable_ledger.runs WHERE run = 'priv-0';

-- ==== a worker: the ledger functions, nothing more ====
SET ROLE regress_priv_worker;
SELECT durable_ledger.acquire_run('priv-1') AS acquired;
SELECT key AS k1, decision, occurrence FROM durable_ledger.begin_effect('priv-1', 'pay', '{"amount": 1}') \gset
SELECT :'k1' = durable_ledger.effect_key('priv-1', 'pay', '{"amount": 1}', 1) AS effect_key_ok,
       durable_ledger.canonical_args('{"amount": 1.0}') AS canonical;
SELECT status, result FROM durable_ledger.complete_effect(:'k1', '{"id": "ch_1"}');
SELECT key AS k2 FROM durable_ledger.begin_effect('priv-1', 'mail', '{}') \gset
SELECT status, error FROM durable_ledger.fail_effect(:'k2', '{"code": 550}');
SELECT key AS k3 FROM durable_ledger.begin_effect('priv-1', 'sms', '{}') \gset
SELECT key = :'k1' AS same_key, status, result FROM durable_ledger.effect_status(:'k1');
SELECT status FROM durable_ledger.effect_status(:'k3');
-- no resolve, no break_lease
SELECT durable_ledger.resolve_effect(:'k3', 'failed', NULL, 'regress_priv_worker');
SELECT durable_ledger.break_lease('priv-1', 'regress_priv_worker');
-- no direct access to the tables or views, neither reading nor writing
SELECT n, stmt, public.regress_priv_try(stmt) AS outcome
  FROM (VALUES
        (1, $$SELECT count(*) FROM durable_ledger.effects$$),
        (2, $$SELECT count(*) FROM durable_ledger.runs$$),
        (3, $$SELECT count(*) FROM durable_ledger.audit_log$$),
        (4, $$SELECT count(*) FROM durable_ledger.leases$$),
        (5, $$SELECT count(*) FROM durable_ledger.unresolved$$),
        (6, $$INSERT INTO durable_ledger.effects (key, status) VALUES ('x', 'completed')$$),
        (7, $$UPDATE durable_ledger.effects SET status = 'completed' WHERE run = 'priv-1'$$),
        (8, $$DELETE FROM durable_ledger.effects WHERE run = 'priv-1'$$),
        (9, $$TRUNCATE durable_ledger.effects$$),
        (10, $$UPDATE durable_ledger.runs SET epochs = 1 WHERE run = 'priv-1'$$),
        (11, $$DELETE FROM durable_ledger.runs WHERE run = 'priv-1'$$),
        (12, $$INSERT INTO durable_ledger.audit_log (event) VALUES ('intent')$$),
        (13, $$SELECT nextval('durable_ledger.audit_log_id_seq')$$),
        (14, $$SELECT * FROM durable_ledger.resolve_effect('x', 'failed', NULL, 'me')$$),
        (15, $$SELECT durable_ledger.break_lease('priv-1', 'me')$$)
       ) AS t(n, stmt)
 ORDER BY n;
RESET ROLE;
-- nothing of that reached the ledger: the sms effect is still started, the pay one completed
SELECT tool, status, resolved_by FROM durable_ledger.effects WHERE run = 'priv-1' ORDER BY tool;
SELECT event, count(*) FROM durable_ledger.audit_log WHERE run = 'priv-1' GROUP BY event ORDER BY event;

-- ==== an auditor: reads everything, calls nothing, writes nothing ====
SET ROLE regress_priv_auditor;
SELECT tool, status, result, error FROM durable_ledger.effects WHERE run = 'priv-1' ORDER BY tool;
SELECT run, epochs, holder_pid = pg_backend_pid() AS holder_is_worker_session, holder_role
  FROM durable_ledger.runs WHERE run = 'priv-1';
SELECT event, role_name, count(*) FROM durable_ledger.audit_log WHERE run = 'priv-1'
 GROUP BY event, role_name ORDER BY event;
SELECT run, holder_pid = pg_backend_pid() AS holder_is_worker_session, lease_epoch, holder_role,
       application_name = current_setting('application_name') AS application_name_ok
  FROM durable_ledger.leases WHERE run = 'priv-1';
SELECT count(*) AS unresolved_priv_1 FROM durable_ledger.unresolved WHERE run = 'priv-1';
SELECT n, stmt, public.regress_priv_try(stmt) AS outcome
  FROM (VALUES
        (1, $$SELECT durable_ledger.begin_effect('priv-1', 'pay', '{}')$$),
        (2, $$SELECT durable_ledger.complete_effect('x', '{}')$$),
        (3, $$SELECT durable_ledger.fail_effect('x', '{}')$$),
        (4, $$SELECT durable_ledger.resolve_effect('x', 'failed', NULL, 'me')$$),
        (5, $$SELECT durable_ledger.acquire_run('priv-a')$$),
        (6, $$SELECT durable_ledger.release_run('priv-1')$$),
        (7, $$SELECT durable_ledger.break_lease('priv-1', 'me')$$),
        (8, $$SELECT * FROM durable_ledger.effect_status('x')$$),
        (9, $$INSERT INTO durable_ledger.effects (key, status) VALUES ('x', 'completed')$$),
        (10, $$UPDATE durable_ledger.effects SET status = 'failed' WHERE run = 'priv-1'$$),
        (11, $$DELETE FROM durable_ledger.effects WHERE run = 'priv-1'$$),
        (12, $$TRUNCATE durable_ledger.runs$$),
        (13, $$UPDATE durable_ledger.runs SET epochs = 9 WHERE run = 'priv-1'$$),
        (14, $$DELETE FROM durable_ledger.audit_log WHERE run = 'priv-1'$$),
        (15, $$INSERT INTO durable_ledger.audit_log (event) VALUES ('intent')$$)
       ) AS t(n, stmt)
 ORDER BY n;
RESET ROLE;

-- the worker ends its attempt: the sms effect's outcome is now unknown
SET ROLE regress_priv_worker;
SELECT durable_ledger.release_run('priv-1') AS released;
SELECT status FROM durable_ledger.effect_status(:'k3');
RESET ROLE;

-- ==== an admin: resolves and breaks leases, and is worker and auditor too ====
SET ROLE regress_priv_admin;
SELECT count(*) AS unresolved_priv_1 FROM durable_ledger.unresolved WHERE run = 'priv-1';
SELECT status, error, resolved_by, resolution_note
  FROM durable_ledger.resolve_effect(:'k3', 'failed', '{"checked": "no sms sent"}', 'regress_priv_admin', 'provider log');
SELECT count(*) AS unresolved_priv_1 FROM durable_ledger.unresolved WHERE run = 'priv-1';
SELECT durable_ledger.break_lease('priv-nobody-holds-this', 'regress_priv_admin') AS broken;
SELECT durable_ledger.break_lease('priv-nobody-holds-this', 'regress_priv_admin', 'a note') AS broken;
SELECT decision, status FROM durable_ledger.begin_effect('priv-2', 'pay', '{}');
SELECT tool, status FROM durable_ledger.effects WHERE run = 'priv-2';
SELECT durable_ledger.release_run('priv-2') AS released;
RESET ROLE;
SELECT event, role_name, detail->>'resolved_by' AS resolved_by
  FROM durable_ledger.audit_log WHERE run = 'priv-1' AND event = 'resolved';
-- break_lease on a run nobody holds writes nothing
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log WHERE run = 'priv-nobody-holds-this';

-- ==== clean up ====
SELECT count(*) AS leases_left FROM durable_ledger.leases WHERE run LIKE 'priv-%';
DROP FUNCTION public.regress_priv_try(text);
DROP OWNED BY regress_priv_nobody, regress_priv_worker, regress_priv_auditor, regress_priv_admin;
DROP ROLE regress_priv_nobody, regress_priv_worker, regress_priv_auditor, regress_priv_admin;
SELECT count(*) AS regress_priv_roles FROM pg_roles WHERE rolname LIKE 'regress_priv%';
