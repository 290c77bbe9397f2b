/*
 * report_funcs.c: complete_effect() and fail_effect(), a worker's report that
 * an attempt of an effect happened or definitively did not, and
 * reconcile_effect(), a reconciler's of what the provider's own record says
 * of an attempt whose outcome is unknown, and reconcilable_from(), when it
 * may be made (report.c judges them).
 */
#include "postgres.h"

#include "funcapi.h"
#include "utils/timestamp.h"

#include "decision.h"

PG_FUNCTION_INFO_V1(dl_complete_effect_1_3);
PG_FUNCTION_INFO_V1(dl_fail_effect_1_3);
PG_FUNCTION_INFO_V1(dl_reconcile_effect_1_3);
PG_FUNCTION_INFO_V1(dl_reconcilable_from_1_3);

/* The effect's row as the function's result. */
static Datum
effect_result(TupleDesc desc, HeapTuple row)
{
	Datum		result = PointerGetDatum(SPI_returntuple(row, desc));

	dl_spi_finish();
	return result;
}

static Datum
report_outcome(FunctionCallInfo fcinfo, EffectStatus reported)
{
	char	   *key = dl_required_text_arg(fcinfo, 0, "key", 0);
	Jsonb	   *value = dl_optional_jsonb_arg(fcinfo, 1);
	int32		attempt = dl_optional_attempt_arg(fcinfo, 2);
	TupleDesc	desc = dl_result_desc(fcinfo);

	dl_check_writable(reported == EFFECT_COMPLETED ? "complete_effect()" : "fail_effect()");
	dl_spi_connect();
	return effect_result(desc, dl_report(key, attempt, reported, value));
}

/* complete_effect(key text, result jsonb, attempt integer) RETURNS durable_ledger.effects */
Datum
dl_complete_effect_1_3(PG_FUNCTION_ARGS)
{
	return report_outcome(fcinfo, EFFECT_COMPLETED);
}

/* fail_effect(key text, error jsonb, attempt integer) RETURNS durable_ledger.effects */
Datum
dl_fail_effect_1_3(PG_FUNCTION_ARGS)
{
	return report_outcome(fcinfo, EFFECT_FAILED);
}

/*
 * reconcile_effect(key text, attempt integer, happened boolean, evidence jsonb)
 * RETURNS durable_ledger.effects
 */
Datum
dl_reconcile_effect_1_3(PG_FUNCTION_ARGS)
{
	char	   *key = dl_required_text_arg(fcinfo, 0, "key", 0);
	int32		attempt = dl_required_attempt_arg(fcinfo, 1);
	TupleDesc	desc = dl_result_desc(fcinfo);
	bool		happened;
	Jsonb	   *evidence;

	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("happened must not be null"),
				 errdetail("A reconciler records only what the provider's record says: that the effect happened, or that it did not. Anything else waits for a person.")));
	happened = PG_GETARG_BOOL(2);
	evidence = dl_required_jsonb_arg(fcinfo, 3, "evidence");
	dl_check_writable("reconcile_effect()");
	dl_spi_connect();
	PG_RETURN_DATUM(effect_result(desc, dl_reconcile(key, attempt, happened, evidence)));
}

/*
 * reconcilable_from(key text, attempt integer) RETURNS timestamptz
 *
 * NULL when the attempt may not be reconciled (report.c says when).
 */
Datum
dl_reconcilable_from_1_3(PG_FUNCTION_ARGS)
{
	char	   *key = dl_required_text_arg(fcinfo, 0, "key", 0);
	int32		attempt = dl_required_attempt_arg(fcinfo, 1);
	TimestampTz from;
	bool		found;

	dl_spi_connect();
	found = dl_reconcilable_from(key, attempt, &from);
	dl_spi_finish();
	if (!found)
		PG_RETURN_NULL();
	PG_RETURN_TIMESTAMPTZ(from);
}
