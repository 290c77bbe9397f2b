-- index_plans: a backend learns a ledger table's indexes once
-- (src/index_plans.c), each transaction locks them at its first write of the
-- table, and every later write uses what was learned.  Whatever changes in a
-- transaction between two writes is seen by the next one, as the next INSERT
-- would see it: an index created,
-- rebuilt or dropped, one given back by a rolled back savepoint, a domain's
-- new constraint, an index expression's function replaced; a trigger that
-- writes the same table in the middle of a write.  (Another session cannot
-- change a table's indexes while a transaction that wrote it runs: its lock
-- waits for the transaction's end.  table_writes changes them between two
-- transactions.)  amcheck verifies every heap row is in every btree index of
-- the tables written.
\set VERBOSITY terse
CREATE EXTENSION amcheck;
CREATE FUNCTION regress_plans_intact() RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    index regclass;
BEGIN
    FOR index IN
        SELECT i.indexrelid::regclass
          FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam
         WHERE i.indrelid IN ('durable_ledger.effects'::regclass, 'durable_ledger.unsettled'::regclass,
                              'durable_ledger.audit_log'::regclass)
           AND a.amname = 'btree' AND i.indisready
    LOOP
        PERFORM bt_index_check(index, heapallindexed => true);
    END LOOP;
    RETURN true;
END $$;
-- this session's RowExclusiveLock on an index, which the writes rely on
CREATE FUNCTION regress_index_locked(index regclass) RETURNS boolean LANGUAGE sql AS $$
    SELECT EXISTS (SELECT FROM pg_locks WHERE pid = pg_backend_pid() AND relation = index
                                          AND mode = 'RowExclusiveLock' AND granted)
$$;

-- an index created between two writes of one transaction is written by the
-- next; rebuilt, then dropped, it is no longer in the way
BEGIN;
SELECT key AS k1 FROM durable_ledger.begin_effect('plans-1', 'pay', '{"n": 1}') \gset
CREATE INDEX effects_plans_n_idx ON durable_ledger.effects ((args ->> 'n')) WHERE tool = 'pay';
SELECT key AS k2 FROM durable_ledger.begin_effect('plans-1', 'pay', '{"n": 2}') \gset
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off;
SELECT key = :'k2' AS found_by_the_new_index
  FROM durable_ledger.effects WHERE args ->> 'n' = '2' AND tool = 'pay' AND run = 'plans-1';
RESET enable_seqscan;
RESET enable_bitmapscan;
REINDEX TABLE durable_ledger.effects;
SELECT status FROM durable_ledger.complete_effect(:'k1', '{"paid": 1}');
DROP INDEX durable_ledger.effects_plans_n_idx;
SELECT status FROM durable_ledger.complete_effect(:'k2', '{"paid": 2}');
SELECT regress_plans_intact();
COMMIT;
SELECT count(*) AS completed FROM durable_ledger.effects WHERE run = 'plans-1' AND status = 'completed';

-- the next transaction locks the indexes again at its first write, as
-- ExecOpenIndices would
BEGIN;
SELECT regress_index_locked('durable_ledger.effects_tool_run_idx') AS locked_before_a_write;
SELECT decision FROM durable_ledger.begin_effect('plans-0', 'pay', '{"n": 1}');
SELECT regress_index_locked('durable_ledger.effects_tool_run_idx') AS locked_by_the_write;
COMMIT;

-- a savepoint rolled back gives back the index created in it, and the locks
-- its writes took: the next write neither opens the index nor goes without
-- the locks
BEGIN;
SAVEPOINT s;
CREATE INDEX audit_plans_note_idx ON durable_ledger.audit_log ((detail ->> 'note'));
SELECT decision FROM durable_ledger.begin_effect('plans-2', 'pay', '{"n": 1}');
SELECT regress_index_locked('durable_ledger.audit_log_pkey') AS locked_in_the_savepoint;
ROLLBACK TO SAVEPOINT s;
SELECT regress_index_locked('durable_ledger.audit_log_pkey') AS locked_after_its_rollback;
SELECT decision FROM durable_ledger.begin_effect('plans-2', 'pay', '{"n": 2}');
SELECT regress_index_locked('durable_ledger.audit_log_pkey') AS locked_again;
-- a savepoint released keeps them: the write after it needs nothing again
SAVEPOINT t;
SELECT decision FROM durable_ledger.begin_effect('plans-3', 'pay', '{"n": 1}');
RELEASE SAVEPOINT t;
SELECT decision FROM durable_ledger.begin_effect('plans-3', 'pay', '{"n": 2}');
SELECT regress_index_locked('durable_ledger.unsettled_pkey') AS still_locked;
SELECT regress_plans_intact();
COMMIT;
SELECT run, count(*) FROM durable_ledger.effects WHERE run IN ('plans-2', 'plans-3') GROUP BY run ORDER BY run;

