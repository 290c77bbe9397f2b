/*
 * write_divergences.c: the rows of durable_ledger.divergences.
 */
#include "postgres.h"

#include "utils/builtins.h"

#include "rows.h"

/* ---------- divergences ---------- */

/* Records a later attempt's drifted call, waiting for a person. */
void
dl_write_divergence(const DivergenceRow *row)
{
	RowWrite		w;

	dl_row_begin(&w, &dl_divergences_table);
	dl_row_set(&w, DIV_KEY, CStringGetTextDatum(row->key));
	dl_row_set(&w, DIV_RUN, CStringGetTextDatum(row->run));
	dl_row_set(&w, DIV_LEASE_EPOCH, Int64GetDatum(row->lease_epoch));
	dl_row_set(&w, DIV_TOOL, CStringGetTextDatum(row->tool));
	dl_row_set(&w, DIV_ARGS, JsonbPGetDatum(row->args));
	dl_row_set(&w, DIV_OCCURRENCE, Int32GetDatum(row->occurrence));
	dl_row_set(&w, DIV_CANDIDATE_KEY, CStringGetTextDatum(row->candidate_key));
	dl_row_set(&w, DIV_DETECTED_AT, dl_row_now());
	dl_row_set_null(&w, DIV_VERDICT);
	dl_row_set_null(&w, DIV_SAME_AS);
	dl_row_set_null(&w, DIV_RESOLVED_BY);
	dl_row_set_null(&w, DIV_RESOLVED_AT);
	dl_row_set_null(&w, DIV_RESOLUTION_NOTE);
	dl_row_insert(&w);
	dl_row_announce_change(&w);
	dl_row_end(&w);
}

/* Locks the divergence of key for this transaction; false when there is none. */
bool
dl_lock_divergence(const char *key, LockedDivergence *locked)
{
	RowWrite		w;
	bool		found;

	dl_row_lookup(&w, &dl_divergences_table);
	found = dl_row_lock(&w, CStringGetTextDatum(key), DIV_KEY, &locked->tuple);
	if (found)
	{
		TupleTableSlot *slot = MakeSingleTupleTableSlot(RelationGetDescr(w.rel),
														&TTSOpsHeapTuple);

		ExecStoreHeapTuple(locked->tuple, slot, false);
		dl_divergence_row_from_slot(slot, &locked->row);
		ExecDropSingleTupleTableSlot(slot);
	}
	dl_row_end(&w);
	return found;
}

/* A person's verdict on a locked divergence. */
void
dl_write_divergence_verdict(LockedDivergence *locked, const char *verdict,
							const char *same_as, const char *resolved_by, const char *note)
{
	RowWrite		w;

	dl_row_begin(&w, &dl_divergences_table);
	dl_row_start_from(&w, locked->tuple);
	dl_row_set(&w, DIV_VERDICT, CStringGetTextDatum(verdict));
	dl_row_set_optional(&w, DIV_SAME_AS, same_as ? CStringGetTextDatum(same_as) : (Datum) 0,
				 same_as == NULL);
	dl_row_set(&w, DIV_RESOLVED_BY, CStringGetTextDatum(resolved_by));
	dl_row_set(&w, DIV_RESOLVED_AT, dl_row_now());
	dl_row_set_optional(&w, DIV_RESOLUTION_NOTE, note ? CStringGetTextDatum(note) : (Datum) 0,
				 note == NULL);
	dl_row_update(&w, locked->tuple);
	dl_row_end(&w);
}
