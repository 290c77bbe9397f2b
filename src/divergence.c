/*
 * divergence.c: a later attempt of a run that drifts from what the run's
 * earlier attempts did.
 *
 * The rule.  Let an attempt be a lease epoch e of run R, and T a tool whose
 * divergence policy is not off.  The earlier effects of T are the effects
 * that R's attempts before e recorded for T under derived keys.  A call of T
 * in e that would execute (its key is new) while some earlier effect of T has
 * not been replayed by e yet is a divergence: the replay has drifted (the
 * model reworded an argument, reordered a list, took another path), and the
 * new call may be one of those earlier effects again under another key.
 *
 * An honest replay never trips it: it makes the earlier calls again, in any
 * order, each reaching its earlier effect (a replay), and only then calls
 * what is new, when every earlier effect of T has been replayed.
 *
 * It costs nothing in an attempt's first epoch (there is nothing earlier) nor
 * for tools whose policy is off.  Otherwise an epoch keeps, next to its
 * occurrence counters and rolled back with them: which earlier effects of T
 * it has replayed (a mark per effect, so that replaying one twice, or once
 * as the verdict of a divergence and once as itself, counts once), how many
 * those are, and how many earlier effects of T there are (counted once per
 * epoch and tool, by the effects' (tool, run) index, when a call of T would
 * first execute).  A call never scans the run's history -- but for the
 * tool's effects in the run, by that index, when a new key of a later
 * attempt is compared with the earlier attempts' call ids (see below).
 *
 * A divergence is keyed by the drifted call's key, and looked up first for
 * every new key of a later attempt, judged or watched or not: once recorded,
 * it waits for its verdict while the tool's policy is not off, however far
 * the replay has come since and whichever way its key is called.
 *
 * Policy pause records the divergence (durable_ledger.divergences), naming as
 * the effect it may duplicate the first earlier effect of T (in the order
 * they were begun) that this attempt has not replayed, and answers pause
 * (this file judges; the decision, decide.c, writes what it asks); a
 * person then says whether the call is the same operation as an earlier
 * effect (its outcome is replayed) or a distinct one (it is executed), with
 * resolve_divergence().  Policy warn executes it with a
 * WARNING and an audited divergence event.
 *
 * A call keyed by a framework's id for it (begin_effect's call_id: its
 * business key names one tool call, not an operation) has no occurrence to
 * replay by: a framework that asks its model again after a lost answer gets
 * the same call under a new id.  So a new call id of a later attempt is a
 * divergence when the run's earlier attempts recorded an effect of the tool,
 * under any key, with the same identity (its key fields, or all of args)
 * that did not fail: it may be that effect, named anew.  Judged under the
 * same policy, recorded and resolved the same way (its occurrence is 0).
 * The other way round, a new derived key whose identity equals an earlier
 * attempt's effect under a call id (a framework that gave no id this time)
 * diverges too, that effect named.  Call ids' keys have a shape of their own
 * ("call:", reserved: keys.c), so that their effects are known as such.
 */
#include "postgres.h"

#include "policy.h"

#define HINT_CALL_ID_OTHER_CALL \
	"A business key names one call (a call id, one tool call): a different call needs a key of its own."

/*
 * What the epoch counts per tool, under names no canonical args can be
 * (they begin with a zero byte): the earlier effects replayed, how many
 * earlier effects there are (plus one; 0: not counted yet), and per earlier
 * effect whether it was replayed (the key follows the name); and, counted
 * with them, how many the earlier attempts recorded under call ids (plus
 * one).
 */
static const char REPLAYED[] = "\0replayed";
static const char EARLIER[] = "\0earlier";
static const char REACHED[] = "\0reached\0";
static const char UNWATCHED[] = "\0unwatched";
static const char KEYED[] = "\0keyed";

/*
 * An attempt's calls of a tool are watched when its policy is not off, from
 * its first call in the attempt on: an attempt that called the tool while it
 * was unwatched (not registered yet, policy off) kept no marks of what it
 * replayed, so it is not judged for that tool, even once the policy is on;
 * its next attempt is.  True when reading the policy of a tool nobody
 * registered waited for a change of it.
 */
