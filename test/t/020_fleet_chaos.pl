# 020_fleet_chaos: the fleet chaos test (test/chaos/fleet_chaos.py) against a
# real cluster, with a fixed seed and a bounded size: workers SIGKILLed at
# random, runs delivered twice at once, interrupted runs restarted, paused
# effects reconciled by asking the bank; every invoice is paid exactly as
# often as planned.  FLEET_CHAOS_RUNS / FLEET_CHAOS_KILLS / FLEET_CHAOS_SEED
# make a larger soak run.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = ledger_node('fleet_chaos', 'max_connections = 50');

my @cmd = (
	'/usr/bin/python3', "$ENV{TESTDIR}/test/chaos/fleet_chaos.py",
	'--dsn', $node->connstr('postgres'),
	'--seed', $ENV{FLEET_CHAOS_SEED} // 42,
	'--runs', $ENV{FLEET_CHAOS_RUNS} // 40,
	'--kills', $ENV{FLEET_CHAOS_KILLS} // 60);
my ($stdout, $stderr);
my $ok = IPC::Run::run(\@cmd, '>', \$stdout, '2>', \$stderr);
diag($stdout);
diag($stderr) if $stderr ne '';
ok($ok, 'the fleet chaos test passed all its checks');
unlike($stdout, qr/^not ok/m, 'no check failed');
like($stdout, qr/^ok - every invoice paid exactly as often as planned/m,
	'every invoice was paid exactly as often as planned');

$node->stop;
done_testing();
