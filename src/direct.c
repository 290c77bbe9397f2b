/*
 * direct.c: the hottest writes, without the executor.
 *
 * Every begin_effect of a new call writes an intent row and an audit row, and
 * every report writes an audit row and completes (or fails) its effect.
 * Through SPI each of those is a whole executor start-up and shut-down, which
 * costs more than the write itself.  Here they are a heap_insert (or
 * heap_update) plus an index_insert per index, as the catalog code does for
 * system tables.
 *
 * Used only where nothing is lost by it:
 *   - the tables are plain heap tables with the extension's own columns (and
 *     NOT NULLs), plain btree indexes, no CHECK constraints, rules, row
 *     security, partitions or children, and no triggers on the writes done
 *     here (were one added, SPI is used, so the trigger fires); an UPDATE
 *     that a publication could not replicate is refused as the executor
 *     refuses it;
 *   - an intent row goes in directly only when its key cannot exist yet: a
 *     derived key in the run's first lease epoch, or, under READ COMMITTED,
 *     one that a unique check's look at the primary key finds nowhere,
 *     committed or in progress (see ledger.c); everything else keeps INSERT
 *     ... ON CONFLICT, and uniqueness still comes from the primary key, which
 *     index_insert enforces here too (UNIQUE_CHECK_YES);
 *   - a report is applied directly only to a started effect whose current
 *     attempt is the one reported on (a report that names none: a derived
 *     key or a first attempt), read with the snapshot an UPDATE statement
 *     would take, and only when heap_update finds that version still
 *     current; anything else (a concurrent change, SERIALIZABLE, a report
 *     that must be judged) goes to the locked read in ledger.c.
 * Values are the ones the SQL statements in store.c would write; the domains
 * on status and event hold by construction (the values are C constants).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_type.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "executor/executor.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/inet.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "durable_ledger.h"

/* Column numbers, as in durable_ledger--1.0.sql (checked against the catalog). */
enum EffectsColumn
{
	EFF_KEY, EFF_RUN, EFF_TOOL, EFF_ARGS, EFF_BUSINESS_KEY, EFF_OCCURRENCE,
	EFF_ATTEMPT, EFF_STATUS, EFF_RESULT, EFF_ERROR, EFF_META, EFF_LEASE_EPOCH,
	EFF_HOLDER_PID, EFF_CREATED_AT, EFF_COMPLETED_AT, EFF_RESOLVED_BY,
	EFF_RESOLUTION_NOTE, EFF_CONFLICT, EFF_NCOLUMNS
};

enum AuditColumn
{
	AUD_ID, AUD_LOGGED_AT, AUD_RUN, AUD_KEY, AUD_EVENT, AUD_DETAIL, AUD_ROLE_NAME,
	AUD_SESSION_USER_NAME, AUD_APPLICATION_NAME, AUD_CLIENT_ADDR, AUD_BACKEND_PID,
	AUD_LEASE_EPOCH, AUD_ATTEMPT, AUD_NCOLUMNS
};

/*
 * The columns a direct write writes: name, base type and NOT NULL, in order,
 * as the install script creates them (the values written satisfy exactly
 * these NOT NULLs, so a table whose NOT NULLs differ goes through SQL).
 */
typedef struct Column
{
	const char *name;
	Oid			base_type;
	bool		not_null;
} Column;

static const Column effects_columns[EFF_NCOLUMNS] = {
	{"key", TEXTOID, true}, {"run", TEXTOID, true}, {"tool", TEXTOID, true},
	{"args", JSONBOID, true}, {"business_key", BOOLOID, true},
	{"occurrence", INT4OID, false}, {"attempt", INT4OID, true},
	{"status", TEXTOID, true}, {"result", JSONBOID, false}, {"error", JSONBOID, false},
	{"meta", JSONBOID, false}, {"lease_epoch", INT8OID, true},
	{"holder_pid", INT4OID, true}, {"created_at", TIMESTAMPTZOID, true},
	{"completed_at", TIMESTAMPTZOID, false}, {"resolved_by", TEXTOID, false},
	{"resolution_note", TEXTOID, false}, {"conflict", BOOLOID, true}
};