bool
dl_progress_start(ReplayProgress *progress, const CallLease *lease, const char *tool,
				  const ToolRules *rules, bool recorded)
{
	bool		waited = false;

	progress->later = lease->epoch > 1;
	progress->watched = false;
	progress->judged = false;
	progress->lease = lease;
	progress->tool = tool;
	progress->policy = DIVERGENCE_OFF;
	progress->earlier_effects = NIL;
	progress->earlier.count = 0;
	progress->keep_earlier = false;
	progress->keep_unwatched = false;
	if (!progress->later)
		return false;
	progress->policy = dl_divergence_policy(rules, &waited);
	progress->judged = dl_divergence_judged(rules, recorded);
	dl_epoch_counter(lease, tool, UNWATCHED, sizeof(UNWATCHED) - 1, &progress->unwatched);
	if (progress->policy == DIVERGENCE_OFF)
	{
		progress->keep_unwatched = progress->unwatched.count == 0;
		return waited;
	}
	if (progress->unwatched.count != 0)
		return waited;
	progress->watched = true;
	dl_epoch_counter(lease, tool, REPLAYED, sizeof(REPLAYED) - 1, &progress->replayed);
	return waited;
}

/* The mark of an earlier effect: replayed in this epoch or not. */
static void
reached_mark(ReplayProgress *progress, const char *key, EpochCounter *mark)
{
	size_t		key_len = strlen(key);
	char	   *what = palloc(sizeof(REACHED) - 1 + key_len);

	memcpy(what, REACHED, sizeof(REACHED) - 1);
	memcpy(what + sizeof(REACHED) - 1, key, key_len);
	dl_epoch_counter(progress->lease, progress->tool, what, sizeof(REACHED) - 1 + key_len, mark);
	pfree(what);
}

/*
 * The call replayed key, an earlier effect of the tool: counted once per
 * effect.  A call id's effect is marked, not counted (the count is of the
 * earlier effects under derived keys): this attempt has accounted for it, so
 * no call of it in this attempt is that effect named anew (same_call_earlier).
 */
void
dl_progress_replayed(ReplayProgress *progress, const char *key)
{
	EpochCounter mark;

	if (!progress->watched)
		return;
	reached_mark(progress, key, &mark);
	if (mark.count != 0)
		return;
	dl_epoch_count(progress->lease, &mark, 1);
	if (!dl_is_call_key(key))
		dl_epoch_count(progress->lease, &progress->replayed, progress->replayed.count + 1);
}

static int32 earlier_count(ReplayProgress *progress);
static char *same_call_earlier(ReplayProgress *progress, const ToolRules *rules,
							   const char *canon, bool call_ids_only);

/*
 * The call makes key, an earlier effect of the tool whose attempt was lost,
 * again in this epoch (begin_recorded): it counts as replayed, as the same
 * call is.  Its row is about to move into this epoch, so the earlier effects
 * are counted first, while it is one of them.
 */
void
dl_progress_redone(ReplayProgress *progress, const char *key)
{
	if (!progress->watched)
		return;
	(void) earlier_count(progress);
	dl_progress_replayed(progress, key);
}

/*
 * The earlier effects of the tool this epoch must replay: those the run's
 * attempts before it recorded.  A verdict of distinct passes none of them
 * over: it says one call is not that effect, not that the run will never
 * make that effect again (a reworded copy in a later attempt would then
 * execute); so each later attempt's new calls of the tool are judged until
 * it has replayed them all.
 */
static List *
earlier_effects(ReplayProgress *progress)
{
	int32		call_ids;

	if (progress->earlier_effects == NIL)
	{
		progress->earlier_effects = dl_read_earlier_effects(progress->lease->run, progress->tool,
															progress->lease->epoch,
															&call_ids);
		progress->call_ids = call_ids;
	}
	return progress->earlier_effects;
}

/*
 * How many earlier effects of the tool there are, counted once per epoch:
 * the count is kept (dl_progress_keep) with the decision it was made for.
 */
