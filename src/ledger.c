/*
 * ledger.c: the SQL-callable ledger functions and the decisions they make.
 *
 * Uniqueness comes from the primary key of durable_ledger.effects: an intent
 * that may already exist is an INSERT ... ON CONFLICT DO NOTHING, and whoever
 * does not insert reads the row that is there and decides from it (decide()
 * says which intent cannot exist yet).  The lease only serialises the
 * occurrence counting of one run.  An outcome that nobody knows is never
 * guessed: it pauses the run until a person resolves it.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "storage/procarray.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/tuplestore.h"

#include "durable_ledger.h"

/*
 * The symbols carry the SQL version that declares them: a backend that still
 * has an older library loaded (connected before ALTER EXTENSION ... UPDATE)
 * then fails to find them, instead of applying older rules to newer tables.
 * The symbols of older declarations are in older_sql.c.
 */
PG_FUNCTION_INFO_V1(dl_begin_effect_1_1);
PG_FUNCTION_INFO_V1(dl_complete_effect_1_1);
PG_FUNCTION_INFO_V1(dl_fail_effect_1_1);
PG_FUNCTION_INFO_V1(dl_resolve_effect_1_1);
PG_FUNCTION_INFO_V1(dl_effect_status_1_1);
PG_FUNCTION_INFO_V1(dl_acquire_run_1_1);
PG_FUNCTION_INFO_V1(dl_release_run_1_1);
PG_FUNCTION_INFO_V1(dl_break_lease_1_1);

/* How often a decision is retried when the row changed under it. */
#define MAX_DECISION_ROUNDS 16

/* How long break_lease waits for the holder's backend to end. */
#define BREAK_LEASE_WAIT_MS 10000

static const char *const status_names[] = {
	[EFFECT_STARTED] = "started",
	[EFFECT_COMPLETED] = "completed",
	[EFFECT_FAILED] = "failed",
	[EFFECT_UNKNOWN] = "unknown",
};

const char *
dl_status_name(EffectStatus status)
{
	return status_names[status];
}

EffectStatus
dl_status_from_name(const char *name)
{
	int			i;

	for (i = 0; i < lengthof(status_names); i++)
		if (strcmp(name, status_names[i]) == 0)
			return (EffectStatus) i;
	elog(ERROR, "unrecognized effect status \"%s\"", name);
	return EFFECT_UNKNOWN;		/* keep compiler quiet */
}

static bool
jsonb_equal(Jsonb *a, Jsonb *b)
{
	if (a == NULL || b == NULL)
		return a == b;
	return compareJsonbContainers(&a->root, &b->root) == 0;
}

static void
spi_connect(void)
{
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

static void
spi_finish(void)
{
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
}

/*
 * The function's composite result type, looked up on its first call and kept
 * with its FmgrInfo for the calls that follow (a query calling it per row).
 */
static TupleDesc
result_desc(FunctionCallInfo fcinfo)
{
	TupleDesc	desc = (TupleDesc) fcinfo->flinfo->fn_extra;

	if (desc == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(fcinfo->flinfo->fn_mcxt);

		if (get_call_result_type(fcinfo, NULL, &desc) != TYPEFUNC_COMPOSITE)
			elog(ERROR, "function returning a row called in a context that cannot accept one");
		desc = BlessTupleDesc(desc);
		MemoryContextSwitchTo(old);
		fcinfo->flinfo->fn_extra = desc;
	}
	return desc;
}

/*
 * Every function that writes the ledger refuses a hot standby and a
 * read-only transaction first, before it takes any lock: a lease taken on a
 * standby would outlive its promotion.
 */
static void
check_writable(const char *function)
{
	if (RecoveryInProgress())
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot execute %s on a hot standby", function),
				 errdetail("A standby's ledger is a read-only copy; its leases and writes live on the primary."),
				 errhint("Connect to the primary server.")));
	if (XactReadOnly)
		ereport(ERROR,
				(errcode(ERRCODE_READ_ONLY_SQL_TRANSACTION),
				 errmsg("cannot execute %s in a read-only transaction", function)));
}

