-- hostile_input: input that tries to break the ledger gets a clear error or a
-- correct row: never a crash, never a silent truncation.
\set VERBOSITY default

-- quotes, backslashes and NUL-free control characters in run, tool and business key
SELECT decision, occurrence, octet_length(key) AS key_bytes
  FROM durable_ledger.begin_effect(E'hi''"\\\x01\x1f\t\nrun', E'to''ol\x7f', '{"a": "\u0001"}');
SELECT run = E'hi''"\\\x01\x1f\t\nrun' AS run_intact, tool = E'to''ol\x7f' AS tool_intact,
       key = durable_ledger.effect_key(run, tool, args, occurrence) AS key_checks_out
  FROM durable_ledger.effects WHERE run = E'hi''"\\\x01\x1f\t\nrun';
SELECT decision, key = E'INV-\x02''; DROP TABLE x; --' AS key_is_the_text
  FROM durable_ledger.begin_effect('hostile-bk', 'pay', '{}', E'INV-\x02''; DROP TABLE x; --');

-- 1 MB of args: stored whole, keyed whole
SELECT decision, occurrence
  FROM durable_ledger.begin_effect('hostile-big', 'upload',
                                   jsonb_build_object('blob', repeat('x', 1048576)));
SELECT octet_length(args ->> 'blob') AS blob_bytes,
       key = durable_ledger.effect_key(run, tool, args, occurrence) AS key_checks_out
  FROM durable_ledger.effects WHERE run = 'hostile-big';
-- one byte more is another call
SELECT decision, occurrence
  FROM durable_ledger.begin_effect('hostile-big', 'upload',
                                   jsonb_build_object('blob', repeat('x', 1048576) || 'y'));

-- deep nesting: 5,000 levels are canonicalised without recursion
SELECT decision
  FROM durable_ledger.begin_effect('hostile-deep', 'nest',
                                   (repeat('[', 5000) || '1' || repeat(']', 5000))::jsonb);
SELECT length(durable_ledger.canonical_args((repeat('[', 5000) || '1' || repeat(']', 5000))::jsonb)) AS canonical_length;
SELECT durable_ledger.canonical_args((repeat('{"a":', 3000) || 'null' || repeat('}', 3000))::jsonb)
       = repeat('{"a":', 3000) || 'null' || repeat('}', 3000) AS deep_objects_canonical;

-- numbers at the edges of numeric: exact, in plain decimal
SELECT durable_ledger.canonical_args('[1e400, -1e-400, 123456789012345678901234567890.1234567890000]')
       = '[1' || repeat('0', 400) || ',-0.' || repeat('0', 399) || '1,'
         || '123456789012345678901234567890.123456789]' AS exact_plain_decimals;
-- 1e400 and 10e399 are one number: the second call is occurrence 2 of the same call
SELECT decision, occurrence FROM durable_ledger.begin_effect('hostile-num', 'pay', '{"amount": 1e400}');
SELECT decision, occurrence FROM durable_ledger.begin_effect('hostile-num', 'pay', '{"amount": 10e399}');
-- a number jsonb itself cannot hold: the input is refused before the ledger sees it
SELECT durable_ledger.begin_effect('hostile-num', 'pay', '{"amount": 1e1000000}');
-- numbers that jsonb holds in a few bytes but that take a character per digit
-- written out: a number may add 324 zeros beyond its significant digits (as
-- many as any double needs), and args 1,024 more in all, so 100 kB of them
-- cost no gigabyte: refused at once (22023), nothing written; one such number
-- alone, or a string of escaped control characters (6 times longer), is keyed
SELECT (SELECT count(*) FROM durable_ledger.effects) || '/' || (SELECT count(*) FROM durable_ledger.audit_log) AS before \gset
SELECT regress_sqlstate($$SELECT durable_ledger.canonical_args(('[' || repeat('1e131071,', 12000) || '1]')::jsonb)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.effect_key('hostile-num', 'pay', '{"amount": 1e131071}', 1)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('hostile-num', 'pay', ('[' || repeat('1e131071,', 12000) || '1]')::jsonb)$$);
SELECT (SELECT count(*) FROM durable_ledger.effects) || '/' || (SELECT count(*) FROM durable_ledger.audit_log) = :'before' AS nothing_written;
SELECT length(durable_ledger.canonical_args('[1e1000]')) AS within_the_bound,
       length(durable_ledger.canonical_args(jsonb_build_array(repeat(E'\x01', 10000)))) AS escaped_controls;
