-- begin_effect + complete_effect of a tool judged for divergence (policy pause:
-- a registered tool, or since 1.3 one nobody registered; -D tool=...) in a
-- later attempt of its run, so that divergence is checked on every call:
-- a client's first transaction makes its run's first attempt (three payments),
-- then starts a second attempt that replays them (started starts at 0: pgbench
-- -D).  Every later call is a new payment in that second attempt, judged
-- against the three earlier ones.  Runs are new in every round (-D round=N).
\if :started = 0
SELECT durable_ledger.acquire_run('bench-reg-' || (:round)::int || '-' || (:client_id)::int);
SELECT count(durable_ledger.complete_effect(d.key, '{"payment_id": "pay_0"}'))
  FROM generate_series(1, 3) AS i,
       durable_ledger.begin_effect('bench-reg-' || (:round)::int || '-' || (:client_id)::int, (:tool)::text,
           jsonb_build_object('invoice', -i, 'amount', 4200, 'currency', 'USD')) AS d;
SELECT durable_ledger.acquire_run('bench-reg-' || (:round)::int || '-' || (:client_id)::int);
SELECT count(*) FILTER (WHERE d.decision = 'replay') AS replayed
  FROM generate_series(1, 3) AS i,
       durable_ledger.begin_effect('bench-reg-' || (:round)::int || '-' || (:client_id)::int, (:tool)::text,
           jsonb_build_object('invoice', -i, 'amount', 4200, 'currency', 'USD')) AS d;
\set started 1
\endif
\set n random(1, 2000000000)
SELECT key FROM durable_ledger.begin_effect('bench-reg-' || (:round)::int || '-' || (:client_id)::int, (:tool)::text,
    jsonb_build_object('invoice', (:n)::bigint, 'amount', 4200, 'currency', 'USD')) \gset
SELECT 1 AS ok FROM durable_ledger.complete_effect(:key, '{"payment_id": "pay_1"}');
