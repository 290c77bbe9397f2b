/*
 * index_plans.c: what a write of a ledger table needs to know of the table's
 * indexes, learned once per transaction.
 *
 * ExecOpenIndices, on every write, lists the table's indexes, locks each one
 * and builds its IndexInfo from the index's relcache entry (the expressions
 * and predicate copied out of it).  Here a transaction learns that once per
 * table -- the indexes' OIDs, locked for the transaction, and their
 * IndexInfo -- and every write opens the indexes without locking them again
 * and gets its own copy of each IndexInfo in its own executor state.  What
 * makes this safe, each a defect of an earlier per-backend cache
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
 * - A plan is learned in a memory context of its own under the transaction's
 *   and installed only when complete: an error while learning (out of memory,
 *   an index that cannot be opened) leaves no half-built plan, and the
 *   transaction's end frees it.
 * - When the table or one of its indexes changes (a relcache invalidation,
 *   from this session or another, or all of them on a cache reset; also one
 *   that arrives while the plan is learned) the plan is marked stale, and the
 *   next write of the table frees it and learns a new one.
 * - A subtransaction that rolls back gives back the locks its plans took (and
 *   an index it created): the plans learned in it are stale then.
 * - A new transaction never sees a plan of an earlier one (they are told
 *   apart by the backend's local transaction id).
 */
#include "postgres.h"

#include "access/genam.h"
#include "access/xact.h"
#include "catalog/index.h"
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
	SubTransactionId learned_in;	/* where its index locks were taken */
	int			nindexes;
	Oid		   *index_oids;		/* as RelationGetIndexList orders them */
	IndexInfo **infos;			/* BuildIndexInfo's, never given to the executor */
} IndexPlan;

/* the plans of the transaction lxid (the list in TopTransactionContext) */
static LocalTransactionId plans_lxid = InvalidLocalTransactionId;
static List *plans = NIL;

/* relcache invalidations seen, so that learning notices one during it */
static uint64 invalidations = 0;

static List *
current_plans(void)
{
	if (plans_lxid != MyProc->lxid)
	{
		plans = NIL;
		plans_lxid = MyProc->lxid;
	}
	return plans;
}

static void
relcache_changed(Datum arg, Oid relid)
{
	ListCell   *lc;

	invalidations++;
	foreach(lc, current_plans())
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
	foreach(lc, current_plans())
	{
		IndexPlan  *plan = lfirst(lc);

		if (plan->learned_in < sub)
			continue;
		if (event == SUBXACT_EVENT_ABORT_SUB)
			plan->stale = true;
		else
			plan->learned_in = parent;	/* its locks are the parent's now */
	}
}

void
dl_index_plans_init(void)
{
	CacheRegisterRelcacheCallback(relcache_changed, (Datum) 0);
	RegisterSubXactCallback(subxact_changed, NULL);
}

/*
 * Learns rel's plan: its indexes opened (and so locked, for the rest of the
 * transaction) and their IndexInfo built as ExecOpenIndices builds them,
 * then closed again (the locks stay).
 */
static IndexPlan *
learn_plan(Relation rel)
{
	MemoryContext cxt = AllocSetContextCreate(TopTransactionContext, "durable_ledger index plan",
											  ALLOCSET_SMALL_SIZES);
	MemoryContext caller = MemoryContextSwitchTo(cxt);
	uint64		seen = invalidations;
	IndexPlan  *plan = palloc0(sizeof(IndexPlan));
	List	   *oids = NIL;
	ListCell   *lc;
	int			i = 0;

	plan->cxt = cxt;
	plan->relid = RelationGetRelid(rel);
	plan->learned_in = GetCurrentSubTransactionId();
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
	/* a change seen while learning: good for this write, learned again next time */
	plan->stale = invalidations != seen;
	MemoryContextSwitchTo(TopTransactionContext);
	plans = lappend(current_plans(), plan);
	MemoryContextSwitchTo(caller);
	return plan;
}

static IndexPlan *
plan_of(Relation rel)
{
	ListCell   *lc;
	Oid			relid = RelationGetRelid(rel);

	foreach(lc, current_plans())
	{
		IndexPlan  *plan = lfirst(lc);

		if (plan->relid != relid)
			continue;
		if (!plan->stale)
			return plan;
		/* no write holds anything of it (copy_info) */
		plans = foreach_delete_current(plans, lc);
		MemoryContextDelete(plan->cxt);
	}
	return learn_plan(rel);
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
		/* locked by learn_plan in this transaction, and not given back since */
		rri->ri_IndexRelationDescs[i] = index_open(plan->index_oids[i], NoLock);
		rri->ri_IndexRelationInfo[i] = copy_info(plan->infos[i]);
		rri->ri_NumIndices = i + 1;
	}
}
