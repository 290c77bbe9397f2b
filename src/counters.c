/*
 * counters.c: the counters of a lease epoch, whichever kind of lease holds
 * it.
 *
 * An epoch counts its identical calls (the occurrence of each) and, for
 * divergence (divergence.c), how far its replay has come.  A session lease
 * keeps its counters in memory with an undo log (lease.c), a token lease in
 * durable_ledger.token_lease_calls (token_lease.c); both roll back with the
 * (sub)transaction that set them.
 */
#include "postgres.h"

#include "lease.h"

void
dl_epoch_counter(const CallLease *lease, const char *tool, const char *what,
				 int what_len, EpochCounter *counter)
{
	counter->session = NULL;
	if (lease->held != NULL)
		counter->session = dl_lease_call_counter(lease->held, tool, what, what_len,
												 &counter->count);
	else
		counter->count = dl_token_counter(lease->run, lease->epoch, tool, what, what_len,
										  &counter->token);
}

void
dl_epoch_count(const CallLease *lease, EpochCounter *counter, int32 count)
{
	if (lease->held != NULL)
		dl_lease_set_count(lease->held, counter->session, count);
	else
		dl_token_set_count(lease->run, lease->epoch, &counter->token, count);
	counter->count = count;
}

/*
 * The occurrence the next identical call (tool, canonical args) gets in the
 * epoch; *counter is where it is counted (dl_epoch_count) once it is used up.
 */
int32
dl_next_occurrence(const CallLease *lease, const char *tool, const char *canon,
				   int canon_len, EpochCounter *counter)
{
	dl_epoch_counter(lease, tool, canon, canon_len, counter);
	if (counter->count == PG_INT32_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("too many identical calls in one lease epoch of run \"%s\"", lease->run)));
	return counter->count + 1;
}
