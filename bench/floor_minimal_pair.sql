-- the minimal floor (bench/floor_minimal.sql): commit an intent row and its
-- audit row (one statement), then the completion and its audit row (one
-- statement); a primary key each, nothing else
\set n random(1, 2000000000)
WITH i AS (
    INSERT INTO minimal_effects (key, run, tool, args, business_key, occurrence, attempt,
                                 status, lease_epoch, holder_pid, created_at)
    VALUES (encode(sha256(convert_to('bench-' || (:client_id)::int || '|' || (:n)::bigint || '|' || random(), 'UTF8')), 'hex'),
            'bench-' || (:client_id)::int, 'bank.pay',
            jsonb_build_object('invoice', (:n)::bigint, 'amount', 4200, 'currency', 'USD'),
            false, 1, 1, 'started', 1, pg_backend_pid(), clock_timestamp())
    RETURNING key, run)
INSERT INTO minimal_audit (logged_at, run, key, event, role_name, session_user_name,
                           application_name, client_addr, backend_pid, lease_epoch)
SELECT clock_timestamp(), run, key, 'intent', current_user, session_user,
       current_setting('application_name'), inet_client_addr(), pg_backend_pid(), 1
  FROM i
RETURNING key \gset
WITH u AS (
    UPDATE minimal_effects SET status = 'completed', result = '{"payment_id": "pay_1"}',
                               completed_at = clock_timestamp()
     WHERE key = :key
    RETURNING key, run)
INSERT INTO minimal_audit (logged_at, run, key, event, role_name, session_user_name,
                           application_name, client_addr, backend_pid, lease_epoch)
SELECT clock_timestamp(), run, key, 'completed', current_user, session_user,
       current_setting('application_name'), inet_client_addr(), pg_backend_pid(), 1
  FROM u;
