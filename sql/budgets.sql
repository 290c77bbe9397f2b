-- budgets: what stops a runaway loop.  A registered tool's budget per run
-- (set_budget: executions, and executions within a window), every run's
-- budget of attempts (set_attempts_budget) and a run's own
-- (set_run_budget).  The call that would pass one pauses, is listed in
-- unresolved, and executes once a person raised the run's budget.  Only
-- executions count: never a replay, a pause, or a rolled-back call.  And the
-- model of each attempt (meta.model): a change is audited once per attempt,
-- and a divergence pause says so.
\set VERBOSITY terse

SELECT tool FROM durable_ledger.register_tool('bu_email', 'regress', key_fields => '{to}');
SELECT tool, max_executions, max_in_window, budget_window
  FROM durable_ledger.set_budget('bu_email', 3, 'ops', 'three emails a run');
SELECT detail ->> 'max_executions' AS max, detail ->> 'previous_max_executions' AS before
  FROM durable_ledger.audit_log WHERE event = 'tool_changed' ORDER BY id DESC LIMIT 1;
-- bad budgets: refused, nothing written
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_sqlstate($$SELECT durable_ledger.set_budget('bu_email', 0, 'ops')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_budget('bu_email', 3, 'ops', max_in_window => 2)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_budget('bu_email', 3, 'ops', max_in_window => 2, budget_window => '-1 minute')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_budget('bu_nobody', 3, 'ops')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_budget('bu_email', 3, NULL)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_attempts_budget(0, 'ops')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_run_budget('bu-1', 'ops')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_run_budget('bu-1', 'ops', max_executions => 5)$$);
SELECT count(*) - :audit_rows AS audit_rows_written FROM durable_ledger.audit_log;
SELECT has_function_privilege('durable_ledger_worker', 'durable_ledger.set_budget(text,integer,text,text,integer,interval)', 'EXECUTE') AS worker_sets,
       has_function_privilege('durable_ledger_admin', 'durable_ledger.set_run_budget(text,text,text,text,integer,integer,integer)', 'EXECUTE') AS admin_raises,
       has_table_privilege('durable_ledger_auditor', 'durable_ledger.run_budgets', 'SELECT') AS auditor_reads;

-- ===================================================================
-- the seeds' email loop: each call reworded, a new call; the fourth pauses
-- ===================================================================
SELECT durable_ledger.acquire_run('bu-1');
SELECT g, b.decision, b.status, b.attempt, b.key IS NOT NULL AS has_key, b.downstream_key IS NULL AS no_downstream_key
  FROM generate_series(1, 5) g,
       LATERAL durable_ledger.begin_effect('bu-1', 'bu_email',
                 jsonb_build_object('to', 'user' || g || '@example.com', 'body', 'Welcome!')) b
 ORDER BY g;
SELECT executions, recent, max_executions, paused_args, paused_epoch, paused_reason
  FROM durable_ledger.run_budgets WHERE run = 'bu-1';
SELECT status, reason, args, attempt, lease_epoch FROM durable_ledger.unresolved WHERE run = 'bu-1';
SELECT detail FROM durable_ledger.audit_log WHERE run = 'bu-1' AND event = 'pause' ORDER BY id;
-- the same email again in this attempt is a new call (its second occurrence): paused too
SELECT status FROM durable_ledger.complete_effect(durable_ledger.effect_key('bu-1', 'bu_email', '{"to": "user1@example.com"}', 1), '{"sent": true}');
SELECT decision, status FROM durable_ledger.begin_effect('bu-1', 'bu_email', '{"to": "user1@example.com", "body": "Welcome!"}');
SELECT executions FROM durable_ledger.run_budgets WHERE run = 'bu-1';
-- a rolled-back execution counts nothing
SELECT durable_ledger.set_run_budget('bu-1', 'ops', 'one more', tool => 'bu_email', max_executions => 4);
SELECT count(*) AS listed FROM durable_ledger.unresolved WHERE run = 'bu-1';
SELECT detail ->> 'pauses_answered' AS answered, detail ->> 'max_executions' AS max
  FROM durable_ledger.audit_log WHERE event = 'budget_changed' AND run = 'bu-1';
