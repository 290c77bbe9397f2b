/*
 * store.c: every SQL statement the extension runs, and the ledger's reads
 * and writes built on them (new intents, audit rows and a worker's report on
 * its own effect go to direct.c first, which writes them without the executor
 * when it can).
 *
 * Statements are parameterised, schema-qualified down to the operators, and
 * prepared once per backend (SPI_keepplan).  They run with read_only = false,
 * so under READ COMMITTED each one reads with a fresh snapshot: a lease that
 * had to be waited for is followed by reads that see what its previous holder
 * committed.  The caller must have an open SPI connection.
 */
#include "postgres.h"

#include "access/htup_details.h"
#include "access/xact.h"
#include "access/xlog.h"
#include "catalog/pg_type.h"
#include "executor/spi.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"
#include "utils/snapmgr.h"
#include "utils/timestamp.h"

#include "durable_ledger.h"

typedef enum StatementId
{
	STMT_START_EPOCH,
	STMT_END_EPOCH,
	STMT_RUN_STATE,
	STMT_INSERT_INTENT,
	STMT_FETCH_EFFECT,
	STMT_FETCH_EFFECT_FOR_UPDATE,
	STMT_MARK_UNKNOWN,
	STMT_RESTART_BUSINESS_KEY,
	STMT_FETCH_PAST_ATTEMPT,
	STMT_LEASE_BEGAN_PAST_ATTEMPT,
	STMT_FINISH,
	STMT_SET_CONFLICT,
	STMT_RESOLVE,
	STMT_EFFECT_ROW,
	STMT_AUDIT,
	STMT_LEASE_HOLDER,
	STMT_LAST_LEASE_EVENT,
	NUM_STATEMENTS
} StatementId;

typedef struct Statement
{
	const char *sql;
	int			nargs;
	Oid			argtypes[9];
} Statement;

#define EQ " OPERATOR(pg_catalog.=) "

/* who and where, for every audit row; the role comes from C (see caller_role_name) */
#define AUDIT_COLUMNS \
	" (logged_at, run, key, event, detail, role_name, session_user_name," \
	"  application_name, client_addr, backend_pid, lease_epoch, attempt)"
#define AUDIT_SESSION_VALUES \
	"SESSION_USER, pg_catalog.current_setting('application_name')," \
	" pg_catalog.inet_client_addr(), pg_catalog.pg_backend_pid()"

#define EFFECT_COLUMNS \
	"key, run, tool, args, business_key, occurrence, attempt, status, " \
	"result, error, lease_epoch, conflict"

