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
