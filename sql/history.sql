-- history: history(run) is the run's timeline in order, for auditors and
-- debuggers: its attempts (lease events), every decision, report, pause,
-- resolution and divergence, with keys, tools, args, attempts, outcomes,
-- who and when.
\set VERBOSITY terse

SELECT tool FROM durable_ledger.register_tool('hi.pay', 'maria');

-- attempt 1: a payment completed, a mail failed, a payment left in flight
SELECT durable_ledger.acquire_run('hi-1');
SELECT (durable_ledger.complete_effect(key, '{"payment_id": "pay_1"}')).status
  FROM durable_ledger.begin_effect('hi-1', 'hi.pay', '{"invoice": 1, "memo": "thanks"}');
SELECT (durable_ledger.fail_effect(key, '{"code": "bounced"}')).status
  FROM durable_ledger.begin_effect('hi-1', 'hi.mail', '{"to": "a@example.com"}');
SELECT decision FROM durable_ledger.begin_effect('hi-1', 'hi.pay', '{"invoice": 2}');
-- attempt 2: replays, the one in flight pauses, a drifted payment pauses
SELECT durable_ledger.acquire_run('hi-1');
SELECT decision FROM durable_ledger.begin_effect('hi-1', 'hi.pay', '{"invoice": 1, "memo": "thanks"}');
SELECT decision FROM durable_ledger.begin_effect('hi-1', 'hi.mail', '{"to": "a@example.com"}');
SELECT decision FROM durable_ledger.begin_effect('hi-1', 'hi.pay', '{"invoice": 2}');
SELECT decision FROM durable_ledger.begin_effect('hi-1', 'hi.pay', '{"invoice": 3}');
SELECT durable_ledger.release_run('hi-1');
-- people decide
SELECT status FROM durable_ledger.resolve_effect(durable_ledger.effect_key('hi-1', 'hi.pay', '{"invoice": 2}', 1),
                                                 'failed', '{"checked": "bank"}', 'maria', 'never sent');
SELECT verdict FROM durable_ledger.resolve_divergence(durable_ledger.effect_key('hi-1', 'hi.pay', '{"invoice": 3}', 1),
                                                      'distinct', 'ana');
SELECT durable_ledger.abandon_run('hi-1', 'ana', 'done by hand');

SELECT lease_epoch AS attempt_epoch, event, tool, args, attempt, outcome,
       COALESCE(detail ->> 'resolved_by', detail ->> 'abandoned_by', detail ->> 'cause', detail ->> 'status') AS about,
       role_name = current_user AS by_caller
  FROM durable_ledger.history('hi-1');
-- in order, nothing of another run
SELECT bool_and(id > prev) AS ordered FROM (SELECT id, lag(id, 1, 0::bigint) OVER () AS prev FROM durable_ledger.history('hi-1')) s;
SELECT count(*) FROM durable_ledger.history('no-such-run');
SELECT count(*) FROM durable_ledger.history(NULL);

-- auditors read it; workers do not
CREATE ROLE regress_hi_auditor IN ROLE durable_ledger_auditor;
CREATE ROLE regress_hi_worker IN ROLE durable_ledger_worker;
SET ROLE regress_hi_auditor;
SELECT count(*) > 0 AS auditor_reads FROM durable_ledger.history('hi-1');
SET ROLE regress_hi_worker;
SELECT count(*) FROM durable_ledger.history('hi-1');
RESET ROLE;
DROP ROLE regress_hi_auditor, regress_hi_worker;
