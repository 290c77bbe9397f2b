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
# (other-run's worker has gone: its backend ends, and its lease with it, after
# psql quits; until then its effect is in flight, not unknown)
ok($node->poll_query_until('postgres', q{SELECT count(*) = 0 FROM durable_ledger.leases WHERE run = 'other-run'}),
	'the worker of other-run has gone, and its lease with it');
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

# Verifying the audit log: its queries run as an auditor and find nothing; then
# a superuser tampers (the append-only trigger disabled) three ways, and each
# is detected.
# three more workers, each its own chain of six rows
for my $i (1 .. 3)
{
	$node->safe_psql('postgres', qq{
		SELECT durable_ledger.acquire_run('chain-run-$i');
		SELECT durable_ledger.complete_effect(key, '{"ok": true}')
		  FROM generate_series(1, 2) AS n, durable_ledger.begin_effect('chain-run-$i', 'bank.pay',
		         jsonb_build_object('invoice', n));
		SELECT durable_ledger.release_run('chain-run-$i');});
}
my ($verifying) = $page =~ /^## Verifying the audit log\n(.*?)(?=^## |\z)/ms;
ok(defined $verifying, 'docs/auditing.md has a section "Verifying the audit log"');
my @verify = $verifying =~ /```sql\n(.*?)```/gs;
is(scalar(@verify), 4, 'it has four queries: verify, export the heads, verify against them, recompute');
my $as_auditor = sub {
	my ($sql, @vars) = @_;
	my ($rc, $out, $err) = $node->psql('postgres', "SET ROLE auditor;\n" . $sql,
		extra_params => [ map { ('-v', $_) } @vars ]);
	is($rc, 0, 'runs as an auditor') or diag $err;
	return $out;
};
is($as_auditor->($verify[0]), '', 'verify_audit finds nothing in an untouched log');
my $heads = $as_auditor->($verify[1]);
like($heads, qr/^\[\{"id": \d+/, 'the heads export as a JSON array');
is($as_auditor->($verify[2], "heads=$heads"), '', 'every kept head is there');
my $recomputed = $as_auditor->($verify[3]);
unlike($recomputed, qr/\|f$/m, 'the plain-SQL recomputation finds every row intact');
like($recomputed, qr/\|t$/m, '... over rows it checked');

my $superuser = sub { $node->safe_psql('postgres', "ALTER TABLE durable_ledger.audit_log DISABLE TRIGGER audit_log_append_only;\n"
		. $_[0] . "\nALTER TABLE durable_ledger.audit_log ENABLE TRIGGER audit_log_append_only;") };
my @chains = split /\n/, $node->safe_psql('postgres',
	q{SELECT chain FROM durable_ledger.audit_log WHERE run LIKE 'chain-run-%' GROUP BY chain ORDER BY chain});
is(scalar(@chains), 3, 'three workers wrote three chains');
my ($updated, $middle, $newest) = @chains[0 .. 2];
# an UPDATE of a row
$superuser->(qq{UPDATE durable_ledger.audit_log SET detail = '{"forged": true}'
	WHERE chain = $updated AND chain_seq = 2;});
like($as_auditor->('SELECT chain, chain_seq, problem FROM durable_ledger.verify_audit()'),
	qr/^$updated\|2\|row_hash does not match/m, 'an UPDATE is detected at the changed row');
# a DELETE in the middle
$superuser->(qq{DELETE FROM durable_ledger.audit_log WHERE chain = $middle AND chain_seq = 2;});
like($as_auditor->('SELECT chain, chain_seq, problem FROM durable_ledger.verify_audit()'),
	qr/^$middle\|3\|chain_seq 3 follows 1/m, 'a DELETE in the middle is detected at the next row');
# a DELETE of the newest rows: the shortened chain looks whole; the kept head does not
$superuser->(qq{DELETE FROM durable_ledger.audit_log WHERE chain = $newest
	AND chain_seq > (SELECT max(chain_seq) - 2 FROM durable_ledger.audit_log WHERE chain = $newest);});
unlike($as_auditor->('SELECT chain FROM durable_ledger.verify_audit()'), qr/^$newest$/m,
	'the shortened chain alone looks whole');
like($as_auditor->(q{SELECT chain, problem FROM durable_ledger.verify_audit(:'heads')}, "heads=$heads"),
	qr/^$newest\|a kept head is gone or changed/m, 'against the kept heads, the deletion of the newest rows is detected');

$holder->quit;
$hung->{run}->kill_kill;
$node->stop;
done_testing();
