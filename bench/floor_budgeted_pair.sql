-- the floor of a budgeted tool's pair: floor_pair.sql's writes, and the bump
-- of the run's counter of the tool in the intent's statement (the same rows
-- as the ledger writes for a call of a tool with a budget)
\set n random(1, 2000000000)
WITH i AS (
    INSERT INTO floor_effects (key, run, tool, args, business_key, occurrence, attempt,
                               status, lease_epoch, holder_pid, created_at)
    VALUES (encode(sha256(convert_to('bench-' || (:client_id)::int || '|' || (:n)::bigint || '|' || random(), 'UTF8')), 'hex'),
            'bench-' || (:client_id)::int, 'bank.pay',
            jsonb_build_object('invoice', (:n)::bigint, 'amount', 4200, 'currency', 'USD'),
            false, 1, 1, 'started', 1, pg_backend_pid(), clock_timestamp())
    RETURNING key, run, created_at),
     o AS (INSERT INTO floor_unsettled (created_at, key) SELECT created_at, key FROM i),
     b AS (INSERT INTO floor_run_budgets AS c (run, tool, executions, recent)
           SELECT run, 'bench.mail', 1, '{}' FROM i
           ON CONFLICT (run, tool) DO UPDATE SET executions = c.executions + 1)
INSERT INTO floor_audit (logged_at, run, key, event, role_name, session_user_name,
                         application_name, client_addr, backend_pid, lease_epoch)
SELECT clock_timestamp(), run, key, 'intent', current_user, session_user,
       current_setting('application_name'), inet_client_addr(), pg_backend_pid(), 1
  FROM i
RETURNING key \gset
WITH u AS (
    UPDATE floor_effects SET status = 'completed', result = '{"payment_id": "pay_1"}',
                             completed_at = clock_timestamp()
     WHERE key = :key
    RETURNING key, run, created_at),
     o AS (DELETE FROM floor_unsettled f USING u WHERE f.created_at = u.created_at AND f.key = u.key)
INSERT INTO floor_audit (logged_at, run, key, event, role_name, session_user_name,
                         application_name, client_addr, backend_pid, lease_epoch)
SELECT clock_timestamp(), run, key, 'completed', current_user, session_user,
       current_setting('application_name'), inet_client_addr(), pg_backend_pid(), 1
  FROM u;
