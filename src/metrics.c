/*
 * metrics.c: how many events of each kind the ledger logged since the server
 * started, for monitoring (durable_ledger.metrics_events, metrics_calls.c).
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

/* The audit log's events (its domain durable_ledger.audit_event). */
static const char *const event_names[DL_NEVENTS] = {
	"lease_acquired", "lease_released", "lease_broken", "intent", "replay", "pause",
	"in_progress", "completed", "late_completion", "failed", "late_failure", "resolved",
	"conflict", "tool_registered", "tool_changed", "tool_retired", "divergence",
	"divergence_resolved", "run_abandoned", "run_forked", "carried", "policy_changed",
	"purged", "audit_purged"
};

typedef struct LedgerMetrics
{
	pg_atomic_uint64 events[DL_NEVENTS];
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
		for (i = 0; i < DL_NEVENTS; i++)
			pg_atomic_init_u64(&metrics->events[i], 0);
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

/* The index of an event in the counts; -1 for one this version does not know. */
int
dl_metrics_event_index(const char *event)
{
	int			i;

	for (i = 0; i < DL_NEVENTS; i++)
		if (strcmp(event_names[i], event) == 0)
			return i;
	return -1;
}

/* Adds a committed transaction's events. */
void
dl_metrics_add(const uint32 *counts)
{
	int			i;

	if (metrics == NULL)
		return;
	for (i = 0; i < DL_NEVENTS; i++)
		if (counts[i] != 0)
			pg_atomic_fetch_add_u64(&metrics->events[i], counts[i]);
}

/* Whether the counts are kept (the library was preloaded). */
bool
dl_metrics_kept(void)
{
	return metrics != NULL;
}

const char *
dl_metrics_event_name(int i)
{
	return event_names[i];
}

/* The count of event i since the server started (dl_metrics_kept). */
uint64
dl_metrics_count(int i)
{
	return pg_atomic_read_u64(&metrics->events[i]);
}
