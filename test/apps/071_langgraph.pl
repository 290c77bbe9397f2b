# 071_langgraph: the LangGraph.js and Deep Agents adapter (adapters/langgraph,
# durable-ledger-langgraph).
#   - its node tests (adapters/langgraph/test/, node's runner, each a TAP line)
#     against a real cluster: workers SIGKILLed in the middle of a tool and their
#     threads resumed from a PostgresSaver checkpoint (a paused effect as a
#     LangGraph interrupt, resolved by a person, replayed), the seeds' flight story
#     as a Deep Agent (and in a `task` subagent), a MemorySaver lost with its
#     process; parallel calls, reads, refused tools, abandoned runs; the README's
#     example; which call is which (each keyed by its tool call's id): a resume
#     after an unknown outcome, a later turn's calls and reads (an identical payment
#     paused once as a divergence, made on a person's 'distinct'), a thread started
#     over whose model names a paid call anew (paused, 'same' replays), a ToolNode and a
#     model node retried by their retry policies, a node's call without a tool
#     call refused; the re-review (review33c): invokeThread's durability 'sync'
#     (others refused) and a worker killed mid-payment with its checkpoint store
#     stalled and an unrecorded model, paused and paid once; a refused payment
#     retried by the model under another id paid once when the thread is started
#     over; an abandoned run's interrupt that does not advise fork_run;
#   - the package as a user installs it: `npm pack` of the client and of the
#     adapter, both tarballs installed into a scratch project with LangGraph, Deep
#     Agents and LangChain's core from the registry (at the adapter's versions), the
#     README's example compiled there as TypeScript under tsc --strict (every
#     declaration checked: no skipLibCheck), and run twice on one thread against
#     the cluster (the second process books nothing).
# Needs `npm ci` done in clients/js and adapters/langgraph (test/npm-packages.sh).
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::NodeTests;
use DurableLedger::TestNode;
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

my $client = "$ENV{TESTDIR}/clients/js";
my $dir = "$ENV{TESTDIR}/adapters/langgraph";
if (!-d "$dir/node_modules/\@langchain/langgraph" || !-x "$dir/node_modules/.bin/tsc")
{
	fail('adapters/langgraph has its dependencies installed (run `npm ci` there)');
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

my $node = ledger_node('langgraph');
my $dsn = node_pg_url($node, scalar getpwuid($<));

run_ok([ "$dir/node_modules/.bin/tsc", '-p', "$dir/tsconfig.build.json" ],
	'tsc generates the declarations from the JSDoc of src/, and the code agrees with them (checkJs)');

my @files = sort glob("$dir/test/*.test.js");
ok(scalar(@files) >= 3, 'adapters/langgraph/test has its test files');
run_node_tests(dir => $dir, files => \@files, prefix => 'langgraph',
	env => { DURABLE_LEDGER_DSN => $dsn });

# The package from its tarball, next to the client's, in a project of a user.
my $scratch = PostgreSQL::Test::Utils::tempdir();
for my $package ($client, $dir)
{
	run_ok([ 'npm', 'pack', '--silent', '--pack-destination', $scratch ], "npm pack in $package",
		init => sub { chdir $package });
}
my ($client_tgz) = glob("$scratch/durable-ledger-1*.tgz");
my ($adapter_tgz) = glob("$scratch/durable-ledger-langgraph-*.tgz");
ok(defined $client_tgz && defined $adapter_tgz, 'both tarballs');
my $listing = run_ok([ 'tar', '-tzf', $adapter_tgz ], 'the adapter\'s tarball lists');
like($listing, qr{^package/types/index\.d\.ts$}m, 'it carries its type declarations');
my @modules = map { m{/src/([^/]+)\.js$} ? $1 : () } glob("$dir/src/*.js");
is_deeply([ grep { $listing !~ m{^package/src/\Q$_\E\.js$}m || $listing !~ m{^package/types/\Q$_\E\.d\.ts$}m } @modules ],
	[], '... every module (' . scalar(@modules) . '), each with its declarations');
like($listing, qr{^package/README\.md$}m, '... its README');
unlike($listing, qr{^package/(test|node_modules|build)/}m, '... and not its tests, builds nor node_modules');

my $manifest = do { local (@ARGV, $/) = "$dir/package.json"; <> };
my @registry = map {
	my ($version) = $manifest =~ /"\Q$_\E": "([^"]+)"/;
	defined $version ? "$_\@$version" : $_
} ('@langchain/langgraph', '@langchain/core', 'deepagents', 'langchain', 'zod', 'pg', 'typescript',
	'@types/node', '@types/pg');
mkdir "$scratch/app";
open(my $fh, '>', "$scratch/app/package.json") or die $!;
print $fh qq({ "name": "a-deep-agent", "private": true, "type": "module" }\n);
close $fh;
run_ok([ 'npm', 'install', '--no-audit', '--no-fund', '--silent', $client_tgz, $adapter_tgz, @registry ],
	'npm install of both tarballs, and LangGraph and Deep Agents from the registry, into a scratch project',
	init => sub { chdir "$scratch/app" });

my $readme = do { local (@ARGV, $/) = "$dir/README.md"; <> };
my ($program) = substr($readme, index($readme, '## Example')) =~ /```ts\n(.*?)```/s;
ok(defined $program, 'the README has its example');
open($fh, '>', "$scratch/app/trip.ts") or die $!;
print $fh $program;
close $fh;
open($fh, '>', "$scratch/app/tsconfig.json") or die $!;
print $fh <<'JSON';
{ "compilerOptions": { "strict": true, "module": "nodenext", "moduleResolution": "nodenext",
    "target": "es2022", "types": ["node"], "outDir": "build" },
  "files": ["trip.ts"] }
JSON
close $fh;
run_ok([ "$scratch/app/node_modules/.bin/tsc", '-p', "$scratch/app/tsconfig.json" ],
	'the README\'s example compiles as TypeScript under --strict against the installed packages',
	init => sub { chdir "$scratch/app" });
local $ENV{DATABASE_URL} = $dsn;
my $first = run_ok([ 'node', "$scratch/app/build/trip.js", 'installed-trip-1' ], 'it runs with the installed packages',
	init => sub { chdir "$scratch/app" });
like($first, qr/\Aairline: booking TP1351 \(key call:\["installed-trip-1","book_flight","[^"]+"\]#1\)\nagent: Booked TP1351\.\n\z/,
	'the first run books, the airline given the tool call\'s key');
my $again = run_ok([ 'node', "$scratch/app/build/trip.js", 'installed-trip-1' ], 'it runs again on the same thread',
	init => sub { chdir "$scratch/app" });
is($again, "agent: Booked TP1351.\n", 'the second process replays: no booking');
is($node->safe_psql('postgres',
		q{SELECT string_agg(tool || ':' || status, ' ' ORDER BY tool) FROM durable_ledger.effects WHERE run = 'installed-trip-1'}),
	'book_flight:completed model.fake-model-builder:completed model.fake-model-builder:completed',
	'the ledger holds its two model turns and its booking');

$node->stop;
done_testing();
