/*
 * report_funcs.c: complete_effect() and fail_effect(), a worker's report that an
 * attempt of an effect happened or definitively did not.
 *
 * A report names the attempt it is about, and never decides another one: a
 * business key is executed again after a failure, and a delayed report for
 * attempt 1 that decided attempt 2 would let attempt 3 pay again.  A report
 * that contradicts the record is kept, never applied, never lost.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"

#include "lease.h"

PG_FUNCTION_INFO_V1(dl_complete_effect_1_3);
PG_FUNCTION_INFO_V1(dl_fail_effect_1_3);

/*
 * Keeps a report that contradicts the record of attempt (its run and epoch):
 * never applied, never lost.  The effect is flagged, so that it waits for a
 * person.  Raising an error would roll the evidence back, so the caller gets
 * a WARNING (from the callers below).  run is NULL (and attempt 0) when the
 * report cannot be matched to an attempt.
 */
static void
keep_conflict(LockedEffect *locked, const char *run, int64 lease_epoch, int32 attempt,
			  EffectStatus reported, Jsonb *value, EffectStatus recorded_status,
			  Jsonb *recorded_result, Jsonb *recorded_error, const char *why)
{
	const EffectRow *row = &locked->row;
	DetailBuilder detail;

	dl_detail_init(&detail);
	dl_detail_text(&detail, "report", dl_status_name(reported));
	dl_detail_jsonb(&detail, reported == EFFECT_COMPLETED ? "result" : "error", value);
	if (attempt > 0)
	{
		dl_detail_text(&detail, "recorded_status", dl_status_name(recorded_status));
		dl_detail_jsonb(&detail, "recorded_result", recorded_result);
		dl_detail_jsonb(&detail, "recorded_error", recorded_error);
	}
	if (attempt != row->attempt)
		dl_detail_int(&detail, "current_attempt", row->attempt);
	if (why != NULL)
		dl_detail_text(&detail, "why", why);
	dl_write_audit(run, row->key, AUDIT_CONFLICT, dl_detail_finish(&detail), lease_epoch, attempt);
	dl_write_conflict_flag(locked);
	dl_note_durable_write();
}

/* A report that contradicts what is recorded for the current attempt. */
static void
record_conflict(LockedEffect *locked, EffectStatus reported, Jsonb *value)
{
	EffectRow	row = locked->row;

	keep_conflict(locked, row.run, row.lease_epoch, row.attempt, reported, value,
				  row.status, row.result, row.error, NULL);
	ereport(WARNING,
			(errcode(ERRCODE_DL_WARNING_CONFLICT),
			 errmsg("report \"%s\" for effect \"%s\" contradicts its recorded outcome",
					dl_status_name(reported), row.key),
			 errdetail("The effect is recorded as %s. The report was kept in the audit log as a conflict and the effect is flagged for a person; nothing else changed.",
					   dl_status_name(row.status)),
			 errhint("A person resolves it with durable_ledger.resolve_effect().")));
}

/*
 * A report on an attempt of a recorded call that a later attempt replaced
 * (its outcome was unknown, so the call was made again): the call was made
 * twice, which its caller said is harmless.  The report is kept in the audit
 * log under the run, epoch and attempt it is about, and changes nothing.
 */
static void
keep_superseded_report(LockedEffect *locked, const char *run, int64 lease_epoch, int32 attempt,
					   EffectStatus reported, Jsonb *value)
{
	DetailBuilder detail;

	dl_detail_init(&detail);
	dl_detail_text(&detail, "report", dl_status_name(reported));
	dl_detail_jsonb(&detail, reported == EFFECT_COMPLETED ? "result" : "error", value);
	dl_detail_int(&detail, "current_attempt", locked->row.attempt);
	dl_write_audit(run, locked->row.key, AUDIT_SUPERSEDED_REPORT, dl_detail_finish(&detail),
				   lease_epoch, attempt);
	dl_note_durable_write();
}

/*
 * A report on an earlier attempt, which a later attempt replaced: it never
 * changes the current attempt.  A recorded call's replaced attempt had an
 * unknown outcome (keep_superseded_report); a business key's has failed: the
 * same failure reported again changes nothing, anything else
 * (a completion: the operation may have happened twice) is kept as a
 * conflict, filed under the run and epoch of the attempt it is about.
 */
