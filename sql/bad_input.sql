-- bad_input: a NULL where a value is required is refused with 22004, an empty or
-- too long name with 22023, an unknown key with 42704 (effect_status: no row, no
-- error), and a refused call writes nothing, takes no lease and advances no
-- occurrence counter; hostile-looking but valid text is stored exactly as given.
\set VERBOSITY default

-- Runs stmt; returns its SQLSTATE (or 'ok') and whether the ledger tables or this
-- session's leases changed.
CREATE FUNCTION pg_temp.attempt(stmt text) RETURNS text
LANGUAGE plpgsql AS $fn$
DECLARE
    state text := 'ok';
    before bigint[];
    after bigint[];
BEGIN
    SELECT ARRAY[(SELECT count(*) FROM durable_ledger.effects),
                 (SELECT count(*) FROM durable_ledger.runs),
                 (SELECT count(*) FROM durable_ledger.audit_log),
                 (SELECT count(*) FROM pg_catalog.pg_locks
                   WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid())]
      INTO before;
    BEGIN
        EXECUTE stmt;
    EXCEPTION WHEN OTHERS THEN
        state := SQLSTATE;
    END;
    SELECT ARRAY[(SELECT count(*) FROM durable_ledger.effects),
                 (SELECT count(*) FROM durable_ledger.runs),
                 (SELECT count(*) FROM durable_ledger.audit_log),
                 (SELECT count(*) FROM pg_catalog.pg_locks
                   WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid())]
      INTO after;
    IF before IS DISTINCT FROM after THEN
        state := state || ' (changed: ' || before::text || ' -> ' || after::text || ')';
    END IF;
    RETURN state;
END
$fn$;

-- a run with a lease and some effects to aim the bad calls at
SELECT durable_ledger.acquire_run('bad-1') AS acquired;
SELECT key AS k_started FROM durable_ledger.begin_effect('bad-1', 'pay', '{"n": 1}') \gset
SELECT key AS k_done FROM durable_ledger.begin_effect('bad-1', 'mail', '{}') \gset
SELECT status FROM durable_ledger.complete_effect(:'k_done', '{"ok": true}');

SELECT count(*) AS effects_before FROM durable_ledger.effects \gset
SELECT count(*) AS runs_before FROM durable_ledger.runs \gset
SELECT count(*) AS audit_before FROM durable_ledger.audit_log \gset

