-- the floor of a local effect: the tool's own write alone, committed
\set n random(1, 2000000000)
INSERT INTO bench_orders (run, item, ledger_key)
VALUES ('bench-local-' || (:client_id)::int, :n,
        encode(sha256(convert_to((:client_id)::int || '|' || (:n)::bigint, 'UTF8')), 'hex'));
