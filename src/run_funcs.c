/*
 * run_funcs.c: abandon_run(), resolve_divergence() and fork_run(), what a
 * person decides about a run: stop it for good, say what a drifted call of a
 * later attempt is (divergence.c), or start a new run from its first steps.
 * Each is audited with the person's name.
 */
#include "postgres.h"

#include "funcapi.h"
#include "utils/builtins.h"

#include "policy.h"

PG_FUNCTION_INFO_V1(dl_abandon_run_1_2);
PG_FUNCTION_INFO_V1(dl_resolve_divergence_1_3);
PG_FUNCTION_INFO_V1(dl_fork_run_1_3);

/*
 * abandon_run(run text, abandoned_by text, note text) RETURNS boolean
 *
 * No further begin_effect, acquire_run or take_lease of the run (55L02);
 * effects in flight keep their status, for a person; reports on them are
 * still recorded.  The run's calls in progress are waited for, so that none
 * decides anything after this returns.  False when it was abandoned already.
 */
Datum
dl_abandon_run_1_2(PG_FUNCTION_ARGS)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	char	   *abandoned_by = dl_required_text_arg(fcinfo, 1, "abandoned_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 2);
	RunState	state;
	int64		epoch;
	bool		abandoned;

	dl_check_writable("abandon_run()");
	dl_spi_connect();
	dl_run_lock_closing(dl_run_lock_key(run));
	if (!dl_read_run_state(run, &state))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("run \"%s\" is not in the ledger", run),
				 errhint("Take the run's lease first (acquire_run or take_lease): that records it.")));
	abandoned = dl_write_run_abandoned(run, abandoned_by, note, &epoch);
	if (abandoned)
	{
		DetailBuilder detail;

		dl_detail_init(&detail);
		dl_detail_text(&detail, "abandoned_by", abandoned_by);
		dl_detail_text(&detail, "note", note);
		dl_write_audit(run, NULL, AUDIT_RUN_ABANDONED, dl_detail_finish(&detail), epoch, 0);
		dl_note_durable_write();
	}
	dl_spi_finish();
	PG_RETURN_BOOL(abandoned);
}

/*
 * same_as must be an effect of the tool that an earlier attempt of the run
 * recorded under a derived key -- under any key for a new call id's
 * divergence (occurrence 0), which is found among them all; or its candidate,
 * which may have a business key (a call's identity found it).  The divergence's
 * own candidate was one when it was found, also if a recorded call's redo has
 * moved it into a later epoch since.
 */
static void
check_same_as(const LockedDivergence *locked, const char *same_as)
{
	EffectRow	row;
	bool		candidate = locked->row.candidate_key != NULL &&
		strcmp(same_as, locked->row.candidate_key) == 0;

	if (dl_read_key(same_as, &row) == KEY_ABSENT ||
		strcmp(row.run, locked->row.run) != 0 || strcmp(row.tool, locked->row.tool) != 0 ||
		(row.business_key && locked->row.occurrence != 0 && !candidate) ||
		(row.lease_epoch >= locked->row.lease_epoch && !candidate))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("effect \"%s\" is not an earlier effect of tool \"%s\" in run \"%s\"",
						same_as, locked->row.tool, locked->row.run),
				 locked->row.occurrence != 0 ?
				 errdetail("A drifted call can be the same as an effect that an earlier attempt of its run recorded for the same tool under a derived key.") :
				 errdetail("A new call id can be the same as an effect that an earlier attempt of its run recorded for the same tool.")));
}

/*
 * Locks key's divergence, which must wait for a verdict.  The run is closed
 * for calls until the verdict commits (the lock abandon_run takes): a call of
 * the drifted key in progress is waited for, so that check_not_executed sees
 * it if it executed, and a later one reads the verdict.  Otherwise a call
 * could execute (its policy turned off) beside a "same" that then commits.
 * Taken before the divergence's row, as a call takes it before anything of
 * the run: a session whose own call holds it shared goes first, and a
 * person's second verdict waits without holding the row.
 */
static void
lock_undecided_divergence(const char *key, LockedDivergence *locked)
{
	DivergenceRow unlocked;
	bool		run_closed;

	run_closed = dl_read_divergence(key, &unlocked);
	if (run_closed)
		dl_run_lock_closing(dl_run_lock_key(unlocked.run));
	if (!dl_lock_divergence(key, locked))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("no divergence is recorded for key \"%s\"", key),
				 errhint("Look for divergences waiting for a person in durable_ledger.unresolved.")));
	if (!run_closed)			/* its pause committed between the two reads */
		dl_run_lock_closing(dl_run_lock_key(locked->row.run));
	if (locked->row.verdict != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the divergence of key \"%s\" was decided already: %s",
						key, locked->row.verdict)));
}

/* A verdict cannot undo a drifted call that executed since it paused. */
static void
check_not_executed(const char *key)
{
	EffectRow	executed;

	if (dl_read_key(key, &executed) != KEY_ABSENT)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the drifted call of key \"%s\" was executed since", key),
				 errdetail("Its tool's divergence policy no longer paused it; a verdict cannot undo it."),
				 errhint("Look at the effect itself: durable_ledger.effect_status(key).")));
}

