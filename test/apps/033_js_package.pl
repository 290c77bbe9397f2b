# 033_js_package: the JavaScript client as a package a user installs.
#   - its type declarations are generated from the code (npm run build: tsc over
#     src/'s JSDoc, with checkJs, so that the code must agree with what it
#     declares) and checked: tsc --noEmit --strict over a TypeScript consumer using
#     node-postgres' own types (clients/js/test/types), and a negative type test
#     (test/types/misuse.ts: misuses marked @ts-expect-error, which tsc must find to
#     be errors; compiled unmarked against the installed package too, with an error
#     on each marked line and no other), with TypeScript from npm (clients/js's
#     devDependencies, installed by `npm ci`);
#   - `npm pack`, then the tarball installed into a scratch project (its dependency,
#     pg, from the npm registry), and the example agent loops, copied there, run
#     against a real cluster with the installed package: the JavaScript one, and
#     the TypeScript one compiled there as a TypeScript project would (TypeScript
#     and the type packages from the registry, at clients/js's versions).
# Needs clients/ copied into $TESTDIR next to test/, with `npm ci` done in clients/js.
use strict;
use warnings;
use lib "$ENV{TESTDIR}/test/perl";
use DurableLedger::TestNode;
use File::Copy ();
use IPC::Run;
use PostgreSQL::Test::Utils;
use Test::More;

my $dir = "$ENV{TESTDIR}/clients/js";
if (!-x "$dir/node_modules/.bin/tsc")
{
	fail('clients/js has its dependencies installed, TypeScript included (run `npm ci` in clients/js)');
	done_testing();
	exit;
}

sub run_ok
{
	my ($cmd, $name, %opt) = @_;
	my ($out, $err) = ('', '');
	my $ok = IPC::Run::run($cmd, '>', \$out, '2>', \$err, %opt);
	ok($ok, $name) or diag join(' ', @$cmd) . "\n$out$err";
	return $out;
}

run_ok([ "$dir/node_modules/.bin/tsc", '-p', "$dir/tsconfig.build.json" ],
	'tsc generates the declarations (types/) from the JSDoc of src/, and the code agrees with them (checkJs)');
run_ok([ "$dir/node_modules/.bin/tsc", '-p', "$dir/tsconfig.json" ],
	'tsc --noEmit --strict: the declarations type-check a TypeScript consumer, and every misuse marked '
	  . '@ts-expect-error in test/types/misuse.ts is an error');

my $scratch = PostgreSQL::Test::Utils::tempdir();
my $packed = run_ok([ 'npm', 'pack', '--silent', '--pack-destination', $scratch ], 'npm pack',
	init => sub { chdir $dir });
chomp $packed;
my ($tarball) = glob("$scratch/durable-ledger-*.tgz");
ok(defined $tarball && -f $tarball, "the package tarball ($packed)");
my $listing = run_ok([ 'tar', '-tzf', $tarball ], 'the tarball lists');
like($listing, qr{^package/types/index\.d\.ts$}m, 'it carries the type declarations');
like($listing, qr{^package/src/index\.js$}m, '... and the module');
my @modules = map { m{/src/([^/]+)\.js$} ? $1 : () } glob("$dir/src/*.js");
is_deeply([ grep { $listing !~ m{^package/src/\Q$_\E\.js$}m || $listing !~ m{^package/types/\Q$_\E\.d\.ts$}m } @modules ],
	[], '... with every module it imports (' . scalar(@modules) . '), each with its declarations');
like($listing, qr{^package/README\.md$}m, '... its README');
like($listing, qr{^package/docs/reference\.md$}m, '... and the reference the README links');
unlike($listing, qr{^package/(test|node_modules)/}m, '... and not the tests nor node_modules');

mkdir "$scratch/app";
open(my $fh, '>', "$scratch/app/package.json") or die $!;
print $fh qq({ "name": "an-agent", "private": true, "type": "module" }\n);
close $fh;
run_ok([ 'npm', 'install', '--no-audit', '--no-fund', '--silent', $tarball ],
	'npm install of the tarball into a scratch project', init => sub { chdir "$scratch/app" });
ok(-f "$scratch/app/node_modules/durable-ledger/types/index.d.ts", 'installed with its declarations');
File::Copy::copy("$dir/examples/agent-loop.js", "$scratch/app/agent-loop.js") or die "copy: $!";

