# 016_failover: a primary stopped with -m immediate in the middle of a
# worker's begin_effect/complete_effect loop, and its standby promoted.
#
# Part 1, synchronous replication (synchronous_standby_names names the
# standby; synchronous_commit left at the server's default, and one of the
# worker's two connections even asks for synchronous_commit = off, which the
# ledger overrides): nothing acknowledged is lost by the failover.  On the
# promoted standby every intent answered with execute is there, every
# answered completion is 'completed' with its result, and nothing else was
# written but the one call in flight.  Intents answered but never completed
# (some on purpose, maybe the interrupted one) are 'started' in the table,
# and because their session leases died with the old primary, effect_status
# calls them 'unknown' and unresolved lists them; no lease survives; a new
# attempt in a new session replays every answered completion and pauses on
# the unknown ones.
#
# Part 2, asynchronous replication (no synchronous_standby_names): the same
# workload and failover, and the test only REPORTS (diag) how many
# acknowledged rows the promoted standby lacks.  It is why the README requires
# synchronous replication; how many are lost depends on timing, so it is not
# an assertion.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Test::More;

my $max_pairs = 3000;    # more than the loop can do before the stop lands
my $stop_after = 150;    # acknowledged completions before the primary is stopped
my $runs = 3;
my $hold_every = 40;     # every 40th effect is begun and left in flight on purpose

# The worker: one process, two connections (the second asks for
# synchronous_commit = off), runs spread over both.  It prints a line for
# every answer it got, flushed at once, and "lost" when the server went away.
my $worker_py = <<'PY';
import json, sys
import psycopg

dsn, prefix, max_pairs, runs, hold_every = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
conns = [psycopg.connect(dsn, autocommit=True), psycopg.connect(dsn, autocommit=True)]
conns[1].execute("SET synchronous_commit = off")
print("ready", flush=True)
try:
    for n in range(1, max_pairs + 1):
        r = n % runs
        conn = conns[r % 2]
        run = f"{prefix}-run-{r}"
        print(f"sent {run} {n}", flush=True)
        key, decision = conn.execute(
            "SELECT key, decision FROM durable_ledger.begin_effect(%s, 'bank.pay', %s::jsonb)",
            (run, json.dumps({"n": n}))).fetchone()
        print(f"intent {key} {decision} {run} {n}", flush=True)
        if decision != "execute" or n % hold_every == 0:
            continue
        (status,) = conn.execute(
            "SELECT status FROM durable_ledger.complete_effect(%s, %s::jsonb)",
            (key, json.dumps({"paid": n}))).fetchone()
        print(f"done {key} {status}", flush=True)
except psycopg.Error as e:
    print("lost " + str(e).replace("\n", " "), flush=True)
    sys.exit(0)
print("finished", flush=True)
PY

# A primary with durable_ledger and a streaming hot standby, both fsync = on;
# with $sync, the primary waits for the standby's flush.
sub ledger_pair
{
	my ($tag, $sync) = @_;
	my $primary = PostgreSQL::Test::Cluster->new("${tag}_primary");
	$primary->init(allows_streaming => 1);
	$primary->append_conf('postgresql.conf', "fsync = on\n");
	$primary->start;
	$primary->safe_psql('postgres', 'CREATE EXTENSION durable_ledger');
	$primary->backup("${tag}_backup");

	my $name = "${tag}_standby";
	my $standby = PostgreSQL::Test::Cluster->new($name);
	$standby->init_from_backup($primary, "${tag}_backup", has_streaming => 1);
	$standby->append_conf('postgresql.conf',
		"fsync = on\nprimary_conninfo = '" . $primary->connstr . " application_name=$name'\n");
	$standby->start;

	# after the backup: the promoted standby must not wait for a standby of its own
	if ($sync)
	{
		$primary->append_conf('postgresql.conf', "synchronous_standby_names = '$name'\n");
		$primary->reload;
	}
	my $state = $sync ? 'sync' : 'async';
	ok($primary->poll_query_until('postgres',
			"SELECT sync_state = '$state' AND state = 'streaming' FROM pg_stat_replication WHERE application_name = '$name'"),
		"$tag: the standby streams, $state");
	return ($primary, $standby);
}

