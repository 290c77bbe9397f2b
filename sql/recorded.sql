-- recorded: begin_recorded records a call that is harmless to make again (a
-- model's answer, a read) as an effect: executed once, completed, replayed
-- with its recorded result; but a call whose lease ended without a report is
-- executed again as the effect's next attempt (the unknown one kept in
-- past_attempts), not paused, and never listed in unresolved.  A late report
-- on the replaced attempt is kept in the audit log and changes nothing.  Both
-- the effect and the call must be recorded ones: begin_effect on a recorded
-- call, or begin_recorded on an effect, makes it unknown and pauses as v1
-- does, and an unknown effect waits for a person whoever asks.  A tool
-- registered as side-effecting is refused.
\set VERBOSITY terse


-- ===================================================================
-- attempt 1: a model turn recorded, executed, completed; a second turn is
-- begun and its worker dies (the lease ends) without a report
-- ===================================================================
SELECT key AS turn1 FROM durable_ledger.effect_key('rec-1', 'model', '{"messages": ["hi"]}', 1) AS key \gset
SELECT key AS turn2 FROM durable_ledger.effect_key('rec-1', 'model', '{"messages": ["hi", "hello", "pay INV-9?"]}', 1) AS key \gset
SELECT key = :'turn1' AS derived_key, decision, status, occurrence, attempt, result, reason,
       downstream_key = key AS downstream_is_key
  FROM durable_ledger.begin_recorded('rec-1', 'model', '{"messages": ["hi"]}',
                                     '{"model": "m-1"}');
SELECT status, attempt, safe_to_redo, meta FROM durable_ledger.effects WHERE key = :'turn1';
SELECT status, attempt FROM durable_ledger.complete_effect(:'turn1', '{"text": "hello"}', 1);
SELECT decision, status, attempt
  FROM durable_ledger.begin_recorded('rec-1', 'model', '{"messages": ["hi", "hello", "pay INV-9?"]}');
-- a recorded call in flight is not something a person may have to look at
SELECT count(*) AS unsettled_rows FROM durable_ledger.unsettled WHERE key IN (:'turn1', :'turn2');
SELECT durable_ledger.release_run('rec-1');
SELECT count(*) AS unresolved_rows FROM durable_ledger.unresolved WHERE run = 'rec-1';

-- ===================================================================
-- attempt 2: turn 1 is replayed; turn 2, whose outcome is unknown, is
-- executed again as attempt 2
-- ===================================================================
SELECT decision, status, attempt, result, reason
  FROM durable_ledger.begin_recorded('rec-1', 'model', '{"messages": ["hi"]}');
