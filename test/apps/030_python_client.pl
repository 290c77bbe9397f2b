# 030_python_client: the Python client (clients/python) against a real cluster,
# and then through a proxy of a sharded ledger (below).
# Runs its unittest suite (clients/python/tests, which also runs the example
# agent loop once, with session and with token leases) with Debian's
# /usr/bin/python3, python3-psycopg and python3-psycopg-pool, and turns every
# unittest result line into a TAP ok / not ok, plus one check that every test
# reported a result and one for the suite's exit status.  The token-lease tests
# also go through a PgBouncer in transaction mode that this script starts in
# front of the cluster (Debian's pgbouncer, see DurableLedger::PgBouncer), and
# so do the tests of a session attempt made through it by mistake
# (tests/test_session_guard.py: PoolerDetected before anything is performed,
# and the run free afterwards); at the end no session lease is left held, by
# a pooled server connection or anyone.
# Needs clients/ copied into $TESTDIR next to test/.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::PgBouncer;
use DurableLedger::PythonTests;
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

my $client = "$ENV{TESTDIR}/clients/python";
BAIL_OUT("$client not found: copy clients/ into TESTDIR") unless -d "$client/tests";

my $node = ledger_node('python_client');

# PgBouncer in transaction mode in front of the node, for the token-lease
# tests and the session attempts it must catch (they need two server
# connections or more); server_round_robin spreads one client's transactions
# over the server connections the pooler has.
my $user = getpwuid($<);
my $bouncer = DurableLedger::PgBouncer->start($node,
	users => [$user], user => $user, pool_size => 4,
	settings => { server_round_robin => 1 });

run_python_tests('python', "$client/tests",
	{ DURABLE_LEDGER_DSN => $node->connstr('postgres'),
	  DURABLE_LEDGER_PGBOUNCER_DSN => $bouncer->connstr('postgres') },
	pythonpath => [$client]);

# The same suite through a proxy of a sharded ledger (durable_ledger_proxy,
# docs/scale-out.md) with one shard, the node's own database, on the same
# cluster (roles are the cluster's): the client's calls go through the proxy,
# the tests' reads of the ledger's tables to the shard (tests/target.py), and
# a PgBouncer client reaches the proxy.  test_local.py is not run there: a
# local effect cannot be begun through a proxy (test/proxy tests its refusal).
$node->safe_psql('postgres', 'CREATE DATABASE proxy');
my $shard = 'host=' . $node->host . ' port=' . $node->port . ' dbname=postgres';
my $unlock = `/usr/bin/python3 -c 'import sys; sys.path.insert(0, "$client/tests"); import target; print(target.UNLOCK_SHARDS)'`;
$node->safe_psql('proxy', qq{
	CREATE EXTENSION durable_ledger_proxy CASCADE;
	CREATE SERVER durable_ledger_shards FOREIGN DATA WRAPPER plproxy
	    OPTIONS (modular_mapping '1', p0 '$shard');
	CREATE USER MAPPING FOR PUBLIC SERVER durable_ledger_shards;
	GRANT USAGE ON FOREIGN SERVER durable_ledger_shards
	    TO durable_ledger_worker, durable_ledger_auditor, durable_ledger_admin, durable_ledger_approver;
	$unlock});
run_python_tests('python through the proxy', "$client/tests",
	{ DURABLE_LEDGER_DSN => $node->connstr('proxy'),
	  DURABLE_LEDGER_ADMIN_DSN => $node->connstr('postgres'),
	  DURABLE_LEDGER_PGBOUNCER_DSN => $bouncer->connstr('proxy') },
	pythonpath => [$client], pattern => 'test_[!l]*.py');

# nothing the suite did left a session lease behind: not on a server connection
# of the pooler (a session attempt through it ends its lease where it was taken),
# nor anywhere else (the tests' own connections are closed)
ok($node->poll_query_until('postgres',
		q{SELECT count(*) = 0 FROM durable_ledger.leases WHERE kind = 'session'}),
	'no session lease is left held after the suite');

$bouncer->stop;
$node->stop;
done_testing();
