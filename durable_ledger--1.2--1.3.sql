/* durable_ledger--1.2--1.3.sql: from 1.2 to 1.3 (ALTER EXTENSION durable_ledger UPDATE). */

\echo Use "ALTER EXTENSION durable_ledger UPDATE TO '1.3'" to load this file. \quit

-- 1.3 is built up by several changes; this script grows with them until 1.3 is
-- released.  A fresh install runs durable_ledger--1.3.sql instead, built from
-- schema/durable_ledger.sql: each change is made in both, and
-- test/t/014_upgrade.pl proves that what this script leaves equals it.

-- ---------------------------------------------------------------------------
-- Divergence on by default: a later attempt's call of a tool nobody
-- registered is judged as a registered side-effecting tool's is (pause),
-- unless an admin says otherwise with set_unregistered_divergence().  A
-- deployment that had a policy row keeps its unregistered_tools setting and
-- gets the new default too (1.2 had no such setting to keep).
-- ---------------------------------------------------------------------------
ALTER TABLE durable_ledger.policy
    ADD COLUMN unregistered_divergence durable_ledger.divergence_policy NOT NULL DEFAULT 'pause';

CREATE FUNCTION durable_ledger.set_unregistered_divergence(setting text, set_by text,
                                                           note text DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'dl_set_unregistered_divergence_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.set_unregistered_divergence(text, text, text) IS
    'how a later attempt''s drifted call of a tool nobody registered is handled: pause (the default), warn or off; audited with the name; returns the previous setting';

CREATE OR REPLACE FUNCTION durable_ledger.set_unregistered_tools(setting text, set_by text,
                                                                 note text DEFAULT NULL)
RETURNS text
AS 'MODULE_PATHNAME', 'dl_set_unregistered_tools_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

-- The calls read the new policy column; reports gave their WARNINGs SQLSTATEs.
-- begin_effect takes call_id: its business key is a framework's id of one
-- tool call, and a new one that repeats an earlier attempt's call pauses as a
-- divergence (a parameter more: the function is made anew, granted as before).
DROP FUNCTION durable_ledger.begin_effect(text, text, jsonb, text, jsonb, text);
CREATE FUNCTION durable_ledger.begin_effect(run text, tool text, args jsonb,
                                            business_key text DEFAULT NULL,
                                            meta jsonb DEFAULT NULL,
                                            lease text DEFAULT NULL,
                                            call_id boolean DEFAULT false)
RETURNS durable_ledger.decision
AS 'MODULE_PATHNAME', 'dl_begin_effect_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.begin_effect(text, text, jsonb, text, jsonb, text, boolean) IS
    'records the intent of a side effect before it happens and says whether to execute, replay, pause or wait; call_id: business_key is a framework''s id of this tool call';
REVOKE ALL ON FUNCTION durable_ledger.begin_effect(text, text, jsonb, text, jsonb, text, boolean) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION durable_ledger.begin_effect(text, text, jsonb, text, jsonb, text, boolean)
    TO durable_ledger_worker;

CREATE OR REPLACE FUNCTION durable_ledger.begin_recorded(run text, tool text, args jsonb,
                                                         meta jsonb DEFAULT NULL,
                                                         lease text DEFAULT NULL)
RETURNS durable_ledger.decision
AS 'MODULE_PATHNAME', 'dl_begin_recorded_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION durable_ledger.complete_effect(key text, result jsonb,
                                                          attempt integer DEFAULT NULL)
RETURNS durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_complete_effect_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION durable_ledger.fail_effect(key text, error jsonb,
                                                      attempt integer DEFAULT NULL)
RETURNS durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_fail_effect_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

-- ---------------------------------------------------------------------------
-- A session attempt that knows its epoch: a client asks session_epoch() in
-- the very statement of each call and calls only while it is unchanged, so a
-- transaction pooler between client and server is caught before anything is
-- performed; release_attempt() ends the attempt's lease where it was left.
-- ---------------------------------------------------------------------------
CREATE FUNCTION durable_ledger.session_epoch(run text)
RETURNS bigint
AS 'MODULE_PATHNAME', 'dl_session_epoch_1_3'
LANGUAGE C VOLATILE PARALLEL RESTRICTED SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.session_epoch(text) IS
    'the epoch of this session''s lease of the run, NULL when this session holds none';

CREATE FUNCTION durable_ledger.release_attempt(run text, epoch bigint)
RETURNS boolean
AS 'MODULE_PATHNAME', 'dl_release_attempt_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.release_attempt(text, bigint) IS
    'ends the session lease of the run at that epoch wherever it is held: released by this session, or its holder terminated as pg_terminate_backend allows the caller; false when no live lease holds it';

REVOKE ALL ON FUNCTION
    durable_ledger.set_unregistered_divergence(text, text, text),
    durable_ledger.session_epoch(text),
    durable_ledger.release_attempt(text, bigint)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    durable_ledger.session_epoch(text),
    durable_ledger.release_attempt(text, bigint)
    TO durable_ledger_worker;
GRANT EXECUTE ON FUNCTION durable_ledger.set_unregistered_divergence(text, text, text)
    TO durable_ledger_admin;

-- ---------------------------------------------------------------------------
-- purge_audit keeps the evidence of anything still open, whatever a row's
-- run column says: the rows about an effect started, unknown or flagged, a
-- divergence waiting for its verdict, a run a live lease holds.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION durable_ledger.purge_audit(older_than interval, purged_by text,
                                                      dry_run boolean DEFAULT true)
RETURNS TABLE (chain bigint, audit_rows bigint, up_to_seq bigint)
AS 'MODULE_PATHNAME', 'dl_purge_audit_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.purge_audit(interval, text, boolean) IS
    'removes audit rows older than older_than of runs with no effect left (and rows of no run), but never the evidence of what is still open nor a row without a chain: a prefix of each hash chain, anchored in audit_anchors; dry_run (the default) only counts';

-- ---------------------------------------------------------------------------
-- No blind spot in verify_audit: the rows written before chains began (by
-- 1.0 and 1.1) are chained now as chain 0, in the order of their ids, by
-- the same rule as every chain (audit_row_content); what this update finds
-- is what it vouches for.  Such a row has an id the sequence gave (from 1)
-- below the first chained row's and was logged no later than it: a row
-- without a chain that is not (one added by hand, or by a worker still
-- running 1.1 during the update to 1.2) stays unchained, and verify_audit
-- reports it.  From here on a row without a chain is flagged wherever its id
-- falls, and so is a chain-0 row that is not history.
-- ---------------------------------------------------------------------------
ALTER DOMAIN durable_ledger.audit_event DROP CONSTRAINT audit_event_check;
ALTER DOMAIN durable_ledger.audit_event ADD CONSTRAINT audit_event_check
    CHECK (VALUE IN ('lease_acquired', 'lease_released', 'lease_broken',
                     'intent', 'replay', 'pause', 'in_progress',
                     'completed', 'late_completion', 'failed', 'late_failure',
                     'resolved', 'conflict',
                     'tool_registered', 'tool_changed', 'tool_retired',
                     'divergence', 'divergence_resolved', 'run_abandoned', 'run_forked',
                     'carried', 'policy_changed', 'purged', 'audit_purged',
                     'superseded_report', 'history_chained', 'retry_allowed',
                     'reconciled'));
ALTER TABLE durable_ledger.audit_log DISABLE TRIGGER audit_log_append_only;
DO $chain_history$
DECLARE
    r durable_ledger.audit_log;
    n bigint := 0;
    previous bytea := pg_catalog.decode(pg_catalog.repeat('00', 32), 'hex');
    first_chained durable_ledger.audit_log := (SELECT c FROM durable_ledger.audit_log c
                                                WHERE c.chain IS NOT NULL ORDER BY c.id LIMIT 1);
BEGIN
    FOR r IN SELECT * FROM durable_ledger.audit_log a
              WHERE a.chain IS NULL AND a.id OPERATOR(pg_catalog.>=) 1
                AND (first_chained.id IS NULL
                     OR (a.id OPERATOR(pg_catalog.<) first_chained.id
                         AND a.logged_at OPERATOR(pg_catalog.<=) first_chained.logged_at))
              ORDER BY a.id
    LOOP
        n := n OPERATOR(pg_catalog.+) 1;
        r.chain := 0;
        r.chain_seq := n;
        r.row_hash := pg_catalog.sha256(previous OPERATOR(pg_catalog.||) durable_ledger.audit_row_content(r));
        previous := r.row_hash;
        UPDATE durable_ledger.audit_log a SET chain = 0, chain_seq = n, row_hash = r.row_hash
         WHERE a.id OPERATOR(pg_catalog.=) r.id;
    END LOOP;
    IF n OPERATOR(pg_catalog.=) 0 THEN
        RETURN;
    END IF;
    -- chain 0's head, recorded in a chained row of a chain of its own, as
    -- audit_chain.c links a backend's first row: chain 0 never grows past it
    r := NULL;
    r.id := pg_catalog.nextval('durable_ledger.audit_log_id_seq');
    r.logged_at := pg_catalog.clock_timestamp();
    r.event := 'history_chained';
    r.detail := pg_catalog.jsonb_build_object('chain', 0, 'chain_seq', n,
                                              'row_hash', pg_catalog.encode(previous, 'hex'));
    r.role_name := current_user;
    r.session_user_name := session_user;
    r.application_name := pg_catalog.current_setting('application_name');
    r.client_addr := pg_catalog.inet_client_addr();
    r.backend_pid := pg_catalog.pg_backend_pid();
    r.chain := pg_catalog.nextval('durable_ledger.audit_chain_seq');
    r.chain_seq := 1;
    r.row_hash := pg_catalog.sha256(pg_catalog.decode(pg_catalog.repeat('00', 32), 'hex')
                                    OPERATOR(pg_catalog.||) durable_ledger.audit_row_content(r));
    INSERT INTO durable_ledger.audit_log SELECT r.*;
