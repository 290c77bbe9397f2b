# 025_model: the contract as an executable model (test/model/): generated
# histories of calls from several sessions -- begins and recorded calls under
# session and token leases, business keys, a tool with key fields, reports
# naming their attempt or not, resolutions, leases taken, renewed, released,
# expired by the server's clock, broken, ended by release_attempt, lost
# behind the ledger's back, waited for; calls at once (a business key called
# by two runs while the first call's transaction is open; a call waiting,
# judged, while its row is reported on); sessions killed, a run abandoned, runs forked (and their first attempts), runs
# purged, histories and leases read, retries
# that reword a call (divergence, its verdicts), tools registered, changed
# and retired, the policies for tools nobody registered -- each answer and,
# after every step, every effect row, every divergence, every session's
# epoch, the runs' epochs and what `unresolved` lists compared with the
# model, every derived key with keys.md's derivation, metrics_events() against
# the audit rows committed; no key and attempt
# answered `execute` twice; the audit chain verifies.  A fixed seed and
# budget (the same histories every run); MODEL_SEED / MODEL_EXAMPLES /
# MODEL_STEPS for others, `make soak` for fresh seeds.  Kept failing
# histories (test/model/regressions/) are replayed first.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

# preloaded, as in production: metrics_events() counts, and is checked
my $node = ledger_node('model', "shared_preload_libraries = 'durable_ledger'");
my $run = "$ENV{TESTDIR}/test/model/run.py";
my $dsn = $node->connstr('postgres');

sub run_model
{
	my ($what, @args) = @_;
	my ($stdout, $stderr);
	my $ok = IPC::Run::run([ '/usr/bin/python3', $run, '--dsn', $dsn, @args ],
		'>', \$stdout, '2>', \$stderr);
	diag($stdout) if !$ok;
	note($stdout) if $ok;
	diag($stderr) if $stderr ne '';
	ok($ok, $what);
	return $stdout;
}

run_model('every kept failing history agrees with the model now',
	'--regressions', "$ENV{TESTDIR}/test/model/regressions");
my $out = run_model(
	'generated histories agree with the model',
	'--seed', $ENV{MODEL_SEED} // 20261202,
	'--examples', $ENV{MODEL_EXAMPLES} // 120,
	'--steps', $ENV{MODEL_STEPS} // 40);

# the check's premise: the same draws make the same histories (names, keys,
# tokens and pids aside), or Hypothesis could neither replay nor shrink a
# failing one
run_model('the same seed makes the same histories twice',
	'--twice', '--seed', $ENV{MODEL_SEED} // 20261202, '--examples', 20, '--steps', 40);

# the histories reached what they are for (a generator that only ever hit
# errors would pass without testing anything)
for my $seen ('begin execute', 'begin replay completed', 'begin pause', 'begin in_progress business key',
	'begin execute business key', 'begin_recorded execute', 'complete_effect applied',
	'complete_effect conflict', 'fail_effect noop', 'begin pause divergence',
	'fork_run carried', 'purge_settled purged', 'metrics_events checked', 'begin replay failed',
	'begin_recorded replay completed', 'begin_recorded execute again', 'overlap waited',
	'report_meanwhile waited', 'retry_effect applied', 'resolve_effect completed',
	'reconcile_effect applied', 'reconcile_effect noop', 'reconcile_effect conflict',
	'resolve_effect failed', 'local completed', 'local failed', 'local without an outcome, refused')
{
	like($out, qr/^#\s+\d+\s+\Q$seen\E$/m, "the histories made \"$seen\" happen");
}

done_testing();
