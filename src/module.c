/*
 * module.c: loading the module, its settings, and the transaction callbacks.
 *
 * Durability: a transaction that wrote an intent, a completion, a failure, a
 * resolution or a conflict commits with synchronous_commit at least "on",
 * whatever the session asked for.  The setting is raised just before commit
 * (the caller could lower it again after our call), for that commit only, and
 * a stronger setting such as remote_apply is kept.
 */
#include "postgres.h"

#include "access/xact.h"
#include "utils/guc.h"

#include "durable_ledger.h"

PG_MODULE_MAGIC;

void		_PG_init(void);

bool		dl_allow_drop = false;
int			dl_max_leases_per_session = 64;

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
ledger_xact_callback(XactEvent event, void *arg)
{
	switch (event)
	{
		case XACT_EVENT_PRE_COMMIT:
			if (durable_write_in_xact)
				raise_synchronous_commit();
			break;
		case XACT_EVENT_PRE_PREPARE:
			if (ledger_write_in_xact || dl_lease_touched_in_xact())
				ereport(ERROR,
						(errcode(ERRCODE_FEATURE_NOT_SUPPORTED),
						 errmsg("cannot PREPARE a transaction that used the ledger"),
						 errdetail("The ledger's occurrence counters and durability rules need the transaction's outcome at COMMIT.")));
			break;
		case XACT_EVENT_COMMIT:
		case XACT_EVENT_PARALLEL_COMMIT:
		case XACT_EVENT_PREPARE:
			durable_write_in_xact = false;
			ledger_write_in_xact = false;
			dl_lease_xact_callback(true);
			break;
		case XACT_EVENT_ABORT:
		case XACT_EVENT_PARALLEL_ABORT:
			durable_write_in_xact = false;
			ledger_write_in_xact = false;
			dl_lease_xact_callback(false);
			break;
		default:
			break;
	}
}

static void
ledger_subxact_callback(SubXactEvent event, SubTransactionId mySubid,
						SubTransactionId parentSubid, void *arg)
{
	if (event == SUBXACT_EVENT_ABORT_SUB)
		dl_lease_subxact_abort(mySubid);
	else if (event == SUBXACT_EVENT_COMMIT_SUB)
		dl_lease_subxact_commit(mySubid, parentSubid);
}

void
_PG_init(void)
{
	DefineCustomBoolVariable("durable_ledger.allow_drop",
							 "Allows DROP EXTENSION durable_ledger while the ledger holds effects.",
							 "The ledger is safety-critical data; dropping it loses every record of which side effects already happened.",
							 &dl_allow_drop,
							 false,
							 PGC_USERSET,
							 0,
							 NULL, NULL, NULL);

	DefineCustomIntVariable("durable_ledger.max_leases_per_session",
							"The most run leases one session may hold at once.",
							"Each lease is a lock in the shared lock table; a full table makes new connections fail.",
							&dl_max_leases_per_session,
							64,
							1,
							10000,
							PGC_SUSET,
							0,
							NULL, NULL, NULL);

	MarkGUCPrefixReserved("durable_ledger");

	RegisterXactCallback(ledger_xact_callback, NULL);
	RegisterSubXactCallback(ledger_subxact_callback, NULL);
}
