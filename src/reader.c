/*
 * reader.c: the ledger's lookups and queries.
 *
 * A key is looked up as a unique check looks (SnapshotDirty on the primary
 * key: committed versions and those of transactions in progress), which
 * tells begin_effect at once whether a key is new, settled, or being
 * changed.  The rows a lease is judged by (a run, a token lease, a token
 * lease's counters) are found through their unique indexes as committed
 * now.  Everything else is SQL with saved plans (plans.c); the questions
 * about now are read with the latest snapshot.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/stratnum.h"
#include "access/table.h"
#include "access/tableam.h"
#include "access/xact.h"
#include "catalog/pg_am.h"
#include "catalog/pg_index.h"
#include "catalog/pg_type.h"
#include "commands/defrem.h"
#include "executor/tuptable.h"
#include "miscadmin.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/fmgroids.h"
#include "utils/lsyscache.h"
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

static Statement highest_epoch_logged = {
	"SELECT pg_catalog.max(lease_epoch) FROM durable_ledger.audit_log WHERE run" EQ "$1",
	1, {TEXTOID}
};

static Statement effect_row = {
	"SELECT * FROM durable_ledger.effects WHERE key" EQ "$1",
	1, {TEXTOID}
};

static Statement past_attempt = {
	"SELECT run, lease_epoch, status, error FROM durable_ledger.past_attempts"
	" WHERE key" EQ "$1 AND attempt" EQ "$2",
	2, {TEXTOID, INT4OID}
};

static Statement past_attempt_runs = {
	"SELECT DISTINCT run FROM durable_ledger.past_attempts"
	" WHERE key" EQ "$1 AND run IS NOT NULL",
	1, {TEXTOID}
};

static Statement approval_requester = {
	/* who made the call that asked for the approval, in the attempt's own life */
	"SELECT role_name, session_user_name FROM durable_ledger.audit_log"
	" WHERE key" EQ "$1 AND attempt" EQ "$2"
	"   AND event" EQ "'approval_requested'"
	"   AND logged_at OPERATOR(pg_catalog.>=) $3"
	" ORDER BY id LIMIT 1",
	3, {TEXTOID, INT4OID, TIMESTAMPTZOID}
};

static Statement found_unknown = {
	/*
	 * The decision that found an attempt's lease ended without a report, in
	 * the attempt's own life: a key purged and begun again (purge_settled),
	 * or a business key used again, has rows of an earlier life too.
	 */
	"SELECT logged_at FROM durable_ledger.audit_log"
	" WHERE key" EQ "$1 AND attempt" EQ "$2"
	"   AND event" EQ "'pause'"
	"   AND (detail OPERATOR(pg_catalog.->>) 'cause')" EQ "'lease ended'"
	"   AND logged_at OPERATOR(pg_catalog.>=) $3"
	" ORDER BY id LIMIT 1",
	3, {TEXTOID, INT4OID, TIMESTAMPTZOID}
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

/* The text of the first column of each row SPI found, in order. */
static List *
first_column_texts(void)
{
	List	   *texts = NIL;
	uint64		i;

	for (i = 0; i < SPI_processed; i++)
		texts = lappend(texts, SPI_getvalue(SPI_tuptable->vals[i], SPI_tuptable->tupdesc, 1));
	return texts;
}

/*
 * A row SPI found, in the shape of desc (the table's row type, whose
 * attributes include the columns an admin dropped, which SELECT * leaves
 * out): each column by its name, a dropped one NULL.
 */
static HeapTuple
in_row_type(HeapTuple tuple, TupleDesc found, TupleDesc desc, const char *table)
{
	Datum	   *values = palloc(desc->natts * sizeof(Datum));
	bool	   *nulls = palloc(desc->natts * sizeof(bool));
	int			i;

	for (i = 0; i < desc->natts; i++)
	{
		Form_pg_attribute att = TupleDescAttr(desc, i);
		int			column;

		values[i] = (Datum) 0;
		nulls[i] = true;
		if (att->attisdropped)
			continue;
		column = SPI_fnumber(found, NameStr(att->attname));
		if (column <= 0 || SPI_gettypeid(found, column) != att->atttypid)
			elog(ERROR, "durable_ledger.%s does not have the columns of its row type", table);
		values[i] = SPI_getbinval(tuple, found, column, &nulls[i]);
	}
	return heap_form_tuple(desc, values, nulls);
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
	if (row != NULL)
	{
		row->key = SPI_getvalue(tuple, found, SPI_fnumber(found, "key"));
		row->run = SPI_getvalue(tuple, found, SPI_fnumber(found, "run"));
		row->status = dl_status_from_name(SPI_getvalue(tuple, found, SPI_fnumber(found, "status")));
		row->attempt = DatumGetInt32(SPI_getbinval(tuple, found, SPI_fnumber(found, "attempt"), &isnull));
		row->lease_epoch = DatumGetInt64(SPI_getbinval(tuple, found, SPI_fnumber(found, "lease_epoch"), &isnull));
	}
	return in_row_type(tuple, found, desc, "effects");
}

/* A key that a report or a resolution names and that does not exist. */
void
dl_error_unknown_key(const char *key)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("effect \"%s\" does not exist", key),
			 errhint("Pass a key that durable_ledger.begin_effect() returned.")));
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
 * The runs that started attempts of key that later ones replaced, as
 * committed now, like dl_read_past_attempt.
 */
List *
dl_read_past_attempt_runs(const char *key)
{
	Datum		values[1];

	values[0] = dl_text_datum(key);
	dl_plan_run_now(&past_attempt_runs, values, NULL, SPI_OK_SELECT);
	return first_column_texts();
}

/*
 * When the ledger found that attempt of key's lease had ended without a
 * report (the effect became unknown), the attempt having begun at begun_at;
 * as committed now; false when its log has no such row.
 */
