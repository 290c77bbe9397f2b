/*
 * tools.c: what the tools registry (durable_ledger.tools) says about a call.
 *
 * A registered tool says whether it changes the world, how divergence of a
 * later attempt's calls is handled (divergence.c), and which fields of args
 * make a call's identity (identity.c).  A retired tool is executed no more.
 * A tool nobody registered is handled as the ledger's policy says (a row of
 * durable_ledger.policy): whether it may execute (set_unregistered_tools():
 * allow, the default, warn, or refuse), judged only when a call would
 * execute, since replaying what was recorded performs nothing; and how its
 * calls' divergence is handled (set_unregistered_divergence(): pause, the
 * default since 1.3, warn or off).  A row, not a setting: a setting of a
 * library loaded on first use is overridden by a client's startup options.
 */
#include "postgres.h"

#include "miscadmin.h"
#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/memutils.h"

#include "policy.h"

/* The registry's rules for tool, as committed now (effect_key: no lock). */
void
dl_tool_rules_now(const char *tool, ToolRules *rules)
{
	rules->registered = dl_read_tool(tool, &rules->row);
}

/*
 * The registry's rules for tool, as committed now, fixed until this
 * transaction ends: a call holds its tool's lock shared, and register_tool,
 * change_tool and retire_tool take it exclusively, so that they wait for the
 * calls in progress (whose intents they then see) and the calls after them
 * read what they wrote.  True when the call had to wait for a change.
 */
bool
dl_tool_rules(const char *tool, ToolRules *rules)
{
	bool		waited = dl_tool_lock(tool, false);

	rules->registered = dl_read_tool_remembered(tool, &rules->row);
	return waited;
}

/*
 * The args that make a call's identity: its tool's key fields, or all of
 * args.  With complete NULL, args without every key field are an error; else
 * *complete says whether they had them (NULL is returned when not).
 */
Jsonb *
dl_identity_of_call(const ToolRules *rules, Jsonb *args, bool *complete)
{
	if (complete != NULL)
		*complete = true;
	if (!rules->registered || rules->row.nkey_fields < 0)
		return args;
	return dl_identity_args(rules->row.tool, args, rules->row.nkey_fields,
							rules->row.key_fields, complete);
}

/*
 * A call of a tool nobody registered that would execute holds their
 * policy's lock shared until its transaction ends, so that
 * set_unregistered_tools waits for it; true when it had to wait for a change
 * of the policy: the call then decides again, on its row as it is now.
 * Taken before dl_may_execute reads the policy.
 */
bool
dl_policy_changed_meanwhile(const ToolRules *rules)
{
	return !rules->registered && dl_policy_lock(false);
}

/*
 * Refuses, before anything is written, a call that may not execute; true
 * when it executes with a warning (dl_warn_unregistered), a tool nobody
 * registered under policy warn.  For such a tool, the caller holds the
 * policy's lock (dl_policy_changed_meanwhile).
 */
bool
dl_may_execute(const char *tool, const ToolRules *rules)
{
	if (rules->registered && rules->row.retired)
		ereport(ERROR,
				(errcode(ERRCODE_DL_TOOL_REFUSED),
				 errmsg("tool \"%s\" is retired", tool),
				 errdetail("A retired tool is executed no more; nothing was recorded."),
				 errhint("An admin registers it again with durable_ledger.register_tool().")));
	if (rules->registered)
		return false;
	switch (dl_read_unregistered_policy_remembered().may_execute)
	{
		case UNREGISTERED_ALLOW:
			break;
		case UNREGISTERED_WARN:
			return true;
		case UNREGISTERED_REFUSE:
			ereport(ERROR,
					(errcode(ERRCODE_DL_TOOL_REFUSED),
					 errmsg("tool \"%s\" is not registered", tool),
					 errdetail("The ledger refuses tools nobody registered (durable_ledger.set_unregistered_tools); nothing was recorded."),
					 errhint("An admin registers it with durable_ledger.register_tool().")));
			break;
	}
	return false;
}

/* The WARNING of a call of a tool nobody registered, under policy warn. */
void
dl_warn_unregistered(const char *tool)
{
	ereport(WARNING,
			(errcode(ERRCODE_DL_WARNING_UNREGISTERED),
			 errmsg("tool \"%s\" is not registered", tool),
			 errhint("An admin registers the tools a deployment uses with durable_ledger.register_tool().")));
}

/*
 * Refuses, before anything is written, to record a call of a tool registered
 * as side-effecting as safe to redo (begin_recorded): its unknown outcome
 * must wait for a person, not be executed again.
 */
void
dl_check_may_redo(const char *tool, const ToolRules *rules)
{
	if (rules->registered && rules->row.side_effecting)
		ereport(ERROR,
				(errcode(ERRCODE_DL_TOOL_REFUSED),
				 errmsg("tool \"%s\" is registered as side-effecting: its calls cannot be recorded as safe to redo", tool),
				 errdetail("begin_recorded() executes a call whose outcome is unknown again; a side effect's unknown outcome waits for a person. Nothing was recorded."),
				 errhint("Call it with durable_ledger.begin_effect(); or, if calling it twice is harmless, an admin says so with durable_ledger.change_tool(tool, changed_by, side_effecting => false).")));
}

/*
 * How divergence is handled for a later attempt's calls of the tool: as the
 * registry says, or for a tool nobody registered as the policy says (pause
 * unless an admin chose otherwise).
 */
