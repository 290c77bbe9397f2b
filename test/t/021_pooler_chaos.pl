# 021_pooler_chaos: the fleet chaos test (test/chaos/fleet_chaos.py) through a
# real transaction pooler, with token leases: Debian's PgBouncer in
# pool_mode = transaction, with 3 server connections for 6 workers and the late
# reporter.  Workers take a token lease for their run, renew it from a
# heartbeat, pass lease => token to every begin_effect; they are SIGKILLed at
# random (their leases then expire: a dead worker does not end its token
# lease), frozen with SIGSTOP past their ttl and resumed (their next
# begin_effect is refused with 55L01 and their attempt ends), runs are
# delivered twice, interrupted runs restarted and paused effects reconciled.
# Every invoice is paid exactly as often as planned, nothing is left
# unresolved, every lease was a token lease, and the workers really shared
# fewer server connections than there were workers.  FLEET_CHAOS_RUNS /
# FLEET_CHAOS_KILLS / FLEET_CHAOS_SEED make a larger soak run.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::PgBouncer;
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

my $pool_size = 3;
my $node = ledger_node('pooler_chaos', 'max_connections = 50');
my $bouncer = DurableLedger::PgBouncer->start($node,
	users => [qw(postgres chaos_worker chaos_reconciler)],
	pool_size => $pool_size);

my @cmd = (
	'/usr/bin/python3', "$ENV{TESTDIR}/test/chaos/fleet_chaos.py",
	'--dsn', $node->connstr('postgres'),
	'--lease', 'token',
	'--pooler-dsn', $bouncer->connstr('postgres'),
	'--ttl', 2,
	'--seed', $ENV{FLEET_CHAOS_SEED} // 42,
	'--runs', $ENV{FLEET_CHAOS_RUNS} // 40,
	'--kills', $ENV{FLEET_CHAOS_KILLS} // 60);
my ($stdout, $stderr);
my $ok = IPC::Run::run(\@cmd, '>', \$stdout, '2>', \$stderr);
diag($stdout);
diag($stderr) if $stderr ne '';
ok($ok, 'the fleet chaos test with token leases through PgBouncer passed all its checks');
unlike($stdout, qr/^not ok/m, 'no check failed');
like($stdout, qr/^ok - every run finished/m, 'every run finished');
like($stdout, qr/^ok - every invoice paid exactly as often as planned/m,
	'every invoice was paid exactly as often as planned');
like($stdout, qr/^ok - no idempotency key paid twice/m, 'no idempotency key was paid twice');
like($stdout, qr/^ok - every business-key operation paid exactly once \(\d+ keys, [1-9]\d* executed again/m,
	'no business-key operation was paid twice, and some were executed again after a decline');
like($stdout, qr/^ok - no attempt tried at the bank twice/m, 'no attempt reached the bank twice');
like($stdout, qr/^ok - every attempt's record agrees with what the bank did for that very attempt/m,
	'effects and past_attempts agree with the bank, attempt by attempt');
like($stdout, qr/^ok - no report landed on another attempt/m,
	'every report in the audit log is filed under the attempt it is about');
like($stdout, qr/^ok - no attempt executed while an earlier one was unknown, in flight or completed/m,
	'no attempt was executed before the one before it had failed');
like($stdout, qr/^ok - nothing unresolved \(0\)/m, 'nothing was left unresolved');
like($stdout, qr/^ok - no lease left held \(0\)/m, 'no lease was left held');
like($stdout, qr/^ok - every attempt held a token lease, none a session lease \([1-9]\d* token leases, 0 session leases\)/m,
	'every attempt held a token lease; no call took a session lease through the pooler');
like($stdout, qr/^ok - the chaos happened: .*killed [1-9].*delivered twice [1-9].*paused [1-9].*frozen past their ttl [1-9]\d*, attempts ended by a lost lease [1-9]/m,
	'workers were killed, a run was delivered twice, runs paused, and frozen workers lost their leases (55L01) and stopped');
like($stdout, qr/^ok - no worker failed other than by SIGKILL, pause or a lost lease \(0\)/m,
	'no worker failed in any other way (no prepared-statement or pooler error)');

if ($stdout =~ /^ok - through the pooler, the workers and the late reporter shared at most (\d+) server connections while up to (\d+) worker processes ran at once/m)
{
	cmp_ok($1, '<=', $pool_size, "the pooler gave the fleet at most $pool_size server connections ($1)");
	cmp_ok($2, '>', $1, "more workers ran at once ($2) than there were server connections ($1)");
}
else
{
	fail('the chaos test reported how many server connections the fleet used');
}

$bouncer->stop;
$node->stop;
done_testing();
