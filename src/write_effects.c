/*
 * write_effects.c: the rows of durable_ledger.effects (an intent, an
 * outcome, a next attempt, a resolution, a forked effect) and of
 * durable_ledger.unsettled, which follows them, and past_attempts.
 *
 * The one statement that needs ON CONFLICT (a business key's intent, which
 * runs that share the key may insert at once) is SQL, with a saved plan.
 */
#include "postgres.h"

#include "access/table.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "rows.h"

/* ---------- unsettled: the effects that are not settled yet ---------- */

/*
 * durable_ledger.unsettled holds (created_at, key) of every effect that is
 * started (but a recorded call's, which begin_recorded executes again if its
 * lease ends: nobody decides anything), unknown or flagged: the only ones a
 * person may have to look at, found without reading the settled millions
 * (the unresolved view, the metrics).  A partial index on effects would list
 * them too, but its predicate (status) changes when an effect completes,
 * which makes every completion a non-HOT update of every index of effects.
 * Keyed by the effect's created_at first, a new row goes to the right edge
 * of the index and a completion finds it among the newest pages
 * (docs/design.md, "What waits for a person").  Its rows change with the effect's row, under that
 * row's lock; one whose effect was deleted by hand matches no effect.
 */
static bool
is_unsettled(const EffectRow *row)
{
	if (row->conflict || row->status == EFFECT_UNKNOWN ||
		row->status == EFFECT_AWAITING_APPROVAL)
		return true;
	return row->status == EFFECT_STARTED && !row->safe_to_redo;
}

static const int unsettled_key[2] = {UNS_CREATED_AT, UNS_KEY};

/* An unsettled row's primary key, in the order of unsettled_key. */
static void
unsettled_values(Datum *values, const char *key, TimestampTz created_at)
{
	values[0] = TimestampTzGetDatum(created_at);
	values[1] = CStringGetTextDatum(key);
}

/*
 * An intent's row is new (its created_at was just taken); an effect that
 * becomes unsettled again keeps its created_at (a flagged report), so a row
 * left by a writer that did not keep unsettled (a backend still running an
 * older library while the extension was updated) may already say it: then
 * it is kept, and the report is never lost to a duplicate key.
 */
static void
add_unsettled(const char *key, TimestampTz created_at, bool may_exist)
{
	Datum		values[2];
	RowWrite		w;

	if (may_exist && dl_read_unsettled_tuple(key, created_at) != NULL)
		return;
	unsettled_values(values, key, created_at);
	dl_row_begin(&w, &dl_unsettled_table);
	dl_row_set(&w, UNS_CREATED_AT, values[0]);
	dl_row_set(&w, UNS_KEY, values[1]);
	dl_row_insert(&w);
	dl_row_end(&w);
}

static void
remove_unsettled(const char *key, TimestampTz created_at)
{
	Datum		values[2];
	RowWrite		w;
	HeapTuple	tuple;

	tuple = dl_read_unsettled_tuple(key, created_at);	/* not locked: see there */
	if (tuple == NULL)
		return;
	unsettled_values(values, key, created_at);
	dl_row_lookup(&w, &dl_unsettled_table);
	dl_row_delete(&w, tuple, 2, unsettled_key, values);
	dl_row_end(&w);
}

/* An effects row went from before to after: unsettled follows it. */
static void
follow_settlement(const EffectRow *before, const EffectRow *after)
{
	bool		was = before != NULL && is_unsettled(before);
	bool		now = is_unsettled(after);
	bool		moved = was && now && before->created_at != after->created_at;

	if (was && (!now || moved))
		remove_unsettled(before->key, before->created_at);
	if (now && (!was || moved))
		add_unsettled(after->key, after->created_at, true);
}

/* ---------- effects ---------- */

static EffectStatus
intent_status(const NewIntent *intent)
{
	return intent->awaiting_approval ? EFFECT_AWAITING_APPROVAL : EFFECT_STARTED;
}

