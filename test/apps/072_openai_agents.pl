# 072_openai_agents: the OpenAI Agents SDK adapter (adapters/openai-agents,
# durable-ledger-openai-agents).
#   - its own tests (adapters/openai-agents/test/, node's test runner) against a
#     throwaway cluster, each node test a TAP line: a worker SIGKILLed in the
#     middle of a payment and the run resumed the SDK's way (test/crash.test.js),
#     the SDK's needsApproval with a RunState saved as a string and the ledger's
#     own approval (test/approval.test.js), which call is which -- the SDK's call id
#     for a resumed state's approved call, the occurrence elsewhere (a recorded turn's
#     id only with keyBy 'recorded-call-id'): an approved second payment of one invoice
#     paused once as a divergence (a call id named anew) and made on a person's
#     'distinct', an alwaysApprove run started over after a lost answer paused and
#     replayed, a tool used before the interruption no divergence, a crash-rerun whose model
#     gives the call a new id paused and replayed, a crash then a rerun with another date
#     in the instructions paused by default, a refusal replayed (test/resume.test.js), replays,
#     parallel calls, reads, stops, streaming (test/adapter.test.js), the README's
#     program and the declarations under tsc --strict (test/examples.test.js);
#   - the package as a user installs it: `npm pack` in clients/js and in the
#     adapter's folder, both tarballs installed into a scratch project with the SDK
#     (at the version the adapter pins), zod, pg and TypeScript from the npm
#     registry; the README's program compiled there under tsc --strict, a
#     TypeScript consumer, and run twice on one run against the cluster.
# Needs clients/ and adapters/ copied into $TESTDIR next to test/, with `npm ci`
# done in clients/js and then in adapters/openai-agents (test/npm-packages.sh).
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::NodeTests;
use DurableLedger::TestNode;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

my $dir = "$ENV{TESTDIR}/adapters/openai-agents";
my $client = "$ENV{TESTDIR}/clients/js";
if (!-x "$dir/node_modules/.bin/tsc" || !-d "$dir/node_modules/\@openai/agents" || !-d "$client/node_modules/pg")
{
	fail('clients/js and adapters/openai-agents have their dependencies installed (npm ci in each, the client first)');
	done_testing();
	exit;
}

sub run_ok
{
	my ($cmd, $name, %opt) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run($cmd, '<', \undef, '>', \$out, '2>', \$err, %opt);
	ok($ok, $name) or diag join(' ', @$cmd) . "\n$out$err";
	return wantarray ? ($out, $err) : $out;
}

my $node = ledger_node('openai_agents');
my $user = getpwuid($<);
my $dsn = node_pg_url($node, $user);

my @files = sort glob("$dir/test/*.test.js");
ok(scalar(@files) >= 4, 'adapters/openai-agents/test has its test files');
run_node_tests(
	dir => $dir,
	files => \@files,
	prefix => 'openai-agents',
	env => { DURABLE_LEDGER_DSN => $dsn });

# The package as a user installs it.
my $scratch = PostgreSQL::Test::Utils::tempdir();
run_ok([ 'npm', 'pack', '--silent', '--pack-destination', $scratch ], 'npm pack of the client',
	init => sub { chdir $client });
run_ok([ 'npm', 'pack', '--silent', '--pack-destination', $scratch ], 'npm pack of the adapter',
	init => sub { chdir $dir });
my ($client_tgz) = glob("$scratch/durable-ledger-1*.tgz");
my ($adapter_tgz) = glob("$scratch/durable-ledger-openai-agents-*.tgz");
ok(defined $client_tgz && defined $adapter_tgz, 'both tarballs');
my $listing = run_ok([ 'tar', '-tzf', $adapter_tgz ], 'the adapter\'s tarball lists');
like($listing, qr{^package/types/index\.d\.ts$}m, 'it carries the type declarations');
like($listing, qr{^package/src/index\.js$}m, '... the module');
like($listing, qr{^package/README\.md$}m, '... and its README');
unlike($listing, qr{^package/(test|node_modules|build)/}m, '... and not its tests, node_modules nor build');

my $manifest = do { local (@ARGV, $/) = "$dir/package.json"; <> };
my ($sdk) = $manifest =~ /"devDependencies":.*?"\@openai\/agents": "([^"]+)"/s;
ok(defined $sdk, "the adapter pins the SDK in its devDependencies (\@openai/agents " . ($sdk // "?") . ")");
my @versioned = map {
	my ($version) = $manifest =~ /"\Q$_\E": "([^"]+)"/;
	defined $version ? "$_\@$version" : $_
} ('zod', 'pg', 'typescript', '@types/node', '@types/pg');

mkdir "$scratch/app";
open(my $fh, '>', "$scratch/app/package.json") or die $!;
print $fh qq({ "name": "an-agent", "private": true, "type": "module" }\n);
close $fh;
run_ok([ 'npm', 'install', '--no-audit', '--no-fund', '--silent', $client_tgz, $adapter_tgz,
		"\@openai/agents\@$sdk", @versioned ],
	'npm install of both tarballs with the SDK into a scratch project', init => sub { chdir "$scratch/app" });
ok(-f "$scratch/app/node_modules/durable-ledger-openai-agents/types/index.d.ts", 'installed with its declarations');

my $readme = do { local (@ARGV, $/) = "$dir/README.md"; <> };
my ($program) = $readme =~ /^## A first run\n.*?^```ts\n(.*?)^```/ms;
ok(defined $program, 'the README has its first program');
open($fh, '>', "$scratch/app/first-run.ts") or die $!;
print $fh $program;
close $fh;
open($fh, '>', "$scratch/app/tsconfig.json") or die $!;
print $fh <<'JSON';
{ "compilerOptions": { "strict": true, "module": "nodenext", "moduleResolution": "nodenext",
    "target": "es2022", "types": ["node"], "outDir": "build", "skipLibCheck": true },
  "files": ["first-run.ts"] }
JSON
close $fh;
run_ok([ "$scratch/app/node_modules/.bin/tsc", '-p', "$scratch/app/tsconfig.json" ],
	'the README\'s program compiles under tsc --strict against the installed packages',
	init => sub { chdir "$scratch/app" });

my ($out, $err) = run_ok([ 'node', "$scratch/app/build/first-run.js", 'installed-oa-1' ],
	'it runs with the installed packages', init => sub { chdir "$scratch/app"; $ENV{DATABASE_URL} = $dsn });
is(scalar(() = $out =~ /^bank: paying 4200 for INV-9 /mg), 1, 'it pays once') or diag($out . $err);
like($out, qr/^first run: Paid INV-9\.\na rerun: Paid INV-9\.$/m, 'its rerun replays the turns and the payment');
($out, $err) = run_ok([ 'node', "$scratch/app/build/first-run.js", 'installed-oa-1' ],
	'a second process on the same run', init => sub { chdir "$scratch/app"; $ENV{DATABASE_URL} = $dsn });
unlike($out, qr/bank: paying/, '... pays nothing');
like($out, qr/^first run: Paid INV-9\.$/m, '... and ends the same');
is($node->safe_psql('postgres',
		q{SELECT string_agg(tool || ':' || status, ' ' ORDER BY tool, created_at) FROM durable_ledger.effects WHERE run = 'installed-oa-1'}),
	'model.openai-agents:completed model.openai-agents:completed pay_invoice:completed',
	'the ledger has the two turns and the payment');

$node->stop;
done_testing();
