-- begin_effect + complete_effect under a token lease, each its own transaction,
-- through a transaction pooler; one run per client.  A client takes its run's
-- lease once, in its first transaction (have_lease starts at 0: pgbench -D),
-- and passes the token to every begin_effect.  A lease outlives the pgbench
-- client that took it, so every round's runs are new (-D round=N).
\if :have_lease = 0
SELECT token FROM durable_ledger.take_lease('bench-tok-' || (:round)::int || '-' || (:client_id)::int,
    '1 hour') \gset
\set have_lease 1
\endif
\set n random(1, 2000000000)
SELECT key FROM durable_ledger.begin_effect('bench-tok-' || (:round)::int || '-' || (:client_id)::int, 'bank.pay',
    jsonb_build_object('invoice', (:n)::bigint, 'amount', 4200, 'currency', 'USD'), lease => :token) \gset
SELECT 1 AS ok FROM durable_ledger.complete_effect(:key, '{"payment_id": "pay_1"}');