/*
 * The columns an attempt has when it starts: its run and attempt, its args
 * (a tool's key fields leave some out of the key, and what an approver
 * decides on is what the attempt executes), status started (or
 * awaiting_approval), no outcome, the intent's meta, lease epoch and this
 * backend, begun now, nobody's resolution yet.  Shared by a new intent, a
 * next attempt and an approved call that starts, which keeps its approval
 * and the args approved (keep_approval).
 */
static void
set_attempt_started(RowWrite *w, const NewIntent *intent, int32 attempt, bool keep_approval)
{
	if (!keep_approval)
		dl_row_set(w, EFF_ARGS, JsonbPGetDatum(intent->args));
	dl_row_set(w, EFF_RUN, CStringGetTextDatum(intent->run));
	dl_row_set(w, EFF_ATTEMPT, Int32GetDatum(attempt));
	dl_row_set(w, EFF_STATUS, CStringGetTextDatum(dl_status_name(intent_status(intent))));
	dl_row_set_null(w, EFF_RESULT);
	dl_row_set_null(w, EFF_ERROR);
	dl_row_set_optional(w, EFF_META, JsonbPGetDatum(intent->meta), intent->meta == NULL);
	dl_row_set(w, EFF_LEASE_EPOCH, Int64GetDatum(intent->lease_epoch));
	dl_row_set(w, EFF_HOLDER_PID, Int32GetDatum(MyProcPid));
	dl_row_set(w, EFF_CREATED_AT, dl_row_now());
	dl_row_set_null(w, EFF_COMPLETED_AT);
	dl_row_set_null(w, EFF_RESOLVED_BY);
	dl_row_set_null(w, EFF_RESOLUTION_NOTE);
	dl_row_set(w, EFF_EXECUTE_AGAIN, BoolGetDatum(false));
	dl_row_set(w, EFF_LOCAL, BoolGetDatum(intent->local));
	if (keep_approval)
		return;
	dl_row_set_optional(w, EFF_APPROVAL, CStringGetTextDatum("requested"),
						!intent->awaiting_approval);
	dl_row_set_null(w, EFF_APPROVER);
	dl_row_set_null(w, EFF_APPROVAL_NOTE);
}

/*
 * Inserts the intent of a key that cannot exist yet.  A duplicate would be a
 * unique violation (an error), never a second intent.
 */
void
dl_write_new_intent(const NewIntent *intent)
{
	RowWrite		w;
	EffectRow	stored = {0};	/* what is_unsettled reads of the new row */

	dl_row_begin(&w, &dl_effects_table);
	dl_row_set(&w, EFF_KEY, CStringGetTextDatum(intent->key));
	dl_row_set(&w, EFF_TOOL, CStringGetTextDatum(intent->tool));
	dl_row_set(&w, EFF_BUSINESS_KEY, BoolGetDatum(intent->business_key));
	dl_row_set_optional(&w, EFF_OCCURRENCE, Int32GetDatum(intent->occurrence), intent->business_key);
	set_attempt_started(&w, intent, 1, false);
	dl_row_set(&w, EFF_CONFLICT, BoolGetDatum(false));
	dl_row_set(&w, EFF_SAFE_TO_REDO, BoolGetDatum(intent->safe_to_redo));
	dl_row_insert(&w);
	/* as stored: a BEFORE ROW trigger may have changed it */
	stored.status = intent_status(intent);
	stored.created_at = DatumGetTimestampTz(dl_row_stored(&w, EFF_CREATED_AT));
	stored.safe_to_redo = DatumGetBool(dl_row_stored(&w, EFF_SAFE_TO_REDO));
	dl_row_end(&w);
	if (is_unsettled(&stored))
		add_unsettled(intent->key, stored.created_at, false);	/* a new key: not there */
}

