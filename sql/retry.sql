-- retry: "it did not happen: do it again".  retry_effect(key, attempt,
-- resolved_by, note) is a person's finding that the attempt they checked did
-- not happen: the effect is failed (a failed one keeps its error), any
-- conflict flag is cleared, the name and note are recorded and audited
-- ('retry_allowed'), and the next call of the key executes the next attempt
-- under a new provider key (key#attempt) -- for a derived key, whose failure
-- is otherwise replayed for ever, as for a business key.  Asked again: no
-- change.  A completed effect, a live lease, another attempt, NULL or empty
-- arguments and an unknown key are errors that write nothing.
\set VERBOSITY terse

-- ===================================================================
-- a derived key failed (the provider refused: a card declined); its
-- failure is replayed, until a person says to make it again
-- ===================================================================
SELECT durable_ledger.effect_key('rt-1', 'charge', '{"amount": 30}', 1) AS k1 \gset
SELECT decision, attempt, downstream_key = key AS downstream_is_key
  FROM durable_ledger.begin_effect('rt-1', 'charge', '{"amount": 30}');
SELECT status FROM durable_ledger.fail_effect(:'k1', '{"code": "card_declined"}', 1);
SELECT durable_ledger.acquire_run('rt-1');
SELECT decision, status, error FROM durable_ledger.begin_effect('rt-1', 'charge', '{"amount": 30}');

SELECT status, attempt, error, resolved_by, resolution_note, conflict, execute_again
  FROM durable_ledger.retry_effect(:'k1', 1, 'alice', 'the customer updated the card');
SELECT event, attempt, detail, role_name = current_user AS by_current_user
  FROM durable_ledger.audit_log WHERE key = :'k1' AND event = 'retry_allowed';
-- asked again (a retry of the person's own call): no change, no second row
SELECT status, execute_again FROM durable_ledger.retry_effect(:'k1', 1, 'alice');
SELECT count(*) AS retry_rows FROM durable_ledger.audit_log
 WHERE key = :'k1' AND event = 'retry_allowed';

-- the next call executes attempt 2, under the provider key k1#2, once
SELECT durable_ledger.acquire_run('rt-1');
SELECT decision, status, occurrence, attempt, reason, downstream_key = key || '#2' AS new_provider_key
  FROM durable_ledger.begin_effect('rt-1', 'charge', '{"amount": 30}');
SELECT status, attempt, error, resolved_by, resolution_note, execute_again
  FROM durable_ledger.effects WHERE key = :'k1';
SELECT attempt, status, error, resolved_by, resolution_note
  FROM durable_ledger.past_attempts WHERE key = :'k1';
SELECT event, attempt, detail FROM durable_ledger.audit_log
 WHERE key = :'k1' AND event = 'intent' ORDER BY id DESC LIMIT 1;
SELECT status, attempt FROM durable_ledger.complete_effect(:'k1', '{"charge": "ch-2"}', 2);
SELECT durable_ledger.acquire_run('rt-1');
SELECT decision, status, attempt, result FROM durable_ledger.begin_effect('rt-1', 'charge', '{"amount": 30}');
-- a late report of attempt 1 decides nothing of attempt 2
SELECT status, attempt, conflict FROM durable_ledger.fail_effect(:'k1', '{"code": "card_declined"}', 1);

-- ===================================================================
-- an unknown outcome: the person asked the provider, which has no record
-- ===================================================================
SELECT durable_ledger.effect_key('rt-2', 'charge', '{"amount": 40}', 1) AS k2 \gset
SELECT decision FROM durable_ledger.begin_effect('rt-2', 'charge', '{"amount": 40}');
SELECT durable_ledger.release_run('rt-2');
SELECT decision, status FROM durable_ledger.begin_effect('rt-2', 'charge', '{"amount": 40}');
SELECT key = :'k2' AS listed, attempt, downstream_key = key AS provider_key
  FROM durable_ledger.unresolved WHERE run = 'rt-2';
SELECT durable_ledger.release_run('rt-2');
SELECT status, error, resolved_by, execute_again, completed_at IS NOT NULL AS has_completed_at
  FROM durable_ledger.retry_effect(:'k2', 1, 'bob', 'no charge at the bank for rt-2');
SELECT detail ->> 'previous_status' AS previous_status FROM durable_ledger.audit_log
 WHERE key = :'k2' AND event = 'retry_allowed';
SELECT count(*) AS unresolved FROM durable_ledger.unresolved WHERE run = 'rt-2';
SELECT count(*) AS unsettled FROM durable_ledger.unsettled WHERE key = :'k2';
SELECT decision, attempt FROM durable_ledger.begin_effect('rt-2', 'charge', '{"amount": 40}');
SELECT attempt, status FROM durable_ledger.past_attempts WHERE key = :'k2';
SELECT durable_ledger.release_run('rt-2');

-- ===================================================================
-- a contradicted completion (a failure reported for it): the person finds
-- it did not happen, resolves it as failed, and asks for it again
-- ===================================================================
SELECT durable_ledger.effect_key('rt-3', 'charge', '{"amount": 50}', 1) AS k3 \gset
SELECT decision FROM durable_ledger.begin_effect('rt-3', 'charge', '{"amount": 50}');
SELECT status FROM durable_ledger.complete_effect(:'k3', '{"charge": "ch-3"}', 1);
SELECT status, conflict FROM durable_ledger.fail_effect(:'k3', '{"code": "reversed"}', 1);
-- a completion stands until a person resolves it otherwise: a retry of it is
-- refused, flagged or not (it happened, as far as the ledger knows)
SELECT regress_sqlstate(format($$SELECT durable_ledger.retry_effect(%L, 1, 'carol')$$, :'k3'));
SELECT status, error, conflict FROM durable_ledger.resolve_effect(:'k3', 'failed', '{"code": "reversed"}',
                                                                 'carol', 'the bank reversed it');
SELECT status, result, error, conflict, execute_again
  FROM durable_ledger.retry_effect(:'k3', 1, 'carol', 'the charge was reversed');
SELECT detail ->> 'previous_status' AS previous_status, detail -> 'previous_error' AS previous_error
  FROM durable_ledger.audit_log WHERE key = :'k3' AND event = 'retry_allowed';
SELECT count(*) AS unresolved FROM durable_ledger.unresolved WHERE key = :'k3';

-- ===================================================================
-- a business key: its failure is executed again anyway; a retry says so
-- by name, and the next attempt is the same as without it
-- ===================================================================
SELECT decision, attempt FROM durable_ledger.begin_effect('rt-4', 'pay_invoice', '{"invoice": 9}', 'RT-INV-9');
SELECT status FROM durable_ledger.fail_effect('RT-INV-9', '{"code": "insufficient_funds"}', 1);
SELECT status, error, execute_again FROM durable_ledger.retry_effect('RT-INV-9', 1, 'dave');
SELECT decision, attempt, downstream_key FROM durable_ledger.begin_effect('rt-4', 'pay_invoice', '{"invoice": 9}', 'RT-INV-9');
SELECT durable_ledger.release_run('rt-4');

-- ===================================================================
-- refusals: each writes nothing
-- ===================================================================
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT durable_ledger.effect_key('rt-5', 'charge', '{"amount": 60}', 1) AS k5 \gset
SELECT decision FROM durable_ledger.begin_effect('rt-5', 'charge', '{"amount": 60}');
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
-- under a live lease: the worker will report
SELECT regress_sqlstate(format($$SELECT durable_ledger.retry_effect(%L, 1, 'eve')$$, :'k5'));
SELECT status FROM durable_ledger.complete_effect(:'k5', '{"charge": "ch-5"}', 1);
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
-- completed: it happened, and would happen twice
SELECT regress_sqlstate(format($$SELECT durable_ledger.retry_effect(%L, 1, 'eve')$$, :'k5'));
-- k1 is at attempt 2: attempt 1 was replaced, attempt 3 does not exist
SELECT regress_sqlstate(format($$SELECT durable_ledger.retry_effect(%L, 1, 'eve')$$, :'k1'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.retry_effect(%L, 3, 'eve')$$, :'k1'));
-- bad input
SELECT regress_sqlstate(format($$SELECT durable_ledger.retry_effect(%L, NULL, 'eve')$$, :'k2'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.retry_effect(%L, 0, 'eve')$$, :'k2'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.retry_effect(%L, 2, NULL)$$, :'k2'));
SELECT regress_sqlstate(format($$SELECT durable_ledger.retry_effect(%L, 2, '')$$, :'k2'));
SELECT regress_sqlstate($$SELECT durable_ledger.retry_effect(NULL, 1, 'eve')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.retry_effect('no-such-key', 1, 'eve')$$);
SELECT count(*) - :audit_rows AS audit_rows_written FROM durable_ledger.audit_log;

-- rolled back, a retry leaves nothing: the failure is replayed still
SELECT durable_ledger.effect_key('rt-6', 'charge', '{"amount": 70}', 1) AS k6 \gset
SELECT decision FROM durable_ledger.begin_effect('rt-6', 'charge', '{"amount": 70}');
SELECT status FROM durable_ledger.fail_effect(:'k6', '{"code": "card_declined"}', 1);
BEGIN;
SELECT execute_again FROM durable_ledger.retry_effect(:'k6', 1, 'frank');
ROLLBACK;
SELECT status, execute_again, resolved_by FROM durable_ledger.effects WHERE key = :'k6';
SELECT count(*) AS retry_rows FROM durable_ledger.audit_log WHERE key = :'k6' AND event = 'retry_allowed';
SELECT durable_ledger.acquire_run('rt-6');
SELECT decision, status FROM durable_ledger.begin_effect('rt-6', 'charge', '{"amount": 70}');

-- a resolution after a retry asked for: a failed effect needs none
SELECT status FROM durable_ledger.retry_effect(:'k6', 1, 'frank');
SELECT regress_sqlstate(format($$SELECT durable_ledger.resolve_effect(%L, 'completed', NULL, 'frank')$$, :'k6'));

-- nothing here may be run by a worker
CREATE ROLE regress_rt_worker;
GRANT durable_ledger_worker TO regress_rt_worker;
SET ROLE regress_rt_worker;
SELECT regress_sqlstate(format($$SELECT durable_ledger.retry_effect(%L, 1, 'mallory')$$, :'k6'));
RESET ROLE;
DROP ROLE regress_rt_worker;

-- ===================================================================
-- a tool watched for divergence (warn): the call made again in a later
-- attempt is that attempt's replay of the earlier effect.  Its row moves
-- into the new epoch, so it is counted first, while it is one of the earlier
-- effects the attempt counted (a drifted call counted them: 2): once the
-- attempt replayed both, its next new call executes without a warning
-- ===================================================================
SELECT tool FROM durable_ledger.register_tool('rt_watched', 'regress', divergence => 'warn');
SELECT durable_ledger.effect_key('rt-7', 'rt_watched', '{"n": 1}', 1) AS k7 \gset
SELECT durable_ledger.effect_key('rt-7', 'rt_watched', '{"n": 2}', 1) AS k8 \gset
SELECT decision FROM durable_ledger.begin_effect('rt-7', 'rt_watched', '{"n": 2}');
SELECT status FROM durable_ledger.complete_effect(:'k8', '{"ok": 2}', 1);
SELECT decision FROM durable_ledger.begin_effect('rt-7', 'rt_watched', '{"n": 1}');
SELECT status FROM durable_ledger.fail_effect(:'k7', '{"code": "timeout_before_send"}', 1);
SELECT status FROM durable_ledger.retry_effect(:'k7', 1, 'gina');
SELECT durable_ledger.acquire_run('rt-7');
SELECT decision, attempt FROM durable_ledger.begin_effect('rt-7', 'rt_watched', '{"n": 3}');
SELECT decision, attempt FROM durable_ledger.begin_effect('rt-7', 'rt_watched', '{"n": 2}');
SELECT decision, attempt FROM durable_ledger.begin_effect('rt-7', 'rt_watched', '{"n": 1}');
SELECT decision, attempt FROM durable_ledger.begin_effect('rt-7', 'rt_watched', '{"n": 4}');
SELECT count(*) AS divergences FROM durable_ledger.audit_log WHERE run = 'rt-7' AND event = 'divergence';
SELECT durable_ledger.release_run('rt-7');

-- ===================================================================
-- a retry asked for is the run's, and waits for its next call: a fork
-- carries the failure, not the retry (the new run replays it, the source
-- run makes it again), and purge_settled keeps the run
-- ===================================================================
SELECT durable_ledger.effect_key('rt-8', 'charge', '{"amount": 80}', 1) AS k8 \gset
SELECT decision FROM durable_ledger.begin_effect('rt-8', 'charge', '{"amount": 80}');
SELECT status FROM durable_ledger.fail_effect(:'k8', '{"code": "card_declined"}', 1);
SELECT durable_ledger.release_run('rt-8');
SELECT status FROM durable_ledger.retry_effect(:'k8', 1, 'hana');
SELECT durable_ledger.fork_run('rt-8', 'rt-8-fork', :'k8', 'hana');
SELECT status, attempt, execute_again FROM durable_ledger.effects WHERE run = 'rt-8-fork';
SELECT decision, status, attempt FROM durable_ledger.begin_effect('rt-8-fork', 'charge', '{"amount": 80}');
SELECT durable_ledger.release_run('rt-8-fork');
SELECT run FROM durable_ledger.purge_settled('0', 'hana', dry_run => true) WHERE run LIKE 'rt-8%' ORDER BY run;
SELECT decision, attempt FROM durable_ledger.begin_effect('rt-8', 'charge', '{"amount": 80}');
SELECT durable_ledger.release_run('rt-8');

-- ===================================================================
-- a drifted call that a verdict made the same as a retried effect replays
-- its failure: executing it would perform its own args under the effect's
-- record (the retry is of the effect's own call)
-- ===================================================================
SELECT tool FROM durable_ledger.register_tool('rt_paused', 'regress', divergence => 'pause');
SELECT durable_ledger.effect_key('rt-9', 'rt_paused', '{"amount": 30}', 1) AS k9 \gset
SELECT decision FROM durable_ledger.begin_effect('rt-9', 'rt_paused', '{"amount": 30}');
SELECT status FROM durable_ledger.fail_effect(:'k9', '{"code": "card_declined"}', 1);
SELECT status FROM durable_ledger.retry_effect(:'k9', 1, 'ivan');
SELECT durable_ledger.acquire_run('rt-9');
SELECT key AS d9, decision, status FROM durable_ledger.begin_effect('rt-9', 'rt_paused', '{"amount": 99}') \gset
SELECT :'decision' AS decision, :'d9' <> :'k9' AS drifted;
SELECT verdict FROM durable_ledger.resolve_divergence(:'d9', 'same', 'ivan');
SELECT key = :'k9' AS is_k9, decision, status, attempt, error
  FROM durable_ledger.begin_effect('rt-9', 'rt_paused', '{"amount": 99}');
SELECT key = :'k9' AS is_k9, decision, attempt
  FROM durable_ledger.begin_effect('rt-9', 'rt_paused', '{"amount": 30}');
SELECT durable_ledger.release_run('rt-9');
