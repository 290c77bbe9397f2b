/*
 * write_budgets.c: the rows of durable_ledger.run_budgets (a run's counter of
 * a budgeted tool, its own budgets, the call a budget paused), a run's and
 * the deployment's budget of attempts, and run_models (each attempt's model).
 *
 * A run's counter is written by the run's calls, which its lease serialises
 * (a session's, or a token call's hold on the run's call lock), and by
 * set_run_budget, which closes the run for calls meanwhile (the lock
 * abandon_run takes).  A call still locks the counter before it judges it,
 * and writes the version it locked: a session that dropped its lease lock
 * behind the extension's back (pg_advisory_unlock_all) in a transaction
 * still open lets another lease of the run call meanwhile, which then waits
 * for that transaction and counts after it.
 *
 * A transaction that executes a tool many times in a run writes its counter
 * each time: each write is a new version of the row, which the next lookup
 * would walk from the index (quadratic in a batch).  So the transaction
 * remembers the version it wrote last, and writes the next from it, by its
 * tid: it holds the row's lock, so nobody else wrote it since.  It is used
 * only while it is the row's latest version as the transaction sees it (not
 * after a change by hand), and forgotten when a subtransaction rolls back,
 * the table changes (TRUNCATE, a rewrite), or the extension's other writers
 * of the row (the answered pauses, a fork) write.
 */
#include "postgres.h"

#include "access/heapam.h"
#include "access/xact.h"
#include "catalog/pg_type.h"
#include "storage/proc.h"
#include "utils/hsearch.h"
#include "storage/bufmgr.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/snapmgr.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"
#include "utils/timestamp.h"

#include "rows.h"

static const int budget_key[] = {BUD_RUN, BUD_TOOL};

/* ---------- the versions this transaction wrote ---------- */

typedef struct WrittenKey
{
	char		run[DL_MAX_RUN_CHARS * 4 + 1];	/* (in bytes: up to four a character) */
	char		tool[DL_MAX_TOOL_CHARS * 4 + 1];
} WrittenKey;

typedef struct Written
{
	WrittenKey	key;
	ItemPointerData tid;		/* the version written */
} Written;

static HTAB *written = NULL;	/* in TopTransactionContext, of transaction written_lxid */
static LocalTransactionId written_lxid = InvalidLocalTransactionId;
static Oid	written_relid = InvalidOid;	/* the table they are versions of */

static void
forget_written(void)
{
	written = NULL;				/* its memory goes with the transaction's */
	written_lxid = InvalidLocalTransactionId;
}

/* A subtransaction rolled back: the versions it wrote are gone. */
static void
subxact_changed(SubXactEvent event, SubTransactionId mySubid, SubTransactionId parentSubid,
				void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		forget_written();
}

/* The table changed (a TRUNCATE, a rewrite): its tids are another table's. */
static void
relcache_changed(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == written_relid)
		forget_written();
}

void
dl_budgets_init(void)
{
	RegisterSubXactCallback(subxact_changed, NULL);
	CacheRegisterRelcacheCallback(relcache_changed, (Datum) 0);
}

static void
written_key(WrittenKey *key, const char *run, const char *tool)
{
	memset(key, 0, sizeof(WrittenKey));
	strlcpy(key->run, run, sizeof(key->run));
	strlcpy(key->tool, tool, sizeof(key->tool));
}

static bool
is_row_of(Relation rel, HeapTuple tuple, const char *run, const char *tool)
{
	TupleDesc	desc = RelationGetDescr(rel);
	AttrNumber *a = dl_budgets_table.attnums;
	bool		isnull;
	Datum		d;

	d = heap_getattr(tuple, a[BUD_RUN], desc, &isnull);
	if (isnull || strcmp(TextDatumGetCString(d), run) != 0)
		return false;
	d = heap_getattr(tuple, a[BUD_TOOL], desc, &isnull);
	return !isnull && strcmp(TextDatumGetCString(d), tool) == 0;
}

/*
 * The version of run's row of tool this transaction wrote last, or NULL: if
 * it is still the row's latest, as this transaction sees it (one changed by
 * hand since, in this transaction, is not).
 */
static HeapTuple
written_version(Relation rel, const char *run, const char *tool)
{
	WrittenKey	key;
	Written    *entry;
	HeapTupleData found;
	Buffer		buffer;
	HeapTuple	version = NULL;

	if (written == NULL || written_lxid != MyProc->lxid || RelationGetRelid(rel) != written_relid)
		return NULL;
	written_key(&key, run, tool);
	entry = hash_search(written, &key, HASH_FIND, NULL);
	if (entry == NULL)
		return NULL;
	found.t_self = entry->tid;
	if (heap_fetch(rel, SnapshotSelf, &found, &buffer, false))
	{
		if (TransactionIdIsCurrentTransactionId(HeapTupleHeaderGetXmin(found.t_data)) &&
			is_row_of(rel, &found, run, tool))
			version = heap_copytuple(&found);
		ReleaseBuffer(buffer);
	}
	return version;
}