bool
dl_read_found_unknown_at(const char *key, int32 attempt, TimestampTz begun_at, TimestampTz *at)
{
	Datum		values[3];
	bool		isnull;

	values[0] = dl_text_datum(key);
	values[1] = Int32GetDatum(attempt);
	values[2] = TimestampTzGetDatum(begun_at);
	if (dl_plan_run_now(&found_unknown, values, NULL, SPI_OK_SELECT) == 0)
		return false;
	*at = DatumGetTimestampTz(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1,
											&isnull));
	return true;
}

/*
 * The roles of the call that asked for the approval of that attempt of key,
 * begun at begun_at (its audit row); as committed now; false when its log
 * has no such row.
 */
bool
dl_read_approval_requester(const char *key, int32 attempt, TimestampTz begun_at,
						   char **role_name, char **session_user_name)
{
	Datum		values[3];

	values[0] = dl_text_datum(key);
	values[1] = Int32GetDatum(attempt);
	values[2] = TimestampTzGetDatum(begun_at);
	if (dl_plan_run_now(&approval_requester, values, NULL, SPI_OK_SELECT) == 0)
		return false;
	*role_name = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
	*session_user_name = SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2);
	return true;
}

/* ---------- rows found by a unique index, as committed now ---------- */

/* The unique index a lookup uses, found once per version of its table. */
typedef struct LookupIndex
{
	uint64		learned;		/* the version of the table it was found in */
	Oid			index;			/* InvalidOid: none (only when missing_ok) */
	bool		unique;			/* unique on exactly the lookup's columns */
	bool		missing_ok;		/* none is no error: no scan, the caller asks SQL */
} LookupIndex;

/*
 * The valid btree index of rel (no expressions, no predicate) whose key
 * columns are exactly t's columns, in that order, and that is unique; or,
 * when unique is false, whose key columns begin with them.  Each of them
 * compared as the column's own equality compares it (its type's default
 * operator family, the column's collation): an index an administrator made
 * with a case-insensitive collation would find another run's rows.  None:
 * an error, or InvalidOid when missing_ok.
 */
static Oid
index_on(LedgerTable *t, Relation rel, int nkeys, const int *columns, bool unique,
		 bool missing_ok)
{
	List	   *indexes = RelationGetIndexList(rel);
	ListCell   *lc;

	foreach(lc, indexes)
	{
		Relation	index = index_open(lfirst_oid(lc), AccessShareLock);
		Form_pg_index form = index->rd_index;
		bool		matches = form->indisvalid &&
			index->rd_rel->relam == BTREE_AM_OID &&
			(unique ? form->indisunique && form->indnkeyatts == nkeys :
			 form->indnkeyatts >= nkeys) &&
			RelationGetIndexExpressions(index) == NIL &&
			RelationGetIndexPredicate(index) == NIL;
		int			i;

		for (i = 0; matches && i < nkeys; i++)
		{
			Form_pg_attribute att = TupleDescAttr(RelationGetDescr(rel),
												  t->attnums[columns[i]] - 1);
			Oid			type = getBaseType(att->atttypid);

			matches = form->indkey.values[i] == t->attnums[columns[i]] &&
				index->rd_indcollation[i] == att->attcollation &&
				index->rd_opcintype[i] == type &&
				index->rd_opfamily[i] ==
				get_opclass_family(GetDefaultOpClass(type, BTREE_AM_OID));
		}
		index_close(index, AccessShareLock);
		if (matches)
			return lfirst_oid(lc);
	}
	if (missing_ok)
		return InvalidOid;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("durable_ledger.%s lost an index the ledger looks its rows up by", t->name),
			 errhint("Restore the indexes the extension created.")));
	return InvalidOid;			/* keep compiler quiet */
}

static RegProcedure
equality_proc(Oid type)
{
	switch (type)
	{
		case TEXTOID:
			return F_TEXTEQ;
		case INT8OID:
			return F_INT8EQ;
		case BYTEAOID:
			return F_BYTEAEQ;
		case INT4OID:
			return F_INT4EQ;
		case BOOLOID:
			return F_BOOLEQ;
		case TIMESTAMPTZOID:
			return F_TIMESTAMPTZ_EQ;
		default:
			elog(ERROR, "no lookup by a column of type %u", type);
			return InvalidOid;	/* keep compiler quiet */
	}
}

/*
 * Finds the rows of t whose columns hold values, through an index on them, as
 * committed now (the latest snapshot, this transaction's own writes
 * included), whatever the transaction's snapshot; calls take with each until
 * it returns false.  by->unique: the index is unique on exactly those
 * columns, else one whose key begins with them.  Returns whether any row was
 * found.  An index scan, never a plan: a plan made while the table was small
 * would scan it whole once it has grown.  With no such index and
 * by->missing_ok, nothing is scanned (by->index says so).
 */
static bool
scan_rows_now(LedgerTable *t, LookupIndex *by, int nkeys, const int *columns,
			  const Datum *values, bool (*take) (TupleTableSlot *, void *), void *arg)
{
	Relation	rel = dl_open_table(t, AccessShareLock);
	Relation	index;
	Snapshot	snapshot;
	ScanKeyData keys[INDEX_MAX_KEYS];
	IndexScanDesc scan;
	TupleTableSlot *slot;
	bool		found = false;
	int			i;

	if (by->learned != t->learned)
	{
		by->index = index_on(t, rel, nkeys, columns, by->unique, by->missing_ok);
		by->learned = t->learned;
	}
	if (!OidIsValid(by->index))
	{
		table_close(rel, NoLock);
		return false;
	}
	index = index_open(by->index, AccessShareLock);
	for (i = 0; i < nkeys; i++)
		ScanKeyEntryInitialize(&keys[i], 0, i + 1, BTEqualStrategyNumber, InvalidOid,
							   index->rd_indcollation[i],
							   equality_proc(t->columns[columns[i]].type), values[i]);

	CommandCounterIncrement();	/* our own writes so far are seen */
	snapshot = RegisterSnapshot(GetLatestSnapshot());
	slot = table_slot_create(rel, NULL);
	scan = index_beginscan(rel, index, snapshot, nkeys, 0);
	index_rescan(scan, keys, nkeys, NULL, 0);
	while (index_getnext_slot(scan, ForwardScanDirection, slot))
	{
		found = true;
		if (!take(slot, arg))
			break;
	}
	index_endscan(scan);
	ExecDropSingleTupleTableSlot(slot);
	UnregisterSnapshot(snapshot);
	index_close(index, NoLock);
	table_close(rel, NoLock);
	return found;
}

