# 060_proxy: the ledger sharded on three clusters behind durable_ledger_proxy
# (PL/Proxy), a fourth cluster.  The proxy's Python suite (test/proxy/
# test_proxy.py): routing by a run's routing key, session and token leases
# through the proxy (a lost shard connection never starts a new epoch),
# reports with and without their run, business keys shared by the runs of one
# routing key, a person's resolution on its shard, the registry on every shard
# and its drift, the views people read and the auditor's cookbook equal to the
# union of the shards' own, what the proxy refuses.  Then one shard stopped
# with 'immediate' in the middle of a run: calls routed to it fail naming it,
# the others go on; once it is back nothing recorded is lost and what it
# paused shows through the proxy, for a person to resolve.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::NodeTests;
use DurableLedger::PgBouncer;
use DurableLedger::PythonTests;
use DurableLedger::Shards;
use PostgreSQL::Test::Utils;
use Test::More;

# (a shard waits for a synchronous standby only with WAL senders: below)
my $ledger = DurableLedger::Shards->start('proxy', 3,
	shard_conf => [ 'wal_level = replica', 'max_wal_senders = 2' ]);
my $proxy = $ledger->proxy;
$ledger->add_role('agent', 'durable_ledger_worker');
$ledger->add_role('oncall', 'durable_ledger_admin');
$ledger->add_role('reader', 'durable_ledger_auditor');
$ledger->add_role('approver', 'durable_ledger_approver');

is($proxy->safe_psql('proxy', q{SELECT string_agg(shard || ':' || ledger_version, ' ' ORDER BY shard)
                                 FROM durable_ledger_proxy.shard_health() WHERE answers}),
	'p0:1.3 p1:1.3 p2:1.3', 'the proxy reaches three shards, each with durable_ledger 1.3');

run_python_tests('proxy', "$ENV{TESTDIR}/test/proxy",
	{ PROXY_DSN => $ledger->proxy_dsn,
	  SHARD_DSNS => join('|', map { $ledger->shard_dsn($_) } 0 .. 2) },
	pattern => 'test_*.py', pythonpath => ["$ENV{TESTDIR}/clients/python"]);

# the JavaScript client through the proxy (its dependencies are those of clients/js)
run_node_tests(
	dir => "$ENV{TESTDIR}/clients/js",
	files => ["$ENV{TESTDIR}/test/proxy/js_client.test.js"],
	prefix => 'js proxy',
	env => {
		PROXY_URL => node_pg_url($proxy, 'agent', 'proxy'),
		ONCALL_URL => node_pg_url($proxy, 'oncall', 'proxy'),
		SHARD_URLS => join('|', map { node_pg_url($ledger->shard($_), scalar(getpwuid($<)), 'ledger') } 0 .. 2) });

# -- one shard stopped in the middle of a run -----------------------------------------
# Runs on each shard; on p1's, an effect begun under a token lease and never
# reported (its worker will be gone): p1 then stops at once.
my %run;
for my $i (0 .. 2)
{
	$run{$i} = $proxy->safe_psql('proxy', qq{
		SELECT r FROM generate_series(1, 1000) n, LATERAL (SELECT 'down-' || n AS r) x
		 WHERE durable_ledger_proxy.shard_of(r) = 'p$i' LIMIT 1});
}
my $token = $proxy->safe_psql('proxy',
	"SELECT token FROM durable_ledger.take_lease('$run{1}', '1 hour', 'worker-1')",
	extra_params => ['-U', 'agent']);
$proxy->safe_psql('proxy', qq{
	SELECT durable_ledger.complete_effect(key, '{"paid": 1}', 1, '$run{1}')
	  FROM durable_ledger.begin_effect('$run{1}', 'bank.pay', '{"invoice": 1}', lease => '$token')},
	extra_params => ['-U', 'agent']);
my $paid_key = $proxy->safe_psql('proxy', qq{
	SELECT key FROM durable_ledger.begin_effect('$run{1}', 'bank.pay', '{"invoice": 2}', lease => '$token')},
	extra_params => ['-U', 'agent']);
like($paid_key, qr/^[0-9a-f]{64}$/, 'p1 holds a completed effect and one begun, not reported');
$ledger->shard(1)->stop('immediate');

my ($ret, $stdout, $stderr) = $proxy->psql('proxy', qq{
	SELECT decision FROM durable_ledger.begin_effect('$run{1}', 'bank.pay', '{"invoice": 3}', lease => '$token')},
	extra_params => ['-U', 'agent']);
isnt($ret, 0, 'a call routed to the stopped shard fails');
like($stderr, qr/shard p1 cannot be reached/, 'its error names the shard');
for my $i (0, 2)
{
	is($proxy->safe_psql('proxy', qq{
		SELECT durable_ledger.acquire_run('$run{$i}');
		SELECT decision FROM durable_ledger.begin_effect('$run{$i}', 'bank.pay', '{"invoice": 1}')},
		extra_params => ['-U', 'agent']),
		"t\nexecute", "a run on p$i goes on while p1 is down");
}
($ret, $stdout, $stderr) = $proxy->psql('proxy', 'SELECT count(*) FROM durable_ledger.unresolved',
	extra_params => ['-U', 'reader']);