# Runs the worker against $primary, stops $primary with -m immediate once
# $stop_after completions were answered, and returns what was answered.
# $midway, if given, is called once half of them were answered (the worker
# goes on meanwhile).
sub workload_until_stop
{
	my ($primary, $prefix, $midway) = @_;
	my ($out, $err) = ('', '');
	my $timer = IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default);
	my $h = IPC::Run::start(
		[ '/usr/bin/python3', '-c', $worker_py, $primary->connstr('postgres'),
		  $prefix, $max_pairs, $runs, $hold_every ],
		'<', \undef, '>', \$out, '2>', \$err, $timer);
	if ($midway)
	{
		$h->pump while $h->pumpable && (() = $out =~ /^done /mg) < $stop_after / 2;
		$midway->();
	}
	$h->pump while $h->pumpable && (() = $out =~ /^done /mg) < $stop_after;
	$primary->stop('immediate');
	$h->finish;

	my (%intents, %done, $last_sent);
	for my $line (split /\n/, $out)
	{
		if ($line =~ /^intent (\w+) execute (\S+) (\d+)$/)
		{
			$intents{$1} = { run => $2, n => $3 };
		}
		elsif ($line =~ /^done (\w+) completed$/)
		{
			$done{$1} = 1;
		}
		elsif ($line =~ /^sent \S+ (\d+)$/)
		{
			$last_sent = $1;
		}
	}
	my ($lost) = $out =~ /^lost (.*)$/m;
	return {
		intents => \%intents,
		done => \%done,
		last_sent => $last_sent,
		lost => $lost,
		stderr => $err,
		finished => scalar($out =~ /^finished$/m),
	};
}

sub promote
{
	my ($standby) = @_;
	$standby->promote;
	return $standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()');
}

# VALUES rows (key, run, n) of the given keys
sub values_of
{
	my ($w, @keys) = @_;
	return join(',', map { "('$_', '$w->{intents}{$_}{run}', $w->{intents}{$_}{n})" } @keys);
}

# --- part 1: synchronous replication -----------------------------------------

my ($primary, $standby) = ledger_pair('fo_sync', 1);
my $w = workload_until_stop($primary, 'sync');

ok(defined $w->{lost}, 'sync: the worker lost its server in the middle of its loop')
  or diag("worker output did not say lost; finished: $w->{finished}; stderr: $w->{stderr}");
is($w->{stderr}, '', 'sync: the worker wrote nothing to stderr');
my @intents = sort keys %{ $w->{intents} };
my @done = sort keys %{ $w->{done} };
my @open = grep { !$w->{done}{$_} } @intents;
my @held = grep { $w->{intents}{$_}{n} % $hold_every == 0 } @intents;
cmp_ok(scalar(@done), '>=', $stop_after, 'sync: ' . scalar(@done) . ' completions were acknowledged');
cmp_ok(scalar(@held), '>=', 2, 'sync: ' . scalar(@held) . ' intents were left in flight on purpose');
note('sync: ' . scalar(@intents) . ' intents acknowledged, ' . scalar(@open)
	  . " without completion; last call sent: n = $w->{last_sent}; worker: $w->{lost}");

ok(promote($standby), 'sync: the standby was promoted');

