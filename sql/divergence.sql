-- divergence: a later attempt of a run (a new lease epoch) that makes a call
-- of a tool its run's earlier attempts did not make, while an earlier effect
-- of that tool has not been replayed by this attempt yet, has drifted: with
-- policy pause (the default of a registered side-effecting tool) the call is
-- paused for a person and recorded in durable_ledger.divergences; with warn it
-- is executed with a WARNING and an audited divergence event; with off nothing
-- is checked (tools nobody registered: sql/unregistered).  A person says
-- whether the drifted call is the same as the earlier effect (its outcome is
-- replayed) or distinct (it is executed).  An honest replay (the same calls, in any order,
-- with any number of legitimate repeats, failures retried, unknown outcomes
-- resolved) never trips it, under session and token leases alike.
\set VERBOSITY default

-- one call: its decision (a completed execution reports a result)
CREATE FUNCTION regress_div_call(r text, t text, a jsonb, outcome jsonb DEFAULT '{"ok": true}',
                             token text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE d durable_ledger.decision;
BEGIN
    d := durable_ledger.begin_effect(r, t, a, lease => token);
    IF d.decision = 'execute' AND outcome IS NOT NULL THEN
        PERFORM durable_ledger.complete_effect(d.key, outcome, d.attempt);
    END IF;
    RETURN d.decision || '#' || d.occurrence;
END $$;

SELECT tool, divergence FROM durable_ledger.register_tool('dv.pay', 'maria');
SELECT tool, divergence FROM durable_ledger.register_tool('dv.mail', 'maria', divergence => 'warn');
SELECT tool, divergence FROM durable_ledger.register_tool('dv.lookup', 'maria', side_effecting => false);

-- ===================================================================
-- honest replays never diverge
-- ===================================================================
-- the same calls in the same order, then something new
SELECT durable_ledger.acquire_run('hr-1');
SELECT regress_div_call('hr-1', 'dv.pay', '{"invoice": "A"}'),
       regress_div_call('hr-1', 'dv.pay', '{"invoice": "B"}'),
       regress_div_call('hr-1', 'dv.mail', '{"to": "x"}');
SELECT durable_ledger.acquire_run('hr-1');
SELECT regress_div_call('hr-1', 'dv.pay', '{"invoice": "A"}'),
       regress_div_call('hr-1', 'dv.pay', '{"invoice": "B"}'),
       regress_div_call('hr-1', 'dv.mail', '{"to": "x"}'),
       regress_div_call('hr-1', 'dv.pay', '{"invoice": "C"}');
-- in another order, then something new
SELECT durable_ledger.acquire_run('hr-1');
SELECT regress_div_call('hr-1', 'dv.pay', '{"invoice": "C"}'),
       regress_div_call('hr-1', 'dv.mail', '{"to": "x"}'),
       regress_div_call('hr-1', 'dv.pay', '{"invoice": "B"}'),
       regress_div_call('hr-1', 'dv.pay', '{"invoice": "A"}'),
       regress_div_call('hr-1', 'dv.pay', '{"invoice": "D"}');
-- legitimate repeats: the same call made twice is made twice again, a third is new
SELECT durable_ledger.acquire_run('hr-2');
SELECT regress_div_call('hr-2', 'dv.pay', '{"invoice": "A"}'),
       regress_div_call('hr-2', 'dv.pay', '{"invoice": "A"}');
SELECT durable_ledger.acquire_run('hr-2');
SELECT regress_div_call('hr-2', 'dv.pay', '{"invoice": "A"}'),
       regress_div_call('hr-2', 'dv.pay', '{"invoice": "A"}'),
       regress_div_call('hr-2', 'dv.pay', '{"invoice": "A"}');
-- a failure replayed, then retried as a new call
SELECT durable_ledger.acquire_run('hr-3');
SELECT decision, (durable_ledger.fail_effect(key, '{"code": "declined"}')).status
  FROM durable_ledger.begin_effect('hr-3', 'dv.pay', '{"invoice": "A"}');
SELECT durable_ledger.acquire_run('hr-3');
SELECT regress_div_call('hr-3', 'dv.pay', '{"invoice": "A"}'),
       regress_div_call('hr-3', 'dv.pay', '{"invoice": "A"}');
-- an unknown outcome pauses (not a replay); resolved, it replays; then new calls execute
SELECT durable_ledger.acquire_run('hr-4');
SELECT decision FROM durable_ledger.begin_effect('hr-4', 'dv.pay', '{"invoice": "A"}');
SELECT durable_ledger.acquire_run('hr-4');
SELECT regress_div_call('hr-4', 'dv.pay', '{"invoice": "A"}');
SELECT status FROM durable_ledger.resolve_effect(durable_ledger.effect_key('hr-4', 'dv.pay', '{"invoice": "A"}', 1),
                                                 'completed', '{"seen": "at the bank"}', 'maria');
SELECT regress_div_call('hr-4', 'dv.pay', '{"invoice": "A"}'),
       regress_div_call('hr-4', 'dv.pay', '{"invoice": "B"}');
-- a read-only tool (off) is never checked (tools nobody registered are
-- judged as pause since 1.3: sql/unregistered)
SELECT durable_ledger.acquire_run('hr-5');
SELECT regress_div_call('hr-5', 'dv.lookup', '{"q": "acme"}');
SELECT durable_ledger.acquire_run('hr-5');
SELECT regress_div_call('hr-5', 'dv.lookup', '{"q": "ACME Inc"}');
-- each tool keeps its own count: new calls of a tool whose earlier effects are replayed
SELECT durable_ledger.acquire_run('hr-1');
SELECT regress_div_call('hr-1', 'dv.mail', '{"to": "x"}'),
       regress_div_call('hr-1', 'dv.mail', '{"to": "y"}');
-- under token leases too (the counters live in rows)
SELECT (durable_ledger.take_lease('hr-6', '1 minute')).token AS t1 \gset
SELECT regress_div_call('hr-6', 'dv.pay', '{"invoice": "A"}', token => :'t1'),
       regress_div_call('hr-6', 'dv.pay', '{"invoice": "B"}', token => :'t1');
SELECT durable_ledger.release_lease(:'t1');
SELECT (durable_ledger.take_lease('hr-6', '1 minute')).token AS t2 \gset
SELECT regress_div_call('hr-6', 'dv.pay', '{"invoice": "B"}', token => :'t2'),
       regress_div_call('hr-6', 'dv.pay', '{"invoice": "A"}', token => :'t2'),
       regress_div_call('hr-6', 'dv.pay', '{"invoice": "C"}', token => :'t2');
SELECT durable_ledger.release_lease(:'t2');
SELECT count(*) AS divergences_of_honest_replays,
       (SELECT count(*) FROM durable_ledger.audit_log WHERE event = 'divergence') AS divergence_events
  FROM durable_ledger.divergences;

-- ===================================================================
-- a drifted replay pauses (policy pause)
-- ===================================================================
SELECT durable_ledger.acquire_run('dr-1');
SELECT regress_div_call('dr-1', 'dv.pay', '{"invoice": "INV-1", "amount": 4200, "memo": "Thanks"}',
                    '{"payment_id": "pay_1"}');
SELECT durable_ledger.effect_key('dr-1', 'dv.pay', '{"invoice": "INV-1", "amount": 4200, "memo": "Thanks"}', 1) AS earlier_key \gset
SELECT durable_ledger.acquire_run('dr-1');
SELECT key = durable_ledger.effect_key('dr-1', 'dv.pay', '{"invoice": "INV-1", "amount": 4200, "memo": "Thank you"}', 1) AS drifted_key,
       decision, status, occurrence, attempt, position(:'earlier_key' IN reason) > 0 AS reason_names_the_earlier_effect
  FROM durable_ledger.begin_effect('dr-1', 'dv.pay', '{"invoice": "INV-1", "amount": 4200, "memo": "Thank you"}');
SELECT durable_ledger.effect_key('dr-1', 'dv.pay', '{"invoice": "INV-1", "amount": 4200, "memo": "Thank you"}', 1) AS drifted \gset
-- nothing was executed; the drift is recorded, listed for a person and audited
SELECT count(*) AS effects_of_the_run FROM durable_ledger.effects WHERE run = 'dr-1';
SELECT run, lease_epoch, tool, args ->> 'memo' AS memo, occurrence, candidate_key = :'earlier_key' AS candidate,
       verdict, same_as
  FROM durable_ledger.divergences WHERE key = :'drifted';
SELECT key = :'drifted' AS drifted, run, tool, status, conflict, may_duplicate = :'earlier_key' AS may_duplicate,
       occurrence, lease_epoch
  FROM durable_ledger.unresolved WHERE run = 'dr-1';
SELECT event, detail ->> 'may_duplicate' = :'earlier_key' AS names_it, detail ->> 'policy' AS policy,
       lease_epoch
  FROM durable_ledger.audit_log WHERE run = 'dr-1' AND key = :'drifted';
-- asking again pauses again, and records nothing more
SELECT decision, status FROM durable_ledger.begin_effect('dr-1', 'dv.pay', '{"invoice": "INV-1", "amount": 4200, "memo": "Thank you"}');
SELECT count(*) AS divergences FROM durable_ledger.divergences WHERE run = 'dr-1';
SELECT event, detail FROM durable_ledger.audit_log WHERE run = 'dr-1' AND key = :'drifted' ORDER BY id;

-- ... also within the transaction that recorded it (a call remembers that its
-- run has no divergence, cache.c, and forgets it when one is recorded)
SELECT durable_ledger.acquire_run('dr-tx');
SELECT regress_div_call('dr-tx', 'dv.pay', '{"invoice": "INV-1", "amount": 4200, "memo": "Thanks"}');
SELECT durable_ledger.acquire_run('dr-tx');
BEGIN;
SELECT regress_div_call('dr-tx', 'dv.pay', '{"invoice": "INV-1", "amount": 4200, "memo": "Thank you"}') AS first,
       regress_div_call('dr-tx', 'dv.pay', '{"invoice": "INV-1", "amount": 4200, "memo": "Thank you"}') AS again;
COMMIT;
SELECT count(*) AS divergences FROM durable_ledger.divergences WHERE run = 'dr-tx';
SELECT durable_ledger.release_run('dr-tx');
-- a person: it is the same payment.  The call replays the earlier outcome
-- (under the earlier effect's key), and what follows executes.
SELECT verdict, same_as = :'earlier_key' AS same_as_the_earlier, resolved_by, resolution_note
  FROM durable_ledger.resolve_divergence(:'drifted', 'same', 'maria', 'the model reworded the memo');
SELECT key = :'earlier_key' AS earlier_key, decision, status, result
  FROM durable_ledger.begin_effect('dr-1', 'dv.pay', '{"invoice": "INV-1", "amount": 4200, "memo": "Thank you"}');
SELECT regress_div_call('dr-1', 'dv.pay', '{"invoice": "INV-2", "amount": 10, "memo": "x"}');
SELECT count(*) AS payments_executed FROM durable_ledger.effects WHERE run = 'dr-1';
SELECT count(*) AS unresolved FROM durable_ledger.unresolved WHERE run = 'dr-1';
-- ... and in every later attempt too
SELECT durable_ledger.acquire_run('dr-1');
SELECT regress_div_call('dr-1', 'dv.pay', '{"invoice": "INV-1", "amount": 4200, "memo": "Thank you"}'),
       regress_div_call('dr-1', 'dv.pay', '{"invoice": "INV-2", "amount": 10, "memo": "x"}');
SELECT durable_ledger.release_run('dr-1');

-- another person: it is a distinct payment.  The call executes.
SELECT durable_ledger.acquire_run('dr-2');
SELECT regress_div_call('dr-2', 'dv.pay', '{"invoice": "INV-1", "memo": "a"}');
SELECT durable_ledger.acquire_run('dr-2');
SELECT decision FROM durable_ledger.begin_effect('dr-2', 'dv.pay', '{"invoice": "INV-9", "memo": "a"}');
SELECT verdict, same_as FROM durable_ledger.resolve_divergence(
    durable_ledger.effect_key('dr-2', 'dv.pay', '{"invoice": "INV-9", "memo": "a"}', 1), 'distinct', 'ana');
SELECT decision, status FROM durable_ledger.begin_effect('dr-2', 'dv.pay', '{"invoice": "INV-9", "memo": "a"}');
SELECT status FROM durable_ledger.complete_effect(
    durable_ledger.effect_key('dr-2', 'dv.pay', '{"invoice": "INV-9", "memo": "a"}', 1), '{"paid": 9}');
-- in that attempt the earlier payment is still due: the person judged one
-- call, not the ones after it
SELECT decision, position(durable_ledger.effect_key('dr-2', 'dv.pay', '{"invoice": "INV-1", "memo": "a"}', 1) IN reason) > 0
         AS may_duplicate_inv_1
  FROM durable_ledger.begin_effect('dr-2', 'dv.pay', '{"invoice": "INV-10", "memo": "a"}');
-- nor in the attempts after it: the verdict said INV-9 is not INV-1, not that
-- the run will never pay INV-1 again, so a reworded INV-1 in the next attempt
-- pauses (were INV-1 passed over, it would be paid twice), and so does every
-- new call of the tool until the attempt has replayed INV-1
SELECT durable_ledger.acquire_run('dr-2');
SELECT regress_div_call('dr-2', 'dv.pay', '{"invoice": "INV-9", "memo": "a"}') AS replayed,
       regress_div_call('dr-2', 'dv.pay', '{"invoice": "INV-1", "memo": "many thanks"}') AS reworded_inv_1,
       regress_div_call('dr-2', 'dv.pay', '{"invoice": "INV-11", "memo": "a"}') AS new_call;
SELECT count(*) AS inv_1_payments FROM durable_ledger.effects
 WHERE run = 'dr-2' AND args ->> 'invoice' = 'INV-1';
-- once it has replayed INV-1, its new calls execute (INV-11's divergence,
-- recorded, still waits for its verdict)
SELECT regress_div_call('dr-2', 'dv.pay', '{"invoice": "INV-1", "memo": "a"}') AS replayed_inv_1,
       regress_div_call('dr-2', 'dv.pay', '{"invoice": "INV-12", "memo": "a"}') AS new_call;
SELECT durable_ledger.release_run('dr-2');

-- the replay's progress rolls back with its transaction: a replay undone is not counted
SELECT durable_ledger.acquire_run('dr-3');
SELECT regress_div_call('dr-3', 'dv.pay', '{"invoice": "A"}');
SELECT durable_ledger.acquire_run('dr-3');
BEGIN;
SELECT regress_div_call('dr-3', 'dv.pay', '{"invoice": "A"}');
ROLLBACK;
SELECT decision FROM durable_ledger.begin_effect('dr-3', 'dv.pay', '{"invoice": "B"}');
SELECT durable_ledger.release_run('dr-3');

-- policy warn: executed, with a WARNING and an audited divergence
SELECT durable_ledger.acquire_run('dw-1');
SELECT regress_div_call('dw-1', 'dv.mail', '{"to": "a", "body": "Hello"}');
SELECT durable_ledger.acquire_run('dw-1');
SELECT regress_div_call('dw-1', 'dv.mail', '{"to": "a", "body": "Hi there"}');
SELECT event, detail ->> 'policy' AS policy FROM durable_ledger.audit_log WHERE run = 'dw-1' AND event = 'divergence';
SELECT count(*) AS recorded_for_a_person FROM durable_ledger.divergences WHERE run = 'dw-1';
SELECT durable_ledger.release_run('dw-1');

-- a drift under a token lease pauses too
SELECT (durable_ledger.take_lease('dt-1', '1 minute')).token AS t1 \gset
SELECT regress_div_call('dt-1', 'dv.pay', '{"invoice": "A", "memo": "1"}', token => :'t1');
SELECT durable_ledger.release_lease(:'t1');
SELECT (durable_ledger.take_lease('dt-1', '1 minute')).token AS t2 \gset
SELECT regress_div_call('dt-1', 'dv.pay', '{"invoice": "A", "memo": "2"}', token => :'t2');
SELECT durable_ledger.release_lease(:'t2');

-- the effect it may duplicate is the first earlier effect this attempt has not
-- replayed, in the order they were begun: here the second, since the first was
-- replayed (out of order)
SELECT durable_ledger.acquire_run('dr-5');
SELECT regress_div_call('dr-5', 'dv.pay', '{"invoice": "X", "memo": "1"}'),
       regress_div_call('dr-5', 'dv.pay', '{"invoice": "Y", "memo": "1"}');
SELECT durable_ledger.acquire_run('dr-5');
SELECT regress_div_call('dr-5', 'dv.pay', '{"invoice": "Y", "memo": "1"}') AS y_first;
SELECT decision, position(durable_ledger.effect_key('dr-5', 'dv.pay', '{"invoice": "X", "memo": "1"}', 1) IN reason) > 0
         AS names_x_not_y
  FROM durable_ledger.begin_effect('dr-5', 'dv.pay', '{"invoice": "X", "memo": "2"}');
SELECT candidate_key = durable_ledger.effect_key('dr-5', 'dv.pay', '{"invoice": "X", "memo": "1"}', 1) AS candidate_is_x
  FROM durable_ledger.divergences WHERE run = 'dr-5';
SELECT durable_ledger.release_run('dr-5');

-- an earlier effect replayed twice (once as a verdict, once as itself) counts once:
-- the other earlier effect, not replayed, still makes a reworded call of it pause
SELECT durable_ledger.acquire_run('dr-6');
SELECT regress_div_call('dr-6', 'dv.pay', '{"invoice": "X", "memo": "1"}'),
       regress_div_call('dr-6', 'dv.pay', '{"invoice": "Y", "memo": "1"}');
SELECT durable_ledger.acquire_run('dr-6');
SELECT regress_div_call('dr-6', 'dv.pay', '{"invoice": "X", "memo": "2"}') AS x_reworded;
SELECT verdict FROM durable_ledger.resolve_divergence(
    durable_ledger.effect_key('dr-6', 'dv.pay', '{"invoice": "X", "memo": "2"}', 1), 'same', 'maria');
SELECT regress_div_call('dr-6', 'dv.pay', '{"invoice": "X", "memo": "2"}') AS x_reworded_again,
       regress_div_call('dr-6', 'dv.pay', '{"invoice": "X", "memo": "1"}') AS x_itself,
       regress_div_call('dr-6', 'dv.pay', '{"invoice": "Y", "memo": "2"}') AS y_reworded;
-- the replay that a verdict gave names the drifted call in the audit log
SELECT detail ->> 'divergence' = durable_ledger.effect_key('dr-6', 'dv.pay', '{"invoice": "X", "memo": "2"}', 1)
         AS names_the_drifted_call
  FROM durable_ledger.audit_log WHERE run = 'dr-6' AND event = 'replay' AND detail ? 'divergence';
SELECT count(*) AS payments FROM durable_ledger.effects WHERE run = 'dr-6';
SELECT durable_ledger.release_run('dr-6');

-- a divergence waits for its verdict however far the replay has come since
SELECT durable_ledger.acquire_run('dr-7');
SELECT regress_div_call('dr-7', 'dv.pay', '{"invoice": "X", "memo": "1"}');
SELECT durable_ledger.acquire_run('dr-7');
SELECT regress_div_call('dr-7', 'dv.pay', '{"invoice": "X", "memo": "2"}') AS drifted;
SELECT durable_ledger.acquire_run('dr-7');
SELECT regress_div_call('dr-7', 'dv.pay', '{"invoice": "X", "memo": "1"}') AS replayed,
       regress_div_call('dr-7', 'dv.pay', '{"invoice": "X", "memo": "2"}') AS still_waiting;
-- a policy turned off lets it execute; its verdict can then no longer be given
SELECT divergence FROM durable_ledger.change_tool('dv.pay', 'ana', divergence => 'off');
SELECT regress_div_call('dr-7', 'dv.pay', '{"invoice": "X", "memo": "2"}') AS executed;
SELECT regress_sqlstate(format($$SELECT durable_ledger.resolve_divergence(%L, 'same', 'maria')$$,
       durable_ledger.effect_key('dr-7', 'dv.pay', '{"invoice": "X", "memo": "2"}', 1)));
SELECT divergence FROM durable_ledger.change_tool('dv.pay', 'ana', divergence => 'pause');
SELECT durable_ledger.release_run('dr-7');

-- a person's "same" is kept whatever the policy becomes: with the policy off,
-- the drifted call still gets the earlier payment, never a second one
SELECT durable_ledger.acquire_run('dr-9');
SELECT regress_div_call('dr-9', 'dv.pay', '{"invoice": "S", "memo": "1"}', '{"paid": "S"}');
SELECT durable_ledger.acquire_run('dr-9');
SELECT regress_div_call('dr-9', 'dv.pay', '{"invoice": "S", "memo": "2"}') AS drifted;
SELECT verdict FROM durable_ledger.resolve_divergence(
    durable_ledger.effect_key('dr-9', 'dv.pay', '{"invoice": "S", "memo": "2"}', 1), 'same', 'maria');
SELECT divergence FROM durable_ledger.change_tool('dv.pay', 'ana', divergence => 'off');
SELECT durable_ledger.acquire_run('dr-9');
SELECT regress_div_call('dr-9', 'dv.pay', '{"invoice": "S", "memo": "2"}') AS same_under_off;
SELECT count(*) AS payments FROM durable_ledger.effects WHERE run = 'dr-9';
-- a drift that executed under off (dr-7 above) no longer waits in unresolved
SELECT count(*) AS dr7_unresolved FROM durable_ledger.unresolved WHERE run = 'dr-7';
-- an attempt that called the tool while it was unwatched is not judged for it,
-- even once the policy is on again (it kept no marks of what it replayed)
SELECT regress_div_call('dr-9', 'dv.pay', '{"invoice": "S", "memo": "1"}') AS replayed_unwatched;
SELECT divergence FROM durable_ledger.change_tool('dv.pay', 'ana', divergence => 'pause');
SELECT regress_div_call('dr-9', 'dv.pay', '{"invoice": "T", "memo": "1"}') AS new_call;
SELECT durable_ledger.release_run('dr-9');

-- ===================================================================
-- resolve_divergence refuses what it cannot mean, writing nothing
-- ===================================================================
SELECT durable_ledger.acquire_run('dr-4');
SELECT regress_div_call('dr-4', 'dv.pay', '{"invoice": "A"}');
SELECT durable_ledger.acquire_run('dr-4');
SELECT decision FROM durable_ledger.begin_effect('dr-4', 'dv.pay', '{"invoice": "Z"}');
SELECT durable_ledger.effect_key('dr-4', 'dv.pay', '{"invoice": "Z"}', 1) AS z \gset
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_sqlstate($$SELECT durable_ledger.resolve_divergence('no-such-key', 'same', 'maria')$$);
SELECT regress_sqlstate(format($$SELECT durable_ledger.resolve_divergence(%L, 'maybe', 'maria')$$, :'z'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.resolve_divergence(%L, NULL, 'maria')$$, :'z'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.resolve_divergence(%L, 'same', NULL)$$, :'z'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.resolve_divergence(%L, 'distinct', 'maria', same_as => %L)$$, :'z', :'earlier_key'));
-- same_as must be an earlier effect of the same tool in the same run
SELECT regress_sqlstate(format($$SELECT durable_ledger.resolve_divergence(%L, 'same', 'maria', same_as => %L)$$, :'z', :'earlier_key'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.resolve_divergence(%L, 'same', 'maria', same_as => 'no-such-key')$$, :'z'));
SELECT count(*) = :audit_rows AS nothing_written, (SELECT verdict FROM durable_ledger.divergences WHERE key = :'z') AS verdict
  FROM durable_ledger.audit_log;
SELECT verdict FROM durable_ledger.resolve_divergence(:'z', 'distinct', 'maria');
SELECT regress_sqlstate(format($$SELECT durable_ledger.resolve_divergence(%L, 'same', 'maria')$$, :'z'));
SELECT durable_ledger.release_run('dr-4');

-- workers do not decide divergences
CREATE ROLE regress_div_worker IN ROLE durable_ledger_worker;
SET ROLE regress_div_worker;
SELECT regress_sqlstate(format($$SELECT durable_ledger.resolve_divergence(%L, 'same', 'w')$$, :'z'));
RESET ROLE;
DROP ROLE regress_div_worker;

-- a retired tool's drifted call, resolved as the same, still replays (nothing executes)
SELECT durable_ledger.acquire_run('dr-8');
SELECT regress_div_call('dr-8', 'dv.pay', '{"invoice": "R", "memo": "1"}', '{"paid": "R"}');
SELECT durable_ledger.acquire_run('dr-8');
SELECT regress_div_call('dr-8', 'dv.pay', '{"invoice": "R", "memo": "2"}');
SELECT verdict FROM durable_ledger.resolve_divergence(
    durable_ledger.effect_key('dr-8', 'dv.pay', '{"invoice": "R", "memo": "2"}', 1), 'same', 'maria');
SELECT retired_by FROM durable_ledger.retire_tool('dv.pay', 'ana');
SELECT decision, result FROM durable_ledger.begin_effect('dr-8', 'dv.pay', '{"invoice": "R", "memo": "2"}');
SELECT durable_ledger.release_run('dr-8');

-- ===================================================================
-- a ledger call nested in another (an administrator's trigger on a ledger
-- table) under the same token lease: in a later epoch both count the tool's
-- counters; the outer call finds the counter rows its nested call added
-- (a counter read without a row is added without a second look only when
-- no counter was set since the read), as under a session lease
-- ===================================================================
SELECT tool, divergence FROM durable_ledger.register_tool('dv.nested', 'admin', divergence => 'off');
SELECT (durable_ledger.take_lease('tok-nest')).token AS tn1 \gset
SELECT decision, occurrence FROM durable_ledger.begin_effect('tok-nest', 'dv.nested', '{"a": 1}', lease => :'tn1');
SELECT durable_ledger.release_lease(:'tn1') AS released;
CREATE FUNCTION regress_nested_call() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.args ? 'outer' THEN
    PERFORM durable_ledger.begin_effect(NEW.run, NEW.tool, '{"nested": 1}',
                                        lease => current_setting('regress.token'));
  END IF;
  RETURN NULL;
END $$;
CREATE TRIGGER regress_nested_call AFTER INSERT ON durable_ledger.effects
  FOR EACH ROW EXECUTE FUNCTION regress_nested_call();
SELECT (durable_ledger.take_lease('tok-nest')).token AS tn2 \gset
SELECT set_config('regress.token', :'tn2', false) IS NOT NULL AS noted;
SELECT decision, occurrence FROM durable_ledger.begin_effect('tok-nest', 'dv.nested', '{"outer": 1}', lease => :'tn2');
SELECT args, status, lease_epoch, occurrence FROM durable_ledger.effects
 WHERE run = 'tok-nest' ORDER BY lease_epoch, args::text;
SELECT epoch, calls FROM durable_ledger.token_lease_calls WHERE run = 'tok-nest' ORDER BY epoch, calls;
DROP TRIGGER regress_nested_call ON durable_ledger.effects;
DROP FUNCTION regress_nested_call();
SELECT durable_ledger.release_lease(:'tn2') AS released;
