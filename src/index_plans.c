/*
 * index_plans.c: what a write of a ledger table needs to know of the table's
 * indexes, learned once by the backend and kept until the table or one of
 * its indexes changes.
 *
 * ExecOpenIndices, on every write, lists the table's indexes, locks each one
 * and builds its IndexInfo from the index's relcache entry (the expressions
 * and predicate copied out of it).  Here a backend learns that once per
 * table -- the indexes' OIDs and their IndexInfo, a plan -- a transaction
 * locks the indexes at its first write of the table, and every write opens
 * them and gets its own copy of each IndexInfo in its own executor state.
 * What makes this safe, each a defect of an earlier per-backend cache
 * (bench/README.md, "CPU per pair"):
 *
 * - Nothing compiled is kept: a write's copy starts without expression or
 *   predicate states and without the access method's cache, so each write
 *   compiles its own in its own EState, as ExecOpenIndices' caller does.  A
 *   function of an index expression replaced, a domain's new constraint, a
 *   whole-row reference: each write sees them as a new statement would.
 * - A write's copy shares no memory with the plan (its expression and
 *   predicate trees and arrays are copied too): a write in progress (one
 *   around a trigger that writes the same table) never reads what a later
 *   write freed.
 * - A plan is learned in a memory context of its own and kept only when
 *   complete: an error while learning (out of memory, an index that cannot be
 *   opened) leaves no half-built plan (the context is the transaction's until
 *   then, so the error frees it).
 * - A plan is what the relcache says, and is kept as long as the relcache's
 *   entries: a relcache invalidation of the table or of one of its indexes
 *   (from this session or another, or of all of them on a cache reset; also
 *   one that arrives while the plan is learned) makes it stale, and the next
 *   write of the table frees it and learns a new one.  Another session's
 *   change reaches this one the way PostgreSQL's own relcache learns it: when
 *   a transaction locks the table, before its first write opens the indexes.
 * - The indexes are locked (RowExclusiveLock, as ExecOpenIndices locks them)
 *   by each transaction's first write of the table, again after a
 *   subtransaction that took the locks rolled back, and opened without a
 *   lock by the writes after it.
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/xact.h"
#include "catalog/index.h"
#include "storage/lmgr.h"
#include "storage/proc.h"
#include "utils/inval.h"
#include "utils/memutils.h"
#include "utils/rel.h"

#include "rows.h"

typedef struct IndexPlan
{
	MemoryContext cxt;			/* holds the plan */
	Oid			relid;			/* the table */
	bool		stale;			/* the table or an index changed: learn again */
	int			nindexes;
	Oid		   *index_oids;		/* as RelationGetIndexList orders them */
	IndexInfo **infos;			/* BuildIndexInfo's, never given to the executor */
	LocalTransactionId locked_lxid; /* the transaction that holds their locks */
	SubTransactionId locked_in; /* its subtransaction that took them */
} IndexPlan;

static List *plans = NIL;		/* in TopMemoryContext */

/* relcache invalidations seen, so that learning notices one during it */
static uint64 invalidations = 0;

static void
relcache_changed(Datum arg, Oid relid)
{
	ListCell   *lc;

	invalidations++;
	foreach(lc, plans)
	{
		IndexPlan  *plan = lfirst(lc);
		int			i;

		if (!OidIsValid(relid) || plan->relid == relid)
			plan->stale = true;
		for (i = 0; i < plan->nindexes; i++)
			if (plan->index_oids[i] == relid)
				plan->stale = true;
	}
}

static void
subxact_changed(SubXactEvent event, SubTransactionId sub, SubTransactionId parent, void *arg)
{
	ListCell   *lc;

	if (event != SUBXACT_EVENT_ABORT_SUB && event != SUBXACT_EVENT_COMMIT_SUB)
		return;
	/* subtransactions begun after sub are sub's own (numbers only grow) */
	foreach(lc, plans)
	{
		IndexPlan  *plan = lfirst(lc);

		if (plan->locked_lxid != MyProc->lxid || plan->locked_in < sub)
			continue;
		if (event == SUBXACT_EVENT_ABORT_SUB)
			plan->locked_lxid = InvalidLocalTransactionId;	/* given back */
		else
			plan->locked_in = parent;	/* the parent's now */
	}
}

/* A transaction's end gives back every lock (and local ids come round again). */
static void
xact_ended(XactEvent event, void *arg)
{
	ListCell   *lc;

	if (event != XACT_EVENT_COMMIT && event != XACT_EVENT_ABORT && event != XACT_EVENT_PREPARE &&
		event != XACT_EVENT_PARALLEL_COMMIT && event != XACT_EVENT_PARALLEL_ABORT)
		return;
	foreach(lc, plans)
		((IndexPlan *) lfirst(lc))->locked_lxid = InvalidLocalTransactionId;
}

void
dl_index_plans_init(void)
{
	CacheRegisterRelcacheCallback(relcache_changed, (Datum) 0);
	RegisterSubXactCallback(subxact_changed, NULL);
	RegisterXactCallback(xact_ended, NULL);
}

/* Notes that this (sub)transaction locked the plan's indexes. */
static void
note_locked(IndexPlan *plan)
{
	plan->locked_lxid = MyProc->lxid;
	plan->locked_in = GetCurrentSubTransactionId();
}

