# 015_hot_standby: the ledger read on a streaming hot standby, and that
# standby's promotion.  A standby cannot see the primary's advisory locks, so
# it never judges a lease: an effect that is in flight under a live lease on
# the primary reads 'started' there (effect_status and unresolved, never
# 'unknown'), and the leases view lists the runs whose epoch was taken and not
# released with liveness 'not judged on a standby'.  Recorded 'unknown' and
# conflict-flagged effects are listed as usual.  Every writing function fails
# there with SQLSTATE 25006 and takes no lock: a session whose begin_effect
# failed on the standby holds no lease (pg_locks class 17484) before or after
# the standby is promoted, and the same session then writes normally on the
# new primary, where the effect whose lease died with the old primary is
# 'unknown' and pauses its run.  Token leases are rows, replicated, but the
# standby's copy may lag behind a renewal: there they are not judged either
# (a token lease whose stored expiry has passed is not called ended), and
# take_lease, renew_lease and release_lease fail with 25006; after the
# promotion the token lease's holder goes on with its token.
use strict;
use warnings;
use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;

my $standby_reason =
  "read on a hot standby, which cannot see the primary's leases: whether this effect is still in flight cannot be judged here; ask the primary";
my $ended_reason =
  'intent recorded, no completion, and the lease that started it has ended: nobody knows whether the effect happened';
my $conflict_reason =
  'a report was kept for a person: it contradicts the recorded outcome, or names no attempt where that is ambiguous; a person must decide which is true';

my $primary = PostgreSQL::Test::Cluster->new('hs_primary');
$primary->init(allows_streaming => 1);
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION durable_ledger');
$primary->backup('hs_backup');

my $standby = PostgreSQL::Test::Cluster->new('hs_standby');
$standby->init_from_backup($primary, 'hs_backup', has_streaming => 1);
$standby->start;

# The ledger's advisory locks (class 17484) held by one backend.
sub lease_locks
{
	my ($node, $pid) = @_;
	return $node->safe_psql('postgres',
		"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 17484 AND pid = $pid");
}

# --- on the primary: four runs in four states -------------------------------

# done-run: completed
my $done_key = $primary->safe_psql('postgres', q{
	SELECT key FROM durable_ledger.begin_effect('done-run', 'bank.pay', '{"invoice": "INV-1"}')});
$primary->safe_psql('postgres',
	"SELECT durable_ledger.complete_effect('$done_key', '{\"payment_id\": \"pay_1\"}')");

# dead-run: its worker began a payment and disconnected: truly unknown
my $dead = $primary->background_psql('postgres');
my $dead_key = $dead->query_safe(q{
	SELECT key FROM durable_ledger.begin_effect('dead-run', 'bank.pay', '{"invoice": "INV-2"}')
	 WHERE decision = 'execute'});
isnt($dead_key, '', 'dead-run: the worker was told to execute');
$dead->quit;
ok($primary->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM durable_ledger.leases WHERE run = 'dead-run'"),
	'dead-run: the lease ended with the worker\'s connection');

# paused-run: same, then a retry paused, so 'unknown' is recorded in the table
my $gone = $primary->background_psql('postgres');
my $paused_key = $gone->query_safe(q{
	SELECT key FROM durable_ledger.begin_effect('paused-run', 'bank.pay', '{"invoice": "INV-3"}')});
$gone->quit;
ok($primary->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM durable_ledger.leases WHERE run = 'paused-run'"),
	'paused-run: the lease ended with the worker\'s connection');
is($primary->safe_psql('postgres', q{
	SELECT decision || ' ' || status
	  FROM durable_ledger.begin_effect('paused-run', 'bank.pay', '{"invoice": "INV-3"}')}),
	'pause unknown', 'paused-run: the retry paused and recorded unknown');

# conflict-run: completed, then a contradicting completion flags it
my $conflict_key = $primary->safe_psql('postgres', q{
	SELECT key FROM durable_ledger.begin_effect('conflict-run', 'bank.pay', '{"invoice": "INV-4"}')});
$primary->safe_psql('postgres',
	"SELECT durable_ledger.complete_effect('$conflict_key', '{\"payment_id\": \"pay_4\"}')");
$primary->safe_psql('postgres',
	"SELECT durable_ledger.complete_effect('$conflict_key', '{\"payment_id\": \"pay_4b\"}')");