static int32
earlier_count(ReplayProgress *progress)
{
	if (progress->earlier.count == 0)
	{
		dl_epoch_counter(progress->lease, progress->tool, EARLIER, sizeof(EARLIER) - 1,
						 &progress->earlier);
		dl_epoch_counter(progress->lease, progress->tool, KEYED, sizeof(KEYED) - 1,
						 &progress->keyed);
		if (progress->earlier.count == 0)
		{
			progress->earlier.count = list_length(earlier_effects(progress)) + 1;
			progress->keyed.count = progress->call_ids + 1;
			progress->keep_earlier = true;
		}
	}
	return progress->earlier.count - 1;
}

/*
 * Keeps in the epoch what judging its call found out: that the tool is
 * unwatched in it, how many earlier effects of the tool there are.
 */
void
dl_progress_keep(ReplayProgress *progress)
{
	if (progress->keep_unwatched)
		dl_epoch_count(progress->lease, &progress->unwatched, 1);
	if (progress->keep_earlier)
	{
		dl_epoch_count(progress->lease, &progress->earlier, progress->earlier.count);
		dl_epoch_count(progress->lease, &progress->keyed, progress->keyed.count);
	}
	progress->keep_unwatched = progress->keep_earlier = false;
}

/* The first earlier effect of the tool, in begin order, this epoch has not replayed. */
static char *
first_not_replayed(ReplayProgress *progress)
{
	ListCell   *lc;

	foreach(lc, earlier_effects(progress))
	{
		EarlierEffect *effect = lfirst(lc);
		EpochCounter mark;

		reached_mark(progress, effect->key, &mark);
		if (mark.count == 0)
			return effect->key;
	}
	elog(ERROR, "run \"%s\" has fewer earlier effects of tool \"%s\" than it counted",
		 progress->lease->run, progress->tool);
	return NULL;				/* keep compiler quiet */
}

/*
 * Judges a call of the tool that would execute key (new): *drift says
 * whether it executes, executes with a warning, pauses for a person (a new
 * divergence, or one waiting for its verdict), or replays what a person said
 * it is the same as.  Reads, writes nothing: the decision writes what the
 * judgement asks (dl_divergence_detail, dl_warn_divergence).
 */
void
dl_judge_drift(ReplayProgress *progress, const char *key, const ToolRules *rules,
			   const char *canon, Drift *drift)
{
	DivergenceRow recorded;

	memset(drift, 0, sizeof(Drift));
	drift->kind = DRIFT_NONE;
	if (!progress->later)
		return;

	/*
	 * A divergence recorded for this very call: a person's "same" is kept
	 * whatever the policy is now (executing would do that effect again); one
	 * without a verdict waits for it while the tool's policy is not off,
	 * however far the replay has come since, and whichever way the key is
	 * called: a recorded call of a tool nobody registered is not judged, and
	 * an attempt that called the tool while its policy was off keeps no
	 * marks, but the person asked about the key decides it.
	 */
	if (dl_run_may_have_divergences(progress->lease->run) &&
		dl_read_divergence(key, &recorded))
	{
		drift->candidate_key = recorded.candidate_key;
		if (recorded.verdict != NULL && strcmp(recorded.verdict, "same") == 0)
		{
			drift->kind = DRIFT_SAME;
			drift->same_as = recorded.same_as;
		}
		else if (recorded.verdict == NULL && progress->policy != DIVERGENCE_OFF)
			drift->kind = DRIFT_WAITING;
		return;
	}
	if (!progress->judged || !progress->watched)
		return;
	(void) earlier_count(progress);

	/*
	 * Replay progress counts no call id's effect: an earlier attempt's call
	 * id with this call's identity may be this call, keyed by its occurrence
	 * now (a framework that gave no id this time).  Named first: it is the
	 * effect the call has the arguments of, whatever else is due.
	 */
	if (progress->keyed.count > 1)
	{
		drift->candidate_key = same_call_earlier(progress, rules, canon, true);
		if (drift->candidate_key != NULL)
		{
			drift->same_args = true;
			drift->kind = progress->policy == DIVERGENCE_WARN ? DRIFT_WARN : DRIFT_NEW;
			return;
		}
	}
	if (progress->earlier.count - 1 <= progress->replayed.count)
		return;

	/* in an honest replay, the earlier effect due next */
	drift->candidate_key = first_not_replayed(progress);
	drift->replayed = progress->replayed.count;
	drift->earlier = progress->earlier.count - 1;
	drift->kind = progress->policy == DIVERGENCE_WARN ? DRIFT_WARN : DRIFT_NEW;
}

