/*
 * lease.c: the per-run lease, its epochs and its occurrence counters.
 *
 * A lease is a session-level advisory lock (through the lock manager, in the
 * extension's own lock class DL_LOCK_CLASS) on a 64-bit hash of the run.  This
 * backend keeps a table of the runs it holds, so that the lock is taken once
 * per run however many calls follow, and so that every call can check with
 * LockHeldByMe() that the lock is really still held: DISCARD ALL and
 * pg_advisory_unlock_all() drop it behind our back.
 *
 * Each acquisition starts a lease epoch (a row update in durable_ledger.runs);
 * within an epoch, identical calls (same tool, same canonical args) are
 * numbered 1, 2, ... by an in-memory counter.  Counters and epochs must roll
 * back with the (sub)transaction that advanced them, or a retried run's keys
 * would drift and a replay would pay twice.  So every change is pushed on an
 * undo log, which is unwound on (sub)transaction abort and forgotten on
 * commit.  The lock itself is not transactional, like any session lock.
 *
 * Runs are keyed by their lock key; the run text is kept and compared, so a
 * 64-bit hash collision is reported instead of silently sharing a lease.
 * The held runs (held_runs.h) belong to a ledger; held_runs.c follows
 * the ledger when this session drops it and creates it again.
 */
#include "postgres.h"

#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/proc.h"
#include "utils/timestamp.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"

#include "lease.h"
#include "held_runs.h"

/* What identical calls are counted by: tool and canonical args. */
typedef struct CallKey
{
	uint32		hash;
	int			len;
	char	   *bytes;			/* tool, '\0', canonical args */
} CallKey;

struct CallCounter
{
	CallKey		key;			/* must be first */
	int32		count;
};

typedef enum UndoKind
{
	UNDO_COUNT,					/* a counter was set */
	UNDO_EPOCH					/* a new epoch replaced the previous one */
} UndoKind;

typedef struct UndoEntry
{
	UndoKind	kind;
	SubTransactionId subid;
	uint64		lock_key;
	uint64		generation;		/* of the epoch the change belongs to */
	CallCounter *counter;		/* UNDO_COUNT: the counter, and its value before */
	int32		old_count;
	int64		old_epoch;		/* UNDO_EPOCH: what to restore */
	uint64		old_generation;
	MemoryContext old_cxt;
	HTAB	   *old_counters;
} UndoEntry;

/* durable_ledger.max_leases_per_session */
static int	max_leases_per_session = 64;

/* durable_ledger.lease_wait_timeout: ms, 0 = no limit (used when lock_timeout is 0) */
static int	lease_wait_timeout = 5000;

/* the undo log and the epochs' counters live here */
static MemoryContext lease_cxt = NULL;
static uint64 next_generation = 1;

/* Entries the undo log keeps room for between transactions. */
#define UNDO_KEEP 1024

static UndoEntry *undo_log = NULL;
static int	undo_len = 0;
static int	undo_cap = 0;

/* ---------- counters ---------- */

static uint32
call_key_hash(const void *key, Size keysize)
{
	return ((const CallKey *) key)->hash;
}

static int
call_key_match(const void *a, const void *b, Size keysize)
{
	const CallKey *ka = a;
	const CallKey *kb = b;

	if (ka->hash != kb->hash || ka->len != kb->len)
		return 1;
	return memcmp(ka->bytes, kb->bytes, ka->len);
}