like($stderr, qr/shard p1 cannot be reached/,
	'what waits for a person is not shown without p1 (never an incomplete list): the error names p1');
is($proxy->safe_psql('proxy', q{SELECT string_agg(shard || '=' || answers, ' ' ORDER BY shard)
                                 FROM durable_ledger_proxy.shard_health()}),
	'p0=true p1=false p2=true', 'shard_health says which shard is down');

$ledger->shard(1)->start;
is($proxy->safe_psql('proxy', qq{SELECT status FROM durable_ledger.effect_status('$paid_key', '$run{1}')},
		extra_params => ['-U', 'agent']),
	'started', 'p1 is back: the effect begun before the stop is there');
is($ledger->shard(1)->safe_psql('ledger', qq{
	SELECT string_agg(status, ',' ORDER BY (args ->> 'invoice')::int) FROM durable_ledger.effects
	 WHERE run = '$run{1}'}),
	'completed,started', 'nothing recorded on p1 was lost');
# the worker is gone: an admin breaks its lease, and the effect waits for a person
is($proxy->safe_psql('proxy', qq{SELECT durable_ledger.break_lease('$run{1}', 'maria', 'worker gone with p1')},
		extra_params => ['-U', 'oncall']),
	't', 'the lost worker\'s token lease is broken through the proxy');
is($proxy->safe_psql('proxy', qq{SELECT shard || ' ' || status FROM durable_ledger.unresolved WHERE key = '$paid_key'},
		extra_params => ['-U', 'reader']),
	'p1 unknown', 'what p1 paused shows through the proxy, with its shard');
is($proxy->safe_psql('proxy', qq{
	SELECT status FROM durable_ledger.resolve_effect('$paid_key', 'completed', '{"paid": 2}', 'maria', 'checked at the bank')},
		extra_params => ['-U', 'oncall']),
	'completed', 'a person resolves it through the proxy');
is($proxy->safe_psql('proxy', qq{
	SELECT durable_ledger.acquire_run('$run{1}');
	SELECT string_agg(decision, ',') FROM (
	    SELECT (durable_ledger.begin_effect('$run{1}', 'bank.pay', jsonb_build_object('invoice', n))).decision
	      FROM generate_series(1, 2) n) d},
		extra_params => ['-U', 'agent']),
	"t\nreplay,replay", 'the run\'s next attempt replays both payments');

# -- a call canceled while its shard's commit waits -------------------------
# p0's commits wait for a synchronous standby that never answers; the proxy's
# statement_timeout cancels a take_lease whose row the shard has committed
# locally: the error says it may have been made.
$ledger->shard(0)->append_conf('postgresql.conf', "synchronous_standby_names = 'nobody'\n");
$ledger->shard(0)->reload;
$ledger->shard(0)->poll_query_until('ledger', q{SELECT current_setting('synchronous_standby_names') = 'nobody'})
  or die 'the shard did not reload';
($ret, $stdout, $stderr) = $proxy->psql('proxy', qq{
	SET statement_timeout = '1s';
	SELECT durable_ledger.take_lease('$run{0}-waits', '1 hour')},
	extra_params => ['-U', 'agent']);
like($stderr, qr/the call to shard p0 was canceled/, 'a call canceled while its shard commits is an error naming the shard');
like($stderr, qr/may have committed it/, '... which says that the shard may have made it');
ok($ledger->shard(0)->poll_query_until('ledger',
		qq{SELECT count(*) = 1 FROM durable_ledger.token_leases WHERE run = '$run{0}-waits'}),
	'... as it did: the lease is on the shard');
$ledger->shard(0)->append_conf('postgresql.conf', "synchronous_standby_names = ''\n");
$ledger->shard(0)->reload;

# -- PgBouncer in session mode in front of the proxy ------------------------
# It resets the proxy's session for the next client (DISCARD ALL), but
# PL/Proxy's connections to the shards stay open with their advisory locks:
# its server_reset_query ends them first (durable_ledger_proxy.end_session_leases).
my $user = getpwuid($<);
my $bouncer = DurableLedger::PgBouncer->start($proxy,
	users => [ 'agent', $user ], user => $user, pool_mode => 'session', pool_size => 1,
	settings => { server_reset_query => 'SELECT durable_ledger_proxy.end_session_leases(); DISCARD ALL' });
my $held = "$run{2}-pooled";
is($bouncer->safe_psql('proxy', qq{SELECT durable_ledger.acquire_run('$held')}, user => 'agent'),
	't', 'a client of PgBouncer (session mode) takes a session lease through the proxy, then leaves');
ok($ledger->shard(2)->poll_query_until('ledger',
		qq{SELECT count(*) = 0 FROM durable_ledger.leases WHERE run = '$held'}),
	'... and PgBouncer\'s reset ended it on the shard');
is($bouncer->safe_psql('proxy', qq{SELECT durable_ledger.session_epoch('$held') IS NULL}, user => 'agent'),
	't', 'the next client, on the same proxy session, holds nothing of it');
is($proxy->safe_psql('proxy', qq{SELECT durable_ledger.acquire_run('$held', wait => false)},
		extra_params => ['-U', 'agent']),
	't', 'another worker takes the run at once');
$bouncer->stop;

$ledger->stop;
done_testing();
