/*
 * older_funcs.c: the C symbols of older SQL declarations of the extension.
 *
 * Each SQL version binds its functions to symbols of its own (dl_..._1_1).
 * When this library is installed but a database still has the objects of an
 * older version (ALTER EXTENSION ... UPDATE not run yet), those objects call
 * the symbols below, which refuse clearly and write nothing: this library's
 * rules need the newer tables.
 */
#include "postgres.h"

#include "fmgr.h"

#include "common.h"

/* The functions of durable_ledger 1.0 that this library implements anew. */
#define REFUSED_1_0(name) \
	PG_FUNCTION_INFO_V1(name); \
	Datum name(PG_FUNCTION_ARGS) { dl_error_older_sql(NULL); PG_RETURN_NULL(); }

REFUSED_1_0(dl_begin_effect)
REFUSED_1_0(dl_complete_effect)
REFUSED_1_0(dl_fail_effect)
REFUSED_1_0(dl_resolve_effect)
REFUSED_1_0(dl_effect_status)
REFUSED_1_0(dl_acquire_run)
REFUSED_1_0(dl_release_run)
REFUSED_1_0(dl_break_lease)

/* The functions of durable_ledger 1.1 that this library implements anew. */
#define REFUSED_1_1(name) REFUSED_1_0(name)

REFUSED_1_1(dl_begin_effect_1_1)
REFUSED_1_1(dl_acquire_run_1_1)
REFUSED_1_1(dl_take_lease_1_1)
REFUSED_1_1(dl_complete_effect_1_1)
REFUSED_1_1(dl_fail_effect_1_1)
REFUSED_1_1(dl_resolve_effect_1_1)
REFUSED_1_1(dl_renew_lease_1_1)

/* The functions of durable_ledger 1.2 that this library implements anew. */
#define REFUSED_1_2(name) REFUSED_1_0(name)

REFUSED_1_2(dl_begin_effect_1_2)
REFUSED_1_2(dl_begin_recorded_1_2)
REFUSED_1_2(dl_complete_effect_1_2)
REFUSED_1_2(dl_fail_effect_1_2)
REFUSED_1_2(dl_set_unregistered_tools_1_2)
REFUSED_1_2(dl_purge_audit_1_2)
REFUSED_1_2(dl_purge_settled_1_2)
REFUSED_1_2(dl_fork_run_1_2)
REFUSED_1_2(dl_take_lease_1_2)
REFUSED_1_2(dl_resolve_effect_1_2)
REFUSED_1_2(dl_resolve_divergence_1_2)
