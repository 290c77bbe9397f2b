/*
 * tool_funcs.c: register_tool(), change_tool() and retire_tool(), the admin
 * functions of the tools registry, and set_unregistered_tools() and
 * set_unregistered_divergence(), of the policy for tools nobody registered
 * (tools.c says what both mean for a call).
 * Every change is audited with the name of the person who made it.
 */
#include "postgres.h"

#include "catalog/pg_type.h"
#include "funcapi.h"
#include "utils/array.h"
#include "utils/builtins.h"
#include "utils/timestamp.h"

#include "policy.h"

PG_FUNCTION_INFO_V1(dl_register_tool_1_2);
PG_FUNCTION_INFO_V1(dl_change_tool_1_2);
PG_FUNCTION_INFO_V1(dl_retire_tool_1_2);
PG_FUNCTION_INFO_V1(dl_set_reconcile_1_3);
PG_FUNCTION_INFO_V1(dl_set_approval_1_3);
PG_FUNCTION_INFO_V1(dl_set_budget_1_3);
PG_FUNCTION_INFO_V1(dl_set_unregistered_tools_1_3);
PG_FUNCTION_INFO_V1(dl_set_unregistered_divergence_1_3);

static DivergencePolicy
divergence_named(const char *what, const char *policy)
{
	DivergencePolicy named;

	if (!dl_divergence_from_name(policy, &named))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must be \"pause\", \"warn\" or \"off\", not \"%s\"", what, policy)));
	return named;
}

static DivergencePolicy
policy_arg(FunctionCallInfo fcinfo, int argno)
{
	return divergence_named("divergence", text_to_cstring(PG_GETARG_TEXT_PP(argno)));
}

/*
 * key_fields: top-level field names, none NULL, empty or repeated.  An
 * empty array names none: the whole of args is the identity (*nfields -1).
 */
static void
key_fields_arg(FunctionCallInfo fcinfo, int argno, int *nfields, char ***fields)
{
	Datum	   *elems;
	bool	   *nulls;
	int			n;
	int			i;
	int			j;

	deconstruct_array(PG_GETARG_ARRAYTYPE_P(argno), TEXTOID, -1, false, TYPALIGN_INT,
					  &elems, &nulls, &n);
	*fields = palloc(sizeof(char *) * Max(n, 1));
	for (i = 0; i < n; i++)
	{
		if (nulls[i])
			ereport(ERROR,
					(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
					 errmsg("key_fields must not contain NULL")));
		(*fields)[i] = TextDatumGetCString(elems[i]);
		if ((*fields)[i][0] == '\0')
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("key_fields must not contain an empty name")));
		for (j = 0; j < i; j++)
			if (strcmp((*fields)[i], (*fields)[j]) == 0)
				ereport(ERROR,
						(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
						 errmsg("key_fields names \"%s\" twice", (*fields)[i])));
	}
	*nfields = n == 0 ? -1 : n;
}

/* The same key fields, in any order (the identity args do not depend on it). */
static bool
same_key_fields(const ToolRow *a, const ToolRow *b)
{
	int			i;
	int			j;

	if (a->nkey_fields != b->nkey_fields)
		return false;
	for (i = 0; i < a->nkey_fields; i++)
	{
		for (j = 0; j < b->nkey_fields; j++)
			if (strcmp(a->key_fields[i], b->key_fields[j]) == 0)
				break;
		if (j == b->nkey_fields)
			return false;
	}
	return true;
}

/*
 * The key fields decide the keys of the tool's calls: once a call was keyed
 * by them, other ones would give its replay another key, and it would be
 * executed again.
 */
static void
check_key_fields_change(const ToolRow *from, const ToolRow *to)
{
	if (!same_key_fields(from, to) && dl_read_tool_has_derived_effects(to->tool))
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("the key fields of tool \"%s\" cannot change: calls of it are recorded",
						to->tool),
				 errdetail("Recorded calls were keyed by the present key fields; with others, their replays would get new keys and be executed again."),
				 errhint("Register the new version of the tool under another name.")));
}