/*
 * A key that a report or a resolution names and that this transaction cannot
 * see: unknown, or (under REPEATABLE READ) recorded after the transaction's
 * snapshot, which is a reason to retry the transaction, not to give up.
 */
static void
report_unknown_key(const char *key)
{
	if (IsolationUsesXactSnapshot() && dl_store_effect_exists_now(key))
		ereport(ERROR,
				(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
				 errmsg("could not serialize access: effect \"%s\" was recorded after this transaction's snapshot", key),
				 errhint("Retry the transaction.")));
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("effect \"%s\" does not exist", key),
			 errhint("Keys come from durable_ledger.begin_effect().")));
}

/* An attempt that the effect has not reached: an error, nothing written. */
static void
report_no_such_attempt(const EffectRow *row, int32 attempt)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("effect \"%s\" has no attempt %d", row->key, attempt),
			 errdetail("Its current attempt is %d.", row->attempt),
			 errhint("Name the attempt that begin_effect() returned.")));
}

/* ======================================================================
 * begin_effect
 * ====================================================================== */

typedef enum DecisionKind
{
	DECIDE_EXECUTE,
	DECIDE_REPLAY,
	DECIDE_PAUSE,
	DECIDE_IN_PROGRESS
} DecisionKind;

static const char *const decision_names[] = {
	[DECIDE_EXECUTE] = "execute",
	[DECIDE_REPLAY] = "replay",
	[DECIDE_PAUSE] = "pause",
	[DECIDE_IN_PROGRESS] = "in_progress",
};

typedef struct Decision
{
	DecisionKind kind;
	EffectStatus status;
	int32		attempt;
	Jsonb	   *result;
	Jsonb	   *error;
	char	   *reason;
} Decision;

/* A business key names one operation: the same tool with the same args. */
static void
check_same_call(const NewIntent *intent, const char *canon, const EffectRow *row)
{
	StringInfoData recorded;

	if (strcmp(row->tool, intent->tool) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("business key \"%s\" is already used by a different call", intent->key),
				 errdetail("It was begun with tool \"%s\"; this call has tool \"%s\".",
						   row->tool, intent->tool),
				 errhint("A business key identifies one operation: the same tool with the same arguments.")));

	initStringInfo(&recorded);
	dl_append_canonical_args(&recorded, row->args);
	if (strcmp(recorded.data, canon) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("business key \"%s\" is already used by a different call", intent->key),
				 errdetail("It was begun with other arguments for tool \"%s\".", row->tool),
				 errhint("A business key identifies one operation: the same tool with the same arguments.")));
}

static void
audit_decision(const NewIntent *intent, const char *event, const Decision *d,
			   const char *detail_name, const char *detail_value)
{
	DetailBuilder detail;

	dl_detail_init(&detail);
	dl_detail_text(&detail, detail_name, detail_value);
	if (d->kind == DECIDE_EXECUTE)
		dl_detail_int(&detail, "attempt", d->attempt);
	dl_audit(intent->run, intent->key, event, dl_detail_finish(&detail),
			 intent->lease_epoch, d->attempt);
}

/* The intent is recorded: the caller performs the effect. */
static void
decide_execute(Decision *d, int32 attempt)
{
	d->kind = DECIDE_EXECUTE;
	d->status = EFFECT_STARTED;
	d->attempt = attempt;
	dl_note_durable_write();
}

