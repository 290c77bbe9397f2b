/*
 * tables.c: the ledger's tables as the store layer knows them.  Columns are
 * found by name, once per table and again whenever the relcache says the
 * table changed; a column must hold what the ledger reads and writes in it
 * (its base type), or the ledger refuses to touch the table.
 */
#include "postgres.h"

#include "access/table.h"
#include "access/genam.h"
#include "catalog/indexing.h"
#include "catalog/namespace.h"
#include "catalog/pg_extension.h"
#include "catalog/pg_type.h"
#include "nodes/nodeFuncs.h"
#include "rewrite/rewriteHandler.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "access/htup_details.h"
#include "utils/inval.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"
#include "utils/rel.h"

#include "tables.h"

static const Column effects_columns[EFF_NCOLUMNS] = {
	{"key", TEXTOID}, {"run", TEXTOID}, {"tool", TEXTOID}, {"args", JSONBOID},
	{"business_key", BOOLOID}, {"occurrence", INT4OID}, {"attempt", INT4OID},
	{"status", TEXTOID}, {"result", JSONBOID}, {"error", JSONBOID}, {"meta", JSONBOID},
	{"lease_epoch", INT8OID}, {"holder_pid", INT4OID}, {"created_at", TIMESTAMPTZOID},
	{"completed_at", TIMESTAMPTZOID}, {"resolved_by", TEXTOID},
	{"resolution_note", TEXTOID}, {"conflict", BOOLOID}, {"forked_from", TEXTOID},
	{"safe_to_redo", BOOLOID}, {"execute_again", BOOLOID},
	{"local", BOOLOID}, {"approval", TEXTOID}, {"approver", TEXTOID},
	{"approval_note", TEXTOID}
};

static const Column audit_columns[AUD_NCOLUMNS] = {
	{"id", INT8OID}, {"logged_at", TIMESTAMPTZOID}, {"run", TEXTOID}, {"key", TEXTOID},
	{"event", TEXTOID}, {"detail", JSONBOID}, {"role_name", TEXTOID},
	{"session_user_name", TEXTOID}, {"application_name", TEXTOID},
	{"client_addr", INETOID}, {"backend_pid", INT4OID}, {"lease_epoch", INT8OID},
	{"attempt", INT4OID}, {"chain", INT8OID}, {"chain_seq", INT8OID}, {"row_hash", BYTEAOID}
};

static const Column runs_columns[RUN_NCOLUMNS] = {
	{"run", TEXTOID}, {"epochs", INT8OID}, {"lock_key", INT8OID}, {"holder_pid", INT4OID},
	{"holder_role", TEXTOID}, {"holder_application_name", TEXTOID},
	{"holder_client_addr", INETOID}, {"acquired_at", TIMESTAMPTZOID},
	{"released_at", TIMESTAMPTZOID}, {"created_at", TIMESTAMPTZOID},
	{"lease_kind", TEXTOID}, {"abandoned_at", TIMESTAMPTZOID}, {"abandoned_by", TEXTOID},
	{"abandon_note", TEXTOID}, {"forked_from", TEXTOID}, {"forked_up_to", TEXTOID},
	{"max_attempts", INT4OID}
};

static const Column token_columns[TOK_NCOLUMNS] = {
	{"run", TEXTOID}, {"epoch", INT8OID}, {"token_sha256", BYTEAOID}, {"holder", TEXTOID},
	{"ttl", INTERVALOID}, {"taken_at", TIMESTAMPTZOID}, {"expires_at", TIMESTAMPTZOID},
	{"released_at", TIMESTAMPTZOID}
};

static const Column calls_columns[CALLS_NCOLUMNS] = {
	{"run", TEXTOID}, {"epoch", INT8OID}, {"call", BYTEAOID}, {"calls", INT4OID}
};