static const Column audit_columns[AUD_NCOLUMNS] = {
	{"id", INT8OID, true}, {"logged_at", TIMESTAMPTZOID, true}, {"run", TEXTOID, false},
	{"key", TEXTOID, false}, {"event", TEXTOID, true}, {"detail", JSONBOID, false},
	{"role_name", TEXTOID, true}, {"session_user_name", TEXTOID, true},
	{"application_name", TEXTOID, false}, {"client_addr", INETOID, false},
	{"backend_pid", INT4OID, true}, {"lease_epoch", INT8OID, false},
	{"attempt", INT4OID, false}
};

/* The columns of effects that a report changes (its UPDATE's SET list). */
static bool
changed_by_report(AttrNumber attno)
{
	return attno == EFF_STATUS + 1 || attno == EFF_RESULT + 1 ||
		attno == EFF_ERROR + 1 || attno == EFF_COMPLETED_AT + 1;
}

/*
 * Is rel a plain heap table with exactly these columns (names, types and NOT
 * NULLs, in order), not partitioned or inherited, with no CHECK constraints,
 * no rules and no row security?  Anything else is written through SQL, where
 * the executor does what it needs.  (Triggers: see has_triggers.)
 */
static bool
is_plain_table(Relation rel, const Column *columns, int ncolumns)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;

	if (rel->rd_rel->relkind != RELKIND_RELATION ||
		rel->rd_rel->relam != HEAP_TABLE_AM_OID ||
		rel->rd_rel->relispartition ||
		rel->rd_rel->relhassubclass ||
		rel->rd_rel->relhasrules ||
		rel->rd_rel->relrowsecurity ||
		(desc->constr != NULL && desc->constr->num_check > 0) ||
		desc->natts != ncolumns)
		return false;
	for (i = 0; i < ncolumns; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped || att->attgenerated ||
			att->attnotnull != columns[i].not_null ||
			strcmp(NameStr(att->attname), columns[i].name) != 0 ||
			getBaseType(att->atttypid) != columns[i].base_type)
			return false;
	}
	return true;
}

/* Has rel any trigger on INSERT (or, with update, on UPDATE)? */
static bool
has_triggers(Relation rel, bool update)
{
	TriggerDesc *trig = rel->trigdesc;

	if (trig == NULL)
		return false;
	if (!update)
		return trig->trig_insert_before_row || trig->trig_insert_after_row ||
			trig->trig_insert_instead_row || trig->trig_insert_before_statement ||
			trig->trig_insert_after_statement;
	return trig->trig_update_before_row || trig->trig_update_after_row ||
		trig->trig_update_instead_row || trig->trig_update_before_statement ||
		trig->trig_update_after_statement;
}

static Oid
ledger_relid(const char *name)
{
	Oid			nsp = get_namespace_oid("durable_ledger", false);
	Oid			relid = get_relname_relid(name, nsp);

	if (!OidIsValid(relid))
		elog(ERROR, "relation durable_ledger.%s does not exist", name);
	return relid;
}

/*
 * What a direct write to one ledger table needs, kept across calls and
 * looked at again whenever the relcache says the table or one of its indexes
 * changed (a new trigger or index, ANALYZE, DROP EXTENSION, ...).  The
 * invalidation callback only marks it stale: it can fire in the middle of a
 * write (any lock acquisition reads invalidations), so the memory in use
 * stays until the next write to that table learns the table again.
 */
typedef struct DirectTable
{
	const char *name;
	const Column *columns;
	int			ncolumns;
	Oid			relid;			/* InvalidOid: stale, look again */
	Oid			known_relid;	/* what the arrays below describe */
	bool		insertable;		/* plain, btree indexes, no INSERT triggers */
	bool		updatable;		/* plain, btree indexes, no UPDATE triggers */
	int			nindexes;
	Oid		   *index_oids;
	IndexInfo **index_infos;
	Oid			primary_key;	/* its primary key index, or InvalidOid */
	MemoryContext cxt;			/* holds the arrays and the IndexInfos */
} DirectTable;

static DirectTable effects_table = {"effects", effects_columns, EFF_NCOLUMNS};
static DirectTable audit_table = {"audit_log", audit_columns, AUD_NCOLUMNS};
static Oid	audit_seq_relid = InvalidOid;
static bool callback_registered = false;
static uint64 invalidations = 0;	/* relcache invalidations seen, ever */

