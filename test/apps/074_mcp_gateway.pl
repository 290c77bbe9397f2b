# 074_mcp_gateway: the MCP gateway (adapters/mcp-gateway), an MCP server in front of
# other MCP servers that passes every call of a side-effecting tool through the ledger.
#   - its node tests (adapters/mcp-gateway/test/*.test.js) against a throwaway cluster,
#     each a TAP line of its own: the MCP SDK's own client through the gateway to an
#     upstream test server whose every call is counted (adapters/test-support's effects
#     server), a client SIGKILLed mid-call and a new one continuing the run (replayed, not
#     sent upstream again), the gateway and the upstream SIGKILLed mid-call (an unknown
#     outcome: a tool error saying what a person must do; resolved, replayed), a read-only
#     tool passed through untouched with nothing in the ledger, key fields against the
#     ledger's registry, the bin over stdio, the configuration's errors, the README's example;
#   - the package as a user installs it: `npm pack` in clients/js and in the adapter's
#     folder, both tarballs installed into a scratch project with the MCP SDK from the npm
#     registry, the bin run from there, and the README's example compiled as TypeScript
#     under tsc --strict (a TypeScript consumer of the declarations generated from the
#     JSDoc) and run against the cluster.
# Needs clients/ and adapters/ copied into $TESTDIR, with `npm ci` done in clients/js and
# in adapters/mcp-gateway (test/install-deps.sh).
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::NodeTests;
use DurableLedger::TestNode;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

my $client_dir = "$ENV{TESTDIR}/clients/js";
my $dir = "$ENV{TESTDIR}/adapters/mcp-gateway";
if (!-x "$dir/node_modules/.bin/tsc" || !-d "$dir/node_modules/\@modelcontextprotocol/sdk")
{
	fail('adapters/mcp-gateway has its dependencies installed (run `npm ci` in clients/js, then in adapters/mcp-gateway)');
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

my $node = ledger_node('mcp_gateway');
my $user = getpwuid($<);
my $dsn = node_pg_url($node, $user);

my @files = sort glob("$dir/test/*.test.js");
ok(scalar(@files) >= 3, 'adapters/mcp-gateway/test has its test files');
run_node_tests(
	dir => $dir,
	files => \@files,
	prefix => 'mcp-gateway',
	env => { DURABLE_LEDGER_DSN => $dsn });

# The package as a user installs it.
my $scratch = PostgreSQL::Test::Utils::tempdir();
my @tarballs;
for my $package ([ $client_dir, 'durable-ledger-1' ], [ $dir, 'durable-ledger-mcp-gateway-1' ])
{
	my ($from, $prefix) = @$package;
	my $packed = run_ok([ 'npm', 'pack', '--silent', '--pack-destination', $scratch ], "npm pack in $from",
		init => sub { chdir $from });
	chomp $packed;
	my ($tarball) = glob("$scratch/$prefix*.tgz");
	ok(defined $tarball && -f $tarball, "the tarball ($packed)");
	push @tarballs, $tarball;
}
my $listing = run_ok([ 'tar', '-tzf', $tarballs[1] ], 'the gateway\'s tarball lists');
my @modules = map { m{/src/([^/]+)\.js$} ? $1 : () } glob("$dir/src/*.js");
is_deeply([ grep { $listing !~ m{^package/src/\Q$_\E\.js$}m || $listing !~ m{^package/types/\Q$_\E\.d\.ts$}m } @modules ],
	[], 'it carries every module (' . scalar(@modules) . '), each with its declarations');
like($listing, qr{^package/bin/durable-ledger-mcp-gateway\.js$}m, '... the command');
like($listing, qr{^package/README\.md$}m, '... and its README');
unlike($listing, qr{^package/(test|node_modules|build|bench)/}m, '... and not its tests, benchmark or node_modules');

my $manifest = do { local (@ARGV, $/) = "$dir/package.json"; <> };
sub pinned
{
	my $name = shift;
	my ($version) = $manifest =~ /"\Q$name\E": "([^"]+)"/;
	return defined $version ? "$name\@$version" : $name;
}

