# 001_memory_flat: 200,000 begin/complete pairs over 2,000 runs in one
# connection, each run released after its effects, keep the backend's memory
# flat: no per-call leak.  So do 2,000 retries of one run (a new lease epoch
# each: its recorded calls replayed, one new call executed and completed).
# Memory is read from pg_backend_memory_contexts (every palloc'd byte of the
# backend), after the first eighth of a workload and at its end.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $runs = 2000;
my $pairs_per_run = 100;
my $allowed_growth = 64 * 1024;    # bytes, for caches that settle; a leak of 1 byte a call exceeds it

my $node = PostgreSQL::Test::Cluster->new('memory');
$node->init;
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION durable_ledger');

# The workload comes from a client, statement by statement, as workers send
# it: no PL/pgSQL block whose own memory would blur the figures.
my $script = "\\set ON_ERROR_STOP on\n\\o /dev/null\n";
for my $r (1 .. $runs)
{
	for my $i (1 .. $pairs_per_run)
	{
		# ten distinct calls, each repeated: occurrences 1..10 per epoch
		my $invoice = $i % 10;
		$script .= "SELECT key FROM durable_ledger.begin_effect('mem-$r', 'pay', "
		  . "'{\"invoice\": $invoice, \"to\": \"ACME\"}') \\gset\n"
		  . "SELECT durable_ledger.complete_effect(:'key', '{\"paid\": true}');\n";
	}
	$script .= "SELECT durable_ledger.release_run('mem-$r');\n";
	if ($r % 250 == 0)
	{
		my $pairs = $r * $pairs_per_run;
		$script .= "\\o\nSELECT 'pairs $pairs backend memory ' || sum(total_bytes) || ' bytes'"
		  . " FROM pg_backend_memory_contexts;\n\\o /dev/null\n";
	}
}

my ($stdout, $stderr);
my $ok = IPC::Run::run([ 'psql', '-X', '-q', '-At', '-d', $node->connstr('postgres') ],
	'<', \$script, '>', \$stdout, '2>', \$stderr);
ok($ok, 'the workload ran') or diag $stderr;

my %memory;
while ($stdout =~ /pairs (\d+) backend memory (\d+) bytes/g)
{
	$memory{$1} = $2;
}
my $total = $runs * $pairs_per_run;
my $first = 250 * $pairs_per_run;
ok(defined $memory{$first} && defined $memory{$total}, 'memory was sampled');

my $growth = $memory{$total} - $memory{$first};
diag(sprintf("backend memory: %d bytes after %d pairs, %d bytes after %d pairs (growth %d bytes)",
		$memory{$first}, $first, $memory{$total}, $total, $growth));
cmp_ok($growth, '<', $allowed_growth,
	"backend memory stays flat from $first to $total begin/complete pairs");

is($node->safe_psql('postgres', "SELECT count(*) FROM durable_ledger.effects WHERE status = 'completed'"),
	$total, 'every effect was recorded and completed');

# Retries: later epochs, where recorded calls are looked up and replayed
# (and judged for divergence: pay is a tool nobody registered, pause since
# 1.3), and one new call is made per epoch, of a tool registered without
# divergence checks (its calls are new in every attempt by design).
my $epochs = 2000;
my $recorded_calls = 10;
$node->safe_psql('postgres', q{SELECT durable_ledger.register_tool('mail', 'tap', divergence => 'off')});
$script = "\\set ON_ERROR_STOP on\n\\o /dev/null\n";
for my $i (1 .. $recorded_calls)
{
	$script .= "SELECT durable_ledger.complete_effect(key, '{\"paid\": $i}')"
	  . " FROM durable_ledger.begin_effect('mem-retry', 'pay', '{\"invoice\": $i}');\n";
}
for my $e (1 .. $epochs)
{
	$script .= "SELECT durable_ledger.acquire_run('mem-retry');\n";
	for my $i (1 .. $recorded_calls)
	{
		$script .= "SELECT decision FROM durable_ledger.begin_effect('mem-retry', 'pay', '{\"invoice\": $i}');\n";
	}
	$script .= "SELECT durable_ledger.complete_effect(key, '{\"sent\": true}')"
	  . " FROM durable_ledger.begin_effect('mem-retry', 'mail', '{\"epoch\": $e}');\n";
	if ($e % 250 == 0)
	{
		$script .= "\\o\nSELECT 'epochs $e backend memory ' || sum(total_bytes) || ' bytes'"
		  . " FROM pg_backend_memory_contexts;\n\\o /dev/null\n";
	}
}
$ok = IPC::Run::run([ 'psql', '-X', '-q', '-At', '-d', $node->connstr('postgres') ],
	'<', \$script, '>', \$stdout, '2>', \$stderr);
ok($ok, 'the retry workload ran') or diag $stderr;

%memory = ();
while ($stdout =~ /epochs (\d+) backend memory (\d+) bytes/g)
{
	$memory{$1} = $2;
}
ok(defined $memory{250} && defined $memory{$epochs}, 'memory was sampled during the retries');
$growth = $memory{$epochs} - $memory{250};
diag(sprintf("backend memory: %d bytes after 250 epochs, %d bytes after %d epochs (growth %d bytes)",
		$memory{250}, $memory{$epochs}, $epochs, $growth));
cmp_ok($growth, '<', $allowed_growth,
	"backend memory stays flat from 250 to $epochs retries of a run");
is($node->safe_psql('postgres',
		"SELECT count(*) FILTER (WHERE event = 'replay') || ' ' || count(*) FILTER (WHERE event = 'completed')"
		  . " FROM durable_ledger.audit_log WHERE run = 'mem-retry'"),
	($epochs * $recorded_calls) . ' ' . ($epochs + $recorded_calls),
	'every retry replayed the recorded calls and completed its new one');
is($node->safe_psql('postgres', "SELECT count(*) FROM durable_ledger.leases"),
	0, 'no lease is left held');

$node->stop;
done_testing();
