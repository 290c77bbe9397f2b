/*
 * lease.h: the lease layer: a run's lease (a session advisory lock in the
 * extension's lock class), its epochs, the occurrence counters of an epoch
 * and their undo on rollback, whether a lease is live, and the lease's
 * setting (durable_ledger.max_leases_per_session).
 *
 * Uses store.h and common.h; the entry points use it.  Functions that read
 * or write the ledger need an open SPI connection.
 */
#ifndef DURABLE_LEDGER_LEASE_H
#define DURABLE_LEDGER_LEASE_H

#include "store.h"

typedef struct HeldRun HeldRun;
typedef struct CallCounter CallCounter;

extern HeldRun *dl_lease_for_call(const char *run);
extern int64 dl_lease_epoch(const HeldRun *held);
extern CallCounter *dl_lease_call_counter(HeldRun *held, const char *tool,
										  const char *canon, int canon_len,
										  int32 *next);
extern void dl_lease_count_call(HeldRun *held, CallCounter *counter);
extern bool dl_lease_acquire(const char *run, bool wait);
extern bool dl_lease_release(const char *run);
extern bool dl_lease_is_live(const char *run, int64 epoch);
extern bool dl_lease_is_mine(const char *run, int64 epoch);
extern uint64 dl_run_lock_key(const char *run);
extern void dl_lease_init(void);

#endif							/* DURABLE_LEDGER_LEASE_H */
