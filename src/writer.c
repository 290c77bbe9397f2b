/*
 * writer.c: the only code that writes the ledger's rows.
 *
 * Single rows go through the executor's own helpers, the ones logical
 * replication's apply worker uses: ExecSimpleRelationInsert and
 * ExecSimpleRelationUpdate on a ResultRelInfo with its indexes open
 * (ExecOpenIndices), the row to change found and locked with
 * RelationFindReplTupleByIndex on the primary key.  Triggers, NOT NULL and
 * CHECK constraints, index maintenance and unique checks, replica identity,
 * are then PostgreSQL's code, whatever an administrator adds to the tables.
 * (Like the apply worker, these fire row triggers, not statement triggers.)
 * One write is one EState, from begin_write() (or begin_lookup(), for a write
 * that only locks or deletes rows and so opens no index) to end_write(), with
 * AFTER triggers fired at its end.
 *
 * The one statement that needs ON CONFLICT (a business key's intent, which
 * runs that share the key may insert at once) is SQL, with a saved plan.
 *
 * Columns are found by name (tables.c); any column the ledger does not know
 * gets its default, as an INSERT would give it.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/namespace.h"
#include "catalog/pg_type.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "miscadmin.h"
#include "nodes/makefuncs.h"
#include "optimizer/optimizer.h"
#include "rewrite/rewriteHandler.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/inet.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "tables.h"

/* ---------- one write: an EState for one statement's worth of one table ---------- */

typedef struct Write
{
	LedgerTable *table;
	Relation	rel;
	EState	   *estate;
	ResultRelInfo *rri;
	RangeTblEntry *rte;
	TupleTableSlot *slot;		/* the new row's values */
	bool	   *set;			/* which attributes the ledger gave a value */
	bool		updating;		/* an update: its SET list is collected in updated */
	Bitmapset  *updated;		/* as RangeTblEntry.updatedCols */
} Write;

/*
 * Starts a write of table t; with_indexes, its indexes are opened for the
 * entries an insert or update makes.  (A write that only locks or deletes
 * rows makes no index entries: begin_lookup.)
 */
static void
begin_write_of(Write *w, LedgerTable *t, bool with_indexes)
{
	RangeTblEntry *rte;
	MemoryContext old;
	TupleDesc	desc;

	/* our earlier writes in this statement (and SQL's) are seen by this one */
	CommandCounterIncrement();

	w->rel = dl_open_table(t, RowExclusiveLock);

	w->table = t;
	w->estate = CreateExecutorState();
	old = MemoryContextSwitchTo(w->estate->es_query_cxt);
	rte = makeNode(RangeTblEntry);
	rte->rtekind = RTE_RELATION;
	rte->relid = RelationGetRelid(w->rel);
	rte->relkind = w->rel->rd_rel->relkind;
	rte->rellockmode = RowExclusiveLock;
	ExecInitRangeTable(w->estate, list_make1(rte));
	w->rte = rte;
	w->updating = false;
	w->updated = NULL;
	w->rri = makeNode(ResultRelInfo);
	InitResultRelInfo(w->rri, w->rel, 1, NULL, 0);
	/* as the apply worker does: so that AFTER triggers find it */
	w->estate->es_opened_result_relations = list_make1(w->rri);
	w->estate->es_output_cid = GetCurrentCommandId(true);
	w->estate->es_snapshot = GetActiveSnapshot();
	if (with_indexes)
		ExecOpenIndices(w->rri, false);
	desc = RelationGetDescr(w->rel);
	w->slot = ExecInitExtraTupleSlot(w->estate, desc, &TTSOpsVirtual);
	ExecClearTuple(w->slot);
	memset(w->slot->tts_isnull, true, sizeof(bool) * desc->natts);
	w->set = palloc0(sizeof(bool) * desc->natts);
	MemoryContextSwitchTo(old);
	AfterTriggerBeginQuery();
}

static void
begin_write(Write *w, LedgerTable *t)
{
	begin_write_of(w, t, true);
}

/* A write that only locks rows (lock_row_by) or deletes them (delete_row). */
static void
begin_lookup(Write *w, LedgerTable *t)
{
	begin_write_of(w, t, false);
}

static void
end_write(Write *w)
{
	int			i;

	AfterTriggerEndQuery(w->estate);

	/*
	 * Our indexes stay locked to the end of the transaction, like the table,
	 * so that the next write finds its locks held (ExecCloseIndices would
	 * release them); then ExecCloseResultRelations closes what the triggers
	 * opened.
	 */
	for (i = 0; i < w->rri->ri_NumIndices; i++)
		index_close(w->rri->ri_IndexRelationDescs[i], NoLock);
	w->rri->ri_NumIndices = 0;
	ExecCloseResultRelations(w->estate);
	ExecResetTupleTable(w->estate->es_tupleTable, false);
	FreeExecutorState(w->estate);
	table_close(w->rel, NoLock);	/* locked until the end of the transaction */
}

/* In an update, column is in the SET list (for UPDATE OF triggers, domains). */
static void
note_updated(Write *w, int column)
{
	MemoryContext caller;

	if (!w->updating)
		return;
	caller = MemoryContextSwitchTo(w->estate->es_query_cxt);
	w->updated = bms_add_member(w->updated,
								w->table->attnums[column] - FirstLowInvalidHeapAttributeNumber);
	MemoryContextSwitchTo(caller);
}

static void
set_value(Write *w, int column, Datum value)
{
	int			i = w->table->attnums[column] - 1;

	w->slot->tts_values[i] = value;
	w->slot->tts_isnull[i] = false;
	w->set[i] = true;
	note_updated(w, column);
}

static void
set_null(Write *w, int column)
{
	int			i = w->table->attnums[column] - 1;

	w->slot->tts_isnull[i] = true;
	w->set[i] = true;
	note_updated(w, column);
}

static void
set_optional(Write *w, int column, Datum value, bool isnull)
{
	if (isnull)
		set_null(w, column);
	else
		set_value(w, column, value);
}

/*
 * Columns the ledger does not know (an administrator added them) get their
 * defaults, as an INSERT would give them.  (The apply worker does the same.)
 */
static void
fill_defaults(Write *w)
{
	TupleDesc	desc = RelationGetDescr(w->rel);
	ExprContext *econtext = GetPerTupleExprContext(w->estate);
	int			i;

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		Node	   *expr;

		if (w->set[i] || att->attisdropped || att->attgenerated)
			continue;
		expr = build_column_default(w->rel, i + 1);
		if (expr != NULL)
		{
			ExprState  *state = ExecPrepareExpr((Expr *) expr, w->estate);

			w->slot->tts_values[i] = ExecEvalExprSwitchContext(state, econtext,
															   &w->slot->tts_isnull[i]);
		}
	}
}

/*
 * A BEFORE ROW trigger that returns NULL makes the executor skip the row
 * silently.  The ledger cannot leave a row unwritten (an intent not recorded
 * would still be executed), so the call fails and writes nothing.  The slot
 * gets the new row's TID only when the row was written.
 */
