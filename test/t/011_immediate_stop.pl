# 011_immediate_stop: the server is stopped with -m immediate right after
# execute was answered to a session that set synchronous_commit = off, many
# times in a row: every intent the client saw is there after restart.  A
# control write with synchronous_commit = off, committed after the intent,
# shows that such a stop really does lose unflushed commits.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

my $rounds = 12;

# WAL is flushed only when a commit asks for it: wal_writer_delay is long
my $node = ledger_node('immediate_stop', 'fsync = on', 'wal_writer_delay = 10s',
	'wal_writer_flush_after = 0');
$node->safe_psql('postgres', 'CREATE TABLE control (round int)');

my $lost_controls = 0;
for my $round (1 .. $rounds)
{
	my $out = $node->safe_psql('postgres', qq{
		SET synchronous_commit = off;
		SELECT decision FROM durable_ledger.begin_effect('stop-run-$round', 'bank.pay', '{"round": $round}');
		INSERT INTO control VALUES ($round);});
	is($out, 'execute', "round $round: execute was answered");

	$node->stop('immediate');
	$node->start;

	is($node->safe_psql('postgres', qq{
			SELECT status FROM durable_ledger.effects
			 WHERE key = durable_ledger.effect_key('stop-run-$round', 'bank.pay', '{"round": $round}', 1)}),
		'started', "round $round: the intent survived the immediate stop");
	$lost_controls++
	  if $node->safe_psql('postgres', "SELECT count(*) FROM control WHERE round = $round") == 0;
}

cmp_ok($lost_controls, '>', 0,
	"the control: $lost_controls of $rounds asynchronous commits made after the intent were lost");
is($node->safe_psql('postgres', "SELECT count(*) FROM durable_ledger.unresolved WHERE run LIKE 'stop-run-%'"),
	$rounds, 'every interrupted intent waits for a person');

$node->stop;
done_testing();