BEGIN;
SELECT decision FROM durable_ledger.begin_effect('bu-1', 'bu_email', '{"to": "user4@example.com", "body": "Welcome!"}');
SELECT executions FROM durable_ledger.run_budgets WHERE run = 'bu-1';
ROLLBACK;
SELECT executions FROM durable_ledger.run_budgets WHERE run = 'bu-1';
-- the call the budget paused executes once it is raised, and the next pauses
SELECT decision FROM durable_ledger.begin_effect('bu-1', 'bu_email', '{"to": "user4@example.com", "body": "Welcome!"}');
SELECT decision FROM durable_ledger.begin_effect('bu-1', 'bu_email', '{"to": "user5@example.com", "body": "Welcome!"}');
SELECT executions, max_executions, paused_args FROM durable_ledger.run_budgets WHERE run = 'bu-1';
-- another run has its own count
SELECT durable_ledger.acquire_run('bu-2');
SELECT decision FROM durable_ledger.begin_effect('bu-2', 'bu_email', '{"to": "user1@example.com", "body": "Welcome!"}');
SELECT run, executions FROM durable_ledger.run_budgets WHERE tool = 'bu_email' ORDER BY run;
SELECT durable_ledger.release_run('bu-1'), durable_ledger.release_run('bu-2');
-- a replay is no execution: in the next attempt the first email replays, over the budget
SELECT durable_ledger.acquire_run('bu-1');
SELECT decision, status FROM durable_ledger.begin_effect('bu-1', 'bu_email', '{"to": "user1@example.com", "body": "Welcome!"}');
SELECT executions FROM durable_ledger.run_budgets WHERE run = 'bu-1';
SELECT durable_ledger.release_run('bu-1');

-- ===================================================================
-- a window: at most two within an hour
-- ===================================================================
SELECT tool FROM durable_ledger.register_tool('bu_upsert', 'regress');
SELECT tool, max_executions, max_in_window, budget_window
  FROM durable_ledger.set_budget('bu_upsert', NULL, 'ops', max_in_window => 2, budget_window => '1 hour');
SELECT durable_ledger.acquire_run('bu-3');
SELECT g, b.decision, left(b.reason, 60) AS reason
  FROM generate_series(1, 3) g,
       LATERAL durable_ledger.begin_effect('bu-3', 'bu_upsert', jsonb_build_object('crm', g)) b ORDER BY g;
SELECT executions, cardinality(recent) AS in_window FROM durable_ledger.run_budgets WHERE run = 'bu-3';
-- the window's executions are by the clock: moved back by hand, it has room again
UPDATE durable_ledger.run_budgets SET recent = ARRAY[now() - interval '2 hours', now() - interval '90 minutes']
 WHERE run = 'bu-3';
SELECT decision FROM durable_ledger.begin_effect('bu-3', 'bu_upsert', '{"crm": 3}');
SELECT executions, cardinality(recent) AS in_window, paused_at IS NULL AS answered FROM durable_ledger.run_budgets WHERE run = 'bu-3';
SELECT durable_ledger.release_run('bu-3');

-- ===================================================================
-- attempts: every run's budget, and one run's own
-- ===================================================================
SELECT durable_ledger.set_attempts_budget(2, 'ops', 'two attempts');
SELECT durable_ledger.set_attempts_budget(2, 'ops') AS replaced;
SELECT tool FROM durable_ledger.register_tool('bu_pay', 'regress');
SELECT durable_ledger.acquire_run('bu-4');
SELECT decision FROM durable_ledger.begin_effect('bu-4', 'bu_pay', '{"n": 1}');
SELECT status FROM durable_ledger.complete_effect(durable_ledger.effect_key('bu-4', 'bu_pay', '{"n": 1}', 1), '{}');
SELECT durable_ledger.release_run('bu-4');
SELECT durable_ledger.acquire_run('bu-4');
SELECT decision FROM durable_ledger.begin_effect('bu-4', 'bu_pay', '{"n": 1}');
SELECT decision FROM durable_ledger.begin_effect('bu-4', 'bu_pay', '{"n": 2}');
SELECT status FROM durable_ledger.complete_effect(durable_ledger.effect_key('bu-4', 'bu_pay', '{"n": 2}', 1), '{}');
SELECT durable_ledger.release_run('bu-4');
SELECT durable_ledger.acquire_run('bu-4');
-- attempt 3: a replay still replays; what would execute pauses
SELECT decision FROM durable_ledger.begin_effect('bu-4', 'bu_pay', '{"n": 1}');
SELECT decision FROM durable_ledger.begin_effect('bu-4', 'bu_pay', '{"n": 2}');
SELECT decision, reason FROM durable_ledger.begin_effect('bu-4', 'bu_pay', '{"n": 3}');
SELECT tool, reason, lease_epoch FROM durable_ledger.unresolved WHERE run = 'bu-4';
SELECT durable_ledger.set_run_budget('bu-4', 'ops', 'a third try', max_attempts => 3);
SELECT max_attempts FROM durable_ledger.runs WHERE run = 'bu-4';
SELECT decision FROM durable_ledger.begin_effect('bu-4', 'bu_pay', '{"n": 3}');
SELECT durable_ledger.release_run('bu-4');
-- a budgeted tool's call past the attempts: its counter row is the one paused
SELECT durable_ledger.acquire_run('bu-6');
SELECT decision FROM durable_ledger.begin_effect('bu-6', 'bu_email', '{"to": "user1@example.com", "body": "Hi"}');
SELECT status FROM durable_ledger.complete_effect(durable_ledger.effect_key('bu-6', 'bu_email', '{"to": "user1@example.com"}', 1), '{}');
SELECT durable_ledger.release_run('bu-6');
SELECT durable_ledger.acquire_run('bu-6'), durable_ledger.release_run('bu-6');
SELECT durable_ledger.acquire_run('bu-6');
SELECT decision FROM durable_ledger.begin_effect('bu-6', 'bu_email', '{"to": "user1@example.com", "body": "Hi"}');
SELECT decision, left(reason, 40) AS reason FROM durable_ledger.begin_effect('bu-6', 'bu_email', '{"to": "user2@example.com", "body": "Hi"}');
SELECT executions, paused_args, left(paused_reason, 40) AS paused_reason FROM durable_ledger.run_budgets WHERE run = 'bu-6';
SELECT durable_ledger.release_run('bu-6');
SELECT durable_ledger.set_attempts_budget(NULL, 'ops') AS replaced;