static void
report_skipped(LedgerTable *t, const char *command)
{
	ereport(ERROR,
			(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
			 errmsg("a trigger on durable_ledger.%s skipped the ledger's %s", t->name, command),
			 errdetail("A BEFORE ROW trigger returned NULL. The ledger records every change or none, so nothing was written."),
			 errhint("A BEFORE ROW trigger on a ledger table must return the row.")));
}

/*
 * A BEFORE ROW trigger changed the primary key of a row the ledger wrote:
 * the row would be found by no call or query that looks for it (an effect
 * executed again, hidden from unresolved), so the call fails and writes
 * nothing.
 */
static void
report_changed_key(LedgerTable *t)
{
	ereport(ERROR,
			(errcode(ERRCODE_TRIGGERED_ACTION_EXCEPTION),
			 errmsg("a trigger on durable_ledger.%s changed the primary key of the row the ledger wrote", t->name),
			 errdetail("The ledger finds its rows by their primary key. It records every change or none, so nothing was written."),
			 errhint("A BEFORE ROW trigger on a ledger table must not change the row's primary key.")));
}

/*
 * The values the ledger gives the row before the executor writes it, kept
 * when a BEFORE ROW trigger may change them (NULL when the table has none):
 * the primary key must come out as it went in (check_key_kept).
 */
static Datum *
values_given(Write *w, bool before_row_triggers)
{
	int			natts = RelationGetDescr(w->rel)->natts;
	Datum	   *given;

	if (!before_row_triggers)
		return NULL;
	given = palloc(sizeof(Datum) * natts);
	memcpy(given, w->slot->tts_values, sizeof(Datum) * natts);
	return given;
}

static void
check_key_kept(Write *w, const Datum *given)
{
	TupleDesc	desc = RelationGetDescr(w->rel);
	Bitmapset  *key = RelationGetIndexAttrBitmap(w->rel, INDEX_ATTR_BITMAP_PRIMARY_KEY);
	int			x = -1;

	if (given == NULL)
		return;
	while ((x = bms_next_member(key, x)) >= 0)
	{
		int			i = x + FirstLowInvalidHeapAttributeNumber - 1;
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (w->slot->tts_isnull[i] ||
			!datum_image_eq(given[i], w->slot->tts_values[i], att->attbyval, att->attlen))
			report_changed_key(w->table);
	}
}

static void
check_written(Write *w, const char *command)
{
	if (!ItemPointerIsValid(&w->slot->tts_tid))
		report_skipped(w->table, command);
}

static void
insert_row(Write *w)
{
	Datum	   *given;

	fill_defaults(w);
	ExecStoreVirtualTuple(w->slot);
	dl_check_domains(w->table, w->slot, NULL);
	given = values_given(w, w->rel->trigdesc && w->rel->trigdesc->trig_insert_before_row);
	ExecSimpleRelationInsert(w->rri, w->estate, w->slot);
	check_written(w, "INSERT");
	check_key_kept(w, given);
}

/*
 * Finds the row whose primary key columns key_columns hold values, waiting
 * for a transaction that is changing it, and locks its latest version for
 * this transaction (as UPDATE locks it); false when there is none.  *tuple
 * is a copy of that version, in the caller's memory.
 */
static bool
lock_row_by(Write *w, int nkeys, const int *key_columns, const Datum *values,
			HeapTuple *tuple)
{
	MemoryContext caller = MemoryContextSwitchTo(w->estate->es_query_cxt);
	TupleTableSlot *search;
	TupleTableSlot *found;
	Oid			primary_key = RelationGetPrimaryKeyIndex(w->rel);
	bool		exists;
	int			i;

	if (!OidIsValid(primary_key))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("durable_ledger.%s has no primary key", w->table->name)));
	search = ExecInitExtraTupleSlot(w->estate, RelationGetDescr(w->rel), &TTSOpsVirtual);
	ExecClearTuple(search);
	memset(search->tts_isnull, true, sizeof(bool) * RelationGetDescr(w->rel)->natts);
	for (i = 0; i < nkeys; i++)
	{
		search->tts_values[w->table->attnums[key_columns[i]] - 1] = values[i];
		search->tts_isnull[w->table->attnums[key_columns[i]] - 1] = false;
	}
	ExecStoreVirtualTuple(search);
	found = table_slot_create(w->rel, &w->estate->es_tupleTable);

	exists = RelationFindReplTupleByIndex(w->rel, primary_key, LockTupleNoKeyExclusive,
										  search, found);
	MemoryContextSwitchTo(caller);
	if (exists)
	{
		*tuple = ExecCopySlotHeapTuple(found);
		(*tuple)->t_self = found->tts_tid;
	}
	return exists;
}

/* lock_row_by for a table whose primary key is one column. */
static bool
lock_row(Write *w, Datum value, int key_column, HeapTuple *tuple)
{
	return lock_row_by(w, 1, &key_column, &value, tuple);
}

/* The row locked by lock_row as the slot the executor's helpers search by. */
static TupleTableSlot *
locked_slot(Write *w, HeapTuple locked)
{
	TupleTableSlot *search;

	search = ExecInitExtraTupleSlot(w->estate, RelationGetDescr(w->rel), &TTSOpsHeapTuple);
	ExecStoreHeapTuple(locked, search, false);
	return search;
}

/* Changes the row locked by lock_row into the values of w->slot. */
static void
update_row(Write *w, HeapTuple locked)
{
	MemoryContext caller = MemoryContextSwitchTo(w->estate->es_query_cxt);
	TupleTableSlot *search = locked_slot(w, locked);
	EPQState	epq;
	Datum	   *given;

	ExecStoreVirtualTuple(w->slot);
	/* the SET list: UPDATE OF triggers fire on it, as after SQL's UPDATE */
	w->rte->updatedCols = w->updated;
	if (w->updated != NULL)
		dl_check_domains(w->table, w->slot, w->updated);
	given = values_given(w, w->rel->trigdesc && w->rel->trigdesc->trig_update_before_row);
	dl_EvalPlanQualInit(&epq, w->estate);
	ExecSimpleRelationUpdate(w->rri, w->estate, &epq, search, w->slot);
	EvalPlanQualEnd(&epq);
	MemoryContextSwitchTo(caller);
	check_written(w, "UPDATE");
	check_key_kept(w, given);
}

/*
 * Removes the row found whose key_columns hold values (locked, or one that
 * no other transaction can be changing).  The executor's helper says nothing
 * when a BEFORE ROW trigger skipped the delete: then the key is looked up
 * again, and a row still there (or put back) is an error, as for a skipped
 * insert.
 */