static bool
concerns(const DirectTable *t, Oid relid)
{
	int			i;

	if (relid == t->known_relid)
		return true;
	for (i = 0; i < t->nindexes; i++)
		if (relid == t->index_oids[i])
			return true;
	return false;
}

static void
relcache_changed(Datum arg, Oid relid)
{
	invalidations++;
	if (!OidIsValid(relid) || concerns(&effects_table, relid))
		effects_table.relid = InvalidOid;
	if (!OidIsValid(relid) || concerns(&audit_table, relid))
		audit_table.relid = InvalidOid;
	if (!OidIsValid(relid) || relid == audit_seq_relid)
		audit_seq_relid = InvalidOid;
}

/*
 * Looks at the open table rel and remembers what writing it takes: every
 * index (ready or not: readiness is checked at each insert), its primary key
 * for lookups, and whether the direct path may be used at all for inserts
 * and for updates (only btree indexes without expressions, predicates,
 * exclusion constraints or deferred uniqueness: their IndexInfo holds no
 * pointers into relcache entries, so it can be kept).
 */
static void
learn_table(DirectTable *t, Relation rel)
{
	uint64		seen = invalidations;
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;
	MemoryContext cxt;
	MemoryContext old;
	Oid		   *oids;
	IndexInfo **infos;
	int			n = 0;
	bool		usable;
	Oid			primary_key = InvalidOid;

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(relcache_changed, (Datum) 0);
		callback_registered = true;
	}

	/* under the caller's context until complete, so that an error frees it */
	cxt = AllocSetContextCreate(CurrentMemoryContext, "durable_ledger direct writes",
								ALLOCSET_SMALL_SIZES);
	old = MemoryContextSwitchTo(cxt);
	oids = palloc(sizeof(Oid) * Max(1, list_length(indexes)));
	infos = palloc(sizeof(IndexInfo *) * Max(1, list_length(indexes)));
	MemoryContextSwitchTo(old);

	usable = is_plain_table(rel, t->columns, t->ncolumns);
	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), RowExclusiveLock);

		old = MemoryContextSwitchTo(cxt);
		infos[n] = BuildIndexInfo(index);
		MemoryContextSwitchTo(old);
		if (index->rd_rel->relam != BTREE_AM_OID ||
			infos[n]->ii_Expressions != NIL || infos[n]->ii_Predicate != NIL ||
			infos[n]->ii_ExclusionOps != NULL)
			usable = false;
		/* a deferred unique check is the executor's to do */
		if (index->rd_index->indisunique && !index->rd_index->indimmediate)
			usable = false;
		/* a lookup by key needs the primary key on a first column named key */
		if (index->rd_index->indisprimary && infos[n]->ii_NumIndexKeyAttrs == 1 &&
			infos[n]->ii_IndexAttrNumbers[0] == 1 &&
			strcmp(NameStr(TupleDescAttr(RelationGetDescr(rel), 0)->attname), "key") == 0)
			primary_key = lfirst_oid(lc);
		oids[n++] = lfirst_oid(lc);
		index_close(index, NoLock);
	}
	list_free(indexes);

	/* swap in the new description; nothing below reads invalidations */
	MemoryContextSetParent(cxt, TopMemoryContext);
	t->nindexes = 0;
	t->index_oids = oids;
	t->index_infos = infos;
	t->nindexes = n;
	t->primary_key = primary_key;
	if (t->cxt != NULL)
		MemoryContextDelete(t->cxt);
	t->cxt = cxt;
	t->insertable = usable && !has_triggers(rel, false);
	t->updatable = usable && !has_triggers(rel, true);
	t->known_relid = RelationGetRelid(rel);
	/* an invalidation read while learning leaves it stale: learn again next time */
	t->relid = invalidations == seen ? t->known_relid : InvalidOid;
}

/*
 * Opens a ledger table for a direct write (cmd: CMD_INSERT or CMD_UPDATE), or
 * returns NULL when it must go through the executor.  When what we knew went
 * stale (opening the table reads invalidations), the name is looked up again:
 * the table may have been renamed or replaced while we waited for its lock.
 */
