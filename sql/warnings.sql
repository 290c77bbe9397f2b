-- warnings: every WARNING the ledger sends has a SQLSTATE of its own (1.3),
-- so that a client passes it on (a log record, an event) without reading its
-- text: 01L01 a call executed although it diverges (policy warn), 01L02 a
-- tool nobody registered (policy warn), 01L03 a report kept as a conflict and
-- flagged for a person, 01L04 a report kept as superseded (a recorded call
-- made again; nobody is needed).
\set VERBOSITY sqlstate

-- 01L01
SELECT tool FROM durable_ledger.register_tool('wn.mail', 'regress', divergence => 'warn');
SELECT durable_ledger.acquire_run('wn-1');
SELECT decision FROM durable_ledger.begin_effect('wn-1', 'wn.mail', '{"body": "a"}');
SELECT durable_ledger.acquire_run('wn-1');
SELECT decision FROM durable_ledger.begin_effect('wn-1', 'wn.mail', '{"body": "b"}');
SELECT durable_ledger.release_run('wn-1');

-- 01L02
SELECT durable_ledger.set_unregistered_tools('warn', 'regress') AS previous;
SELECT decision FROM durable_ledger.begin_effect('wn-2', 'wn.unregistered', '{"n": 1}');
SELECT durable_ledger.set_unregistered_tools('allow', 'regress') AS previous;

-- 01L03: a contradicting report; a report that names no attempt, on a
-- business key at its second attempt
SELECT key AS k2 FROM durable_ledger.effects WHERE run = 'wn-2' \gset
SELECT status FROM durable_ledger.complete_effect(:'k2', '{"sent": 1}');
SELECT status, conflict FROM durable_ledger.complete_effect(:'k2', '{"sent": 2}');
SELECT decision, (durable_ledger.fail_effect(key, '{"code": "busy"}', attempt)).status
  FROM durable_ledger.begin_effect('wn-3', 'wn.pay', '{"invoice": 1}', 'WN-BK');
SELECT decision, attempt FROM durable_ledger.begin_effect('wn-3', 'wn.pay', '{"invoice": 1}', 'WN-BK');
-- (this session's lease began both attempts: it cannot say which one it reports on)
SELECT conflict FROM durable_ledger.complete_effect('WN-BK', '{"paid": 1}');

-- 01L04: a report that names no attempt, on a recorded call that another
-- session's attempt made again
SELECT key AS k4 FROM durable_ledger.begin_recorded('wn-4', 'wn.model', '{"q": 1}') \gset
SELECT durable_ledger.release_run('wn-4');
SELECT dblink_connect('wn_other', 'dbname=' || current_database());
SELECT * FROM dblink('wn_other', $$SELECT attempt FROM durable_ledger.begin_recorded('wn-4', 'wn.model', '{"q": 1}')$$)
    AS t(attempt integer);
SELECT status, conflict FROM durable_ledger.complete_effect(:'k4', '{"a": 1}');
SELECT dblink_disconnect('wn_other');
SELECT durable_ledger.release_run('wn-2'), durable_ledger.release_run('wn-3');
\set VERBOSITY default