/*
 * Decides what to do with intent, writing what the decision needs.  Uniqueness
 * comes from the primary key: the intent is an INSERT ... ON CONFLICT DO
 * NOTHING, and whoever does not insert reads the row that is there, with a
 * fresh snapshot, and changes it only with a conditional UPDATE that re-checks
 * what was read, so concurrent reports are never overwritten.
 *
 * A derived key is only ever written under its run's lease, which this
 * session holds.  It is looked up as a unique check looks: when no version of
 * it exists, committed or in progress, it is inserted straight away (a
 * duplicate would still be a unique violation); when its current, committed
 * version is found, the decision is made from that.  (A first epoch is no
 * proof that the key is new: the run's row in durable_ledger.runs may have
 * been deleted or not restored while its effects were.)  Otherwise (a
 * business key, or a lookup that must go through SQL) the row is read
 * through SQL, and for a business key the INSERT comes first.
 */
static void
decide(const NewIntent *intent, const char *canon, Decision *d)
{
	int			round;
	KeyLookup	lookup = KEY_USE_SQL;
	EffectRow	found;

	if (!intent->business_key)
	{
		lookup = dl_direct_lookup(intent->key, &found);
		if (lookup == KEY_ABSENT)
		{
			dl_store_insert_new_intent(intent);
			decide_execute(d, 1);
			return;
		}
	}

	for (round = 0; round < MAX_DECISION_ROUNDS; round++)
	{
		EffectRow	row;

		if (round == 0 && lookup == KEY_FOUND)
			row = found;
		else if (!(round == 0 && !intent->business_key &&
				   dl_store_fetch_effect(intent->key, false, &row)))
		{
			if (dl_store_insert_intent(intent))
			{
				decide_execute(d, 1);
				return;
			}
			if (!dl_store_fetch_effect(intent->key, false, &row))
				continue;		/* the conflicting insert rolled back: try again */
		}

		if (intent->business_key)
			check_same_call(intent, canon, &row);

		d->status = row.status;
		d->attempt = row.attempt;

		if (row.conflict)
		{
			d->kind = DECIDE_PAUSE;
			d->reason = "contradicting reports about this effect were recorded; a person must resolve it with durable_ledger.resolve_effect()";
			audit_decision(intent, "pause", d, "cause", "conflict");
			return;
		}

		switch (row.status)
		{
			case EFFECT_COMPLETED:
				d->kind = DECIDE_REPLAY;
				d->result = row.result;
				d->reason = psprintf("the effect completed in an earlier attempt; its recorded result is returned and it must not be performed again");
				audit_decision(intent, "replay", d, "status", "completed");
				return;

			case EFFECT_FAILED:
				if (!intent->business_key)
				{
					d->kind = DECIDE_REPLAY;
					d->error = row.error;
					d->reason = "the effect failed in an earlier attempt; its recorded error is returned (call again for a new occurrence, or start a new run)";
					audit_decision(intent, "replay", d, "status", "failed");
					return;
				}
				if (dl_store_restart_business_key(intent, row.attempt))
				{
					decide_execute(d, row.attempt + 1);
					audit_decision(intent, "intent", d, "after", "failed");
					return;
				}
				continue;		/* changed under us: read again */

			case EFFECT_UNKNOWN:
				d->kind = DECIDE_PAUSE;
				d->reason = "the outcome of an earlier attempt is unknown: its intent was recorded and no completion arrived before its lease ended; a person must resolve it with durable_ledger.resolve_effect()";
				audit_decision(intent, "pause", d, "cause", "unknown");
				return;

			case EFFECT_STARTED:
				if (dl_lease_is_live(row.run, row.lease_epoch))
				{
					d->kind = DECIDE_IN_PROGRESS;
					if (strcmp(row.run, intent->run) == 0 && row.lease_epoch == intent->lease_epoch)
						d->reason = "this lease began this effect and has not reported its outcome yet; report it with complete_effect or fail_effect";
					else
						d->reason = psprintf("run \"%s\" is performing this effect right now under a live lease; ask again later",
											 row.run);
					audit_decision(intent, "in_progress", d, "holder_run", row.run);
					return;
				}
				if (dl_store_mark_unknown(&row))
				{
					d->kind = DECIDE_PAUSE;
					d->status = EFFECT_UNKNOWN;
					d->reason = "the outcome of an earlier attempt is unknown: its intent was recorded and no completion arrived before its lease ended; a person must resolve it with durable_ledger.resolve_effect()";
					audit_decision(intent, "pause", d, "cause", "lease ended");
					return;
				}
				continue;		/* completed or failed meanwhile: read again */
		}
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("effect \"%s\" kept changing while a decision was being made", intent->key),
			 errhint("Retry the call.")));
}