static Relation
open_for_direct_write(DirectTable *t, CmdType cmd)
{
	/* what the executor would refuse for a write, refused here too */
	PreventCommandIfReadOnly("a write to the ledger");
	PreventCommandDuringRecovery("a write to the ledger");

	for (;;)
	{
		Oid			relid = OidIsValid(t->relid) ? t->relid : ledger_relid(t->name);
		Relation	rel = table_open(relid, RowExclusiveLock);

		if (t->relid != relid)
		{
			if (ledger_relid(t->name) != relid)
			{
				table_close(rel, RowExclusiveLock);
				t->relid = InvalidOid;
				continue;
			}
			learn_table(t, rel);
		}
		if (!(cmd == CMD_UPDATE ? t->updatable : t->insertable))
		{
			table_close(rel, RowExclusiveLock);
			return NULL;
		}
		/* as the executor: an UPDATE a publication cannot replicate is refused */
		if (cmd == CMD_UPDATE)
			CheckCmdReplicaIdentity(rel, CMD_UPDATE);
		return rel;
	}
}

/*
 * An index_insert into every index of t for the heap tuple at tid, whose
 * columns are values/nulls.  For the new version of a report's update,
 * report is true: an index on none of the columns it changed then gets the
 * executor's hint that its key is unchanged (btree's bottom-up deletion
 * removes the older versions' entries instead of splitting the page).
 */
static void
insert_index_entries(DirectTable *t, Relation rel, Datum *values, bool *nulls,
					 ItemPointer tid, bool report)
{
	int			nindexes = t->nindexes;
	Oid		   *index_oids = t->index_oids;
	IndexInfo **index_infos = t->index_infos;
	int			n;

	/* the arrays stay valid even if an invalidation marks t stale meanwhile */
	for (n = 0; n < nindexes; n++)
	{
		Relation	index = index_open(index_oids[n], RowExclusiveLock);
		IndexInfo  *info = index_infos[n];
		Datum		key_values[INDEX_MAX_KEYS];
		bool		key_nulls[INDEX_MAX_KEYS];
		bool		unchanged = report;
		int			i;

		/* as ExecOpenIndices: an index being built concurrently may not want rows yet */
		if (!index->rd_index->indisready)
		{
			index_close(index, NoLock);
			continue;
		}

		for (i = 0; i < info->ii_NumIndexAttrs; i++)
		{
			AttrNumber	attno = info->ii_IndexAttrNumbers[i];

			key_values[i] = values[attno - 1];
			key_nulls[i] = nulls[attno - 1];
			if (changed_by_report(attno))
				unchanged = false;
		}
		index_insert(index, key_values, key_nulls, tid, rel,
					 index->rd_index->indisunique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO,
					 unchanged, info);
		index_close(index, NoLock);	/* held to the end of the transaction */
	}
}

/* heap_insert, then an index_insert into every index. */
static void
insert_row(DirectTable *t, Relation rel, Datum *values, bool *nulls)
{
	HeapTuple	tuple = heap_form_tuple(RelationGetDescr(rel), values, nulls);

	heap_insert(rel, tuple, GetCurrentCommandId(true), 0, NULL);
	insert_index_entries(t, rel, values, nulls, &tuple->t_self, false);
	heap_freetuple(tuple);
}

/*
 * Inserts a new intent row directly; false when the table must be written
 * through SQL (the caller then does).  The key must be new: a duplicate is a
 * unique violation, as with a plain INSERT.
 */