/* Remembers the version w wrote of run's row of tool. */
static void
remember_written(RowWrite *w, const char *run, const char *tool)
{
	WrittenKey	key;
	Written    *entry;

	if (written == NULL || written_lxid != MyProc->lxid)
	{
		HASHCTL		ctl;

		written_relid = RelationGetRelid(w->rel);
		ctl.keysize = sizeof(WrittenKey);
		ctl.entrysize = sizeof(Written);
		ctl.hcxt = TopTransactionContext;
		written = hash_create("durable_ledger counters written", 16, &ctl,
							  HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
		written_lxid = MyProc->lxid;
	}
	written_key(&key, run, tool);
	entry = hash_search(written, &key, HASH_ENTER, NULL);
	entry->tid = w->slot->tts_tid;
}

/* The counter row's columns, as locked. */
static void
budget_from_tuple(TupleDesc desc, HeapTuple tuple, RunBudgetRow *row)
{
	AttrNumber *a = dl_budgets_table.attnums;
	bool		isnull;
	Datum		d;

	row->found = true;
	row->executions = DatumGetInt32(heap_getattr(tuple, a[BUD_EXECUTIONS], desc, &isnull));
	d = heap_getattr(tuple, a[BUD_RECENT], desc, &isnull);
	if (!isnull)
	{
		Datum	   *elems;
		bool	   *nulls;
		int			i;

		deconstruct_array(DatumGetArrayTypeP(d), TIMESTAMPTZOID, sizeof(TimestampTz), true,
						  TYPALIGN_DOUBLE, &elems, &nulls, &row->nrecent);
		row->recent = palloc(sizeof(TimestampTz) * Max(row->nrecent, 1));
		for (i = 0; i < row->nrecent; i++)
			row->recent[i] = DatumGetTimestampTz(elems[i]);
	}
	d = heap_getattr(tuple, a[BUD_MAX_EXECUTIONS], desc, &isnull);
	row->max_executions = isnull ? 0 : DatumGetInt32(d);
	d = heap_getattr(tuple, a[BUD_MAX_IN_WINDOW], desc, &isnull);
	row->max_in_window = isnull ? 0 : DatumGetInt32(d);
	(void) heap_getattr(tuple, a[BUD_PAUSED_AT], desc, &isnull);
	row->paused = !isnull;
}

/*
 * Locks run's counter of tool for this transaction, its latest version
 * (whatever the snapshot; waiting for a transaction that is writing it, also
 * one inserting it), and reads it; counter->tuple NULL (and zeros) when the
 * run has none yet.
 */
void
dl_lock_run_budget(const char *run, const char *tool, BudgetCounter *counter)
{
	Datum		values[2];
	RowWrite	w;
	HeapTuple	mine;

	memset(counter, 0, sizeof(BudgetCounter));
	dl_row_lookup(&w, &dl_budgets_table);
	mine = written_version(w.rel, run, tool);
	if (mine != NULL)
	{
		counter->tuple = mine;	/* locked by its write */
		budget_from_tuple(RelationGetDescr(w.rel), counter->tuple, &counter->row);
		dl_row_end(&w);
		return;
	}
	values[0] = CStringGetTextDatum(run);
	values[1] = CStringGetTextDatum(tool);
	if (dl_row_lock_by(&w, 2, budget_key, values, &counter->tuple))
		budget_from_tuple(RelationGetDescr(w.rel), counter->tuple, &counter->row);
	else
		counter->tuple = NULL;
	dl_row_end(&w);
}

/*
 * Begins the write of run's row of tool: from the version read, or a new
 * row (no execution, no window, no budget of its own, nothing paused).
 */
static void
begin_budget_write(RowWrite *w, const char *run, const char *tool, HeapTuple read)
{
	dl_row_begin(w, &dl_budgets_table);
	if (read != NULL)
	{
		dl_row_start_from(w, read);
		return;
	}
	dl_row_set(w, BUD_RUN, CStringGetTextDatum(run));
	dl_row_set(w, BUD_TOOL, CStringGetTextDatum(tool));
	dl_row_set(w, BUD_EXECUTIONS, Int32GetDatum(0));
	dl_row_set(w, BUD_RECENT, PointerGetDatum(construct_empty_array(TIMESTAMPTZOID)));
	dl_row_set_null(w, BUD_MAX_EXECUTIONS);
	dl_row_set_null(w, BUD_MAX_IN_WINDOW);
}

static void
set_not_paused(RowWrite *w)
{
	dl_row_set_null(w, BUD_PAUSED_AT);
	dl_row_set_null(w, BUD_PAUSED_KEY);
	dl_row_set_null(w, BUD_PAUSED_ARGS);
	dl_row_set_null(w, BUD_PAUSED_EPOCH);
	dl_row_set_null(w, BUD_PAUSED_REASON);
	dl_row_set_null(w, BUD_PAUSED_BUDGET);
}

static void
end_budget_write(RowWrite *w, HeapTuple read, const char *run, const char *tool)
{
	if (read != NULL)
		dl_row_update(w, read);
	else
		dl_row_insert(w);
	remember_written(w, run, tool);
	dl_row_end(w);
}

/*
 * A call of tool executed in run: counted, one more than read, with the
 * times of the latest executions its window counts.  A pause of the tool in
 * the run is answered by it.
 */
void
dl_write_budget_count(const char *run, const char *tool, const BudgetCounter *counter,
					  const TimestampTz *recent, int nrecent)
{
	RowWrite	w;
	Datum	   *elems = palloc(sizeof(Datum) * Max(nrecent, 1));
	int			i;

	for (i = 0; i < nrecent; i++)
		elems[i] = TimestampTzGetDatum(recent[i]);
	begin_budget_write(&w, run, tool, counter->tuple);
	dl_row_set(&w, BUD_EXECUTIONS, Int32GetDatum(counter->row.executions + 1));
	if (nrecent > 0 || counter->row.nrecent > 0)
		dl_row_set(&w, BUD_RECENT,
				   PointerGetDatum(construct_array(elems, nrecent, TIMESTAMPTZOID,
												   sizeof(TimestampTz), true, TYPALIGN_DOUBLE)));
	if (counter->row.paused)
		set_not_paused(&w);
	end_budget_write(&w, counter->tuple, run, tool);
}

/*
 * A budget paused a call of tool in run (key, args, from epoch), for reason;
 * counter: as the call judged it.
 */
void
dl_write_budget_pause(const char *run, const char *tool, const BudgetCounter *counter,
					  const char *key, Jsonb *args, int64 epoch, const char *budget,
					  const char *reason)
{
	RowWrite	w;

	begin_budget_write(&w, run, tool, counter->tuple);
	dl_row_set(&w, BUD_PAUSED_AT, dl_row_now());
	dl_row_set(&w, BUD_PAUSED_KEY, CStringGetTextDatum(key));
	dl_row_set(&w, BUD_PAUSED_ARGS, JsonbPGetDatum(args));
	dl_row_set(&w, BUD_PAUSED_EPOCH, Int64GetDatum(epoch));
	dl_row_set(&w, BUD_PAUSED_REASON, CStringGetTextDatum(reason));
	dl_row_set(&w, BUD_PAUSED_BUDGET, CStringGetTextDatum(budget));
	end_budget_write(&w, counter->tuple, run, tool);
}

/* run's own budgets of tool: those given (NULL: kept); the caller closed the run. */
void
dl_write_run_budget(const char *run, const char *tool, const int32 *max_executions,
					const int32 *max_in_window)
{
	BudgetCounter counter;
	RowWrite	w;

	dl_lock_run_budget(run, tool, &counter);
	begin_budget_write(&w, run, tool, counter.tuple);
	if (max_executions != NULL)
		dl_row_set(&w, BUD_MAX_EXECUTIONS, Int32GetDatum(*max_executions));
	if (max_in_window != NULL)
		dl_row_set(&w, BUD_MAX_IN_WINDOW, Int32GetDatum(*max_in_window));
	end_budget_write(&w, counter.tuple, run, tool);
}

/*
 * run's own budget of attempts; *before its earlier one (0: none).  False
 * when the run has no row.
 */
bool
dl_write_run_attempts(const char *run, int32 max_attempts, int32 *before)
{
	RowWrite	w;
	HeapTuple	locked;
	bool		isnull;
	Datum		d;

	dl_row_begin(&w, &dl_runs_table);
	if (!dl_row_lock(&w, CStringGetTextDatum(run), RUN_RUN, &locked))
	{
		dl_row_end(&w);
		return false;
	}
	d = heap_getattr(locked, dl_runs_table.attnums[RUN_MAX_ATTEMPTS], RelationGetDescr(w.rel),
					 &isnull);
	*before = isnull ? 0 : DatumGetInt32(d);
	dl_row_start_from(&w, locked);
	dl_row_set(&w, RUN_MAX_ATTEMPTS, Int32GetDatum(max_attempts));
	dl_row_update(&w, locked);
	dl_row_announce_change(&w);	/* calls remember a run's budget of attempts */
	dl_row_end(&w);
	return true;
}

#define NOT_PAUSED \
	"UPDATE durable_ledger.run_budgets b" \
	"   SET paused_at = NULL, paused_key = NULL, paused_args = NULL," \
	"       paused_epoch = NULL, paused_reason = NULL, paused_budget = NULL" \
	" WHERE b.paused_at IS NOT NULL AND "

/* set_run_budget: the run's pauses of the budgets given ($3, $4, $5: given) */
static Statement answer_run_pauses = {
	NOT_PAUSED "b.run" EQ "$1 AND ("
	"   (b.tool" EQ "$2 AND b.paused_budget" EQ "'executions' AND $3)"
	"   OR (b.tool" EQ "$2 AND b.paused_budget" EQ "'window' AND $4)"
	"   OR (b.paused_budget" EQ "'attempts' AND $5))",
	5, {TEXTOID, TEXTOID, BOOLOID, BOOLOID, BOOLOID}
};

/*
 * set_budget: every run's pauses of the tool whose budget it removed or
 * raised past them: executions ($2 the new limit, NULL: none) where the run
 * has no limit of its own, windows ($3 the new limit, NULL: none; $4 the one
 * it replaces) where the run has no window limit of its own
 */
static Statement answer_tool_pauses = {
	NOT_PAUSED "b.tool" EQ "$1 AND ("
	"   (b.paused_budget" EQ "'executions' AND b.max_executions IS NULL"
	"    AND ($2::integer IS NULL OR b.executions OPERATOR(pg_catalog.<) $2))"
	"   OR (b.paused_budget" EQ "'window' AND b.max_in_window IS NULL"
	"    AND ($3::integer IS NULL OR $3 OPERATOR(pg_catalog.>) $4)))",
	4, {TEXTOID, INT4OID, INT4OID, INT4OID}
};

/*
 * set_attempts_budget: the pauses of attempts of the runs without a budget of
 * their own, when it removed or raised every run's ($1 the new, NULL: none;
 * $2 the one it replaces, NULL: none)
 */
static Statement answer_attempts_pauses = {
	NOT_PAUSED "b.paused_budget" EQ "'attempts'"
	" AND ($1::integer IS NULL OR $1 OPERATOR(pg_catalog.>) $2)"
	" AND NOT EXISTS (SELECT FROM durable_ledger.runs r"
	"                  WHERE r.run" EQ "b.run AND r.max_attempts IS NOT NULL)",
	2, {INT4OID, INT4OID}
};

static Datum
optional_int(int32 value, char *null)
{
	*null = value > 0 ? ' ' : 'n';
	return Int32GetDatum(value);
}

/*
 * A person set run's own budgets: the calls they paused are listed no more
 * (one that a budget still stops pauses again): tool's of executions, of its
 * window, and the run's of attempts, as given.  Returns how many.
 */
int64
dl_write_run_pauses_answered(const char *run, const char *tool, bool executions, bool window,
							 bool attempts)
{
	Datum		values[5];
	char		nulls[6] = "     ";

	forget_written();			/* it writes rows this transaction may have written */
	values[0] = CStringGetTextDatum(run);
	values[1] = tool ? CStringGetTextDatum(tool) : (Datum) 0;
	nulls[1] = tool ? ' ' : 'n';
	values[2] = BoolGetDatum(executions);
	values[3] = BoolGetDatum(window);
	values[4] = BoolGetDatum(attempts);
	return (int64) dl_plan_run(&answer_run_pauses, values, nulls, SPI_OK_UPDATE);
}

/*
 * An admin changed tool's budget (0: none) from one whose window limit was
 * window_before: the pauses it no longer holds are listed no more.
 */
int64
dl_write_tool_pauses_answered(const char *tool, int32 max_executions, int32 max_in_window,
							  int32 window_before)
{
	Datum		values[4];
	char		nulls[5] = "    ";

	forget_written();
	values[0] = CStringGetTextDatum(tool);
	values[1] = optional_int(max_executions, &nulls[1]);
	values[2] = optional_int(max_in_window, &nulls[2]);
	values[3] = Int32GetDatum(window_before);
	return (int64) dl_plan_run(&answer_tool_pauses, values, nulls, SPI_OK_UPDATE);
}

/* An admin changed every run's budget of attempts (0: none) from before. */
int64
dl_write_attempts_pauses_answered(int32 max_attempts, int32 before)
{
	Datum		values[2];
	char		nulls[3] = "  ";

	forget_written();
	values[0] = optional_int(max_attempts, &nulls[0]);
	values[1] = optional_int(before, &nulls[1]);
	return (int64) dl_plan_run(&answer_attempts_pauses, values, nulls, SPI_OK_UPDATE);
}

static Statement fork_counters = {
	"INSERT INTO durable_ledger.run_budgets (run, tool, executions, recent)"
	" SELECT e.run, e.tool, pg_catalog.count(*),"
	"        COALESCE((SELECT s.recent FROM durable_ledger.run_budgets s"
	"                   WHERE s.run" EQ "$2 AND s.tool" EQ "e.tool), '{}')"
	"   FROM durable_ledger.effects e JOIN durable_ledger.tools t ON t.tool" EQ "e.tool"
	"  WHERE e.run" EQ "$1 AND (t.max_executions IS NOT NULL OR t.max_in_window IS NOT NULL)"
	"    AND e.approval IS DISTINCT FROM 'rejected'"	/* never executed */
	"  GROUP BY e.run, e.tool",
	2, {TEXTOID, TEXTOID}
};

/*
 * A forked run starts counting its budgeted tools' executions at what it
 * carries of them, one each, and its windows at the source run's: a fork is
 * no way around a budget.
 */
void
dl_write_fork_counters(const char *new_run, const char *source_run)
{
	Datum		values[2];

	forget_written();
	values[0] = CStringGetTextDatum(new_run);
	values[1] = CStringGetTextDatum(source_run);
	(void) dl_plan_run(&fork_counters, values, NULL, SPI_OK_INSERT);
}

/*
 * Every run's budget of attempts (0: none), in the policy's row (added with
 * the defaults of the other settings when there is none); returns the
 * earlier one.
 */
int32
dl_write_policy_attempts(int32 max_attempts, const char *changed_by, const char *note)
{
	RowWrite	w;
	HeapTuple	current;
	int32		before = 0;

	dl_row_begin(&w, &dl_policy_table);
	if (dl_row_lock(&w, BoolGetDatum(true), POL_SINGLETON, &current))
	{
		bool		isnull;
		Datum		d = heap_getattr(current, dl_policy_table.attnums[POL_MAX_RUN_ATTEMPTS],
									 RelationGetDescr(w.rel), &isnull);

		before = isnull ? 0 : DatumGetInt32(d);
		dl_row_start_from(&w, current);
	}
	else
	{
		dl_row_set(&w, POL_SINGLETON, BoolGetDatum(true));
		dl_row_set(&w, POL_UNREGISTERED_TOOLS,
				   CStringGetTextDatum(dl_unregistered_name(DL_UNREGISTERED_DEFAULT.may_execute)));
		dl_row_set(&w, POL_UNREGISTERED_DIVERGENCE,
				   CStringGetTextDatum(dl_divergence_name(DL_UNREGISTERED_DEFAULT.divergence)));
	}
	dl_row_set_optional(&w, POL_MAX_RUN_ATTEMPTS, Int32GetDatum(max_attempts), max_attempts == 0);
	dl_row_set(&w, POL_CHANGED_BY, CStringGetTextDatum(changed_by));
	dl_row_set(&w, POL_CHANGED_AT, dl_row_now());
	dl_row_set_optional(&w, POL_NOTE, note ? CStringGetTextDatum(note) : (Datum) 0, note == NULL);
	if (w.updating)
		dl_row_update(&w, current);
	else
		dl_row_insert(&w);
	dl_row_announce_change(&w);
	dl_row_end(&w);
	return before;
}

/* The model of run's attempt epoch, and the earlier attempts' when it changed. */
void
dl_write_attempt_model(const char *run, int64 epoch, const char *model, const char *changed_from)
{
	RowWrite	w;

	dl_row_begin(&w, &dl_models_table);
	dl_row_set(&w, MOD_RUN, CStringGetTextDatum(run));
	dl_row_set(&w, MOD_LEASE_EPOCH, Int64GetDatum(epoch));
	dl_row_set(&w, MOD_MODEL, CStringGetTextDatum(model));
	dl_row_set_optional(&w, MOD_CHANGED_FROM,
						changed_from ? CStringGetTextDatum(changed_from) : (Datum) 0,
						changed_from == NULL);
	dl_row_set(&w, MOD_RECORDED_AT, dl_row_now());
	dl_row_insert(&w);
	dl_row_end(&w);
}