DivergencePolicy
dl_divergence_policy(const ToolRules *rules, bool *waited)
{
	*waited = false;
	if (rules->registered)
		return rules->row.divergence;
	*waited = dl_policy_lock(false);	/* set_unregistered_divergence waits for this call */
	return dl_read_unregistered_policy_remembered().divergence;
}

/*
 * Whether a call is judged for divergence: a recorded call (begin_recorded,
 * a model's turn or a read) of a tool nobody registered never is -- making
 * it again with other args performs nothing --, though its replays are
 * counted as any call's, so that the tool's side-effecting calls, if any,
 * are judged alike.  A registered tool's calls are judged as the registry
 * says, recorded or not.
 */
bool
dl_divergence_judged(const ToolRules *rules, bool recorded)
{
	return rules->registered || !recorded;
}

/*
 * Whether args match an approval condition: a strict jsonpath predicate
 * (dl_check_approval_condition), evaluated silently.  Strict, a field it
 * names that args lack is an error, which silent evaluation turns into no
 * answer; and no answer -- that, or a result that is no boolean (a path, not
 * a predicate) -- asks for an approval: a rule an admin wrote to stop calls
 * never lets one through by a slip of its spelling.
 */
static bool
condition_matches(JsonPath *condition, Jsonb *args)
{
	static Jsonb *no_variables = NULL;	/* '{}', made once: a condition names none */
	LOCAL_FCINFO(fcinfo, 4);
	Datum		matched;

	if (no_variables == NULL)
	{
		MemoryContext old = MemoryContextSwitchTo(TopMemoryContext);

		no_variables = DatumGetJsonbP(DirectFunctionCall1(jsonb_in, CStringGetDatum("{}")));
		MemoryContextSwitchTo(old);
	}
	InitFunctionCallInfoData(*fcinfo, NULL, 4, InvalidOid, NULL, NULL);
	fcinfo->args[0].value = JsonbPGetDatum(args);
	fcinfo->args[0].isnull = false;
	fcinfo->args[1].value = PointerGetDatum(condition);
	fcinfo->args[1].isnull = false;
	fcinfo->args[2].value = JsonbPGetDatum(no_variables);
	fcinfo->args[2].isnull = false;
	fcinfo->args[3].value = BoolGetDatum(true);	/* silent */
	fcinfo->args[3].isnull = false;
	matched = jsonb_path_match(fcinfo);
	return fcinfo->isnull || DatumGetBool(matched);
}

/* Whether a call with args needs an approver before it executes (set_approval). */
bool
dl_needs_approval(const ToolRules *rules, Jsonb *args)
{
	if (!rules->registered || rules->row.approval == NULL)
		return false;
	return condition_matches(rules->row.approval, args);
}

/* Whether a jsonpath item, or one it contains or is followed by, is a variable. */
static bool
names_a_variable(JsonPathItem *item)
{
	JsonPathItem arg;
	JsonPathItem to;
	int			i;

	check_stack_depth();
	switch (item->type)
	{
		case jpiVariable:
			return true;
		case jpiAnd:
		case jpiOr:
		case jpiEqual:
		case jpiNotEqual:
		case jpiLess:
		case jpiGreater:
		case jpiLessOrEqual:
		case jpiGreaterOrEqual:
		case jpiAdd:
		case jpiSub:
		case jpiMul:
		case jpiDiv:
		case jpiMod:
		case jpiStartsWith:
			jspGetLeftArg(item, &arg);
			if (names_a_variable(&arg))
				return true;
			jspGetRightArg(item, &arg);
			if (names_a_variable(&arg))
				return true;
			break;
		case jpiNot:
		case jpiIsUnknown:
		case jpiPlus:
		case jpiMinus:
		case jpiFilter:
		case jpiExists:
			jspGetArg(item, &arg);
			if (names_a_variable(&arg))
				return true;
			break;
		case jpiDatetime:
			if (item->content.arg)	/* its template, when it has one */
			{
				jspGetArg(item, &arg);
				if (names_a_variable(&arg))
					return true;
			}
			break;
		case jpiLikeRegex:
			jspInitByBuffer(&arg, item->base, item->content.like_regex.expr);
			if (names_a_variable(&arg))
				return true;
			break;
		case jpiIndexArray:
			for (i = 0; i < item->content.array.nelems; i++)
			{
				bool		range = jspGetArraySubscript(item, &arg, &to, i);

				if (names_a_variable(&arg) || (range && names_a_variable(&to)))
					return true;
			}
			break;
		default:
			break;
	}
	return jspGetNext(item, &arg) && names_a_variable(&arg);
}

/*
 * An approval condition is a strict jsonpath: in lax mode a field it names
 * that a call's args lack compares as false, so a misspelt field would let
 * every call through.  It names no variable, which a call cannot pass (every
 * call would fail).
 */
void
dl_check_approval_condition(JsonPath *condition)
{
	JsonPathItem root;

	if (condition->header & JSONPATH_LAX)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("an approval condition must be a strict jsonpath"),
				 errdetail("In lax mode a field the condition names that a call's args lack compares as false: a misspelt field would let every call through."),
				 errhint("Write it in strict mode, e.g. 'strict $.amount > 100': a call whose args lack a field it names then waits for an approver.")));
	jspInit(&root, condition);
	if (names_a_variable(&root))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("an approval condition must not name a variable"),
				 errdetail("A call passes its args alone: the condition is evaluated with no variables."),
				 errhint("Write the value itself, e.g. 'strict $.amount > 100'.")));
}