static void
audit_verdict(const char *key, const LockedDivergence *locked, const char *verdict,
			  const char *same_as, const char *resolved_by, const char *note)
{
	DetailBuilder detail;

	dl_detail_init(&detail);
	dl_detail_text(&detail, "verdict", verdict);
	dl_detail_text(&detail, "same_as", same_as);
	dl_detail_text(&detail, "resolved_by", resolved_by);
	dl_detail_text(&detail, "note", note);
	dl_write_audit(locked->row.run, key, AUDIT_DIVERGENCE_RESOLVED,
				   dl_detail_finish(&detail), locked->row.lease_epoch, 0);
}

/*
 * resolve_divergence(key text, verdict text, resolved_by text, note text,
 *                    same_as text) RETURNS durable_ledger.divergences
 *
 * verdict 'same': the drifted call is the same operation as same_as (by
 * default the earlier effect it was found to possibly duplicate): the run's
 * next call of it gets that effect's outcome.  'distinct': it is a new
 * operation: the next call of it executes.  Waits for the run's calls in
 * progress; its later calls wait for the verdict.
 */
Datum
dl_resolve_divergence_1_3(PG_FUNCTION_ARGS)
{
	char	   *key = dl_required_text_arg(fcinfo, 0, "key", 0);
	char	   *verdict = dl_required_text_arg(fcinfo, 1, "verdict", 0);
	char	   *resolved_by = dl_required_text_arg(fcinfo, 2, "resolved_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 3);
	char	   *same_as = dl_optional_text_arg(fcinfo, 4);
	MemoryContext call_cxt = CurrentMemoryContext;
	TupleDesc	desc = dl_result_desc(fcinfo);
	LockedDivergence locked;
	HeapTuple	tuple;
	Datum		result;

	if (strcmp(verdict, "same") != 0 && strcmp(verdict, "distinct") != 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("verdict must be \"same\" or \"distinct\", not \"%s\"", verdict)));
	if (strcmp(verdict, "distinct") == 0 && same_as != NULL)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("same_as is for the verdict \"same\"")));
	dl_check_writable("resolve_divergence()");

	dl_spi_connect();
	lock_undecided_divergence(key, &locked);
	check_not_executed(key);
	if (strcmp(verdict, "same") == 0)
	{
		if (same_as == NULL)
			same_as = locked.row.candidate_key;
		check_same_as(&locked, same_as);
	}
	dl_write_divergence_verdict(&locked, verdict, same_as, resolved_by, note);
	audit_verdict(key, &locked, verdict, same_as, resolved_by, note);
	dl_note_durable_write();

	tuple = dl_read_divergence_tuple(key);
	MemoryContextSwitchTo(call_cxt);
	result = heap_copy_tuple_as_datum(tuple, desc);
	dl_spi_finish();
	PG_RETURN_DATUM(result);
}

/* The rules of tool, looked up once per fork. */
static const ToolRules *
rules_of(List **known, const char *tool)
{
	ListCell   *lc;
	ToolRules  *rules;

	foreach(lc, *known)
	{
		rules = lfirst(lc);
		if (strcmp(rules->row.tool, tool) == 0)
			return rules;
	}
	rules = palloc0(sizeof(ToolRules));
	(void) dl_tool_rules(tool, rules);
	rules->row.tool = pstrdup(tool);
	*known = lappend(*known, rules);
	return rules;
}

/*
 * The effects source_run recorded under derived keys, in the order they were
 * begun, up to up_to (which must be one of them).
 */
static List *
effects_up_to(const char *source_run, const char *up_to)
{
	List	   *keys = dl_read_run_effect_keys(source_run);
	ListCell   *lc;

	foreach(lc, keys)
	{
		if (strcmp(lfirst(lc), up_to) == 0)
			return list_truncate(keys, foreach_current_index(lc) + 1);
	}
	ereport(ERROR,
			(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
			 errmsg("effect \"%s\" is not an effect of run \"%s\" under a derived key",
					up_to, source_run),
			 errhint("Name as up_to the last effect the new run carries: a key of durable_ledger.effects with run \"%s\".",
					 source_run)));
	return NIL;					/* keep compiler quiet */
}

/* Refuses to carry an effect without a settled outcome. */
static void
check_settled(const EffectRow *row, const char *source_run)
{
	if (!row->conflict && (row->status == EFFECT_COMPLETED || row->status == EFFECT_FAILED))
		return;
	ereport(ERROR,
			(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
			 errmsg("effect \"%s\" of run \"%s\" has no settled outcome", row->key, source_run),
			 row->conflict ?
			 errdetail("It is %s and contradicted; a fork carries only completed and failed effects.",
					   dl_status_name(row->status)) :
			 errdetail("It is %s; a fork carries only completed and failed effects.",
					   dl_status_name(row->status)),
			 errhint("A person resolves it with durable_ledger.resolve_effect() first, or the fork stops before it.")));
}