static Jsonb *
key_fields_json(const ToolRow *row)
{
	JsonbParseState *state = NULL;
	JsonbValue *result;
	int			i;

	if (row->nkey_fields < 0)
		return NULL;
	pushJsonbValue(&state, WJB_BEGIN_ARRAY, NULL);
	for (i = 0; i < row->nkey_fields; i++)
	{
		JsonbValue	v;

		v.type = jbvString;
		v.val.string.val = row->key_fields[i];
		v.val.string.len = strlen(row->key_fields[i]);
		pushJsonbValue(&state, WJB_ELEM, &v);
	}
	result = pushJsonbValue(&state, WJB_END_ARRAY, NULL);
	return JsonbValueToJsonb(result);
}

static void
audit_tool(AuditEvent event, const ToolRow *row, const char *by_name, const char *by,
		   const char *note)
{
	DetailBuilder detail;

	dl_detail_init(&detail);
	dl_detail_text(&detail, "tool", row->tool);
	dl_detail_text(&detail, by_name, by);
	dl_detail_bool(&detail, "side_effecting", row->side_effecting);
	dl_detail_text(&detail, "divergence", dl_divergence_name(row->divergence));
	dl_detail_jsonb(&detail, "key_fields", key_fields_json(row));
	dl_detail_text(&detail, "note", note);
	dl_write_audit(NULL, NULL, event, dl_detail_finish(&detail), 0, 0);
}

/* tool's row as the function's result, formed in call_cxt (it outlives SPI). */
static Datum
tool_result(FunctionCallInfo fcinfo, MemoryContext call_cxt, const char *tool)
{
	TupleDesc	desc = dl_result_desc(fcinfo);
	HeapTuple	tuple = dl_read_tool_tuple(tool);
	MemoryContext old;
	Datum		result;

	if (tuple == NULL)
		elog(ERROR, "tool \"%s\" has no row", tool);
	old = MemoryContextSwitchTo(call_cxt);
	result = heap_copy_tuple_as_datum(tuple, desc);
	MemoryContextSwitchTo(old);
	return result;
}

static void
error_unknown_tool(const char *tool)
{
	ereport(ERROR,
			(errcode(ERRCODE_UNDEFINED_OBJECT),
			 errmsg("tool \"%s\" is not registered", tool),
			 errhint("Register it with durable_ledger.register_tool().")));
}

/*
 * register_tool(tool text, registered_by text, side_effecting boolean,
 *               divergence text, key_fields text[], note text)
 *   RETURNS durable_ledger.tools
 *
 * divergence defaults to pause for a side-effecting tool, off for a read-only
 * one.  A retired tool is registered anew; a registered one is 23505.
 */
Datum
dl_register_tool_1_2(PG_FUNCTION_ARGS)
{
	MemoryContext call_cxt = CurrentMemoryContext;
	ToolRow		row = {0};
	char	   *registered_by;
	LockedTool	locked;
	Datum		result;

	row.tool = dl_required_text_arg(fcinfo, 0, "tool", DL_MAX_TOOL_CHARS);
	registered_by = dl_required_text_arg(fcinfo, 1, "registered_by", 0);
	if (PG_ARGISNULL(2))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("side_effecting must not be null")));
	row.side_effecting = PG_GETARG_BOOL(2);
	row.divergence = PG_ARGISNULL(3) ?
		(row.side_effecting ? DIVERGENCE_PAUSE : DIVERGENCE_OFF) : policy_arg(fcinfo, 3);
	row.nkey_fields = -1;
	if (!PG_ARGISNULL(4))
		key_fields_arg(fcinfo, 4, &row.nkey_fields, &row.key_fields);
	row.note = dl_optional_text_arg(fcinfo, 5);
	dl_check_writable("register_tool()");

	dl_spi_connect();
	dl_tool_lock(row.tool, true);	/* waits for the tool's calls in progress */
	if (dl_lock_tool(row.tool, &locked))
	{
		if (!locked.row.retired)
			ereport(ERROR,
					(errcode(ERRCODE_UNIQUE_VIOLATION),
					 errmsg("tool \"%s\" is already registered", row.tool),
					 errhint("Change it with durable_ledger.change_tool().")));
		check_key_fields_change(&locked.row, &row);
		dl_write_tool_change(&locked, &row, registered_by, true);
	}
	else
	{
		ToolRow		none = {.nkey_fields = -1};

		none.tool = row.tool;
		check_key_fields_change(&none, &row);
		dl_write_new_tool(&row, registered_by);
	}
	audit_tool(AUDIT_TOOL_REGISTERED, &row, "registered_by", registered_by, row.note);
	dl_note_durable_write();
	result = tool_result(fcinfo, call_cxt, row.tool);
	dl_spi_finish();
	PG_RETURN_DATUM(result);
}

