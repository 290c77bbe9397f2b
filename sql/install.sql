-- install: the extension creates exactly the v1 interface, in its own schema,
-- with its group roles, and grants nothing to PUBLIC.
CREATE EXTENSION durable_ledger;

SELECT extname, extversion, extrelocatable, nspname
  FROM pg_extension e JOIN pg_namespace n ON n.oid = e.extnamespace
 WHERE extname = 'durable_ledger';

-- every member object, by kind
SELECT pg_describe_object(classid, objid, objsubid) AS member
  FROM pg_depend
 WHERE refclassid = 'pg_extension'::regclass
   AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'durable_ledger')
   AND deptype = 'e'
 ORDER BY 1;

-- the functions, with their exact signatures and defaults
SELECT p.proname, pg_get_function_arguments(p.oid) AS arguments,
       pg_get_function_result(p.oid) AS result, p.provolatile, p.prosecdef, p.proisstrict,
       p.proconfig
  FROM pg_proc p
 WHERE p.pronamespace = 'durable_ledger'::regnamespace
 ORDER BY p.proname;

-- the decision type
SELECT attnum, attname, format_type(atttypid, atttypmod)
  FROM pg_attribute
 WHERE attrelid = 'durable_ledger.decision'::regclass AND attnum > 0
 ORDER BY attnum;

-- the group roles exist and cannot log in; admin is worker + auditor
SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'durable_ledger_%' ORDER BY 1;
SELECT pg_has_role('durable_ledger_admin', 'durable_ledger_worker', 'MEMBER') AS admin_is_worker,
       pg_has_role('durable_ledger_admin', 'durable_ledger_auditor', 'MEMBER') AS admin_is_auditor,
       pg_has_role('durable_ledger_worker', 'durable_ledger_auditor', 'MEMBER') AS worker_is_auditor;

-- nothing for PUBLIC: no function, table, view, sequence or schema privilege
SELECT p.proname
  FROM pg_proc p
 WHERE p.pronamespace = 'durable_ledger'::regnamespace
   AND has_function_privilege('public', p.oid, 'EXECUTE');
SELECT c.relname
  FROM pg_class c
 WHERE c.relnamespace = 'durable_ledger'::regnamespace
   AND c.relkind IN ('r', 'v', 'S')
   AND (c.relacl IS NULL OR EXISTS (SELECT 1 FROM aclexplode(c.relacl) a WHERE a.grantee = 0));
SELECT has_type_privilege('public', 'durable_ledger.decision', 'USAGE') AS public_decision_usage;
SELECT has_schema_privilege('public', 'durable_ledger', 'USAGE') AS public_schema_usage;

-- every table, view and column says what it holds (COMMENT ON): a person
-- answering "why was this paid?" with \d+ reads it there; none lacks one
SELECT c.relname AS uncommented
  FROM pg_class c
 WHERE c.relnamespace = 'durable_ledger'::regnamespace
   AND c.relkind IN ('r', 'v')
   AND obj_description(c.oid, 'pg_class') IS NULL;
SELECT c.relname, a.attname AS uncommented_column
  FROM pg_class c JOIN pg_attribute a ON a.attrelid = c.oid
 WHERE c.relnamespace = 'durable_ledger'::regnamespace
   AND c.relkind IN ('r', 'v')
   AND a.attnum > 0 AND NOT a.attisdropped
   AND col_description(c.oid, a.attnum) IS NULL;
SELECT p.proname AS uncommented_function
  FROM pg_proc p
 WHERE p.pronamespace = 'durable_ledger'::regnamespace
   AND obj_description(p.oid, 'pg_proc') IS NULL
 ORDER BY 1;

-- the ledger tables are dumped by pg_dump
SELECT unnest(extconfig)::regclass AS dumped
  FROM pg_extension WHERE extname = 'durable_ledger' ORDER BY 1;

-- a helper for the other files: runs a statement, answers 'ok' or its SQLSTATE
-- and message (an error in a DO block or a function call would stop the file)
CREATE FUNCTION regress_try(stmt text) RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    EXECUTE stmt;
    RETURN 'ok';
EXCEPTION WHEN OTHERS THEN
    RETURN SQLSTATE || ': ' || SQLERRM;
END
$$;

-- the same, answering 'no error' (the later files' expected output says so)
CREATE FUNCTION regress_sqlstate(stmt text) RETURNS text LANGUAGE plpgsql AS $$
DECLARE st text; msg text;
BEGIN
    EXECUTE stmt;
    RETURN 'no error';
EXCEPTION WHEN OTHERS THEN
    GET STACKED DIAGNOSTICS st = RETURNED_SQLSTATE, msg = MESSAGE_TEXT;
    RETURN st || ': ' || msg;
END $$;