-- any double stays well within the bound: args of many floats at the edges
-- of a double (1e-300 takes 302 characters, the smallest normal double 327,
-- 16 bytes each in jsonb) are keyed, while longer numbers are refused
SELECT length(durable_ledger.canonical_args(('[' || repeat('1e-300,', 999) || '-2.2250738585072014e-308]')::jsonb)) AS tiny_doubles,
       length(durable_ledger.canonical_args(('[' || repeat('1.7976931348623157e308,', 999) || '1]')::jsonb)) AS huge_doubles;
SELECT decision, occurrence
  FROM durable_ledger.begin_effect('hostile-num', 'pay', ('{"rates": [' || repeat('1e-300,', 99) || '1e-300]}')::jsonb);
SELECT regress_sqlstate($$SELECT durable_ledger.canonical_args(('[' || repeat('1e-1000,', 2000) || '1]')::jsonb)$$) AS longer_numbers;
-- and whatever their size, the text never takes more than 128 MB: 25 MB of
-- control characters (150 MB escaped) are refused, not run out of memory
SELECT regress_sqlstate($$SELECT durable_ledger.canonical_args(jsonb_build_array(repeat(E'\x01', 25000000)))$$) AS past_128_mb;
SELECT durable_ledger.canonical_args('[1e20000]');
-- the bound depends on the value alone, not on its spelling or stored size
-- (review: 1.0000... is stored in more bytes than 1, and passed a bound that
-- 1 did not): equal args are both keyed, or both refused
SELECT durable_ledger.canonical_args('[1e1348, 1]') = durable_ledger.canonical_args(('[1e1348, 1.' || repeat('0', 70) || ']')::jsonb) AS equal_spellings_keyed;
SELECT regress_sqlstate($$SELECT durable_ledger.canonical_args('[1e1349, 1]')$$) AS shorter_refused,
       regress_sqlstate($$SELECT durable_ledger.canonical_args(('[1e1349, 1.' || repeat('0', 70) || ']')::jsonb)$$) AS longer_refused;

-- text that only looks like non-UTF-8 is ordinary text; invalid bytes never get in
SELECT decision, key FROM durable_ledger.begin_effect('hostile-bytes', 'pay', '{"s": "\\xff\\xfe"}', '\xff\xfe Ã©');
SELECT durable_ledger.begin_effect(convert_from('\xff'::bytea, 'UTF8'), 'pay', '{}');

-- a business key as long as allowed in 4-byte characters: not truncated
SELECT decision, char_length(key) AS chars, octet_length(key) AS bytes
  FROM durable_ledger.begin_effect('hostile-long', 'pay', '{}', repeat('😀', 255));

-- a run and a tool as long as allowed in 4-byte characters would not fit in
-- the index entry that holds both: refused up front (22023, not the index's
-- 54000), nothing written; within 2,600 bytes together they are accepted,
-- for a fork's new run too
SELECT (SELECT count(*) FROM durable_ledger.effects) || '/' || (SELECT count(*) FROM durable_ledger.audit_log) AS before \gset
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect(repeat('😀', 512), repeat('😀', 255), '{}')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.begin_recorded(repeat('😀', 512), repeat('😀', 255), '{}')$$);
SELECT (SELECT count(*) FROM durable_ledger.effects) || '/' || (SELECT count(*) FROM durable_ledger.audit_log) = :'before' AS nothing_written;
SELECT decision FROM durable_ledger.begin_effect(repeat('😀', 512), repeat('😀', 138), '{}');
SELECT octet_length(run) + octet_length(tool) AS bytes FROM durable_ledger.effects WHERE run = repeat('😀', 512);
SELECT (durable_ledger.complete_effect(key, '{}')).status
  FROM durable_ledger.begin_effect('hostile-fork', repeat('😀', 255), '{}');
