-- metrics: durable_ledger.metrics is the ledger's state now, one row, for a
-- scrape every few seconds: live session and token leases, token leases
-- expired without release, what waits for a person and for how long;
-- metrics_events() counts each kind of event since the server started when
-- the library is preloaded (the TAP test 024_monitoring checks the counts;
-- here the values are compared before and after, whatever else the database
-- holds).
\set VERBOSITY terse

-- every event the audit log may hold is counted (metrics.c keeps its own list of them)
SELECT array_agg(m ORDER BY m) = (SELECT array_agg(event ORDER BY event) FROM durable_ledger.metrics_events())
       AS every_event_counted
  FROM (SELECT (regexp_matches(pg_get_constraintdef(c.oid), '''([a-z_]+)''', 'g'))[1] AS m
          FROM pg_constraint c
         WHERE c.contypid = 'durable_ledger.audit_event'::regtype) d;

-- the counts are compared before and after: every other session of this
-- database (an earlier file's, ending) must be gone first, with its leases,
-- or its lease could end in between.  Bounded: 60 s, polling.
CREATE FUNCTION public.regress_mt_others_gone(p int DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql AS $fn$
BEGIN
    FOR i IN 1 .. 1200 LOOP
        PERFORM pg_stat_clear_snapshot();
        IF NOT EXISTS (SELECT FROM pg_stat_activity
                        WHERE CASE WHEN p IS NULL
                                   THEN datname = current_database() AND pid <> pg_backend_pid()
                                        AND backend_type = 'client backend'
                                   ELSE pid = p END)
           AND NOT EXISTS (SELECT FROM pg_locks
                            WHERE locktype = 'advisory' AND objsubid = 17484 AND pid <> pg_backend_pid()
                              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())) THEN
            RETURN true;
        END IF;
        PERFORM pg_sleep(0.05);
    END LOOP;
    RETURN false;
END
$fn$;
SELECT public.regress_mt_others_gone() AS others_gone;
SELECT * FROM durable_ledger.metrics \gset before_
SELECT count(*) AS kinds, bool_and(total IS NULL) = NOT :'before_counters_kept'::boolean AS nulls_iff_not_kept
  FROM durable_ledger.metrics_events();

-- a session lease, a live token lease, a token lease broken (expired), an
-- intent left by a worker that went away (unresolved)
SELECT durable_ledger.acquire_run('mt-1');
SELECT durable_ledger.take_lease('mt-2', '1 hour') IS NOT NULL AS taken;
SELECT durable_ledger.take_lease('mt-3', '1 hour') IS NOT NULL AS taken;
SELECT durable_ledger.break_lease('mt-3', 'oncall');
SELECT dblink_connect('gone', 'dbname=' || current_database());
SELECT * FROM dblink('gone', $$SELECT decision FROM durable_ledger.begin_effect('mt-4', 'mt.pay', '{"invoice": 1}')$$) AS t(decision text);
SELECT pid AS gone_pid FROM dblink('gone', 'SELECT pg_backend_pid()') AS t(pid int) \gset
SELECT dblink_disconnect('gone');
-- its backend ends, and drops its lease, after the disconnect returns: wait for it
SELECT public.regress_mt_others_gone(:gone_pid) AS gone_ended;

SELECT m.session_leases - :before_session_leases AS session_leases,
       m.token_leases - :before_token_leases AS token_leases,
       m.token_leases_expired - :before_token_leases_expired AS token_leases_expired,
       m.unresolved - :before_unresolved AS unresolved,
       m.unresolved_oldest_seconds >= 0 AS oldest_known
  FROM durable_ledger.metrics m;
SELECT durable_ledger.release_run('mt-1');

-- auditors (and a monitoring role granted durable_ledger_auditor) read them; workers do not
CREATE ROLE regress_mt_auditor IN ROLE durable_ledger_auditor;
CREATE ROLE regress_mt_worker IN ROLE durable_ledger_worker;
SET ROLE regress_mt_auditor;
SELECT count(*) AS rows FROM durable_ledger.metrics;
SELECT count(*) AS kinds FROM durable_ledger.metrics_events();
SET ROLE regress_mt_worker;
SELECT count(*) FROM durable_ledger.metrics;
RESET ROLE;
DROP ROLE regress_mt_auditor, regress_mt_worker;
DROP FUNCTION public.regress_mt_others_gone(int);
