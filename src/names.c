/*
 * names.c: the statuses of an effect, as the ledger's tables spell them.
 */
#include "postgres.h"

#include "common.h"

static const char *const status_names[] = {
	[EFFECT_STARTED] = "started",
	[EFFECT_COMPLETED] = "completed",
	[EFFECT_FAILED] = "failed",
	[EFFECT_UNKNOWN] = "unknown",
};

const char *
dl_status_name(EffectStatus status)
{
	return status_names[status];
}

EffectStatus
dl_status_from_name(const char *name)
{
	int			i;

	for (i = 0; i < lengthof(status_names); i++)
		if (strcmp(name, status_names[i]) == 0)
			return (EffectStatus) i;
	elog(ERROR, "unrecognized effect status \"%s\"", name);
	return EFFECT_UNKNOWN;		/* keep compiler quiet */
}