static void
delete_row(Write *w, HeapTuple locked, int nkeys, const int *key_columns, const Datum *values)
{
	MemoryContext caller = MemoryContextSwitchTo(w->estate->es_query_cxt);
	TupleTableSlot *search = locked_slot(w, locked);
	EPQState	epq;
	HeapTuple	left;

	dl_EvalPlanQualInit(&epq, w->estate);
	ExecSimpleRelationDelete(w->rri, w->estate, &epq, search);
	EvalPlanQualEnd(&epq);
	MemoryContextSwitchTo(caller);
	if (w->rel->trigdesc != NULL && w->rel->trigdesc->trig_delete_before_row)
	{
		CommandCounterIncrement();
		if (lock_row_by(w, nkeys, key_columns, values, &left))
			report_skipped(w->table, "DELETE");
	}
}

/* The values of a locked row, as the starting point of its update. */
static void
start_from(Write *w, HeapTuple locked)
{
	TupleDesc	desc = RelationGetDescr(w->rel);

	heap_deform_tuple(locked, desc, w->slot->tts_values, w->slot->tts_isnull);
	memset(w->set, true, sizeof(bool) * desc->natts);
	w->updating = true;
}

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
	if (row->conflict || row->status == EFFECT_UNKNOWN)
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
	Write		w;

	if (may_exist && dl_read_unsettled_tuple(key, created_at) != NULL)
		return;
	unsettled_values(values, key, created_at);
	begin_write(&w, &dl_unsettled_table);
	set_value(&w, UNS_CREATED_AT, values[0]);
	set_value(&w, UNS_KEY, values[1]);
	insert_row(&w);
	end_write(&w);
}