static const Statement statements[NUM_STATEMENTS] = {
	[STMT_START_EPOCH] = {
		/*
		 * The next epoch of a known run; a run without a row (a new one, or
		 * one whose row was deleted or not restored) continues after the
		 * highest epoch its append-only audit log names, so that an epoch
		 * number is never used twice (that subquery runs only then).
		 */
		"WITH next_epoch AS ("
		"  UPDATE durable_ledger.runs SET"
		"   epochs = epochs OPERATOR(pg_catalog.+) 1, lock_key = $2,"
		"   holder_pid = pg_catalog.pg_backend_pid(), holder_role = $3,"
		"   holder_application_name = pg_catalog.current_setting('application_name'),"
		"   holder_client_addr = pg_catalog.inet_client_addr(),"
		"   acquired_at = pg_catalog.clock_timestamp(), released_at = NULL"
		"  WHERE run" EQ "$1"
		"  RETURNING epochs),"
		" first_epoch AS ("
		"  INSERT INTO durable_ledger.runs"
		"   (run, epochs, lock_key, holder_pid, holder_role, holder_application_name,"
		"    holder_client_addr, acquired_at, released_at, created_at)"
		"  SELECT $1, 1 OPERATOR(pg_catalog.+) COALESCE("
		"          (SELECT pg_catalog.max(a.lease_epoch) FROM durable_ledger.audit_log a"
		"            WHERE a.run" EQ "$1), 0),"
		"         $2, pg_catalog.pg_backend_pid(), $3,"
		"         pg_catalog.current_setting('application_name'), pg_catalog.inet_client_addr(),"
		"         pg_catalog.clock_timestamp(), NULL, pg_catalog.clock_timestamp()"
		"   WHERE NOT EXISTS (SELECT FROM next_epoch)"
		"  ON CONFLICT (run) DO NOTHING"
		"  RETURNING epochs)"
		" SELECT epochs FROM next_epoch UNION ALL SELECT epochs FROM first_epoch",
		3, {TEXTOID, INT8OID, TEXTOID}
	},
	[STMT_END_EPOCH] = {
		"UPDATE durable_ledger.runs SET released_at = pg_catalog.clock_timestamp()"
		" WHERE run" EQ "$1 AND epochs" EQ "$2"
		"   AND holder_pid" EQ "pg_catalog.pg_backend_pid()",
		2, {TEXTOID, INT8OID}
	},
	[STMT_LAST_LEASE_EVENT] = {
		/*
		 * This session's last lease event on run: its audit rows are those
		 * of its backend pid since the backend started (a pid is reused only
		 * after its previous backend has ended).
		 */
		"SELECT event OPERATOR(pg_catalog.=) 'lease_acquired', lease_epoch"
		"  FROM durable_ledger.audit_log"
		" WHERE run" EQ "$1 AND backend_pid" EQ "pg_catalog.pg_backend_pid()"
		"   AND logged_at OPERATOR(pg_catalog.>=) $2"
		"   AND event OPERATOR(pg_catalog.=) ANY ('{lease_acquired,lease_released}')"
		" ORDER BY id DESC LIMIT 1",
		2, {TEXTOID, TIMESTAMPTZOID}
	},
	[STMT_RUN_STATE] = {
		"SELECT epochs, released_at IS NOT NULL, holder_pid FROM durable_ledger.runs WHERE run" EQ "$1",
		1, {TEXTOID}
	},
	[STMT_INSERT_INTENT] = {
		/* the intent and its audit row in one statement: one executor run */
		"WITH intent AS ("
		"  INSERT INTO durable_ledger.effects"
		"   (key, run, tool, args, business_key, occurrence, attempt, status, meta,"
		"    lease_epoch, holder_pid, created_at)"
		"  VALUES ($1, $2, $3, $4, $5, $6, 1, 'started', $7, $8,"
		"   pg_catalog.pg_backend_pid(), pg_catalog.clock_timestamp())"
		"  ON CONFLICT (key) DO NOTHING"
		"  RETURNING key, run, lease_epoch)"
		" INSERT INTO durable_ledger.audit_log" AUDIT_COLUMNS
		" SELECT pg_catalog.clock_timestamp(), intent.run, intent.key, 'intent', NULL, $9,"
		AUDIT_SESSION_VALUES ", intent.lease_epoch, 1 FROM intent",
		9, {TEXTOID, TEXTOID, TEXTOID, JSONBOID, BOOLOID, INT4OID, JSONBOID, INT8OID, TEXTOID}
	},
	[STMT_FETCH_EFFECT] = {
		"SELECT " EFFECT_COLUMNS " FROM durable_ledger.effects WHERE key" EQ "$1",
		1, {TEXTOID}
	},
	[STMT_FETCH_EFFECT_FOR_UPDATE] = {
		"SELECT " EFFECT_COLUMNS " FROM durable_ledger.effects WHERE key" EQ "$1 FOR UPDATE",
		1, {TEXTOID}
	},
	[STMT_MARK_UNKNOWN] = {
		"UPDATE durable_ledger.effects SET status = 'unknown'"
		" WHERE key" EQ "$1 AND status" EQ "'started' AND run" EQ "$2"
		"   AND lease_epoch" EQ "$3 AND attempt" EQ "$4",
		4, {TEXTOID, TEXTOID, INT8OID, INT4OID}
	},
	[STMT_RESTART_BUSINESS_KEY] = {
		/* the failed attempt is kept in past_attempts, the effect starts the next */
		"WITH failed AS ("
		"  SELECT key, attempt, run, lease_epoch, holder_pid, status, error, meta,"
		"         created_at, completed_at, resolved_by, resolution_note"
		"    FROM durable_ledger.effects"
		"   WHERE key" EQ "$1 AND status" EQ "'failed' AND attempt" EQ "$5 AND NOT conflict"
		"   FOR UPDATE),"
		" next AS ("
		"  UPDATE durable_ledger.effects e SET"
		"   run = $2, status = 'started', attempt = e.attempt OPERATOR(pg_catalog.+) 1,"
		"   result = NULL, error = NULL, meta = $3, lease_epoch = $4,"
		"   holder_pid = pg_catalog.pg_backend_pid(), created_at = pg_catalog.clock_timestamp(),"
		"   completed_at = NULL, resolved_by = NULL, resolution_note = NULL"
		"   FROM failed WHERE e.key" EQ "failed.key"
		"   RETURNING e.key)"
		" INSERT INTO durable_ledger.past_attempts"
		"  (key, attempt, run, lease_epoch, holder_pid, status, error, meta, created_at,"
		"   completed_at, resolved_by, resolution_note, replaced_at)"
		" SELECT f.key, f.attempt, f.run, f.lease_epoch, f.holder_pid, f.status, f.error,"
		"        f.meta, f.created_at, f.completed_at, f.resolved_by, f.resolution_note,"
		"        pg_catalog.clock_timestamp()"
		"   FROM failed f JOIN next n ON n.key" EQ "f.key",
		5, {TEXTOID, TEXTOID, JSONBOID, INT8OID, INT4OID}
	},
	[STMT_LEASE_BEGAN_PAST_ATTEMPT] = {
		"SELECT FROM durable_ledger.past_attempts"
		" WHERE key" EQ "$1 AND run" EQ "$2 AND lease_epoch" EQ "$3",
		3, {TEXTOID, TEXTOID, INT8OID}
	},
	[STMT_FETCH_PAST_ATTEMPT] = {
		"SELECT run, lease_epoch, status, error FROM durable_ledger.past_attempts"
		" WHERE key" EQ "$1 AND attempt" EQ "$2",
		2, {TEXTOID, INT4OID}
	},
	[STMT_FINISH] = {
		/* $6: the attempt reported on; NULL: whichever is unambiguous (see ledger.c) */
		"UPDATE durable_ledger.effects SET status = $3,"
		"  result = $4, error = $5, completed_at = pg_catalog.clock_timestamp()"
		" WHERE key" EQ "$1 AND status" EQ "$2"
		"   AND (attempt" EQ "$6"
		"        OR ($6 IS NULL AND (NOT business_key OR attempt" EQ "1)))"
		" RETURNING *",
		6, {TEXTOID, TEXTOID, TEXTOID, JSONBOID, JSONBOID, INT4OID}
	},
	[STMT_SET_CONFLICT] = {
		"UPDATE durable_ledger.effects SET conflict = true WHERE key" EQ "$1",
		1, {TEXTOID}
	},
	[STMT_RESOLVE] = {
		"UPDATE durable_ledger.effects SET status = $2,"
		"  result = $3, error = $4,"
		"  resolved_by = $5, resolution_note = $6, conflict = false,"
		"  completed_at = pg_catalog.clock_timestamp()"
		" WHERE key" EQ "$1",
		6, {TEXTOID, TEXTOID, JSONBOID, JSONBOID, TEXTOID, TEXTOID}
	},
	[STMT_EFFECT_ROW] = {
		"SELECT * FROM durable_ledger.effects WHERE key" EQ "$1",
		1, {TEXTOID}
	},
	[STMT_AUDIT] = {
		"INSERT INTO durable_ledger.audit_log" AUDIT_COLUMNS
		" VALUES (pg_catalog.clock_timestamp(), $1, $2, $3, $4, $5, "
		AUDIT_SESSION_VALUES ", $6, $7)",
		7, {TEXTOID, TEXTOID, TEXTOID, JSONBOID, TEXTOID, INT8OID, INT4OID}
	},
	[STMT_LEASE_HOLDER] = {
		"SELECT l.pid FROM pg_catalog.pg_locks l"
		" WHERE l.locktype" EQ "'advisory' AND l.database" EQ "$1"
		"   AND l.classid" EQ "$2 AND l.objid" EQ "$3"
		"   AND l.objsubid" EQ "$4 AND l.granted",
		4, {OIDOID, OIDOID, OIDOID, INT2OID}
	},
};

