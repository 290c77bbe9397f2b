-- table_writes: the ledger's writes (src/rows.c, through the executor's
-- single-row helpers) leave every row in every index, as SQL would (amcheck
-- verifies every heap row is in every btree index), and whatever an
-- administrator adds to a ledger table takes part: row triggers fire, CHECK
-- and NOT NULL constraints hold, domains are checked, any index kind is kept,
-- a column the ledger does not know gets its default, a publication's replica
-- identity rule holds; at every isolation level, and in a read-only
-- transaction nothing.  A BEFORE trigger that skips the ledger's row fails
-- the call: the ledger records every change or none.
\set VERBOSITY default
CREATE EXTENSION amcheck;
CREATE FUNCTION regress_ledger_indexes_intact() RETURNS boolean LANGUAGE plpgsql AS $$
DECLARE
    index regclass;
BEGIN
    FOR index IN
        SELECT i.indexrelid::regclass
          FROM pg_index i
         WHERE i.indrelid IN ('durable_ledger.effects'::regclass,
                              'durable_ledger.audit_log'::regclass)
           AND (SELECT a.amname FROM pg_class c JOIN pg_am a ON a.oid = c.relam
                 WHERE c.oid = i.indexrelid) = 'btree'         -- what amcheck checks
    LOOP
        PERFORM bt_index_check(index, heapallindexed => true);
    END LOOP;
    RETURN true;
END $$;

-- a first epoch: new intents and completions
SELECT durable_ledger.acquire_run('direct-1');
SELECT key AS k1 FROM durable_ledger.begin_effect('direct-1', 'pay', '{"n": 1}') \gset
SELECT key AS k2 FROM durable_ledger.begin_effect('direct-1', 'pay', '{"n": 2}') \gset
SELECT key AS k3 FROM durable_ledger.begin_effect('direct-1', 'pay', '{"n": 3}') \gset
SELECT status, result, conflict, completed_at IS NOT NULL AS completed_at_set
  FROM durable_ledger.complete_effect(:'k1', '{"paid": 1}');
SELECT status, error FROM durable_ledger.fail_effect(:'k2', '{"declined": 2}');
SELECT durable_ledger.release_run('direct-1');

-- a later epoch: the recorded calls are answered from the record, and calls
-- that are new in this epoch are written too
SELECT durable_ledger.acquire_run('direct-1');
SELECT decision, status, result FROM durable_ledger.begin_effect('direct-1', 'pay', '{"n": 1}');
SELECT decision, status, error FROM durable_ledger.begin_effect('direct-1', 'pay', '{"n": 2}');
SELECT decision, status FROM durable_ledger.begin_effect('direct-1', 'pay', '{"n": 3}');
-- (its outcome is unknown: a person says it failed, and it replays; a new
-- call before then would diverge from the earlier attempt, and pause)
SELECT status FROM durable_ledger.resolve_effect(:'k3', 'failed', NULL, 'regress');
SELECT decision, status FROM durable_ledger.begin_effect('direct-1', 'pay', '{"n": 3}');
SELECT key AS k4, decision AS k4_decision, occurrence AS k4_occurrence
  FROM durable_ledger.begin_effect('direct-1', 'pay', '{"n": 4}') \gset
SELECT :'k4_decision' AS decision, :k4_occurrence AS occurrence;
-- the same call again in this epoch is its next occurrence, also new
SELECT decision, occurrence FROM durable_ledger.begin_effect('direct-1', 'pay', '{"n": 4}');
SELECT status, result FROM durable_ledger.complete_effect(:'k4', '{"paid": 4}');
-- a report on someone else's key, or a second report
SELECT status FROM durable_ledger.complete_effect(:'k4', '{"paid": 4}');
SELECT status, conflict FROM durable_ledger.complete_effect(:'k1', '{"paid": "other"}');
SELECT durable_ledger.release_run('direct-1');
SELECT key = :'k4' AS same_key, run, lease_epoch, occurrence, status, result, holder_pid = pg_backend_pid() AS mine
  FROM durable_ledger.effects WHERE key = :'k4';
SELECT event, lease_epoch FROM durable_ledger.audit_log WHERE run = 'direct-1' ORDER BY id;
SELECT regress_ledger_indexes_intact();

