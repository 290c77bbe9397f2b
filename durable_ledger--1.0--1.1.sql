/* durable_ledger--1.0--1.1.sql: from 1.0 to 1.1 (ALTER EXTENSION durable_ledger UPDATE). */

\echo Use "ALTER EXTENSION durable_ledger UPDATE TO '1.1'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- Reports name their attempt.
-- ---------------------------------------------------------------------------

-- Every audit row says which attempt of its key it concerns (NULL for lease
-- events, and for a report that named no attempt when that was ambiguous).
ALTER TABLE durable_ledger.audit_log ADD COLUMN attempt integer;

-- The attempts of business keys that a later attempt replaced (a replaced
-- attempt has always failed): what a late report on an earlier attempt is
-- compared with, and where the audit log files it.
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
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.past_attempts', '');
REVOKE ALL ON durable_ledger.past_attempts FROM PUBLIC;
GRANT SELECT ON durable_ledger.past_attempts TO durable_ledger_auditor;

-- The earlier attempts of a 1.0 ledger, from its audit log: attempt 1's
-- intent is the key's first intent (1.0 logged it without detail), attempt
-- k > 1's intent carries {"attempt": k}; the attempt's outcome is the last
-- failure (or failed resolution) logged before the next attempt's intent.
-- (1.0 logged an SQL NULL error as JSON null: it becomes NULL again.)
INSERT INTO durable_ledger.past_attempts
    (key, attempt, run, lease_epoch, holder_pid, status, error, meta, created_at,
     completed_at, resolved_by, resolution_note, replaced_at)
SELECT e.key, k.attempt, i.run, i.lease_epoch, i.backend_pid, 'failed',
       NULLIF(o.error, 'null'::jsonb), NULL, i.logged_at, o.logged_at, o.resolved_by, o.note,
       COALESCE(n.logged_at, e.created_at)
  FROM durable_ledger.effects e
 CROSS JOIN LATERAL pg_catalog.generate_series(1, e.attempt OPERATOR(pg_catalog.-) 1) AS k(attempt)
 CROSS JOIN LATERAL (
        SELECT a.id, a.run, a.lease_epoch, a.backend_pid, a.logged_at
          FROM durable_ledger.audit_log a
         WHERE a.key OPERATOR(pg_catalog.=) e.key
           AND a.event OPERATOR(pg_catalog.=) 'intent'
           AND CASE WHEN k.attempt OPERATOR(pg_catalog.=) 1
                    THEN (a.detail OPERATOR(pg_catalog.->>) 'attempt') IS NULL
                    ELSE (a.detail OPERATOR(pg_catalog.->>) 'attempt') OPERATOR(pg_catalog.=) k.attempt::text END
         ORDER BY a.id
         LIMIT 1) i
  LEFT JOIN LATERAL (
        SELECT a.id, a.logged_at
          FROM durable_ledger.audit_log a
         WHERE a.key OPERATOR(pg_catalog.=) e.key
           AND a.event OPERATOR(pg_catalog.=) 'intent'
           AND (a.detail OPERATOR(pg_catalog.->>) 'attempt') OPERATOR(pg_catalog.=) (k.attempt OPERATOR(pg_catalog.+) 1)::text
         ORDER BY a.id
         LIMIT 1) n ON true
  LEFT JOIN LATERAL (
        SELECT a.logged_at,
               a.detail OPERATOR(pg_catalog.->) 'error' AS error,
               a.detail OPERATOR(pg_catalog.->>) 'resolved_by' AS resolved_by,
               a.detail OPERATOR(pg_catalog.->>) 'note' AS note
          FROM durable_ledger.audit_log a
         WHERE a.key OPERATOR(pg_catalog.=) e.key
           AND a.id OPERATOR(pg_catalog.>) i.id
           AND (n.id IS NULL OR a.id OPERATOR(pg_catalog.<) n.id)
           AND (a.event OPERATOR(pg_catalog.=) ANY (ARRAY['failed', 'late_failure'])
                OR (a.event OPERATOR(pg_catalog.=) 'resolved'
                    AND a.detail OPERATOR(pg_catalog.->>) 'outcome' OPERATOR(pg_catalog.=) 'failed'))
         ORDER BY a.id DESC
         LIMIT 1) o ON true
 WHERE e.business_key AND e.attempt OPERATOR(pg_catalog.>) 1;

-- complete_effect, fail_effect and resolve_effect gain the attempt they are
-- about.  (The old forms must go: with both, a call without the attempt
-- would be ambiguous.)  Every function implemented anew binds to a symbol of
-- version 1.1: a backend that still has the 1.0 library loaded then fails to
-- find it, instead of applying 1.0 rules to 1.1 tables.
DROP FUNCTION durable_ledger.complete_effect(text, jsonb);
DROP FUNCTION durable_ledger.fail_effect(text, jsonb);
DROP FUNCTION durable_ledger.resolve_effect(text, text, jsonb, text, text);

CREATE FUNCTION durable_ledger.complete_effect(key text, result jsonb,
                                               attempt integer DEFAULT NULL)
RETURNS durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_complete_effect_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.complete_effect(text, jsonb, integer) IS
    'records that the effect (the given attempt of it) happened and what it returned';

