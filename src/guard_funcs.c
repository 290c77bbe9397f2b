/*
 * guard_funcs.c: refuses to drop a ledger that holds effects.
 *
 * An event trigger at ddl_command_start sees the parse tree of DROP
 * EXTENSION, DROP SCHEMA and DROP OWNED before anything is dropped.  When the
 * command would take durable_ledger with it while durable_ledger.effects has
 * rows, it fails, unless the session set durable_ledger.allow_drop = on.
 * (A C function is needed: only C event triggers see the parse tree, and
 * calling one loads the library, which defines the setting.)
 */
#include "postgres.h"

#include "commands/event_trigger.h"
#include "executor/spi.h"
#include "nodes/parsenodes.h"
#include "utils/acl.h"
#include "utils/guc.h"

#include "common.h"

PG_FUNCTION_INFO_V1(dl_guard_drop);

void		dl_drop_guard_init(void);

/* durable_ledger.allow_drop */
static bool allow_drop = false;

void
dl_drop_guard_init(void)
{
	DefineCustomBoolVariable("durable_ledger.allow_drop",
							 "Allows DROP EXTENSION durable_ledger while the ledger holds effects.",
							 "The ledger is safety-critical data; dropping it loses every record of which side effects already happened.",
							 &allow_drop,
							 false,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);
}

#define EXTENSION_NAME "durable_ledger"
#define SCHEMA_NAME "durable_ledger"

static bool
list_names(List *objects, const char *name)
{
	ListCell   *lc;

	foreach(lc, objects)
	{
		Node	   *object = lfirst(lc);

		/* extensions and schemas are named by a String node */
		if (IsA(object, String) && strcmp(strVal(object), name) == 0)
			return true;
	}
	return false;
}

/* The owner of the extension, or InvalidOid when it is not installed. */
static Oid
extension_owner(void)
{
	Oid			owner = InvalidOid;
	bool		isnull;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute("SELECT extowner FROM pg_catalog.pg_extension"
					" WHERE extname OPERATOR(pg_catalog.=) '" EXTENSION_NAME "'",
					true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read pg_extension");
	if (SPI_processed == 1)
		owner = DatumGetObjectId(SPI_getbinval(SPI_tuptable->vals[0],
											   SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	return owner;
}

/* DROP OWNED BY roles drops the extension when one of them owns it. */
static bool
owner_listed(List *roles)
{
	Oid			owner = extension_owner();
	ListCell   *lc;

	foreach(lc, roles)
	{
		if (OidIsValid(owner) && get_rolespec_oid(lfirst(lc), true) == owner)
			return true;
	}
	return false;
}

static bool
command_drops_ledger(Node *parsetree)
{
	if (IsA(parsetree, DropStmt))
	{
		DropStmt   *stmt = (DropStmt *) parsetree;

		if (stmt->removeType == OBJECT_EXTENSION)
			return list_names(stmt->objects, EXTENSION_NAME);
		if (stmt->removeType == OBJECT_SCHEMA)
			return stmt->behavior == DROP_CASCADE &&
				list_names(stmt->objects, SCHEMA_NAME);
		return false;
	}
	if (IsA(parsetree, DropOwnedStmt))
		return owner_listed(((DropOwnedStmt *) parsetree)->roles);
	return false;
}

static bool
ledger_holds_effects(void)
{
	bool		holds;
	bool		isnull;

	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
	if (SPI_execute("SELECT EXISTS (SELECT 1 FROM " SCHEMA_NAME ".effects)", true, 1) != SPI_OK_SELECT)
		elog(ERROR, "could not read durable_ledger.effects");
	holds = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	SPI_finish();
	return holds;
}

Datum
dl_guard_drop(PG_FUNCTION_ARGS)
{
	EventTriggerData *trigdata;

	if (!CALLED_AS_EVENT_TRIGGER(fcinfo))
		ereport(ERROR,
				(errcode(ERRCODE_E_R_I_E_EVENT_TRIGGER_PROTOCOL_VIOLATED),
				 errmsg("guard_drop() must be called as an event trigger")));
	trigdata = (EventTriggerData *) fcinfo->context;

	if (allow_drop || !command_drops_ledger(trigdata->parsetree))
		PG_RETURN_VOID();

	if (ledger_holds_effects())
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("cannot drop the durable_ledger extension while the ledger holds effects"),
				 errdetail("Dropping it would lose the record of which side effects already happened, and with it the protection against performing them again."),
				 errhint("Back up the ledger first (pg_dump), then SET durable_ledger.allow_drop = on in this session.")));
	PG_RETURN_VOID();
}
