/*
 * budgets.c: what stops a runaway loop.  Each call is one the ledger must
 * execute when it is new (new args, a new occurrence: "again" is not
 * "twice"), so a loop that rewords its call would execute forever.  A budget
 * the database holds stops it: per registered tool, at most N executions per
 * run, and at most M per run within a window (set_budget); per run, at most K
 * attempts (set_attempts_budget, or the run's own: set_run_budget).
 *
 * Only a call that would execute is judged, and only an execution is
 * counted: a replay, a pause or an approval request never are.  The count is
 * a counter row per run and tool (run_budgets), locked and written in the
 * call's transaction (a rolled-back call counts nothing) under the run's
 * lease, which serialises the run's calls, so two workers sharing a token
 * lease never count past a budget; nothing reads the run's history.
 * The call a budget stops pauses: nothing is performed or recorded but the
 * pause, listed in unresolved until a person changes the budget that paused
 * it, or the tool executes again in the run (once a window has room).
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/timestamp.h"

#include "policy.h"

static const char *
interval_text(const Interval *interval)
{
	return DatumGetCString(DirectFunctionCall1(interval_out, IntervalPGetDatum(interval)));
}

static void
stopped_by(BudgetCheck *check, const char *budget, int32 limit, int32 count, char *reason)
{
	check->stopped = true;
	check->budget = budget;
	check->limit = limit;
	check->count = count;
	check->reason = reason;
}

#define BUDGET_HINT \
	"nothing was performed; a person raises the run's budget (durable_ledger.set_run_budget()) or abandons the run (abandon_run)"
#define BUDGET_WINDOW_HINT \
	"nothing was performed; the next call executes once the window has room, or a person raises the run's budget (durable_ledger.set_run_budget()) or abandons the run (abandon_run)"

static const char *
times(int32 n)
{
	return n == 1 ? "once" : psprintf("%d times", n);
}

/*
 * The window's executions that began after now - window, the oldest first
 * in row->recent: how many there are, and where they start.
 */
static int
in_window(const BudgetCheck *check, int *first)
{
	TimestampTz since = DatumGetTimestampTz(DirectFunctionCall2(timestamptz_mi_interval,
																TimestampTzGetDatum(check->now),
																IntervalPGetDatum(&check->window)));
	int			i;

	for (i = 0; i < check->counter.row.nrecent && check->counter.row.recent[i] <= since; i++)
		;
	*first = i;
	return check->counter.row.nrecent - i;
}

/*
 * The tool's budget in the run: its counter is locked, its latest version
 * (write_budgets.c says why a lock, under the run's lease), and judged.
 */
static void
judge_tool_budget(const CallLease *lease, const char *tool, const ToolRow *tool_row,
				  BudgetCheck *check)
{
	int			first;
	int			n;

	check->counted = true;
	dl_lock_run_budget(lease->run, tool, &check->counter);
	check->max_executions = check->counter.row.max_executions > 0 ? check->counter.row.max_executions :
		tool_row->max_executions;
	check->max_in_window = tool_row->max_in_window > 0 ?
		(check->counter.row.max_in_window > 0 ? check->counter.row.max_in_window : tool_row->max_in_window) : 0;
	check->window = tool_row->budget_window;
	if (check->max_executions > 0 && check->counter.row.executions >= check->max_executions)
	{
		stopped_by(check, "executions", check->max_executions, check->counter.row.executions,
				   psprintf("budget: tool \"%s\" executed %s in this run, its budget of %d per run; " BUDGET_HINT,
							tool, times(check->counter.row.executions), check->max_executions));
		return;
	}
	if (check->max_in_window == 0)
		return;
	n = in_window(check, &first);
	if (n >= check->max_in_window)
		stopped_by(check, "window", check->max_in_window, n,
				   psprintf("budget: tool \"%s\" executed %s in this run within %s, its budget of %d per %s; " BUDGET_WINDOW_HINT,
							tool, times(n), interval_text(&check->window), check->max_in_window,
							interval_text(&check->window)));
}

/*
 * Whether a budget stops the call of tool that would execute in the lease's
 * epoch: check says which, and what the call counts once it executes.
 */
bool
dl_budget_stops(const CallLease *lease, const char *tool, const ToolRules *rules,
				BudgetCheck *check)
{
	memset(check, 0, sizeof(BudgetCheck));
	check->now = GetCurrentTimestamp();
	if (lease->epoch > 1)
	{
		bool		forked;
		int32		max_attempts = dl_read_attempts_budget_remembered(lease->run, &forked);
		/* a forked run's epoch 1 is the fork's: its first attempt is epoch 2 */
		int64		attempt = forked ? lease->epoch - 1 : lease->epoch;

		if (max_attempts > 0 && attempt > max_attempts)
		{
			stopped_by(check, "attempts", max_attempts, (int32) attempt,
					   psprintf("budget: this is attempt " INT64_FORMAT " of the run, past its budget of %d attempt%s; " BUDGET_HINT,
								attempt, max_attempts, max_attempts == 1 ? "" : "s"));
			return true;
		}
	}
	if (rules->registered && (rules->row.max_executions > 0 || rules->row.max_in_window > 0))
		judge_tool_budget(lease, tool, &rules->row, check);
	return check->stopped;
}

/* The call check judged executed: counted, with the window's latest times. */
void
dl_budget_count(const CallLease *lease, const char *tool, const BudgetCheck *check)
{
	TimestampTz *recent;
	int			first = 0;
	int			n = 0;

	if (!check->counted)
		return;
	if (check->counter.row.executions == PG_INT32_MAX)
		ereport(ERROR,
				(errcode(ERRCODE_PROGRAM_LIMIT_EXCEEDED),
				 errmsg("too many executions of tool \"%s\" in run \"%s\"", tool, lease->run)));
	recent = palloc(sizeof(TimestampTz) * (Min(check->max_in_window, check->counter.row.nrecent) + 1));
	if (check->max_in_window > 0)
	{
		int			kept = in_window(check, &first);

		/* the latest max_in_window, this one included */
		if (kept >= check->max_in_window)
		{
			first += kept - check->max_in_window + 1;
			kept = check->max_in_window - 1;
		}
		memcpy(recent, check->counter.row.recent + first, sizeof(TimestampTz) * kept);
		recent[kept] = check->now;
		n = kept + 1;
	}
	dl_write_budget_count(lease->run, tool, &check->counter, recent, n);
}

/* The call check stopped is recorded paused (key, args): unresolved lists it. */
void
dl_budget_pause(const CallLease *lease, const char *tool, const char *key, Jsonb *args,
				const BudgetCheck *check)
{
	BudgetCounter counter = check->counter;

	if (!check->counted)		/* stopped by the attempts: the counter was not read */
		dl_lock_run_budget(lease->run, tool, &counter);
	dl_write_budget_pause(lease->run, tool, &counter, key, args, lease->epoch, check->budget,
						  check->reason);
}