-- (a next attempt reaches the provider under a key of its own, key#2)
SELECT decision, status, occurrence, attempt, reason,
       downstream_key = key || '#2' AS downstream_names_attempt
  FROM durable_ledger.begin_recorded('rec-1', 'model', '{"messages": ["hi", "hello", "pay INV-9?"]}');
SELECT status, attempt, lease_epoch, conflict FROM durable_ledger.effects WHERE key = :'turn2';
SELECT attempt, status, lease_epoch, error FROM durable_ledger.past_attempts WHERE key = :'turn2';
SELECT event, lease_epoch, attempt, detail FROM durable_ledger.audit_log
 WHERE key = :'turn2' ORDER BY id;
SELECT count(*) AS unsettled_rows FROM durable_ledger.unsettled WHERE key = :'turn2';

-- the dead worker's report on attempt 1 arrives late: kept, not applied, not flagged
SELECT status, attempt, result, conflict
  FROM durable_ledger.complete_effect(:'turn2', '{"text": "the late answer"}', 1);
SELECT event, lease_epoch, attempt, detail FROM durable_ledger.audit_log
 WHERE key = :'turn2' AND event = 'superseded_report';
-- turn 3 is begun; its worker dies too
SELECT key AS turn3 FROM durable_ledger.effect_key('rec-1', 'model', '{"messages": ["turn 3"]}', 1) AS key \gset
SELECT decision, attempt FROM durable_ledger.begin_recorded('rec-1', 'model', '{"messages": ["turn 3"]}');
-- the current attempt's report is applied
SELECT status, attempt, result, conflict
  FROM durable_ledger.complete_effect(:'turn2', '{"text": "yes, pay it"}', 2);
SELECT count(*) AS unresolved_rows FROM durable_ledger.unresolved WHERE run = 'rec-1';
SELECT durable_ledger.release_run('rec-1');

-- attempt 3: turn 2 is replayed (its current attempt's result); turn 3,
-- unknown, is executed again
SELECT decision, status, attempt, result
  FROM durable_ledger.begin_recorded('rec-1', 'model', '{"messages": ["hi", "hello", "pay INV-9?"]}');
SELECT decision, status, attempt
  FROM durable_ledger.begin_recorded('rec-1', 'model', '{"messages": ["turn 3"]}');
SELECT durable_ledger.release_run('rec-1');
-- a report that names no attempt, from a session that is not the current
-- attempt's lease: it may be attempt 1's, so it is not applied; kept as
-- superseded (no run, no attempt), flagged for nobody: if it was the current
-- attempt's, the call is made again

SELECT conninfo AS other_conninfo FROM (SELECT 'dbname=' || current_database()
       || ' port=' || current_setting('port') AS conninfo) c \gset
SELECT dblink_connect('rec_other', :'other_conninfo');
SELECT * FROM dblink('rec_other', format($$SELECT status, attempt, conflict
       FROM durable_ledger.complete_effect(%L, '{"text": "whose?"}')$$, :'turn3'))
       AS t(status text, attempt integer, conflict boolean);
SELECT event, run, lease_epoch, attempt, detail FROM durable_ledger.audit_log
 WHERE key = :'turn3' AND event IN ('conflict', 'superseded_report');
SELECT count(*) AS unresolved_rows FROM durable_ledger.unresolved WHERE run = 'rec-1';
SELECT dblink_disconnect('rec_other');
SELECT decision, status, attempt
  FROM durable_ledger.begin_recorded('rec-1', 'model', '{"messages": ["turn 3"]}');
SELECT status, attempt FROM durable_ledger.complete_effect(:'turn3', '{"text": "three"}', 3);
SELECT durable_ledger.release_run('rec-1');

-- ===================================================================
-- both must be recorded calls: begin_effect on a recorded call whose lease
-- ended, and begin_recorded on a side effect's, pause as any unknown does;
-- once unknown (a person was asked), a recorded call is not redone either
-- ===================================================================
SELECT decision FROM durable_ledger.begin_recorded('rec-mix', 'lookup', '{"q": "a"}');
SELECT decision FROM durable_ledger.begin_effect('rec-mix', 'lookup', '{"q": "b"}');
SELECT durable_ledger.release_run('rec-mix');
SELECT decision, status, attempt, reason IS NOT NULL AS explained
  FROM durable_ledger.begin_effect('rec-mix', 'lookup', '{"q": "a"}');
SELECT decision, status, attempt, reason IS NOT NULL AS explained
  FROM durable_ledger.begin_recorded('rec-mix', 'lookup', '{"q": "b"}');
SELECT decision, status, attempt
  FROM durable_ledger.begin_recorded('rec-mix', 'lookup', '{"q": "a"}');
SELECT args, status, attempt, safe_to_redo FROM durable_ledger.effects WHERE run = 'rec-mix' ORDER BY args::text;
SELECT args, status FROM durable_ledger.unresolved WHERE run = 'rec-mix' ORDER BY args::text;
SELECT durable_ledger.release_run('rec-mix');

-- ===================================================================
-- a failure is recorded and replayed as any effect's (calling again is the
-- next occurrence)
-- ===================================================================
SELECT key AS failed_key FROM durable_ledger.begin_recorded('rec-fail', 'model', '{"m": 1}') \gset
SELECT status FROM durable_ledger.fail_effect(:'failed_key', '{"error": "content policy"}', 1);
SELECT durable_ledger.release_run('rec-fail');
SELECT decision, status, attempt, error
  FROM durable_ledger.begin_recorded('rec-fail', 'model', '{"m": 1}');
SELECT decision, occurrence, attempt
  FROM durable_ledger.begin_recorded('rec-fail', 'model', '{"m": 1}');
SELECT durable_ledger.release_run('rec-fail');

-- ===================================================================
-- token leases: an expired or broken lease's recorded call is executed
-- again in the next lease's epoch
-- ===================================================================
SELECT token AS tok1 FROM durable_ledger.take_lease('rec-tok', '1 minute') \gset
SELECT key AS tok_key, decision, attempt
  FROM durable_ledger.begin_recorded('rec-tok', 'model', '{"t": 1}', NULL, :'tok1') \gset
SELECT :'decision' AS decision, :attempt AS attempt;
SELECT durable_ledger.break_lease('rec-tok', 'regress', 'the worker is gone');
SELECT token AS tok2 FROM durable_ledger.take_lease('rec-tok', '1 minute') \gset
SELECT decision, status, attempt
  FROM durable_ledger.begin_recorded('rec-tok', 'model', '{"t": 1}', NULL, :'tok2');
SELECT status, attempt FROM durable_ledger.complete_effect(:'tok_key', '{"ok": true}', 2);
SELECT durable_ledger.release_lease(:'tok2');

-- ===================================================================
-- the tools registry: a tool registered as side-effecting is refused (55L03,
-- nothing written); one registered as read-only is recorded
-- ===================================================================
SELECT tool FROM durable_ledger.register_tool('charge_card', 'regress');
SELECT tool FROM durable_ledger.register_tool('search_docs', 'regress', side_effecting => false);
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_try($$SELECT durable_ledger.begin_recorded('rec-reg', 'charge_card', '{"cents": 100}')$$)
       AS side_effecting;
SELECT count(*) = :audit_rows AS nothing_written FROM durable_ledger.audit_log;
SELECT count(*) AS effects FROM durable_ledger.effects WHERE run = 'rec-reg';
\set VERBOSITY default
SELECT durable_ledger.begin_recorded('rec-reg', 'charge_card', '{"cents": 100}');
\set VERBOSITY terse
SELECT decision FROM durable_ledger.begin_recorded('rec-reg', 'search_docs', '{"q": "refunds"}');
SELECT durable_ledger.release_run('rec-reg');
SELECT tool FROM durable_ledger.retire_tool('charge_card', 'regress');
SELECT tool FROM durable_ledger.retire_tool('search_docs', 'regress');

-- ===================================================================
-- a tool watched for divergence (warn): a call made again counts as
-- replayed, so the attempt's later calls of the tool are judged as before
-- ===================================================================
SELECT tool FROM durable_ledger.register_tool('model_watched', 'regress', side_effecting => false,
                                              divergence => 'warn');
SELECT decision FROM durable_ledger.begin_recorded('rec-watch', 'model_watched', '{"t": "a"}');
SELECT status FROM durable_ledger.complete_effect(
       (SELECT key FROM durable_ledger.effects WHERE run = 'rec-watch' AND args = '{"t": "a"}'),
       '{"ok": "a"}', 1);
SELECT decision FROM durable_ledger.begin_recorded('rec-watch', 'model_watched', '{"t": "b"}');
SELECT durable_ledger.release_run('rec-watch');
SELECT decision FROM durable_ledger.begin_recorded('rec-watch', 'model_watched', '{"t": "a"}');
SELECT decision FROM durable_ledger.begin_recorded('rec-watch', 'model_watched', '{"t": "c"}');
SELECT decision, attempt FROM durable_ledger.begin_recorded('rec-watch', 'model_watched', '{"t": "b"}');
SELECT decision FROM durable_ledger.begin_recorded('rec-watch', 'model_watched', '{"t": "d"}');
SELECT durable_ledger.release_run('rec-watch');
SELECT tool FROM durable_ledger.retire_tool('model_watched', 'regress');

-- a divergence whose candidate is a recorded call made again since (in a
-- later epoch) can still be resolved as the same as that candidate
SELECT tool FROM durable_ledger.register_tool('model_paused', 'regress', side_effecting => false,
                                              divergence => 'pause');
SELECT key AS cand_a1 FROM durable_ledger.begin_recorded('rec-cand', 'model_paused', '{"m": "a1"}') \gset
SELECT status FROM durable_ledger.complete_effect(:'cand_a1', '"one"', 1);
SELECT key AS cand_a2 FROM durable_ledger.begin_recorded('rec-cand', 'model_paused', '{"m": "a2"}') \gset
SELECT durable_ledger.release_run('rec-cand');
SELECT decision FROM durable_ledger.begin_recorded('rec-cand', 'model_paused', '{"m": "a1"}');
SELECT key AS cand_x, decision FROM durable_ledger.begin_recorded('rec-cand', 'model_paused', '{"m": "a2, reworded"}') \gset
SELECT :'decision' AS drifted;
SELECT durable_ledger.release_run('rec-cand');
SELECT decision FROM durable_ledger.begin_recorded('rec-cand', 'model_paused', '{"m": "a1"}');
SELECT decision, attempt FROM durable_ledger.begin_recorded('rec-cand', 'model_paused', '{"m": "a2"}');
SELECT durable_ledger.release_run('rec-cand');
SELECT verdict, same_as = :'cand_a2' AS same_as_the_candidate
  FROM durable_ledger.resolve_divergence(:'cand_x', 'same', 'regress');
SELECT tool FROM durable_ledger.retire_tool('model_paused', 'regress');

-- a lost recorded call made again for a drifted call a person said is the
-- same keeps its own args (its key is of them): history and a fork see them
SELECT tool FROM durable_ledger.register_tool('model_same', 'regress', side_effecting => false,
                                              divergence => 'pause');
SELECT key AS same_x FROM durable_ledger.begin_recorded('rec-same', 'model_same', '{"p": "A"}') \gset
SELECT durable_ledger.release_run('rec-same');
SELECT key AS same_y1, decision FROM durable_ledger.begin_recorded('rec-same', 'model_same', '{"p": "B"}') \gset
SELECT durable_ledger.release_run('rec-same');
SELECT verdict FROM durable_ledger.resolve_divergence(:'same_y1', 'distinct', 'regress');
SELECT decision FROM durable_ledger.begin_recorded('rec-same', 'model_same', '{"p": "B"}');
SELECT status FROM durable_ledger.complete_effect(:'same_y1', '"b"', 1);
SELECT key AS same_y2, decision FROM durable_ledger.begin_recorded('rec-same', 'model_same', '{"p": "B"}') \gset
SELECT durable_ledger.release_run('rec-same');
SELECT verdict, same_as = :'same_x' AS same_as_x FROM durable_ledger.resolve_divergence(:'same_y2', 'same', 'regress');
SELECT decision, attempt FROM durable_ledger.begin_recorded('rec-same', 'model_same', '{"p": "B"}');
SELECT key = :'same_x' AS is_x, decision, attempt FROM durable_ledger.begin_recorded('rec-same', 'model_same', '{"p": "B"}');
SELECT status FROM durable_ledger.complete_effect(:'same_x', '"redone"', 2);
SELECT durable_ledger.release_run('rec-same');
SELECT key = :'same_x' AS is_x, args FROM durable_ledger.effects WHERE run = 'rec-same' ORDER BY 1;
SELECT attempt, args FROM durable_ledger.past_attempts WHERE key = :'same_x';
SELECT durable_ledger.fork_run('rec-same', 'rec-same-fork', :'same_x', 'regress') AS carried;
SELECT tool FROM durable_ledger.retire_tool('model_same', 'regress');
-- ... and is judged for an approval on those args: the record says what was approved
SELECT tool FROM durable_ledger.register_tool('model_ap', 'regress', side_effecting => false,
                                              divergence => 'pause');
SELECT key AS ap_x FROM durable_ledger.begin_recorded('rec-ap', 'model_ap', '{"p": "A"}') \gset
SELECT durable_ledger.release_run('rec-ap');
SELECT tool FROM durable_ledger.set_approval('model_ap', 'strict $.p == "A"', 'regress');
SELECT key AS ap_y, decision FROM durable_ledger.begin_recorded('rec-ap', 'model_ap', '{"p": "B"}') \gset
SELECT durable_ledger.release_run('rec-ap');
SELECT verdict FROM durable_ledger.resolve_divergence(:'ap_y', 'same', 'regress');
SELECT key = :'ap_x' AS is_x, decision, status, attempt FROM durable_ledger.begin_recorded('rec-ap', 'model_ap', '{"p": "B"}');
SELECT durable_ledger.release_run('rec-ap');
SELECT status, args FROM durable_ledger.effects WHERE key = :'ap_x';
SELECT detail -> 'args' AS asked FROM durable_ledger.audit_log WHERE key = :'ap_x' AND event = 'approval_requested';
SELECT tool FROM durable_ledger.retire_tool('model_ap', 'regress');

-- ===================================================================
-- a run whose last recorded call was lost is settled for purge_settled and
-- fork_run: nobody has anything to decide; a fork does not carry the call
-- (the new run makes it again)
-- ===================================================================
SELECT key AS lost_key FROM durable_ledger.begin_recorded('rec-lost', 'model', '{"q": 1}') \gset
SELECT status FROM durable_ledger.complete_effect(:'lost_key', '{"a": 1}', 1);
SELECT key AS lost_key2 FROM durable_ledger.begin_recorded('rec-lost', 'model', '{"q": 2}') \gset
SELECT durable_ledger.release_run('rec-lost');
SELECT durable_ledger.fork_run('rec-lost', 'rec-lost-fork', :'lost_key2', 'regress') AS carried;
SELECT decision, status FROM durable_ledger.begin_recorded('rec-lost-fork', 'model', '{"q": 1}');
SELECT decision, status, attempt FROM durable_ledger.begin_recorded('rec-lost-fork', 'model', '{"q": 2}');
SELECT durable_ledger.release_run('rec-lost-fork');
SELECT run FROM durable_ledger.purge_settled('0 seconds', 'regress')
 WHERE run LIKE 'rec-lost%' ORDER BY run;

-- ===================================================================
-- bad input: clear errors, nothing written
-- ===================================================================
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_try($$SELECT durable_ledger.begin_recorded(NULL, 'model', '{}')$$) AS null_run;
SELECT regress_try($$SELECT durable_ledger.begin_recorded('rec-bad', '', '{}')$$) AS empty_tool;
SELECT regress_try($$SELECT durable_ledger.begin_recorded('rec-bad', 'model', NULL)$$) AS null_args;
SELECT regress_try($$SELECT durable_ledger.begin_recorded('rec-bad', 'model', '{}', NULL, 'not-a-token')$$)
       AS bad_token;
SELECT count(*) = :audit_rows AS nothing_written FROM durable_ledger.audit_log;

-- the replayed history of the run, as an auditor reads it
SELECT event, attempt, outcome FROM durable_ledger.history('rec-1')
 WHERE key = :'turn2' ORDER BY id;
