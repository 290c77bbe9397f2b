# 070_ai_sdk: the AI SDK adapter (adapters/ai-sdk, durable-ledger-ai-sdk).
#   - its node tests (adapters/ai-sdk/test/, node's runner, each a TAP line)
#     against a real cluster: replays, two calls of one step, pauses, a worker
#     SIGKILLed in the middle of a payment and resumed, the README's program and
#     chat route; which call is which (issue 33's F7): a chat's repeated call
#     performed with the request as the run (requestRun) or the conversation as
#     the run (keyBy 'recorded-call-id'), and reruns that never pay twice;
#     tool approvals (the re-review's A1): two instalments approved in two
#     continuations each paid under its own key (the call's id), each
#     continuation its own run (requestRun), a retried continuation replayed;
#   - the package as a user installs it: `npm pack` of the client and of the
#     adapter, both tarballs installed into a scratch project with the AI SDK
#     from the registry (at the adapter's versions), the README's program
#     compiled there as TypeScript under tsc --strict, and run twice with one run
#     id against the cluster (the second run pays nothing).
# Needs `npm ci` done in clients/js and adapters/ai-sdk (test/npm-packages.sh).
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::NodeTests;
use DurableLedger::TestNode;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

my $client = "$ENV{TESTDIR}/clients/js";
my $dir = "$ENV{TESTDIR}/adapters/ai-sdk";
if (!-d "$dir/node_modules/ai" || !-x "$dir/node_modules/.bin/tsc")
{
	fail('adapters/ai-sdk has its dependencies installed (run `npm ci` there)');
	done_testing();
	exit;
}

sub run_ok
{
	my ($cmd, $name, %opt) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run($cmd, '<', \undef, '>', \$out, '2>', \$err, %opt);
	ok($ok, $name) or diag join(' ', @$cmd) . "\n$out$err";
	return $out;
}

my $node = ledger_node('ai_sdk');
my $dsn = node_pg_url($node, scalar getpwuid($<));

run_ok([ "$dir/node_modules/.bin/tsc", '-p', "$dir/tsconfig.build.json" ],
	'tsc generates the declarations from the JSDoc of src/, and the code agrees with them (checkJs)');

my @files = sort glob("$dir/test/*.test.js");
ok(scalar(@files), 'adapters/ai-sdk/test has test files');
run_node_tests(dir => $dir, files => \@files, prefix => 'ai-sdk',
	env => { DURABLE_LEDGER_DSN => $dsn });

# The package from its tarball, next to the client's, in a project of a user.
my $scratch = PostgreSQL::Test::Utils::tempdir();
for my $package ($client, $dir)
{
	run_ok([ 'npm', 'pack', '--silent', '--pack-destination', $scratch ], "npm pack in $package",
		init => sub { chdir $package });
}
my ($client_tgz) = glob("$scratch/durable-ledger-1*.tgz");
my ($adapter_tgz) = glob("$scratch/durable-ledger-ai-sdk-*.tgz");
ok(defined $client_tgz && defined $adapter_tgz, 'both tarballs');
my $listing = run_ok([ 'tar', '-tzf', $adapter_tgz ], 'the adapter\'s tarball lists');
like($listing, qr{^package/types/index\.d\.ts$}m, 'it carries its type declarations');
unlike($listing, qr{^package/(test|node_modules)/}m, '... and not its tests nor node_modules');

my $manifest = do { local (@ARGV, $/) = "$dir/package.json"; <> };
my @registry = map {
	my ($version) = $manifest =~ /"\Q$_\E": "([^"]+)"/;
	defined $version ? "$_\@$version" : $_
} ('ai', 'zod', 'pg', 'typescript', '@types/node', '@types/pg', '@types/json-schema');
mkdir "$scratch/app";
open(my $fh, '>', "$scratch/app/package.json") or die $!;
print $fh qq({ "name": "an-agent", "private": true, "type": "module" }\n);
close $fh;
run_ok([ 'npm', 'install', '--no-audit', '--no-fund', '--silent', $client_tgz, $adapter_tgz, @registry ],
	'npm install of both tarballs, and the AI SDK from the registry, into a scratch project',
	init => sub { chdir "$scratch/app" });

# (@types/json-schema: the AI SDK's own declarations import 'json-schema', whose
# types it does not depend on; with them, tsc checks every declaration, the
# adapter's and the client's included: no skipLibCheck.)
my $readme = do { local (@ARGV, $/) = "$dir/README.md"; <> };
my ($program) = substr($readme, index($readme, '## A first run')) =~ /```js\n(.*?)```/s;
ok(defined $program, 'the README has a first program');
open($fh, '>', "$scratch/app/pay.ts") or die $!;
print $fh $program;
close $fh;
open($fh, '>', "$scratch/app/tsconfig.json") or die $!;
print $fh <<'JSON';
{ "compilerOptions": { "strict": true, "module": "nodenext", "moduleResolution": "nodenext",
    "target": "es2022", "types": ["node"], "outDir": "build" },
  "files": ["pay.ts"] }
JSON
close $fh;
run_ok([ "$scratch/app/node_modules/.bin/tsc", '-p', "$scratch/app/tsconfig.json" ],
	'the README\'s program compiles as TypeScript under --strict against the installed packages',
	init => sub { chdir "$scratch/app" });
local $ENV{DATABASE_URL} = $dsn;
my $first = run_ok([ 'node', "$scratch/app/build/pay.js", 'installed-1' ], 'it runs with the installed packages',
	init => sub { chdir "$scratch/app" });
is($first, "bank: paying 4200 for INV-9\nPaid INV-9.\n", 'the first run pays');
my $again = run_ok([ 'node', "$scratch/app/build/pay.js", 'installed-1' ], 'it runs again on the same run',
	init => sub { chdir "$scratch/app" });
is($again, "Paid INV-9.\n", 'the rerun replays: no payment');
is($node->safe_psql('postgres',
		q{SELECT string_agg(tool || ':' || status, ' ' ORDER BY tool) FROM durable_ledger.effects WHERE run = 'installed-1'}),
	'model.mock-provider.mock-model-id:completed model.mock-provider.mock-model-id:completed payInvoice:completed',
	'the ledger holds its two turns and its payment');

$node->stop;
done_testing();
