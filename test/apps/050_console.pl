# 050_console: the operator console (console/) in Debian's headless Chromium,
# against a cluster where every role but the test's own superuser logs in with
# a SCRAM password (pg_hba.conf below): console/test/*.test.js, each node test
# a TAP line of its own.  Its dependencies must already be installed in
# console/ (`npm ci` there, from package-lock.json).  The pages' screenshots
# are kept in tmp_check/console_screenshots.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::NodeTests;
use DurableLedger::TestNode;
use PostgreSQL::Test::Utils;
use Test::More;

my $dir = "$ENV{TESTDIR}/console";
my @files = sort glob("$dir/test/*.test.js");

if (!-d "$dir/node_modules/puppeteer-core")
{
	fail("console has its dependencies installed (run `npm ci` in console)");
	done_testing();
	exit;
}
ok(-x '/usr/bin/chromium', "Debian's chromium is installed");
ok(scalar(@files), 'console/test has test files');

my $node = ledger_node('console', "password_encryption = 'scram-sha-256'");
my $user = getpwuid($<);
# the test's superuser sets up and checks by trust; everyone else, the
# console's people and the demo's workers, by password
open my $hba, '>', $node->data_dir . '/pg_hba.conf' or die "pg_hba.conf: $!";
# (trusted_one: a role pg_hba.conf trusts, which the console must refuse)
print $hba "local all $user trust\nlocal all trusted_one trust\nlocal all all scram-sha-256\n";
close $hba;
$node->reload;
is($node->safe_psql('postgres',
		"SELECT auth_method FROM pg_hba_file_rules WHERE user_name = '{all}' AND type = 'local'"),
	'scram-sha-256', 'the cluster asks for SCRAM passwords');

my $screenshots = "$PostgreSQL::Test::Utils::tmp_check/console_screenshots";
# one file after another: they share the cluster, and a page that counts
# what waits (the metrics) must not see another file's calls arrive
for my $file (@files)
{
	(my $name = $file) =~ s{.*/|\.test\.js$}{}g;
	run_node_tests(
		dir => $dir,
		files => [$file],
		prefix => "console/$name",
		timeout => $PostgreSQL::Test::Utils::timeout_default * 4,
		env => {
			DURABLE_LEDGER_DSN => node_pg_url($node, $user),
			CONSOLE_DATABASE => node_pg_url($node, undef),
			CONSOLE_WORKER_DSN => sprintf('host=%s port=%d dbname=postgres user=ap_worker password=worker-secret-1',
				$node->host, $node->port),
			CONSOLE_SCREENSHOTS => $screenshots,
		});
}
my @shots = glob("$screenshots/*.png");
ok(@shots >= 10, 'the pages were saved as screenshots (' . scalar(@shots) . ')');

$node->stop;
done_testing();