/*
 * The first effect, in the order begun, of the tool that an attempt of the
 * run before this one recorded with the call's identity (canon), that did not
 * fail, and that this attempt has not replayed: a failed effect did not
 * happen (a rejected one neither), and the call may make it anew -- unless a
 * report contradicted the failure (flagged: it may have happened, and waits
 * for a person); an effect this attempt replayed (or a verdict answered a
 * call with) is accounted for, and a call like it now is another call.
 * With call_ids_only, only effects under call ids.  NULL when none.
 */
static char *
same_call_earlier(ReplayProgress *progress, const ToolRules *rules, const char *canon,
				  bool call_ids_only)
{
	const CallLease *lease = progress->lease;
	List	   *effects = dl_read_run_tool_effects(lease->run, progress->tool);
	EffectRow  *first = NULL;
	ListCell   *lc;
	StringInfoData identity;

	initStringInfo(&identity);
	foreach(lc, effects)
	{
		EffectRow  *row = lfirst(lc);
		bool		complete;
		Jsonb	   *fields;

		if (row->lease_epoch >= lease->epoch || (row->status == EFFECT_FAILED && !row->conflict) ||
			(call_ids_only && !(row->business_key && dl_is_call_key(row->key))))
			continue;
		if (first != NULL && (row->created_at > first->created_at ||
							  (row->created_at == first->created_at &&
							   strcmp(row->key, first->key) > 0)))
			continue;
		fields = dl_identity_of_call(rules, row->args, &complete);
		if (!complete)
			continue;
		resetStringInfo(&identity);
		dl_append_canonical_args(&identity, fields);
		if (strcmp(identity.data, canon) != 0)
			continue;
		if (progress->watched)
		{
			EpochCounter mark;

			reached_mark(progress, row->key, &mark);
			if (mark.count != 0)
				continue;
		}
		first = row;
	}
	return first != NULL ? first->key : NULL;
}

/*
 * A divergence recorded for a business key binds the key to the call that
 * made it, as an effect's row binds it (decide.c, check_same_call): a call of
 * the key by another run, with another tool, or with other args (other
 * values of the tool's key fields) is refused, nothing written; a verdict is
 * about the call judged.
 */
static void
check_divergence_call(const DivergenceRow *recorded, const char *run, const char *tool,
					  const ToolRules *rules, const char *canon)
{
	StringInfoData identity;
	Jsonb	   *fields;
	bool		complete;

	if (strcmp(recorded->run, run) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("business key \"%s\" is already used by a different call", recorded->key),
				 errdetail("Another run called it, and the call waits for or had a person's verdict on a divergence."),
				 errhint(HINT_CALL_ID_OTHER_CALL)));
	if (strcmp(recorded->tool, tool) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("business key \"%s\" is already used by a different call", recorded->key),
				 errdetail("It was called with tool \"%s\"; this call has tool \"%s\".",
						   recorded->tool, tool),
				 errhint(HINT_CALL_ID_OTHER_CALL)));
	initStringInfo(&identity);
	fields = dl_identity_of_call(rules, recorded->args, &complete);
	if (complete)
		dl_append_canonical_args(&identity, fields);
	if (!complete || strcmp(identity.data, canon) != 0)
		ereport(ERROR,
				(errcode(ERRCODE_UNIQUE_VIOLATION),
				 errmsg("business key \"%s\" is already used by a different call", recorded->key),
				 errdetail("It was called with other arguments for tool \"%s\", and a person was asked about that call.",
						   tool),
				 errhint(HINT_CALL_ID_OTHER_CALL)));
}

/*
 * Judges a call that would execute key, a new business key: a divergence
 * recorded for the key decides it, whichever way the key is called (with
 * call_id or not) -- a verdict of same replays, one awaited pauses while the
 * tool's policy is not off; else a new call id of a later attempt (see the
 * head of this file) is judged by the call's identity, not by replay
 * progress, which business keys do not count.  Reads, writes nothing.  True
 * when reading the policy of a tool nobody registered waited for a change of
 * it.
 */
