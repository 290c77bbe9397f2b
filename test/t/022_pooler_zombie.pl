# 022_pooler_zombie: a worker frozen past its token lease's ttl comes back as
# a zombie, through PgBouncer in transaction mode, and nothing is executed twice.
#
# Worker Z (test/chaos/fleet_chaos.py, a token lease with a 4 s ttl renewed by a
# heartbeat thread) begins paying INV-1 of a two-invoice run and stops right
# after the intent, before the bank.  While Z is alive its heartbeat keeps the
# lease past its first ttl, and nobody else can take the run.  Then Z is frozen
# whole (SIGSTOP: a suspended VM, a long GC pause) and its lease expires.
# Worker B takes the run over (take_lease succeeds): INV-1 is not executed again
# but paused, because nobody knows whether Z paid.  Z is resumed (SIGCONT): it
# pays INV-1 at the bank (its call arrived before expiry; the effect lands
# after it), and its report is recorded as late (late_completion) on the
# attempt it started; its next begin_effect (INV-2) is refused with 55L01 and
# writes nothing, and Z stops.  Worker C finishes the run: INV-1 replays Z's
# completion, INV-2 is paid once.  The bank shows one payment per invoice.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::PgBouncer;
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

# (renewed every ttl / 4: a heartbeat may be 3 s late on a loaded machine before
# the live worker's lease expires by mistake)
my $ttl = 4;
my $run = 'zombie-run';
my $chaos = "$ENV{TESTDIR}/test/chaos/fleet_chaos.py";
my $plan = '[{"invoice": "INV-1", "amount": 100}, {"invoice": "INV-2", "amount": 200}]';
my $inv1 = '{"invoice": "INV-1", "amount": 100}';

my $node = ledger_node('pooler_zombie');
my $bouncer = DurableLedger::PgBouncer->start($node,
	users => [qw(postgres chaos_worker chaos_reconciler)], pool_size => 3);
# the bank (bank_payments: every try it receives) and the chaos_worker role
IPC::Run::run([ '/usr/bin/python3', $chaos, 'setup', '--dsn', $node->connstr('postgres') ])
  or die 'fleet_chaos.py setup failed';

my $worker_dsn = $bouncer->connstr('postgres', 'chaos_worker');
my @worker = ('/usr/bin/python3', $chaos, 'worker', '--dsn', $worker_dsn, '--pooled',
	'--lease', 'token', '--ttl', $ttl, '--run', $run, '--plan', $plan);
my $timer = IPC::Run::timer($PostgreSQL::Test::Utils::timeout_default);

# through the pooler, as the fleet's role
sub pooled
{
	my ($sql) = @_;
	return $bouncer->safe_psql('postgres', $sql, user => 'chaos_worker');
}

# --- Z begins INV-1 and holds there, its heartbeat renewing its lease
my ($zin, $zout, $zerr) = ('', '', '');
my $z;
END
{
	# a test that dies half-way leaves no frozen worker behind
	if ($z)
	{
		local $?;
		eval { $z->signal('CONT'); $z->kill_kill(grace => 1); };
	}
}
$z = IPC::Run::start([ @worker, '--hold', 'intent recorded' ],
	'<', \$zin, '>', \$zout, '2>', \$zerr, $timer);
$z->pump until $zout =~ /^intent recorded$/m || $timer->is_expired;
like($zout, qr/^lease taken, epoch 1\nintent recorded$/m,
	'Z took a token lease (epoch 1) and recorded its intent for INV-1');
my $key1 = $node->safe_psql('postgres',
	"SELECT key FROM durable_ledger.effects WHERE run = '$run' AND args->>'invoice' = 'INV-1'");
is($node->safe_psql('postgres', "SELECT status || ' ' || lease_epoch FROM durable_ledger.effects WHERE key = '$key1'"),
	'started 1', 'INV-1 is started under epoch 1');

ok( $node->poll_query_until('postgres', qq{
	SELECT clock_timestamp() > taken_at + interval '$ttl seconds' + interval '500 ms'
	       AND expires_at > clock_timestamp()
	  FROM durable_ledger.token_leases WHERE run = '$run' AND epoch = 1}),
	'while Z is alive, its heartbeat keeps the lease live past its first ttl (renewed through the pooler)');
is(pooled("SELECT durable_ledger.take_lease('$run', '1 minute', 'worker-b') IS NULL"), 't',
	'so another worker cannot take the run');

