/*
 * rows.c: the row-write core, the only code that writes a row of the
 * ledger's tables (the write_*.c files and audit.c say what to write).
 *
 * Single rows go through the executor's own helpers, the ones logical
 * replication's apply worker uses: ExecSimpleRelationInsert and
 * ExecSimpleRelationUpdate on a ResultRelInfo with its indexes open (as
 * ExecOpenIndices opens them, with what the transaction learned of them:
 * index_plans.c), the row to change found and locked with
 * RelationFindReplTupleByIndex on the primary key.  Triggers, NOT NULL and
 * CHECK constraints, index maintenance and unique checks, replica identity,
 * are then PostgreSQL's code, whatever an administrator adds to the tables.
 * (Like the apply worker, these fire row triggers, not statement triggers.)
 *
 * Columns are found by name (tables.c); any column the ledger does not know
 * gets its default, as an INSERT would give it.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/table.h"
#include "executor/executor.h"
#include "rewrite/rewriteHandler.h"
#include "utils/builtins.h"
#include "utils/datum.h"
#include "utils/inval.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "rows.h"

/*
 * Starts a write of table t; with_indexes, its indexes are opened for the
 * entries an insert or update makes.  (A write that only locks or deletes
 * rows makes no index entries: dl_row_lookup.)
 */
static void
begin_write_of(RowWrite *w, LedgerTable *t, bool with_indexes)
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
		dl_open_indexes(w->rri);
	desc = RelationGetDescr(w->rel);
	w->slot = ExecInitExtraTupleSlot(w->estate, desc, &TTSOpsVirtual);
	ExecClearTuple(w->slot);
	memset(w->slot->tts_isnull, true, sizeof(bool) * desc->natts);
	w->set = palloc0(sizeof(bool) * desc->natts);
	MemoryContextSwitchTo(old);
	AfterTriggerBeginQuery();
}

void
dl_row_begin(RowWrite *w, LedgerTable *t)
{
	begin_write_of(w, t, true);
}

/* A write that only locks rows (lock_row_by) or deletes them (delete_row). */
void
dl_row_lookup(RowWrite *w, LedgerTable *t)
{
	begin_write_of(w, t, false);
}

void
dl_row_end(RowWrite *w)
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
note_updated(RowWrite *w, int column)
{
	MemoryContext caller;

	if (!w->updating)
		return;
	caller = MemoryContextSwitchTo(w->estate->es_query_cxt);
	w->updated = bms_add_member(w->updated,
								w->table->attnums[column] - FirstLowInvalidHeapAttributeNumber);
	MemoryContextSwitchTo(caller);
}

void
dl_row_set(RowWrite *w, int column, Datum value)
{
	int			i = w->table->attnums[column] - 1;

	w->slot->tts_values[i] = value;
	w->slot->tts_isnull[i] = false;
	w->set[i] = true;
	note_updated(w, column);
}

void
dl_row_set_null(RowWrite *w, int column)
{
	int			i = w->table->attnums[column] - 1;

	w->slot->tts_isnull[i] = true;
	w->set[i] = true;
	note_updated(w, column);
}

void
dl_row_set_optional(RowWrite *w, int column, Datum value, bool isnull)
{
	if (isnull)
		dl_row_set_null(w, column);
	else
		dl_row_set(w, column, value);
}

/*
 * Columns the ledger does not know (an administrator added them) get their
 * defaults, as an INSERT would give them.  (The apply worker does the same.)
 */
static void
fill_defaults(RowWrite *w)
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
void
dl_row_report_skipped(LedgerTable *t, const char *command)
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
void
dl_row_report_changed_key(LedgerTable *t)
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
values_given(RowWrite *w, bool before_row_triggers)
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
check_key_kept(RowWrite *w, const Datum *given)
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
			dl_row_report_changed_key(w->table);
	}
}

static void
check_written(RowWrite *w, const char *command)
{
	if (!ItemPointerIsValid(&w->slot->tts_tid))
		dl_row_report_skipped(w->table, command);
}

void
dl_row_insert(RowWrite *w)
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
bool
dl_row_lock_by(RowWrite *w, int nkeys, const int *key_columns, const Datum *values,
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
bool
dl_row_lock(RowWrite *w, Datum value, int key_column, HeapTuple *tuple)
{
	return dl_row_lock_by(w, 1, &key_column, &value, tuple);
}

/* The row locked by lock_row as the slot the executor's helpers search by. */
static TupleTableSlot *
locked_slot(RowWrite *w, HeapTuple locked)
{
	TupleTableSlot *search;

	search = ExecInitExtraTupleSlot(w->estate, RelationGetDescr(w->rel), &TTSOpsHeapTuple);
	ExecStoreHeapTuple(locked, search, false);
	return search;
}

/* Changes the row locked by lock_row into the values of w->slot. */
void
dl_row_update(RowWrite *w, HeapTuple locked)
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
void
dl_row_delete(RowWrite *w, HeapTuple locked, int nkeys, const int *key_columns, const Datum *values)
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
		if (dl_row_lock_by(w, nkeys, key_columns, values, &left))
			dl_row_report_skipped(w->table, "DELETE");
	}
}

/* The values of a locked row, as the starting point of its update. */
void
dl_row_start_from(RowWrite *w, HeapTuple locked)
{
	TupleDesc	desc = RelationGetDescr(w->rel);

	heap_deform_tuple(locked, desc, w->slot->tts_values, w->slot->tts_isnull);
	memset(w->set, true, sizeof(bool) * desc->natts);
	w->updating = true;
}

/* A column of the row just written, as stored (NOT NULL columns only). */
Datum
dl_row_stored(RowWrite *w, int column)
{
	int			i = w->table->attnums[column] - 1;

	Assert(!w->slot->tts_isnull[i]);
	return w->slot->tts_values[i];
}

Datum
dl_row_now(void)
{
	return TimestampTzGetDatum(GetCurrentTimestamp());
}

/*
 * A fact that calls remember (cache.c) changed: every backend forgets what
 * it remembered at this transaction's commit (this one also at its
 * rollback), and this one at once, not only at its next command.
 */
void
dl_row_announce_change(RowWrite *w)
{
	CacheInvalidateRelcache(w->rel);
	dl_forget_remembered();
}

/* A text column of a row locked by dl_row_lock. */
char *
dl_row_locked_text(RowWrite *w, HeapTuple locked, int column)
{
	bool		isnull;
	Datum		d = heap_getattr(locked, w->table->attnums[column], RelationGetDescr(w->rel),
								 &isnull);

	return isnull ? "" : TextDatumGetCString(d);
}
