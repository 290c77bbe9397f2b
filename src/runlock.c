/*
 * runlock.c: the locks of a run, in lock classes of the extension's own
 * (field4 of an advisory LOCKTAG; applications' advisory locks cannot
 * collide with them).  A run is named by a 64-bit hash of its text: a
 * collision only makes two runs wait for each other, since rows are keyed by
 * the full text.
 *
 *   DL_LOCK_CLASS       a session lease: a session-level ExclusiveLock;
 *                       take_lease takes a ShareLock for its own
 *                       transaction, to keep session leases out
 *   DL_CALL_LOCK_CLASS  the calls of a token lease: a transaction-level lock,
 *                       which serialises them inside their transactions
 *   DL_OPEN_LOCK_CLASS  every begin_effect holds a ShareLock for its
 *                       transaction, abandon_run an ExclusiveLock: a call
 *                       decides either before an abandonment or after it
 *   DL_TOOL_LOCK_CLASS  on a bucket of tools (a hash of the name, not of a
 *                       run): every begin_effect holds a ShareLock for its
 *                       transaction, changes of the registry an
 *                       ExclusiveLock; one more for the policy on
 *                       unregistered tools
 */
#include "postgres.h"

#include "access/twophase.h"
#include "access/xact.h"
#include "common/hashfn.h"
#include "miscadmin.h"
#include "storage/lock.h"
#include "utils/guc.h"
#include "utils/hsearch.h"
#include "utils/memutils.h"
#include "utils/timestamp.h"

#include "lease.h"

/*
 * durable_ledger.max_runs_per_transaction: every run a transaction calls
 * keeps its locks until the transaction ends -- the DL_OPEN_LOCK_CLASS lock
 * of each call, under a token lease the DL_CALL_LOCK_CLASS lock of each call
 * and renewal, take_lease's keeping session leases out, abandon_run's and
 * purge_settled's closing of the run: up to three of them -- in the shared
 * lock table, which holds max_locks_per_transaction * (max_connections +
 * max_prepared_transactions) locks for all sessions together (6,400 by
 * default), and which, once full, makes every session's next lock fail with
 * "out of shared memory".  So a transaction may lock this many runs, and the
 * next run's lock is refused first, with the ledger's own error.  Counted
 * per top-level transaction, each run once (also one that a rolled-back
 * savepoint locked, whose locks are gone: it may lock them again).
 */
static int	max_runs_per_transaction = 1000;

/*
 * The runs this transaction locked: the first few in an array (a call locks
 * one run, so no hash table is made on the hot path), the rest in a hash in
 * TopTransactionContext.
 */
#define RUNS_LOCKED_INLINE 8
static uint64 runs_locked_first[RUNS_LOCKED_INLINE];
static int	nruns_locked_first = 0;
static HTAB *runs_locked_more = NULL;

static void
runlock_xact_callback(XactEvent event, void *arg)
{
	if (event == XACT_EVENT_COMMIT || event == XACT_EVENT_ABORT ||
		event == XACT_EVENT_PARALLEL_COMMIT || event == XACT_EVENT_PARALLEL_ABORT ||
		event == XACT_EVENT_PREPARE)
	{
		nruns_locked_first = 0;
		runs_locked_more = NULL;	/* its memory goes with the transaction */
	}
}

void
dl_runlock_init(void)
{
	DefineCustomIntVariable("durable_ledger.max_runs_per_transaction",
							"The most runs one transaction may lock.",
							"Each run a transaction calls keeps up to three locks in the shared lock table until the transaction ends; a full table makes every session's next lock fail.",
							&max_runs_per_transaction,
							1000,
							1,
							1000000,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);
	RegisterXactCallback(runlock_xact_callback, NULL);
}

/* Whether this transaction locked run lock_key already. */
static bool
run_locked_already(uint64 lock_key)
{
	int			i;

	for (i = 0; i < nruns_locked_first; i++)
		if (runs_locked_first[i] == lock_key)
			return true;
	return runs_locked_more != NULL &&
		hash_search(runs_locked_more, &lock_key, HASH_FIND, NULL) != NULL;
}

