/*
 * liveness.c: is the lease that started an effect (its run and epoch) still
 * live?  It is while epoch is the run's current one and, for a session
 * lease, the epoch is not released and the backend that took it still holds
 * the run's lock; for a token lease, the lease is neither released nor
 * expired (the server's clock).  The durable_ledger.unresolved and leases
 * views ask the same question in SQL; all must agree, or a person could be
 * shown an effect that resolve_effect then refuses.  So this session's memory
 * answers only for its own current session epoch; anything else (a lock it
 * holds without an epoch, after a rolled-back acquisition) is judged from the
 * tables, as everyone else judges it.  A hot standby never holds the
 * primary's locks, and its copy of a token lease may lag behind a renewal:
 * there no lease is judged at all.
 */
#include "postgres.h"

#include "access/xlog.h"

#include "lease.h"

Liveness
dl_lease_liveness(const char *run, int64 epoch)
{
	RunState	state;

	if (dl_lease_is_mine(run, epoch))
		return LEASE_LIVE;
	if (RecoveryInProgress())
		return LEASE_NOT_JUDGED;
	if (!dl_read_run_state(run, &state) || state.epoch != epoch)
		return LEASE_ENDED;		/* superseded */
	if (state.token)
		return state.token_live ? LEASE_LIVE : LEASE_ENDED;
	if (state.released)
		return LEASE_ENDED;
	return dl_read_lease_holder_pid(dl_run_lock_key(run)) == state.holder_pid ?
		LEASE_LIVE : LEASE_ENDED;
}

/* Live, or not to be judged here: anything but certainly ended. */
bool
dl_lease_is_live(const char *run, int64 epoch)
{
	return dl_lease_liveness(run, epoch) != LEASE_ENDED;
}