-- an index expression's function replaced in the transaction: the next write
-- computes the entry with the new one, as the next INSERT would.  (A SQL
-- function with a SET clause is called, not inlined into the expression the
-- relcache keeps; its compiled body is the caller's for the transaction, so a
-- compiled expression kept from the first write would still write 'old-2'.)
CREATE FUNCTION public.regress_plans_tag(jsonb) RETURNS text IMMUTABLE LANGUAGE sql
    SET search_path = pg_catalog AS $$ SELECT 'old-' || ($1 ->> 'n') $$;
CREATE INDEX effects_plans_tag_idx ON durable_ledger.effects (public.regress_plans_tag(args));
BEGIN;
SELECT decision FROM durable_ledger.begin_effect('plans-4', 'pay', '{"n": 1}');
CREATE OR REPLACE FUNCTION public.regress_plans_tag(jsonb) RETURNS text IMMUTABLE LANGUAGE sql
    SET search_path = pg_catalog AS $$ SELECT 'new-' || ($1 ->> 'n') $$;
SELECT decision FROM durable_ledger.begin_effect('plans-4', 'pay', '{"n": 2}');
SET LOCAL enable_seqscan = off;
SET LOCAL enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT args ->> 'n' FROM durable_ledger.effects WHERE public.regress_plans_tag(args) = 'new-2';
SELECT args ->> 'n' AS n FROM durable_ledger.effects WHERE public.regress_plans_tag(args) = 'new-2';
COMMIT;
DROP INDEX durable_ledger.effects_plans_tag_idx;
DROP FUNCTION public.regress_plans_tag(jsonb);

-- a domain constraint added in the transaction is checked by the next write
-- of an index expression cast to the domain (the write fails, 23514)
CREATE DOMAIN public.regress_plans_n AS int CHECK (VALUE > -100);
CREATE INDEX effects_plans_dn_idx ON durable_ledger.effects (((args ->> 'dn')::public.regress_plans_n));
BEGIN;
SELECT decision FROM durable_ledger.begin_effect('plans-5', 'pay', '{"dn": 1}');
ALTER DOMAIN public.regress_plans_n ADD CONSTRAINT regress_plans_positive CHECK (VALUE > 0);
SAVEPOINT s;
SELECT decision FROM durable_ledger.begin_effect('plans-5', 'pay', '{"dn": -5}');
ROLLBACK TO SAVEPOINT s;
SELECT decision FROM durable_ledger.begin_effect('plans-5', 'pay', '{"dn": 3}');
COMMIT;
SELECT array_agg(args ->> 'dn' ORDER BY args ->> 'dn') AS written FROM durable_ledger.effects WHERE run = 'plans-5';
DROP INDEX durable_ledger.effects_plans_dn_idx;
DROP DOMAIN public.regress_plans_n;

-- a trigger that writes the same table in the middle of a write: the ledger
-- writes an effect (and its audit row) of another run from a BEFORE trigger
-- of the first effect's insert, in a savepoint it rolls back once and in one
-- it keeps; both writes leave their rows in every index
CREATE FUNCTION public.regress_plans_nested() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.run = 'plans-6' THEN
        BEGIN
            PERFORM durable_ledger.begin_effect('plans-6-nested', 'pay', '{"n": 0}');
            RAISE EXCEPTION 'regress: undone';
        EXCEPTION WHEN raise_exception THEN NULL;
        END;
        PERFORM durable_ledger.begin_effect('plans-6-nested', 'pay', jsonb_build_object('n', NEW.args -> 'n'));
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER regress_plans_nested BEFORE INSERT ON durable_ledger.effects
    FOR EACH ROW EXECUTE FUNCTION public.regress_plans_nested();
BEGIN;
SELECT decision FROM durable_ledger.begin_effect('plans-6', 'pay', '{"n": 1}');
SELECT decision FROM durable_ledger.begin_effect('plans-6', 'pay', '{"n": 2}');
SELECT regress_plans_intact();
COMMIT;
DROP TRIGGER regress_plans_nested ON durable_ledger.effects;
DROP FUNCTION public.regress_plans_nested();
SELECT run, array_agg(args ->> 'n' ORDER BY args ->> 'n') FROM durable_ledger.effects
 WHERE run IN ('plans-6', 'plans-6-nested') GROUP BY run ORDER BY run;

SELECT durable_ledger.release_run(run) FROM durable_ledger.runs WHERE run LIKE 'plans-%' ORDER BY run;
DROP FUNCTION regress_plans_intact();
DROP FUNCTION regress_index_locked(regclass);
DROP EXTENSION amcheck;
