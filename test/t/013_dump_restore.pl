# 013_dump_restore: pg_dump and restore into a new database keep the ledger's
# rows: replay protection, unresolved effects and the audit log survive, and
# the audit log is still append-only and keeps numbering after its last row.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

my $node = ledger_node('dump_restore');

$node->safe_psql('postgres', q{
	SELECT key FROM durable_ledger.begin_effect('dump-run', 'bank.pay', '{"invoice": 1}');
	SELECT status FROM durable_ledger.complete_effect(
		durable_ledger.effect_key('dump-run', 'bank.pay', '{"invoice": 1}', 1), '{"payment_id": "pay_1"}');
	SELECT key FROM durable_ledger.begin_effect('dump-run', 'mail.send', '{"to": "ap@example.com"}');
	SELECT key FROM durable_ledger.begin_effect('dump-run', 'bank.pay', '{"invoice": 2}', 'INV-2');
	SELECT durable_ledger.release_run('dump-run');});

my $audit_before = $node->safe_psql('postgres',
	'SELECT count(*) || \' \' || max(id) FROM durable_ledger.audit_log');

my $dump = $node->basedir . '/ledger.dump';
$node->command_ok([ 'pg_dump', '-Fc', '-d', $node->connstr('postgres'), '-f', $dump ],
	'pg_dump of the database');
$node->safe_psql('postgres', 'CREATE DATABASE restored');
$node->command_ok([ 'pg_restore', '-d', $node->connstr('restored'), $dump ],
	'pg_restore into a new database');

is($node->safe_psql('restored', 'SELECT count(*) || \' \' || max(id) FROM durable_ledger.audit_log'),
	$audit_before, 'the audit log came along, row for row');
is($node->safe_psql('restored', q{
		SELECT decision || ' ' || (result->>'payment_id')
		  FROM durable_ledger.begin_effect('dump-run', 'bank.pay', '{"invoice": 1}')}),
	'replay pay_1', 'a completed effect is replayed in the restored database');
is($node->safe_psql('restored', q{
		SELECT decision FROM durable_ledger.begin_effect('dump-run', 'mail.send', '{"to": "ap@example.com"}')}),
	'pause', 'an effect with an unknown outcome still pauses');
is($node->safe_psql('restored', q{
		SELECT decision FROM durable_ledger.begin_effect('other-run', 'bank.pay', '{"invoice": 2}', 'INV-2')}),
	'pause', 'a business key is still taken across runs');

my ($rc, $out, $err) = $node->psql('restored', 'DELETE FROM durable_ledger.audit_log');
like($err, qr/append-only/, 'the restored audit log is still append-only');
my $max_before = (split ' ', $audit_before)[1];
cmp_ok($node->safe_psql('restored', "SELECT count(*) FROM durable_ledger.audit_log WHERE id > $max_before"),
	'>', 0, 'new audit rows are numbered after the restored ones');

$node->stop;
done_testing();
