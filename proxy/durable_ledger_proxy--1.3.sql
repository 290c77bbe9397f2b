/*
 * durable_ledger_proxy 1.3: the ledger's API (durable_ledger 1.3) in a proxy
 * database, each call routed by PL/Proxy to the one shard that holds its run.
 * The shards run durable_ledger unchanged; this package holds no data and
 * decides nothing: every decision is the shard's.  docs/scale-out.md says why
 * each part is as it is.
 *
 * What is here, in order:
 *   routing     a run's routing key (Redis Cluster's hash tags) and its hash;
 *               the shards, read from the PL/Proxy server durable_ledger_shards
 *   errors      a shard PL/Proxy cannot reach is named (08006)
 *   per shard   one PL/Proxy function per ledger function, run on one shard
 *               (durable_ledger_proxy.*_on); nobody calls them but the API
 *   the API     durable_ledger.*: the ledger's names and decisions, routed by
 *               the run; reports by a key take the run as a last argument
 *               (without it, the one shard that has the key is looked up)
 *   fan-out     the views people read (unresolved, leases, metrics,
 *               audit_heads) and the auditor's questions over every shard,
 *               each row naming its shard
 *   privileges  the ledger's four roles, as on the shards
 */

\echo Use "CREATE EXTENSION durable_ledger_proxy" to load this file. \quit

DO $guard$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_catalog.pg_extension WHERE extname = 'durable_ledger') THEN
        RAISE EXCEPTION 'durable_ledger_proxy cannot share a database with durable_ledger'
            USING ERRCODE = '55000',
                  HINT = 'Install the proxy in a database of its own: the ledger runs on the shards.';
    END IF;
END
$guard$;

-- ---------------------------------------------------------------------------
-- Roles: the ledger's own four, created when missing (roles are cluster-wide:
-- a proxy on its own cluster needs them there too).  PL/Proxy connects to a
-- shard as the calling role, so each shard checks what that role may do.
-- ---------------------------------------------------------------------------
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'durable_ledger_worker') THEN
        CREATE ROLE durable_ledger_worker NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'durable_ledger_auditor') THEN
        CREATE ROLE durable_ledger_auditor NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'durable_ledger_admin') THEN
        CREATE ROLE durable_ledger_admin NOLOGIN;
    END IF;
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'durable_ledger_approver') THEN
        CREATE ROLE durable_ledger_approver NOLOGIN;
    END IF;
    IF NOT pg_catalog.pg_has_role('durable_ledger_admin', 'durable_ledger_worker', 'MEMBER') THEN
        GRANT durable_ledger_worker TO durable_ledger_admin;
    END IF;
    IF NOT pg_catalog.pg_has_role('durable_ledger_admin', 'durable_ledger_auditor', 'MEMBER') THEN
        GRANT durable_ledger_auditor TO durable_ledger_admin;
    END IF;
END
$roles$;

CREATE SCHEMA durable_ledger_proxy;
COMMENT ON SCHEMA durable_ledger_proxy IS
    'the proxy''s routing, its shards and its per-shard calls; the API is in durable_ledger';

-- ---------------------------------------------------------------------------
-- Types: the rows the shards return, column for column (a status is text on
-- the shards too, checked there by a domain).  PL/Proxy asks a shard for
-- these columns by name.
-- ---------------------------------------------------------------------------
CREATE TYPE durable_ledger.decision AS (
    key text, decision text, status text, occurrence integer, attempt integer,
    result jsonb, error jsonb, reason text, downstream_key text);

-- The token is the shard's token behind the routing hash of its run
-- ("<hash>.<token>"): renew_lease and release_lease find the shard by it.
CREATE TYPE durable_ledger.lease AS (
    run text, token text, epoch bigint, expires_at timestamptz, holder text);

CREATE TYPE durable_ledger.effects AS (
    key text, run text, tool text, args jsonb, business_key boolean,
    occurrence integer, attempt integer, status text, result jsonb, error jsonb,
    meta jsonb, lease_epoch bigint, holder_pid integer, created_at timestamptz,
    completed_at timestamptz, resolved_by text, resolution_note text,
    conflict boolean, forked_from text, safe_to_redo boolean,
    execute_again boolean, local boolean, approval text, approver text,
    approval_note text);

CREATE TYPE durable_ledger.tools AS (
    tool text, side_effecting boolean, divergence text, key_fields text[],
    note text, registered_by text, registered_at timestamptz, changed_by text,
    changed_at timestamptz, retired_by text, retired_at timestamptz,
    reconcile_grace interval, approval jsonpath, max_executions integer,
    max_in_window integer, budget_window interval);

CREATE TYPE durable_ledger.divergences AS (
    key text, run text, lease_epoch bigint, tool text, args jsonb,
    occurrence integer, candidate_key text, detected_at timestamptz,
    verdict text, same_as text, resolved_by text, resolved_at timestamptz,
    resolution_note text);

-- rows of the shards' views, read by the fan-out below
CREATE TYPE durable_ledger_proxy.unresolved_row AS (
    key text, run text, tool text, status text, conflict boolean, reason text,
    created_at timestamptz, age interval, args jsonb, meta jsonb,
    business_key boolean, occurrence integer, attempt integer,
    lease_epoch bigint, may_duplicate text, run_abandoned_at timestamptz,
    downstream_key text, reconcile_grace interval);

CREATE TYPE durable_ledger_proxy.leases_row AS (
    run text, holder_pid integer, lease_epoch bigint, holder_role text,
    application_name text, client_addr inet, since timestamptz,
    backend_state text, lock_key bigint, liveness text, kind text,
    holder text, expires_at timestamptz);

CREATE TYPE durable_ledger_proxy.metrics_row AS (
    session_leases bigint, token_leases bigint, token_leases_expired bigint,
    unresolved bigint, unresolved_oldest_seconds double precision,
    counters_kept boolean);

CREATE TYPE durable_ledger_proxy.audit_heads_row AS (
    chain bigint, chain_seq bigint, id bigint, logged_at timestamptz,
    row_hash text);

