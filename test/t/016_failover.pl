# 016_failover: a primary stopped with -m immediate in the middle of a
# worker's begin_effect/complete_effect loop, and its standby promoted.
#
# Part 1, synchronous replication (synchronous_standby_names names the
# standby; synchronous_commit left at the server's default): nothing
# acknowledged is lost by the failover.  On the promoted standby every intent
# answered with execute is there, every answered completion is 'completed'
# with its result, and nothing else was written but the one call in flight.
# Intents answered but never completed (some on purpose, maybe the
# interrupted one) are 'started' in the table, and because their session
# leases died with the old primary, effect_status calls them 'unknown' and
# unresolved lists them; no lease survives; a new attempt in a new session
# replays every answered completion and pauses on the effects left in flight.
#   1a: the primary is stopped while the loop runs at full speed; one of the
#       worker's two connections asks for synchronous_commit = off.
#   1b: the standby is cut off from the primary halfway, with every call on a
#       connection that asks for synchronous_commit = off: the ledger still
#       makes each intent and completion wait for the standby, so the worker
#       stops getting answers (it waits in SyncRep), and the failover loses
#       nothing it was told.  A ledger that let the session's setting through
#       would keep answering, and lose those answers in the failover.
#
# Part 2, asynchronous replication (no synchronous_standby_names): the same
# workload and failover, (2a) with the standby connected and (2b) with it cut
# off halfway, as in a network blip.  The test only REPORTS (diag) how many
# acknowledged rows the promoted standby lacks, and how many of the lost
# intents a new attempt is told to execute again (the effect would happen
# twice): it is why the README requires synchronous replication, and the
# counts depend on timing.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use IPC::Run;
use Time::HiRes qw(usleep);
use Test::More;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;

my $max_pairs = 3000;    # more than the loop can do before the stop lands
my $stop_after = 150;    # acknowledged completions before the primary is stopped
my $runs = 3;
my $hold_every = 40;     # every 40th effect is begun and left in flight on purpose

# The worker: one process, two connections (the second asks for
# synchronous_commit = off); with connections = "mixed" its runs are spread
# over both, with "off" they all use the second.  It prints a line for every
# answer it got, flushed at once, and "lost" when the server went away.
my $worker_py = <<'PY';
import json, sys
import psycopg

dsn, prefix, connections = sys.argv[1], sys.argv[2], sys.argv[3]
max_pairs, runs, hold_every = int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
conns = [psycopg.connect(dsn, autocommit=True), psycopg.connect(dsn, autocommit=True)]
conns[1].execute("SET synchronous_commit = off")
try:
    for n in range(1, max_pairs + 1):
        r = n % runs
        conn = conns[r % 2] if connections == "mixed" else conns[1]
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

sub count_done
{
	my ($out) = @_;
	return scalar(() = $out =~ /^done /mg);
}

# Runs the worker against $primary and stops $primary with -m immediate once
# $stop_after completions were answered; returns what was answered.  With
# $midway, that is called once half of them were answered (the worker goes
# on meanwhile) with the harness and a reference to its output, and the
# primary is stopped as soon as it returns true.
sub workload_until_stop
{
	my ($primary, $prefix, $connections, $midway) = @_;
	my ($out, $err) = ('', '');
	my $timer = IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default);
	my $h = IPC::Run::start(
		[ '/usr/bin/python3', '-c', $worker_py, $primary->connstr('postgres'),
		  $prefix, $connections, $max_pairs, $runs, $hold_every ],
		'<', \undef, '>', \$out, '2>', \$err, $timer);
	my $stop_now = 0;
	if ($midway)
	{
		$h->pump while $h->pumpable && count_done($out) < $stop_after / 2;
		$stop_now = $midway->($h, \$out);
	}
	$h->pump while !$stop_now && $h->pumpable && count_done($out) < $stop_after;
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