-- ===================================================================
-- the model of each attempt
-- ===================================================================
SELECT tool FROM durable_ledger.register_tool('bu_book', 'regress');
SELECT durable_ledger.acquire_run('bu-5');
SELECT decision FROM durable_ledger.begin_effect('bu-5', 'bu_book', '{"flight": "LH 400"}', meta => '{"model": "model-a"}');
SELECT status FROM durable_ledger.complete_effect(durable_ledger.effect_key('bu-5', 'bu_book', '{"flight": "LH 400"}', 1), '{}');
SELECT decision FROM durable_ledger.begin_effect('bu-5', 'bu_book', '{"flight": "LH 402"}', meta => '{"model": "model-a"}');
SELECT durable_ledger.release_run('bu-5');
SELECT durable_ledger.acquire_run('bu-5');
-- attempt 2 calls with another model: audited once; its drifted call's pause says so
SELECT decision FROM durable_ledger.begin_effect('bu-5', 'bu_book', '{"flight": "LH 400"}', meta => '{"model": "model-b"}');
SELECT decision, reason FROM durable_ledger.begin_effect('bu-5', 'bu_book', '{"flight": "LH 403"}', meta => '{"model": "model-b"}');
SELECT lease_epoch, model, changed_from FROM durable_ledger.run_models WHERE run = 'bu-5' ORDER BY lease_epoch;
SELECT event, lease_epoch, detail FROM durable_ledger.history('bu-5') WHERE event = 'model_changed';
SELECT durable_ledger.release_run('bu-5');
-- the same model again: nothing audited
SELECT durable_ledger.acquire_run('bu-5');
SELECT decision FROM durable_ledger.begin_effect('bu-5', 'bu_book', '{"flight": "LH 400"}', meta => '{"model": "model-b"}');
SELECT durable_ledger.release_run('bu-5');
SELECT count(*) AS model_changes FROM durable_ledger.audit_log WHERE run = 'bu-5' AND event = 'model_changed';
SELECT lease_epoch, model, changed_from FROM durable_ledger.run_models WHERE run = 'bu-5' ORDER BY lease_epoch;

-- ===================================================================
-- what else answers a pause, a fork, a recorded call, retention
-- ===================================================================
SELECT tool FROM durable_ledger.register_tool('bu_ping', 'regress');
SELECT tool FROM durable_ledger.set_budget('bu_ping', 1, 'ops');
SELECT durable_ledger.acquire_run('bu-7');
SELECT decision FROM durable_ledger.begin_effect('bu-7', 'bu_ping', '{"n": 1}');
SELECT key AS k_ping2, decision FROM durable_ledger.begin_effect('bu-7', 'bu_ping', '{"n": 2}') \gset
SELECT count(*) AS listed FROM durable_ledger.unresolved WHERE run = 'bu-7';
-- the tool's budget removed: its pauses are answered (audited), and the call executes
SELECT tool, max_executions FROM durable_ledger.set_budget('bu_ping', NULL, 'ops', 'no limit after all');
SELECT detail ->> 'pauses_answered' AS answered FROM durable_ledger.audit_log
 WHERE event = 'tool_changed' AND detail ->> 'tool' = 'bu_ping' ORDER BY id DESC LIMIT 1;
