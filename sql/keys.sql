-- keys: a derived key is the lowercase hex SHA-256 of the documented key material, so
-- every stored key can be recomputed in plain SQL with pgcrypto's digest(); effect_key()
-- gives the same key without writing anything; a business key is the text itself.
\set VERBOSITY default

-- what begin_effect answered, call by call
CREATE TEMP TABLE key_calls (n int PRIMARY KEY, run text, tool text, args jsonb, d_key text,
                             decision text, occurrence int);

INSERT INTO key_calls SELECT 1, 'key-1', 'send_email', '{"to": "a@example.com", "n": 1}', d.key, d.decision, d.occurrence
  FROM durable_ledger.begin_effect('key-1', 'send_email', '{"to": "a@example.com", "n": 1}') d;
-- the same call again in the same lease: occurrence 2, another key (1.0 is 1)
INSERT INTO key_calls SELECT 2, 'key-1', 'send_email', '{"n": 1.0, "to": "a@example.com"}', d.key, d.decision, d.occurrence
  FROM durable_ledger.begin_effect('key-1', 'send_email', '{"n": 1.0, "to": "a@example.com"}') d;
INSERT INTO key_calls SELECT 3, 'key-1', 'charge', '{"amount": 12.50, "currency": "EUR"}', d.key, d.decision, d.occurrence
  FROM durable_ledger.begin_effect('key-1', 'charge', '{"amount": 12.50, "currency": "EUR"}') d;
-- '|' in run and tool: the byte lengths keep the material unambiguous
INSERT INTO key_calls SELECT 4, 'key-2|a|b', 'tool|with|pipes', '["|", "||"]', d.key, d.decision, d.occurrence
  FROM durable_ledger.begin_effect('key-2|a|b', 'tool|with|pipes', '["|", "||"]') d;
-- multibyte run, tool and args
INSERT INTO key_calls SELECT 5, 'key-3-ünïcødé-日本', 'outil_é', '{"nom": "café", "emoji": "😀"}', d.key, d.decision, d.occurrence
  FROM durable_ledger.begin_effect('key-3-ünïcødé-日本', 'outil_é', '{"nom": "café", "emoji": "😀"}') d;
INSERT INTO key_calls SELECT 6, 'key-4-😀', '📧', 'null', d.key, d.decision, d.occurrence
  FROM durable_ledger.begin_effect('key-4-😀', '📧', 'null') d;
-- scalar and nested args, quotes and backslashes
INSERT INTO key_calls SELECT 7, 'key-1', 'note', E'"say \\"hi\\" \\\\ bye"', d.key, d.decision, d.occurrence
  FROM durable_ledger.begin_effect('key-1', 'note', E'"say \\"hi\\" \\\\ bye"') d;
INSERT INTO key_calls SELECT 8, 'key-1', 'nested', '{"b": [1, {"y": -0, "x": 1e2}], "a": {}}', d.key, d.decision, d.occurrence
  FROM durable_ledger.begin_effect('key-1', 'nested', '{"b": [1, {"y": -0, "x": 1e2}], "a": {}}') d;
-- a third identical call: occurrence 3
INSERT INTO key_calls SELECT 9, 'key-1', 'send_email', '{"to": "a@example.com", "n": 10e-1}', d.key, d.decision, d.occurrence
  FROM durable_ledger.begin_effect('key-1', 'send_email', '{"to": "a@example.com", "n": 10e-1}') d;

SELECT n, run, tool, decision, occurrence FROM key_calls ORDER BY n;

-- keys are 64 lowercase hex digits, all distinct
SELECT count(*) AS calls, count(DISTINCT d_key) AS distinct_keys,
       bool_and(d_key ~ '^[0-9a-f]{64}$') AS all_lowercase_hex
  FROM key_calls;

-- the stored rows carry the keys begin_effect returned
SELECT c.n, e.key = c.d_key AS stored_key_is_returned_key, e.occurrence, e.business_key
  FROM key_calls c JOIN durable_ledger.effects e ON e.key = c.d_key
 ORDER BY c.n;

-- every stored derived key of these runs equals the plain-SQL recomputation, and effect_key()
SELECT e.run, e.tool, e.occurrence,
       e.key = encode(digest(convert_to(concat_ws('|', 'durable_ledger.v1',
                        octet_length(e.run), e.run, octet_length(e.tool), e.tool,
                        e.occurrence, durable_ledger.canonical_args(e.args)), 'UTF8'), 'sha256'), 'hex')
         AS key_is_recomputed,
       e.key = durable_ledger.effect_key(e.run, e.tool, e.args, e.occurrence) AS key_is_effect_key
  FROM durable_ledger.effects e
 WHERE e.run LIKE 'key-%' AND NOT e.business_key
 ORDER BY e.run, e.tool, e.occurrence;

