-- contention: every client works on the same run; each transaction is one
-- handoff of the lease (acquire, one effect, release)
\set n random(1, 2000000000)
SELECT durable_ledger.acquire_run('bench-hot');
SELECT key FROM durable_ledger.begin_effect('bench-hot', 'bank.pay',
    jsonb_build_object('invoice', (:n)::bigint, 'amount', 4200)) \gset
SELECT 1 AS ok FROM durable_ledger.complete_effect(:key, '{"payment_id": "pay_1"}');
SELECT durable_ledger.release_run('bench-hot');
