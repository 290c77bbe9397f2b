/*
 * lease.h: the lease layer.  A run's lease is either a session lease (a
 * session advisory lock in the extension's lock class, lease.c) or a token
 * lease (a row with an expiry, token_lease.c); either holds one epoch of the
 * run at a time, and the calls of an epoch count their identical calls
 * (occurrences), which roll back with their transaction.  liveness.c says
 * whether the lease that started an effect is live; runlock.c holds the
 * run's locks and says whether it is open for calls (not abandoned);
 * counters.c reads and sets an epoch's counters, whichever kind holds it.
 *
 * Uses store.h and common.h; the entry points use it.  Functions that read
 * or write the ledger need an open SPI connection.
 */
#ifndef DURABLE_LEDGER_LEASE_H
#define DURABLE_LEDGER_LEASE_H

#include "datatype/timestamp.h"

#include "store.h"

/* lease.c: session leases */
typedef struct HeldRun HeldRun;
typedef struct CallCounter CallCounter;

extern HeldRun *dl_lease_for_call(const char *run);
extern int64 dl_lease_epoch(const HeldRun *held);
extern CallCounter *dl_lease_call_counter(HeldRun *held, const char *tool,
										  const char *what, int what_len,
										  int32 *count);
extern void dl_lease_set_count(HeldRun *held, CallCounter *counter, int32 count);
extern bool dl_lease_acquire(const char *run, bool wait);
extern bool dl_lease_release(const char *run);
extern bool dl_lease_is_mine(const char *run, int64 epoch);
extern int64 dl_lease_held_epoch(const char *run);
extern void dl_lease_init(void);

/* token_lease.c: token leases */
typedef struct TokenGrant
{
	char	   *token;
	int64		epoch;
	TimestampTz expires_at;
} TokenGrant;

extern bool dl_token_take(const char *run, Interval *ttl, const char *holder,
						  TokenGrant *grant);
extern int64 dl_token_for_call(const char *run, const char *token);
/* A counter of a token lease's epoch, as its read found it. */
typedef struct TokenCall
{
	bytea	   *call;			/* what its row is keyed by */
	bool		has_row;		/* the row was there, or was written since */
	uint64		read_after;		/* the token calls begun in this backend when it was read */
} TokenCall;

extern int32 dl_token_counter(const char *run, int64 epoch, const char *tool,
							  const char *what, int what_len, TokenCall *call);
extern void dl_token_set_count(const char *run, int64 epoch, TokenCall *call, int32 count);
extern TimestampTz dl_token_renew(const char *token, Interval *ttl);
extern bool dl_token_release(const char *token);
extern bool dl_token_break(const char *run, const char *broken_by, const char *note);
extern void dl_check_ttl(Interval *ttl);

/* counters.c: the counters of a lease epoch, either kind */
typedef struct CallLease
{
	const char *run;
	int64		epoch;
	HeldRun    *held;			/* a session lease's; NULL under a token lease */
} CallLease;

typedef struct EpochCounter
{
	int32		count;			/* its value */
	CallCounter *session;		/* where a session lease keeps it */
	TokenCall	token;			/* where a token lease keeps it */
} EpochCounter;

extern void dl_epoch_counter(const CallLease *lease, const char *tool,
							 const char *what, int what_len, EpochCounter *counter);
extern void dl_epoch_count(const CallLease *lease, EpochCounter *counter, int32 count);
extern int32 dl_next_occurrence(const CallLease *lease, const char *tool,
								const char *canon, int canon_len, EpochCounter *counter);

/* liveness.c */
typedef enum Liveness
{
	LEASE_LIVE,
	LEASE_ENDED,
	LEASE_NOT_JUDGED			/* a session lease, seen from a hot standby */
} Liveness;

extern Liveness dl_lease_liveness(const char *run, int64 epoch);
extern bool dl_lease_is_live(const char *run, int64 epoch);

/* runlock.c */
extern void dl_runlock_init(void);
extern uint64 dl_run_lock_key(const char *run);
extern bool dl_run_lock_held(uint64 lock_key);
extern bool dl_run_lock_session(uint64 lock_key, bool wait, bool *waited);
extern void dl_run_unlock_session(uint64 lock_key);
extern bool dl_run_exclude_sessions(uint64 lock_key);
extern bool dl_run_when_calls_idle(uint64 lock_key, void (*judge_now) (void *), void *arg);
extern bool dl_run_lock_xact(uint64 lock_key, uint16 lock_class, bool wait);
extern bool dl_run_lock_xact_held(uint64 lock_key, uint16 lock_class);
extern void dl_run_unlock_xact(uint64 lock_key, uint16 lock_class);
extern bool dl_run_lock_open(uint64 lock_key);
extern void dl_run_lock_closing(uint64 lock_key);
extern bool dl_tool_lock(const char *tool, bool exclusive);
extern bool dl_policy_lock(bool exclusive);
extern bool dl_run_lock_open_nowait(uint64 lock_key);
extern void dl_refuse_if_abandoned(const char *run);
extern bool dl_check_run_open(const char *run);

#endif							/* DURABLE_LEDGER_LEASE_H */