/* A business key's intent, unless the key exists. */
static Statement insert_intent_unless_exists = {
	"INSERT INTO durable_ledger.effects"
	" (key, run, tool, args, business_key, occurrence, attempt, status, meta,"
	"  lease_epoch, holder_pid, created_at, local, approval)"
	" VALUES ($1, $2, $3, $4, $5, $6, 1, $10, $7, $8,"
	"  pg_catalog.pg_backend_pid(), pg_catalog.clock_timestamp(), $9, $11)"
	" ON CONFLICT (key) DO NOTHING RETURNING created_at, key",
	11, {TEXTOID, TEXTOID, TEXTOID, JSONBOID, BOOLOID, INT4OID, JSONBOID, INT8OID, BOOLOID,
	TEXTOID, TEXTOID}
};

/*
 * ON CONFLICT DO NOTHING inserted nothing: because the key exists, or
 * because a BEFORE ROW trigger skipped the row (then no version of the key
 * exists, not even one being inserted).
 */
static bool
insert_was_skipped(const char *key)
{
	Relation	rel = dl_open_table(&dl_effects_table, RowExclusiveLock);
	bool		before_row_triggers = rel->trigdesc != NULL &&
		rel->trigdesc->trig_insert_before_row;
	EffectRow	row;

	table_close(rel, NoLock);
	return before_row_triggers && dl_read_key(key, &row) == KEY_ABSENT;
}

/*
 * Inserts an intent (as INSERT ... ON CONFLICT DO NOTHING): false when the
 * key exists (also when another transaction inserts it at the
 * same moment).  Needs an open SPI connection.
 */
bool
dl_write_intent_unless_exists(const NewIntent *intent)
{
	Datum		values[11];
	char		nulls[11] = "           ";

	values[0] = dl_text_datum(intent->key);
	values[1] = dl_text_datum(intent->run);
	values[2] = dl_text_datum(intent->tool);
	values[3] = JsonbPGetDatum(intent->args);
	values[4] = BoolGetDatum(intent->business_key);
	values[5] = Int32GetDatum(intent->occurrence);
	if (intent->business_key)
		nulls[5] = 'n';
	values[6] = PointerGetDatum(intent->meta);
	if (intent->meta == NULL)
		nulls[6] = 'n';
	values[7] = Int64GetDatum(intent->lease_epoch);
	values[8] = BoolGetDatum(intent->local);
	values[9] = dl_text_datum(dl_status_name(intent_status(intent)));
	values[10] = dl_text_datum("requested");
	if (!intent->awaiting_approval)
		nulls[10] = 'n';
	dl_note_ledger_write();
	if (dl_plan_run(&insert_intent_unless_exists, values, nulls, SPI_OK_INSERT_RETURNING) == 1)
	{
		HeapTuple	stored = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		/* as stored: a BEFORE ROW trigger may have changed it */
		if (strcmp(TextDatumGetCString(SPI_getbinval(stored, desc, 2, &isnull)), intent->key) != 0)
			dl_row_report_changed_key(&dl_effects_table);
		add_unsettled(intent->key, DatumGetTimestampTz(SPI_getbinval(stored, desc, 1, &isnull)),
					  false);
		return true;
	}
	if (insert_was_skipped(intent->key))
		dl_row_report_skipped(&dl_effects_table, "INSERT");
	return false;
}

/*
 * Locks key's row of effects for this transaction, after any transaction
 * changing it has ended; false when there is no such key.  The row is its
 * latest committed version, whatever the transaction's snapshot.
 */
bool
dl_lock_effect(const char *key, LockedEffect *locked)
{
	RowWrite		w;
	bool		found;

	dl_row_lookup(&w, &dl_effects_table);
	found = dl_row_lock(&w, CStringGetTextDatum(key), EFF_KEY, &locked->tuple);
	if (found)
	{
		TupleTableSlot *slot = MakeSingleTupleTableSlot(RelationGetDescr(w.rel),
														&TTSOpsHeapTuple);

		ExecStoreHeapTuple(locked->tuple, slot, false);
		dl_effect_row_from_slot(slot, &locked->row);
		ExecDropSingleTupleTableSlot(slot);
	}
	dl_row_end(&w);
	return found;
}

