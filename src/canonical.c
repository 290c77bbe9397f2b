/*
 * canonical.c: the canonical text of a call's args.
 *
 * Two calls whose args mean the same JSON value must get the same key, so
 * the key material holds a canonical text of args instead of what the client
 * sent.  jsonb has already dropped white space and duplicate object keys (the
 * last one wins) and stores object keys in its own order: shorter keys first,
 * keys of equal length by their bytes.  What is left is written here:
 *
 *   - no white space at all; ',' and ':' as separators;
 *   - object keys in jsonb's order (above);
 *   - strings as jsonb prints them (escape_json), byte for byte, no Unicode
 *     normalization;
 *   - numbers in plain decimal notation without trailing fractional zeros:
 *     1, 1.0, 1.00 and 10e-1 all give "1"; -0 gives "0"; 1e3 gives "1000";
 *   - true, false, null.
 *
 * The README documents the same rules for people recomputing keys elsewhere.
 *
 * A number written out in full takes a character per digit: 1e131071 is
 * eight bytes of JSON and 131,072 characters of canonical text.  So the
 * zeros a number's exponent adds beyond its significant digits are bounded:
 * NUMBER_FREE_ZEROS a number (as many as any double needs: 4.9e-324 has
 * 324), and NUMBER_EXTRA_ZEROS beyond those for all of args together; and
 * the text never takes more than CANONICAL_MAX_BYTES.  Larger args are
 * refused (22023) as soon as they pass a bound, before the rest is written.
 * The bounds depend on the value alone, never on how it was spelled or
 * stored (1.0 and 1, 1e3 and 1000 count the same), so equal args are
 * either both keyed or both refused.  Every key the ledger ever derived is
 * unchanged: the bounds only refuse.
 */
#include "postgres.h"

#include "utils/builtins.h"
#include "utils/fmgrprotos.h"
#include "utils/json.h"
#include "utils/jsonb.h"
#include "utils/numeric.h"

#include "common.h"

#define NUMBER_FREE_ZEROS 324
#define NUMBER_EXTRA_ZEROS 1024
#define CANONICAL_MAX_BYTES (128 * 1024 * 1024)

/* Where the canonical text goes, and how long it has grown. */
typedef struct Canonical
{
	StringInfo	out;
	int			start;			/* out->len when args began */
	Size		extra_zeros;	/* numbers' zeros beyond their free ones, so far */
} Canonical;

static void
check_bound(const Canonical *c, Size more)
{
	if ((Size) (c->out->len - c->start) + more > CANONICAL_MAX_BYTES)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("args are too large once written canonically"),
				 errdetail("Their canonical text would take more than %d bytes.",
						   CANONICAL_MAX_BYTES)));
}

/*
 * The zeros a number written out adds beyond its significant digits (text
 * is trimmed: "1000" adds 3, "0.001" adds 3, "1.5" none).
 */
static Size
padding_zeros(const char *text)
{
	Size		leading = 0;
	Size		trailing = 0;
	bool		significant = false;
	bool		fraction = false;
	const char *p;

	for (p = text; *p; p++)
	{
		if (*p == '.')
		{
			fraction = true;
			continue;
		}
		if (*p < '0' || *p > '9')
			continue;
		if (*p != '0')
		{
			significant = true;
			trailing = 0;
		}
		else if (!significant)
			leading++;
		else if (!fraction)
			trailing++;
	}
	return fraction ? leading : leading + trailing;
}

static void
check_number(Canonical *c, const char *text)
{
	Size		zeros = padding_zeros(text);

	if (zeros > NUMBER_FREE_ZEROS)
		c->extra_zeros += zeros - NUMBER_FREE_ZEROS;
	if (c->extra_zeros > NUMBER_EXTRA_ZEROS)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("args are too large once written canonically"),
				 errdetail("A number is written out in full, a character per digit: args may add at most %d zeros a number beyond its significant digits, and %d more in all.",
						   NUMBER_FREE_ZEROS, NUMBER_EXTRA_ZEROS),
				 errhint("Pass such a number as a string.")));
	check_bound(c, strlen(text));
}