/*
 * begin_effect(run text, tool text, args jsonb, business_key text, meta jsonb)
 * RETURNS durable_ledger.decision
 */
Datum
dl_begin_effect_1_1(PG_FUNCTION_ARGS)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	char	   *tool = dl_required_text_arg(fcinfo, 1, "tool", DL_MAX_TOOL_CHARS);
	Jsonb	   *args = dl_required_jsonb_arg(fcinfo, 2, "args");
	char	   *business_key = NULL;
	MemoryContext call_cxt = CurrentMemoryContext;
	TupleDesc	desc;
	StringInfoData canon;
	NewIntent	intent;
	HeldRun    *held;
	CallCounter *counter = NULL;
	char		derived_key[DL_KEY_HEX_LEN + 1];
	Decision	d = {0};
	Datum		values[8];
	bool		nulls[8] = {false};
	HeapTuple	tuple;

	if (!PG_ARGISNULL(3))
	{
		business_key = dl_required_text_arg(fcinfo, 3, "business_key",
											DL_MAX_BUSINESS_KEY_CHARS);
		dl_check_business_key(business_key);
	}
	desc = result_desc(fcinfo);
	check_writable("begin_effect()");

	initStringInfo(&canon);
	dl_append_canonical_args(&canon, args);

	spi_connect();
	held = dl_lease_for_call(run);

	intent.run = run;
	intent.tool = tool;
	intent.args = args;
	intent.meta = dl_optional_jsonb_arg(fcinfo, 4);
	intent.lease_epoch = dl_lease_epoch(held);
	intent.business_key = business_key != NULL;
	if (business_key != NULL)
	{
		intent.key = business_key;
		intent.occurrence = 0;
	}
	else
	{
		counter = dl_lease_call_counter(held, tool, canon.data, canon.len,
										&intent.occurrence);
		dl_derive_key(run, tool, canon.data, canon.len, intent.occurrence, derived_key);
		intent.key = derived_key;
	}

	decide(&intent, canon.data, &d);

	/*
	 * A paused call did not happen: it does not use up its occurrence, so
	 * asking again in this epoch asks about the same effect (pause until a
	 * person resolves it, then its outcome) and never executes a new one.
	 */
	if (counter != NULL && d.kind != DECIDE_PAUSE)
		dl_lease_count_call(held, counter);

	/* form the answer where it outlives SPI_finish */
	values[0] = CStringGetTextDatum(intent.key);
	values[1] = CStringGetTextDatum(decision_names[d.kind]);
	values[2] = CStringGetTextDatum(dl_status_name(d.status));
	values[3] = Int32GetDatum(intent.occurrence);
	nulls[3] = intent.business_key;
	values[4] = Int32GetDatum(d.attempt);
	values[5] = PointerGetDatum(d.result);
	nulls[5] = d.result == NULL;
	values[6] = PointerGetDatum(d.error);
	nulls[6] = d.error == NULL;
	values[7] = d.reason ? CStringGetTextDatum(d.reason) : (Datum) 0;
	nulls[7] = d.reason == NULL;
	MemoryContextSwitchTo(call_cxt);
	tuple = heap_form_tuple(desc, values, nulls);
	spi_finish();

	PG_RETURN_DATUM(HeapTupleGetDatum(tuple));
}

/* ======================================================================
 * complete_effect, fail_effect: reports from the worker
 * ====================================================================== */

/*
 * The effects row that complete_effect, fail_effect and resolve_effect
 * return: row when the caller has it already, else read by key.
 */
