# DurableLedger::NodeTests: runs test files with node's built-in test runner
# and makes each of its top-level tests a TAP line of this test, so that a
# failing node test is counted and named like any other; then one check of
# node's exit status, one that every test reported a result, and one that no
# test was skipped.
package DurableLedger::NodeTests;

use strict;
use warnings;
use Exporter 'import';
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

our @EXPORT = qw(run_node_tests node_pg_url);

# node-postgres reads URLs, not libpq's keyword=value strings: the URL of a
# cluster's Unix socket, as $user (or with no user at all: undef).
sub node_pg_url
{
	my ($node, $user, $dbname) = @_;
	my $escape = sub {
		my $s = shift;
		$s =~ s/([^A-Za-z0-9\-._~])/sprintf('%%%02X', ord($1))/ge;
		return $s;
	};
	return sprintf('postgresql://%s/%s?host=%s&port=%d',
		defined $user ? $escape->($user) . '@' : '', $dbname // 'postgres',
		$escape->($node->host), $node->port);
}

# run_node_tests(dir => where node runs, files => [test files],
#                env => { NAME => value }, prefix => 'js', timeout => seconds)
sub run_node_tests
{
	my %args = @_;
	my $dir = $args{dir};
	my $prefix = $args{prefix};
	# The files are named one by one: node 21 and later no longer search a
	# directory given to --test.
	my @cmd = ('node', '--test', '--test-reporter=tap', @{ $args{files} });
	my ($stdout, $stderr) = ('', '');
	my $ran = eval {
		local @ENV{ keys %{ $args{env} } } = values %{ $args{env} };
		IPC::Run::run(\@cmd, '<', \undef, '>', \$stdout, '2>', \$stderr,
			init => sub { chdir $dir or die "chdir $dir: $!" },
			IPC::Run::timeout($args{timeout} // $PostgreSQL::Test::Utils::timeout_default * 2));
	};
	my $run_error = $@;
	my $rc = $? >> 8;

	# Only top-level results ("ok N - name" at the start of a line); what
	# follows a result, indented, is its YAML diagnostics block.
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
			Test::More->builder->skip("$prefix: $name: $why");
			next;
		}
		Test::More->builder->todo_start($why) if $directive eq 'TODO';
		ok($r->{ok}, "$prefix: $name") or diag($r->{diag});
		Test::More->builder->todo_end if $directive eq 'TODO';
	}

	# On a failure no test explains, show everything node said.
	my $explained = grep { !$_->{ok} } @results;
	ok($ran && $rc == 0, "$prefix: node --test exited with status 0")
	  or diag("exit status $rc $run_error\n"
		  . ($explained ? '' : "--- stdout\n$stdout\n")
		  . "--- stderr\n$stderr");
	ok(@results && defined $plan && @results == $plan,
		"$prefix: node reported a result for each of its tests")
	  or diag("plan " . ($plan // 'missing') . ', results ' . scalar(@results));
	# as in DurableLedger::PythonTests: a skipped test is a test that did not run
	my @skipped = grep { $_->{name} =~ /\s#\s+SKIP\b/i } @results;
	ok(!@skipped, "$prefix: no test was skipped")
	  or diag(join("\n", map { $_->{name} } @skipped));
	diag($stderr) if $stderr ne '' && $ran && $rc == 0;
	return;
}

1;