static HTAB *
create_counters(MemoryContext cxt)
{
	HASHCTL		ctl;

	ctl.keysize = sizeof(CallKey);
	ctl.entrysize = sizeof(CallCounter);
	ctl.hash = call_key_hash;
	ctl.match = call_key_match;
	ctl.hcxt = cxt;
	return hash_create("durable_ledger occurrence counters", 32, &ctl,
					   HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
}

/* ---------- undo log ---------- */

static UndoEntry *
push_undo(UndoKind kind, const HeldRun *held)
{
	UndoEntry  *e;

	if (undo_len == undo_cap)
	{
		int			new_cap = undo_cap == 0 ? 64 : undo_cap * 2;

		if (undo_log == NULL)
			undo_log = MemoryContextAlloc(lease_cxt, new_cap * sizeof(UndoEntry));
		else
			undo_log = repalloc(undo_log, new_cap * sizeof(UndoEntry));
		undo_cap = new_cap;
	}
	e = &undo_log[undo_len++];
	memset(e, 0, sizeof(UndoEntry));
	e->kind = kind;
	e->subid = GetCurrentSubTransactionId();
	e->lock_key = held->lock_key;
	e->generation = held->generation;
	return e;
}

static void
undo_one(UndoEntry *e)
{
	HeldRun    *held = dl_find_generation(e->lock_key, e->generation);
	bool		current = held != NULL;

	switch (e->kind)
	{
		case UNDO_COUNT:
			if (current)
				e->counter->count = e->old_count;
			break;
		case UNDO_EPOCH:
			if (current)
			{
				if (held->epoch_cxt != NULL)
					MemoryContextDelete(held->epoch_cxt);
				held->epoch = e->old_epoch;
				held->generation = e->old_generation;
				held->epoch_cxt = e->old_cxt;
				held->counters = e->old_counters;
			}
			else if (e->old_cxt != NULL)
				MemoryContextDelete(e->old_cxt);	/* the run was released since */
			break;
	}
}

/* Unwinds every change made at or below subid (all of them for top level). */
static void
undo_to(SubTransactionId subid)
{
	while (undo_len > 0 && undo_log[undo_len - 1].subid >= subid)
		undo_one(&undo_log[--undo_len]);
}

static void
lease_xact_end(bool commit)
{
	int			i;

	if (undo_len == 0)
		return;
	if (commit)
	{
		/* the replaced epochs are gone for good */
		for (i = 0; i < undo_len; i++)
			if (undo_log[i].kind == UNDO_EPOCH && undo_log[i].old_cxt != NULL)
				MemoryContextDelete(undo_log[i].old_cxt);
		undo_len = 0;
	}
	else
		undo_to(InvalidSubTransactionId);

	/* one huge transaction must not keep its undo log for the session's life */
	if (undo_cap > UNDO_KEEP)
	{
		pfree(undo_log);
		undo_log = NULL;
		undo_cap = 0;
	}
}

static void
lease_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_PREPARE:
			if (undo_len > 0)
				dl_refuse_prepare();
			break;
		case XACT_EVENT_PRE_COMMIT:
			dl_settle_ledgers();	/* which ledger the held runs belong to */
			break;
		case XACT_EVENT_COMMIT:
			lease_xact_end(true);
			dl_forget_gone_ledgers();	/* those PRE_COMMIT marked */
			break;
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:

			/*
			 * Nothing is settled at a PREPARE: which ledger lives is known
			 * at COMMIT PREPARED or ROLLBACK PREPARED, and that sends the
			 * invalidations that make this session's next commit settle.
			 */
			lease_xact_end(true);
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			lease_xact_end(false);
			break;
		default:
			break;
	}
}

static void
lease_subxact_callback(SubXactEvent event, SubTransactionId subid,
					   SubTransactionId parent, void *arg)
{
	int			i;

	if (event == SUBXACT_EVENT_ABORT_SUB)
		undo_to(subid);
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		for (i = undo_len - 1; i >= 0 && undo_log[i].subid >= subid; i--)
			undo_log[i].subid = parent;
	}
}