static Datum
return_effect_row(FunctionCallInfo fcinfo, const char *key, HeapTuple row)
{
	TupleDesc	desc = result_desc(fcinfo);

	if (row == NULL)
		row = dl_store_effect_tuple(key, false, desc);
	if (row == NULL)
		report_unknown_key(key);
	return PointerGetDatum(SPI_returntuple(row, desc));
}

/*
 * Keeps a report that contradicts the record of attempt (its run and epoch):
 * never applied, never lost.  The effect is flagged, so that it waits for a
 * person.  Raising an error would roll the evidence back, so the caller gets
 * a WARNING.  run is NULL (and attempt 0) when the report cannot be matched
 * to an attempt.
 */
static void
keep_conflict(const EffectRow *row, const char *run, int64 lease_epoch, int32 attempt,
			  EffectStatus reported, Jsonb *value, EffectStatus recorded_status,
			  Jsonb *recorded_result, Jsonb *recorded_error, const char *why)
{
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
	dl_audit(run, row->key, "conflict", dl_detail_finish(&detail), lease_epoch, attempt);
	dl_store_set_conflict(row->key);
	dl_note_durable_write();
}

/* A report that contradicts what is recorded for the current attempt. */
static void
record_conflict(const EffectRow *row, EffectStatus reported, Jsonb *value)
{
	keep_conflict(row, row->run, row->lease_epoch, row->attempt, reported, value,
				  row->status, row->result, row->error, NULL);
	ereport(WARNING,
			(errmsg("report \"%s\" for effect \"%s\" contradicts its recorded outcome",
					dl_status_name(reported), row->key),
			 errdetail("The effect is recorded as %s. The report was kept in the audit log as a conflict and the effect is flagged for a person; nothing else changed.",
					   dl_status_name(row->status)),
			 errhint("A person resolves it with durable_ledger.resolve_effect().")));
}

/*
 * A report on an earlier attempt of a business key, which a later attempt
 * replaced: it never changes the current attempt.  A replaced attempt has
 * failed; the same failure reported again changes nothing, anything else
 * (a completion: the operation may have happened twice) is kept as a
 * conflict, filed under the run and epoch of the attempt it is about.
 */
static void
report_on_past_attempt(const EffectRow *row, int32 attempt, EffectStatus reported,
					   Jsonb *value)
{
	PastAttempt past;

	if (!dl_store_fetch_past_attempt(row->key, attempt, &past))
	{
		/* not on record (an upgraded ledger whose log lacked it): it failed */
		past.run = NULL;
		past.lease_epoch = 0;
		past.status = EFFECT_FAILED;
		past.error = value;
	}
	if (reported == past.status && jsonb_equal(past.error, value))
		return;

	keep_conflict(row, past.run, past.lease_epoch, attempt, reported, value,
				  past.status, NULL, past.error, NULL);
	ereport(WARNING,
			(errmsg("report \"%s\" for attempt %d of effect \"%s\" contradicts its recorded outcome",
					dl_status_name(reported), attempt, row->key),
			 errdetail("Attempt %d is recorded as %s and attempt %d has started since. The report was kept in the audit log as a conflict and the effect is flagged for a person; nothing else changed.",
					   attempt, dl_status_name(past.status), row->attempt),
			 errhint("A person resolves it with durable_ledger.resolve_effect().")));
}

/*
 * A report that names no attempt, on a business key whose current attempt
 * is not the first and was not started by the lease this session holds now:
 * it may be a late report on an earlier attempt, so it is never applied.
 */
static void
report_on_unnamed_attempt(const EffectRow *row, EffectStatus reported, Jsonb *value)
{
	keep_conflict(row, NULL, 0, 0, reported, value, row->status, NULL, NULL,
				  "the report named no attempt, and the current attempt is not the first");
	ereport(WARNING,
			(errmsg("report \"%s\" for effect \"%s\" names no attempt, and the effect is at attempt %d",
					dl_status_name(reported), row->key, row->attempt),
			 errdetail("It may concern an earlier attempt, so it was not applied: it was kept in the audit log as a conflict and the effect is flagged for a person."),
			 errhint("Pass the attempt that begin_effect() returned. A person resolves this one with durable_ledger.resolve_effect().")));
}