static const Column past_columns[PAST_NCOLUMNS] = {
	{"key", TEXTOID}, {"attempt", INT4OID}, {"run", TEXTOID}, {"lease_epoch", INT8OID},
	{"holder_pid", INT4OID}, {"status", TEXTOID}, {"error", JSONBOID}, {"meta", JSONBOID},
	{"created_at", TIMESTAMPTZOID}, {"completed_at", TIMESTAMPTZOID},
	{"resolved_by", TEXTOID}, {"resolution_note", TEXTOID}, {"replaced_at", TIMESTAMPTZOID},
	{"args", JSONBOID}
};

static const Column tools_columns[TOOL_NCOLUMNS] = {
	{"tool", TEXTOID}, {"side_effecting", BOOLOID}, {"divergence", TEXTOID},
	{"key_fields", TEXTARRAYOID}, {"note", TEXTOID}, {"registered_by", TEXTOID},
	{"registered_at", TIMESTAMPTZOID}, {"changed_by", TEXTOID},
	{"changed_at", TIMESTAMPTZOID}, {"retired_by", TEXTOID}, {"retired_at", TIMESTAMPTZOID},
	{"reconcile_grace", INTERVALOID}, {"approval", JSONPATHOID},
	{"max_executions", INT4OID}, {"max_in_window", INT4OID}, {"budget_window", INTERVALOID}
};

static const Column divergences_columns[DIV_NCOLUMNS] = {
	{"key", TEXTOID}, {"run", TEXTOID}, {"lease_epoch", INT8OID}, {"tool", TEXTOID},
	{"args", JSONBOID}, {"occurrence", INT4OID}, {"candidate_key", TEXTOID},
	{"detected_at", TIMESTAMPTZOID}, {"verdict", TEXTOID}, {"same_as", TEXTOID},
	{"resolved_by", TEXTOID}, {"resolved_at", TIMESTAMPTZOID},
	{"resolution_note", TEXTOID}
};

static const Column policy_columns[POL_NCOLUMNS] = {
	{"singleton", BOOLOID}, {"unregistered_tools", TEXTOID}, {"changed_by", TEXTOID},
	{"changed_at", TIMESTAMPTZOID}, {"note", TEXTOID}, {"unregistered_divergence", TEXTOID},
	{"max_run_attempts", INT4OID}
};

static const Column budgets_columns[BUD_NCOLUMNS] = {
	{"run", TEXTOID}, {"tool", TEXTOID}, {"executions", INT4OID},
	{"recent", TIMESTAMPTZARRAYOID}, {"max_executions", INT4OID}, {"max_in_window", INT4OID},
	{"paused_at", TIMESTAMPTZOID}, {"paused_key", TEXTOID}, {"paused_args", JSONBOID},
	{"paused_epoch", INT8OID}, {"paused_reason", TEXTOID}, {"paused_budget", TEXTOID}
};

static const Column models_columns[MOD_NCOLUMNS] = {
	{"run", TEXTOID}, {"lease_epoch", INT8OID}, {"model", TEXTOID},
	{"changed_from", TEXTOID}, {"recorded_at", TIMESTAMPTZOID}
};

static const Column unsettled_columns[UNS_NCOLUMNS] = {
	{"created_at", TIMESTAMPTZOID}, {"key", TEXTOID}
};

LedgerTable dl_effects_table = {"effects", effects_columns, EFF_NCOLUMNS};
LedgerTable dl_unsettled_table = {"unsettled", unsettled_columns, UNS_NCOLUMNS};
LedgerTable dl_audit_table = {"audit_log", audit_columns, AUD_NCOLUMNS};
LedgerTable dl_runs_table = {"runs", runs_columns, RUN_NCOLUMNS};
LedgerTable dl_past_table = {"past_attempts", past_columns, PAST_NCOLUMNS};
LedgerTable dl_token_table = {"token_leases", token_columns, TOK_NCOLUMNS};
LedgerTable dl_calls_table = {"token_lease_calls", calls_columns, CALLS_NCOLUMNS};
LedgerTable dl_tools_table = {"tools", tools_columns, TOOL_NCOLUMNS};
LedgerTable dl_divergences_table = {"divergences", divergences_columns, DIV_NCOLUMNS};
LedgerTable dl_policy_table = {"policy", policy_columns, POL_NCOLUMNS};
LedgerTable dl_budgets_table = {"run_budgets", budgets_columns, BUD_NCOLUMNS};
LedgerTable dl_models_table = {"run_models", models_columns, MOD_NCOLUMNS};