static void
remove_unsettled(const char *key, TimestampTz created_at)
{
	Datum		values[2];
	Write		w;
	HeapTuple	tuple;

	tuple = dl_read_unsettled_tuple(key, created_at);	/* not locked: see there */
	if (tuple == NULL)
		return;
	unsettled_values(values, key, created_at);
	begin_lookup(&w, &dl_unsettled_table);
	delete_row(&w, tuple, 2, unsettled_key, values);
	end_write(&w);
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

/* A column of the row just written, as stored (NOT NULL columns only). */
static Datum
stored_value(Write *w, int column)
{
	int			i = w->table->attnums[column] - 1;

	Assert(!w->slot->tts_isnull[i]);
	return w->slot->tts_values[i];
}

static Datum
now_datum(void)
{
	return TimestampTzGetDatum(GetCurrentTimestamp());
}

/*
 * Inserts the intent of a key that cannot exist yet.  A duplicate would be a
 * unique violation (an error), never a second intent.
 */
void
dl_write_new_intent(const NewIntent *intent)
{
	Write		w;
	EffectRow	stored = {0};	/* what is_unsettled reads of the new row */

	begin_write(&w, &dl_effects_table);
	set_value(&w, EFF_KEY, CStringGetTextDatum(intent->key));
	set_value(&w, EFF_RUN, CStringGetTextDatum(intent->run));
	set_value(&w, EFF_TOOL, CStringGetTextDatum(intent->tool));
	set_value(&w, EFF_ARGS, JsonbPGetDatum(intent->args));
	set_value(&w, EFF_BUSINESS_KEY, BoolGetDatum(intent->business_key));
	set_optional(&w, EFF_OCCURRENCE, Int32GetDatum(intent->occurrence), intent->business_key);
	set_value(&w, EFF_ATTEMPT, Int32GetDatum(1));
	set_value(&w, EFF_STATUS, CStringGetTextDatum(dl_status_name(EFFECT_STARTED)));
	set_null(&w, EFF_RESULT);
	set_null(&w, EFF_ERROR);
	set_optional(&w, EFF_META, JsonbPGetDatum(intent->meta), intent->meta == NULL);
	set_value(&w, EFF_LEASE_EPOCH, Int64GetDatum(intent->lease_epoch));
	set_value(&w, EFF_HOLDER_PID, Int32GetDatum(MyProcPid));
	set_value(&w, EFF_CREATED_AT, now_datum());
	set_null(&w, EFF_COMPLETED_AT);
	set_null(&w, EFF_RESOLVED_BY);
	set_null(&w, EFF_RESOLUTION_NOTE);
	set_value(&w, EFF_CONFLICT, BoolGetDatum(false));
	set_value(&w, EFF_SAFE_TO_REDO, BoolGetDatum(intent->safe_to_redo));
	insert_row(&w);
	/* as stored: a BEFORE ROW trigger may have changed it */
	stored.status = EFFECT_STARTED;
	stored.created_at = DatumGetTimestampTz(stored_value(&w, EFF_CREATED_AT));
	stored.safe_to_redo = DatumGetBool(stored_value(&w, EFF_SAFE_TO_REDO));
	end_write(&w);
	if (is_unsettled(&stored))
		add_unsettled(intent->key, stored.created_at, false);	/* a new key: not there */
}

/* A business key's intent, unless the key exists. */
static Statement insert_intent_unless_exists = {
	"INSERT INTO durable_ledger.effects"
	" (key, run, tool, args, business_key, occurrence, attempt, status, meta,"
	"  lease_epoch, holder_pid, created_at)"
	" VALUES ($1, $2, $3, $4, $5, $6, 1, 'started', $7, $8,"
	"  pg_catalog.pg_backend_pid(), pg_catalog.clock_timestamp())"
	" ON CONFLICT (key) DO NOTHING RETURNING created_at, key",
	8, {TEXTOID, TEXTOID, TEXTOID, JSONBOID, BOOLOID, INT4OID, JSONBOID, INT8OID}
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
	Datum		values[8];
	char		nulls[8] = "        ";

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
	dl_note_ledger_write();
	if (dl_plan_run(&insert_intent_unless_exists, values, nulls, SPI_OK_INSERT_RETURNING) == 1)
	{
		HeapTuple	stored = SPI_tuptable->vals[0];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		bool		isnull;

		/* as stored: a BEFORE ROW trigger may have changed it */
		if (strcmp(TextDatumGetCString(SPI_getbinval(stored, desc, 2, &isnull)), intent->key) != 0)
			report_changed_key(&dl_effects_table);
		add_unsettled(intent->key, DatumGetTimestampTz(SPI_getbinval(stored, desc, 1, &isnull)),
					  false);
		return true;
	}
	if (insert_was_skipped(intent->key))
		report_skipped(&dl_effects_table, "INSERT");
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
	Write		w;
	bool		found;

	begin_lookup(&w, &dl_effects_table);
	found = lock_row(&w, CStringGetTextDatum(key), EFF_KEY, &locked->tuple);
	if (found)
	{
		TupleTableSlot *slot = MakeSingleTupleTableSlot(RelationGetDescr(w.rel),
														&TTSOpsHeapTuple);

		ExecStoreHeapTuple(locked->tuple, slot, false);
		dl_effect_row_from_slot(slot, &locked->row);
		ExecDropSingleTupleTableSlot(slot);
	}
	end_write(&w);
	return found;
}

/*
 * Starts an update of the locked effects row: the new row's values are the
 * locked version's, to be changed with set_value().
 */
static void
begin_effect_update(Write *w, LockedEffect *locked)
{
	begin_write(w, &dl_effects_table);
	start_from(w, locked->tuple);
}

/*
 * Writes the update begun with begin_effect_update and returns the new row
 * (in the caller's memory); the locked version becomes the new one.
 */
static HeapTuple
end_effect_update(Write *w, LockedEffect *locked)
{
	HeapTuple	updated;
	EffectRow	before = locked->row;

	update_row(w, locked->tuple);
	updated = ExecCopySlotHeapTuple(w->slot);
	updated->t_self = w->slot->tts_tid;
	locked->tuple = updated;
	dl_effect_row_from_slot(w->slot, &locked->row);
	end_write(w);
	follow_settlement(&before, &locked->row);
	return heap_copytuple(updated);
}

/* started or unknown -> to: the reported (or resolved) outcome. */
HeapTuple
dl_write_outcome(LockedEffect *locked, EffectStatus to, Jsonb *result, Jsonb *error)
{
	Write		w;

	begin_effect_update(&w, locked);
	set_value(&w, EFF_STATUS, CStringGetTextDatum(dl_status_name(to)));
	set_optional(&w, EFF_RESULT, JsonbPGetDatum(result), result == NULL);
	set_optional(&w, EFF_ERROR, JsonbPGetDatum(error), error == NULL);
	set_value(&w, EFF_COMPLETED_AT, now_datum());
	return end_effect_update(&w, locked);
}

/* started -> unknown: its lease ended without a report. */
void
dl_write_unknown(LockedEffect *locked)
{
	Write		w;

	begin_effect_update(&w, locked);
	set_value(&w, EFF_STATUS, CStringGetTextDatum(dl_status_name(EFFECT_UNKNOWN)));
	(void) end_effect_update(&w, locked);
}

/* A contradicting report was kept: the effect waits for a person. */
void
dl_write_conflict_flag(LockedEffect *locked)
{
	Write		w;

	begin_effect_update(&w, locked);
	set_value(&w, EFF_CONFLICT, BoolGetDatum(true));
	(void) end_effect_update(&w, locked);
}

/* A person's decision: the outcome, who decided, and the flag cleared. */
HeapTuple
dl_write_resolution(LockedEffect *locked, EffectStatus to, Jsonb *value,
					const char *resolved_by, const char *note)
{
	Write		w;

	begin_effect_update(&w, locked);
	set_value(&w, EFF_STATUS, CStringGetTextDatum(dl_status_name(to)));
	/* the value is the result of a completed effect, the error of a failed one */
	set_optional(&w, EFF_RESULT, JsonbPGetDatum(value), to != EFFECT_COMPLETED || value == NULL);
	set_optional(&w, EFF_ERROR, JsonbPGetDatum(value), to != EFFECT_FAILED || value == NULL);
	set_value(&w, EFF_RESOLVED_BY, CStringGetTextDatum(resolved_by));
	set_optional(&w, EFF_RESOLUTION_NOTE, note ? CStringGetTextDatum(note) : (Datum) 0,
				 note == NULL);
	set_value(&w, EFF_CONFLICT, BoolGetDatum(false));
	set_value(&w, EFF_COMPLETED_AT, now_datum());
	return end_effect_update(&w, locked);
}

/*
 * An effect's next attempt: the current one is kept in past_attempts (with
 * status replaced_as: a failed business key's as failed, a recorded call's
 * whose lease ended without a report as unknown), and the effect starts
 * again under intent's lease.
 */
void
dl_write_next_attempt(LockedEffect *locked, const NewIntent *intent, EffectStatus replaced_as)
{
	Write		past;
	Write		w;
	TupleTableSlot *old_values;
	AttrNumber *e = dl_effects_table.attnums;

	/* the replaced attempt, as it was recorded */
	begin_effect_update(&w, locked);
	old_values = w.slot;
	begin_write(&past, &dl_past_table);
#define COPY(to, from) \
	set_optional(&past, to, old_values->tts_values[e[from] - 1], old_values->tts_isnull[e[from] - 1])
	COPY(PAST_KEY, EFF_KEY);
	COPY(PAST_ATTEMPT, EFF_ATTEMPT);
	COPY(PAST_RUN, EFF_RUN);
	COPY(PAST_LEASE_EPOCH, EFF_LEASE_EPOCH);
	COPY(PAST_HOLDER_PID, EFF_HOLDER_PID);
	set_value(&past, PAST_STATUS, CStringGetTextDatum(dl_status_name(replaced_as)));
	COPY(PAST_ERROR, EFF_ERROR);
	COPY(PAST_META, EFF_META);
	COPY(PAST_CREATED_AT, EFF_CREATED_AT);
	COPY(PAST_COMPLETED_AT, EFF_COMPLETED_AT);
	COPY(PAST_RESOLVED_BY, EFF_RESOLVED_BY);
	COPY(PAST_RESOLUTION_NOTE, EFF_RESOLUTION_NOTE);
#undef COPY
	set_value(&past, PAST_REPLACED_AT, now_datum());
	insert_row(&past);
	end_write(&past);

	/* the next attempt */
	set_value(&w, EFF_RUN, CStringGetTextDatum(intent->run));
	set_value(&w, EFF_STATUS, CStringGetTextDatum(dl_status_name(EFFECT_STARTED)));
	set_value(&w, EFF_ATTEMPT, Int32GetDatum(locked->row.attempt + 1));
	set_null(&w, EFF_RESULT);
	set_null(&w, EFF_ERROR);
	set_optional(&w, EFF_META, JsonbPGetDatum(intent->meta), intent->meta == NULL);
	set_value(&w, EFF_LEASE_EPOCH, Int64GetDatum(intent->lease_epoch));
	set_value(&w, EFF_HOLDER_PID, Int32GetDatum(MyProcPid));
	set_value(&w, EFF_CREATED_AT, now_datum());
	set_null(&w, EFF_COMPLETED_AT);
	set_null(&w, EFF_RESOLVED_BY);
	set_null(&w, EFF_RESOLUTION_NOTE);
	(void) end_effect_update(&w, locked);
}

/* ---------- runs ---------- */

static Statement highest_epoch_logged = {
	"SELECT pg_catalog.max(lease_epoch) FROM durable_ledger.audit_log WHERE run" EQ "$1",
	1, {TEXTOID}
};

static bool
client_addr(Datum *addr)
{
	LOCAL_FCINFO(fcinfo, 0);

	InitFunctionCallInfoData(*fcinfo, NULL, 0, InvalidOid, NULL, NULL);
	*addr = inet_client_addr(fcinfo);
	return !fcinfo->isnull;
}

static void
set_holder(Write *w)
{
	Datum		addr;
	bool		has_addr = client_addr(&addr);

	set_value(w, RUN_HOLDER_PID, Int32GetDatum(MyProcPid));
	set_value(w, RUN_HOLDER_ROLE, CStringGetTextDatum(dl_caller_role_name()));
	set_optional(w, RUN_HOLDER_APPLICATION_NAME,
				 application_name ? CStringGetTextDatum(application_name) : (Datum) 0,
				 application_name == NULL);
	set_optional(w, RUN_HOLDER_CLIENT_ADDR, addr, !has_addr);
	set_value(w, RUN_ACQUIRED_AT, now_datum());
	set_null(w, RUN_RELEASED_AT);
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
	Write		w;
	HeapTuple	current;
	int64		epoch;

	begin_write(&w, &dl_runs_table);
	if (lock_row(&w, CStringGetTextDatum(run), RUN_RUN, &current))
	{
		bool		isnull;

		start_from(&w, current);
		epoch = DatumGetInt64(heap_getattr(current, dl_runs_table.attnums[RUN_EPOCHS],
										   RelationGetDescr(w.rel), &isnull)) + 1;
		set_value(&w, RUN_EPOCHS, Int64GetDatum(epoch));
		set_value(&w, RUN_LOCK_KEY, Int64GetDatum((int64) lock_key));
		set_value(&w, RUN_LEASE_KIND, CStringGetTextDatum(token ? "token" : "session"));
		set_holder(&w);
		update_row(&w, current);
	}
	else
	{
		Datum		values[1];
		bool		isnull;
		Datum		highest;

		values[0] = dl_text_datum(run);
		dl_plan_run_now(&highest_epoch_logged, values, NULL, SPI_OK_SELECT);
		highest = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
		epoch = 1 + (isnull ? 0 : DatumGetInt64(highest));
		set_value(&w, RUN_RUN, CStringGetTextDatum(run));
		set_value(&w, RUN_EPOCHS, Int64GetDatum(epoch));
		set_value(&w, RUN_LOCK_KEY, Int64GetDatum((int64) lock_key));
		set_value(&w, RUN_LEASE_KIND, CStringGetTextDatum(token ? "token" : "session"));
		set_holder(&w);
		set_value(&w, RUN_CREATED_AT, now_datum());
		insert_row(&w);
	}
	end_write(&w);
	return epoch;
}

/*
 * Records the end of epoch of run, if it is still the run's current one and
 * of the kind given: a token lease's, or this backend's session lease's.
 */
void
dl_write_epoch_end(const char *run, int64 epoch, bool token)
{
	Write		w;
	HeapTuple	current;

	begin_write(&w, &dl_runs_table);
	if (lock_row(&w, CStringGetTextDatum(run), RUN_RUN, &current))
	{
		TupleDesc	desc = RelationGetDescr(w.rel);
		AttrNumber *a = dl_runs_table.attnums;
		bool		isnull;
		bool		kind_isnull;
		Datum		kind = heap_getattr(current, a[RUN_LEASE_KIND], desc, &kind_isnull);

		start_from(&w, current);
		if (DatumGetInt64(heap_getattr(current, a[RUN_EPOCHS], desc, &isnull)) == epoch &&
			!kind_isnull &&
			strcmp(TextDatumGetCString(kind), token ? "token" : "session") == 0 &&
			(token ||
			 DatumGetInt32(heap_getattr(current, a[RUN_HOLDER_PID], desc, &isnull)) == MyProcPid))
		{
			set_value(&w, RUN_RELEASED_AT, now_datum());
			update_row(&w, current);
		}
	}
	end_write(&w);
}

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
	Write		w;

	begin_write(&w, &dl_token_table);
	set_value(&w, TOK_RUN, CStringGetTextDatum(run));
	set_value(&w, TOK_EPOCH, Int64GetDatum(epoch));
	set_value(&w, TOK_TOKEN_SHA256, PointerGetDatum(token_sha256));
	set_optional(&w, TOK_HOLDER, holder ? CStringGetTextDatum(holder) : (Datum) 0, holder == NULL);
	set_value(&w, TOK_TTL, IntervalPGetDatum(ttl));
	set_value(&w, TOK_TAKEN_AT, TimestampTzGetDatum(taken_at));
	set_value(&w, TOK_EXPIRES_AT, TimestampTzGetDatum(expires_at));
	set_null(&w, TOK_RELEASED_AT);
	insert_row(&w);
	end_write(&w);
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
	Write		w;
	bool		found;

	values[0] = CStringGetTextDatum(run);
	values[1] = Int64GetDatum(epoch);
	begin_lookup(&w, &dl_token_table);
	found = lock_row_by(&w, 2, keys, values, &locked->tuple);
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
	end_write(&w);
	return found;
}