void
dl_lease_init(void)
{
	DefineCustomIntVariable("durable_ledger.max_leases_per_session",
							"The most run leases one session may hold at once.",
							"Each lease is a lock in the shared lock table; a full table makes new connections fail.",
							&max_leases_per_session,
							64,
							1,
							10000,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);
	DefineCustomIntVariable("durable_ledger.lease_wait_timeout",
							"The longest wait for a run's lease, when lock_timeout is not set.",
							"A wait that lasts longer fails with SQLSTATE 55P03 naming the run and its holder, and writes nothing; 0 waits without limit.",
							&lease_wait_timeout,
							5000,
							0,
							INT_MAX,
							PGC_USERSET,
							GUC_UNIT_MS,
							NULL, NULL, NULL);
	RegisterXactCallback(lease_xact_callback, NULL);
	RegisterSubXactCallback(lease_subxact_callback, NULL);
	dl_held_runs_init();
}

/* ---------- epochs ---------- */

/* Makes epoch the held run's current epoch, with fresh counters. */
static void
start_epoch(HeldRun *held, int64 epoch)
{
	MemoryContext cxt;
	HTAB	   *counters;
	UndoEntry  *e;

	/*
	 * Allocate first, under the caller's context: an error before the epoch
	 * is in place must leave the old one intact and leak nothing.
	 */
	cxt = AllocSetContextCreate(CurrentMemoryContext, "durable_ledger lease epoch",
								ALLOCSET_DEFAULT_SIZES);
	counters = create_counters(cxt);

	e = push_undo(UNDO_EPOCH, held);
	MemoryContextSetParent(cxt, lease_cxt);
	e->old_epoch = held->epoch;
	e->old_generation = held->generation;
	e->old_cxt = held->epoch_cxt;
	e->old_counters = held->counters;

	held->epoch_cxt = cxt;
	held->counters = counters;
	held->generation = next_generation++;
	held->epoch = epoch;
	/* the undo entry belongs to the new generation: undoing it restores the old */
	e->generation = held->generation;
}

/*
 * The run this session holds under lock_key in the ledger it works in, or
 * NULL.  Every entry point that names a run starts here.
 */
static HeldRun *
find_held(const char *run, uint64 lock_key)
{
	HeldRun    *held;

	if (lease_cxt == NULL)
		lease_cxt = AllocSetContextCreate(TopMemoryContext, "durable_ledger leases",
										  ALLOCSET_SMALL_SIZES);
	dl_follow_ledger();
	held = dl_find_held_run(lock_key);
	if (held != NULL && strcmp(held->run, run) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_IN_USE),
				 errmsg("runs \"%s\" and \"%s\" share a lease lock key", held->run, run),
				 errdetail("Both hash to lock key %llu.", (unsigned long long) lock_key),
				 errhint("Release one run before using the other.")));
	return held;
}

static HeldRun *
add_held(const char *run, uint64 lock_key)
{
	return dl_add_held_run(run, lock_key, next_generation++);
}

/*
 * Room for one more lease.  Only runs whose lock is held count: every one is
 * an entry in the shared lock table.  Runs whose lock was lost behind our
 * back are remembered, so that their next call fails at once.  Past
 * DL_MAX_LOST_LEASES of them (a pooled connection reset many times) they are
 * forgotten from memory, but never as evidence: from then on, a run this
 * session does not hold is first looked up in the audit log, which records
 * every epoch the session took and released (dl_lease_for_call).
 */
#define DL_MAX_LOST_LEASES 1024

static void
check_lease_capacity(const char *run, uint64 lock_key)
{
	int			lost;
	int			held_locks = dl_count_lease_locks(&lost);

	if (lost > DL_MAX_LOST_LEASES)
		dl_forget_lost_leases();

	/* a run another ledger holds already takes no new lock */
	if (held_locks >= max_leases_per_session && !dl_run_lock_held(lock_key))
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("this session already holds %d leases, cannot take run \"%s\"",
						max_leases_per_session, run),
				 errdetail("Every lease is a lock in the shared lock table, which is shared by all sessions."),
				 errhint("Release runs that are over with durable_ledger.release_run(), or raise durable_ledger.max_leases_per_session.")));
}

