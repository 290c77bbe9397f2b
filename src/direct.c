/*
 * direct.c: the two hottest writes, without the executor.
 *
 * Every begin_effect of a new call writes an intent row and an audit row, and
 * every report writes an audit row.  Through SPI each of those is a whole
 * executor start-up and shut-down, which costs more than the insert itself.
 * Here they are a heap_insert plus an index_insert per index, as the catalog
 * code does for system tables.
 *
 * Used only where nothing is lost by it:
 *   - the tables have no INSERT triggers (were one added, SPI is used, so the
 *     trigger fires);
 *   - an intent row goes in directly only when its key cannot exist yet (a
 *     derived key in the run's first lease epoch, see ledger.c); everything
 *     else keeps INSERT ... ON CONFLICT, so uniqueness still comes from the
 *     primary key, which index_insert enforces here too (UNIQUE_CHECK_YES).
 * Values are the ones the SQL statements in store.c would write; the domains
 * on status and event hold by construction (the values are C constants).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/heapam.h"
#include "access/table.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_type.h"
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "miscadmin.h"
#include "tcop/utility.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/inet.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"
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
	AUD_LEASE_EPOCH, AUD_NCOLUMNS
};

/* The columns a direct insert writes: name and base type, in order. */
typedef struct Column
{
	const char *name;
	Oid			base_type;
} Column;

static const Column effects_columns[EFF_NCOLUMNS] = {
	{"key", TEXTOID}, {"run", TEXTOID}, {"tool", TEXTOID}, {"args", JSONBOID},
	{"business_key", BOOLOID}, {"occurrence", INT4OID}, {"attempt", INT4OID},
	{"status", TEXTOID}, {"result", JSONBOID}, {"error", JSONBOID}, {"meta", JSONBOID},
	{"lease_epoch", INT8OID}, {"holder_pid", INT4OID}, {"created_at", TIMESTAMPTZOID},
	{"completed_at", TIMESTAMPTZOID}, {"resolved_by", TEXTOID},
	{"resolution_note", TEXTOID}, {"conflict", BOOLOID}
};

static const Column audit_columns[AUD_NCOLUMNS] = {
	{"id", INT8OID}, {"logged_at", TIMESTAMPTZOID}, {"run", TEXTOID}, {"key", TEXTOID},
	{"event", TEXTOID}, {"detail", JSONBOID}, {"role_name", TEXTOID},
	{"session_user_name", TEXTOID}, {"application_name", TEXTOID},
	{"client_addr", INETOID}, {"backend_pid", INT4OID}, {"lease_epoch", INT8OID}
};

/*
 * Is rel a plain heap table with exactly these columns (names and types, in
 * order), no CHECK constraints, no rules and no INSERT triggers?  Anything
 * else is written through SQL, where the executor does what it needs.
 */
static bool
is_plain_table(Relation rel, const Column *columns, int ncolumns)
{
	TupleDesc	desc = RelationGetDescr(rel);
	TriggerDesc *trig = rel->trigdesc;
	int			i;

	if (rel->rd_rel->relkind != RELKIND_RELATION ||
		rel->rd_rel->relam != HEAP_TABLE_AM_OID ||
		rel->rd_rel->relhasrules ||
		(desc->constr != NULL && desc->constr->num_check > 0) ||
		desc->natts != ncolumns)
		return false;
	if (trig != NULL &&
		(trig->trig_insert_before_row || trig->trig_insert_after_row ||
		 trig->trig_insert_instead_row || trig->trig_insert_before_statement ||
		 trig->trig_insert_after_statement))
		return false;
	for (i = 0; i < ncolumns; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped || att->attgenerated ||
			strcmp(NameStr(att->attname), columns[i].name) != 0 ||
			getBaseType(att->atttypid) != columns[i].base_type)
			return false;
	}
	return true;
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
 * What a direct insert into one ledger table needs, kept across calls and
 * looked at again whenever the relcache says the table or one of its indexes
 * changed (a new trigger or index, ANALYZE, DROP EXTENSION, ...).  The
 * invalidation callback only marks it stale: it can fire in the middle of an
 * insert (any lock acquisition reads invalidations), so the memory in use
 * stays until the next insert into that table learns the table again.
 */
typedef struct DirectTable
{
	const char *name;
	const Column *columns;
	int			ncolumns;
	Oid			relid;			/* InvalidOid: stale, look again */
	Oid			known_relid;	/* what the arrays below describe */
	bool		usable;			/* expected columns, no INSERT triggers */
	int			nindexes;
	Oid		   *index_oids;
	IndexInfo **index_infos;
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
 * Looks at the open table rel and remembers what inserting into it takes:
 * every index (ready or not: readiness is checked at each insert), and
 * whether the direct path may be used at all (only btree indexes without
 * expressions, predicates or exclusion constraints: their IndexInfo holds no
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

	if (!callback_registered)
	{
		CacheRegisterRelcacheCallback(relcache_changed, (Datum) 0);
		callback_registered = true;
	}

	/* under the caller's context until complete, so that an error frees it */
	cxt = AllocSetContextCreate(CurrentMemoryContext, "durable_ledger direct inserts",
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
	if (t->cxt != NULL)
		MemoryContextDelete(t->cxt);
	t->cxt = cxt;
	t->usable = usable;
	t->known_relid = RelationGetRelid(rel);
	/* an invalidation read while learning leaves it stale: learn again next time */
	t->relid = invalidations == seen ? t->known_relid : InvalidOid;
}

/*
 * Opens a ledger table for a direct insert, or returns NULL when it must go
 * through the executor.  When what we knew went stale (opening the table
 * reads invalidations), the name is looked up again: the table may have been
 * renamed or replaced while we waited for its lock.
 */
static Relation
open_for_direct_insert(DirectTable *t)
{
	/* what the executor would refuse for an INSERT, refused here too */
	PreventCommandIfReadOnly("INSERT into the ledger");
	PreventCommandDuringRecovery("INSERT into the ledger");

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
		if (!t->usable)
		{
			table_close(rel, RowExclusiveLock);
			return NULL;
		}
		return rel;
	}
}

/* heap_insert, then an index_insert into every index. */
static void
insert_row(DirectTable *t, Relation rel, Datum *values, bool *nulls)
{
	HeapTuple	tuple = heap_form_tuple(RelationGetDescr(rel), values, nulls);
	int			nindexes = t->nindexes;
	Oid		   *index_oids = t->index_oids;
	IndexInfo **index_infos = t->index_infos;
	int			n;

	heap_insert(rel, tuple, GetCurrentCommandId(true), 0, NULL);

	/* the arrays stay valid even if an invalidation marks t stale meanwhile */
	for (n = 0; n < nindexes; n++)
	{
		Relation	index = index_open(index_oids[n], RowExclusiveLock);
		IndexInfo  *info = index_infos[n];
		Datum		key_values[INDEX_MAX_KEYS];
		bool		key_nulls[INDEX_MAX_KEYS];
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
		}
		index_insert(index, key_values, key_nulls, &tuple->t_self, rel,
					 index->rd_index->indisunique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO,
					 false, info);
		index_close(index, NoLock);	/* held to the end of the transaction */
	}
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

	rel = open_for_direct_insert(&effects_table);
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
				int64 lease_epoch, const char *role_name)
{
	Relation	rel;
	Datum		values[AUD_NCOLUMNS];
	bool		nulls[AUD_NCOLUMNS];
	Datum		addr;

	rel = open_for_direct_insert(&audit_table);
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
#undef SET

	insert_row(&audit_table, rel, values, nulls);
	table_close(rel, NoLock);
	return true;
}