static void
update_token(LockedToken *locked, int column, Datum value)
{
	Write		w;

	begin_write(&w, &dl_token_table);
	start_from(&w, locked->tuple);
	set_value(&w, column, value);
	update_row(&w, locked->tuple);
	end_write(&w);
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
	update_token(locked, TOK_RELEASED_AT, now_datum());
	locked->released = true;
}

/*
 * Records that calls identical calls were counted in a token lease's epoch.
 * The caller serialises the epoch's calls, so the row is changed in place
 * (its latest version, whatever the transaction's snapshot) or added.
 */
void
dl_write_token_calls(const char *run, int64 epoch, bytea *call, int32 calls)
{
	static const int keys[] = {CALLS_RUN, CALLS_EPOCH, CALLS_CALL};
	Datum		values[3];
	HeapTuple	counted;
	Write		w;

	values[0] = CStringGetTextDatum(run);
	values[1] = Int64GetDatum(epoch);
	values[2] = PointerGetDatum(call);
	begin_write(&w, &dl_calls_table);
	if (lock_row_by(&w, 3, keys, values, &counted))
	{
		start_from(&w, counted);
		set_value(&w, CALLS_CALLS, Int32GetDatum(calls));
		update_row(&w, counted);
	}
	else
	{
		set_value(&w, CALLS_RUN, values[0]);
		set_value(&w, CALLS_EPOCH, values[1]);
		set_value(&w, CALLS_CALL, values[2]);
		set_value(&w, CALLS_CALLS, Int32GetDatum(calls));
		insert_row(&w);
	}
	end_write(&w);
}

/* ---------- the audit log ---------- */

/*
 * Appends one event to the audit log: who (the role as after SET ROLE, the
 * session user, application, client address, backend) and when.  A
 * lease_epoch or attempt of 0 is stored as NULL.
 */
