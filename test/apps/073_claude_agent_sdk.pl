# 073_claude_agent_sdk: the Claude Agent SDK adapter (adapters/claude-agent-sdk,
# durable-ledger-claude-agent-sdk): custom tools of an in-process SDK MCP server through the
# ledger, the session id as the run.
#   - its node tests (adapters/claude-agent-sdk/test/*.test.js) against a throwaway
#     cluster, each a TAP line of its own: the tools driven through the SDK's own server
#     object (createSdkMcpServer(...).instance) by an MCP client playing the CLI's part; a
#     worker SIGKILLed mid-payment and the session resumed (the e-mail replayed, the
#     payment paused, resolved by a person, replayed), a completed session resumed,
#     reads, stops, forks, abortOnStop, the MCP gateway through gatewayServer(), the
#     README's first example;
#   - the package as a user installs it: `npm pack` in clients/js and in the adapter's
#     folder, both tarballs installed into a scratch project with the SDK (its optional
#     Claude Code CLI left out: nothing here runs it), zod, pg and the MCP SDK from the npm
#     registry; both README examples compiled as TypeScript under tsc --strict (the second
#     calls query(), which needs the CLI and a model: compiled, not run), the first run
#     twice on one session against the cluster.
# Needs clients/ and adapters/ copied into $TESTDIR, with `npm ci` done in clients/js, in
# adapters/mcp-gateway and in adapters/claude-agent-sdk (test/npm-packages.sh).
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::NodeTests;
use DurableLedger::TestNode;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

my $client_dir = "$ENV{TESTDIR}/clients/js";
my $dir = "$ENV{TESTDIR}/adapters/claude-agent-sdk";
if (!-x "$dir/node_modules/.bin/tsc" || !-d "$dir/node_modules/\@anthropic-ai/claude-agent-sdk"
	|| !-d "$ENV{TESTDIR}/adapters/mcp-gateway/node_modules/\@modelcontextprotocol/sdk")
{
	fail('adapters/claude-agent-sdk has its dependencies installed (npm ci in clients/js, adapters/mcp-gateway, then adapters/claude-agent-sdk)');
	done_testing();
	exit;
}

sub run_ok
{
	my ($cmd, $name, %opt) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run($cmd, '>', \$out, '2>', \$err, %opt);
	ok($ok, $name) or diag join(' ', @$cmd) . "\n$out$err";
	return wantarray ? ($out, $err) : $out;
}

run_ok([ "$dir/node_modules/.bin/tsc", '-p', "$dir/tsconfig.build.json" ],
	'tsc generates the declarations (types/) from the JSDoc of src/, and the code agrees with them (checkJs, strict)');

my $node = ledger_node('claude_agent_sdk');
my $user = getpwuid($<);
my $dsn = node_pg_url($node, $user);

my @files = sort glob("$dir/test/*.test.js");
ok(scalar(@files) >= 2, 'adapters/claude-agent-sdk/test has its test files');
run_node_tests(
	dir => $dir,
	files => \@files,
	prefix => 'claude-agent-sdk',
	env => { DURABLE_LEDGER_DSN => $dsn });

# The package as a user installs it.
my $scratch = PostgreSQL::Test::Utils::tempdir();
my @tarballs;
for my $package ([ $client_dir, 'durable-ledger-1' ], [ $dir, 'durable-ledger-claude-agent-sdk-1' ])
{
	my ($from, $prefix) = @$package;
	my $packed = run_ok([ 'npm', 'pack', '--silent', '--pack-destination', $scratch ], "npm pack in $from",
		init => sub { chdir $from });
	chomp $packed;
	my ($tarball) = glob("$scratch/$prefix*.tgz");
	ok(defined $tarball && -f $tarball, "the tarball ($packed)");
	push @tarballs, $tarball;
}
my $listing = run_ok([ 'tar', '-tzf', $tarballs[1] ], 'the adapter\'s tarball lists');
my @modules = map { m{/src/([^/]+)\.js$} ? $1 : () } glob("$dir/src/*.js");
is_deeply([ grep { $listing !~ m{^package/src/\Q$_\E\.js$}m || $listing !~ m{^package/types/\Q$_\E\.d\.ts$}m } @modules ],
	[], 'it carries every module (' . scalar(@modules) . '), each with its declarations');