/* How long escape_json writes a string: checked before it is written. */
static Size
escaped_length(const char *s, int len)
{
	Size		escaped = 2;		/* the quotes */
	int			i;

	for (i = 0; i < len; i++)
	{
		unsigned char ch = (unsigned char) s[i];

		if (ch == '\b' || ch == '\f' || ch == '\n' || ch == '\r' || ch == '\t' ||
			ch == '"' || ch == '\\')
			escaped += 2;
		else if (ch < ' ')
			escaped += 6;		/* \u00XX */
		else
			escaped += 1;
	}
	return escaped;
}

static void
append_number(Canonical *c, Numeric num)
{
	Datum		trimmed;
	char	   *text;

	trimmed = DirectFunctionCall1(numeric_trim_scale, NumericGetDatum(num));
	text = DatumGetCString(DirectFunctionCall1(numeric_out, trimmed));

	/* numeric keeps the sign of a negative zero ("-0"); the key must not */
	if (strcmp(text, "-0") == 0)
		appendStringInfoChar(c->out, '0');
	else
	{
		check_number(c, text);
		appendStringInfoString(c->out, text);
	}
	pfree(text);
}

static void
append_scalar(Canonical *c, const JsonbValue *v)
{
	StringInfo	out = c->out;

	switch (v->type)
	{
		case jbvNull:
			appendStringInfoString(out, "null");
			break;
		case jbvBool:
			appendStringInfoString(out, v->val.boolean ? "true" : "false");
			break;
		case jbvNumeric:
			append_number(c, v->val.numeric);
			break;
		case jbvString:
			{
				char	   *s;

				/* counted only when even the worst (six bytes a byte) may not fit */
				if ((Size) (c->out->len - c->start) + 6 * (Size) v->val.string.len + 2 > CANONICAL_MAX_BYTES)
					check_bound(c, escaped_length(v->val.string.val, v->val.string.len));
				s = pnstrdup(v->val.string.val, v->val.string.len);
				escape_json(out, s);
				pfree(s);
				break;
			}
		default:
			elog(ERROR, "unexpected jsonb scalar type %d", (int) v->type);
	}
}

/*
 * Appends the canonical text of args to out.  The iterator walks the value
 * without recursion, so deeply nested input cannot exhaust the stack here.
 */
void
dl_append_canonical_args(StringInfo out, Jsonb *args)
{
	JsonbIterator *it;
	JsonbValue	v;
	JsonbIteratorToken tok;
	bool		need_comma = false;
	Canonical	c;

	c.out = out;
	c.start = out->len;
	c.extra_zeros = 0;

	/* a bare scalar is stored as a one-element pseudo array: write it alone */
	if (JB_ROOT_IS_SCALAR(args))
	{
		if (!JsonbExtractScalar(&args->root, &v))
			elog(ERROR, "could not extract the scalar of a scalar jsonb");
		append_scalar(&c, &v);
		return;
	}

	it = JsonbIteratorInit(&args->root);
	while ((tok = JsonbIteratorNext(&it, &v, false)) != WJB_DONE)
	{
		switch (tok)
		{
			case WJB_BEGIN_ARRAY:
				if (need_comma)
					appendStringInfoChar(out, ',');
				appendStringInfoChar(out, '[');
				need_comma = false;
				break;
			case WJB_BEGIN_OBJECT:
				if (need_comma)
					appendStringInfoChar(out, ',');
				appendStringInfoChar(out, '{');
				need_comma = false;
				break;
			case WJB_END_ARRAY:
				appendStringInfoChar(out, ']');
				need_comma = true;
				break;
			case WJB_END_OBJECT:
				appendStringInfoChar(out, '}');
				need_comma = true;
				break;
			case WJB_KEY:
				if (need_comma)
					appendStringInfoChar(out, ',');
				append_scalar(&c, &v);
				appendStringInfoChar(out, ':');
				need_comma = false;
				break;
			case WJB_VALUE:
				append_scalar(&c, &v);
				need_comma = true;
				break;
			case WJB_ELEM:
				if (need_comma)
					appendStringInfoChar(out, ',');
				append_scalar(&c, &v);
				need_comma = true;
				break;
			default:
				elog(ERROR, "unexpected jsonb iterator token %d", (int) tok);
		}
	}
}
