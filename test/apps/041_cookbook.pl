# 041_cookbook: every SQL block of docs/auditing.md ("The auditor's cookbook") runs, as
# a role with only durable_ledger_auditor, against a ledger that has a story
# in it, and answers what the section says it answers.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

my $page = slurp_file("$ENV{TESTDIR}/docs/auditing.md");
my ($section) = $page =~ /^## The auditor's cookbook\n(.*?)(?=^## |\z)/ms;
ok(defined $section, "docs/auditing.md has a section \"The auditor's cookbook\"");
my @queries = $section =~ /```sql\n(.*?)```/gs;
is(scalar(@queries), 6, 'the cookbook has six queries');

my $node = ledger_node('cookbook');
# a story: ap-run-42 pays INV-9 and sends a mail, dies with the mail unreported;
# the retry replays the payment and pauses; maria resolves; a hung worker's
# lease is broken; another worker holds a run.
$node->safe_psql('postgres', q{
	CREATE ROLE auditor LOGIN;
	GRANT durable_ledger_auditor TO auditor;
	CREATE ROLE maria LOGIN;
	GRANT durable_ledger_admin TO maria;
	CREATE ROLE hung_worker LOGIN;
	GRANT durable_ledger_worker TO hung_worker;});
$node->safe_psql('postgres', q{
	SELECT durable_ledger.complete_effect(key, '{"payment_id": "pay_81"}')
	  FROM durable_ledger.begin_effect('ap-run-42', 'bank.pay', '{"invoice": "INV-9", "amount": 4200}',
	                                   meta => '{"model": "agent-v3", "approved_by": "po-1177"}');
	SELECT decision FROM durable_ledger.begin_effect('ap-run-42', 'mail.send', '{"invoice": "INV-9", "to": "ap@acme.example"}');});
$node->safe_psql('postgres', q{
	SELECT decision FROM durable_ledger.begin_effect('ap-run-42', 'bank.pay', '{"invoice": "INV-9", "amount": 4200}');
	SELECT decision FROM durable_ledger.begin_effect('ap-run-42', 'mail.send', '{"invoice": "INV-9", "to": "ap@acme.example"}');
	SELECT durable_ledger.begin_effect('other-run', 'ticket.open', '{"title": "late"}');});
my $holder = $node->background_psql('postgres');
$holder->query_safe(q{SELECT durable_ledger.acquire_run('busy-run')});
# (a worker, not a superuser: an admin may not end a superuser's session)
my $hung = $node->background_psql('postgres', extra_params => [ '--username', 'hung_worker' ]);
$hung->query_safe(q{SELECT durable_ledger.acquire_run('hung-run')});
$node->safe_psql('postgres', q{
	SET ROLE maria;
	SELECT durable_ledger.resolve_effect(durable_ledger.effect_key('ap-run-42', 'mail.send',
	         '{"invoice": "INV-9", "to": "ap@acme.example"}', 1),
	       'completed', NULL, 'maria.lopez', 'the mail server log shows it was sent');
	SELECT durable_ledger.break_lease('hung-run', 'oncall.sam', 'stuck for 20 minutes');});

my @expect = (
	[ qr/intent.*\n.*completed.*\n.*replay/s, 'the history of INV-9: intent, completion, replay' ],
	[ qr/lease_acquired.*\n.*intent.*\n.*completed/s, 'the history of the run, lease events included' ],
	[ qr/other-run.*ticket\.open.*unknown/, 'the effect that waits for a person' ],
	[ qr/resolved.*maria\.lopez.*completed.*unknown.*mail server log.*\n.*lease_broken.*oncall\.sam/s,
		'the human decisions, with author and note' ],
	[ qr/busy-run/, 'the live lease of busy-run' ],
	[ qr/bank\.pay\|1\|1\|1/, 'one replay of bank.pay' ]);

for my $i (0 .. $#queries)
{
	my ($rc, $out, $err) = $node->psql('postgres', "SET ROLE auditor;\n" . $queries[$i]);
	is($rc, 0, "cookbook query " . ($i + 1) . " runs as an auditor") or diag $err;
	like($out, $expect[$i][0], "cookbook query " . ($i + 1) . ": $expect[$i][1]") or diag $out;
}

$holder->quit;
$hung->{run}->kill_kill;
$node->stop;
done_testing();