/*
 * Locks a registered tool that is not retired, to change it, once the calls
 * of it in progress have ended (they hold its lock shared).
 */
static void
lock_tool_to_change(const char *tool, LockedTool *locked)
{
	dl_tool_lock(tool, true);
	if (!dl_lock_tool(tool, locked))
		error_unknown_tool(tool);
	if (locked->row.retired)
		ereport(ERROR,
				(errcode(ERRCODE_OBJECT_NOT_IN_PREREQUISITE_STATE),
				 errmsg("tool \"%s\" is retired", tool),
				 errhint("Register it again with durable_ledger.register_tool().")));
}

/*
 * change_tool(tool text, changed_by text, side_effecting boolean,
 *             divergence text, key_fields text[], note text)
 *   RETURNS durable_ledger.tools
 *
 * What is NULL stays as it is; key_fields '{}' means none (the whole args).
 */
Datum
dl_change_tool_1_2(PG_FUNCTION_ARGS)
{
	char	   *tool = dl_required_text_arg(fcinfo, 0, "tool", DL_MAX_TOOL_CHARS);
	char	   *changed_by = dl_required_text_arg(fcinfo, 1, "changed_by", 0);
	MemoryContext call_cxt = CurrentMemoryContext;
	LockedTool	locked;
	ToolRow		to;
	Datum		result;

	dl_check_writable("change_tool()");
	dl_spi_connect();
	lock_tool_to_change(tool, &locked);
	to = locked.row;
	if (!PG_ARGISNULL(2))
		to.side_effecting = PG_GETARG_BOOL(2);
	if (!PG_ARGISNULL(3))
		to.divergence = policy_arg(fcinfo, 3);
	if (!PG_ARGISNULL(4))
		key_fields_arg(fcinfo, 4, &to.nkey_fields, &to.key_fields);
	if (!PG_ARGISNULL(5))
		to.note = dl_optional_text_arg(fcinfo, 5);
	check_key_fields_change(&locked.row, &to);
	dl_write_tool_change(&locked, &to, changed_by, false);
	audit_tool(AUDIT_TOOL_CHANGED, &to, "changed_by", changed_by, to.note);
	dl_note_durable_write();
	result = tool_result(fcinfo, call_cxt, tool);
	dl_spi_finish();
	PG_RETURN_DATUM(result);
}

/*
 * retire_tool(tool text, retired_by text, note text) RETURNS durable_ledger.tools
 *
 * Its calls are executed no more (55L03); what was recorded still replays.
 * Retiring a retired tool changes nothing.
 */