like($listing, qr{^package/README\.md$}m, '... and its README');
unlike($listing, qr{^package/(test|node_modules|build)/}m, '... and not its tests or node_modules');

my $manifest = do { local (@ARGV, $/) = "$dir/package.json"; <> };
sub pinned
{
	my $name = shift;
	my ($version) = $manifest =~ /"\Q$name\E": "\^?([^"]+)"/;
	return defined $version ? "$name\@$version" : $name;
}

mkdir "$scratch/app";
open(my $fh, '>', "$scratch/app/package.json") or die $!;
print $fh qq({ "name": "a-claude-agent", "private": true, "type": "module" }\n);
close $fh;
# --omit=optional: the SDK's optional dependencies are the Claude Code CLI's binaries
run_ok([ 'npm', 'install', '--no-audit', '--no-fund', '--silent', '--omit=optional', @tarballs,
		pinned('@anthropic-ai/claude-agent-sdk'), pinned('@modelcontextprotocol/sdk'), pinned('zod'), pinned('pg') ],
	'npm install of both tarballs, the SDK, the MCP SDK, zod and pg (from the registry) into a scratch project',
	init => sub { chdir "$scratch/app" });
run_ok([ 'npm', 'install', '--no-audit', '--no-fund', '--silent', '--save-dev',
		pinned('typescript'), pinned('@types/node'), pinned('@types/pg') ],
	'npm install of TypeScript and the type packages', init => sub { chdir "$scratch/app" });
ok(-f "$scratch/app/node_modules/durable-ledger-claude-agent-sdk/types/index.d.ts", 'installed with its declarations');

# The README's two examples as TypeScript: the first is run, the second (query()) compiled.
my $readme = do { local (@ARGV, $/) = "$dir/README.md"; <> };
my ($example) = $readme =~ /^## Example\n(.*?)^## The run/ms;
my @blocks = $example =~ /^```js\n(.*?)^```/msg;
is(scalar(@blocks), 2, 'the README\'s examples: the tools through the server object, and with query()');
for my $i (0, 1)
{
	open($fh, '>', "$scratch/app/example$i.ts") or die $!;
	print $fh $blocks[$i];
	close $fh;
}
open($fh, '>', "$scratch/app/tsconfig.json") or die $!;
print $fh <<'JSON';
{ "compilerOptions": { "strict": true, "module": "nodenext", "moduleResolution": "nodenext",
    "target": "es2022", "types": ["node"], "outDir": "build", "skipLibCheck": false },
  "files": ["example0.ts", "example1.ts"] }
JSON
close $fh;
run_ok([ "$scratch/app/node_modules/.bin/tsc", '-p', "$scratch/app/tsconfig.json" ],
	'both examples compile as TypeScript under --strict against the installed packages',
	init => sub { chdir "$scratch/app" });

my $session = 'a3c9e0f4-6d1b-4f3e-9a57-0c2b8e1d7f42';
my $paid = 0;
for my $process (1, 2)
{
	my ($out, $err) = run_ok([ 'node', "$scratch/app/build/example0.js", $session ],
		"the compiled first example runs with the installed packages (process $process)", init => sub {
			chdir "$scratch/app";
			$ENV{DATABASE_URL} = $dsn;
		});
	$paid += () = $out =~ /^bank: paying 4200 for INV-9 /mg;
	like($out, qr/^resumed: .*"durable-ledger\/replayed":true/m, "... its resumed session replays (process $process)");
}
is($paid, 1, 'the bank is paid once over both processes');
is($node->safe_psql('postgres',
		qq{SELECT tool || ' ' || status || ' ' || count(*) OVER () FROM durable_ledger.effects WHERE run = '$session'}),
	'pay_invoice completed 1', 'the ledger has the payment, once, in the session\'s run');

$node->stop;
done_testing();