static void
report_on_past_attempt(LockedEffect *locked, int32 attempt, EffectStatus reported,
					   Jsonb *value)
{
	PastAttempt past;

	if (!dl_read_past_attempt(locked->row.key, attempt, &past))
	{
		/*
		 * Not on record.  A recorded call's replaced attempts were all lost
		 * (only their redo replaces them), and a carried effect's stay with
		 * the source's effect: unknown.  Anything else's is an upgraded
		 * ledger's whose log lacked it, where only failures were replaced.
		 */
		past.run = NULL;
		past.lease_epoch = 0;
		past.status = locked->row.safe_to_redo ? EFFECT_UNKNOWN : EFFECT_FAILED;
		past.error = locked->row.safe_to_redo ? NULL : value;
	}
	if (reported == past.status && dl_jsonb_equal(past.error, value))
		return;
	if (locked->row.safe_to_redo && past.status == EFFECT_UNKNOWN)
	{
		keep_superseded_report(locked, past.run, past.lease_epoch, attempt, reported, value);
		return;
	}

	keep_conflict(locked, past.run, past.lease_epoch, attempt, reported, value,
				  past.status, NULL, past.error, NULL);
	ereport(WARNING,
			(errcode(ERRCODE_DL_WARNING_CONFLICT),
			 errmsg("report \"%s\" for attempt %d of effect \"%s\" contradicts its recorded outcome",
					dl_status_name(reported), attempt, locked->row.key),
			 errdetail("Attempt %d is recorded as %s and attempt %d has started since. The report was kept in the audit log as a conflict and the effect is flagged for a person; nothing else changed.",
					   attempt, dl_status_name(past.status), locked->row.attempt),
			 errhint("A person resolves it with durable_ledger.resolve_effect().")));
}

/*
 * A report that names no attempt, on an effect (a business key, a recorded
 * call made again, an effect a person retried) whose current attempt is not the first and was not
 * started by the lease this session holds now (alone: a lease that began two
 * attempts cannot tell them apart): it may be a late report on an earlier
 * attempt, so it is never applied.
 */
static void
report_on_unnamed_attempt(LockedEffect *locked, EffectStatus reported, Jsonb *value)
{
	int32		current = locked->row.attempt;

	/*
	 * A recorded call's: kept as superseded (no run, no attempt: it cannot be
	 * matched to one), not flagged.  Were it the current attempt's, the call
	 * is made again when that attempt's lease ends: harmless, its caller said.
	 */
	if (locked->row.safe_to_redo)
	{
		keep_superseded_report(locked, NULL, 0, 0, reported, value);
		ereport(WARNING,
				(errcode(ERRCODE_DL_WARNING_SUPERSEDED),
				 errmsg("report \"%s\" for effect \"%s\" names no attempt, and the effect is at attempt %d",
						dl_status_name(reported), locked->row.key, current),
				 errdetail("It may concern an earlier attempt, so it was not applied: it was kept in the audit log as a superseded report. The effect is a recorded call: if its current attempt's lease ends without a report, it is made again."),
				 errhint("Pass the attempt that begin_recorded() returned.")));
		return;
	}

	keep_conflict(locked, NULL, 0, 0, reported, value, locked->row.status, NULL, NULL,
				  "the report named no attempt, and the current attempt is not the first");
	ereport(WARNING,
			(errcode(ERRCODE_DL_WARNING_CONFLICT),
			 errmsg("report \"%s\" for effect \"%s\" names no attempt, and the effect is at attempt %d",
					dl_status_name(reported), locked->row.key, current),
			 errdetail("It may concern an earlier attempt, so it was not applied: it was kept in the audit log as a conflict and the effect is flagged for a person."),
			 errhint("Pass the attempt that begin_effect() returned. A person resolves this one with durable_ledger.resolve_effect().")));
}

/*
 * Is a report that names no attempt certainly about the current attempt?  It
 * is when there is one attempt only, or when this session holds the very
 * lease that started the current attempt and no lease of a run that started
 * an earlier one (1.3): a session driving two runs that share a business key
 * cannot say which of their attempts it reports on (nor one lease that began
 * two attempts).
 */
static bool
unnamed_attempt_is_current(const EffectRow *row)
{
	ListCell   *lc;

	if (row->attempt == 1)
		return true;			/* a derived key's only, unless redone or retried */
	if (!dl_lease_is_mine(row->run, row->lease_epoch))
		return false;
	foreach(lc, dl_read_past_attempt_runs(row->key))
	{
		if (dl_lease_held_epoch((const char *) lfirst(lc)) != 0)
			return false;
	}
	return true;
}

