# 014_upgrade: every upgrade path to the default version, exercised.  For
# each older version that has a path: install it, write ledger rows, ALTER
# EXTENSION ... UPDATE, and check that the rows survived and that the schema
# is the one a fresh install of the default version creates.  With a single
# version, ALTER EXTENSION ... UPDATE must be a no-op that keeps the rows.
# Shipping a new version only adds its script: this test picks it up.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = PostgreSQL::Test::Cluster->new('upgrade');
$node->init;
$node->start;

# What a database's ledger looks like, object by object (not its data).
my $shape_sql = q{
	SELECT string_agg(d, E'\n' ORDER BY d) FROM (
	  SELECT pg_describe_object(classid, objid, objsubid) AS d
	    FROM pg_depend
	   WHERE refclassid = 'pg_extension'::regclass AND deptype = 'e'
	     AND refobjid = (SELECT oid FROM pg_extension WHERE extname = 'durable_ledger')
	  UNION ALL
	  SELECT format('%s.%s %s', c.relname, a.attname, format_type(a.atttypid, a.atttypmod))
	    FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
	   WHERE c.relnamespace = 'durable_ledger'::regnamespace AND a.attnum > 0 AND NOT a.attisdropped
	  UNION ALL
	  SELECT format('%s(%s) %s', p.proname, pg_get_function_arguments(p.oid), md5(pg_get_functiondef(p.oid)))
	    FROM pg_proc p WHERE p.pronamespace = 'durable_ledger'::regnamespace
	) s};

my $default = $node->safe_psql('postgres',
	"SELECT default_version FROM pg_available_extensions WHERE name = 'durable_ledger'");
$node->safe_psql('postgres', 'CREATE DATABASE fresh');
$node->safe_psql('fresh', 'CREATE EXTENSION durable_ledger');
my $fresh_shape = $node->safe_psql('fresh', $shape_sql);

my @sources = split /\n/, $node->safe_psql('postgres', qq{
	SELECT source FROM pg_extension_update_paths('durable_ledger')
	 WHERE target = '$default' AND path IS NOT NULL ORDER BY source});
push @sources, $default;    # the no-op update of the current version

for my $from (@sources)
{
	my $db = "from_" . ($from =~ s/\W/_/gr);
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, "CREATE EXTENSION durable_ledger VERSION '$from'");
	$node->safe_psql($db, q{
		SELECT durable_ledger.complete_effect(key, '{"payment_id": "pay_1"}')
		  FROM durable_ledger.begin_effect('upgrade-run', 'bank.pay', '{"invoice": 1}');
		SELECT durable_ledger.release_run('upgrade-run');});
	$node->safe_psql($db, 'ALTER EXTENSION durable_ledger UPDATE');

	is($node->safe_psql($db, "SELECT extversion FROM pg_extension WHERE extname = 'durable_ledger'"),
		$default, "from $from: the extension is at $default");
	is($node->safe_psql($db, $shape_sql), $fresh_shape,
		"from $from: the schema equals a fresh install of $default");
	is($node->safe_psql($db, q{
			SELECT decision || ' ' || (result->>'payment_id')
			  FROM durable_ledger.begin_effect('upgrade-run', 'bank.pay', '{"invoice": 1}')}),
		'replay pay_1', "from $from: the ledger's rows survived the update");
}

$node->stop;
done_testing();