/* The one row of t that a unique index finds (scan_rows_now). */
static bool
find_row_now(LedgerTable *t, LookupIndex *by, int nkeys, const int *columns,
			 const Datum *values, bool (*take) (TupleTableSlot *, void *), void *arg)
{
	by->unique = true;
	return scan_rows_now(t, by, nkeys, columns, values, take, arg);
}

static Datum
column_value(LedgerTable *t, TupleTableSlot *slot, int column, bool *isnull)
{
	return slot_getattr(slot, t->attnums[column], isnull);
}

static bool
take_run_state(TupleTableSlot *slot, void *arg)
{
	RunState   *state = arg;
	bool		isnull;
	Datum		d;

	state->epoch = DatumGetInt64(column_value(&dl_runs_table, slot, RUN_EPOCHS, &isnull));
	(void) column_value(&dl_runs_table, slot, RUN_RELEASED_AT, &isnull);
	state->released = !isnull;
	d = column_value(&dl_runs_table, slot, RUN_HOLDER_PID, &isnull);
	state->holder_pid = isnull ? 0 : DatumGetInt32(d);
	d = column_value(&dl_runs_table, slot, RUN_LEASE_KIND, &isnull);
	state->token = !isnull && strcmp(TextDatumGetCString(d), "token") == 0;
	d = column_value(&dl_runs_table, slot, RUN_ABANDONED_AT, &isnull);
	state->abandoned = !isnull;
	state->abandoned_at = isnull ? 0 : DatumGetTimestampTz(d);
	d = column_value(&dl_runs_table, slot, RUN_ABANDONED_BY, &isnull);
	state->abandoned_by = isnull ? NULL : TextDatumGetCString(d);
	return false;
}

/* The token lease row's state, judged by the server's clock now. */
typedef struct TokenRow
{
	char	   *run;
	int64		epoch;
	bool		released;
	TimestampTz expires_at;
} TokenRow;

static bool
take_token_row(TupleTableSlot *slot, void *arg)
{
	TokenRow   *row = arg;
	bool		isnull;

	row->run = TextDatumGetCString(column_value(&dl_token_table, slot, TOK_RUN, &isnull));
	row->epoch = DatumGetInt64(column_value(&dl_token_table, slot, TOK_EPOCH, &isnull));
	(void) column_value(&dl_token_table, slot, TOK_RELEASED_AT, &isnull);
	row->released = !isnull;
	row->expires_at = DatumGetTimestampTz(column_value(&dl_token_table, slot, TOK_EXPIRES_AT,
													   &isnull));
	return false;
}

static bool
take_calls(TupleTableSlot *slot, void *arg)
{
	bool		isnull;

	*(int32 *) arg = DatumGetInt32(column_value(&dl_calls_table, slot, CALLS_CALLS, &isnull));
	return false;
}

/*
 * The run's row as committed now, as dl_read_run_state reads it but for the
 * token lease of its epoch, which is not read (token_live false, expires_at
 * 0): for who asks only about the run (its epoch, whether it was abandoned).
 * False when the run has no row.
 */
bool
dl_read_run_row(const char *run, RunState *state)
{
	static LookupIndex runs_by_run;
	static const int run_key[] = {RUN_RUN};
	Datum		values[1];

	state->token_live = false;
	state->expires_at = 0;
	values[0] = CStringGetTextDatum(run);
	return find_row_now(&dl_runs_table, &runs_by_run, 1, run_key, values, take_run_state, state);
}

/*
 * What the ledger knows of the run's current epoch, as committed now
 * (whatever the transaction's snapshot); false when the run has no row.
 * Token leases are judged by the server's clock.
 */
bool
dl_read_run_state(const char *run, RunState *state)
{
	static LookupIndex token_by_epoch;
	static const int token_key[] = {TOK_RUN, TOK_EPOCH};
	Datum		values[2];
	TokenRow	token;

	if (!dl_read_run_row(run, state))
		return false;
	values[0] = CStringGetTextDatum(run);
	values[1] = Int64GetDatum(state->epoch);
	if (state->token &&
		find_row_now(&dl_token_table, &token_by_epoch, 2, token_key, values, take_token_row, &token))
	{
		state->token_live = !token.released && token.expires_at > GetCurrentTimestamp();
		state->expires_at = token.expires_at;
	}
	return true;
}

static bool
take_highest_epoch(TupleTableSlot *slot, void *arg)
{
	bool		isnull;
	Datum		epoch = column_value(&dl_audit_table, slot, AUD_LEASE_EPOCH, &isnull);

	if (!isnull && DatumGetInt64(epoch) > *(int64 *) arg)
		*(int64 *) arg = DatumGetInt64(epoch);
	return true;
}

/*
 * The highest lease epoch that run's audit rows name, as committed now; 0
 * when none does.  Through an index beginning with the log's run (the
 * extension's audit_log_run_idx): a run that is new has no entry there, and
 * its first lease looks at nothing more.  Without one (dropped, or being
 * rebuilt), by a query, which may read the whole log: a run must still be
 * startable.  Needs an open SPI connection.
 */
int64
dl_read_highest_logged_epoch(const char *run)
{
	static LookupIndex audit_by_run = {.missing_ok = true};	/* not unique */
	static const int run_key[] = {AUD_RUN};
	Datum		values[1];
	int64		highest = 0;
	bool		isnull;
	Datum		d;

	values[0] = CStringGetTextDatum(run);
	(void) scan_rows_now(&dl_audit_table, &audit_by_run, 1, run_key, values,
						 take_highest_epoch, &highest);
	if (OidIsValid(audit_by_run.index))
		return highest;
	dl_plan_run_now(&highest_epoch_logged, values, NULL, SPI_OK_SELECT);
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? 0 : DatumGetInt64(d);
}

