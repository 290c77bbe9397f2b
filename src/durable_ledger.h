/*
 * durable_ledger.h: what the parts of the extension offer each other.
 *
 *   module.c      _PG_init, settings, transaction callbacks (durability)
 *   canonical.c   the canonical text of args
 *   keys.c        key material and SHA-256, argument checks
 *   lease.c       the per-run advisory lock, lease epochs, occurrence counters
 *   store.c       every SQL statement the extension runs (SPI, saved plans)
 *   direct.c      the hottest writes, without the executor
 *   ledger.c      the SQL-callable ledger functions and their decisions
 *   drop_guard.c  the event trigger that protects a ledger holding effects
 *   older_sql.c   the symbols of older SQL declarations: refused
 */
#ifndef DURABLE_LEDGER_H
#define DURABLE_LEDGER_H

#include "fmgr.h"
#include "access/htup.h"
#include "access/tupdesc.h"
#include "lib/stringinfo.h"
#include "utils/jsonb.h"

#include "compat.h"

/*
 * field4 of the extension's advisory LOCKTAGs: pg_locks shows it as objsubid.
 * PostgreSQL uses 1 and 2, Citus 4 to 16; 17484 is "DL".
 */
#define DL_LOCK_CLASS 17484

/* The SQL version this library implements (its symbols end in _1_1). */
#define DL_LIBRARY_VERSION "1.1"

/* Limits on names (characters, not bytes); see README "Limits". */
#define DL_MAX_RUN_CHARS 512
#define DL_MAX_TOOL_CHARS 255
#define DL_MAX_BUSINESS_KEY_CHARS 255

/* A derived key: lowercase hex SHA-256. */
#define DL_KEY_HEX_LEN 64

typedef enum EffectStatus
{
	EFFECT_STARTED,
	EFFECT_COMPLETED,
	EFFECT_FAILED,
	EFFECT_UNKNOWN
} EffectStatus;

extern const char *dl_status_name(EffectStatus status);
extern EffectStatus dl_status_from_name(const char *name);

/* module.c */
extern bool dl_allow_drop;
extern int	dl_max_leases_per_session;
extern void dl_note_durable_write(void);
extern void dl_note_ledger_write(void);

/* canonical.c */
extern void dl_append_canonical_args(StringInfo out, Jsonb *args);

/* keys.c */
extern char *dl_required_text_arg(FunctionCallInfo fcinfo, int argno,
								  const char *argname, int max_chars);
extern Jsonb *dl_required_jsonb_arg(FunctionCallInfo fcinfo, int argno,
									const char *argname);
extern Jsonb *dl_optional_jsonb_arg(FunctionCallInfo fcinfo, int argno);
extern char *dl_optional_text_arg(FunctionCallInfo fcinfo, int argno);
extern int32 dl_optional_attempt_arg(FunctionCallInfo fcinfo, int argno);
extern void dl_check_business_key(const char *business_key);
extern void dl_derive_key(const char *run, const char *tool,
						  const char *canon, int canon_len,
						  int32 occurrence, char *hex_out);

/* lease.c */
typedef struct HeldRun HeldRun;

extern HeldRun *dl_lease_for_call(const char *run);
extern int64 dl_lease_epoch(const HeldRun *held);
typedef struct CallCounter CallCounter;

extern CallCounter *dl_lease_call_counter(HeldRun *held, const char *tool,
										  const char *canon, int canon_len,
										  int32 *next);
extern void dl_lease_count_call(HeldRun *held, CallCounter *counter);
extern bool dl_lease_acquire(const char *run, bool wait);
extern bool dl_lease_release(const char *run);
extern bool dl_lease_is_live(const char *run, int64 epoch);
extern bool dl_lease_is_mine(const char *run, int64 epoch);
extern bool dl_lease_touched_in_xact(void);
extern uint64 dl_run_lock_key(const char *run);
extern void dl_lease_xact_callback(bool commit);
extern void dl_lease_subxact_abort(SubTransactionId subid);
extern void dl_lease_subxact_commit(SubTransactionId subid,
									SubTransactionId parent);

/* store.c: every statement needs an open SPI connection */
typedef struct EffectRow
{
	char	   *key;
	char	   *run;
	char	   *tool;
	Jsonb	   *args;
	bool		business_key;
	int32		occurrence;		/* 0 when NULL (business key) */
	int32		attempt;
	EffectStatus status;
	Jsonb	   *result;			/* NULL when SQL NULL */
	Jsonb	   *error;			/* NULL when SQL NULL */
	int64		lease_epoch;
	bool		conflict;
} EffectRow;

