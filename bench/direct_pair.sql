-- begin_effect + complete_effect straight to one shard (the proxy section's
-- baseline), each its own transaction: a session lease taken once per client
-- (have_lease starts at 0: pgbench -D), one run per client and round
\if :have_lease = 0
SELECT durable_ledger.acquire_run('bench-proxy-' || (:round)::int || '-' || (:client_id)::int);
\set have_lease 1
\endif
\set n random(1, 2000000000)
SELECT key FROM durable_ledger.begin_effect('bench-proxy-' || (:round)::int || '-' || (:client_id)::int, 'bank.pay',
    jsonb_build_object('invoice', (:n)::bigint, 'amount', 4200, 'currency', 'USD')) \gset
SELECT 1 AS ok FROM durable_ledger.complete_effect(:key, '{"payment_id": "pay_1"}', 1);
