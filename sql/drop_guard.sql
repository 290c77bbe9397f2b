-- drop_guard (runs last): DROP EXTENSION durable_ledger, a DROP SCHEMA ... CASCADE and a
-- DROP OWNED that would take the ledger along are refused (55006) while it holds effects,
-- unless the session sets durable_ledger.allow_drop = on; other extensions, schemas and
-- roles drop as usual; the group roles outlive the extension; it can be created again
-- and an empty ledger drops without the setting. Ends with a fresh, empty ledger installed.
\set VERBOSITY default

SELECT decision FROM durable_ledger.begin_effect('drop-1', 'pay', '{}');
SELECT durable_ledger.release_run('drop-1') AS released;
SELECT count(*) AS effects FROM durable_ledger.effects \gset
SELECT :effects > 0 AS ledger_holds_effects;
SHOW durable_ledger.allow_drop;

-- ==== refused while the ledger holds effects (each in a transaction, rolled back anyway) ====
BEGIN;
DROP EXTENSION durable_ledger;
ROLLBACK;
BEGIN;
DROP EXTENSION durable_ledger CASCADE;
ROLLBACK;
BEGIN;
DROP EXTENSION IF EXISTS durable_ledger;
ROLLBACK;
BEGIN;
DROP EXTENSION pg_trgm_not_installed_regress, durable_ledger;
ROLLBACK;
BEGIN;
DROP EXTENSION "durable_ledger" RESTRICT;
ROLLBACK;
BEGIN;
DROP SCHEMA durable_ledger CASCADE;
ROLLBACK;
BEGIN;
DROP SCHEMA IF EXISTS regress_no_such_schema, durable_ledger CASCADE;
ROLLBACK;
-- allow_drop set to off explicitly is no permission either
SET durable_ledger.allow_drop = off;
BEGIN;
DROP EXTENSION durable_ledger;
ROLLBACK;
RESET durable_ledger.allow_drop;
\set VERBOSITY default
DROP EXTENSION durable_ledger;
\set VERBOSITY default
-- its tables are extension members: they cannot be dropped one by one either
BEGIN;
DROP TABLE durable_ledger.effects;
ROLLBACK;
BEGIN;
DROP TABLE durable_ledger.effects CASCADE;
ROLLBACK;
-- a fresh session, where only the event trigger loads the library, is refused too
SELECT dblink_connect('regress_fresh', 'dbname=' || current_database());
SELECT * FROM dblink('regress_fresh',
         $$SELECT count(*) FROM pg_settings WHERE name = 'durable_ledger.allow_drop'$$) AS t(loaded bigint);
\set VERBOSITY terse
DO $$
BEGIN
    PERFORM dblink_exec('regress_fresh', 'DROP EXTENSION durable_ledger');
    RAISE NOTICE 'fresh session: dropped';
EXCEPTION WHEN OTHERS THEN
    RAISE NOTICE 'fresh session: refused with %', SQLSTATE;
END
$$;
\set VERBOSITY default
SELECT dblink_disconnect('regress_fresh');
-- the extension, its schema and every effect are still there
SELECT extname, extversion FROM pg_extension WHERE extname = 'durable_ledger';
SELECT count(*) = :effects AS same_effects FROM durable_ledger.effects;
SELECT count(*) AS tables FROM pg_tables WHERE schemaname = 'durable_ledger';

-- ==== unrelated drops are not affected ====
CREATE EXTENSION hstore;
DROP EXTENSION hstore;
CREATE EXTENSION pg_trgm;
CREATE EXTENSION fuzzystrmatch;
DROP EXTENSION pg_trgm, fuzzystrmatch CASCADE;
SELECT count(*) AS leftover FROM pg_extension WHERE extname IN ('hstore', 'pg_trgm', 'fuzzystrmatch');
CREATE SCHEMA regress_drop_other;
CREATE TABLE regress_drop_other.t (x int);
DROP SCHEMA regress_drop_other CASCADE;
CREATE ROLE regress_drop_someone NOLOGIN;
CREATE TABLE public.regress_drop_owned (x int);
ALTER TABLE public.regress_drop_owned OWNER TO regress_drop_someone;
DROP OWNED BY regress_drop_someone;
DROP ROLE regress_drop_someone;
SELECT to_regclass('public.regress_drop_owned') AS dropped_table;
-- without CASCADE PostgreSQL itself refuses to drop the ledger's schema
DROP SCHEMA durable_ledger;
SELECT extname FROM pg_extension WHERE extname = 'durable_ledger';

