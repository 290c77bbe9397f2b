# 023_pooler_session_unsafe: why a session lease must not go through a
# transaction pooler, and that a token lease passes the same scenario.
#
# PgBouncer in pool_mode = transaction hands each transaction of a client to
# whichever server connection is free, so a session advisory lock belongs to
# a server connection, not to the client that took it.  This test documents
# what then happens to session leases, step by step, and fails if the
# behaviour changes (a pooler or a ledger that starts to refuse it would have
# to update the README's advice):
#
#   - a run delivered twice: clients A and B, one after the other, land on the
#     same server connection; both acquire_run(wait => false) return true, and
#     both are told to execute the run's one payment (occurrences 1 and 2):
#     the invoice would be paid twice;
#   - while another client's transaction occupies that connection, A's next
#     calls land on another one: its begin_effect waits for the lock A itself
#     "holds" (55P03 after lock_timeout; without one, for ever), and its
#     release_run returns false;
#   - the lock outlives every client: with nobody connected, the run is still
#     held, by a pooled server connection, and a worker connecting directly
#     cannot take it (break_lease ends it).
#
# The same scenario with the clients' guard (1.3): each call asks
# session_epoch() in its own statement and is made only on the session that
# holds the attempt's epoch, so A's call after B took the connection over is
# not made, nor B's once it lands on another connection; release_attempt()
# then ends the lock where it was left (terminating that server connection,
# and with it the transaction another client had open there), and the run is
# free.
#
# The same scenario with a token lease: B's take_lease returns NULL on the
# very same server connection, B's begin_effect without the token is refused
# at once (55P03), so the payment is executed once; A's calls go on from any
# server connection, with its occurrence counters; release_lease works from
# any of them; and nothing is left held.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::PgBouncer;
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = ledger_node('pooler_session_unsafe');
# a database per scenario: each gets a pool of its own, empty at the start
for my $db (qw(session_db guard_db token_db))
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION durable_ledger');
}
my $bouncer = DurableLedger::PgBouncer->start($node, pool_size => 3);
my $pay = q{'twice-run', 'bank.pay', '{"invoice": "INV-7", "amount": 700}'};

# A client session through the pooler, whose errors do not end it and show
# their SQLSTATE.
sub client
{
	my ($db) = @_;
	return $bouncer->background_psql($db, on_error_stop => 0,
		extra_params => [ '-v', 'VERBOSITY=verbose' ]);
}

# A query that must fail: its error (the session's stderr), cleared.
sub error_of
{
	my ($session, $sql) = @_;
	$session->query($sql);
	my $err = $session->{stderr};
	$session->{stderr} = '';
	return $err;
}

# ---------------------------------------------------------------------------
# Session lease
# ---------------------------------------------------------------------------
{
	my $db = 'session_db';
	my ($a, $b) = (client($db), client($db));

	my ($a_pid, $a_got) = split(/\|/,
		$a->query_safe("SELECT pg_backend_pid(), durable_ledger.acquire_run('twice-run', wait => false)"));
	my ($b_pid, $b_got) = split(/\|/,
		$b->query_safe("SELECT pg_backend_pid(), durable_ledger.acquire_run('twice-run', wait => false)"));
	is($a_got, 't', 'session lease: A acquires the run');
	is($b_pid, $a_pid, 'B\'s transaction runs on the very server connection A\'s did');
	is($b_got, 't', 'B acquires the run too: two clients believe they hold the lease of one run');

	is($a->query_safe("SELECT decision || ' ' || occurrence FROM durable_ledger.begin_effect($pay)"),
		'execute 1', 'A is told to execute the payment');
	is($b->query_safe("SELECT decision || ' ' || occurrence FROM durable_ledger.begin_effect($pay)"),
		'execute 2', 'B is told to execute it as well (as the run\'s second identical call): paid twice');
	is($node->safe_psql($db, q{
		SELECT count(DISTINCT lease_epoch) || ' ' || count(*) FROM durable_ledger.effects
		 WHERE run = 'twice-run' AND status = 'started'}),
		'1 2', 'the ledger saw one lease epoch making two payments');

	# another client's transaction occupies the connection that holds the lock
	my $c = client($db);
	$c->query_safe('BEGIN');
	is($c->query_safe('SELECT pg_backend_pid()'), $a_pid,
		'C\'s transaction is given the (only idle) server connection that holds the lock');

	$a->query_safe('BEGIN');
	my $a_pid2 = $a->query_safe('SELECT pg_backend_pid()');
	isnt($a_pid2, $a_pid, 'A\'s next transaction lands on another server connection');
	$a->query_safe("SET LOCAL lock_timeout = '200ms'");
	like(error_of($a, "SELECT decision FROM durable_ledger.begin_effect($pay)"),
		qr/ERROR:  55P03: gave up waiting for the lease on run "twice-run" after 200 ms/,
		'where A\'s begin_effect waits for the lock A "holds" (55P03 after lock_timeout; without one, after durable_ledger.lease_wait_timeout)');
	$a->query_safe('ROLLBACK');
	my ($a_pid3, $released) = split(/\|/,
		$a->query_safe("SELECT pg_backend_pid(), durable_ledger.release_run('twice-run')"));
	isnt($a_pid3, $a_pid, 'A\'s release_run lands on another server connection too');
	is($released, 'f', 'and returns false: that connection holds nothing');

	$a->quit;
	$b->quit;
	$c->query_safe('COMMIT');
	$c->quit;
	ok($bouncer->wait_for_no_clients($db), 'every client has gone');
	is($node->safe_psql($db, q{SELECT kind || ' ' || holder_pid FROM durable_ledger.leases WHERE run = 'twice-run'}),
		"session $a_pid", 'the lock outlives every client: the run is still held, by that server connection');
	is(scalar(grep { $_->{remote_pid} eq $a_pid && $_->{state} eq 'idle' } $bouncer->servers($db)), 1,
		'which sits idle in the pooler\'s pool, for the next client that happens to get it');
	is($node->safe_psql($db, q{SELECT durable_ledger.acquire_run('twice-run', wait => false)}),
		'f', 'a worker connecting directly cannot take the run');
	is($node->safe_psql($db, q{SELECT durable_ledger.break_lease('twice-run', 'tap', 'leaked through the pooler')}),
		't', 'an admin can end it with break_lease (which terminates that server connection)');
	# (the terminated backend ends, and lets go of its locks, after break_lease returns)
	ok($node->poll_query_until($db, qq{SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $a_pid)}),
		'the server connection that held it is gone');
	is($node->safe_psql($db, q{SELECT count(*) FROM durable_ledger.leases}), 0, 'then nothing holds the run');
}

