/*
 * write_retention.c: what purge_settled and purge_audit delete, and the
 * anchors of the audit log's chains.
 */
#include "postgres.h"


#include "rows.h"

/* ---------- retention ---------- */

static Statement purge_run = {
	/*
	 * the run's effects (RUN_LOGGED_KEYS) with every replaced attempt of
	 * theirs, whichever run made it (a business key's earlier runs: left
	 * behind, it would refuse the key's next use), its divergences and its
	 * token leases' counters; an attempt it made of another run's effect
	 * stays with that effect
	 */
	"WITH keys AS (SELECT DISTINCT k.key FROM (" RUN_LOGGED_KEYS ") k),"
	"     e AS (DELETE FROM durable_ledger.effects e USING keys k"
	"            WHERE e.key" EQ "k.key AND e.run" EQ "$1 RETURNING e.key),"
	"     p AS (DELETE FROM durable_ledger.past_attempts p USING e"
	"            WHERE p.key" EQ "e.key RETURNING 1),"
	"     d AS (DELETE FROM durable_ledger.divergences d WHERE d.run" EQ "$1 RETURNING 1),"
	"     c AS (DELETE FROM durable_ledger.token_lease_calls c WHERE c.run" EQ "$1 RETURNING 1)"
	" SELECT (SELECT pg_catalog.count(*) FROM e), (SELECT pg_catalog.count(*) FROM p),"
	"        (SELECT pg_catalog.count(*) FROM d), (SELECT pg_catalog.count(*) FROM c)",
	1, {TEXTOID}, NULL, true
};

/*
 * Removes a settled run's effects, their replaced attempts, its divergences
 * and its token leases' counters; the run's row, its token leases and its
 * audit log stay.  The caller holds the run closed (dl_run_lock_closing).
 */
void
dl_write_run_purge(const char *run, PurgeCounts *counts)
{
	Datum		values[1];
	HeapTuple	tuple;
	TupleDesc	desc;
	bool		isnull;

	values[0] = dl_text_datum(run);
	dl_note_ledger_write();
	dl_plan_run(&purge_run, values, NULL, SPI_OK_SELECT);
	tuple = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	counts->effects = DatumGetInt64(SPI_getbinval(tuple, desc, 1, &isnull));
	counts->past_attempts = DatumGetInt64(SPI_getbinval(tuple, desc, 2, &isnull));
	counts->divergences = DatumGetInt64(SPI_getbinval(tuple, desc, 3, &isnull));
}

/* While purge_audit deletes, and only then, the append-only trigger lets it. */
static bool audit_purge_under_way = false;

bool
dl_audit_purge_under_way(void)
{
	return audit_purge_under_way;
}

static uint64
run_audit_delete(Statement *stmt, Datum *values)
{
	uint64		deleted;

	audit_purge_under_way = true;
	PG_TRY();
	{
		deleted = dl_plan_run(stmt, values, NULL, SPI_OK_DELETE);
	}
	PG_FINALLY();
	{
		audit_purge_under_way = false;
	}
	PG_END_TRY();
	return deleted;
}

static Statement delete_chain_prefix = {
	"DELETE FROM durable_ledger.audit_log WHERE chain" EQ "$1"
	" AND chain_seq OPERATOR(pg_catalog.<=) $2",
	2, {INT8OID, INT8OID}
};

static Statement anchor_chain = {
	"INSERT INTO durable_ledger.audit_anchors (chain, chain_seq, row_hash, purged_at, purged_by)"
	" VALUES ($1, $2, $3, pg_catalog.clock_timestamp(), $4)"
	" ON CONFLICT (chain) DO UPDATE SET chain_seq = EXCLUDED.chain_seq,"
	"  row_hash = EXCLUDED.row_hash, purged_at = EXCLUDED.purged_at, purged_by = EXCLUDED.purged_by"
	" WHERE durable_ledger.audit_anchors.chain_seq OPERATOR(pg_catalog.<) EXCLUDED.chain_seq",
	4, {INT8OID, INT8OID, BYTEAOID, TEXTOID}
};

/*
 * Removes a prefix of an audit chain and anchors the chain at its last row
 * (verify_audit links the next row to the anchor); an anchor only moves
 * forward (two purges at once).  How many rows went.
 */
int64
dl_write_audit_purge(const AuditPurge *purge, const char *purged_by)
{
	Datum		values[4];
	uint64		deleted;

	values[0] = Int64GetDatum(purge->chain);
	values[1] = Int64GetDatum(purge->up_to_seq);
	dl_note_ledger_write();
	deleted = run_audit_delete(&delete_chain_prefix, values);
	if (deleted == 0)
		return 0;				/* a purge of its own got there first: its anchor stands */
	values[2] = PointerGetDatum(purge->row_hash);
	values[3] = dl_text_datum(purged_by);
	dl_plan_run(&anchor_chain, values, NULL, SPI_OK_INSERT);
	return (int64) deleted;
}