END
$chain_history$;
ALTER TABLE durable_ledger.audit_log ENABLE TRIGGER audit_log_append_only;

-- Recomputes every chain; one row per chain whose first broken link it names,
-- per anchor no purge recorded, per chain no backend was given, per chain-0
-- row that is not history, per row without a chain, and per kept head that is
-- gone or changed.
CREATE OR REPLACE FUNCTION durable_ledger.verify_audit(heads jsonb DEFAULT NULL)
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
-- a chain the sequence never issued (chain 0 is the history from before chains)
SELECT DISTINCT ON (a.chain) a.chain, a.chain_seq, a.id,
       'no backend was given this chain: the row was added by hand'
  FROM durable_ledger.audit_log a
 WHERE a.chain OPERATOR(pg_catalog.>) (SELECT s.last_value FROM durable_ledger.audit_chain_seq s)
    OR a.chain OPERATOR(pg_catalog.<) 0
UNION ALL
-- a row of the history from before chains (chain 0) that is not history: an
-- id the sequence did not give, or out of the order of ids, or newer (by id
-- or by time) than the first chained row
SELECT DISTINCT ON (h.chain) h.chain, h.chain_seq, h.id,
       'a row of the history from before chains (chain 0) that is out of order or newer than a chained row: added by hand'
  FROM (SELECT a.chain, a.chain_seq, a.id, a.logged_at,
               pg_catalog.lag(a.id) OVER (ORDER BY a.chain_seq, a.id) AS previous_id
          FROM durable_ledger.audit_log a WHERE a.chain OPERATOR(pg_catalog.=) 0) h
 WHERE h.id OPERATOR(pg_catalog.<) 1
    OR h.id OPERATOR(pg_catalog.<=) h.previous_id
    OR h.id OPERATOR(pg_catalog.>) (SELECT pg_catalog.min(c.id) FROM durable_ledger.audit_log c
                                     WHERE c.chain OPERATOR(pg_catalog.>) 0)
    OR h.logged_at OPERATOR(pg_catalog.>) (SELECT c.logged_at FROM durable_ledger.audit_log c
                                            WHERE c.chain OPERATOR(pg_catalog.>) 0
                                            ORDER BY c.id LIMIT 1)
UNION ALL
-- a row of chain 0 beyond its head as the update to 1.3 recorded it, in a
-- chained row (history_chained): chain 0 never grows, and its head keeps its hash
SELECT h.chain, h.chain_seq, h.id,
       'a row of the history from before chains (chain 0) beyond the head the update recorded, or its head changed: added or rewritten by hand'
  FROM (SELECT a.chain, a.chain_seq, a.id
          FROM durable_ledger.audit_log a
          LEFT JOIN (SELECT (p.detail OPERATOR(pg_catalog.->>) 'chain_seq')::bigint AS seq,
                            p.detail OPERATOR(pg_catalog.->>) 'row_hash' AS row_hash
                       FROM durable_ledger.audit_log p
                      WHERE p.event OPERATOR(pg_catalog.=) 'history_chained'
                        AND p.chain OPERATOR(pg_catalog.>) 0
                      ORDER BY p.id LIMIT 1) head ON true
         WHERE a.chain OPERATOR(pg_catalog.=) 0
           AND (a.chain_seq OPERATOR(pg_catalog.>) COALESCE(head.seq, 0)
                OR (a.chain_seq OPERATOR(pg_catalog.=) head.seq
                    AND pg_catalog.encode(a.row_hash, 'hex') OPERATOR(pg_catalog.<>) head.row_hash))
         ORDER BY a.chain_seq LIMIT 1) h
UNION ALL
-- a row without a chain, wherever its id falls: since 1.3 every row has one
-- (the rows written before chains began were chained as chain 0 by the update)
SELECT NULL::bigint, NULL::bigint, a.id,
       'an audit row without a chain: added by hand, or by a worker still running an earlier version''s library'
  FROM durable_ledger.audit_log a
 WHERE a.chain IS NULL
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
    'recomputes the audit log''s hash chains (chain 0: the rows written before chains began, chained at the update to 1.3): the first broken link of each chain, anchors no purge recorded, chains no backend was given, chain-0 rows that are not history or lie beyond the head the update recorded, rows without a chain, and every kept head (audit_heads rows as a JSON array) that is gone or changed; no rows: nothing was found';

-- ---------------------------------------------------------------------------
-- purge_settled removes every replaced attempt of the effects it removes,
-- whichever run made it, so that a purged business key can be used again.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION durable_ledger.purge_settled(older_than interval, purged_by text,
                                                        dry_run boolean DEFAULT true,
                                                        max_runs integer DEFAULT 500)
RETURNS TABLE (run text, effects bigint, past_attempts bigint, divergences bigint)
AS 'MODULE_PATHNAME', 'dl_purge_settled_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.purge_settled(interval, text, boolean, integer) IS
    'removes the effects of runs whose every effect is completed or failed (none started but a recorded call, none unknown or flagged, no divergence waiting), that no live lease holds (theirs, or a run''s that shares their effects) and about which nothing was logged for older_than; a later call of such a run executes again; dry_run (the default) only lists them; at most max_runs per call';

