/*
 * store.h: the store layer, every read and write of the ledger's tables.
 *
 *   reader.c      lookups and queries (SPI with saved plans, and the
 *                 unique-check look at a key)
 *   rows.c        the only code that writes a row: PostgreSQL's executor
 *                 helpers for single rows (rows.h, for the store's files)
 *   write_*.c     what is written, one file per table (effects, runs,
 *                 tokens, registry, divergences) and for retention; SPI
 *                 for the one statement that needs ON CONFLICT
 *   audit.c       the audit log's rows: each event's row, chained, counted,
 *                 and notified (NOTIFY durable_ledger_attention) when a
 *                 person attends to it
 *   audit_chain.c the audit log's hash chains (tamper evidence)
 *   metrics.c     event counts since the server started (shared memory)
 *   tables.c      the tables' columns, found by name (tables.h, for the
 *                 store's own files)
 *   cache.c       what rarely changes (a tool's row, a run not abandoned,
 *                 a run without divergences), remembered between calls
 *   durability.c  synchronous_commit raised for transactions that wrote
 *   plans.c       saved SPI plans, run with the right snapshot
 *
 * Uses common.h only; the lease layer and the entry points use it.  The
 * callers of SPI-based functions have an open SPI connection.
 */
#ifndef DURABLE_LEDGER_STORE_H
#define DURABLE_LEDGER_STORE_H

#include "access/htup.h"
#include "datatype/timestamp.h"
#include "executor/spi.h"
#include "nodes/pg_list.h"
#include "storage/itemptr.h"
#include "utils/jsonpath.h"

#include "common.h"

/* A call's approval (effects.approval) */
typedef enum Approval
{
	APPROVAL_NONE,				/* none needed (NULL) */
	APPROVAL_REQUESTED,
	APPROVAL_APPROVED,
	APPROVAL_REJECTED
} Approval;

/* A row of durable_ledger.effects. */
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
	TimestampTz created_at;		/* when the current attempt began */
	bool		safe_to_redo;	/* a recorded call (begin_recorded) */
	bool		execute_again;	/* failed, and the next call executes the next attempt */
	bool		local;			/* begun by begin_local: commits with its outcome */
	bool		reconciled;		/* ... since a reconciler found it did not happen (not a person) */
	Approval	approval;		/* of the current attempt */
} EffectRow;

/*
 * A row of effects locked for this transaction (as SELECT ... FOR NO KEY
 * UPDATE locks it): its values, and the version that write_effects.c may change.
 */
typedef struct LockedEffect
{
	EffectRow	row;
	HeapTuple	tuple;			/* the locked version, with its TID */
} LockedEffect;

/* What begin_effect records for a new call. */
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
	bool		safe_to_redo;	/* a recorded call (begin_recorded) */
	bool		local;			/* begin_local: its transaction commits it with its outcome */
	bool		awaiting_approval;	/* recorded to wait for an approver, not executed */
} NewIntent;

/* An attempt that a later one replaced (a business key's, a recorded call's). */
typedef struct PastAttempt
{
	int32		attempt;
	char	   *run;
	int64		lease_epoch;
	EffectStatus status;
	Jsonb	   *error;			/* NULL when SQL NULL */
} PastAttempt;

/* What the ledger knows of a run's current epoch now. */
typedef struct RunState
{
	bool		abandoned;		/* by a person: no further calls */
	char	   *abandoned_by;
	TimestampTz abandoned_at;
	int64		epoch;
	bool		released;		/* its holder released it (session) */
	int			holder_pid;		/* the backend that took it */
	bool		token;			/* held by a token lease, not a session */
	bool		token_live;		/* ... not released nor expired (server's clock) */
	TimestampTz expires_at;		/* ... when it expires */
} RunState;

/* Who holds a run's lease (the leases view), for a wait's error. */
typedef struct LeaseHolder
{
	bool		found;
	bool		token;			/* a token lease (else a session's) */
	int			pid;			/* a session's backend */
	char	   *holder;			/* a token lease's holder name */
	char	   *application;
	bool		since_known;
	TimestampTz since;
} LeaseHolder;