Datum
dl_retire_tool_1_2(PG_FUNCTION_ARGS)
{
	char	   *tool = dl_required_text_arg(fcinfo, 0, "tool", DL_MAX_TOOL_CHARS);
	char	   *retired_by = dl_required_text_arg(fcinfo, 1, "retired_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 2);
	MemoryContext call_cxt = CurrentMemoryContext;
	LockedTool	locked;
	Datum		result;

	dl_check_writable("retire_tool()");
	dl_spi_connect();
	dl_tool_lock(tool, true);	/* waits for the tool's calls in progress */
	if (!dl_lock_tool(tool, &locked))
		error_unknown_tool(tool);
	if (!locked.row.retired)
	{
		dl_write_tool_retired(&locked, retired_by, note);
		audit_tool(AUDIT_TOOL_RETIRED, &locked.row, "retired_by", retired_by, note);
		dl_note_durable_write();
	}
	result = tool_result(fcinfo, call_cxt, tool);
	dl_spi_finish();
	PG_RETURN_DATUM(result);
}

/* A grace longer than a year is a person's matter, not a request in flight. */
#define MAX_RECONCILE_GRACE_DAYS 366

static const char *
grace_text(const ToolRow *row)
{
	return row->reconcilable ?
		DatumGetCString(DirectFunctionCall1(interval_out,
											IntervalPGetDatum(&row->reconcile_grace))) : NULL;
}

/*
 * set_reconcile(tool text, grace interval, changed_by text, note text)
 *   RETURNS durable_ledger.tools
 *
 * Whether a worker may settle an unknown outcome of the tool from the
 * provider's own record (reconcile_effect): grace NULL, no (a person
 * resolves it, the default); else yes, once grace has passed since the
 * ledger found the outcome unknown -- time for a request still in flight
 * to land.  Audited as tool_changed, with the grace before.
 */
Datum
dl_set_reconcile_1_3(PG_FUNCTION_ARGS)
{
	char	   *tool = dl_required_text_arg(fcinfo, 0, "tool", DL_MAX_TOOL_CHARS);
	char	   *changed_by = dl_required_text_arg(fcinfo, 2, "changed_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 3);
	MemoryContext call_cxt = CurrentMemoryContext;
	LockedTool	locked;
	ToolRow		to;
	DetailBuilder detail;
	Datum		result;
	bool		reconcilable = !PG_ARGISNULL(1);
	Interval	grace = {0};

	if (reconcilable)
	{
		int64		usecs;

		grace = *PG_GETARG_INTERVAL_P(1);
		/* counted with days of 24 hours, whatever the time zone (report.c) */
		if (!dl_interval_usecs(&grace, &usecs) || usecs < 0 ||
			usecs > (int64) MAX_RECONCILE_GRACE_DAYS * USECS_PER_DAY)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("grace must be between 0 and %d days", MAX_RECONCILE_GRACE_DAYS),
					 errdetail("It is how long after an outcome was found unknown a worker may settle it: time for a request still in flight to reach the provider.")));
	}
	dl_check_writable("set_reconcile()");
	dl_spi_connect();
	lock_tool_to_change(tool, &locked);
	to = locked.row;
	to.reconcilable = reconcilable;
	to.reconcile_grace = grace;
	if (note != NULL)
		to.note = note;
	dl_write_tool_change(&locked, &to, changed_by, false);

	dl_detail_init(&detail);
	dl_detail_text(&detail, "tool", tool);
	dl_detail_text(&detail, "changed_by", changed_by);
	dl_detail_text(&detail, "reconcile_grace", grace_text(&to));
	dl_detail_text(&detail, "previous_reconcile_grace", grace_text(&locked.row));
	dl_detail_text(&detail, "note", note);
	dl_write_audit(NULL, NULL, AUDIT_TOOL_CHANGED, dl_detail_finish(&detail), 0, 0);
	dl_note_durable_write();
	result = tool_result(fcinfo, call_cxt, tool);
	dl_spi_finish();
	PG_RETURN_DATUM(result);
}

static const char *
approval_text(const ToolRow *row)
{
	return row->approval == NULL ? NULL :
		DatumGetCString(DirectFunctionCall1(jsonpath_out, PointerGetDatum(row->approval)));
}

/*
 * set_approval(tool text, condition jsonpath, changed_by text, note text)
 *   RETURNS durable_ledger.tools
 *
 * Which calls of the tool wait for an approver before they execute: those
 * whose args the strict jsonpath predicate condition matches ('strict true':
 * every call); NULL: none.  A predicate, not SQL: evaluating it runs nothing of anyone's
 * inside a worker's call.  Audited as tool_changed, with the condition before.
 * The calls in progress finish under the rule they began with (they hold
 * the tool's lock shared).
 */
