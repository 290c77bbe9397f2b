/*
 * begin_funcs.c: begin_effect(), which records the intent of a side effect before
 * it happens and says whether to execute, replay, pause or wait; and
 * begin_recorded(), the same for a call that is harmless to make again (a
 * model's answer, a read), recorded so that a replay sees what it returned;
 * and begin_local(), begin_effect() for an effect that is a write in this
 * database, committed with its outcome (local.c).
 * The decision is decide.c's; this file parses the call and forms the row.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"
#include "utils/builtins.h"

#include "decision.h"

PG_FUNCTION_INFO_V1(dl_begin_effect_1_3);
PG_FUNCTION_INFO_V1(dl_begin_recorded_1_3);
PG_FUNCTION_INFO_V1(dl_begin_local_1_3);

/* The columns of durable_ledger.decision. */
#define DECISION_COLUMNS 9

/* Where a kind of call takes its optional arguments (-1: it has none). */
typedef struct BeginArgs
{
	const char *function;
	bool		recorded;
	bool		local;
	int			business_key;
	int			meta;
	int			lease;
	int			call_id;
} BeginArgs;

static const BeginArgs begin_effect_args = {
	.function = "begin_effect()", .recorded = false, .business_key = 3, .meta = 4, .lease = 5,
	.call_id = 6
};
static const BeginArgs begin_local_args = {
	.function = "begin_local()", .local = true, .business_key = 3, .meta = 4, .lease = 5,
	.call_id = -1
};
static const BeginArgs begin_recorded_args = {
	.function = "begin_recorded()", .recorded = true, .business_key = -1, .meta = 3, .lease = 4,
	.call_id = -1
};

/* The call as passed: names checked, nothing read yet. */
static void
parse_request(FunctionCallInfo fcinfo, const BeginArgs *kind, BeginRequest *request)
{
	memset(request, 0, sizeof(BeginRequest));
	request->run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	request->tool = dl_required_text_arg(fcinfo, 1, "tool", DL_MAX_TOOL_CHARS);
	request->args = dl_required_jsonb_arg(fcinfo, 2, "args");
	request->recorded = kind->recorded;
	request->local = kind->local;
	dl_check_run_and_tool(request->run, request->tool);
	if (kind->call_id >= 0 && PG_NARGS() > kind->call_id)
	{
		if (PG_ARGISNULL(kind->call_id))
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("call_id must not be null")));
		request->call_id = PG_GETARG_BOOL(kind->call_id);
	}
	if (kind->business_key >= 0 && !PG_ARGISNULL(kind->business_key))
	{
		char	   *business_key = dl_required_text_arg(fcinfo, kind->business_key,
														"business_key",
														DL_MAX_BUSINESS_KEY_CHARS);

		dl_check_business_key(business_key, request->call_id);
		request->business_key = business_key;
	}
	if (request->call_id && request->business_key == NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("call_id needs a business_key"),
				 errdetail("call_id says that business_key is a framework's id of this tool call."),
				 errhint("Pass the call's id as business_key (made of the run, the tool and the id), or leave call_id false.")));
	request->meta = dl_optional_jsonb_arg(fcinfo, kind->meta);
	if (PG_NARGS() > kind->lease && !PG_ARGISNULL(kind->lease))
		request->token = dl_required_text_arg(fcinfo, kind->lease, "lease", 0);
}

/* The answer as a row of durable_ledger.decision. */
static HeapTuple
form_decision(TupleDesc desc, const BeginAnswer *a)
{
	Datum		values[DECISION_COLUMNS];
	bool		nulls[DECISION_COLUMNS] = {false};
	int			i = 0;

	values[i++] = CStringGetTextDatum(a->key);
	values[i++] = CStringGetTextDatum(dl_decision_name(a->decision));
	nulls[i] = a->no_effect;
	values[i++] = a->no_effect ? (Datum) 0 : CStringGetTextDatum(dl_status_name(a->status));
	nulls[i] = a->business_key;
	values[i++] = Int32GetDatum(a->occurrence);
	nulls[i] = a->no_effect;
	values[i++] = Int32GetDatum(a->attempt);
	nulls[i] = a->result == NULL;
	values[i++] = PointerGetDatum(a->result);
	nulls[i] = a->error == NULL;
	values[i++] = PointerGetDatum(a->error);
	nulls[i] = a->reason == NULL;
	values[i++] = a->reason ? CStringGetTextDatum(a->reason) : (Datum) 0;
	nulls[i] = a->downstream_key == NULL;
	values[i++] = a->downstream_key ? CStringGetTextDatum(a->downstream_key) : (Datum) 0;
	Assert(i == DECISION_COLUMNS);
	return heap_form_tuple(desc, values, nulls);
}

/*
 * Records a call's intent and decides (both entry points below).  Without
 * lease (a token), the call belongs to this session's lease of run, taken
 * when the session does not hold it; with one, to that token lease's epoch,
 * and the session holds nothing.
 */
static Datum
begin_call(FunctionCallInfo fcinfo, const BeginArgs *kind)
{
	MemoryContext call_cxt = CurrentMemoryContext;
	BeginRequest request;
	BeginAnswer answer;
	TupleDesc	desc;
	HeapTuple	tuple;

	parse_request(fcinfo, kind, &request);
	desc = dl_result_desc(fcinfo);
	/* before anything is written: the SQL objects may be older than the library */
	if (desc->natts != DECISION_COLUMNS)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("durable_ledger.decision has %d attributes, the library fills %d",
						desc->natts, DECISION_COLUMNS),
				 errhint("Run ALTER EXTENSION durable_ledger UPDATE.")));
	dl_check_writable(kind->function);

	dl_spi_connect();
	dl_begin(&request, &answer);
	/* form the answer where it outlives SPI_finish */
	MemoryContextSwitchTo(call_cxt);
	tuple = form_decision(desc, &answer);
	dl_spi_finish();
	PG_RETURN_DATUM(HeapTupleGetDatum(tuple));
}

/*
 * begin_effect(run text, tool text, args jsonb, business_key text, meta jsonb,
 *              lease text, call_id boolean) RETURNS durable_ledger.decision
 */
Datum
dl_begin_effect_1_3(PG_FUNCTION_ARGS)
{
	return begin_call(fcinfo, &begin_effect_args);
}

/*
 * begin_recorded(run text, tool text, args jsonb, meta jsonb, lease text)
 * RETURNS durable_ledger.decision
 *
 * A call that is harmless to make again: recorded and replayed as an effect,
 * but executed again when its outcome is unknown.
 */
Datum
dl_begin_recorded_1_3(PG_FUNCTION_ARGS)
{
	return begin_call(fcinfo, &begin_recorded_args);
}

/*
 * begin_local(run text, tool text, args jsonb, business_key text, meta jsonb,
 *             lease text) RETURNS durable_ledger.decision
 *
 * begin_effect for an effect that is a write in this database, made in the
 * same transaction: that transaction commits only once the effect is
 * reported, so its intent, writes and outcome commit together or not at all.
 */
Datum
dl_begin_local_1_3(PG_FUNCTION_ARGS)
{
	return begin_call(fcinfo, &begin_local_args);
}