-- begin and complete in one transaction: the completion sees the intent
BEGIN;
SELECT key AS k5 FROM durable_ledger.begin_effect('direct-2', 'pay', '{"n": 5}') \gset
SELECT status, result FROM durable_ledger.complete_effect(:'k5', '{"paid": 5}');
COMMIT;
SELECT status, result FROM durable_ledger.effect_status(:'k5');
-- and rolled back, nothing of it stays
BEGIN;
SELECT key AS k6 FROM durable_ledger.begin_effect('direct-2', 'pay', '{"n": 6}') \gset
SELECT status FROM durable_ledger.complete_effect(:'k6', '{"paid": 6}');
ROLLBACK;
SELECT count(*) AS rolled_back_rows FROM durable_ledger.effects WHERE key = :'k6';
SELECT count(*) AS rolled_back_events FROM durable_ledger.audit_log WHERE key = :'k6';
SELECT durable_ledger.release_run('direct-2');

-- REPEATABLE READ: the same answers (decisions are made on the latest
-- committed version of a row, locked)
-- (run direct-4: an attempt of its own, then a later one that replays it
-- and makes a new call)
SELECT decision, (durable_ledger.complete_effect(key, '{"paid": 4}')).status
  FROM durable_ledger.begin_effect('direct-4', 'pay', '{"n": 4}');
SELECT durable_ledger.release_run('direct-4');
BEGIN ISOLATION LEVEL REPEATABLE READ;
SELECT durable_ledger.acquire_run('direct-4');
SELECT decision, status, result FROM durable_ledger.begin_effect('direct-4', 'pay', '{"n": 4}');
SELECT key AS k40, decision AS k40_decision FROM durable_ledger.begin_effect('direct-4', 'pay', '{"n": 40}') \gset
SELECT :'k40_decision' AS decision;
SELECT status, result FROM durable_ledger.complete_effect(:'k40', '{"paid": 40}');
COMMIT;
SELECT durable_ledger.release_run('direct-4');
SELECT occurrence, status, result, lease_epoch FROM durable_ledger.effects WHERE key = :'k40';

-- SERIALIZABLE: the same answers
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT durable_ledger.acquire_run('direct-3');
SELECT key AS k7, decision FROM durable_ledger.begin_effect('direct-3', 'pay', '{"n": 7}') \gset
SELECT status, result FROM durable_ledger.complete_effect(:'k7', '{"paid": 7}');
COMMIT;
SELECT durable_ledger.release_run('direct-3');
BEGIN ISOLATION LEVEL SERIALIZABLE;
SELECT durable_ledger.acquire_run('direct-3');
SELECT decision, status, result FROM durable_ledger.begin_effect('direct-3', 'pay', '{"n": 7}');
SELECT key AS k8, decision FROM durable_ledger.begin_effect('direct-3', 'pay', '{"n": 8}') \gset
SELECT status, result FROM durable_ledger.complete_effect(:'k8', '{"paid": 8}');
COMMIT;
SELECT durable_ledger.release_run('direct-3');
SELECT regress_ledger_indexes_intact();

-- row triggers someone adds to a ledger table fire, BEFORE and AFTER
CREATE FUNCTION regress_direct_notice() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE 'trigger saw % of a % row', TG_OP, TG_TABLE_NAME;
    RETURN NEW;
END $$;
CREATE TRIGGER regress_audit_notice AFTER INSERT ON durable_ledger.audit_log
    FOR EACH ROW EXECUTE FUNCTION regress_direct_notice();
CREATE TRIGGER regress_effects_notice AFTER INSERT ON durable_ledger.effects
    FOR EACH ROW EXECUTE FUNCTION regress_direct_notice();
\set VERBOSITY terse
SELECT key AS k9, decision FROM durable_ledger.begin_effect('direct-trig', 'pay', '{"event": "intent"}') \gset
\set VERBOSITY default
DROP TRIGGER regress_audit_notice ON durable_ledger.audit_log;
DROP TRIGGER regress_effects_notice ON durable_ledger.effects;
CREATE TRIGGER regress_effects_notice AFTER UPDATE ON durable_ledger.effects
    FOR EACH ROW EXECUTE FUNCTION regress_direct_notice();
\set VERBOSITY terse
SELECT status FROM durable_ledger.complete_effect(:'k9', '{"paid": 9}');
\set VERBOSITY default
DROP TRIGGER regress_effects_notice ON durable_ledger.effects;
DROP FUNCTION regress_direct_notice();
SELECT durable_ledger.release_run('direct-trig');

