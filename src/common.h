/*
 * common.h: the bottom layer of durable_ledger, the parts that depend on
 * nothing but PostgreSQL: the names of statuses, canonical args, keys, the
 * checks on what callers pass, the audit detail builder.
 *
 * The layers of src/, from the top.  Each file uses only its own layer and
 * the layers below it, never one above; the entry points never use each
 * other.  test/check-layers.py reads this list (one layer a line, its files
 * as shell patterns) and checks the rule on the built objects:
 *
 * layers:
 *   module    module.c
 *   entry     *_funcs.c
 *   decision  decide.c report.c local.c decision.h
 *   policy    tools.c divergence.c budgets.c models.c policy.h
 *   lease     lease.c held_runs.c token_lease.c liveness.c runlock.c counters.c
 *   lease     lease.h held_runs.h
 *   store     reader.c rows.c write_*.c audit.c audit_chain.c metrics.c cache.c
 *   store     tables.c plans.c durability.c index_plans.c store.h rows.h tables.h
 *   common    names.c canonical.c identity.c keys.c digest.c call.c detail.c common.h compat.h digest.h
 *
 * The entry points parse, call their subsystem and form the result; the
 * decision layer decides a begin (read, judge, apply); the policy layer
 * says what a run's calls may execute; the lease layer holds runs; the store
 * reads and writes the tables (rows.c is the only code that writes a row).
 * module.c (_PG_init) only calls each part's init.  This header includes
 * PostgreSQL's headers and compat.h, nothing else of ours.
 */
#ifndef DURABLE_LEDGER_COMMON_H
#define DURABLE_LEDGER_COMMON_H

#include "fmgr.h"
#include "access/tupdesc.h"
#include "datatype/timestamp.h"
#include "lib/stringinfo.h"
#include "utils/jsonb.h"

#include "compat.h"

/* The SQL version this library implements (its new C symbols end in _1_3). */
#define DL_LIBRARY_VERSION "1.3"

/*
 * field4 of the extension's advisory LOCKTAGs: pg_locks shows it as objsubid.
 * PostgreSQL uses 1 and 2, Citus 4 to 16; 17484 is "DL".  Session leases use
 * DL_LOCK_CLASS, the calls of a token lease DL_CALL_LOCK_CLASS, every call
 * and abandon_run DL_OPEN_LOCK_CLASS, every call and the registry's changes
 * DL_TOOL_LOCK_CLASS (runlock.c).
 */
#define DL_LOCK_CLASS 17484
#define DL_CALL_LOCK_CLASS 17485
#define DL_OPEN_LOCK_CLASS 17486
#define DL_TOOL_LOCK_CLASS 17487

/* The SQLSTATE of a token lease that is no longer held (expired, released, ...). */
#define ERRCODE_DL_LEASE_LOST MAKE_SQLSTATE('5','5','L','0','1')
/* ... of a call of a run that a person abandoned */
#define ERRCODE_DL_RUN_ABANDONED MAKE_SQLSTATE('5','5','L','0','2')
/* ... of a tool that may not be executed: retired, or not registered where that is refused */
#define ERRCODE_DL_TOOL_REFUSED MAKE_SQLSTATE('5','5','L','0','3')

/*
 * The SQLSTATEs of the ledger's WARNINGs (class 01), so that a client can
 * tell them apart without reading their text (1.3): a call executed although
 * it diverges (policy warn), a call of a tool nobody registered (policy
 * warn), a report kept as a conflict and flagged for a person, a report kept
 * as superseded (a recorded call made again).
 */
#define ERRCODE_DL_WARNING_DIVERGENCE MAKE_SQLSTATE('0','1','L','0','1')
#define ERRCODE_DL_WARNING_UNREGISTERED MAKE_SQLSTATE('0','1','L','0','2')
#define ERRCODE_DL_WARNING_CONFLICT MAKE_SQLSTATE('0','1','L','0','3')
#define ERRCODE_DL_WARNING_SUPERSEDED MAKE_SQLSTATE('0','1','L','0','4')

/* Limits on names (characters, not bytes); see docs/reference.md. */
#define DL_MAX_RUN_CHARS 512
#define DL_MAX_TOOL_CHARS 255
/* a window's limit: the times of that many latest executions are kept per run */
#define DL_MAX_IN_WINDOW 10000
#define DL_MAX_BUSINESS_KEY_CHARS 255
/* how the key of a call id begins (begin_effect's call_id): reserved for them */
#define DL_CALL_KEY_PREFIX "call:"

/*
 * ... and the bytes of a run and a tool together: an effect is indexed by
 * both (effects_tool_run_idx), and a B-tree entry of an 8 kB page holds at
 * most 2,704 bytes; 512 and 255 characters of four bytes would not fit.
 */
#define DL_MAX_RUN_TOOL_BYTES 2600

/* A derived key: lowercase hex SHA-256. */
#define DL_KEY_HEX_LEN 64

/* names.c: the statuses of an effect */
typedef enum EffectStatus
{
	EFFECT_STARTED,
	EFFECT_COMPLETED,
	EFFECT_FAILED,
	EFFECT_UNKNOWN,
	EFFECT_AWAITING_APPROVAL,	/* a call that needs approval, recorded, not executed */
	EFFECT_APPROVED				/* ... approved: the next call of its key executes it */
} EffectStatus;

extern const char *dl_status_name(EffectStatus status);
extern EffectStatus dl_status_from_name(const char *name);