my $all = values_of($w, @intents);
is($standby->safe_psql('postgres',
		"SELECT count(*) FROM (VALUES $all) v(key, run, n) JOIN durable_ledger.effects e USING (key)
		  WHERE e.run = v.run AND e.args = jsonb_build_object('n', v.n)"),
	scalar(@intents), 'sync: every acknowledged intent is on the promoted standby');

my $done_values = values_of($w, @done);
is($standby->safe_psql('postgres',
		"SELECT count(*) FROM (VALUES $done_values) v(key, run, n) JOIN durable_ledger.effects e USING (key)
		  WHERE e.status = 'completed' AND e.result = jsonb_build_object('paid', v.n)"),
	scalar(@done), 'sync: every acknowledged completion is completed, with its result');

# Nothing but the one call in flight (never answered) may have been written besides.
my $extra = $standby->safe_psql('postgres',
	"SELECT coalesce(string_agg((args->>'n'), ','), '') FROM durable_ledger.effects
	  WHERE run LIKE 'sync-%' AND key NOT IN (SELECT key FROM (VALUES $all) v(key, run, n))");
ok($extra eq '' || $extra eq $w->{last_sent},
	"sync: no effect besides the acknowledged ones and the call in flight (extra: '$extra', in flight: $w->{last_sent})");

# acknowledged intents without an acknowledged completion
my $open_values = values_of($w, @open);
my $open_rows = $standby->safe_psql('postgres',
	"SELECT e.key || ' ' || e.status || ' ' || s.status || ' ' || (u.key IS NOT NULL)
	   FROM (VALUES $open_values) v(key, run, n)
	   JOIN durable_ledger.effects e USING (key)
	   CROSS JOIN LATERAL durable_ledger.effect_status(v.key) s
	   LEFT JOIN durable_ledger.unresolved u ON u.key = v.key AND u.status = 'unknown'");
my %open_state = map { my ($k, @rest) = split / /; ($k => "@rest") } split /\n/, $open_rows;
for my $key (@open)
{
	my $state = $open_state{$key} // 'missing';
	my $n = $w->{intents}{$key}{n};
	if ($n % $hold_every == 0)
	{
		is($state, 'started unknown true',
			"sync: n = $n, begun and left in flight: started in the table, unknown to effect_status, in unresolved");
	}
	else
	{
		# the completion in flight may have committed without its answer
		ok($state eq 'started unknown true' || $state eq 'completed completed false',
			"sync: n = $n, completion interrupted: unknown and unresolved, or completed unanswered ($state)");
	}
}

is($standby->safe_psql('postgres', 'SELECT count(*) FROM durable_ledger.leases'),
	0, 'sync: no lease survived the failover');
is($standby->safe_psql('postgres', 'SELECT count(*) FROM pg_locks WHERE locktype = \'advisory\' AND objsubid = 17484'),
	0, 'sync: no lease lock is held on the promoted standby');

# a new attempt, in a new session: every acknowledged completion replays
is($standby->safe_psql('postgres',
		"SELECT count(*) FROM (VALUES $done_values) v(key, run, n)
		  CROSS JOIN LATERAL durable_ledger.begin_effect(v.run, 'bank.pay', jsonb_build_object('n', v.n)) d
		  WHERE d.key = v.key AND d.decision = 'replay' AND d.result = jsonb_build_object('paid', v.n)"),
	scalar(@done), 'sync: a new attempt replays every acknowledged completion with its result');
my $held_values = values_of($w, @held);
is($standby->safe_psql('postgres',
		"SELECT count(*) FROM (VALUES $held_values) v(key, run, n)
		  CROSS JOIN LATERAL durable_ledger.begin_effect(v.run, 'bank.pay', jsonb_build_object('n', v.n)) d
		  WHERE d.key = v.key AND d.decision = 'pause' AND d.status = 'unknown'"),
	scalar(@held), 'sync: a new attempt pauses on every effect left in flight');

$standby->stop;

# --- part 2: asynchronous replication: only reported --------------------------

# How many acknowledged intents and completions the promoted standby lacks.
sub report_missing
{
	my ($standby, $w, $what) = @_;
	my @intents = sort keys %{ $w->{intents} };
	my @done = sort keys %{ $w->{done} };
	my $all = values_of($w, @intents);
	my $done_values = values_of($w, @done);
	my $missing_intents = $standby->safe_psql('postgres',
		"SELECT count(*) FROM (VALUES $all) v(key, run, n)
		  WHERE NOT EXISTS (SELECT 1 FROM durable_ledger.effects e WHERE e.key = v.key)");
	my $missing_completions = $standby->safe_psql('postgres',
		"SELECT count(*) FROM (VALUES $done_values) v(key, run, n)
		  WHERE NOT EXISTS (SELECT 1 FROM durable_ledger.effects e WHERE e.key = v.key AND e.status = 'completed')");
	diag("asynchronous replication, $what: after the failover the promoted standby lacks "
		  . "$missing_intents of " . scalar(@intents) . " acknowledged intents and "
		  . "$missing_completions of " . scalar(@done) . ' acknowledged completions');
}

# 2a: the same workload and failover; a standby on the same machine usually
# keeps up, so few or no rows are lost here, but none is promised.
my ($async_primary, $async_standby) = ledger_pair('fo_async', 0);
my $aw = workload_until_stop($async_primary, 'async');
ok(defined $aw->{lost}, 'async: the worker lost its server in the middle of its loop');
ok(promote($async_standby), 'async: the standby was promoted');
report_missing($async_standby, $aw, 'standby connected');
$async_standby->stop;

# 2b: the same, but the standby loses its connection to the primary halfway
# (a network blip): an asynchronous primary goes on acknowledging, and what it
# acknowledged meanwhile is gone after the failover.
my ($blip_primary, $blip_standby) = ledger_pair('fo_blip', 0);
my $bw = workload_until_stop($blip_primary, 'blip', sub {
	$blip_standby->append_conf('postgresql.conf', "primary_conninfo = ''\n");
	$blip_standby->reload;
	$blip_primary->poll_query_until('postgres', 'SELECT count(*) = 0 FROM pg_stat_replication')
	  or diag('the standby did not disconnect');
});
ok(defined $bw->{lost}, 'async blip: the worker lost its server in the middle of its loop');
ok(promote($blip_standby), 'async blip: the standby was promoted');
report_missing($blip_standby, $bw, 'standby cut off halfway');
$blip_standby->stop;

diag('the README requires synchronous replication (synchronous_standby_names) for this reason');
done_testing();