Datum
dl_set_approval_1_3(PG_FUNCTION_ARGS)
{
	char	   *tool = dl_required_text_arg(fcinfo, 0, "tool", DL_MAX_TOOL_CHARS);
	char	   *changed_by = dl_required_text_arg(fcinfo, 2, "changed_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 3);
	MemoryContext call_cxt = CurrentMemoryContext;
	LockedTool	locked;
	ToolRow		to;
	DetailBuilder detail;
	Datum		result;

	dl_check_writable("set_approval()");
	dl_spi_connect();
	lock_tool_to_change(tool, &locked);
	to = locked.row;
	to.approval = PG_ARGISNULL(1) ? NULL : PG_GETARG_JSONPATH_P(1);
	if (to.approval != NULL)
		dl_check_approval_condition(to.approval);
	if (note != NULL)
		to.note = note;
	dl_write_tool_change(&locked, &to, changed_by, false);

	dl_detail_init(&detail);
	dl_detail_text(&detail, "tool", tool);
	dl_detail_text(&detail, "changed_by", changed_by);
	dl_detail_text(&detail, "approval", approval_text(&to));
	dl_detail_text(&detail, "previous_approval", approval_text(&locked.row));
	dl_detail_text(&detail, "note", note);
	dl_write_audit(NULL, NULL, AUDIT_TOOL_CHANGED, dl_detail_finish(&detail), 0, 0);
	dl_note_durable_write();
	result = tool_result(fcinfo, call_cxt, tool);
	dl_spi_finish();
	PG_RETURN_DATUM(result);
}

#define MAX_BUDGET_WINDOW_DAYS 366

static const char *
window_text(const ToolRow *row)
{
	return row->max_in_window == 0 ? NULL :
		DatumGetCString(DirectFunctionCall1(interval_out, IntervalPGetDatum(&row->budget_window)));
}

/*
 * set_budget(tool text, max_executions integer, changed_by text, note text,
 *            max_in_window integer, budget_window interval)
 *   RETURNS durable_ledger.tools
 *
 * A registered tool's budget per run (budgets.c): at most max_executions
 * executions (NULL: no limit), and at most max_in_window of them within
 * budget_window (both NULL: no window).  Counted from the change on: what
 * executed before is not counted.  The calls its budget paused that it no
 * longer stops (a limit removed, or raised past the run's count; a window's
 * removed or raised) are listed no more.  Audited as tool_changed, with the
 * budget before.  The calls in progress finish under the rule they began
 * with.
 */
Datum
dl_set_budget_1_3(PG_FUNCTION_ARGS)
{
	char	   *tool = dl_required_text_arg(fcinfo, 0, "tool", DL_MAX_TOOL_CHARS);
	int32		max_executions = dl_budget_arg(fcinfo, 1, "max_executions", 0);
	char	   *changed_by = dl_required_text_arg(fcinfo, 2, "changed_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 3);
	int32		max_in_window = dl_budget_arg(fcinfo, 4, "max_in_window", DL_MAX_IN_WINDOW);
	MemoryContext call_cxt = CurrentMemoryContext;
	LockedTool	locked;
	ToolRow		to;
	DetailBuilder detail;
	Datum		result;
	Interval	window = {0};
	int64		answered;

	if ((max_in_window > 0) != !PG_ARGISNULL(5))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("max_in_window and budget_window are given together, or neither")));
	if (max_in_window > 0)
	{
		int64		usecs;

		window = *PG_GETARG_INTERVAL_P(5);
		/* no months: a month's length is the calendar's, a window's must not be */
		if (window.month != 0 || !dl_interval_usecs(&window, &usecs) || usecs <= 0 ||
			usecs > (int64) MAX_BUDGET_WINDOW_DAYS * USECS_PER_DAY)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("budget_window must be longer than 0 and at most %d days, in days, hours, minutes or seconds",
							MAX_BUDGET_WINDOW_DAYS)));
	}
	dl_check_writable("set_budget()");
	dl_spi_connect();
	lock_tool_to_change(tool, &locked);
	to = locked.row;
	to.max_executions = max_executions;
	to.max_in_window = max_in_window;
	to.budget_window = window;
	if (note != NULL)
		to.note = note;
	dl_write_tool_change(&locked, &to, changed_by, false);
	answered = dl_write_tool_pauses_answered(tool, to.max_executions, to.max_in_window,
											 locked.row.max_in_window);

	dl_detail_init(&detail);
	dl_detail_text(&detail, "tool", tool);
	dl_detail_text(&detail, "changed_by", changed_by);
	dl_detail_int(&detail, "pauses_answered", answered);
	dl_detail_count_or_null(&detail, "max_executions", to.max_executions);
	dl_detail_count_or_null(&detail, "max_in_window", to.max_in_window);
	dl_detail_text(&detail, "budget_window", window_text(&to));
	dl_detail_count_or_null(&detail, "previous_max_executions", locked.row.max_executions);
	dl_detail_count_or_null(&detail, "previous_max_in_window", locked.row.max_in_window);
	dl_detail_text(&detail, "previous_budget_window", window_text(&locked.row));
	dl_detail_text(&detail, "note", note);
	dl_write_audit(NULL, NULL, AUDIT_TOOL_CHANGED, dl_detail_finish(&detail), 0, 0);
	dl_note_durable_write();
	result = tool_result(fcinfo, call_cxt, tool);
	dl_spi_finish();
	PG_RETURN_DATUM(result);
}