SELECT regress_sqlstate(format($$SELECT durable_ledger.fork_run('hostile-fork', repeat('😃', 512), %L, 'regress')$$,
       durable_ledger.effect_key('hostile-fork', repeat('😀', 255), '{}', 1)));
SELECT durable_ledger.fork_run('hostile-fork', repeat('😀', 300), durable_ledger.effect_key('hostile-fork', repeat('😀', 255), '{}', 1),
       'regress') AS carried;

-- a transaction that calls the ledger for many runs keeps a lock or two per
-- run until it ends, in the lock table all sessions share: past
-- durable_ledger.max_runs_per_transaction runs (1,000) the next run's call
-- fails with the ledger's own 53400, not "out of shared memory" for everyone;
-- a run called again does not count again, and the count ends with the
-- transaction (here with a limit of 3, under token leases: no limit of
-- session leases is met first)
CREATE TEMP TABLE hostile_many AS
  SELECT i, (durable_ledger.take_lease('hostile-many-' || i, '1 minute')).token
    FROM generate_series(1, 4) i;
SET durable_ledger.max_runs_per_transaction = 3;
BEGIN;
SELECT m.i, d.decision FROM hostile_many m,
       LATERAL durable_ledger.begin_effect('hostile-many-' || m.i, 'pay', '{}', lease => m.token) d
 WHERE m.i <= 3 ORDER BY m.i;
SELECT decision FROM durable_ledger.begin_effect('hostile-many-1', 'pay', '{"again": 1}',
                                                 lease => (SELECT token FROM hostile_many WHERE i = 1));
SELECT regress_sqlstate(format($$SELECT durable_ledger.begin_effect('hostile-many-4', 'pay', '{}', lease => %L)$$,
                               (SELECT token FROM hostile_many WHERE i = 4)));
-- a renewal locks its run too
SELECT regress_sqlstate(format($$SELECT durable_ledger.renew_lease(%L)$$, (SELECT token FROM hostile_many WHERE i = 4)));
COMMIT;
-- a run locked again after a rolled-back savepoint counts once
BEGIN;
DO $$
DECLARE t text := (SELECT token FROM hostile_many WHERE i = 1);
BEGIN
    FOR n IN 1..10 LOOP
        BEGIN
            PERFORM durable_ledger.begin_effect('hostile-many-1', 'pay', jsonb_build_object('n', n), lease => t);
            RAISE EXCEPTION 'undo';
        EXCEPTION WHEN raise_exception THEN NULL;
        END;
    END LOOP;
END $$;
SELECT count(*) AS renewed FROM hostile_many WHERE i <= 3 AND durable_ledger.renew_lease(token) IS NOT NULL;
COMMIT;
SELECT decision FROM durable_ledger.begin_effect('hostile-many-4', 'pay', '{}',
                                                 lease => (SELECT token FROM hostile_many WHERE i = 4));
RESET durable_ledger.max_runs_per_transaction;
SELECT count(*) FILTER (WHERE durable_ledger.release_lease(token)) AS released FROM hostile_many;
DROP TABLE hostile_many;

SELECT durable_ledger.release_run(r)
  FROM unnest(ARRAY[E'hi''"\\\x01\x1f\t\nrun', 'hostile-bk', 'hostile-big', 'hostile-deep',
                    'hostile-num', 'hostile-bytes', 'hostile-long', repeat('😀', 512),
                    'hostile-fork']) AS r;