/* Logs a report that was applied: on time, or late (its lease had ended). */
static void
audit_applied_report(const EffectRow *before, EffectStatus reported, Jsonb *value)
{
	bool		late = before->status == EFFECT_UNKNOWN ||
		!dl_lease_is_live(before->run, before->lease_epoch);
	AuditEvent	event;
	Jsonb	   *detail_value = NULL;

	if (reported == EFFECT_COMPLETED)
		event = late ? AUDIT_LATE_COMPLETION : AUDIT_COMPLETED;
	else
		event = late ? AUDIT_LATE_FAILURE : AUDIT_FAILED;
	/* a failure's error is kept in the log: a business key may retry later */
	if (late || reported == EFFECT_FAILED)
	{
		DetailBuilder detail;

		dl_detail_init(&detail);
		if (reported == EFFECT_FAILED)
			dl_detail_jsonb(&detail, "error", value);
		if (late)
			dl_detail_text(&detail, "status_before", dl_status_name(EFFECT_UNKNOWN));
		detail_value = dl_detail_finish(&detail);
	}
	dl_write_audit(before->run, before->key, event, detail_value, before->lease_epoch,
				   before->attempt);
	dl_note_durable_write();
}

/*
 * A worker's report that attempt (0: not named) of the effect ended as
 * reported (completed or failed).  The row is locked (after any transaction
 * changing it has ended) and judged:
 *   - an attempt above the current one: an error, nothing written;
 *   - an earlier attempt: never applied (report_on_past_attempt);
 *   - no attempt named, and not certainly the current one: never applied;
 *   - otherwise the current attempt: started or unknown -> applied (late when
 *     its lease has ended), the same report again -> no change, a
 *     contradiction -> a conflict.
 */
static Datum
report_outcome(FunctionCallInfo fcinfo, EffectStatus reported)
{
	char	   *key = dl_required_text_arg(fcinfo, 0, "key", 0);
	Jsonb	   *value = dl_optional_jsonb_arg(fcinfo, 1);
	int32		attempt = dl_optional_attempt_arg(fcinfo, 2);
	TupleDesc	desc = dl_result_desc(fcinfo);
	LockedEffect locked;
	EffectRow	before;
	HeapTuple	row;
	Datum		result;

	dl_check_writable(reported == EFFECT_COMPLETED ? "complete_effect()" : "fail_effect()");
	dl_spi_connect();
	if (!dl_lock_effect(key, &locked))
		dl_error_unknown_key(key);
	before = locked.row;

	if (attempt > before.attempt)
		dl_error_no_such_attempt(key, attempt, before.attempt);
	if (attempt != 0 && attempt < before.attempt)
		report_on_past_attempt(&locked, attempt, reported, value);
	else if (attempt == 0 && !unnamed_attempt_is_current(&before))
		report_on_unnamed_attempt(&locked, reported, value);
	else if (before.status == EFFECT_STARTED || before.status == EFFECT_UNKNOWN)
	{
		(void) dl_write_outcome(&locked,
								reported,
								reported == EFFECT_COMPLETED ? value : NULL,
								reported == EFFECT_FAILED ? value : NULL);
		audit_applied_report(&before, reported, value);
	}
	else if (before.status == reported &&
			 dl_jsonb_equal(reported == EFFECT_COMPLETED ? before.result : before.error, value))
	{
		/* the same report again (a retry after a network error): no change */
	}
	else
		record_conflict(&locked, reported, value);

	row = heap_copytuple(locked.tuple);
	result = PointerGetDatum(SPI_returntuple(row, desc));
	dl_spi_finish();
	PG_RETURN_DATUM(result);
}

/* complete_effect(key text, result jsonb, attempt integer) RETURNS durable_ledger.effects */
Datum
dl_complete_effect_1_3(PG_FUNCTION_ARGS)
{
	return report_outcome(fcinfo, EFFECT_COMPLETED);
}

/* fail_effect(key text, error jsonb, attempt integer) RETURNS durable_ledger.effects */
Datum
dl_fail_effect_1_3(PG_FUNCTION_ARGS)
{
	return report_outcome(fcinfo, EFFECT_FAILED);
}
