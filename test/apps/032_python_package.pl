# 032_python_package: the Python client as a package a user installs.
#   - its type hints are complete: mypy --strict finds nothing (Debian's python3-mypy);
#   - its tools, guarded and record are typed by their result: a typed use passes and
#     every misuse of tests/typecheck/misuse.py is caught (a negative type test);
#   - `pip install` of clients/python into a fresh virtual environment (with the
#     system's site packages, offline: --no-index --no-build-isolation, Debian's
#     setuptools and psycopg) installs the package with its py.typed marker;
#   - the example agent loops (sync, and asyncio with a worker killed mid-run),
#     copied away from the source tree, run against a real cluster with the
#     installed package (not the folder).
# Needs clients/ copied into $TESTDIR next to test/.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;
use File::Copy ();
use PostgreSQL::Test::RecursiveCopy;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

my $client = "$ENV{TESTDIR}/clients/python";
BAIL_OUT("$client not found: copy clients/ into TESTDIR") unless -d "$client/durable_ledger";

sub run_ok
{
	my ($cmd, $name, %opt) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run($cmd, '>', \$out, '2>', \$err, %opt);
	ok($ok, $name) or diag join(' ', @$cmd) . "\n$out$err";
	return $out;
}

# the type hints
run_ok([ '/usr/bin/python3', '-m', 'mypy', '--strict', '--cache-dir', PostgreSQL::Test::Utils::tempdir() . '/mypy',
		 "$client/durable_ledger" ], 'mypy --strict: the package is completely typed');

# ... and a user's code that imports every name the package exports type-checks too
# (mypy --strict re-exports only what __all__ lists in a form it reads)
my $user_dir = PostgreSQL::Test::Utils::tempdir();
my $names = run_ok([ '/usr/bin/python3', '-c', 'import durable_ledger; from durable_ledger import errors; '
	. 'assert set(errors.__all__) <= set(durable_ledger.__all__), "an exception not exported"; '
	. 'print(", ".join(durable_ledger.__all__))' ],
	'the package lists its names, every exception among them', init => sub { $ENV{PYTHONPATH} = $client });
chomp $names;
PostgreSQL::Test::Utils::append_to_file("$user_dir/user_app.py",
	"from durable_ledger import $names\n\nprint(Ledger, AttemptStopped, EffectPaused)\n");
run_ok([ '/usr/bin/python3', '-m', 'mypy', '--strict', '--cache-dir', "$user_dir/mypy", "$user_dir/user_app.py" ],
	'mypy --strict: a user module importing every exported name', init => sub { $ENV{MYPYPATH} = $client });

# The tools, guarded and record are generic in their result: typed use passes, and each
# misuse in tests/typecheck/misuse.py (a tool's dict taken for an int, ...) is reported
# with the code its "# type: ignore[...]" names -- an ignore mypy finds unneeded (the
# misuse went unnoticed) fails the check (--warn-unused-ignores).
for my $module ('typed_use', 'misuse')
{
	run_ok([ '/usr/bin/python3', '-m', 'mypy', '--strict', '--warn-unused-ignores', '--cache-dir', "$user_dir/mypy",
			 "$client/tests/typecheck/$module.py" ],
		"mypy --strict --warn-unused-ignores: tests/typecheck/$module.py", init => sub { $ENV{MYPYPATH} = $client });
}
my $misuses = () = PostgreSQL::Test::Utils::slurp_file("$client/tests/typecheck/misuse.py") =~ /# type: ignore\[/g;
cmp_ok($misuses, '>=', 10, "the negative type test marks its misuses ($misuses)");

# the package, installed into a fresh virtual environment from a copy of the folder
my $scratch = PostgreSQL::Test::Utils::tempdir();
PostgreSQL::Test::RecursiveCopy::copypath($client, "$scratch/source");
run_ok([ '/usr/bin/python3', '-m', 'venv', '--system-site-packages', "$scratch/venv" ],
	'a virtual environment with the system site packages');
run_ok([ "$scratch/venv/bin/pip", 'install', '--quiet', '--no-index', '--no-build-isolation', "$scratch/source" ],
	'pip install ./clients/python, offline');
my $where = run_ok([ "$scratch/venv/bin/python", '-c',
	'import durable_ledger, os; d = os.path.dirname(durable_ledger.__file__); '
	  . 'print(d); print(os.path.exists(os.path.join(d, "py.typed")))' ],
	'the installed package imports', init => sub { chdir $scratch });
like($where, qr{^\Q$scratch\E/venv/lib/python3[.0-9]*/site-packages/durable_ledger\nTrue$}m,
	'it comes from the virtual environment, with its py.typed marker');

# the example, away from the source tree, against a real cluster
my $node = ledger_node('python_package');
mkdir "$scratch/app";
File::Copy::copy("$client/examples/agent_loop.py", "$scratch/app/agent_loop.py") or die "copy: $!";
my $dsn = 'host=' . $node->host . ' port=' . $node->port . ' dbname=postgres';
my $out = run_ok([ "$scratch/venv/bin/python", "$scratch/app/agent_loop.py", '--dsn', $dsn, '--run', 'installed-1' ],
	'the example agent loop runs with the installed package', init => sub { chdir "$scratch/app" });
like($out, qr/^ok - /m, 'the example ends well');
is($node->safe_psql('postgres', q{SELECT count(*) FROM durable_ledger.effects WHERE run = 'installed-1'}), '4',
	'its effects are in the ledger');

File::Copy::copy("$client/examples/async_agent.py", "$scratch/app/async_agent.py") or die "copy: $!";
$out = run_ok([ "$scratch/venv/bin/python", "$scratch/app/async_agent.py", '--dsn', $dsn, '--run', 'installed-async' ],
	'the asyncio agent example runs with the installed package', init => sub { chdir "$scratch/app" });
like($out, qr/^ok - /m, 'the asyncio example ends well (a worker killed, the rerun replayed)');
is($node->safe_psql('postgres', q{SELECT count(*) FROM durable_ledger.effects WHERE run = 'installed-async'}), '6',
	'its effects are in the ledger');

$node->stop;
done_testing();
