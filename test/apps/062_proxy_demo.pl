# 062_proxy_demo: the demo's story (demo/demo.py) through durable_ledger_proxy
# in front of three shard clusters, ending as told: the same workers and
# people, every call routed to the shard of its run ('ap-1' .. 'ob-9' are
# spread over the shards), the bank in the proxy's database, the person's
# reads through the proxy's views and routed functions.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::Shards;
use PostgreSQL::Test::Utils;
use Test::More;

my $ledger = DurableLedger::Shards->start('proxy_demo', 3);
my ($stdout, $stderr);
my $ok = IPC::Run::run(
	[ '/usr/bin/python3', "$ENV{TESTDIR}/demo/demo.py", '--dsn', $ledger->proxy_dsn,
	  map { ('--shard-dsn', $ledger->shard_dsn($_)) } 0 .. 2 ],
	'>', \$stdout, '2>', \$stderr);
note($stdout);
diag($stderr) if $stderr ne '';
ok($ok, 'the demo ran to its end');
like($stdout, qr/OK the bank shows 2 payments for ap-1/, 'without the ledger, INV-9 is paid twice');
like($stdout, qr/OK the bank shows 1 payment for ap-2/, 'with the ledger, the retry replays');
like($stdout, qr/maria\.lopez/, 'the unknown outcome is resolved by a named person');
like($stdout, qr/OK the bank shows 1 payment for ap-4/, 'two workers on one run pay once');
like($stdout, qr/OK the bank shows 2 payments for ap-5/, '"again" pays twice, its replay nothing');
like($stdout, qr/begin_effect -> pause.*was not made by the run's earlier attempts/s,
	'a replay that rewords the memo is paused as a divergence');
like($stdout, qr/OK the bank shows 1 payment for ap-6/, '... resolved by a person as the same payment, it pays nothing');
like($stdout, qr/reconcile_effect\(\.\.\., happened => True\)/,
	'a worker lost mid-payment is settled from the bank\'s record');
like($stdout, qr/OK the bank shows 1 payment for ap-7/, '... paid once, nobody paged');
like($stdout, qr/begin_effect -> pause.*PAUSE: awaiting approval/s, 'a payment over the limit waits for an approver');
like($stdout, qr/OK the bank shows 0 payments for ap-8/, '... and nothing is paid before the approval');
like($stdout, qr/OK the bank shows 1 payment for ap-8/, '... approved by another role, it is paid once, and replayed');
like($stdout, qr/begin_effect -> pause: budget: tool "mail\.send" executed 3 times/,
	'a runaway loop that rewords its email is paused at its budget');
like($stdout, qr/OK the mailbox shows 3 emails for ob-9/, '... three emails sent, not fourteen');
like($stdout, qr/Every story ended as told\./, 'every story ended as told');

my @runs = grep { $_ ne '' } $ledger->on_shards('SELECT count(*) FROM durable_ledger.runs');
is(scalar(grep { $_ > 0 } @runs), 3, "the story's runs were on all three shards (@runs)");

$ledger->stop;
done_testing();