/*
 * Starts an update of the locked effects row: the new row's values are the
 * locked version's, to be changed with dl_row_set().
 */
static void
begin_effect_update(RowWrite *w, LockedEffect *locked)
{
	dl_row_begin(w, &dl_effects_table);
	dl_row_start_from(w, locked->tuple);
}

/*
 * Writes the update begun with begin_effect_update and returns the new row
 * (in the caller's memory); the locked version becomes the new one.
 */
static HeapTuple
end_effect_update(RowWrite *w, LockedEffect *locked)
{
	HeapTuple	updated;
	EffectRow	before = locked->row;

	dl_row_update(w, locked->tuple);
	updated = ExecCopySlotHeapTuple(w->slot);
	updated->t_self = w->slot->tts_tid;
	locked->tuple = updated;
	dl_effect_row_from_slot(w->slot, &locked->row);
	dl_row_end(w);
	follow_settlement(&before, &locked->row);
	return heap_copytuple(updated);
}

/* started or unknown -> to: the reported (or resolved) outcome. */
HeapTuple
dl_write_outcome(LockedEffect *locked, EffectStatus to, Jsonb *result, Jsonb *error)
{
	RowWrite		w;

	begin_effect_update(&w, locked);
	dl_row_set(&w, EFF_STATUS, CStringGetTextDatum(dl_status_name(to)));
	dl_row_set_optional(&w, EFF_RESULT, JsonbPGetDatum(result), result == NULL);
	dl_row_set_optional(&w, EFF_ERROR, JsonbPGetDatum(error), error == NULL);
	dl_row_set(&w, EFF_COMPLETED_AT, dl_row_now());
	return end_effect_update(&w, locked);
}

/* started -> unknown: its lease ended without a report. */
void
dl_write_unknown(LockedEffect *locked)
{
	RowWrite		w;

	begin_effect_update(&w, locked);
	dl_row_set(&w, EFF_STATUS, CStringGetTextDatum(dl_status_name(EFFECT_UNKNOWN)));
	(void) end_effect_update(&w, locked);
}

/* A contradicting report was kept: the effect waits for a person. */
void
dl_write_conflict_flag(LockedEffect *locked)
{
	RowWrite		w;

	begin_effect_update(&w, locked);
	dl_row_set(&w, EFF_CONFLICT, BoolGetDatum(true));
	(void) end_effect_update(&w, locked);
}

/* A person's decision: the outcome, who decided, and the flag cleared. */
HeapTuple
dl_write_resolution(LockedEffect *locked, EffectStatus to, Jsonb *value,
					const char *resolved_by, const char *note)
{
	RowWrite		w;

	begin_effect_update(&w, locked);
	dl_row_set(&w, EFF_STATUS, CStringGetTextDatum(dl_status_name(to)));
	/* the value is the result of a completed effect, the error of a failed one */
	dl_row_set_optional(&w, EFF_RESULT, JsonbPGetDatum(value), to != EFFECT_COMPLETED || value == NULL);
	dl_row_set_optional(&w, EFF_ERROR, JsonbPGetDatum(value), to != EFFECT_FAILED || value == NULL);
	dl_row_set(&w, EFF_RESOLVED_BY, CStringGetTextDatum(resolved_by));
	dl_row_set_optional(&w, EFF_RESOLUTION_NOTE, note ? CStringGetTextDatum(note) : (Datum) 0,
				 note == NULL);
	dl_row_set(&w, EFF_CONFLICT, BoolGetDatum(false));
	dl_row_set(&w, EFF_COMPLETED_AT, dl_row_now());
	dl_row_set(&w, EFF_EXECUTE_AGAIN, BoolGetDatum(false));
	return end_effect_update(&w, locked);
}

/*
 * A person found that the current attempt did not happen and asked for it to
 * be made again (retry_effect): it is failed -- keeping the error it was
 * reported with, if it failed already --, any conflict flag is cleared, who
 * decided is recorded, and the next call executes the next attempt.
 */
