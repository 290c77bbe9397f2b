-- tools: the tools registry.  Admins register, change and retire tools, each
-- change audited with a name; a registered tool says whether it changes the
-- world, its divergence policy (pause by default when it does, off when it
-- does not) and optionally the fields of args that make a call's identity
-- (key_fields): then only those fields are counted and keyed, so a replay
-- that rewords a memo is the same call.  A retired tool is executed no more
-- (55L03), what was recorded of it still replays; set_unregistered_tools
-- (allow, warn, refuse) says what happens to a tool nobody registered.  Bad
-- input is refused and writes nothing.
\set VERBOSITY default

CREATE FUNCTION regress_registry_footprint() RETURNS text LANGUAGE sql AS $$
    SELECT format('tools=%s audit=%s effects=%s',
                  (SELECT count(*) FROM durable_ledger.tools),
                  (SELECT count(*) FROM durable_ledger.audit_log),
                  (SELECT count(*) FROM durable_ledger.effects))
$$;

-- ===================================================================
-- register_tool
-- ===================================================================
SELECT tool, side_effecting, divergence, key_fields, note, registered_by,
       registered_at BETWEEN now() AND clock_timestamp() AS registered_now, changed_by, retired_at
  FROM durable_ledger.register_tool('tl.pay', 'maria', key_fields => '{invoice,amount}',
                                    note => 'reviewed 2026-11');
-- a read-only tool: divergence off unless asked for
SELECT tool, side_effecting, divergence, key_fields
  FROM durable_ledger.register_tool('tl.lookup', 'maria', side_effecting => false);
SELECT tool, side_effecting, divergence
  FROM durable_ledger.register_tool('tl.mail', 'maria', divergence => 'warn');
SELECT event, detail, role_name = current_user AS by_the_caller
  FROM durable_ledger.audit_log WHERE event LIKE 'tool_%' ORDER BY id;

-- bad input writes nothing
SELECT regress_registry_footprint() AS before \gset
SELECT regress_sqlstate($$SELECT durable_ledger.register_tool(NULL, 'maria')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.register_tool('', 'maria')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.register_tool('x.tool', NULL)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.register_tool('x.tool', '')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.register_tool('x.tool', 'maria', NULL)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.register_tool('x.tool', 'maria', divergence => 'sometimes')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.register_tool('x.tool', 'maria', key_fields => '{invoice,NULL}')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.register_tool('x.tool', 'maria', key_fields => '{invoice,""}')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.register_tool('x.tool', 'maria', key_fields => '{invoice,invoice}')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.register_tool(repeat('t', 256), 'maria')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.register_tool('tl.pay', 'maria')$$);
SELECT regress_registry_footprint() = :'before' AS nothing_written;

-- ===================================================================
-- key_fields: the fields of args that make a call's identity
-- ===================================================================
SELECT durable_ledger.acquire_run('kf-1');
SELECT decision, occurrence
  FROM durable_ledger.begin_effect('kf-1', 'tl.pay',
         '{"invoice": "INV-1", "amount": 4200, "memo": "Thanks for your order"}');
SELECT (durable_ledger.complete_effect(key, '{"payment_id": "pay_1"}')).status
  FROM durable_ledger.effects WHERE run = 'kf-1';
-- the next attempt (a new epoch) rewords the memo: the same call, replayed
SELECT durable_ledger.acquire_run('kf-1');
SELECT decision, status, occurrence, result
  FROM durable_ledger.begin_effect('kf-1', 'tl.pay',
         '{"memo": "Thank you!", "amount": 4200.00, "invoice": "INV-1"}');
-- another amount is another call
SELECT decision, occurrence
  FROM durable_ledger.begin_effect('kf-1', 'tl.pay',
         '{"invoice": "INV-1", "amount": 4300, "memo": "Thanks"}');
-- the key is recomputed in plain SQL from the key fields (docs/keys.md)
SELECT e.key = encode(sha256(convert_to(concat_ws('|', 'durable_ledger.v1',
                  octet_length(e.run), e.run, octet_length(e.tool), e.tool, e.occurrence,
                  durable_ledger.canonical_args(
                      (SELECT jsonb_object_agg(f, e.args -> f) FROM unnest(t.key_fields) f))),
              'UTF8')), 'hex') AS key_checks_out,
       e.args ->> 'memo' AS memo_as_first_called
  FROM durable_ledger.effects e JOIN durable_ledger.tools t USING (tool)
 WHERE e.run = 'kf-1' ORDER BY e.created_at;
-- effect_key derives the key begin_effect derives: from the key fields
SELECT durable_ledger.effect_key('kf-1', 'tl.pay', '{"amount": 4200, "invoice": "INV-1", "memo": "any"}', 1)
       = (SELECT key FROM durable_ledger.effects WHERE run = 'kf-1' AND args ->> 'memo' = 'Thanks for your order')
       AS effect_key_agrees;