static void
report_lost_lease(const char *run)
{
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("the lease on run \"%s\" was lost", run),
			 errdetail("This session's lock on the run was released behind the ledger's back (DISCARD ALL, pg_advisory_unlock_all() or a pooler resetting the connection)."),
			 errhint("Start a new attempt with durable_ledger.acquire_run().")));
}

/* Records the next epoch of run, held by this session, with its audit row. */
static int64
record_epoch_start(const char *run, uint64 lock_key, bool waited)
{
	int64		epoch = dl_write_next_epoch(run, lock_key, false);
	DetailBuilder detail;

	dl_detail_init(&detail);
	dl_detail_bool(&detail, "waited", waited);
	dl_write_audit(run, NULL, AUDIT_LEASE_ACQUIRED, dl_detail_finish(&detail), epoch, 0);
	return epoch;
}

/*
 * Records the end of this session's epoch of run (0: none was started);
 * lock_lost says that its lock had been released behind the ledger's back.
 */
static void
record_epoch_end(const char *run, int64 epoch, bool lock_lost)
{
	Jsonb	   *detail = NULL;

	if (epoch > 0)
		dl_write_epoch_end(run, epoch, false);
	if (lock_lost)
	{
		DetailBuilder d;

		dl_detail_init(&d);
		dl_detail_bool(&d, "lock_lost", true);
		detail = dl_detail_finish(&d);
	}
	dl_write_audit(run, NULL, AUDIT_LEASE_RELEASED, detail, epoch, 0);
}

static void
report_token_lease_holds(const char *run, TimestampTz until)
{
	ereport(ERROR,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("run \"%s\" is held by a token lease", run),
			 errdetail("It is held until %s (the server's clock); a session lease and a token lease never hold one run at once.",
					   timestamptz_to_str(until)),
			 errhint("Wait until it is released or expires, or take the run with durable_ledger.take_lease().")));
}

/*
 * A wait for run's lease timed out: 55P03, naming the run and who held it
 * when the wait began (holder: from the leases view, or found false).
 */
static void
report_lease_wait_timeout(const char *run, const LeaseHolder *holder, int timeout_ms,
						  bool by_lock_timeout)
{
	const char *setting = by_lock_timeout ? "lock_timeout" : "durable_ledger.lease_wait_timeout";
	const char *application = holder->application ? holder->application : "";

	if (!holder->found)
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("gave up waiting for the lease on run \"%s\" after %d ms", run, timeout_ms),
				 errdetail("Another session held the run (%s); nothing was written.", setting),
				 errhint("Retry later (an auditor sees who holds a run in durable_ledger.leases). SET durable_ledger.lease_wait_timeout to wait longer (0: no limit).")));
	if (holder->token)
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("gave up waiting for the lease on run \"%s\" after %d ms", run, timeout_ms),
				 errdetail("A token lease held it: holder \"%s\", application \"%s\", since %s (%s); nothing was written.",
						   holder->holder ? holder->holder : "", application,
						   timestamptz_to_str(holder->since), setting),
				 errhint("Retry later, or take the run over with durable_ledger.take_lease() once its lease has expired. SET durable_ledger.lease_wait_timeout to wait longer (0: no limit).")));
	if (holder->since_known)
		ereport(ERROR,
				(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
				 errmsg("gave up waiting for the lease on run \"%s\" after %d ms", run, timeout_ms),
				 errdetail("Backend %d held it: application \"%s\", since %s (%s); nothing was written.",
						   holder->pid, application, timestamptz_to_str(holder->since), setting),
				 errhint("Retry later, or end that session's attempt (release_run, or durable_ledger.break_lease). SET durable_ledger.lease_wait_timeout to wait longer (0: no limit).")));
	ereport(ERROR,
			(errcode(ERRCODE_LOCK_NOT_AVAILABLE),
			 errmsg("gave up waiting for the lease on run \"%s\" after %d ms", run, timeout_ms),
			 errdetail("Backend %d held it: application \"%s\" (%s); nothing was written.",
					   holder->pid, application, setting),
			 errhint("Retry later, or end that session's attempt (release_run, or durable_ledger.break_lease). SET durable_ledger.lease_wait_timeout to wait longer (0: no limit).")));
}