# ---------------------------------------------------------------------------
# Session lease with the clients' guard: the same scenario
# ---------------------------------------------------------------------------
{
	my $db = 'guard_db';
	my ($a, $b) = (client($db), client($db));
	my $acquire = q{SELECT a.acquired || '|' || durable_ledger.session_epoch('twice-run') || '|' || pg_backend_pid()
	                  FROM (SELECT durable_ledger.acquire_run('twice-run', wait => false) AS acquired OFFSET 0) a};
	# a call of the attempt at (epoch, pid): decision and occurrence, or
	# "not called" with the epoch and the server connection it reached
	my $guarded = sub {
		my ($session, $epoch) = @_;
		return $session->query_safe(qq{
			SELECT coalesce((g.d).decision || ' ' || (g.d).occurrence,
			                'not called: epoch ' || coalesce(s.epoch::text, 'none') || ' on ' || s.pid)
			  FROM (SELECT pg_backend_pid() AS pid, durable_ledger.session_epoch('twice-run') AS epoch
			        OFFSET 0) s,
			       LATERAL (SELECT CASE WHEN s.epoch = $epoch
			                            THEN durable_ledger.begin_effect($pay) END AS d
			                OFFSET 0) g});
	};

	my ($a_got, $a_epoch, $a_pid) = split(/\|/, $a->query_safe($acquire));
	my ($b_got, $b_epoch, $b_pid) = split(/\|/, $b->query_safe($acquire));
	is("$a_got $b_got", 'true true', 'guard: A and B both acquire the run');
	is($b_pid, $a_pid, 'on the very same server connection');
	is($b_epoch, $a_epoch + 1, 'B\'s acquisition is the next epoch of that session');
	is($guarded->($a, $a_epoch), "not called: epoch $b_epoch on $a_pid",
		'A\'s call is not made: the session it reached is in B\'s epoch (the client raises PoolerDetected)');
	is($guarded->($b, $b_epoch), 'execute 1', 'B\'s call is made: the payment is executed once');

	# another client's transaction occupies the connection that holds the lock
	my $c = client($db);
	$c->query_safe('BEGIN');
	is($c->query_safe('SELECT pg_backend_pid()'), $a_pid,
		'guard: C\'s transaction is given the server connection that holds the lock');
	my $reached = $guarded->($b, $b_epoch);
	like($reached, qr/^not called: epoch none on (\d+)$/, 'B\'s next call lands elsewhere and is not made');
	my ($b_pid2) = $reached =~ /on (\d+)$/;
	isnt($b_pid2, $a_pid, '(another server connection)');
	is($b->query_safe("SELECT durable_ledger.release_attempt('twice-run', $a_epoch)"), 'f',
		'release_attempt of A\'s epoch ends nothing: B\'s attempt superseded it');
	is($b->query_safe("SELECT durable_ledger.release_attempt('twice-run', $b_epoch)"), 't',
		'release_attempt of B\'s epoch ends the lock where it was left');
	ok($node->poll_query_until($db, qq{SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $a_pid)}),
		'the server connection that held it is gone');
	ok(!eval { $c->query_safe('SELECT 1'); 1 },
		'and with it C\'s transaction there: PgBouncer closed C\'s connection (as with break_lease)');
	is($node->safe_psql($db, q{SELECT count(*) FROM durable_ledger.leases WHERE run = 'twice-run'}), 0,
		'nothing holds the run');
	is($node->safe_psql($db, q{
		SELECT count(*) || ' ' || count(DISTINCT lease_epoch) FROM durable_ledger.effects WHERE run = 'twice-run'}),
		'1 1', 'the ledger saw one payment');
	is($node->safe_psql($db, q{
		SELECT detail->>'broken_by' || ' ' || lease_epoch FROM durable_ledger.audit_log
		 WHERE run = 'twice-run' AND event = 'lease_broken'}),
		"release_attempt $b_epoch", 'audited as lease_broken, by release_attempt, for B\'s epoch');
	is($node->safe_psql($db, q{SELECT durable_ledger.acquire_run('twice-run', wait => false)}),
		't', 'a worker connecting directly can take the run');
	$a->quit;
	$b->quit;
	eval { $c->quit };    # its psql has ended with the connection
}

