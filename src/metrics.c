/*
 * metrics.c: how many events of each kind the ledger logged in each database
 * since the server started (its shared memory was last initialised: a
 * crashed backend makes the server do that too), for monitoring
 * (durable_ledger.metrics_events, metrics_funcs.c).
 *
 * The counts live in shared memory, which a library can ask for only while
 * the server starts: they are kept when durable_ledger is in
 * shared_preload_libraries, and not kept otherwise (the view then shows
 * NULL).  The audit writer counts each event of a transaction (audit_chain.c
 * keeps them with the chain's head, rolled back with it) and adds them here
 * at commit, so a rolled-back transaction counts nothing and a call costs a
 * few atomic additions per transaction.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "port/atomics.h"
#include "storage/ipc.h"
#include "storage/lwlock.h"
#include "storage/shmem.h"

#include "store.h"

/*
 * One slot per database (the audit log, and so what is counted, is a
 * database's): a slot is claimed by the first commit in its database that
 * logged an event; past MAX_DATABASES databases, events are not counted.
 */
#define MAX_DATABASES 64

typedef struct DatabaseMetrics
{
	pg_atomic_uint32 database;	/* its OID; 0: free */
	pg_atomic_uint64 events[DL_NEVENTS];
} DatabaseMetrics;

typedef struct LedgerMetrics
{
	DatabaseMetrics databases[MAX_DATABASES];
} LedgerMetrics;

static LedgerMetrics *metrics = NULL;
static shmem_request_hook_type prev_shmem_request_hook = NULL;
static shmem_startup_hook_type prev_shmem_startup_hook = NULL;

static void
metrics_shmem_request(void)
{
	if (prev_shmem_request_hook)
		prev_shmem_request_hook();
	RequestAddinShmemSpace(MAXALIGN(sizeof(LedgerMetrics)));
}

static void
metrics_shmem_startup(void)
{
	bool		found;
	int			i;

	if (prev_shmem_startup_hook)
		prev_shmem_startup_hook();
	LWLockAcquire(AddinShmemInitLock, LW_EXCLUSIVE);
	metrics = ShmemInitStruct("durable_ledger metrics", sizeof(LedgerMetrics), &found);
	if (!found)
		for (i = 0; i < MAX_DATABASES; i++)
		{
			int			e;

			pg_atomic_init_u32(&metrics->databases[i].database, InvalidOid);
			for (e = 0; e < DL_NEVENTS; e++)
				pg_atomic_init_u64(&metrics->databases[i].events[e], 0);
		}
	LWLockRelease(AddinShmemInitLock);
}

/* Asks for the counters' shared memory, when loaded as the server starts. */
void
dl_metrics_init(void)
{
	if (!process_shared_preload_libraries_in_progress)
		return;
	prev_shmem_request_hook = shmem_request_hook;
	shmem_request_hook = metrics_shmem_request;
	prev_shmem_startup_hook = shmem_startup_hook;
	shmem_startup_hook = metrics_shmem_startup;
}

/* This database's slot; claimed when claim, else NULL when it has none. */
static DatabaseMetrics *
database_slot(bool claim)
{
	int			i;

	for (i = 0; i < MAX_DATABASES; i++)
	{
		DatabaseMetrics *slot = &metrics->databases[i];
		uint32		owner = pg_atomic_read_u32(&slot->database);

		if (owner == MyDatabaseId)
			return slot;
		if (owner == InvalidOid && claim)
		{
			uint32		expected = InvalidOid;

			if (pg_atomic_compare_exchange_u32(&slot->database, &expected, MyDatabaseId) ||
				expected == MyDatabaseId)
				return slot;
		}
	}
	return NULL;
}

/* Adds a committed transaction's events to its database's counts. */
void
dl_metrics_add(const uint32 *counts)
{
	DatabaseMetrics *slot;
	int			i;

	if (metrics == NULL || (slot = database_slot(true)) == NULL)
		return;
	for (i = 0; i < DL_NEVENTS; i++)
		if (counts[i] != 0)
			pg_atomic_fetch_add_u64(&slot->events[i], counts[i]);
}

/* Whether the counts are kept (the library was preloaded). */
bool
dl_metrics_kept(void)
{
	return metrics != NULL;
}

/* This database's count of event i since the server started (dl_metrics_kept). */
uint64
dl_metrics_count(int i)
{
	DatabaseMetrics *slot = database_slot(false);

	return slot ? pg_atomic_read_u64(&slot->events[i]) : 0;
}