-- ---------------------------------------------------------------------------
-- Routing.  A run's routing key is the part of its name between the first
-- '{' and the first '}' after it, when that part is not empty, else the whole
-- name: Redis Cluster's hash tags.  Runs that share business keys (which are
-- unique per shard) share a routing key: '{acme}ap-run-42', '{acme}ap-run-43'.
-- A run's name alone decides its shard, so no call can take a run elsewhere.
-- ---------------------------------------------------------------------------
CREATE FUNCTION durable_ledger_proxy.routing_key(run text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE
AS $fn$
SELECT CASE WHEN pg_catalog.strpos(run, '{') OPERATOR(pg_catalog.>) 0
             AND pg_catalog.strpos(pg_catalog.substr(run, pg_catalog.strpos(run, '{') OPERATOR(pg_catalog.+) 1), '}')
                 OPERATOR(pg_catalog.>) 1
            THEN pg_catalog.substr(run, pg_catalog.strpos(run, '{') OPERATOR(pg_catalog.+) 1,
                     pg_catalog.strpos(pg_catalog.substr(run, pg_catalog.strpos(run, '{') OPERATOR(pg_catalog.+) 1), '}')
                     OPERATOR(pg_catalog.-) 1)
            ELSE run END
$fn$;
COMMENT ON FUNCTION durable_ledger_proxy.routing_key(text) IS
    'the routing key of a run: the text between its first { and the first } after it when not empty (Redis Cluster''s hash tags), else the run itself';

-- The hash PL/Proxy maps to a shard: the first four bytes of the SHA-256 of
-- the routing key's UTF-8 bytes, as a signed integer.  The same on every
-- proxy, platform and PostgreSQL version (hashtext() is not promised to be).
-- Both are single expressions, not STRICT (NULL gives NULL anyway), so that a
-- caller's plan inlines them (STABLE: convert_to() is), instead of running a
-- SQL function, parsed anew, on every call.
CREATE FUNCTION durable_ledger_proxy.route(run text)
RETURNS integer
LANGUAGE sql STABLE PARALLEL SAFE
AS $fn$
SELECT ('x' OPERATOR(pg_catalog.||) pg_catalog.left(pg_catalog.encode(pg_catalog.sha256(
            pg_catalog.convert_to(durable_ledger_proxy.routing_key(run), 'UTF8')), 'hex'), 8))
       ::pg_catalog.bit(32)::integer
$fn$;
COMMENT ON FUNCTION durable_ledger_proxy.route(text) IS
    'the hash a run is routed by: the first 4 bytes of sha256(the routing key in UTF-8), a signed integer';

-- The shards: PL/Proxy's partitions of the foreign server durable_ledger_shards
-- (docs/scale-out.md sets it up), named as PL/Proxy reads them: every option
-- that is not one of its settings is a partition, "p<N>" or "partition_<N>",
-- shown here as shard p<N>.  Their number is fixed for good.
CREATE VIEW durable_ledger_proxy.shards AS
SELECT (pg_catalog.regexp_match(o.option_name, '^(?:p|partition_)([0-9]+)$'))[1]::integer AS partition,
       'p' OPERATOR(pg_catalog.||)
           (pg_catalog.regexp_match(o.option_name, '^(?:p|partition_)([0-9]+)$'))[1]::integer::text AS shard,
       pg_catalog.regexp_replace(o.option_value,
           'password\s*=\s*(''([^''\\]|\\.)*''|\S+)', 'password=********', 'g') AS connstr,
       o.option_name AS option_name
  FROM pg_catalog.pg_foreign_server s
 CROSS JOIN LATERAL pg_catalog.pg_options_to_table(s.srvoptions) o
 WHERE s.srvname OPERATOR(pg_catalog.=) 'durable_ledger_shards'
   AND pg_catalog.lower(o.option_name) OPERATOR(pg_catalog.<>) ALL
       ('{connection_lifetime,query_timeout,disable_binary,keepalive_idle,keepalive_interval,'
        'keepalive_count,modular_mapping,default_user,connect_timeout}'::text[]);
COMMENT ON VIEW durable_ledger_proxy.shards IS
    'the shards: the partitions of the PL/Proxy server durable_ledger_shards, p<N> (a password in a connection string is not shown)';

-- How many shards, once they are numbered 0 .. N-1 as PL/Proxy needs.
CREATE FUNCTION durable_ledger_proxy.shard_count()
RETURNS integer
LANGUAGE plpgsql STABLE PARALLEL SAFE
AS $fn$
DECLARE
    n integer;
    numbered boolean;
BEGIN
    SELECT pg_catalog.count(*)::integer,
           pg_catalog.count(DISTINCT x.partition) = pg_catalog.count(*)
           AND COALESCE(pg_catalog.min(x.partition) = 0 AND pg_catalog.max(x.partition) = pg_catalog.count(*) - 1, true)
      INTO n, numbered
      FROM durable_ledger_proxy.shards x;
    IF NOT numbered THEN
        RAISE EXCEPTION 'the partitions of server durable_ledger_shards are not p0 .. p%', n - 1
            USING ERRCODE = '55000',
                  DETAIL = (SELECT 'Its partitions: ' || pg_catalog.string_agg(x.option_name, ', ' ORDER BY x.option_name)
                              FROM durable_ledger_proxy.shards x),
                  HINT = 'Name them p0, p1, … with no gap (docs/scale-out.md).';
    END IF;
    RETURN n;
END
$fn$;

-- The shard PL/Proxy sends a hash to: abs(hash % N) with modular_mapping
-- (which the setup sets: any number of shards), else hash & (N - 1) (a power
-- of two), as PL/Proxy's own mapping.
CREATE FUNCTION durable_ledger_proxy.shard_name(hash integer)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $fn$
SELECT 'p' OPERATOR(pg_catalog.||)
       (CASE WHEN COALESCE((SELECT pg_catalog.lower(o.option_value) NOT IN ('0', '', 'off', 'false')
                              FROM pg_catalog.pg_foreign_server s,
                                   pg_catalog.pg_options_to_table(s.srvoptions) o
                             WHERE s.srvname OPERATOR(pg_catalog.=) 'durable_ledger_shards'
                               AND pg_catalog.lower(o.option_name) OPERATOR(pg_catalog.=) 'modular_mapping'), false)
             THEN pg_catalog.abs(hash OPERATOR(pg_catalog.%) NULLIF(durable_ledger_proxy.shard_count(), 0))
             ELSE hash OPERATOR(pg_catalog.&) (durable_ledger_proxy.shard_count() OPERATOR(pg_catalog.-) 1)
        END)::text
$fn$;

CREATE FUNCTION durable_ledger_proxy.shard_of(run text)
RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
AS $fn$ SELECT durable_ledger_proxy.shard_name(durable_ledger_proxy.route(run)) $fn$;
COMMENT ON FUNCTION durable_ledger_proxy.shard_of(text) IS
    'the shard that holds a run (p0, p1, …)';

-- A proxy token is "<hash>.<the shard's token>": the hash of the run it
-- leases routes its renewals and releases.  NULL when it has no such form.
CREATE FUNCTION durable_ledger_proxy.token_route(token text)
RETURNS integer
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $fn$
SELECT CASE WHEN token OPERATOR(pg_catalog.~) '^-?[0-9]{1,10}\.'
             AND pg_catalog.split_part(token, '.', 1)::bigint
                 BETWEEN -2147483648 AND 2147483647
            THEN pg_catalog.split_part(token, '.', 1)::integer END
$fn$;

CREATE FUNCTION durable_ledger_proxy.shard_token(token text)
RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE STRICT
AS $fn$ SELECT pg_catalog.substr(token, pg_catalog.strpos(token, '.') OPERATOR(pg_catalog.+) 1) $fn$;

-- ---------------------------------------------------------------------------
-- Errors (each API function catches what a shard call raised, a cancel too,
-- and raises it again, renamed where below says so).  A shard's own errors
-- reach the caller as the shard raised them
-- (PL/Proxy keeps their SQLSTATE).  When PL/Proxy cannot reach a shard, or
-- loses it in the middle of a call, the call fails with 08006 naming the
-- shard; calls of runs on other shards go on.  A call lost in the middle may
-- have been committed by the shard: as after any lost connection, its effect
-- is then started under a lease that ends, and pauses for a person.
-- ---------------------------------------------------------------------------
CREATE FUNCTION durable_ledger_proxy.raise_if_unreachable(hash integer, state text, message text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    name text := durable_ledger_proxy.shard_name(hash);
    address text;
    what text := pg_catalog.regexp_replace(message, '^(PL/Proxy function )?[^ ]+\(\d+\): ', '');
BEGIN
    SELECT s.connstr INTO address FROM durable_ledger_proxy.shards s WHERE s.shard = name;
    IF message ~ '\] REMOTE FATAL: terminating connection due to administrator command' THEN
        -- break_lease, pg_terminate_backend: the shard is up
        RAISE EXCEPTION 'this session''s connection to shard % was terminated', name
            USING ERRCODE = '08006',
                  DETAIL = 'The shard ended it (durable_ledger.break_lease, pg_terminate_backend): the session leases '
                           'it held are gone.  A call under way when it ended may have been made.',
                  HINT = 'Stop the attempt; a new one (acquire_run) replays what was recorded, and pauses what is unknown.';
    ELSIF message LIKE 'PL/Proxy function %' OR message ~ '\] REMOTE (FATAL|PANIC): ' THEN
        RAISE EXCEPTION 'shard % cannot be reached: %', name, what
            USING ERRCODE = '08006',
                  DETAIL = pg_catalog.format('The shard''s connection string is "%s".  A call lost while under way '
                                             'may have been made there.', address),
                  HINT = 'Runs on the other shards go on.  Nothing recorded on this shard is lost: once it is back, '
                         'its calls answer again and what it paused shows in durable_ledger.unresolved.  Do not '
                         'make the call again in this attempt: start a new one.';
    ELSIF state = '57014' THEN
        RAISE EXCEPTION 'the call to shard % was canceled: %', name, what
            USING ERRCODE = '57014',
                  DETAIL = 'The shard may have committed it before the cancel reached it (a commit waiting for a '
                           'synchronous standby, say): through the proxy that is an error, not a WARNING.',
                  HINT = 'Do not make the call again in this attempt: start a new one, which replays what was '
                         'recorded and pauses what is unknown.';
    END IF;
END
$fn$;

CREATE FUNCTION durable_ledger_proxy.no_session_lease(run text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    RAISE EXCEPTION 'this session holds no lease of run "%" on its shard %', run,
            durable_ledger_proxy.shard_of(run)
        USING ERRCODE = '55000',
              DETAIL = 'Through the proxy, a call without a lease token takes no lease implicitly: '
                       'PL/Proxy would take it on a new connection to the shard after losing the one that held it.',
              HINT = 'Start the attempt with durable_ledger.acquire_run(), or use a token lease (durable_ledger.take_lease()).';
END
$fn$;

-- ---------------------------------------------------------------------------
-- Per shard: PL/Proxy calls run on the one shard a hash maps to.  The plain
-- ones (one ledger function, its own arguments) are made from the routing
-- table below; these are the others.  Each names the columns it asks for
-- (PL/Proxy's rule).
--
-- A call that writes first gives the shard's session the caller's
-- application_name (app), when it differs, so that the shard's audit log names
-- the caller's application, not the proxy's connection: the subquery "a"
-- (OFFSET 0: evaluated once, first) whose column the call's first argument
-- depends on, so that it runs after it.
-- ---------------------------------------------------------------------------

-- A call under a session lease goes on only while this session's connection
-- to the shard holds the run's lease, checked in the call's own statement
-- (NULL columns otherwise).  Under a token lease the shard checks the token.
CREATE FUNCTION durable_ledger_proxy.begin_effect_held(hash integer, app text, run text, tool text, args jsonb,
                                                       business_key text, meta jsonb, call_id boolean)
RETURNS durable_ledger.decision LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT (c.d).* FROM (SELECT CASE WHEN a.named AND durable_ledger.session_epoch(run) IS NOT NULL
                                     THEN durable_ledger.begin_effect(run, tool, args, business_key, meta,
                                                                      NULL, call_id) END AS d
                           FROM (SELECT pg_catalog.num_nulls(CASE WHEN pg_catalog.current_setting('application_name') IS DISTINCT FROM app THEN pg_catalog.set_config('application_name', app, false) END) >= 0 AS named OFFSET 0) a
                           OFFSET 0) c;
$fn$;
CREATE FUNCTION durable_ledger_proxy.begin_recorded_held(hash integer, app text, run text, tool text, args jsonb,
                                                         meta jsonb)
RETURNS durable_ledger.decision LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT (c.d).* FROM (SELECT CASE WHEN a.named AND durable_ledger.session_epoch(run) IS NOT NULL
                                     THEN durable_ledger.begin_recorded(run, tool, args, meta) END AS d
                           FROM (SELECT pg_catalog.num_nulls(CASE WHEN pg_catalog.current_setting('application_name') IS DISTINCT FROM app THEN pg_catalog.set_config('application_name', app, false) END) >= 0 AS named OFFSET 0) a
                           OFFSET 0) c;
$fn$;

-- The wait for a session lease honours the caller's lock_timeout and
-- durable_ledger.lease_wait_timeout (set for this call only, in its own
-- transaction on the shard), as on a direct connection.
CREATE FUNCTION durable_ledger_proxy.acquire_run_on(hash integer, app text, run text, wait boolean,
                                                    lock_timeout text, lease_wait_timeout text)
RETURNS boolean LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT x.r AS acquire_run_on
      FROM (SELECT pg_catalog.num_nulls(CASE WHEN pg_catalog.current_setting('application_name') IS DISTINCT FROM app THEN pg_catalog.set_config('application_name', app, false) END) >= 0 AS named OFFSET 0) a,
           (SELECT pg_catalog.num_nulls(
                       CASE WHEN lock_timeout IS NOT NULL
                            THEN pg_catalog.set_config('lock_timeout', lock_timeout, true) END,
                       CASE WHEN lease_wait_timeout IS NOT NULL
                            THEN pg_catalog.set_config('durable_ledger.lease_wait_timeout', lease_wait_timeout, true) END)
                   >= 0 AS timed
             OFFSET 0) t,
           LATERAL durable_ledger.acquire_run(CASE WHEN a.named AND t.timed THEN run END, wait) AS x(r);
$fn$;

-- The token handed out is the shard's behind the run's routing hash.
CREATE FUNCTION durable_ledger_proxy.take_lease_on(hash integer, app text, run text, ttl interval, holder text)
RETURNS durable_ledger.lease LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT l.run, hash::text || '.' || l.token AS token, l.epoch, l.expires_at, l.holder
      FROM (SELECT pg_catalog.num_nulls(CASE WHEN pg_catalog.current_setting('application_name') IS DISTINCT FROM app THEN pg_catalog.set_config('application_name', app, false) END) >= 0 AS named OFFSET 0) a,
           LATERAL durable_ledger.take_lease(CASE WHEN a.named THEN run END, ttl, holder) l;
$fn$;

-- Whether a shard has a key, asked as each caller may ask: a worker or an
-- admin by effect_status, an approver by the effects it may read, an admin's
-- divergence by the divergences an auditor (and so an admin) reads.
CREATE FUNCTION durable_ledger_proxy.has_effect_on(hash integer, key text)
RETURNS boolean LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT EXISTS (SELECT FROM durable_ledger.effect_status(key)) AS has_effect_on;
$fn$;
CREATE FUNCTION durable_ledger_proxy.has_effect_row_on(hash integer, key text)
RETURNS boolean LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT EXISTS (SELECT FROM durable_ledger.effects e WHERE e.key = key) AS has_effect_row_on;
$fn$;
CREATE FUNCTION durable_ledger_proxy.has_divergence_on(hash integer, key text)
RETURNS boolean LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT EXISTS (SELECT FROM durable_ledger.divergences d WHERE d.key = key) AS has_divergence_on;
$fn$;

-- What a shard is: its ledger's version (NULL: none), its registry, its policy.
CREATE FUNCTION durable_ledger_proxy.ledger_version_on(hash integer)
RETURNS text LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT (SELECT x.extversion FROM pg_catalog.pg_extension x
             WHERE x.extname = 'durable_ledger') AS ledger_version_on;
$fn$;
CREATE FUNCTION durable_ledger_proxy.tools_on(hash integer)
RETURNS SETOF durable_ledger.tools LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT t.* FROM durable_ledger.tools t;
$fn$;
CREATE FUNCTION durable_ledger_proxy.policy_on(hash integer)
RETURNS TABLE (unregistered_tools text, unregistered_divergence text, max_run_attempts integer)
LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT p.unregistered_tools, p.unregistered_divergence, p.max_run_attempts FROM durable_ledger.policy p;
$fn$;

-- The views people read, and the auditor's cookbook (docs/auditing.md), on one shard.
CREATE FUNCTION durable_ledger_proxy.unresolved_on(hash integer)
RETURNS SETOF durable_ledger_proxy.unresolved_row LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT u.key, u.run, u.tool, u.status, u.conflict, u.reason, u.created_at, u.age, u.args,
           u.meta, u.business_key, u.occurrence, u.attempt, u.lease_epoch, u.may_duplicate,
           u.run_abandoned_at, u.downstream_key, u.reconcile_grace
      FROM durable_ledger.unresolved u;
$fn$;
CREATE FUNCTION durable_ledger_proxy.leases_on(hash integer)
RETURNS SETOF durable_ledger_proxy.leases_row LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT l.run, l.holder_pid, l.lease_epoch, l.holder_role, l.application_name, l.client_addr,
           l.since, l.backend_state, l.lock_key, l.liveness, l.kind, l.holder, l.expires_at
      FROM durable_ledger.leases l;
$fn$;
CREATE FUNCTION durable_ledger_proxy.metrics_on(hash integer)
RETURNS SETOF durable_ledger_proxy.metrics_row LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT m.session_leases, m.token_leases, m.token_leases_expired, m.unresolved,
           m.unresolved_oldest_seconds, m.counters_kept
      FROM durable_ledger.metrics m;
$fn$;
CREATE FUNCTION durable_ledger_proxy.audit_heads_on(hash integer)
RETURNS SETOF durable_ledger_proxy.audit_heads_row LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT h.chain, h.chain_seq, h.id, h.logged_at, h.row_hash FROM durable_ledger.audit_heads h;
$fn$;
CREATE FUNCTION durable_ledger_proxy.metrics_events_on(hash integer)
RETURNS TABLE (event text, total bigint) LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT m.event, m.total FROM durable_ledger.metrics_events() m;
$fn$;
CREATE FUNCTION durable_ledger_proxy.verify_audit_on(hash integer, heads jsonb)
RETURNS TABLE (chain bigint, chain_seq bigint, id bigint, problem text) LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT v.chain, v.chain_seq, v.id, v.problem FROM durable_ledger.verify_audit(heads) v;
$fn$;
CREATE FUNCTION durable_ledger_proxy.audit_by_args_on(hash integer, field text, value text)
RETURNS TABLE (logged_at timestamptz, run text, event text, tool text, role_name text,
               session_user_name text, application_name text, client_addr inet,
               lease_epoch bigint, detail jsonb, args jsonb, meta jsonb, result jsonb)
LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT a.logged_at, a.run, a.event, e.tool, a.role_name, a.session_user_name,
           a.application_name, a.client_addr, a.lease_epoch, a.detail, e.args, e.meta, e.result
      FROM durable_ledger.audit_log a
      JOIN durable_ledger.effects e ON e.key = a.key
     WHERE e.args ->> field = value
     ORDER BY a.id;
$fn$;
CREATE FUNCTION durable_ledger_proxy.audit_of_run_on(hash integer, run text)
RETURNS TABLE (logged_at timestamptz, event text, key text, tool text, lease_epoch bigint,
               role_name text, application_name text, backend_pid integer, detail jsonb)
LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT a.logged_at, a.event, a.key, e.tool, a.lease_epoch, a.role_name,
           a.application_name, a.backend_pid, a.detail
      FROM durable_ledger.audit_log a
      LEFT JOIN durable_ledger.effects e ON e.key = a.key
     WHERE a.run = run
     ORDER BY a.id;
$fn$;
CREATE FUNCTION durable_ledger_proxy.human_decisions_on(hash integer)
RETURNS TABLE (logged_at timestamptz, event text, run text, key text, tool text, decided_by text,
               outcome text, previous_status text, note text, role_name text, session_user_name text)
LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT a.logged_at, a.event, a.run, a.key, e.tool,
           coalesce(a.detail ->> 'resolved_by', a.detail ->> 'broken_by') AS decided_by,
           a.detail ->> 'outcome' AS outcome,
           a.detail ->> 'previous_status' AS previous_status,
           a.detail ->> 'note' AS note,
           a.role_name, a.session_user_name
      FROM durable_ledger.audit_log a
      LEFT JOIN durable_ledger.effects e ON e.key = a.key
     WHERE a.event IN ('resolved', 'retry_allowed', 'lease_broken')
     ORDER BY a.id;
$fn$;
CREATE FUNCTION durable_ledger_proxy.replays_per_tool_on(hash integer, since interval)
RETURNS TABLE (tool text, replays bigint, runs bigint, effects bigint)
LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT coalesce(a.detail ->> 'tool',
                    (SELECT e.tool FROM durable_ledger.effects e WHERE e.key = a.key)) AS tool,
           count(*) AS replays, count(DISTINCT a.run) AS runs, count(DISTINCT a.key) AS effects
      FROM durable_ledger.audit_log a
     WHERE a.event = 'replay'
       AND a.logged_at >= now() - since
     GROUP BY 1
     ORDER BY replays DESC;
$fn$;

-- ---------------------------------------------------------------------------
-- Finding a key's shard.  A report or a decision names its run when it can
-- (the clients do): it goes straight to the run's shard.  Without one, every
-- shard is asked whether it has the key, and the call goes to the one that
-- does; a key on none is unknown (42704); a business key on several (runs of
-- several routing keys used it, which the routing rules forbid) needs its
-- run.  Asking is read-only: nothing is ever written on more than one shard.
-- ---------------------------------------------------------------------------
CREATE FUNCTION durable_ledger_proxy.locate(key text, run text, asked_as text)
RETURNS integer
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    s record;
    found integer[] := '{}';
    names text[] := '{}';
    there boolean;
BEGIN
    IF run IS NOT NULL THEN
        RETURN durable_ledger_proxy.route(run);
    ELSIF key IS NULL THEN
        RETURN 0;   -- the shard says that a key is required
    END IF;
    FOR s IN SELECT x.partition, x.shard FROM durable_ledger_proxy.shards x ORDER BY x.partition LOOP
        BEGIN
            -- (one statement each: an expression needs the right to every function it names)
            IF asked_as = 'effect' THEN
                there := durable_ledger_proxy.has_effect_on(s.partition, key);
            ELSIF asked_as = 'effect_row' THEN
                there := durable_ledger_proxy.has_effect_row_on(s.partition, key);
            ELSE
                there := durable_ledger_proxy.has_divergence_on(s.partition, key);
            END IF;
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            PERFORM durable_ledger_proxy.raise_if_unreachable(s.partition, SQLSTATE, SQLERRM);
            RAISE;
        END;
        IF there THEN
            found := found || s.partition;
            names := names || s.shard;
        END IF;
    END LOOP;
    IF pg_catalog.cardinality(found) = 0 THEN
        RAISE EXCEPTION '% "%" does not exist on any shard',
                CASE asked_as WHEN 'divergence' THEN 'divergence' ELSE 'effect' END, key
            USING ERRCODE = '42704',
                  HINT = 'Pass a key that durable_ledger.begin_effect() returned.';
    ELSIF pg_catalog.cardinality(found) > 1 THEN
        RAISE EXCEPTION 'key "%" is on more than one shard (%)', key, pg_catalog.array_to_string(names, ', ')
            USING ERRCODE = '22023',
                  DETAIL = 'Runs of different routing keys used the same business key; each shard holds its own.',
                  HINT = 'Name the run the call is about: run => …';
    END IF;
    RETURN found[1];
END
$fn$;

-- ---------------------------------------------------------------------------
-- A change of the registry or the policy goes to every shard in turn, once
-- every shard has answered (a shard that is down stops it before anything
-- changed).  Each shard commits its own; one that fails in the middle stops
-- the rest, and the error names the shards that took it
-- (durable_ledger_proxy.registry_drift shows where they differ).
-- ---------------------------------------------------------------------------
CREATE FUNCTION durable_ledger_proxy.every_shard_answers()
RETURNS void
LANGUAGE plpgsql STABLE
AS $fn$
DECLARE
    s record;
    version text;
BEGIN
    IF NOT EXISTS (SELECT FROM durable_ledger_proxy.shards) THEN
        RAISE EXCEPTION 'the proxy has no shards'
            USING ERRCODE = '55000',
                  HINT = 'Create the PL/Proxy server durable_ledger_shards with a partition p0, p1, … per shard (docs/scale-out.md).';
    END IF;
    FOR s IN SELECT x.partition, x.shard FROM durable_ledger_proxy.shards x ORDER BY x.partition LOOP
        BEGIN
            version := durable_ledger_proxy.ledger_version_on(s.partition);
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            PERFORM durable_ledger_proxy.raise_if_unreachable(s.partition, SQLSTATE, SQLERRM);
            RAISE;
        END;
        IF version IS NULL THEN
            RAISE EXCEPTION 'shard % has no durable_ledger', s.shard
                USING ERRCODE = '55000',
                      HINT = 'Run CREATE EXTENSION durable_ledger in the shard''s database.';
        END IF;
    END LOOP;
END
$fn$;

-- The error of a change some shards took: with the shard's own SQLSTATE.
CREATE FUNCTION durable_ledger_proxy.raise_partly_applied(what text, failed integer, applied text[],
                                                          state text, message text)
RETURNS void
LANGUAGE plpgsql STABLE
AS $fn$
BEGIN
    PERFORM durable_ledger_proxy.raise_if_unreachable(failed, state, message);
    IF pg_catalog.cardinality(applied) > 0 THEN
        RAISE EXCEPTION '% failed on shard % after shards % took it: %', what,
                durable_ledger_proxy.shard_name(failed), pg_catalog.array_to_string(applied, ', '), message
            USING ERRCODE = state,
                  HINT = 'The shards differ until the change is made on the others: see durable_ledger_proxy.registry_drift.';
    END IF;
END
$fn$;

-- ---------------------------------------------------------------------------
-- The routing table: how each of the ledger's functions reaches its shard.
-- From each row come a PL/Proxy call on one shard
-- (durable_ledger_proxy.<name>_on) and, unless the API function is written
-- out further down, the API function itself, durable_ledger.<name>, with the
-- ledger's parameters, run as its caller (PL/Proxy connects to the shard as
-- the calling role: the shard checks what it may do and records it).
--   run          the shard of its run
--   key          a report or decision about a key: the shard of its run
--                (run, added as the last parameter) or, without it, the one
--                shard that has the key (locate above) — asked as a worker
--                ('effect'), an approver ('effect_row') or for a divergence
--   every shard  the registry and the policy (above)
--   own          the call on one shard only; the API function is written out
--   by hand      both are written out
-- A call is its own transaction on its shard, committed when it returns,
-- whatever the caller's transaction does afterwards.
-- ---------------------------------------------------------------------------
CREATE TABLE durable_ledger_proxy.routing (
    name        text PRIMARY KEY,    -- the ledger's function
    params      text NOT NULL,       -- its parameters, as the ledger declares them
    returns     text NOT NULL,
    routed_by   text NOT NULL CHECK (routed_by IN ('run', 'key', 'every shard', 'own', 'by hand')),
    asked_as    text CHECK ((routed_by = 'key') = (asked_as IS NOT NULL)),
    granted_to  name NOT NULL    -- as on the shards: the API function and its call on one shard
);
COMMENT ON TABLE durable_ledger_proxy.routing IS
    'how each of the ledger''s functions is routed to its shard (read by the install script)';

INSERT INTO durable_ledger_proxy.routing VALUES
    -- workers
    ('canonical_args',   'args jsonb', 'text', 'own', NULL, 'durable_ledger_worker'),
    ('effect_key',       'run text, tool text, args jsonb, occurrence integer', 'text', 'run', NULL, 'durable_ledger_worker'),
    ('acquire_run',      'run text, wait boolean DEFAULT true', 'boolean', 'by hand', NULL, 'durable_ledger_worker'),
    ('release_run',      'run text', 'boolean', 'run', NULL, 'durable_ledger_worker'),
    ('session_epoch',    'run text', 'bigint', 'run', NULL, 'durable_ledger_worker'),
    ('release_attempt',  'run text, epoch bigint', 'boolean', 'run', NULL, 'durable_ledger_worker'),
    ('take_lease',       'run text, ttl interval, holder text', 'durable_ledger.lease', 'by hand', NULL, 'durable_ledger_worker'),
    ('renew_lease',      'token text, ttl interval', 'timestamptz', 'own', NULL, 'durable_ledger_worker'),
    ('release_lease',    'token text', 'boolean', 'own', NULL, 'durable_ledger_worker'),
    ('begin_effect',     'run text, tool text, args jsonb, business_key text, meta jsonb, lease text, call_id boolean',
                         'durable_ledger.decision', 'own', NULL, 'durable_ledger_worker'),
    ('begin_recorded',   'run text, tool text, args jsonb, meta jsonb, lease text',
                         'durable_ledger.decision', 'own', NULL, 'durable_ledger_worker'),
    ('complete_effect',  'key text, result jsonb, attempt integer DEFAULT NULL',
                         'durable_ledger.effects', 'key', 'effect', 'durable_ledger_worker'),
    ('fail_effect',      'key text, error jsonb, attempt integer DEFAULT NULL',
                         'durable_ledger.effects', 'key', 'effect', 'durable_ledger_worker'),
    ('effect_status',    'key text', 'SETOF durable_ledger.effects', 'own', NULL, 'durable_ledger_worker'),
    ('reconcile_effect', 'key text, attempt integer, happened boolean, evidence jsonb',
                         'durable_ledger.effects', 'key', 'effect', 'durable_ledger_worker'),
    ('reconcilable_from', 'key text, attempt integer', 'timestamptz', 'key', 'effect', 'durable_ledger_worker'),
    -- admins: decisions about an effect, a run
    ('resolve_effect',   'key text, outcome text, result jsonb, resolved_by text, note text DEFAULT NULL, attempt integer DEFAULT NULL',
                         'durable_ledger.effects', 'key', 'effect', 'durable_ledger_admin'),
    ('retry_effect',     'key text, attempt integer, resolved_by text, note text DEFAULT NULL',
                         'durable_ledger.effects', 'key', 'effect', 'durable_ledger_admin'),
    ('resolve_divergence', 'key text, verdict text, resolved_by text, note text DEFAULT NULL, same_as text DEFAULT NULL',
                         'durable_ledger.divergences', 'key', 'divergence', 'durable_ledger_admin'),
    ('break_lease',      'run text, broken_by text, note text DEFAULT NULL', 'boolean', 'run', NULL, 'durable_ledger_admin'),
    ('abandon_run',      'run text, abandoned_by text, note text DEFAULT NULL', 'boolean', 'run', NULL, 'durable_ledger_admin'),
    ('fork_run',         'source_run text, new_run text, up_to text, forked_by text, note text',
                         'integer', 'own', NULL, 'durable_ledger_admin'),
    ('set_run_budget',   'run text, changed_by text, note text DEFAULT NULL, tool text DEFAULT NULL, max_executions integer DEFAULT NULL, max_in_window integer DEFAULT NULL, max_attempts integer DEFAULT NULL',
                         'void', 'run', NULL, 'durable_ledger_admin'),
    -- admins: the registry and the policy
    ('register_tool',    'tool text, registered_by text, side_effecting boolean DEFAULT true, divergence text DEFAULT NULL, key_fields text[] DEFAULT NULL, note text DEFAULT NULL',
                         'durable_ledger.tools', 'every shard', NULL, 'durable_ledger_admin'),
    ('change_tool',      'tool text, changed_by text, side_effecting boolean DEFAULT NULL, divergence text DEFAULT NULL, key_fields text[] DEFAULT NULL, note text DEFAULT NULL',
                         'durable_ledger.tools', 'every shard', NULL, 'durable_ledger_admin'),
    ('retire_tool',      'tool text, retired_by text, note text DEFAULT NULL', 'durable_ledger.tools', 'every shard', NULL, 'durable_ledger_admin'),
    ('set_reconcile',    'tool text, grace interval, changed_by text, note text DEFAULT NULL',
                         'durable_ledger.tools', 'every shard', NULL, 'durable_ledger_admin'),
    ('set_approval',     'tool text, condition jsonpath, changed_by text, note text DEFAULT NULL',
                         'durable_ledger.tools', 'every shard', NULL, 'durable_ledger_admin'),
    ('set_budget',       'tool text, max_executions integer, changed_by text, note text DEFAULT NULL, max_in_window integer DEFAULT NULL, budget_window interval DEFAULT NULL',
                         'durable_ledger.tools', 'every shard', NULL, 'durable_ledger_admin'),
    ('set_attempts_budget', 'max_attempts integer, changed_by text, note text DEFAULT NULL', 'integer', 'every shard', NULL, 'durable_ledger_admin'),
    ('set_unregistered_tools', 'setting text, set_by text, note text DEFAULT NULL', 'text', 'every shard', NULL, 'durable_ledger_admin'),
    ('set_unregistered_divergence', 'setting text, set_by text, note text DEFAULT NULL', 'text', 'every shard', NULL, 'durable_ledger_admin'),
    -- admins: retention, shard by shard
    ('purge_settled',    'older_than interval, purged_by text, dry_run boolean, max_runs integer',
                         'TABLE (run text, effects bigint, past_attempts bigint, divergences bigint)', 'own', NULL, 'durable_ledger_admin'),
    ('purge_audit',      'older_than interval, purged_by text, dry_run boolean',
                         'TABLE (chain bigint, audit_rows bigint, up_to_seq bigint)', 'own', NULL, 'durable_ledger_admin'),
    -- approvers
    ('approve_effect',   'key text, approved_by text, note text DEFAULT NULL', 'durable_ledger.effects', 'key', 'effect_row', 'durable_ledger_approver'),
    ('reject_effect',    'key text, rejected_by text, note text DEFAULT NULL', 'durable_ledger.effects', 'key', 'effect_row', 'durable_ledger_approver'),
    -- auditors
    ('history',          'run text',
                         'TABLE (id bigint, logged_at timestamptz, lease_epoch bigint, event text, key text, tool text, args jsonb, attempt integer, outcome jsonb, detail jsonb, role_name text, application_name text)',
                         'run', NULL, 'durable_ledger_auditor');

DO $make$
DECLARE
    r record;
    shard_params text;      -- the parameters without their defaults
    call_args text;         -- their names, as the call's arguments
    after_named text;       -- the same, the first one after the subquery "a" (above)
    set_returning boolean;
    row_returning boolean;
    route text;
    body text;
BEGIN
    FOR r IN SELECT * FROM durable_ledger_proxy.routing WHERE routed_by <> 'by hand' ORDER BY name LOOP
        shard_params := pg_catalog.regexp_replace(r.params, '\s+DEFAULT\s+[^,]+', '', 'g');
        SELECT pg_catalog.string_agg(pg_catalog.split_part(pg_catalog.btrim(p), ' ', 1), ', ' ORDER BY n)
          INTO call_args
          FROM pg_catalog.unnest(pg_catalog.string_to_array(shard_params, ',')) WITH ORDINALITY AS u(p, n);
        set_returning := r.returns ~ '^(SETOF|TABLE) ';
        row_returning := set_returning OR r.returns LIKE 'durable_ledger.%';
        after_named := pg_catalog.regexp_replace(call_args, '^(\w+)', 'CASE WHEN a.named THEN \1 END');

        -- the call on one shard, after the caller's application_name
        EXECUTE pg_catalog.format(
            $f$CREATE FUNCTION durable_ledger_proxy.%1$I(hash integer, app text, %2$s) RETURNS %3$s
               LANGUAGE plproxy AS $p$
                   CLUSTER 'durable_ledger_shards'; RUN ON hash;
                   SELECT %4$s
                     FROM %5$s,
                          LATERAL durable_ledger.%6$I(%7$s) AS %8$s;
               $p$$f$,
            r.name || '_on', shard_params, r.returns,
            CASE WHEN row_returning THEN 'x.*' ELSE pg_catalog.format('x.r AS %I', r.name || '_on') END,
            '(SELECT pg_catalog.num_nulls(CASE WHEN pg_catalog.current_setting(''application_name'') IS DISTINCT FROM app THEN pg_catalog.set_config(''application_name'', app, false) END) >= 0 AS named OFFSET 0) a', r.name, after_named,
            CASE WHEN row_returning THEN 'x' ELSE 'x(r)' END);
        -- only to whom the ledger grants the function: a user mapping that connected
        -- every caller as one role would otherwise let anyone make any call
        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION durable_ledger_proxy.%I(hash integer, app text, %s) TO %I',
                                  r.name || '_on', shard_params, r.granted_to);

        CONTINUE WHEN r.routed_by = 'own';

        -- the API function
        IF r.routed_by = 'every shard' THEN
            EXECUTE pg_catalog.format(
                $f$CREATE FUNCTION durable_ledger.%1$I(%2$s) RETURNS %3$s LANGUAGE plpgsql VOLATILE AS $w$
                   DECLARE
                       s record;
                       answer %3$s;
                       applied text[] := '{}';
                   BEGIN
                       PERFORM durable_ledger_proxy.every_shard_answers();
                       FOR s IN SELECT x.partition, x.shard FROM durable_ledger_proxy.shards x ORDER BY x.partition LOOP
                           BEGIN
                               answer := durable_ledger_proxy.%4$I(s.partition, pg_catalog.current_setting('application_name'), %5$s);
                           EXCEPTION WHEN OTHERS OR query_canceled THEN
                               PERFORM durable_ledger_proxy.raise_partly_applied(%1$L, s.partition, applied, SQLSTATE, SQLERRM);
                               RAISE;
                           END;
                           applied := applied || s.shard;
                       END LOOP;
                       RETURN answer;
                   END
                   $w$$f$,
                r.name, r.params, r.returns, r.name || '_on', call_args);
            EXECUTE pg_catalog.format('COMMENT ON FUNCTION durable_ledger.%I(%s) IS %L', r.name, shard_params,
                pg_catalog.format('durable_ledger.%s on every shard, one after another', r.name));
            CONTINUE;
        END IF;

        IF r.routed_by = 'run' THEN
            route := 'COALESCE(durable_ledger_proxy.route(run), 0)';
        ELSE
            route := pg_catalog.format('durable_ledger_proxy.locate(key, run, %L)', r.asked_as);
            r.params := r.params || ', run text DEFAULT NULL';
            shard_params := shard_params || ', run text';
        END IF;
        body := CASE
            WHEN set_returning THEN 'RETURN QUERY SELECT * FROM durable_ledger_proxy.%1$I(hash, %3$s, %2$s);'
            WHEN r.returns = 'void' THEN 'PERFORM durable_ledger_proxy.%1$I(hash, %3$s, %2$s);'
            ELSE 'RETURN durable_ledger_proxy.%1$I(hash, %3$s, %2$s);' END;
        EXECUTE pg_catalog.format(
            $f$CREATE FUNCTION durable_ledger.%1$I(%2$s) RETURNS %3$s LANGUAGE plpgsql VOLATILE AS $w$
               DECLARE
                   hash integer;
               BEGIN
                   hash := %4$s;
                   %5$s
               EXCEPTION WHEN OTHERS OR query_canceled THEN
                   PERFORM durable_ledger_proxy.raise_if_unreachable(hash, SQLSTATE, SQLERRM);
                   RAISE;
               END
               $w$$f$,
            r.name, r.params, r.returns, route,
            pg_catalog.format(body, r.name || '_on', call_args, 'pg_catalog.current_setting(''application_name'')'));
        EXECUTE pg_catalog.format('COMMENT ON FUNCTION durable_ledger.%I(%s) IS %L', r.name, shard_params,
            CASE r.routed_by
                WHEN 'run' THEN pg_catalog.format('durable_ledger.%s on the shard of its run', r.name)
                ELSE pg_catalog.format('durable_ledger.%s on the shard of run (or, without it, on the one shard that has the key)', r.name) END);
    END LOOP;
END
$make$;

-- ---------------------------------------------------------------------------
-- The API functions written out: what is more than a routed call.
-- ---------------------------------------------------------------------------

-- Any shard computes canonical args the same: the first is asked.
CREATE FUNCTION durable_ledger.canonical_args(args jsonb)
RETURNS text LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RETURN durable_ledger_proxy.canonical_args_on(0, pg_catalog.current_setting('application_name'), args);
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(0, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;

-- Session leases: PL/Proxy's connection to the run's shard holds it.  A new
-- attempt relies on nothing its session had: when that connection turns out
-- to have been ended (a lease broken, the shard restarted, PL/Proxy having
-- read the end only now), the call is made once more, on PL/Proxy's new one.
CREATE FUNCTION durable_ledger.acquire_run(run text, wait boolean DEFAULT true)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    hash integer := COALESCE(durable_ledger_proxy.route(run), 0);
    tries integer := 0;
BEGIN
    LOOP
        tries := tries + 1;
        BEGIN
            RETURN durable_ledger_proxy.acquire_run_on(hash, pg_catalog.current_setting('application_name'), run, wait,
                                                       pg_catalog.current_setting('lock_timeout'),
                                                       pg_catalog.current_setting('durable_ledger.lease_wait_timeout', true));
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            IF tries > 1 OR SQLERRM !~ '(\] REMOTE FATAL: terminating connection|server closed the connection unexpectedly)' THEN
                PERFORM durable_ledger_proxy.raise_if_unreachable(hash, SQLSTATE, SQLERRM);
                RAISE;
            END IF;
        END;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION durable_ledger.acquire_run(text, boolean) IS
    'durable_ledger.acquire_run on the shard of its run, waiting as long as this session''s lock_timeout and durable_ledger.lease_wait_timeout say';

-- Token leases: the token carries its run's routing hash.
CREATE FUNCTION durable_ledger.take_lease(run text, ttl interval DEFAULT '5 minutes', holder text DEFAULT NULL)
RETURNS durable_ledger.lease LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    hash integer := COALESCE(durable_ledger_proxy.route(run), 0);
    l durable_ledger.lease;
BEGIN
    l := durable_ledger_proxy.take_lease_on(hash, pg_catalog.current_setting('application_name'), run, ttl, holder);
    IF l.token IS NULL THEN
        RETURN NULL;   -- a live lease holds the run
    END IF;
    RETURN l;
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(hash, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;

CREATE FUNCTION durable_ledger.renew_lease(token text, ttl interval DEFAULT NULL)
RETURNS timestamptz LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    hash integer := durable_ledger_proxy.token_route(token);
BEGIN
    IF token IS NULL THEN
        hash := 0;   -- the shard says that a token is required
    ELSIF hash IS NULL THEN
        RAISE EXCEPTION 'no token lease has this token'
            USING ERRCODE = '55L01',
                  HINT = 'Pass a token that durable_ledger.take_lease() returned through the proxy.';
    END IF;
    RETURN durable_ledger_proxy.renew_lease_on(hash, pg_catalog.current_setting('application_name'),
                                               durable_ledger_proxy.shard_token(token), ttl);
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(hash, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;

CREATE FUNCTION durable_ledger.release_lease(token text)
RETURNS boolean LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    hash integer := durable_ledger_proxy.token_route(token);
BEGIN
    IF token IS NULL THEN
        hash := 0;
    ELSIF hash IS NULL THEN
        RETURN false;   -- no lease has it, as the ledger answers
    END IF;
    RETURN durable_ledger_proxy.release_lease_on(hash, pg_catalog.current_setting('application_name'),
                                                 durable_ledger_proxy.shard_token(token));
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(hash, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;

-- Calls.  Without a token, a call needs this session's lease of the run on
-- the run's shard, and takes none implicitly (no_session_lease says why).
CREATE FUNCTION durable_ledger.begin_effect(run text, tool text, args jsonb,
                                            business_key text DEFAULT NULL,
                                            meta jsonb DEFAULT NULL,
                                            lease text DEFAULT NULL,
                                            call_id boolean DEFAULT false)
RETURNS durable_ledger.decision LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    hash integer := COALESCE(durable_ledger_proxy.route(run), 0);
    d durable_ledger.decision;
BEGIN
    IF lease IS NOT NULL THEN
        RETURN durable_ledger_proxy.begin_effect_on(hash, pg_catalog.current_setting('application_name'),
                                                    run, tool, args, business_key, meta,
                                                    durable_ledger_proxy.shard_token(lease), call_id);
    END IF;
    d := durable_ledger_proxy.begin_effect_held(hash, pg_catalog.current_setting('application_name'),
                                                run, tool, args, business_key, meta, call_id);
    IF d.decision IS NULL THEN
        PERFORM durable_ledger_proxy.no_session_lease(run);
    END IF;
    RETURN d;
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(hash, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;
COMMENT ON FUNCTION durable_ledger.begin_effect(text, text, jsonb, text, jsonb, text, boolean) IS
    'durable_ledger.begin_effect on the shard of its run; without a token, only under this session''s lease of the run (acquire_run)';

CREATE FUNCTION durable_ledger.begin_recorded(run text, tool text, args jsonb,
                                              meta jsonb DEFAULT NULL,
                                              lease text DEFAULT NULL)
RETURNS durable_ledger.decision LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    hash integer := COALESCE(durable_ledger_proxy.route(run), 0);
    d durable_ledger.decision;
BEGIN
    IF lease IS NOT NULL THEN
        RETURN durable_ledger_proxy.begin_recorded_on(hash, pg_catalog.current_setting('application_name'),
                                                      run, tool, args, meta,
                                                      durable_ledger_proxy.shard_token(lease));
    END IF;
    d := durable_ledger_proxy.begin_recorded_held(hash, pg_catalog.current_setting('application_name'),
                                                  run, tool, args, meta);
    IF d.decision IS NULL THEN
        PERFORM durable_ledger_proxy.no_session_lease(run);
    END IF;
    RETURN d;
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(hash, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;
COMMENT ON FUNCTION durable_ledger.begin_recorded(text, text, jsonb, jsonb, text) IS
    'durable_ledger.begin_recorded on the shard of its run; without a token, only under this session''s lease of the run (acquire_run)';

-- A local effect's writes share a transaction with its intent and outcome in
-- the ledger's own database: through a proxy, whose calls are each a
-- transaction of their own on a shard, that cannot be.
CREATE FUNCTION durable_ledger.begin_local(run text, tool text, args jsonb,
                                           business_key text DEFAULT NULL,
                                           meta jsonb DEFAULT NULL,
                                           lease text DEFAULT NULL)
RETURNS durable_ledger.decision LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RAISE EXCEPTION 'a local effect cannot be begun through the proxy'
        USING ERRCODE = '0A000',
              DETAIL = 'A local effect commits with its tool''s writes in the ledger''s own database; '
                       'through the proxy every call is a transaction of its own on its shard.',
              HINT = pg_catalog.format('Begin it on the run''s shard, %s (durable_ledger_proxy.shards).',
                                       durable_ledger_proxy.shard_of(run));
END
$fn$;

-- Without a run, every shard is asked (read-only); a business key that runs
-- of several routing keys used gives a row per shard that has it.
CREATE FUNCTION durable_ledger.effect_status(key text, run text DEFAULT NULL)
RETURNS SETOF durable_ledger.effects LANGUAGE plpgsql VOLATILE ROWS 1 AS $fn$
DECLARE
    s record;
    hash integer := durable_ledger_proxy.route(run);
BEGIN
    IF hash IS NOT NULL OR key IS NULL THEN
        hash := COALESCE(hash, 0);
        RETURN QUERY SELECT * FROM durable_ledger_proxy.effect_status_on(hash, pg_catalog.current_setting('application_name'), key);
        RETURN;
    END IF;
    FOR s IN SELECT x.partition FROM durable_ledger_proxy.shards x ORDER BY x.partition LOOP
        hash := s.partition;
        RETURN QUERY SELECT * FROM durable_ledger_proxy.effect_status_on(hash, pg_catalog.current_setting('application_name'), key);
    END LOOP;
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(hash, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;

-- A fork is written on its source's shard, so the new run must be routed
-- there for good: it must have the source's routing key.
CREATE FUNCTION durable_ledger.fork_run(source_run text, new_run text, up_to text, forked_by text,
                                        note text DEFAULT NULL)
RETURNS integer LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    hash integer := COALESCE(durable_ledger_proxy.route(source_run), 0);
    source_key text := durable_ledger_proxy.routing_key(source_run);
    new_key text := durable_ledger_proxy.routing_key(new_run);
BEGIN
    IF source_key IS DISTINCT FROM new_key AND source_run IS NOT NULL AND new_run IS NOT NULL THEN
        RAISE EXCEPTION 'the new run "%" must have the routing key of "%"', new_run, source_run
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('A fork is written on its source''s shard; the source''s routing key is "%s", the new run''s "%s".',
                                             source_key, new_key),
                  HINT = pg_catalog.format('Name the new run with the source''s routing key as a hash tag, e.g. "{%s}%s".',
                                           source_key, new_run);
    END IF;
    RETURN durable_ledger_proxy.fork_run_on(hash, pg_catalog.current_setting('application_name'),
                                            source_run, new_run, up_to, forked_by, note);
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(hash, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;

-- Retention, shard by shard (each row names its shard).
CREATE FUNCTION durable_ledger.purge_settled(older_than interval, purged_by text,
                                             dry_run boolean DEFAULT true,
                                             max_runs integer DEFAULT 500)
RETURNS TABLE (shard text, run text, effects bigint, past_attempts bigint, divergences bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    s record;
BEGIN
    PERFORM durable_ledger_proxy.every_shard_answers();
    FOR s IN SELECT x.partition, x.shard FROM durable_ledger_proxy.shards x ORDER BY x.partition LOOP
        BEGIN
            RETURN QUERY SELECT s.shard, p.run, p.effects, p.past_attempts, p.divergences
                           FROM durable_ledger_proxy.purge_settled_on(s.partition,
                                    pg_catalog.current_setting('application_name'), older_than, purged_by,
                                    dry_run, max_runs) p;
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            PERFORM durable_ledger_proxy.raise_if_unreachable(s.partition, SQLSTATE, SQLERRM);
            RAISE;
        END;
    END LOOP;
END
$fn$;

CREATE FUNCTION durable_ledger.purge_audit(older_than interval, purged_by text,
                                           dry_run boolean DEFAULT true)
RETURNS TABLE (shard text, chain bigint, audit_rows bigint, up_to_seq bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    s record;
BEGIN
    PERFORM durable_ledger_proxy.every_shard_answers();
    FOR s IN SELECT x.partition, x.shard FROM durable_ledger_proxy.shards x ORDER BY x.partition LOOP
        BEGIN
            RETURN QUERY SELECT s.shard, p.chain, p.audit_rows, p.up_to_seq
                           FROM durable_ledger_proxy.purge_audit_on(s.partition,
                                    pg_catalog.current_setting('application_name'), older_than, purged_by, dry_run) p;
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            PERFORM durable_ledger_proxy.raise_if_unreachable(s.partition, SQLSTATE, SQLERRM);
            RAISE;
        END;
    END LOOP;
END
$fn$;

-- ---------------------------------------------------------------------------
-- What people read, over every shard, one after another; each row names its
-- shard.  A shard that cannot be reached fails the whole answer (08006,
-- naming it): a list of what waits for a person is never shown incomplete.
-- durable_ledger_proxy.shard_health says which shards answer.
-- ---------------------------------------------------------------------------
CREATE FUNCTION durable_ledger_proxy.unresolved_at(part integer)
RETURNS SETOF durable_ledger_proxy.unresolved_row LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RETURN QUERY SELECT * FROM durable_ledger_proxy.unresolved_on(part);
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(part, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;
CREATE FUNCTION durable_ledger_proxy.leases_at(part integer)
RETURNS SETOF durable_ledger_proxy.leases_row LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RETURN QUERY SELECT * FROM durable_ledger_proxy.leases_on(part);
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(part, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;
CREATE FUNCTION durable_ledger_proxy.metrics_at(part integer)
RETURNS SETOF durable_ledger_proxy.metrics_row LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RETURN QUERY SELECT * FROM durable_ledger_proxy.metrics_on(part);
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(part, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;
CREATE FUNCTION durable_ledger_proxy.audit_heads_at(part integer)
RETURNS SETOF durable_ledger_proxy.audit_heads_row LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RETURN QUERY SELECT * FROM durable_ledger_proxy.audit_heads_on(part);
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(part, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;

CREATE VIEW durable_ledger.unresolved AS
SELECT s.shard, u.*
  FROM durable_ledger_proxy.shards s
 CROSS JOIN LATERAL durable_ledger_proxy.unresolved_at(s.partition) u;
COMMENT ON VIEW durable_ledger.unresolved IS
    'what waits for a person, on every shard (each shard''s durable_ledger.unresolved, with the shard''s name)';

CREATE VIEW durable_ledger.leases AS
SELECT s.shard, l.*
  FROM durable_ledger_proxy.shards s
 CROSS JOIN LATERAL durable_ledger_proxy.leases_at(s.partition) l;
COMMENT ON VIEW durable_ledger.leases IS
    'the live leases of every shard; a session lease''s holder_pid, application_name and client_addr are those of the proxy''s connection to the shard';

CREATE VIEW durable_ledger.metrics AS
SELECT s.shard, m.*
  FROM durable_ledger_proxy.shards s
 CROSS JOIN LATERAL durable_ledger_proxy.metrics_at(s.partition) m;
COMMENT ON VIEW durable_ledger.metrics IS
    'each shard''s durable_ledger.metrics, one row per shard';

CREATE VIEW durable_ledger.audit_heads AS
SELECT s.shard, h.*
  FROM durable_ledger_proxy.shards s
 CROSS JOIN LATERAL durable_ledger_proxy.audit_heads_at(s.partition) h;
COMMENT ON VIEW durable_ledger.audit_heads IS
    'the newest row of every audit chain of every shard: kept outside, jsonb_object_agg(shard, heads) is what verify_audit(heads) takes';

CREATE FUNCTION durable_ledger.metrics_events()
RETURNS TABLE (shard text, event text, total bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT x.partition, x.shard FROM durable_ledger_proxy.shards x ORDER BY x.partition LOOP
        BEGIN
            RETURN QUERY SELECT s.shard, m.event, m.total FROM durable_ledger_proxy.metrics_events_on(s.partition) m;
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            PERFORM durable_ledger_proxy.raise_if_unreachable(s.partition, SQLSTATE, SQLERRM);
            RAISE;
        END;
    END LOOP;
END
$fn$;

-- Each shard's chains are its own.  heads: what audit_heads showed, as one
-- object keyed by shard ({"p0": [ … ], "p1": [ … ]}); a shard it leaves out
-- is checked without heads, and says so.
CREATE FUNCTION durable_ledger.verify_audit(heads jsonb DEFAULT NULL)
RETURNS TABLE (shard text, chain bigint, chain_seq bigint, id bigint, problem text)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    s record;
BEGIN
    IF heads IS NOT NULL AND pg_catalog.jsonb_typeof(heads) IS DISTINCT FROM 'object' THEN
        RAISE EXCEPTION 'heads must be a JSON object of each shard''s heads'
            USING ERRCODE = '22023',
                  HINT = 'Keep SELECT jsonb_object_agg(shard, heads) FROM (SELECT shard, jsonb_agg(h) AS heads FROM durable_ledger.audit_heads h GROUP BY shard) x.';
    END IF;
    FOR s IN SELECT x.partition, x.shard FROM durable_ledger_proxy.shards x ORDER BY x.partition LOOP
        IF heads IS NOT NULL AND NOT heads ? s.shard THEN
            shard := s.shard; chain := NULL; chain_seq := NULL; id := NULL;
            problem := 'no heads were given for this shard: its newest rows were not checked against kept heads';
            RETURN NEXT;
        END IF;
        BEGIN
            RETURN QUERY SELECT s.shard, v.chain, v.chain_seq, v.id, v.problem
                           FROM durable_ledger_proxy.verify_audit_on(s.partition, heads -> s.shard) v;
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            PERFORM durable_ledger_proxy.raise_if_unreachable(s.partition, SQLSTATE, SQLERRM);
            RAISE;
        END;
    END LOOP;
END
$fn$;

-- The role a shard sees this session as: PL/Proxy connects as the caller's
-- own role only when the user mapping (and the partitions' connection
-- strings, which must not say user=) let it.
CREATE FUNCTION durable_ledger_proxy.shard_user_on(hash integer)
RETURNS text LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT current_user::text AS shard_user_on;
$fn$;

-- Which shards answer, with which ledger, and what is wrong with the setup
-- (docs/scale-out.md): no error for a shard that does not answer.
CREATE FUNCTION durable_ledger_proxy.shard_health()
RETURNS TABLE (shard text, connstr text, answers boolean, ledger_version text, problem text)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    s record;
    shard_user text;
    lifetime text;
BEGIN
    SELECT o.option_value INTO lifetime
      FROM pg_catalog.pg_foreign_server f, pg_catalog.pg_options_to_table(f.srvoptions) o
     WHERE f.srvname = 'durable_ledger_shards' AND pg_catalog.lower(o.option_name) = 'connection_lifetime';
    FOR s IN SELECT x.partition, x.shard, x.connstr FROM durable_ledger_proxy.shards x ORDER BY x.partition LOOP
        shard := s.shard;
        connstr := s.connstr;
        problem := NULL;
        BEGIN
            ledger_version := durable_ledger_proxy.ledger_version_on(s.partition);
            shard_user := durable_ledger_proxy.shard_user_on(s.partition);
            answers := true;
            problem := CASE
                WHEN ledger_version IS NULL THEN 'durable_ledger is not installed'
                WHEN shard_user IS DISTINCT FROM current_user::text THEN
                    pg_catalog.format('the shard sees this session as role %s, not %s: the shards cannot check '
                                      'or record who calls (a user mapping or a connection string naming one role)',
                                      shard_user, current_user)
                END;
        EXCEPTION WHEN OTHERS THEN
            answers := false;
            ledger_version := NULL;
            problem := SQLERRM;
        END;
        IF problem IS NULL AND s.connstr LIKE '%password=********%' THEN
            problem := 'a password in the server''s options: every role can read it in pg_foreign_server '
                       '(give it in a user mapping)';
        ELSIF problem IS NULL AND COALESCE(lifetime, '0') NOT IN ('0', '') THEN
            problem := 'connection_lifetime is set: PL/Proxy then ends the session leases held through the proxy '
                       'when it renews a connection';
        END IF;
        RETURN NEXT;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION durable_ledger_proxy.shard_health() IS
    'each shard: whether it answers, its durable_ledger version, and what is wrong (a shard that sees another role than the caller, a password in the server''s options, connection_lifetime)';

-- What a pooler's reset must add in front of the proxy: PgBouncer in session
-- mode resets the proxy's session (DISCARD ALL) when a client leaves, but
-- PL/Proxy's connections to the shards stay open, and the session leases
-- they hold would pass to the next client.  server_reset_query =
-- 'SELECT durable_ledger_proxy.end_session_leases(); DISCARD ALL' ends them.
CREATE FUNCTION durable_ledger_proxy.end_session_leases_on(hash integer)
RETURNS boolean LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT true AS end_session_leases_on FROM (SELECT pg_catalog.pg_advisory_unlock_all()) x;
$fn$;
CREATE FUNCTION durable_ledger_proxy.end_session_leases()
RETURNS void
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT x.partition FROM durable_ledger_proxy.shards x ORDER BY x.partition LOOP
        BEGIN
            PERFORM durable_ledger_proxy.end_session_leases_on(s.partition);
        EXCEPTION WHEN OTHERS THEN
            NULL;  -- a shard that cannot be reached holds none of this session's leases any more
        END;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION durable_ledger_proxy.end_session_leases() IS
    'ends every session lease this session holds on any shard (what a pooler''s reset query must run in front of the proxy: SELECT durable_ledger_proxy.end_session_leases(); DISCARD ALL)';


-- The shard backends that serve this session (PL/Proxy's connections, one
-- per shard, opened here if need be): the holder_pid of its session leases.
CREATE FUNCTION durable_ledger_proxy.backend_pid_on(hash integer)
RETURNS integer LANGUAGE plproxy AS $fn$
    CLUSTER 'durable_ledger_shards'; RUN ON hash;
    SELECT pg_catalog.pg_backend_pid() AS backend_pid_on;
$fn$;
CREATE FUNCTION durable_ledger_proxy.shard_backends()
RETURNS TABLE (shard text, pid integer)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT x.partition, x.shard FROM durable_ledger_proxy.shards x ORDER BY x.partition LOOP
        shard := s.shard;
        BEGIN
            pid := durable_ledger_proxy.backend_pid_on(s.partition);
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            PERFORM durable_ledger_proxy.raise_if_unreachable(s.partition, SQLSTATE, SQLERRM);
            RAISE;
        END;
        RETURN NEXT;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION durable_ledger_proxy.shard_backends() IS
    'the process of each shard that serves this session (PL/Proxy''s connection): the holder_pid, in leases, of the session leases this session holds';
CREATE FUNCTION durable_ledger_proxy.shard_backend(run text)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    hash integer := COALESCE(durable_ledger_proxy.route(run), 0);
BEGIN
    RETURN durable_ledger_proxy.backend_pid_on(hash);
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(hash, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;
COMMENT ON FUNCTION durable_ledger_proxy.shard_backend(text) IS
    'the process of the run''s shard that serves this session: the holder_pid of its session lease of the run';

-- The registry as each shard has it, and where the shards differ (a change
-- that stopped in the middle, or one made on a shard directly).
CREATE FUNCTION durable_ledger_proxy.settings_at(part integer)
RETURNS TABLE (what text, setting jsonb)
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    RETURN QUERY
    SELECT 'tool ' || t.tool,
           pg_catalog.jsonb_build_object('side_effecting', t.side_effecting, 'divergence', t.divergence,
               'key_fields', t.key_fields, 'retired', t.retired_at IS NOT NULL,
               'reconcile_grace', t.reconcile_grace, 'approval', t.approval::text,
               'max_executions', t.max_executions, 'max_in_window', t.max_in_window,
               'budget_window', t.budget_window)
      FROM durable_ledger_proxy.tools_on(part) t
    UNION ALL
    SELECT 'policy', pg_catalog.to_jsonb(p) FROM durable_ledger_proxy.policy_on(part) p;
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(part, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;
CREATE VIEW durable_ledger_proxy.registry_drift AS
WITH settings AS (
    SELECT s.shard, x.what, x.setting
      FROM durable_ledger_proxy.shards s
     CROSS JOIN LATERAL durable_ledger_proxy.settings_at(s.partition) x
), differing AS (
    SELECT what FROM settings GROUP BY what
    HAVING pg_catalog.count(DISTINCT setting) > 1
        OR pg_catalog.count(*) < (SELECT pg_catalog.count(*) FROM durable_ledger_proxy.shards)
)
SELECT d.what, s.shard, t.setting
  FROM differing d
 CROSS JOIN durable_ledger_proxy.shards s
  LEFT JOIN settings t ON t.what = d.what AND t.shard = s.shard
 ORDER BY d.what, s.partition;
COMMENT ON VIEW durable_ledger_proxy.registry_drift IS
    'each tool (and the policy) whose settings are not the same on every shard, with each shard''s (NULL: the shard does not have it)';

-- ---------------------------------------------------------------------------
-- The auditor's cookbook (docs/auditing.md) over every shard: the same
-- questions, asked of each shard with its indexes, each row naming its shard
-- (docs/scale-out.md).  What waits for a person and the live leases are the
-- views above.
-- ---------------------------------------------------------------------------
CREATE FUNCTION durable_ledger_proxy.audit_by_args(field text, value text)
RETURNS TABLE (shard text, logged_at timestamptz, run text, event text, tool text, role_name text,
               session_user_name text, application_name text, client_addr inet,
               lease_epoch bigint, detail jsonb, args jsonb, meta jsonb, result jsonb)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT x.partition, x.shard FROM durable_ledger_proxy.shards x ORDER BY x.partition LOOP
        BEGIN
            RETURN QUERY SELECT s.shard, q.* FROM durable_ledger_proxy.audit_by_args_on(s.partition, field, value) q;
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            PERFORM durable_ledger_proxy.raise_if_unreachable(s.partition, SQLSTATE, SQLERRM);
            RAISE;
        END;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION durable_ledger_proxy.audit_by_args(text, text) IS
    'everything that happened to the effects whose args carry field = value (e.g. ''invoice'', ''INV-9''), on every shard, in each shard''s order';

CREATE FUNCTION durable_ledger_proxy.audit_of_run(run text)
RETURNS TABLE (shard text, logged_at timestamptz, event text, key text, tool text, lease_epoch bigint,
               role_name text, application_name text, backend_pid integer, detail jsonb)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    hash integer := COALESCE(durable_ledger_proxy.route(run), 0);
BEGIN
    RETURN QUERY SELECT durable_ledger_proxy.shard_name(hash), q.*
                   FROM durable_ledger_proxy.audit_of_run_on(hash, run) q;
EXCEPTION WHEN OTHERS OR query_canceled THEN
    PERFORM durable_ledger_proxy.raise_if_unreachable(hash, SQLSTATE, SQLERRM);
    RAISE;
END
$fn$;
COMMENT ON FUNCTION durable_ledger_proxy.audit_of_run(text) IS
    'everything that happened in one run, lease events included, from the run''s shard';

CREATE FUNCTION durable_ledger_proxy.human_decisions()
RETURNS TABLE (shard text, logged_at timestamptz, event text, run text, key text, tool text,
               decided_by text, outcome text, previous_status text, note text, role_name text,
               session_user_name text)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT x.partition, x.shard FROM durable_ledger_proxy.shards x ORDER BY x.partition LOOP
        BEGIN
            RETURN QUERY SELECT s.shard, q.* FROM durable_ledger_proxy.human_decisions_on(s.partition) q;
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            PERFORM durable_ledger_proxy.raise_if_unreachable(s.partition, SQLSTATE, SQLERRM);
            RAISE;
        END;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION durable_ledger_proxy.human_decisions() IS
    'every human decision (resolutions, retries asked for, broken leases) with its author and note, on every shard';

CREATE FUNCTION durable_ledger_proxy.replays_per_tool(since interval DEFAULT '1 day')
RETURNS TABLE (shard text, tool text, replays bigint, runs bigint, effects bigint)
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    s record;
BEGIN
    FOR s IN SELECT x.partition, x.shard FROM durable_ledger_proxy.shards x ORDER BY x.partition LOOP
        BEGIN
            RETURN QUERY SELECT s.shard, q.* FROM durable_ledger_proxy.replays_per_tool_on(s.partition, since) q;
        EXCEPTION WHEN OTHERS OR query_canceled THEN
            PERFORM durable_ledger_proxy.raise_if_unreachable(s.partition, SQLSTATE, SQLERRM);
            RAISE;
        END;
    END LOOP;
END
$fn$;
COMMENT ON FUNCTION durable_ledger_proxy.replays_per_tool(interval) IS
    'effects replayed per tool over the last interval (a day by default), per shard';

-- ---------------------------------------------------------------------------
-- Privileges: nothing for PUBLIC.  The API is granted as on the shards, and
-- so is each call on one shard (durable_ledger_proxy.*_on, granted with the
-- routing table above, the others here): the shard checks the role PL/Proxy
-- connects as, which must be the caller's own (docs/scale-out.md), and the
-- proxy does not rely on it.  What only says where things are (routing,
-- shards, errors) is for the four roles.
-- ---------------------------------------------------------------------------
REVOKE ALL ON SCHEMA durable_ledger, durable_ledger_proxy FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA durable_ledger FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA durable_ledger_proxy FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA durable_ledger FROM PUBLIC;
REVOKE ALL ON ALL TABLES IN SCHEMA durable_ledger_proxy FROM PUBLIC;
REVOKE ALL ON TYPE durable_ledger.decision, durable_ledger.lease, durable_ledger.effects,
                   durable_ledger.tools, durable_ledger.divergences FROM PUBLIC;

GRANT USAGE ON SCHEMA durable_ledger, durable_ledger_proxy
    TO durable_ledger_worker, durable_ledger_auditor, durable_ledger_admin, durable_ledger_approver;
GRANT USAGE ON TYPE durable_ledger.decision, durable_ledger.lease, durable_ledger.effects,
                    durable_ledger.tools, durable_ledger.divergences
    TO durable_ledger_worker, durable_ledger_auditor, durable_ledger_admin, durable_ledger_approver;
GRANT EXECUTE ON FUNCTION
    durable_ledger_proxy.routing_key(text),
    durable_ledger_proxy.route(text),
    durable_ledger_proxy.shard_count(),
    durable_ledger_proxy.shard_name(integer),
    durable_ledger_proxy.shard_of(text),
    durable_ledger_proxy.token_route(text),
    durable_ledger_proxy.shard_token(text),
    durable_ledger_proxy.raise_if_unreachable(integer, text, text),
    durable_ledger_proxy.no_session_lease(text),
    durable_ledger_proxy.locate(text, text, text),
    durable_ledger_proxy.every_shard_answers(),
    durable_ledger_proxy.raise_partly_applied(text, integer, text[], text, text),
    durable_ledger_proxy.ledger_version_on(integer),
    durable_ledger_proxy.shard_user_on(integer),
    durable_ledger_proxy.shard_health(),
    durable_ledger_proxy.backend_pid_on(integer),
    durable_ledger_proxy.shard_backends(),
    durable_ledger_proxy.shard_backend(text),
    durable_ledger_proxy.end_session_leases_on(integer),
    durable_ledger_proxy.end_session_leases()
    TO durable_ledger_worker, durable_ledger_auditor, durable_ledger_admin, durable_ledger_approver;
GRANT EXECUTE ON FUNCTION
    durable_ledger_proxy.begin_effect_held(integer, text, text, text, jsonb, text, jsonb, boolean),
    durable_ledger_proxy.begin_recorded_held(integer, text, text, text, jsonb, jsonb),
    durable_ledger_proxy.take_lease_on(integer, text, text, interval, text),
    durable_ledger_proxy.acquire_run_on(integer, text, text, boolean, text, text),
    durable_ledger_proxy.has_effect_on(integer, text)
    TO durable_ledger_worker;
GRANT EXECUTE ON FUNCTION
    durable_ledger_proxy.has_divergence_on(integer, text)
    TO durable_ledger_admin;
GRANT EXECUTE ON FUNCTION
    durable_ledger_proxy.has_effect_row_on(integer, text),
    durable_ledger_proxy.unresolved_on(integer),
    durable_ledger_proxy.unresolved_at(integer)
    TO durable_ledger_approver, durable_ledger_auditor;
GRANT EXECUTE ON FUNCTION
    durable_ledger_proxy.leases_on(integer),
    durable_ledger_proxy.leases_at(integer),
    durable_ledger_proxy.metrics_on(integer),
    durable_ledger_proxy.metrics_at(integer),
    durable_ledger_proxy.audit_heads_on(integer),
    durable_ledger_proxy.audit_heads_at(integer),
    durable_ledger_proxy.metrics_events_on(integer),
    durable_ledger_proxy.verify_audit_on(integer, jsonb),
    durable_ledger_proxy.tools_on(integer),
    durable_ledger_proxy.policy_on(integer),
    durable_ledger_proxy.settings_at(integer),
    durable_ledger_proxy.audit_by_args_on(integer, text, text),
    durable_ledger_proxy.audit_by_args(text, text),
    durable_ledger_proxy.audit_of_run_on(integer, text),
    durable_ledger_proxy.audit_of_run(text),
    durable_ledger_proxy.human_decisions_on(integer),
    durable_ledger_proxy.human_decisions(),
    durable_ledger_proxy.replays_per_tool_on(integer, interval),
    durable_ledger_proxy.replays_per_tool(interval)
    TO durable_ledger_auditor;
GRANT SELECT ON durable_ledger_proxy.shards, durable_ledger_proxy.routing
    TO durable_ledger_worker, durable_ledger_auditor, durable_ledger_admin, durable_ledger_approver;
GRANT SELECT ON durable_ledger_proxy.registry_drift TO durable_ledger_auditor;

GRANT EXECUTE ON FUNCTION
    durable_ledger.begin_effect(text, text, jsonb, text, jsonb, text, boolean),
    durable_ledger.begin_recorded(text, text, jsonb, jsonb, text),
    durable_ledger.begin_local(text, text, jsonb, text, jsonb, text),
    durable_ledger.complete_effect(text, jsonb, integer, text),
    durable_ledger.fail_effect(text, jsonb, integer, text),
    durable_ledger.reconcile_effect(text, integer, boolean, jsonb, text),
    durable_ledger.reconcilable_from(text, integer, text),
    durable_ledger.effect_status(text, text),
    durable_ledger.effect_key(text, text, jsonb, integer),
    durable_ledger.canonical_args(jsonb),
    durable_ledger.acquire_run(text, boolean),
    durable_ledger.release_run(text),
    durable_ledger.session_epoch(text),
    durable_ledger.release_attempt(text, bigint),
    durable_ledger.take_lease(text, interval, text),
    durable_ledger.renew_lease(text, interval),
    durable_ledger.release_lease(text)
    TO durable_ledger_worker;

GRANT SELECT ON durable_ledger.unresolved, durable_ledger.leases, durable_ledger.metrics,
                durable_ledger.audit_heads
    TO durable_ledger_auditor;
GRANT EXECUTE ON FUNCTION
    durable_ledger.history(text),
    durable_ledger.verify_audit(jsonb),
    durable_ledger.metrics_events()
    TO durable_ledger_auditor;

GRANT EXECUTE ON FUNCTION
    durable_ledger.resolve_effect(text, text, jsonb, text, text, integer, text),
    durable_ledger.retry_effect(text, integer, text, text, text),
    durable_ledger.break_lease(text, text, text),
    durable_ledger.register_tool(text, text, boolean, text, text[], text),
    durable_ledger.change_tool(text, text, boolean, text, text[], text),
    durable_ledger.retire_tool(text, text, text),
    durable_ledger.set_reconcile(text, interval, text, text),
    durable_ledger.set_approval(text, jsonpath, text, text),
    durable_ledger.set_budget(text, integer, text, text, integer, interval),
    durable_ledger.set_attempts_budget(integer, text, text),
    durable_ledger.set_run_budget(text, text, text, text, integer, integer, integer),
    durable_ledger.set_unregistered_tools(text, text, text),
    durable_ledger.set_unregistered_divergence(text, text, text),
    durable_ledger.resolve_divergence(text, text, text, text, text, text),
    durable_ledger.abandon_run(text, text, text),
    durable_ledger.fork_run(text, text, text, text, text),
    durable_ledger.purge_settled(interval, text, boolean, integer),
    durable_ledger.purge_audit(interval, text, boolean)
    TO durable_ledger_admin;

GRANT SELECT ON durable_ledger.unresolved TO durable_ledger_approver;
GRANT EXECUTE ON FUNCTION
    durable_ledger.approve_effect(text, text, text, text),
    durable_ledger.reject_effect(text, text, text, text)
    TO durable_ledger_approver;