/* A token lease, as found by its token. */
typedef struct TokenLease
{
	char	   *run;
	int64		epoch;
	int64		current_epoch;	/* its run's: a greater one superseded it */
	bool		released;
	bool		expired;		/* by the server's clock */
	TimestampTz expires_at;
} TokenLease;

/* A token lease's row, locked for this transaction. */
typedef struct LockedToken
{
	bool		released;
	bool		expired;		/* by the server's clock */
	TimestampTz expires_at;
	Interval   *ttl;
	HeapTuple	tuple;
} LockedToken;

/*
 * The policy row: whether a tool nobody registered may execute, and how a
 * later attempt's calls of it are judged for divergence (1.3).  No row:
 * allow, and pause.
 */
typedef struct UnregisteredPolicy
{
	UnregisteredTools may_execute;
	DivergencePolicy divergence;
} UnregisteredPolicy;

#define DL_UNREGISTERED_DEFAULT ((UnregisteredPolicy) {UNREGISTERED_ALLOW, DIVERGENCE_PAUSE})

/* A row of durable_ledger.tools. */
typedef struct ToolRow
{
	char	   *tool;
	bool		side_effecting;
	DivergencePolicy divergence;
	int			nkey_fields;	/* -1: none named, the whole args */
	char	  **key_fields;
	char	   *note;
	bool		retired;
	bool		reconcilable;	/* a worker may settle an unknown outcome (reconcile_effect) */
	Interval	reconcile_grace;	/* ... this long after it was found unknown */
	JsonPath   *approval;		/* NULL: no approval needed; else which calls need one */
	int32		max_executions; /* per run; 0: no budget */
	int32		max_in_window;	/* per run within budget_window; 0: no window */
	Interval	budget_window;
} ToolRow;

/* A tool's row locked for this transaction. */
typedef struct LockedTool
{
	ToolRow		row;
	HeapTuple	tuple;
} LockedTool;

/* A run's counter of a budgeted tool, and its own budgets (0: the tool's). */
typedef struct RunBudgetRow
{
	bool		found;
	int32		executions;
	int			nrecent;
	TimestampTz *recent;		/* when the latest executions began, oldest first */
	int32		max_executions;
	int32		max_in_window;
	bool		paused;
} RunBudgetRow;

/*
 * A run's counter of a tool, locked for this transaction, to be written from
 * (tuple: its version, NULL when the run has no row yet).
 */
typedef struct BudgetCounter
{
	RunBudgetRow row;
	HeapTuple	tuple;
} BudgetCounter;

/* A row of durable_ledger.divergences: a later attempt's drifted call. */
typedef struct DivergenceRow
{
	char	   *key;
	char	   *run;
	int64		lease_epoch;
	char	   *tool;
	Jsonb	   *args;
	int32		occurrence;
	char	   *candidate_key;
	char	   *verdict;		/* NULL until a person decides */
	char	   *same_as;
} DivergenceRow;

typedef struct LockedDivergence
{
	DivergenceRow row;
	HeapTuple	tuple;
} LockedDivergence;

/* reader.c */
typedef enum KeyLookup
{
	KEY_ABSENT,					/* no version at all, committed or in progress */
	KEY_FOUND,					/* its current committed version, nobody changing it */
	KEY_BUSY					/* a writer is changing it: lock it to know */
} KeyLookup;

extern Oid	dl_ledger_identity(void);
extern Oid	dl_ledger_identity_if_any(void);
extern KeyLookup dl_read_key(const char *key, EffectRow *row);
extern HeapTuple dl_read_effect_now(const char *key, TupleDesc desc, EffectRow *row);
extern bool dl_read_past_attempt(const char *key, int32 attempt, PastAttempt *past);
extern List *dl_read_past_attempt_runs(const char *key);
extern bool dl_read_found_unknown_at(const char *key, int32 attempt, TimestampTz begun_at,
									 TimestampTz *at);