SELECT decision FROM durable_ledger.begin_effect('bu-7', 'bu_ping', '{"n": 2}');
SELECT count(*) AS listed FROM durable_ledger.unresolved WHERE run = 'bu-7';
-- an execution of the tool in the run answers its pause
SELECT tool FROM durable_ledger.set_budget('bu_ping', 2, 'ops');
SELECT decision FROM durable_ledger.begin_effect('bu-7', 'bu_ping', '{"n": 3}');
SELECT decision FROM durable_ledger.begin_effect('bu-7', 'bu_ping', '{"n": 4}');
UPDATE durable_ledger.run_budgets SET max_executions = 3 WHERE run = 'bu-7';   -- by hand: nothing answered
SELECT decision FROM durable_ledger.begin_effect('bu-7', 'bu_ping', '{"n": 4}');
SELECT count(*) AS listed, (SELECT paused_at IS NULL FROM durable_ledger.run_budgets WHERE run = 'bu-7') AS answered
  FROM durable_ledger.unresolved WHERE run = 'bu-7';
-- a pause whose call executed since it was recorded is not listed, whatever left it
UPDATE durable_ledger.run_budgets b SET paused_at = e.created_at - interval '1 second', paused_key = e.key,
       paused_args = e.args, paused_epoch = e.lease_epoch, paused_reason = 'budget: by hand', paused_budget = 'executions'
  FROM durable_ledger.effects e WHERE b.run = 'bu-7' AND e.key = durable_ledger.effect_key('bu-7', 'bu_ping', '{"n": 4}', 1);
SELECT count(*) AS listed FROM durable_ledger.unresolved WHERE run = 'bu-7';
UPDATE durable_ledger.run_budgets SET paused_at = paused_at + interval '1 hour' WHERE run = 'bu-7';
SELECT count(*) AS listed_if_before FROM durable_ledger.unresolved WHERE run = 'bu-7';
UPDATE durable_ledger.run_budgets SET paused_at = NULL WHERE run = 'bu-7';
SELECT count(*) FROM durable_ledger.effects e, LATERAL durable_ledger.complete_effect(e.key, '{}') c
 WHERE e.run = 'bu-7' AND e.status = 'started';
SELECT durable_ledger.release_run('bu-7');
-- a fork starts counting at what it carries: no way around the budget
SELECT durable_ledger.fork_run('bu-7', 'bu-7g', durable_ledger.effect_key('bu-7', 'bu_ping', '{"n": 2}', 1), 'ops');
SELECT run, executions FROM durable_ledger.run_budgets WHERE run = 'bu-7g';
SELECT durable_ledger.acquire_run('bu-7g');
SELECT n, d.decision FROM generate_series(1, 4) n,
       durable_ledger.begin_effect('bu-7g', 'bu_ping', jsonb_build_object('n', n)) d ORDER BY n;
SELECT durable_ledger.release_run('bu-7g');
-- a forked run's first attempt is attempt 1 of its budget of attempts
SELECT durable_ledger.set_attempts_budget(1, 'ops');
SELECT durable_ledger.fork_run('bu-7', 'bu-7h', durable_ledger.effect_key('bu-7', 'bu_ping', '{"n": 1}', 1), 'ops');
SELECT durable_ledger.acquire_run('bu-7h');
SELECT decision FROM durable_ledger.begin_effect('bu-7h', 'bu_other', '{"n": 1}');
SELECT status FROM durable_ledger.complete_effect(durable_ledger.effect_key('bu-7h', 'bu_other', '{"n": 1}', 1), '{}');
SELECT durable_ledger.release_run('bu-7h');
SELECT durable_ledger.acquire_run('bu-7h');
SELECT decision FROM durable_ledger.begin_effect('bu-7h', 'bu_other', '{"n": 1}');
SELECT decision, reason FROM durable_ledger.begin_effect('bu-7h', 'bu_other', '{"n": 2}');
SELECT durable_ledger.release_run('bu-7h');
-- every run's budget removed: its pauses are answered
SELECT durable_ledger.set_attempts_budget(NULL, 'ops');
SELECT count(*) AS listed FROM durable_ledger.unresolved WHERE run = 'bu-7h';
-- a recorded call made again past a budget: the pause says its attempt is unknown
SELECT tool FROM durable_ledger.register_tool('bu_lookup', 'regress', side_effecting => false);
SELECT tool FROM durable_ledger.set_budget('bu_lookup', 1, 'ops');
SELECT durable_ledger.acquire_run('bu-8');
SELECT decision FROM durable_ledger.begin_recorded('bu-8', 'bu_lookup', '{"q": 1}');
SELECT durable_ledger.release_run('bu-8');
SELECT durable_ledger.acquire_run('bu-8');
SELECT decision, status, attempt FROM durable_ledger.begin_recorded('bu-8', 'bu_lookup', '{"q": 1}');
SELECT durable_ledger.release_run('bu-8');
-- retention: a run a budget paused is not settled
SELECT durable_ledger.acquire_run('bu-9');
SELECT status FROM durable_ledger.complete_effect(
  (SELECT key FROM durable_ledger.begin_effect('bu-9', 'bu_ping', '{"n": 1}')), '{}');