/*
 * Carries one effect into new_run, under new_run's key for the same call;
 * false when it is not carried (a recorded call without an outcome: the new
 * run makes it again).  Waits for a report in progress on it: its outcome is
 * what is carried.
 */
static bool
carry_effect(const char *key, const char *source_run, const char *new_run, List **known_rules)
{
	LockedEffect source;
	StringInfoData canon;
	char		new_key[DL_KEY_HEX_LEN + 1];
	DetailBuilder detail;

	if (!dl_lock_effect(key, &source))
		elog(ERROR, "effect \"%s\" disappeared", key);
	if (source.row.safe_to_redo && source.row.status == EFFECT_STARTED && !source.row.conflict)
		return false;
	check_settled(&source.row, source_run);
	dl_check_run_and_tool(new_run, source.row.tool);
	initStringInfo(&canon);
	dl_append_canonical_args(&canon, dl_identity_of_call(rules_of(known_rules, source.row.tool),
														 source.row.args, NULL));
	dl_derive_key(new_run, source.row.tool, canon.data, canon.len, source.row.occurrence,
				  new_key);
	dl_write_forked_effect(&source, new_run, new_key, 1);
	dl_detail_init(&detail);
	dl_detail_text(&detail, "forked_from", source.row.key);
	dl_detail_text(&detail, "status", dl_status_name(source.row.status));
	dl_write_audit(new_run, new_key, AUDIT_CARRIED, dl_detail_finish(&detail), 1,
				   source.row.attempt);
	return true;
}

/*
 * fork_run(source_run text, new_run text, up_to text, forked_by text,
 *          note text) RETURNS integer
 *
 * A new run whose first steps are those of source_run, up to its effect
 * up_to, in the order they were begun: each effect the source run recorded
 * under a derived key is recorded in new_run under new_run's key for the
 * same call, with its outcome, and says which effect it carries.  The new
 * run's first attempt replays them and executes what comes after (its
 * divergence is judged against them).  Business keys are not carried: they
 * keep their own identity, and a completed one replays in any run; a run
 * with effects under call ids, whose keys name the run, is not forked.  Every
 * effect carried must have a settled outcome; a report in progress on one is
 * waited for.  A recorded call that has none (started: in flight, or lost
 * with its lease) is not carried: the new run makes the call again.  Nothing
 * of the source run changes.  Returns how many effects the new run carries.
 */
Datum
dl_fork_run_1_3(PG_FUNCTION_ARGS)
{
	char	   *source_run = dl_required_text_arg(fcinfo, 0, "source_run", DL_MAX_RUN_CHARS);
	char	   *new_run = dl_required_text_arg(fcinfo, 1, "new_run", DL_MAX_RUN_CHARS);
	char	   *up_to = dl_required_text_arg(fcinfo, 2, "up_to", 0);
	char	   *forked_by = dl_required_text_arg(fcinfo, 3, "forked_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 4);
	uint64		new_lock = dl_run_lock_key(new_run);
	List	   *known_rules = NIL;
	ListCell   *lc;
	int			carried = 0;
	DetailBuilder detail;

	if (strcmp(source_run, new_run) == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("a run cannot be forked into itself")));
	dl_check_writable("fork_run()");
	dl_spi_connect();

	/* the new run is ours until this transaction ends: no lease, no other fork */
	(void) dl_run_lock_xact(new_lock, DL_CALL_LOCK_CLASS, true);
	if (!dl_run_exclude_sessions(new_lock) || dl_read_run_known(new_run))
		ereport(ERROR,
				(errcode(ERRCODE_DUPLICATE_OBJECT),
				 errmsg("run \"%s\" exists already", new_run),
				 errhint("Fork into a run name the ledger has never seen.")));
	if (!dl_read_run_known(source_run))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("run \"%s\" is not in the ledger", source_run)));
	/*
	 * A call id's key names its run, and a fork carries derived keys only: the
	 * new run would make those calls again, under keys of its own, with
	 * nothing to compare them with.
	 */
	if (dl_read_run_has_call_ids(source_run))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("run \"%s\" recorded effects under call ids, which a fork cannot carry",
						source_run),
				 errdetail("The new run would perform those calls again."),
				 errhint("Go on in the run itself, or abandon it (durable_ledger.abandon_run) and start a new one.")));

	foreach(lc, effects_up_to(source_run, up_to))
	{
		if (carry_effect(lfirst(lc), source_run, new_run, &known_rules))
			carried++;
	}
	dl_write_forked_run(new_run, new_lock, source_run, up_to);
	dl_write_fork_counters(new_run, source_run);

	dl_detail_init(&detail);
	dl_detail_text(&detail, "source_run", source_run);
	dl_detail_text(&detail, "up_to", up_to);
	dl_detail_int(&detail, "effects", carried);
	dl_detail_text(&detail, "forked_by", forked_by);
	dl_detail_text(&detail, "note", note);
	dl_write_audit(new_run, NULL, AUDIT_RUN_FORKED, dl_detail_finish(&detail), 1, 0);
	dl_note_durable_write();
	dl_spi_finish();
	PG_RETURN_INT32(carried);
}