-- ==== with allow_drop = on the drop goes through ====
-- (in a fresh session, set before the library is loaded: the setting is picked up)
SELECT dblink_connect('regress_fresh', 'dbname=' || current_database());
SELECT dblink_exec('regress_fresh', 'SET durable_ledger.allow_drop = on');
SELECT dblink_exec('regress_fresh', 'DROP EXTENSION durable_ledger');
SELECT * FROM dblink('regress_fresh', 'SHOW durable_ledger.allow_drop') AS t(allow_drop text);
SELECT dblink_disconnect('regress_fresh');
SELECT count(*) AS extension FROM pg_extension WHERE extname = 'durable_ledger';
SELECT count(*) AS ledger_tables FROM pg_class WHERE relname IN ('effects', 'runs', 'audit_log')
   AND relnamespace::regnamespace::text = 'durable_ledger';
SELECT count(*) AS event_triggers FROM pg_event_trigger WHERE evtname = 'durable_ledger_guard_drop';
-- the group roles are cluster-wide and survive, with their memberships
SELECT rolname, rolcanlogin FROM pg_roles WHERE rolname LIKE 'durable_ledger_%' ORDER BY rolname;
SELECT pg_has_role('durable_ledger_admin', 'durable_ledger_worker', 'MEMBER') AS admin_is_worker,
       pg_has_role('durable_ledger_admin', 'durable_ledger_auditor', 'MEMBER') AS admin_is_auditor;

-- ==== created again: works with the roles already there; the ledger is empty ====
CREATE EXTENSION durable_ledger;
SELECT extname, extversion FROM pg_extension WHERE extname = 'durable_ledger';
SELECT count(*) AS effects FROM durable_ledger.effects;
SELECT rolname FROM pg_roles WHERE rolname LIKE 'durable_ledger_%' ORDER BY rolname;
SELECT has_function_privilege('durable_ledger_worker', 'durable_ledger.begin_effect(text,text,jsonb,text,jsonb,text,boolean)', 'EXECUTE') AS worker_can_begin,
       has_table_privilege('durable_ledger_auditor', 'durable_ledger.effects', 'SELECT') AS auditor_can_read,
       has_function_privilege('public', 'durable_ledger.begin_effect(text,text,jsonb,text,jsonb,text,boolean)', 'EXECUTE') AS public_can_begin;
-- an empty ledger drops without the setting, even after leases were taken
SELECT durable_ledger.acquire_run('drop-2') AS acquired, durable_ledger.release_run('drop-2') AS released;
SELECT count(*) AS effects, (SELECT count(*) FROM durable_ledger.runs) AS runs FROM durable_ledger.effects;
DROP EXTENSION durable_ledger;
SELECT count(*) AS extension FROM pg_extension WHERE extname = 'durable_ledger';

-- ==== the same session can use a re-created ledger ====
CREATE EXTENSION durable_ledger;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-3', 'pay', '{}');
SELECT status FROM durable_ledger.complete_effect(durable_ledger.effect_key('drop-3', 'pay', '{}', 1), '{"ok": 1}');
SELECT durable_ledger.release_run('drop-3') AS released;
BEGIN;
DROP EXTENSION durable_ledger;
ROLLBACK;
SET durable_ledger.allow_drop = on;
DROP EXTENSION durable_ledger;
RESET durable_ledger.allow_drop;