extern bool dl_read_run_state(const char *run, RunState *state);
extern bool dl_read_run_row(const char *run, RunState *state);
extern int64 dl_read_highest_logged_epoch(const char *run);
extern bool dl_read_token_lease(bytea *token_sha256, TokenLease *lease);
extern bool dl_read_token_calls(const char *run, int64 epoch, bytea *call, int32 *calls);
extern int	dl_read_lease_holder_pid(uint64 lock_key);
extern void dl_read_lease_holder(const char *run, LeaseHolder *holder);
extern bool dl_read_tool(const char *tool, ToolRow *row);
extern int32 dl_read_attempts_budget(const char *run, bool *forked);
extern char *dl_read_attempt_model(const char *run, int64 epoch, char **changed_from);
extern char *dl_read_earlier_model(const char *run, int64 epoch);
extern UnregisteredPolicy dl_read_unregistered_policy(void);
extern bool dl_read_tool_has_derived_effects(const char *tool);
extern bool dl_read_divergence(const char *key, DivergenceRow *row);
extern bool dl_read_run_has_divergences(const char *run);
extern HeapTuple dl_read_tool_tuple(const char *tool);
extern HeapTuple dl_read_divergence_tuple(const char *key);
extern HeapTuple dl_read_unsettled_tuple(const char *key, TimestampTz created_at);
extern List *dl_read_earlier_effects(const char *run, const char *tool, int64 epoch,
									  int32 *call_ids);
extern List *dl_read_run_tool_effects(const char *run, const char *tool);
extern List *dl_read_run_effect_keys(const char *run);
extern bool dl_read_run_has_call_ids(const char *run);
extern bool dl_read_run_known(const char *run);

/* What purging a run removes (purge_settled). */
typedef struct PurgeCounts
{
	int64		effects;
	int64		past_attempts;
	int64		divergences;
} PurgeCounts;
/* What purge_audit removes of one chain: a prefix, up to up_to_seq. */
typedef struct AuditPurge
{
	int64		chain;
	int64		rows;
	int64		up_to_seq;
	bytea	   *row_hash;		/* of the row at up_to_seq: the chain's new anchor */
} AuditPurge;
extern List *dl_read_audit_purge_plan(TimestampTz cutoff);
extern List *dl_read_purge_candidates(TimestampTz cutoff, const char *after_run, int limit);
extern List *dl_read_runs_sharing_effects(const char *run);
extern bool dl_read_run_purge_state(const char *run, TimestampTz cutoff, bool lock,
									PurgeCounts *counts);

/* An effect of a run's earlier attempt (dl_read_earlier_effects). */
typedef struct EarlierEffect
{
	char	   *key;
	TimestampTz created_at;
} EarlierEffect;
extern bool dl_read_lease_unreleased_by_me(const char *run, int64 *epoch);
extern void dl_error_unknown_key(const char *key);

/* rows.c, write_*.c, audit.c: the only code that writes */
extern void dl_write_new_intent(const NewIntent *intent);
extern bool dl_write_intent_unless_exists(const NewIntent *intent);
extern bool dl_lock_effect(const char *key, LockedEffect *locked);
extern HeapTuple dl_write_outcome(LockedEffect *locked, EffectStatus to,
								  Jsonb *result, Jsonb *error);
extern void dl_write_unknown(LockedEffect *locked);
extern void dl_write_conflict_flag(LockedEffect *locked);
extern HeapTuple dl_write_resolution(LockedEffect *locked, EffectStatus to, Jsonb *value,
									 const char *resolved_by, const char *note);
extern HeapTuple dl_write_reconciled(LockedEffect *locked, bool happened, Jsonb *evidence);
extern HeapTuple dl_write_retry(LockedEffect *locked, const char *resolved_by, const char *note);
extern void dl_write_next_attempt(LockedEffect *locked, const NewIntent *intent,
								  EffectStatus replaced_as);
extern void dl_write_approved_start(LockedEffect *locked, const NewIntent *intent);
extern HeapTuple dl_write_approval(LockedEffect *locked, bool approved, const char *approver,
								   const char *note);
extern bool dl_read_approval_requester(const char *key, int32 attempt, TimestampTz begun_at,
									   char **role_name, char **session_user_name);
extern int64 dl_write_next_epoch(const char *run, uint64 lock_key, bool token);
extern void dl_write_token_lease(const char *run, int64 epoch, bytea *token_sha256,
								 const char *holder, Interval *ttl, TimestampTz taken_at,
								 TimestampTz expires_at);
