# 018_local_sigkill: a local effect (begin_local) whose worker is SIGKILLed
# after its intent and its write, before its completion: the client process,
# then the backend itself (the postmaster resets the cluster).  Its intent,
# its write and its completion commit together or not at all, so nothing of
# it is left -- no intent, no row, nothing unknown, nothing for a person --
# and the run's next attempt executes it once.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = ledger_node('local_sigkill', 'restart_after_crash = on');
$node->safe_psql('postgres', 'CREATE TABLE stock_moves (run text, item text, qty int)');

my $call = q{durable_ledger.begin_local('%s', 'stock.move', '{"item": "tea", "qty": 5}')};

# A worker inside its local effect: the intent and the write are made, not committed.
sub worker_in_flight
{
	my ($run) = @_;
	my $worker = $node->background_psql('postgres');
	$worker->query_safe('BEGIN');
	is($worker->query_safe(sprintf('SELECT decision FROM %s', sprintf($call, $run))),
		'execute', "$run: the worker is told to execute");
	$worker->query_safe("INSERT INTO stock_moves VALUES ('$run', 'tea', 5)");
	return ($worker, $worker->query_safe('SELECT pg_backend_pid()'));
}

# Nothing of the lost attempt is left, and the next one executes it once.
sub nothing_left_then_once
{
	my ($run) = @_;
	is($node->safe_psql('postgres',
			"SELECT count(*) FROM durable_ledger.effects WHERE run = '$run'"),
		0, "$run: no intent is left");
	is($node->safe_psql('postgres', "SELECT count(*) FROM stock_moves WHERE run = '$run'"),
		0, "$run: no write is left");
	is($node->safe_psql('postgres',
			"SELECT count(*) FROM durable_ledger.unresolved WHERE run = '$run'"),
		0, "$run: nothing waits for a person");
	my $next = $node->safe_psql('postgres', sprintf(q{
		BEGIN;
		SELECT decision || ' ' || attempt FROM %s;
		INSERT INTO stock_moves VALUES ('%s', 'tea', 5);
		SELECT status FROM durable_ledger.complete_effect(
			durable_ledger.effect_key('%s', 'stock.move', '{"item": "tea", "qty": 5}', 1),
			'{"moved": 5}', 1);
		COMMIT;}, sprintf($call, $run), $run, $run));
	is($next, "execute 1\ncompleted", "$run: the next attempt executes it, as attempt 1");
	is($node->safe_psql('postgres', sprintf(q{
		SELECT decision || ' ' || (result ->> 'moved') FROM %s}, sprintf($call, $run))),
		'replay 5', "$run: and then replays it");
	is($node->safe_psql('postgres', "SELECT count(*) FROM stock_moves WHERE run = '$run'"),
		1, "$run: the stock moved once");
}

# the client process dies without a word: its backend rolls the transaction back
my ($client, $client_pid) = worker_in_flight('local-client');
$client->{run}->signal('KILL');
$client->{run}->finish;
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $client_pid"),
	'the dead client\'s backend has ended');
nothing_left_then_once('local-client');

# the backend itself is killed: the cluster recovers without the transaction
my ($victim, $victim_pid) = worker_in_flight('local-backend');
my $log_offset = -s $node->logfile;
kill 'KILL', $victim_pid;
$node->wait_for_log(qr/all server processes terminated; reinitializing/, $log_offset);
ok($node->poll_query_until('postgres', 'SELECT true'), 'the cluster came back after crash recovery');
$victim->{run}->kill_kill;
nothing_left_then_once('local-backend');

$node->stop;
done_testing();
