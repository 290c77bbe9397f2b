# DurableLedger::TestNode: a throwaway cluster with durable_ledger installed,
# for the TAP tests in test/t/.
package DurableLedger::TestNode;

use strict;
use warnings;
use Exporter 'import';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

our @EXPORT = qw(ledger_node ledger_pair cut_off);

# ledger_node(name, extra postgresql.conf lines...): init, start, CREATE EXTENSION.
# TAP's init writes fsync = off; durability tests pass "fsync = on".
sub ledger_node
{
	my ($name, @conf) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init;
	$node->append_conf('postgresql.conf', join("\n", @conf) . "\n") if @conf;
	$node->start;
	$node->safe_psql('postgres', 'CREATE EXTENSION durable_ledger');
	return $node;
}

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

# The standby stops receiving WAL (its walreceiver is not restarted).
sub cut_off
{
	my ($primary, $standby) = @_;
	$standby->append_conf('postgresql.conf', "primary_conninfo = ''\n");
	$standby->reload;
	return $primary->poll_query_until('postgres', 'SELECT count(*) = 0 FROM pg_stat_replication');
}

1;
