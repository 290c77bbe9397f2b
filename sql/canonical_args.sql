-- canonical_args: the canonical text of args ignores object key order, white space,
-- duplicate keys (last wins) and the spelling of numbers (-0 is 0), keeps strings byte
-- for byte (no Unicode normalization), handles scalars, nesting and huge numbers, and
-- refuses NULL (22004); equal canonical text means equal keys, different text different keys.
\set VERBOSITY default

-- One row per input: the canonical text, exactly.
SELECT n, durable_ledger.canonical_args(input::jsonb) AS canonical
  FROM (VALUES
        -- object key order: jsonb's (shorter first, then bytewise: "B" < "a", "z" < "é")
        (1, '{"b": 1, "a": 2}'),
        (2, '{"bb": 1, "a": 2, "c": 3, "aa": 4}'),
        (3, '{"a": 1, "B": 2}'),
        (4, '{"é": 1, "z": 2}'),
        -- white space everywhere
        (5, E' \n\t{ "a" : [ 1 , 2 , { "b" : null } ] ,\r\n "c" : "x y" } '),
        -- duplicate keys: the last one wins, at any depth
        (6, '{"a": 1, "a": 2}'),
        (7, '{"o": {"x": 1, "x": {"y": 3}}, "o2": [{"k": true, "k": false}]}'),
        -- nested arrays keep their order, objects are sorted inside
        (8, '[3, 1, 2, [2, 1], {"b": [true, false, null], "a": {}}, [], {}]'),
        -- literals
        (9, '{"t": true, "f": false, "n": null}'),
        -- scalars at the top level
        (10, '"a bare string"'),
        (11, '42'),
        (12, 'null'),
        (13, 'true'),
        -- empty containers
        (14, '{}'),
        (15, '[]'),
        (16, '[[]]'),
        (17, '{"": ""}')
       ) AS t(n, input)
 ORDER BY n;

-- Number spellings: plain decimal, no exponent, no trailing fractional zeros, no "-0".
SELECT n, input, durable_ledger.canonical_args(input::jsonb) AS canonical
  FROM (VALUES
        (1, '1'), (2, '1.0'), (3, '1.00'), (4, '10e-1'), (5, '0.1e1'), (6, '1E0'),
        (7, '100e-2'), (8, '-0'), (9, '-0.0'), (10, '-0e5'), (11, '0.000'),
        (12, '1e3'), (13, '1.5e3'), (14, '1.23000'), (15, '0.000100'), (16, '1e-5'),
        (17, '-1.50'), (18, '-1e2'), (19, '123456789012345678901234567890'),
        (20, '1e-20'), (21, '12345.678900e2'), (22, '2.5E+2')
       ) AS t(n, input)
 ORDER BY n;

-- the same, inside containers
SELECT durable_ledger.canonical_args('{"amount": 10.50, "qty": 1e0, "z": -0.00, "l": [1.0, 2e1]}');

-- 1, 1.0, 1.00 and 10e-1 are one value: one canonical text, one key
SELECT count(DISTINCT durable_ledger.canonical_args(v::jsonb)) AS texts,
       count(DISTINCT durable_ledger.effect_key('canon-1', 'pay', v::jsonb, 1)) AS keys
  FROM unnest(ARRAY['{"n": 1}', '{"n": 1.0}', '{"n": 1.00}', '{"n": 10e-1}', '{ "n" : 1 }']) AS v;
SELECT count(DISTINCT durable_ledger.canonical_args(v::jsonb)) AS texts,
       count(DISTINCT durable_ledger.effect_key('canon-1', 'pay', v::jsonb, 1)) AS keys
  FROM unnest(ARRAY['0', '-0', '-0.0', '0e10', '0.000']) AS v;
-- key order, white space and duplicates do not change the key either
SELECT count(DISTINCT durable_ledger.effect_key('canon-1', 'pay', v::jsonb, 1)) AS keys
  FROM unnest(ARRAY['{"a": 1, "b": [1, 2]}', '{"b":[1,2],"a":1}', '{"b": [1, 2], "a": 0, "a": 1}']) AS v;
-- but different values do: 1 vs 1.5, 1 vs "1", array order, null vs absent
SELECT count(DISTINCT durable_ledger.effect_key('canon-1', 'pay', v::jsonb, 1)) AS keys
  FROM unnest(ARRAY['{"n": 1}', '{"n": 1.5}', '{"n": "1"}', '{"n": [1, 2]}', '{"n": [2, 1]}',
                    '{"n": null}', '{}', '[]', 'null', '"null"']) AS v;

