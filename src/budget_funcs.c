/*
 * budget_funcs.c: set_attempts_budget() and set_run_budget(), the admin
 * functions of the budgets a person raises when a runaway loop was stopped
 * (budgets.c says what they mean for a call; set_budget(), of a tool's, is
 * in tool_funcs.c with the registry).  Every change is audited by name.
 */
#include "postgres.h"

#include "utils/builtins.h"

#include "lease.h"

PG_FUNCTION_INFO_V1(dl_set_attempts_budget_1_3);
PG_FUNCTION_INFO_V1(dl_set_run_budget_1_3);

/*
 * set_attempts_budget(max_attempts integer, changed_by text, note text)
 *   RETURNS integer
 *
 * Every run's budget of attempts (lease epochs) that has none of its own; a
 * call that would execute in a later attempt pauses.  NULL: none.  Returns
 * the budget it replaces.  When it removes or raises it, the calls it paused
 * in runs without a budget of their own are listed no more (one still
 * stopped pauses again).  Audited as policy_changed.
 */
Datum
dl_set_attempts_budget_1_3(PG_FUNCTION_ARGS)
{
	int32		max_attempts = dl_budget_arg(fcinfo, 0, "max_attempts", 0);
	char	   *changed_by = dl_required_text_arg(fcinfo, 1, "changed_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 2);
	DetailBuilder detail;
	int32		before;
	int64		answered;

	dl_check_writable("set_attempts_budget()");
	dl_spi_connect();
	before = dl_write_policy_attempts(max_attempts, changed_by, note);
	answered = dl_write_attempts_pauses_answered(max_attempts, before);
	dl_detail_init(&detail);
	dl_detail_count_or_null(&detail, "max_run_attempts", max_attempts);
	dl_detail_count_or_null(&detail, "previous", before);
	dl_detail_int(&detail, "pauses_answered", answered);
	dl_detail_text(&detail, "set_by", changed_by);
	dl_detail_text(&detail, "note", note);
	dl_write_audit(NULL, NULL, AUDIT_POLICY_CHANGED, dl_detail_finish(&detail), 0, 0);
	dl_note_durable_write();
	dl_spi_finish();
	if (before == 0)
		PG_RETURN_NULL();
	PG_RETURN_INT32(before);
}

/*
 * set_run_budget(run text, changed_by text, note text, tool text,
 *                max_executions integer, max_in_window integer,
 *                max_attempts integer) RETURNS void
 *
 * One run's own budgets, set by the person who answers a pause: of a
 * budgeted tool's executions (max_executions) and of those in its window
 * (max_in_window), and of attempts (max_attempts).  What is NULL is kept; at
 * least one is given.  The run's pauses of the budgets given are listed no
 * more: a call that a budget still stops pauses again.  Audited as
 * budget_changed.
 */
Datum
dl_set_run_budget_1_3(PG_FUNCTION_ARGS)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	char	   *changed_by = dl_required_text_arg(fcinfo, 1, "changed_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 2);
	char	   *tool = PG_ARGISNULL(3) ? NULL : dl_required_text_arg(fcinfo, 3, "tool", DL_MAX_TOOL_CHARS);
	int32		max_executions = dl_budget_arg(fcinfo, 4, "max_executions", 0);
	int32		max_in_window = dl_budget_arg(fcinfo, 5, "max_in_window", DL_MAX_IN_WINDOW);
	int32		max_attempts = dl_budget_arg(fcinfo, 6, "max_attempts", 0);
	bool		executions_given = max_executions > 0;
	bool		window_given = max_in_window > 0;
	bool		attempts_given = max_attempts > 0;
	DetailBuilder detail;
	int32		attempts_before = 0;
	int64		answered;

	if (!executions_given && !window_given && !attempts_given)
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("set_run_budget() needs a budget to set"),
				 errhint("Give max_executions or max_in_window (with tool), or max_attempts.")));
	if ((executions_given || window_given) != (tool != NULL))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg(tool == NULL ? "max_executions and max_in_window are budgets of a tool: name it" :
						"tool is given without a budget of it"),
				 errhint("max_attempts is the run's own; max_executions and max_in_window are of the tool named.")));
	dl_check_writable("set_run_budget()");
	dl_spi_connect();
	/*
	 * Waits for the run's calls in progress and keeps new ones out until
	 * this commits, as abandon_run does: a call reads the run's counter and
	 * writes it back, and must not miss a change of its budget between.
	 */
	dl_run_lock_closing(dl_run_lock_key(run));
	if (!dl_read_run_known(run))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("run \"%s\" is not in the ledger", run),
				 errdetail("A run's own budget is set once it has begun.")));
	if (tool != NULL)
	{
		ToolRow		row;

		if (!dl_read_tool(tool, &row) ||
			(row.max_executions == 0 && row.max_in_window == 0))
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("tool \"%s\" has no budget", tool),
					 errdetail("Only the executions of a tool with a budget are counted."),
					 errhint("An admin gives it one with durable_ledger.set_budget().")));
		if (window_given && row.max_in_window == 0)
			ereport(ERROR,
					(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
					 errmsg("tool \"%s\" has no window", tool),
					 errhint("An admin gives it one with durable_ledger.set_budget(..., max_in_window => ..., budget_window => ...).")));
		dl_write_run_budget(run, tool, executions_given ? &max_executions : NULL,
							window_given ? &max_in_window : NULL);
	}
	if (attempts_given && !dl_write_run_attempts(run, max_attempts, &attempts_before))
		ereport(ERROR,
				(errcode(ERRCODE_UNDEFINED_OBJECT),
				 errmsg("run \"%s\" has no row in durable_ledger.runs", run),
				 errdetail("A run's own budget of attempts is set once a lease of it began an attempt.")));
	answered = dl_write_run_pauses_answered(run, tool, executions_given, window_given,
											attempts_given);

	dl_detail_init(&detail);
	dl_detail_text(&detail, "tool", tool);
	if (executions_given)
		dl_detail_int(&detail, "max_executions", max_executions);
	if (window_given)
		dl_detail_int(&detail, "max_in_window", max_in_window);
	if (attempts_given)
	{
		dl_detail_int(&detail, "max_attempts", max_attempts);
		dl_detail_count_or_null(&detail, "previous_max_attempts", attempts_before);
	}
	dl_detail_int(&detail, "pauses_answered", answered);
	dl_detail_text(&detail, "changed_by", changed_by);
	dl_detail_text(&detail, "note", note);
	dl_write_audit(run, NULL, AUDIT_BUDGET_CHANGED, dl_detail_finish(&detail), 0, 0);
	dl_note_durable_write();
	dl_spi_finish();
	PG_RETURN_VOID();
}
