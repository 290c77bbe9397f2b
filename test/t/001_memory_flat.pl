# 001_memory_flat: 200,000 begin/complete pairs over 2,000 runs in one
# connection, each run released after its effects, keep the backend's memory
# flat: no per-call leak.  Memory is read from pg_backend_memory_contexts
# (every palloc'd byte of the backend), after 25,000 pairs and at the end.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $runs = 2000;
my $pairs_per_run = 100;
my $allowed_growth = 256 * 1024;    # bytes, for caches that settle; a leak of 2 bytes a call exceeds it

my $node = PostgreSQL::Test::Cluster->new('memory');
$node->init;
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION durable_ledger');

my $sql = <<"SQL";
DO \$\$
DECLARE
    k   text;
    mem bigint;
BEGIN
    FOR r IN 1..$runs LOOP
        FOR i IN 1..$pairs_per_run LOOP
            -- ten distinct calls, each repeated: occurrences 1..10 per epoch
            SELECT key INTO k
              FROM durable_ledger.begin_effect('mem-' || r, 'pay',
                                               jsonb_build_object('invoice', i % 10, 'to', 'ACME'));
            PERFORM durable_ledger.complete_effect(k, '{"paid": true}');
        END LOOP;
        PERFORM durable_ledger.release_run('mem-' || r);
        COMMIT;
        IF r % 250 = 0 THEN
            SELECT sum(total_bytes) INTO mem FROM pg_backend_memory_contexts;
            RAISE NOTICE 'pairs % backend memory % bytes', r * $pairs_per_run, mem;
        END IF;
    END LOOP;
END
\$\$;
SQL

my ($rc, $stdout, $stderr) = $node->psql('postgres', $sql);
is($rc, 0, 'the workload ran') or diag $stderr;

my %memory;
while ($stderr =~ /pairs (\d+) backend memory (\d+) bytes/g)
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
is($node->safe_psql('postgres', "SELECT count(*) FROM durable_ledger.leases"),
	0, 'no lease is left held');

$node->stop;
done_testing();
