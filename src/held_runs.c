/*
 * held_runs.c: the runs this session holds a session lease on, and the
 * ledger they belong to.
 *
 * lease.c finds, adds and forgets the runs held in the ledger this session
 * works in.  DROP EXTENSION and CREATE EXTENSION in this session make a new
 * ledger, which knows nothing of the runs held in the old one.  The old
 * ledger's held runs are parked in other_ledgers, with their locks, epochs
 * and counters, because the transaction that replaced the ledger may still
 * roll back (to a savepoint, too) and bring the old ledger back.  They are
 * given up at a call once the current ledger is one this transaction did
 * not make, and at a commit for every ledger but the one that lives on and
 * the one the catalogs name.  A run of the same name held in several
 * ledgers has one lock.  docs/design.md, "A ledger dropped and created again
 * in one session", gives the decisions.
 */
#include "postgres.h"

#include "access/xact.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/rel.h"
#include "utils/relcache.h"
#include "utils/syscache.h"

#include "lease.h"
#include "held_runs.h"

/*
 * The runs this session holds in other ledgers than the current one, which a
 * rollback may bring back: DROP EXTENSION and CREATE EXTENSION in a
 * transaction or savepoint that is then rolled back (dl_follow_ledger()).
 */
typedef struct OtherLedger
{
	Oid			ledger;			/* dl_ledger_identity() of runs */
	HTAB	   *runs;
	bool		forgot_lost_leases;
	bool		gone;			/* to be given up (marked at PRE_COMMIT) */
	struct OtherLedger *next;
} OtherLedger;

static MemoryContext held_runs_cxt = NULL;

/* The runs held in the current ledger, and its dl_ledger_identity() */
static HTAB *held_runs = NULL;
static Oid	held_in_ledger = InvalidOid;

/*
 * Has this session forgotten a lost lease of the current ledger?  (Then the
 * audit log is asked.)  Parked and brought back with its ledger.
 */
static bool forgot_lost_leases = false;

static OtherLedger *other_ledgers = NULL;

static void switch_ledger(Oid ledger);
static bool table_exists(Oid relid);
static Oid	live_ledger(Oid named);
static bool held_before(uint64 lock_key, const OtherLedger *until);
static int	locks_of_other_ledgers(void);

static HTAB *
create_held_runs(void)
{
	HASHCTL		ctl;

	ctl.keysize = sizeof(uint64);
	ctl.entrysize = sizeof(HeldRun);
	ctl.hcxt = held_runs_cxt;
	return hash_create("durable_ledger held runs", 16, &ctl,
					   HASH_ELEM | HASH_BLOBS | HASH_CONTEXT);
}

static void
ensure_state(void)
{
	if (held_runs != NULL)
		return;
	held_runs_cxt = AllocSetContextCreate(TopMemoryContext, "durable_ledger held runs",
										  ALLOCSET_SMALL_SIZES);
	held_runs = create_held_runs();
}

/* ---------- the runs held in the current ledger ---------- */

/* The run with this lock key held in ledger other (NULL: the current one), or NULL. */
static HeldRun *
run_in(const OtherLedger *other, uint64 lock_key)
{
	return hash_search(other != NULL ? other->runs : held_runs, &lock_key, HASH_FIND, NULL);
}

HeldRun *
dl_find_held_run(uint64 lock_key)
{
	return run_in(NULL, lock_key);
}

/* A new entry: its lock is held, no epoch yet. */
HeldRun *
dl_add_held_run(const char *run, uint64 lock_key, uint64 generation)
{
	/* allocated first: an entry is never left without its run */
	char	   *name = MemoryContextStrdup(held_runs_cxt, run);
	HeldRun    *held;
	bool		found;

	held = hash_search(held_runs, &lock_key, HASH_ENTER, &found);
	Assert(!found);
	held->run = name;
	held->epoch = 0;
	held->generation = generation;
	held->epoch_cxt = NULL;
	held->counters = NULL;
	held->lock_retaken_elsewhere = false;
	return held;
}

