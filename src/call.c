/*
 * call.c: what every SQL-callable function of the ledger needs: its
 * arguments checked (a NULL where a value is required is 22004, never a
 * silent NULL answer), its result type, refusing a standby, SPI.
 */
#include "postgres.h"

#include "access/xact.h"
#include "access/xlog.h"
#include "executor/spi.h"
#include "funcapi.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/inet.h"
#include "common/int.h"
#include "datatype/timestamp.h"
#include "utils/jsonb.h"

#include "common.h"

/*
 * Returns argument argno as a C string, refusing NULL (22004), the empty
 * string and text longer than max_chars characters (22023).
 */
char *
dl_required_text_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
					 int max_chars)
{
	text	   *t;
	int			nbytes;
	int			nchars;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));

	t = PG_GETARG_TEXT_PP(argno);
	nbytes = VARSIZE_ANY_EXHDR(t);
	if (nbytes == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", argname)));

	if (max_chars > 0)
	{
		nchars = pg_mbstrlen_with_len(VARDATA_ANY(t), nbytes);
		if (nchars > max_chars)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s is too long", argname),
					 errdetail("It has %d characters; at most %d are allowed.",
							   nchars, max_chars)));
	}
	return text_to_cstring(t);
}

/*
 * A run and a tool that an effect's row may hold: together they fit in the
 * index entry that holds both (DL_MAX_RUN_TOOL_BYTES), checked before
 * anything is written rather than met as the index's own error.
 */
void
dl_check_run_and_tool(const char *run, const char *tool)
{
	size_t		run_bytes = strlen(run);
	size_t		tool_bytes = strlen(tool);

	if (run_bytes + tool_bytes > DL_MAX_RUN_TOOL_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("run and tool are too long together"),
				 errdetail("They take %zu and %zu bytes; an effect's run and tool may take at most %d bytes together.",
						   run_bytes, tool_bytes, DL_MAX_RUN_TOOL_BYTES)));
}

/*
 * An optional attempt number (argument argno, absent in older SQL
 * declarations): 0 when NULL or absent, else at least 1 (22023).
 */
int32
dl_optional_attempt_arg(FunctionCallInfo fcinfo, int argno)
{
	int32		attempt;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return 0;
	attempt = PG_GETARG_INT32(argno);
	if (attempt < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("attempt must be at least 1"),
				 errdetail("The attempt given was %d.", attempt)));
	return attempt;
}

/* A required attempt number: not NULL (22004), at least 1 (22023). */
int32
dl_required_attempt_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("attempt must not be null"),
				 errhint("Name the attempt you checked: durable_ledger.unresolved and effect_status() show it.")));
	return dl_optional_attempt_arg(fcinfo, argno);
}

/*
 * The extension's SQL objects in this database are of an older version than
 * this library (sql_version, when known): ALTER EXTENSION ... UPDATE was not
 * run yet.  The library's rules need the newer tables: nothing is written.
 */
void
dl_error_older_sql(const char *sql_version)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("the durable_ledger extension in this database is older than its library"),
			 sql_version ?
			 errdetail("The installed library is version %s; the extension's SQL objects are version %s.",
					   DL_LIBRARY_VERSION, sql_version) :
			 errdetail("The installed library is version %s; the extension's SQL objects are of an earlier version.",
					   DL_LIBRARY_VERSION),
			 errhint("Run ALTER EXTENSION durable_ledger UPDATE in this database.")));
}

char *
dl_optional_text_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		return NULL;
	return text_to_cstring(PG_GETARG_TEXT_PP(argno));
}

Jsonb *
dl_required_jsonb_arg(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname),
				 errhint("Use the JSON value 'null'::jsonb for a call without arguments.")));
	return PG_GETARG_JSONB_P(argno);
}

Jsonb *
dl_optional_jsonb_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		return NULL;
	return PG_GETARG_JSONB_P(argno);
}

/*
 * Every function that writes the ledger refuses a hot standby and a
 * read-only transaction first, before it takes any lock: a lease taken on a
 * standby would outlive its promotion.
 */
void
dl_check_writable(const char *function)
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
 * PREPARE TRANSACTION of a transaction that used the ledger: its occurrence
 * counters, epochs and durability rule need the outcome at COMMIT.
 */
void
dl_refuse_prepare(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
			 errmsg("cannot PREPARE a transaction that used the ledger"),
			 errdetail("The ledger's occurrence counters and durability rules need the transaction's outcome at COMMIT.")));
}

/*
 * The function's composite result type, looked up on its first call and kept
 * with its FmgrInfo for the calls that follow (a query calling it per row).
 */
TupleDesc
dl_result_desc(FunctionCallInfo fcinfo)
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

void
dl_spi_connect(void)
{
	if (SPI_connect() != SPI_OK_CONNECT)
		elog(ERROR, "SPI_connect failed");
}

void
dl_spi_finish(void)
{
	if (SPI_finish() != SPI_OK_FINISH)
		elog(ERROR, "SPI_finish failed");
}

/* An attempt that the effect has not reached: an error, nothing written. */
void
dl_error_no_such_attempt(const char *key, int32 attempt, int32 current_attempt)
{
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("effect \"%s\" has no attempt %d", key, attempt),
			 errdetail("Its current attempt is %d.", current_attempt),
			 errhint("Name the attempt that begin_effect() returned.")));
}

/*
 * An interval as a fixed number of microseconds, days of 24 hours and months
 * of 30 days (a year is 360 days here; EXTRACT(epoch FROM interval) counts
 * 365.25), whatever the session's time zone; false when it does not fit in
 * 64 bits.
 */
bool
dl_interval_usecs(const Interval *span, int64 *usecs)
{
	int64		days;
	int64		total;

	if (pg_mul_s64_overflow((int64) span->month, DAYS_PER_MONTH, &days) ||
		pg_add_s64_overflow(days, (int64) span->day, &days) ||
		pg_mul_s64_overflow(days, USECS_PER_DAY, &total) ||
		pg_add_s64_overflow(total, span->time, &total))
		return false;
	*usecs = total;
	return true;
}

/* Equal JSON values, or both SQL NULL. */
bool
dl_jsonb_equal(Jsonb *a, Jsonb *b)
{
	if (a == NULL || b == NULL)
		return a == b;
	return compareJsonbContainers(&a->root, &b->root) == 0;
}

/* The client's address, as inet_client_addr() gives it; false for a local socket. */
bool
dl_client_addr(Datum *addr)
{
	LOCAL_FCINFO(fcinfo, 0);

	InitFunctionCallInfoData(*fcinfo, NULL, 0, InvalidOid, NULL, NULL);
	*addr = inet_client_addr(fcinfo);
	return !fcinfo->isnull;
}

/*
 * A budget argument (set_budget, set_attempts_budget, set_run_budget): NULL
 * (0: none), or from 1 to max (0: no bound).  A window's limit is bounded:
 * the times of that many latest executions are kept per run and tool.
 */
int32
dl_budget_arg(FunctionCallInfo fcinfo, int argno, const char *argname, int32 max)
{
	int32		value;

	if (PG_ARGISNULL(argno))
		return 0;
	value = PG_GETARG_INT32(argno);
	if (value < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be at least 1, not %d", argname, value),
				 errhint("A budget of none is NULL; a tool that must not execute is retired (retire_tool).")));
	if (max > 0 && value > max)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be at most %d, not %d", argname, max, value),
				 errdetail("The times of that many latest executions are kept per run and tool.")));
	return value;
}
