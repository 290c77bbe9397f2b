/* durable_ledger--1.2--1.3.sql: from 1.2 to 1.3 (ALTER EXTENSION durable_ledger UPDATE). */

\echo Use "ALTER EXTENSION durable_ledger UPDATE TO '1.3'" to load this file. \quit

-- 1.3 is built up by several changes; this script grows with them until 1.3 is
-- released.  Until then a fresh install runs durable_ledger--1.2.sql and this
-- script (PostgreSQL's own update path).

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
CREATE OR REPLACE FUNCTION durable_ledger.begin_effect(run text, tool text, args jsonb,
                                                       business_key text DEFAULT NULL,
                                                       meta jsonb DEFAULT NULL,
                                                       lease text DEFAULT NULL)
RETURNS durable_ledger.decision
AS 'MODULE_PATHNAME', 'dl_begin_effect_1_3'
LANGUAGE C VOLATILE PARALLEL UNSAFE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp;

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
END
$chain_history$;
ALTER TABLE durable_ledger.audit_log ENABLE TRIGGER audit_log_append_only;

-- Recomputes every chain; one row per chain whose first broken link it names,
-- and one per kept head that is gone or changed.
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
    'recomputes the audit log''s hash chains (chain 0: the rows written before chains began, chained at the update to 1.3): the first broken link of each chain, chains no backend was given, rows without a chain, and every kept head (audit_heads rows as a JSON array) that is gone or changed; no rows: nothing was found';

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

-- ---------------------------------------------------------------------------
-- Canonical args have a bounded cost: at most 8 times the size of args as
-- jsonb stores them, plus 1 kB (a number is written out in full); larger args
-- are refused at once (22023).  Every key ever derived is unchanged.
-- ---------------------------------------------------------------------------
CREATE OR REPLACE FUNCTION durable_ledger.canonical_args(args jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'dl_canonical_args_1_3'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

CREATE OR REPLACE FUNCTION durable_ledger.effect_key(run text, tool text, args jsonb, occurrence integer)
RETURNS text
AS 'MODULE_PATHNAME', 'dl_effect_key_1_3'
LANGUAGE C STABLE PARALLEL RESTRICTED;

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
-- unresolved says what a flagged effect's report is: contradicting, or (1.3)
-- naming no attempt where that is ambiguous.
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
