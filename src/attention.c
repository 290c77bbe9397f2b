/*
 * attention.c: NOTIFY durable_ledger_attention when something needs a
 * person, or a person decided it: an effect paused (an unknown outcome, a
 * conflict, a divergence waiting), a report flagged as contradicting, a call
 * diverging, a resolution, a divergence's verdict.  Sent with the
 * transaction's commit, as every NOTIFY is, so a console or a chat bot that
 * LISTENs reacts at once and never hears of what was rolled back.
 *
 * Anyone who can connect may LISTEN (PostgreSQL checks no privilege), and
 * anyone may pg_notify() on any channel: so the payload tells only what is
 * safe to show anyone, the kind of event and the id of the audit row that
 * records it, {"event": "pause", "audit_id": 1234} (since 1.3; 1.2 named the
 * run, the key and the attempt).  A listener reads that row with its own
 * rights (an auditor's), and takes it, never the notification, as the fact:
 * a forged notification names a row that is not there, or not that event.
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

/*
 * Queues the notification of an audited event (audit_id: its row), when it
 * is one a person attends to.
 */
void
dl_notify_attention(const char *event, int64 audit_id)
{
	StringInfoData payload;

	if (!needs_attention(event))
		return;
	initStringInfo(&payload);
	appendStringInfoString(&payload, "{\"event\": ");
	escape_json(&payload, event);
	appendStringInfo(&payload, ", \"audit_id\": " INT64_FORMAT "}", audit_id);
	Async_Notify(ATTENTION_CHANNEL, payload.data);
	pfree(payload.data);
}