static void
forget_held(HTAB *runs, HeldRun *held)
{
	uint64		lock_key = held->lock_key;

	if (held->epoch_cxt != NULL)
		MemoryContextDelete(held->epoch_cxt);
	pfree(held->run);
	hash_search(runs, &lock_key, HASH_REMOVE, NULL);
}

void
dl_forget_held_run(HeldRun *held)
{
	forget_held(held_runs, held);
}

/*
 * The lease locks this session holds, in every ledger (a run held in several
 * ledgers has one); *lost: the runs of the current ledger whose lock was lost
 * behind the ledger's back.
 */
int
dl_count_lease_locks(int *lost)
{
	HASH_SEQ_STATUS scan;
	HeldRun    *held;
	int			locks = 0;

	*lost = 0;
	hash_seq_init(&scan, held_runs);
	while ((held = hash_seq_search(&scan)) != NULL)
	{
		if (lock_still_held(held))
			locks++;
		else
			(*lost)++;
	}
	return locks + locks_of_other_ledgers();
}

/*
 * Forgets the current ledger's runs whose lock was lost; from then on the
 * audit log answers whether a run not held was lost (lease.c).
 */
void
dl_forget_lost_leases(void)
{
	HASH_SEQ_STATUS scan;
	HeldRun    *held;

	hash_seq_init(&scan, held_runs);
	while ((held = hash_seq_search(&scan)) != NULL)
	{
		if (!lock_still_held(held))
			forget_held(held_runs, held);	/* deleting the current entry is allowed */
	}
	forgot_lost_leases = true;
}

/* Has this session forgotten a lost lease of the current ledger? */
bool
dl_lost_leases_forgotten(void)
{
	return forgot_lost_leases;
}

/*
 * The held run an undo entry's change belongs to, in whichever ledger's
 * table it is now (generations are unique in the session); NULL when it was
 * released, or started another epoch, since.
 */
HeldRun *
dl_find_generation(uint64 lock_key, uint64 generation)
{
	HeldRun    *held = run_in(NULL, lock_key);
	OtherLedger *other;

	if (held != NULL && held->generation == generation)
		return held;
	for (other = other_ledgers; other != NULL; other = other->next)
	{
		held = run_in(other, lock_key);
		if (held != NULL && held->generation == generation)
			return held;
	}
	return NULL;
}

/* ---------- the ledger they belong to ---------- */

/* The current ledger's runs table had a relcache invalidation: dropped, perhaps. */
static bool ledger_may_have_changed = false;

static void
lease_relcache_changed(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == held_in_ledger)
		ledger_may_have_changed = true;
}

/*
 * May this session hold runs in a ledger that is not the one it works in?
 * Then the end of the transaction settles them.  Runs of another ledger than
 * the current one, or a current ledger that may have been replaced (without
 * a call since) while the session holds runs in it.
 */
static bool
ledgers_to_settle(void)
{
	return other_ledgers != NULL ||
		(ledger_may_have_changed && held_runs != NULL && hash_get_num_entries(held_runs) > 0);
}

/*
 * At PRE_COMMIT: runs may be held in more than one ledger, and the one this
 * transaction sees now is the one that lives on.  Made current here, where
 * the catalogs can be read and an error still aborts; the others' locks are
 * given back once the commit is sure (dl_forget_gone_ledgers, at COMMIT).
 */
void
dl_settle_ledgers(void)
{
	Oid			live;
	Oid			named;
	OtherLedger *other;

	if (!ledgers_to_settle())
		return;
	/* cleared first: an invalidation read from here on counts */
	ledger_may_have_changed = false;
	named = dl_ledger_identity_if_any();
	live = live_ledger(named);
	if (live != held_in_ledger)
		switch_ledger(live);
	/*
	 * every other ledger is gone once this commits (dropped, or a runs table
	 * renamed or detached and replaced under its name), but one the catalogs
	 * name: the next call goes back to it
	 */
	for (other = other_ledgers; other != NULL; other = other->next)
		other->gone = other->ledger != named;
}

void
dl_held_runs_init(void)
{
	CacheRegisterRelcacheCallback(lease_relcache_changed, (Datum) 0);
}

/*
 * The run with this lock key that ledger other (NULL: the current ledger)
 * holds the lock for; NULL when it holds none.
 */