SELECT count(*) AS derived_keys,
       count(*) FILTER (WHERE e.key = encode(digest(convert_to(concat_ws('|', 'durable_ledger.v1',
                        octet_length(e.run), e.run, octet_length(e.tool), e.tool,
                        e.occurrence, durable_ledger.canonical_args(e.args)), 'UTF8'), 'sha256'), 'hex')) AS recomputed,
       count(*) FILTER (WHERE e.key = durable_ledger.effect_key(e.run, e.tool, e.args, e.occurrence)) AS effect_key_equal
  FROM durable_ledger.effects e
 WHERE e.run LIKE 'key-%' AND NOT e.business_key;

-- the lengths are bytes, not characters: with char_length the multibyte keys do not match
SELECT e.run, e.key = encode(digest(convert_to(concat_ws('|', 'durable_ledger.v1',
                        char_length(e.run), e.run, char_length(e.tool), e.tool,
                        e.occurrence, durable_ledger.canonical_args(e.args)), 'UTF8'), 'sha256'), 'hex')
         AS matches_with_char_length
  FROM durable_ledger.effects e
 WHERE e.run LIKE 'key-%' AND NOT e.business_key AND e.tool IN ('outil_é', '📧')
 ORDER BY e.run;

-- one concrete key, written out: material and hash
SELECT concat_ws('|', 'durable_ledger.v1', octet_length('key-0'), 'key-0', octet_length('pay'), 'pay', 1,
                 durable_ledger.canonical_args('{"amount": 5.0}')) AS material,
       durable_ledger.effect_key('key-0', 'pay', '{"amount": 5.0}', 1) AS key,
       durable_ledger.effect_key('key-0', 'pay', '{"amount": 5.0}', 1)
         = encode(digest('durable_ledger.v1|5|key-0|3|pay|1|{"amount":5}', 'sha256'), 'hex') AS equal;

-- lengths and occurrences of several digits, up to the longest run and tool and the
-- largest occurrence, written out
SELECT r.len, o.occurrence,
       durable_ledger.effect_key(repeat('r', r.len), repeat('t', least(r.len, 255)), '[]', o.occurrence)
         = encode(digest('durable_ledger.v1|' || r.len || '|' || repeat('r', r.len) || '|'
                         || least(r.len, 255) || '|' || repeat('t', least(r.len, 255)) || '|'
                         || o.occurrence || '|[]', 'sha256'), 'hex') AS equal
  FROM (VALUES (9), (10), (99), (100), (512)) AS r(len),
       (VALUES (9), (10), (1000000), (2147483647)) AS o(occurrence)
 ORDER BY r.len, o.occurrence;

-- run "r|t" with tool "u" and run "r" with tool "t|u" would collide without the lengths
SELECT 'r|t' || '|' || 'u' = 'r' || '|' || 't|u' AS naive_material_equal,
       durable_ledger.effect_key('r|t', 'u', '{}', 1) = durable_ledger.effect_key('r', 't|u', '{}', 1) AS keys_equal;

-- every part of the material matters: run, tool, args, occurrence
SELECT count(DISTINCT k) AS keys
  FROM (VALUES (durable_ledger.effect_key('key-x', 'pay', '{"a": 1}', 1)),
               (durable_ledger.effect_key('key-y', 'pay', '{"a": 1}', 1)),
               (durable_ledger.effect_key('key-x', 'paY', '{"a": 1}', 1)),
               (durable_ledger.effect_key('key-x', 'pay', '{"a": 2}', 1)),
               (durable_ledger.effect_key('key-x', 'pay', '{"a": 1}', 2)),
               (durable_ledger.effect_key('key-x', 'pay', '{"a": 1}', 2147483647))) AS t(k);

-- effect_key writes nothing and takes no lease
SELECT count(*) AS effects_before FROM durable_ledger.effects \gset
SELECT count(*) AS runs_before FROM durable_ledger.runs \gset
SELECT count(*) AS audit_before FROM durable_ledger.audit_log \gset
SELECT count(*) AS locks_before FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory' \gset
SELECT durable_ledger.effect_key('key-nowrite', 'pay', '{"a": 1}', 1) = durable_ledger.effect_key('key-nowrite', 'pay', '{"a": 1}', 1) AS stable;
SELECT (SELECT count(*) FROM durable_ledger.effects) = :effects_before AS effects_unchanged,
       (SELECT count(*) FROM durable_ledger.runs) = :runs_before AS runs_unchanged,
       (SELECT count(*) FROM durable_ledger.audit_log) = :audit_before AS audit_unchanged,
       (SELECT count(*) FROM pg_locks WHERE pid = pg_backend_pid() AND locktype = 'advisory') = :locks_before AS locks_unchanged,
       (SELECT count(*) FROM durable_ledger.runs WHERE run = 'key-nowrite') AS nowrite_runs;