CREATE FUNCTION durable_ledger.fail_effect(key text, error jsonb,
                                           attempt integer DEFAULT NULL)
RETURNS durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_fail_effect_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.fail_effect(text, jsonb, integer) IS
    'declares that the effect (the given attempt of it) definitively did not happen';

CREATE FUNCTION durable_ledger.resolve_effect(key text, outcome text, result jsonb,
                                              resolved_by text, note text DEFAULT NULL,
                                              attempt integer DEFAULT NULL)
RETURNS durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_resolve_effect_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.resolve_effect(text, text, jsonb, text, text, integer) IS
    'a named person''s decision on an effect (the given attempt of it) whose outcome is unknown or contradicted';

REVOKE ALL ON FUNCTION durable_ledger.complete_effect(text, jsonb, integer),
                       durable_ledger.fail_effect(text, jsonb, integer),
                       durable_ledger.resolve_effect(text, text, jsonb, text, text, integer)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION durable_ledger.complete_effect(text, jsonb, integer),
                          durable_ledger.fail_effect(text, jsonb, integer)
    TO durable_ledger_worker;
GRANT EXECUTE ON FUNCTION durable_ledger.resolve_effect(text, text, jsonb, text, text, integer)
    TO durable_ledger_admin;

CREATE OR REPLACE FUNCTION durable_ledger.acquire_run(run text, wait boolean DEFAULT true)
RETURNS boolean
AS 'MODULE_PATHNAME', 'dl_acquire_run_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION durable_ledger.release_run(run text)
RETURNS boolean
AS 'MODULE_PATHNAME', 'dl_release_run_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

DROP FUNCTION durable_ledger.begin_effect(text, text, jsonb, text, jsonb);
CREATE FUNCTION durable_ledger.begin_effect(run text, tool text, args jsonb,
                                            business_key text DEFAULT NULL,
                                            meta jsonb DEFAULT NULL,
                                            lease text DEFAULT NULL)
RETURNS durable_ledger.decision
AS 'MODULE_PATHNAME', 'dl_begin_effect_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.begin_effect(text, text, jsonb, text, jsonb, text) IS
    'records the intent of a side effect before it happens and says whether to execute, replay, pause or wait';
REVOKE ALL ON FUNCTION durable_ledger.begin_effect(text, text, jsonb, text, jsonb, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION durable_ledger.begin_effect(text, text, jsonb, text, jsonb, text)
    TO durable_ledger_worker;

CREATE OR REPLACE FUNCTION durable_ledger.effect_status(key text)
RETURNS SETOF durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_effect_status_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
ROWS 1;

CREATE OR REPLACE FUNCTION durable_ledger.break_lease(run text, broken_by text, note text DEFAULT NULL)
RETURNS boolean
AS 'MODULE_PATHNAME', 'dl_break_lease_1_1'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

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

ALTER TABLE durable_ledger.runs
    ADD COLUMN lease_kind durable_ledger.lease_kind NOT NULL DEFAULT 'session';  -- of the current epoch

SELECT pg_catalog.pg_extension_config_dump('durable_ledger.token_leases', '');
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.token_lease_calls', '');
REVOKE ALL ON durable_ledger.token_leases, durable_ledger.token_lease_calls FROM PUBLIC;
GRANT SELECT ON durable_ledger.token_leases, durable_ledger.token_lease_calls
    TO durable_ledger_auditor;
REVOKE ALL ON TYPE durable_ledger.lease, durable_ledger.lease_kind FROM PUBLIC;
GRANT USAGE ON TYPE durable_ledger.lease, durable_ledger.lease_kind
    TO durable_ledger_worker, durable_ledger_auditor, durable_ledger_admin;

CREATE FUNCTION durable_ledger.take_lease(run text, ttl interval DEFAULT '5 minutes',
                                          holder text DEFAULT NULL)
RETURNS durable_ledger.lease
AS 'MODULE_PATHNAME', 'dl_take_lease_1_1'
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

REVOKE ALL ON FUNCTION durable_ledger.take_lease(text, interval, text),
                       durable_ledger.renew_lease(text, interval),
                       durable_ledger.release_lease(text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION durable_ledger.take_lease(text, interval, text),
                          durable_ledger.renew_lease(text, interval),
                          durable_ledger.release_lease(text)
    TO durable_ledger_worker;

-- ---------------------------------------------------------------------------
-- Replicas: the views say what a hot standby cannot judge.
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
REVOKE ALL ON FUNCTION durable_ledger.lease_holder_activity() FROM PUBLIC;
GRANT EXECUTE ON FUNCTION durable_ledger.lease_holder_activity() TO durable_ledger_auditor;

DROP VIEW durable_ledger.leases;
DROP VIEW durable_ledger.unresolved;

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
 WHERE pg_catalog.pg_is_in_recovery()
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
-- with a reason saying so.
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
       e.lease_epoch
  FROM durable_ledger.effects e
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
    OR j.not_judged;

REVOKE ALL ON durable_ledger.leases, durable_ledger.unresolved FROM PUBLIC;
GRANT SELECT ON durable_ledger.leases, durable_ledger.unresolved TO durable_ledger_auditor;