/* A table (or one of its indexes) changed: look it up again before writing. */
static void
relcache_changed(Datum arg, Oid relid)
{
	LedgerTable *tables[] = {&dl_effects_table, &dl_unsettled_table, &dl_audit_table, &dl_runs_table,
	&dl_past_table, &dl_token_table, &dl_calls_table, &dl_tools_table,
	&dl_divergences_table, &dl_policy_table, &dl_budgets_table, &dl_models_table};
	int			i;

	for (i = 0; i < lengthof(tables); i++)
		if (!OidIsValid(relid) || relid == tables[i]->relid)
			tables[i]->relid = InvalidOid;
}

void
dl_tables_init(void)
{
	CacheRegisterRelcacheCallback(relcache_changed, (Datum) 0);
}

static Oid
ledger_relid(const char *name)
{
	Oid			relid = get_relname_relid(name, get_namespace_oid("durable_ledger", false));

	if (!OidIsValid(relid))
		elog(ERROR, "relation durable_ledger.%s does not exist", name);
	return relid;
}

/*
 * The sequence a column's default draws from, when the default is nothing
 * but that (nextval of a sequence, or an identity); else InvalidOid.
 */
static Oid
default_sequence(Relation rel, AttrNumber attnum)
{
	Node	   *expr = build_column_default(rel, attnum);

	if (expr != NULL && IsA(expr, NextValueExpr))
		return ((NextValueExpr *) expr)->seqid;
	if (expr != NULL && IsA(expr, FuncExpr) && ((FuncExpr *) expr)->funcid == F_NEXTVAL &&
		list_length(((FuncExpr *) expr)->args) == 1 &&
		IsA(linitial(((FuncExpr *) expr)->args), Const) &&
		!((Const *) linitial(((FuncExpr *) expr)->args))->constisnull)
		return DatumGetObjectId(((Const *) linitial(((FuncExpr *) expr)->args))->constvalue);
	return InvalidOid;
}

/*
 * The attributes of rel whose type is a domain: SQL checks a domain's
 * constraints when a value is assigned to such a column, and so must we.
 */
static void
learn_domains(LedgerTable *t, Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	int			i;

	t->ndomains = 0;
	t->domain_attnums = palloc(sizeof(AttrNumber) * desc->natts);
	t->domain_types = palloc(sizeof(Oid) * desc->natts);
	t->domain_checks = palloc0(sizeof(void *) * desc->natts);
	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);

		if (att->attisdropped || att->attgenerated || get_typtype(att->atttypid) != TYPTYPE_DOMAIN)
			continue;
		t->domain_attnums[t->ndomains] = att->attnum;
		t->domain_types[t->ndomains] = att->atttypid;
		t->ndomains++;
	}
}

/*
 * Checks the values in slot of t's domain-typed attributes (all of them, or
 * those in only, offset by FirstLowInvalidHeapAttributeNumber as in
 * updatedCols) against their domains' constraints.
 */
void
dl_check_domains(LedgerTable *t, TupleTableSlot *slot, Bitmapset *only)
{
	int			i;

	for (i = 0; i < t->ndomains; i++)
	{
		AttrNumber	attnum = t->domain_attnums[i];

		if (only != NULL && !bms_is_member(attnum - FirstLowInvalidHeapAttributeNumber, only))
			continue;
		domain_check(slot->tts_values[attnum - 1], slot->tts_isnull[attnum - 1],
					 t->domain_types[i], &t->domain_checks[i], t->cxt);
	}
}