-- an index someone adds to a ledger table is kept up to date; one on status
-- makes the completion a non-HOT update, which needs new entries in every index
CREATE INDEX regress_effects_tool ON durable_ledger.effects (tool);
CREATE INDEX regress_effects_status ON durable_ledger.effects (status);
SELECT key AS k10, decision FROM durable_ledger.begin_effect('direct-idx', 'regress-indexed-tool', '{}') \gset
SELECT status FROM durable_ledger.complete_effect(:'k10', '{"paid": 10}');
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT count(*) FROM durable_ledger.effects WHERE tool = 'regress-indexed-tool';
SELECT count(*) FROM durable_ledger.effects WHERE tool = 'regress-indexed-tool';
SELECT count(*) FROM durable_ledger.effects WHERE status = 'completed' AND key = :'k10';
SELECT count(*) FROM durable_ledger.effects WHERE status = 'started' AND key = :'k10';
RESET enable_seqscan;
RESET enable_bitmapscan;
SELECT regress_ledger_indexes_intact();
SELECT durable_ledger.release_run('direct-idx');
DROP INDEX durable_ledger.regress_effects_tool;
DROP INDEX durable_ledger.regress_effects_status;

-- a NOT NULL someone adds is enforced (tried on an emptied table, rolled back)
BEGIN;
DELETE FROM durable_ledger.effects;
ALTER TABLE durable_ledger.effects ALTER COLUMN error SET NOT NULL;
SELECT regress_try($$SELECT durable_ledger.begin_effect('direct-nn', 'pay', '{}')$$);
ROLLBACK;
SELECT count(*) > 0 AS effects_are_back FROM durable_ledger.effects;
SELECT durable_ledger.release_run('direct-nn');

-- an UPDATE that a publication could not replicate is refused, as SQL refuses it
ALTER TABLE durable_ledger.effects REPLICA IDENTITY NOTHING;
SET client_min_messages = error;  -- the publication warns when wal_level is not logical
CREATE PUBLICATION regress_direct_pub FOR TABLE durable_ledger.effects;
RESET client_min_messages;
SELECT key AS k14 FROM durable_ledger.begin_effect('direct-pub', 'pay', '{}') \gset
SELECT regress_try(format('SELECT durable_ledger.complete_effect(%L, %L)', :'k14', '{"paid": 14}'));
SELECT status FROM durable_ledger.effects WHERE key = :'k14';
DROP PUBLICATION regress_direct_pub;
ALTER TABLE durable_ledger.effects REPLICA IDENTITY DEFAULT;
SELECT status FROM durable_ledger.complete_effect(:'k14', '{"paid": 14}');
SELECT durable_ledger.release_run('direct-pub');

-- an index of another kind (here GIN) is kept too: it finds the rows
CREATE INDEX regress_effects_args ON durable_ledger.effects USING gin (args);
SELECT key AS k11, decision FROM durable_ledger.begin_effect('direct-gin', 'pay', '{"regress": "gin"}') \gset
SELECT status FROM durable_ledger.complete_effect(:'k11', '{"paid": 11}');
SET enable_seqscan = off;
SELECT count(*) FROM durable_ledger.effects WHERE args @> '{"regress": "gin"}';
RESET enable_seqscan;
SELECT durable_ledger.release_run('direct-gin');
DROP INDEX durable_ledger.regress_effects_args;

-- a BEFORE ROW trigger that skips the ledger's row (returns NULL) makes the
-- call fail with 09000, writing nothing: an intent that is not recorded must
-- never be executed, a report that is not recorded never acknowledged
CREATE FUNCTION regress_skip_row() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RETURN NULL;
END $$;
CREATE TRIGGER regress_skip BEFORE INSERT ON durable_ledger.effects
    FOR EACH ROW WHEN (NEW.tool = 'email') EXECUTE FUNCTION regress_skip_row();
SELECT regress_try($$SELECT durable_ledger.begin_effect('direct-skip', 'email', '{"to": "a@b"}')$$);
SELECT durable_ledger.release_run('direct-skip');
SELECT regress_try($$SELECT durable_ledger.begin_effect('direct-skip', 'email', '{"to": "a@b"}')$$);
SELECT regress_try($$SELECT durable_ledger.begin_effect('direct-skip', 'email', '{"to": "c@d"}', 'BK-SKIP')$$);
SELECT count(*) AS effects, (SELECT count(*) FROM durable_ledger.audit_log
                              WHERE run = 'direct-skip' AND event = 'intent') AS intents
  FROM durable_ledger.effects WHERE run = 'direct-skip';