-- Huge and tiny numbers are written out in full (no exponent).
SELECT durable_ledger.canonical_args('1e400') = '1' || repeat('0', 400) AS e400_plain,
       length(durable_ledger.canonical_args('1e400')) AS e400_length,
       durable_ledger.canonical_args('-1.5e400') = '-15' || repeat('0', 399) AS minus_e400_plain,
       durable_ledger.canonical_args('1e-400') = '0.' || repeat('0', 399) || '1' AS e_minus_400_plain,
       durable_ledger.canonical_args('{"big": 1e400}') = '{"big":1' || repeat('0', 400) || '}' AS nested_plain;

-- Strings: quotes, backslashes and control characters as escape_json writes them;
-- "\/" is the string "/"; non-ASCII text is kept as it is.
SELECT n, durable_ledger.canonical_args(input::jsonb) AS canonical
  FROM (VALUES
        (1, '{"s": "say \"hi\""}'),
        (2, '{"s": "back\\slash \\n is not a newline"}'),
        (3, '{"s": "tab\there\nnewline\rreturn\bback\fform"}'),
        (4, '{"s": "\u0001\u001f"}'),
        (5, '{"s": "\/ and /"}'),
        (6, '{"s": "caf\u00e9", "t": "café"}'),
        (7, '{"s": "\ud83d\ude00 😀"}'),
        (8, '{"quote\"key": 1, "back\\key": 2}'),
        (9, '"|durable_ledger.v1|"')
       ) AS t(n, input)
 ORDER BY n;

-- escape_json's output is JSON again: it reads back as the same value
SELECT bool_and(durable_ledger.canonical_args(v::jsonb)::jsonb = v::jsonb) AS round_trips
  FROM unnest(ARRAY['{"s": "say \"hi\""}', '{"s": "tab\there\n"}', '{"s": "\u0001"}',
                    '{"a": [1.0, {"b": -0}], "c": "é"}', '[]', '"x"', '1e400']) AS v;

-- No Unicode normalization: precomposed U+00E9 and e + U+0301 (combining acute)
-- look alike but are different bytes, so different canonical text and keys.
SELECT octet_length(durable_ledger.canonical_args(jsonb_build_object('name', U&'caf\00E9'))) AS precomposed_bytes,
       octet_length(durable_ledger.canonical_args(jsonb_build_object('name', U&'cafe\0301'))) AS decomposed_bytes,
       durable_ledger.canonical_args(jsonb_build_object('name', U&'caf\00E9'))
         = durable_ledger.canonical_args(jsonb_build_object('name', U&'cafe\0301')) AS same_text,
       durable_ledger.effect_key('canon-1', 'greet', jsonb_build_object('name', U&'caf\00E9'), 1)
         = durable_ledger.effect_key('canon-1', 'greet', jsonb_build_object('name', U&'cafe\0301'), 1) AS same_key;
-- the bytes are exactly the input's bytes
SELECT convert_to(durable_ledger.canonical_args(jsonb_build_object('n', U&'cafe\0301')), 'UTF8') AS decomposed;
-- normalization-equal keys are not merged either: "é" and "e" + U+0301 as object keys
SELECT durable_ledger.canonical_args(jsonb_build_object(U&'\00E9', 1, U&'e\0301', 2)) AS two_keys;

-- Deep nesting is fine (the canonical form is written without recursion).
SELECT length(durable_ledger.canonical_args((repeat('[', 5000) || repeat(']', 5000))::jsonb)) AS deep_length;

-- canonical_args is what the key material holds: its text is what effect_key hashes
SELECT durable_ledger.effect_key('canon-1', 'pay', '{"b": 2.0, "a": 1}', 1)
       = encode(sha256(convert_to('durable_ledger.v1|7|canon-1|3|pay|1|{"a":1,"b":2}', 'UTF8')), 'hex') AS key_hashes_canonical_text;

-- NULL is refused (22004); JSON null is a value
SELECT durable_ledger.canonical_args(NULL);
SELECT durable_ledger.canonical_args(NULL::jsonb);
SELECT durable_ledger.canonical_args('null'::jsonb);

-- the function is immutable and writes nothing
SELECT provolatile FROM pg_proc WHERE oid = 'durable_ledger.canonical_args(jsonb)'::regprocedure;
SELECT count(*) AS effects FROM durable_ledger.effects WHERE run = 'canon-1';
SELECT count(*) AS runs FROM durable_ledger.runs WHERE run = 'canon-1';
