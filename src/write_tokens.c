/*
 * write_tokens.c: the rows of durable_ledger.token_leases and of
 * token_lease_calls, a token lease's counters.
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/timestamp.h"

#include "rows.h"

/* ---------- token leases ---------- */

/*
 * Records a token lease on epoch of run (the epoch itself is recorded by
 * dl_write_next_epoch), taken at taken_at and expiring at expires_at.
 */
void
dl_write_token_lease(const char *run, int64 epoch, bytea *token_sha256,
					 const char *holder, Interval *ttl, TimestampTz taken_at,
					 TimestampTz expires_at)
{
	RowWrite		w;

	dl_row_begin(&w, &dl_token_table);
	dl_row_set(&w, TOK_RUN, CStringGetTextDatum(run));
	dl_row_set(&w, TOK_EPOCH, Int64GetDatum(epoch));
	dl_row_set(&w, TOK_TOKEN_SHA256, PointerGetDatum(token_sha256));
	dl_row_set_optional(&w, TOK_HOLDER, holder ? CStringGetTextDatum(holder) : (Datum) 0, holder == NULL);
	dl_row_set(&w, TOK_TTL, IntervalPGetDatum(ttl));
	dl_row_set(&w, TOK_TAKEN_AT, TimestampTzGetDatum(taken_at));
	dl_row_set(&w, TOK_EXPIRES_AT, TimestampTzGetDatum(expires_at));
	dl_row_set_null(&w, TOK_RELEASED_AT);
	dl_row_insert(&w);
	dl_row_end(&w);
}

/*
 * Locks the row of the token lease on epoch of run for this transaction;
 * false when there is none.  Its expiry is judged by the server's clock.
 */
bool
dl_lock_token_lease(const char *run, int64 epoch, LockedToken *locked)
{
	static const int keys[] = {TOK_RUN, TOK_EPOCH};
	Datum		values[2];
	RowWrite		w;
	bool		found;

	values[0] = CStringGetTextDatum(run);
	values[1] = Int64GetDatum(epoch);
	dl_row_lookup(&w, &dl_token_table);
	found = dl_row_lock_by(&w, 2, keys, values, &locked->tuple);
	if (found)
	{
		TupleDesc	desc = RelationGetDescr(w.rel);
		AttrNumber *a = dl_token_table.attnums;
		bool		isnull;

		(void) heap_getattr(locked->tuple, a[TOK_RELEASED_AT], desc, &isnull);
		locked->released = !isnull;
		locked->expires_at = DatumGetTimestampTz(heap_getattr(locked->tuple, a[TOK_EXPIRES_AT],
															  desc, &isnull));
		locked->expired = locked->expires_at <= GetCurrentTimestamp();
		locked->ttl = DatumGetIntervalP(datumCopy(heap_getattr(locked->tuple, a[TOK_TTL], desc, &isnull),
												  false, sizeof(Interval)));
	}
	dl_row_end(&w);
	return found;
}

static void
update_token(LockedToken *locked, int column, Datum value)
{
	RowWrite		w;

	dl_row_begin(&w, &dl_token_table);
	dl_row_start_from(&w, locked->tuple);
	dl_row_set(&w, column, value);
	dl_row_update(&w, locked->tuple);
	dl_row_end(&w);
}

/* A locked token lease expires at expires_at (renewed, or broken now). */
void
dl_write_token_expiry(LockedToken *locked, TimestampTz expires_at)
{
	update_token(locked, TOK_EXPIRES_AT, TimestampTzGetDatum(expires_at));
	locked->expires_at = expires_at;
}

/* A locked token lease is released now. */
void
dl_write_token_release(LockedToken *locked)
{
	update_token(locked, TOK_RELEASED_AT, dl_row_now());
	locked->released = true;
}

/*
 * Records that calls identical calls were counted in a token lease's epoch.
 * The caller serialises the epoch's calls, so the row is changed in place
 * (its latest version, whatever the transaction's snapshot) or added.  When
 * the caller knows it has no row (look false: dl_token_set_count says when),
 * it is added without looking for one; a row another writer added all the
 * same meets the primary key (a unique violation, never a second row or a
 * count lost).
 */
void
dl_write_token_calls(const char *run, int64 epoch, bytea *call, int32 calls, bool look)
{
	static const int keys[] = {CALLS_RUN, CALLS_EPOCH, CALLS_CALL};
	Datum		values[3];
	HeapTuple	counted;
	RowWrite		w;

	values[0] = CStringGetTextDatum(run);
	values[1] = Int64GetDatum(epoch);
	values[2] = PointerGetDatum(call);
	dl_row_begin(&w, &dl_calls_table);
	if (look && dl_row_lock_by(&w, 3, keys, values, &counted))
	{
		dl_row_start_from(&w, counted);
		dl_row_set(&w, CALLS_CALLS, Int32GetDatum(calls));
		dl_row_update(&w, counted);
	}
	else
	{
		dl_row_set(&w, CALLS_RUN, values[0]);
		dl_row_set(&w, CALLS_EPOCH, values[1]);
		dl_row_set(&w, CALLS_CALL, values[2]);
		dl_row_set(&w, CALLS_CALLS, Int32GetDatum(calls));
		dl_row_insert(&w);
	}
	dl_row_end(&w);
}