bool
dl_direct_insert_intent(const NewIntent *intent)
{
	Relation	rel;
	Datum		values[EFF_NCOLUMNS];
	bool		nulls[EFF_NCOLUMNS];

	rel = open_for_direct_write(&effects_table, CMD_INSERT);
	if (rel == NULL)
		return false;

	memset(nulls, true, sizeof(nulls));
#define SET(col, datum) (values[col] = (datum), nulls[col] = false)
	SET(EFF_KEY, CStringGetTextDatum(intent->key));
	SET(EFF_RUN, CStringGetTextDatum(intent->run));
	SET(EFF_TOOL, CStringGetTextDatum(intent->tool));
	SET(EFF_ARGS, JsonbPGetDatum(intent->args));
	SET(EFF_BUSINESS_KEY, BoolGetDatum(intent->business_key));
	if (!intent->business_key)
		SET(EFF_OCCURRENCE, Int32GetDatum(intent->occurrence));
	SET(EFF_ATTEMPT, Int32GetDatum(1));
	SET(EFF_STATUS, CStringGetTextDatum(dl_status_name(EFFECT_STARTED)));
	if (intent->meta != NULL)
		SET(EFF_META, JsonbPGetDatum(intent->meta));
	SET(EFF_LEASE_EPOCH, Int64GetDatum(intent->lease_epoch));
	SET(EFF_HOLDER_PID, Int32GetDatum(MyProcPid));
	SET(EFF_CREATED_AT, TimestampTzGetDatum(GetCurrentTimestamp()));
	SET(EFF_CONFLICT, BoolGetDatum(false));

	insert_row(&effects_table, rel, values, nulls);
	table_close(rel, NoLock);
	return true;
}

/*
 * Opens effects for a direct write of kind cmd that starts with a lookup by
 * key, and the primary key to look it up with; false (nothing is left open)
 * when that must go through SQL, which is also the case when there is no
 * primary key on key that a lookup can trust.
 */
static bool
open_effects_by_key(CmdType cmd, Relation *rel, Relation *primary_key)
{
	*rel = open_for_direct_write(&effects_table, cmd);
	if (*rel == NULL)
		return false;
	if (OidIsValid(effects_table.primary_key))
	{
		*primary_key = index_open(effects_table.primary_key, RowExclusiveLock);
		if ((*primary_key)->rd_index->indisvalid && (*primary_key)->rd_index->indimmediate)
			return true;
		index_close(*primary_key, NoLock);
	}
	table_close(*rel, NoLock);
	return false;
}

/* Fetches into slot the version of key's row that snapshot sees, if any. */
static bool
fetch_by_key(Relation rel, Relation primary_key, Snapshot snapshot,
			 const char *key, TupleTableSlot *slot)
{
	ScanKeyData scankey;
	IndexScanDesc scan;
	bool		found;

	ScanKeyEntryInitialize(&scankey, 0, 1, BTEqualStrategyNumber, InvalidOid,
						   primary_key->rd_indcollation[0], F_TEXTEQ,
						   CStringGetTextDatum(key));
	scan = index_beginscan(rel, primary_key, snapshot, 1, 0);
	index_rescan(scan, &scankey, 1, NULL, 0);
	found = index_getnext_slot(scan, ForwardScanDirection, slot);
	index_endscan(scan);
	return found;
}

/* The effects row in slot as an EffectRow, copied out of the page. */
static void
effect_row_from_slot(TupleTableSlot *slot, EffectRow *row)
{
	Datum	   *values;
	bool	   *nulls;

	slot_getallattrs(slot);
	values = slot->tts_values;
	nulls = slot->tts_isnull;
#define OPTIONAL_JSONB(col) (nulls[col] ? NULL : DatumGetJsonbPCopy(values[col]))
	row->key = TextDatumGetCString(values[EFF_KEY]);
	row->run = TextDatumGetCString(values[EFF_RUN]);
	row->tool = TextDatumGetCString(values[EFF_TOOL]);
	row->args = DatumGetJsonbPCopy(values[EFF_ARGS]);
	row->business_key = DatumGetBool(values[EFF_BUSINESS_KEY]);
	row->occurrence = nulls[EFF_OCCURRENCE] ? 0 : DatumGetInt32(values[EFF_OCCURRENCE]);
	row->attempt = DatumGetInt32(values[EFF_ATTEMPT]);
	row->status = dl_status_from_name(TextDatumGetCString(values[EFF_STATUS]));
	row->result = OPTIONAL_JSONB(EFF_RESULT);
	row->error = OPTIONAL_JSONB(EFF_ERROR);
	row->lease_epoch = DatumGetInt64(values[EFF_LEASE_EPOCH]);
	row->conflict = DatumGetBool(values[EFF_CONFLICT]);
#undef OPTIONAL_JSONB
}

