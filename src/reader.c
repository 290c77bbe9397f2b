/*
 * reader.c: the ledger's lookups and queries.
 *
 * A key is looked up as a unique check looks (SnapshotDirty on the primary
 * key: committed versions and those of transactions in progress), which
 * tells begin_effect at once whether a key is new, settled, or being
 * changed.  Everything else is SQL with saved plans (plans.c); the questions
 * about now (is a lease live?) are read with the latest snapshot.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/rel.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "tables.h"

/*
 * Looks key up in effects as a unique check does:
 *   KEY_ABSENT  no version of key exists: an intent for it is certainly new;
 *   KEY_FOUND   *row is the key's current version, committed (or this
 *               transaction's own) and not being changed by another
 *               transaction (row lockers are ignored, as by a SELECT);
 *   KEY_BUSY    another transaction is inserting or changing it: lock it
 *               (dl_lock_effect waits for that transaction) to know.
 * Whatever the isolation level: the answer is about the key as it is now.
 */
KeyLookup
dl_read_key(const char *key, EffectRow *row)
{
	Relation	rel = dl_open_table(&dl_effects_table, AccessShareLock);
	Oid			primary_key = RelationGetPrimaryKeyIndex(rel);
	Relation	index;
	SnapshotData dirty;
	ScanKeyData scankey;
	IndexScanDesc scan;
	TupleTableSlot *slot;
	KeyLookup	lookup = KEY_BUSY;

	if (!OidIsValid(primary_key))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("durable_ledger.effects has no primary key")));
	index = index_open(primary_key, AccessShareLock);
	InitDirtySnapshot(dirty);
	slot = table_slot_create(rel, NULL);
	ScanKeyEntryInitialize(&scankey, 0, 1, BTEqualStrategyNumber, InvalidOid,
						   index->rd_indcollation[0], F_TEXTEQ,
						   CStringGetTextDatum(key));
	scan = index_beginscan(rel, index, &dirty, 1, 0);
	index_rescan(scan, &scankey, 1, NULL, 0);
	if (!index_getnext_slot(scan, ForwardScanDirection, slot))
		lookup = KEY_ABSENT;
	else if (!TransactionIdIsValid(dirty.xmin) && !TransactionIdIsValid(dirty.xmax))
	{
		dl_effect_row_from_slot(slot, row);
		lookup = KEY_FOUND;
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	index_close(index, NoLock);
	table_close(rel, NoLock);
	return lookup;
}

/* ---------- questions asked in SQL ---------- */

static Statement effect_row = {
	"SELECT * FROM durable_ledger.effects WHERE key" EQ "$1",
	1, {TEXTOID}
};

static Statement past_attempt = {
	"SELECT run, lease_epoch, status, error FROM durable_ledger.past_attempts"
	" WHERE key" EQ "$1 AND attempt" EQ "$2",
	2, {TEXTOID, INT4OID}
};

static Statement lease_began_past_attempt = {
	"SELECT FROM durable_ledger.past_attempts"
	" WHERE key" EQ "$1 AND run" EQ "$2 AND lease_epoch" EQ "$3",
	3, {TEXTOID, TEXTOID, INT8OID}
};

static Statement run_state = {
	"SELECT r.epochs, r.released_at IS NOT NULL, r.holder_pid,"
	"       r.lease_kind OPERATOR(pg_catalog.=) 'token',"
	"       t.released_at IS NULL"
	"        AND t.expires_at OPERATOR(pg_catalog.>) pg_catalog.clock_timestamp(),"
	"       t.expires_at"
	"  FROM durable_ledger.runs r"
	"  LEFT JOIN durable_ledger.token_leases t"
	"    ON t.run" EQ "r.run AND t.epoch" EQ "r.epochs"
	" WHERE r.run" EQ "$1",
	1, {TEXTOID}
};

static Statement token_lease = {
	"SELECT t.run, t.epoch, r.epochs, t.released_at IS NOT NULL,"
	"       t.expires_at OPERATOR(pg_catalog.<=) pg_catalog.clock_timestamp(), t.expires_at"
	"  FROM durable_ledger.token_leases t"
	"  JOIN durable_ledger.runs r ON r.run" EQ "t.run"
	" WHERE t.token_sha256" EQ "$1",
	1, {BYTEAOID}
};

static Statement token_calls = {
	"SELECT calls FROM durable_ledger.token_lease_calls"
	" WHERE run" EQ "$1 AND epoch" EQ "$2 AND call" EQ "$3",
	3, {TEXTOID, INT8OID, BYTEAOID}
};

