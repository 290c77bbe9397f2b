# DurableLedger::PythonTests: a Python unittest suite run from a TAP test,
# with Debian's /usr/bin/python3, every unittest result turned into a TAP
# ok / not ok, plus one check that every test reported a result, one for the
# suite's exit status and one that nothing was skipped.
#
#   run_python_tests('python', "$dir/tests", { DURABLE_LEDGER_DSN => ... },
#                    pythonpath => [$dir]);
#   run_python_tests('proxy', 'test/proxy', { ... }, pattern => 'test_*.py');
package DurableLedger::PythonTests;

use strict;
use warnings;
use Exporter 'import';
use IPC::Run;
use Test::More;

our @EXPORT = qw(run_python_tests);

sub run_python_tests
{
	my ($label, $dir, $env, %opts) = @_;
	my ($stdout, $stderr);
	my $exit_ok;
	{
		local %ENV = %ENV;
		$ENV{$_} = $env->{$_} for keys %$env;
		$ENV{PYTHONPATH} = join(':', @{ $opts{pythonpath} // [] },
			grep { defined && $_ ne '' } $ENV{PYTHONPATH});
		my @cmd = ('/usr/bin/python3', '-m', 'unittest', 'discover', '-v', '-s', $dir,
			'-p', $opts{pattern} // 'test*.py');
		$exit_ok = IPC::Run::run(\@cmd, '<', \undef, '>', \$stdout, '2>', \$stderr);
	}
	# unittest -v writes its report to stderr: "test_x (module.Class.test_x) ... ok".
	# A test's own output (or a docstring line) may come between the name and the
	# verdict, so a verdict belongs to the last test name seen.
	my $report = $stdout . $stderr;
	my ($current, $results) = (undef, 0);
	for my $line (split /\n/, $report)
	{
		if ($line =~ /^(test\w*) \(([\w.]+)\)/)
		{
			$current = $1;
		}
		next unless defined $current;
		if ($line =~ /(?:^| \.\.\. )(ok|FAIL|ERROR|skipped(?: .*)?|expected failure|unexpected success)$/)
		{
			my $verdict = $1;
			$results++;
			if ($verdict eq 'ok' || $verdict eq 'expected failure')
			{
				pass("$label: $current");
			}
			elsif ($verdict =~ /^skipped ?(.*)/)
			{
			  SKIP: { skip("$label: $current: $1", 1); }
			}
			else
			{
				fail("$label: $current ($verdict)");
			}
			$current = undef;
		}
	}
	my ($ran) = $report =~ /^Ran (\d+) tests? in /m;
	ok(defined $ran && $ran > 0 && $ran == $results,
		"every $label test reported a result (" . ($ran // 'none') . " ran, $results read)");
	ok($exit_ok, "the $label test suite passed");
	unlike($report, qr/ \.\.\. skipped|^OK \(.*skipped/m, "no $label test was skipped");
	diag($report) unless $exit_ok && defined $ran && $ran == $results;
	return ($exit_ok, $report);
}

1;
