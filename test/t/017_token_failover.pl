# 017_token_failover: token leases are rows, and a failover to a synchronous
# standby keeps them, so their holder goes on against the new primary with
# its token.  The worker's connection asks for synchronous_commit = off, as
# a pooled connection may: take_lease, renew_lease, release_lease and a call
# counted under a token lease (its occurrence counter) still wait for the
# standby (a lost count would give the holder's next identical call an
# occurrence it already used).  With the standby cut off, each of them waits
# in SyncRep instead of answering; the primary is then stopped with -m
# immediate and the standby promoted: everything answered is there, the
# token's counters go on where they were, its effect left in flight is
# 'started' under a live lease (not 'unknown'), and the holder reports it.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Time::HiRes qw(usleep);
use Test::More;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;

my ($primary, $standby) = ledger_pair('tok_fo', 1);

# A worker session that asks for synchronous_commit = off.
sub worker_session
{
	my $s = $primary->background_psql('postgres');
	$s->query_safe('SET synchronous_commit = off');
	return $s;
}

my $w = worker_session();
my $token = $w->query_safe(q{SELECT (durable_ledger.take_lease('tok-fo', '1 hour', 'w1')).token});
like($token, qr/^[0-9a-f]{64}$/, 'the worker took a token lease');

# three identical payments (occurrences 1, 2, 3); 1 and 2 completed, 3 in flight
my @keys;
for my $n (1 .. 3)
{
	my ($key, $occurrence) = split /\|/, $w->query_safe(qq{
		SELECT key || '|' || occurrence FROM durable_ledger.begin_effect(
		  'tok-fo', 'bank.pay', '{"invoice": "INV-1"}', lease => '$token') WHERE decision = 'execute'});
	is($occurrence, $n, "call $n executes as occurrence $n");
	push @keys, $key;
}
for my $n (1 .. 2)
{
	is($w->query_safe(qq{SELECT status FROM durable_ledger.complete_effect('$keys[$n-1]', '{"paid": $n}', 1)}),
		'completed', "payment $n completed");
}
ok($w->query_safe(qq{SELECT durable_ledger.renew_lease('$token', '2 hours') > now() + interval '119 minutes'}) eq 't',
	'the lease was renewed for two hours');

# two more token leases, one to be released and one renewed while the standby is
# cut off (on runs of their own: a call of tok-fo that waits for the standby holds
# the run's call lock until it ends, and a renewal of tok-fo would wait for that)
my $other = $w->query_safe(q{SELECT (durable_ledger.take_lease('tok-fo-2', '1 hour')).token});
my $renewed = $w->query_safe(q{SELECT (durable_ledger.take_lease('tok-fo-4', '1 hour')).token});

# --- the standby is cut off: each token write waits for it ------------------

ok(cut_off($primary, $standby), 'the standby no longer receives WAL');

my %waiting = (
	'take_lease()' => q{SELECT durable_ledger.take_lease('tok-fo-3', '1 hour');},
	'renew_lease()' => qq{SELECT durable_ledger.renew_lease('$renewed');},
	'release_lease()' => qq{SELECT durable_ledger.release_lease('$other');},
	'a counted call (a replay)' => qq{SELECT decision FROM durable_ledger.begin_effect(
		'tok-fo', 'bank.pay', '{"invoice": "INV-1"}', lease => '$token');},
);
my @sessions;
for my $what (sort keys %waiting)
{
	my $s = worker_session();
	my $pid = $s->query_safe('SELECT pg_backend_pid()');
	$s->{stdin} .= $waiting{$what} . "\n";
	$s->{run}->pump_nb;
	ok($primary->poll_query_until('postgres',
			"SELECT wait_event = 'SyncRep' FROM pg_stat_activity WHERE pid = $pid"),
		"$what, asked for with synchronous_commit = off, waits for the synchronous standby");
	push @sessions, $s;
}

# --- failover -----------------------------------------------------------------

$primary->stop('immediate');
$_->{run}->kill_kill for ($w, @sessions);
$standby->promote;
ok($standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()'), 'the standby was promoted');

# the holder goes on with its token against the new primary
is($standby->safe_psql('postgres', "SELECT kind || ' ' || holder || ' ' || liveness FROM durable_ledger.leases WHERE run = 'tok-fo'"),
	'token w1 live', 'promoted: the token lease is there, live');
ok($standby->safe_psql('postgres', "SELECT expires_at > now() + interval '100 minutes' FROM durable_ledger.token_leases WHERE run = 'tok-fo'") eq 't',
	'promoted: with the expiry of its acknowledged renewal');
is($standby->safe_psql('postgres', "SELECT string_agg(status, ',' ORDER BY occurrence) FROM durable_ledger.effects WHERE run = 'tok-fo'"),
	'completed,completed,started', 'promoted: every acknowledged intent and completion is there');
is($standby->safe_psql('postgres', "SELECT status FROM durable_ledger.effect_status('$keys[2]')"),
	'started', 'promoted: the payment in flight is started under a live lease, not unknown');
is($standby->safe_psql('postgres', "SELECT count(*) FROM durable_ledger.unresolved WHERE run = 'tok-fo'"),
	0, 'promoted: nothing of the run waits for a person');
is($standby->safe_psql('postgres', qq{SELECT status FROM durable_ledger.complete_effect('$keys[2]', '{"paid": 3}', 1)}),
	'completed', 'promoted: the holder reports its payment in flight');
is($standby->safe_psql('postgres', qq{
	SELECT decision || ' ' || occurrence FROM durable_ledger.begin_effect(
	  'tok-fo', 'bank.pay', '{"invoice": "INV-1"}', lease => '$token')}),
	'execute 4', 'promoted: its next identical call is occurrence 4: the counters survived');
is($standby->safe_psql('postgres', "SELECT durable_ledger.release_lease('$token')"),
	't', 'promoted: it releases its lease');

$standby->stop;
done_testing();