/* Logs a report that was applied: on time, or late (its lease had ended). */
static void
audit_applied_report(const char *key, const char *run, int64 lease_epoch, int32 attempt,
					 EffectStatus before, EffectStatus reported, Jsonb *value)
{
	bool		late = before == EFFECT_UNKNOWN || !dl_lease_is_live(run, lease_epoch);
	const char *event;
	Jsonb	   *detail_value = NULL;

	if (reported == EFFECT_COMPLETED)
		event = late ? "late_completion" : "completed";
	else
		event = late ? "late_failure" : "failed";
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
	dl_audit(run, key, event, detail_value, lease_epoch, attempt);
	dl_note_durable_write();
}

/*
 * A worker's report that attempt (0: not named) of the effect ended as
 * reported (completed or failed).  The common case, a started effect at the
 * attempt reported on, is one update (direct.c); anything else is read under
 * a row lock and judged:
 *   - an attempt above the current one: an error, nothing written;
 *   - an earlier attempt: never applied (report_on_past_attempt);
 *   - no attempt named, a business key past its first attempt, and not the
 *     lease that started that attempt: never applied (a conflict);
 *   - otherwise the current attempt: started or unknown → applied (late when
 *     its lease has ended), the same report again → no change, a
 *     contradiction → a conflict.
 */
static Datum
report_outcome(FunctionCallInfo fcinfo, EffectStatus reported)
{
	char	   *key = dl_required_text_arg(fcinfo, 0, "key", 0);
	Jsonb	   *value = dl_optional_jsonb_arg(fcinfo, 1);
	Jsonb	   *result_value = reported == EFFECT_COMPLETED ? value : NULL;
	Jsonb	   *error_value = reported == EFFECT_FAILED ? value : NULL;
	int32		attempt = 0;
	EffectRow	row;
	HeapTuple	finished;
	char	   *run;
	int64		lease_epoch;
	int32		finished_attempt;
	Datum		result;

	attempt = dl_optional_attempt_arg(fcinfo, 2);
	check_writable(reported == EFFECT_COMPLETED ? "complete_effect()" : "fail_effect()");

	spi_connect();
	finished = dl_store_finish(key, EFFECT_STARTED, reported, result_value, error_value,
							   attempt, &run, &lease_epoch, &finished_attempt);
	if (finished != NULL)
		audit_applied_report(key, run, lease_epoch, finished_attempt, EFFECT_STARTED,
							 reported, value);
	else
	{
		if (!dl_store_fetch_effect(key, true, &row))
			report_unknown_key(key);

		if (attempt > row.attempt)
			report_no_such_attempt(&row, attempt);
		if (attempt != 0 && attempt < row.attempt)
			report_on_past_attempt(&row, attempt, reported, value);
		else if (attempt == 0 && row.business_key && row.attempt > 1 &&
				 !(dl_lease_is_mine(row.run, row.lease_epoch) &&
				   !dl_store_lease_began_past_attempt(key, row.run, row.lease_epoch)))
			report_on_unnamed_attempt(&row, reported, value);
		else if (row.status == EFFECT_STARTED || row.status == EFFECT_UNKNOWN)
		{
			finished = dl_store_finish(key, row.status, reported, result_value, error_value,
									   row.attempt, &run, &lease_epoch, &finished_attempt);
			if (finished == NULL)
				elog(ERROR, "effect \"%s\" changed while locked", key);
			audit_applied_report(key, row.run, row.lease_epoch, row.attempt, row.status,
								 reported, value);
		}
		else if (row.status == reported &&
				 jsonb_equal(reported == EFFECT_COMPLETED ? row.result : row.error, value))
		{
			/* the same report again (a retry after a network error): no change */
		}
		else
			record_conflict(&row, reported, value);
	}

	result = return_effect_row(fcinfo, key, finished);
	spi_finish();
	PG_RETURN_DATUM(result);
}

