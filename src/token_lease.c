/*
 * token_lease.c: token leases, a lease that is a row, not a session lock, so
 * that a run's calls may come through a transaction pooler, each in its own
 * transaction on whichever backend.
 *
 * take_lease starts a new epoch (a new attempt) when no live lease of either
 * kind holds the run, and hands out an unguessable token; only its SHA-256 is
 * stored.  A call with the token belongs to that epoch while the lease is
 * live: not expired (the server's clock, never the client's), not released,
 * not superseded by a newer epoch.  Anything else is the lost-lease error
 * (ERRCODE_DL_LEASE_LOST), writing nothing.  The calls of one run are
 * serialised inside their own transactions by a transaction-level lock
 * (DL_CALL_LOCK_CLASS), and their occurrence counters are rows, which roll
 * back with the call's transaction: consecutive calls may run in different
 * backends.
 */
#include "postgres.h"

#include "common/int.h"
#include "port.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "digest.h"
#include "lease.h"

/* How many random bytes a token carries (hex-encoded: twice as many characters). */
#define TOKEN_BYTES 32

/*
 * How many times this backend has looked up a call's token lease
 * (dl_token_for_call): a call nested in another (a trigger's, on a ledger
 * table) does so when it begins, before it reads or sets a counter.
 */
static uint64 calls_begun;

/*
 * A ttl is a duration: its days count 24 hours each, and months (whose
 * length depends on the calendar) are refused; -1 for those, and for one
 * whose microseconds do not fit in 64 bits (a ttl of 584,000 years would
 * wrap around to an hour).
 */
static int64
ttl_usecs(Interval *ttl)
{
	int64		days_usecs;
	int64		usecs;

	if (ttl->month != 0 ||
		pg_mul_s64_overflow((int64) ttl->day, USECS_PER_DAY, &days_usecs) ||
		pg_add_s64_overflow(days_usecs, ttl->time, &usecs))
		return -1;
	return usecs;
}

/* When a lease given ttl from now expires. */
static TimestampTz
expiry(TimestampTz now, Interval *ttl)
{
	return now + ttl_usecs(ttl);
}

/* A token lease lasts from one second to one day between renewals. */
void
dl_check_ttl(Interval *ttl)
{
	int64		usecs = ttl_usecs(ttl);

	if (ttl->month != 0 || usecs < USECS_PER_SEC || usecs > USECS_PER_DAY)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("ttl must be between 1 second and 1 day"),
				 errdetail("The ttl given was %s.",
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(ttl))))));
}

/*
 * SHA-256 of bytes followed by more bytes (more_len may be 0), as a bytea:
 * through the backend's one digest context (digest.c), not a cryptohash
 * context made and registered per hash.
 */
static bytea *
token_sha256(const char *bytes, size_t len, const char *more, size_t more_len)
{
	bytea	   *digest = palloc(VARHDRSZ + PG_SHA256_DIGEST_LENGTH);

	SET_VARSIZE(digest, VARHDRSZ + PG_SHA256_DIGEST_LENGTH);
	dl_sha256_begin();
	dl_sha256_add(bytes, len);
	if (more_len > 0)
		dl_sha256_add(more, more_len);
	dl_sha256_end((uint8 *) VARDATA(digest));
	return digest;
}

/* Refuses a token lease that is not live: expired, released or superseded. */
static void
check_live(const char *run, bool released, bool expired, TimestampTz expires_at,
		   int64 epoch, int64 current_epoch)
{
	if (current_epoch != epoch)
		ereport(ERROR,
				(errcode(ERRCODE_DL_LEASE_LOST),
				 errmsg("the token lease on run \"%s\" was superseded", run),
				 errdetail("Epoch %lld of the run has started since this lease's epoch %lld.",
						   (long long) current_epoch, (long long) epoch),
				 errhint("Stop this attempt; start a new one with durable_ledger.take_lease().")));
	if (released)
		ereport(ERROR,
				(errcode(ERRCODE_DL_LEASE_LOST),
				 errmsg("the token lease on run \"%s\" was released", run),
				 errhint("Stop this attempt; start a new one with durable_ledger.take_lease().")));
	if (expired)
		ereport(ERROR,
				(errcode(ERRCODE_DL_LEASE_LOST),
				 errmsg("the token lease on run \"%s\" has expired", run),
				 errdetail("It expired at %s (the server's clock).",
						   timestamptz_to_str(expires_at)),
				 errhint("Stop this attempt; start a new one with durable_ledger.take_lease().")));
}

