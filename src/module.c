/*
 * module.c: loading the module.  Each part registers its own settings and
 * transaction callbacks.
 */
#include "postgres.h"

#include "fmgr.h"
#include "utils/guc.h"

#include "decision.h"

PG_MODULE_MAGIC;

extern void dl_drop_guard_init(void);
void		_PG_init(void);

void
_PG_init(void)
{
	dl_tables_init();
	dl_index_plans_init();
	dl_cache_init();
	dl_audit_chain_init();
	dl_metrics_init();
	dl_durability_init();
	dl_budgets_init();
	dl_lease_init();
	dl_runlock_init();
	dl_drop_guard_init();
	dl_local_init();
	MarkGUCPrefixReserved("durable_ledger");
}