/*
 * Waits for a lock on run by wait(lock_key) -- the caller tried it without
 * waiting first -- for at most lock_timeout or, when that is 0,
 * durable_ledger.lease_wait_timeout (set as lock_timeout for the wait only).
 * Who holds the run is read before the wait, so that a wait that times out
 * names them; the error replaces lock_timeout's own, which names nothing (the
 * lock manager has left the wait queue by then, and the transaction ends).
 */
static void
bounded_lease_wait(const char *run, uint64 lock_key, void (*wait) (uint64 lock_key))
{
	MemoryContext cxt = CurrentMemoryContext;
	LeaseHolder holder;
	bool		by_lock_timeout = LockTimeout > 0;
	int			timeout_ms = by_lock_timeout ? LockTimeout : lease_wait_timeout;
	volatile int nest_level = -1;

	dl_read_lease_holder(run, &holder);
	if (!by_lock_timeout && lease_wait_timeout > 0)
	{
		char		value[16];

		snprintf(value, sizeof(value), "%d", lease_wait_timeout);
		nest_level = NewGUCNestLevel();
		(void) set_config_option("lock_timeout", value, PGC_USERSET, PGC_S_SESSION,
								 GUC_ACTION_SAVE, true, 0, false);
	}
	PG_TRY();
	{
		wait(lock_key);
	}
	PG_CATCH();
	{
		ErrorData  *error;

		MemoryContextSwitchTo(cxt);
		error = CopyErrorData();
		if (error->sqlerrcode != ERRCODE_LOCK_NOT_AVAILABLE || timeout_ms == 0)
			PG_RE_THROW();
		FlushErrorState();
		report_lease_wait_timeout(run, &holder, timeout_ms, by_lock_timeout);
	}
	PG_END_TRY();
	if (nest_level >= 0)
		AtEOXact_GUC(true, nest_level);
}

static void
wait_for_token_calls(uint64 lock_key)
{
	(void) dl_run_lock_xact(lock_key, DL_CALL_LOCK_CLASS, true);
}

static void
wait_for_session_lock(uint64 lock_key)
{
	bool		waited;

	(void) dl_run_lock_session(lock_key, true, &waited);
}

/*
 * Waits for an abandon_run or a verdict under way on the run (the lock they
 * close it with), with the session lock just taken: an error while waiting
 * (lock_timeout, a deadlock) gives that lock back, or the session would keep
 * the run from every other worker without knowing it holds it.
 */
static void
wait_until_open(uint64 lock_key, bool had_lock)
{
	PG_TRY();
	{
		(void) dl_run_lock_open(lock_key);
	}
	PG_CATCH();
	{
		if (!had_lock)
			dl_run_unlock_session(lock_key);
		PG_RE_THROW();
	}
	PG_END_TRY();
}

/*
 * Takes run's session lease lock, unless a token lease holds the run: one run
 * is held by at most one live lease of either kind.  The run's token calls,
 * renewals and take_lease in progress are waited for first (their lock, for
 * this transaction), then the session lock, then the run is looked at.  With
 * wait false, false at once when any of them is busy or a token lease holds
 * the run; with wait true, a token lease holding the run is 55P03.  Nothing
 * stays locked on either (an error while waiting ends the transaction, and
 * with it the transaction's lock; the session lock is given back when the
 * wait for an abandon_run or a verdict under way fails).
 *
 * The session may hold the lock already, for a run of the same name in
 * another ledger (dl_follow_ledger): that lock is kept, never given back here.
 * Otherwise such a run had lost it, and it stays lost (dl_lose_in_other_ledgers).
 */