/* The two settings of the policy for tools nobody registered. */
typedef enum PolicySetting
{
	POLICY_MAY_EXECUTE,			/* set_unregistered_tools: allow, warn, refuse */
	POLICY_DIVERGENCE			/* set_unregistered_divergence: pause, warn, off */
} PolicySetting;

static const char *
setting_value(const UnregisteredPolicy *policy, PolicySetting setting)
{
	return setting == POLICY_MAY_EXECUTE ? dl_unregistered_name(policy->may_execute) :
		dl_divergence_name(policy->divergence);
}

/*
 * Changes one setting of the policy (the other is kept), audited as
 * policy_changed with the setting's new and previous value; returns the
 * value it replaces.  Waits for the calls of unregistered tools in progress,
 * which hold the policy's lock shared.
 */
static const char *
set_policy(PolicySetting setting, int value, const char *set_by, const char *note,
		   const char *function)
{
	UnregisteredPolicy before;
	UnregisteredPolicy after;
	DetailBuilder detail;

	dl_check_writable(function);
	dl_spi_connect();
	(void) dl_policy_lock(true);
	if (setting == POLICY_MAY_EXECUTE)
	{
		UnregisteredTools may_execute = (UnregisteredTools) value;

		before = dl_write_unregistered_policy(&may_execute, NULL, set_by, note, &after);
	}
	else
	{
		DivergencePolicy divergence = (DivergencePolicy) value;

		before = dl_write_unregistered_policy(NULL, &divergence, set_by, note, &after);
	}
	dl_detail_init(&detail);
	dl_detail_text(&detail, setting == POLICY_MAY_EXECUTE ? "unregistered_tools" :
				   "unregistered_divergence", setting_value(&after, setting));
	dl_detail_text(&detail, "previous", setting_value(&before, setting));
	dl_detail_text(&detail, "set_by", set_by);
	dl_detail_text(&detail, "note", note);
	dl_write_audit(NULL, NULL, AUDIT_POLICY_CHANGED, dl_detail_finish(&detail), 0, 0);
	dl_note_durable_write();
	dl_spi_finish();
	return setting_value(&before, setting);
}

/*
 * set_unregistered_tools(setting text, set_by text, note text) RETURNS text
 *
 * What the ledger does with a call of a tool nobody registered that would
 * execute: allow, warn (a WARNING) or refuse (55L03).  Returns the setting
 * it replaces.
 */
Datum
dl_set_unregistered_tools_1_3(PG_FUNCTION_ARGS)
{
	char	   *setting = dl_required_text_arg(fcinfo, 0, "setting", 0);
	char	   *set_by = dl_required_text_arg(fcinfo, 1, "set_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 2);
	UnregisteredTools to;

	if (!dl_unregistered_from_name(setting, &to))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("setting must be \"allow\", \"warn\" or \"refuse\", not \"%s\"", setting)));
	PG_RETURN_TEXT_P(cstring_to_text(set_policy(POLICY_MAY_EXECUTE, to, set_by, note,
												"set_unregistered_tools()")));
}

/*
 * set_unregistered_divergence(setting text, set_by text, note text) RETURNS text
 *
 * How a later attempt's call of a tool nobody registered that diverges from
 * the run's earlier attempts is handled: pause (the default), warn or off.
 * Returns the setting it replaces.
 */
Datum
dl_set_unregistered_divergence_1_3(PG_FUNCTION_ARGS)
{
	char	   *setting = dl_required_text_arg(fcinfo, 0, "setting", 0);
	char	   *set_by = dl_required_text_arg(fcinfo, 1, "set_by", 0);
	char	   *note = dl_optional_text_arg(fcinfo, 2);
	DivergencePolicy to = divergence_named("setting", setting);

	PG_RETURN_TEXT_P(cstring_to_text(set_policy(POLICY_DIVERGENCE, to, set_by, note,
												"set_unregistered_divergence()")));
}
