/*
 * run_calls.c: abandon_run() and resolve_divergence(), what a person decides
 * about a run: stop it for good, or say what a drifted call of a later
 * attempt is (divergence.c).  Both are audited with the person's name.
 */
#include "postgres.h"

#include "funcapi.h"
#include "utils/builtins.h"

#include "policy.h"

PG_FUNCTION_INFO_V1(dl_abandon_run_1_2);
PG_FUNCTION_INFO_V1(dl_resolve_divergence_1_2);

/*
 * abandon_run(run text, abandoned_by text, note text) RETURNS boolean
 *
 * No further begin_effect, acquire_run or take_lease of the run (55L02);
 * effects in flight keep their status, for a person; reports on them are
 * still recorded.  The run's calls in progress are waited for, so that none
 * decides anything after this returns.  False when it was abandoned already.
 */
Datum
dl_abandon_run_1_2(PG_FUNCTION_ARGS)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	char	   *abandoned_by = dl_required_text_arg(fcinfo, 1, "abandoned_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 2);
	RunState	state;
	int64		epoch;
	bool		abandoned;

	dl_check_writable("abandon_run()");
	dl_spi_connect();
	dl_run_lock_closing(dl_run_lock_key(run));
	if (!dl_read_run_state(run, &state))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("run \"%s\" is not in the ledger", run),
				 errhint("A run is recorded when its lease is first taken.")));
	abandoned = dl_write_run_abandoned(run, abandoned_by, note, &epoch);
	if (abandoned)
	{
		DetailBuilder detail;

		dl_detail_init(&detail);
		dl_detail_text(&detail, "abandoned_by", abandoned_by);
		dl_detail_text(&detail, "note", note);
		dl_write_audit(run, NULL, "run_abandoned", dl_detail_finish(&detail), epoch, 0);
		dl_note_durable_write();
	}
	dl_spi_finish();
	PG_RETURN_BOOL(abandoned);
}

static void
check_same_as(const LockedDivergence *locked, const char *same_as)
{
	EffectRow	row;

	if (dl_read_key(same_as, &row) == KEY_ABSENT ||
		strcmp(row.run, locked->row.run) != 0 || strcmp(row.tool, locked->row.tool) != 0 ||
		row.business_key || row.lease_epoch >= locked->row.lease_epoch)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("effect \"%s\" is not an earlier effect of tool \"%s\" in run \"%s\"",
						same_as, locked->row.tool, locked->row.run),
				 errdetail("A drifted call can be the same as an effect that an earlier attempt of its run recorded for the same tool under a derived key.")));
}

/*
 * resolve_divergence(key text, verdict text, resolved_by text, note text,
 *                    same_as text) RETURNS durable_ledger.divergences
 *
 * verdict 'same': the drifted call is the same operation as same_as (by
 * default the earlier effect it was found to possibly duplicate): the run's
 * next call of it gets that effect's outcome.  'distinct': it is a new
 * operation: the next call of it executes.
 */
Datum
dl_resolve_divergence_1_2(PG_FUNCTION_ARGS)
{
	char	   *key = dl_required_text_arg(fcinfo, 0, "key", 0);
	char	   *verdict = dl_required_text_arg(fcinfo, 1, "verdict", 0);
	char	   *resolved_by = dl_required_text_arg(fcinfo, 2, "resolved_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 3);
	char	   *same_as = dl_optional_text_arg(fcinfo, 4);
	MemoryContext call_cxt = CurrentMemoryContext;
	TupleDesc	desc = dl_result_desc(fcinfo);
	LockedDivergence locked;
	DetailBuilder detail;
	HeapTuple	tuple;
	Datum		result;

	if (strcmp(verdict, "same") != 0 && strcmp(verdict, "distinct") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("verdict must be \"same\" or \"distinct\", not \"%s\"", verdict)));
	if (strcmp(verdict, "distinct") == 0 && same_as != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("same_as is for the verdict \"same\"")));
	dl_check_writable("resolve_divergence()");

	dl_spi_connect();
	if (!dl_lock_divergence(key, &locked))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("no divergence is recorded for key \"%s\"", key),
				 errhint("Divergences waiting for a person are listed in durable_ledger.unresolved.")));
	if (locked.row.verdict != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the divergence of key \"%s\" was decided already: %s",
						key, locked.row.verdict)));
	if (strcmp(verdict, "same") == 0)
	{
		if (same_as == NULL)
			same_as = locked.row.candidate_key;
		check_same_as(&locked, same_as);
	}
	dl_write_divergence_verdict(&locked, verdict, same_as, resolved_by, note);

	dl_detail_init(&detail);
	dl_detail_text(&detail, "verdict", verdict);
	dl_detail_text(&detail, "same_as", same_as);
	dl_detail_text(&detail, "resolved_by", resolved_by);
	dl_detail_text(&detail, "note", note);
	dl_write_audit(locked.row.run, key, "divergence_resolved", dl_detail_finish(&detail),
				   locked.row.lease_epoch, 0);
	dl_note_durable_write();

	tuple = dl_read_divergence_tuple(key);
	MemoryContextSwitchTo(call_cxt);
	result = heap_copy_tuple_as_datum(tuple, desc);
	dl_spi_finish();
	PG_RETURN_DATUM(result);
}