/* The token lease with this token, found whatever its state; errors if none. */
static void
find_token(const char *token, TokenLease *lease)
{
	if (!dl_read_token_lease(token_sha256(token, strlen(token), NULL, 0), lease))
		ereport(ERROR,
				(errcode(ERRCODE_DL_LEASE_LOST),
				 errmsg("no token lease has this token"),
				 errhint("Pass a token that durable_ledger.take_lease() returned.")));
}

/*
 * Takes a token lease on run when no live lease of either kind holds it,
 * starting a new epoch; false at once (no waiting: a pooled transaction must
 * not sit on its connection) when one does, or another take or call of the
 * run is under way.
 */
bool
dl_token_take(const char *run, Interval *ttl, const char *holder, TokenGrant *grant)
{
	uint64		lock_key = dl_run_lock_key(run);
	RunState	state;
	char		random[TOKEN_BYTES];
	TimestampTz now;
	DetailBuilder detail;

	/*
	 * a session lease (this session's too: its own lock would not keep it
	 * out), another take_lease, or a call or renewal in progress: not now
	 */
	dl_refuse_if_abandoned(run);
	if (dl_run_lock_held(lock_key) ||
		!dl_run_exclude_sessions(lock_key) ||
		!dl_run_lock_xact(lock_key, DL_CALL_LOCK_CLASS, false))
		return false;
	if (dl_read_run_row(run, &state) && dl_lease_is_live(run, state.epoch))
		return false;
	/* abandon_run cannot be under way from here on (one under way: not now) */
	if (!dl_run_lock_open_nowait(lock_key))
		return false;
	dl_refuse_if_abandoned(run);

	if (!pg_strong_random(random, sizeof(random)))
		ereport(ERROR,
				(errcode(ERRCODE_INTERNAL_ERROR),
				 errmsg("could not generate a random token")));
	grant->token = palloc(2 * TOKEN_BYTES + 1);
	hex_encode(random, TOKEN_BYTES, grant->token);
	grant->token[2 * TOKEN_BYTES] = '\0';

	grant->epoch = dl_write_next_epoch(run, lock_key, true);
	now = GetCurrentTimestamp();
	grant->expires_at = expiry(now, ttl);
	dl_write_token_lease(run, grant->epoch, token_sha256(grant->token, 2 * TOKEN_BYTES, NULL, 0),
						 holder, ttl, now, grant->expires_at);
	dl_detail_init(&detail);
	dl_detail_text(&detail, "kind", "token");
	dl_detail_text(&detail, "holder", holder);
	dl_detail_text(&detail, "ttl", DatumGetCString(DirectFunctionCall1(interval_out,
																	   IntervalPGetDatum(ttl))));
	dl_detail_text(&detail, "expires_at", timestamptz_to_str(grant->expires_at));
	dl_write_audit(run, NULL, AUDIT_LEASE_ACQUIRED, dl_detail_finish(&detail), grant->epoch, 0);
	/* its holder goes on after a failover: the lease must be there */
	dl_note_durable_write();
	return true;
}

/*
 * The token lease with this token, which must be run's: a token of another
 * run is a caller's mistake (22023), not a lost lease.
 */
static void
find_token_of_run(const char *run, const char *token, TokenLease *lease)
{
	find_token(token, lease);
	if (strcmp(lease->run, run) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the token lease is for run \"%s\", not \"%s\"", lease->run, run)));
}

/*
 * The epoch a call of run with this token belongs to.  Waits for the run's
 * other calls in progress (serialised inside their transactions), then
 * checks the lease with a fresh look: it must be this run's, and live.
 *
 * Uncontended, the token is looked up once, with the run's call lock held.
 * When another call holds that lock, a token of another run or one never
 * issued is refused before waiting (a wait could deadlock with the holder,
 * or sit on a pooled connection), and the lease is looked at again after
 * the wait.  A refusal gives back the call lock this call took: the error
 * reaches the client before the abort lets go of the transaction's locks,
 * and a take_lease sent at once would be told that the run is busy.
 */
int64
dl_token_for_call(const char *run, const char *token)
{
	uint64		lock_key = dl_run_lock_key(run);
	bool		locked_before = dl_run_lock_xact_held(lock_key, DL_CALL_LOCK_CLASS);
	TokenLease	lease;

	calls_begun++;
	if (!dl_run_lock_xact(lock_key, DL_CALL_LOCK_CLASS, false))
	{
		find_token_of_run(run, token, &lease);
		(void) dl_run_lock_xact(lock_key, DL_CALL_LOCK_CLASS, true);
	}
	PG_TRY();
	{
		find_token_of_run(run, token, &lease);
		check_live(run, lease.released, lease.expired, lease.expires_at, lease.epoch,
				   lease.current_epoch);
	}
	PG_CATCH();
	{
		if (!locked_before)
			dl_run_unlock_xact(lock_key, DL_CALL_LOCK_CLASS);
		PG_RE_THROW();
	}
	PG_END_TRY();
	return lease.epoch;
}