/* complete_effect(key text, result jsonb, attempt integer) RETURNS durable_ledger.effects */
Datum
dl_complete_effect_1_1(PG_FUNCTION_ARGS)
{
	return report_outcome(fcinfo, EFFECT_COMPLETED);
}

/* fail_effect(key text, error jsonb, attempt integer) RETURNS durable_ledger.effects */
Datum
dl_fail_effect_1_1(PG_FUNCTION_ARGS)
{
	return report_outcome(fcinfo, EFFECT_FAILED);
}

/* ======================================================================
 * resolve_effect: a person's decision
 * ====================================================================== */

/*
 * resolve_effect(key text, outcome text, result jsonb, resolved_by text,
 *                note text, attempt integer) RETURNS durable_ledger.effects
 *
 * A decision is prepared from what a person saw (unresolved lists the
 * attempt): with attempt, it applies only while that attempt is current, so
 * a decision about attempt 2 never lands on an attempt 3 begun meanwhile.
 */
Datum
dl_resolve_effect_1_1(PG_FUNCTION_ARGS)
{
	char	   *key = dl_required_text_arg(fcinfo, 0, "key", 0);
	char	   *outcome = dl_required_text_arg(fcinfo, 1, "outcome", 0);
	Jsonb	   *value = dl_optional_jsonb_arg(fcinfo, 2);
	char	   *resolved_by = dl_required_text_arg(fcinfo, 3, "resolved_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 4);
	int32		attempt = dl_optional_attempt_arg(fcinfo, 5);
	EffectStatus to;
	EffectRow	row;
	bool		needs_person;
	DetailBuilder detail;
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
	check_writable("resolve_effect()");

	spi_connect();
	if (!dl_store_fetch_effect(key, true, &row))
		report_unknown_key(key);
	if (attempt > row.attempt)
		report_no_such_attempt(&row, attempt);
	if (attempt != 0 && attempt < row.attempt)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("attempt %d of effect \"%s\" was replaced by attempt %d", attempt, key, row.attempt),
				 errdetail("A resolution decides the current attempt; this one was prepared for an earlier attempt."),
				 errhint("Look at durable_ledger.unresolved again.")));

	needs_person = row.conflict || row.status == EFFECT_UNKNOWN;
	if (row.status == EFFECT_STARTED || row.status == EFFECT_UNKNOWN)
	{
		if (dl_lease_is_live(row.run, row.lease_epoch))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("effect \"%s\" is in flight under a live lease", key),
					 errdetail("Run \"%s\" holds the lease that started it; its worker will report the outcome.", row.run),
					 errhint("Wait for the worker, or end its lease with durable_ledger.break_lease() first.")));
		needs_person = true;
	}
	if (!needs_person)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("effect \"%s\" is %s and needs no resolution", key, dl_status_name(row.status)),
				 errdetail("Only an effect whose outcome is unknown, or that carries a conflict flag, can be resolved.")));

	dl_store_resolve(key, to, value, resolved_by, note);

	dl_detail_init(&detail);
	dl_detail_text(&detail, "outcome", outcome);
	dl_detail_jsonb(&detail, to == EFFECT_COMPLETED ? "result" : "error", value);
	dl_detail_text(&detail, "resolved_by", resolved_by);
	dl_detail_text(&detail, "note", note);
	dl_detail_text(&detail, "previous_status",
				   dl_status_name(row.status == EFFECT_STARTED ? EFFECT_UNKNOWN : row.status));
	dl_detail_jsonb(&detail, "previous_result", row.result);
	dl_detail_jsonb(&detail, "previous_error", row.error);
	dl_detail_bool(&detail, "conflict_cleared", row.conflict);
	dl_audit(row.run, key, "resolved", dl_detail_finish(&detail), row.lease_epoch, row.attempt);
	dl_note_durable_write();

	result = return_effect_row(fcinfo, key, NULL);
	spi_finish();
	PG_RETURN_DATUM(result);
}