/*
 * The token lease whose token has this SHA-256, as it is now (expiry judged
 * by the server's clock); false when there is none.
 */
bool
dl_read_token_lease(bytea *token_sha256, TokenLease *lease)
{
	static LookupIndex token_by_hash;
	static const int hash_key[] = {TOK_TOKEN_SHA256};
	Datum		values[1];
	TokenRow	token;
	RunState	state;

	values[0] = PointerGetDatum(token_sha256);
	if (!find_row_now(&dl_token_table, &token_by_hash, 1, hash_key, values, take_token_row, &token))
		return false;
	lease->run = token.run;
	lease->epoch = token.epoch;
	/* only the run's epoch: this token's own row says the rest */
	lease->current_epoch = dl_read_run_row(token.run, &state) ? state.epoch : 0;
	lease->released = token.released;
	lease->expired = token.expires_at <= GetCurrentTimestamp();
	lease->expires_at = token.expires_at;
	return true;
}

/*
 * The identical calls counted so far in a token lease's epoch, as committed
 * now (the caller serialises the epoch's calls; an older snapshot would
 * count a call twice), in *calls; false (and 0) when it has no row.
 */
bool
dl_read_token_calls(const char *run, int64 epoch, bytea *call, int32 *calls)
{
	static LookupIndex calls_by_call;
	static const int calls_key[] = {CALLS_RUN, CALLS_EPOCH, CALLS_CALL};
	Datum		values[3];

	values[0] = CStringGetTextDatum(run);
	values[1] = Int64GetDatum(epoch);
	values[2] = PointerGetDatum(call);
	*calls = 0;
	return find_row_now(&dl_calls_table, &calls_by_call, 3, calls_key, values, take_calls, calls);
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

static Statement run_lease_holder = {
	"SELECT kind" EQ "'token', holder_pid, holder, application_name, since"
	"  FROM durable_ledger.leases WHERE run" EQ "$1"
	" ORDER BY kind LIMIT 1",	/* 'session' first */
	1, {TEXTOID}
};

/* Who holds run's lease now, by the leases view; holder->found false: nobody. */
void
dl_read_lease_holder(const char *run, LeaseHolder *holder)
{
	Datum		values[1];
	HeapTuple	row;
	TupleDesc	desc;
	bool		isnull;
	Datum		d;

	memset(holder, 0, sizeof(*holder));
	values[0] = dl_text_datum(run);
	if (dl_plan_run_now(&run_lease_holder, values, NULL, SPI_OK_SELECT) == 0)
		return;
	row = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	holder->found = true;
	holder->token = DatumGetBool(SPI_getbinval(row, desc, 1, &isnull));
	d = SPI_getbinval(row, desc, 2, &isnull);
	holder->pid = isnull ? 0 : DatumGetInt32(d);
	holder->holder = SPI_getvalue(row, desc, 3);
	holder->application = SPI_getvalue(row, desc, 4);
	d = SPI_getbinval(row, desc, 5, &isnull);
	holder->since_known = !isnull;
	holder->since = isnull ? 0 : DatumGetTimestampTz(d);
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

/* ---------- the tools registry, divergences, a run's earlier effects ---------- */

/* The registry's and the divergences' rows by their primary keys (one lookup each). */
static LookupIndex tools_by_tool;
static const int tool_key[] = {TOOL_TOOL};
static LookupIndex divergences_by_key;
static const int div_key[] = {DIV_KEY};

static char *
optional_text(LedgerTable *t, TupleTableSlot *slot, int column)
{
	bool		isnull;
	Datum		d = column_value(t, slot, column, &isnull);

	return isnull ? NULL : TextDatumGetCString(d);
}

/* A tool's row (store.h), copied out of slot. */
void
dl_tool_row_from_slot(TupleTableSlot *slot, ToolRow *row)
{
	LedgerTable *t = &dl_tools_table;
	bool		isnull;
	Datum		d;
	char	   *policy;

	row->tool = optional_text(t, slot, TOOL_TOOL);
	row->side_effecting = DatumGetBool(column_value(t, slot, TOOL_SIDE_EFFECTING, &isnull));
	policy = optional_text(t, slot, TOOL_DIVERGENCE);
	if (!dl_divergence_from_name(policy, &row->divergence))
		elog(ERROR, "unrecognized divergence policy \"%s\"", policy);
	d = column_value(t, slot, TOOL_KEY_FIELDS, &isnull);
	row->nkey_fields = -1;
	row->key_fields = NULL;
	if (!isnull)
	{
		Datum	   *elems;
		bool	   *nulls;
		int			n;
		int			i;

		deconstruct_array(DatumGetArrayTypeP(d), TEXTOID, -1, false, TYPALIGN_INT,
						  &elems, &nulls, &n);
		row->key_fields = palloc(sizeof(char *) * Max(n, 1));
		for (i = 0; i < n; i++)
			row->key_fields[i] = nulls[i] ? pstrdup("") : TextDatumGetCString(elems[i]);
		row->nkey_fields = n;
	}
	row->note = optional_text(t, slot, TOOL_NOTE);
	(void) column_value(t, slot, TOOL_RETIRED_AT, &isnull);
	row->retired = !isnull;
	d = column_value(t, slot, TOOL_RECONCILE_GRACE, &isnull);
	row->reconcilable = !isnull;
	if (!isnull)
		row->reconcile_grace = *DatumGetIntervalP(d);
	d = column_value(t, slot, TOOL_APPROVAL, &isnull);
	row->approval = isnull ? NULL : DatumGetJsonPathPCopy(d);
	d = column_value(t, slot, TOOL_MAX_EXECUTIONS, &isnull);
	row->max_executions = isnull ? 0 : DatumGetInt32(d);
	d = column_value(t, slot, TOOL_MAX_IN_WINDOW, &isnull);
	row->max_in_window = isnull ? 0 : DatumGetInt32(d);
	memset(&row->budget_window, 0, sizeof(Interval));
	d = column_value(t, slot, TOOL_BUDGET_WINDOW, &isnull);
	if (!isnull)
		row->budget_window = *DatumGetIntervalP(d);
}

static bool
take_tool(TupleTableSlot *slot, void *arg)
{
	dl_tool_row_from_slot(slot, arg);
	return false;
}

/* The registry's row of tool, as committed now; false when it has none. */
bool
dl_read_tool(const char *tool, ToolRow *row)
{
	Datum		values[1];

	values[0] = CStringGetTextDatum(tool);
	return find_row_now(&dl_tools_table, &tools_by_tool, 1, tool_key, values, take_tool, row);
}

static bool
take_derived(TupleTableSlot *slot, void *arg)
{
	bool		isnull;

	if (DatumGetBool(column_value(&dl_effects_table, slot, EFF_BUSINESS_KEY, &isnull)))
		return true;			/* look on */
	*(bool *) arg = true;
	return false;
}

/* Has tool been called with a derived key (its calls' keys depend on its key fields)? */
bool
dl_read_tool_has_derived_effects(const char *tool)
{
	static LookupIndex effects_by_tool = {.unique = false};
	static const int tool_key[] = {EFF_TOOL};
	Datum		values[1];
	bool		derived = false;

	values[0] = CStringGetTextDatum(tool);
	(void) scan_rows_now(&dl_effects_table, &effects_by_tool, 1, tool_key, values,
						 take_derived, &derived);
	return derived;
}

/* A divergence's row (store.h), copied out of slot. */
void
dl_divergence_row_from_slot(TupleTableSlot *slot, DivergenceRow *row)
{
	LedgerTable *t = &dl_divergences_table;
	bool		isnull;

	row->key = optional_text(t, slot, DIV_KEY);
	row->run = optional_text(t, slot, DIV_RUN);
	row->lease_epoch = DatumGetInt64(column_value(t, slot, DIV_LEASE_EPOCH, &isnull));
	row->tool = optional_text(t, slot, DIV_TOOL);
	row->args = DatumGetJsonbPCopy(column_value(t, slot, DIV_ARGS, &isnull));
	row->occurrence = DatumGetInt32(column_value(t, slot, DIV_OCCURRENCE, &isnull));
	row->candidate_key = optional_text(t, slot, DIV_CANDIDATE_KEY);
	row->verdict = optional_text(t, slot, DIV_VERDICT);
	row->same_as = optional_text(t, slot, DIV_SAME_AS);
}

static bool
take_divergence(TupleTableSlot *slot, void *arg)
{
	dl_divergence_row_from_slot(slot, arg);
	return false;
}

/* The divergence recorded for key, as committed now; false when there is none. */
bool
dl_read_divergence(const char *key, DivergenceRow *row)
{
	Datum		values[1];

	values[0] = CStringGetTextDatum(key);
	return find_row_now(&dl_divergences_table, &divergences_by_key, 1, div_key, values,
						take_divergence, row);
}

static bool
take_existence(TupleTableSlot *slot, void *arg)
{
	*(bool *) arg = true;
	return false;
}

/* Whether a divergence was recorded for run, as committed now. */
bool
dl_read_run_has_divergences(const char *run)
{
	static LookupIndex divergences_by_run = {.unique = false};
	static const int run_key[] = {DIV_RUN};
	Datum		values[1];
	bool		any = false;

	values[0] = CStringGetTextDatum(run);
	(void) scan_rows_now(&dl_divergences_table, &divergences_by_run, 1, run_key, values,
						 take_existence, &any);
	return any;
}

/* a run's effects of one tool (the effects' (tool, run) index) */
static LookupIndex effects_by_tool_run = {.unique = false};
static const int tool_run_key[] = {EFF_TOOL, EFF_RUN};

typedef struct EarlierEffects
{
	int64		before_epoch;
	List	   *effects;		/* of EarlierEffect */
	int32		call_ids;		/* the earlier effects under call ids' keys */
} EarlierEffects;

static bool
take_earlier(TupleTableSlot *slot, void *arg)
{
	EarlierEffects *earlier = arg;
	LedgerTable *t = &dl_effects_table;
	EarlierEffect *effect;
	bool		isnull;

	if (DatumGetInt64(column_value(t, slot, EFF_LEASE_EPOCH, &isnull)) >= earlier->before_epoch)
		return true;
	if (DatumGetBool(column_value(t, slot, EFF_BUSINESS_KEY, &isnull)))
	{
		if (dl_is_call_key(optional_text(t, slot, EFF_KEY)))
			earlier->call_ids++;
		return true;
	}
	effect = palloc(sizeof(EarlierEffect));
	effect->key = optional_text(t, slot, EFF_KEY);
	effect->created_at = DatumGetTimestampTz(column_value(t, slot, EFF_CREATED_AT, &isnull));
	earlier->effects = lappend(earlier->effects, effect);
	return true;
}

static int
earlier_order(const ListCell *a, const ListCell *b)
{
	const EarlierEffect *ea = lfirst(a);
	const EarlierEffect *eb = lfirst(b);

	if (ea->created_at != eb->created_at)
		return ea->created_at < eb->created_at ? -1 : 1;
	return strcmp(ea->key, eb->key);
}

/*
 * The effects of tool that run's attempts before epoch recorded under derived
 * keys, as committed now, in the order they were begun (then by key); and how
 * many they recorded under call ids (business keys begun with call_id).
 */
List *
dl_read_earlier_effects(const char *run, const char *tool, int64 epoch, int32 *call_ids)
{
	Datum		values[2];
	EarlierEffects earlier = {epoch, NIL, 0};

	values[0] = CStringGetTextDatum(tool);
	values[1] = CStringGetTextDatum(run);
	(void) scan_rows_now(&dl_effects_table, &effects_by_tool_run, 2, tool_run_key, values,
						 take_earlier, &earlier);
	list_sort(earlier.effects, earlier_order);
	*call_ids = earlier.call_ids;
	return earlier.effects;
}

static bool
take_effect_row(TupleTableSlot *slot, void *arg)
{
	EffectRow  *row = palloc(sizeof(EffectRow));

	dl_effect_row_from_slot(slot, row);
	*(List **) arg = lappend(*(List **) arg, row);
	return true;
}

/*
 * Every effect of tool that run recorded, under any key, as committed now
 * (EffectRow each, in no order): what a new call id of the run's is compared
 * with (divergence.c).  By the effects' (tool, run) index.
 */
List *
dl_read_run_tool_effects(const char *run, const char *tool)
{
	Datum		values[2];
	List	   *effects = NIL;

	values[0] = CStringGetTextDatum(tool);
	values[1] = CStringGetTextDatum(run);
	(void) scan_rows_now(&dl_effects_table, &effects_by_tool_run, 2, tool_run_key, values,
						 take_effect_row, &effects);
	return effects;
}

/* A copy of the row found, with its TID (for a write of it). */
static bool
take_tuple(TupleTableSlot *slot, void *arg)
{
	HeapTuple	tuple = ExecCopySlotHeapTuple(slot);

	tuple->t_self = slot->tts_tid;
	*(HeapTuple *) arg = tuple;
	return false;
}

/* tool's row of the registry as committed now, or NULL. */
HeapTuple
dl_read_tool_tuple(const char *tool)
{
	Datum		values[1];
	HeapTuple	tuple = NULL;

	values[0] = CStringGetTextDatum(tool);
	(void) find_row_now(&dl_tools_table, &tools_by_tool, 1, tool_key, values, take_tuple, &tuple);
	return tuple;
}

/* The row of key's divergence as committed now, or NULL. */
HeapTuple
dl_read_divergence_tuple(const char *key)
{
	Datum		values[1];
	HeapTuple	tuple = NULL;

	values[0] = CStringGetTextDatum(key);
	(void) find_row_now(&dl_divergences_table, &divergences_by_key, 1, div_key, values,
						take_tuple, &tuple);
	return tuple;
}

/*
 * The unsettled row of an effect (its key and created_at) as committed now,
 * or NULL.  Not locked: only a writer that holds its effect's row lock writes
 * it (write_effects.c), so none can be changing it under that lock.
 */
HeapTuple
dl_read_unsettled_tuple(const char *key, TimestampTz created_at)
{
	static LookupIndex unsettled_by_key;
	static const int unsettled_key[] = {UNS_CREATED_AT, UNS_KEY};
	Datum		values[2];
	HeapTuple	tuple = NULL;

	values[0] = TimestampTzGetDatum(created_at);
	values[1] = CStringGetTextDatum(key);
	(void) find_row_now(&dl_unsettled_table, &unsettled_by_key, 2, unsettled_key, values,
						take_tuple, &tuple);
	return tuple;
}

static Statement run_effect_keys = {
	/* its derived keys, found through its audit log (RUN_LOGGED_KEYS) */
	"SELECT e.key FROM durable_ledger.effects e"
	" WHERE e.key OPERATOR(pg_catalog.=) ANY (" RUN_LOGGED_KEYS ")"
	"   AND e.run" EQ "$1 AND NOT e.business_key"
	" ORDER BY e.created_at, e.key",
	1, {TEXTOID}, NULL, true
};

/*
 * The keys of the effects run recorded under derived keys, as committed now,
 * in the order they were begun (then by key), as dl_read_earlier_effects
 * orders them.
 */
List *
dl_read_run_effect_keys(const char *run)
{
	Datum		values[1];

	values[0] = dl_text_datum(run);
	dl_plan_run_now(&run_effect_keys, values, NULL, SPI_OK_SELECT);
	return first_column_texts();
}

static Statement run_call_ids = {
	/* its effects under call ids' keys, found through its audit log */
	"SELECT e.key FROM durable_ledger.effects e"
	" WHERE e.key OPERATOR(pg_catalog.=) ANY (" RUN_LOGGED_KEYS ")"
	"   AND e.run" EQ "$1 AND e.business_key"
	"   AND pg_catalog.starts_with(e.key, '" DL_CALL_KEY_PREFIX "') LIMIT 1",
	1, {TEXTOID}, NULL, true
};

/* Has run recorded an effect under a call id (begin_effect's call_id), as committed now? */
bool
dl_read_run_has_call_ids(const char *run)
{
	Datum		values[1];

	values[0] = dl_text_datum(run);
	return dl_plan_run_now(&run_call_ids, values, NULL, SPI_OK_SELECT) > 0;
}

static Statement run_logged = {
	"SELECT FROM durable_ledger.audit_log WHERE run" EQ "$1 LIMIT 1",
	1, {TEXTOID}, NULL, true
};

/* Has the ledger ever heard of run: a row of it, or a line of its audit log? */
bool
dl_read_run_known(const char *run)
{
	RunState	state;
	Datum		values[1];

	if (dl_read_run_state(run, &state))
		return true;
	values[0] = dl_text_datum(run);
	return dl_plan_run_now(&run_logged, values, NULL, SPI_OK_SELECT) > 0;
}

static bool
take_policy(TupleTableSlot *slot, void *arg)
{
	UnregisteredPolicy *policy = arg;
	char	   *may_execute = optional_text(&dl_policy_table, slot, POL_UNREGISTERED_TOOLS);
	char	   *divergence = optional_text(&dl_policy_table, slot, POL_UNREGISTERED_DIVERGENCE);

	if (!dl_unregistered_from_name(may_execute, &policy->may_execute) ||
		!dl_divergence_from_name(divergence, &policy->divergence))
		elog(ERROR, "unrecognized policy \"%s\", \"%s\"", may_execute, divergence);
	return false;
}

/*
 * What the ledger does with a tool nobody registered, as committed now (no
 * row: DL_UNREGISTERED_DEFAULT).
 */
UnregisteredPolicy
dl_read_unregistered_policy(void)
{
	static LookupIndex policy_by_singleton;
	static const int policy_key[] = {POL_SINGLETON};
	Datum		values[1];
	UnregisteredPolicy policy = DL_UNREGISTERED_DEFAULT;

	values[0] = BoolGetDatum(true);
	(void) find_row_now(&dl_policy_table, &policy_by_singleton, 1, policy_key, values,
						take_policy, &policy);
	return policy;
}

/* ---------- retention (purge_settled) ---------- */

static Statement purge_candidates = {
	/* runs whose lease was last taken, and released, before the cutoff; by name, after $2 */
	"SELECT r.run FROM durable_ledger.runs r"
	" WHERE r.run OPERATOR(pg_catalog.>) $2"
	"   AND r.acquired_at OPERATOR(pg_catalog.<) $1"
	"   AND (r.released_at IS NULL OR r.released_at OPERATOR(pg_catalog.<) $1)"
	" ORDER BY r.run LIMIT $3",
	3, {TIMESTAMPTZOID, TEXTOID, INT4OID}
};

/* Up to limit runs (names after after_run) that may be quiet since cutoff. */
List *
dl_read_purge_candidates(TimestampTz cutoff, const char *after_run, int limit)
{
	Datum		values[3];

	values[0] = TimestampTzGetDatum(cutoff);
	values[1] = dl_text_datum(after_run);
	values[2] = Int32GetDatum(limit);
	dl_plan_run_now(&purge_candidates, values, NULL, SPI_OK_SELECT);
	return first_column_texts();
}

/* the run's effects (RUN_LOGGED_KEYS), what it has to remove and whether it may */
#define RUN_PURGE_STATE(lock) \
	"WITH keys AS (SELECT DISTINCT k.key FROM (" RUN_LOGGED_KEYS ") k)," \
	"     mine AS (SELECT e.key, e.status, e.conflict, e.safe_to_redo, e.execute_again" \
	"               FROM durable_ledger.effects e" \
	"               JOIN keys k ON e.key" EQ "k.key WHERE e.run" EQ "$1" lock ")" \
	" SELECT (SELECT pg_catalog.count(*) FROM mine)," \
	"        (SELECT pg_catalog.count(*) FROM mine" \
	"          WHERE (mine.status OPERATOR(pg_catalog.<>) ALL ('{completed,failed}')" \
	"                 AND NOT (mine.status OPERATOR(pg_catalog.=) 'started' AND mine.safe_to_redo))" \
	"             OR mine.conflict OR mine.execute_again)," \
	"        (SELECT pg_catalog.count(*) FROM durable_ledger.past_attempts p JOIN mine" \
	"            ON p.key" EQ "mine.key)," \
	"        (SELECT pg_catalog.count(*) FROM durable_ledger.divergences d WHERE d.run" EQ "$1)," \
	"        (SELECT pg_catalog.count(*) FROM durable_ledger.divergences d" \
	"          WHERE d.run" EQ "$1 AND d.verdict IS NULL)" \
	"        OPERATOR(pg_catalog.+) (SELECT pg_catalog.count(*) FROM durable_ledger.run_budgets b" \
	"          WHERE b.run" EQ "$1 AND b.paused_at IS NOT NULL)," \
	"        GREATEST(" \
	"          (SELECT pg_catalog.max(a.logged_at) FROM durable_ledger.audit_log a WHERE a.run" EQ "$1)," \
	"          (SELECT pg_catalog.max(a.logged_at) FROM durable_ledger.audit_log a" \
	"             JOIN mine ON a.key" EQ "mine.key))"

static Statement run_purge_state = {RUN_PURGE_STATE(""), 1, {TEXTOID}, NULL, true};

/*
 * The other runs the ledger names with the run's effects: those of their
 * replaced attempts, and those whose audit rows name one (a business key
 * another run began, failed or replayed).
 */
static Statement runs_sharing_effects = {
	"WITH keys AS (SELECT DISTINCT k.key FROM (" RUN_LOGGED_KEYS ") k),"
	"     mine AS (SELECT e.key FROM durable_ledger.effects e"
	"               JOIN keys k ON e.key" EQ "k.key WHERE e.run" EQ "$1)"
	" SELECT p.run FROM durable_ledger.past_attempts p JOIN mine ON p.key" EQ "mine.key"
	"  WHERE p.run OPERATOR(pg_catalog.<>) $1"
	" UNION"
	" SELECT a.run FROM durable_ledger.audit_log a JOIN mine ON a.key" EQ "mine.key"
	"  WHERE a.run OPERATOR(pg_catalog.<>) $1",
	1, {TEXTOID}, NULL, true
};

/* The runs other than run that the ledger names with run's effects, as committed now. */
List *
dl_read_runs_sharing_effects(const char *run)
{
	Datum		values[1];

	values[0] = dl_text_datum(run);
	dl_plan_run_now(&runs_sharing_effects, values, NULL, SPI_OK_SELECT);
	return first_column_texts();
}

/* the same, its effects locked until the transaction ends: reports wait for the purge */
static Statement run_purge_state_locked = {RUN_PURGE_STATE(" FOR UPDATE OF e"), 1, {TEXTOID}, NULL, true};

/*
 * What purging run would remove, as committed now, and whether it may: none
 * of its effects started (but a recorded call: made again, were the run
 * called again), unknown or flagged, no divergence waiting for a verdict,
 * nothing logged since cutoff, by the run or about one of its effects (a
 * business key another run replayed just now must not be forgotten before
 * that run's retry).  With lock, its effects are locked
 * for this transaction (a report waits for it; READ COMMITTED only).
 */
bool
dl_read_run_purge_state(const char *run, TimestampTz cutoff, bool lock, PurgeCounts *counts)
{
	Datum		values[1];
	HeapTuple	tuple;
	TupleDesc	desc;
	bool		isnull;
	int64		open,
				pending;
	TimestampTz last = 0;
	bool		logged;

	values[0] = dl_text_datum(run);
	if (lock)
		dl_plan_run(&run_purge_state_locked, values, NULL, SPI_OK_SELECT);
	else
		dl_plan_run_now(&run_purge_state, values, NULL, SPI_OK_SELECT);
	tuple = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	counts->effects = DatumGetInt64(SPI_getbinval(tuple, desc, 1, &isnull));
	open = DatumGetInt64(SPI_getbinval(tuple, desc, 2, &isnull));
	counts->past_attempts = DatumGetInt64(SPI_getbinval(tuple, desc, 3, &isnull));
	counts->divergences = DatumGetInt64(SPI_getbinval(tuple, desc, 4, &isnull));
	pending = DatumGetInt64(SPI_getbinval(tuple, desc, 5, &isnull));
	last = DatumGetTimestampTz(SPI_getbinval(tuple, desc, 6, &isnull));
	logged = !isnull;
	return counts->effects > 0 && open == 0 && pending == 0 && (!logged || last < cutoff);
}

static Statement audit_purge_plan = {
	/*
	 * Per chain, the longest prefix of rows past the horizon
	 * (AUDIT_ROW_PAST_HORIZON): a row that stays keeps every row after it in
	 * its chain (a chain loses only a prefix, behind an anchor).
	 */
	"WITH judged AS ("
	"  SELECT a.chain, a.chain_seq, a.id, a.row_hash, " AUDIT_ROW_PAST_HORIZON " AS done"
	"    FROM durable_ledger.audit_log a WHERE a.chain IS NOT NULL),"
	" prefix AS ("
	"  SELECT j.*, pg_catalog.bool_and(j.done) OVER (PARTITION BY j.chain ORDER BY j.chain_seq, j.id"
	"                                        ROWS UNBOUNDED PRECEDING) AS in_prefix"
	"    FROM judged j)"
	" SELECT p.chain, pg_catalog.count(*), pg_catalog.max(p.chain_seq),"
	"        (pg_catalog.array_agg(p.row_hash ORDER BY p.chain_seq DESC))[1]"
	"   FROM prefix p WHERE p.in_prefix GROUP BY p.chain ORDER BY p.chain",
	1, {TIMESTAMPTZOID}
};

/* What purge_audit would remove of each chain, as committed now. */
List *
dl_read_audit_purge_plan(TimestampTz cutoff)
{
	Datum		values[1];
	List	   *plan = NIL;
	uint64		i;

	values[0] = TimestampTzGetDatum(cutoff);
	dl_plan_run_now(&audit_purge_plan, values, NULL, SPI_OK_SELECT);
	for (i = 0; i < SPI_processed; i++)
	{
		HeapTuple	tuple = SPI_tuptable->vals[i];
		TupleDesc	desc = SPI_tuptable->tupdesc;
		AuditPurge *purge = palloc(sizeof(AuditPurge));
		bool		isnull;

		purge->chain = DatumGetInt64(SPI_getbinval(tuple, desc, 1, &isnull));
		purge->rows = DatumGetInt64(SPI_getbinval(tuple, desc, 2, &isnull));
		purge->up_to_seq = DatumGetInt64(SPI_getbinval(tuple, desc, 3, &isnull));
		purge->row_hash = DatumGetByteaPCopy(SPI_getbinval(tuple, desc, 4, &isnull));
		plan = lappend(plan, purge);
	}
	return plan;
}


/* ---------- budgets and the models of attempts ---------- */

static Statement attempts_budget = {
	"SELECT COALESCE(r.max_attempts, (SELECT p.max_run_attempts FROM durable_ledger.policy p)),"
	"       r.forked_from IS NOT NULL"
	"  FROM durable_ledger.runs r WHERE r.run" EQ "$1",
	1, {TEXTOID}
};

/*
 * The run's budget of attempts, its own or the deployment's, as committed
 * now; 0: none.  *forked: the run was forked (its epoch 1 is the fork's).
 */
int32
dl_read_attempts_budget(const char *run, bool *forked)
{
	Datum		values[1];
	bool		isnull;
	Datum		d;

	*forked = false;
	values[0] = CStringGetTextDatum(run);
	if (dl_plan_run_now(&attempts_budget, values, NULL, SPI_OK_SELECT) == 0)
		return 0;
	*forked = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull);
	return isnull ? 0 : DatumGetInt32(d);
}

typedef struct ModelRead
{
	char	   *model;
	char	   *changed_from;
} ModelRead;

static bool
take_model(TupleTableSlot *slot, void *arg)
{
	ModelRead  *read = arg;

	read->model = optional_text(&dl_models_table, slot, MOD_MODEL);
	read->changed_from = optional_text(&dl_models_table, slot, MOD_CHANGED_FROM);
	return false;
}

/*
 * The model recorded for the run's attempt (lease epoch), as committed now;
 * NULL when none was.  *changed_from: the earlier attempts', when it differed.
 */
char *
dl_read_attempt_model(const char *run, int64 epoch, char **changed_from)
{
	static LookupIndex models_by_epoch;
	static const int model_key[] = {MOD_RUN, MOD_LEASE_EPOCH};
	Datum		values[2];
	ModelRead	read = {NULL, NULL};

	values[0] = CStringGetTextDatum(run);
	values[1] = Int64GetDatum(epoch);
	(void) find_row_now(&dl_models_table, &models_by_epoch, 2, model_key, values, take_model,
						&read);
	if (changed_from != NULL)
		*changed_from = read.changed_from;
	return read.model;
}

static Statement earlier_model = {
	"SELECT model FROM durable_ledger.run_models"
	" WHERE run" EQ "$1 AND lease_epoch OPERATOR(pg_catalog.<) $2"
	" ORDER BY lease_epoch DESC LIMIT 1",
	2, {TEXTOID, INT8OID}
};

/* The model of the run's latest attempt before epoch that recorded one; NULL: none. */
char *
dl_read_earlier_model(const char *run, int64 epoch)
{
	Datum		values[2];

	values[0] = CStringGetTextDatum(run);
	values[1] = Int64GetDatum(epoch);
	if (dl_plan_run_now(&earlier_model, values, NULL, SPI_OK_SELECT) == 0)
		return NULL;
	return SPI_getvalue(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1);
}
