-- call_ids: a business key that is a framework's id of one tool call
-- (begin_effect's call_id), as the agent adapters key calls of frameworks that
-- resume from a checkpoint.  Such a key has no occurrence to replay by: a
-- framework that asks its model again after a lost answer gets the same call
-- under a new id.  So a new call id of a later attempt whose call (its key
-- fields, or all of args) equals an effect of the tool that an earlier attempt
-- recorded, under any key, and that did not fail, is a divergence: paused for
-- a person under policy pause, executed with a WARNING under warn, not judged
-- under off.  A verdict of same replays that effect's outcome; distinct
-- executes the call.  In the first attempt, and for an id seen before, nothing
-- changes.
\set VERBOSITY default

-- one call under a call id: its decision (a completed execution reports a result)
CREATE FUNCTION regress_cid_call(r text, t text, a jsonb, id text,
                                 outcome jsonb DEFAULT '{"ok": true}', fail boolean DEFAULT false)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE d durable_ledger.decision;
BEGIN
    d := durable_ledger.begin_effect(r, t, a, business_key => 'call:' || r || '/' || id,
                                     call_id => true);
    IF d.decision = 'execute' AND fail THEN
        PERFORM durable_ledger.fail_effect(d.key, outcome, d.attempt);
    ELSIF d.decision = 'execute' AND outcome IS NOT NULL THEN
        PERFORM durable_ledger.complete_effect(d.key, outcome, d.attempt);
    END IF;
    RETURN d.decision || coalesce(':' || (d.result ->> 'paid'), '');
END $$;

SELECT tool FROM durable_ledger.register_tool('ci.pay', 'maria');
SELECT tool FROM durable_ledger.register_tool('ci.mail', 'maria', divergence => 'warn');
SELECT tool FROM durable_ledger.register_tool('ci.note', 'maria', divergence => 'off');
SELECT tool FROM durable_ledger.register_tool('ci.transfer', 'maria', key_fields => '{to,cents}');

-- ===================================================================
-- call_id needs a business key, and writes nothing without one
-- ===================================================================
SELECT durable_ledger.acquire_run('ci-0');
SELECT durable_ledger.begin_effect('ci-0', 'ci.pay', '{"invoice": 1}', call_id => true);
SELECT count(*) AS effects FROM durable_ledger.effects WHERE run = 'ci-0';
-- false is a business key as ever; NULL is refused
SELECT decision FROM durable_ledger.begin_effect('ci-0', 'ci.pay', '{"invoice": 1}',
                                                  business_key => 'ci-0/op', call_id => false);
SELECT durable_ledger.begin_effect('ci-0', 'ci.pay', '{"invoice": 1}', 'ci-0/op2', call_id => NULL);
-- a call id's key begins with "call:", and only a call id's does (the shape is
-- reserved, as derived keys' is): so that an effect under a call id is known as one
SELECT durable_ledger.begin_effect('ci-0', 'ci.pay', '{"invoice": 1}', 'toolu_01', call_id => true);
SELECT durable_ledger.begin_effect('ci-0', 'ci.pay', '{"invoice": 1}', 'call:', call_id => true);
SELECT durable_ledger.begin_effect('ci-0', 'ci.pay', '{"invoice": 1}', 'call:["ci-0","ci.pay","x"]');
SELECT count(*) AS effects FROM durable_ledger.effects WHERE run = 'ci-0';

-- ===================================================================
-- the first attempt: a repeat under a new id is a repeat (as an occurrence)
-- ===================================================================
SELECT durable_ledger.acquire_run('ci-1');
SELECT regress_cid_call('ci-1', 'ci.pay', '{"invoice": 9}', 'a', '{"paid": "first"}'),
       regress_cid_call('ci-1', 'ci.pay', '{"invoice": 9}', 'b', '{"paid": "second"}');

-- ===================================================================
-- a later attempt: the model asked again names the call anew
-- ===================================================================
SELECT durable_ledger.acquire_run('ci-2');
SELECT regress_cid_call('ci-2', 'ci.pay', '{"invoice": 7}', 'a', '{"paid": "once"}');
SELECT durable_ledger.acquire_run('ci-2');      -- the answer was lost: attempt 2
-- the same call under a new id pauses (the call by its first id would replay;
-- once replayed in this attempt, a call like it is a repeat: ci-22 below)
SELECT regress_cid_call('ci-2', 'ci.pay', '{"invoice": 7}', 'z');
SELECT key, decision, status, occurrence, attempt, reason
  FROM durable_ledger.begin_effect('ci-2', 'ci.pay', '{"invoice": 7}',
                                   business_key => 'call:ci-2/z', call_id => true);
SELECT key, tool, occurrence, candidate_key, verdict FROM durable_ledger.divergences WHERE run = 'ci-2';
SELECT key, detail FROM durable_ledger.audit_log WHERE run = 'ci-2' AND event = 'divergence';
-- nothing was recorded for it, and the person sees it among the unresolved
SELECT count(*) AS effects FROM durable_ledger.effects WHERE key = 'call:ci-2/z';
SELECT key, tool, business_key, occurrence, may_duplicate, reason
  FROM durable_ledger.unresolved WHERE run = 'ci-2';
-- other args, and another tool's call with the same args, are new calls
SELECT regress_cid_call('ci-2', 'ci.pay', '{"invoice": 8}', 'y', '{"paid": "eight"}'),
       regress_cid_call('ci-2', 'ci.note', '{"invoice": 7}', 'x');
-- a person says it is the same: its outcome is replayed, never performed
SELECT verdict, same_as FROM durable_ledger.resolve_divergence('call:ci-2/z', 'same', 'maria');
SELECT regress_cid_call('ci-2', 'ci.pay', '{"invoice": 7}', 'z');
SELECT durable_ledger.acquire_run('ci-2');      -- and in every later attempt
SELECT regress_cid_call('ci-2', 'ci.pay', '{"invoice": 7}', 'z');
SELECT count(*) AS paid FROM durable_ledger.effects WHERE run = 'ci-2' AND args = '{"invoice": 7}';

-- distinct: the call is executed, once
SELECT durable_ledger.acquire_run('ci-3');
SELECT regress_cid_call('ci-3', 'ci.pay', '{"invoice": 5}', 'a', '{"paid": "first"}');
SELECT durable_ledger.acquire_run('ci-3');
SELECT regress_cid_call('ci-3', 'ci.pay', '{"invoice": 5}', 'b');
SELECT verdict FROM durable_ledger.resolve_divergence('call:ci-3/b', 'distinct', 'maria',
                                                      'the customer asked for a second payment');
SELECT regress_cid_call('ci-3', 'ci.pay', '{"invoice": 5}', 'b', '{"paid": "second"}'),
       regress_cid_call('ci-3', 'ci.pay', '{"invoice": 5}', 'b');

-- ===================================================================
-- what the earlier effect is
-- ===================================================================
-- under an occurrence key (an adapter that keyed by occurrence before): found
SELECT durable_ledger.acquire_run('ci-4');
SELECT decision FROM durable_ledger.begin_effect('ci-4', 'ci.pay', '{"invoice": 4}');
SELECT regress_cid_call('ci-4', 'ci.pay', '{"invoice": 40}', 'b', '{"paid": "forty"}');
SELECT durable_ledger.acquire_run('ci-4');
SELECT regress_cid_call('ci-4', 'ci.pay', '{"invoice": 4}', 'a'),
       regress_cid_call('ci-4', 'ci.pay', '{"invoice": 41}', 'c', '{"paid": "forty-one"}');
SELECT candidate_key = durable_ledger.effect_key('ci-4', 'ci.pay', '{"invoice": 4}', 1) AS names_it
  FROM durable_ledger.divergences WHERE run = 'ci-4';
-- same may name another effect of the tool from an earlier attempt, a call id's
-- too; not one of the divergence's own attempt
SELECT verdict FROM durable_ledger.resolve_divergence('call:ci-4/a', 'same', 'maria',
                                                      same_as => 'call:ci-4/c');
SELECT verdict, same_as FROM durable_ledger.resolve_divergence('call:ci-4/a', 'same', 'maria',
                                                               same_as => 'call:ci-4/b');
SELECT regress_cid_call('ci-4', 'ci.pay', '{"invoice": 4}', 'a');

-- a failed effect did not happen: the call under a new id executes
SELECT durable_ledger.acquire_run('ci-5');
SELECT regress_cid_call('ci-5', 'ci.pay', '{"invoice": 3}', 'a', '{"declined": true}', fail => true);
SELECT durable_ledger.acquire_run('ci-5');
SELECT regress_cid_call('ci-5', 'ci.pay', '{"invoice": 3}', 'b', '{"paid": "now"}');

-- an unknown outcome: the new id pauses as a divergence, the old one as unknown
SELECT durable_ledger.acquire_run('ci-6');
SELECT regress_cid_call('ci-6', 'ci.pay', '{"invoice": 6}', 'a', NULL);
SELECT durable_ledger.acquire_run('ci-6');
SELECT regress_cid_call('ci-6', 'ci.pay', '{"invoice": 6}', 'b'),
       regress_cid_call('ci-6', 'ci.pay', '{"invoice": 6}', 'a');

-- a tool's key fields are its calls' identity: a reworded memo is the same call
SELECT durable_ledger.acquire_run('ci-7');
SELECT regress_cid_call('ci-7', 'ci.transfer', '{"to": "acme", "cents": 500, "memo": "rent"}', 'a');
SELECT durable_ledger.acquire_run('ci-7');
SELECT regress_cid_call('ci-7', 'ci.transfer', '{"to": "acme", "cents": 500, "memo": "June rent"}', 'b'),
       regress_cid_call('ci-7', 'ci.transfer', '{"to": "acme", "cents": 600, "memo": "rent"}', 'c');

-- ===================================================================
-- the tool's divergence policy
-- ===================================================================
-- warn: executed, with a WARNING and an audited divergence
SELECT durable_ledger.acquire_run('ci-8');
SELECT regress_cid_call('ci-8', 'ci.mail', '{"to": "x"}', 'a');
SELECT durable_ledger.acquire_run('ci-8');
SELECT regress_cid_call('ci-8', 'ci.mail', '{"to": "x"}', 'b');
SELECT key, detail ->> 'may_duplicate' AS may_duplicate, detail ->> 'call_id' AS call_id
  FROM durable_ledger.audit_log WHERE run = 'ci-8' AND event = 'divergence';
-- off: not judged
SELECT durable_ledger.acquire_run('ci-9');
SELECT regress_cid_call('ci-9', 'ci.note', '{"n": 1}', 'a');
SELECT durable_ledger.acquire_run('ci-9');
SELECT regress_cid_call('ci-9', 'ci.note', '{"n": 1}', 'b');
-- a tool nobody registered: the policy for unregistered tools (pause by default)
SELECT durable_ledger.acquire_run('ci-10');
SELECT regress_cid_call('ci-10', 'ci.unregistered', '{"n": 1}', 'a');
SELECT durable_ledger.acquire_run('ci-10');
SELECT regress_cid_call('ci-10', 'ci.unregistered', '{"n": 1}', 'b');

-- under a token lease alike: each take_lease is an attempt
SELECT token AS t1 FROM durable_ledger.take_lease('ci-11') \gset
SELECT decision FROM durable_ledger.begin_effect('ci-11', 'ci.pay', '{"invoice": 11}', 'call:ci-11/a',
                                                  lease => :'t1', call_id => true);
SELECT durable_ledger.release_lease(:'t1');
SELECT token AS t2 FROM durable_ledger.take_lease('ci-11') \gset
SELECT decision FROM durable_ledger.begin_effect('ci-11', 'ci.pay', '{"invoice": 11}', 'call:ci-11/b',
                                                  lease => :'t2', call_id => true);
SELECT durable_ledger.release_lease(:'t2');

-- ===================================================================
-- a divergence binds its key to the call judged (as an effect binds a
-- business key): another run, another tool, other args are refused, and
-- nothing is written
-- ===================================================================
SELECT durable_ledger.acquire_run('ci-12');
SELECT regress_cid_call('ci-12', 'ci.pay', '{"invoice": 12}', 'a', '{"paid": "twelve"}');
SELECT durable_ledger.acquire_run('ci-12');
SELECT regress_cid_call('ci-12', 'ci.pay', '{"invoice": 12}', 'z');
SELECT durable_ledger.acquire_run('ci-13');
SELECT durable_ledger.acquire_run('ci-13');
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT decision FROM durable_ledger.begin_effect('ci-13', 'ci.pay', '{"invoice": 12}',
                                                  'call:ci-12/z', call_id => true);
SELECT decision FROM durable_ledger.begin_effect('ci-12', 'ci.mail', '{"invoice": 12}',
                                                  'call:ci-12/z', call_id => true);
SELECT decision FROM durable_ledger.begin_effect('ci-12', 'ci.pay', '{"invoice": 12, "cents": 990000}',
                                                  'call:ci-12/z', call_id => true);
SELECT count(*) - :audit_rows AS audit_rows_written FROM durable_ledger.audit_log;
-- after a verdict too: "distinct" lets the call judged execute, not another
SELECT verdict FROM durable_ledger.resolve_divergence('call:ci-12/z', 'distinct', 'maria');
SELECT decision FROM durable_ledger.begin_effect('ci-12', 'ci.pay', '{"invoice": 12, "cents": 990000}',
                                                  'call:ci-12/z', call_id => true);
-- a call id's key is never begun as an operation's (its shape is reserved):
-- without call_id it is refused, and the divergence waits
SELECT durable_ledger.acquire_run('ci-14');
SELECT regress_cid_call('ci-14', 'ci.pay', '{"invoice": 14}', 'a', '{"paid": "fourteen"}');
SELECT durable_ledger.acquire_run('ci-14');
SELECT regress_cid_call('ci-14', 'ci.pay', '{"invoice": 14}', 'z');
SELECT decision, status FROM durable_ledger.begin_effect('ci-14', 'ci.pay', '{"invoice": 14}', 'call:ci-14/z');
SELECT verdict FROM durable_ledger.resolve_divergence('call:ci-14/z', 'same', 'maria');
SELECT decision, key, result FROM durable_ledger.begin_effect('ci-14', 'ci.pay', '{"invoice": 14}', 'call:ci-14/z',
                                                               call_id => true);

-- ===================================================================
-- a failure a report contradicted (flagged) may have happened: not passed over
-- ===================================================================
SELECT durable_ledger.acquire_run('ci-15');
SELECT regress_cid_call('ci-15', 'ci.pay', '{"invoice": 15}', 'a', '{"declined": true}', fail => true);
SELECT status, conflict FROM durable_ledger.complete_effect('call:ci-15/a', '{"paid": "after all"}', 1);
SELECT durable_ledger.acquire_run('ci-15');
SELECT regress_cid_call('ci-15', 'ci.pay', '{"invoice": 15}', 'z');

-- ===================================================================
-- a call id first, then the same call keyed by its occurrence (a framework
-- that gave no id this time): the occurrence key is judged by its identity
-- too, once the tool's earlier derived effects are replayed
-- ===================================================================
SELECT durable_ledger.acquire_run('ci-16');
SELECT regress_cid_call('ci-16', 'ci.pay', '{"invoice": 16}', 'a', '{"paid": "sixteen"}');
SELECT durable_ledger.acquire_run('ci-16');
SELECT key, decision, status, reason FROM durable_ledger.begin_effect('ci-16', 'ci.pay', '{"invoice": 16}');
SELECT occurrence, candidate_key FROM durable_ledger.divergences WHERE run = 'ci-16';
SELECT verdict, same_as FROM durable_ledger.resolve_divergence(
         durable_ledger.effect_key('ci-16', 'ci.pay', '{"invoice": 16}', 1), 'same', 'maria');
SELECT decision, result, downstream_key FROM durable_ledger.begin_effect('ci-16', 'ci.pay', '{"invoice": 16}');
-- other args under an occurrence key are a new call
SELECT decision FROM durable_ledger.begin_effect('ci-16', 'ci.pay', '{"invoice": 17}');

-- and the reverse: a call id a verdict answered with an earlier derived key's
-- effect replayed it, so the attempt's next new call of the tool is not a divergence
SELECT durable_ledger.acquire_run('ci-17');
SELECT c.status FROM durable_ledger.begin_effect('ci-17', 'ci.pay', '{"invoice": 170}') d,
                     durable_ledger.complete_effect(d.key, '{"paid": "170"}', d.attempt) c;
SELECT durable_ledger.acquire_run('ci-17');
SELECT regress_cid_call('ci-17', 'ci.pay', '{"invoice": 170}', 'z');
SELECT verdict FROM durable_ledger.resolve_divergence('call:ci-17/z', 'same', 'maria');
SELECT regress_cid_call('ci-17', 'ci.pay', '{"invoice": 170}', 'z');
SELECT decision FROM durable_ledger.begin_effect('ci-17', 'ci.pay', '{"invoice": 171}');

-- ===================================================================
-- an approved call named anew, with its very args: a person's "same" starts
-- the approved call, once
-- ===================================================================
CREATE ROLE regress_ci_alice LOGIN IN ROLE durable_ledger_approver;
SELECT tool FROM durable_ledger.register_tool('ci.refund', 'maria');
SELECT tool FROM durable_ledger.set_approval('ci.refund', 'strict $.amount > 100', 'maria');
SELECT durable_ledger.acquire_run('ci-18');
SELECT regress_cid_call('ci-18', 'ci.refund', '{"amount": 500}', 'a');
SET SESSION AUTHORIZATION regress_ci_alice;
SELECT status FROM durable_ledger.approve_effect('call:ci-18/a', 'alice');
RESET SESSION AUTHORIZATION;
SELECT durable_ledger.acquire_run('ci-18');     -- the continuation names the call anew
SELECT regress_cid_call('ci-18', 'ci.refund', '{"amount": 500}', 'z');
SELECT verdict FROM durable_ledger.resolve_divergence('call:ci-18/z', 'same', 'maria');
SELECT key, decision, status, attempt, downstream_key
  FROM durable_ledger.begin_effect('ci-18', 'ci.refund', '{"amount": 500}', 'call:ci-18/z', call_id => true);
SELECT status FROM durable_ledger.complete_effect('call:ci-18/a', '{"refunded": 500}', 1);
SELECT regress_cid_call('ci-18', 'ci.refund', '{"amount": 500}', 'z'),
       regress_cid_call('ci-18', 'ci.refund', '{"amount": 500}', 'a');
-- other args are not what was approved: paused
SELECT durable_ledger.acquire_run('ci-19');
SELECT regress_cid_call('ci-19', 'ci.refund', '{"amount": 500, "memo": "x"}', 'a');
SET SESSION AUTHORIZATION regress_ci_alice;
SELECT status FROM durable_ledger.approve_effect('call:ci-19/a', 'alice');
RESET SESSION AUTHORIZATION;
SELECT durable_ledger.acquire_run('ci-19');
SELECT tool FROM durable_ledger.change_tool('ci.refund', 'maria', key_fields => '{amount}');
SELECT regress_cid_call('ci-19', 'ci.refund', '{"amount": 500, "memo": "y"}', 'z');
SELECT verdict FROM durable_ledger.resolve_divergence('call:ci-19/z', 'same', 'maria');
SELECT decision, left(reason, 60) AS reason
  FROM durable_ledger.begin_effect('ci-19', 'ci.refund', '{"amount": 500, "memo": "y"}', 'call:ci-19/z', call_id => true);

-- ===================================================================
-- an occurrence key is compared with the earlier attempts' call ids only:
-- an operation's business key with the same identity is another thing
-- ===================================================================
SELECT durable_ledger.acquire_run('ci-20');
SELECT decision FROM durable_ledger.begin_effect('ci-20', 'ci.transfer', '{"to": "u1", "cents": 1, "memo": "welcome"}',
                                                  'welcome-u1');
SELECT durable_ledger.acquire_run('ci-20');
SELECT decision FROM durable_ledger.begin_effect('ci-20', 'ci.transfer', '{"to": "u1", "cents": 1, "memo": "done"}');
-- the effect a drifted occurrence key has the arguments of is the one named,
-- whatever else of the tool is due: a person's "distinct" is about that one
SELECT durable_ledger.acquire_run('ci-21');
SELECT regress_cid_call('ci-21', 'ci.pay', '{"invoice": 7}', 'a', '{"paid": "seven"}');
SELECT decision FROM durable_ledger.begin_effect('ci-21', 'ci.pay', '{"invoice": 1}') d,
                     durable_ledger.complete_effect(d.key, '{"paid": "one"}', d.attempt) c;
SELECT durable_ledger.acquire_run('ci-21');
SELECT decision FROM durable_ledger.begin_effect('ci-21', 'ci.pay', '{"invoice": 7}');
SELECT candidate_key FROM durable_ledger.divergences WHERE run = 'ci-21';

-- an effect this attempt replayed (or a verdict answered a call with) is
-- accounted for: a call like it now is another call, never that one named anew
SELECT durable_ledger.acquire_run('ci-22');
SELECT regress_cid_call('ci-22', 'ci.pay', '{"invoice": 22}', 'a', '{"paid": "a"}');
SELECT durable_ledger.acquire_run('ci-22');
SELECT regress_cid_call('ci-22', 'ci.pay', '{"invoice": 22}', 'a'),
       (SELECT decision FROM durable_ledger.begin_effect('ci-22', 'ci.pay', '{"invoice": 22}'));
-- two call ids sent the same: a later attempt's two calls of it by occurrence
-- name the first, then (once a verdict answered with it) the second
SELECT durable_ledger.acquire_run('ci-23');
SELECT regress_cid_call('ci-23', 'ci.pay', '{"invoice": 23}', 'k1', '{"paid": "k1"}'),
       regress_cid_call('ci-23', 'ci.pay', '{"invoice": 23}', 'k2', '{"paid": "k2"}');
SELECT durable_ledger.acquire_run('ci-23');
SELECT decision FROM durable_ledger.begin_effect('ci-23', 'ci.pay', '{"invoice": 23}');
SELECT verdict, same_as FROM durable_ledger.resolve_divergence(
         durable_ledger.effect_key('ci-23', 'ci.pay', '{"invoice": 23}', 1), 'same', 'maria');
SELECT decision, result FROM durable_ledger.begin_effect('ci-23', 'ci.pay', '{"invoice": 23}');
SELECT decision FROM durable_ledger.begin_effect('ci-23', 'ci.pay', '{"invoice": 23}');
SELECT occurrence, candidate_key FROM durable_ledger.divergences WHERE run = 'ci-23' ORDER BY occurrence;
SELECT verdict, same_as FROM durable_ledger.resolve_divergence(
         durable_ledger.effect_key('ci-23', 'ci.pay', '{"invoice": 23}', 2), 'same', 'maria');
SELECT decision, result FROM durable_ledger.begin_effect('ci-23', 'ci.pay', '{"invoice": 23}');
-- a third is a new call: both are accounted for
SELECT decision FROM durable_ledger.begin_effect('ci-23', 'ci.pay', '{"invoice": 23}');

-- ===================================================================
-- a run with effects under call ids is not forked: their keys name the run,
-- and the new run would perform those calls again
-- ===================================================================
SELECT durable_ledger.fork_run('ci-21', 'ci-21-fork', durable_ledger.effect_key('ci-21', 'ci.pay', '{"invoice": 1}', 1), 'maria');
SELECT count(*) AS forked FROM durable_ledger.effects WHERE run = 'ci-21-fork';

SELECT count(*) FILTER (WHERE durable_ledger.release_run(r)) AS released
  FROM unnest(ARRAY['ci-0', 'ci-1', 'ci-2', 'ci-3', 'ci-4', 'ci-5', 'ci-6', 'ci-7', 'ci-8', 'ci-9',
                    'ci-10', 'ci-12', 'ci-13', 'ci-14', 'ci-15', 'ci-16', 'ci-17', 'ci-18', 'ci-19',
                    'ci-20', 'ci-21', 'ci-22', 'ci-23']) r;
DROP ROLE regress_ci_alice;
DROP FUNCTION regress_cid_call(text, text, jsonb, text, jsonb, boolean);