static Statement lease_holder = {
	"SELECT l.pid FROM pg_catalog.pg_locks l"
	" WHERE l.locktype" EQ "'advisory' AND l.database" EQ "$1"
	"   AND l.classid" EQ "$2 AND l.objid" EQ "$3"
	"   AND l.objsubid" EQ "$4 AND l.granted AND l.mode" EQ "'ExclusiveLock'",
	4, {OIDOID, OIDOID, OIDOID, INT2OID}
};

static Statement last_lease_event = {
	/*
	 * This session's last session-lease event on run: its audit rows are
	 * those of its backend pid since the backend started (a pid is reused
	 * only after its previous backend has ended); a token lease it took or
	 * released is no session lease of its.
	 */
	"SELECT event OPERATOR(pg_catalog.=) 'lease_acquired', lease_epoch"
	"  FROM durable_ledger.audit_log"
	" WHERE run" EQ "$1 AND backend_pid" EQ "pg_catalog.pg_backend_pid()"
	"   AND logged_at OPERATOR(pg_catalog.>=) $2"
	"   AND event OPERATOR(pg_catalog.=) ANY ('{lease_acquired,lease_released}')"
	"   AND (detail OPERATOR(pg_catalog.->>) 'kind') IS DISTINCT FROM 'token'"
	" ORDER BY id DESC LIMIT 1",
	2, {TEXTOID, TIMESTAMPTZOID}
};

static Jsonb *
optional_jsonb(HeapTuple tuple, TupleDesc desc, int column)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tuple, desc, column, &isnull);

	return isnull ? NULL : DatumGetJsonbP(d);
}

/*
 * key's row as it is now (whatever the transaction's snapshot), formed with
 * desc (the durable_ledger.effects row type) in SPI memory, with its values
 * in *row; NULL when there is no such key.
 */
HeapTuple
dl_read_effect_now(const char *key, TupleDesc desc, EffectRow *row)
{
	Datum		values[1];
	HeapTuple	tuple;
	TupleDesc	found;
	bool		isnull;

	values[0] = dl_text_datum(key);
	if (dl_plan_run_now(&effect_row, values, NULL, SPI_OK_SELECT) == 0)
		return NULL;
	tuple = SPI_tuptable->vals[0];
	found = SPI_tuptable->tupdesc;
	if (found->natts != desc->natts)
		elog(ERROR, "durable_ledger.effects does not have the columns of its row type");
	if (row != NULL)
	{
		row->key = SPI_getvalue(tuple, found, SPI_fnumber(found, "key"));
		row->run = SPI_getvalue(tuple, found, SPI_fnumber(found, "run"));
		row->status = dl_status_from_name(SPI_getvalue(tuple, found, SPI_fnumber(found, "status")));
		row->attempt = DatumGetInt32(SPI_getbinval(tuple, found, SPI_fnumber(found, "attempt"), &isnull));
		row->lease_epoch = DatumGetInt64(SPI_getbinval(tuple, found, SPI_fnumber(found, "lease_epoch"), &isnull));
	}
	return heap_copytuple(tuple);
}

/* A key that a report or a resolution names and that does not exist. */
void
dl_error_unknown_key(const char *key)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("effect \"%s\" does not exist", key),
			 errhint("Keys come from durable_ledger.begin_effect().")));
}

/*
 * An attempt of key that a later attempt replaced: the run and epoch that
 * started it and what was recorded for it, as committed now (the caller has
 * locked key's latest version, which may be newer than the transaction's
 * snapshot).  False when it is not on record.
 */
bool
dl_read_past_attempt(const char *key, int32 attempt, PastAttempt *past)
{
	Datum		values[2];
	HeapTuple	tuple;
	TupleDesc	desc;
	bool		isnull;

	values[0] = dl_text_datum(key);
	values[1] = Int32GetDatum(attempt);
	if (dl_plan_run_now(&past_attempt, values, NULL, SPI_OK_SELECT) == 0)
		return false;
	tuple = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	past->attempt = attempt;
	past->run = SPI_getvalue(tuple, desc, 1);
	past->lease_epoch = DatumGetInt64(SPI_getbinval(tuple, desc, 2, &isnull));
	past->status = dl_status_from_name(SPI_getvalue(tuple, desc, 3));
	past->error = optional_jsonb(tuple, desc, 4);
	return true;
}

/*
 * Did the lease (run, epoch) also start an attempt of key that was replaced?
 * As committed now, like dl_read_past_attempt.
 */
