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

typedef struct TokenJudgement
{
	const char *run;
	int64		epoch;
	bool		live;
} TokenJudgement;

static void
judge_token_lease(void *arg)
{
	TokenJudgement *j = arg;
	RunState	state;

	j->live = dl_read_run_state(j->run, &state) && state.epoch == j->epoch &&
		state.token && state.token_live;
}

/*
 * A token lease that looks expired is ended only if no renewal (or call) of
 * its run is in progress: a renewal that began before the expiry may commit
 * after it, and then the lease goes on.  So it is looked at again while no
 * call of the run can be under way; while one is, it is not certainly ended.
 */
static Liveness
token_lease_liveness(const char *run, int64 epoch, const RunState *state)
{
	TokenJudgement j = {run, epoch, false};

	if (state->token_live)
		return LEASE_LIVE;
	if (!dl_run_when_calls_idle(dl_run_lock_key(run), judge_token_lease, &j))
		return LEASE_LIVE;
	return j.live ? LEASE_LIVE : LEASE_ENDED;
}

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
		return token_lease_liveness(run, epoch, &state);
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