static HeldRun *
holding_run(const OtherLedger *other, uint64 lock_key)
{
	HeldRun    *held = run_in(other, lock_key);

	return held != NULL && lock_still_held(held) ? held : NULL;
}

/*
 * Was the ledger made by this transaction (or one of its subtransactions)?
 * Then a rollback may still undo it and bring back the one it replaced.  The
 * relation cache knows when its runs table was created in this transaction
 * (a GRANT, ALTER TABLE or TRUNCATE of an older one does not count).
 */
static bool
ledger_made_by_this_transaction(Oid ledger)
{
	Relation	rel = RelationIdGetRelation(ledger);
	bool		made;

	if (!RelationIsValid(rel))
		return false;			/* no such table: gone, whatever rolls back */
	made = rel->rd_createSubid != InvalidSubTransactionId;
	RelationClose(rel);
	return made;
}

/* The link to ledger's entry in other_ledgers, or NULL when it has none. */
static OtherLedger **
find_other_ledger(Oid ledger)
{
	OtherLedger **link;

	for (link = &other_ledgers; *link != NULL; link = &(*link)->next)
		if ((*link)->ledger == ledger)
			return link;
	return NULL;
}

/*
 * Makes ledger the current one.  The runs held in the ledger that was
 * current are parked in other_ledgers, locks and all, until it is known
 * to be gone; the new current ledger's runs come back from there when this
 * session held runs in it before (a rollback brought it back), or start
 * empty.
 */
static void
switch_ledger(Oid ledger)
{
	OtherLedger **back = find_other_ledger(ledger);
	bool		park = hash_get_num_entries(held_runs) > 0 || forgot_lost_leases;
	OtherLedger *parked = NULL;
	HTAB	   *runs = held_runs;	/* an empty table serves the next ledger */
	bool		forgot = false;

	/* allocate first: an error must leave everything as it was */
	if (park)
		parked = MemoryContextAlloc(held_runs_cxt, sizeof(OtherLedger));
	if (park && back == NULL)
		runs = create_held_runs();

	if (back != NULL)
	{
		OtherLedger *returning = *back;

		*back = returning->next;
		runs = returning->runs;
		forgot = returning->forgot_lost_leases;
		pfree(returning);
		if (!park)
			hash_destroy(held_runs);	/* empty */
	}
	if (park)
	{
		parked->ledger = held_in_ledger;
		parked->runs = held_runs;
		parked->forgot_lost_leases = forgot_lost_leases;
		parked->gone = false;
		parked->next = other_ledgers;
		other_ledgers = parked;
	}
	held_runs = runs;
	forgot_lost_leases = forgot;
	held_in_ledger = ledger;
}

/*
 * Does the current ledger, or another ledger listed before until, hold the
 * lock of a run with this key?  (A run held in several ledgers has one lock:
 * walking other_ledgers, it belongs to the first that holds it.)
 */
static bool
held_before(uint64 lock_key, const OtherLedger *until)
{
	const OtherLedger *other;

	if (holding_run(NULL, lock_key) != NULL)
		return true;
	for (other = other_ledgers; other != until; other = other->next)
		if (holding_run(other, lock_key) != NULL)
			return true;
	return false;
}

/*
 * Does the current ledger, or a parked one that is not gone, hold the lock
 * of a run with this key?  (A run held in several ledgers has one lock.)
 */
static bool
held_by_kept_ledger(uint64 lock_key)
{
	OtherLedger *other;

	if (holding_run(NULL, lock_key) != NULL)
		return true;
	for (other = other_ledgers; other != NULL; other = other->next)
		if (!other->gone && holding_run(other, lock_key) != NULL)
			return true;
	return false;
}

/*
 * Runs held in parked ledgers that are gone belong to nothing: their locks
 * are given back (unless a ledger kept holds the same run: one lock serves
 * both; the first of the gone ones gives it back, so it is given back once)
 * and they are forgotten.  Allocates nothing and cannot fail: it runs at
 * COMMIT.
 */