-- (it reads the registry with the latest snapshot: STABLE, and never in a parallel query)
SELECT provolatile, proparallel FROM pg_proc WHERE oid = 'durable_ledger.effect_key'::regproc;
-- a call without a key field, or with args that are no object, has no identity
SELECT regress_registry_footprint() AS before \gset
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('kf-1', 'tl.pay', '{"invoice": "INV-2", "memo": "m"}')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('kf-1', 'tl.pay', '["INV-2", 4200]')$$);
SELECT regress_registry_footprint() = :'before' AS nothing_written;
-- a business key compares the key fields too: a reworded memo is the same call
-- (in progress under this very lease), another amount a different one
SELECT decision FROM durable_ledger.begin_effect('kf-1', 'tl.pay',
         '{"invoice": "INV-7", "amount": 100, "memo": "a"}', 'PAY-INV-7');
SELECT decision FROM durable_ledger.begin_effect('kf-1', 'tl.pay',
         '{"invoice": "INV-7", "amount": 100, "memo": "b"}', 'PAY-INV-7');
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('kf-1', 'tl.pay',
         '{"invoice": "INV-7", "amount": 999, "memo": "a"}', 'PAY-INV-7')$$);
SELECT durable_ledger.release_run('kf-1');

-- ===================================================================
-- change_tool
-- ===================================================================
SELECT tool, divergence, changed_by, changed_at BETWEEN now() AND clock_timestamp() AS changed_now, note
  FROM durable_ledger.change_tool('tl.pay', 'ana', divergence => 'warn');
SELECT event, detail ->> 'changed_by' AS changed_by, detail ->> 'divergence' AS divergence
  FROM durable_ledger.audit_log WHERE event = 'tool_changed';
-- the key fields of a tool whose calls are recorded cannot change: their
-- replays would get new keys and be executed again
SELECT regress_sqlstate($$SELECT durable_ledger.change_tool('tl.pay', 'ana', key_fields => '{invoice}')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.change_tool('tl.pay', 'ana', key_fields => '{}')$$);
-- ... the same fields in another order are the same identity
SELECT key_fields FROM durable_ledger.change_tool('tl.pay', 'ana', key_fields => '{amount,invoice}');
-- ... those of a tool never called with a derived key can ('{}': none, the whole args)
SELECT key_fields FROM durable_ledger.change_tool('tl.mail', 'ana', key_fields => '{to}');
SELECT key_fields FROM durable_ledger.change_tool('tl.mail', 'ana', key_fields => '{}');
SELECT regress_sqlstate($$SELECT durable_ledger.change_tool('no.such.tool', 'ana', divergence => 'off')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.change_tool('tl.pay', NULL)$$);
SELECT regress_sqlstate($$SELECT durable_ledger.change_tool('tl.pay', 'ana', divergence => 'always')$$);

-- ===================================================================
-- retire_tool: executed no more; what was recorded still replays
-- ===================================================================
SELECT durable_ledger.acquire_run('rt-1');
SELECT (durable_ledger.complete_effect(key, '{"sent": true}')).status
  FROM durable_ledger.begin_effect('rt-1', 'tl.mail', '{"to": "a@example.com"}');
SELECT tool, retired_by, retired_at BETWEEN now() AND clock_timestamp() AS retired_now, note
  FROM durable_ledger.retire_tool('tl.mail', 'ana', 'replaced by tl.mail.v2');
SELECT durable_ledger.acquire_run('rt-1');
SELECT decision, result FROM durable_ledger.begin_effect('rt-1', 'tl.mail', '{"to": "a@example.com"}');
SELECT regress_registry_footprint() AS before \gset
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('rt-1', 'tl.mail', '{"to": "b@example.com"}')$$);
SELECT regress_registry_footprint() = :'before' AS nothing_written;
-- retiring again changes nothing; registering again puts it back in use
SELECT retired_by FROM durable_ledger.retire_tool('tl.mail', 'someone else');
SELECT count(*) AS retirements FROM durable_ledger.audit_log WHERE event = 'tool_retired';
SELECT regress_sqlstate($$SELECT durable_ledger.change_tool('tl.mail', 'ana', divergence => 'off')$$);
SELECT registered_by, retired_at, divergence
  FROM durable_ledger.register_tool('tl.mail', 'ana', divergence => 'off');
SELECT decision FROM durable_ledger.begin_effect('rt-1', 'tl.mail', '{"to": "b@example.com"}');
SELECT regress_sqlstate($$SELECT durable_ledger.retire_tool('no.such.tool', 'ana')$$);
SELECT durable_ledger.release_run('rt-1');