SELECT status FROM durable_ledger.complete_effect(
  (SELECT key FROM durable_ledger.begin_effect('bu-9', 'bu_ping', '{"n": 2}')), '{}');
SELECT status FROM durable_ledger.complete_effect(
  (SELECT key FROM durable_ledger.begin_effect('bu-9', 'bu_ping', '{"n": 3}')), '{}');
SELECT decision FROM durable_ledger.begin_effect('bu-9', 'bu_ping', '{"n": 4}');
SELECT durable_ledger.release_run('bu-9');
SELECT count(*) AS purged FROM durable_ledger.purge_settled('0 seconds', 'ops', dry_run => false) WHERE run = 'bu-9';
SELECT count(*) AS effects_kept FROM durable_ledger.effects WHERE run = 'bu-9';
-- bad input: a run never seen, a window of months
SELECT regress_sqlstate($$SELECT durable_ledger.set_run_budget('bu-nobody', 'ops', tool => 'bu_ping', max_executions => 5)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_budget('bu_ping', 3, 'ops', max_in_window => 2, budget_window => '1 month')$$);
SELECT count(*) AS rows_for_nobody FROM durable_ledger.run_budgets WHERE run = 'bu-nobody';
-- many executions in one transaction: each counted from the version it wrote
-- last, also past a rolled-back savepoint and a person's change in between
SELECT tool FROM durable_ledger.set_budget('bu_ping', 6, 'ops');
SELECT durable_ledger.acquire_run('bu-10');
BEGIN;
SELECT count(*) FROM generate_series(1, 2) n, durable_ledger.begin_effect('bu-10', 'bu_ping', jsonb_build_object('n', n)) d
 WHERE d.decision = 'execute';
SAVEPOINT s;
SELECT decision FROM durable_ledger.begin_effect('bu-10', 'bu_ping', '{"n": 3}');
ROLLBACK TO SAVEPOINT s;
SELECT decision FROM durable_ledger.begin_effect('bu-10', 'bu_ping', '{"n": 4}');
SELECT durable_ledger.set_run_budget('bu-10', 'ops', tool => 'bu_ping', max_executions => 5);
SELECT count(*) FILTER (WHERE d.decision = 'execute') AS executed, count(*) FILTER (WHERE d.decision = 'pause') AS paused
  FROM generate_series(5, 9) n, durable_ledger.begin_effect('bu-10', 'bu_ping', jsonb_build_object('n', n)) d;
SELECT executions, max_executions FROM durable_ledger.run_budgets WHERE run = 'bu-10';
COMMIT;
SELECT executions, max_executions, paused_args FROM durable_ledger.run_budgets WHERE run = 'bu-10';
SELECT count(*) AS effects FROM durable_ledger.effects WHERE run = 'bu-10';
SELECT durable_ledger.release_run('bu-10');
-- ... past a change by hand of the counter, and a TRUNCATE, in the transaction
BEGIN;
SELECT durable_ledger.acquire_run('bu-14');
SELECT decision FROM durable_ledger.begin_effect('bu-14', 'bu_ping', '{"n": 1}');
UPDATE durable_ledger.run_budgets SET executions = 4 WHERE run = 'bu-14';
SELECT n, d.decision FROM generate_series(2, 4) n, durable_ledger.begin_effect('bu-14', 'bu_ping', jsonb_build_object('n', n)) d ORDER BY n;
SELECT executions FROM durable_ledger.run_budgets WHERE run = 'bu-14';
TRUNCATE durable_ledger.run_budgets;
SELECT durable_ledger.acquire_run('bu-11');
SELECT decision FROM durable_ledger.begin_effect('bu-11', 'bu_ping', '{"n": 1}');
SELECT decision FROM durable_ledger.begin_effect('bu-14', 'bu_ping', '{"n": 5}');
SELECT run, executions FROM durable_ledger.run_budgets ORDER BY run;
ROLLBACK;

