/* durable_ledger--1.2.sql: declarations only; the work is done in C (src/). */

\echo Use "CREATE EXTENSION durable_ledger" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Roles.  Roles are cluster-wide: they are created once, when missing, and
-- outlive DROP EXTENSION (see README).  They carry no LOGIN; an administrator
-- grants them to the roles applications log in as.
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
    IF NOT pg_catalog.pg_has_role('durable_ledger_admin', 'durable_ledger_worker', 'MEMBER') THEN
        GRANT durable_ledger_worker TO durable_ledger_admin;
    END IF;
    IF NOT pg_catalog.pg_has_role('durable_ledger_admin', 'durable_ledger_auditor', 'MEMBER') THEN
        GRANT durable_ledger_auditor TO durable_ledger_admin;
    END IF;
END
$roles$;

REVOKE ALL ON SCHEMA durable_ledger FROM PUBLIC;
GRANT USAGE ON SCHEMA durable_ledger
    TO durable_ledger_worker, durable_ledger_auditor, durable_ledger_admin;

-- ---------------------------------------------------------------------------
-- What begin_effect returns.
-- ---------------------------------------------------------------------------
CREATE TYPE durable_ledger.decision AS (
    key         text,       -- the effect's idempotency key
    decision    text,       -- execute | replay | pause | in_progress
    status      text,       -- the effect's status after this call
    occurrence  integer,    -- which identical call of this lease epoch; NULL for a business key
    attempt     integer,    -- 1, or n+1 after n failures of a business key
    result      jsonb,      -- replay of a completed effect: its result
    error       jsonb,      -- replay of a failed effect: its error
    reason      text,       -- one sentence explaining replay, pause or in_progress
    downstream_key text     -- the key to give the provider: the key itself, or for a
                            -- business key the key and its attempt ("INV-9#2"); NULL
                            -- when the call has no effect (a divergence pause)
);