static SPIPlanPtr plans[NUM_STATEMENTS];

/* The saved plan of statement id, prepared on first use. */
static SPIPlanPtr
prepared_plan(StatementId id)
{
	const Statement *stmt = &statements[id];

	if (plans[id] == NULL)
	{
		SPIPlanPtr	plan = SPI_prepare(stmt->sql, stmt->nargs, (Oid *) stmt->argtypes);

		if (plan == NULL)
			elog(ERROR, "SPI_prepare failed for \"%s\": %s",
				 stmt->sql, SPI_result_code_string(SPI_result));
		if (SPI_keepplan(plan) != 0)
			elog(ERROR, "SPI_keepplan failed");
		plans[id] = plan;
	}
	return plans[id];
}

/* Runs statement id with the given parameters; returns SPI_processed. */
static uint64
run_statement(StatementId id, Datum *values, const char *nulls, int expected)
{
	const Statement *stmt = &statements[id];
	int			rc;

	rc = SPI_execute_plan(prepared_plan(id), values, nulls, false, 0);
	if (rc != expected)
		elog(ERROR, "SPI_execute_plan returned %s for \"%s\"",
			 SPI_result_code_string(rc), stmt->sql);
	return SPI_processed;
}

/*
 * As run_statement, but reading with the latest snapshot, whatever the
 * isolation level: a question about now (is a lease live?) must not be
 * answered from a REPEATABLE READ transaction's old snapshot.
 */