-- effect_key gives the key begin_effect will use for a call not made yet
SELECT durable_ledger.effect_key('key-1', 'send_email', '{"to": "a@example.com", "n": 1}', 4) AS predicted \gset
SELECT d.key = :'predicted' AS begin_effect_used_predicted_key, d.occurrence
  FROM durable_ledger.begin_effect('key-1', 'send_email', '{"to": "a@example.com", "n": 1}') d;

-- occurrence: NULL is refused (22004), 0 and negatives are invalid (22023), nothing written
SELECT durable_ledger.effect_key('key-1', 'pay', '{}', NULL);
SELECT durable_ledger.effect_key('key-1', 'pay', '{}', 0);
SELECT durable_ledger.effect_key('key-1', 'pay', '{}', -1);
SELECT durable_ledger.effect_key('key-1', 'pay', '{}', -2147483648);
SELECT durable_ledger.effect_key('key-1', 'pay', '{}', 1) ~ '^[0-9a-f]{64}$' AS occurrence_1_ok;
-- and the other arguments
SELECT durable_ledger.effect_key(NULL, 'pay', '{}', 1);
SELECT durable_ledger.effect_key('key-1', NULL, '{}', 1);
SELECT durable_ledger.effect_key('key-1', 'pay', NULL, 1);
SELECT durable_ledger.effect_key('', 'pay', '{}', 1);
SELECT durable_ledger.effect_key('key-1', '', '{}', 1);

-- Business keys: the key is the text itself, no occurrence, not hashed
INSERT INTO key_calls SELECT 20, 'key-5', 'ship', '{"order": 1001}', d.key, d.decision, d.occurrence
  FROM durable_ledger.begin_effect('key-5', 'ship', '{"order": 1001}', business_key => 'order-1001') d;
INSERT INTO key_calls SELECT 21, 'key-5', 'ship', '{"order": 1002}', d.key, d.decision, d.occurrence
  FROM durable_ledger.begin_effect('key-5', 'ship', '{"order": 1002}', business_key => 'Rechnung|2024|ü-1002') d;
SELECT c.n, c.d_key, c.decision, c.occurrence, e.key = c.d_key AS stored_as_text,
       e.business_key, e.occurrence AS stored_occurrence
  FROM key_calls c JOIN durable_ledger.effects e ON e.key = c.d_key
 WHERE c.n >= 20
 ORDER BY c.n;
-- a business key with the shape of a derived key is refused (22023), nothing written
SELECT durable_ledger.begin_effect('key-5', 'ship', '{}', business_key => repeat('ab', 32));
SELECT count(*) AS hex_business_keys FROM durable_ledger.effects WHERE key = repeat('ab', 32);
-- (upper case hex is not a derived key's shape)
SELECT d.key, d.decision FROM durable_ledger.begin_effect('key-5', 'ship', '{"order": 1003}', business_key => repeat('AB', 32)) d;

-- effect_key reads the registry with the latest snapshot, which no
-- process may take while a parallel query runs: it is PARALLEL UNSAFE, so a
-- query that would otherwise get a parallel plan runs without one (before,
-- XX000 "cannot update SecondarySnapshot during a parallel operation")
CREATE TABLE public.key_parallel AS
    SELECT g, 'run-' || g AS run, jsonb_build_object('g', g) AS args FROM generate_series(1, 2000) g;
ANALYZE public.key_parallel;
SET max_parallel_workers_per_gather = 2;
SET parallel_setup_cost = 0;
SET parallel_tuple_cost = 0;
SET min_parallel_table_scan_size = 0;
SET force_parallel_mode = on;
SELECT count(*) AS rows,
       count(*) FILTER (WHERE durable_ledger.effect_key(run, 'pay', args, 1)
                              = encode(digest(convert_to(concat_ws('|', 'durable_ledger.v1', octet_length(run), run,
                                  3, 'pay', 1, durable_ledger.canonical_args(args)), 'UTF8'), 'sha256'), 'hex')) AS recomputed
  FROM public.key_parallel;
RESET force_parallel_mode;
RESET min_parallel_table_scan_size;
RESET parallel_tuple_cost;
RESET parallel_setup_cost;
RESET max_parallel_workers_per_gather;
DROP TABLE public.key_parallel;

-- clean up the leases this file took
SELECT run, durable_ledger.release_run(run) AS released
  FROM (SELECT DISTINCT run FROM key_calls) r
 ORDER BY run;
SELECT count(*) AS leases_left FROM durable_ledger.leases WHERE run LIKE 'key-%';
DROP TABLE key_calls;
