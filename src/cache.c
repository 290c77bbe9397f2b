/*
 * cache.c: what a backend remembers between calls, so that a call does not
 * read again what rarely changes: a tool's row of the registry (or that it
 * has none), what is done with a tool nobody registered, that a run is not
 * abandoned, that a run has no recorded divergence, a run's budget of
 * attempts.
 *
 * Each fact is read as committed now (reader.c) and forgotten when a
 * relcache invalidation of its table arrives, the mechanism PostgreSQL's own
 * caches use.  The writers of those facts (write_*.c: a tool registered,
 * changed or retired, a run abandoned, a divergence recorded) send one,
 * which PostgreSQL delivers to every backend at the writer's commit, before
 * the writer's locks are released, and processes locally when the writer
 * rolls back.  A call that uses a fact holds the lock its writer takes (the
 * tool's bucket, the run's open lock; a divergence is recorded only by a
 * call of its run), and takes the pending invalidations here before every
 * use: once it has the lock, it sees every change committed before it.  The
 * writing backend forgets at once, for the rest of its own transaction.
 *
 * Bounded: past MAX_REMEMBERED tools or runs, everything is forgotten and
 * learned again.
 */
#include "postgres.h"

#include "access/table.h"
#include "common/hashfn.h"
#include "utils/hsearch.h"
#include "utils/inval.h"
#include "utils/memutils.h"

#include "tables.h"

#define MAX_REMEMBERED 1024

typedef struct RememberedTool
{
	const char *tool;			/* hash key: a copy owned by the cache */
	bool		registered;
	ToolRow		row;
} RememberedTool;

typedef struct RememberedRun
{
	const char *run;			/* hash key: a copy owned by the cache */
	bool		known_open;		/* read not abandoned */
	bool		no_divergences; /* read without a recorded divergence */
	bool		attempts_known; /* max_attempts was read */
	int32		max_attempts;	/* the run's budget of attempts, its own or every run's; 0: none */
	bool		forked;			/* ... and the run was forked */
} RememberedRun;

static MemoryContext remembered_cxt = NULL;
static HTAB *tools_remembered = NULL;
static HTAB *runs_remembered = NULL;
static uint64 forgotten = 0;	/* how many times everything was forgotten */
static bool policy_known = false;	/* unregistered_policy holds the policy read */
static UnregisteredPolicy unregistered_policy;

/*
 * The tables the facts are read from, learned before a fact is read (so that
 * an invalidation arriving during the read is recognised: tables.c forgets
 * its own notion of a table when one arrives).
 */
static Oid	tools_relid = InvalidOid;
static Oid	runs_relid = InvalidOid;
static Oid	divergences_relid = InvalidOid;
static Oid	policy_relid = InvalidOid;

static uint32
name_hash(const void *key, Size keysize)
{
	return string_hash(*(const char *const *) key, 0);
}

static int
name_match(const void *a, const void *b, Size keysize)
{
	return strcmp(*(const char *const *) a, *(const char *const *) b);
}

static HTAB *
name_table(const char *what, Size entrysize)
{
	HASHCTL		ctl;

	ctl.keysize = sizeof(const char *);
	ctl.entrysize = entrysize;
	ctl.hash = name_hash;
	ctl.match = name_match;
	ctl.hcxt = remembered_cxt;
	return hash_create(what, 64, &ctl, HASH_ELEM | HASH_FUNCTION | HASH_COMPARE | HASH_CONTEXT);
}

/* Forgets everything this backend remembered. */
void
dl_forget_remembered(void)
{
	forgotten++;
	if (remembered_cxt != NULL)
		MemoryContextReset(remembered_cxt);
	tools_remembered = NULL;
	runs_remembered = NULL;
	policy_known = false;
}

static void
relcache_changed(Datum arg, Oid relid)
{
	if (!OidIsValid(relid) || relid == tools_relid || relid == runs_relid ||
		relid == divergences_relid || relid == policy_relid)
		dl_forget_remembered();
}

void
dl_cache_init(void)
{
	CacheRegisterRelcacheCallback(relcache_changed, (Datum) 0);
}

/*
 * Learns which relation t is before a fact is read from it; returns the
 * generation to remember the fact at (what forgets during the read, or after,
 * makes it not remembered).
 */
static uint64
watch_table(LedgerTable *t, Oid *watched)
{
	Relation	rel = dl_open_table(t, AccessShareLock);

	*watched = RelationGetRelid(rel);
	table_close(rel, NoLock);
	return forgotten;
}

/* name's entry in table, or NULL. */
static void *
remembered(HTAB *table, const char *name)
{
	if (table == NULL)
		return NULL;
	return hash_search(table, &name, HASH_FIND, NULL);
}

/* A new entry for name in *table, whose fields the caller fills. */
static void *
remember(HTAB **table, const char *what, Size entrysize, const char *name)
{
	const char **entry;
	bool		found;

	if (remembered_cxt == NULL)
		remembered_cxt = AllocSetContextCreate(CacheMemoryContext, "durable_ledger remembered",
											   ALLOCSET_SMALL_SIZES);
	if (*table != NULL && hash_get_num_entries(*table) >= MAX_REMEMBERED)
		dl_forget_remembered();
	if (*table == NULL)
		*table = name_table(what, entrysize);
	entry = hash_search(*table, &name, HASH_ENTER, &found);
	if (!found)
	{
		memset(entry, 0, entrysize);
		*entry = MemoryContextStrdup(remembered_cxt, name);
	}
	return entry;
}

