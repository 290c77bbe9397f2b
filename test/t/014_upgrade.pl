# 014_upgrade: every upgrade path to the default version, exercised, and the
# result equal to a fresh install.  For each older version that has a path:
# install it, load a ledger that version really wrote (test/fixtures), check
# that the new library refuses to write into the old objects, ALTER EXTENSION
# ... UPDATE, and check that the schema (objects, columns in their order,
# constraints, indexes, triggers, views, functions, privileges, the comments
# of relations, columns, functions and types, dumped tables) is the one a
# fresh install of the default version creates, that the rows
# survived, and that the update filled in what the new version keeps (the
# replaced attempts of business keys).  The no-op update of the default
# version keeps the rows too.  Shipping a new version adds its script and a
# fixture of the version before it: this test picks them up.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
$node->start;

# What a database's ledger looks like, object by object (not its data); a
# column's #n is its place in SELECT * (regression outputs depend on it).
my $shape_sql = q{
	WITH ext AS (SELECT oid FROM pg_extension WHERE extname = 'durable_ledger'),
	     nsp AS (SELECT 'durable_ledger'::regnamespace AS oid)
	SELECT string_agg(d, E'\n' ORDER BY d) FROM (
	  SELECT 'member ' || pg_describe_object(classid, objid, objsubid) AS d
	    FROM pg_depend
	   WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
	     AND refobjid = (SELECT oid FROM ext)
	  UNION ALL
	  SELECT format('column %s.%s #%s %s notnull=%s default=%s comment=%s', c.relname, a.attname,
	                row_number() OVER (PARTITION BY a.attrelid ORDER BY a.attnum),
	                format_type(a.atttypid, a.atttypmod), a.attnotnull,
	                pg_get_expr(ad.adbin, ad.adrelid), col_description(c.oid, a.attnum))
	    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
	    LEFT JOIN pg_attrdef ad ON ad.adrelid = a.attrelid AND ad.adnum = a.attnum
	   WHERE c.relnamespace = (SELECT oid FROM nsp) AND a.attnum > 0 AND NOT a.attisdropped
	  UNION ALL
	  SELECT format('relation %s %s acl=%s options=%s comment=%s', c.relname, c.relkind,
	                c.relacl, c.reloptions, obj_description(c.oid, 'pg_class'))
	    FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM nsp)
	  UNION ALL
	  SELECT 'index ' || pg_get_indexdef(i.indexrelid)
	    FROM pg_index i JOIN pg_class c ON c.oid = i.indrelid
	   WHERE c.relnamespace = (SELECT oid FROM nsp)
	  UNION ALL
	  SELECT format('constraint %s on %s: %s', co.conname, co.conrelid::regclass,
	                pg_get_constraintdef(co.oid))
	    FROM pg_constraint co WHERE co.connamespace = (SELECT oid FROM nsp)
	  UNION ALL
	  SELECT 'trigger ' || pg_get_triggerdef(t.oid)
	    FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid
	   WHERE c.relnamespace = (SELECT oid FROM nsp) AND NOT t.tgisinternal
	  UNION ALL
	  SELECT format('view %s: %s', c.relname, pg_get_viewdef(c.oid))
	    FROM pg_class c WHERE c.relnamespace = (SELECT oid FROM nsp) AND c.relkind = 'v'
	  UNION ALL
	  SELECT format('function %s(%s) %s acl=%s comment=%s', p.proname,
	                pg_get_function_arguments(p.oid), md5(pg_get_functiondef(p.oid)),
	                p.proacl, obj_description(p.oid, 'pg_proc'))
	    FROM pg_proc p WHERE p.pronamespace = (SELECT oid FROM nsp)
	  UNION ALL
	  SELECT format('type %s acl=%s comment=%s', t.typname, t.typacl, obj_description(t.oid, 'pg_type'))
	    FROM pg_type t WHERE t.typnamespace = (SELECT oid FROM nsp) AND t.typarray <> 0
	  UNION ALL
	  SELECT format('schema acl=%s', n.nspacl) FROM pg_namespace n WHERE n.oid = (SELECT oid FROM nsp)
	  UNION ALL
	  SELECT 'dumped ' || unnest(extconfig)::regclass::text
	    FROM pg_extension WHERE extname = 'durable_ledger'
	  UNION ALL
	  SELECT format('event trigger %s on %s tags %s', evtname, evtevent, evttags)
	    FROM pg_event_trigger WHERE evtfoid IN
	         (SELECT oid FROM pg_proc WHERE pronamespace = (SELECT oid FROM nsp))
	) s};