/* ======================================================================
 * effect_status: look, never write
 * ====================================================================== */

/* effect_status(key text) RETURNS SETOF durable_ledger.effects */
Datum
dl_effect_status_1_1(PG_FUNCTION_ARGS)
{
	char	   *key = dl_required_text_arg(fcinfo, 0, "key", 0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HeapTuple	tuple;

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);

	spi_connect();
	tuple = dl_store_effect_tuple(key, true, rsinfo->setDesc);
	if (tuple != NULL)
		tuplestore_puttuple(rsinfo->setResult, tuple);
	spi_finish();

	return (Datum) 0;
}

/* ======================================================================
 * Leases
 * ====================================================================== */

/* acquire_run(run text, wait boolean) RETURNS boolean */
Datum
dl_acquire_run_1_1(PG_FUNCTION_ARGS)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	bool		acquired;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("wait must not be null")));
	check_writable("acquire_run()");

	spi_connect();
	acquired = dl_lease_acquire(run, PG_GETARG_BOOL(1));
	spi_finish();
	PG_RETURN_BOOL(acquired);
}

/* release_run(run text) RETURNS boolean */
Datum
dl_release_run_1_1(PG_FUNCTION_ARGS)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	bool		released;

	check_writable("release_run()");
	spi_connect();
	released = dl_lease_release(run);
	spi_finish();
	PG_RETURN_BOOL(released);
}

/*
 * break_lease follows pg_terminate_backend's own rule: only a superuser ends
 * a superuser's session.  The function runs as the extension's owner, so the
 * caller is the role as after SET ROLE, as the audit log records it.
 */
static void
check_may_terminate(int holder, const char *run)
{
	PGPROC	   *proc = BackendPidGetProc(holder);

	if (proc != NULL && superuser_arg(proc->roleId) && !superuser_arg(GetOuterUserId()))
		ereport(ERROR,
				(errcode(ERRCODE_INSUFFICIENT_PRIVILEGE),
				 errmsg("permission denied to break the lease on run \"%s\"", run),
				 errdetail("Its holder is a superuser's session; only a superuser may terminate it.")));
}

/* break_lease(run text, broken_by text, note text) RETURNS boolean */
Datum
dl_break_lease_1_1(PG_FUNCTION_ARGS)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	char	   *broken_by = dl_required_text_arg(fcinfo, 1, "broken_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 2);
	int			holder;
	bool		terminated;
	DetailBuilder detail;
	int64		epoch = 0;
	bool		released;
	int			epoch_holder;

	check_writable("break_lease()");
	spi_connect();
	holder = dl_store_lease_holder_pid(dl_run_lock_key(run));
	if (holder == 0)
	{
		spi_finish();
		PG_RETURN_BOOL(false);
	}
	if (holder == MyProcPid)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("this session holds the lease on run \"%s\"", run),
				 errhint("Use durable_ledger.release_run() to release it.")));
	check_may_terminate(holder, run);

	terminated = DatumGetBool(DirectFunctionCall2(pg_terminate_backend,
												  Int32GetDatum(holder),
												  Int64GetDatum(BREAK_LEASE_WAIT_MS)));

	(void) dl_store_run_state(run, &epoch, &released, &epoch_holder);
	dl_detail_init(&detail);
	dl_detail_text(&detail, "broken_by", broken_by);
	dl_detail_text(&detail, "note", note);
	dl_detail_int(&detail, "holder_pid", holder);
	dl_detail_bool(&detail, "terminated", terminated);
	dl_audit(run, NULL, "lease_broken", dl_detail_finish(&detail), epoch, 0);
	dl_note_durable_write();
	spi_finish();

	PG_RETURN_BOOL(terminated);
}
