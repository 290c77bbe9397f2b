/*
 * local.c: local effects (begin_local), whose effect is a write in the
 * ledger's own database made in the same transaction.  Their intent, the
 * tool's writes and their outcome commit together or not at all, so the
 * ledger never holds one whose outcome is unknown: a transaction that began
 * one commits only once it is completed or failed, else its COMMIT fails and
 * everything it did is rolled back (docs/reference.md, "Local effects").
 *
 * The keys begun are remembered for the transaction and each is read again
 * just before it commits: whatever happened to it since (reported, or its
 * begin rolled back to a savepoint) is what the row now says.
 */
#include "postgres.h"

#include "access/xact.h"
#include "nodes/pg_list.h"
#include "utils/memutils.h"

#include "decision.h"

/* The keys of the local effects this transaction began (TopTransactionContext). */
static List *local_keys = NIL;

/* begin_local executed key in this transaction: it must be reported before commit. */
void
dl_local_begun(const char *key)
{
	MemoryContext old = MemoryContextSwitchTo(TopTransactionContext);

	local_keys = lappend(local_keys, pstrdup(key));
	MemoryContextSwitchTo(old);
}

/*
 * Whether key is a local effect still waiting for its outcome, as the row
 * says now.  A flagged one has none either: a report contradicted another,
 * and both came from this transaction (no one else can report on the row
 * while it holds it), which knows the truth and must say it once.
 */
static bool
awaits_outcome(const char *key)
{
	EffectRow	row;

	if (dl_read_key(key, &row) != KEY_FOUND || !row.local)
		return false;			/* its begin was rolled back with a savepoint */
	return row.conflict || (row.status != EFFECT_COMPLETED && row.status != EFFECT_FAILED);
}

static void
check_outcomes(void)
{
	ListCell   *cell;

	foreach(cell, local_keys)
	{
		const char *key = lfirst(cell);

		if (awaits_outcome(key))
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_TRANSACTION_STATE),
					 errmsg("local effect \"%s\" has no outcome", key),
					 errdetail("begin_local() began it in this transaction, and its intent, the tool's writes and its outcome commit together or not at all. The transaction is rolled back: nothing of it is recorded."),
					 errhint("Report its one outcome with complete_effect() or fail_effect() before COMMIT, in the same transaction block (BEGIN ... COMMIT); reports that contradict each other are no outcome.")));
	}
}

static void
local_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			check_outcomes();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			local_keys = NIL;	/* freed with TopTransactionContext */
			break;
		default:
			break;
	}
}

void
dl_local_init(void)
{
	RegisterXactCallback(local_xact_callback, NULL);
}
