/*
 * names.c: the statuses of an effect, the settings of the tools registry
 * and the policy, and the audit log's events, as the ledger's tables spell
 * them.
 */
#include "postgres.h"

#include "common.h"

static const char *const status_names[] = {
	[EFFECT_STARTED] = "started",
	[EFFECT_COMPLETED] = "completed",
	[EFFECT_FAILED] = "failed",
	[EFFECT_UNKNOWN] = "unknown",
	[EFFECT_AWAITING_APPROVAL] = "awaiting_approval",
	[EFFECT_APPROVED] = "approved",
};

static const char *const divergence_names[] = {
	[DIVERGENCE_OFF] = "off",
	[DIVERGENCE_WARN] = "warn",
	[DIVERGENCE_PAUSE] = "pause",
};

static const char *const unregistered_names[] = {
	[UNREGISTERED_ALLOW] = "allow",
	[UNREGISTERED_WARN] = "warn",
	[UNREGISTERED_REFUSE] = "refuse",
};

/* name's index in names, or -1 */
static int
name_index(const char *const *names, int n, const char *name)
{
	int			i;

	for (i = 0; i < n; i++)
		if (strcmp(name, names[i]) == 0)
			return i;
	return -1;
}

const char *
dl_status_name(EffectStatus status)
{
	return status_names[status];
}

EffectStatus
dl_status_from_name(const char *name)
{
	int			i = name_index(status_names, lengthof(status_names), name);

	if (i < 0)
		elog(ERROR, "unrecognized effect status \"%s\"", name);
	return (EffectStatus) i;
}

const char *
dl_divergence_name(DivergencePolicy policy)
{
	return divergence_names[policy];
}

/* False when name is not a divergence policy. */
bool
dl_divergence_from_name(const char *name, DivergencePolicy *policy)
{
	int			i = name_index(divergence_names, lengthof(divergence_names), name);

	if (i >= 0)
		*policy = (DivergencePolicy) i;
	return i >= 0;
}

const char *
dl_unregistered_name(UnregisteredTools setting)
{
	return unregistered_names[setting];
}

/* False when name is not a setting for unregistered tools. */
bool
dl_unregistered_from_name(const char *name, UnregisteredTools *setting)
{
	int			i = name_index(unregistered_names, lengthof(unregistered_names), name);

	if (i >= 0)
		*setting = (UnregisteredTools) i;
	return i >= 0;
}

/* The audit log's events: each one's name, and whether a person attends to it (NOTIFY). */
static const struct
{
	const char *name;
	bool		attended;
}			audit_events[DL_NEVENTS] = {
	[AUDIT_LEASE_ACQUIRED] = {"lease_acquired", false},
	[AUDIT_LEASE_RELEASED] = {"lease_released", false},
	[AUDIT_LEASE_BROKEN] = {"lease_broken", false},
	[AUDIT_INTENT] = {"intent", false},
	[AUDIT_REPLAY] = {"replay", false},
	[AUDIT_PAUSE] = {"pause", true},
	[AUDIT_IN_PROGRESS] = {"in_progress", false},
	[AUDIT_COMPLETED] = {"completed", false},
	[AUDIT_LATE_COMPLETION] = {"late_completion", false},
	[AUDIT_FAILED] = {"failed", false},
	[AUDIT_LATE_FAILURE] = {"late_failure", false},
	[AUDIT_RESOLVED] = {"resolved", true},
	[AUDIT_CONFLICT] = {"conflict", true},
	[AUDIT_TOOL_REGISTERED] = {"tool_registered", false},
	[AUDIT_TOOL_CHANGED] = {"tool_changed", false},
	[AUDIT_TOOL_RETIRED] = {"tool_retired", false},
	[AUDIT_DIVERGENCE] = {"divergence", true},
	[AUDIT_DIVERGENCE_RESOLVED] = {"divergence_resolved", true},
	[AUDIT_RUN_ABANDONED] = {"run_abandoned", false},
	[AUDIT_RUN_FORKED] = {"run_forked", false},
	[AUDIT_CARRIED] = {"carried", false},
	[AUDIT_POLICY_CHANGED] = {"policy_changed", false},
	[AUDIT_PURGED] = {"purged", false},
	[AUDIT_AUDIT_PURGED] = {"audit_purged", false},
	[AUDIT_SUPERSEDED_REPORT] = {"superseded_report", false},
	[AUDIT_HISTORY_CHAINED] = {"history_chained", false},
	[AUDIT_RETRY_ALLOWED] = {"retry_allowed", true},
	[AUDIT_RECONCILED] = {"reconciled", true},	/* a pause a person was told of is settled */
	[AUDIT_APPROVAL_REQUESTED] = {"approval_requested", true},
	[AUDIT_APPROVED] = {"approved", true},	/* the run may go on */
	[AUDIT_REJECTED] = {"rejected", true},
	[AUDIT_BUDGET_CHANGED] = {"budget_changed", true},
	[AUDIT_MODEL_CHANGED] = {"model_changed", false},
};

const char *
dl_audit_event_name(AuditEvent event)
{
	return audit_events[event].name;
}

/* Whether a person attends to event: audit.c notifies a listener of it. */
bool
dl_audit_event_attended(AuditEvent event)
{
	return audit_events[event].attended;
}
