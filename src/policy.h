/*
 * policy.h: the policy layer, what a run's calls may execute: the tools
 * registry and its setting (tools.c), divergence of a later attempt's calls
 * from its run's earlier attempts (divergence.c).
 *
 * Uses lease.h, store.h and common.h; the entry points use it.  Functions
 * that read or write the ledger need an open SPI connection.
 */
#ifndef DURABLE_LEDGER_POLICY_H
#define DURABLE_LEDGER_POLICY_H

#include "lease.h"

/* tools.c */
typedef struct ToolRules
{
	bool		registered;
	ToolRow		row;			/* when registered */
} ToolRules;

extern bool dl_tool_rules(const char *tool, ToolRules *rules);
extern Jsonb *dl_identity_of_call(const ToolRules *rules, Jsonb *args, bool *complete);
extern bool dl_policy_changed_meanwhile(const ToolRules *rules);
extern bool dl_may_execute(const char *tool, const ToolRules *rules);
extern void dl_warn_unregistered(const char *tool);
extern void dl_check_may_redo(const char *tool, const ToolRules *rules);
extern DivergencePolicy dl_divergence_policy(const ToolRules *rules, bool *waited);
extern bool dl_divergence_judged(const ToolRules *rules, bool recorded);
extern void dl_tool_rules_now(const char *tool, ToolRules *rules);
extern bool dl_needs_approval(const ToolRules *rules, Jsonb *args);
extern void dl_check_approval_condition(JsonPath *condition);

/* budgets.c */
typedef struct BudgetCheck
{
	bool		counted;		/* the tool has a budget: an execution is counted */
	bool		stopped;		/* a budget stops the call */
	const char *budget;			/* which: executions, window, attempts */
	int32		limit;			/* ... its limit */
	int32		count;			/* ... and how far the run is */
	char	   *reason;			/* the pause's */
	TimestampTz now;
	BudgetCounter counter;		/* the run's counter of the tool, as read (counted) */
	int32		max_executions; /* what applies to the run: 0, none */
	int32		max_in_window;
	Interval	window;
} BudgetCheck;

extern bool dl_budget_stops(const CallLease *lease, const char *tool, const ToolRules *rules,
							BudgetCheck *check);
extern void dl_budget_count(const CallLease *lease, const char *tool, const BudgetCheck *check);
extern void dl_budget_pause(const CallLease *lease, const char *tool, const char *key,
							Jsonb *args, const BudgetCheck *check);

/* models.c */
extern void dl_note_attempt_model(const CallLease *lease, Jsonb *meta);

/* divergence.c */
typedef struct ReplayProgress
{
	bool		later;			/* a later attempt of the run (epoch > 1) */
	bool		watched;		/* the epoch keeps this tool's replay progress */
	bool		judged;			/* ... and judges this call by it */
	const CallLease *lease;
	const char *tool;
	DivergencePolicy policy;
	EpochCounter replayed;		/* how many earlier effects of tool this epoch replayed */
	EpochCounter earlier;		/* 1 + how many there are; 0: not counted yet */
	EpochCounter unwatched;		/* 1: the epoch called the tool while it was unwatched */
	EpochCounter keyed;			/* 1 + how many earlier effects have call ids' keys; 0: not counted */
	int32		call_ids;		/* (as read with the earlier effects) */
	bool		keep_earlier;	/* counted by this call: dl_progress_keep keeps it */
	bool		keep_unwatched; /* ... found unwatched by this call */
	List	   *earlier_effects;	/* when read */
} ReplayProgress;

typedef enum DriftKind
{
	DRIFT_NONE,					/* execute */
	DRIFT_WARN,					/* a new divergence, executed with a warning */
	DRIFT_NEW,					/* a new divergence, recorded to wait for a person */
	DRIFT_WAITING,				/* recorded before, waiting for a person's verdict */
	DRIFT_SAME					/* a person said it is same_as: replay that */
} DriftKind;

typedef struct Drift
{
	DriftKind	kind;
	char	   *candidate_key;	/* the earlier effect it may duplicate */
	char	   *same_as;		/* DRIFT_SAME */
	int32		replayed;		/* DRIFT_WARN, DRIFT_NEW: earlier effects replayed, */
	int32		earlier;		/* ... of how many */
	bool		same_args;		/* candidate_key has the call's identity (not replay progress) */
	bool		call_id;		/* ... and the call is a new call id */
} Drift;

extern bool dl_progress_start(ReplayProgress *progress, const CallLease *lease,
							  const char *tool, const ToolRules *rules, bool recorded);
extern void dl_judge_drift(ReplayProgress *progress, const char *key, const ToolRules *rules,
						   const char *canon, Drift *drift);
extern bool dl_judge_business_key(ReplayProgress *progress, const CallLease *lease,
								  const char *tool, const ToolRules *rules, const char *key,
								  const char *canon, bool call_id, Drift *drift);
extern Jsonb *dl_divergence_detail(const ReplayProgress *progress, const Drift *drift);
extern void dl_warn_divergence(const ReplayProgress *progress, const Drift *drift);
extern void dl_progress_replayed(ReplayProgress *progress, const char *key);
extern void dl_progress_redone(ReplayProgress *progress, const char *key);
extern void dl_progress_keep(ReplayProgress *progress);

#endif							/* DURABLE_LEDGER_POLICY_H */
