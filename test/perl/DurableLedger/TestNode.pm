# DurableLedger::TestNode: a throwaway cluster with durable_ledger installed,
# for the TAP tests in test/t/.
package DurableLedger::TestNode;

use strict;
use warnings;
use Exporter 'import';
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;

our @EXPORT = qw(ledger_node);

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

1;