-- ---------------------------------------------------------------------------
-- Canonical args have a bounded cost: a number written out in full may add
-- 324 zeros beyond its significant digits, args 1,024 more in all, and the
-- text never takes more than 128 MB; larger args are refused at once
-- (22023), whatever their spelling.  Every key ever derived is unchanged.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION durable_ledger.canonical_args(args jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'dl_canonical_args_1_3'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION durable_ledger.effect_key(run text, tool text, args jsonb, occurrence integer)
RETURNS text
AS 'MODULE_PATHNAME', 'dl_effect_key_1_3'
LANGUAGE C STABLE PARALLEL UNSAFE;

CREATE OR REPLACE FUNCTION durable_ledger.fork_run(source_run text, new_run text, up_to text,
                                                   forked_by text, note text DEFAULT NULL)
RETURNS integer
AS 'MODULE_PATHNAME', 'dl_fork_run_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

-- ---------------------------------------------------------------------------
-- A ttl too long for 64 bits of microseconds is refused (22023), not wrapped.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION durable_ledger.take_lease(run text, ttl interval DEFAULT '5 minutes',
                                                     holder text DEFAULT NULL)
RETURNS durable_ledger.lease
AS 'MODULE_PATHNAME', 'dl_take_lease_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION durable_ledger.renew_lease(token text, ttl interval DEFAULT NULL)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'dl_renew_lease_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

-- ---------------------------------------------------------------------------
-- Columns an admin adds and drops do not break the ledger: effect_status
-- forms its row by column name, skipping dropped attributes.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION durable_ledger.effect_status(key text)
RETURNS SETOF durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_effect_status_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
ROWS 1;

-- ---------------------------------------------------------------------------
-- The attention channel tells only what is safe to show anyone who can
-- connect: {"event": ..., "audit_id": ...}, the audit row a listener reads
-- with its own rights (1.2 sent the run, the key and the attempt).
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION durable_ledger.resolve_effect(key text, outcome text, result jsonb,
                                                         resolved_by text, note text DEFAULT NULL,
                                                         attempt integer DEFAULT NULL)
RETURNS durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_resolve_effect_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

CREATE OR REPLACE FUNCTION durable_ledger.resolve_divergence(key text, verdict text, resolved_by text,
                                                             note text DEFAULT NULL,
                                                             same_as text DEFAULT NULL)
RETURNS durable_ledger.divergences
AS 'MODULE_PATHNAME', 'dl_resolve_divergence_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

-- ---------------------------------------------------------------------------
-- The lock class of session leases in one place: lease_locks, which leases,
-- unresolved, metrics and lease_holder_activity read (each wrote the class
-- and the rest of the predicate out before).
-- ---------------------------------------------------------------------------
CREATE VIEW durable_ledger.lease_locks AS
SELECT l.pid,
       (l.classid::pg_catalog.int8 OPERATOR(pg_catalog.<<) 32)
       OPERATOR(pg_catalog.|) l.objid::pg_catalog.int8 AS lock_key
  FROM pg_catalog.pg_locks l
 WHERE l.locktype OPERATOR(pg_catalog.=) 'advisory'
   AND l.objsubid OPERATOR(pg_catalog.=) 17484
   AND l.mode OPERATOR(pg_catalog.=) 'ExclusiveLock'
   AND l.granted
   AND l.database OPERATOR(pg_catalog.=)
       (SELECT d.oid FROM pg_catalog.pg_database d
         WHERE d.datname OPERATOR(pg_catalog.=) pg_catalog.current_database());
COMMENT ON VIEW durable_ledger.lease_locks IS
    'the session leases held in this database: granted ExclusiveLock advisory locks of the extension''s lock class (pg_locks.objsubid 17484), one per run held; what leases, unresolved, metrics and lease_holder_activity() read';
COMMENT ON COLUMN durable_ledger.lease_locks.pid IS
    'the backend that holds the lease';
COMMENT ON COLUMN durable_ledger.lease_locks.lock_key IS
    'the lock''s key, (classid << 32) | objid: runs.lock_key of the run it holds';
REVOKE ALL ON durable_ledger.lease_locks FROM PUBLIC;

CREATE OR REPLACE FUNCTION durable_ledger.lease_holder_activity()
RETURNS TABLE (pid integer, application_name text, client_addr inet, backend_state text)
LANGUAGE sql STABLE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp
AS $fn$
    SELECT a.pid, a.application_name, a.client_addr, a.state
      FROM pg_catalog.pg_stat_activity a
     WHERE a.datname OPERATOR(pg_catalog.=) pg_catalog.current_database()
       AND a.pid OPERATOR(pg_catalog.=) ANY (SELECT l.pid FROM durable_ledger.lease_locks l)
$fn$;

CREATE OR REPLACE VIEW durable_ledger.leases AS
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
       l.lock_key,
       'live'::text                                          AS liveness,
       'session'::text                                       AS kind,
       NULL::text                                            AS holder,
       NULL::timestamptz                                     AS expires_at
  FROM durable_ledger.lease_locks l
  LEFT JOIN durable_ledger.runs r ON r.lock_key OPERATOR(pg_catalog.=) l.lock_key
 CROSS JOIN LATERAL (SELECT r.holder_pid OPERATOR(pg_catalog.=) l.pid
                            AND r.released_at IS NULL
                            AND r.lease_kind OPERATOR(pg_catalog.=) 'session' AS current_epoch) c
  LEFT JOIN durable_ledger.lease_holder_activity() a ON a.pid OPERATOR(pg_catalog.=) l.pid
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

CREATE OR REPLACE VIEW durable_ledger.metrics AS
SELECT (SELECT pg_catalog.count(*) FROM durable_ledger.lease_locks l) AS session_leases,
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

-- ---------------------------------------------------------------------------
-- Reconcilers: an admin may let workers settle an unknown outcome of a tool
-- from the provider's own record (set_reconcile, reconcile_effect, below),
-- after a grace; unresolved shows it.  The column comes last, as a fresh
-- install has it.
-- ---------------------------------------------------------------------------
ALTER TABLE durable_ledger.tools ADD COLUMN reconcile_grace interval;
COMMENT ON COLUMN durable_ledger.tools.reconcile_grace IS
    'NULL: an unknown outcome of the tool waits for a person; else a worker may settle it from the provider''s record (reconcile_effect) this long after the ledger found it unknown (set_reconcile)';

-- ---------------------------------------------------------------------------
-- unresolved says what a flagged effect's report is: contradicting, or (1.3)
-- naming no attempt where that is ambiguous; and (1.3) whether a reconciler
-- may settle it.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE VIEW durable_ledger.unresolved AS
SELECT e.key,
       e.run,
       e.tool,
       CASE WHEN j.ended THEN 'unknown'
            ELSE e.status END::durable_ledger.effect_state AS status,
       e.conflict,
       CASE
           WHEN e.conflict THEN
               'a report was kept for a person: it contradicts the recorded outcome, or names no attempt where that is ambiguous; a person must decide which is true'
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
       -- the key the provider was given: a business key's, and any attempt
       -- after the first, names its attempt
       CASE WHEN e.business_key OR e.attempt OPERATOR(pg_catalog.>) 1
            THEN pg_catalog.concat(e.key, '#', e.attempt)
            ELSE e.key END                          AS downstream_key,
       -- a reconciler may settle an unknown outcome of the tool, this long
       -- after it was found unknown (a flagged one waits for a person)
       CASE WHEN NOT e.conflict THEN (
            SELECT t.reconcile_grace FROM durable_ledger.tools t
             WHERE t.tool OPERATOR(pg_catalog.=) e.tool) END AS reconcile_grace
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
                       SELECT 1 FROM durable_ledger.lease_locks l
                        WHERE l.pid OPERATOR(pg_catalog.=) cur.holder_pid
                          AND l.lock_key OPERATOR(pg_catalog.=) cur.lock_key)
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
       NULL,
       NULL::interval
  FROM durable_ledger.divergences d
  LEFT JOIN durable_ledger.runs ab ON ab.run OPERATOR(pg_catalog.=) d.run
 WHERE d.verdict IS NULL
   AND NOT EXISTS (SELECT FROM durable_ledger.effects x
                    WHERE x.key OPERATOR(pg_catalog.=) d.key);  -- executed meanwhile (policy off)

-- ---------------------------------------------------------------------------
-- Every table, column and view says what it holds (\d+ shows it).
-- ---------------------------------------------------------------------------
COMMENT ON TABLE durable_ledger.runs IS
    'one row per run: its lease epochs (attempts), who holds or last held its lease, and whether a person abandoned it or it was forked';
COMMENT ON COLUMN durable_ledger.runs.run IS
    'the run''s name, as its callers give it';
COMMENT ON COLUMN durable_ledger.runs.epochs IS
    'how many lease epochs (attempts) the run has had: the number of the current one';
COMMENT ON COLUMN durable_ledger.runs.lock_key IS
    'a 64-bit hash of run, the key of its session lease''s advisory lock: (classid << 32) | objid in pg_locks, lock_key in lease_locks';
COMMENT ON COLUMN durable_ledger.runs.holder_pid IS
    'the backend that took the current (or last) epoch''s lease';
COMMENT ON COLUMN durable_ledger.runs.holder_role IS
    'the role that took it, as after SET ROLE';
COMMENT ON COLUMN durable_ledger.runs.holder_application_name IS
    'the application_name of the session that took it';
COMMENT ON COLUMN durable_ledger.runs.holder_client_addr IS
    'the client address of the session that took it; NULL for a Unix socket';
COMMENT ON COLUMN durable_ledger.runs.acquired_at IS
    'when the current epoch began';
COMMENT ON COLUMN durable_ledger.runs.released_at IS
    'when the current epoch''s lease was released; NULL while it was not (its holder may still hold it, or have died)';
COMMENT ON COLUMN durable_ledger.runs.created_at IS
    'when the ledger first recorded the run';
COMMENT ON COLUMN durable_ledger.runs.lease_kind IS
    'session or token: the kind of lease that holds the current epoch';
COMMENT ON COLUMN durable_ledger.runs.abandoned_at IS
    'when a person abandoned the run (abandon_run): no further begin_effect, acquire_run or take_lease; NULL: not abandoned';
COMMENT ON COLUMN durable_ledger.runs.abandoned_by IS
    'who abandoned it, as named to abandon_run';
COMMENT ON COLUMN durable_ledger.runs.abandon_note IS
    'abandon_run''s note';
COMMENT ON COLUMN durable_ledger.runs.forked_from IS
    'a forked run''s source run (fork_run); NULL for a run that was not forked';
COMMENT ON COLUMN durable_ledger.runs.forked_up_to IS
    'the last effect of the source run that the fork carries';
COMMENT ON TABLE durable_ledger.effects IS
    'one row per idempotency key: the intent of a side effect (or of a recorded call), recorded before it happens, its current attempt and its outcome';
COMMENT ON COLUMN durable_ledger.effects.key IS
    'the idempotency key: derived from run, tool, args and occurrence (64 hexadecimal digits), or the business key itself';
COMMENT ON COLUMN durable_ledger.effects.run IS
    'the run whose lease started the current attempt';
COMMENT ON COLUMN durable_ledger.effects.tool IS
    'the tool called';
COMMENT ON COLUMN durable_ledger.effects.args IS
    'the call''s arguments, as given';
COMMENT ON COLUMN durable_ledger.effects.business_key IS
    'true: key is a business key, one operation across all runs; false: a key derived from the call';
COMMENT ON COLUMN durable_ledger.effects.occurrence IS
    'which identical call of its lease epoch it was (1, 2, ...); NULL for a business key';
COMMENT ON COLUMN durable_ledger.effects.attempt IS
    'the current attempt: 1, or n+1 after n failures of a business key or n attempts of a recorded call lost with their lease';
COMMENT ON COLUMN durable_ledger.effects.status IS
    'started, completed, failed or unknown (effect_status shows a started effect whose lease has ended as unknown)';
COMMENT ON COLUMN durable_ledger.effects.result IS
    'what a completed effect returned';
COMMENT ON COLUMN durable_ledger.effects.error IS
    'why a failed effect did not happen';
COMMENT ON COLUMN durable_ledger.effects.meta IS
    'the caller''s meta of the current attempt, as given to begin_effect or begin_recorded';
COMMENT ON COLUMN durable_ledger.effects.lease_epoch IS
    'the lease epoch of run that started the current attempt';