typedef struct NewIntent
{
	const char *key;
	const char *run;
	const char *tool;
	Jsonb	   *args;
	bool		business_key;
	int32		occurrence;		/* 0 for a business key */
	Jsonb	   *meta;
	int64		lease_epoch;
} NewIntent;

/* An attempt of a business key that a later attempt replaced. */
typedef struct PastAttempt
{
	int32		attempt;
	char	   *run;
	int64		lease_epoch;
	EffectStatus status;
	Jsonb	   *error;			/* NULL when SQL NULL */
} PastAttempt;

extern int64 dl_store_start_epoch(const char *run, uint64 lock_key, bool waited);
extern void dl_store_end_epoch(const char *run, int64 epoch, bool lock_lost);
extern bool dl_store_lease_unreleased_by_me(const char *run, int64 *epoch);
extern bool dl_store_run_state(const char *run, int64 *epoch, bool *released,
							   int *holder_pid);
extern bool dl_store_insert_intent(const NewIntent *intent);
extern void dl_store_insert_new_intent(const NewIntent *intent);
extern bool dl_store_fetch_effect(const char *key, bool for_update, EffectRow *row);
extern bool dl_store_mark_unknown(const EffectRow *row);
extern bool dl_store_restart_business_key(const NewIntent *intent, int32 old_attempt);
extern bool dl_store_fetch_past_attempt(const char *key, int32 attempt, PastAttempt *past);
extern bool dl_store_lease_began_past_attempt(const char *key, const char *run,
											  int64 lease_epoch);
extern bool dl_store_effect_exists_now(const char *key);
extern HeapTuple dl_store_finish(const char *key, EffectStatus from, EffectStatus to,
								 Jsonb *result, Jsonb *error, int32 attempt,
								 char **run, int64 *lease_epoch, int32 *row_attempt);
extern void dl_store_set_conflict(const char *key);
extern void dl_store_resolve(const char *key, EffectStatus to, Jsonb *value,
							 const char *resolved_by, const char *note);
extern HeapTuple dl_store_effect_tuple(const char *key, bool report_unknown,
									   TupleDesc desc);
extern void dl_audit(const char *run, const char *key, const char *event,
					 Jsonb *detail, int64 lease_epoch, int32 attempt);
extern int	dl_store_lease_holder_pid(uint64 lock_key);

/* direct.c: the hottest writes without the executor (false: use SQL) */
typedef enum DirectOutcome
{
	DIRECT_DONE,
	DIRECT_NOT_DONE,			/* no such row of this backend, or it changed */
	DIRECT_USE_SQL				/* the table must be written through SQL */
} DirectOutcome;

typedef enum KeyLookup
{
	KEY_ABSENT,					/* no version at all, committed or in progress */
	KEY_FOUND,					/* its current version, as a fresh snapshot reads it */
	KEY_USE_SQL					/* read it through SQL */
} KeyLookup;

extern bool dl_direct_insert_intent(const NewIntent *intent);
extern KeyLookup dl_direct_lookup(const char *key, EffectRow *row);
extern DirectOutcome dl_direct_finish(const char *key, EffectStatus to,
									  Jsonb *result, Jsonb *error, int32 attempt,
									  HeapTuple *finished, char **run,
									  int64 *lease_epoch, int32 *row_attempt);
extern bool dl_direct_audit(const char *run, const char *key, const char *event,
							Jsonb *detail, int64 lease_epoch, int32 attempt,
							const char *role_name);

/* A small builder for audit details: a flat JSON object. */
typedef struct DetailBuilder
{
	JsonbParseState *state;
} DetailBuilder;

extern void dl_detail_init(DetailBuilder *d);
extern void dl_detail_text(DetailBuilder *d, const char *name, const char *value);
extern void dl_detail_int(DetailBuilder *d, const char *name, int64 value);
extern void dl_detail_bool(DetailBuilder *d, const char *name, bool value);
extern void dl_detail_jsonb(DetailBuilder *d, const char *name, Jsonb *value);
extern Jsonb *dl_detail_finish(DetailBuilder *d);

#endif							/* DURABLE_LEDGER_H */
