/*
 * attention.c: NOTIFY durable_ledger_attention when something needs a
 * person, or a person decided it: an effect paused (an unknown outcome, a
 * conflict, a divergence waiting), a report flagged as contradicting, a call
 * diverging, a resolution, a divergence's verdict.  Sent with the
 * transaction's commit, as every NOTIFY is, so a console or a chat bot that
 * LISTENs reacts at once and never hears of what was rolled back.
 *
 * The payload is a small JSON object: {"event", "run", "key", "attempt"}
 * (attempt absent when the event concerns none); the audit log has the rest.
 */
#include "postgres.h"

#include "commands/async.h"
#include "lib/stringinfo.h"
#include "utils/json.h"

#include "store.h"

#define ATTENTION_CHANNEL "durable_ledger_attention"

static bool
needs_attention(const char *event)
{
	static const char *const events[] = {
		"pause", "conflict", "divergence", "resolved", "divergence_resolved"
	};
	int			i;

	for (i = 0; i < lengthof(events); i++)
		if (strcmp(event, events[i]) == 0)
			return true;
	return false;
}

/* Queues the notification of an audited event, when it is one a person attends to. */
void
dl_notify_attention(const char *event, const char *run, const char *key, int32 attempt)
{
	StringInfoData payload;

	if (!needs_attention(event))
		return;
	initStringInfo(&payload);
	appendStringInfoString(&payload, "{\"event\": ");
	escape_json(&payload, event);
	appendStringInfoString(&payload, ", \"run\": ");
	if (run != NULL)
		escape_json(&payload, run);
	else
		appendStringInfoString(&payload, "null");
	appendStringInfoString(&payload, ", \"key\": ");
	if (key != NULL)
		escape_json(&payload, key);
	else
		appendStringInfoString(&payload, "null");
	if (attempt > 0)
		appendStringInfo(&payload, ", \"attempt\": %d", attempt);
	appendStringInfoChar(&payload, '}');
	Async_Notify(ATTENTION_CHANNEL, payload.data);
	pfree(payload.data);
}
