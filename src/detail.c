/*
 * detail.c: the detail of an audit row, a small flat JSON object built with
 * jsonb's own builder.
 */
#include "postgres.h"

#include "utils/jsonb.h"
#include "utils/numeric.h"

#include "common.h"

void
dl_detail_init(DetailBuilder *d)
{
	d->state = NULL;
	(void) pushJsonbValue(&d->state, WJB_BEGIN_OBJECT, NULL);
}

static void
detail_key(DetailBuilder *d, const char *name)
{
	JsonbValue	k;

	k.type = jbvString;
	k.val.string.val = (char *) name;
	k.val.string.len = strlen(name);
	(void) pushJsonbValue(&d->state, WJB_KEY, &k);
}

void
dl_detail_text(DetailBuilder *d, const char *name, const char *value)
{
	JsonbValue	v;

	detail_key(d, name);
	if (value == NULL)
		v.type = jbvNull;
	else
	{
		v.type = jbvString;
		v.val.string.val = (char *) value;
		v.val.string.len = strlen(value);
	}
	(void) pushJsonbValue(&d->state, WJB_VALUE, &v);
}

void
dl_detail_int(DetailBuilder *d, const char *name, int64 value)
{
	JsonbValue	v;

	detail_key(d, name);
	v.type = jbvNumeric;
	v.val.numeric = int64_to_numeric(value);
	(void) pushJsonbValue(&d->state, WJB_VALUE, &v);
}

/* A count where 0 means none (a budget): the number, or null. */
void
dl_detail_count_or_null(DetailBuilder *d, const char *name, int64 value)
{
	if (value > 0)
		dl_detail_int(d, name, value);
	else
		dl_detail_text(d, name, NULL);
}

void
dl_detail_bool(DetailBuilder *d, const char *name, bool value)
{
	JsonbValue	v;

	detail_key(d, name);
	v.type = jbvBool;
	v.val.boolean = value;
	(void) pushJsonbValue(&d->state, WJB_VALUE, &v);
}

/* A jsonb value, or JSON null for SQL NULL. */
void
dl_detail_jsonb(DetailBuilder *d, const char *name, Jsonb *value)
{
	JsonbValue	v;

	detail_key(d, name);
	if (value == NULL)
		v.type = jbvNull;
	else
	{
		v.type = jbvBinary;
		v.val.binary.data = &value->root;
		v.val.binary.len = VARSIZE(value) - VARHDRSZ;
	}
	(void) pushJsonbValue(&d->state, WJB_VALUE, &v);
}

Jsonb *
dl_detail_finish(DetailBuilder *d)
{
	JsonbValue *object = pushJsonbValue(&d->state, WJB_END_OBJECT, NULL);

	return JsonbValueToJsonb(object);
}
