-- audit_chain: every audit row written from 1.2 on is linked into the hash
-- chain of the backend that wrote it (chain, chain_seq 1, 2, 3, ..., row_hash
-- = sha256(the previous row's row_hash || the row's content)); a row of a
-- rolled-back (sub)transaction leaves no hole; verify_audit() recomputes the
-- chains and names the first broken link of each, and a kept head
-- (audit_heads) makes the deletion of the newest rows detectable.  Tampering
-- is done here as a superuser with the append-only trigger disabled, each
-- time inside a transaction that is rolled back.
\set VERBOSITY terse

SELECT tool FROM durable_ledger.register_tool('ac.pay', 'maria');
SELECT durable_ledger.acquire_run('ac-1');
SELECT (durable_ledger.complete_effect(key, '{"paid": 1}')).status
  FROM durable_ledger.begin_effect('ac-1', 'ac.pay', '{"invoice": 1}');
-- a rolled-back subtransaction and a rolled-back transaction leave no hole
BEGIN;
SAVEPOINT s;
SELECT decision FROM durable_ledger.begin_effect('ac-1', 'ac.pay', '{"invoice": 2}');
ROLLBACK TO s;
SELECT (durable_ledger.complete_effect(key, '{"paid": 3}')).status
  FROM durable_ledger.begin_effect('ac-1', 'ac.pay', '{"invoice": 3}');
COMMIT;
BEGIN;
SELECT decision FROM durable_ledger.begin_effect('ac-1', 'ac.pay', '{"invoice": 4}');
ROLLBACK;
-- a plpgsql block that catches an error after writing (a subtransaction)
DO $$
BEGIN
    PERFORM durable_ledger.begin_effect('ac-1', 'ac.pay', '{"invoice": 5}');
    RAISE EXCEPTION 'the worker gave up';
EXCEPTION WHEN OTHERS THEN
    NULL;
END $$;
SELECT (durable_ledger.complete_effect(key, '{"paid": 6}')).status
  FROM durable_ledger.begin_effect('ac-1', 'ac.pay', '{"invoice": 6}');
SELECT durable_ledger.release_run('ac-1');
-- another session writes its own chain
SELECT dblink_connect('other', 'dbname=' || current_database());
SELECT * FROM dblink('other', $$SELECT (durable_ledger.complete_effect(key, '{"paid": 7}')).status::text
                                 FROM durable_ledger.begin_effect('ac-2', 'ac.pay', '{"invoice": 7}')$$) AS t(status text);
SELECT dblink_disconnect('other');

-- every row is chained; this session's chain is numbered without holes
SELECT chain AS mine FROM durable_ledger.audit_log WHERE run = 'ac-1' LIMIT 1 \gset
SELECT count(DISTINCT chain) AS chains, bool_and(row_hash IS NOT NULL AND length(row_hash) = 32) AS hashed
  FROM durable_ledger.audit_log WHERE run IN ('ac-1', 'ac-2');
SELECT max(chain_seq) = count(*) AS no_holes, min(chain_seq) AS first
  FROM durable_ledger.audit_log WHERE chain = :mine;
SELECT count(*) AS problems FROM durable_ledger.verify_audit();

