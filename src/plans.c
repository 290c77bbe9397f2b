/*
 * plans.c: the ledger's SQL statements run through SPI, each prepared once
 * per backend and kept (SPI_keepplan).  Statements are parameterised and
 * schema-qualified down to the operators (a pinned search_path is not enough
 * against a temporary table that shadows a name).
 *
 * Run with read_only = false, so that under READ COMMITTED each statement
 * reads with a fresh snapshot: a lease that had to be waited for is followed
 * by reads that see what its previous holder committed.
 */
#include "postgres.h"

#include "access/xact.h"
#include "miscadmin.h"
#include "nodes/parsenodes.h"
#include "utils/builtins.h"
#include "utils/snapmgr.h"

#include "store.h"

static SPIPlanPtr
prepared(Statement *stmt)
{
	if (stmt->plan == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare_cursor(stmt->sql, stmt->nargs, stmt->argtypes,
											  stmt->replan ? CURSOR_OPT_CUSTOM_PLAN : 0);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s",
				 stmt->sql, SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		stmt->plan = plan;
	}
	return stmt->plan;
}

/* Runs stmt with the given parameters; returns SPI_processed. */
uint64
dl_plan_run(Statement *stmt, Datum *values, const char *nulls, int expected)
{
	int			rc = SPI_execute_plan(prepared(stmt), values, nulls, false, 0);

	if (rc != expected)
		elog(ERROR, "SPI_execute_plan returned %s for \"%s\"",
			 SPI_result_code_string(rc), stmt->sql);
	return SPI_processed;
}

/*
 * As dl_plan_run, but reading with the latest snapshot, whatever the
 * isolation level: a question about now (is a lease live?) must not be
 * answered from a REPEATABLE READ transaction's old snapshot.
 */
uint64
dl_plan_run_now(Statement *stmt, Datum *values, const char *nulls, int expected)
{
	int			rc;

	if (!IsolationUsesXactSnapshot())
		return dl_plan_run(stmt, values, nulls, expected);
	rc = SPI_execute_snapshot(prepared(stmt), values, nulls, GetLatestSnapshot(),
							  InvalidSnapshot, false, false, 0);
	if (rc != expected)
		elog(ERROR, "SPI_execute_snapshot returned %s for \"%s\"",
			 SPI_result_code_string(rc), stmt->sql);
	return SPI_processed;
}

Datum
dl_text_datum(const char *s)
{
	return PointerGetDatum(cstring_to_text(s));
}

/* The role as after SET ROLE: SECURITY DEFINER changes only the current user. */
char *
dl_caller_role_name(void)
{
	return GetUserNameFromId(GetOuterUserId(), false);
}
