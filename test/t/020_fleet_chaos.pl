# 020_fleet_chaos: the fleet chaos test (test/chaos/fleet_chaos.py) against a
# real cluster, with a fixed seed and a bounded size: workers SIGKILLed at
# random, runs delivered twice at once, interrupted runs restarted, paused
# effects reconciled by asking the bank about their attempt, business keys
# declined by the bank and executed again (attempt 2, 3), and truthful reports
# re-sent late and twice by replacements and a late reporter; every invoice is
# paid exactly as often as planned, and every report lands on the attempt it
# names.  It runs twice: first an on-call person settles every unknown outcome
# (resolve_effect, after asking the bank); then, in a fresh database, the
# workers themselves do (--reconcilers: bank.pay is reconcilable, and a worker
# that gets a pause for an unknown outcome asks the bank's lookup API by the
# provider key the lost attempt used, then reconcile_effect), and no unknown
# outcome is left for a person.  FLEET_CHAOS_RUNS / FLEET_CHAOS_KILLS /
# FLEET_CHAOS_SEED make a larger soak run.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = ledger_node('fleet_chaos', 'max_connections = 50');

sub chaos
{
	my ($dbname, $seed, @more) = @_;
	$node->safe_psql('postgres', "CREATE DATABASE $dbname");
	$node->safe_psql($dbname, 'CREATE EXTENSION durable_ledger CASCADE');
	my @cmd = (
		'/usr/bin/python3', "$ENV{TESTDIR}/test/chaos/fleet_chaos.py",
		'--dsn', $node->connstr($dbname),
		'--seed', $seed,
		'--runs', $ENV{FLEET_CHAOS_RUNS} // 40,
		'--kills', $ENV{FLEET_CHAOS_KILLS} // 60, @more);
	my ($stdout, $stderr);
	my $ok = IPC::Run::run(\@cmd, '>', \$stdout, '2>', \$stderr);
	diag($stdout);
	diag($stderr) if $stderr ne '';
	ok($ok, "the fleet chaos test passed all its checks (@more)");
	return $stdout;
}

my $stdout = chaos('chaos_people', $ENV{FLEET_CHAOS_SEED} // 42);
unlike($stdout, qr/^not ok/m, 'no check failed');
like($stdout, qr/^ok - every invoice paid exactly as often as planned/m,
	'every invoice was paid exactly as often as planned');
like($stdout, qr/^ok - every business-key operation paid exactly once \(\d+ keys, [1-9]\d* executed again/m,
	'no business-key operation was paid twice, and some were executed again after a decline');
like($stdout, qr/^ok - no attempt tried at the bank twice/m,
	'no attempt reached the bank twice');
like($stdout, qr/^ok - every attempt's record agrees with what the bank did for that very attempt/m,
	'effects and past_attempts agree with the bank, attempt by attempt');
like($stdout, qr/^ok - no report landed on another attempt/m,
	'every report in the audit log is filed under the attempt it is about');
like($stdout, qr/^ok - no attempt executed while an earlier one was unknown, in flight or completed/m,
	'no attempt was executed before the one before it had failed');
like($stdout, qr/^ok - nothing unresolved \(0\)/m, 'nothing was left unresolved');
like($stdout, qr/^ok - business keys were declined and executed again, and reports came late and twice/m,
	'late, duplicated and earlier-attempt reports were really sent');
like($stdout, qr/resolved by the reconciler [1-9]/, 'a person resolved unknown outcomes');

# the same chaos, the unknown outcomes settled by the workers' reconcilers
$stdout = chaos('chaos_reconcilers', ($ENV{FLEET_CHAOS_SEED} // 42) + 1, '--reconcilers');
unlike($stdout, qr/^not ok/m, 'no check failed, with reconcilers');
like($stdout, qr/^ok - every invoice paid exactly as often as planned/m,
	'with reconcilers, every invoice was paid exactly as often as planned');
like($stdout, qr/^ok - no attempt tried at the bank twice/m,
	'with reconcilers, no attempt reached the bank twice');
like($stdout, qr/^ok - every attempt's record agrees with what the bank did for that very attempt/m,
	'with reconcilers, effects and past_attempts agree with the bank');
like($stdout, qr/^ok - every unknown outcome settled by the workers' reconcilers from the bank's lookup API, none left for a person \([1-9]\d* reconciled, 0 resolved by a person\)/m,
	'every unknown outcome was settled by a reconciler, none by a person');
like($stdout, qr/^ok - nothing unresolved \(0\)/m, 'with reconcilers, nothing was left unresolved');

$node->stop;
done_testing();