/* The version of the extension's SQL objects in this database, or NULL. */
static char *
installed_version(void)
{
	Relation	rel = table_open(ExtensionRelationId, AccessShareLock);
	ScanKeyData key;
	SysScanDesc scan;
	HeapTuple	tuple;
	char	   *version = NULL;

	ScanKeyInit(&key, Anum_pg_extension_extname, BTEqualStrategyNumber, F_NAMEEQ,
				CStringGetDatum("durable_ledger"));
	scan = systable_beginscan(rel, ExtensionNameIndexId, true, NULL, 1, &key);
	tuple = systable_getnext(scan);
	if (HeapTupleIsValid(tuple))
	{
		bool		isnull;
		Datum		d = heap_getattr(tuple, Anum_pg_extension_extversion,
									 RelationGetDescr(rel), &isnull);

		if (!isnull)
			version = TextDatumGetCString(d);
	}
	systable_endscan(scan);
	table_close(rel, AccessShareLock);
	return version;
}

/*
 * A column the ledger writes is missing: the objects are of an older version
 * than this library (ALTER EXTENSION ... UPDATE not run yet; then the call
 * fails as older_funcs.c's do), or someone dropped it.
 */
static void
report_missing_column(LedgerTable *t, const char *column)
{
	char	   *version = installed_version();

	if (version != NULL && strcmp(version, DL_LIBRARY_VERSION) != 0)
		dl_error_older_sql(version);
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_COLUMN),
			 errmsg("durable_ledger.%s has no column \"%s\"", t->name, column),
			 errhint("Restore the columns the extension created.")));
}

/*
 * Learns where t's columns are in relation rel (opened and locked), and
 * checks that each holds what the ledger writes into it, compared as the
 * ledger compares it: byte for byte, which a nondeterministic collation
 * (case-insensitive, say) would not do in the ledger's lookups and queries.
 * Only once every check has passed is anything kept for the backend.
 */
static void
learn_table(LedgerTable *t, Relation rel)
{
	TupleDesc	desc = RelationGetDescr(rel);
	MemoryContext cxt;
	MemoryContext old;
	AttrNumber *found = palloc(sizeof(AttrNumber) * t->ncolumns);
	AttrNumber *attnums;
	int			i;

	for (i = 0; i < t->ncolumns; i++)
	{
		AttrNumber	attnum = get_attnum(RelationGetRelid(rel), t->columns[i].name);
		Form_pg_attribute att;
		Oid			type;

		if (attnum == InvalidAttrNumber)
			report_missing_column(t, t->columns[i].name);
		att = TupleDescAttr(desc, attnum - 1);
		type = getBaseType(att->atttypid);
		if (type != t->columns[i].type)
			ereport(ERROR,
					(errcode(ERRCODE_DATATYPE_MISMATCH),
					 errmsg("column \"%s\" of durable_ledger.%s is of type %s, but the ledger writes %s",
							t->columns[i].name, t->name, format_type_be(type),
							format_type_be(t->columns[i].type))));
		if (OidIsValid(att->attcollation) && !get_collation_isdeterministic(att->attcollation))
			ereport(ERROR,
					(errcode(ERRCODE_COLLATION_MISMATCH),
					 errmsg("column \"%s\" of durable_ledger.%s has the nondeterministic collation \"%s\", but the ledger compares its values byte for byte",
							t->columns[i].name, t->name, get_collation_name(att->attcollation)),
					 errhint("Give the column back the collation the extension created it with.")));
		found[i] = attnum;
	}
	cxt = AllocSetContextCreate(TopMemoryContext, "durable_ledger writer",
								ALLOCSET_SMALL_SIZES);
	attnums = MemoryContextAlloc(cxt, sizeof(AttrNumber) * t->ncolumns);
	memcpy(attnums, found, sizeof(AttrNumber) * t->ncolumns);
	pfree(found);
	if (t->cxt != NULL)
		MemoryContextDelete(t->cxt);
	t->cxt = cxt;
	t->attnums = attnums;
	old = MemoryContextSwitchTo(cxt);
	learn_domains(t, rel);
	MemoryContextSwitchTo(old);
	t->first_sequence = default_sequence(rel, attnums[0]);
	t->relid = RelationGetRelid(rel);
	t->learned++;
}


/*
 * Which ledger this is: the OID of its runs table, which a DROP EXTENSION
 * and CREATE EXTENSION in one session changes.
 */
Oid
dl_ledger_identity(void)
{
	return OidIsValid(dl_runs_table.relid) ? dl_runs_table.relid : ledger_relid(dl_runs_table.name);
}