-- ==== DROP OWNED BY the extension's owner is guarded too ====
CREATE ROLE regress_drop_owner SUPERUSER NOLOGIN;
SET ROLE regress_drop_owner;
CREATE EXTENSION durable_ledger;
SELECT decision FROM durable_ledger.begin_effect('drop-4', 'pay', '{}');
SELECT durable_ledger.release_run('drop-4') AS released;
RESET ROLE;
SELECT pg_get_userbyid(extowner) AS owner FROM pg_extension WHERE extname = 'durable_ledger';
BEGIN;
DROP OWNED BY regress_drop_owner;
ROLLBACK;
CREATE ROLE regress_drop_bystander NOLOGIN;
BEGIN;
DROP OWNED BY regress_drop_bystander, regress_drop_owner;
ROLLBACK;
DROP ROLE regress_drop_bystander;
SELECT count(*) AS extension FROM pg_extension WHERE extname = 'durable_ledger';
SET durable_ledger.allow_drop = on;
DROP OWNED BY regress_drop_owner;
RESET durable_ledger.allow_drop;
SELECT count(*) AS extension FROM pg_extension WHERE extname = 'durable_ledger';
DROP ROLE regress_drop_owner;

-- ==== DROP EXTENSION and CREATE EXTENSION in one session (also in one
-- ==== transaction): nothing the session cached about the dropped ledger (its
-- ==== tables, indexes, sequence, saved plans) is used afterwards
CREATE FUNCTION pg_temp.use_every_function(r text) RETURNS text LANGUAGE plpgsql AS $fn$
DECLARE
    k text;
    out text;
BEGIN
    k := (durable_ledger.begin_effect(r, 'pay', '{"n": 1}')).key;
    PERFORM durable_ledger.complete_effect(k, '{"ok": 1}', 1);
    k := (durable_ledger.begin_effect(r, 'pay', '{"n": 2}')).key;
    PERFORM durable_ledger.fail_effect(k, '"declined"');
    k := (durable_ledger.begin_effect(r, 'pay', '{"n": 3}', r || '-bk')).key;
    PERFORM durable_ledger.fail_effect(k, '"declined"', 1);
    PERFORM durable_ledger.begin_effect(r, 'pay', '{"n": 3}', r || '-bk');
    PERFORM durable_ledger.release_run(r);
    PERFORM durable_ledger.resolve_effect(r || '-bk', 'failed', NULL, 'regress');
    PERFORM durable_ledger.acquire_run(r);
    SELECT string_agg(d.decision, ',' ORDER BY n) INTO out
      FROM generate_series(1, 3) AS n,
           LATERAL durable_ledger.begin_effect(r, 'pay', jsonb_build_object('n', n)) AS d;
    PERFORM durable_ledger.release_run(r);
    RETURN out || ' ' || (SELECT status FROM durable_ledger.effect_status(r || '-bk'))
               || ' ' || (SELECT count(*) FROM durable_ledger.unresolved)
               || ' ' || (SELECT count(*) FROM durable_ledger.leases)
               || ' ' || (SELECT count(*) FROM durable_ledger.past_attempts);
END
$fn$;
CREATE EXTENSION durable_ledger;
SELECT pg_temp.use_every_function('drop-5');
SET durable_ledger.allow_drop = on;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
SELECT pg_temp.use_every_function('drop-6');
BEGIN;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
SELECT pg_temp.use_every_function('drop-7');
COMMIT;
SELECT pg_temp.use_every_function('drop-8');
SELECT count(DISTINCT run) AS runs FROM durable_ledger.effects;
DROP EXTENSION durable_ledger;
RESET durable_ledger.allow_drop;

-- ==== a run this session still holds when its ledger is dropped: the
-- ==== re-created ledger knows nothing of it, and neither does the session
-- (the session's lease locks: the extension's lock class in pg_locks)
CREATE FUNCTION pg_temp.lease_locks() RETURNS bigint LANGUAGE sql AS $$
    SELECT count(*) FROM pg_locks
     WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid()