# live-run: a worker holds the lease and is performing the payment right now
my $worker = $primary->background_psql('postgres');
my $worker_pid = $worker->query_safe('SELECT pg_backend_pid()');
my $live_key = $worker->query_safe(q{
	SELECT key FROM durable_ledger.begin_effect('live-run', 'bank.pay', '{"invoice": "INV-5"}')
	 WHERE decision = 'execute'});
isnt($live_key, '', 'live-run: the worker was told to execute');

# the primary's own view, for contrast
is($primary->safe_psql('postgres', "SELECT status FROM durable_ledger.effect_status('$live_key')"),
	'started', 'primary: the live effect is started');
is($primary->safe_psql('postgres', "SELECT status FROM durable_ledger.effect_status('$dead_key')"),
	'unknown', 'primary: the dead worker\'s effect is unknown');
is($primary->safe_psql('postgres', 'SELECT run || \' \' || holder_pid || \' \' || liveness FROM durable_ledger.leases'),
	"live-run $worker_pid live", 'primary: only the live worker holds a lease, judged live');

# tok-run: a token-lease worker (say behind PgBouncer) performing a payment
my $token = $primary->safe_psql('postgres',
	q{SELECT (durable_ledger.take_lease('tok-run', '1 hour', 'worker-t')).token});
my $tok_key = $primary->safe_psql('postgres', qq{
	SELECT key FROM durable_ledger.begin_effect('tok-run', 'bank.pay', '{"invoice": "INV-8"}',
	                                            lease => '$token') WHERE decision = 'execute'});
isnt($tok_key, '', 'tok-run: the token-lease worker was told to execute');

# tok-short: a token lease that expires on the primary with its effect in flight
# (taken for an hour and shortened to a second once the effect is begun: a
# lease taken for a second could expire before the call on a loaded machine)
my $short = $primary->safe_psql('postgres',
	q{SELECT (durable_ledger.take_lease('tok-short', '1 hour')).token});
my $short_key = $primary->safe_psql('postgres', qq{
	SELECT key FROM durable_ledger.begin_effect('tok-short', 'bank.pay', '{"invoice": "INV-9"}',
	                                            lease => '$short')});
isnt($short_key, '', 'tok-short: the token-lease worker began its payment');
$primary->safe_psql('postgres', "SELECT durable_ledger.renew_lease('$short', '1 second')");
ok($primary->poll_query_until('postgres',
		"SELECT count(*) = 0 FROM durable_ledger.leases WHERE run = 'tok-short'"),
	'tok-short: its token lease expired');
is($primary->safe_psql('postgres',
		"SELECT status || '|' || reason FROM durable_ledger.unresolved WHERE key = '$short_key'"),
	"unknown|$ended_reason", 'primary: the expired token lease\'s effect is unknown');

$primary->wait_for_catchup($standby);

# --- on the standby: reads --------------------------------------------------

is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'the standby is in recovery');

is($standby->safe_psql('postgres', "SELECT status FROM durable_ledger.effect_status('$live_key')"),
	'started', 'standby: effect_status of the live effect is started, not unknown');
is($standby->safe_psql('postgres', "SELECT status FROM durable_ledger.effect_status('$dead_key')"),
	'started', 'standby: effect_status of the dead worker\'s effect is its stored status, started');
is($standby->safe_psql('postgres',
		"SELECT status || ' ' || (result->>'payment_id') FROM durable_ledger.effect_status('$done_key')"),
	'completed pay_1', 'standby: effect_status of the completed effect');
is($standby->safe_psql('postgres', "SELECT status FROM durable_ledger.effect_status('$paused_key')"),
	'unknown', 'standby: effect_status of a recorded unknown');

is($standby->safe_psql('postgres',
		"SELECT status || '|' || reason FROM durable_ledger.unresolved WHERE key = '$live_key'"),
	"started|$standby_reason", 'standby: unresolved lists the live effect as started, with the standby reason');
is($standby->safe_psql('postgres',
		"SELECT status || '|' || reason FROM durable_ledger.unresolved WHERE key = '$dead_key'"),
	"started|$standby_reason", 'standby: unresolved lists the dead worker\'s effect the same way');
is($standby->safe_psql('postgres',
		"SELECT count(*) FROM durable_ledger.unresolved WHERE status = 'unknown' AND key IN ('$live_key', '$dead_key')"),
	0, 'standby: unresolved never calls a started effect unknown');
is($standby->safe_psql('postgres',
		"SELECT status || '|' || conflict || '|' || reason FROM durable_ledger.unresolved WHERE key = '$paused_key'"),
	"unknown|false|$ended_reason", 'standby: a recorded unknown is listed as usual');