/* The same, looked up afresh; InvalidOid when the database has no ledger now. */
Oid
dl_ledger_identity_if_any(void)
{
	Oid			schema = get_namespace_oid("durable_ledger", true);

	return OidIsValid(schema) ? get_relname_relid(dl_runs_table.name, schema) : InvalidOid;
}

/*
 * Opens the ledger table t with lockmode.  When what we knew went stale
 * (opening the table reads invalidations), its name is looked up again: the
 * table may have been renamed or replaced while we waited for its lock.
 */
Relation
dl_open_table(LedgerTable *t, LOCKMODE lockmode)
{
	for (;;)
	{
		Oid			relid = OidIsValid(t->relid) ? t->relid : ledger_relid(t->name);
		Relation	rel = table_open(relid, lockmode);

		if (t->relid == relid)
			return rel;
		if (ledger_relid(t->name) == relid)
		{
			learn_table(t, rel);
			return rel;
		}
		table_close(rel, lockmode);
		t->relid = InvalidOid;
	}
}

static Jsonb *
slot_jsonb(TupleTableSlot *slot, AttrNumber attnum)
{
	return slot->tts_isnull[attnum - 1] ? NULL :
		DatumGetJsonbPCopy(slot->tts_values[attnum - 1]);
}

/* The effects row in slot as an EffectRow, copied out of the page. */
void
dl_effect_row_from_slot(TupleTableSlot *slot, EffectRow *row)
{
	AttrNumber *a = dl_effects_table.attnums;
	Datum	   *v;
	bool	   *n;

	slot_getallattrs(slot);
	v = slot->tts_values;
	n = slot->tts_isnull;
	row->key = TextDatumGetCString(v[a[EFF_KEY] - 1]);
	row->run = TextDatumGetCString(v[a[EFF_RUN] - 1]);
	row->tool = TextDatumGetCString(v[a[EFF_TOOL] - 1]);
	row->args = DatumGetJsonbPCopy(v[a[EFF_ARGS] - 1]);
	row->business_key = DatumGetBool(v[a[EFF_BUSINESS_KEY] - 1]);
	row->occurrence = n[a[EFF_OCCURRENCE] - 1] ? 0 : DatumGetInt32(v[a[EFF_OCCURRENCE] - 1]);
	row->attempt = DatumGetInt32(v[a[EFF_ATTEMPT] - 1]);
	row->status = dl_status_from_name(TextDatumGetCString(v[a[EFF_STATUS] - 1]));
	row->result = slot_jsonb(slot, a[EFF_RESULT]);
	row->error = slot_jsonb(slot, a[EFF_ERROR]);
	row->lease_epoch = DatumGetInt64(v[a[EFF_LEASE_EPOCH] - 1]);
	row->conflict = DatumGetBool(v[a[EFF_CONFLICT] - 1]);
	row->created_at = DatumGetTimestampTz(v[a[EFF_CREATED_AT] - 1]);
	row->safe_to_redo = !n[a[EFF_SAFE_TO_REDO] - 1] && DatumGetBool(v[a[EFF_SAFE_TO_REDO] - 1]);
	row->execute_again = !n[a[EFF_EXECUTE_AGAIN] - 1] && DatumGetBool(v[a[EFF_EXECUTE_AGAIN] - 1]);
	row->local = !n[a[EFF_LOCAL] - 1] && DatumGetBool(v[a[EFF_LOCAL] - 1]);
	/* a person's retry names them; a reconciler's finding names nobody */
	row->reconciled = row->execute_again && n[a[EFF_RESOLVED_BY] - 1];
	row->approval = APPROVAL_NONE;
	if (!n[a[EFF_APPROVAL] - 1])
	{
		char	   *approval = TextDatumGetCString(v[a[EFF_APPROVAL] - 1]);

		row->approval = strcmp(approval, "requested") == 0 ? APPROVAL_REQUESTED :
			strcmp(approval, "approved") == 0 ? APPROVAL_APPROVED : APPROVAL_REJECTED;
	}
}

