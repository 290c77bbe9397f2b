/*
 * report.c: what a report on an effect decides -- a worker's that an attempt
 * happened or definitively did not (complete_effect, fail_effect), and a
 * reconciler's of what the provider's own record says of an attempt whose
 * outcome the ledger found unknown (reconcile_effect).
 *
 * A report names the attempt it is about, and never decides another one: a
 * business key is executed again after a failure, and a delayed report for
 * attempt 1 that decided attempt 2 would let attempt 3 pay again.  A report
 * that contradicts the record is kept, never applied, never lost.
 *
 * The row is locked, judged on one ladder, and each branch writes once.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "decision.h"

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
 * Returns the effect's row as it is now.
 */
HeapTuple
dl_report(const char *key, int32 attempt, EffectStatus reported, Jsonb *value)
{
	LockedEffect locked;
	EffectRow	before;

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
	return heap_copytuple(locked.tuple);
}

/* ---------- reconcilers ---------- */

#define WHY_RECONCILED "a reconciler's finding from the provider's record"

/*
 * A reconciler's finding that contradicts what is recorded of attempt (the
 * current one, or one a later attempt replaced, as recorded): kept, as a
 * report that contradicts is -- the operation may have happened twice.
 */
static void
keep_contradicting_finding(LockedEffect *locked, const char *run, int64 lease_epoch,
						   int32 attempt, bool happened, Jsonb *evidence,
						   EffectStatus recorded_status, Jsonb *recorded_result,
						   Jsonb *recorded_error)
{
	keep_conflict(locked, run, lease_epoch, attempt,
				  happened ? EFFECT_COMPLETED : EFFECT_FAILED, evidence,
				  recorded_status, recorded_result, recorded_error, WHY_RECONCILED);
	ereport(WARNING,
			(errcode(ERRCODE_DL_WARNING_CONFLICT),
			 errmsg("the provider's record of attempt %d of effect \"%s\" contradicts the ledger's",
					attempt, locked->row.key),
			 errdetail("The reconciler found that it %s; the ledger records it as %s. The finding was kept in the audit log as a conflict and the effect is flagged for a person; nothing else changed.",
					   happened ? "happened" : "did not happen", dl_status_name(recorded_status)),
			 errhint("A person resolves it with durable_ledger.resolve_effect().")));
}

/*
 * A finding about an attempt that a later one replaced: that it did not
 * happen is what the ledger went on from, and changes nothing; that it
 * happened means the operation may have happened twice.
 */
static void
finding_on_past_attempt(LockedEffect *locked, int32 attempt, bool happened, Jsonb *evidence)
{
	PastAttempt past;

	if (!happened)
		return;
	if (!dl_read_past_attempt(locked->row.key, attempt, &past))
	{
		past.run = NULL;
		past.lease_epoch = 0;
		past.status = locked->row.safe_to_redo ? EFFECT_UNKNOWN : EFFECT_FAILED;
		past.error = NULL;
	}
	if (locked->row.safe_to_redo && past.status == EFFECT_UNKNOWN)
	{
		/* a recorded call made twice, which its caller said is harmless */
		keep_superseded_report(locked, past.run, past.lease_epoch, attempt, EFFECT_COMPLETED,
							   evidence);
		return;
	}
	keep_contradicting_finding(locked, past.run, past.lease_epoch, attempt, happened, evidence,
							   past.status, NULL, past.error);
}

/*
 * An unknown outcome is reconciled once the tool's grace has passed since
 * the ledger found it unknown: a request its worker sent just before it was
 * lost may still reach the provider, after a lookup that did not find it.
 * *from is that moment; false when the audit log does not say when the
 * outcome was found unknown.
 */
static bool
reconcile_from(const EffectRow *row, const ToolRules *rules, TimestampTz *found_at,
			   TimestampTz *from)
{
	int64		grace;

	if (!dl_read_found_unknown_at(row->key, row->attempt, row->created_at, found_at))
		return false;
	/*
	 * A fixed length (days of 24 hours): added in the session's time zone, a
	 * grace of days would shrink across a change of daylight saving time, or
	 * to nothing in a zone made for it.  set_reconcile keeps it in range.
	 */
	if (!dl_interval_usecs(&rules->row.reconcile_grace, &grace))
		elog(ERROR, "the reconcile grace of tool \"%s\" is out of range", row->tool);
	*from = *found_at + grace;
	return true;
}

static void
check_grace_passed(const EffectRow *row, const ToolRules *rules)
{
	TimestampTz found_at;
	TimestampTz from;

	if (!reconcile_from(row, rules, &found_at, &from))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the audit log does not say when the outcome of effect \"%s\" was found unknown",
						row->key),
				 errdetail("The grace a reconciler must wait is counted from that moment."),
				 errhint("A person resolves it with durable_ledger.resolve_effect().")));
	if (GetCurrentTimestamp() < from)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("effect \"%s\" may be reconciled from %s", row->key, timestamptz_to_str(from)),
				 errdetail("Its outcome was found unknown at %s, and tool \"%s\" is reconciled only after a grace of %s: a request still in flight may yet reach the provider.",
						   timestamptz_to_str(found_at), row->tool,
						   DatumGetCString(DirectFunctionCall1(interval_out,
															   IntervalPGetDatum(&rules->row.reconcile_grace)))),
				 errhint("Look the effect up at the provider again after that time (reconcilable_from() says when): a lookup made before it may miss a request still in flight. Until then the effect stays paused.")));
}