-- The statuses of an effect and the events of the audit log: text, checked by
-- a domain.  (A table's CHECK constraint is read back from its stored form by
-- every statement that writes the table; a domain's is kept by the type cache.)
CREATE DOMAIN durable_ledger.effect_state AS text
    CHECK (VALUE IN ('started', 'completed', 'failed', 'unknown'));
CREATE DOMAIN durable_ledger.audit_event AS text
    CHECK (VALUE IN ('lease_acquired', 'lease_released', 'lease_broken',
                     'intent', 'replay', 'pause', 'in_progress',
                     'completed', 'late_completion', 'failed', 'late_failure',
                     'resolved', 'conflict',
                     'tool_registered', 'tool_changed', 'tool_retired',
                     'divergence', 'divergence_resolved', 'run_abandoned', 'run_forked',
                     'carried', 'policy_changed', 'purged', 'audit_purged',
                     'superseded_report'));

-- ---------------------------------------------------------------------------
-- Token leases: a lease that is a row, not a session lock, so that a run's
-- calls may come through a transaction pooler, each in its own transaction
-- on any backend.
-- ---------------------------------------------------------------------------

-- What take_lease returns.  Whoever has the token acts for the lease; only
-- its SHA-256 is stored.
CREATE TYPE durable_ledger.lease AS (
    run         text,
    token       text,
    epoch       bigint,
    expires_at  timestamptz,
    holder      text
);

-- The kind of lease that holds an epoch.
CREATE DOMAIN durable_ledger.lease_kind AS text
    CHECK (VALUE IN ('session', 'token'));

-- One row per token lease: an epoch of a run, held until it expires (judged
-- by the server's clock), is released, or a newer epoch supersedes it.
CREATE TABLE durable_ledger.token_leases (
    run          text NOT NULL,
    epoch        bigint NOT NULL,
    token_sha256 bytea NOT NULL,
    holder       text,                       -- the caller's own name for itself
    ttl          interval NOT NULL,          -- what renew_lease extends by, by default
    taken_at     timestamptz NOT NULL,
    expires_at   timestamptz NOT NULL,       -- set to the moment of breaking by break_lease
    released_at  timestamptz,
    PRIMARY KEY (run, epoch)
);
CREATE UNIQUE INDEX token_leases_token_idx ON durable_ledger.token_leases (token_sha256);

-- The occurrence counters of token leases' epochs: the calls of one epoch may
-- run in different backends, so they are counted here, and roll back with
-- the transaction of the call.
CREATE TABLE durable_ledger.token_lease_calls (
    run     text NOT NULL,
    epoch   bigint NOT NULL,
    call    bytea NOT NULL,                  -- SHA-256 of tool, a zero byte, canonical args
    calls   integer NOT NULL,                -- identical calls counted so far in the epoch
    PRIMARY KEY (run, epoch, call)
);

-- ---------------------------------------------------------------------------
-- Tables.  Only the extension's functions write them (SECURITY DEFINER);
-- nobody else has INSERT, UPDATE or DELETE.
-- ---------------------------------------------------------------------------

-- One row per run: how many lease epochs (attempts) it has had, and who holds
-- or last held it.
CREATE TABLE durable_ledger.runs (
    run                     text PRIMARY KEY,
    epochs                  bigint NOT NULL,
    lock_key                bigint NOT NULL,        -- pg_locks: (classid << 32) | objid, objsubid = 17484
    holder_pid              integer NOT NULL,
    holder_role             text NOT NULL,
    holder_application_name text,
    holder_client_addr      inet,
    acquired_at             timestamptz NOT NULL,
    released_at             timestamptz,            -- NULL while the epoch's holder has not released it
    created_at              timestamptz NOT NULL,
    lease_kind              durable_ledger.lease_kind NOT NULL DEFAULT 'session',  -- of the current epoch
    abandoned_at            timestamptz,            -- no further begin_effect, acquire_run or take_lease
    abandoned_by            text,
    abandon_note            text,
    forked_from             text,                   -- the run it was forked from
    forked_up_to            text                    -- the last effect of that run it carries
);
CREATE INDEX runs_lock_key_idx ON durable_ledger.runs (lock_key);

-- One row per idempotency key.
CREATE TABLE durable_ledger.effects (
    key             text PRIMARY KEY,
    run             text NOT NULL,          -- the run whose lease started the current attempt
    tool            text NOT NULL,
    args            jsonb NOT NULL,
    business_key    boolean NOT NULL,
    occurrence      integer,                -- NULL for a business key
    attempt         integer NOT NULL,
    status          durable_ledger.effect_state NOT NULL,
    result          jsonb,
    error           jsonb,
    meta            jsonb,
    lease_epoch     bigint NOT NULL,        -- the lease epoch of run that started it
    holder_pid      integer NOT NULL,       -- the backend that started it
    created_at      timestamptz NOT NULL,
    completed_at    timestamptz,
    resolved_by     text,
    resolution_note text,
    conflict        boolean NOT NULL DEFAULT false,
    forked_from     text,                   -- a forked run's: the effect of the source run it carries
    safe_to_redo    boolean NOT NULL DEFAULT false  -- begun by begin_recorded: executed again when unknown
) WITH (fillfactor = 85);   -- room for the HOT update that completes an effect
-- (No table CHECK constraints here: every statement that writes a table reads
-- its CHECKs back from their stored form, which costs more than the write.
-- The only writer is the extension's C code, which sets occurrence exactly
-- when the key is derived, and attempt from 1.)

-- The effects that are not settled (started, unknown, or flagged by a
-- contradicting report), by when their attempt began and their key, kept by
-- the ledger's own writes in the transaction that changes the effect: the
-- unresolved view and the metrics read these few rows instead of every
-- effect (docs/design.md, "What waits for a person").  (A partial index on
-- effects would list them too, but its predicate is the status a completion
-- changes, which would make every completion a non-HOT update of every
-- index.)  A row whose effect was deleted by hand matches no effect and is
-- ignored.
CREATE TABLE durable_ledger.unsettled (
    created_at timestamptz,             -- the effect's: new rows go to the index's right edge
    key        text,
    PRIMARY KEY (created_at, key)
);

-- Append-only: one row per event.
CREATE SEQUENCE durable_ledger.audit_log_id_seq;
CREATE TABLE durable_ledger.audit_log (
    id                bigint PRIMARY KEY DEFAULT pg_catalog.nextval('durable_ledger.audit_log_id_seq'),
    logged_at         timestamptz NOT NULL,
    run               text,
    key               text,
    event             durable_ledger.audit_event NOT NULL,
    detail            jsonb,
    role_name         text NOT NULL,         -- the calling role, as after SET ROLE
    session_user_name text NOT NULL,
    application_name  text,
    client_addr       inet,
    backend_pid       integer NOT NULL,
    lease_epoch       bigint,
    attempt           integer                -- the attempt of key the event concerns
);
ALTER SEQUENCE durable_ledger.audit_log_id_seq OWNED BY durable_ledger.audit_log.id;
CREATE INDEX audit_log_key_idx ON durable_ledger.audit_log (key);
CREATE INDEX audit_log_run_idx ON durable_ledger.audit_log (run);
-- The auditor's questions (docs/auditing.md), each by an index: rows by time
-- (BRIN: the log is appended in time order, so a summary per range of pages
-- costs almost nothing to keep), and the events asked for by kind -- the
-- decisions people made, and replays -- by kind and time.  One partial index
-- for both: every audit row is tested against each partial index's
-- predicate, compiled anew for each write (bench/README.md, "Auditing at
-- scale").
CREATE INDEX audit_log_logged_at_idx ON durable_ledger.audit_log USING brin (logged_at);
CREATE INDEX audit_log_events_idx ON durable_ledger.audit_log (event, logged_at)
    WHERE event IN ('resolved', 'lease_broken', 'divergence_resolved', 'run_abandoned',
                    'run_forked', 'tool_registered', 'tool_changed', 'tool_retired',
                    'policy_changed', 'purged', 'audit_purged', 'replay');

CREATE FUNCTION durable_ledger.refuse_audit_log_change() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    RAISE EXCEPTION 'durable_ledger.audit_log is append-only'
        USING ERRCODE = '42501',
              DETAIL = pg_catalog.format('%s is refused on the audit log, for its owner too.', TG_OP);
END
$fn$;
COMMENT ON FUNCTION durable_ledger.refuse_audit_log_change() IS
    'trigger: refuses UPDATE, DELETE and TRUNCATE on durable_ledger.audit_log';

CREATE TRIGGER audit_log_append_only
    BEFORE UPDATE OR DELETE OR TRUNCATE ON durable_ledger.audit_log
    FOR EACH STATEMENT EXECUTE FUNCTION durable_ledger.refuse_audit_log_change();

-- The attempts that a later attempt replaced: a business key's (always a
-- failed one) and a recorded call's (lost with its lease: unknown); what a
-- late report on an earlier attempt is compared with, and where the audit
-- log files it.
CREATE TABLE durable_ledger.past_attempts (
    key             text NOT NULL,
    attempt         integer NOT NULL,
    run             text NOT NULL,          -- the run whose lease started this attempt
    lease_epoch     bigint NOT NULL,
    holder_pid      integer NOT NULL,
    status          durable_ledger.effect_state NOT NULL,
    error           jsonb,
    meta            jsonb,
    created_at      timestamptz NOT NULL,
    completed_at    timestamptz,
    resolved_by     text,
    resolution_note text,
    replaced_at     timestamptz NOT NULL,   -- when the next attempt started
    PRIMARY KEY (key, attempt)
);

-- ---------------------------------------------------------------------------
-- The tools registry.
-- ---------------------------------------------------------------------------
CREATE DOMAIN durable_ledger.divergence_policy AS text
    CHECK (VALUE IN ('pause', 'warn', 'off'));

CREATE TABLE durable_ledger.tools (
    tool            text PRIMARY KEY,
    side_effecting  boolean NOT NULL,       -- false: a read-only tool, registered for review
    divergence      durable_ledger.divergence_policy NOT NULL,
    key_fields      text[],                 -- the fields of args that make a call's identity; NULL: all of args
    note            text,
    registered_by   text NOT NULL,
    registered_at   timestamptz NOT NULL,
    changed_by      text,
    changed_at      timestamptz,
    retired_by      text,                   -- a retired tool is executed no more
    retired_at      timestamptz
);
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.tools', '');

-- What a deployment allows: whether a tool nobody registered may execute
-- (allow, warn, refuse).  A row, changed by admins with set_unregistered_tools()
-- and audited, not a setting: a setting of a library loaded on first use can
-- be overridden by a client's startup options.  No row: allow.
CREATE DOMAIN durable_ledger.unregistered_tools_policy AS text
    CHECK (VALUE IN ('allow', 'warn', 'refuse'));

CREATE TABLE durable_ledger.policy (
    singleton           boolean PRIMARY KEY DEFAULT true,   -- one row at most
    unregistered_tools  durable_ledger.unregistered_tools_policy NOT NULL,
    changed_by          text NOT NULL,
    changed_at          timestamptz NOT NULL,
    note                text
);
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.policy', '');

-- The effects of a run by tool: the earlier effects a later attempt of the run
-- is compared with (divergence), counted once per attempt and tool.
CREATE INDEX effects_tool_run_idx ON durable_ledger.effects (tool, run);

-- ---------------------------------------------------------------------------
-- Divergence: a later attempt's call that its run's earlier attempts did not
-- make, while they made calls of the same tool that it has not replayed yet.
-- ---------------------------------------------------------------------------
CREATE DOMAIN durable_ledger.divergence_verdict AS text
    CHECK (VALUE IN ('distinct', 'same'));

CREATE TABLE durable_ledger.divergences (
    key             text PRIMARY KEY,       -- the drifted call's derived key
    run             text NOT NULL,
    lease_epoch     bigint NOT NULL,        -- the attempt that made the call
    tool            text NOT NULL,
    args            jsonb NOT NULL,
    occurrence      integer NOT NULL,
    candidate_key   text NOT NULL,          -- the earlier effect it may duplicate
    detected_at     timestamptz NOT NULL,
    verdict         durable_ledger.divergence_verdict,  -- NULL until a person decides
    same_as         text,                   -- verdict 'same': the effect whose outcome it replays
    resolved_by     text,
    resolved_at     timestamptz,
    resolution_note text
);
-- a call asks first whether its run has any divergence at all (then remembers it)
CREATE INDEX divergences_run_idx ON durable_ledger.divergences (run);
-- the divergences that wait for a verdict, found without reading the decided ones
CREATE INDEX divergences_waiting_idx ON durable_ledger.divergences (detected_at)
    WHERE verdict IS NULL;
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.divergences', '');

-- pg_dump keeps the ledger's rows (and the audit sequence's position).
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.runs', '');
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.effects', '');
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.unsettled', '');
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.audit_log', '');
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.audit_log_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.past_attempts', '');
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.token_leases', '');
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.token_lease_calls', '');

-- ---------------------------------------------------------------------------
-- Views for people.
-- ---------------------------------------------------------------------------

-- The activity of the backends that hold leases in this database, for readers
-- who may not see other roles' sessions in pg_stat_activity (auditors):
-- state, application and client address of lease holders only, never their
-- queries.
CREATE FUNCTION durable_ledger.lease_holder_activity()
RETURNS TABLE (pid integer, application_name text, client_addr inet, backend_state text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT a.pid, a.application_name, a.client_addr, a.state
      FROM pg_catalog.pg_stat_activity a
     WHERE a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
       AND a.pid OPERATOR(pg_catalog.=) ANY (
            SELECT l.pid FROM pg_catalog.pg_locks l
             WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
               AND l.objsubid OPERATOR(pg_catalog.=) 17484
               AND l.mode OPERATOR(pg_catalog.=) 'ExclusiveLock'
               AND l.granted
               AND l.database OPERATOR(pg_catalog.=)
                   (SELECT d.oid FROM pg_catalog.pg_database d
                     WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()))
$fn$;
COMMENT ON FUNCTION durable_ledger.lease_holder_activity() IS
    'state, application and client address of the backends that hold leases (for the leases view)';

-- Live leases of both kinds.  Session leases: granted advisory locks in the
-- extension's lock class (17484) in this database, matched to their run by
-- the lock key (a lock whose acquiring transaction rolled back is live but
-- has no epoch: lease_epoch and since are then NULL, and so is run if the run
-- was never recorded); their mode is ExclusiveLock (take_lease's transaction
-- holds a ShareLock there, which is no lease).  Token leases: the rows not expired, released or
-- superseded, judged by the server's clock.  On a hot standby, which never
-- holds the primary's locks, a session lease's liveness cannot be judged: the
-- view lists the session epochs that were taken and not released, with
-- liveness 'not judged on a standby', and so does it list the token leases
-- not released (its copy may lag behind a renewal).
CREATE VIEW durable_ledger.leases AS
SELECT r.run,
       l.pid                                                 AS holder_pid,
       CASE WHEN current_epoch THEN r.epochs END             AS lease_epoch,
       CASE WHEN current_epoch THEN r.holder_role END        AS holder_role,
       COALESCE(a.application_name, CASE WHEN current_epoch THEN r.holder_application_name END)
                                                             AS application_name,
       COALESCE(a.client_addr, CASE WHEN current_epoch THEN r.holder_client_addr END)
                                                             AS client_addr,
       CASE WHEN current_epoch THEN r.acquired_at END        AS since,
       a.backend_state,
       k.lock_key,
       'live'::text                                          AS liveness,
       'session'::text                                       AS kind,
       NULL::text                                            AS holder,
       NULL::timestamptz                                     AS expires_at
  FROM pg_catalog.pg_locks l
 CROSS JOIN LATERAL (SELECT (l.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
                            OPERATOR(pg_catalog.|) l.objid::pg_catalog.int8 AS lock_key) k
  LEFT JOIN durable_ledger.runs r ON r.lock_key OPERATOR(pg_catalog.=) k.lock_key
 CROSS JOIN LATERAL (SELECT r.holder_pid OPERATOR(pg_catalog.=) l.pid
                            AND r.released_at IS NULL
                            AND r.lease_kind OPERATOR(pg_catalog.=) 'session' AS current_epoch) c
  LEFT JOIN durable_ledger.lease_holder_activity() a ON a.pid OPERATOR(pg_catalog.=) l.pid
 WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
   AND l.objsubid OPERATOR(pg_catalog.=) 17484
   AND l.mode OPERATOR(pg_catalog.=) 'ExclusiveLock'
   AND l.granted
   AND l.database OPERATOR(pg_catalog.=)
       (SELECT d.oid FROM pg_catalog.pg_database d
         WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database())
UNION ALL
SELECT t.run, NULL, t.epoch, r.holder_role, r.holder_application_name, r.holder_client_addr,
       t.taken_at, NULL, r.lock_key,
       CASE WHEN pg_catalog.pg_is_in_recovery() THEN 'not judged on a standby' ELSE 'live' END,
       'token', t.holder, t.expires_at
  FROM durable_ledger.token_leases t
  JOIN durable_ledger.runs r
    ON r.run OPERATOR(pg_catalog.=) t.run AND r.epochs OPERATOR(pg_catalog.=) t.epoch
 WHERE t.released_at IS NULL
   AND (pg_catalog.pg_is_in_recovery()
        OR t.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp())
UNION ALL
SELECT r.run, r.holder_pid, r.epochs, r.holder_role, r.holder_application_name,
       r.holder_client_addr, r.acquired_at, NULL, r.lock_key,
       'not judged on a standby', 'session', NULL, NULL
  FROM durable_ledger.runs r
 WHERE (SELECT pg_catalog.pg_is_in_recovery())   -- once, not per row: on a primary, no scan
   AND r.released_at IS NULL
   AND r.lease_kind OPERATOR(pg_catalog.=) 'session';

-- Effects that need a person: outcome unknown (recorded, or a started effect
-- whose lease is no longer live), or flagged by a contradicting report.  A
-- started effect is shown unknown only when its lease has ended (a flagged
-- one may still be in flight).  Liveness is the question the C functions ask
-- (lease.c): the effect's epoch is the run's current one, not released, and
-- either its session lock is held by the backend that took it, or its token
-- lease has not expired, judged by the server's clock.  On a hot standby no
-- lease is judged (it cannot see the primary's locks, and its copy of a token
-- lease may lag behind a renewal): a started effect is listed as started,
-- with a reason saying so.  Divergences waiting for a person are listed too
-- (status NULL: no effect was recorded for the drifted call; may_duplicate
-- names the earlier effect it may be); run_abandoned_at says when a person
-- abandoned the run.
CREATE VIEW durable_ledger.unresolved AS
SELECT e.key,
       e.run,
       e.tool,
       CASE WHEN j.ended THEN 'unknown'
            ELSE e.status END::durable_ledger.effect_state AS status,
       e.conflict,
       CASE
           WHEN e.conflict THEN
               'a report contradicts the recorded outcome; a person must decide which is true'
           WHEN j.not_judged THEN
               'read on a hot standby, which cannot see the primary''s leases: whether this effect is still in flight cannot be judged here; ask the primary'
           ELSE
               'intent recorded, no completion, and the lease that started it has ended: nobody knows whether the effect happened'
       END                                          AS reason,
       e.created_at,
       pg_catalog.now() OPERATOR(pg_catalog.-) e.created_at AS age,
       e.args,
       e.meta,
       e.business_key,
       e.occurrence,
       e.attempt,
       e.lease_epoch,
       NULL::text                                   AS may_duplicate,
       ab.abandoned_at                              AS run_abandoned_at,
       -- the key the provider was given: a business key's names its attempt
       CASE WHEN e.business_key THEN pg_catalog.concat(e.key, '#', e.attempt)
            ELSE e.key END                          AS downstream_key
  FROM durable_ledger.unsettled u
  JOIN durable_ledger.effects e ON e.key OPERATOR(pg_catalog.=) u.key
                              AND e.created_at OPERATOR(pg_catalog.=) u.created_at
  LEFT JOIN durable_ledger.runs ab ON ab.run OPERATOR(pg_catalog.=) e.run
 CROSS JOIN (SELECT pg_catalog.pg_is_in_recovery() AS standby) s
  LEFT JOIN LATERAL (
        SELECT r.lease_kind, r.lock_key, r.holder_pid
          FROM durable_ledger.runs r
         WHERE r.run OPERATOR(pg_catalog.=) e.run
           AND r.epochs OPERATOR(pg_catalog.=) e.lease_epoch
           AND r.released_at IS NULL) cur ON e.status OPERATOR(pg_catalog.=) 'started'
 CROSS JOIN LATERAL (
        SELECT e.status OPERATOR(pg_catalog.=) 'started' AND s.standby AS not_judged,
               e.status OPERATOR(pg_catalog.=) 'started' AND CASE
                   WHEN s.standby THEN false
                   WHEN cur.lease_kind OPERATOR(pg_catalog.=) 'token' THEN NOT EXISTS (
                       SELECT 1 FROM durable_ledger.token_leases t
                        WHERE t.run OPERATOR(pg_catalog.=) e.run
                          AND t.epoch OPERATOR(pg_catalog.=) e.lease_epoch
                          AND t.released_at IS NULL
                          AND t.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp())
                   WHEN cur.lease_kind IS NULL THEN true
                   ELSE NOT EXISTS (
                       SELECT 1 FROM pg_catalog.pg_locks l
                        WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
                          AND l.objsubid OPERATOR(pg_catalog.=) 17484
                          AND l.mode OPERATOR(pg_catalog.=) 'ExclusiveLock'
                          AND l.granted
                          AND l.pid OPERATOR(pg_catalog.=) cur.holder_pid
                          AND cur.lock_key OPERATOR(pg_catalog.=)
                              ((l.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
                               OPERATOR(pg_catalog.|) l.objid::pg_catalog.int8)
                          AND l.database OPERATOR(pg_catalog.=)
                              (SELECT d.oid FROM pg_catalog.pg_database d
                                WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()))
               END AS ended) j
 WHERE e.conflict
    OR e.status OPERATOR(pg_catalog.=) 'unknown'
    OR j.ended
    OR j.not_judged
UNION ALL
SELECT d.key,
       d.run,
       d.tool,
       NULL::durable_ledger.effect_state,
       false,
       'a later attempt made a call of this tool that the run''s earlier attempts did not make, while an earlier effect of the tool (may_duplicate) was not replayed yet: a person must say whether it is the same operation (durable_ledger.resolve_divergence(key, ''same'', ...): its outcome is replayed) or distinct (''distinct'': it is executed)',
       d.detected_at,
       pg_catalog.now() OPERATOR(pg_catalog.-) d.detected_at,
       d.args,
       NULL,
       false,
       d.occurrence,
       NULL,
       d.lease_epoch,
       d.candidate_key,
       ab.abandoned_at,
       NULL
  FROM durable_ledger.divergences d
  LEFT JOIN durable_ledger.runs ab ON ab.run OPERATOR(pg_catalog.=) d.run
 WHERE d.verdict IS NULL
   AND NOT EXISTS (SELECT FROM durable_ledger.effects x
                    WHERE x.key OPERATOR(pg_catalog.=) d.key);  -- executed meanwhile (policy off)

-- ---------------------------------------------------------------------------
-- Functions.  The writers are SECURITY DEFINER with a pinned search_path; every
-- SQL text they run is schema-qualified (src/store.c).  None is STRICT: a NULL
-- where a value is required is an error (22004), never a silent NULL answer.
-- The C symbols carry the version that last changed their code (dl_..._1_2):
-- a backend that still has an older library loaded fails to find them
-- instead of applying older rules.
-- ---------------------------------------------------------------------------

CREATE FUNCTION durable_ledger.canonical_args(args jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'dl_canonical_args'
LANGUAGE C IMMUTABLE PARALLEL SAFE;
COMMENT ON FUNCTION durable_ledger.canonical_args(jsonb) IS
    'the canonical text of args that goes into a derived key';

CREATE FUNCTION durable_ledger.effect_key(run text, tool text, args jsonb, occurrence integer)
RETURNS text
AS 'MODULE_PATHNAME', 'dl_effect_key_1_2'
LANGUAGE C STABLE PARALLEL RESTRICTED;
COMMENT ON FUNCTION durable_ledger.effect_key(text, text, jsonb, integer) IS
    'the derived idempotency key of a call, computed without writing anything';

CREATE FUNCTION durable_ledger.acquire_run(run text, wait boolean DEFAULT true)
RETURNS boolean
AS 'MODULE_PATHNAME', 'dl_acquire_run_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.acquire_run(text, boolean) IS
    'takes the run''s lease (waiting unless wait is false) and starts a new lease epoch';

CREATE FUNCTION durable_ledger.release_run(run text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'dl_release_run_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.release_run(text) IS
    'releases the run''s lease held by this session; false when it did not hold it';

CREATE FUNCTION durable_ledger.begin_effect(run text, tool text, args jsonb,
                                            business_key text DEFAULT NULL,
                                            meta jsonb DEFAULT NULL,
                                            lease text DEFAULT NULL)
RETURNS durable_ledger.decision
AS 'MODULE_PATHNAME', 'dl_begin_effect_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.begin_effect(text, text, jsonb, text, jsonb, text) IS
    'records the intent of a side effect before it happens and says whether to execute, replay, pause or wait';

-- A call that is harmless to make again (a model's answer, a read): recorded
-- and replayed like an effect, so that a replay sees the same answers, but a
-- call whose outcome is unknown is executed again instead of pausing the run.
CREATE FUNCTION durable_ledger.begin_recorded(run text, tool text, args jsonb,
                                              meta jsonb DEFAULT NULL,
                                              lease text DEFAULT NULL)
RETURNS durable_ledger.decision
AS 'MODULE_PATHNAME', 'dl_begin_recorded_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.begin_recorded(text, text, jsonb, jsonb, text) IS
    'records a call that is safe to redo (a model call, a read) before it happens: as begin_effect, but an unknown outcome is executed again, not paused';

CREATE FUNCTION durable_ledger.take_lease(run text, ttl interval DEFAULT '5 minutes',
                                          holder text DEFAULT NULL)
RETURNS durable_ledger.lease
AS 'MODULE_PATHNAME', 'dl_take_lease_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.take_lease(text, interval, text) IS
    'takes a token lease on the run and starts a new attempt, or returns NULL at once when a live lease holds it';

CREATE FUNCTION durable_ledger.renew_lease(token text, ttl interval DEFAULT NULL)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'dl_renew_lease_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.renew_lease(text, interval) IS
    'extends a live token lease to now + ttl (or its own ttl); returns the new expiry';

CREATE FUNCTION durable_ledger.release_lease(token text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'dl_release_lease_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.release_lease(text) IS
    'ends a token lease; false when it was not live';

CREATE FUNCTION durable_ledger.complete_effect(key text, result jsonb,
                                               attempt integer DEFAULT NULL)
RETURNS durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_complete_effect_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.complete_effect(text, jsonb, integer) IS
    'records that the effect (the given attempt of it) happened and what it returned';

CREATE FUNCTION durable_ledger.fail_effect(key text, error jsonb,
                                           attempt integer DEFAULT NULL)
RETURNS durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_fail_effect_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.fail_effect(text, jsonb, integer) IS
    'declares that the effect (the given attempt of it) definitively did not happen';

CREATE FUNCTION durable_ledger.resolve_effect(key text, outcome text, result jsonb,
                                              resolved_by text, note text DEFAULT NULL,
                                              attempt integer DEFAULT NULL)
RETURNS durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_resolve_effect_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.resolve_effect(text, text, jsonb, text, text, integer) IS
    'a named person''s decision on an effect (the given attempt of it) whose outcome is unknown or contradicted';

CREATE FUNCTION durable_ledger.effect_status(key text)
RETURNS SETOF durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_effect_status_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
ROWS 1;
COMMENT ON FUNCTION durable_ledger.effect_status(text) IS
    'the effect''s row (a started effect whose lease has ended shows as unknown), or no row';

CREATE FUNCTION durable_ledger.break_lease(run text, broken_by text, note text DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'dl_break_lease_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.break_lease(text, text, text) IS
    'ends a hung holder''s lease by terminating its backend; audited with the name';

-- The tools registry, managed by admins; every change is audited by name.
CREATE FUNCTION durable_ledger.register_tool(tool text, registered_by text,
                                             side_effecting boolean DEFAULT true,
                                             divergence text DEFAULT NULL,
                                             key_fields text[] DEFAULT NULL,
                                             note text DEFAULT NULL)
RETURNS durable_ledger.tools
AS 'MODULE_PATHNAME', 'dl_register_tool_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.register_tool(text, text, boolean, text, text[], text) IS
    'registers a tool (or a retired one anew): side-effecting or not, its divergence policy, the fields of args that make a call''s identity';

CREATE FUNCTION durable_ledger.change_tool(tool text, changed_by text,
                                           side_effecting boolean DEFAULT NULL,
                                           divergence text DEFAULT NULL,
                                           key_fields text[] DEFAULT NULL,
                                           note text DEFAULT NULL)
RETURNS durable_ledger.tools
AS 'MODULE_PATHNAME', 'dl_change_tool_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.change_tool(text, text, boolean, text, text[], text) IS
    'changes what is given of a registered tool (key_fields only while no call of it is recorded; ''{}'' for none)';

CREATE FUNCTION durable_ledger.retire_tool(tool text, retired_by text, note text DEFAULT NULL)
RETURNS durable_ledger.tools
AS 'MODULE_PATHNAME', 'dl_retire_tool_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.retire_tool(text, text, text) IS
    'retires a tool: its calls are executed no more; what was recorded still replays';

CREATE FUNCTION durable_ledger.set_unregistered_tools(setting text, set_by text,
                                                      note text DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'dl_set_unregistered_tools_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.set_unregistered_tools(text, text, text) IS
    'whether a tool nobody registered may execute: allow, warn or refuse; audited with the name; returns the previous setting';

CREATE FUNCTION durable_ledger.resolve_divergence(key text, verdict text, resolved_by text,
                                                  note text DEFAULT NULL,
                                                  same_as text DEFAULT NULL)
RETURNS durable_ledger.divergences
AS 'MODULE_PATHNAME', 'dl_resolve_divergence_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.resolve_divergence(text, text, text, text, text) IS
    'a named person''s verdict on a drifted call: the same as an earlier effect (its outcome is replayed) or distinct (it is executed)';

CREATE FUNCTION durable_ledger.abandon_run(run text, abandoned_by text, note text DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'dl_abandon_run_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.abandon_run(text, text, text) IS
    'stops a run for good: nothing more is executed for it; effects in flight wait for a person';

-- ---------------------------------------------------------------------------
-- A run's history, for auditors and debuggers.
CREATE FUNCTION durable_ledger.fork_run(source_run text, new_run text, up_to text,
                                        forked_by text, note text DEFAULT NULL)
RETURNS integer
AS 'MODULE_PATHNAME', 'dl_fork_run_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.fork_run(text, text, text, text, text) IS
    'a new run that carries the source run''s effects up to one it names: their replays return the recorded outcomes, later calls execute; returns how many it carries';

-- ---------------------------------------------------------------------------
CREATE FUNCTION durable_ledger.history(run text)
RETURNS TABLE (id bigint, logged_at timestamptz, lease_epoch bigint, event text, key text,
               tool text, args jsonb, attempt integer, outcome jsonb, detail jsonb,
               role_name text, application_name text)
LANGUAGE plpgsql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
BEGIN
    IF history.run IS NULL THEN
        RAISE EXCEPTION 'run must not be null' USING ERRCODE = '22004';
    END IF;
    RETURN QUERY
    SELECT a.id, a.logged_at, a.lease_epoch, a.event::text, a.key,
           COALESCE(e.tool, d.tool, a.detail OPERATOR(pg_catalog.->>) 'tool'),
           COALESCE(e.args, d.args),
           a.attempt,
           COALESCE(a.detail OPERATOR(pg_catalog.->) 'result',
                    a.detail OPERATOR(pg_catalog.->) 'error',
                    CASE WHEN a.event OPERATOR(pg_catalog.=) ANY ('{completed,late_completion}')
                          AND a.attempt IS NOT DISTINCT FROM e.attempt THEN e.result
                         WHEN a.event OPERATOR(pg_catalog.=) ANY ('{replay,carried}')
                         THEN COALESCE(e.result, e.error) END),
           a.detail, a.role_name, a.application_name
      FROM durable_ledger.audit_log a
      LEFT JOIN durable_ledger.effects e ON e.key OPERATOR(pg_catalog.=) a.key
      LEFT JOIN durable_ledger.divergences d ON d.key OPERATOR(pg_catalog.=) a.key
     WHERE a.run OPERATOR(pg_catalog.=) history.run
     ORDER BY a.id;
END
$fn$;
COMMENT ON FUNCTION durable_ledger.history(text) IS
    'the run''s timeline in order: attempts, decisions, reports, pauses, resolutions, lease events and divergences, with keys, args, outcomes, who and when';

-- The guard against dropping a ledger that holds effects.
CREATE FUNCTION durable_ledger.guard_drop()
RETURNS event_trigger
AS 'MODULE_PATHNAME', 'dl_guard_drop'
LANGUAGE C;
COMMENT ON FUNCTION durable_ledger.guard_drop() IS
    'event trigger: refuses DROP EXTENSION durable_ledger (or DROP SCHEMA durable_ledger) while effects exist, unless durable_ledger.allow_drop is on';

CREATE EVENT TRIGGER durable_ledger_guard_drop
    ON ddl_command_start
    WHEN TAG IN ('DROP EXTENSION', 'DROP SCHEMA', 'DROP OWNED')
    EXECUTE FUNCTION durable_ledger.guard_drop();

-- ---------------------------------------------------------------------------
-- Privileges: nothing for PUBLIC; three group roles carry the capabilities.
-- ---------------------------------------------------------------------------
REVOKE ALL ON ALL TABLES IN SCHEMA durable_ledger FROM PUBLIC;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA durable_ledger FROM PUBLIC;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA durable_ledger FROM PUBLIC;
REVOKE ALL ON TYPE durable_ledger.decision, durable_ledger.effect_state,
                   durable_ledger.audit_event, durable_ledger.lease,
                   durable_ledger.lease_kind FROM PUBLIC;

GRANT USAGE ON TYPE durable_ledger.decision, durable_ledger.effect_state,
                    durable_ledger.audit_event, durable_ledger.lease,
                    durable_ledger.lease_kind
    TO durable_ledger_worker, durable_ledger_auditor, durable_ledger_admin;

GRANT EXECUTE ON FUNCTION
    durable_ledger.begin_effect(text, text, jsonb, text, jsonb, text),
    durable_ledger.begin_recorded(text, text, jsonb, jsonb, text),
    durable_ledger.take_lease(text, interval, text),
    durable_ledger.renew_lease(text, interval),
    durable_ledger.release_lease(text),
    durable_ledger.complete_effect(text, jsonb, integer),
    durable_ledger.fail_effect(text, jsonb, integer),
    durable_ledger.effect_status(text),
    durable_ledger.effect_key(text, text, jsonb, integer),
    durable_ledger.canonical_args(jsonb),
    durable_ledger.acquire_run(text, boolean),
    durable_ledger.release_run(text)
    TO durable_ledger_worker;

GRANT SELECT ON durable_ledger.effects, durable_ledger.unsettled, durable_ledger.runs,
                durable_ledger.audit_log, durable_ledger.past_attempts, durable_ledger.token_leases,
                durable_ledger.token_lease_calls, durable_ledger.leases, durable_ledger.unresolved
    TO durable_ledger_auditor;
GRANT EXECUTE ON FUNCTION durable_ledger.lease_holder_activity() TO durable_ledger_auditor;

GRANT EXECUTE ON FUNCTION
    durable_ledger.resolve_effect(text, text, jsonb, text, text, integer),
    durable_ledger.break_lease(text, text, text)
    TO durable_ledger_admin;

-- ---------------------------------------------------------------------------
-- Privileges of the tools registry, divergences, abandon_run and history.
-- ---------------------------------------------------------------------------
REVOKE ALL ON durable_ledger.tools, durable_ledger.divergences, durable_ledger.policy FROM PUBLIC;
REVOKE ALL ON FUNCTION
    durable_ledger.register_tool(text, text, boolean, text, text[], text),
    durable_ledger.change_tool(text, text, boolean, text, text[], text),
    durable_ledger.retire_tool(text, text, text),
    durable_ledger.set_unregistered_tools(text, text, text),
    durable_ledger.resolve_divergence(text, text, text, text, text),
    durable_ledger.abandon_run(text, text, text),
    durable_ledger.fork_run(text, text, text, text, text),
    durable_ledger.history(text)
    FROM PUBLIC;
REVOKE ALL ON TYPE durable_ledger.divergence_policy, durable_ledger.divergence_verdict,
                   durable_ledger.unregistered_tools_policy FROM PUBLIC;
GRANT USAGE ON TYPE durable_ledger.divergence_policy, durable_ledger.divergence_verdict,
                    durable_ledger.unregistered_tools_policy
    TO durable_ledger_worker, durable_ledger_auditor, durable_ledger_admin;
GRANT SELECT ON durable_ledger.tools, durable_ledger.divergences, durable_ledger.policy
    TO durable_ledger_auditor;
GRANT EXECUTE ON FUNCTION durable_ledger.history(text) TO durable_ledger_auditor;
GRANT EXECUTE ON FUNCTION
    durable_ledger.register_tool(text, text, boolean, text, text[], text),
    durable_ledger.change_tool(text, text, boolean, text, text[], text),
    durable_ledger.retire_tool(text, text, text),
    durable_ledger.set_unregistered_tools(text, text, text),
    durable_ledger.resolve_divergence(text, text, text, text, text),
    durable_ledger.abandon_run(text, text, text),
    durable_ledger.fork_run(text, text, text, text, text)
    TO durable_ledger_admin;

-- ---------------------------------------------------------------------------
-- Tamper evidence: every audit row written from 1.2 on is linked into a hash
-- chain, one per writing backend (src/audit_chain.c; docs/auditing.md,
-- "Verifying the audit log").  Rows written before have no chain.
-- ---------------------------------------------------------------------------
CREATE SEQUENCE durable_ledger.audit_chain_seq;
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.audit_chain_seq', '');
ALTER TABLE durable_ledger.audit_log
    ADD COLUMN chain     bigint,        -- the writing backend's chain (audit_chain_seq)
    ADD COLUMN chain_seq bigint,        -- 1, 2, 3, ... within its chain
    ADD COLUMN row_hash  bytea;         -- sha256(the chain's previous row_hash || content)

-- Where purge_audit cut each chain: the last row it removed, which the next links to.
CREATE TABLE durable_ledger.audit_anchors (
    chain      bigint PRIMARY KEY,
    chain_seq  bigint NOT NULL,
    row_hash   bytea NOT NULL,
    purged_at  timestamptz NOT NULL,
    purged_by  text NOT NULL
);
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.audit_anchors', '');

-- What an audit row's hash covers: every column, as UTF-8 text.
CREATE FUNCTION durable_ledger.audit_row_content(a durable_ledger.audit_log)
RETURNS bytea
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
SELECT pg_catalog.convert_to(pg_catalog.jsonb_build_array(
           a.id, a.chain, a.chain_seq,
           (pg_catalog.extract('epoch', a.logged_at) OPERATOR(pg_catalog.*) 1000000)::bigint,
           a.run, a.key, a.event, a.detail, a.role_name, a.session_user_name,
           a.application_name, a.client_addr::text, a.backend_pid,
           a.lease_epoch, a.attempt)::text, pg_catalog.getdatabaseencoding())
$fn$;
COMMENT ON FUNCTION durable_ledger.audit_row_content(durable_ledger.audit_log) IS
    'the bytes an audit row''s row_hash covers after the previous row''s hash: the text of jsonb_build_array(id, chain, chain_seq, logged_at in microseconds since 1970, run, key, event, detail, role_name, session_user_name, application_name, client_addr::text, backend_pid, lease_epoch, attempt) in the database''s encoding';

-- The newest row of every chain: what an auditor keeps outside the database.
CREATE VIEW durable_ledger.audit_heads AS
SELECT DISTINCT ON (a.chain) a.chain, a.chain_seq, a.id, a.logged_at,
       pg_catalog.encode(a.row_hash, 'hex') AS row_hash
  FROM durable_ledger.audit_log a
 WHERE a.chain IS NOT NULL
 ORDER BY a.chain, a.chain_seq DESC;
COMMENT ON VIEW durable_ledger.audit_heads IS
    'the newest row of every audit chain; kept outside the database, it makes the deletion of newer rows detectable (verify_audit(heads))';

-- Recomputes every chain; one row per chain whose first broken link it names,
-- and one per kept head that is gone or changed.
CREATE FUNCTION durable_ledger.verify_audit(heads jsonb DEFAULT NULL)
RETURNS TABLE (chain bigint, chain_seq bigint, id bigint, problem text)
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
AS $fn$
WITH anchors AS (
    -- an anchor counts only if a purge's own (chained) audit row recorded that cut
    SELECT x.chain, x.chain_seq, x.row_hash,
           EXISTS (SELECT FROM durable_ledger.audit_log p
                    WHERE p.event OPERATOR(pg_catalog.=) 'audit_purged'
                      AND (p.detail OPERATOR(pg_catalog.->) 'cuts') OPERATOR(pg_catalog.@>)
                          pg_catalog.jsonb_build_array(pg_catalog.jsonb_build_object(
                              'chain', x.chain, 'chain_seq', x.chain_seq,
                              'row_hash', pg_catalog.encode(x.row_hash, 'hex')))) AS recorded
      FROM durable_ledger.audit_anchors x
), linked AS (
    -- the first row left of a chain links to the chain's anchor, if purge_audit removed rows before it
    SELECT a.chain, a.chain_seq, a.id, a.row_hash,
           COALESCE(pg_catalog.lag(a.chain_seq) OVER w, x.chain_seq) AS previous_seq,
           COALESCE(pg_catalog.lag(a.row_hash) OVER w, x.row_hash) AS previous_hash,
           durable_ledger.audit_row_content(a) AS content
      FROM durable_ledger.audit_log a
      LEFT JOIN anchors x ON x.chain OPERATOR(pg_catalog.=) a.chain AND x.recorded
     WHERE a.chain IS NOT NULL
    WINDOW w AS (PARTITION BY a.chain ORDER BY a.chain_seq, a.id)
), broken AS (
    SELECT DISTINCT ON (l.chain) l.chain, l.chain_seq, l.id,
           CASE WHEN l.chain_seq IS DISTINCT FROM
                     (COALESCE(l.previous_seq, 0) OPERATOR(pg_catalog.+) 1)
                THEN pg_catalog.format('chain_seq %s follows %s: rows are missing or added',
                                       l.chain_seq, COALESCE(l.previous_seq, 0))
                ELSE 'row_hash does not match the row and the previous row''s hash: the row (or the one before it) was changed'
           END AS problem
      FROM linked l
     WHERE l.chain_seq IS DISTINCT FROM (COALESCE(l.previous_seq, 0) OPERATOR(pg_catalog.+) 1)
        OR l.row_hash IS DISTINCT FROM pg_catalog.sha256(
               COALESCE(l.previous_hash, pg_catalog.decode(pg_catalog.repeat('00', 32), 'hex'))
               OPERATOR(pg_catalog.||) l.content)
     ORDER BY l.chain, l.chain_seq, l.id
)
SELECT b.chain, b.chain_seq, b.id, b.problem FROM broken b
UNION ALL
SELECT x.chain, x.chain_seq, NULL::bigint,
       'an anchor no purge_audit recorded: rows before it were deleted and hidden'
  FROM anchors x WHERE NOT x.recorded
UNION ALL
-- a chain the sequence never issued
SELECT DISTINCT ON (a.chain) a.chain, a.chain_seq, a.id,
       'no backend was given this chain: the row was added by hand'
  FROM durable_ledger.audit_log a
 WHERE a.chain OPERATOR(pg_catalog.>) (SELECT s.last_value FROM durable_ledger.audit_chain_seq s)
UNION ALL
-- a row without a chain, written after chaining began
SELECT NULL::bigint, NULL::bigint, a.id,
       'an audit row without a chain, written after chaining began: added by hand, or by a worker still running an earlier version''s library'
  FROM durable_ledger.audit_log a
 WHERE a.chain IS NULL
   AND a.id OPERATOR(pg_catalog.>) (SELECT pg_catalog.min(c.id) FROM durable_ledger.audit_log c
                                     WHERE c.chain IS NOT NULL)
UNION ALL
SELECT h.chain, h.chain_seq, NULL::bigint,
       'a kept head is gone or changed: rows were deleted or rewritten'
  FROM pg_catalog.jsonb_to_recordset(COALESCE(verify_audit.heads, '[]'))
       AS h(chain bigint, chain_seq bigint, row_hash text)
 WHERE NOT EXISTS (SELECT FROM durable_ledger.audit_log a
                    WHERE a.chain OPERATOR(pg_catalog.=) h.chain
                      AND a.chain_seq OPERATOR(pg_catalog.=) h.chain_seq
                      AND pg_catalog.encode(a.row_hash, 'hex') OPERATOR(pg_catalog.=) h.row_hash)
   -- a head purge_audit removed: the anchor is that row, or one after it
   AND NOT EXISTS (SELECT FROM anchors x
                    WHERE x.chain OPERATOR(pg_catalog.=) h.chain AND x.recorded
                      AND (x.chain_seq OPERATOR(pg_catalog.>) h.chain_seq
                           OR (x.chain_seq OPERATOR(pg_catalog.=) h.chain_seq
                               AND pg_catalog.encode(x.row_hash, 'hex') OPERATOR(pg_catalog.=) h.row_hash)))
 ORDER BY 1, 2
$fn$;
COMMENT ON FUNCTION durable_ledger.verify_audit(jsonb) IS
    'recomputes the audit log''s hash chains: the first broken link of each chain, chains no backend was given, rows without a chain written after chaining began, and every kept head (audit_heads rows as a JSON array) that is gone or changed; no rows: nothing was found';

REVOKE ALL ON durable_ledger.audit_heads FROM PUBLIC;
REVOKE ALL ON SEQUENCE durable_ledger.audit_chain_seq FROM PUBLIC;
REVOKE ALL ON FUNCTION durable_ledger.audit_row_content(durable_ledger.audit_log),
                       durable_ledger.verify_audit(jsonb) FROM PUBLIC;
GRANT SELECT ON durable_ledger.audit_heads TO durable_ledger_auditor;
REVOKE ALL ON durable_ledger.audit_anchors FROM PUBLIC;
GRANT SELECT ON durable_ledger.audit_anchors TO durable_ledger_auditor;
GRANT SELECT ON SEQUENCE durable_ledger.audit_chain_seq TO durable_ledger_auditor;
GRANT EXECUTE ON FUNCTION durable_ledger.audit_row_content(durable_ledger.audit_log),
                          durable_ledger.verify_audit(jsonb) TO durable_ledger_auditor;

-- ---------------------------------------------------------------------------
-- Retention: the effects of settled, quiet runs are removed by an admin
-- (src/purge_calls.c; docs/operations.md "Retention").
-- ---------------------------------------------------------------------------
CREATE FUNCTION durable_ledger.purge_settled(older_than interval, purged_by text,
                                             dry_run boolean DEFAULT true,
                                             max_runs integer DEFAULT 500)
RETURNS TABLE (run text, effects bigint, past_attempts bigint, divergences bigint)
AS 'MODULE_PATHNAME', 'dl_purge_settled_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.purge_settled(interval, text, boolean, integer) IS
    'removes the effects of runs whose every effect is completed or failed (none started but a recorded call, none unknown or flagged, no divergence waiting) and whose audit log is quiet for older_than; a later call of such a run executes again; dry_run (the default) only lists them; at most max_runs per call';
REVOKE ALL ON FUNCTION durable_ledger.purge_settled(interval, text, boolean, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION durable_ledger.purge_settled(interval, text, boolean, integer)
    TO durable_ledger_admin;

-- The audit log's horizon (src/purge_calls.c; docs/operations.md "Retention").
CREATE FUNCTION durable_ledger.purge_audit(older_than interval, purged_by text,
                                           dry_run boolean DEFAULT true)
RETURNS TABLE (chain bigint, audit_rows bigint, up_to_seq bigint)
AS 'MODULE_PATHNAME', 'dl_purge_audit_1_2'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.purge_audit(interval, text, boolean) IS
    'removes audit rows older than older_than of runs with no effect left (and rows of no run), a prefix of each hash chain, anchored in audit_anchors; dry_run (the default) only counts';
REVOKE ALL ON FUNCTION durable_ledger.purge_audit(interval, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION durable_ledger.purge_audit(interval, text, boolean) TO durable_ledger_admin;

-- The append-only trigger, in C: only purge_audit's own deletes pass.
CREATE OR REPLACE FUNCTION durable_ledger.refuse_audit_log_change() RETURNS trigger
AS 'MODULE_PATHNAME', 'dl_refuse_audit_log_change_1_2'
LANGUAGE C;
COMMENT ON FUNCTION durable_ledger.refuse_audit_log_change() IS
    'trigger: refuses UPDATE, DELETE and TRUNCATE on durable_ledger.audit_log, for its owner too; only purge_audit deletes';

-- ---------------------------------------------------------------------------
-- Monitoring (docs/operations.md "Monitoring"; monitoring/ holds the
-- exporter's queries and the alert rules).
-- ---------------------------------------------------------------------------
-- Event counts since the server started, kept in shared memory when the
-- library is in shared_preload_libraries (else total is NULL).
CREATE FUNCTION durable_ledger.metrics_events()
RETURNS TABLE (event text, total bigint)
AS 'MODULE_PATHNAME', 'dl_metrics_events_1_2'
LANGUAGE C VOLATILE PARALLEL SAFE;
COMMENT ON FUNCTION durable_ledger.metrics_events() IS
    'every kind of audit event with how many were logged since the server started; total NULL unless durable_ledger is in shared_preload_libraries';

-- the token leases not released, found without reading the released ones
CREATE INDEX token_leases_unreleased_idx ON durable_ledger.token_leases (expires_at)
    WHERE released_at IS NULL;

-- The state of the ledger now, one row, for a scrape every few seconds.
CREATE VIEW durable_ledger.metrics AS
SELECT (SELECT pg_catalog.count(*) FROM pg_catalog.pg_locks l
         WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
           AND l.objsubid OPERATOR(pg_catalog.=) 17484 AND l.granted
           AND l.mode OPERATOR(pg_catalog.=) 'ExclusiveLock'
           AND l.database OPERATOR(pg_catalog.=) (SELECT d.oid FROM pg_catalog.pg_database d
                                                  WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()))
           AS session_leases,
       (SELECT pg_catalog.count(*) FROM durable_ledger.token_leases t
         WHERE t.released_at IS NULL AND t.expires_at OPERATOR(pg_catalog.>) pg_catalog.now())
           AS token_leases,
       (SELECT pg_catalog.count(*) FROM durable_ledger.token_leases t
         WHERE t.released_at IS NULL AND t.expires_at OPERATOR(pg_catalog.<=) pg_catalog.now())
           AS token_leases_expired,
       u.unresolved,
       COALESCE(pg_catalog.extract('epoch', u.oldest), 0)::double precision AS unresolved_oldest_seconds,
       EXISTS (SELECT FROM durable_ledger.metrics_events() e WHERE e.total IS NOT NULL) AS counters_kept
  FROM (SELECT pg_catalog.count(*) AS unresolved, pg_catalog.max(x.age) AS oldest
          FROM durable_ledger.unresolved x) u;
COMMENT ON VIEW durable_ledger.metrics IS
    'the ledger now: live session and token leases, token leases expired without release, what waits for a person (unresolved) and for how long, whether event counts are kept';

REVOKE ALL ON durable_ledger.metrics FROM PUBLIC;
REVOKE ALL ON FUNCTION durable_ledger.metrics_events() FROM PUBLIC;
GRANT SELECT ON durable_ledger.metrics TO durable_ledger_auditor;
GRANT EXECUTE ON FUNCTION durable_ledger.metrics_events() TO durable_ledger_auditor;