-- ===================================================================
-- set_unregistered_tools: what happens to a tool nobody registered
-- (a row of durable_ledger.policy, not a setting a client could override)
-- ===================================================================
SELECT count(*) AS policy_rows FROM durable_ledger.policy;
SELECT durable_ledger.acquire_run('ur-1');
SELECT decision, (durable_ledger.complete_effect(key, '{"faxed": true}')).status
  FROM durable_ledger.begin_effect('ur-1', 'fax.send', '{"to": 1}');
SELECT durable_ledger.set_unregistered_tools('warn', 'maria', 'review pending') AS previous;
SELECT decision, (durable_ledger.complete_effect(key, '{"faxed": true}')).status
  FROM durable_ledger.begin_effect('ur-1', 'fax.send', '{"to": 2}');
SELECT durable_ledger.set_unregistered_tools('refuse', 'maria') AS previous;
SELECT unregistered_tools, changed_by, note FROM durable_ledger.policy;
SELECT event, detail FROM durable_ledger.audit_log WHERE event = 'policy_changed' ORDER BY id;
SELECT regress_registry_footprint() AS before \gset
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('ur-1', 'fax.send', '{"to": 3}')$$);
SELECT regress_registry_footprint() = :'before' AS nothing_written;
-- registered tools go on; what was recorded replays
SELECT decision FROM durable_ledger.begin_effect('ur-1', 'tl.lookup', '{"customer": 1}');
SELECT durable_ledger.acquire_run('ur-1');
-- (a later attempt replays what the earlier one did first: a new call of the
-- tool before that would diverge, and pause for a person)
SELECT decision, status FROM durable_ledger.begin_effect('ur-1', 'fax.send', '{"to": 1}');
SELECT decision, status FROM durable_ledger.begin_effect('ur-1', 'fax.send', '{"to": 2}');
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('ur-1', 'fax.send', '{"to": 3}')$$);
-- a call remembers its tool's row (cache.c): a registration in the same
-- transaction is used at once, and forgotten when it rolls back
BEGIN;
SELECT tool FROM durable_ledger.register_tool('fax.send', 'maria');
SELECT decision FROM durable_ledger.begin_effect('ur-1', 'fax.send', '{"to": 4}');
ROLLBACK;
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('ur-1', 'fax.send', '{"to": 4}')$$);
-- ... and a retirement in the same transaction refuses the next call at once
BEGIN;
SELECT decision FROM durable_ledger.begin_effect('ur-1', 'tl.lookup', '{"customer": 2}');
SELECT retired_by FROM durable_ledger.retire_tool('tl.lookup', 'maria');
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('ur-1', 'tl.lookup', '{"customer": 3}')$$);
ROLLBACK;
SELECT decision FROM durable_ledger.begin_effect('ur-1', 'tl.lookup', '{"customer": 3}');
-- the setting of earlier versions' documentation is no setting: the prefix is reserved
SELECT regress_sqlstate($$SET durable_ledger.unregistered_tools = allow$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_unregistered_tools('sometimes', 'maria')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_unregistered_tools(NULL, 'maria')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_unregistered_tools('allow', NULL)$$);
SELECT durable_ledger.set_unregistered_tools('allow', 'maria', 'done') AS previous;
SELECT decision FROM durable_ledger.begin_effect('ur-1', 'fax.send', '{"to": 3}');
-- the policy is remembered too: a change in the same transaction refuses the
-- next call at once, and is forgotten when it rolls back
BEGIN;
SELECT durable_ledger.set_unregistered_tools('refuse', 'maria') AS previous;
SELECT regress_sqlstate($$SELECT durable_ledger.begin_effect('ur-1', 'fax.send', '{"to": 5}')$$);
ROLLBACK;
SELECT decision FROM durable_ledger.begin_effect('ur-1', 'fax.send', '{"to": 5}');
SELECT durable_ledger.release_run('ur-1');

-- ===================================================================
-- privileges: workers call tools, admins register them
-- ===================================================================
CREATE ROLE regress_tools_worker IN ROLE durable_ledger_worker;
CREATE ROLE regress_tools_auditor IN ROLE durable_ledger_auditor;
SET ROLE regress_tools_worker;
SELECT regress_sqlstate($$SELECT durable_ledger.register_tool('w.tool', 'w')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.retire_tool('tl.pay', 'w')$$);
SELECT regress_sqlstate($$SELECT durable_ledger.set_unregistered_tools('allow', 'w')$$);
SELECT regress_sqlstate($$SELECT count(*) FROM durable_ledger.tools$$);
RESET ROLE;
SET ROLE regress_tools_auditor;
SELECT tool, divergence, retired_at IS NOT NULL AS retired FROM durable_ledger.tools ORDER BY tool;
RESET ROLE;
DROP ROLE regress_tools_worker, regress_tools_auditor;
