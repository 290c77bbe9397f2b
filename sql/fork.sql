-- fork: fork_run(source_run, new_run, up_to, forked_by, note) starts a new run
-- that carries the source run's effects up to the one it names (in the order
-- they were begun), each under the new run's key for the same call, with its
-- outcome and the effect it came from.  The new run's first attempt replays
-- them and executes what comes after; business keys keep their own identity
-- (a completed one replays in any run); nothing of the source run changes.
-- Only settled effects are carried; admins only; audited.
\set VERBOSITY default

CREATE FUNCTION regress_fork_call(r text, t text, a jsonb, outcome jsonb DEFAULT '{"ok": true}',
                             bk text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE d durable_ledger.decision;
BEGIN
    d := durable_ledger.begin_effect(r, t, a, bk);
    IF d.decision = 'execute' AND outcome IS NOT NULL THEN
        IF outcome ? 'error' THEN
            PERFORM durable_ledger.fail_effect(d.key, outcome -> 'error', d.attempt);
        ELSE
            PERFORM durable_ledger.complete_effect(d.key, outcome, d.attempt);
        END IF;
    END IF;
    RETURN d.decision || coalesce('#' || d.occurrence, '') || coalesce(' ' || coalesce(d.result, d.error)::text, '');
END $$;

SELECT tool FROM durable_ledger.register_tool('fk.pay', 'maria');

-- the source run: six steps, one of them a business key
SELECT durable_ledger.acquire_run('fk-src');
SELECT regress_fork_call('fk-src', 'fk.pay', '{"invoice": "A"}', '{"paid": "A1"}') AS step1,
       regress_fork_call('fk-src', 'fk.mail', '{"to": "x"}', '{"error": {"code": "bounced"}}') AS step2,
       regress_fork_call('fk-src', 'fk.pay', '{"invoice": "A"}', '{"paid": "A2"}') AS step3,
       regress_fork_call('fk-src', 'fk.ticket', '{"subject": "refund"}', '{"ticket": 7}') AS step4,
       regress_fork_call('fk-src', 'fk.ship', '{"order": 9}', '{"shipped": true}', 'SHIP-9') AS step5,
       regress_fork_call('fk-src', 'fk.pay', '{"invoice": "B"}', '{"paid": "B1"}') AS step6;
SELECT durable_ledger.release_run('fk-src');
SELECT md5(string_agg(e::text, ',' ORDER BY key)) AS source_before
  FROM durable_ledger.effects e WHERE run = 'fk-src' \gset
SELECT count(*) AS source_audit_before FROM durable_ledger.audit_log WHERE run = 'fk-src' \gset
SELECT durable_ledger.effect_key('fk-src', 'fk.ticket', '{"subject": "refund"}', 1) AS step4 \gset

-- fork it up to step 4
SELECT durable_ledger.fork_run('fk-src', 'fk-new', :'step4', 'maria', 'redo from step 5');
SELECT n.tool, n.occurrence, n.status, coalesce(n.result, n.error) AS outcome, n.lease_epoch,
       n.key = durable_ledger.effect_key('fk-new', n.tool, n.args, n.occurrence) AS new_runs_key,
       s.run AS carries_from, s.key = n.forked_from AS carries
  FROM durable_ledger.effects n JOIN durable_ledger.effects s ON s.key = n.forked_from
 WHERE n.run = 'fk-new' ORDER BY n.created_at;
SELECT epochs, released_at IS NOT NULL AS held_by_nobody, forked_from, forked_up_to = :'step4' AS up_to
  FROM durable_ledger.runs WHERE run = 'fk-new';
SELECT event, lease_epoch, detail ->> 'source_run' AS source, detail ->> 'effects' AS effects,
       detail ->> 'forked_by' AS forked_by, detail ->> 'note' AS note
  FROM durable_ledger.audit_log WHERE run = 'fk-new';
-- nothing of the source run changed
SELECT md5(string_agg(e::text, ',' ORDER BY key)) = :'source_before' AS source_unchanged,
       (SELECT count(*) FROM durable_ledger.audit_log WHERE run = 'fk-src') = :source_audit_before AS source_history_unchanged
  FROM durable_ledger.effects e WHERE run = 'fk-src';

-- the new run's first attempt (epoch 2) replays steps 1 to 4 and the business
-- key, and executes step 6, which was not carried
SELECT durable_ledger.acquire_run('fk-new');
SELECT (SELECT lease_epoch FROM durable_ledger.audit_log WHERE run = 'fk-new' AND event = 'lease_acquired') AS epoch;
SELECT regress_fork_call('fk-new', 'fk.pay', '{"invoice": "A"}') AS step1,
       regress_fork_call('fk-new', 'fk.mail', '{"to": "x"}') AS step2,
       regress_fork_call('fk-new', 'fk.pay', '{"invoice": "A"}') AS step3,
       regress_fork_call('fk-new', 'fk.ticket', '{"subject": "refund"}') AS step4;
SELECT regress_fork_call('fk-new', 'fk.ship', '{"order": 9}', bk => 'SHIP-9') AS step5,
       regress_fork_call('fk-new', 'fk.pay', '{"invoice": "B"}', '{"paid": "B-again"}') AS step6;
SELECT durable_ledger.release_run('fk-new');

-- a forked run is forked like any other: what it carried comes along
SELECT durable_ledger.fork_run('fk-new', 'fk-chain',
         durable_ledger.effect_key('fk-new', 'fk.pay', '{"invoice": "B"}', 1), 'maria') AS carried;
SELECT durable_ledger.acquire_run('fk-chain');
SELECT regress_fork_call('fk-chain', 'fk.pay', '{"invoice": "A"}') AS step1,
       regress_fork_call('fk-chain', 'fk.mail', '{"to": "x"}') AS step2,
       regress_fork_call('fk-chain', 'fk.pay', '{"invoice": "A"}') AS step3,
       regress_fork_call('fk-chain', 'fk.ticket', '{"subject": "refund"}') AS step4,
       regress_fork_call('fk-chain', 'fk.pay', '{"invoice": "B"}') AS step6;
SELECT durable_ledger.release_run('fk-chain');
-- the new run's history starts with what it carries
SELECT event, tool, outcome FROM durable_ledger.history('fk-chain') LIMIT 6;

-- a forked run's replay that drifts before the end of what it carries pauses
SELECT durable_ledger.fork_run('fk-src', 'fk-drift', :'step4', 'maria');
SELECT durable_ledger.acquire_run('fk-drift');
SELECT regress_fork_call('fk-drift', 'fk.pay', '{"invoice": "A, reworded"}') AS drifted;
SELECT durable_ledger.release_run('fk-drift');

-- an abandoned run is forked like any other
SELECT durable_ledger.abandon_run('fk-src', 'maria', 'forked instead');
SELECT durable_ledger.fork_run('fk-src', 'fk-after-abandon',
                               durable_ledger.effect_key('fk-src', 'fk.pay', '{"invoice": "A"}', 1), 'maria');

-- refused, writing nothing
SELECT durable_ledger.acquire_run('fk-src2');
SELECT regress_fork_call('fk-src2', 'fk.pay', '{"invoice": "A"}') AS settled;
SELECT decision AS in_flight FROM durable_ledger.begin_effect('fk-src2', 'fk.pay', '{"invoice": "B"}');
SELECT count(*) AS audit_rows, (SELECT count(*) FROM durable_ledger.effects) AS effect_rows,
       (SELECT count(*) FROM durable_ledger.runs) AS run_rows FROM durable_ledger.audit_log \gset
SELECT regress_sqlstate(format($$SELECT durable_ledger.fork_run('fk-src2', 'fk-x', %L, 'maria')$$,
       durable_ledger.effect_key('fk-src2', 'fk.pay', '{"invoice": "B"}', 1)));
SELECT regress_sqlstate(format($$SELECT durable_ledger.fork_run('fk-src', 'fk-new', %L, 'maria')$$, :'step4'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.fork_run('fk-src', 'fk-src', %L, 'maria')$$, :'step4'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.fork_run('no-such-run', 'fk-x', %L, 'maria')$$, :'step4'));
SELECT regress_sqlstate($$SELECT durable_ledger.fork_run('fk-src', 'fk-x', 'SHIP-9', 'maria')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.fork_run('fk-src', 'fk-x', 'no-such-key', 'maria')$$);
SELECT regress_sqlstate(format($$SELECT durable_ledger.fork_run('fk-src', 'fk-x', %L, NULL)$$, :'step4'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.fork_run(NULL, 'fk-x', %L, 'maria')$$, :'step4'));
SELECT count(*) = :audit_rows AS no_audit, (SELECT count(*) FROM durable_ledger.effects) = :effect_rows AS no_effects,
       (SELECT count(*) FROM durable_ledger.runs) = :run_rows AS no_runs
  FROM durable_ledger.audit_log;
SELECT durable_ledger.release_run('fk-src2');

CREATE ROLE regress_fk_worker IN ROLE durable_ledger_worker;
SET ROLE regress_fk_worker;
SELECT regress_sqlstate(format($$SELECT durable_ledger.fork_run('fk-src', 'fk-y', %L, 'w')$$, :'step4'));
RESET ROLE;
DROP ROLE regress_fk_worker;

-- a carried recorded call keeps its attempt (2: its first was lost and made
-- again); its replaced attempt stays with the source's effect.  A report on
-- the carried key naming attempt 1 is about a recorded call's lost attempt:
-- kept as superseded (nobody is needed), nothing flagged, whatever it says
SELECT durable_ledger.acquire_run('fk-rec');
SELECT decision, attempt FROM durable_ledger.begin_recorded('fk-rec', 'fk.model', '{"q": 1}');
SELECT durable_ledger.acquire_run('fk-rec');
SELECT (durable_ledger.complete_effect(key, '{"a": 1}', attempt)).attempt AS completed_attempt
  FROM durable_ledger.begin_recorded('fk-rec', 'fk.model', '{"q": 1}');
SELECT durable_ledger.release_run('fk-rec');
SELECT durable_ledger.fork_run('fk-rec', 'fk-rec-new',
         durable_ledger.effect_key('fk-rec', 'fk.model', '{"q": 1}', 1), 'maria') AS carried;
SELECT durable_ledger.effect_key('fk-rec-new', 'fk.model', '{"q": 1}', 1) AS carried_key \gset
SELECT attempt, status, safe_to_redo FROM durable_ledger.effects WHERE key = :'carried_key';
SELECT (durable_ledger.fail_effect(:'carried_key', '{"code": "timeout"}', 1)).status;
SELECT (durable_ledger.complete_effect(:'carried_key', '{"a": 2}', 1)).status;
SELECT status, conflict, result FROM durable_ledger.effects WHERE key = :'carried_key';
SELECT event, attempt, detail ->> 'report' AS report FROM durable_ledger.audit_log
 WHERE key = :'carried_key' AND event <> 'carried' ORDER BY id;