bool
dl_read_lease_began_past_attempt(const char *key, const char *run, int64 lease_epoch)
{
	Datum		values[3];

	values[0] = dl_text_datum(key);
	values[1] = dl_text_datum(run);
	values[2] = Int64GetDatum(lease_epoch);
	return dl_plan_run_now(&lease_began_past_attempt, values, NULL, SPI_OK_SELECT) > 0;
}

/*
 * What the ledger knows of the run's current epoch, as committed now
 * (whatever the transaction's snapshot); false when the run has no row.
 * Token leases are judged by the server's clock.
 */
bool
dl_read_run_state(const char *run, RunState *state)
{
	Datum		values[1];
	HeapTuple	tuple;
	TupleDesc	desc;
	bool		isnull;
	Datum		d;

	values[0] = dl_text_datum(run);
	if (dl_plan_run_now(&run_state, values, NULL, SPI_OK_SELECT) == 0)
		return false;
	tuple = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	state->epoch = DatumGetInt64(SPI_getbinval(tuple, desc, 1, &isnull));
	state->released = DatumGetBool(SPI_getbinval(tuple, desc, 2, &isnull));
	state->holder_pid = DatumGetInt32(SPI_getbinval(tuple, desc, 3, &isnull));
	state->token = DatumGetBool(SPI_getbinval(tuple, desc, 4, &isnull));
	d = SPI_getbinval(tuple, desc, 5, &isnull);
	state->token_live = state->token && !isnull && DatumGetBool(d);
	d = SPI_getbinval(tuple, desc, 6, &isnull);
	state->expires_at = isnull ? 0 : DatumGetTimestampTz(d);
	return true;
}

/*
 * The token lease whose token has this SHA-256, as it is now (expiry judged
 * by the server's clock); false when there is none.
 */
bool
dl_read_token_lease(bytea *token_sha256, TokenLease *lease)
{
	Datum		values[1];
	HeapTuple	tuple;
	TupleDesc	desc;
	bool		isnull;

	values[0] = PointerGetDatum(token_sha256);
	if (dl_plan_run_now(&token_lease, values, NULL, SPI_OK_SELECT) == 0)
		return false;
	tuple = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	lease->run = SPI_getvalue(tuple, desc, 1);
	lease->epoch = DatumGetInt64(SPI_getbinval(tuple, desc, 2, &isnull));
	lease->current_epoch = DatumGetInt64(SPI_getbinval(tuple, desc, 3, &isnull));
	lease->released = DatumGetBool(SPI_getbinval(tuple, desc, 4, &isnull));
	lease->expired = DatumGetBool(SPI_getbinval(tuple, desc, 5, &isnull));
	lease->expires_at = DatumGetTimestampTz(SPI_getbinval(tuple, desc, 6, &isnull));
	return true;
}

/*
 * The identical calls counted so far in a token lease's epoch, as committed
 * now (the caller serialises the epoch's calls; an older snapshot would
 * count a call twice).
 */
int32
dl_read_token_calls(const char *run, int64 epoch, bytea *call)
{
	Datum		values[3];
	bool		isnull;

	values[0] = dl_text_datum(run);
	values[1] = Int64GetDatum(epoch);
	values[2] = PointerGetDatum(call);
	if (dl_plan_run_now(&token_calls, values, NULL, SPI_OK_SELECT) == 0)
		return 0;
	return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/* The pid holding the run's lease lock (by its lock key), or 0. */
int
dl_read_lease_holder_pid(uint64 lock_key)
{
	Datum		values[4];
	bool		isnull;

	values[0] = ObjectIdGetDatum(MyDatabaseId);
	values[1] = ObjectIdGetDatum((Oid) (lock_key >> 32));
	values[2] = ObjectIdGetDatum((Oid) (uint32) lock_key);
	values[3] = Int16GetDatum(DL_LOCK_CLASS);
	if (dl_plan_run(&lease_holder, values, NULL, SPI_OK_SELECT) == 0)
		return 0;
	return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/*
 * Did this session take a lease epoch of run that it never released?  The
 * audit log knows, also after the session has forgotten (lease.c); *epoch is
 * that epoch.
 */
bool
dl_read_lease_unreleased_by_me(const char *run, int64 *epoch)
{
	Datum		values[2];
	bool		isnull;
	Datum		d;

	values[0] = dl_text_datum(run);
	values[1] = TimestampTzGetDatum(MyStartTimestamp);
	if (dl_plan_run_now(&last_lease_event, values, NULL, SPI_OK_SELECT) == 0 ||
		!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
		return false;
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
	*epoch = isnull ? 0 : DatumGetInt64(d);
	return true;
}