/*
 * Looks key up in effects as a unique check does (SnapshotDirty: committed
 * versions and those of transactions still in progress):
 *   KEY_ABSENT  no version of key exists: an intent for it is certainly new;
 *   KEY_FOUND   *row is the key's current version, committed (or this
 *               transaction's own) and not being updated by another
 *               transaction (row lockers are ignored, as by a SELECT): what
 *               a statement's fresh snapshot would read;
 *   KEY_USE_SQL anything else (a writer in progress, a table that must be
 *               read through SQL): the caller reads through SQL.
 * Only under READ COMMITTED: the transaction snapshot of REPEATABLE READ may
 * still see a row that this look no longer finds (a committed DELETE), and
 * SERIALIZABLE needs the predicate locks of SQL's reads.
 */
KeyLookup
dl_direct_lookup(const char *key, EffectRow *row)
{
	Relation	rel;
	Relation	primary_key;
	SnapshotData dirty;
	TupleTableSlot *slot;
	KeyLookup	lookup = KEY_USE_SQL;

	if (IsolationUsesXactSnapshot() ||
		!open_effects_by_key(CMD_INSERT, &rel, &primary_key))
		return KEY_USE_SQL;

	InitDirtySnapshot(dirty);
	slot = table_slot_create(rel, NULL);
	if (!fetch_by_key(rel, primary_key, &dirty, key, slot))
		lookup = KEY_ABSENT;
	else if (!TransactionIdIsValid(dirty.xmin) && !TransactionIdIsValid(dirty.xmax))
	{
		effect_row_from_slot(slot, row);
		lookup = KEY_FOUND;
	}
	ExecDropSingleTupleTableSlot(slot);

	index_close(primary_key, NoLock);
	table_close(rel, NoLock);
	return lookup;
}

/*
 * Reports the outcome of a started effect whose current attempt is attempt
 * (0: a report that names none, for a derived key or a first attempt only):
 * status started -> to, with result or error and completed_at, as
 * STMT_FINISH of store.c does.  The row is read as an UPDATE statement reads it (after
 * a CommandCounterIncrement, with the transaction's snapshot, which under
 * READ COMMITTED is a fresh one) and changed with heap_update, which waits
 * for a concurrent writer.  When that version is no longer current, the
 * caller reads the row again under a lock and decides: nothing was changed.
 * (*run and *lease_epoch may be set even then.)
 */
DirectOutcome
dl_direct_finish(const char *key, EffectStatus to, Jsonb *result, Jsonb *error,
				 int32 attempt, HeapTuple *finished, char **run,
				 int64 *lease_epoch, int32 *row_attempt)
{
	Relation	rel;
	Relation	primary_key;
	Snapshot	snapshot;
	TupleTableSlot *slot;
	Datum		values[EFF_NCOLUMNS];
	bool		nulls[EFF_NCOLUMNS];
	HeapTuple	tuple = NULL;
	ItemPointerData tid;
	DirectOutcome outcome = DIRECT_NOT_DONE;

	if (IsolationIsSerializable() ||
		!open_effects_by_key(CMD_UPDATE, &rel, &primary_key))
		return DIRECT_USE_SQL;

	CommandCounterIncrement();
	snapshot = RegisterSnapshot(GetTransactionSnapshot());
	slot = table_slot_create(rel, NULL);
	if (fetch_by_key(rel, primary_key, snapshot, key, slot))
	{
		int32		current_attempt;

		slot_getallattrs(slot);
		memcpy(values, slot->tts_values, sizeof(values));
		memcpy(nulls, slot->tts_isnull, sizeof(nulls));
		current_attempt = DatumGetInt32(values[EFF_ATTEMPT]);
		if (strcmp(TextDatumGetCString(values[EFF_STATUS]),
				   dl_status_name(EFFECT_STARTED)) == 0 &&
			(attempt != 0 ? current_attempt == attempt :
			 !DatumGetBool(values[EFF_BUSINESS_KEY]) || current_attempt == 1))
		{
			values[EFF_STATUS] = CStringGetTextDatum(dl_status_name(to));
			values[EFF_RESULT] = PointerGetDatum(result);
			nulls[EFF_RESULT] = result == NULL;
			values[EFF_ERROR] = PointerGetDatum(error);
			nulls[EFF_ERROR] = error == NULL;
			values[EFF_COMPLETED_AT] = TimestampTzGetDatum(GetCurrentTimestamp());
			nulls[EFF_COMPLETED_AT] = false;
			/* formed while the slot still pins the page its values point into */
			tuple = heap_form_tuple(RelationGetDescr(rel), values, nulls);
			tid = slot->tts_tid;
			*run = TextDatumGetCString(values[EFF_RUN]);
			*lease_epoch = DatumGetInt64(values[EFF_LEASE_EPOCH]);
			*row_attempt = current_attempt;
		}
	}
	ExecDropSingleTupleTableSlot(slot);

	/* the snapshot stays registered while the version it read is updated */
	if (tuple != NULL)
	{
		TM_FailureData tmfd;
		LockTupleMode lockmode;
		bool		new_index_entries;

		if (dl_heap_update(rel, &tid, tuple, GetCurrentCommandId(true),
						   &tmfd, &lockmode, &new_index_entries) == TM_Ok)
		{
			/* not a HOT update: every index needs an entry for the new version */
			if (new_index_entries)
			{
				heap_deform_tuple(tuple, RelationGetDescr(rel), values, nulls);
				insert_index_entries(&effects_table, rel, values, nulls,
									 &tuple->t_self, true);
			}
			*finished = tuple;
			outcome = DIRECT_DONE;
		}
	}
	UnregisterSnapshot(snapshot);

	index_close(primary_key, NoLock);
	table_close(rel, NoLock);
	return outcome;
}

