/*
 * write_runs.c: the rows of durable_ledger.runs: epochs, their ends, an
 * abandoned run, a forked run.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/builtins.h"

#include "rows.h"

/* ---------- runs ---------- */

static void
set_holder(RowWrite *w)
{
	Datum		addr;
	bool		has_addr = dl_client_addr(&addr);

	dl_row_set(w, RUN_HOLDER_PID, Int32GetDatum(MyProcPid));
	dl_row_set(w, RUN_HOLDER_ROLE, CStringGetTextDatum(dl_caller_role_name()));
	dl_row_set_optional(w, RUN_HOLDER_APPLICATION_NAME,
				 application_name ? CStringGetTextDatum(application_name) : (Datum) 0,
				 application_name == NULL);
	dl_row_set_optional(w, RUN_HOLDER_CLIENT_ADDR, addr, !has_addr);
	dl_row_set(w, RUN_ACQUIRED_AT, dl_row_now());
	dl_row_set_null(w, RUN_RELEASED_AT);
}

/*
 * Records the next lease epoch of run, held by this session, and returns it.
 * The caller holds the run's lock, so nobody else starts one meanwhile.  A
 * run without a row (a new one, or one whose row was deleted or not
 * restored) continues after the highest epoch its append-only audit log
 * names: an epoch number is never used twice.  Needs an open SPI connection.
 */
int64
dl_write_next_epoch(const char *run, uint64 lock_key, bool token)
{
	RowWrite		w;
	HeapTuple	current;
	int64		epoch;

	dl_row_begin(&w, &dl_runs_table);
	if (dl_row_lock(&w, CStringGetTextDatum(run), RUN_RUN, &current))
	{
		bool		isnull;

		dl_row_start_from(&w, current);
		epoch = DatumGetInt64(heap_getattr(current, dl_runs_table.attnums[RUN_EPOCHS],
										   RelationGetDescr(w.rel), &isnull)) + 1;
		dl_row_set(&w, RUN_EPOCHS, Int64GetDatum(epoch));
		dl_row_set(&w, RUN_LOCK_KEY, Int64GetDatum((int64) lock_key));
		dl_row_set(&w, RUN_LEASE_KIND, CStringGetTextDatum(token ? "token" : "session"));
		set_holder(&w);
		dl_row_update(&w, current);
	}
	else
	{
		epoch = 1 + dl_read_highest_logged_epoch(run);
		dl_row_set(&w, RUN_RUN, CStringGetTextDatum(run));
		dl_row_set(&w, RUN_EPOCHS, Int64GetDatum(epoch));
		dl_row_set(&w, RUN_LOCK_KEY, Int64GetDatum((int64) lock_key));
		dl_row_set(&w, RUN_LEASE_KIND, CStringGetTextDatum(token ? "token" : "session"));
		set_holder(&w);
		dl_row_set(&w, RUN_CREATED_AT, dl_row_now());
		dl_row_insert(&w);
	}
	dl_row_end(&w);
	return epoch;
}

/*
 * Records the end of epoch of run, if it is still the run's current one and
 * of the kind given: a token lease's, or this backend's session lease's.
 */
void
dl_write_epoch_end(const char *run, int64 epoch, bool token)
{
	RowWrite		w;
	HeapTuple	current;

	dl_row_begin(&w, &dl_runs_table);
	if (dl_row_lock(&w, CStringGetTextDatum(run), RUN_RUN, &current))
	{
		TupleDesc	desc = RelationGetDescr(w.rel);
		AttrNumber *a = dl_runs_table.attnums;
		bool		isnull;
		bool		kind_isnull;
		Datum		kind = heap_getattr(current, a[RUN_LEASE_KIND], desc, &kind_isnull);

		dl_row_start_from(&w, current);
		if (DatumGetInt64(heap_getattr(current, a[RUN_EPOCHS], desc, &isnull)) == epoch &&
			!kind_isnull &&
			strcmp(TextDatumGetCString(kind), token ? "token" : "session") == 0 &&
			(token ||
			 DatumGetInt32(heap_getattr(current, a[RUN_HOLDER_PID], desc, &isnull)) == MyProcPid))
		{
			dl_row_set(&w, RUN_RELEASED_AT, dl_row_now());
			dl_row_update(&w, current);
		}
	}
	dl_row_end(&w);
}