extern bool dl_lock_token_lease(const char *run, int64 epoch, LockedToken *locked);
extern void dl_write_token_expiry(LockedToken *locked, TimestampTz expires_at);
extern void dl_write_token_release(LockedToken *locked);
extern void dl_write_token_calls(const char *run, int64 epoch, bytea *call, int32 calls,
								 bool look);
extern void dl_write_epoch_end(const char *run, int64 epoch, bool token);
extern bool dl_lock_run(const char *run);
extern bool dl_write_run_abandoned(const char *run, const char *abandoned_by,
								   const char *note, int64 *epoch);
extern void dl_write_new_tool(const ToolRow *row, const char *registered_by);
extern UnregisteredPolicy dl_write_unregistered_policy(const UnregisteredTools *may_execute,
													   const DivergencePolicy *divergence,
													   const char *changed_by,
													   const char *note,
													   UnregisteredPolicy *after);
extern bool dl_lock_tool(const char *tool, LockedTool *locked);
extern void dl_write_tool_change(LockedTool *locked, const ToolRow *to,
								 const char *changed_by, bool registered_anew);
extern void dl_write_tool_retired(LockedTool *locked, const char *retired_by,
								  const char *note);
extern void dl_write_divergence(const DivergenceRow *row);

/* write_budgets.c */
extern void dl_lock_run_budget(const char *run, const char *tool, BudgetCounter *counter);
extern void dl_write_budget_count(const char *run, const char *tool, const BudgetCounter *counter,
								  const TimestampTz *recent, int nrecent);
extern void dl_write_budget_pause(const char *run, const char *tool, const BudgetCounter *counter,
								  const char *key, Jsonb *args, int64 epoch, const char *budget,
								  const char *reason);
extern void dl_write_run_budget(const char *run, const char *tool, const int32 *max_executions,
								const int32 *max_in_window);
extern bool dl_write_run_attempts(const char *run, int32 max_attempts, int32 *before);
extern int64 dl_write_run_pauses_answered(const char *run, const char *tool, bool executions,
										 bool window, bool attempts);
extern int64 dl_write_tool_pauses_answered(const char *tool, int32 max_executions,
										   int32 max_in_window, int32 window_before);
extern int64 dl_write_attempts_pauses_answered(int32 max_attempts, int32 before);
extern void dl_write_fork_counters(const char *new_run, const char *source_run);
extern int32 dl_write_policy_attempts(int32 max_attempts, const char *changed_by,
									  const char *note);
extern void dl_write_attempt_model(const char *run, int64 epoch, const char *model,
								   const char *changed_from);
extern void dl_write_forked_effect(const LockedEffect *source, const char *new_run,
								   const char *new_key, int64 lease_epoch);
extern void dl_write_forked_run(const char *new_run, uint64 lock_key, const char *source_run,
								const char *up_to);
extern bool dl_lock_divergence(const char *key, LockedDivergence *locked);
extern void dl_write_divergence_verdict(LockedDivergence *locked, const char *verdict,
										const char *same_as, const char *resolved_by,
										const char *note);
extern void dl_write_run_purge(const char *run, PurgeCounts *counts);
extern int64 dl_write_audit_purge(const AuditPurge *purge, const char *purged_by);
extern bool dl_audit_purge_under_way(void);
extern void dl_write_audit(const char *run, const char *key, AuditEvent event,
						   Jsonb *detail, int64 lease_epoch, int32 attempt);

/* tables.c */
extern void dl_tables_init(void);
extern void dl_index_plans_init(void);

/* audit_chain.c: an audit row as its hash covers it */
typedef struct AuditRow
{
	int64		id;
	int64		chain;			/* set by dl_chain_audit_row */
	int64		chain_seq;		/* set by dl_chain_audit_row */
	TimestampTz logged_at;
	const char *run;
	const char *key;
	AuditEvent	event;
	Jsonb	   *detail;
	const char *role_name;
	const char *session_user_name;
	const char *application_name;
	const char *client_addr;	/* client_addr::text */
	int32		backend_pid;
	int64		lease_epoch;	/* <= 0: NULL */
	int32		attempt;		/* <= 0: NULL */
	bytea	   *row_hash;		/* set by dl_chain_audit_row */
} AuditRow;