bool
dl_judge_business_key(ReplayProgress *progress, const CallLease *lease, const char *tool,
					  const ToolRules *rules, const char *key, const char *canon, bool call_id,
					  Drift *drift)
{
	DivergenceRow recorded;
	bool		waited = false;
	DivergencePolicy policy;

	memset(drift, 0, sizeof(Drift));
	drift->kind = DRIFT_NONE;

	/*
	 * Only a call id's key can be a divergence's (an operation's business key
	 * never is: its shape is not "call:", keys.c).  A business key is shared by
	 * runs, and the run's remembered "no divergences" says nothing of another
	 * run's: looked up by the key.
	 */
	if (dl_is_call_key(key) && dl_read_divergence(key, &recorded))
	{
		check_divergence_call(&recorded, lease->run, tool, rules, canon);
		policy = dl_divergence_policy(rules, &waited);
		drift->call_id = drift->same_args = recorded.occurrence == 0;
		drift->candidate_key = recorded.candidate_key;
		if (recorded.verdict != NULL && strcmp(recorded.verdict, "same") == 0)
		{
			drift->kind = DRIFT_SAME;
			drift->same_as = recorded.same_as;
		}
		else if (recorded.verdict == NULL && policy != DIVERGENCE_OFF)
			drift->kind = DRIFT_WAITING;
		return waited;
	}

	/* a call id's progress was started with the call (dl_progress_start) */
	if (!call_id || !progress->later || progress->policy == DIVERGENCE_OFF)
		return false;
	drift->call_id = true;
	drift->same_args = true;
	drift->candidate_key = same_call_earlier(progress, rules, canon, false);
	if (drift->candidate_key != NULL)
		drift->kind = progress->policy == DIVERGENCE_WARN ? DRIFT_WARN : DRIFT_NEW;
	return waited;
}

/* The detail of a new divergence's audit row (DRIFT_WARN, DRIFT_NEW). */
Jsonb *
dl_divergence_detail(const ReplayProgress *progress, const Drift *drift)
{
	DetailBuilder detail;

	dl_detail_init(&detail);
	dl_detail_text(&detail, "tool", progress->tool);
	dl_detail_text(&detail, "may_duplicate", drift->candidate_key);
	dl_detail_text(&detail, "policy", dl_divergence_name(progress->policy));
	if (drift->same_args)
	{
		/* a call with may_duplicate's identity: a new call id, or under its occurrence */
		dl_detail_bool(&detail, "same_args", true);
		if (drift->call_id)
			dl_detail_bool(&detail, "call_id", true);
		return dl_detail_finish(&detail);
	}
	dl_detail_int(&detail, "replayed", drift->replayed);
	dl_detail_int(&detail, "earlier", drift->earlier);
	return dl_detail_finish(&detail);
}

/* The WARNING of a divergent call that policy warn executes. */
void
dl_warn_divergence(const ReplayProgress *progress, const Drift *drift)
{
	int			not_replayed = drift->earlier - drift->replayed;

	ereport(WARNING,
			(errcode(ERRCODE_DL_WARNING_DIVERGENCE),
			 errmsg("call of tool \"%s\" diverges from the earlier attempts of run \"%s\"",
					progress->tool, progress->lease->run),
			 drift->call_id ?
			 errdetail("The call has a new call id, and an earlier attempt recorded effect \"%s\" of the tool with the same arguments: the call may duplicate it.",
					   drift->candidate_key) :
			 drift->same_args ?
			 errdetail("An earlier attempt recorded effect \"%s\" of the tool with the same arguments under a call id: the call may duplicate it.",
					   drift->candidate_key) :
			 errdetail_plural("The earlier attempts recorded %d effect of the tool that this attempt has not replayed: the call may duplicate effect \"%s\".",
							  "The earlier attempts recorded %d effects of the tool that this attempt has not replayed: the call may duplicate effect \"%s\".",
							  not_replayed, not_replayed, drift->candidate_key),
			 errhint("Compare the call with that effect; to pause such calls instead, an admin sets the tool's divergence to \"pause\" with durable_ledger.change_tool().")));
}