/* Only an unknown outcome of a tool an admin made reconcilable (set_reconcile). */
static void
check_reconcilable(const EffectRow *row, const ToolRules *rules)
{
	if (!rules->registered || !rules->row.reconcilable)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("tool \"%s\" is not reconciled by workers", row->tool),
				 errdetail("Its unknown outcomes wait for a person."),
				 errhint("An admin allows reconcilers with durable_ledger.set_reconcile(); until then a person resolves the effect with durable_ledger.resolve_effect().")));
	if (row->conflict)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("effect \"%s\" waits for a person", row->key),
				 errdetail("A report on it contradicts its recorded outcome, or names no attempt where that is ambiguous."),
				 errhint("A person resolves it with durable_ledger.resolve_effect().")));
	if (row->status == EFFECT_STARTED)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("effect \"%s\" is started, not unknown", row->key),
				 errdetail("Only an outcome the ledger found unknown is reconciled: while the lease that started it is live, its worker reports the outcome."),
				 errhint("Call begin_effect() for it: once its lease has ended, that finds the outcome unknown.")));
}

static void
audit_reconciled(const EffectRow *before, bool happened, Jsonb *evidence)
{
	DetailBuilder detail;

	dl_detail_init(&detail);
	dl_detail_bool(&detail, "happened", happened);
	dl_detail_jsonb(&detail, "evidence", evidence);
	dl_detail_text(&detail, "downstream_key",
				   dl_downstream_key(before->key, before->business_key, before->attempt));
	dl_detail_text(&detail, "previous_status", dl_status_name(before->status));
	dl_write_audit(before->run, before->key, AUDIT_RECONCILED, dl_detail_finish(&detail),
				   before->lease_epoch, before->attempt);
	dl_note_durable_write();
}

/*
 * A reconciler's finding of what the provider's record (looked up by the
 * attempt's downstream key) says of attempt: it happened, with evidence as
 * its result, or it did not, with evidence as its error -- then the next
 * call executes the next attempt, under a new provider key.  The tool's
 * lock is taken first (shared, as a call's: fixed until the transaction
 * ends), then the row is locked and judged; evidence of an outcome the
 * ledger has recorded otherwise is kept whatever the tool's setting, as a
 * report's is:
 *   - an attempt above the current one: an error, nothing written;
 *   - an earlier attempt: did not happen, no change; happened, a conflict
 *     (a recorded call's lost attempt: superseded);
 *   - completed or failed already (another reconciler, or a person, was
 *     first): the same finding, no change; the other one, a conflict;
 *   - started or unknown: a tool not reconcilable, a flagged or a started
 *     effect are errors; unknown, applied once the tool's grace has passed
 *     (else an error).
 * Returns the effect's row as it is now.
 */
HeapTuple
dl_reconcile(const char *key, int32 attempt, bool happened, Jsonb *evidence)
{
	EffectStatus found = happened ? EFFECT_COMPLETED : EFFECT_FAILED;
	EffectRow	peek;
	ToolRules	rules;
	LockedEffect locked;
	EffectRow	before;

	/*
	 * The tool's lock before the row's, in the order a call takes them (a
	 * key's tool never changes); a row another transaction is changing is
	 * locked first, to read it.
	 */
	switch (dl_read_key(key, &peek))
	{
		case KEY_ABSENT:
			dl_error_unknown_key(key);
			break;
		case KEY_FOUND:
			(void) dl_tool_rules(peek.tool, &rules);
			break;
		case KEY_BUSY:
			peek.tool = NULL;
			break;
	}
	if (!dl_lock_effect(key, &locked))
		dl_error_unknown_key(key);
	if (peek.tool == NULL)
		(void) dl_tool_rules(locked.row.tool, &rules);
	before = locked.row;

	if (attempt > before.attempt)
		dl_error_no_such_attempt(key, attempt, before.attempt);
	if (attempt < before.attempt)
		finding_on_past_attempt(&locked, attempt, happened, evidence);
	else if (before.status == EFFECT_COMPLETED || before.status == EFFECT_FAILED)
	{
		if (before.status != found)
			keep_contradicting_finding(&locked, before.run, before.lease_epoch, before.attempt,
									   happened, evidence, before.status, before.result,
									   before.error);
	}
	else
	{
		check_reconcilable(&before, &rules);
		check_grace_passed(&before, &rules);
		(void) dl_write_reconciled(&locked, happened, evidence);
		audit_reconciled(&before, happened, evidence);
	}
	return heap_copytuple(locked.tuple);
}

/*
 * From when attempt of key may be reconciled: false when it may not be at
 * all (no such effect, another attempt, not unknown, flagged, a tool not
 * reconcilable, no record of when it was found unknown).  Reads the row and
 * the registry as committed now, and writes nothing: a reconciler asks it
 * before it asks the provider, so that its lookup is made after the grace
 * (a lookup made earlier may miss a request still in flight).
 */
bool
dl_reconcilable_from(const char *key, int32 attempt, TimestampTz *from)
{
	EffectRow	row;
	ToolRules	rules;
	TimestampTz found_at;

	if (dl_read_key(key, &row) != KEY_FOUND || row.attempt != attempt ||
		row.status != EFFECT_UNKNOWN || row.conflict)
		return false;
	dl_tool_rules_now(row.tool, &rules);
	if (!rules.registered || !rules.row.reconcilable)
		return false;
	return reconcile_from(&row, &rules, &found_at, from);
}
