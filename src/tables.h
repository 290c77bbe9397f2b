/*
 * tables.h: the ledger's tables as the store layer knows them: which columns
 * it reads and writes, by name, and where they are.  For the store's own
 * files (reader.c, rows.c, write_*.c, audit.c); the other layers use store.h.
 */
#ifndef DURABLE_LEDGER_TABLES_H
#define DURABLE_LEDGER_TABLES_H

#include "executor/tuptable.h"
#include "utils/relcache.h"

#include "store.h"

typedef struct Column
{
	const char *name;
	Oid			type;			/* its base type */
} Column;

typedef struct LedgerTable
{
	const char *name;
	const Column *columns;
	int			ncolumns;
	Oid			relid;			/* InvalidOid: look it up again */
	uint64		learned;		/* how many times it was looked up: a new version */
	AttrNumber *attnums;		/* columns[i] is attribute attnums[i] */
	int			ndomains;		/* attributes of a domain type, checked as SQL would */
	AttrNumber *domain_attnums;
	Oid		   *domain_types;
	void	  **domain_checks;	/* domain_check()'s cache, one per attribute */
	Oid			first_sequence; /* the sequence its first column's default draws from */
	MemoryContext cxt;
} LedgerTable;

enum
{
	EFF_KEY, EFF_RUN, EFF_TOOL, EFF_ARGS, EFF_BUSINESS_KEY, EFF_OCCURRENCE,
	EFF_ATTEMPT, EFF_STATUS, EFF_RESULT, EFF_ERROR, EFF_META, EFF_LEASE_EPOCH,
	EFF_HOLDER_PID, EFF_CREATED_AT, EFF_COMPLETED_AT, EFF_RESOLVED_BY,
	EFF_RESOLUTION_NOTE, EFF_CONFLICT, EFF_FORKED_FROM, EFF_SAFE_TO_REDO, EFF_EXECUTE_AGAIN,
	EFF_LOCAL, EFF_APPROVAL, EFF_APPROVER, EFF_APPROVAL_NOTE,
	EFF_NCOLUMNS
};

enum
{
	UNS_CREATED_AT, UNS_KEY, UNS_NCOLUMNS
};

enum
{
	AUD_ID, AUD_LOGGED_AT, AUD_RUN, AUD_KEY, AUD_EVENT, AUD_DETAIL, AUD_ROLE_NAME,
	AUD_SESSION_USER_NAME, AUD_APPLICATION_NAME, AUD_CLIENT_ADDR, AUD_BACKEND_PID,
	AUD_LEASE_EPOCH, AUD_ATTEMPT, AUD_CHAIN, AUD_CHAIN_SEQ, AUD_ROW_HASH, AUD_NCOLUMNS
};

enum
{
	RUN_RUN, RUN_EPOCHS, RUN_LOCK_KEY, RUN_HOLDER_PID, RUN_HOLDER_ROLE,
	RUN_HOLDER_APPLICATION_NAME, RUN_HOLDER_CLIENT_ADDR, RUN_ACQUIRED_AT,
	RUN_RELEASED_AT, RUN_CREATED_AT, RUN_LEASE_KIND, RUN_ABANDONED_AT, RUN_ABANDONED_BY,
	RUN_ABANDON_NOTE, RUN_FORKED_FROM, RUN_FORKED_UP_TO, RUN_MAX_ATTEMPTS, RUN_NCOLUMNS
};

enum
{
	PAST_KEY, PAST_ATTEMPT, PAST_RUN, PAST_LEASE_EPOCH, PAST_HOLDER_PID, PAST_STATUS,
	PAST_ERROR, PAST_META, PAST_CREATED_AT, PAST_COMPLETED_AT, PAST_RESOLVED_BY,
	PAST_RESOLUTION_NOTE, PAST_REPLACED_AT, PAST_ARGS, PAST_NCOLUMNS
};

extern LedgerTable dl_effects_table;
extern LedgerTable dl_unsettled_table;
extern LedgerTable dl_audit_table;
extern LedgerTable dl_runs_table;
extern LedgerTable dl_past_table;
extern LedgerTable dl_token_table;
extern LedgerTable dl_calls_table;
extern LedgerTable dl_tools_table;
extern LedgerTable dl_divergences_table;
extern LedgerTable dl_policy_table;
extern LedgerTable dl_budgets_table;
extern LedgerTable dl_models_table;

enum
{
	TOK_RUN, TOK_EPOCH, TOK_TOKEN_SHA256, TOK_HOLDER, TOK_TTL, TOK_TAKEN_AT,
	TOK_EXPIRES_AT, TOK_RELEASED_AT, TOK_NCOLUMNS
};

enum
{
	CALLS_RUN, CALLS_EPOCH, CALLS_CALL, CALLS_CALLS, CALLS_NCOLUMNS
};

enum
{
	TOOL_TOOL, TOOL_SIDE_EFFECTING, TOOL_DIVERGENCE, TOOL_KEY_FIELDS, TOOL_NOTE,
	TOOL_REGISTERED_BY, TOOL_REGISTERED_AT, TOOL_CHANGED_BY, TOOL_CHANGED_AT,
	TOOL_RETIRED_BY, TOOL_RETIRED_AT, TOOL_RECONCILE_GRACE, TOOL_APPROVAL,
	TOOL_MAX_EXECUTIONS, TOOL_MAX_IN_WINDOW, TOOL_BUDGET_WINDOW, TOOL_NCOLUMNS
};

enum
{
	POL_SINGLETON, POL_UNREGISTERED_TOOLS, POL_CHANGED_BY, POL_CHANGED_AT, POL_NOTE,
	POL_UNREGISTERED_DIVERGENCE, POL_MAX_RUN_ATTEMPTS, POL_NCOLUMNS
};

enum
{
	DIV_KEY, DIV_RUN, DIV_LEASE_EPOCH, DIV_TOOL, DIV_ARGS, DIV_OCCURRENCE,
	DIV_CANDIDATE_KEY, DIV_DETECTED_AT, DIV_VERDICT, DIV_SAME_AS, DIV_RESOLVED_BY,
	DIV_RESOLVED_AT, DIV_RESOLUTION_NOTE, DIV_NCOLUMNS
};

enum
{
	BUD_RUN, BUD_TOOL, BUD_EXECUTIONS, BUD_RECENT, BUD_MAX_EXECUTIONS, BUD_MAX_IN_WINDOW,
	BUD_PAUSED_AT, BUD_PAUSED_KEY, BUD_PAUSED_ARGS, BUD_PAUSED_EPOCH, BUD_PAUSED_REASON,
	BUD_PAUSED_BUDGET, BUD_NCOLUMNS
};

enum
{
	MOD_RUN, MOD_LEASE_EPOCH, MOD_MODEL, MOD_CHANGED_FROM, MOD_RECORDED_AT, MOD_NCOLUMNS
};

extern Relation dl_open_table(LedgerTable *t, LOCKMODE lockmode);
extern void dl_check_domains(LedgerTable *t, TupleTableSlot *slot, Bitmapset *only);
extern void dl_effect_row_from_slot(TupleTableSlot *slot, EffectRow *row);
extern void dl_tool_row_from_slot(TupleTableSlot *slot, ToolRow *row);
extern void dl_divergence_row_from_slot(TupleTableSlot *slot, DivergenceRow *row);

#endif							/* DURABLE_LEDGER_TABLES_H */