my $default = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'durable_ledger'");
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION durable_ledger');
my $fresh_shape = $node->safe_psql('fresh', $shape_sql);
like($fresh_shape, qr/^member table durable_ledger\.effects$/m, 'the shape query sees the ledger');

my @sources = split /\n/, $node->safe_psql('postgres', qq{
	SELECT source FROM pg_extension_update_paths('durable_ledger')
	 WHERE target = '$default' AND path IS NOT NULL ORDER BY source});
ok(scalar(@sources) >= 1, "there is an upgrade path to $default") if $default ne '1.0';

my $counts_sql = q{
	SELECT (SELECT count(*) FROM durable_ledger.effects) || ' effects, '
	    || (SELECT count(*) FROM durable_ledger.runs) || ' runs, '
	    || (SELECT count(*) FROM durable_ledger.audit_log
	         WHERE event::text <> 'history_chained') || ' audit rows, '
	    || (SELECT count(*) FROM durable_ledger.effects e
	         WHERE to_jsonb(e) @> '{"safe_to_redo": true}') || ' recorded calls, '
	    || (SELECT count(*) FROM durable_ledger.effects e
	         WHERE to_jsonb(e) @> '{"local": true}') || ' local, '
	    || (SELECT md5(string_agg((jsonb_strip_nulls(to_jsonb(e)) - 'safe_to_redo'
	                               - 'execute_again' - 'local')::text, ',' ORDER BY key))
	          FROM durable_ledger.effects e)};
# (an effect's columns with a value: a column a version adds is NULL in the rows it
# finds, or false: safe_to_redo, 1.2's, and execute_again and local, 1.3's, which no
# effect of an earlier version is)