static uint64
run_statement_now(StatementId id, Datum *values, const char *nulls, int expected)
{
	const Statement *stmt = &statements[id];
	int			rc;

	if (!IsolationUsesXactSnapshot())
		return run_statement(id, values, nulls, expected);

	rc = SPI_execute_snapshot(prepared_plan(id), values, nulls, GetLatestSnapshot(),
							  InvalidSnapshot, false, false, 0);
	if (rc != expected)
		elog(ERROR, "SPI_execute_snapshot returned %s for \"%s\"",
			 SPI_result_code_string(rc), stmt->sql);
	return SPI_processed;
}

static Datum
text_datum(const char *s)
{
	return PointerGetDatum(cstring_to_text(s));
}

static char *
caller_role_name(void)
{
	/* the role as after SET ROLE: SECURITY DEFINER changes only the current user */
	return GetUserNameFromId(GetOuterUserId(), false);
}

/* ---------- runs ---------- */

int64
dl_store_start_epoch(const char *run, uint64 lock_key, bool waited)
{
	Datum		values[3];
	bool		isnull;
	int64		epoch;
	DetailBuilder detail;

	values[0] = text_datum(run);
	values[1] = Int64GetDatum((int64) lock_key);
	values[2] = text_datum(caller_role_name());
	if (run_statement(STMT_START_EPOCH, values, NULL, SPI_OK_SELECT) != 1)
	{
		/* the run's row exists, but not in this transaction's snapshot */
		if (IsolationUsesXactSnapshot())
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("could not serialize access due to a concurrent lease of run \"%s\"", run),
					 errhint("Retry the transaction.")));
		elog(ERROR, "starting a lease epoch of run \"%s\" wrote no row", run);
	}
	epoch = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc,
										1, &isnull));

	dl_detail_init(&detail);
	dl_detail_bool(&detail, "waited", waited);
	dl_audit(run, NULL, "lease_acquired", dl_detail_finish(&detail), epoch, 0);
	return epoch;
}

/*
 * Records the end of this backend's epoch of run (0: no epoch was started);
 * lock_lost says that its lock had been released behind the ledger's back.
 */
void
dl_store_end_epoch(const char *run, int64 epoch, bool lock_lost)
{
	Datum		values[2];
	Jsonb	   *detail = NULL;

	if (epoch > 0)
	{
		values[0] = text_datum(run);
		values[1] = Int64GetDatum(epoch);
		run_statement(STMT_END_EPOCH, values, NULL, SPI_OK_UPDATE);
	}
	if (lock_lost)
	{
		DetailBuilder d;

		dl_detail_init(&d);
		dl_detail_bool(&d, "lock_lost", true);
		detail = dl_detail_finish(&d);
	}
	dl_audit(run, NULL, "lease_released", detail, epoch > 0 ? epoch : 0, 0);
}

/*
 * Did this session take a lease epoch of run that it never released?  The
 * audit log knows, also after the session has forgotten (lease.c); *epoch is
 * that epoch.
 */
bool
dl_store_lease_unreleased_by_me(const char *run, int64 *epoch)
{
	Datum		values[2];
	bool		isnull;
	Datum		d;

	values[0] = text_datum(run);
	values[1] = TimestampTzGetDatum(MyStartTimestamp);
	if (run_statement_now(STMT_LAST_LEASE_EVENT, values, NULL, SPI_OK_SELECT) == 0 ||
		!DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull)))
		return false;
	d = SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull);
	*epoch = isnull ? 0 : DatumGetInt64(d);
	return true;
}

/*
 * The run's current epoch, whether it was released, and who took it, as
 * committed now (whatever the transaction's snapshot).
 */
