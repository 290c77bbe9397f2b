-- unregistered: a tool nobody registered is judged for divergence as a
-- registered side-effecting tool is (policy pause) since 1.3, unless an admin
-- says otherwise with set_unregistered_divergence(): a later attempt whose
-- model reworded an email, a memo, is paused for a person instead of sending
-- it twice.  Honest replays never pause; recorded calls (begin_recorded: a
-- model's turns, reads) are never paused for drift, but their replays count,
-- so that the tool's side-effecting calls, if any, are judged alike.
\set VERBOSITY default

-- one call: its decision (a completed execution reports a result)
CREATE FUNCTION regress_ur_call(r text, t text, a jsonb, recorded boolean DEFAULT false,
                                token text DEFAULT NULL)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE d durable_ledger.decision;
BEGIN
    IF recorded THEN
        d := durable_ledger.begin_recorded(r, t, a, lease => token);
    ELSE
        d := durable_ledger.begin_effect(r, t, a, lease => token);
    END IF;
    IF d.decision = 'execute' THEN
        PERFORM durable_ledger.complete_effect(d.key, '{"ok": true}', d.attempt);
    END IF;
    RETURN d.decision || coalesce(':' || d.status, ':-');
END $$;

-- the default (sql/tools left the policy row it wrote with it)
SELECT unregistered_tools, unregistered_divergence FROM durable_ledger.policy;

-- ===================================================================
-- the newcomer's shape: an email tool nobody registered; the retry's model
-- rewords the body.  The second send pauses; nothing is recorded for it but
-- the divergence, which waits in unresolved for a person.
-- ===================================================================
SELECT durable_ledger.acquire_run('ur-mail');
SELECT regress_ur_call('ur-mail', 'mail.send', '{"to": "ap@acme.example", "body": "Paid INV-9."}');
SELECT durable_ledger.acquire_run('ur-mail');
SELECT decision, status, attempt, downstream_key,
       position(durable_ledger.effect_key('ur-mail', 'mail.send',
                '{"to": "ap@acme.example", "body": "Paid INV-9."}', 1) IN reason) > 0 AS names_the_first
  FROM durable_ledger.begin_effect('ur-mail', 'mail.send', '{"to": "ap@acme.example", "body": "We paid INV-9."}');
SELECT count(*) AS emails FROM durable_ledger.effects WHERE run = 'ur-mail';
SELECT tool, args ->> 'body' AS body, verdict
  FROM durable_ledger.divergences WHERE run = 'ur-mail';
SELECT tool, status, may_duplicate = durable_ledger.effect_key('ur-mail', 'mail.send',
                '{"to": "ap@acme.example", "body": "Paid INV-9."}', 1) AS may_duplicate_the_first
  FROM durable_ledger.unresolved WHERE run = 'ur-mail';
SELECT detail ->> 'policy' AS policy FROM durable_ledger.audit_log
 WHERE run = 'ur-mail' AND event = 'divergence';
-- a person: the same email.  The call replays the first one's outcome.
SELECT verdict FROM durable_ledger.resolve_divergence(
    durable_ledger.effect_key('ur-mail', 'mail.send', '{"to": "ap@acme.example", "body": "We paid INV-9."}', 1),
    'same', 'maria', 'reworded');
SELECT regress_ur_call('ur-mail', 'mail.send', '{"to": "ap@acme.example", "body": "We paid INV-9."}');
SELECT count(*) AS emails FROM durable_ledger.effects WHERE run = 'ur-mail';
SELECT durable_ledger.release_run('ur-mail');

-- ===================================================================
-- honest replays of tools nobody registered never pause: the same calls in
-- another order, repeats, a failure replayed and retried, an unknown outcome
-- resolved, then new calls; under a token lease too
-- ===================================================================
SELECT durable_ledger.acquire_run('ur-honest');
SELECT regress_ur_call('ur-honest', 'sms.send', '{"to": "+1"}'),
       regress_ur_call('ur-honest', 'sms.send', '{"to": "+2"}'),
       regress_ur_call('ur-honest', 'sms.send', '{"to": "+2"}');
SELECT decision, (durable_ledger.fail_effect(key, '{"code": "blocked"}')).status
  FROM durable_ledger.begin_effect('ur-honest', 'sms.send', '{"to": "+3"}');
SELECT decision FROM durable_ledger.begin_effect('ur-honest', 'desk.ticket', '{"subject": "refund"}');
SELECT durable_ledger.acquire_run('ur-honest');
SELECT regress_ur_call('ur-honest', 'sms.send', '{"to": "+2"}'),
       regress_ur_call('ur-honest', 'sms.send', '{"to": "+1"}'),
       regress_ur_call('ur-honest', 'sms.send', '{"to": "+2"}'),
       regress_ur_call('ur-honest', 'sms.send', '{"to": "+3"}') AS failure_replayed,
       regress_ur_call('ur-honest', 'sms.send', '{"to": "+3"}') AS retried,
       regress_ur_call('ur-honest', 'desk.ticket', '{"subject": "refund"}') AS unknown;
SELECT status FROM durable_ledger.resolve_effect(
    durable_ledger.effect_key('ur-honest', 'desk.ticket', '{"subject": "refund"}', 1),
    'completed', '{"ticket": 5}', 'maria');
SELECT regress_ur_call('ur-honest', 'desk.ticket', '{"subject": "refund"}'),
       regress_ur_call('ur-honest', 'desk.ticket', '{"subject": "new"}'),
       regress_ur_call('ur-honest', 'sms.send', '{"to": "+4"}');
SELECT durable_ledger.release_run('ur-honest');
SELECT (durable_ledger.take_lease('ur-honest-t', '1 minute')).token AS t1 \gset
SELECT regress_ur_call('ur-honest-t', 'sms.send', '{"to": "+1"}', token => :'t1'),
       regress_ur_call('ur-honest-t', 'sms.send', '{"to": "+2"}', token => :'t1');
SELECT durable_ledger.release_lease(:'t1');
SELECT (durable_ledger.take_lease('ur-honest-t', '1 minute')).token AS t2 \gset
SELECT regress_ur_call('ur-honest-t', 'sms.send', '{"to": "+2"}', token => :'t2'),
       regress_ur_call('ur-honest-t', 'sms.send', '{"to": "+1"}', token => :'t2'),
       regress_ur_call('ur-honest-t', 'sms.send', '{"to": "+5"}', token => :'t2');
SELECT durable_ledger.release_lease(:'t2');
SELECT count(*) AS divergences_of_honest_replays FROM durable_ledger.divergences
 WHERE run IN ('ur-honest', 'ur-honest-t');

-- ... but a new call before every earlier effect was replayed diverges,
-- under a token lease as under a session lease
SELECT (durable_ledger.take_lease('ur-honest-t', '1 minute')).token AS t3 \gset
SELECT regress_ur_call('ur-honest-t', 'sms.send', '{"to": "+9"}', token => :'t3');
SELECT durable_ledger.release_lease(:'t3');

-- ===================================================================
-- recorded calls of a tool nobody registered (a model's turns) are never
-- paused for drift: a later attempt whose model is asked other things makes
-- new calls freely
-- ===================================================================
SELECT durable_ledger.acquire_run('ur-model');
SELECT regress_ur_call('ur-model', 'model', '{"messages": ["pay INV-9"]}', recorded => true),
       regress_ur_call('ur-model', 'model', '{"messages": ["pay INV-9", "paid"]}', recorded => true);
SELECT durable_ledger.acquire_run('ur-model');
SELECT regress_ur_call('ur-model', 'model', '{"messages": ["pay INV-9, quickly"]}', recorded => true),
       regress_ur_call('ur-model', 'model', '{"messages": ["something else"]}', recorded => true);
SELECT count(*) AS divergences FROM durable_ledger.divergences WHERE run = 'ur-model';
SELECT durable_ledger.release_run('ur-model');

-- a tool called both ways (recorded, and as a side effect): its recorded
-- calls neither pause nor turn the checking off for its side-effecting ones;
-- their replays count as the side effects' do, so an honest replay of both
-- goes on
SELECT durable_ledger.acquire_run('ur-both');
SELECT regress_ur_call('ur-both', 'crm', '{"read": 1}', recorded => true),
       regress_ur_call('ur-both', 'crm', '{"write": 1}');
SELECT durable_ledger.acquire_run('ur-both');
SELECT regress_ur_call('ur-both', 'crm', '{"read": 2}', recorded => true) AS new_read,
       regress_ur_call('ur-both', 'crm', '{"write": 2}') AS reworded_write;
SELECT durable_ledger.acquire_run('ur-both');
SELECT regress_ur_call('ur-both', 'crm', '{"read": 1}', recorded => true) AS read_replayed,
       regress_ur_call('ur-both', 'crm', '{"write": 1}') AS write_replayed,
       regress_ur_call('ur-both', 'crm', '{"read": 2}', recorded => true) AS read_replayed_too,
       regress_ur_call('ur-both', 'crm', '{"write": 3}') AS new_write;
SELECT durable_ledger.release_run('ur-both');

-- a divergence decides its key whichever way the key is called: the paused
-- write made again with begin_recorded (not judged itself) pauses too, and
-- waits in unresolved for the verdict, which is still accepted
SELECT durable_ledger.acquire_run('ur-key');
SELECT regress_ur_call('ur-key', 'crm', '{"write": 1}');
SELECT durable_ledger.acquire_run('ur-key');
SELECT regress_ur_call('ur-key', 'crm', '{"write": 2}') AS reworded_write,
       regress_ur_call('ur-key', 'crm', '{"write": 2}', recorded => true) AS same_call_recorded;
SELECT count(*) AS effects_of_the_paused_call FROM durable_ledger.effects
 WHERE key = durable_ledger.effect_key('ur-key', 'crm', '{"write": 2}', 1);
SELECT tool, status FROM durable_ledger.unresolved WHERE run = 'ur-key';
-- ... also in an attempt that called the tool while the policy was off (such
-- an attempt keeps no marks and is not judged for the tool): once the policy
-- is pause again, the key still waits for the person
SELECT durable_ledger.set_unregistered_divergence('off', 'maria') AS previous;
SELECT durable_ledger.acquire_run('ur-key');
SELECT regress_ur_call('ur-key', 'crm', '{"write": 9}') AS while_off;
SELECT durable_ledger.set_unregistered_divergence('pause', 'maria') AS previous;
SELECT regress_ur_call('ur-key', 'crm', '{"write": 2}') AS the_paused_call_again;
SELECT verdict FROM durable_ledger.resolve_divergence(
    durable_ledger.effect_key('ur-key', 'crm', '{"write": 2}', 1), 'same', 'maria');
SELECT regress_ur_call('ur-key', 'crm', '{"write": 2}', recorded => true) AS after_the_verdict;
SELECT count(*) AS effects FROM durable_ledger.effects WHERE run = 'ur-key';
SELECT durable_ledger.release_run('ur-key');

-- a registered tool is judged as the registry says, whatever the policy for
-- unregistered tools: read-only (off) executes its new calls
SELECT tool, divergence FROM durable_ledger.register_tool('ur.lookup', 'maria', side_effecting => false);
SELECT durable_ledger.acquire_run('ur-reg');
SELECT regress_ur_call('ur-reg', 'ur.lookup', '{"q": "acme"}');
SELECT durable_ledger.acquire_run('ur-reg');
SELECT regress_ur_call('ur-reg', 'ur.lookup', '{"q": "ACME Inc"}');
SELECT durable_ledger.release_run('ur-reg');

-- ===================================================================
-- set_unregistered_divergence: warn executes with a WARNING (SQLSTATE
-- 01L01) and an audited divergence; off executes silently.  Audited, and
-- independent of set_unregistered_tools.
-- ===================================================================
SELECT max(id) AS policy_audit_from FROM durable_ledger.audit_log \gset
SELECT durable_ledger.set_unregistered_divergence('warn', 'maria', 'we reword on purpose') AS previous;
SELECT unregistered_tools, unregistered_divergence, changed_by, note FROM durable_ledger.policy;
SELECT durable_ledger.acquire_run('ur-warn');
SELECT regress_ur_call('ur-warn', 'mail.send', '{"body": "a"}');
SELECT durable_ledger.acquire_run('ur-warn');
\set VERBOSITY sqlstate
SELECT regress_ur_call('ur-warn', 'mail.send', '{"body": "b"}');
\set VERBOSITY default
SELECT event, detail ->> 'policy' AS policy FROM durable_ledger.audit_log
 WHERE run = 'ur-warn' AND event = 'divergence';
SELECT count(*) AS recorded_for_a_person FROM durable_ledger.divergences WHERE run = 'ur-warn';
SELECT durable_ledger.set_unregistered_divergence('off', 'maria') AS previous;
SELECT durable_ledger.acquire_run('ur-warn');
SELECT regress_ur_call('ur-warn', 'mail.send', '{"body": "c"}');
-- the other setting is its own: changing it keeps this one
SELECT durable_ledger.set_unregistered_tools('warn', 'ana') AS previous;
SELECT unregistered_tools, unregistered_divergence, changed_by FROM durable_ledger.policy;
SELECT durable_ledger.set_unregistered_tools('allow', 'ana') AS previous;
SELECT event, detail FROM durable_ledger.audit_log
 WHERE event = 'policy_changed' AND id > :policy_audit_from ORDER BY id;
SELECT durable_ledger.release_run('ur-warn');

-- the policy is remembered (cache.c): a change in the same transaction is
-- used at once, and forgotten when it rolls back
SELECT durable_ledger.acquire_run('ur-cache');
SELECT regress_ur_call('ur-cache', 'mail.send', '{"body": "a"}');
SELECT durable_ledger.acquire_run('ur-cache');
BEGIN;
SELECT durable_ledger.set_unregistered_divergence('pause', 'maria') AS previous;
SELECT regress_ur_call('ur-cache', 'mail.send', '{"body": "b"}') AS paused_at_once;
ROLLBACK;
SELECT regress_ur_call('ur-cache', 'mail.send', '{"body": "b"}') AS off_again;
SELECT durable_ledger.release_run('ur-cache');

-- bad input: a clear error, nothing written
SELECT count(*) AS audit_rows FROM durable_ledger.audit_log \gset
SELECT regress_sqlstate($$SELECT durable_ledger.set_unregistered_divergence('sometimes', 'maria')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_unregistered_divergence(NULL, 'maria')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_unregistered_divergence('pause', NULL)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_unregistered_divergence('pause', '')$$);
BEGIN READ ONLY;
SELECT regress_sqlstate($$SELECT durable_ledger.set_unregistered_divergence('off', 'maria')$$);
ROLLBACK;
SELECT count(*) = :audit_rows AS nothing_written FROM durable_ledger.audit_log;

-- admins only; auditors read the policy
CREATE ROLE regress_ur_worker IN ROLE durable_ledger_worker;
CREATE ROLE regress_ur_auditor IN ROLE durable_ledger_auditor;
SET ROLE regress_ur_worker;
SELECT regress_sqlstate($$SELECT durable_ledger.set_unregistered_divergence('off', 'mallory')$$);
RESET ROLE;
SET ROLE regress_ur_auditor;
SELECT unregistered_divergence FROM durable_ledger.policy;
RESET ROLE;
DROP ROLE regress_ur_worker, regress_ur_auditor;

-- both settings changed in one statement: each change keeps the other's
SELECT durable_ledger.set_unregistered_tools('warn', 'maria') AS tools_before,
       durable_ledger.set_unregistered_divergence('warn', 'maria') AS divergence_before;
SELECT unregistered_tools, unregistered_divergence FROM durable_ledger.policy;
SELECT durable_ledger.set_unregistered_tools('allow', 'maria') AS previous;

-- back to the default, for the files after this one
SELECT durable_ledger.set_unregistered_divergence('pause', 'maria', 'the default') AS previous;
DROP FUNCTION regress_ur_call(text, text, jsonb, boolean, text);
