/*
 * metrics_funcs.c: metrics_events(), the ledger's event counts since the
 * server started (metrics.c), for monitoring.
 */
#include "postgres.h"

#include "funcapi.h"
#include "utils/builtins.h"

#include "policy.h"

PG_FUNCTION_INFO_V1(dl_metrics_events_1_2);

/*
 * metrics_events() RETURNS TABLE (event text, total bigint): every kind of
 * event, with how many were logged since the server started; total NULL when
 * the counts are not kept (durable_ledger not in shared_preload_libraries).
 */
Datum
dl_metrics_events_1_2(PG_FUNCTION_ARGS)
{
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	bool		kept = dl_metrics_kept();
	int			i;

	InitMaterializedSRF(fcinfo, 0);
	for (i = 0; i < DL_NEVENTS; i++)
	{
		Datum		values[2];
		bool		nulls[2] = {false, !kept};

		values[0] = CStringGetTextDatum(dl_audit_event_name((AuditEvent) i));
		values[1] = kept ? Int64GetDatum((int64) dl_metrics_count(i)) : (Datum) 0;
		tuplestore_putvalues(rsinfo->setResult, rsinfo->setDesc, values, nulls);
	}
	return (Datum) 0;
}
