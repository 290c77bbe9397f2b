/*
 * resolve_funcs.c: resolve_effect(), a person's (or a reconciler's) decision on an
 * effect whose outcome is unknown or contradicted, with a name.
 *
 * A decision is prepared from what a person saw (unresolved lists the
 * attempt): with attempt, it applies only while that attempt is current, so
 * a decision about attempt 2 never lands on an attempt 3 begun meanwhile.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"

#include "lease.h"

PG_FUNCTION_INFO_V1(dl_resolve_effect_1_3);
PG_FUNCTION_INFO_V1(dl_retry_effect_1_3);

/*
 * Locks key's effect for a person's decision about the given attempt: the
 * current one (NULL: whichever is current, resolve_effect's v1 form).
 */
static void
lock_attempt(const char *key, int32 attempt, LockedEffect *locked)
{
	if (!dl_lock_effect(key, locked))
		dl_error_unknown_key(key);
	if (attempt > locked->row.attempt)
		dl_error_no_such_attempt(key, attempt, locked->row.attempt);
	if (attempt != 0 && attempt < locked->row.attempt)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("attempt %d of effect \"%s\" was replaced by attempt %d", attempt, key,
						locked->row.attempt),
				 errdetail("A resolution decides the current attempt; this one was prepared for an earlier attempt."),
				 errhint("Look at durable_ledger.unresolved again.")));
}

/* A started or unknown effect is decided only once its lease has ended. */
static void
check_not_in_flight(const char *key, const EffectRow *row)
{
	if ((row->status == EFFECT_STARTED || row->status == EFFECT_UNKNOWN) &&
		dl_lease_is_live(row->run, row->lease_epoch))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("effect \"%s\" is in flight under a live lease", key),
				 errdetail("Run \"%s\" holds the lease that started it; its worker will report the outcome.", row->run),
				 errhint("Wait for the worker, or end its lease with durable_ledger.break_lease() first.")));
}

/* What a person's decision replaced, for its audit row (resolved, retry_allowed). */
static void
detail_previous(DetailBuilder *detail, const EffectRow *before)
{
	dl_detail_text(detail, "previous_status",
				   dl_status_name(before->status == EFFECT_STARTED ? EFFECT_UNKNOWN : before->status));
	dl_detail_jsonb(detail, "previous_result", before->result);
	dl_detail_jsonb(detail, "previous_error", before->error);
	dl_detail_bool(detail, "conflict_cleared", before->conflict);
}

/*
 * resolve_effect(key text, outcome text, result jsonb, resolved_by text,
 *                note text, attempt integer) RETURNS durable_ledger.effects
 */
Datum
dl_resolve_effect_1_3(PG_FUNCTION_ARGS)
{
	char	   *key = dl_required_text_arg(fcinfo, 0, "key", 0);
	char	   *outcome = dl_required_text_arg(fcinfo, 1, "outcome", 0);
	Jsonb	   *value = dl_optional_jsonb_arg(fcinfo, 2);
	char	   *resolved_by = dl_required_text_arg(fcinfo, 3, "resolved_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 4);
	int32		attempt = dl_optional_attempt_arg(fcinfo, 5);
	TupleDesc	desc = dl_result_desc(fcinfo);
	EffectStatus to;
	LockedEffect locked;
	EffectRow	before;
	DetailBuilder detail;
	HeapTuple	row;
	Datum		result;

	if (strcmp(outcome, "completed") == 0)
		to = EFFECT_COMPLETED;
	else if (strcmp(outcome, "failed") == 0)
		to = EFFECT_FAILED;
	else
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("invalid outcome \"%s\"", outcome),
				 errdetail("The outcome of a resolution is \"completed\" (the effect happened) or \"failed\" (it did not).")));
	dl_check_writable("resolve_effect()");

	dl_spi_connect();
	lock_attempt(key, attempt, &locked);
	before = locked.row;
	check_not_in_flight(key, &before);
	if (!before.conflict && before.status != EFFECT_UNKNOWN && before.status != EFFECT_STARTED)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("effect \"%s\" is %s and needs no resolution", key, dl_status_name(before.status)),
				 errdetail("Only an effect whose outcome is unknown, or that carries a conflict flag, can be resolved.")));

	row = dl_write_resolution(&locked, to, value, resolved_by, note);

	dl_detail_init(&detail);
	dl_detail_text(&detail, "outcome", outcome);
	dl_detail_jsonb(&detail, to == EFFECT_COMPLETED ? "result" : "error", value);
	dl_detail_text(&detail, "resolved_by", resolved_by);
	dl_detail_text(&detail, "note", note);
	detail_previous(&detail, &before);
	dl_write_audit(before.run, key, AUDIT_RESOLVED, dl_detail_finish(&detail), before.lease_epoch,
				   before.attempt);
	dl_note_durable_write();

	result = PointerGetDatum(SPI_returntuple(row, desc));
	dl_spi_finish();
	PG_RETURN_DATUM(result);
}

