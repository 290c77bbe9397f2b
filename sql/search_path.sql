-- search_path: the SECURITY DEFINER functions are immune to a hostile
-- search_path.  A schema that shadows pg_catalog functions and operators,
-- placed first in the caller's search_path, changes nothing: same keys, same
-- decisions, same rows, same audit columns.
CREATE ROLE regress_sp_worker LOGIN;
GRANT durable_ledger_worker, durable_ledger_auditor TO regress_sp_worker;
CREATE SCHEMA regress_evil;
GRANT USAGE, CREATE ON SCHEMA regress_evil TO PUBLIC;
-- impostors for functions the extension's SQL calls, and for text equality
CREATE FUNCTION regress_evil.clock_timestamp() RETURNS timestamptz
    LANGUAGE sql AS $$ SELECT timestamptz '1999-01-01 00:00+00' $$;
CREATE FUNCTION regress_evil.pg_backend_pid() RETURNS integer
    LANGUAGE sql AS $$ SELECT 42 $$;
CREATE FUNCTION regress_evil.current_setting(text) RETURNS text
    LANGUAGE sql AS $$ SELECT 'evil' $$;
CREATE FUNCTION regress_evil.nextval(regclass) RETURNS bigint
    LANGUAGE sql AS $$ SELECT 1::bigint $$;
CREATE FUNCTION regress_evil.texteq_always(text, text) RETURNS boolean
    LANGUAGE sql AS $$ SELECT true $$;
CREATE OPERATOR regress_evil.= (LEFTARG = text, RIGHTARG = text,
                                FUNCTION = regress_evil.texteq_always);
CREATE FUNCTION regress_evil.int8pl_evil(bigint, integer) RETURNS bigint
    LANGUAGE sql AS $$ SELECT 1000::bigint $$;
CREATE OPERATOR regress_evil.+ (LEFTARG = bigint, RIGHTARG = integer,
                                FUNCTION = regress_evil.int8pl_evil);
-- a temporary table that shadows a ledger table's name
CREATE TEMP TABLE effects (key text);

SET ROLE regress_sp_worker;
SET search_path = regress_evil, pg_catalog, pg_temp, public;
-- the impostors really are in force for the caller
SELECT 'a' = 'b' AS evil_equality, pg_backend_pid() = 42 AS evil_pid;

SELECT left(key, 12) AS key, decision, occurrence
  FROM durable_ledger.begin_effect('sp-run', 'pay', '{"invoice": 1}');
SELECT left(key, 12) AS key, decision, occurrence
  FROM durable_ledger.begin_effect('sp-run', 'pay', '{"invoice": 2}');
SELECT status FROM durable_ledger.complete_effect(
    durable_ledger.effect_key('sp-run', 'pay', '{"invoice": 1}', 1), '{"ok": true}');
SELECT durable_ledger.release_run('sp-run');
SELECT durable_ledger.acquire_run('sp-run');
-- a new epoch (2, not 1000): replay and pause as always
SELECT decision, status, occurrence
  FROM durable_ledger.begin_effect('sp-run', 'pay', '{"invoice": 1}');
SELECT decision, status, occurrence
  FROM durable_ledger.begin_effect('sp-run', 'pay', '{"invoice": 2}');
SELECT durable_ledger.release_run('sp-run');
RESET search_path;
RESET ROLE;

-- the rows carry real values, not the impostors'
SELECT run, epochs, holder_pid = 42 AS evil_pid, acquired_at < '2000-01-01' AS evil_time,
       holder_application_name = 'evil' AS evil_setting
  FROM durable_ledger.runs WHERE run = 'sp-run';
SELECT event, lease_epoch, backend_pid = 42 AS evil_pid, logged_at < '2000-01-01' AS evil_time,
       application_name = 'evil' AS evil_setting, role_name
  FROM durable_ledger.audit_log WHERE run = 'sp-run' ORDER BY id;
SELECT count(DISTINCT id) = count(*) AS audit_ids_distinct
  FROM durable_ledger.audit_log WHERE run = 'sp-run';
SELECT count(*) AS temp_table_rows FROM pg_temp.effects;

DROP TABLE pg_temp.effects;
DROP SCHEMA regress_evil CASCADE;
DROP ROLE regress_sp_worker;
