/*
 * held_runs.h: the runs this session holds session leases on, in the ledger
 * it works in (held_runs.c, which also follows that ledger when this session
 * drops it and creates it again).  lease.c keeps their leases, epochs and
 * counters; nothing else uses this header.
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
	MemoryContext epoch_cxt;	/* holds counters; NULL when epoch is 0 (made
								 * by lease.c, deleted with the entry) */
	HTAB	   *counters;
	bool		lock_retaken_elsewhere;	/* its lock was lost, then taken again for
									 * another ledger's run of the same name */
};

/* Does this session still hold held's lock, for held? */
static inline bool
lock_still_held(const HeldRun *held)
{
	return !held->lock_retaken_elsewhere && dl_run_lock_held(held->lock_key);
}

/* The ledger they belong to */
extern void dl_follow_ledger(void);	/* at a call, before the functions below */
extern void dl_settle_ledgers(void);	/* at PRE_COMMIT */
extern void dl_forget_gone_ledgers(void);	/* at COMMIT */
extern void dl_held_runs_init(void);

/* The runs held in the current ledger (after dl_follow_ledger in the call) */
extern HeldRun *dl_find_held_run(uint64 lock_key);
extern HeldRun *dl_add_held_run(const char *run, uint64 lock_key, uint64 generation);
extern void dl_forget_held_run(HeldRun *held);
extern int	dl_count_lease_locks(int *lost);
extern void dl_forget_lost_leases(void);
extern bool dl_lost_leases_forgotten(void);

/* A held run by its epoch's generation, in any ledger (for the undo log) */
extern HeldRun *dl_find_generation(uint64 lock_key, uint64 generation);

/* The same run (lock key) held in other ledgers */
extern void dl_forget_in_other_ledgers(uint64 lock_key);
extern void dl_lose_in_other_ledgers(uint64 lock_key);
extern bool dl_held_in_other_ledgers(uint64 lock_key);

#endif							/* DURABLE_LEDGER_HELD_RUNS_H */