bool
dl_store_run_state(const char *run, int64 *epoch, bool *released, int *holder_pid)
{
	Datum		values[1];
	bool		isnull;

	values[0] = text_datum(run);
	if (run_statement_now(STMT_RUN_STATE, values, NULL, SPI_OK_SELECT) == 0)
		return false;
	*epoch = DatumGetInt64(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
	*released = DatumGetBool(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 2, &isnull));
	*holder_pid = DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 3, &isnull));
	return true;
}

/* ---------- effects ---------- */

/*
 * Inserts the intent of a key that cannot exist yet, and its audit row.  A
 * duplicate would be a unique violation (an error), never a second intent.
 */
void
dl_store_insert_new_intent(const NewIntent *intent)
{
	if (dl_direct_insert_intent(intent))
		dl_audit(intent->run, intent->key, "intent", NULL, intent->lease_epoch, 1);
	else if (!dl_store_insert_intent(intent))
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("effect \"%s\" already exists", intent->key)));
}

/* Inserts the intent and its audit row; false when the key already exists. */
bool
dl_store_insert_intent(const NewIntent *intent)
{
	Datum		values[9];
	char		nulls[9] = "         ";

	values[0] = text_datum(intent->key);
	values[1] = text_datum(intent->run);
	values[2] = text_datum(intent->tool);
	values[3] = JsonbPGetDatum(intent->args);
	values[4] = BoolGetDatum(intent->business_key);
	values[5] = Int32GetDatum(intent->occurrence);
	if (intent->business_key)
		nulls[5] = 'n';
	values[6] = PointerGetDatum(intent->meta);
	if (intent->meta == NULL)
		nulls[6] = 'n';
	values[7] = Int64GetDatum(intent->lease_epoch);
	values[8] = text_datum(caller_role_name());
	return run_statement(STMT_INSERT_INTENT, values, nulls, SPI_OK_INSERT) == 1;
}

static Jsonb *
optional_jsonb(HeapTuple tuple, TupleDesc desc, int column)
{
	bool		isnull;
	Datum		d = SPI_getbinval(tuple, desc, column, &isnull);

	return isnull ? NULL : DatumGetJsonbP(d);
}

bool
dl_store_fetch_effect(const char *key, bool for_update, EffectRow *row)
{
	Datum		values[1];
	HeapTuple	tuple;
	TupleDesc	desc;
	bool		isnull;
	Datum		d;

	values[0] = text_datum(key);
	if (run_statement(for_update ? STMT_FETCH_EFFECT_FOR_UPDATE : STMT_FETCH_EFFECT,
					  values, NULL, SPI_OK_SELECT) == 0)
		return false;

	tuple = SPI_tuptable->vals[0];
	desc = SPI_tuptable->tupdesc;
	row->key = SPI_getvalue(tuple, desc, 1);
	row->run = SPI_getvalue(tuple, desc, 2);
	row->tool = SPI_getvalue(tuple, desc, 3);
	row->args = DatumGetJsonbP(SPI_getbinval(tuple, desc, 4, &isnull));
	row->business_key = DatumGetBool(SPI_getbinval(tuple, desc, 5, &isnull));
	d = SPI_getbinval(tuple, desc, 6, &isnull);
	row->occurrence = isnull ? 0 : DatumGetInt32(d);
	row->attempt = DatumGetInt32(SPI_getbinval(tuple, desc, 7, &isnull));
	row->status = dl_status_from_name(SPI_getvalue(tuple, desc, 8));
	row->result = optional_jsonb(tuple, desc, 9);
	row->error = optional_jsonb(tuple, desc, 10);
	row->lease_epoch = DatumGetInt64(SPI_getbinval(tuple, desc, 11, &isnull));
	row->conflict = DatumGetBool(SPI_getbinval(tuple, desc, 12, &isnull));
	return true;
}

/*
 * started -> unknown, only if the row is still the attempt the caller saw
 * (a business key's next attempt may reuse an epoch number of another run).
 */
bool
dl_store_mark_unknown(const EffectRow *row)
{
	Datum		values[4];

	values[0] = text_datum(row->key);
	values[1] = text_datum(row->run);
	values[2] = Int64GetDatum(row->lease_epoch);
	values[3] = Int32GetDatum(row->attempt);
	return run_statement(STMT_MARK_UNKNOWN, values, NULL, SPI_OK_UPDATE) == 1;
}