-- an auditor recomputes every hash in plain SQL (here with pgcrypto's digest();
-- PostgreSQL's own sha256() gives the same)
SELECT bool_and(a.row_hash = digest(coalesce(p.row_hash, decode(repeat('00', 32), 'hex'))
                                    || convert_to(jsonb_build_array(a.id, a.chain, a.chain_seq,
                                          (extract(epoch FROM a.logged_at) * 1000000)::bigint,
                                          a.run, a.key, a.event, a.detail, a.role_name,
                                          a.session_user_name, a.application_name,
                                          a.client_addr::text, a.backend_pid, a.lease_epoch,
                                          a.attempt)::text, 'UTF8'), 'sha256')) AS recomputed,
       bool_and(a.row_hash = sha256(coalesce(p.row_hash, decode(repeat('00', 32), 'hex'))
                                    || durable_ledger.audit_row_content(a))) AS with_sha256,
       count(*) > 0 AS rows_checked
  FROM durable_ledger.audit_log a
  LEFT JOIN durable_ledger.audit_log p ON p.chain = a.chain AND p.chain_seq = a.chain_seq - 1
 WHERE a.chain IS NOT NULL;

-- the auditor keeps the heads outside the database
SELECT jsonb_agg(h) AS heads FROM durable_ledger.audit_heads h \gset
SELECT count(*) AS problems FROM durable_ledger.verify_audit(:'heads');
SELECT id AS completed_id, chain_seq AS completed_seq FROM durable_ledger.audit_log
 WHERE run = 'ac-1' AND event = 'completed' ORDER BY id LIMIT 1 \gset

-- (1) a row changed: its link breaks
BEGIN;
ALTER TABLE durable_ledger.audit_log DISABLE TRIGGER audit_log_append_only;
UPDATE durable_ledger.audit_log SET detail = '{"result": {"paid": 0}}' WHERE id = :completed_id;
SELECT chain = :mine AS my_chain, chain_seq = :completed_seq AS at_the_row, id = :completed_id AS its_id, problem
  FROM durable_ledger.verify_audit();
ROLLBACK;
-- ... also when its hash was recomputed to match: the next link breaks
BEGIN;
ALTER TABLE durable_ledger.audit_log DISABLE TRIGGER audit_log_append_only;
UPDATE durable_ledger.audit_log SET detail = '{"result": {"paid": 0}}' WHERE id = :completed_id;
UPDATE durable_ledger.audit_log a
   SET row_hash = sha256(p.row_hash || durable_ledger.audit_row_content(a))
  FROM durable_ledger.audit_log p
 WHERE a.id = :completed_id AND p.chain = a.chain AND p.chain_seq = a.chain_seq - 1;
SELECT chain = :mine AS my_chain, chain_seq = :completed_seq + 1 AS at_the_next_row, problem
  FROM durable_ledger.verify_audit();
ROLLBACK;
-- (2) a row deleted in the middle
BEGIN;
ALTER TABLE durable_ledger.audit_log DISABLE TRIGGER audit_log_append_only;
DELETE FROM durable_ledger.audit_log WHERE id = :completed_id;
SELECT chain = :mine AS my_chain, chain_seq = :completed_seq + 1 AS at_the_next_row, problem
  FROM durable_ledger.verify_audit();
ROLLBACK;
-- (3) the newest rows deleted: the chain alone looks whole, the kept head does not
BEGIN;
ALTER TABLE durable_ledger.audit_log DISABLE TRIGGER audit_log_append_only;
DELETE FROM durable_ledger.audit_log
 WHERE chain = :mine AND chain_seq > (SELECT max(chain_seq) - 2 FROM durable_ledger.audit_log WHERE chain = :mine);
SELECT count(*) AS problems_without_heads FROM durable_ledger.verify_audit();
SELECT chain = :mine AS my_chain, id, problem FROM durable_ledger.verify_audit(:'heads');
ROLLBACK;
-- (4) a row added in the middle of a chain
BEGIN;
ALTER TABLE durable_ledger.audit_log DISABLE TRIGGER audit_log_append_only;
INSERT INTO durable_ledger.audit_log (logged_at, run, key, event, role_name, session_user_name,
                                      backend_pid, chain, chain_seq, row_hash)
SELECT logged_at, run, key, 'completed', role_name, session_user_name, backend_pid, chain, chain_seq, row_hash
  FROM durable_ledger.audit_log WHERE id = :completed_id;
SELECT chain = :mine AS my_chain, chain_seq = :completed_seq AS at_the_row, problem
  FROM durable_ledger.verify_audit();
ROLLBACK;
-- (5) a client address changed (also only its netmask)
BEGIN;
ALTER TABLE durable_ledger.audit_log DISABLE TRIGGER audit_log_append_only;
UPDATE durable_ledger.audit_log SET client_addr = '127.0.0.1/1' WHERE id = :completed_id;
SELECT chain = :mine AS my_chain, chain_seq = :completed_seq AS at_the_row, problem
  FROM durable_ledger.verify_audit();
ROLLBACK;
-- (6) a forged row without a chain (an INSERT needs no disabled trigger)
BEGIN;
INSERT INTO durable_ledger.audit_log (logged_at, run, key, event, detail, role_name, session_user_name, backend_pid)
VALUES (now(), 'ac-1', 'forged', 'completed', '{"result": {"paid": 1000000}}', 'maria', 'maria', 4242);
SELECT chain, chain_seq, id IS NOT NULL AS has_id, problem FROM durable_ledger.verify_audit(:'heads');
ROLLBACK;
-- (7) a forged chain of its own, well formed
BEGIN;
ALTER TABLE durable_ledger.audit_log DISABLE TRIGGER audit_log_append_only;
INSERT INTO durable_ledger.audit_log (logged_at, run, key, event, role_name, session_user_name, backend_pid,
                                      chain, chain_seq, row_hash)
VALUES (now(), 'ac-1', 'forged', 'completed', 'maria', 'maria', 4242, 1000000, 1, '\x00');
UPDATE durable_ledger.audit_log a SET row_hash = sha256(decode(repeat('00', 32), 'hex') || durable_ledger.audit_row_content(a))
 WHERE chain = 1000000;
SELECT chain, chain_seq, problem FROM durable_ledger.verify_audit();
ROLLBACK;
-- (8) a forged row without a chain and with an id below every chained row,
-- posing as a person's decision: flagged wherever its id falls (1.3; 1.2
-- flagged only those newer than the first chained row)
BEGIN;
INSERT INTO durable_ledger.audit_log (id, logged_at, run, key, event, detail, role_name, session_user_name, backend_pid)
VALUES (-1, now() - interval '1 year', 'ac-1', 'forged', 'resolved',
        '{"outcome": "completed", "resolved_by": "maria"}', 'maria', 'maria', 4242);
