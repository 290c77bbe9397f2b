/*
 * audit.c: the audit log's rows: each event's row, linked into its backend's
 * hash chain (audit_chain.c), counted (metrics.c), and notified when a
 * person attends to it.
 *
 * NOTIFY durable_ledger_attention is sent when something needs a person, or
 * a person decided it: an effect paused (an unknown outcome, a
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

#include "commands/sequence.h"
#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "commands/async.h"
#include "utils/json.h"

#include "rows.h"

#define ATTENTION_CHANNEL "durable_ledger_attention"

/*
 * Queues the notification of an audited event (audit_id: its row), when it
 * is one a person attends to.
 */
void
dl_notify_attention(AuditEvent event, int64 audit_id)
{
	StringInfoData payload;

	if (!dl_audit_event_attended(event))
		return;
	initStringInfo(&payload);
	appendStringInfoString(&payload, "{\"event\": ");
	escape_json(&payload, dl_audit_event_name(event));
	appendStringInfo(&payload, ", \"audit_id\": " INT64_FORMAT "}", audit_id);
	Async_Notify(ATTENTION_CHANNEL, payload.data);
	pfree(payload.data);
}

/* ---------- the audit log ---------- */

/*
 * Appends one event to the audit log: who (the role as after SET ROLE, the
 * session user, application, client address, backend) and when.  A
 * lease_epoch or attempt of 0 is stored as NULL.
 */
void
dl_write_audit(const char *run, const char *key, AuditEvent event, Jsonb *detail,
			   int64 lease_epoch, int32 attempt)
{
	RowWrite		w;
	Datum		addr;
	bool		has_addr;
	AuditRow	row;

	dl_note_ledger_write();
	dl_row_begin(&w, &dl_audit_table);
	has_addr = dl_client_addr(&addr);
	/* the id column's default, drawn here (the row's hash covers it) */
	row.id = nextval_internal(dl_audit_table.first_sequence, false);
	row.logged_at = GetCurrentTimestamp();
	row.run = run;
	row.key = key;
	row.event = event;
	row.detail = detail;
	row.role_name = dl_caller_role_name();
	row.session_user_name = GetUserNameFromId(GetSessionUserId(), false);
	row.application_name = application_name;
	row.client_addr = has_addr ? TextDatumGetCString(DirectFunctionCall1(network_show, addr)) : NULL;
	row.backend_pid = MyProcPid;
	row.lease_epoch = lease_epoch;
	row.attempt = attempt;
	dl_chain_audit_row(&row, RelationGetRelid(w.rel), RelationGetNamespace(w.rel));

	dl_row_set(&w, AUD_ID, Int64GetDatum(row.id));
	dl_row_set(&w, AUD_LOGGED_AT, TimestampTzGetDatum(row.logged_at));
	dl_row_set_optional(&w, AUD_RUN, run ? CStringGetTextDatum(run) : (Datum) 0, run == NULL);
	dl_row_set_optional(&w, AUD_KEY, key ? CStringGetTextDatum(key) : (Datum) 0, key == NULL);
	dl_row_set(&w, AUD_EVENT, CStringGetTextDatum(dl_audit_event_name(event)));
	dl_row_set_optional(&w, AUD_DETAIL, JsonbPGetDatum(detail), detail == NULL);
	dl_row_set(&w, AUD_ROLE_NAME, CStringGetTextDatum(row.role_name));
	dl_row_set(&w, AUD_SESSION_USER_NAME, CStringGetTextDatum(row.session_user_name));
	dl_row_set_optional(&w, AUD_APPLICATION_NAME,
				 application_name ? CStringGetTextDatum(application_name) : (Datum) 0,
				 application_name == NULL);
	dl_row_set_optional(&w, AUD_CLIENT_ADDR, addr, !has_addr);
	dl_row_set(&w, AUD_BACKEND_PID, Int32GetDatum(MyProcPid));
	dl_row_set_optional(&w, AUD_LEASE_EPOCH, Int64GetDatum(lease_epoch), lease_epoch <= 0);
	dl_row_set_optional(&w, AUD_ATTEMPT, Int32GetDatum(attempt), attempt <= 0);
	dl_row_set(&w, AUD_CHAIN, Int64GetDatum(row.chain));
	dl_row_set(&w, AUD_CHAIN_SEQ, Int64GetDatum(row.chain_seq));
	dl_row_set(&w, AUD_ROW_HASH, PointerGetDatum(row.row_hash));
	dl_row_insert(&w);
	dl_row_end(&w);
	dl_notify_attention(event, row.id);
}