void
dl_write_audit(const char *run, const char *key, const char *event, Jsonb *detail,
			   int64 lease_epoch, int32 attempt)
{
	Write		w;
	Datum		addr;
	bool		has_addr;
	AuditRow	row;

	dl_note_ledger_write();
	begin_write(&w, &dl_audit_table);
	has_addr = client_addr(&addr);
	/* the id column's default, drawn here (the row's hash covers it) */
	row.id = nextval_internal(dl_audit_table.first_sequence, false);
	row.logged_at = GetCurrentTimestamp();
	row.run = run;
	row.key = key;
	row.event = event;
	row.detail = detail;
	row.role_name = dl_caller_role_name();
	row.session_user_name = GetUserNameFromId(GetSessionUserId(), false);
	row.application_name = application_name;
	row.client_addr = has_addr ? TextDatumGetCString(DirectFunctionCall1(network_show, addr)) : NULL;
	row.backend_pid = MyProcPid;
	row.lease_epoch = lease_epoch;
	row.attempt = attempt;
	dl_chain_audit_row(&row, RelationGetRelid(w.rel), RelationGetNamespace(w.rel));

	set_value(&w, AUD_ID, Int64GetDatum(row.id));
	set_value(&w, AUD_LOGGED_AT, TimestampTzGetDatum(row.logged_at));
	set_optional(&w, AUD_RUN, run ? CStringGetTextDatum(run) : (Datum) 0, run == NULL);
	set_optional(&w, AUD_KEY, key ? CStringGetTextDatum(key) : (Datum) 0, key == NULL);
	set_value(&w, AUD_EVENT, CStringGetTextDatum(event));
	set_optional(&w, AUD_DETAIL, JsonbPGetDatum(detail), detail == NULL);
	set_value(&w, AUD_ROLE_NAME, CStringGetTextDatum(row.role_name));
	set_value(&w, AUD_SESSION_USER_NAME, CStringGetTextDatum(row.session_user_name));
	set_optional(&w, AUD_APPLICATION_NAME,
				 application_name ? CStringGetTextDatum(application_name) : (Datum) 0,
				 application_name == NULL);
	set_optional(&w, AUD_CLIENT_ADDR, addr, !has_addr);
	set_value(&w, AUD_BACKEND_PID, Int32GetDatum(MyProcPid));
	set_optional(&w, AUD_LEASE_EPOCH, Int64GetDatum(lease_epoch), lease_epoch <= 0);
	set_optional(&w, AUD_ATTEMPT, Int32GetDatum(attempt), attempt <= 0);
	set_value(&w, AUD_CHAIN, Int64GetDatum(row.chain));
	set_value(&w, AUD_CHAIN_SEQ, Int64GetDatum(row.chain_seq));
	set_value(&w, AUD_ROW_HASH, PointerGetDatum(row.row_hash));
	insert_row(&w);
	end_write(&w);
	dl_notify_attention(event, row.id);
}

/* ---------- abandoned runs ---------- */

/*
 * A fact that calls remember (cache.c) changed: every backend forgets what
 * it remembered at this transaction's commit (this one also at its
 * rollback), and this one at once, not only at its next command.
 */
static void
announce_change(Write *w)
{
	CacheInvalidateRelcache(w->rel);
	dl_forget_remembered();
}

/*
 * Records that a person abandoned run; false when it has no row or was
 * abandoned already (nothing changes).  *epoch is its current epoch.
 */
bool
dl_write_run_abandoned(const char *run, const char *abandoned_by, const char *note,
					   int64 *epoch)
{
	Write		w;
	HeapTuple	current;
	bool		changed = false;

	*epoch = 0;
	begin_write(&w, &dl_runs_table);
	if (lock_row(&w, CStringGetTextDatum(run), RUN_RUN, &current))
	{
		TupleDesc	desc = RelationGetDescr(w.rel);
		bool		isnull;

		*epoch = DatumGetInt64(heap_getattr(current, dl_runs_table.attnums[RUN_EPOCHS],
											desc, &isnull));
		(void) heap_getattr(current, dl_runs_table.attnums[RUN_ABANDONED_AT], desc, &isnull);
		if (isnull)
		{
			start_from(&w, current);
			set_value(&w, RUN_ABANDONED_AT, now_datum());
			set_value(&w, RUN_ABANDONED_BY, CStringGetTextDatum(abandoned_by));
			set_optional(&w, RUN_ABANDON_NOTE, note ? CStringGetTextDatum(note) : (Datum) 0,
						 note == NULL);
			update_row(&w, current);
			announce_change(&w);
			changed = true;
		}
	}
	end_write(&w);
	return changed;
}

/*
 * Locks run's row for this transaction, so that its lease's changes (a
 * release, the next epoch) wait; false when the run has none.
 */
bool
dl_lock_run(const char *run)
{
	Write		w;
	HeapTuple	current;
	bool		found;

	begin_write(&w, &dl_runs_table);
	found = lock_row(&w, CStringGetTextDatum(run), RUN_RUN, &current);
	end_write(&w);
	return found;
}

/* ---------- the tools registry ---------- */

static void
set_tool_rules(Write *w, const ToolRow *row)
{
	set_value(w, TOOL_SIDE_EFFECTING, BoolGetDatum(row->side_effecting));
	set_value(w, TOOL_DIVERGENCE, CStringGetTextDatum(dl_divergence_name(row->divergence)));
	if (row->nkey_fields < 0)
		set_null(w, TOOL_KEY_FIELDS);
	else
	{
		Datum	   *elems = palloc(sizeof(Datum) * Max(row->nkey_fields, 1));
		int			i;

		for (i = 0; i < row->nkey_fields; i++)
			elems[i] = CStringGetTextDatum(row->key_fields[i]);
		set_value(w, TOOL_KEY_FIELDS,
				  PointerGetDatum(construct_array(elems, row->nkey_fields, TEXTOID, -1, false,
												  TYPALIGN_INT)));
	}
	set_optional(w, TOOL_NOTE, row->note ? CStringGetTextDatum(row->note) : (Datum) 0,
				 row->note == NULL);
}

/* Registers a tool that has no row. */
void
dl_write_new_tool(const ToolRow *row, const char *registered_by)
{
	Write		w;

	begin_write(&w, &dl_tools_table);
	set_value(&w, TOOL_TOOL, CStringGetTextDatum(row->tool));
	set_tool_rules(&w, row);
	set_value(&w, TOOL_REGISTERED_BY, CStringGetTextDatum(registered_by));
	set_value(&w, TOOL_REGISTERED_AT, now_datum());
	set_null(&w, TOOL_CHANGED_BY);
	set_null(&w, TOOL_CHANGED_AT);
	set_null(&w, TOOL_RETIRED_BY);
	set_null(&w, TOOL_RETIRED_AT);
	insert_row(&w);
	announce_change(&w);
	end_write(&w);
}

/* Locks tool's row for this transaction; false when it has none. */
bool
dl_lock_tool(const char *tool, LockedTool *locked)
{
	Write		w;
	bool		found;

	begin_lookup(&w, &dl_tools_table);
	found = lock_row(&w, CStringGetTextDatum(tool), TOOL_TOOL, &locked->tuple);
	if (found)
	{
		TupleTableSlot *slot = MakeSingleTupleTableSlot(RelationGetDescr(w.rel),
														&TTSOpsHeapTuple);

		ExecStoreHeapTuple(locked->tuple, slot, false);
		dl_tool_row_from_slot(slot, &locked->row);
		ExecDropSingleTupleTableSlot(slot);
	}
	end_write(&w);
	return found;
}

/*
 * Gives a locked tool the rules of to, by changed_by; registered_anew: a
 * retired tool registered again, which is in use again from now.
 */