/* The client's address, as inet_client_addr() gives it (NULL for a socket). */
static bool
client_addr(Datum *addr)
{
	LOCAL_FCINFO(fcinfo, 0);

	InitFunctionCallInfoData(*fcinfo, NULL, 0, InvalidOid, NULL, NULL);
	*addr = inet_client_addr(fcinfo);
	return !fcinfo->isnull;
}

/*
 * Appends an audit row directly; false when the table must be written
 * through SQL.  The columns are those of STMT_AUDIT in store.c.
 */
bool
dl_direct_audit(const char *run, const char *key, const char *event, Jsonb *detail,
				int64 lease_epoch, int32 attempt, const char *role_name)
{
	Relation	rel;
	Datum		values[AUD_NCOLUMNS];
	bool		nulls[AUD_NCOLUMNS];
	Datum		addr;

	rel = open_for_direct_write(&audit_table, CMD_INSERT);
	if (rel == NULL)
		return false;

	memset(nulls, true, sizeof(nulls));
	if (!OidIsValid(audit_seq_relid))
		audit_seq_relid = ledger_relid("audit_log_id_seq");
	SET(AUD_ID, Int64GetDatum(nextval_internal(audit_seq_relid, false)));
	SET(AUD_LOGGED_AT, TimestampTzGetDatum(GetCurrentTimestamp()));
	if (run != NULL)
		SET(AUD_RUN, CStringGetTextDatum(run));
	if (key != NULL)
		SET(AUD_KEY, CStringGetTextDatum(key));
	SET(AUD_EVENT, CStringGetTextDatum(event));
	if (detail != NULL)
		SET(AUD_DETAIL, JsonbPGetDatum(detail));
	SET(AUD_ROLE_NAME, CStringGetTextDatum(role_name));
	SET(AUD_SESSION_USER_NAME, CStringGetTextDatum(GetUserNameFromId(GetSessionUserId(), false)));
	if (application_name != NULL)
		SET(AUD_APPLICATION_NAME, CStringGetTextDatum(application_name));
	if (client_addr(&addr))
		SET(AUD_CLIENT_ADDR, addr);
	SET(AUD_BACKEND_PID, Int32GetDatum(MyProcPid));
	if (lease_epoch > 0)
		SET(AUD_LEASE_EPOCH, Int64GetDatum(lease_epoch));
	if (attempt > 0)
		SET(AUD_ATTEMPT, Int32GetDatum(attempt));
#undef SET

	insert_row(&audit_table, rel, values, nulls);
	table_close(rel, NoLock);
	return true;
}
