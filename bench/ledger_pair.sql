-- begin_effect + complete_effect, each its own transaction; one run per client
\set n random(1, 2000000000)
SELECT key FROM durable_ledger.begin_effect('bench-' || (:client_id)::int, 'bank.pay',
    jsonb_build_object('invoice', (:n)::bigint, 'amount', 4200, 'currency', 'USD')) \gset
SELECT 1 AS ok FROM durable_ledger.complete_effect(:key, '{"payment_id": "pay_1"}');