static bool
take_session_lock(const char *run, uint64 lock_key, bool wait, bool *waited)
{
	RunState	state;
	bool		calls_locked_before = dl_run_lock_xact_held(lock_key, DL_CALL_LOCK_CLASS);
	bool		had_lock = dl_held_in_other_ledgers(lock_key);

	if (!dl_run_lock_xact(lock_key, DL_CALL_LOCK_CLASS, false))
	{
		if (!wait)
			return false;
		bounded_lease_wait(run, lock_key, wait_for_token_calls);
	}
	if (!dl_run_lock_session(lock_key, false, waited))
	{
		if (!wait)
			return false;
		bounded_lease_wait(run, lock_key, wait_for_session_lock);
		*waited = true;
	}
	/* read once abandon_run cannot be under way: it may have ended while we waited */
	if (wait)
		wait_until_open(lock_key, had_lock);
	else if (!dl_run_lock_open_nowait(lock_key))
	{
		if (!had_lock)
			dl_run_unlock_session(lock_key);
		return false;			/* an abandon_run is under way: not now */
	}
	if (dl_read_run_state(run, &state) && (state.abandoned || (state.token && state.token_live)))
	{
		if (!had_lock)
			dl_run_unlock_session(lock_key);
		/*
		 * and the calls' lock: the error below reaches the client before the
		 * abort releases the transaction's locks, and a take_lease sent at
		 * once (the run is free once its token lease is released) would
		 * find it and be told that the run is busy
		 */
		if (!calls_locked_before)
			dl_run_unlock_xact(lock_key, DL_CALL_LOCK_CLASS);
		if (state.abandoned)
			dl_refuse_if_abandoned(run);
		if (!wait)
			return false;
		report_token_lease_holds(run, state.expires_at);
	}
	if (!had_lock)
		dl_lose_in_other_ledgers(lock_key);
	return true;
}

/*
 * The lease a begin_effect relies on: the session's current epoch of run.
 * Takes the lease (waiting) and starts an epoch when the session does not
 * hold the run; fails when the lock was lost behind our back, since silently
 * starting a new epoch mid-attempt would renumber the attempt's calls.
 */
HeldRun *
dl_lease_for_call(const char *run)
{
	uint64		lock_key = dl_run_lock_key(run);
	HeldRun    *held = find_held(run, lock_key);
	bool		waited = false;

	if (held != NULL)
	{
		if (!lock_still_held(held))
			report_lost_lease(run);
	}
	else
	{
		int64		lost_epoch;

		if (dl_lost_leases_forgotten() && dl_read_lease_unreleased_by_me(run, &lost_epoch))
			report_lost_lease(run);
		dl_refuse_if_abandoned(run);
		check_lease_capacity(run, lock_key);
		(void) take_session_lock(run, lock_key, true, &waited);
		held = add_held(run, lock_key);
	}
	if (held->epoch == 0)
	{
		int64		epoch = record_epoch_start(run, lock_key, waited);

		start_epoch(held, epoch);
	}
	return held;
}

int64
dl_lease_epoch(const HeldRun *held)
{
	return held->epoch;
}

/*
 * A counter of the held run's current epoch: of identical calls (tool,
 * canonical args), or of what else the epoch counts about a tool (what:
 * bytes that no canonical args can be, since they begin with a zero byte).
 * *count is its value; nothing changes until dl_lease_set_count().
 */
CallCounter *
dl_lease_call_counter(HeldRun *held, const char *tool, const char *what,
					  int what_len, int32 *count)
{
	size_t		tool_len = strlen(tool);
	char	   *bytes;
	CallKey		probe;
	CallCounter *counter;
	bool		found;

	probe.len = tool_len + 1 + what_len;
	bytes = palloc(probe.len);
	memcpy(bytes, tool, tool_len + 1);
	memcpy(bytes + tool_len + 1, what, what_len);
	probe.bytes = bytes;
	probe.hash = hash_bytes((const unsigned char *) bytes, probe.len);

	counter = hash_search(held->counters, &probe, HASH_FIND, NULL);
	if (counter == NULL)
	{
		/* the table keeps its own copy of the key, in the epoch's memory */
		probe.bytes = MemoryContextAlloc(held->epoch_cxt, probe.len);
		memcpy(probe.bytes, bytes, probe.len);
		counter = hash_search(held->counters, &probe, HASH_ENTER, &found);
		counter->count = 0;
	}
	pfree(bytes);
	*count = counter->count;
	return counter;
}

