/*
 * token_funcs.c: take_lease(), renew_lease() and release_lease(), the SQL
 * functions of token leases (token_lease.c keeps them).
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "lease.h"

PG_FUNCTION_INFO_V1(dl_take_lease_1_3);
PG_FUNCTION_INFO_V1(dl_renew_lease_1_3);
PG_FUNCTION_INFO_V1(dl_release_lease_1_1);

static Interval *
optional_ttl(FunctionCallInfo fcinfo, int argno)
{
	Interval   *ttl;

	if (PG_ARGISNULL(argno))
		return NULL;
	ttl = PG_GETARG_INTERVAL_P(argno);
	dl_check_ttl(ttl);
	return ttl;
}

/*
 * take_lease(run text, ttl interval, holder text) RETURNS durable_ledger.lease
 * (run, token, epoch, expires_at, holder), or NULL at once when a live lease
 * holds the run.
 */
Datum
dl_take_lease_1_3(PG_FUNCTION_ARGS)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	Interval   *ttl;
	char	   *holder = dl_optional_text_arg(fcinfo, 2);
	TupleDesc	desc = dl_result_desc(fcinfo);
	MemoryContext call_cxt = CurrentMemoryContext;
	TokenGrant	grant;
	bool		taken;
	Datum		values[5];
	bool		nulls[5] = {false};
	HeapTuple	tuple;

	if (PG_ARGISNULL(1))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("ttl must not be null")));
	ttl = optional_ttl(fcinfo, 1);
	dl_check_writable("take_lease()");

	dl_spi_connect();
	taken = dl_token_take(run, ttl, holder, &grant);
	if (taken)
	{
		MemoryContextSwitchTo(call_cxt);
		values[0] = CStringGetTextDatum(run);
		values[1] = CStringGetTextDatum(grant.token);
		values[2] = Int64GetDatum(grant.epoch);
		values[3] = TimestampTzGetDatum(grant.expires_at);
		values[4] = holder ? CStringGetTextDatum(holder) : (Datum) 0;
		nulls[4] = holder == NULL;
		tuple = heap_form_tuple(desc, values, nulls);
	}
	dl_spi_finish();
	if (!taken)
		PG_RETURN_NULL();
	PG_RETURN_DATUM(HeapTupleGetDatum(tuple));
}

/* renew_lease(token text, ttl interval) RETURNS timestamptz: the new expiry */
Datum
dl_renew_lease_1_3(PG_FUNCTION_ARGS)
{
	char	   *token = dl_required_text_arg(fcinfo, 0, "token", 0);
	Interval   *ttl = optional_ttl(fcinfo, 1);
	TimestampTz expires_at;

	dl_check_writable("renew_lease()");
	dl_spi_connect();
	expires_at = dl_token_renew(token, ttl);
	dl_spi_finish();
	PG_RETURN_TIMESTAMPTZ(expires_at);
}

/* release_lease(token text) RETURNS boolean: false when it was not live */
Datum
dl_release_lease_1_1(PG_FUNCTION_ARGS)
{
	char	   *token = dl_required_text_arg(fcinfo, 0, "token", 0);
	bool		released;

	dl_check_writable("release_lease()");
	dl_spi_connect();
	released = dl_token_release(token);
	dl_spi_finish();
	PG_RETURN_BOOL(released);
}