is($standby->safe_psql('postgres',
		"SELECT status || '|' || conflict || '|' || reason FROM durable_ledger.unresolved WHERE key = '$conflict_key'"),
	"completed|true|$conflict_reason", 'standby: a conflict-flagged effect is listed as usual');
is($standby->safe_psql('postgres',
		"SELECT count(*) FROM durable_ledger.unresolved WHERE key = '$done_key'"),
	0, 'standby: the completed effect is not unresolved');

is($standby->safe_psql('postgres',
		"SELECT holder_pid || ' ' || liveness FROM durable_ledger.leases WHERE run = 'live-run'"),
	"$worker_pid not judged on a standby", 'standby: leases lists the live run, not judged');
is($standby->safe_psql('postgres',
		"SELECT kind || ' ' || holder || ' ' || liveness FROM durable_ledger.leases WHERE run = 'tok-run'"),
	'token worker-t not judged on a standby', 'standby: leases lists the token lease, not judged');
is($standby->safe_psql('postgres',
		"SELECT count(*) FROM durable_ledger.leases WHERE liveness <> 'not judged on a standby'"),
	0, 'standby: leases judges no lease live');
for my $k ([ 'tok-run', $tok_key ], [ 'tok-short', $short_key ])
{
	is($standby->safe_psql('postgres',
			"SELECT status || '|' || reason FROM durable_ledger.unresolved WHERE key = '$k->[1]'"),
		"started|$standby_reason", "standby: $k->[0]'s effect under a token lease is started, not judged");
	is($standby->safe_psql('postgres', "SELECT status FROM durable_ledger.effect_status('$k->[1]')"),
		'started', "standby: effect_status of $k->[0]'s effect is its stored status");
}
is($standby->safe_psql('postgres',
		"SELECT count(*) FROM durable_ledger.leases WHERE run = 'dead-run'"),
	1, 'standby: leases lists the unreleased epoch of the dead worker as well, not judged');

# --- on the standby: writes fail with 25006 and take no lock -----------------

my $ro = $standby->background_psql('postgres', on_error_stop => 0);
my $ro_pid = $ro->query_safe('SELECT pg_backend_pid()');
$ro->query_safe('\set VERBOSITY verbose');

my @writes = (
	[ 'begin_effect()', q{SELECT * FROM durable_ledger.begin_effect('promo-run', 'bank.pay', '{"invoice": "INV-6"}')} ],
	[ 'begin_effect()', q{SELECT * FROM durable_ledger.begin_effect('live-run', 'bank.pay', '{"invoice": "INV-5"}')} ],
	[ 'begin_effect()', q{SELECT * FROM durable_ledger.begin_effect('bk-run', 'bank.pay', '{}', 'invoice-INV-7')} ],
	[ 'complete_effect()', "SELECT * FROM durable_ledger.complete_effect('$live_key', '{\"payment_id\": \"pay_5\"}')" ],
	[ 'fail_effect()', "SELECT * FROM durable_ledger.fail_effect('$live_key', '{\"code\": \"declined\"}')" ],
	[ 'resolve_effect()', "SELECT * FROM durable_ledger.resolve_effect('$dead_key', 'failed', NULL, 'maria', 'never sent')" ],
	[ 'acquire_run()', q{SELECT durable_ledger.acquire_run('promo-run')} ],
	[ 'acquire_run()', q{SELECT durable_ledger.acquire_run('promo-run', wait => false)} ],
	[ 'release_run()', q{SELECT durable_ledger.release_run('live-run')} ],
	[ 'break_lease()', q{SELECT durable_ledger.break_lease('live-run', 'maria', 'worker hung')} ],
	[ 'take_lease()', q{SELECT durable_ledger.take_lease('promo-run')} ],
	[ 'renew_lease()', "SELECT durable_ledger.renew_lease('$token')" ],
	[ 'release_lease()', "SELECT durable_ledger.release_lease('$token')" ],
	[ 'begin_effect()', "SELECT * FROM durable_ledger.begin_effect('tok-run', 'bank.pay', '{}', lease => '$token')" ],
	# the last call before the promotion: a begin_effect, as a worker would retry
	[ 'begin_effect()', q{SELECT * FROM durable_ledger.begin_effect('promo-run', 'bank.pay', '{"invoice": "INV-6"}')} ],
);
for my $w (@writes)
{
	my ($function, $sql) = @$w;
	$ro->{stderr} = '';
	my ($out, $failed) = $ro->query($sql);
	my $stderr = $ro->{stderr};
	ok($failed && $out eq '', "standby: $function fails and returns nothing: $sql");
	like($stderr, qr/ERROR:  25006: cannot execute \Q$function\E on a hot standby/,
		"standby: $function fails with 25006 naming itself");
	is(lease_locks($standby, $ro_pid), 0, "standby: the failed $function took no lease lock");
}
$ro->{stderr} = '';