COMMENT ON COLUMN durable_ledger.effects.holder_pid IS
    'the backend that started the current attempt';
COMMENT ON COLUMN durable_ledger.effects.created_at IS
    'when the current attempt began';
COMMENT ON COLUMN durable_ledger.effects.completed_at IS
    'when its outcome was reported or resolved; NULL while it has none';
COMMENT ON COLUMN durable_ledger.effects.resolved_by IS
    'who decided the outcome, or that it is made again (resolve_effect, retry_effect); NULL unless a person did';
COMMENT ON COLUMN durable_ledger.effects.resolution_note IS
    'the note of resolve_effect or retry_effect';
COMMENT ON COLUMN durable_ledger.effects.conflict IS
    'true while a report that contradicts the recorded outcome, or names no attempt where that is ambiguous, waits for a person (resolve_effect clears it)';
COMMENT ON COLUMN durable_ledger.effects.forked_from IS
    'in a forked run: the effect of the source run it carries';
COMMENT ON COLUMN durable_ledger.effects.safe_to_redo IS
    'begun by begin_recorded: a call safe to make again, executed again when its lease ended without a report';
COMMENT ON TABLE durable_ledger.unsettled IS
    'the effects that may wait for a person: started (but recorded calls), unknown or flagged; kept by the ledger''s own writes, read by unresolved and metrics';
COMMENT ON COLUMN durable_ledger.unsettled.created_at IS
    'the effect''s created_at: when its current attempt began';
COMMENT ON COLUMN durable_ledger.unsettled.key IS
    'the effect''s key';
COMMENT ON TABLE durable_ledger.past_attempts IS
    'the attempts that a later attempt replaced: a business key''s failed ones, a recorded call''s lost with their lease (unknown); what a late report on an earlier attempt is judged against';
COMMENT ON COLUMN durable_ledger.past_attempts.key IS
    'the effect''s key';
COMMENT ON COLUMN durable_ledger.past_attempts.attempt IS
    'which attempt of the effect this was';
COMMENT ON COLUMN durable_ledger.past_attempts.run IS
    'the run whose lease started this attempt';
COMMENT ON COLUMN durable_ledger.past_attempts.lease_epoch IS
    'the lease epoch of run that started it';
COMMENT ON COLUMN durable_ledger.past_attempts.holder_pid IS
    'the backend that started it';
COMMENT ON COLUMN durable_ledger.past_attempts.status IS
    'its status when it was replaced: failed (a business key), or unknown (a recorded call)';
COMMENT ON COLUMN durable_ledger.past_attempts.error IS
    'why it failed';
COMMENT ON COLUMN durable_ledger.past_attempts.meta IS
    'the caller''s meta of this attempt';
COMMENT ON COLUMN durable_ledger.past_attempts.created_at IS
    'when this attempt began';
COMMENT ON COLUMN durable_ledger.past_attempts.completed_at IS
    'when its outcome was reported or resolved';
COMMENT ON COLUMN durable_ledger.past_attempts.resolved_by IS
    'who decided its outcome, or that it is made again (resolve_effect, retry_effect); NULL unless a person did';
COMMENT ON COLUMN durable_ledger.past_attempts.resolution_note IS
    'the note of resolve_effect or retry_effect';
COMMENT ON COLUMN durable_ledger.past_attempts.replaced_at IS
    'when the next attempt started';
COMMENT ON SEQUENCE durable_ledger.audit_log_id_seq IS
    'the ids of the audit log''s rows';
COMMENT ON TABLE durable_ledger.audit_log IS
    'append-only, one row per event, each linked into a hash chain (verify_audit); UPDATE, DELETE and TRUNCATE are refused, for its owner too: only purge_audit deletes';
COMMENT ON COLUMN durable_ledger.audit_log.id IS
    'the row''s number, from audit_log_id_seq';
COMMENT ON COLUMN durable_ledger.audit_log.logged_at IS
    'when the event was logged';
COMMENT ON COLUMN durable_ledger.audit_log.run IS
    'the run the event concerns; NULL for an event of no run (the tools registry, the policy, a purge''s summary)';
COMMENT ON COLUMN durable_ledger.audit_log.key IS
    'the effect (or drifted call) the event concerns';
COMMENT ON COLUMN durable_ledger.audit_log.event IS
    'what happened (the audit_event domain lists the kinds; docs/reference.md says what each means)';
COMMENT ON COLUMN durable_ledger.audit_log.detail IS
    'what the event says besides, as JSON: a report''s result or error, a decision''s reason, a person''s name and note, the previous outcome';
COMMENT ON COLUMN durable_ledger.audit_log.role_name IS
    'the calling role, as after SET ROLE';
COMMENT ON COLUMN durable_ledger.audit_log.session_user_name IS
    'the session user';
COMMENT ON COLUMN durable_ledger.audit_log.application_name IS
    'the session''s application_name';
COMMENT ON COLUMN durable_ledger.audit_log.client_addr IS
    'the session''s client address; NULL for a Unix socket';
COMMENT ON COLUMN durable_ledger.audit_log.backend_pid IS
    'the backend that logged it';
COMMENT ON COLUMN durable_ledger.audit_log.lease_epoch IS
    'the lease epoch of run the event happened in';
COMMENT ON COLUMN durable_ledger.audit_log.attempt IS
    'the attempt of key the event concerns; NULL for lease events and for a report that could not be matched to an attempt';
COMMENT ON COLUMN durable_ledger.audit_log.chain IS
    'the hash chain the row is linked into: its writing backend''s (audit_chain_seq), or 0 for the rows written before chains began (by 1.0 and 1.1), chained by the update to 1.3';
COMMENT ON COLUMN durable_ledger.audit_log.chain_seq IS
    'the row''s place in its chain: 1, 2, 3, ...';
COMMENT ON COLUMN durable_ledger.audit_log.row_hash IS
    'sha256 of the previous row''s row_hash (after a purge, the chain''s anchor''s; 32 zero bytes before a chain''s first row) followed by audit_row_content(row)';
COMMENT ON SEQUENCE durable_ledger.audit_chain_seq IS
    'the audit log''s hash chains: a backend takes the next one for the rows it writes';
COMMENT ON TABLE durable_ledger.audit_anchors IS
    'where purge_audit last cut each hash chain: the last row it removed, which the chain''s first remaining row links to';
COMMENT ON COLUMN durable_ledger.audit_anchors.chain IS
    'the chain';
COMMENT ON COLUMN durable_ledger.audit_anchors.chain_seq IS
    'the chain_seq of the last row removed';
COMMENT ON COLUMN durable_ledger.audit_anchors.row_hash IS
    'that row''s row_hash';
COMMENT ON COLUMN durable_ledger.audit_anchors.purged_at IS
    'when purge_audit removed it';
COMMENT ON COLUMN durable_ledger.audit_anchors.purged_by IS
    'who purged, as named to purge_audit';
COMMENT ON TABLE durable_ledger.token_leases IS
    'one row per token lease: an epoch of a run, held by whoever has the token until it expires (by the server''s clock), is released, or a later epoch supersedes it';
COMMENT ON COLUMN durable_ledger.token_leases.run IS
    'the run';
COMMENT ON COLUMN durable_ledger.token_leases.epoch IS
    'the run''s lease epoch it holds';
COMMENT ON COLUMN durable_ledger.token_leases.token_sha256 IS
    'the SHA-256 of the token; the token itself is never stored';
COMMENT ON COLUMN durable_ledger.token_leases.holder IS
    'the caller''s own name for itself, as given to take_lease';
COMMENT ON COLUMN durable_ledger.token_leases.ttl IS
    'what renew_lease extends it by, by default';
COMMENT ON COLUMN durable_ledger.token_leases.taken_at IS
    'when take_lease took it';
COMMENT ON COLUMN durable_ledger.token_leases.expires_at IS
    'when it expires, by the server''s clock (the latest renewal''s); break_lease sets it to the moment of breaking';
COMMENT ON COLUMN durable_ledger.token_leases.released_at IS
    'when release_lease ended it; NULL while it was not released';
COMMENT ON TABLE durable_ledger.token_lease_calls IS
    'the counters of token leases'' epochs, whose calls may come from any backend: kept here, and rolled back with the transaction of the call';
COMMENT ON COLUMN durable_ledger.token_lease_calls.run IS
    'the run';
COMMENT ON COLUMN durable_ledger.token_lease_calls.epoch IS
    'the token lease''s epoch';
COMMENT ON COLUMN durable_ledger.token_lease_calls.call IS
    'what is counted: SHA-256 of the tool, a zero byte and the canonical args (identical calls), or of the tool, a zero byte and a name that begins with a zero byte (a divergence counter)';
COMMENT ON COLUMN durable_ledger.token_lease_calls.calls IS
    'the count so far in the epoch';
COMMENT ON TABLE durable_ledger.tools IS
    'the tools registry: what admins declared of each tool (register_tool, change_tool, retire_tool), every change audited';
COMMENT ON COLUMN durable_ledger.tools.tool IS
    'the tool''s name, as calls give it';
COMMENT ON COLUMN durable_ledger.tools.side_effecting IS
    'true: the tool changes the world; false: a read-only tool, registered for review (begin_recorded may record only such a tool)';