/* Room for the locks of run lock_key in this transaction. */
static void
count_run_of_transaction(uint64 lock_key)
{
	long		locked;
	bool		found;

	if (run_locked_already(lock_key))
		return;
	locked = nruns_locked_first + (runs_locked_more ? hash_get_num_entries(runs_locked_more) : 0);
	if (locked >= max_runs_per_transaction)
		ereport(ERROR,
				(errcode(ERRCODE_CONFIGURATION_LIMIT_EXCEEDED),
				 errmsg("this transaction has locked %ld runs already", locked),
				 errdetail("Each run a transaction calls keeps up to three locks in the shared lock table until the transaction ends; the table holds max_locks_per_transaction × (max_connections + max_prepared_transactions) locks for all sessions, %d here.",
						   max_locks_per_xact * (MaxConnections + max_prepared_xacts)),
				 errhint("Commit more often, or raise durable_ledger.max_runs_per_transaction (and max_locks_per_transaction).")));
	if (nruns_locked_first < RUNS_LOCKED_INLINE)
	{
		runs_locked_first[nruns_locked_first++] = lock_key;
		return;
	}
	if (runs_locked_more == NULL)
	{
		HASHCTL		ctl;

		ctl.keysize = sizeof(uint64);
		ctl.entrysize = sizeof(uint64);
		ctl.hcxt = TopTransactionContext;
		runs_locked_more = hash_create("durable_ledger runs locked", 64, &ctl,
									   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
	}
	(void) hash_search(runs_locked_more, &lock_key, HASH_ENTER, &found);
}

/* The seed of the run -> lock key hash; changing it changes every lock key. */
#define RUN_LOCK_KEY_SEED UINT64CONST(0x64757261626c65)

uint64
dl_run_lock_key(const char *run)
{
	return hash_bytes_extended((const unsigned char *) run, strlen(run),
							   RUN_LOCK_KEY_SEED);
}

static void
set_lock_tag(LOCKTAG *tag, uint64 lock_key, uint16 lock_class)
{
	SET_LOCKTAG_ADVISORY(*tag, MyDatabaseId, (uint32) (lock_key >> 32),
						 (uint32) lock_key, lock_class);
}

/* Does this session hold the run's session lease lock? */
bool
dl_run_lock_held(uint64 lock_key)
{
	LOCKTAG		tag;

	set_lock_tag(&tag, lock_key, DL_LOCK_CLASS);
	return LockHeldByMe(&tag, ExclusiveLock);
}

/*
 * Takes the run's session lease lock; returns false when wait is false and
 * another session holds it.  *waited tells whether the lock had to be waited
 * for.  A wait honours lock_timeout (55P03) and deadlock detection.
 */
bool
dl_run_lock_session(uint64 lock_key, bool wait, bool *waited)
{
	LOCKTAG		tag;
	LockAcquireResult res;

	set_lock_tag(&tag, lock_key, DL_LOCK_CLASS);
	*waited = false;
	res = LockAcquireExtended(&tag, ExclusiveLock, true, true, true, NULL);
	if (res == LOCKACQUIRE_NOT_AVAIL)
	{
		if (!wait)
			return false;
		*waited = true;
		res = LockAcquireExtended(&tag, ExclusiveLock, true, false, true, NULL);
	}

	/*
	 * Already held without an entry (an error struck between taking the lock
	 * and recording it): keep one hold, never a stack of them.
	 */
	if (res == LOCKACQUIRE_ALREADY_HELD || res == LOCKACQUIRE_ALREADY_CLEAR)
		LockRelease(&tag, ExclusiveLock, true);
	return true;
}

void
dl_run_unlock_session(uint64 lock_key)
{
	LOCKTAG		tag;

	set_lock_tag(&tag, lock_key, DL_LOCK_CLASS);
	LockRelease(&tag, ExclusiveLock, true);
}

/*
 * Keeps session leases of the run out for this transaction (take_lease):
 * false at once when another session holds one.  A ShareLock: it conflicts
 * with a session lease's ExclusiveLock but is not one, so that nothing
 * (LockHeldByMe, pg_locks) takes it for a session lease.
 */
bool
dl_run_exclude_sessions(uint64 lock_key)
{
	LOCKTAG		tag;

	count_run_of_transaction(lock_key);
	set_lock_tag(&tag, lock_key, DL_LOCK_CLASS);
	return LockAcquireExtended(&tag, ShareLock, false, true, true, NULL) !=
		LOCKACQUIRE_NOT_AVAIL;
}

/*
 * Is no token call, renewal or take_lease of the run in progress in another
 * transaction?  Then calls judge_now, holding their lock while it runs (so
 * none of them can change the run meanwhile), and returns true; false at once
 * when one is in progress.  The lock is let go again at once, unless this
 * transaction held it already.
 */
bool
dl_run_when_calls_idle(uint64 lock_key, void (*judge_now) (void *), void *arg)
{
	LOCKTAG		tag;
	LockAcquireResult res;

	set_lock_tag(&tag, lock_key, DL_CALL_LOCK_CLASS);
	res = LockAcquireExtended(&tag, ExclusiveLock, false, true, true, NULL);
	if (res == LOCKACQUIRE_NOT_AVAIL)
		return false;
	judge_now(arg);
	if (res == LOCKACQUIRE_OK)
		LockRelease(&tag, ExclusiveLock, false);
	return true;
}

/*
 * Takes a lock of lock_class on the run for this transaction (released at
 * its end, rolled back or not); false when wait is false and it is taken.
 */
bool
dl_run_lock_xact(uint64 lock_key, uint16 lock_class, bool wait)
{
	LOCKTAG		tag;

	count_run_of_transaction(lock_key);
	set_lock_tag(&tag, lock_key, lock_class);
	return LockAcquireExtended(&tag, ExclusiveLock, false, !wait, true, NULL) !=
		LOCKACQUIRE_NOT_AVAIL;
}

/* Does this transaction hold the run's lock of lock_class (dl_run_lock_xact)? */
bool
dl_run_lock_xact_held(uint64 lock_key, uint16 lock_class)
{
	LOCKTAG		tag;

	set_lock_tag(&tag, lock_key, lock_class);
	return LockHeldByMe(&tag, ExclusiveLock);
}

/*
 * Gives back, before the transaction ends, a lock of lock_class that this
 * statement took with dl_run_lock_xact (not one the transaction held before
 * it): a refusal that raises an error must not keep it.  The client hears an
 * error as soon as it is raised, before the transaction's abort lets go of
 * its locks, and may act on it at once: a take_lease or acquire_run(wait =>
 * false) of the run meanwhile would be refused for a call "under way".
 */
void
dl_run_unlock_xact(uint64 lock_key, uint16 lock_class)
{
	LOCKTAG		tag;

	set_lock_tag(&tag, lock_key, lock_class);
	LockRelease(&tag, ExclusiveLock, false);
}

/*
 * A call of the run, for this transaction: abandon_run waits for it to end.
 * True when it had to wait (for an abandon_run under way).
 */
bool
dl_run_lock_open(uint64 lock_key)
{
	LOCKTAG		tag;

	count_run_of_transaction(lock_key);
	set_lock_tag(&tag, lock_key, DL_OPEN_LOCK_CLASS);
	if (LockAcquire(&tag, ShareLock, false, true) != LOCKACQUIRE_NOT_AVAIL)
		return false;
	(void) LockAcquire(&tag, ShareLock, false, false);
	return true;
}

/* dl_run_lock_open, or false at once while an abandon_run of the run is under way. */
bool
dl_run_lock_open_nowait(uint64 lock_key)
{
	LOCKTAG		tag;

	count_run_of_transaction(lock_key);
	set_lock_tag(&tag, lock_key, DL_OPEN_LOCK_CLASS);
	return LockAcquire(&tag, ShareLock, false, true) != LOCKACQUIRE_NOT_AVAIL;
}

/* abandon_run, for this transaction: waits for the run's calls in progress. */
void
dl_run_lock_closing(uint64 lock_key)
{
	LOCKTAG		tag;

	count_run_of_transaction(lock_key);
	set_lock_tag(&tag, lock_key, DL_OPEN_LOCK_CLASS);
	(void) LockAcquire(&tag, ExclusiveLock, false, false);
}

/*
 * Tools share TOOL_LOCK_BUCKETS locks, by a hash of their name: a
 * transaction calling many tools holds a bounded number of locks (the shared
 * lock table is finite), at the price of a registry change waiting for calls
 * of the other tools of its bucket.  Bucket TOOL_LOCK_BUCKETS is the policy
 * for unregistered tools.
 */
#define TOOL_LOCK_BUCKETS 1024

/* Locks a bucket for this transaction; true when it had to wait for it. */
static bool
lock_tool_bucket(uint64 bucket, bool exclusive)
{
	LOCKTAG		tag;
	LOCKMODE	mode = exclusive ? ExclusiveLock : ShareLock;

	set_lock_tag(&tag, bucket, DL_TOOL_LOCK_CLASS);
	if (LockAcquire(&tag, mode, false, true) != LOCKACQUIRE_NOT_AVAIL)
		return false;
	(void) LockAcquire(&tag, mode, false, false);
	return true;
}

/*
 * The lock of a tool's rules, for this transaction: shared by a call,
 * exclusive for a change of the registry.  True when it had to wait.
 */
bool
dl_tool_lock(const char *tool, bool exclusive)
{
	return lock_tool_bucket(hash_bytes_extended((const unsigned char *) tool, strlen(tool),
										 RUN_LOCK_KEY_SEED) % TOOL_LOCK_BUCKETS, exclusive);
}

/*
 * The lock of the policy for unregistered tools, for this transaction: shared
 * by a call of an unregistered tool that would execute, exclusive for
 * set_unregistered_tools().  True when it had to wait for a change.
 */
bool
dl_policy_lock(bool exclusive)
{
	return lock_tool_bucket(TOOL_LOCK_BUCKETS, exclusive);
}

/* ---------- whether the run is open for calls ---------- */

static void
report_abandoned(const char *run, const RunState *state)
{
	ereport(ERROR,
			(errcode(ERRCODE_DL_RUN_ABANDONED),
			 errmsg("run \"%s\" was abandoned", run),
			 errdetail("%s abandoned it at %s; nothing more is executed for it.",
					   state->abandoned_by ? state->abandoned_by : "someone",
					   timestamptz_to_str(state->abandoned_at)),
			 errhint("Stop this attempt. Effects it left in flight wait for a person in durable_ledger.unresolved.")));
}

/* Refuses to start an attempt of an abandoned run (acquire_run, take_lease). */
void
dl_refuse_if_abandoned(const char *run)
{
	RunState	state;

	if (dl_read_run_row(run, &state) && state.abandoned)
		report_abandoned(run, &state);
}

/*
 * A call of run may go on only while nobody has abandoned the run.  Its
 * transaction keeps abandon_run out until it ends (runlock.c), so that once
 * abandon_run has returned no call decides anything more; the run is then
 * read as committed now, abandon_run's own commit included.  True when the
 * call had to wait for an abandon_run under way (which may have rolled back).
 */
bool
dl_check_run_open(const char *run)
{
	bool		waited = dl_run_lock_open(dl_run_lock_key(run));
	uint64		generation;

	if (dl_run_remembered_open(run, &generation))
		return waited;
	dl_refuse_if_abandoned(run);
	dl_remember_run_open(run, generation);
	return waited;
}