HeapTuple
dl_write_retry(LockedEffect *locked, const char *resolved_by, const char *note)
{
	RowWrite		w;

	begin_effect_update(&w, locked);
	if (locked->row.status != EFFECT_FAILED)
	{
		dl_row_set(&w, EFF_STATUS, CStringGetTextDatum(dl_status_name(EFFECT_FAILED)));
		dl_row_set_null(&w, EFF_RESULT);
		dl_row_set_null(&w, EFF_ERROR);
		dl_row_set(&w, EFF_COMPLETED_AT, dl_row_now());
	}
	dl_row_set(&w, EFF_RESOLVED_BY, CStringGetTextDatum(resolved_by));
	dl_row_set_optional(&w, EFF_RESOLUTION_NOTE, note ? CStringGetTextDatum(note) : (Datum) 0,
						note == NULL);
	dl_row_set(&w, EFF_CONFLICT, BoolGetDatum(false));
	dl_row_set(&w, EFF_EXECUTE_AGAIN, BoolGetDatum(true));
	return end_effect_update(&w, locked);
}

/*
 * A reconciler's finding from the provider's record, on an unknown effect:
 * it happened (completed, with the provider's record as its result) or it
 * did not (failed, with the provider's answer as its error, and the next
 * call executes the next attempt).  Nobody is named as resolving it: the
 * audit row names the worker's role.
 */
HeapTuple
dl_write_reconciled(LockedEffect *locked, bool happened, Jsonb *evidence)
{
	RowWrite		w;

	begin_effect_update(&w, locked);
	dl_row_set(&w, EFF_STATUS,
			   CStringGetTextDatum(dl_status_name(happened ? EFFECT_COMPLETED : EFFECT_FAILED)));
	dl_row_set_optional(&w, EFF_RESULT, JsonbPGetDatum(evidence), !happened);
	dl_row_set_optional(&w, EFF_ERROR, JsonbPGetDatum(evidence), happened);
	dl_row_set(&w, EFF_COMPLETED_AT, dl_row_now());
	dl_row_set(&w, EFF_EXECUTE_AGAIN, BoolGetDatum(!happened));
	return end_effect_update(&w, locked);
}

/*
 * An effect's next attempt: the current one is kept in past_attempts (with
 * status replaced_as: a failed business key's as failed, a recorded call's
 * whose lease ended without a report as unknown; and its args), and the
 * effect starts again under intent's lease, with intent's args.
 */
void
dl_write_next_attempt(LockedEffect *locked, const NewIntent *intent, EffectStatus replaced_as)
{
	RowWrite		past;
	RowWrite		w;
	TupleTableSlot *old_values;
	AttrNumber *e = dl_effects_table.attnums;

	/* the replaced attempt, as it was recorded */
	begin_effect_update(&w, locked);
	old_values = w.slot;
	dl_row_begin(&past, &dl_past_table);
#define COPY(to, from) \
	dl_row_set_optional(&past, to, old_values->tts_values[e[from] - 1], old_values->tts_isnull[e[from] - 1])
	COPY(PAST_KEY, EFF_KEY);
	COPY(PAST_ATTEMPT, EFF_ATTEMPT);
	COPY(PAST_RUN, EFF_RUN);
	COPY(PAST_LEASE_EPOCH, EFF_LEASE_EPOCH);
	COPY(PAST_HOLDER_PID, EFF_HOLDER_PID);
	dl_row_set(&past, PAST_STATUS, CStringGetTextDatum(dl_status_name(replaced_as)));
	COPY(PAST_ERROR, EFF_ERROR);
	COPY(PAST_META, EFF_META);
	COPY(PAST_CREATED_AT, EFF_CREATED_AT);
	COPY(PAST_COMPLETED_AT, EFF_COMPLETED_AT);
	COPY(PAST_RESOLVED_BY, EFF_RESOLVED_BY);
	COPY(PAST_RESOLUTION_NOTE, EFF_RESOLUTION_NOTE);
	COPY(PAST_ARGS, EFF_ARGS);
#undef COPY
	dl_row_set(&past, PAST_REPLACED_AT, dl_row_now());
	dl_row_insert(&past);
	dl_row_end(&past);

	/* the next attempt, with its own args */
	set_attempt_started(&w, intent, locked->row.attempt + 1, false);
	(void) end_effect_update(&w, locked);
}

