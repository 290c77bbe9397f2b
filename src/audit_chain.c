/*
 * audit_chain.c: the audit log's hash chains, which make a rewritten history
 * visible.
 *
 * Every backend appends its audit rows to a chain of its own: audit_log.chain
 * (drawn from durable_ledger.audit_chain_seq at the backend's first row),
 * numbered 1, 2, 3, ... (chain_seq), each row carrying
 *
 *   row_hash = sha256(the previous row's row_hash, or 32 zero bytes for the
 *                     first row of a chain
 *                     || content, as bytes in the database's encoding)
 *
 *   content  = jsonb_build_array(id, chain, chain_seq,
 *                                logged_at in microseconds since 1970-01-01 UTC,
 *                                run, key, event, detail, role_name,
 *                                session_user_name, application_name,
 *                                client_addr::text, backend_pid, lease_epoch,
 *                                attempt)::text
 *
 * so an auditor recomputes every hash in plain SQL (docs/auditing.md).  A
 * chain per backend takes no lock and reads nothing: unrelated runs never
 * wait for each other, and a call writes what it wrote before.  The head of
 * the chain (its number, last chain_seq and hash) lives in memory and goes
 * back with a (sub)transaction that rolls back, so a chain has no holes but
 * the ones someone made.  A transaction that wrote the ledger cannot be
 * prepared (durability.c), so no row of a chain waits for a later verdict.
 * The head also counts the transaction's events, for metrics.c.
 */
#include "postgres.h"

#include "access/xact.h"
#include "commands/sequence.h"
#include "nodes/pg_list.h"
#include "utils/builtins.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/lsyscache.h"
#include "utils/memutils.h"

#include "digest.h"
#include "store.h"

#define CHAIN_HASH_LEN 32

/* microseconds from 1970-01-01 to 2000-01-01, PostgreSQL's own epoch */
#define UNIX_TO_POSTGRES_USECS \
	((int64) (POSTGRES_EPOCH_JDATE - UNIX_EPOCH_JDATE) * USECS_PER_DAY)

typedef struct ChainHead
{
	Oid			audit_relid;	/* the audit log it was drawn for */
	int64		chain;			/* 0: none drawn yet */
	int64		seq;
	uint8		hash[CHAIN_HASH_LEN];
	uint32		events[DL_NEVENTS];	/* this transaction's, added at commit (metrics.c) */
} ChainHead;

/* The head as it was before a (sub)transaction first moved it. */
typedef struct ChainUndo
{
	SubTransactionId subid;
	ChainHead	before;
} ChainUndo;

static ChainHead head;
static List *undo = NIL;		/* of ChainUndo, innermost last, in TopTransactionContext */

static void
chain_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			if (undo != NIL)
				head = ((ChainUndo *) linitial(undo))->before;
			undo = NIL;
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
			if (undo != NIL)
			{
				dl_metrics_add(head.events);
				memset(head.events, 0, sizeof(head.events));
			}
			undo = NIL;
			break;
		default:
			break;
	}
}

static void
chain_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
					   SubTransactionId parentSubid, void *arg)
{
	ChainUndo  *top;

	if (undo == NIL)
		return;
	top = llast(undo);
	if (top->subid != mySubid)
		return;
	if (event == SUBXACT_EVENT_ABORT_SUB)
	{
		head = top->before;
		undo = list_delete_last(undo);
	}
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
	{
		/* the parent keeps the older state, if it moved the head itself */
		if (list_length(undo) > 1 &&
			((ChainUndo *) list_nth(undo, list_length(undo) - 2))->subid == parentSubid)
			undo = list_delete_last(undo);
		else
			top->subid = parentSubid;
	}
}

void
dl_audit_chain_init(void)
{
	RegisterXactCallback(chain_xact_callback, NULL);
	RegisterSubXactCallback(chain_subxact_callback, NULL);
}

/* Remembers the head before this (sub)transaction first moves it. */
static void
note_undo(void)
{
	SubTransactionId subid = GetCurrentSubTransactionId();
	ChainUndo  *entry;
	MemoryContext old;

	if (undo != NIL && ((ChainUndo *) llast(undo))->subid == subid)
		return;
	old = MemoryContextSwitchTo(TopTransactionContext);
	entry = palloc(sizeof(ChainUndo));
	entry->subid = subid;
	entry->before = head;
	undo = lappend(undo, entry);
	MemoryContextSwitchTo(old);
}

/*
 * A string as escape_json() writes it, the same bytes: a string with nothing
 * to escape (a key, a run, a role: almost every one) is copied whole instead
 * of a byte at a time.
 */