COMMENT ON COLUMN durable_ledger.tools.divergence IS
    'pause, warn or off: how a later attempt''s drifted call of the tool is handled';
COMMENT ON COLUMN durable_ledger.tools.key_fields IS
    'the fields of args that make a call''s identity (its key and its count); NULL: all of args';
COMMENT ON COLUMN durable_ledger.tools.note IS
    'the note last given to register_tool, change_tool or retire_tool';
COMMENT ON COLUMN durable_ledger.tools.registered_by IS
    'who registered it';
COMMENT ON COLUMN durable_ledger.tools.registered_at IS
    'when it was registered';
COMMENT ON COLUMN durable_ledger.tools.changed_by IS
    'who changed it last (change_tool)';
COMMENT ON COLUMN durable_ledger.tools.changed_at IS
    'when it was changed last';
COMMENT ON COLUMN durable_ledger.tools.retired_by IS
    'who retired it: a retired tool is executed no more; NULL while it is not retired';
COMMENT ON COLUMN durable_ledger.tools.retired_at IS
    'when it was retired';
COMMENT ON TABLE durable_ledger.policy IS
    'what a deployment allows for tools nobody registered: at most one row, changed by admins with set_unregistered_tools and set_unregistered_divergence and audited; no row: allow and pause';
COMMENT ON COLUMN durable_ledger.policy.singleton IS
    'always true: the table has one row at most';
COMMENT ON COLUMN durable_ledger.policy.unregistered_tools IS
    'allow, warn or refuse: whether a tool nobody registered may execute';
COMMENT ON COLUMN durable_ledger.policy.changed_by IS
    'who made the latest change of either setting';
COMMENT ON COLUMN durable_ledger.policy.changed_at IS
    'when';
COMMENT ON COLUMN durable_ledger.policy.note IS
    'the note of the latest change';
COMMENT ON COLUMN durable_ledger.policy.unregistered_divergence IS
    'pause, warn or off: how a later attempt''s drifted call of a tool nobody registered is handled';
COMMENT ON TABLE durable_ledger.divergences IS
    'drifted calls paused for a person: a later attempt''s call that the run''s earlier attempts did not make, while an earlier effect of the tool was not replayed yet';
COMMENT ON COLUMN durable_ledger.divergences.key IS
    'the drifted call''s key (derived, or a new call id); no effect has it until a verdict of distinct lets the call execute';
COMMENT ON COLUMN durable_ledger.divergences.run IS
    'the run';
COMMENT ON COLUMN durable_ledger.divergences.lease_epoch IS
    'the attempt (lease epoch) that made the call';
COMMENT ON COLUMN durable_ledger.divergences.tool IS
    'the tool called';
COMMENT ON COLUMN durable_ledger.divergences.args IS
    'the call''s arguments, as given';
COMMENT ON COLUMN durable_ledger.divergences.occurrence IS
    'which identical call of its lease epoch it was; 0: a new call id (begin_effect''s call_id) with an earlier effect''s arguments';
COMMENT ON COLUMN durable_ledger.divergences.candidate_key IS
    'the earlier effect it may duplicate';
COMMENT ON COLUMN durable_ledger.divergences.detected_at IS
    'when the call was paused';
COMMENT ON COLUMN durable_ledger.divergences.verdict IS
    'same or distinct; NULL until a person decides (resolve_divergence)';
COMMENT ON COLUMN durable_ledger.divergences.same_as IS
    'with same: the effect whose outcome the call replays';
COMMENT ON COLUMN durable_ledger.divergences.resolved_by IS
    'who gave the verdict';
COMMENT ON COLUMN durable_ledger.divergences.resolved_at IS
    'when';
COMMENT ON COLUMN durable_ledger.divergences.resolution_note IS
    'resolve_divergence''s note';
COMMENT ON COLUMN durable_ledger.audit_heads.chain IS
    'the chain';
COMMENT ON COLUMN durable_ledger.audit_heads.chain_seq IS
    'the chain_seq of its newest row';
COMMENT ON COLUMN durable_ledger.audit_heads.id IS
    'that row''s id';
COMMENT ON COLUMN durable_ledger.audit_heads.logged_at IS
    'when that row was logged';
COMMENT ON COLUMN durable_ledger.audit_heads.row_hash IS
    'that row''s row_hash, in hexadecimal';
COMMENT ON VIEW durable_ledger.leases IS
    'live leases of both kinds: session leases (lease_locks, matched to their run) and token leases not expired, released or superseded (by the server''s clock); on a hot standby, the epochs taken and not released, not judged';
COMMENT ON COLUMN durable_ledger.leases.run IS
    'the run held; NULL for a session lock whose run was never recorded (its acquiring transaction rolled back)';
COMMENT ON COLUMN durable_ledger.leases.holder_pid IS
    'the backend that holds a session lease; NULL for a token lease';
COMMENT ON COLUMN durable_ledger.leases.lease_epoch IS
    'the epoch it holds; NULL for a session lock whose acquiring transaction rolled back';
COMMENT ON COLUMN durable_ledger.leases.holder_role IS
    'the role that took it, as after SET ROLE';
COMMENT ON COLUMN durable_ledger.leases.application_name IS
    'the holder''s application_name (a token lease''s: of the session that took it)';
COMMENT ON COLUMN durable_ledger.leases.client_addr IS
    'the holder''s client address (a token lease''s: of the session that took it)';
COMMENT ON COLUMN durable_ledger.leases.since IS
    'when its epoch began';
COMMENT ON COLUMN durable_ledger.leases.backend_state IS
    'the state of a session lease''s backend, from pg_stat_activity; NULL for a token lease';
COMMENT ON COLUMN durable_ledger.leases.lock_key IS
    'the run''s lock key (runs.lock_key)';
COMMENT ON COLUMN durable_ledger.leases.liveness IS
    'live, or not judged on a standby';
COMMENT ON COLUMN durable_ledger.leases.kind IS
    'session or token';
COMMENT ON COLUMN durable_ledger.leases.holder IS
    'a token lease''s holder, as given to take_lease';
COMMENT ON COLUMN durable_ledger.leases.expires_at IS
    'when a token lease expires, by the server''s clock';
COMMENT ON VIEW durable_ledger.unresolved IS
    'what needs a person: effects unknown, started under a lease that is no longer live, or flagged by a report, and drifted calls without a verdict; read through unsettled, so it costs what waits, not what the ledger holds';
COMMENT ON COLUMN durable_ledger.unresolved.key IS
    'the effect''s key, or the drifted call''s';
COMMENT ON COLUMN durable_ledger.unresolved.run IS
    'the run';
COMMENT ON COLUMN durable_ledger.unresolved.tool IS
    'the tool called';
COMMENT ON COLUMN durable_ledger.unresolved.status IS
    'the effect''s status (unknown for a started effect whose lease has ended); NULL for a drifted call, for which nothing was recorded';
COMMENT ON COLUMN durable_ledger.unresolved.conflict IS
    'true: flagged by a report that contradicts the recorded outcome, or names no attempt where that is ambiguous';
COMMENT ON COLUMN durable_ledger.unresolved.reason IS
    'what a person must decide, in a sentence';
COMMENT ON COLUMN durable_ledger.unresolved.created_at IS
    'when the effect''s current attempt began, or the drifted call was paused';
COMMENT ON COLUMN durable_ledger.unresolved.age IS
    'how long ago that was';
COMMENT ON COLUMN durable_ledger.unresolved.args IS
    'the call''s arguments';
COMMENT ON COLUMN durable_ledger.unresolved.meta IS
    'the caller''s meta of the current attempt; NULL for a drifted call';
COMMENT ON COLUMN durable_ledger.unresolved.business_key IS
    'true for a business key; false for a derived key and a drifted call';
COMMENT ON COLUMN durable_ledger.unresolved.occurrence IS
    'which identical call of its lease epoch it was; NULL for a business key';
COMMENT ON COLUMN durable_ledger.unresolved.attempt IS
    'the current attempt, which resolve_effect should be given; NULL for a drifted call';
COMMENT ON COLUMN durable_ledger.unresolved.lease_epoch IS
    'the lease epoch that started the current attempt, or made the drifted call';
COMMENT ON COLUMN durable_ledger.unresolved.may_duplicate IS
    'a drifted call''s: the earlier effect it may duplicate';
COMMENT ON COLUMN durable_ledger.unresolved.run_abandoned_at IS
    'when a person abandoned the run; NULL: not abandoned';
COMMENT ON COLUMN durable_ledger.unresolved.downstream_key IS
    'the key the provider was given (what a reconciler asks it about): key for the first attempt of a derived key, else key#attempt; NULL for a drifted call';
COMMENT ON COLUMN durable_ledger.unresolved.reconcile_grace IS
    'when the tool is reconciled by workers (set_reconcile): how long after an unknown outcome was found unknown a worker may settle it from the provider''s record (reconcile_effect); NULL: a person decides';
COMMENT ON COLUMN durable_ledger.metrics.session_leases IS
    'session leases held in this database (lease_locks)';
COMMENT ON COLUMN durable_ledger.metrics.token_leases IS
    'token leases neither released nor expired';
COMMENT ON COLUMN durable_ledger.metrics.token_leases_expired IS
    'token leases that expired without being released';
