/*
 * identity.c: the part of a call's args that makes its identity.
 *
 * A registered tool may name key_fields: the top-level fields of args that
 * say which operation a call is (the invoice and the amount, not the memo a
 * model words differently on every replay).  Its calls are then counted and
 * keyed by the object of those fields alone, each as the call passed it:
 *
 *   identity args = { f: args->f  for f in key_fields }
 *
 * which canonical_args() then writes as it writes any args, so that a key is
 * recomputed in plain SQL with jsonb_object_agg (docs/keys.md).  A call
 * without one of the fields has no identity: it is refused, never keyed by
 * the fields it happens to have.
 */
#include "postgres.h"

#include "utils/jsonb.h"

#include "common.h"

/*
 * The identity args of a call of tool.  With complete NULL, args that are
 * not an object or lack a key field are an error; else *complete says
 * whether they had them all (NULL is returned when not).
 */
Jsonb *
dl_identity_args(const char *tool, Jsonb *args, int nfields, char *const *fields,
				 bool *complete)
{
	JsonbParseState *state = NULL;
	JsonbValue *result;
	int			i;

	if (complete != NULL)
		*complete = JB_ROOT_IS_OBJECT(args) && !JB_ROOT_IS_SCALAR(args);
	if (complete != NULL && !*complete)
		return NULL;
	if (!JB_ROOT_IS_OBJECT(args) || JB_ROOT_IS_SCALAR(args))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("args of tool \"%s\" must be a JSON object", tool),
				 errdetail("The tool is registered with key fields, which are fields of its args.")));

	pushJsonbValue(&state, WJB_BEGIN_OBJECT, NULL);
	for (i = 0; i < nfields; i++)
	{
		JsonbValue	key;
		JsonbValue *value;

		value = getKeyJsonValueFromContainer(&args->root, fields[i], strlen(fields[i]), NULL);
		if (value == NULL && complete != NULL)
		{
			*complete = false;
			return NULL;
		}
		if (value == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("args of tool \"%s\" lack its key field \"%s\"", tool, fields[i]),
					 errdetail("A call of the tool is identified by its key fields; nothing was recorded."),
					 errhint("Pass every key field, or change the tool's key fields with durable_ledger.change_tool().")));
		key.type = jbvString;
		key.val.string.val = fields[i];
		key.val.string.len = strlen(fields[i]);
		pushJsonbValue(&state, WJB_KEY, &key);
		pushJsonbValue(&state, WJB_VALUE, value);
	}
	result = pushJsonbValue(&state, WJB_END_OBJECT, NULL);
	return JsonbValueToJsonb(result);
}