extern void dl_audit_chain_init(void);

/* metrics.c: event counts since the server started (when preloaded) */
extern void dl_metrics_init(void);
extern void dl_metrics_add(const uint32 *counts);
extern bool dl_metrics_kept(void);
extern uint64 dl_metrics_count(int i);
extern void dl_chain_audit_row(AuditRow *row, Oid audit_relid, Oid namespace);

/* cache.c: facts that rarely change, remembered until an invalidation */
extern void dl_cache_init(void);
extern void dl_forget_remembered(void);
extern bool dl_read_tool_remembered(const char *tool, ToolRow *row);
extern UnregisteredPolicy dl_read_unregistered_policy_remembered(void);
extern int32 dl_read_attempts_budget_remembered(const char *run, bool *forked);
extern bool dl_run_remembered_open(const char *run, uint64 *generation);
extern void dl_remember_run_open(const char *run, uint64 generation);
extern bool dl_run_may_have_divergences(const char *run);

/* audit.c */
extern void dl_notify_attention(AuditEvent event, int64 audit_id);

/* durability.c */
extern void dl_note_durable_write(void);
extern void dl_note_ledger_write(void);
extern void dl_durability_init(void);
extern void dl_budgets_init(void);

/* plans.c: saved SPI plans (for the store's files) */
typedef struct Statement
{
	const char *sql;
	int			nargs;
	Oid			argtypes[11];
	SPIPlanPtr	plan;			/* prepared on first use, kept */
	bool		replan;			/* planned anew for each run's values (a rare
								 * question about one run of a table that grows) */
} Statement;

extern uint64 dl_plan_run(Statement *stmt, Datum *values, const char *nulls,
						  int expected);
extern uint64 dl_plan_run_now(Statement *stmt, Datum *values, const char *nulls,
							  int expected);
extern Datum dl_text_datum(const char *s);
extern char *dl_caller_role_name(void);

#define EQ " OPERATOR(pg_catalog.=) "

/*
 * The keys of the effects run $1 began, found through its audit log (indexed
 * by run): every intent is logged under the run that began it (that of a
 * call awaiting approval as approval_requested), and every effect a fork
 * carried; a query restricts them to effects whose run is still $1 (a
 * business key's next attempt may belong to another run).
 */
#define RUN_LOGGED_KEYS \
	"SELECT a.key FROM durable_ledger.audit_log a" \
	" WHERE a.run" EQ "$1" \
	"   AND a.event OPERATOR(pg_catalog.=) ANY ('{intent,carried,approval_requested}')"

/*
 * An audit row (alias a) that purge_audit may remove: logged before $1, not
 * a purge's own row (it vouches for the anchors) nor the one that records
 * chain 0's head (history_chained), of no run or of a run with
 * no effect left (the ledger finds a run's effects through its rows) -- and,
 * whatever its run column says, not evidence that something still open
 * needs: a row about an effect that is started, unknown or flagged (its
 * conflicting reports may name no run, or a business key's earlier run), a
 * row about a divergence waiting for its verdict, a row of a run a live
 * lease holds.  What waits is few rows: each set is read once (a hashed
 * subplan).
 */
#define AUDIT_ROW_PAST_HORIZON \
	"(a.logged_at OPERATOR(pg_catalog.<) $1" \
	" AND a.event OPERATOR(pg_catalog.<>) ALL ('{audit_purged,history_chained}')" \
	" AND (a.run IS NULL OR NOT EXISTS" \
	"  (SELECT FROM durable_ledger.effects e WHERE e.run" EQ "a.run))" \
	" AND (a.key IS NULL OR NOT a.key" EQ "ANY" \
	"  (SELECT u.key FROM durable_ledger.unsettled u))" \
	" AND (a.key IS NULL OR NOT a.key" EQ "ANY" \
	"  (SELECT d.key FROM durable_ledger.divergences d WHERE d.verdict IS NULL))" \
	" AND (a.run IS NULL OR NOT a.run" EQ "ANY" \
	"  (SELECT l.run FROM durable_ledger.leases l WHERE l.run IS NOT NULL)))"

#endif							/* DURABLE_LEDGER_STORE_H */
