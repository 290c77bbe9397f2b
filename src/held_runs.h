/*
 * held_runs.h: the runs this session holds session leases on (held_runs.c),
 * per ledger.  lease.c keeps their leases, epochs and counters; held_runs.c
 * keeps which ledger they belong to when this session drops the ledger and
 * creates it again.  Used by lease.c only.
 */
#ifndef DURABLE_LEDGER_HELD_RUNS_H
#define DURABLE_LEDGER_HELD_RUNS_H

#include "utils/hsearch.h"

#include "lease.h"

struct HeldRun
{
	uint64		lock_key;		/* hash key; must be first */
	char	   *run;
	int64		epoch;			/* 0: lock held, no epoch (its start rolled back) */
	uint64		generation;		/* identifies the counters of this epoch */
	MemoryContext epoch_cxt;	/* holds counters; NULL when epoch is 0 */
	HTAB	   *counters;
	bool		lock_retaken_elsewhere;	/* its lock was lost, then taken again for
									 * another ledger's run of the same name */
};

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

extern MemoryContext dl_lease_cxt;
extern HTAB *dl_held_runs;		/* the runs held in the current ledger */
extern bool dl_forgot_lost_leases;	/* has it forgotten a lost lease?  (Then
									 * the audit log is asked.) */
extern OtherLedger *dl_other_ledgers;	/* runs held in other ledgers */

/* Does this session still hold held's lock, for held? */
static inline bool
lock_still_held(const HeldRun *held)
{
	return !held->lock_retaken_elsewhere && dl_run_lock_held(held->lock_key);
}

extern void dl_forget_held(HTAB *runs, HeldRun *held);
extern HeldRun *dl_find_generation(uint64 lock_key, uint64 generation);

/* The ledger they belong to */
extern void dl_follow_ledger(void);	/* at a call, before dl_held_runs is read */
extern void dl_settle_ledgers(void);	/* at PRE_COMMIT */
extern void dl_forget_gone_ledgers(void);	/* at COMMIT */
extern void dl_forget_in_other_ledgers(uint64 lock_key);
extern void dl_lose_in_other_ledgers(uint64 lock_key);
extern bool dl_held_in_other_ledgers(uint64 lock_key);
extern int	dl_locks_of_other_ledgers(void);
extern void dl_held_runs_init(void);

#endif							/* DURABLE_LEDGER_HELD_RUNS_H */
