/*
 * compat.h: the few places where PostgreSQL versions differ.
 *
 * The extension is developed and tested against PostgreSQL 15; anything that
 * changes between major versions is kept here so that supporting 16 and 17 is
 * a matter of a few #if lines in one place.
 */
#ifndef DURABLE_LEDGER_COMPAT_H
#define DURABLE_LEDGER_COMPAT_H

#include "access/heapam.h"

#if PG_VERSION_NUM < 150000
#error "durable_ledger requires PostgreSQL 15 or later"
#endif

/* PostgreSQL 16 moved varatt macros into their own header. */
#if PG_VERSION_NUM >= 160000
#include "varatt.h"
#endif

/*
 * heap_update with wait and no crosscheck; *new_index_entries says whether
 * the btree indexes need entries for the new version (not a HOT update).
 * PostgreSQL 16 reports that itself.
 */
static inline TM_Result
dl_heap_update(Relation rel, ItemPointer otid, HeapTuple tuple, CommandId cid,
			   TM_FailureData *tmfd, LockTupleMode *lockmode,
			   bool *new_index_entries)
{
	TM_Result	result;
#if PG_VERSION_NUM >= 160000
	TU_UpdateIndexes update_indexes;

	result = heap_update(rel, otid, tuple, cid, InvalidSnapshot, true, tmfd,
						 lockmode, &update_indexes);
	/* TU_Summarizing concerns BRIN only, which direct writes never keep */
	*new_index_entries = update_indexes == TU_All;
#else
	result = heap_update(rel, otid, tuple, cid, InvalidSnapshot, true, tmfd,
						 lockmode);
	*new_index_entries = !HeapTupleIsHeapOnly(tuple);
#endif
	return result;
}

#endif							/* DURABLE_LEDGER_COMPAT_H */
