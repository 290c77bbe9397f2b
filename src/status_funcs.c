/*
 * status_funcs.c: effect_status(), the effect's row, or no row.  Looks, never
 * writes.  A started effect whose lease is no longer live is shown as
 * unknown: the question a status query asks is "may this still be in
 * flight?".
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "funcapi.h"
#include "utils/builtins.h"
#include "utils/tuplestore.h"

#include "lease.h"

PG_FUNCTION_INFO_V1(dl_effect_status_1_3);
PG_FUNCTION_INFO_V1(dl_effect_status_1_1);

/* How often the row is read again when it keeps changing under the look. */
#define MAX_STATUS_ROUNDS 16

/*
 * The row and the lease are both read as they are now (also under
 * REPEATABLE READ), and the row is read again once the lease is found ended:
 * an effect that was completed meanwhile must not be called unknown.  A hot
 * standby cannot see the primary's session leases: it shows the stored
 * status of an effect started under one.
 */
static HeapTuple
effect_as_now(const char *key, TupleDesc desc)
{
	int			round;

	for (round = 0; round < MAX_STATUS_ROUNDS; round++)
	{
		EffectRow	row;
		EffectRow	again;
		HeapTuple	tuple = dl_read_effect_now(key, desc, &row);
		Datum	   *values;
		bool	   *nulls;

		if (tuple == NULL || row.status != EFFECT_STARTED ||
			dl_lease_liveness(row.run, row.lease_epoch) != LEASE_ENDED)
			return tuple;

		/* ended: unknown, if the row is still that started attempt now */
		tuple = dl_read_effect_now(key, desc, &again);
		if (tuple == NULL)
			return NULL;
		if (again.status != EFFECT_STARTED || again.attempt != row.attempt ||
			again.lease_epoch != row.lease_epoch || strcmp(again.run, row.run) != 0)
			continue;
		values = palloc(desc->natts * sizeof(Datum));
		nulls = palloc(desc->natts * sizeof(bool));
		heap_deform_tuple(tuple, desc, values, nulls);
		values[SPI_fnumber(desc, "status") - 1] =
			CStringGetTextDatum(dl_status_name(EFFECT_UNKNOWN));
		return heap_form_tuple(desc, values, nulls);
	}
	ereport(ERROR,
			(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
			 errmsg("effect \"%s\" kept changing while its status was read", key),
			 errhint("Retry the call.")));
	return NULL;				/* keep compiler quiet */
}

/*
 * effect_status(key text) RETURNS SETOF durable_ledger.effects
 *
 * 1.3's symbol: the row in the shape of the table's row type, also after an
 * admin dropped a column.  Writing nothing, the older SQL objects' symbol
 * computes the same.
 */
Datum
dl_effect_status_1_3(PG_FUNCTION_ARGS)
{
	char	   *key = dl_required_text_arg(fcinfo, 0, "key", 0);
	ReturnSetInfo *rsinfo = (ReturnSetInfo *) fcinfo->resultinfo;
	HeapTuple	tuple;

	InitMaterializedSRF(fcinfo, MAT_SRF_USE_EXPECTED_DESC);

	dl_spi_connect();
	tuple = effect_as_now(key, rsinfo->setDesc);
	if (tuple != NULL)
		tuplestore_puttuple(rsinfo->setResult, tuple);
	dl_spi_finish();

	return (Datum) 0;
}

/* effect_status of the SQL objects of 1.1 and 1.2 */
Datum
dl_effect_status_1_1(PG_FUNCTION_ARGS)
{
	return dl_effect_status_1_3(fcinfo);
}
