# 024_monitoring: the ledger's metrics as an operator's Prometheus sees them.
#
# A cluster with durable_ledger in shared_preload_libraries runs a scripted
# workload (payments completed, one failed, one contradicted, one left in
# flight by a worker that went away, a live token lease, one broken); then:
#   - metrics_events() counts every committed event since the server started,
#     exactly as the audit log holds them, and nothing of a rolled-back call;
#   - the metrics view says what is live and what waits for a person;
#   - Debian's prometheus-postgres-exporter, started on 127.0.0.1 with
#     monitoring/postgres_exporter_queries.yaml as a role granted only
#     durable_ledger_auditor, serves the same values on /metrics;
#   - promtool checks monitoring/alerts.yml and runs its unit tests.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use HTTP::Tiny;
use IPC::Run;
use Test::More;

my $monitoring = "$ENV{TESTDIR}/monitoring";
my $node = ledger_node('monitoring', "shared_preload_libraries = 'durable_ledger'");
$node->safe_psql('postgres', q{
	CREATE ROLE monitor LOGIN;
	GRANT durable_ledger_auditor TO monitor;});

# the workload
$node->safe_psql('postgres', q{
	SELECT durable_ledger.complete_effect(d.key, jsonb_build_object('paid', i), d.attempt)
	  FROM generate_series(1, 3) AS i,
	       durable_ledger.begin_effect('mon-1', 'bank.pay', jsonb_build_object('invoice', i)) AS d;
	SELECT durable_ledger.fail_effect(key, '{"declined": true}', attempt)
	  FROM durable_ledger.begin_effect('mon-1', 'bank.pay', '{"invoice": 4}');});
$node->safe_psql('postgres', q{
	SELECT durable_ledger.complete_effect(key, '{"paid": 5}', attempt)
	  FROM durable_ledger.begin_effect('mon-2', 'bank.pay', '{"invoice": 5}');
	SELECT durable_ledger.fail_effect(durable_ledger.effect_key('mon-2', 'bank.pay', '{"invoice": 5}', 1),
	                                  '{"chargeback": true}');});
# rolled back: counts nothing
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT durable_ledger.begin_effect('mon-3', 'bank.pay', '{"invoice": 6}');
	ROLLBACK;});
# a worker that went away with an effect in flight (its backend ends, and its
# lease with it, after psql has quit: waited for below)
$node->safe_psql('postgres', q{SELECT durable_ledger.begin_effect('mon-4', 'bank.pay', '{"invoice": 7}')});
# a live token lease, and a token lease broken (expired at once)
$node->safe_psql('postgres', q{
	SELECT durable_ledger.take_lease('mon-5', '1 hour');
	SELECT durable_ledger.take_lease('mon-6', '1 hour');
	SELECT durable_ledger.break_lease('mon-6', 'oncall');});

# the counts equal the audit log's, event by event
my $counts = $node->safe_psql('postgres', q{
	SELECT m.event || '=' || m.total FROM durable_ledger.metrics_events() m
	 WHERE m.total > 0 ORDER BY m.event});
my $logged = $node->safe_psql('postgres', q{
	SELECT event || '=' || count(*) FROM durable_ledger.audit_log GROUP BY event ORDER BY event});
is($counts, $logged, 'metrics_events() counts what the audit log holds, event by event');
like($counts, qr/^intent=6$/m, 'six intents counted (the rolled-back one is not)');
like($counts, qr/^conflict=1$/m, 'one conflict counted');
like($counts, qr/^completed=4$/m, 'four completions counted');

# another database's events are its own
$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('other', q{
	CREATE EXTENSION durable_ledger;
	SELECT durable_ledger.begin_effect('mon-other', 'bank.pay', '{"invoice": 8}');});
is($node->safe_psql('postgres', q{SELECT total FROM durable_ledger.metrics_events() WHERE event = 'intent'}),
	'6', "another database's intents are not counted here");
is($node->safe_psql('other', q{SELECT total FROM durable_ledger.metrics_events() WHERE event = 'intent'}),
	'1', '... but there');

ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM durable_ledger.leases WHERE run = 'mon-4'}),
	'the worker that went away holds no lease any more');
my $state = $node->safe_psql('postgres', q{
	SELECT session_leases, token_leases, token_leases_expired, unresolved, counters_kept
	  FROM durable_ledger.metrics});
is($state, '0|1|1|2|t', 'metrics: no session lease, one live token lease, one expired, two waiting for a person (the conflict, the intent in flight)');

# the exporter, as a role with only the auditor's grant
my $port = PostgreSQL::Test::Cluster::get_free_port();
my ($out, $err) = ('', '');
my $exporter = IPC::Run::start(
	[ 'prometheus-postgres-exporter', "--web.listen-address=127.0.0.1:$port",
	  "--extend.query-path=$monitoring/postgres_exporter_queries.yaml",
	  '--disable-default-metrics', '--disable-settings-metrics' ],
	'>', \$out, '2>', \$err,
	init => sub {
		$ENV{DATA_SOURCE_NAME} = 'host=' . $node->host . ' port=' . $node->port
		  . ' user=monitor dbname=postgres sslmode=disable';
	});
my $metrics = '';
for (1 .. 60)
{
	my $response = HTTP::Tiny->new(timeout => 5)->get("http://127.0.0.1:$port/metrics");
	$metrics = $response->{content} if $response->{success};
	last if $metrics =~ /^durable_ledger_state_unresolved\{/m;
	sleep 1;
}
like($metrics, qr/^durable_ledger_events_total\{event="intent",server="[^"]*"\} 6$/m,
	'/metrics: the intents, as a counter labelled by event');
like($metrics, qr/^durable_ledger_events_total\{event="conflict",server="[^"]*"\} 1$/m,
	'/metrics: the conflict');
like($metrics, qr/^durable_ledger_state_token_leases\{server="[^"]*"\} 1$/m, '/metrics: the live token lease');
like($metrics, qr/^durable_ledger_state_token_leases_expired\{server="[^"]*"\} 1$/m,
	'/metrics: the expired token lease');
like($metrics, qr/^durable_ledger_state_unresolved\{server="[^"]*"\} 2$/m, '/metrics: what waits for a person');
like($metrics, qr/^durable_ledger_state_unresolved_oldest_seconds\{server="[^"]*"\} [0-9.e+-]+$/m,
	'/metrics: how long the oldest has waited');
unlike($metrics, qr/^pg_up 0/m, 'the exporter reached the database') or diag $err;
$exporter->kill_kill;

# the alert rules
my ($check_out, $check_err) = ('', '');
ok(IPC::Run::run([ 'promtool', 'check', 'rules', "$monitoring/alerts.yml" ], '>', \$check_out, '2>', \$check_err),
	'promtool check rules: the alert rules are valid') or diag "$check_out$check_err";
my ($test_out, $test_err) = ('', '');
ok(IPC::Run::run([ 'promtool', 'test', 'rules', "$monitoring/alerts_test.yml" ], '>', \$test_out, '2>', \$test_err),
	'promtool test rules: each alert fires when it should, and not before') or diag "$test_out$test_err";

$node->stop;
done_testing();