# --- Z freezes; its lease expires; B takes the run over
$z->signal('STOP');
ok($node->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM durable_ledger.leases WHERE run = '$run'"),
	'frozen, Z renews no more and its lease expires (server clock)');
my ($b_token, $b_epoch) = split(/\|/, pooled(
	"SELECT token, epoch FROM durable_ledger.take_lease('$run', '1 minute', 'worker-b')"));
is($b_epoch, 2, 'B takes the run over after the expiry: a new attempt, epoch 2');
is(pooled("SELECT decision || ' ' || status || ' ' || attempt FROM durable_ledger.begin_effect("
		  . "'$run', 'bank.pay', '$inv1', lease => '$b_token')"),
	'pause unknown 1',
	'B is not told to execute INV-1 again: Z\'s intent has an unknown outcome, the run pauses');
is($node->safe_psql('postgres', "SELECT key FROM durable_ledger.unresolved WHERE run = '$run'"),
	$key1, 'INV-1 waits in unresolved');
is(pooled("SELECT durable_ledger.release_lease('$b_token')"), 't', 'B releases its lease and stops');
is($node->safe_psql('postgres', "SELECT count(*) FROM bank_payments"), 0, 'nobody has paid yet');

# --- Z resumes, pays INV-1 (its intent was accepted before the expiry), reports
# late, and is refused at its next call
$z->signal('CONT');
$zin .= "go\n";
$z->finish;
is($z->result, 5, 'Z stops with the exit status of a lost lease');
like($zout, qr/^paid at the bank\nstep done$/m, 'Z paid INV-1 at the bank and reported it');
like($zerr, qr/^lease lost, 55L01: the token lease on run "$run" was superseded/m,
	'Z\'s next begin_effect (INV-2) is refused with 55L01: its lease was superseded');
is($node->safe_psql('postgres', qq{
	SELECT string_agg(event || ' ' || lease_epoch || ' ' || attempt, ', ' ORDER BY id)
	  FROM durable_ledger.audit_log WHERE key = '$key1'}),
	'intent 1 1, pause 2 1, late_completion 1 1',
	'Z\'s report is recorded as late (late_completion), on its own epoch and attempt');
is($node->safe_psql('postgres', qq{
	SELECT status || ' ' || (result->>'payment_id') FROM durable_ledger.effects WHERE key = '$key1'}),
	'completed ' . $node->safe_psql('postgres', "SELECT id FROM bank_payments WHERE invoice = 'INV-1'"),
	'INV-1 is completed with the payment Z made');
is($node->safe_psql('postgres', qq{
	SELECT count(*) FROM durable_ledger.effects WHERE run = '$run' AND args->>'invoice' = 'INV-2'}),
	0, 'the refused call wrote nothing: no effect for INV-2');
is($node->safe_psql('postgres', qq{
	SELECT count(*) FROM durable_ledger.audit_log
	 WHERE run = '$run' AND lease_epoch = 1 AND event NOT IN ('lease_acquired', 'intent', 'late_completion')}),
	0, 'nothing else was written under Z\'s epoch');

# --- C finishes the run
my ($cout, $cerr) = ('', '');
IPC::Run::run(\@worker, '<', \undef, '>', \$cout, '2>', \$cerr, $timer);
is($?, 0, 'C finishes the run') or diag($cerr);
is($cout, "reports re-sent\nlease taken, epoch 3\nstep done\nintent recorded\npaid at the bank\nstep done\n",
	'C re-sends Z\'s report, replays INV-1 (a step done without an intent) and executes INV-2 once');

is($node->safe_psql('postgres', qq{
	SELECT string_agg(invoice || ' ' || n, ', ' ORDER BY invoice)
	  FROM (SELECT invoice, count(*) AS n FROM bank_payments WHERE status = 'paid' GROUP BY 1) p}),
	'INV-1 1, INV-2 1', 'the bank shows exactly one payment per invoice');
is($node->safe_psql('postgres', qq{
	SELECT string_agg(args->>'invoice' || ' ' || status || ' ' || attempt, ', ' ORDER BY args->>'invoice')
	  FROM durable_ledger.effects WHERE run = '$run'}),
	'INV-1 completed 1, INV-2 completed 1', 'the ledger agrees: both completed, one attempt each');
is($node->safe_psql('postgres', "SELECT count(*) FROM durable_ledger.unresolved"), 0, 'nothing unresolved');
is($node->safe_psql('postgres', "SELECT count(*) FROM durable_ledger.leases"), 0, 'no lease left held');

$bouncer->stop;
$node->stop;
done_testing();