void
dl_write_tool_change(LockedTool *locked, const ToolRow *to, const char *changed_by,
					 bool registered_anew)
{
	Write		w;

	begin_write(&w, &dl_tools_table);
	start_from(&w, locked->tuple);
	set_tool_rules(&w, to);
	if (registered_anew)
	{
		set_value(&w, TOOL_REGISTERED_BY, CStringGetTextDatum(changed_by));
		set_value(&w, TOOL_REGISTERED_AT, now_datum());
		set_null(&w, TOOL_CHANGED_BY);
		set_null(&w, TOOL_CHANGED_AT);
		set_null(&w, TOOL_RETIRED_BY);
		set_null(&w, TOOL_RETIRED_AT);
	}
	else
	{
		set_value(&w, TOOL_CHANGED_BY, CStringGetTextDatum(changed_by));
		set_value(&w, TOOL_CHANGED_AT, now_datum());
	}
	update_row(&w, locked->tuple);
	announce_change(&w);
	end_write(&w);
}

/* A locked tool is retired: it is executed no more. */
void
dl_write_tool_retired(LockedTool *locked, const char *retired_by, const char *note)
{
	Write		w;

	begin_write(&w, &dl_tools_table);
	start_from(&w, locked->tuple);
	set_value(&w, TOOL_RETIRED_BY, CStringGetTextDatum(retired_by));
	set_value(&w, TOOL_RETIRED_AT, now_datum());
	if (note != NULL)
		set_value(&w, TOOL_NOTE, CStringGetTextDatum(note));
	update_row(&w, locked->tuple);
	announce_change(&w);
	end_write(&w);
}

/* ---------- retention ---------- */

static Statement purge_run = {
	/*
	 * the run's effects (RUN_LOGGED_KEYS) with every replaced attempt of
	 * theirs, whichever run made it (a business key's earlier runs: left
	 * behind, it would refuse the key's next use), its divergences and its
	 * token leases' counters; an attempt it made of another run's effect
	 * stays with that effect
	 */
	"WITH keys AS (SELECT DISTINCT k.key FROM (" RUN_LOGGED_KEYS ") k),"
	"     e AS (DELETE FROM durable_ledger.effects e USING keys k"
	"            WHERE e.key" EQ "k.key AND e.run" EQ "$1 RETURNING e.key),"
	"     p AS (DELETE FROM durable_ledger.past_attempts p USING e"
	"            WHERE p.key" EQ "e.key RETURNING 1),"
	"     d AS (DELETE FROM durable_ledger.divergences d WHERE d.run" EQ "$1 RETURNING 1),"
	"     c AS (DELETE FROM durable_ledger.token_lease_calls c WHERE c.run" EQ "$1 RETURNING 1)"
	" SELECT (SELECT pg_catalog.count(*) FROM e), (SELECT pg_catalog.count(*) FROM p),"
	"        (SELECT pg_catalog.count(*) FROM d), (SELECT pg_catalog.count(*) FROM c)",
	1, {TEXTOID}, NULL, true
};

/*
 * Removes a settled run's effects, their replaced attempts, its divergences
 * and its token leases' counters; the run's row, its token leases and its
 * audit log stay.  The caller holds the run closed (dl_run_lock_closing).
 */
void
dl_write_run_purge(const char *run, PurgeCounts *counts)
{
	Datum		values[1];
	HeapTuple	tuple;
	TupleDesc	desc;
	bool		isnull;

	values[0] = dl_text_datum(run);
	dl_note_ledger_write();
	dl_plan_run(&purge_run, values, NULL, SPI_OK_SELECT);
	tuple = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	counts->effects = DatumGetInt64(SPI_getbinval(tuple, desc, 1, &isnull));
	counts->past_attempts = DatumGetInt64(SPI_getbinval(tuple, desc, 2, &isnull));
	counts->divergences = DatumGetInt64(SPI_getbinval(tuple, desc, 3, &isnull));
}

/* While purge_audit deletes, and only then, the append-only trigger lets it. */
static bool audit_purge_under_way = false;

bool
dl_audit_purge_under_way(void)
{
	return audit_purge_under_way;
}

static uint64
run_audit_delete(Statement *stmt, Datum *values)
{
	uint64		deleted;

	audit_purge_under_way = true;
	PG_TRY();
	{
		deleted = dl_plan_run(stmt, values, NULL, SPI_OK_DELETE);
	}
	PG_FINALLY();
	{
		audit_purge_under_way = false;
	}
	PG_END_TRY();
	return deleted;
}

static Statement delete_chain_prefix = {
	"DELETE FROM durable_ledger.audit_log WHERE chain" EQ "$1"
	" AND chain_seq OPERATOR(pg_catalog.<=) $2",
	2, {INT8OID, INT8OID}
};

static Statement anchor_chain = {
	"INSERT INTO durable_ledger.audit_anchors (chain, chain_seq, row_hash, purged_at, purged_by)"
	" VALUES ($1, $2, $3, pg_catalog.clock_timestamp(), $4)"
	" ON CONFLICT (chain) DO UPDATE SET chain_seq = EXCLUDED.chain_seq,"
	"  row_hash = EXCLUDED.row_hash, purged_at = EXCLUDED.purged_at, purged_by = EXCLUDED.purged_by"
	" WHERE durable_ledger.audit_anchors.chain_seq OPERATOR(pg_catalog.<) EXCLUDED.chain_seq",
	4, {INT8OID, INT8OID, BYTEAOID, TEXTOID}
};

/*
 * Removes a prefix of an audit chain and anchors the chain at its last row
 * (verify_audit links the next row to the anchor); an anchor only moves
 * forward (two purges at once).  How many rows went.
 */
int64
dl_write_audit_purge(const AuditPurge *purge, const char *purged_by)
{
	Datum		values[4];
	uint64		deleted;

	values[0] = Int64GetDatum(purge->chain);
	values[1] = Int64GetDatum(purge->up_to_seq);
	dl_note_ledger_write();
	deleted = run_audit_delete(&delete_chain_prefix, values);
	if (deleted == 0)
		return 0;				/* a purge of its own got there first: its anchor stands */
	values[2] = PointerGetDatum(purge->row_hash);
	values[3] = dl_text_datum(purged_by);
	dl_plan_run(&anchor_chain, values, NULL, SPI_OK_INSERT);
	return (int64) deleted;
}


/* ---------- divergences ---------- */

/* Records a later attempt's drifted call, waiting for a person. */
void
dl_write_divergence(const DivergenceRow *row)
{
	Write		w;

	begin_write(&w, &dl_divergences_table);
	set_value(&w, DIV_KEY, CStringGetTextDatum(row->key));
	set_value(&w, DIV_RUN, CStringGetTextDatum(row->run));
	set_value(&w, DIV_LEASE_EPOCH, Int64GetDatum(row->lease_epoch));
	set_value(&w, DIV_TOOL, CStringGetTextDatum(row->tool));
	set_value(&w, DIV_ARGS, JsonbPGetDatum(row->args));
	set_value(&w, DIV_OCCURRENCE, Int32GetDatum(row->occurrence));
	set_value(&w, DIV_CANDIDATE_KEY, CStringGetTextDatum(row->candidate_key));
	set_value(&w, DIV_DETECTED_AT, now_datum());
	set_null(&w, DIV_VERDICT);
	set_null(&w, DIV_SAME_AS);
	set_null(&w, DIV_RESOLVED_BY);
	set_null(&w, DIV_RESOLVED_AT);
	set_null(&w, DIV_RESOLUTION_NOTE);
	insert_row(&w);
	announce_change(&w);
	end_write(&w);
}