DROP TRIGGER regress_skip ON durable_ledger.effects;
SELECT key AS k15, decision FROM durable_ledger.begin_effect('direct-skip', 'email', '{"to": "a@b"}') \gset
CREATE TRIGGER regress_skip BEFORE UPDATE ON durable_ledger.effects
    FOR EACH ROW EXECUTE FUNCTION regress_skip_row();
SELECT regress_try(format('SELECT durable_ledger.complete_effect(%L, %L, 1)', :'k15', '{"sent": 15}'));
SELECT status, result FROM durable_ledger.effects WHERE key = :'k15';
SELECT count(*) AS completions FROM durable_ledger.audit_log WHERE key = :'k15' AND event = 'completed';
DROP TRIGGER regress_skip ON durable_ledger.effects;
SELECT status FROM durable_ledger.complete_effect(:'k15', '{"sent": 15}', 1);
SELECT durable_ledger.release_run('direct-skip');
DROP FUNCTION regress_skip_row();

-- an UPDATE OF trigger fires on the columns the ledger sets, as after SQL's
-- UPDATE ... SET status = ..., and not on the ones it leaves alone
CREATE FUNCTION regress_update_of() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE NOTICE '% fired: % -> %', TG_NAME, OLD.status, NEW.status;
    RETURN NEW;
END $$;
CREATE TRIGGER regress_status_changed AFTER UPDATE OF status ON durable_ledger.effects
    FOR EACH ROW EXECUTE FUNCTION regress_update_of();
CREATE TRIGGER regress_tool_changed AFTER UPDATE OF tool ON durable_ledger.effects
    FOR EACH ROW EXECUTE FUNCTION regress_update_of();
SELECT key AS k16 FROM durable_ledger.begin_effect('direct-of', 'pay', '{"n": 16}') \gset
\set VERBOSITY terse
SELECT status FROM durable_ledger.complete_effect(:'k16', '{"paid": 16}', 1);
\set VERBOSITY default
DROP TRIGGER regress_status_changed ON durable_ledger.effects;
DROP TRIGGER regress_tool_changed ON durable_ledger.effects;
DROP FUNCTION regress_update_of();
SELECT durable_ledger.release_run('direct-of');

-- a domain someone gives a ledger column is checked, as SQL checks it: on
-- the ledger's columns when it sets them, on a column it does not know when
-- it gets its default (tried in a transaction, rolled back)
CREATE DOMAIN regress_json_object AS jsonb CHECK (jsonb_typeof(VALUE) = 'object');
CREATE DOMAIN regress_tenant AS text NOT NULL;
BEGIN;
ALTER TABLE durable_ledger.effects ALTER COLUMN result TYPE regress_json_object;
SELECT key AS k17 FROM durable_ledger.begin_effect('direct-dom', 'pay', '{"n": 17}') \gset
SELECT regress_try(format('SELECT durable_ledger.complete_effect(%L, %L, 1)', :'k17', '[1, 2, 3]'));
SELECT status FROM durable_ledger.complete_effect(:'k17', '{"paid": 17}', 1);
DELETE FROM durable_ledger.effects;
ALTER TABLE durable_ledger.effects ADD COLUMN regress_tenant regress_tenant;
SELECT regress_try($$SELECT durable_ledger.begin_effect('direct-dom', 'pay', '{"n": 18}')$$);
ROLLBACK;
DROP DOMAIN regress_json_object;
DROP DOMAIN regress_tenant;
SELECT durable_ledger.release_run('direct-dom');

-- audit_log.id takes the column's own default: made an identity that starts
-- elsewhere, the ledger's rows number from there (tried and rolled back)
BEGIN;
ALTER TABLE durable_ledger.audit_log ALTER COLUMN id DROP DEFAULT;
ALTER TABLE durable_ledger.audit_log ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (START WITH 900000001);
SELECT decision FROM durable_ledger.begin_effect('direct-id', 'pay', '{"n": 19}');
SELECT id, event FROM durable_ledger.audit_log WHERE run = 'direct-id' ORDER BY id;
ROLLBACK;
SELECT durable_ledger.release_run('direct-id');