$$;
CREATE EXTENSION durable_ledger;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-9', 'pay', '{"i": 1}');
SET durable_ledger.allow_drop = on;
DROP EXTENSION durable_ledger;
RESET durable_ledger.allow_drop;
CREATE EXTENSION durable_ledger;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-9', 'pay', '{"i": 1}');
SELECT epochs FROM durable_ledger.runs WHERE run = 'drop-9';
SELECT status FROM durable_ledger.effect_status(durable_ledger.effect_key('drop-9', 'pay', '{"i": 1}', 1));
SELECT count(*) AS unresolved FROM durable_ledger.unresolved WHERE run = 'drop-9';
SELECT pg_temp.lease_locks() AS lease_locks;
SELECT durable_ledger.release_run('drop-9') AS released;
SELECT pg_temp.lease_locks() AS lease_locks;
SET durable_ledger.allow_drop = on;
DROP EXTENSION durable_ledger;
RESET durable_ledger.allow_drop;

-- ==== DROP EXTENSION and CREATE EXTENSION rolled back (to a savepoint, or the
-- ==== whole transaction) after a call in the new ledger: the old ledger comes
-- ==== back with the session's lease as it was (same epoch, counters, lock),
-- ==== so a retry in the same attempt is the next occurrence, not a new epoch
-- ==== that would pause it as an outcome unknown or a divergence
CREATE EXTENSION durable_ledger;
SET durable_ledger.allow_drop = on;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-10', 'pay', '{"i": 1}');
BEGIN;
SAVEPOINT replace_ledger;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-10', 'pay', '{"i": 9}');
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-10b', 'pay', '{}');
ROLLBACK TO replace_ledger;
SELECT decision, occurrence, status FROM durable_ledger.begin_effect('drop-10', 'pay', '{"i": 1}');
COMMIT;
BEGIN;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-10', 'pay', '{"i": 1}');
ROLLBACK;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-10', 'pay', '{"i": 1}');
SELECT epochs FROM durable_ledger.runs WHERE run = 'drop-10';
SELECT count(*) AS divergences FROM durable_ledger.divergences;
SELECT count(*) AS effects, count(DISTINCT lease_epoch) AS epochs FROM durable_ledger.effects;
-- the lock of drop-10b, taken in the ledger rolled back, is given back by the next call
SELECT pg_temp.lease_locks() AS lease_locks;
-- a ledger replaced for good (committed) gives back the locks of the runs held
-- in the old one at the commit, and keeps the lock a run of the same name holds
-- in the new one: one lock serves both
BEGIN;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-11', 'pay', '{}');
SELECT pg_temp.lease_locks() AS lease_locks;
COMMIT;
SELECT pg_temp.lease_locks() AS lease_locks;
BEGIN;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-11', 'pay', '{}');
COMMIT;
SELECT pg_temp.lease_locks() AS lease_locks;
SELECT epochs FROM durable_ledger.runs WHERE run = 'drop-11';
SELECT durable_ledger.release_run('drop-11') AS released;
SELECT pg_temp.lease_locks() AS lease_locks;
-- made in an outer savepoint, called in an inner one rolled back: the new
-- ledger lives on, and the old one's run is given back at the commit
SELECT decision FROM durable_ledger.begin_effect('drop-12', 'pay', '{}');
BEGIN;
SAVEPOINT outer_sp;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
SAVEPOINT inner_sp;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-13', 'pay', '{}');
ROLLBACK TO inner_sp;
COMMIT;
SELECT pg_temp.lease_locks() AS lease_locks;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-13', 'pay', '{}');
SELECT epochs FROM durable_ledger.runs WHERE run = 'drop-13';
SELECT count(*) AS runs FROM durable_ledger.runs;
SELECT durable_ledger.release_run('drop-13') AS released;
-- release_run in the new ledger gives back the one lock of a run held in both;
-- like any release it stays given back when the transaction rolls back, and
-- the old ledger's run is no longer held: its next call takes a new lease
SELECT decision FROM durable_ledger.begin_effect('drop-14', 'pay', '{}');
BEGIN;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
SELECT decision FROM durable_ledger.begin_effect('drop-14', 'pay', '{}');
SELECT durable_ledger.release_run('drop-14') AS released;
ROLLBACK;
SELECT pg_temp.lease_locks() AS lease_locks;
SELECT decision, occurrence, status FROM durable_ledger.begin_effect('drop-14', 'pay', '{}');
SELECT epochs FROM durable_ledger.runs WHERE run = 'drop-14';
SELECT durable_ledger.release_run('drop-14') AS released;
-- a lease lost in the old ledger stays lost, although the new ledger took the
-- run's lock again: after the rollback the old run is refused (55000), and
-- the lock, the new ledger's, is given back
SELECT decision FROM durable_ledger.begin_effect('drop-15', 'pay', '{}');
SELECT pg_advisory_unlock_all();
BEGIN;
SAVEPOINT replace_ledger;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
SELECT decision FROM durable_ledger.begin_effect('drop-15', 'pay', '{"other": 1}');
ROLLBACK TO replace_ledger;
SELECT decision FROM durable_ledger.begin_effect('drop-15', 'pay', '{"n": 2}');
ROLLBACK;
SELECT decision FROM durable_ledger.begin_effect('drop-15', 'pay', '{"n": 2}');
SELECT pg_temp.lease_locks() AS lease_locks;
SELECT durable_ledger.acquire_run('drop-15') AS acquired;
SELECT durable_ledger.release_run('drop-15') AS released;
-- the old ledger's locks count against max_leases_per_session while they are
-- kept: a run of the same name takes no new lock, another run is refused (53400)
SET durable_ledger.max_leases_per_session = 2;
SELECT durable_ledger.acquire_run('drop-16a') AS a, durable_ledger.acquire_run('drop-16b') AS b;
BEGIN;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
SELECT decision FROM durable_ledger.begin_effect('drop-16a', 'pay', '{}');
SELECT durable_ledger.acquire_run('drop-16c') AS c;
ROLLBACK;
SELECT pg_temp.lease_locks() AS lease_locks;
SELECT durable_ledger.release_run('drop-16a') AS a, durable_ledger.release_run('drop-16b') AS b;
RESET durable_ledger.max_leases_per_session;
-- a PREPAREd replacement settles nothing until it is decided: rolled back,
-- the old ledger's lease goes on; committed, the old ledger's lock is given
-- back at the session's next commit
SELECT decision FROM durable_ledger.begin_effect('drop-17', 'pay', '{}');
BEGIN;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
SELECT durable_ledger.session_epoch('drop-17') AS epoch;
PREPARE TRANSACTION 'regress_drop_prepare';
ROLLBACK PREPARED 'regress_drop_prepare';
SELECT durable_ledger.session_epoch('drop-17') AS epoch;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-17', 'pay', '{}');
BEGIN;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
SELECT durable_ledger.session_epoch('drop-17') AS epoch;
PREPARE TRANSACTION 'regress_drop_prepare';
SELECT pg_temp.lease_locks() AS lease_locks;
COMMIT PREPARED 'regress_drop_prepare';
SELECT 1 AS any_commit;
SELECT pg_temp.lease_locks() AS lease_locks;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-17', 'pay', '{}');
SELECT epochs FROM durable_ledger.runs WHERE run = 'drop-17';
-- a replacement rolled back to a savepoint is prepared, and the lease goes on
BEGIN;
SAVEPOINT replace_ledger;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
SELECT durable_ledger.session_epoch('drop-17') AS epoch;
ROLLBACK TO replace_ledger;
PREPARE TRANSACTION 'regress_drop_prepare';
COMMIT PREPARED 'regress_drop_prepare';
SELECT durable_ledger.session_epoch('drop-17') AS epoch;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-17', 'pay', '{}');
SELECT pg_temp.lease_locks() AS lease_locks;
SELECT durable_ledger.release_run('drop-17') AS released;
-- a ledger replaced for good with no call in the new one gives the old one's
-- locks back at that commit (they were kept until the session's next call)
SELECT decision FROM durable_ledger.begin_effect('drop-18', 'pay', '{}');
BEGIN;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
COMMIT;
SELECT pg_temp.lease_locks() AS lease_locks;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-18', 'pay', '{}');
SELECT epochs FROM durable_ledger.runs WHERE run = 'drop-18';
SELECT durable_ledger.release_run('drop-18') AS released;
-- what a rolled-back replacement leaves does not refuse a later transaction's
-- PREPARE, though it GRANTs on the runs table: the old ledger's lease goes on,
-- the rolled-back ledger's lock is given back at the next commit (here, the
-- COMMIT PREPARED's)
CREATE ROLE regress_drop_reader NOLOGIN;
SELECT decision FROM durable_ledger.begin_effect('drop-19', 'pay', '{}');
BEGIN;
DROP EXTENSION durable_ledger;
CREATE EXTENSION durable_ledger;
SELECT durable_ledger.acquire_run('drop-19b') AS acquired;
ROLLBACK;
BEGIN;
GRANT SELECT ON durable_ledger.runs TO regress_drop_reader;
PREPARE TRANSACTION 'regress_drop_prepare';
COMMIT PREPARED 'regress_drop_prepare';
SELECT pg_temp.lease_locks() AS lease_locks;
SELECT durable_ledger.session_epoch('drop-19') AS epoch;
REVOKE SELECT ON durable_ledger.runs FROM regress_drop_reader;
DROP ROLE regress_drop_reader;
SELECT durable_ledger.release_run('drop-19') AS released;
-- the ledger is its runs table, whatever its name: renamed away and back, the
-- session's lease goes on (its lock is not given back at the rename's commit)
SELECT decision FROM durable_ledger.begin_effect('drop-20', 'pay', '{}');
ALTER TABLE durable_ledger.runs RENAME TO runs_moved;
SELECT pg_temp.lease_locks() AS lease_locks;
ALTER TABLE durable_ledger.runs_moved RENAME TO runs;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-20', 'pay', '{}');
SELECT epochs FROM durable_ledger.runs WHERE run = 'drop-20';
-- a PREPAREd DROP EXTENSION rolled back: the lease goes on
BEGIN;
DROP EXTENSION durable_ledger;
PREPARE TRANSACTION 'regress_drop_prepare';
ROLLBACK PREPARED 'regress_drop_prepare';
SELECT durable_ledger.session_epoch('drop-20') AS epoch;
SELECT durable_ledger.release_run('drop-20') AS released;
-- a runs table detached from the extension and kept when the ledger is
-- replaced keeps the lock of a run held in it while it exists (given up at
-- the session's next call in the new ledger, or once the table is dropped)
SELECT decision FROM durable_ledger.begin_effect('drop-21', 'pay', '{}');
BEGIN;
ALTER EXTENSION durable_ledger DROP TABLE durable_ledger.runs;
ALTER TABLE durable_ledger.runs SET SCHEMA public;
DROP EXTENSION durable_ledger CASCADE;
CREATE EXTENSION durable_ledger;
COMMIT;
SELECT pg_temp.lease_locks() AS lease_locks;
DROP TABLE public.runs;
SELECT pg_temp.lease_locks() AS lease_locks;
-- a runs table renamed away while another table takes its name is the same
-- ledger when it comes back: an unrelated commit in between gives nothing up
SELECT decision FROM durable_ledger.begin_effect('drop-21b', 'pay', '{}');
SELECT dblink_connect('regress_fresh', 'dbname=' || current_database());
SELECT dblink_exec('regress_fresh', 'BEGIN');
SELECT dblink_exec('regress_fresh', 'ALTER TABLE durable_ledger.runs RENAME TO runs_away');
SELECT dblink_exec('regress_fresh', 'CREATE TABLE durable_ledger.runs (note text)');
SELECT dblink_exec('regress_fresh', 'COMMIT');
SELECT 1 AS any_commit;
SELECT pg_temp.lease_locks() AS lease_locks;
SELECT dblink_exec('regress_fresh', 'BEGIN');
SELECT dblink_exec('regress_fresh', 'DROP TABLE durable_ledger.runs');
SELECT dblink_exec('regress_fresh', 'ALTER TABLE durable_ledger.runs_away RENAME TO runs');
SELECT dblink_exec('regress_fresh', 'COMMIT');
SELECT dblink_disconnect('regress_fresh');
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-21b', 'pay', '{}');
SELECT epochs FROM durable_ledger.runs WHERE run = 'drop-21b';
SELECT durable_ledger.release_run('drop-21b') AS released;
-- a session that renames the runs table away, makes another under the name
-- and calls it, then swaps the two back before it commits: the commit keeps
-- the ledger the catalogs name, and the lease in it goes on
SELECT decision FROM durable_ledger.begin_effect('drop-24', 'pay', '{}');
BEGIN;
ALTER TABLE durable_ledger.runs RENAME TO runs_old;
CREATE TABLE durable_ledger.runs (LIKE durable_ledger.runs_old INCLUDING ALL);
SELECT durable_ledger.acquire_run('drop-24b') AS acquired;
ALTER TABLE durable_ledger.runs RENAME TO runs_b;
ALTER TABLE durable_ledger.runs_old RENAME TO runs;
COMMIT;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-24', 'pay', '{}');
SELECT epochs FROM durable_ledger.runs WHERE run = 'drop-24';
SELECT pg_temp.lease_locks() AS lease_locks;
DROP TABLE durable_ledger.runs_b;
SELECT durable_ledger.release_run('drop-24') AS released;
-- detached from the extension but still durable_ledger.runs, the table is the
-- one the ledger's calls use: the lease goes on, through an invalidation of
-- the table (ANALYZE) and a commit
SELECT decision FROM durable_ledger.begin_effect('drop-23', 'pay', '{}');
ALTER EXTENSION durable_ledger DROP TABLE durable_ledger.runs;
ANALYZE durable_ledger.runs;
SELECT 1 AS any_commit;
SELECT pg_temp.lease_locks() AS lease_locks;
SELECT decision, occurrence FROM durable_ledger.begin_effect('drop-23', 'pay', '{}');
ALTER EXTENSION durable_ledger ADD TABLE durable_ledger.runs;
SELECT durable_ledger.release_run('drop-23') AS released;
SELECT decision FROM durable_ledger.begin_effect('drop-22', 'pay', '{}');
-- a ledger another session dropped while this transaction ran: it is
-- prepared, and the dropped ledger's lock given back at the next commit
BEGIN;
SELECT dblink_connect('regress_fresh', 'dbname=' || current_database());
SELECT dblink_exec('regress_fresh', 'SET durable_ledger.allow_drop = on');
SELECT dblink_exec('regress_fresh', 'DROP EXTENSION durable_ledger');
SELECT dblink_disconnect('regress_fresh');
CREATE TABLE public.regress_drop_note (x int);
PREPARE TRANSACTION 'regress_drop_prepare';
COMMIT PREPARED 'regress_drop_prepare';
SELECT pg_temp.lease_locks() AS lease_locks;
DROP TABLE public.regress_drop_note;
CREATE EXTENSION durable_ledger;
DROP EXTENSION durable_ledger;
RESET durable_ledger.allow_drop;

-- ==== leave a clean database: the extension installed, its ledger empty ====
CREATE EXTENSION durable_ledger;
SELECT extname, pg_get_userbyid(extowner) = current_user AS owned_by_me,
       (SELECT count(*) FROM durable_ledger.effects) AS effects
  FROM pg_extension WHERE extname = 'durable_ledger';
SELECT count(*) AS regress_roles FROM pg_roles WHERE rolname LIKE 'regress_drop%';