COMMENT ON COLUMN durable_ledger.metrics.unresolved IS
    'the rows of unresolved: what waits for a person';
COMMENT ON COLUMN durable_ledger.metrics.unresolved_oldest_seconds IS
    'the age of the oldest of them, in seconds; 0 when there is none';
COMMENT ON COLUMN durable_ledger.metrics.counters_kept IS
    'whether metrics_events() counts events (durable_ledger is in shared_preload_libraries)';

-- ---------------------------------------------------------------------------
-- "It did not happen: do it again."  A person who checked and found that an
-- effect's attempt did not happen says so by name with retry_effect(), bound
-- to that attempt; the next call of the key executes the next attempt, under
-- a new provider key (key#attempt), for a derived key as for a business key
-- (a derived key's failure is otherwise replayed for ever).  The column
-- comes last, as a fresh install has it.
-- ---------------------------------------------------------------------------
ALTER TABLE durable_ledger.effects
    ADD COLUMN execute_again boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN durable_ledger.effects.execute_again IS
    'true when a person found that the failed current attempt did not happen and asked for it to be made again (retry_effect): the next call executes the next attempt';

-- the people's decisions, by kind and time, include the new one
DROP INDEX durable_ledger.audit_log_events_idx;
CREATE INDEX audit_log_events_idx ON durable_ledger.audit_log (event, logged_at)
    WHERE event IN ('resolved', 'lease_broken', 'divergence_resolved', 'run_abandoned',
                    'run_forked', 'tool_registered', 'tool_changed', 'tool_retired',
                    'policy_changed', 'purged', 'audit_purged', 'replay', 'retry_allowed',
                    'reconciled');

CREATE FUNCTION durable_ledger.retry_effect(key text, attempt integer, resolved_by text,
                                            note text DEFAULT NULL)
RETURNS durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_retry_effect_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.retry_effect(text, integer, text, text) IS
    'a named person''s finding that the given attempt of an effect did not happen, and that it is to be made again: the next call executes the next attempt under a new provider key';
REVOKE ALL ON FUNCTION durable_ledger.retry_effect(text, integer, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION durable_ledger.retry_effect(text, integer, text, text)
    TO durable_ledger_admin;

-- ---------------------------------------------------------------------------
-- Reconcilers.  A worker's record of what the provider's own record says of
-- an unknown outcome, for a tool an admin made reconcilable
-- (docs/reference.md, "Reconcilers").
-- ---------------------------------------------------------------------------
CREATE FUNCTION durable_ledger.set_reconcile(tool text, grace interval, changed_by text,
                                             note text DEFAULT NULL)
RETURNS durable_ledger.tools
AS 'MODULE_PATHNAME', 'dl_set_reconcile_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.set_reconcile(text, interval, text, text) IS
    'whether workers may settle an unknown outcome of a registered tool from the provider''s record, and after what grace (NULL: no, a person decides)';

CREATE FUNCTION durable_ledger.reconcile_effect(key text, attempt integer, happened boolean,
                                                evidence jsonb)
RETURNS durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_reconcile_effect_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.reconcile_effect(text, integer, boolean, jsonb) IS
    'a worker''s record of what the provider''s lookup by downstream_key said of the given attempt of an unknown effect: it happened (evidence is its result) or it did not (evidence is its error; the next call executes the next attempt under a new provider key)';

CREATE FUNCTION durable_ledger.reconcilable_from(key text, attempt integer)
RETURNS timestamptz
AS 'MODULE_PATHNAME', 'dl_reconcilable_from_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.reconcilable_from(text, integer) IS
    'from when a worker may reconcile the given attempt of an unknown effect (ask the provider after it, then reconcile_effect); NULL: it may not (not unknown, flagged, another attempt, a tool not reconcilable)';
REVOKE ALL ON FUNCTION durable_ledger.set_reconcile(text, interval, text, text),
                      durable_ledger.reconcile_effect(text, integer, boolean, jsonb),
                      durable_ledger.reconcilable_from(text, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION durable_ledger.set_reconcile(text, interval, text, text)
    TO durable_ledger_admin;
GRANT EXECUTE ON FUNCTION durable_ledger.reconcile_effect(text, integer, boolean, jsonb),
                          durable_ledger.reconcilable_from(text, integer)
    TO durable_ledger_worker;

-- ---------------------------------------------------------------------------
-- Local effects: an effect that is a write in this very database.  Its
-- intent, the tool's writes and its outcome commit in one transaction or not
-- at all, so it is never unknown; a transaction that began one commits only
-- once it is completed or failed (docs/reference.md, "Local effects").  The
-- column comes last, as a fresh install has it.
-- ---------------------------------------------------------------------------
ALTER TABLE durable_ledger.effects
    ADD COLUMN local boolean NOT NULL DEFAULT false;
COMMENT ON COLUMN durable_ledger.effects.local IS
    'begun by begin_local: the current attempt''s intent, the tool''s writes in this database and its outcome committed in one transaction (never unknown)';

CREATE FUNCTION durable_ledger.begin_local(run text, tool text, args jsonb,
                                           business_key text DEFAULT NULL,
                                           meta jsonb DEFAULT NULL,
                                           lease text DEFAULT NULL)
RETURNS durable_ledger.decision
AS 'MODULE_PATHNAME', 'dl_begin_local_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.begin_local(text, text, jsonb, text, jsonb, text) IS
    'as begin_effect, for an effect that is a write in this database made in the same transaction: the transaction commits only with the effect completed or failed, so its intent, writes and outcome commit together or not at all';
REVOKE ALL ON FUNCTION durable_ledger.begin_local(text, text, jsonb, text, jsonb, text)
    FROM PUBLIC;
GRANT EXECUTE ON FUNCTION durable_ledger.begin_local(text, text, jsonb, text, jsonb, text)
    TO durable_ledger_worker;

-- ---------------------------------------------------------------------------
-- Approvals bound to the call: an admin says which calls of a registered
-- tool need a person's approval (a jsonpath predicate on their args); such a
-- call is recorded awaiting_approval and pauses; an approver -- a role of its
-- own, not an admin -- approves it (the next call of its key executes it,
-- once) or rejects it (it is failed and replays as failed).  The columns
-- come last, as a fresh install has them.
-- ---------------------------------------------------------------------------
DO $roles$
BEGIN
    IF NOT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = 'durable_ledger_approver') THEN
        CREATE ROLE durable_ledger_approver NOLOGIN;
    END IF;
END
$roles$;
ALTER DOMAIN durable_ledger.effect_state DROP CONSTRAINT effect_state_check;
ALTER DOMAIN durable_ledger.effect_state ADD CONSTRAINT effect_state_check
    CHECK (VALUE IN ('started', 'completed', 'failed', 'unknown',
                     'awaiting_approval', 'approved'));
ALTER DOMAIN durable_ledger.audit_event DROP CONSTRAINT audit_event_check;
ALTER DOMAIN durable_ledger.audit_event ADD CONSTRAINT audit_event_check
    CHECK (VALUE IN ('lease_acquired', 'lease_released', 'lease_broken',
                     'intent', 'replay', 'pause', 'in_progress',
                     'completed', 'late_completion', 'failed', 'late_failure',
                     'resolved', 'conflict',
                     'tool_registered', 'tool_changed', 'tool_retired',
                     'divergence', 'divergence_resolved', 'run_abandoned', 'run_forked',
                     'carried', 'policy_changed', 'purged', 'audit_purged',
                     'superseded_report', 'history_chained', 'retry_allowed',
                     'reconciled', 'approval_requested', 'approved', 'rejected',
                     'budget_changed', 'model_changed'));
CREATE DOMAIN durable_ledger.approval_state AS text
    CHECK (VALUE IN ('requested', 'approved', 'rejected'));
REVOKE ALL ON TYPE durable_ledger.approval_state FROM PUBLIC;

ALTER TABLE durable_ledger.effects
    ADD COLUMN approval durable_ledger.approval_state,
    ADD COLUMN approver text,
    ADD COLUMN approval_note text;
COMMENT ON COLUMN durable_ledger.effects.status IS
    'started, completed, failed or unknown (effect_status shows a started effect whose lease has ended as unknown); awaiting_approval or approved for a call that needs approval and has not executed';
COMMENT ON COLUMN durable_ledger.effects.approval IS
    'for a call of a tool that needs approval (set_approval): requested, approved or rejected, for the current attempt; NULL: none needed';
COMMENT ON COLUMN durable_ledger.effects.approver IS
    'who approved or rejected the current attempt (approve_effect, reject_effect), as they named themselves';
COMMENT ON COLUMN durable_ledger.effects.approval_note IS
    'the note of approve_effect or reject_effect';
ALTER TABLE durable_ledger.tools ADD COLUMN approval jsonpath;

-- a next attempt records its own args (an approver decides on them); the
-- attempts it replaced keep theirs: until now every attempt had the effect's
ALTER TABLE durable_ledger.past_attempts ADD COLUMN args jsonb;
COMMENT ON COLUMN durable_ledger.past_attempts.args IS
    'the args this attempt was called with (a next attempt records its own in effects: a tool''s key fields leave some out of the key)';
-- The first attempt had the effect's args (1.2 wrote them once), and so had
-- every later one, but of a tool that has or had key fields (the registry's
-- audit rows say so): its later attempts may have been called with others,
-- which nobody recorded.
UPDATE durable_ledger.past_attempts p SET args = e.args
  FROM durable_ledger.effects e
 WHERE e.key OPERATOR(pg_catalog.=) p.key
   AND (p.attempt OPERATOR(pg_catalog.=) 1
        OR (NOT EXISTS (SELECT FROM durable_ledger.tools t
                         WHERE t.tool OPERATOR(pg_catalog.=) e.tool AND t.key_fields IS NOT NULL)
            AND NOT EXISTS (SELECT FROM durable_ledger.audit_log a
                             WHERE a.event OPERATOR(pg_catalog.=) ANY ('{tool_registered,tool_changed}')
                               AND a.detail OPERATOR(pg_catalog.->>) 'tool' OPERATOR(pg_catalog.=) e.tool
                               AND pg_catalog.jsonb_typeof(a.detail OPERATOR(pg_catalog.->) 'key_fields')
                                   OPERATOR(pg_catalog.=) 'array')));

-- history shows each attempt's own args
CREATE OR REPLACE FUNCTION durable_ledger.history(run text)
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
           CASE WHEN p.key IS NOT NULL THEN p.args ELSE COALESCE(e.args, d.args) END,
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
      LEFT JOIN durable_ledger.past_attempts p ON p.key OPERATOR(pg_catalog.=) a.key
                                               AND p.attempt OPERATOR(pg_catalog.=) a.attempt
     WHERE a.run OPERATOR(pg_catalog.=) history.run
     ORDER BY a.id;
END
$fn$;
COMMENT ON COLUMN durable_ledger.tools.approval IS
    'NULL: the tool''s calls execute without approval; else a jsonpath predicate on a call''s args: where it is true (or not a boolean), the call waits for an approver (set_approval, approve_effect)';

-- the approvers' verdicts are people's decisions, asked for by kind and time
DROP INDEX durable_ledger.audit_log_events_idx;
CREATE INDEX audit_log_events_idx ON durable_ledger.audit_log (event, logged_at)
    WHERE event IN ('resolved', 'lease_broken', 'divergence_resolved', 'run_abandoned',
                    'run_forked', 'tool_registered', 'tool_changed', 'tool_retired',
                    'policy_changed', 'purged', 'audit_purged', 'replay', 'retry_allowed',
                    'reconciled', 'approved', 'rejected');

-- what waits for an approver is listed with what waits for other people in
-- unresolved: its last definition, with the budgets' pauses, is below


-- Approvals (docs/reference.md, "Approvals"): an admin says which calls of
-- a tool need a person's approval; an approver approves or rejects the very
-- call recorded.
CREATE FUNCTION durable_ledger.set_approval(tool text, condition jsonpath, changed_by text,
                                            note text DEFAULT NULL)
RETURNS durable_ledger.tools
AS 'MODULE_PATHNAME', 'dl_set_approval_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.set_approval(text, jsonpath, text, text) IS
    'which calls of a registered tool wait for an approver before they execute: those whose args match condition, a jsonpath predicate (''true'': every call); NULL: none; audited as tool_changed';

CREATE FUNCTION durable_ledger.approve_effect(key text, approved_by text, note text DEFAULT NULL)
RETURNS durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_approve_effect_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.approve_effect(text, text, text) IS
    'a named approver''s approval of the call recorded under key: the next call of the key executes it, once; refused to the role that made the call';

CREATE FUNCTION durable_ledger.reject_effect(key text, rejected_by text, note text DEFAULT NULL)
RETURNS durable_ledger.effects
AS 'MODULE_PATHNAME', 'dl_reject_effect_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.reject_effect(text, text, text) IS
    'a named approver''s refusal of the call recorded under key: it is failed, and replays as failed';
REVOKE ALL ON FUNCTION durable_ledger.set_approval(text, jsonpath, text, text),
                      durable_ledger.approve_effect(text, text, text),
                      durable_ledger.reject_effect(text, text, text) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION durable_ledger.set_approval(text, jsonpath, text, text)
    TO durable_ledger_admin;
GRANT USAGE ON SCHEMA durable_ledger TO durable_ledger_approver;
GRANT USAGE ON TYPE durable_ledger.decision, durable_ledger.lease,
                    durable_ledger.effect_state, durable_ledger.audit_event,
                    durable_ledger.lease_kind, durable_ledger.divergence_policy,
                    durable_ledger.divergence_verdict,
                    durable_ledger.unregistered_tools_policy
    TO durable_ledger_approver;
GRANT USAGE ON TYPE durable_ledger.approval_state
    TO durable_ledger_worker, durable_ledger_auditor, durable_ledger_admin,
       durable_ledger_approver;
GRANT SELECT ON durable_ledger.effects, durable_ledger.unresolved TO durable_ledger_approver;
GRANT EXECUTE ON FUNCTION
    durable_ledger.approve_effect(text, text, text),
    durable_ledger.reject_effect(text, text, text)
    TO durable_ledger_approver;

-- ---------------------------------------------------------------------------
-- Budgets and the model of each attempt (docs/reference.md, "Budgets" and
-- "The model that answered"): a registered tool's executions per run (and
-- in a window), every run's attempts, each run's own where an admin raised
-- them; a call that would pass one pauses, listed in unresolved.  Each
-- attempt's model (meta.model) is recorded, and a change audited.
-- ---------------------------------------------------------------------------
ALTER TABLE durable_ledger.runs ADD COLUMN max_attempts integer;
COMMENT ON COLUMN durable_ledger.runs.max_attempts IS
    'this run''s budget of attempts (set_run_budget); NULL: the deployment''s (policy.max_run_attempts)';
ALTER TABLE durable_ledger.tools
    ADD COLUMN max_executions integer,
    ADD COLUMN max_in_window integer,
    ADD COLUMN budget_window interval;
COMMENT ON COLUMN durable_ledger.tools.max_executions IS
    'the budget of executions of the tool per run (set_budget): the call that would pass it pauses; NULL: none';
COMMENT ON COLUMN durable_ledger.tools.max_in_window IS
    'at most this many executions per run within budget_window (set_budget); NULL: no window';
COMMENT ON COLUMN durable_ledger.tools.budget_window IS
    'the window of max_in_window';
ALTER TABLE durable_ledger.policy ADD COLUMN max_run_attempts integer;
COMMENT ON COLUMN durable_ledger.policy.max_run_attempts IS
    'the budget of attempts (lease epochs) of every run, unless an admin set a run''s own (set_attempts_budget, set_run_budget): a call that would execute in a later attempt pauses; NULL: none';

-- Budgets (1.3; docs/reference.md, "Budgets"): each run's count of the
-- executions of each budgeted tool, kept by the call that executes (so a
-- rolled-back call counts nothing, and no history is scanned), with the
-- run's own budget where an admin set one, and the call a budget paused.
CREATE TABLE durable_ledger.run_budgets (
    run             text NOT NULL,
    tool            text NOT NULL,
    executions      integer NOT NULL,
    recent          timestamptz[] NOT NULL,
    max_executions  integer,
    max_in_window   integer,
    paused_at       timestamptz,
    paused_key      text,
    paused_args     jsonb,
    paused_epoch    bigint,
    paused_reason   text,
    paused_budget   text,
    PRIMARY KEY (run, tool)
);
-- the budgets that pause a call, found without reading the others
CREATE INDEX run_budgets_paused_idx ON durable_ledger.run_budgets (paused_at)
    WHERE paused_at IS NOT NULL;
COMMENT ON TABLE durable_ledger.run_budgets IS
    'per run and budgeted tool: how many times the tool executed in the run, the run''s own budget where an admin set one (set_run_budget), and the call a budget paused';
COMMENT ON COLUMN durable_ledger.run_budgets.run IS
    'the run';
COMMENT ON COLUMN durable_ledger.run_budgets.tool IS
    'the tool';
COMMENT ON COLUMN durable_ledger.run_budgets.executions IS
    'how many calls of the tool executed in the run while it had a budget (a replay or a pause is no execution)';
COMMENT ON COLUMN durable_ledger.run_budgets.recent IS
    'when the latest executions began, at most max_in_window of them: what the window counts';
COMMENT ON COLUMN durable_ledger.run_budgets.max_executions IS
    'this run''s budget of executions of the tool (set_run_budget); NULL: the tool''s';
COMMENT ON COLUMN durable_ledger.run_budgets.max_in_window IS
    'this run''s budget of executions within the tool''s window; NULL: the tool''s';
COMMENT ON COLUMN durable_ledger.run_budgets.paused_at IS
    'when a budget last paused a call of the tool in the run; NULL once a call of the tool in the run executes, or an admin changes the budget that paused it (set_run_budget, set_budget, set_attempts_budget)';
COMMENT ON COLUMN durable_ledger.run_budgets.paused_key IS
    'the paused call''s key (nothing is recorded under it)';
COMMENT ON COLUMN durable_ledger.run_budgets.paused_args IS
    'the paused call''s arguments';
COMMENT ON COLUMN durable_ledger.run_budgets.paused_epoch IS
    'the attempt (lease epoch) that made it';
COMMENT ON COLUMN durable_ledger.run_budgets.paused_reason IS
    'the budget that paused it, and the count';
COMMENT ON COLUMN durable_ledger.run_budgets.paused_budget IS
    'which budget paused it: executions, window or attempts';

-- The model each attempt of a run called with (meta.model of its first call
-- that names one), and the earlier attempts' when it changed.
CREATE TABLE durable_ledger.run_models (
    run             text NOT NULL,
    lease_epoch     bigint NOT NULL,
    model           text NOT NULL,
    changed_from    text,
    recorded_at     timestamptz NOT NULL,
    PRIMARY KEY (run, lease_epoch)
);
COMMENT ON TABLE durable_ledger.run_models IS
    'per attempt of a run: the model its calls named (meta.model), recorded by its first call that named one';
COMMENT ON COLUMN durable_ledger.run_models.run IS
    'the run';
COMMENT ON COLUMN durable_ledger.run_models.lease_epoch IS
    'the attempt (lease epoch)';
COMMENT ON COLUMN durable_ledger.run_models.model IS
    'the model, as meta.model names it';
COMMENT ON COLUMN durable_ledger.run_models.changed_from IS
    'the model of the run''s latest earlier attempt that named one, when it was another (model_changed); NULL: the same, or none';
COMMENT ON COLUMN durable_ledger.run_models.recorded_at IS
    'when';

SELECT pg_catalog.pg_extension_config_dump('durable_ledger.run_budgets', '');
SELECT pg_catalog.pg_extension_config_dump('durable_ledger.run_models', '');
REVOKE ALL ON durable_ledger.run_budgets, durable_ledger.run_models FROM PUBLIC;
GRANT SELECT ON durable_ledger.run_budgets, durable_ledger.run_models TO durable_ledger_auditor;

CREATE OR REPLACE VIEW durable_ledger.unresolved AS
SELECT e.key,
       e.run,
       e.tool,
       CASE WHEN j.ended THEN 'unknown'
            ELSE e.status END::durable_ledger.effect_state AS status,
       e.conflict,
       CASE
           WHEN e.conflict THEN
               'a report was kept for a person: it contradicts the recorded outcome, or names no attempt where that is ambiguous; a person must decide which is true'
           WHEN e.status OPERATOR(pg_catalog.=) 'awaiting_approval' THEN
               'awaiting approval: the call of a tool that needs approval was recorded and has not executed; an approver decides with durable_ledger.approve_effect() or durable_ledger.reject_effect()'
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
       -- the key the provider was given: a business key's, and any attempt
       -- after the first, names its attempt
       CASE WHEN e.business_key OR e.attempt OPERATOR(pg_catalog.>) 1
            THEN pg_catalog.concat(e.key, '#', e.attempt)
            ELSE e.key END                          AS downstream_key,
       -- a reconciler may settle an unknown outcome of the tool, this long
       -- after it was found unknown (a flagged one waits for a person)
       CASE WHEN NOT e.conflict THEN (
            SELECT t.reconcile_grace FROM durable_ledger.tools t
             WHERE t.tool OPERATOR(pg_catalog.=) e.tool) END AS reconcile_grace
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
                       SELECT 1 FROM durable_ledger.lease_locks l
                        WHERE l.pid OPERATOR(pg_catalog.=) cur.holder_pid
                          AND l.lock_key OPERATOR(pg_catalog.=) cur.lock_key)
               END AS ended) j
 WHERE e.conflict
    OR e.status OPERATOR(pg_catalog.=) 'unknown'
    OR e.status OPERATOR(pg_catalog.=) 'awaiting_approval'
    OR j.ended
    OR j.not_judged