static void
audit_retry(const char *key, const EffectRow *before, const char *resolved_by, const char *note)
{
	DetailBuilder detail;

	dl_detail_init(&detail);
	dl_detail_text(&detail, "resolved_by", resolved_by);
	dl_detail_text(&detail, "note", note);
	detail_previous(&detail, before);
	dl_write_audit(before->run, key, AUDIT_RETRY_ALLOWED, dl_detail_finish(&detail),
				   before->lease_epoch, before->attempt);
}

/*
 * retry_effect(key text, attempt integer, resolved_by text, note text)
 * RETURNS durable_ledger.effects
 *
 * A person checked and found that the attempt did not happen: it is failed,
 * and the next call of the key executes the next attempt (docs/reference.md,
 * "Resolving").  Not for an effect that completed without a contradiction:
 * it happened, and would happen twice.  Asked again, no change.
 */
Datum
dl_retry_effect_1_3(PG_FUNCTION_ARGS)
{
	char	   *key = dl_required_text_arg(fcinfo, 0, "key", 0);
	int32		attempt = dl_required_attempt_arg(fcinfo, 1);
	char	   *resolved_by = dl_required_text_arg(fcinfo, 2, "resolved_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 3);
	TupleDesc	desc = dl_result_desc(fcinfo);
	LockedEffect locked;
	EffectRow	before;
	HeapTuple	row;
	Datum		result;

	dl_check_writable("retry_effect()");
	dl_spi_connect();
	lock_attempt(key, attempt, &locked);
	before = locked.row;
	check_not_in_flight(key, &before);
	if (before.status == EFFECT_COMPLETED)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("effect \"%s\" completed: making it again would perform it twice", key),
				 errdetail("Only an attempt that did not happen can be made again: one whose outcome is unknown, or that failed."),
				 errhint("If a contradicting report shows that it did not happen after all, resolve it as failed with durable_ledger.resolve_effect() first.")));
	if (before.status == EFFECT_AWAITING_APPROVAL || before.status == EFFECT_APPROVED ||
		before.approval == APPROVAL_REJECTED)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("effect \"%s\" is %s: it was never executed", key,
						before.approval == APPROVAL_REJECTED ? "rejected" : dl_status_name(before.status)),
				 errdetail("A call that needs an approval executes once an approver approved it (durable_ledger.approve_effect()); a rejected one is not made again."),
				 errhint("For a rejected call, start the operation anew: a new business key, or a new run.")));
	if (before.execute_again && !before.conflict)
		row = locked.tuple;		/* asked again: nothing to change */
	else
	{
		row = dl_write_retry(&locked, resolved_by, note);
		audit_retry(key, &before, resolved_by, note);
		dl_note_durable_write();
	}
	result = PointerGetDatum(SPI_returntuple(row, desc));
	dl_spi_finish();
	PG_RETURN_DATUM(result);
}