/*
 * approved -> started: the approved call executes, as the attempt that was
 * approved, under intent's lease; who approved it is kept.
 */
void
dl_write_approved_start(LockedEffect *locked, const NewIntent *intent)
{
	RowWrite		w;

	begin_effect_update(&w, locked);
	set_attempt_started(&w, intent, locked->row.attempt, true);
	(void) end_effect_update(&w, locked);
}

/*
 * An approver's verdict on a call awaiting approval: approved (the next
 * call of its key executes it), or rejected (failed, with the verdict as its
 * error: it replays as failed).  Who decided is kept with it.
 */
HeapTuple
dl_write_approval(LockedEffect *locked, bool approved, const char *approver, const char *note)
{
	RowWrite		w;

	begin_effect_update(&w, locked);
	dl_row_set(&w, EFF_APPROVAL, CStringGetTextDatum(approved ? "approved" : "rejected"));
	dl_row_set(&w, EFF_APPROVER, CStringGetTextDatum(approver));
	dl_row_set_optional(&w, EFF_APPROVAL_NOTE, note ? CStringGetTextDatum(note) : (Datum) 0,
						note == NULL);
	if (approved)
		dl_row_set(&w, EFF_STATUS, CStringGetTextDatum(dl_status_name(EFFECT_APPROVED)));
	else
	{
		DetailBuilder error;

		dl_detail_init(&error);
		dl_detail_text(&error, "rejected_by", approver);
		dl_detail_text(&error, "note", note);
		dl_row_set(&w, EFF_STATUS, CStringGetTextDatum(dl_status_name(EFFECT_FAILED)));
		dl_row_set(&w, EFF_ERROR, JsonbPGetDatum(dl_detail_finish(&error)));
		dl_row_set(&w, EFF_COMPLETED_AT, dl_row_now());
	}
	return end_effect_update(&w, locked);
}

/* ---------- forked effects ---------- */

/*
 * Records in new_run, under new_key, what a locked effect of the source run
 * recorded: its call, outcome and resolution, as of lease_epoch (the fork's),
 * and which effect it carries.
 */
void
dl_write_forked_effect(const LockedEffect *source, const char *new_run, const char *new_key,
					   int64 lease_epoch)
{
	RowWrite		w;
	EffectRow	carried;

	dl_row_begin(&w, &dl_effects_table);
	dl_row_start_from(&w, source->tuple);
	w.updating = false;			/* a new row with the source's values */
	dl_row_set(&w, EFF_KEY, CStringGetTextDatum(new_key));
	dl_row_set(&w, EFF_RUN, CStringGetTextDatum(new_run));
	dl_row_set(&w, EFF_LEASE_EPOCH, Int64GetDatum(lease_epoch));
	dl_row_set(&w, EFF_HOLDER_PID, Int32GetDatum(MyProcPid));
	dl_row_set(&w, EFF_CREATED_AT, dl_row_now());
	dl_row_set(&w, EFF_CONFLICT, BoolGetDatum(false));
	/* a person's retry was of the source's effect: the new run replays its failure */
	dl_row_set(&w, EFF_EXECUTE_AGAIN, BoolGetDatum(false));
	dl_row_set(&w, EFF_FORKED_FROM, CStringGetTextDatum(source->row.key));
	dl_row_insert(&w);
	dl_effect_row_from_slot(w.slot, &carried);
	dl_row_end(&w);
	follow_settlement(NULL, &carried);
}