-- a ledger column given a nondeterministic collation (case-insensitive) is
-- refused, as a column of another type is: the ledger compares runs, keys and
-- tools byte for byte, and such a column would match another run's rows.  A
-- check that fails keeps nothing for the backend: no context is left behind
-- by each refused call (tried in a transaction, rolled back)
CREATE COLLATION regress_ci (provider = icu, locale = 'und-u-ks-level2', deterministic = false);
SELECT set_config('regress.tci', (durable_ledger.take_lease('direct-ci')).token, false) IS NOT NULL AS taken;
BEGIN;
ALTER TABLE durable_ledger.token_lease_calls ALTER COLUMN run TYPE text COLLATE regress_ci;
SELECT regress_try($$SELECT durable_ledger.begin_effect('direct-ci', 'pay', '{"n": 20}',
                                                        lease => current_setting('regress.tci'))$$);
SELECT count(*) AS writers FROM pg_backend_memory_contexts WHERE name = 'durable_ledger writer' \gset
DO $$
BEGIN
    FOR i IN 1..50 LOOP
        BEGIN
            PERFORM durable_ledger.begin_effect('direct-ci', 'pay', '{"n": 20}',
                                                lease => current_setting('regress.tci'));
        EXCEPTION WHEN collation_mismatch THEN NULL;
        END;
    END LOOP;
END $$;
SELECT count(*) - :writers AS writers_left_by_50_refusals
  FROM pg_backend_memory_contexts WHERE name = 'durable_ledger writer';
ROLLBACK;
SELECT count(*) AS written FROM durable_ledger.effects WHERE run = 'direct-ci';
SELECT durable_ledger.release_lease(current_setting('regress.tci')) AS released;
DROP COLLATION regress_ci;

-- a read-only transaction writes nothing
SELECT durable_ledger.acquire_run('direct-ro');
SELECT key AS k12 FROM durable_ledger.begin_effect('direct-ro', 'pay', '{}') \gset
BEGIN READ ONLY;
SELECT durable_ledger.begin_effect('direct-ro', 'pay', '{"n": 12}');
ROLLBACK;
BEGIN READ ONLY;
SELECT durable_ledger.complete_effect(:'k12', '{"paid": 12}');
ROLLBACK;
SELECT count(*) AS effects, count(*) FILTER (WHERE status = 'started') AS started
  FROM durable_ledger.effects WHERE run = 'direct-ro';
SELECT durable_ledger.release_run('direct-ro');

-- columns an admin adds and drops: the ledger goes on, on every table (a
-- dropped column stays in the row type, where the ledger skips it).  The
-- columns stay dropped: every later file runs on these tables.
SELECT key AS kd FROM durable_ledger.begin_effect('direct-dc', 'pay', '{"n": 1}') \gset
DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['effects', 'runs', 'audit_log', 'tools', 'divergences', 'past_attempts',
                             'token_leases', 'token_lease_calls', 'policy', 'unsettled', 'audit_anchors'] LOOP
        EXECUTE format('ALTER TABLE durable_ledger.%I ADD COLUMN regress_added text, ADD COLUMN regress_dropped int', t);
        EXECUTE format('ALTER TABLE durable_ledger.%I DROP COLUMN regress_dropped', t);
    END LOOP;
END $$;
SELECT count(*) AS dropped_columns FROM pg_attribute
 WHERE attrelid::regclass::text LIKE 'durable_ledger.%' AND attisdropped;
SELECT key = :'kd' AS same_key, status FROM durable_ledger.effect_status(:'kd');
SELECT status FROM durable_ledger.complete_effect(:'kd', '{"paid": 1}');
SELECT status, result FROM durable_ledger.effect_status(:'kd');
SELECT durable_ledger.acquire_run('direct-dc');
SELECT decision, status FROM durable_ledger.begin_effect('direct-dc', 'pay', '{"n": 1}');
SELECT decision, (durable_ledger.fail_effect(key, '{"declined": 2}', attempt)).status
  FROM durable_ledger.begin_effect('direct-dc', 'pay', '{"n": 2}', 'DIRECT-DC-BK');
