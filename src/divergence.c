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
 * for tools whose policy is off.  Otherwise an epoch keeps two counters per
 * tool, next to its occurrence counters and rolled back with them: how many
 * earlier effects of T it has replayed, and how many there are (counted once
 * per epoch and tool, by the effects' (tool, run) index, when a call of T
 * would first execute).  A call never scans the run's history.
 *
 * Policy pause records the divergence (durable_ledger.divergences) and
 * answers pause; a person then says whether the call is the same operation
 * as the earlier effect (its outcome is replayed) or a distinct one (it is
 * executed), with resolve_divergence().  Policy warn executes it with a
 * WARNING and an audited divergence event.
 */
#include "postgres.h"

#include "policy.h"

/* What the epoch counts per tool (bytes no canonical args can be). */
static const char REPLAYED[] = "\0replayed";
static const char EARLIER[] = "\0earlier";

void
dl_progress_start(ReplayProgress *progress, const CallLease *lease, const char *tool,
				  DivergencePolicy policy)
{
	progress->watched = policy != DIVERGENCE_OFF && lease->epoch > 1;
	progress->lease = lease;
	progress->tool = tool;
	progress->policy = policy;
	progress->earlier_effects = NIL;
	progress->earlier.count = 0;
	if (progress->watched)
		dl_epoch_counter(lease, tool, REPLAYED, sizeof(REPLAYED) - 1, &progress->replayed);
}

/* The call replayed an earlier effect of the tool. */
void
dl_progress_replayed(ReplayProgress *progress)
{
	if (progress->watched)
		dl_epoch_count(progress->lease, &progress->replayed, progress->replayed.count + 1);
}

static List *
earlier_effects(ReplayProgress *progress)
{
	if (progress->earlier_effects == NIL)
		progress->earlier_effects = dl_read_earlier_effects(progress->lease->run,
															progress->tool,
															progress->lease->epoch);
	return progress->earlier_effects;
}

/* How many earlier effects of the tool there are, counted once per epoch. */
static int32
earlier_count(ReplayProgress *progress)
{
	dl_epoch_counter(progress->lease, progress->tool, EARLIER, sizeof(EARLIER) - 1,
					 &progress->earlier);
	if (progress->earlier.count == 0)
		dl_epoch_count(progress->lease, &progress->earlier,
					   list_length(earlier_effects(progress)) + 1);
	return progress->earlier.count - 1;
}

static void
audit_divergence(ReplayProgress *progress, const char *key, const char *candidate)
{
	DetailBuilder detail;

	dl_detail_init(&detail);
	dl_detail_text(&detail, "tool", progress->tool);
	dl_detail_text(&detail, "may_duplicate", candidate);
	dl_detail_text(&detail, "policy", progress->policy == DIVERGENCE_PAUSE ? "pause" : "warn");
	dl_detail_int(&detail, "replayed", progress->replayed.count);
	dl_detail_int(&detail, "earlier", progress->earlier.count - 1);
	dl_write_audit(progress->lease->run, key, "divergence", dl_detail_finish(&detail),
				   progress->lease->epoch, 0);
}

/*
 * Judges a call of the tool that would execute key (new): *drift says
 * whether it executes, pauses for a person, or replays what a person said it
 * is the same as.
 */
void
dl_check_drift(ReplayProgress *progress, const char *key, Jsonb *args, int32 occurrence,
			   Drift *drift)
{
	DivergenceRow recorded;
	EarlierEffect *candidate;

	memset(drift, 0, sizeof(Drift));
	drift->kind = DRIFT_NONE;
	if (!progress->watched || earlier_count(progress) <= progress->replayed.count)
		return;

	if (dl_read_divergence(key, &recorded))
	{
		drift->candidate_key = recorded.candidate_key;
		if (recorded.verdict == NULL)
			drift->kind = DRIFT_PAUSE;
		else if (strcmp(recorded.verdict, "same") == 0)
		{
			drift->kind = DRIFT_SAME;
			drift->same_as = recorded.same_as;
		}
		return;
	}

	/* in an honest replay, the earlier effect due next */
	candidate = list_nth(earlier_effects(progress),
						 Min(progress->replayed.count, list_length(earlier_effects(progress)) - 1));
	drift->candidate_key = candidate->key;
	audit_divergence(progress, key, candidate->key);
	if (progress->policy == DIVERGENCE_WARN)
	{
		ereport(WARNING,
				(errmsg("call of tool \"%s\" diverges from the earlier attempts of run \"%s\"",
						progress->tool, progress->lease->run),
				 errdetail("The earlier attempts recorded %d effect(s) of the tool that this attempt has not replayed; it may duplicate effect \"%s\".",
						   progress->earlier.count - 1 - progress->replayed.count,
						   candidate->key),
				 errhint("The tool's divergence policy is \"warn\": the call is executed.")));
		return;
	}
	else
	{
		DivergenceRow row;

		row.key = (char *) key;
		row.run = (char *) progress->lease->run;
		row.lease_epoch = progress->lease->epoch;
		row.tool = (char *) progress->tool;
		row.args = args;
		row.occurrence = occurrence;
		row.candidate_key = candidate->key;
		dl_write_divergence(&row);
		drift->kind = DRIFT_PAUSE;
		drift->recorded_now = true;
	}
}
