# 061_proxy_chaos: the fleet chaos test (test/chaos/fleet_chaos.py) through
# durable_ledger_proxy in front of three shard clusters: workers SIGKILLed at
# random, runs delivered twice, business keys shared by the runs of one
# routing key (a tenant, "{tenant-n}chaos-run-r") and declined and executed
# again, reports late and twice (the workers' naming their run, the late
# reporter's found by their key alone), drifting replays paused and decided,
# unknown outcomes resolved by a person; every invoice paid exactly as often
# as planned.  Twice: with session leases, the workers connected to the proxy
# directly; then with token leases, every worker, the late reporter and the
# person through PgBouncer in transaction mode in front of the proxy, some
# workers frozen past their ttl.  The bank lives in the proxy's database; the
# checks read the ledger on the shards.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::PgBouncer;
use DurableLedger::Shards;
use PostgreSQL::Test::Utils;
use Test::More;

my $ledger = DurableLedger::Shards->start('proxy_chaos', 3, conf => ['max_connections = 80']);
my $proxy = $ledger->proxy;

sub chaos
{
	my ($ledger, $label, @more) = @_;
	my @shards = map { ('--shard-dsn', $ledger->shard_dsn($_)) } 0 .. 2;
	my @cmd = (
		'/usr/bin/python3', "$ENV{TESTDIR}/test/chaos/fleet_chaos.py",
		'--dsn', $ledger->proxy_dsn, @shards,
		'--seed', $ENV{FLEET_CHAOS_SEED} // 42,
		'--runs', $ENV{FLEET_CHAOS_RUNS} // 40,
		'--kills', $ENV{FLEET_CHAOS_KILLS} // 60, @more);
	my ($stdout, $stderr);
	my $ok = IPC::Run::run(\@cmd, '>', \$stdout, '2>', \$stderr);
	diag($stdout);
	diag($stderr) if $stderr ne '';
	ok($ok, "$label: the fleet chaos test passed all its checks");
	unlike($stdout, qr/^not ok/m, "$label: no check failed");
	like($stdout, qr/^ok - the runs were spread over every shard/m, "$label: the runs were on every shard");
	like($stdout, qr/^ok - every invoice paid exactly as often as planned/m,
		"$label: every invoice was paid exactly as often as planned");
	like($stdout, qr/^ok - every business-key operation paid exactly once \(\d+ keys, [1-9]\d* executed again/m,
		"$label: no business-key operation of a tenant was paid twice, and some were executed again");
	like($stdout, qr/^ok - no report landed on another attempt/m,
		"$label: every report was filed under the attempt it is about");
	like($stdout, qr/^ok - nothing unresolved \(0\)/m, "$label: nothing was left unresolved");
	return $stdout;
}

my $stdout = chaos($ledger, 'session leases');
like($stdout, qr/resolved by the reconciler [1-9]/, 'session leases: a person resolved unknown outcomes');

# the same on a second ledger (its own databases on the same clusters), through
# PgBouncer (transaction mode) in front of the proxy, with token leases
my $second = $ledger->another('2');
my $user = getpwuid($<);
my $bouncer = DurableLedger::PgBouncer->start($proxy,
	users => [ 'chaos_worker', 'chaos_reconciler', $user ], user => $user, pool_size => 4);
$stdout = chaos($second, 'token leases through PgBouncer',
	'--lease', 'token', '--pooler-dsn', $bouncer->connstr('proxy2'));
like($stdout, qr/^ok - every attempt held a token lease, none a session lease/m,
	'token leases: every attempt held a token lease');
like($stdout, qr/^ok - through the pooler, the workers and the late reporter shared/m,
	'token leases: the fleet shared fewer server connections than it had workers');

$bouncer->stop;
$ledger->stop;
done_testing();