/*
 * A counter of a token lease's epoch, as committed now (the caller holds the
 * run's call lock): of identical calls (tool, canonical args), or of what else
 * the epoch counts about a tool (lease.c).  call: its name in the counters,
 * and whether it has a row there yet.
 */
int32
dl_token_counter(const char *run, int64 epoch, const char *tool, const char *what,
				 int what_len, TokenCall *call)
{
	int32		count;

	/* the tool, its terminating zero byte, what is counted */
	call->call = token_sha256(tool, strlen(tool) + 1, what, what_len);
	call->has_row = dl_read_token_calls(run, epoch, call->call, &count);
	call->read_after = calls_begun;
	return count;
}

/*
 * Sets a counter of a token lease's epoch (rolled back with the transaction).
 * Durable like an intent: the holder goes on after a failover, and a lost
 * count would give its next identical call an occurrence again.
 *
 * A counter read without a row is added without looking for it again when
 * no token call has begun in this backend since the read: the caller
 * holds the run's call lock, so no other backend's call adds it meanwhile,
 * but a call nested in this one (a trigger's, on a ledger table) holds that
 * lock too, and may have.
 */
void
dl_token_set_count(const char *run, int64 epoch, TokenCall *call, int32 count)
{
	bool		look = call->has_row || call->read_after != calls_begun;

	dl_write_token_calls(run, epoch, call->call, count, look);
	call->has_row = true;
	dl_note_durable_write();
}

/* Extends a live token lease to now + ttl (or its own ttl); returns when. */
TimestampTz
dl_token_renew(const char *token, Interval *ttl)
{
	TokenLease	lease;
	LockedToken locked;
	RunState	state;
	TimestampTz expires_at;

	find_token(token, &lease);
	/*
	 * Like a call: a renewal that is under way when the lease's expiry
	 * passes may still commit, so nothing may judge the lease ended (or take
	 * the run) meanwhile; they wait for this lock, or say the run is busy.
	 */
	(void) dl_run_lock_xact(dl_run_lock_key(lease.run), DL_CALL_LOCK_CLASS, true);
	if (!dl_lock_token_lease(lease.run, lease.epoch, &locked))
		elog(ERROR, "token lease of run \"%s\" disappeared", lease.run);
	if (!dl_read_run_row(lease.run, &state))
		elog(ERROR, "run \"%s\" of a token lease has no row", lease.run);
	check_live(lease.run, locked.released, locked.expired, locked.expires_at, lease.epoch,
			   state.epoch);
	expires_at = expiry(GetCurrentTimestamp(), ttl ? ttl : locked.ttl);
	dl_write_token_expiry(&locked, expires_at);
	dl_note_durable_write();
	return expires_at;
}

/* Ends a live token lease; false when it was not live (or no such token). */
bool
dl_token_release(const char *token)
{
	TokenLease	lease;
	LockedToken locked;
	RunState	state;
	DetailBuilder detail;

	if (!dl_read_token_lease(token_sha256(token, strlen(token), NULL, 0), &lease) ||
		!dl_lock_token_lease(lease.run, lease.epoch, &locked) ||
		!dl_read_run_row(lease.run, &state) ||
		locked.released || locked.expired || state.epoch != lease.epoch)
		return false;
	dl_write_token_release(&locked);
	dl_write_epoch_end(lease.run, lease.epoch, true);
	dl_detail_init(&detail);
	dl_detail_text(&detail, "kind", "token");
	dl_write_audit(lease.run, NULL, AUDIT_LEASE_RELEASED, dl_detail_finish(&detail), lease.epoch, 0);
	dl_note_durable_write();
	return true;
}

/*
 * break_lease of a token lease: when a live one holds run, it expires now
 * (nothing is terminated), audited with the name; false when none does.
 */
bool
dl_token_break(const char *run, const char *broken_by, const char *note)
{
	RunState	state;
	LockedToken locked;
	DetailBuilder detail;

	if (!dl_read_run_state(run, &state) || !state.token ||
		!dl_lock_token_lease(run, state.epoch, &locked) ||
		locked.released || locked.expired)
		return false;
	dl_write_token_expiry(&locked, GetCurrentTimestamp());
	dl_detail_init(&detail);
	dl_detail_text(&detail, "kind", "token");
	dl_detail_text(&detail, "broken_by", broken_by);
	dl_detail_text(&detail, "note", note);
	dl_detail_bool(&detail, "terminated", false);
	dl_write_audit(run, NULL, AUDIT_LEASE_BROKEN, dl_detail_finish(&detail), state.epoch, 0);
	dl_note_durable_write();
	return true;
}
