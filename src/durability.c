/*
 * durability.c: a transaction that wrote an intent, a completion, a failure,
 * a resolution or a conflict commits with synchronous_commit at least "on",
 * whatever the session asked for.  The setting is raised just before commit
 * (the caller could lower it again after our call), for that commit only,
 * and a stronger setting such as remote_apply is kept.
 *
 * A transaction that wrote the ledger at all cannot be prepared: the
 * durability rule needs its outcome at COMMIT.
 */
#include "postgres.h"

#include "access/xact.h"
#include "utils/guc.h"

#include "store.h"

/* Did this transaction write something that must survive a crash? */
static bool durable_write_in_xact = false;

/* Did it write the ledger at all (an audit row at least)? */
static bool ledger_write_in_xact = false;

void
dl_note_durable_write(void)
{
	durable_write_in_xact = true;
	ledger_write_in_xact = true;
}

void
dl_note_ledger_write(void)
{
	ledger_write_in_xact = true;
}

static void
raise_synchronous_commit(void)
{
	if (synchronous_commit >= SYNCHRONOUS_COMMIT_ON)
		return;
	ereport(DEBUG1,
			(errmsg_internal("durable_ledger: committing with synchronous_commit = on, since the transaction wrote the ledger")));
	(void) set_config_option("synchronous_commit", "on", PGC_USERSET, PGC_S_SESSION,
							 GUC_ACTION_LOCAL, true, 0, false);
}

static void
durability_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			if (durable_write_in_xact)
				raise_synchronous_commit();
			break;
		case XACT_EVENT_PRE_PREPARE:
			if (ledger_write_in_xact)
				dl_refuse_prepare();
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			durable_write_in_xact = false;
			ledger_write_in_xact = false;
			break;
		default:
			break;
	}
}

void
dl_durability_init(void)
{
	RegisterXactCallback(durability_xact_callback, NULL);
}
