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
