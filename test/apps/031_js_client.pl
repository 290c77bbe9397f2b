# 031_js_client: the JavaScript client's own tests (clients/js/test/, node's
# built-in test runner) against a real cluster, and then through a proxy of a
# sharded ledger (below); each node test becomes a TAP line of its own, and no
# test may be skipped.  Its dependencies must already be installed in clients/js
# (`npm ci` there, from package-lock.json).  The token-lease tests, the
# TypeScript example and the session attempts a transaction pooler is caught
# under (test/pooler.test.js, in ledgers of their own, so that the pools they
# steer are theirs alone) also go through a PgBouncer in transaction mode that
# this script starts in front of the cluster (Debian's pgbouncer, see
# DurableLedger::PgBouncer); at the end no session lease is left held, by a
# pooled server connection or anyone, and no database a test made is left.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::NodeTests;
use DurableLedger::PgBouncer;
use DurableLedger::TestNode;
use IPC::Run;
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
my $bouncer_url = sub {
	sprintf('postgresql://%s@%s:%d/%s',
		$user =~ s/([^A-Za-z0-9\-._~])/sprintf('%%%02X', ord($1))/ger, $bouncer->host, $bouncer->port, shift);
};

run_node_tests(
	dir => $dir,
	files => \@files,
	prefix => 'js',
	env => {
		DURABLE_LEDGER_DSN => $dsn,
		DURABLE_LEDGER_PGBOUNCER_DSN => $bouncer_url->('postgres'),
	});

# The same suite through a proxy of a sharded ledger (durable_ledger_proxy,
# docs/scale-out.md) with one shard, the node's own database, on the same
# cluster (roles are the cluster's): the client's calls go through the proxy,
# the tests' reads of the ledger's tables to the shard (test/target.js), and a
# PgBouncer client reaches the proxy; the tests that need a ledger of their own
# make a proxy of their own in front of it (target.withLedgerDatabase).
# local.test.js is not run there: a local effect cannot be begun through a proxy
# (its write could not commit with its intent); client.test.js tests that
# refusal through the client, test/proxy/test_proxy.py the proxy's.
$node->safe_psql('postgres', 'CREATE DATABASE proxy');
my $shard = 'host=' . $node->host . ' port=' . $node->port . ' dbname=postgres';
# public.unlock_shard_connections(), which target.dropLeases calls through a
# proxy, as test/target.js has it (the tests' own proxies are made from it too)
my ($unlock, $said) = ('', '');
{
	local $ENV{DURABLE_LEDGER_DSN} = $dsn;
	IPC::Run::run([ 'node', '--input-type=module', '-e',
			q{process.stdout.write((await import('./test/target.js')).UNLOCK_SHARDS)} ],
		'<', \undef, '>', \$unlock, '2>', \$said,
		init => sub { chdir $dir or die "chdir $dir: $!" })
	  or BAIL_OUT("test/target.js's UNLOCK_SHARDS: $said");
}
$node->safe_psql('proxy', qq{
	CREATE EXTENSION durable_ledger_proxy CASCADE;
	CREATE SERVER durable_ledger_shards FOREIGN DATA WRAPPER plproxy
	    OPTIONS (modular_mapping '1', p0 '$shard');
	CREATE USER MAPPING FOR PUBLIC SERVER durable_ledger_shards;
	GRANT USAGE ON FOREIGN SERVER durable_ledger_shards
	    TO durable_ledger_worker, durable_ledger_auditor, durable_ledger_admin, durable_ledger_approver;
	$unlock});
run_node_tests(
	dir => $dir,
	files => [ grep { !m{/local\.test\.js$} } @files ],
	prefix => 'js through the proxy',
	env => {
		DURABLE_LEDGER_DSN => node_pg_url($node, $user, 'proxy'),
		DURABLE_LEDGER_ADMIN_DSN => $dsn,
		DURABLE_LEDGER_PGBOUNCER_DSN => $bouncer_url->('proxy'),
	});

# nothing the suite did left a session lease behind: not on a server connection
# of the pooler (a session attempt through it ends its lease where it was taken),
# nor anywhere else (the tests' own connections are closed); and the ledgers
# the tests made for themselves are gone
ok($node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM durable_ledger.leases WHERE kind = 'session'}),
	'no session lease is left held after the suite');
is($node->safe_psql('postgres',
		q{SELECT string_agg(datname, ' ') FROM pg_database WHERE datname LIKE 'js\_%'}),
	'', 'no database a test made is left');

$bouncer->stop;
$node->stop;
done_testing();
