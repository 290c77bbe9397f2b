/*
 * names.c: the statuses of an effect and the settings of the tools registry
 * and the policy, as the ledger's tables spell them.
 */
#include "postgres.h"

#include "common.h"

static const char *const status_names[] = {
	[EFFECT_STARTED] = "started",
	[EFFECT_COMPLETED] = "completed",
	[EFFECT_FAILED] = "failed",
	[EFFECT_UNKNOWN] = "unknown",
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