# Everything the worker was told is on the promoted standby, as 1a/1b say.
sub check_nothing_acknowledged_lost
{
	my ($standby, $w, $tag, $prefix) = @_;

	ok(defined $w->{lost}, "$tag: the worker lost its server in the middle of its loop")
	  or diag("worker output did not say lost; finished: $w->{finished}");
	is($w->{stderr}, '', "$tag: the worker wrote nothing to stderr");
	my @intents = sort keys %{ $w->{intents} };
	my @done = sort keys %{ $w->{done} };
	my @open = grep { !$w->{done}{$_} } @intents;
	my @held = grep { $w->{intents}{$_}{n} % $hold_every == 0 } @intents;
	cmp_ok(scalar(@done), '>=', $stop_after / 2, "$tag: " . scalar(@done) . ' completions were acknowledged');
	cmp_ok(scalar(@held), '>=', 1, "$tag: " . scalar(@held) . ' intents were left in flight on purpose');
	note("$tag: " . scalar(@intents) . ' intents acknowledged, ' . scalar(@open)
		  . " without completion; last call sent: n = $w->{last_sent}; worker: $w->{lost}");

	ok(promote($standby), "$tag: the standby was promoted");

	my $all = values_of($w, @intents);
	is($standby->safe_psql('postgres',
			"SELECT count(*) FROM (VALUES $all) v(key, run, n) JOIN durable_ledger.effects e USING (key)
			  WHERE e.run = v.run AND e.args = jsonb_build_object('n', v.n)"),
		scalar(@intents), "$tag: every acknowledged intent is on the promoted standby");

	my $done_values = values_of($w, @done);
	is($standby->safe_psql('postgres',
			"SELECT count(*) FROM (VALUES $done_values) v(key, run, n) JOIN durable_ledger.effects e USING (key)
			  WHERE e.status = 'completed' AND e.result = jsonb_build_object('paid', v.n)"),
		scalar(@done), "$tag: every acknowledged completion is completed, with its result");

	# Nothing but the one call in flight (never answered) may have been written besides.
	my $extra = $standby->safe_psql('postgres',
		"SELECT coalesce(string_agg((args->>'n'), ','), '') FROM durable_ledger.effects
		  WHERE run LIKE '$prefix-%' AND key NOT IN (SELECT key FROM (VALUES $all) v(key, run, n))");
	ok($extra eq '' || $extra eq $w->{last_sent},
		"$tag: no effect besides the acknowledged ones and the call in flight (extra: '$extra', in flight: $w->{last_sent})");

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
				"$tag: n = $n, begun and left in flight: started in the table, unknown to effect_status, in unresolved");
		}
		else
		{
			# the completion in flight may have committed without its answer
			ok($state eq 'started unknown true' || $state eq 'completed completed false',
				"$tag: n = $n, completion interrupted: unknown and unresolved, or completed unanswered ($state)");
		}
	}

	is($standby->safe_psql('postgres', 'SELECT count(*) FROM durable_ledger.leases'),
		0, "$tag: no lease survived the failover");
	is($standby->safe_psql('postgres',
			"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 17484"),
		0, "$tag: no lease lock is held on the promoted standby");

	# a new attempt, in a new session: every acknowledged completion replays
	is($standby->safe_psql('postgres',
			"SELECT count(*) FROM (VALUES $done_values) v(key, run, n)
			  CROSS JOIN LATERAL durable_ledger.begin_effect(v.run, 'bank.pay', jsonb_build_object('n', v.n)) d
			  WHERE d.key = v.key AND d.decision = 'replay' AND d.result = jsonb_build_object('paid', v.n)"),
		scalar(@done), "$tag: a new attempt replays every acknowledged completion with its result");
	my $held_values = values_of($w, @held);
	is($standby->safe_psql('postgres',
			"SELECT count(*) FROM (VALUES $held_values) v(key, run, n)
			  CROSS JOIN LATERAL durable_ledger.begin_effect(v.run, 'bank.pay', jsonb_build_object('n', v.n)) d
			  WHERE d.key = v.key AND d.decision = 'pause' AND d.status = 'unknown'"),
		scalar(@held), "$tag: a new attempt pauses on every effect left in flight");
}

# --- part 1a: synchronous replication, stopped at full speed -------------------

my ($primary, $standby) = ledger_pair('fo_sync', 1);
my $w = workload_until_stop($primary, 'sync', 'mixed');
check_nothing_acknowledged_lost($standby, $w, 'sync', 'sync');
$standby->stop;

# --- part 1b: synchronous replication, standby cut off, session asks for off ---

my ($cut_primary, $cut_standby) = ledger_pair('fo_cut', 1);
my $cw = workload_until_stop($cut_primary, 'cut', 'off', sub {
	my ($h, $out) = @_;
	ok(cut_off($cut_primary, $cut_standby), 'sync cut: the standby no longer receives WAL');
	# The worker's next intent or completion must wait for the standby.  A
	# bounded poll: a ledger that did not make it wait would keep answering.
	my $answered = count_done($$out);
	my $waiting = 0;
	for (1 .. 10 * $PostgreSQL::Test::Utils::timeout_default)
	{
		$h->pump_nb;
		last if count_done($$out) > $answered + 20 || !$h->pumpable;
		$waiting = $cut_primary->safe_psql('postgres',
			"SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'");
		last if $waiting;
		usleep(100_000);
	}
	ok($waiting, 'sync cut: the worker, which asked for synchronous_commit = off, waits for the standby');
	return 1;
});
check_nothing_acknowledged_lost($cut_standby, $cw, 'sync cut', 'cut');
$cut_standby->stop;

# --- part 2: asynchronous replication: only reported --------------------------

# How many acknowledged intents and completions the promoted standby lacks,
# and how many of the lost intents a new attempt is told to execute again
# (the effect would happen twice).
sub report_missing
{
	my ($standby, $w, $what) = @_;
	my @intents = sort keys %{ $w->{intents} };
	my @done = sort keys %{ $w->{done} };
	my %present = map { $_ => 1 } split /\n/, $standby->safe_psql('postgres',
		'SELECT key FROM durable_ledger.effects WHERE key IN (' . join(',', map { "'$_'" } @intents) . ')');
	my @missing = grep { !$present{$_} } @intents;
	my $done_values = values_of($w, @done);
	my $missing_completions = $standby->safe_psql('postgres',
		"SELECT count(*) FROM (VALUES $done_values) v(key, run, n)
		  WHERE NOT EXISTS (SELECT 1 FROM durable_ledger.effects e WHERE e.key = v.key AND e.status = 'completed')");
	my $executed_again = 0;
	if (@missing)
	{
		my $missing_values = values_of($w, @missing);
		$executed_again = $standby->safe_psql('postgres',
			"SELECT count(*) FROM (VALUES $missing_values) v(key, run, n)
			  CROSS JOIN LATERAL durable_ledger.begin_effect(v.run, 'bank.pay', jsonb_build_object('n', v.n)) d
			  WHERE d.key = v.key AND d.decision = 'execute'");
	}
	diag("asynchronous replication, $what: after the failover the promoted standby lacks "
		  . scalar(@missing) . ' of ' . scalar(@intents) . ' acknowledged intents and '
		  . "$missing_completions of " . scalar(@done) . ' acknowledged completions; a new attempt '
		  . "is told to execute $executed_again of the lost intents again");
}

# 2a: the same workload and failover; a standby on the same machine usually
# keeps up, so few or no rows are lost here, but none is promised.
my ($async_primary, $async_standby) = ledger_pair('fo_async', 0);
my $aw = workload_until_stop($async_primary, 'async', 'mixed');
ok(defined $aw->{lost}, 'async: the worker lost its server in the middle of its loop');
ok(promote($async_standby), 'async: the standby was promoted');
report_missing($async_standby, $aw, 'standby connected');
$async_standby->stop;

# 2b: the same, but the standby loses its connection to the primary halfway
# (a network blip): an asynchronous primary goes on acknowledging, and what it
# acknowledged meanwhile is gone after the failover.
my ($blip_primary, $blip_standby) = ledger_pair('fo_blip', 0);
my $bw = workload_until_stop($blip_primary, 'blip', 'mixed', sub {
	cut_off($blip_primary, $blip_standby) or diag('the standby did not disconnect');
	return 0;
});
ok(defined $bw->{lost}, 'async blip: the worker lost its server in the middle of its loop');
ok(promote($blip_standby), 'async blip: the standby was promoted');
report_missing($blip_standby, $bw, 'standby cut off halfway');
$blip_standby->stop;

diag('this is why the README requires synchronous replication (synchronous_standby_names)');
done_testing();