/*
 * failed -> started (the next attempt), only if the row is still what the
 * caller saw; the failed attempt is kept in past_attempts.
 */
bool
dl_store_restart_business_key(const NewIntent *intent, int32 old_attempt)
{
	Datum		values[5];
	char		nulls[5] = "     ";

	values[0] = text_datum(intent->key);
	values[1] = text_datum(intent->run);
	values[2] = PointerGetDatum(intent->meta);
	if (intent->meta == NULL)
		nulls[2] = 'n';
	values[3] = Int64GetDatum(intent->lease_epoch);
	values[4] = Int32GetDatum(old_attempt);
	return run_statement(STMT_RESTART_BUSINESS_KEY, values, nulls, SPI_OK_INSERT) == 1;
}

/* Did the lease (run, epoch) also start an attempt of key that was replaced? */
bool
dl_store_lease_began_past_attempt(const char *key, const char *run, int64 lease_epoch)
{
	Datum		values[3];

	values[0] = text_datum(key);
	values[1] = text_datum(run);
	values[2] = Int64GetDatum(lease_epoch);
	return run_statement(STMT_LEASE_BEGAN_PAST_ATTEMPT, values, NULL, SPI_OK_SELECT) > 0;
}

/*
 * Does key exist now, whatever the transaction's snapshot?  (Under
 * REPEATABLE READ, an effect recorded after the snapshot is not "unknown":
 * the transaction must be retried.)
 */
bool
dl_store_effect_exists_now(const char *key)
{
	Datum		values[1];

	values[0] = text_datum(key);
	return run_statement_now(STMT_EFFECT_ROW, values, NULL, SPI_OK_SELECT) > 0;
}

/*
 * An attempt of key that a later attempt replaced: the run and epoch that
 * started it and what was recorded for it.  False when it is not on record.
 */
