# 012_backend_crash: a backend is SIGKILLed in the middle of a fleet, so the
# postmaster resets the whole cluster (crash recovery).  Nothing that was
# acknowledged to a client is lost: every intent answered with execute and
# every completion answered is there after recovery; the leases of all
# sessions are gone, and the intents left without completion wait for a
# person.  The workers ask for synchronous_commit = off: the ledger must not
# care.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

my $workers = 4;
my $steps = 30;

my $node = ledger_node('backend_crash', 'fsync = on', 'restart_after_crash = on',
	'wal_writer_delay = 10s');

my @sessions = map { $node->background_psql('postgres', on_error_stop => 0) } 1 .. $workers;
$_->query_safe('SET synchronous_commit = off') for @sessions;

# Interleave the workers: each pays invoices of its own run.
my (%acked_intents, %acked_completions);
for my $step (1 .. $steps)
{
	for my $w (1 .. $workers)
	{
		my $s = $sessions[ $w - 1 ];
		my $key = $s->query_safe(
			"SELECT key FROM durable_ledger.begin_effect('fleet-$w', 'bank.pay', '{\"step\": $step}') WHERE decision = 'execute'");
		$acked_intents{$key} = 1 if $key ne '';
		my $status = $s->query_safe("SELECT status FROM durable_ledger.complete_effect('$key', '{\"paid\": $step}')");
		$acked_completions{$key} = 1 if $status eq 'completed';
	}
}
# then every worker begins a refund and is still performing it: intents without completions
for my $w (1 .. $workers)
{
	my $key = $sessions[ $w - 1 ]->query_safe(
		"SELECT key FROM durable_ledger.begin_effect('fleet-$w', 'bank.refund', '{\"w\": $w}') WHERE decision = 'execute'");
	$acked_intents{$key} = 1 if $key ne '';
}
is(scalar(keys %acked_intents), $workers * $steps + $workers, 'every intent was acknowledged');

# kill -9 one worker's backend: the postmaster ends every session and recovers
my $victim = $sessions[0]->query_safe('SELECT pg_backend_pid()');
my $log_offset = -s $node->logfile;
kill 'KILL', $victim;
# (a connection made before the postmaster has seen the crash would still be
# answered by the old cluster: wait for the reset, then for the recovered cluster)
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset);
ok($node->poll_query_until('postgres', 'SELECT true'), 'the cluster came back after crash recovery');
$_->{run}->kill_kill for @sessions;

my $keys_list = join(',', map { "'$_'" } keys %acked_intents);
is($node->safe_psql('postgres', "SELECT count(*) FROM durable_ledger.effects WHERE key IN ($keys_list)"),
	scalar(keys %acked_intents), 'every acknowledged intent survived');
my $done_list = join(',', map { "'$_'" } keys %acked_completions);
is($node->safe_psql('postgres',
		"SELECT count(*) FROM durable_ledger.effects WHERE key IN ($done_list) AND status = 'completed'"),
	scalar(keys %acked_completions), 'every acknowledged completion survived');
is($node->safe_psql('postgres', 'SELECT count(*) FROM durable_ledger.leases'), 0,
	'no lease outlived the crash');
is($node->safe_psql('postgres', "SELECT count(*) FROM durable_ledger.unresolved WHERE run LIKE 'fleet-%'"),
	$workers, 'the in-flight intents wait for a person');

$node->stop;
done_testing();