-- a change of one budget answers only the pauses it no longer holds
SELECT tool FROM durable_ledger.register_tool('bu_t', 'regress');
SELECT tool FROM durable_ledger.register_tool('bu_u', 'regress');
SELECT tool FROM durable_ledger.set_budget('bu_t', 1, 'ops');
SELECT tool FROM durable_ledger.set_budget('bu_u', 1, 'ops');
SELECT durable_ledger.acquire_run('bu-12');
SELECT t, n, d.decision FROM unnest('{bu_t,bu_u}'::text[]) t, generate_series(1, 2) n,
       durable_ledger.begin_effect('bu-12', t, jsonb_build_object('n', n)) d ORDER BY t, n;
SELECT count(*) FROM durable_ledger.effects e, LATERAL durable_ledger.complete_effect(e.key, '{}') c
 WHERE e.run = 'bu-12' AND e.status = 'started';
SELECT durable_ledger.release_run('bu-12');
SELECT tool FROM durable_ledger.unresolved WHERE run = 'bu-12' ORDER BY tool;
SELECT durable_ledger.set_run_budget('bu-12', 'ops', tool => 'bu_u', max_executions => 5);
SELECT tool FROM durable_ledger.unresolved WHERE run = 'bu-12' ORDER BY tool;
SELECT tool FROM durable_ledger.set_budget('bu_t', 1, 'ops', 'the same limit');
SELECT tool FROM durable_ledger.unresolved WHERE run = 'bu-12' ORDER BY tool;
SELECT tool FROM durable_ledger.set_budget('bu_t', 2, 'ops', 'raised past the count');
SELECT count(*) AS listed FROM durable_ledger.unresolved WHERE run = 'bu-12';

-- a fork keeps its source's window
SELECT tool FROM durable_ledger.register_tool('bu_w', 'regress');
SELECT tool FROM durable_ledger.set_budget('bu_w', NULL, 'ops', max_in_window => 2, budget_window => '1 hour');
SELECT durable_ledger.acquire_run('bu-13');
SELECT n, d.decision FROM generate_series(1, 3) n, durable_ledger.begin_effect('bu-13', 'bu_w', jsonb_build_object('n', n)) d ORDER BY n;
SELECT count(*) FROM durable_ledger.effects e, LATERAL durable_ledger.complete_effect(e.key, '{}') c
 WHERE e.run = 'bu-13' AND e.status = 'started';
SELECT durable_ledger.release_run('bu-13');
SELECT durable_ledger.fork_run('bu-13', 'bu-13f', durable_ledger.effect_key('bu-13', 'bu_w', '{"n": 2}', 1), 'ops');
SELECT executions, cardinality(recent) AS in_window FROM durable_ledger.run_budgets WHERE run = 'bu-13f';
SELECT durable_ledger.acquire_run('bu-13f');
SELECT n, d.decision FROM generate_series(1, 3) n, durable_ledger.begin_effect('bu-13f', 'bu_w', jsonb_build_object('n', n)) d ORDER BY n;
SELECT durable_ledger.release_run('bu-13f');
SELECT regress_sqlstate($$SELECT durable_ledger.set_budget('bu_w', NULL, 'ops', max_in_window => 2147483647, budget_window => '1 hour')$$);

-- an attempt's model is noted once (an epoch counter), and a rolled-back call notes nothing
SELECT durable_ledger.acquire_run('bu-15');
BEGIN;
SELECT decision FROM durable_ledger.begin_effect('bu-15', 'bu_book', '{"flight": "LH 1"}', meta => '{"model": "model-x"}');
ROLLBACK;
SELECT decision FROM durable_ledger.begin_effect('bu-15', 'bu_book', '{"flight": "LH 1"}', meta => '{"model": "model-y"}');
SELECT decision FROM durable_ledger.begin_effect('bu-15', 'bu_book', '{"flight": "LH 2"}', meta => '{"model": "model-z"}');
SELECT lease_epoch, model FROM durable_ledger.run_models WHERE run = 'bu-15';
SELECT durable_ledger.release_run('bu-15');