/* A copy of row in the current memory context, or in the cache's. */
static void
copy_tool_row(ToolRow *to, const ToolRow *from, MemoryContext cxt)
{
	MemoryContext old = MemoryContextSwitchTo(cxt);
	int			i;

	*to = *from;
	to->tool = from->tool ? pstrdup(from->tool) : NULL;
	to->note = from->note ? pstrdup(from->note) : NULL;
	to->key_fields = NULL;
	if (from->nkey_fields > 0)
	{
		to->key_fields = palloc(sizeof(char *) * from->nkey_fields);
		for (i = 0; i < from->nkey_fields; i++)
			to->key_fields[i] = pstrdup(from->key_fields[i]);
	}
	if (from->approval != NULL)
	{
		to->approval = palloc(VARSIZE(from->approval));
		memcpy(to->approval, from->approval, VARSIZE(from->approval));
	}
	MemoryContextSwitchTo(old);
}

/*
 * dl_read_tool, remembered.  A fact is remembered only when no invalidation
 * arrived while it was read (the read might predate the change it announces).
 */
bool
dl_read_tool_remembered(const char *tool, ToolRow *row)
{
	RememberedTool *entry;
	uint64		before;
	bool		registered;

	AcceptInvalidationMessages();
	entry = remembered(tools_remembered, tool);
	if (entry != NULL)
	{
		if (entry->registered)
			copy_tool_row(row, &entry->row, CurrentMemoryContext);
		return entry->registered;
	}
	before = watch_table(&dl_tools_table, &tools_relid);
	registered = dl_read_tool(tool, row);
	if (before == forgotten)
	{
		entry = remember(&tools_remembered, "durable_ledger tools", sizeof(RememberedTool), tool);
		entry->registered = registered;
		if (registered)
			copy_tool_row(&entry->row, row, remembered_cxt);
	}
	return registered;
}

/* dl_read_unregistered_policy, remembered: the caller holds the policy's lock. */
UnregisteredPolicy
dl_read_unregistered_policy_remembered(void)
{
	uint64		before;
	UnregisteredPolicy policy;

	AcceptInvalidationMessages();
	if (policy_known)
		return unregistered_policy;
	before = watch_table(&dl_policy_table, &policy_relid);
	policy = dl_read_unregistered_policy();
	if (before == forgotten)
	{
		unregistered_policy = policy;
		policy_known = true;
	}
	return policy;
}

/* The run's entry, created when the fact read is to be remembered. */
static RememberedRun *
run_entry(const char *run)
{
	RememberedRun *entry = remembered(runs_remembered, run);

	if (entry == NULL)
		entry = remember(&runs_remembered, "durable_ledger runs", sizeof(RememberedRun), run);
	return entry;
}

/*
 * Whether run was read not abandoned and nothing changed since; when not,
 * *generation is what dl_remember_run_open needs after the caller's read.
 */
bool
dl_run_remembered_open(const char *run, uint64 *generation)
{
	RememberedRun *entry;

	AcceptInvalidationMessages();
	entry = remembered(runs_remembered, run);
	if (entry != NULL && entry->known_open)
		return true;
	*generation = watch_table(&dl_runs_table, &runs_relid);
	return false;
}

/* run was read not abandoned, by a read begun at generation. */
void
dl_remember_run_open(const char *run, uint64 generation)
{
	if (generation != forgotten)
		return;					/* something changed while it was read */
	run_entry(run)->known_open = true;
}

/* Whether a divergence may be recorded for run: false when none was, as committed now. */
bool
dl_run_may_have_divergences(const char *run)
{
	RememberedRun *entry;
	uint64		before;
	bool		any;

	AcceptInvalidationMessages();
	entry = remembered(runs_remembered, run);
	if (entry != NULL && entry->no_divergences)
		return false;
	before = watch_table(&dl_divergences_table, &divergences_relid);
	any = dl_read_run_has_divergences(run);
	if (!any && before == forgotten)
		run_entry(run)->no_divergences = true;
	return any;
}

/*
 * dl_read_attempts_budget, remembered.  Its writers (set_run_budget, which
 * closes the run, and set_attempts_budget) announce the change; a call reads
 * it once it holds the run's open lock.
 */
int32
dl_read_attempts_budget_remembered(const char *run, bool *forked)
{
	RememberedRun *entry;
	uint64		before;
	int32		max_attempts;

	AcceptInvalidationMessages();
	entry = remembered(runs_remembered, run);
	if (entry != NULL && entry->attempts_known)
	{
		*forked = entry->forked;
		return entry->max_attempts;
	}
	before = watch_table(&dl_runs_table, &runs_relid);
	(void) watch_table(&dl_policy_table, &policy_relid);
	max_attempts = dl_read_attempts_budget(run, forked);
	if (before == forgotten)
	{
		entry = run_entry(run);
		entry->attempts_known = true;
		entry->max_attempts = max_attempts;
		entry->forked = *forked;
	}
	return max_attempts;
}