/* Sets a counter of the epoch (undone on rollback). */
void
dl_lease_set_count(HeldRun *held, CallCounter *counter, int32 count)
{
	UndoEntry  *e = push_undo(UNDO_COUNT, held);

	e->counter = counter;
	e->old_count = counter->count;
	counter->count = count;
}

/* acquire_run: take the lease if needed, and start a new epoch in any case. */
bool
dl_lease_acquire(const char *run, bool wait)
{
	uint64		lock_key = dl_run_lock_key(run);
	HeldRun    *held = find_held(run, lock_key);
	bool		waited = false;
	int64		epoch;

	dl_refuse_if_abandoned(run);
	if (held == NULL)
	{
		check_lease_capacity(run, lock_key);
		if (!take_session_lock(run, lock_key, wait, &waited))
			return false;
		held = add_held(run, lock_key);
	}
	else if (!lock_still_held(held))
	{
		/*
		 * Lost behind our back: this is the new attempt the error asked for.
		 * It starts from a fresh entry, so that rolling it back leaves no
		 * epoch (the next call starts one) rather than the lost attempt's.
		 */
		check_lease_capacity(run, lock_key);
		if (!take_session_lock(run, lock_key, wait, &waited))
			return false;
		/* the capacity check may have forgotten it with every lost lease */
		held = dl_find_held_run(lock_key);
		if (held != NULL)
			dl_forget_held_run(held);
		held = add_held(run, lock_key);
	}
	else
		(void) dl_check_run_open(run);	/* held already: an abandonment may have ended meanwhile */
	epoch = record_epoch_start(run, lock_key, waited);
	start_epoch(held, epoch);
	return true;
}

/*
 * release_run: drops the lock and forgets the run.  Returns false when this
 * session did not hold it, also when the lock had been lost: the lost epoch
 * is then recorded as ended (lock_lost), so that the run's next begin_effect
 * in this session takes a new lease instead of failing.  Not transactional:
 * like any session lock, it stays released if the transaction rolls back.
 */
bool
dl_lease_release(const char *run)
{
	uint64		lock_key = dl_run_lock_key(run);
	HeldRun    *held = find_held(run, lock_key);
	int64		epoch;

	if (held == NULL)
	{
		if (dl_lost_leases_forgotten() && dl_read_lease_unreleased_by_me(run, &epoch))
			record_epoch_end(run, epoch, true);
		return false;
	}
	epoch = held->epoch;
	if (!lock_still_held(held))
	{
		dl_forget_held_run(held);
		record_epoch_end(run, epoch, true);
		return false;
	}

	dl_forget_in_other_ledgers(lock_key);
	dl_run_unlock_session(lock_key);
	dl_forget_held_run(held);
	record_epoch_end(run, epoch, false);
	return true;
}

/*
 * The epoch of this session's lease of run while its lock is held; 0 when
 * the session holds none (or holds the lock without an epoch, after a
 * rolled-back acquisition).
 */
int64
dl_lease_held_epoch(const char *run)
{
	uint64		lock_key = dl_run_lock_key(run);
	HeldRun    *held = find_held(run, lock_key);

	return held != NULL && lock_still_held(held) ? held->epoch : 0;
}

/* Is (run, epoch) this session's current, still held lease? */
bool
dl_lease_is_mine(const char *run, int64 epoch)
{
	uint64		lock_key = dl_run_lock_key(run);
	HeldRun    *held = find_held(run, lock_key);

	return held != NULL && held->epoch == epoch && lock_still_held(held);
}