-- NULLs and empty strings, function by function
SELECT n, stmt, pg_temp.attempt(stmt) AS outcome
  FROM (VALUES
        -- begin_effect: run, tool, args required; business_key may be NULL but not empty
        (101, $$SELECT durable_ledger.begin_effect(NULL, 'pay', '{}')$$),
        (102, $$SELECT durable_ledger.begin_effect('', 'pay', '{}')$$),
        (103, $$SELECT durable_ledger.begin_effect('bad-1', NULL, '{}')$$),
        (104, $$SELECT durable_ledger.begin_effect('bad-1', '', '{}')$$),
        (105, $$SELECT durable_ledger.begin_effect('bad-1', 'pay', NULL)$$),
        (106, $$SELECT durable_ledger.begin_effect('bad-new', 'pay', NULL)$$),
        (107, $$SELECT durable_ledger.begin_effect('bad-1', 'pay', '{}', business_key => '')$$),
        (108, $$SELECT durable_ledger.begin_effect('bad-new', 'pay', '{}', business_key => '')$$),
        (109, $$SELECT durable_ledger.begin_effect(NULL, NULL, NULL, NULL, NULL)$$),
        -- complete_effect, fail_effect: key required
        (201, $$SELECT durable_ledger.complete_effect(NULL, '{}')$$),
        (202, $$SELECT durable_ledger.complete_effect('', '{}')$$),
        (203, $$SELECT durable_ledger.fail_effect(NULL, '{}')$$),
        (204, $$SELECT durable_ledger.fail_effect('', '{}')$$),
        -- resolve_effect: key, outcome, resolved_by required; outcome is completed or failed
        (301, $$SELECT durable_ledger.resolve_effect(NULL, 'failed', NULL, 'me')$$),
        (302, $$SELECT durable_ledger.resolve_effect('', 'failed', NULL, 'me')$$),
        (303, $$SELECT durable_ledger.resolve_effect('$$ || :'k_started' || $$', NULL, NULL, 'me')$$),
        (304, $$SELECT durable_ledger.resolve_effect('$$ || :'k_started' || $$', '', NULL, 'me')$$),
        (305, $$SELECT durable_ledger.resolve_effect('$$ || :'k_started' || $$', 'maybe', NULL, 'me')$$),
        (306, $$SELECT durable_ledger.resolve_effect('$$ || :'k_started' || $$', 'Completed', NULL, 'me')$$),
        (307, $$SELECT durable_ledger.resolve_effect('$$ || :'k_started' || $$', 'failed', NULL, NULL)$$),
        (308, $$SELECT durable_ledger.resolve_effect('$$ || :'k_started' || $$', 'failed', NULL, '')$$),
        -- effect_status, effect_key
        (401, $$SELECT * FROM durable_ledger.effect_status(NULL)$$),
        (402, $$SELECT * FROM durable_ledger.effect_status('')$$),
        (403, $$SELECT durable_ledger.effect_key(NULL, 'pay', '{}', 1)$$),
        (404, $$SELECT durable_ledger.effect_key('', 'pay', '{}', 1)$$),
        (405, $$SELECT durable_ledger.effect_key('bad-1', NULL, '{}', 1)$$),
        (406, $$SELECT durable_ledger.effect_key('bad-1', '', '{}', 1)$$),
        (407, $$SELECT durable_ledger.effect_key('bad-1', 'pay', NULL, 1)$$),
        (408, $$SELECT durable_ledger.effect_key('bad-1', 'pay', '{}', NULL)$$),
        (409, $$SELECT durable_ledger.effect_key('bad-1', 'pay', '{}', 0)$$),
        -- acquire_run, release_run, break_lease
        (501, $$SELECT durable_ledger.acquire_run(NULL)$$),
        (502, $$SELECT durable_ledger.acquire_run('')$$),
        (503, $$SELECT durable_ledger.acquire_run('bad-new', NULL)$$),
        (504, $$SELECT durable_ledger.acquire_run('bad-1', NULL)$$),
        (505, $$SELECT durable_ledger.acquire_run(NULL, false)$$),
        (506, $$SELECT durable_ledger.release_run(NULL)$$),
        (507, $$SELECT durable_ledger.release_run('')$$),
        (508, $$SELECT durable_ledger.break_lease(NULL, 'me')$$),
        (509, $$SELECT durable_ledger.break_lease('', 'me')$$),
        (510, $$SELECT durable_ledger.break_lease('bad-1', NULL)$$),
        (511, $$SELECT durable_ledger.break_lease('bad-1', '')$$),
        (512, $$SELECT durable_ledger.break_lease('bad-new', NULL, 'note')$$),
        -- canonical_args
        (601, $$SELECT durable_ledger.canonical_args(NULL)$$)
       ) AS t(n, stmt)
 ORDER BY n;

