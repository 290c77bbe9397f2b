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
#include "catalog/index.h"
#include "catalog/namespace.h"
#include "commands/sequence.h"
#include "commands/trigger.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/guc.h"
#include "utils/inet.h"
#include "utils/lsyscache.h"
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

static const char *const effects_columns[EFF_NCOLUMNS] = {
	"key", "run", "tool", "args", "business_key", "occurrence", "attempt", "status",
	"result", "error", "meta", "lease_epoch", "holder_pid", "created_at",
	"completed_at", "resolved_by", "resolution_note", "conflict"
};

static const char *const audit_columns[AUD_NCOLUMNS] = {
	"id", "logged_at", "run", "key", "event", "detail", "role_name",
	"session_user_name", "application_name", "client_addr", "backend_pid",
	"lease_epoch"
};

/* Does rel have exactly these columns, in this order? */
static bool
has_columns(Relation rel, const char *const *names, int ncolumns)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;

	if (desc->natts != ncolumns)
		return false;
	for (i = 0; i < ncolumns; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped || strcmp(NameStr(att->attname), names[i]) != 0)
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
 * Opens a ledger table for a direct insert, or returns NULL when it must go
 * through the executor (INSERT triggers) or does not have the expected
 * columns (a schema this library does not know, say mid-upgrade).
 */
static Relation
open_for_direct_insert(const char *name, const char *const *columns, int ncolumns)
{
	Relation	rel = table_open(ledger_relid(name), RowExclusiveLock);

	if (!has_columns(rel, columns, ncolumns) ||
		(rel->trigdesc != NULL &&
		 (rel->trigdesc->trig_insert_before_row || rel->trigdesc->trig_insert_after_row ||
		  rel->trigdesc->trig_insert_instead_row || rel->trigdesc->trig_insert_before_statement ||
		  rel->trigdesc->trig_insert_after_statement)))
	{
		table_close(rel, RowExclusiveLock);
		return NULL;
	}
	return rel;
}

/* heap_insert, then an index_insert into every ready index. */
static void
insert_row(Relation rel, Datum *values, bool *nulls)
{
	HeapTuple	tuple = heap_form_tuple(RelationGetDescr(rel), values, nulls);
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;

	heap_insert(rel, tuple, GetCurrentCommandId(true), 0, NULL);

	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), RowExclusiveLock);
		IndexInfo  *info;
		Datum		key_values[INDEX_MAX_KEYS];
		bool		key_nulls[INDEX_MAX_KEYS];
		int			i;

		if (!index->rd_index->indisready)
		{
			index_close(index, RowExclusiveLock);
			continue;
		}
		info = BuildIndexInfo(index);
		if (info->ii_Expressions != NIL || info->ii_Predicate != NIL)
			elog(ERROR, "index \"%s\" has expressions or a predicate; the ledger's indexes are plain",
				 RelationGetRelationName(index));
		for (i = 0; i < info->ii_NumIndexAttrs; i++)
		{
			AttrNumber	attno = info->ii_IndexAttrNumbers[i];

			key_values[i] = values[attno - 1];
			key_nulls[i] = nulls[attno - 1];
		}
		index_insert(index, key_values, key_nulls, &tuple->t_self, rel,
					 index->rd_index->indisunique ? UNIQUE_CHECK_YES : UNIQUE_CHECK_NO,
					 false, info);
		index_close(index, RowExclusiveLock);
	}
	list_free(indexes);
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
	Relation	rel = open_for_direct_insert("effects", effects_columns, EFF_NCOLUMNS);
	Datum		values[EFF_NCOLUMNS];
	bool		nulls[EFF_NCOLUMNS];

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

	insert_row(rel, values, nulls);
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
	Relation	rel = open_for_direct_insert("audit_log", audit_columns, AUD_NCOLUMNS);
	Datum		values[AUD_NCOLUMNS];
	bool		nulls[AUD_NCOLUMNS];
	Datum		addr;

	if (rel == NULL)
		return false;

	memset(nulls, true, sizeof(nulls));
	SET(AUD_ID, Int64GetDatum(nextval_internal(ledger_relid("audit_log_id_seq"), false)));
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

	insert_row(rel, values, nulls);
	table_close(rel, NoLock);
	return true;
}
