# 031_js_client: the JavaScript client's own tests (clients/js/test/, node's
# built-in test runner) against a real cluster; each node test becomes a TAP
# line of its own.  Its dependencies must already be installed in clients/js
# (`npm ci` there, from package-lock.json).  The token-lease tests, the
# TypeScript example and the session attempts a transaction pooler is caught
# under (test/pooler.test.js, in databases of their own, so that the pools they
# steer are theirs alone) also go through a PgBouncer in transaction mode that
# this script starts in front of the cluster (Debian's pgbouncer, see
# DurableLedger::PgBouncer).
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::NodeTests;
use DurableLedger::PgBouncer;
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

my $dir = "$ENV{TESTDIR}/clients/js";
my @files = sort glob("$dir/test/*.test.js");

if (!-d "$dir/node_modules/pg")
{
	fail("clients/js has its dependencies installed (run `npm ci` in clients/js)");
	done_testing();
	exit;
}
ok(scalar(@files), 'clients/js/test has test files');

my $node = ledger_node('js_client');

my $user = getpwuid($<);
my $dsn = node_pg_url($node, $user);

# PgBouncer in transaction mode in front of the node, for the token-lease
# tests; server_round_robin spreads one client's transactions over the server
# connections the pooler has; a pool of 4 (2 or more, for the pooler tests:
# another client's transaction holds one server connection while the attempt's
# statement goes to another).
my $bouncer = DurableLedger::PgBouncer->start($node,
	users => [$user], user => $user, pool_size => 4,
	settings => { server_round_robin => 1 });
my $bouncer_dsn = sprintf('postgresql://%s@%s:%d/postgres',
	$user =~ s/([^A-Za-z0-9\-._~])/sprintf('%%%02X', ord($1))/ger, $bouncer->host, $bouncer->port);

run_node_tests(
	dir => $dir,
	files => \@files,
	prefix => 'js',
	env => {
		DURABLE_LEDGER_DSN => $dsn,
		DURABLE_LEDGER_PGBOUNCER_DSN => $bouncer_dsn,
	});

$bouncer->stop;
$node->stop;
done_testing();