void
dl_forget_gone_ledgers(void)
{
	OtherLedger **link = &other_ledgers;

	while (*link != NULL)
	{
		OtherLedger *other = *link;
		HASH_SEQ_STATUS scan;
		HeldRun    *held;

		if (!other->gone)
		{
			link = &other->next;
			continue;
		}
		hash_seq_init(&scan, other->runs);
		while ((held = hash_seq_search(&scan)) != NULL)
		{
			if (lock_still_held(held) && !held_by_kept_ledger(held->lock_key))
				dl_run_unlock_session(held->lock_key);
			forget_held(other->runs, held);	/* deleting the current entry is allowed */
		}
		*link = other->next;
		hash_destroy(other->runs);
		pfree(other);
	}
}

/* Every parked ledger is gone: the current one is not made by this transaction. */
static void
forget_other_ledgers(void)
{
	OtherLedger *other;

	for (other = other_ledgers; other != NULL; other = other->next)
		other->gone = true;
	dl_forget_gone_ledgers();
}

/*
 * Follows the ledger this session works in, at every lease call: a new one
 * (this session dropped the ledger and created it again) starts with no
 * runs, the old one's are parked.  They are given up once the current
 * ledger is one this transaction did not make: every other is then gone.
 */
void
dl_follow_ledger(void)
{
	Oid			ledger;

	ensure_state();
	ledger = dl_ledger_identity();
	if (ledger != held_in_ledger)
		switch_ledger(ledger);
	if (other_ledgers != NULL && !ledger_made_by_this_transaction(ledger))
		forget_other_ledgers();
}

/* Does this transaction see a table with OID relid? */
static bool
table_exists(Oid relid)
{
	return OidIsValid(relid) && SearchSysCacheExists1(RELOID, ObjectIdGetDatum(relid));
}

/*
 * The ledger to keep as the current one when this transaction commits: the
 * current one while its runs table exists (whatever its name or schema: a
 * rename, even one that puts another table in its place for a while, is no
 * replacement), else the first parked one whose table exists (a rollback
 * brought it back), else named, the one the catalogs name (InvalidOid: none).
 */
static Oid
live_ledger(Oid named)
{
	OtherLedger *other;

	if (table_exists(held_in_ledger))
		return held_in_ledger;
	for (other = other_ledgers; other != NULL; other = other->next)
		if (table_exists(other->ledger))
			return other->ledger;
	return named;
}

/*
 * release_run gives back run's lock: the same run held in another ledger
 * under that lock is not held any more either (one that had lost it stays
 * lost).
 */
void
dl_forget_in_other_ledgers(uint64 lock_key)
{
	OtherLedger *other;
	HeldRun    *held;

	for (other = other_ledgers; other != NULL; other = other->next)
		if ((held = holding_run(other, lock_key)) != NULL)
			forget_held(other->runs, held);
}

/*
 * The current ledger took a run's lock that this session did not hold: the
 * same run held in another ledger had lost it, and stays lost, or a rollback
 * to that ledger would find the new lock and take it for its own lease.
 */
void
dl_lose_in_other_ledgers(uint64 lock_key)
{
	OtherLedger *other;
	HeldRun    *held;

	for (other = other_ledgers; other != NULL; other = other->next)
		if ((held = run_in(other, lock_key)) != NULL)
			held->lock_retaken_elsewhere = true;
}

/* Does a run of another ledger hold this lock? */
bool
dl_held_in_other_ledgers(uint64 lock_key)
{
	OtherLedger *other;

	for (other = other_ledgers; other != NULL; other = other->next)
		if (holding_run(other, lock_key) != NULL)
			return true;
	return false;
}

/*
 * The locks this session holds for runs of other ledgers only: each is an
 * entry in the shared lock table too.  A run held in several ledgers has one.
 */
static int
locks_of_other_ledgers(void)
{
	OtherLedger *other;
	HASH_SEQ_STATUS scan;
	HeldRun    *held;
	int			locks = 0;

	for (other = other_ledgers; other != NULL; other = other->next)
	{
		hash_seq_init(&scan, other->runs);
		while ((held = hash_seq_search(&scan)) != NULL)
			if (lock_still_held(held) && !held_before(held->lock_key, other))
				locks++;
	}
	return locks;
}
