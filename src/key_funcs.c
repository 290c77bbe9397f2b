/*
 * key_funcs.c: the SQL functions canonical_args() and effect_key(), which
 * compute without writing anything what begin_effect() derives (effect_key
 * with the key fields the registry gives the tool).
 */
#include "postgres.h"

#include "utils/builtins.h"

#include "policy.h"

PG_FUNCTION_INFO_V1(dl_canonical_args_1_3);
PG_FUNCTION_INFO_V1(dl_canonical_args);
PG_FUNCTION_INFO_V1(dl_effect_key);
PG_FUNCTION_INFO_V1(dl_effect_key_1_2);
PG_FUNCTION_INFO_V1(dl_effect_key_1_3);

/*
 * canonical_args(args jsonb) RETURNS text
 *
 * 1.3's symbol: the canonical text is bounded (canonical.c).  Writing
 * nothing, the older SQL objects' symbols compute the same.
 */
Datum
dl_canonical_args_1_3(PG_FUNCTION_ARGS)
{
	Jsonb	   *args = dl_required_jsonb_arg(fcinfo, 0, "args");
	StringInfoData buf;

	initStringInfo(&buf);
	dl_append_canonical_args(&buf, args);
	PG_RETURN_TEXT_P(cstring_to_text_with_len(buf.data, buf.len));
}

/* canonical_args of the SQL objects of 1.0 to 1.2 */
Datum
dl_canonical_args(PG_FUNCTION_ARGS)
{
	return dl_canonical_args_1_3(fcinfo);
}

static int32
occurrence_arg(FunctionCallInfo fcinfo, int argno)
{
	int32		occurrence;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("occurrence must not be null")));
	occurrence = PG_GETARG_INT32(argno);
	if (occurrence < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("occurrence must be at least 1"),
				 errdetail("The occurrence given was %d.", occurrence)));
	return occurrence;
}

/*
 * The key of effect_key's call: from all of args, or (registry) from the
 * identity args of a tool registered with key fields, as the registry says now.
 */
static Datum
effect_key_of_call(FunctionCallInfo fcinfo, bool registry)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	char	   *tool = dl_required_text_arg(fcinfo, 1, "tool", DL_MAX_TOOL_CHARS);
	Jsonb	   *args = dl_required_jsonb_arg(fcinfo, 2, "args");
	int32		occurrence = occurrence_arg(fcinfo, 3);
	StringInfoData canon;
	char		key[DL_KEY_HEX_LEN + 1];

	if (registry)
	{
		ToolRules	rules;

		dl_tool_rules_now(tool, &rules);
		args = dl_identity_of_call(&rules, args, NULL);
	}
	initStringInfo(&canon);
	dl_append_canonical_args(&canon, args);
	dl_derive_key(run, tool, canon.data, canon.len, occurrence, key);
	PG_RETURN_TEXT_P(cstring_to_text(key));
}

/*
 * effect_key(run text, tool text, args jsonb, occurrence integer) RETURNS text
 *
 * As begin_effect derives it: from the identity args of a tool registered
 * with key fields (as the registry says now), else from all of args.
 */
Datum
dl_effect_key_1_3(PG_FUNCTION_ARGS)
{
	return effect_key_of_call(fcinfo, true);
}

/* effect_key of the 1.2 SQL objects: the same */
Datum
dl_effect_key_1_2(PG_FUNCTION_ARGS)
{
	return effect_key_of_call(fcinfo, true);
}

/* effect_key of the 1.0 and 1.1 SQL objects: all of args (they had no registry) */
Datum
dl_effect_key(PG_FUNCTION_ARGS)
{
	return effect_key_of_call(fcinfo, false);
}