-- Unknown keys: 42704 for the writers, no row (and no error) for effect_status
SELECT n, stmt, pg_temp.attempt(stmt) AS outcome
  FROM (VALUES
        (1, $$SELECT durable_ledger.complete_effect('bad-no-such-key', '{}')$$),
        (2, $$SELECT durable_ledger.fail_effect('bad-no-such-key', '{}')$$),
        (3, $$SELECT durable_ledger.resolve_effect('bad-no-such-key', 'failed', NULL, 'me')$$),
        (4, $$SELECT durable_ledger.complete_effect(repeat('0', 64), NULL)$$),
        (5, $$SELECT durable_ledger.complete_effect($q$' OR true --$q$, '{}')$$),
        (6, $$SELECT durable_ledger.complete_effect(upper('$$ || :'k_done' || $$'), '{"ok": true}')$$),
        (7, $$SELECT durable_ledger.complete_effect(' $$ || :'k_done' || $$', '{"ok": true}')$$)
       ) AS t(n, stmt)
 ORDER BY n;
SELECT count(*) AS rows FROM durable_ledger.effect_status('bad-no-such-key');
SELECT count(*) AS rows FROM durable_ledger.effect_status($q$' OR true --$q$);
SELECT count(*) AS rows FROM durable_ledger.effect_status(upper(:'k_done'));

-- Lengths are characters: run 512 and tool 255 are fine, one more is 22023.
SELECT n, stmt, pg_temp.attempt(stmt) AS outcome
  FROM (VALUES
        (1, $$SELECT durable_ledger.begin_effect(repeat('r', 513), 'pay', '{}')$$),
        (2, $$SELECT durable_ledger.begin_effect('bad-1', repeat('t', 256), '{}')$$),
        (3, $$SELECT durable_ledger.begin_effect(repeat('é', 513), 'pay', '{}')$$),
        (4, $$SELECT durable_ledger.begin_effect('bad-1', repeat('😀', 256), '{}')$$),
        (5, $$SELECT durable_ledger.begin_effect('bad-1', 'pay', '{}', business_key => repeat('b', 256))$$),
        (6, $$SELECT durable_ledger.acquire_run(repeat('r', 513))$$),
        (7, $$SELECT durable_ledger.release_run(repeat('r', 513))$$),
        (8, $$SELECT durable_ledger.break_lease(repeat('r', 513), 'me')$$),
        (9, $$SELECT durable_ledger.effect_key(repeat('r', 513), 'pay', '{}', 1)$$),
        (10, $$SELECT durable_ledger.effect_key('bad-1', repeat('t', 256), '{}', 1)$$)
       ) AS t(n, stmt)
 ORDER BY n;

-- after all of that: not a row more, and the run's occurrence counters did not move
SELECT (SELECT count(*) FROM durable_ledger.effects) - :effects_before AS new_effects,
       (SELECT count(*) FROM durable_ledger.runs) - :runs_before AS new_runs,
       (SELECT count(*) FROM durable_ledger.audit_log) - :audit_before AS new_audit_rows,
       (SELECT count(*) FROM durable_ledger.runs WHERE run LIKE 'bad-new%') AS bad_new_runs;
SELECT count(*) AS my_leases FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid();
SELECT decision, occurrence FROM durable_ledger.begin_effect('bad-1', 'refund', '{}');
-- (the first pay call of this epoch was made before the bad calls: this is the second)
SELECT decision, occurrence, key = durable_ledger.effect_key('bad-1', 'pay', '{"n": 1}', 2) AS is_occurrence_2
  FROM durable_ledger.begin_effect('bad-1', 'pay', '{"n": 1}');
SELECT status FROM durable_ledger.effect_status(:'k_started');

-- the messages say which argument is wrong
\set VERBOSITY default
SELECT durable_ledger.begin_effect('bad-1', NULL, '{}');
SELECT durable_ledger.begin_effect('bad-1', 'pay', NULL);
SELECT durable_ledger.begin_effect('bad-1', '', '{}');
SELECT durable_ledger.acquire_run('bad-1', NULL);
SELECT durable_ledger.begin_effect(repeat('r', 513), 'pay', '{}');
SELECT durable_ledger.complete_effect('bad-no-such-key', '{}');
\set VERBOSITY default

-- Exactly at the limits is accepted (and multibyte characters count as one).
SELECT decision FROM durable_ledger.begin_effect(repeat('r', 512), 'pay', '{}');
SELECT length(run) AS run_chars, octet_length(run) AS run_bytes FROM durable_ledger.effects WHERE run = repeat('r', 512);
SELECT decision FROM durable_ledger.begin_effect('bad-1', repeat('t', 255), '{}');
SELECT decision FROM durable_ledger.begin_effect(repeat('é', 512), 'pay', '{}');
SELECT length(run) AS run_chars, octet_length(run) AS run_bytes FROM durable_ledger.effects WHERE run = repeat('é', 512);
SELECT decision FROM durable_ledger.begin_effect('bad-1', repeat('😀', 255), '{}');
SELECT length(tool) AS tool_chars, octet_length(tool) AS tool_bytes FROM durable_ledger.effects
 WHERE run = 'bad-1' AND tool IN (repeat('t', 255), repeat('😀', 255)) ORDER BY 2;
SELECT decision, length(key) FROM durable_ledger.begin_effect('bad-1', 'ship', '{}', business_key => repeat('b', 255));
SELECT durable_ledger.release_run(repeat('r', 512)) AS released_512,
       durable_ledger.release_run(repeat('é', 512)) AS released_512_multibyte;
SELECT durable_ledger.acquire_run(repeat('r', 512)) AS acquired_512,
       durable_ledger.release_run(repeat('r', 512)) AS released_512;
SELECT durable_ledger.effect_key(repeat('r', 512), repeat('t', 255), '{}', 1) ~ '^[0-9a-f]{64}$' AS key_at_limits;
SELECT durable_ledger.break_lease(repeat('r', 512), 'me') AS broken;

-- Optional arguments may be NULL; JSON null is a valid args value.
SELECT decision, status FROM durable_ledger.begin_effect('bad-1', 'noop', 'null');
SELECT decision, status FROM durable_ledger.begin_effect('bad-1', 'noop2', '{}', NULL, NULL);
SELECT key AS k_nullres FROM durable_ledger.begin_effect('bad-1', 'noop3', '{}') \gset
SELECT status, result IS NULL AS result_is_null FROM durable_ledger.complete_effect(:'k_nullres', NULL);
SELECT status, result IS NULL AS result_is_null FROM durable_ledger.complete_effect(:'k_nullres', NULL);
SELECT key AS k_nullerr FROM durable_ledger.begin_effect('bad-1', 'noop4', '{}') \gset
SELECT status, error IS NULL AS error_is_null FROM durable_ledger.fail_effect(:'k_nullerr', NULL);
SELECT args FROM durable_ledger.effects WHERE run = 'bad-1' AND tool = 'noop';

-- Hostile-looking but valid text: stored and found exactly as given.
\set hostile_run 'bad-''; DROP TABLE durable_ledger.effects; --\t"\\😀'
\set hostile_tool 'tool"\x01\n<script>'
\set hostile_bk 'bk-''"\\%_ 😀\r'
SELECT length(:'hostile_run') AS run_chars, octet_length(:'hostile_tool') AS tool_bytes,
       :'hostile_tool' ~ '[\x01]' AS tool_has_control_char;
SELECT key AS k_hostile, decision FROM durable_ledger.begin_effect(:'hostile_run', :'hostile_tool', '{"q": "''; --", "c": "\u0007"}') \gset
SELECT :'decision' AS decision;
SELECT run = :'hostile_run' AS run_exact, tool = :'hostile_tool' AS tool_exact,
       args = '{"q": "''; --", "c": "\u0007"}'::jsonb AS args_exact,
       key = durable_ledger.effect_key(:'hostile_run', :'hostile_tool', '{"c": "\u0007", "q": "''; --"}', 1) AS key_is_derived
  FROM durable_ledger.effects WHERE key = :'k_hostile';
SELECT status, run = :'hostile_run' AS run_exact FROM durable_ledger.complete_effect(:'k_hostile', '{"ok": "😀"}');
SELECT key = :'hostile_bk' AS key_is_text, decision
  FROM durable_ledger.begin_effect(:'hostile_run', :'hostile_tool', '{}', business_key => :'hostile_bk');
SELECT status, business_key, run = :'hostile_run' AS run_exact FROM durable_ledger.effect_status(:'hostile_bk');
SELECT status FROM durable_ledger.fail_effect(:'hostile_bk', '{"why": "\\"}');
SELECT event, run = :'hostile_run' AS run_exact
  FROM durable_ledger.audit_log WHERE run = :'hostile_run' ORDER BY id;
SELECT run = :'hostile_run' AS run_exact, holder_pid = pg_backend_pid() AS mine
  FROM durable_ledger.leases WHERE run = :'hostile_run';
-- LIKE metacharacters are not patterns: a similar-looking key is unknown
SELECT count(*) AS rows FROM durable_ledger.effect_status(replace(:'hostile_bk', '%', 'x'));
SELECT durable_ledger.complete_effect('bk-%', NULL);
SELECT to_regclass('durable_ledger.effects') IS NOT NULL AS effects_table_still_there;

-- clean up the leases
SELECT durable_ledger.release_run(:'hostile_run') AS released, durable_ledger.release_run('bad-1') AS released;
SELECT count(*) AS my_leases FROM pg_locks
 WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = pg_backend_pid();
