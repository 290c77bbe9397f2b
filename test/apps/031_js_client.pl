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
use DurableLedger::PgBouncer;
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;
use IPC::Run;

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

# node-postgres reads URLs, not libpq's keyword=value strings.
sub uri_escape
{
	my $s = shift;
	$s =~ s/([^A-Za-z0-9\-._~])/sprintf('%%%02X', ord($1))/ge;
	return $s;
}
my $user = getpwuid($<);
my $dsn = sprintf('postgresql://%s@/postgres?host=%s&port=%d',
	uri_escape($user), uri_escape($node->host), $node->port);

# PgBouncer in transaction mode in front of the node, for the token-lease
# tests; server_round_robin spreads one client's transactions over the server
# connections the pooler has; a pool of 4 (2 or more, for the pooler tests:
# another client's transaction holds one server connection while the attempt's
# statement goes to another).
my $bouncer = DurableLedger::PgBouncer->start($node,
	users => [$user], user => $user, pool_size => 4,
	settings => { server_round_robin => 1 });
my $bouncer_dsn = sprintf('postgresql://%s@%s:%d/postgres',
	uri_escape($user), $bouncer->host, $bouncer->port);

# The files are named one by one: node 21 and later no longer search a
# directory given to --test.
my @cmd = ('node', '--test', '--test-reporter=tap', @files);
my ($stdout, $stderr) = ('', '');
my $ran = eval {
	local $ENV{DURABLE_LEDGER_DSN} = $dsn;
	local $ENV{DURABLE_LEDGER_PGBOUNCER_DSN} = $bouncer_dsn;
	IPC::Run::run(\@cmd, '<', \undef, '>', \$stdout, '2>', \$stderr,
		init => sub { chdir $dir or die "chdir $dir: $!" },
		IPC::Run::timeout($PostgreSQL::Test::Utils::timeout_default * 2));
};
my $run_error = $@;
my $rc = $? >> 8;

# Only top-level results ("ok N - name" at the start of a line); what follows
# a result, indented, is its YAML diagnostics block.
my (@results, $plan);
for my $line (split /\n/, $stdout)
{
	if ($line =~ /^(not )?ok (\d+)(?: - (.*))?$/)
	{
		push @results,
		  { ok => !defined $1, name => $3 // "test $2", diag => '' };
	}
	elsif ($line =~ /^1\.\.(\d+)/)
	{
		$plan = $1;
	}
	elsif (@results && $line =~ /^\s+\S/)
	{
		$results[-1]{diag} .= "$line\n";
	}
}

for my $r (@results)
{
	my $name = $r->{name};
	my ($directive, $why) = ('', '');
	($directive, $why) = (uc $1, $2)
	  if $name =~ s/\s+#\s+(SKIP|TODO)\b\s*(.*)$//i;
	$name =~ s/\\#/#/g;
	$name =~ s/\\\\/\\/g;
	if ($directive eq 'SKIP')
	{
		Test::More->builder->skip("js: $name: $why");
		next;
	}
	Test::More->builder->todo_start($why) if $directive eq 'TODO';
	ok($r->{ok}, "js: $name") or diag($r->{diag});
	Test::More->builder->todo_end if $directive eq 'TODO';
}

# On a failure no test explains, show everything node said.
my $explained = grep { !$_->{ok} } @results;
ok($ran && $rc == 0, 'node --test exited with status 0')
  or diag("exit status $rc $run_error\n"
	  . ($explained ? '' : "--- stdout\n$stdout\n")
	  . "--- stderr\n$stderr");
ok(@results && defined $plan && @results == $plan,
	'node reported a result for each of its tests')
  or diag("plan " . ($plan // 'missing') . ', results ' . scalar(@results));
diag($stderr) if $stderr ne '' && $ran && $rc == 0;

$bouncer->stop;
$node->stop;
done_testing();