/* names.c: how a later attempt's drifted call is handled (the tools registry) */
typedef enum DivergencePolicy
{
	DIVERGENCE_OFF,
	DIVERGENCE_WARN,
	DIVERGENCE_PAUSE
} DivergencePolicy;

/* names.c: whether a tool nobody registered may execute (durable_ledger.policy) */
typedef enum UnregisteredTools
{
	UNREGISTERED_ALLOW,
	UNREGISTERED_WARN,
	UNREGISTERED_REFUSE
} UnregisteredTools;

extern const char *dl_divergence_name(DivergencePolicy policy);
extern bool dl_divergence_from_name(const char *name, DivergencePolicy *policy);
extern const char *dl_unregistered_name(UnregisteredTools setting);
extern bool dl_unregistered_from_name(const char *name, UnregisteredTools *setting);

/* names.c: the audit log's events (its domain durable_ledger.audit_event) */
typedef enum AuditEvent
{
	AUDIT_LEASE_ACQUIRED,
	AUDIT_LEASE_RELEASED,
	AUDIT_LEASE_BROKEN,
	AUDIT_INTENT,
	AUDIT_REPLAY,
	AUDIT_PAUSE,
	AUDIT_IN_PROGRESS,
	AUDIT_COMPLETED,
	AUDIT_LATE_COMPLETION,
	AUDIT_FAILED,
	AUDIT_LATE_FAILURE,
	AUDIT_RESOLVED,
	AUDIT_CONFLICT,
	AUDIT_TOOL_REGISTERED,
	AUDIT_TOOL_CHANGED,
	AUDIT_TOOL_RETIRED,
	AUDIT_DIVERGENCE,
	AUDIT_DIVERGENCE_RESOLVED,
	AUDIT_RUN_ABANDONED,
	AUDIT_RUN_FORKED,
	AUDIT_CARRIED,
	AUDIT_POLICY_CHANGED,
	AUDIT_PURGED,
	AUDIT_AUDIT_PURGED,
	AUDIT_SUPERSEDED_REPORT,
	AUDIT_HISTORY_CHAINED,
	AUDIT_RETRY_ALLOWED,
	AUDIT_RECONCILED,
	AUDIT_APPROVAL_REQUESTED,
	AUDIT_APPROVED,
	AUDIT_REJECTED,
	AUDIT_BUDGET_CHANGED,
	AUDIT_MODEL_CHANGED,
	DL_NEVENTS
} AuditEvent;

extern const char *dl_audit_event_name(AuditEvent event);
extern bool dl_audit_event_attended(AuditEvent event);

/* canonical.c */
extern void dl_append_canonical_args(StringInfo out, Jsonb *args);

/* identity.c: the key fields of a registered tool */
extern Jsonb *dl_identity_args(const char *tool, Jsonb *args, int nfields,
							   char *const *fields, bool *complete);

/* keys.c */
extern void dl_check_business_key(const char *business_key, bool call_id);
extern bool dl_is_call_key(const char *key);
extern void dl_derive_key(const char *run, const char *tool,
						  const char *canon, int canon_len,
						  int32 occurrence, char *hex_out);
extern char *dl_downstream_key(const char *key, bool business_key, int32 attempt);

/* call.c: what every SQL-callable function needs */
extern char *dl_required_text_arg(FunctionCallInfo fcinfo, int argno,
								  const char *argname, int max_chars);
extern char *dl_optional_text_arg(FunctionCallInfo fcinfo, int argno);
extern Jsonb *dl_required_jsonb_arg(FunctionCallInfo fcinfo, int argno,
									const char *argname);
extern Jsonb *dl_optional_jsonb_arg(FunctionCallInfo fcinfo, int argno);
extern int32 dl_optional_attempt_arg(FunctionCallInfo fcinfo, int argno);
extern int32 dl_required_attempt_arg(FunctionCallInfo fcinfo, int argno);
extern void dl_check_run_and_tool(const char *run, const char *tool);
extern void dl_check_writable(const char *function);
extern void dl_refuse_prepare(void);
extern void dl_error_older_sql(const char *sql_version);
extern TupleDesc dl_result_desc(FunctionCallInfo fcinfo);
extern void dl_spi_connect(void);
extern void dl_spi_finish(void);
extern void dl_error_no_such_attempt(const char *key, int32 attempt,
									 int32 current_attempt);
extern bool dl_interval_usecs(const Interval *span, int64 *usecs);
extern int32 dl_budget_arg(FunctionCallInfo fcinfo, int argno, const char *argname, int32 max);
extern bool dl_jsonb_equal(Jsonb *a, Jsonb *b);
extern bool dl_client_addr(Datum *addr);

/* detail.c: a small builder for audit details, a flat JSON object */
typedef struct DetailBuilder
{
	JsonbParseState *state;
} DetailBuilder;

extern void dl_detail_init(DetailBuilder *d);
extern void dl_detail_text(DetailBuilder *d, const char *name, const char *value);
extern void dl_detail_int(DetailBuilder *d, const char *name, int64 value);
extern void dl_detail_count_or_null(DetailBuilder *d, const char *name, int64 value);
extern void dl_detail_bool(DetailBuilder *d, const char *name, bool value);
extern void dl_detail_jsonb(DetailBuilder *d, const char *name, Jsonb *value);
extern Jsonb *dl_detail_finish(DetailBuilder *d);

#endif							/* DURABLE_LEDGER_COMMON_H */