UNION ALL
SELECT d.key,
       d.run,
       d.tool,
       NULL::durable_ledger.effect_state,
       false,
       CASE WHEN d.occurrence OPERATOR(pg_catalog.=) 0
            THEN 'a later attempt called this tool under a new call id with the arguments of an earlier effect (may_duplicate): the model may have named that call anew; a person must say whether it is the same operation (durable_ledger.resolve_divergence(key, ''same'', ...): its outcome is replayed) or distinct (''distinct'': it is executed)'
            ELSE 'a later attempt made a call of this tool that the run''s earlier attempts did not make, while an earlier effect of the tool (may_duplicate) was not replayed yet: a person must say whether it is the same operation (durable_ledger.resolve_divergence(key, ''same'', ...): its outcome is replayed) or distinct (''distinct'': it is executed)'
       END,
       d.detected_at,
       pg_catalog.now() OPERATOR(pg_catalog.-) d.detected_at,
       d.args,
       NULL,
       d.occurrence OPERATOR(pg_catalog.=) 0,  -- a call id is a business key
       CASE WHEN d.occurrence OPERATOR(pg_catalog.<>) 0 THEN d.occurrence END,
       NULL,
       d.lease_epoch,
       d.candidate_key,
       ab.abandoned_at,
       NULL,
       NULL::interval
  FROM durable_ledger.divergences d
  LEFT JOIN durable_ledger.runs ab ON ab.run OPERATOR(pg_catalog.=) d.run
 WHERE d.verdict IS NULL
   AND NOT EXISTS (SELECT FROM durable_ledger.effects x
                    WHERE x.key OPERATOR(pg_catalog.=) d.key)  -- executed meanwhile (policy off)