static void
append_text_or_null(StringInfo buf, const char *s)
{
	const char *p;

	if (s == NULL)
	{
		appendStringInfoString(buf, "null");
		return;
	}
	for (p = s; *p != '\0'; p++)
		if ((unsigned char) *p < ' ' || *p == '"' || *p == '\\')
		{
			escape_json(buf, s);
			return;
		}
	appendStringInfoChar(buf, '"');
	appendBinaryStringInfo(buf, s, p - s);
	appendStringInfoChar(buf, '"');
}

/* value as INT64_FORMAT writes it, without a printf */
static void
append_int(StringInfo buf, int64 value)
{
	char		digits[MAXINT8LEN + 1];

	appendBinaryStringInfo(buf, digits, pg_lltoa(value, digits));
}

static void
append_int_or_null(StringInfo buf, int64 value, bool isnull)
{
	if (isnull)
		appendStringInfoString(buf, "null");
	else
		append_int(buf, value);
}

/* The row's content: the text of jsonb_build_array(...) (see above). */
static void
append_content(StringInfo buf, const AuditRow *row)
{
	appendStringInfoChar(buf, '[');
	append_int(buf, row->id);
	appendStringInfoString(buf, ", ");
	append_int(buf, row->chain);
	appendStringInfoString(buf, ", ");
	append_int(buf, row->chain_seq);
	appendStringInfoString(buf, ", ");
	append_int(buf, (int64) row->logged_at + UNIX_TO_POSTGRES_USECS);
	appendStringInfoString(buf, ", ");
	append_text_or_null(buf, row->run);
	appendStringInfoString(buf, ", ");
	append_text_or_null(buf, row->key);
	appendStringInfoString(buf, ", ");
	append_text_or_null(buf, dl_audit_event_name(row->event));
	appendStringInfoString(buf, ", ");
	if (row->detail == NULL)
		appendStringInfoString(buf, "null");
	else
		(void) JsonbToCString(buf, &row->detail->root, VARSIZE(row->detail));
	appendStringInfoString(buf, ", ");
	append_text_or_null(buf, row->role_name);
	appendStringInfoString(buf, ", ");
	append_text_or_null(buf, row->session_user_name);
	appendStringInfoString(buf, ", ");
	append_text_or_null(buf, row->application_name);
	appendStringInfoString(buf, ", ");
	append_text_or_null(buf, row->client_addr);
	appendStringInfoString(buf, ", ");
	append_int(buf, row->backend_pid);
	appendStringInfoString(buf, ", ");
	append_int_or_null(buf, row->lease_epoch, row->lease_epoch <= 0);
	appendStringInfoString(buf, ", ");
	append_int_or_null(buf, row->attempt, row->attempt <= 0);
	appendStringInfoChar(buf, ']');
}

/*
 * Links row into this backend's chain: sets its chain, chain_seq and
 * row_hash (a bytea).  audit_relid and namespace: the audit log's, whose
 * sequence of chains is drawn from.
 */
void
dl_chain_audit_row(AuditRow *row, Oid audit_relid, Oid namespace)
{
	StringInfoData content;
	uint8		hash[CHAIN_HASH_LEN];
	bytea	   *result;

	note_undo();
	if (head.chain == 0 || head.audit_relid != audit_relid)
	{
		Oid			seq = get_relname_relid("audit_chain_seq", namespace);
		uint32		events[DL_NEVENTS];

		if (!OidIsValid(seq))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("durable_ledger.audit_chain_seq is missing")));
		memcpy(events, head.events, sizeof(events));
		memset(&head, 0, sizeof(head));
		memcpy(head.events, events, sizeof(events));
		head.audit_relid = audit_relid;
		head.chain = nextval_internal(seq, false);
	}
	row->chain = head.chain;
	row->chain_seq = head.seq + 1;

	initStringInfo(&content);
	append_content(&content, row);

	/* the bytes as stored: no conversion (a SQL_ASCII database may hold any) */
	dl_sha256_begin();
	dl_sha256_add(head.hash, CHAIN_HASH_LEN);
	dl_sha256_add(content.data, content.len);
	dl_sha256_end(hash);

	result = palloc(VARHDRSZ + CHAIN_HASH_LEN);
	SET_VARSIZE(result, VARHDRSZ + CHAIN_HASH_LEN);
	memcpy(VARDATA(result), hash, CHAIN_HASH_LEN);
	row->row_hash = result;

	head.seq = row->chain_seq;
	memcpy(head.hash, hash, CHAIN_HASH_LEN);
	head.events[row->event]++;
}