for my $from (@sources)
{
	my $db = "from_" . ($from =~ s/\W/_/gr);
	my $fixture = "$ENV{TESTDIR}/test/fixtures/ledger-$from.sql";
	ok(-f $fixture, "from $from: a ledger written by $from is on file");
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION durable_ledger VERSION '$from'");

	# the new library never writes into the old version's objects
	my ($rc, $out, $err) = $node->psql($db, q{
		SELECT decision FROM durable_ledger.begin_effect('upgrade-run', 'bank.pay', '{"invoice": 1}')},
		on_error_stop => 1);
	like($err, qr/older than its library.*ALTER EXTENSION durable_ledger UPDATE/s,
		"from $from: before the update, writes fail with a clear error");
	# ... also those whose C code did not change (they find the tables lack a column)
	($rc, $out, $err) = $node->psql($db, q{
		SELECT status FROM durable_ledger.complete_effect('no-such-key', '{}')},
		on_error_stop => 1);
	like($err, qr/older than its library.*ALTER EXTENSION durable_ledger UPDATE/s,
		"from $from: before the update, a report fails with the same clear error");
	is($node->safe_psql($db, 'SELECT count(*) FROM durable_ledger.effects')
		 . $node->safe_psql($db, q{SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 17484
		                             AND database = (SELECT oid FROM pg_database WHERE datname = current_database())}),
		'00', "from $from: ... and write nothing, nor keep a lock");

	$node->command_ok(
		[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr($db), '-f', $fixture ],
		"from $from: the $from ledger loads");
	my $counts_before = $node->safe_psql($db, $counts_sql);
	my $history = $node->safe_psql($db, q{
		SELECT count(*) FROM durable_ledger.audit_log a
		 WHERE NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = 'durable_ledger.audit_log'::regclass
		                                             AND attname = 'chain')
		    OR to_jsonb(a) ->> 'chain' IS NULL});

	$node->safe_psql($db, 'ALTER EXTENSION durable_ledger UPDATE');

	is($node->safe_psql($db, "SELECT extversion FROM pg_extension WHERE extname = 'durable_ledger'"),
		$default, "from $from: the extension is at $default");
	is($node->safe_psql($db, $shape_sql), $fresh_shape,
		"from $from: the schema equals a fresh install of $default");
	is($node->safe_psql($db, $counts_sql), $counts_before,
		"from $from: every effect, run and audit row is unchanged");
	# the rows written before chains began are chained (chain 0, 1.3): the
	# audit log has no row without a chain, and verify_audit finds nothing
	is($node->safe_psql($db, q{
			SELECT count(*) FILTER (WHERE chain = 0) || ' ' || count(*) FILTER (WHERE chain IS NULL)
			  FROM durable_ledger.audit_log}),
		"$history 0", "from $from: the $history rows written before chains are chain 0, none is left without a chain");
	is($node->safe_psql($db, q{SELECT count(*) FROM durable_ledger.verify_audit()}), '0',
		"from $from: verify_audit finds nothing");
	# ... and chain 0's head is recorded in a chained row (history_chained)
	is($node->safe_psql($db, q{
			SELECT string_agg((detail ->> 'chain_seq') || ' ' || (chain > 0)::text, ', ')
			  FROM durable_ledger.audit_log WHERE event = 'history_chained'}),
		$history > 0 ? "$history true" : '', "from $from: chain 0's head is recorded in a chained row");

	# what waits for a person is listed as before the update: unsettled was
	# filled from effects (the view reads nothing else)
	like($node->safe_psql($db, q{
			SELECT count(*) FILTER (WHERE EXISTS (SELECT FROM durable_ledger.unsettled u
			                                       WHERE u.key = e.key AND u.created_at = e.created_at))
			       || ' of ' || count(*) || ', ' || (SELECT count(*) FROM durable_ledger.unsettled)
			  FROM durable_ledger.effects e
			 WHERE e.status IN ('started', 'unknown') OR e.conflict}), qr/^([1-9]\d*) of \1, \1$/,
		"from $from: unsettled holds every effect started, unknown or flagged, and nothing else");

	# the cookbook's replays per tool (docs/auditing.md) names the tool of a
	# replay written before 1.2 too (its audit row has none: it is looked up)
	my ($replays_sql) = slurp_file("$ENV{TESTDIR}/docs/auditing.md") =~
	  /(SELECT coalesce\(a\.detail ->> 'tool'.*?ORDER BY replays DESC;)/s;
	ok(defined $replays_sql, 'docs/auditing.md has the replays-per-tool query');
	$replays_sql =~ s/now\(\) - interval '1 day'/'-infinity'/;
	my $per_tool = $node->safe_psql($db, $replays_sql);
	my $logged = $node->safe_psql($db,
		q{SELECT count(*) FROM durable_ledger.audit_log WHERE event = 'replay'});
	unlike($per_tool, qr/^\|/m, "from $from: every replay is counted under a tool");
	my $counted = 0;
	$counted += (split /\|/)[1] for split /\n/, $per_tool;
	is($counted, $logged, "from $from: the replays per tool add up to every replay ($logged)");

	if ($from eq '1.1')
	{
		# the updated 1.1 ledger decides as before: completed and resolved
		# effects replay, a failed one replays its error, the business key
		# in flight when its worker died pauses, the completed one replays
		is($node->safe_psql($db, q{
				SELECT string_agg(decision || ':' || COALESCE(status, '-') || ':' || attempt, ' ' ORDER BY n)
				  FROM (VALUES (1, 'ap-1', 'bank.pay', '{"invoice": "INV-1", "amount": 100}'::jsonb, NULL),
				               (2, 'ap-1', 'mail.send', '{"to": "a@example.com"}', NULL),
				               (3, 'ap-1', 'bank.pay', '{"invoice": "INV-1", "amount": 100}', NULL),
				               (4, 'ap-1', 'desk.ticket', '{"subject": "refund"}', NULL),
				               (5, 'up-2', 'bank.pay', '{"invoice": "BK-A"}', 'BK-A'),
				               (6, 'up-2', 'shop.order', '{"order": "BK-B"}', 'BK-B')) AS c(n, run, tool, args, bk),
				       LATERAL durable_ledger.begin_effect(c.run, c.tool, c.args, c.bk) AS d}),
			'replay:completed:1 replay:failed:1 replay:completed:1 pause:completed:1 replay:completed:3 pause:unknown:1',
			'from 1.1: completed, resolved and failed effects replay, a conflict and an unknown outcome pause');
		# a token lease of the 1.1 ledger: its run's next epoch follows its
		# last, and its calls' counters were kept
		is($node->safe_psql($db, q{
				SELECT (durable_ledger.take_lease('tok-2', '1 minute')).epoch}),
			'2', 'from 1.1: a released token lease\'s run starts its next epoch');
		is($node->safe_psql($db, q{SELECT string_agg(calls::text, ',' ORDER BY run) FROM durable_ledger.token_lease_calls}),
			'2,1,1', 'from 1.1: the token leases\' counters are kept');
	}
	if ($from eq '1.2')
	{
		# the policy row keeps its setting and gets 1.3's divergence default
		is($node->safe_psql($db, q{
				SELECT unregistered_tools || ' ' || unregistered_divergence || ' ' || changed_by
				  FROM durable_ledger.policy}),
			'warn pause ana', 'from 1.2: the policy keeps its setting; divergence of unregistered tools: pause');
		# the updated 1.2 ledger decides as before: the paid invoice (reworded
		# memo, key fields), the bounced mail and the resolved ticket replay,
		# the business key completed at attempt 2 replays, the one in flight
		# pauses, the divergence waiting for a verdict still waits, the one
		# judged the same replays, and the abandoned run is refused
		is($node->safe_psql($db, q{
				SELECT string_agg(decision || ':' || COALESCE(status, '-'), ' ' ORDER BY n)
				  FROM (VALUES (1, 'ap-1', 'bank.pay', '{"invoice": "INV-1", "amount": 100, "memo": "Cheers"}'::jsonb, NULL),
				               (2, 'ap-1', 'mail.send', '{"to": "a@example.com"}', NULL),
				               (3, 'ap-1', 'desk.ticket', '{"subject": "refund"}', NULL),
				               (4, 'up-3', 'shop.charge', '{"order": "BK-A"}', 'BK-A'),
				               (5, 'up-3', 'shop.ship', '{"order": "BK-B"}', 'BK-B'),
				               (6, 'div-1', 'acme.pay', '{"invoice": "INV-4", "memo": "Thank you"}', NULL),
				               (7, 'div-2', 'acme.pay', '{"invoice": "INV-4", "memo": "Thank you"}', NULL))
				       AS c(n, run, tool, args, bk),
				       LATERAL durable_ledger.begin_effect(c.run, c.tool, c.args, c.bk) AS d}),
			'replay:completed replay:failed replay:completed replay:completed pause:unknown pause:- replay:completed',
			'from 1.2: completed, failed and resolved effects replay, an unknown outcome and a waiting divergence pause');
		my (undef, undef, $abandoned) = $node->psql($db, q{SELECT durable_ledger.acquire_run('ab-1')});
		like($abandoned, qr/was abandoned/, 'from 1.2: the abandoned run stays abandoned');
		# a recorded call whose model call was made again replays its second attempt
		is($node->safe_psql($db, q{
				SELECT decision || ':' || attempt || ':' || (result->>'content')
				  FROM durable_ledger.begin_recorded('rec-1', 'model', '{"messages": ["pay INV-3", "paid"]}')}),
			'replay:2:done', 'from 1.2: a recorded call made again replays its last attempt');
		# a later attempt of a run whose unregistered tool is reworded pauses now
		is($node->safe_psql($db, q{
				SELECT durable_ledger.acquire_run('tok-2');
				SELECT decision FROM durable_ledger.begin_effect('tok-2', 'sms.send', '{"to": "+2 (reworded)"}')}),
			"t
pause", 'from 1.2: an unregistered tool reworded in a later attempt pauses (1.3)');
	}
	if ($from eq '1.1')
	{
		# a row appended to the history (chain 0) after the update, well
		# linked, is not history: an id the sequence never gave, out of order,
		# or newer than the first chained row (by id or by time) -- reported
		is($node->safe_psql($db, q{
				BEGIN;
				WITH last AS (SELECT * FROM durable_ledger.audit_log WHERE chain = 0 ORDER BY chain_seq DESC LIMIT 1),
				     r AS (SELECT (-1)::bigint AS id, l.logged_at, l.run, l.key, 'resolved'::text AS event,
				                  '{"outcome": "failed", "resolved_by": "cfo"}'::jsonb AS detail,
				                  l.role_name, l.session_user_name, l.application_name, l.client_addr,
				                  l.backend_pid, l.lease_epoch, l.attempt, 0::bigint AS chain,
				                  l.chain_seq + 1 AS chain_seq, l.row_hash AS previous
				             FROM last l)
				INSERT INTO durable_ledger.audit_log (id, logged_at, run, key, event, detail, role_name,
				                                      session_user_name, application_name, client_addr,
				                                      backend_pid, lease_epoch, attempt, chain, chain_seq, row_hash)
				SELECT r.id, r.logged_at, r.run, r.key, r.event, r.detail, r.role_name, r.session_user_name,
				       r.application_name, r.client_addr, r.backend_pid, r.lease_epoch, r.attempt, r.chain,
				       r.chain_seq, sha256(r.previous || durable_ledger.audit_row_content(
				           ROW(r.id, r.logged_at, r.run, r.key, r.event, r.detail, r.role_name, r.session_user_name,
				               r.application_name, r.client_addr, r.backend_pid, r.lease_epoch, r.attempt,
				               r.chain, r.chain_seq, NULL)::durable_ledger.audit_log))
				  FROM r;
				SELECT string_agg(DISTINCT chain || ' ' || id, ', ') || ' '
				       || bool_or(problem LIKE '%chain 0%out of order%') || ' '
				       || bool_or(problem LIKE '%chain 0%beyond the head%')
				  FROM durable_ledger.verify_audit();
				ROLLBACK;}),
			'0 -1 true true', 'from 1.1: a row appended to the history after the update is reported');
		# the last row of the history rewritten by hand, its hash recomputed so
		# that the chain still links: the head the update recorded tells
		is($node->safe_psql($db, q{
				BEGIN;
				ALTER TABLE durable_ledger.audit_log DISABLE TRIGGER audit_log_append_only;
				SELECT id AS last_id, chain_seq AS last_seq FROM durable_ledger.audit_log
				 WHERE chain = 0 ORDER BY chain_seq DESC LIMIT 1 \gset
				UPDATE durable_ledger.audit_log SET detail = '{"outcome": "completed", "resolved_by": "cfo"}'
				 WHERE id = :last_id;
				UPDATE durable_ledger.audit_log a
				   SET row_hash = sha256((SELECT p.row_hash FROM durable_ledger.audit_log p
				                           WHERE p.chain = 0 AND p.chain_seq = :last_seq - 1)
				                         || durable_ledger.audit_row_content(a))
				 WHERE a.id = :last_id;
				SELECT string_agg(chain || ' ' || (problem LIKE '%chain 0%head changed%')::text, ', ')
				  FROM durable_ledger.verify_audit();
				ROLLBACK;}),
			'0 true', 'from 1.1: the last row of the history rewritten, its hash recomputed, is reported');
	}
	if ($from eq '1.2')
	{
		# a row without a chain added by hand to a 1.2 ledger, posing as a
		# person's decision below every chained row: the update does not take
		# it into the history (an id the sequence never gave, logged after
		# chains began), and verify_audit reports it
		my $forged = "${db}_forged";
		$node->safe_psql('postgres', "CREATE DATABASE $forged");
		$node->safe_psql($forged, "CREATE EXTENSION durable_ledger VERSION '1.2'");
		$node->command_ok(
			[ 'psql', '-X', '-q', '-v', 'ON_ERROR_STOP=1', '-d', $node->connstr($forged), '-f', $fixture ],
			"from 1.2: the 1.2 ledger loads again, to be forged");
		$node->safe_psql($forged, q{
			INSERT INTO durable_ledger.audit_log (id, logged_at, run, key, event, detail, role_name,
			                                      session_user_name, backend_pid)
			VALUES (0, now(), 'ap-1', 'BK-B', 'resolved', '{"outcome": "completed", "resolved_by": "cfo"}',
			        'cfo', 'cfo', 4242)});
		$node->safe_psql($forged, 'ALTER EXTENSION durable_ledger UPDATE');
		is($node->safe_psql($forged, q{
				SELECT coalesce(a.chain::text, 'none') || ' ' || v.problem
				  FROM durable_ledger.audit_log a JOIN durable_ledger.verify_audit() v ON v.id = a.id}),
			"none an audit row without a chain: added by hand, or by a worker still running an earlier version's library",
			'from 1.2: a row forged before the update stays unchained, and is reported');
	}
	next unless $from eq '1.0';

	# 1.1 keeps the attempts of business keys that a later attempt replaced:
	# the update rebuilds them from the 1.0 audit log
	is($node->safe_psql($db, q{
			SELECT string_agg(format('%s#%s %s/%s %s %s %s', key, attempt, run, lease_epoch, status,
			                         error, coalesce(resolved_by, '-')), E'\n' ORDER BY key, attempt)
			  FROM durable_ledger.past_attempts}),
		join("\n",
			'BK-A#1 bk-run-1/1 failed {"try": 1, "code": "declined"} -',
			'BK-A#2 bk-run-2/1 failed {"try": 2, "code": "timeout"} -',
			'BK-A#3 bk-run-3/1 failed {"try": 3, "checked": "bank"} maria',
			'BK-B#1 bk-run-5/1 failed {"code": "no stock"} -',
			'BK-C#1 bk-run-7/1 failed  -'),
		'from 1.0: the replaced attempts are rebuilt from the audit log');

	# and the updated ledger decides as before
	is($node->safe_psql($db, q{
			SELECT string_agg(decision || ':' || status || ':' || attempt, ' ' ORDER BY n)
			  FROM (VALUES (1, 'ap-1', 'bank.pay', '{"invoice": "INV-1", "amount": 100}'::jsonb, NULL),
			               (2, 'ap-1', 'bank.pay', '{"invoice": "INV-2", "amount": 200}', NULL),
			               (3, 'up-1', 'bank.pay', '{"invoice": "BK-A"}', 'BK-A'),
			               (4, 'up-1', 'ship', '{"order": "BK-B"}', 'BK-B')) AS c(n, run, tool, args, bk),
			       LATERAL durable_ledger.begin_effect(c.run, c.tool, c.args, c.bk) AS d}),
		'replay:completed:1 pause:unknown:1 replay:completed:4 pause:unknown:2',
		'from 1.0: completed effects replay, unknown ones pause, business keys keep their attempts');

	# reports on the replaced attempts: the same failure again changes nothing
	# (also one reported without an error, which 1.0 logged as JSON null), a
	# completion is a conflict filed under the attempt's own run and epoch
	is($node->safe_psql($db, q{
			SELECT error IS NULL FROM durable_ledger.past_attempts WHERE key = 'BK-C'}),
		't', 'from 1.0: an error reported as SQL NULL is NULL again');
	is($node->safe_psql($db, q{
			SELECT status || ' ' || conflict FROM durable_ledger.fail_effect('BK-C', NULL, 1)}),
		'completed false', 'from 1.0: ... so its failure reported again agrees with it');
	is($node->safe_psql($db, q{
			SELECT status || ' ' || conflict FROM durable_ledger.fail_effect('BK-B', '{"code": "no stock"}', 1);
			SELECT status || ' ' || conflict FROM durable_ledger.complete_effect('BK-A', '{"payment_id": "pay_X"}', 2);
			SELECT run || '/' || lease_epoch || '/' || attempt FROM durable_ledger.audit_log
			 WHERE key = 'BK-A' AND event = 'conflict' ORDER BY id DESC LIMIT 1;}),
		"unknown false\ncompleted true\nbk-run-2/1/2",
		'from 1.0: reports on replaced attempts are judged against them');

	# the audit sequence went on from where the 1.0 ledger left it
	is($node->safe_psql($db, q{SELECT count(*) = count(DISTINCT id) FROM durable_ledger.audit_log}),
		't', 'from 1.0: audit ids stay unique');
}

# A backend that connected before the update keeps the library it loaded: if
# it is older, the functions it calls must not be found in it (their symbols
# are new), or it would apply older rules to the newer tables.  Only the
# functions whose C code has not changed since a version may keep a symbol of
# that version's library (listed here, by version).
my %unchanged_since = (
	'1.0' => { map { $_ => 1 } qw(canonical_args guard_drop) },
	'1.1' => { map { $_ => 1 } qw(canonical_args guard_drop effect_status release_run
		break_lease renew_lease release_lease) },
	'1.2' => { map { $_ => 1 } qw(guard_drop release_run
		break_lease release_lease abandon_run acquire_run change_tool
		metrics_events refuse_audit_log_change register_tool
		retire_tool) });
for my $from (@sources)
{
	my $symbols = "$ENV{TESTDIR}/test/fixtures/symbols-$from.txt";
	ok(-f $symbols, "from $from: the symbols of the $from library are on file");
	my %old = map { chomp; ($_ => 1) } grep { !/^#/ } do { open my $f, '<', $symbols or die; <$f> };
	my $db = "from_" . ($from =~ s/\W/_/gr);
	my @stale = grep { my ($name, $src) = split / /; $old{$src} && !$unchanged_since{$from}{$name} }
	  split /\n/, $node->safe_psql($db, q{
		SELECT p.proname || ' ' || p.prosrc FROM pg_proc p
		 WHERE p.pronamespace = 'durable_ledger'::regnamespace
		   AND p.prolang = (SELECT oid FROM pg_language WHERE lanname = 'c')
		 ORDER BY 1});
	is(join(', ', @stale), '', "from $from: no function whose C code changed binds to a symbol of the $from library");
}

# the no-op update of the current version keeps the rows
$node->safe_psql('postgres', 'CREATE DATABASE from_default');
$node->safe_psql('from_default', 'CREATE EXTENSION durable_ledger');
$node->safe_psql('from_default', q{
	SELECT durable_ledger.complete_effect(key, '{"payment_id": "pay_1"}', attempt)
	  FROM durable_ledger.begin_effect('upgrade-run', 'bank.pay', '{"invoice": 1}');
	SELECT durable_ledger.release_run('upgrade-run');});
$node->safe_psql('from_default', 'ALTER EXTENSION durable_ledger UPDATE');
is($node->safe_psql('from_default', $shape_sql), $fresh_shape,
	"from $default: a no-op update keeps the schema");
is($node->safe_psql('from_default', q{
		SELECT decision || ' ' || (result->>'payment_id')
		  FROM durable_ledger.begin_effect('upgrade-run', 'bank.pay', '{"invoice": 1}')}),
	'replay pay_1', "from $default: the rows survived");

$node->stop;
done_testing();