# ---------------------------------------------------------------------------
# Token lease: the same scenario
# ---------------------------------------------------------------------------
{
	my $db = 'token_db';
	my ($a, $b) = (client($db), client($db));

	my ($a_pid, $token) = split(/\|/,
		$a->query_safe("SELECT pg_backend_pid(), token FROM durable_ledger.take_lease('twice-run', '1 minute', 'A')"));
	like($token, qr/^[0-9a-f]{64}$/, 'token lease: A takes the run');
	my ($b_pid, $b_null) = split(/\|/,
		$b->query_safe("SELECT pg_backend_pid(), durable_ledger.take_lease('twice-run', '1 minute', 'B') IS NULL"));
	is($b_pid, $a_pid, 'B\'s transaction runs on the very server connection A\'s did');
	is($b_null, 't', 'B\'s take_lease returns NULL: the run is A\'s, whichever connection asks');

	is($a->query_safe("SELECT decision || ' ' || occurrence FROM durable_ledger.begin_effect($pay, lease => '$token')"),
		'execute 1', 'A is told to execute the payment');
	like(error_of($b, "SELECT decision FROM durable_ledger.begin_effect($pay)"),
		qr/ERROR:  55P03: run "twice-run" is held by a token lease/,
		'B\'s begin_effect without the token is refused at once (55P03), on the same server connection');
	is($b->query_safe("SELECT durable_ledger.acquire_run('twice-run', wait => false)"), 'f',
		'and B cannot take a session lease on the run either');

	my $c = client($db);
	$c->query_safe('BEGIN');
	is($c->query_safe('SELECT pg_backend_pid()'), $a_pid,
		'C\'s transaction is given the server connection A\'s calls ran on');
	my ($a_pid2, $decision) = split(/\|/, $a->query_safe(
		"SELECT pg_backend_pid(), decision || ' ' || occurrence FROM durable_ledger.begin_effect($pay, lease => '$token')"));
	isnt($a_pid2, $a_pid, 'A\'s next call lands on another server connection');
	is($decision, 'execute 2',
		'and goes on with A\'s lease and its occurrence counter (the run\'s second identical call)');
	my ($a_pid3, $released) = split(/\|/,
		$a->query_safe("SELECT pg_backend_pid(), durable_ledger.release_lease('$token')"));
	isnt($a_pid3, $a_pid, 'A\'s release_lease runs on another server connection too');
	is($released, 't', 'and releases the lease');

	$a->quit;
	$b->quit;
	$c->query_safe('COMMIT');
	$c->quit;
	ok($bouncer->wait_for_no_clients($db), 'every client has gone');
	is($node->safe_psql($db, q{
		SELECT count(*) || ' ' || count(DISTINCT lease_epoch) FROM durable_ledger.effects WHERE run = 'twice-run'}),
		'2 1', 'the ledger saw only A\'s epoch make calls (its two identical calls)');
	is($node->safe_psql($db, q{SELECT count(*) FROM durable_ledger.leases}), 0,
		'nothing is left held after every client has gone');
	is($node->safe_psql($db, q{SELECT durable_ledger.acquire_run('twice-run', wait => false)}),
		't', 'a worker connecting directly can take the run');
}

$bouncer->stop;
$node->stop;
done_testing();
