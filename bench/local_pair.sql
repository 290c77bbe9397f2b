-- a local effect: begin_local, the tool's own write and complete_effect in one
-- transaction (one commit); one run per client
\set n random(1, 2000000000)
BEGIN;
SELECT key FROM durable_ledger.begin_local('bench-local-' || (:client_id)::int, 'shop.order',
    jsonb_build_object('order', (:n)::bigint, 'item', 'tea')) \gset
INSERT INTO bench_orders (run, item, ledger_key) VALUES ('bench-local-' || (:client_id)::int, :n, :key);
SELECT 1 AS ok FROM durable_ledger.complete_effect(:key, '{"placed": true}', 1);
COMMIT;