SELECT decision, attempt FROM durable_ledger.begin_effect('direct-dc', 'pay', '{"n": 2}', 'DIRECT-DC-BK');
SELECT key, attempt, status FROM durable_ledger.effect_status('DIRECT-DC-BK');
SELECT durable_ledger.release_run('direct-dc');
-- ... and dropping the columns it added too
ALTER TABLE durable_ledger.effects DROP COLUMN regress_added;
SELECT status FROM durable_ledger.effect_status(:'kd');
DO $$
DECLARE t text;
BEGIN
    FOREACH t IN ARRAY ARRAY['runs', 'audit_log', 'tools', 'divergences', 'past_attempts',
                             'token_leases', 'token_lease_calls', 'policy', 'unsettled', 'audit_anchors'] LOOP
        EXECUTE format('ALTER TABLE durable_ledger.%I DROP COLUMN regress_added', t);
    END LOOP;
END $$;

-- an index created between two writes of one session (a partial one on an
-- expression, here) is written by the next, one created by another session
-- too, and a dropped or rebuilt one is no longer in its way
SELECT durable_ledger.acquire_run('direct-ix');
SELECT key AS kx1 FROM durable_ledger.begin_effect('direct-ix', 'pay', '{"n": 1}') \gset
CREATE INDEX effects_n_idx ON durable_ledger.effects ((args ->> 'n')) WHERE tool = 'pay';
SELECT key AS kx2 FROM durable_ledger.begin_effect('direct-ix', 'pay', '{"n": 2}') \gset
SELECT status FROM durable_ledger.complete_effect(:'kx2', '{"paid": 2}');
SELECT dblink_exec('dbname=' || current_database(),
       $$CREATE INDEX audit_log_detail_idx ON durable_ledger.audit_log ((detail ->> 'note'))$$);
SELECT key AS kx3 FROM durable_ledger.begin_effect('direct-ix', 'pay', '{"n": 3}') \gset
SELECT regress_ledger_indexes_intact();
SET enable_seqscan = off;
SET enable_bitmapscan = off;
EXPLAIN (COSTS OFF) SELECT key FROM durable_ledger.effects WHERE args ->> 'n' = '3' AND tool = 'pay';
SELECT key = :'kx3' AS found_by_the_new_index
  FROM durable_ledger.effects WHERE args ->> 'n' = '3' AND tool = 'pay' AND run = 'direct-ix';
RESET enable_seqscan;
RESET enable_bitmapscan;
REINDEX TABLE durable_ledger.effects;
SELECT status FROM durable_ledger.complete_effect(:'kx3', '{"paid": 3}');
DROP INDEX durable_ledger.effects_n_idx;
SELECT dblink_exec('dbname=' || current_database(), 'DROP INDEX durable_ledger.audit_log_detail_idx');
SELECT status FROM durable_ledger.complete_effect(:'kx1', '{"paid": 1}');
SELECT durable_ledger.release_run('direct-ix');

-- index expressions are evaluated as SQL evaluates them, write after write: a
-- whole-row reference, and a domain whose constraint is added between two
-- writes (the next write checks it, as an INSERT would)
CREATE FUNCTION public.regress_rowtag(durable_ledger.unsettled) RETURNS text
    IMMUTABLE LANGUAGE plpgsql AS $$BEGIN RETURN $1.key; END$$;
CREATE INDEX unsettled_rowtag_idx ON durable_ledger.unsettled (public.regress_rowtag(unsettled));
CREATE DOMAIN public.regress_n AS int CHECK (VALUE > -100);
CREATE INDEX effects_regress_n_idx ON durable_ledger.effects (((args ->> 'regress_n')::public.regress_n));
SELECT decision FROM durable_ledger.begin_effect('direct-ex', 'pay', '{"regress_n": 1}');
SELECT decision FROM durable_ledger.begin_effect('direct-ex', 'pay', '{"regress_n": 2}');
ALTER DOMAIN public.regress_n ADD CONSTRAINT regress_n_positive CHECK (VALUE > 0);
SELECT decision FROM durable_ledger.begin_effect('direct-ex', 'pay', '{"regress_n": -5}');
SELECT decision FROM durable_ledger.begin_effect('direct-ex', 'pay', '{"regress_n": 3}');
SELECT count(*) AS written FROM durable_ledger.effects WHERE run = 'direct-ex';
SELECT durable_ledger.release_run('direct-ex');
DROP INDEX durable_ledger.unsettled_rowtag_idx, durable_ledger.effects_regress_n_idx;
DROP FUNCTION public.regress_rowtag(durable_ledger.unsettled);
DROP DOMAIN public.regress_n;
SELECT regress_ledger_indexes_intact();
DROP FUNCTION regress_ledger_indexes_intact();
DROP EXTENSION amcheck;