SELECT chain, chain_seq, id, problem FROM durable_ledger.verify_audit(:'heads');
ROLLBACK;
-- (9) a row of the history from before chains (chain 0) newer than a chained
-- row, well linked (a fresh ledger has no chain 0: it starts one), and a
-- chain with a negative number: flagged
BEGIN;
ALTER TABLE durable_ledger.audit_log DISABLE TRIGGER audit_log_append_only;
INSERT INTO durable_ledger.audit_log (logged_at, run, key, event, role_name, session_user_name, backend_pid,
                                      chain, chain_seq, row_hash)
VALUES (now(), 'ac-1', 'forged', 'completed', 'maria', 'maria', 4242, 0, 1, '\x00'),
       (now(), 'ac-1', 'forged', 'completed', 'maria', 'maria', 4242, -7, 1, '\x00');
UPDATE durable_ledger.audit_log a SET row_hash = sha256(decode(repeat('00', 32), 'hex') || durable_ledger.audit_row_content(a))
 WHERE chain IN (0, -7);
SELECT chain, chain_seq, problem FROM durable_ledger.verify_audit();
ROLLBACK;
SELECT count(*) AS problems_after_rollbacks FROM durable_ledger.verify_audit(:'heads');

-- a SQL_ASCII database may hold any bytes in a run's name: they are hashed as stored
CREATE DATABASE regress_ac_ascii ENCODING 'SQL_ASCII' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0;
SELECT dblink_connect('ascii', 'dbname=regress_ac_ascii');
SELECT * FROM dblink('ascii', $$CREATE EXTENSION durable_ledger$$) AS t(r text);
SELECT * FROM dblink('ascii', $$SELECT durable_ledger.acquire_run(E'caf\xe9')::text$$) AS t(acquired text);
SELECT * FROM dblink('ascii', $$SELECT count(*)::text FROM durable_ledger.verify_audit()$$) AS t(problems text);
SELECT * FROM dblink('ascii', $$SELECT bool_and(a.row_hash = sha256(decode(repeat('00', 32), 'hex')
                                       || durable_ledger.audit_row_content(a)))::text
                                  FROM durable_ledger.audit_log a WHERE chain_seq = 1$$) AS t(recomputed text);
SELECT dblink_disconnect('ascii');
-- its backend ends after the disconnect returns: wait (at most 60 s) until it
-- has left the database, or DROP DATABASE may find it still there
DO $$ BEGIN
  FOR i IN 1..1200 LOOP
    PERFORM pg_stat_clear_snapshot();
    EXIT WHEN NOT EXISTS (SELECT 1 FROM pg_stat_activity WHERE datname = 'regress_ac_ascii');
    PERFORM pg_sleep(0.05);
  END LOOP;
END $$;
DROP DATABASE regress_ac_ascii;

-- strings that JSON escapes (a quote, a backslash, control characters) and
-- strings it writes as they are (non-ASCII) hash as jsonb_build_array's text
-- writes them: the chain writes a string with nothing to escape whole
SET application_name = 'regress "ac" \ app';
SELECT durable_ledger.acquire_run(E'ac-"esc"\\\t\n\x01-\u00e9');
SELECT (durable_ledger.complete_effect(key, '{"paid": 8}')).status
  FROM durable_ledger.begin_effect(E'ac-"esc"\\\t\n\x01-\u00e9', 'ac.pay', '{"invoice": 8}');
SELECT durable_ledger.release_run(E'ac-"esc"\\\t\n\x01-\u00e9');
RESET application_name;
SELECT count(*) AS escaped_rows,
       bool_and(strpos(convert_from(durable_ledger.audit_row_content(a), 'UTF8'),
                       E'"ac-\\"esc\\"\\\\\\t\\n\\u0001-\u00e9"') > 0) AS escaped_as_json
  FROM durable_ledger.audit_log a WHERE run = E'ac-"esc"\\\t\n\x01-\u00e9';
SELECT count(*) AS problems FROM durable_ledger.verify_audit();

-- auditors verify; workers do not
CREATE ROLE regress_ac_auditor IN ROLE durable_ledger_auditor;
CREATE ROLE regress_ac_worker IN ROLE durable_ledger_worker;
SET ROLE regress_ac_auditor;
SELECT count(*) AS problems FROM durable_ledger.verify_audit();
SELECT count(*) > 0 AS heads_visible FROM durable_ledger.audit_heads;
SET ROLE regress_ac_worker;
SELECT regress_sqlstate($$SELECT durable_ledger.verify_audit()$$);
RESET ROLE;
DROP ROLE regress_ac_auditor, regress_ac_worker;
