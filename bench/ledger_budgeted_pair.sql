-- begin_effect + complete_effect of a registered tool with a budget per run
-- (bench.mail: set_budget, never reached), each its own transaction; one run
-- per client: every execution reads and writes the run's counter of the tool.
\set n random(1, 2000000000)
SELECT key FROM durable_ledger.begin_effect('bench-bud-' || (:round)::int || '-' || (:client_id)::int, 'bench.mail',
    jsonb_build_object('invoice', (:n)::bigint, 'amount', 4200, 'currency', 'USD')) \gset
SELECT 1 AS ok FROM durable_ledger.complete_effect(:key, '{"payment_id": "pay_1"}');