mkdir "$scratch/app";
open(my $fh, '>', "$scratch/app/package.json") or die $!;
print $fh qq({ "name": "an-agent-host", "private": true, "type": "module" }\n);
close $fh;
run_ok([ 'npm', 'install', '--no-audit', '--no-fund', '--silent', @tarballs, pinned('@modelcontextprotocol/sdk') ],
	'npm install of both tarballs and the MCP SDK (from the registry) into a scratch project',
	init => sub { chdir "$scratch/app" });
run_ok([ 'npm', 'install', '--no-audit', '--no-fund', '--silent', '--save-dev',
		pinned('typescript'), pinned('@types/node'), pinned('@types/pg') ],
	'npm install of TypeScript and the type packages', init => sub { chdir "$scratch/app" });
ok(-f "$scratch/app/node_modules/durable-ledger-mcp-gateway/types/index.d.ts", 'installed with its declarations');

my ($sql) = run_ok([ "$scratch/app/node_modules/.bin/durable-ledger-mcp-gateway", '--config', "$scratch/app/gateway.json", '--registry-sql' ],
	'the installed command runs', init => sub {
		chdir "$scratch/app";
		open(my $c, '>', 'gateway.json') or die $!;
		print $c qq({ "servers": { "bank": { "command": "node", "args": ["bank-server.mjs"],
			"tools": { "pay_invoice": { "keyFields": ["invoice", "amount"] }, "find": { "sideEffecting": false } } } } }\n);
		close $c;
	});
like($sql, qr/^SELECT durable_ledger\.register_tool\('bank\.pay_invoice', 'mcp-gateway', side_effecting => true, key_fields => '\{"invoice","amount"\}'/m,
	'--registry-sql prints the statements an admin runs');

# The README's example: the bank server as it is, the program as TypeScript.
my $readme = do { local (@ARGV, $/) = "$dir/README.md"; <> };
my ($example) = $readme =~ /^## Example\n(.*?)^## Running it/ms;
my @blocks = $example =~ /^```js\n(.*?)^```/msg;
is(scalar(@blocks), 2, 'the README\'s example has its two blocks');
open($fh, '>', "$scratch/app/bank-server.mjs") or die $!;
print $fh $blocks[0];
close $fh;
open($fh, '>', "$scratch/app/pay.ts") or die $!;
print $fh $blocks[1];
close $fh;
open($fh, '>', "$scratch/app/tsconfig.json") or die $!;
print $fh <<'JSON';
{ "compilerOptions": { "strict": true, "module": "nodenext", "moduleResolution": "nodenext",
    "target": "es2022", "types": ["node"], "outDir": "build", "skipLibCheck": false },
  "files": ["pay.ts"] }
JSON
close $fh;
run_ok([ "$scratch/app/node_modules/.bin/tsc", '-p', "$scratch/app/tsconfig.json" ],
	'the example compiles as TypeScript under --strict against the installed packages', init => sub { chdir "$scratch/app" });
my ($out, $err) = run_ok([ 'node', "$scratch/app/build/pay.js", 'installed-mcp-1' ],
	'the compiled example runs with the installed packages', init => sub {
		chdir "$scratch/app";
		$ENV{DATABASE_URL} = $dsn;
	});
is(scalar(() = $err =~ /^bank: paying 4200 for INV-9 /mg), 1, 'the bank is paid once') or diag $err;
like($out, qr/^the agent: .*"durable-ledger\/replayed":false/m, 'the first session executes');
like($out, qr/^the agent after a crash: .*"durable-ledger\/replayed":true/m, '... the second replays');
is($node->safe_psql('postgres',
		q{SELECT tool || ' ' || status FROM durable_ledger.effects WHERE run = 'installed-mcp-1'}),
	'bank.pay_invoice completed', 'the ledger has the payment, once');

$node->stop;
done_testing();