# --- failover: the primary goes away, the standby is promoted ---------------

$primary->stop('immediate');
$worker->{run}->kill_kill;
$standby->promote;
ok($standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()'), 'the standby was promoted');

is(lease_locks($standby, $ro_pid), 0,
	'promoted: the session whose begin_effect failed on the standby holds no lease lock');
is($standby->safe_psql('postgres',
		"SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 17484"),
	0, 'promoted: no lease lock is held by anyone');
is($standby->safe_psql('postgres', 'SELECT run || \' \' || kind || \' \' || liveness FROM durable_ledger.leases'),
	'tok-run token live', 'promoted: the leases view holds only the token lease, a row that survived');

# the same session now writes
is($ro->query_safe(q{
	SELECT decision FROM durable_ledger.begin_effect('promo-run', 'bank.pay', '{"invoice": "INV-6"}')}),
	'execute', 'promoted: the same session\'s begin_effect now executes');
is(lease_locks($standby, $ro_pid), 1, 'promoted: and it holds the run\'s lease lock once');
is($standby->safe_psql('postgres', "SELECT run || ' ' || holder_pid || ' ' || liveness FROM durable_ledger.leases WHERE kind = 'session'"),
	"promo-run $ro_pid live", 'promoted: leases shows it, judged live');
is($ro->query_safe(q{
	SELECT status FROM durable_ledger.complete_effect(
	  durable_ledger.effect_key('promo-run', 'bank.pay', '{"invoice": "INV-6"}', 1), '{"payment_id": "pay_6"}')}),
	'completed', 'promoted: its completion is recorded');
is($ro->query_safe(q{SELECT durable_ledger.release_run('promo-run')}), 't', 'promoted: it releases the run');
$ro->quit;

# the live effect's lease died with the old primary
is($standby->safe_psql('postgres', "SELECT status FROM durable_ledger.effect_status('$live_key')"),
	'unknown', 'promoted: the effect in flight on the old primary is unknown');
is($standby->safe_psql('postgres',
		"SELECT status || '|' || reason FROM durable_ledger.unresolved WHERE key = '$live_key'"),
	"unknown|$ended_reason", 'promoted: it waits for a person in unresolved');
is($standby->safe_psql('postgres', q{
	SELECT decision || ' ' || status
	  FROM durable_ledger.begin_effect('live-run', 'bank.pay', '{"invoice": "INV-5"}')}),
	'pause unknown', 'promoted: a new attempt at the live run pauses');
is($standby->safe_psql('postgres', q{
	SELECT decision || ' ' || (result->>'payment_id')
	  FROM durable_ledger.begin_effect('done-run', 'bank.pay', '{"invoice": "INV-1"}')}),
	'replay pay_1', 'promoted: a new attempt at the completed run replays');
is($standby->safe_psql('postgres',
		"SELECT status FROM durable_ledger.resolve_effect('$live_key', 'completed', '{\"payment_id\": \"pay_5\"}', 'maria', 'seen at the bank')"),
	'completed', 'promoted: a person resolves it');

# the token lease's holder goes on against the new primary
is($standby->safe_psql('postgres', "SELECT status FROM durable_ledger.effect_status('$tok_key')"),
	'started', 'promoted: the token lease\'s effect in flight is still started (its lease is live)');
is($standby->safe_psql('postgres', qq{
	SELECT status FROM durable_ledger.complete_effect('$tok_key', '{"payment_id": "pay_8"}', 1)}),
	'completed', 'promoted: its holder reports it');
is($standby->safe_psql('postgres', qq{
	SELECT decision FROM durable_ledger.begin_effect('tok-run', 'bank.pay', '{"invoice": "INV-8"}',
	                                                 lease => '$token')}),
	'execute', 'promoted: its next call with the same token is counted after the first (occurrence 2)');
is($standby->safe_psql('postgres', "SELECT durable_ledger.release_lease('$token')"),
	't', 'promoted: it releases its token lease');

$standby->stop;
done_testing();