UNION ALL
SELECT b.paused_key,
       b.run,
       b.tool,
       NULL::durable_ledger.effect_state,
       false,
       b.paused_reason,
       b.paused_at,
       pg_catalog.now() OPERATOR(pg_catalog.-) b.paused_at,
       b.paused_args,
       NULL,
       false,
       NULL,
       NULL,
       b.paused_epoch,
       NULL,
       ab.abandoned_at,
       NULL,
       NULL::interval
  FROM durable_ledger.run_budgets b
  LEFT JOIN durable_ledger.runs ab ON ab.run OPERATOR(pg_catalog.=) b.run
 WHERE b.paused_at IS NOT NULL
   AND NOT EXISTS (SELECT FROM durable_ledger.effects x   -- the paused call executed since
                    WHERE x.key OPERATOR(pg_catalog.=) b.paused_key
                      AND x.created_at OPERATOR(pg_catalog.>) b.paused_at
                      AND x.status OPERATOR(pg_catalog.<>) ALL ('{awaiting_approval,approved}'));
COMMENT ON VIEW durable_ledger.unresolved IS
    'what needs a person: effects unknown, started under a lease that is no longer live, flagged by a report or awaiting approval, drifted calls without a verdict, and calls a budget paused; read through unsettled, so it costs what waits, not what the ledger holds';
COMMENT ON COLUMN durable_ledger.unresolved.status IS
    'the effect''s status (unknown for a started effect whose lease has ended); NULL for a drifted call or a call a budget paused, for which nothing was recorded';

-- Budgets (docs/reference.md, "Budgets").
CREATE FUNCTION durable_ledger.set_budget(tool text, max_executions integer, changed_by text,
                                          note text DEFAULT NULL,
                                          max_in_window integer DEFAULT NULL,
                                          budget_window interval DEFAULT NULL)
RETURNS durable_ledger.tools
AS 'MODULE_PATHNAME', 'dl_set_budget_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.set_budget(text, integer, text, text, integer, interval) IS
    'a registered tool''s budget per run: at most max_executions executions (NULL: no limit), and at most max_in_window within budget_window; the call that would pass it pauses; audited as tool_changed';

CREATE FUNCTION durable_ledger.set_attempts_budget(max_attempts integer, changed_by text,
                                                   note text DEFAULT NULL)
RETURNS integer
AS 'MODULE_PATHNAME', 'dl_set_attempts_budget_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.set_attempts_budget(integer, text, text) IS
    'every run''s budget of attempts (lease epochs), unless it has its own: a call that would execute in a later attempt pauses; NULL: none; returns the budget it replaces; audited as policy_changed';

CREATE FUNCTION durable_ledger.set_run_budget(run text, changed_by text, note text DEFAULT NULL,
                                              tool text DEFAULT NULL,
                                              max_executions integer DEFAULT NULL,
                                              max_in_window integer DEFAULT NULL,
                                              max_attempts integer DEFAULT NULL)
RETURNS void
AS 'MODULE_PATHNAME', 'dl_set_run_budget_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;
COMMENT ON FUNCTION durable_ledger.set_run_budget(text, text, text, text, integer, integer, integer) IS
    'one run''s own budgets, where a person raises (or lowers) what paused it: of a budgeted tool''s executions, in its window, of attempts; what is NULL is kept; the pauses it answers are listed no more; audited as budget_changed';
REVOKE ALL ON FUNCTION
    durable_ledger.set_budget(text, integer, text, text, integer, interval),
    durable_ledger.set_attempts_budget(integer, text, text),
    durable_ledger.set_run_budget(text, text, text, text, integer, integer, integer) FROM PUBLIC;
GRANT EXECUTE ON FUNCTION
    durable_ledger.set_budget(text, integer, text, text, integer, interval),
    durable_ledger.set_attempts_budget(integer, text, text),
    durable_ledger.set_run_budget(text, text, text, text, integer, integer, integer)
    TO durable_ledger_admin;