/* ---------- abandoned runs ---------- */

/*
 * Records that a person abandoned run; false when it has no row or was
 * abandoned already (nothing changes).  *epoch is its current epoch.
 */
bool
dl_write_run_abandoned(const char *run, const char *abandoned_by, const char *note,
					   int64 *epoch)
{
	RowWrite		w;
	HeapTuple	current;
	bool		changed = false;

	*epoch = 0;
	dl_row_begin(&w, &dl_runs_table);
	if (dl_row_lock(&w, CStringGetTextDatum(run), RUN_RUN, &current))
	{
		TupleDesc	desc = RelationGetDescr(w.rel);
		bool		isnull;

		*epoch = DatumGetInt64(heap_getattr(current, dl_runs_table.attnums[RUN_EPOCHS],
											desc, &isnull));
		(void) heap_getattr(current, dl_runs_table.attnums[RUN_ABANDONED_AT], desc, &isnull);
		if (isnull)
		{
			dl_row_start_from(&w, current);
			dl_row_set(&w, RUN_ABANDONED_AT, dl_row_now());
			dl_row_set(&w, RUN_ABANDONED_BY, CStringGetTextDatum(abandoned_by));
			dl_row_set_optional(&w, RUN_ABANDON_NOTE, note ? CStringGetTextDatum(note) : (Datum) 0,
						 note == NULL);
			dl_row_update(&w, current);
			dl_row_announce_change(&w);
			changed = true;
		}
	}
	dl_row_end(&w);
	return changed;
}

/*
 * Locks run's row for this transaction, so that its lease's changes (a
 * release, the next epoch) wait; false when the run has none.
 */
bool
dl_lock_run(const char *run)
{
	RowWrite		w;
	HeapTuple	current;
	bool		found;

	dl_row_begin(&w, &dl_runs_table);
	found = dl_row_lock(&w, CStringGetTextDatum(run), RUN_RUN, &current);
	dl_row_end(&w);
	return found;
}

/* ---------- forked runs ---------- */

/*
 * Records new_run, forked from source_run up to its effect up_to, in its
 * first epoch, which the fork itself is (held by nobody): its first lease
 * starts epoch 2, whose calls look their keys up.
 */
void
dl_write_forked_run(const char *new_run, uint64 lock_key, const char *source_run,
					const char *up_to)
{
	RowWrite		w;

	dl_row_begin(&w, &dl_runs_table);
	dl_row_set(&w, RUN_RUN, CStringGetTextDatum(new_run));
	dl_row_set(&w, RUN_EPOCHS, Int64GetDatum(1));
	dl_row_set(&w, RUN_LOCK_KEY, Int64GetDatum((int64) lock_key));
	dl_row_set(&w, RUN_LEASE_KIND, CStringGetTextDatum("session"));
	set_holder(&w);
	dl_row_set(&w, RUN_RELEASED_AT, dl_row_now());
	dl_row_set(&w, RUN_CREATED_AT, dl_row_now());
	dl_row_set_null(&w, RUN_ABANDONED_AT);
	dl_row_set_null(&w, RUN_ABANDONED_BY);
	dl_row_set_null(&w, RUN_ABANDON_NOTE);
	dl_row_set(&w, RUN_FORKED_FROM, CStringGetTextDatum(source_run));
	dl_row_set(&w, RUN_FORKED_UP_TO, CStringGetTextDatum(up_to));
	dl_row_insert(&w);
	dl_row_end(&w);
}