/*
 * Learns rel's plan: its indexes opened (and so locked for the transaction)
 * and their IndexInfo built as ExecOpenIndices builds them.
 */
static IndexPlan *
learn_plan(Relation rel)
{
	MemoryContext cxt = AllocSetContextCreate(CurTransactionContext, "durable_ledger index plan",
											  ALLOCSET_SMALL_SIZES);
	MemoryContext caller = MemoryContextSwitchTo(cxt);
	uint64		seen = invalidations;
	IndexPlan  *plan = palloc0(sizeof(IndexPlan));
	List	   *oids = NIL;
	ListCell   *lc;
	int			i = 0;

	plan->cxt = cxt;
	plan->relid = RelationGetRelid(rel);
	if (RelationGetForm(rel)->relhasindex)
		oids = RelationGetIndexList(rel);
	plan->nindexes = list_length(oids);
	plan->index_oids = palloc(sizeof(Oid) * Max(plan->nindexes, 1));
	plan->infos = palloc(sizeof(IndexInfo *) * Max(plan->nindexes, 1));
	foreach(lc, oids)
	{
		Relation	index = index_open(lfirst_oid(lc), RowExclusiveLock);

		plan->index_oids[i] = lfirst_oid(lc);
		plan->infos[i] = BuildIndexInfo(index);
		index_close(index, NoLock);
		i++;
	}
	note_locked(plan);
	/* a change seen while learning: good for this write, learned again next time */
	plan->stale = invalidations != seen;
	/* complete: the backend's from now on */
	MemoryContextSwitchTo(TopMemoryContext);
	plans = lappend(plans, plan);
	MemoryContextSetParent(cxt, TopMemoryContext);
	MemoryContextSwitchTo(caller);
	return plan;
}

/*
 * rel's plan, its indexes locked by this transaction.  Stale plans are freed
 * on the way (no write holds anything of them: copy_info).
 */
static IndexPlan *
plan_of(Relation rel)
{
	Oid			relid = RelationGetRelid(rel);

	for (;;)
	{
		IndexPlan  *found = NULL;
		ListCell   *lc;
		int			i;

		foreach(lc, plans)
		{
			IndexPlan  *plan = lfirst(lc);

			if (plan->stale)
			{
				plans = foreach_delete_current(plans, lc);
				MemoryContextDelete(plan->cxt);
			}
			else if (plan->relid == relid)
				found = plan;
		}
		if (found == NULL)
			return learn_plan(rel);
		if (found->locked_lxid == MyProc->lxid)
			return found;
		for (i = 0; i < found->nindexes; i++)
			LockRelationOid(found->index_oids[i], RowExclusiveLock);
		note_locked(found);
		if (!found->stale)
			return found;
		/* a change arrived with a lock: learn again (the locks stay) */
	}
}

static void *
copy_array(const void *array, Size size)
{
	void	   *copy;

	if (array == NULL)
		return NULL;
	copy = palloc(size);
	memcpy(copy, array, size);
	return copy;
}

/* A write's own IndexInfo, as BuildIndexInfo would have made it. */
static IndexInfo *
copy_info(const IndexInfo *info)
{
	IndexInfo  *copy = palloc(sizeof(IndexInfo));
	int			nkeys = info->ii_NumIndexKeyAttrs;

	memcpy(copy, info, sizeof(IndexInfo));
	copy->ii_Expressions = copyObject(info->ii_Expressions);
	copy->ii_ExpressionsState = NIL;
	copy->ii_Predicate = copyObject(info->ii_Predicate);
	copy->ii_PredicateState = NULL;
	copy->ii_ExclusionOps = copy_array(info->ii_ExclusionOps, sizeof(Oid) * nkeys);
	copy->ii_ExclusionProcs = copy_array(info->ii_ExclusionProcs, sizeof(Oid) * nkeys);
	copy->ii_ExclusionStrats = copy_array(info->ii_ExclusionStrats, sizeof(uint16) * nkeys);
	/* set only by BuildSpeculativeIndexInfo (an ON CONFLICT insert) */
	copy->ii_UniqueOps = NULL;
	copy->ii_UniqueProcs = NULL;
	copy->ii_UniqueStrats = NULL;
	/* read by index builds only (index_create, CompareIndexInfo), never by a write */
	copy->ii_OpclassOptions = NULL;
	copy->ii_AmCache = NULL;
	copy->ii_Context = CurrentMemoryContext;
	return copy;
}

/*
 * ExecOpenIndices(rri, false) for a write of a ledger table, in the memory
 * of the write's EState (the caller's current context).
 */
void
dl_open_indexes(ResultRelInfo *rri)
{
	IndexPlan  *plan = plan_of(rri->ri_RelationDesc);
	int			n = plan->nindexes;
	int			i;

	rri->ri_NumIndices = 0;
	if (n == 0)
		return;
	rri->ri_IndexRelationDescs = palloc(sizeof(Relation) * n);
	rri->ri_IndexRelationInfo = palloc(sizeof(IndexInfo *) * n);
	for (i = 0; i < n; i++)
	{
		/* locked by this transaction (plan_of), and not given back since */
		rri->ri_IndexRelationDescs[i] = index_open(plan->index_oids[i], NoLock);
		rri->ri_IndexRelationInfo[i] = copy_info(plan->infos[i]);
		rri->ri_NumIndices = i + 1;
	}
}
