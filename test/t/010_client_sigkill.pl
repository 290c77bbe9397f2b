# 010_client_sigkill: a worker process SIGKILLed between begin_effect and
# complete_effect.  Its lease is released as soon as its connection closes (no
# timeout to wait for), the next worker gets pause, and the effect is listed
# in durable_ledger.unresolved until a person resolves it.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = ledger_node('client_sigkill');

my $worker = $node->background_psql('postgres');
my $decision = $worker->query_safe(
	"SELECT decision FROM durable_ledger.begin_effect('inv-run', 'bank.pay', '{\"invoice\": \"INV-9\", \"amount\": 4200}')");
is($decision, 'execute', 'the first worker is told to execute');
is($node->safe_psql('postgres', 'SELECT count(*) FROM durable_ledger.leases'), 1,
	'the first worker holds the run');

# the pod is evicted: the client process dies without a word
$worker->{run}->signal('KILL');
$worker->{run}->finish;

ok($node->poll_query_until('postgres', 'SELECT count(*) = 0 FROM durable_ledger.leases'),
	'the lease ends with the dead client\'s connection');

my $retry = $node->safe_psql('postgres',
	"SELECT decision || ' ' || status FROM durable_ledger.begin_effect('inv-run', 'bank.pay', '{\"amount\": 4200, \"invoice\": \"INV-9\"}')");
is($retry, 'pause unknown', 'the retry pauses: nobody knows whether the payment went out');

is($node->safe_psql('postgres',
		"SELECT tool || ' ' || status FROM durable_ledger.unresolved WHERE run = 'inv-run'"),
	'bank.pay unknown', 'the effect waits for a person in unresolved');

$node->safe_psql('postgres', q{
	SELECT durable_ledger.resolve_effect(key, 'completed', '{"payment_id": "pay_1"}', 'maria', 'seen on the bank statement')
	  FROM durable_ledger.unresolved WHERE run = 'inv-run'});
is($node->safe_psql('postgres', q{
	SELECT decision || ' ' || (result->>'payment_id')
	  FROM durable_ledger.begin_effect('inv-run', 'bank.pay', '{"invoice": "INV-9", "amount": 4200}')}),
	'replay pay_1', 'after the resolution the next attempt replays');

$node->stop;
done_testing();