bool
dl_store_fetch_past_attempt(const char *key, int32 attempt, PastAttempt *past)
{
	Datum		values[2];
	HeapTuple	tuple;
	TupleDesc	desc;
	bool		isnull;

	values[0] = text_datum(key);
	values[1] = Int32GetDatum(attempt);
	if (run_statement(STMT_FETCH_PAST_ATTEMPT, values, NULL, SPI_OK_SELECT) == 0)
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
 * from -> to with result/error, only if the row is in status from and its
 * current attempt is attempt; an attempt of 0 stands for a report that named
 * none, and matches only a derived key or a first attempt.  Returns the
 * changed row, laid out as durable_ledger.effects, with the run, lease epoch
 * and attempt that started it; or NULL when no row matched.  A report on a
 * started effect is the hot path: direct.c applies it without the executor
 * when it can.
 */
HeapTuple
dl_store_finish(const char *key, EffectStatus from, EffectStatus to,
				Jsonb *result, Jsonb *error, int32 attempt,
				char **run, int64 *lease_epoch, int32 *row_attempt)
{
	Datum		values[6];
	char		nulls[6] = "      ";
	HeapTuple	row;
	TupleDesc	desc;
	bool		isnull;

	if (from == EFFECT_STARTED)
	{
		switch (dl_direct_finish(key, to, result, error, attempt, &row, run,
								 lease_epoch, row_attempt))
		{
			case DIRECT_DONE:
				return row;
			case DIRECT_NOT_DONE:
				return NULL;
			case DIRECT_USE_SQL:
				break;
		}
	}

	values[0] = text_datum(key);
	values[1] = text_datum(dl_status_name(from));
	values[2] = text_datum(dl_status_name(to));
	values[3] = PointerGetDatum(result);
	if (result == NULL)
		nulls[3] = 'n';
	values[4] = PointerGetDatum(error);
	if (error == NULL)
		nulls[4] = 'n';
	values[5] = Int32GetDatum(attempt);
	if (attempt == 0)
		nulls[5] = 'n';
	if (run_statement(STMT_FINISH, values, nulls, SPI_OK_UPDATE_RETURNING) != 1)
		return NULL;

	row = SPI_copytuple(SPI_tuptable->vals[0]);
	desc = SPI_tuptable->tupdesc;
	*run = SPI_getvalue(row, desc, SPI_fnumber(desc, "run"));
	*lease_epoch = DatumGetInt64(SPI_getbinval(row, desc, SPI_fnumber(desc, "lease_epoch"),
											   &isnull));
	*row_attempt = DatumGetInt32(SPI_getbinval(row, desc, SPI_fnumber(desc, "attempt"),
											   &isnull));
	return row;
}

void
dl_store_set_conflict(const char *key)
{
	Datum		values[1];

	values[0] = text_datum(key);
	if (run_statement(STMT_SET_CONFLICT, values, NULL, SPI_OK_UPDATE) != 1)
		elog(ERROR, "flagging effect \"%s\" updated no row", key);
}

void
dl_store_resolve(const char *key, EffectStatus to, Jsonb *value,
				 const char *resolved_by, const char *note)
{
	Datum		values[6];
	char		nulls[6] = "      ";

	values[0] = text_datum(key);
	values[1] = text_datum(dl_status_name(to));
	values[2] = PointerGetDatum(value);
	values[3] = PointerGetDatum(value);
	/* the value is the result of a completed effect, the error of a failed one */
	if (to != EFFECT_COMPLETED || value == NULL)
		nulls[2] = 'n';
	if (to != EFFECT_FAILED || value == NULL)
		nulls[3] = 'n';
	values[4] = text_datum(resolved_by);
	values[5] = note ? text_datum(note) : (Datum) 0;
	if (note == NULL)
		nulls[5] = 'n';
	if (run_statement(STMT_RESOLVE, values, nulls, SPI_OK_UPDATE) != 1)
		elog(ERROR, "resolving effect \"%s\" updated no row", key);
}

/*
 * The effect's row formed with desc (the durable_ledger.effects row type), in
 * SPI memory, or NULL when there is no such key.  With report_unknown, a
 * started effect whose lease has ended is shown with status unknown.  The row
 * and the lease are both read as they are now (also under REPEATABLE READ),
 * and the row is read again once the lease is found ended: an effect that
 * was completed meanwhile must not be called unknown.  A hot standby cannot
 * see the primary's leases: it shows the stored status.
 */
HeapTuple
dl_store_effect_tuple(const char *key, bool report_unknown, TupleDesc desc)
{
	Datum		values[1];
	Datum	   *cols = palloc(desc->natts * sizeof(Datum));
	bool	   *col_nulls = palloc(desc->natts * sizeof(bool));
	int			round;

	values[0] = text_datum(key);
	for (round = 0;; round++)
	{
		TupleDesc	found_desc;
		int			status_col;
		int			run_col;
		int			epoch_col;
		int			attempt_col;
		char	   *run;
		int64		epoch;
		int32		attempt;

		if (run_statement_now(STMT_EFFECT_ROW, values, NULL, SPI_OK_SELECT) == 0)
			return NULL;
		found_desc = SPI_tuptable->tupdesc;
		if (found_desc->natts != desc->natts)
			elog(ERROR, "durable_ledger.effects does not have the columns this library expects");
		heap_deform_tuple(SPI_tuptable->vals[0], found_desc, cols, col_nulls);

		status_col = SPI_fnumber(found_desc, "status");
		if (!report_unknown || RecoveryInProgress() ||
			strcmp(TextDatumGetCString(cols[status_col - 1]), "started") != 0)
			break;

		run_col = SPI_fnumber(found_desc, "run");
		epoch_col = SPI_fnumber(found_desc, "lease_epoch");
		attempt_col = SPI_fnumber(found_desc, "attempt");
		run = TextDatumGetCString(cols[run_col - 1]);
		epoch = DatumGetInt64(cols[epoch_col - 1]);
		attempt = DatumGetInt32(cols[attempt_col - 1]);
		if (dl_lease_is_live(run, epoch))
			break;

		/* ended: unknown, if the row is still that started attempt now */
		if (run_statement_now(STMT_EFFECT_ROW, values, NULL, SPI_OK_SELECT) == 0)
			return NULL;
		heap_deform_tuple(SPI_tuptable->vals[0], found_desc, cols, col_nulls);
		if (strcmp(TextDatumGetCString(cols[status_col - 1]), "started") == 0 &&
			strcmp(TextDatumGetCString(cols[run_col - 1]), run) == 0 &&
			DatumGetInt64(cols[epoch_col - 1]) == epoch &&
			DatumGetInt32(cols[attempt_col - 1]) == attempt)
		{
			cols[status_col - 1] = text_datum("unknown");
			break;
		}
		if (round >= 16)
			ereport(ERROR,
					(errcode(ERRCODE_T_R_SERIALIZATION_FAILURE),
					 errmsg("effect \"%s\" kept changing while its status was read", key),
					 errhint("Retry the call.")));
	}
	return heap_form_tuple(desc, cols, col_nulls);
}

/* The pid holding the run's lease lock, or 0. */
int
dl_store_lease_holder_pid(uint64 lock_key)
{
	Datum		values[4];
	bool		isnull;

	values[0] = ObjectIdGetDatum(MyDatabaseId);
	values[1] = ObjectIdGetDatum((Oid) (lock_key >> 32));
	values[2] = ObjectIdGetDatum((Oid) (uint32) lock_key);
	values[3] = Int16GetDatum(DL_LOCK_CLASS);
	if (run_statement(STMT_LEASE_HOLDER, values, NULL, SPI_OK_SELECT) == 0)
		return 0;
	return DatumGetInt32(SPI_getbinval(SPI_tuptable->vals[0], SPI_tuptable->tupdesc, 1, &isnull));
}

/* ---------- audit log ---------- */

/*
 * Appends one event to the audit log; a lease_epoch or attempt of 0 is
 * stored as NULL.
 */
void
dl_audit(const char *run, const char *key, const char *event, Jsonb *detail,
		 int64 lease_epoch, int32 attempt)
{
	char	   *role_name = caller_role_name();
	Datum		values[7];
	char		nulls[7] = "       ";

	dl_note_ledger_write();
	if (dl_direct_audit(run, key, event, detail, lease_epoch, attempt, role_name))
		return;

	values[0] = run ? text_datum(run) : (Datum) 0;
	if (run == NULL)
		nulls[0] = 'n';
	values[1] = key ? text_datum(key) : (Datum) 0;
	if (key == NULL)
		nulls[1] = 'n';
	values[2] = text_datum(event);
	values[3] = PointerGetDatum(detail);
	if (detail == NULL)
		nulls[3] = 'n';
	values[4] = text_datum(role_name);
	values[5] = Int64GetDatum(lease_epoch);
	if (lease_epoch <= 0)
		nulls[5] = 'n';
	values[6] = Int32GetDatum(attempt);
	if (attempt <= 0)
		nulls[6] = 'n';
	run_statement(STMT_AUDIT, values, nulls, SPI_OK_INSERT);
}

/* ---------- details: small flat JSON objects for the audit log ---------- */

void
dl_detail_init(DetailBuilder *d)
{
	d->state = NULL;
	(void) pushJsonbValue(&d->state, WJB_BEGIN_OBJECT, NULL);
}

static void
detail_key(DetailBuilder *d, const char *name)
{
	JsonbValue	k;

	k.type = jbvString;
	k.val.string.val = (char *) name;
	k.val.string.len = strlen(name);
	(void) pushJsonbValue(&d->state, WJB_KEY, &k);
}

void
dl_detail_text(DetailBuilder *d, const char *name, const char *value)
{
	JsonbValue	v;

	detail_key(d, name);
	if (value == NULL)
		v.type = jbvNull;
	else
	{
		v.type = jbvString;
		v.val.string.val = (char *) value;
		v.val.string.len = strlen(value);
	}
	(void) pushJsonbValue(&d->state, WJB_VALUE, &v);
}

void
dl_detail_int(DetailBuilder *d, const char *name, int64 value)
{
	JsonbValue	v;

	detail_key(d, name);
	v.type = jbvNumeric;
	v.val.numeric = int64_to_numeric(value);
	(void) pushJsonbValue(&d->state, WJB_VALUE, &v);
}

void
dl_detail_bool(DetailBuilder *d, const char *name, bool value)
{
	JsonbValue	v;

	detail_key(d, name);
	v.type = jbvBool;
	v.val.boolean = value;
	(void) pushJsonbValue(&d->state, WJB_VALUE, &v);
}

/* A jsonb value, or JSON null for SQL NULL. */
void
dl_detail_jsonb(DetailBuilder *d, const char *name, Jsonb *value)
{
	JsonbValue	v;

	detail_key(d, name);
	if (value == NULL)
		v.type = jbvNull;
	else
	{
		v.type = jbvBinary;
		v.val.binary.data = &value->root;
		v.val.binary.len = VARSIZE(value) - VARHDRSZ;
	}
	(void) pushJsonbValue(&d->state, WJB_VALUE, &v);
}

Jsonb *
dl_detail_finish(DetailBuilder *d)
{
	JsonbValue *object = pushJsonbValue(&d->state, WJB_END_OBJECT, NULL);

	return JsonbValueToJsonb(object);
}