/* Locks the divergence of key for this transaction; false when there is none. */
bool
dl_lock_divergence(const char *key, LockedDivergence *locked)
{
	Write		w;
	bool		found;

	begin_lookup(&w, &dl_divergences_table);
	found = lock_row(&w, CStringGetTextDatum(key), DIV_KEY, &locked->tuple);
	if (found)
	{
		TupleTableSlot *slot = MakeSingleTupleTableSlot(RelationGetDescr(w.rel),
														&TTSOpsHeapTuple);

		ExecStoreHeapTuple(locked->tuple, slot, false);
		dl_divergence_row_from_slot(slot, &locked->row);
		ExecDropSingleTupleTableSlot(slot);
	}
	end_write(&w);
	return found;
}

/* A person's verdict on a locked divergence. */
void
dl_write_divergence_verdict(LockedDivergence *locked, const char *verdict,
							const char *same_as, const char *resolved_by, const char *note)
{
	Write		w;

	begin_write(&w, &dl_divergences_table);
	start_from(&w, locked->tuple);
	set_value(&w, DIV_VERDICT, CStringGetTextDatum(verdict));
	set_optional(&w, DIV_SAME_AS, same_as ? CStringGetTextDatum(same_as) : (Datum) 0,
				 same_as == NULL);
	set_value(&w, DIV_RESOLVED_BY, CStringGetTextDatum(resolved_by));
	set_value(&w, DIV_RESOLVED_AT, now_datum());
	set_optional(&w, DIV_RESOLUTION_NOTE, note ? CStringGetTextDatum(note) : (Datum) 0,
				 note == NULL);
	update_row(&w, locked->tuple);
	end_write(&w);
}

/* ---------- forked runs ---------- */

/*
 * Records in new_run, under new_key, what a locked effect of the source run
 * recorded: its call, outcome and resolution, as of lease_epoch (the fork's),
 * and which effect it carries.
 */
void
dl_write_forked_effect(const LockedEffect *source, const char *new_run, const char *new_key,
					   int64 lease_epoch)
{
	Write		w;
	EffectRow	carried;

	begin_write(&w, &dl_effects_table);
	start_from(&w, source->tuple);
	w.updating = false;			/* a new row with the source's values */
	set_value(&w, EFF_KEY, CStringGetTextDatum(new_key));
	set_value(&w, EFF_RUN, CStringGetTextDatum(new_run));
	set_value(&w, EFF_LEASE_EPOCH, Int64GetDatum(lease_epoch));
	set_value(&w, EFF_HOLDER_PID, Int32GetDatum(MyProcPid));
	set_value(&w, EFF_CREATED_AT, now_datum());
	set_value(&w, EFF_CONFLICT, BoolGetDatum(false));
	set_value(&w, EFF_FORKED_FROM, CStringGetTextDatum(source->row.key));
	insert_row(&w);
	dl_effect_row_from_slot(w.slot, &carried);
	end_write(&w);
	follow_settlement(NULL, &carried);
}

/*
 * Records new_run, forked from source_run up to its effect up_to, in its
 * first epoch, which the fork itself is (held by nobody): its first lease
 * starts epoch 2, whose calls look their keys up.
 */
void
dl_write_forked_run(const char *new_run, uint64 lock_key, const char *source_run,
					const char *up_to)
{
	Write		w;

	begin_write(&w, &dl_runs_table);
	set_value(&w, RUN_RUN, CStringGetTextDatum(new_run));
	set_value(&w, RUN_EPOCHS, Int64GetDatum(1));
	set_value(&w, RUN_LOCK_KEY, Int64GetDatum((int64) lock_key));
	set_value(&w, RUN_LEASE_KIND, CStringGetTextDatum("session"));
	set_holder(&w);
	set_value(&w, RUN_RELEASED_AT, now_datum());
	set_value(&w, RUN_CREATED_AT, now_datum());
	set_null(&w, RUN_ABANDONED_AT);
	set_null(&w, RUN_ABANDONED_BY);
	set_null(&w, RUN_ABANDON_NOTE);
	set_value(&w, RUN_FORKED_FROM, CStringGetTextDatum(source_run));
	set_value(&w, RUN_FORKED_UP_TO, CStringGetTextDatum(up_to));
	insert_row(&w);
	end_write(&w);
}

/* ---------- the ledger's policy ---------- */

/* A text column of a row locked by lock_row. */
static char *
locked_text(Write *w, HeapTuple locked, int column)
{
	bool		isnull;
	Datum		d = heap_getattr(locked, w->table->attnums[column], RelationGetDescr(w->rel),
								 &isnull);

	return isnull ? "" : TextDatumGetCString(d);
}

/*
 * Sets what the ledger does with a tool nobody registered: the settings
 * given (NULL: kept as the locked row has them, also a change this very
 * statement made); returns what it did before (no row:
 * DL_UNREGISTERED_DEFAULT), *after what it does now.
 */
UnregisteredPolicy
dl_write_unregistered_policy(const UnregisteredTools *may_execute,
							 const DivergencePolicy *divergence, const char *changed_by,
							 const char *note, UnregisteredPolicy *after)
{
	Write		w;
	HeapTuple	current;
	UnregisteredPolicy before = DL_UNREGISTERED_DEFAULT;
	UnregisteredPolicy *to = after;

	begin_write(&w, &dl_policy_table);
	if (lock_row(&w, BoolGetDatum(true), POL_SINGLETON, &current))
	{
		(void) dl_unregistered_from_name(locked_text(&w, current, POL_UNREGISTERED_TOOLS),
										 &before.may_execute);
		(void) dl_divergence_from_name(locked_text(&w, current, POL_UNREGISTERED_DIVERGENCE),
									   &before.divergence);
		start_from(&w, current);
	}
	else
		set_value(&w, POL_SINGLETON, BoolGetDatum(true));
	*to = before;
	if (may_execute != NULL)
		to->may_execute = *may_execute;
	if (divergence != NULL)
		to->divergence = *divergence;
	set_value(&w, POL_UNREGISTERED_TOOLS, CStringGetTextDatum(dl_unregistered_name(to->may_execute)));
	set_value(&w, POL_UNREGISTERED_DIVERGENCE, CStringGetTextDatum(dl_divergence_name(to->divergence)));
	set_value(&w, POL_CHANGED_BY, CStringGetTextDatum(changed_by));
	set_value(&w, POL_CHANGED_AT, now_datum());
	set_optional(&w, POL_NOTE, note ? CStringGetTextDatum(note) : (Datum) 0, note == NULL);
	if (w.updating)
		update_row(&w, current);
	else
		insert_row(&w);
	announce_change(&w);
	end_write(&w);
	return before;
}