my $node = ledger_node('js_package');
# node-postgres reads URLs, not libpq's keyword=value strings
sub uri_escape
{
	my $s = shift;
	$s =~ s/([^A-Za-z0-9\-._~])/sprintf('%%%02X', ord($1))/ge;
	return $s;
}
my $user = getpwuid($<);
my $dsn = sprintf('postgresql://%s@/postgres?host=%s&port=%d',
	uri_escape($user), uri_escape($node->host), $node->port);
my $out = run_ok([ 'node', "$scratch/app/agent-loop.js", 'installed-js-1' ],
	'the example agent loop runs with the installed package',
	init => sub { chdir "$scratch/app"; $ENV{DURABLE_LEDGER_DSN} = $dsn });
like($out, qr/payments\.charge \[executed\]/, 'the first worker pays');
like($out, qr/payments\.charge \[replayed\]/, 'the restarted worker replays the payment');
is($node->safe_psql('postgres', q{SELECT count(*) FROM durable_ledger.effects WHERE run = 'installed-js-1'}), '2',
	'its two effects are in the ledger');

# The TypeScript agent loop: the scratch project becomes a TypeScript one.
my $manifest = do { local (@ARGV, $/) = "$dir/package.json"; <> };
my @types = map {
	my ($version) = $manifest =~ /"\Q$_\E": "([^"]+)"/;
	defined $version ? "$_\@$version" : $_
} ('typescript', '@types/node', '@types/pg');
run_ok([ 'npm', 'install', '--no-audit', '--no-fund', '--silent', '--save-dev', @types ],
	"npm install @types", init => sub { chdir "$scratch/app" });
File::Copy::copy("$dir/examples/agent-loop.ts", "$scratch/app/agent-loop.ts") or die "copy: $!";
open($fh, '>', "$scratch/app/tsconfig.json") or die $!;
print $fh <<'JSON';
{ "compilerOptions": { "strict": true, "module": "nodenext", "moduleResolution": "nodenext",
    "target": "es2022", "types": ["node"], "outDir": "build" },
  "files": ["agent-loop.ts"] }
JSON
close $fh;
run_ok([ "$scratch/app/node_modules/.bin/tsc", '-p', "$scratch/app/tsconfig.json" ],
	'the TypeScript agent loop compiles against the installed package', init => sub { chdir "$scratch/app" });

# The negative type test against the installed package, without its marks: each
# misuse marked // @ts-expect-error is a type error on its own line, and there
# is no other (tsc alone only proves that each marked line has some error).
my $misuse = do { local (@ARGV, $/) = "$dir/test/types/misuse.ts"; <> };
my @lines = split /\n/, $misuse, -1;
my @marked = map { $_ + 2 } grep { $lines[$_] =~ m{^\s*// \@ts-expect-error\s*$} } 0 .. $#lines;
ok(@marked >= 5, scalar(@marked) . ' misuses are marked in test/types/misuse.ts');
(my $stripped = $misuse) =~ s{^(\s*)// \@ts-expect-error\s*$}{$1//}mg;    # the same line numbers
open($fh, '>', "$scratch/app/misuse.ts") or die $!;
print $fh $stripped;
close $fh;
open($fh, '>', "$scratch/app/tsconfig.misuse.json") or die $!;
print $fh <<'JSON';
{ "compilerOptions": { "strict": true, "module": "nodenext", "moduleResolution": "nodenext",
    "target": "es2022", "types": ["node"], "noEmit": true },
  "files": ["misuse.ts"] }
JSON
close $fh;
my ($tsc_out, $tsc_err) = ('', '');
my $compiled = IPC::Run::run([ "$scratch/app/node_modules/.bin/tsc", '-p', "$scratch/app/tsconfig.misuse.json" ],
	'>', \$tsc_out, '2>', \$tsc_err, init => sub { chdir "$scratch/app" });
ok(!$compiled, 'the misuses, unmarked, do not compile against the installed package');
my %errors = map { $_ => 1 } $tsc_out =~ /^misuse\.ts\((\d+),\d+\): error TS\d+/mg;
is_deeply([ sort { $a <=> $b } keys %errors ], \@marked, 'tsc reports an error on each marked line, and on no other')
  or diag($tsc_out . $tsc_err);
$out = run_ok([ 'node', "$scratch/app/build/agent-loop.js", $dsn, 'installed-ts-1' ],
	'the TypeScript agent loop runs with the installed package', init => sub { chdir "$scratch/app" });
like($out, qr/^ok - /m, 'it ends well (a worker killed mid-run, the rerun replayed)');
is($node->safe_psql('postgres', q{SELECT count(*) FROM durable_ledger.effects WHERE run = 'installed-ts-1'}), '6',
	'its six effects are in the ledger');

$node->stop;
done_testing();
