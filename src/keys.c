/*
 * keys.c: the idempotency key of a call, and the checks on what callers pass.
 *
 * A derived key is the lowercase hex SHA-256 (PostgreSQL's own cryptohash)
 * of this key material, in the database encoding:
 *
 *   durable_ledger.v1|<bytes of run>|<run>|<bytes of tool>|<tool>|<occurrence>|<canonical args>
 *
 * The byte lengths make the material unambiguous whatever run and tool
 * contain; the occurrence is a decimal number; the canonical args come last
 * (canonical.c).  The README shows the same computation in plain SQL, and the
 * "keys" regression test recomputes stored keys with pgcrypto's digest().
 */
#include "postgres.h"

#include "common/cryptohash.h"
#include "common/sha2.h"
#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

#include "durable_ledger.h"

#define KEY_MATERIAL_PREFIX "durable_ledger.v1"

PG_FUNCTION_INFO_V1(dl_canonical_args);
PG_FUNCTION_INFO_V1(dl_effect_key);

/*
 * Returns argument argno as a C string, refusing NULL (22004), the empty
 * string and text longer than max_chars characters (22023).
 */
char *
dl_required_text_arg(FunctionCallInfo fcinfo, int argno, const char *argname,
					 int max_chars)
{
	text	   *t;
	int			nbytes;
	int			nchars;

	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname)));

	t = PG_GETARG_TEXT_PP(argno);
	nbytes = VARSIZE_ANY_EXHDR(t);
	if (nbytes == 0)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("%s must not be empty", argname)));

	if (max_chars > 0)
	{
		nchars = pg_mbstrlen_with_len(VARDATA_ANY(t), nbytes);
		if (nchars > max_chars)
			ereport(ERROR,
					(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
					 errmsg("%s is too long", argname),
					 errdetail("It has %d characters; at most %d are allowed.",
							   nchars, max_chars)));
	}
	return text_to_cstring(t);
}

/*
 * An optional attempt number (argument argno, absent in older SQL
 * declarations): 0 when NULL or absent, else at least 1 (22023).
 */
int32
dl_optional_attempt_arg(FunctionCallInfo fcinfo, int argno)
{
	int32		attempt;

	if (PG_NARGS() <= argno || PG_ARGISNULL(argno))
		return 0;
	attempt = PG_GETARG_INT32(argno);
	if (attempt < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("attempt must be at least 1"),
				 errdetail("The attempt given was %d.", attempt)));
	return attempt;
}

char *
dl_optional_text_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		return NULL;
	return text_to_cstring(PG_GETARG_TEXT_PP(argno));
}

Jsonb *
dl_required_jsonb_arg(FunctionCallInfo fcinfo, int argno, const char *argname)
{
	if (PG_ARGISNULL(argno))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("%s must not be null", argname),
				 errhint("Use the JSON value 'null'::jsonb for a call without arguments.")));
	return PG_GETARG_JSONB_P(argno);
}

Jsonb *
dl_optional_jsonb_arg(FunctionCallInfo fcinfo, int argno)
{
	if (PG_ARGISNULL(argno))
		return NULL;
	return PG_GETARG_JSONB_P(argno);
}

static bool
looks_like_derived_key(const char *s)
{
	int			i;

	for (i = 0; i < DL_KEY_HEX_LEN; i++)
	{
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	}
	return s[DL_KEY_HEX_LEN] == '\0';
}

/*
 * A business key is chosen by the caller; it must not be confusable with a
 * derived key, which is 64 lowercase hex digits.  (Length and emptiness are
 * checked by dl_required_text_arg.)
 */
void
dl_check_business_key(const char *business_key)
{
	if (looks_like_derived_key(business_key))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("business key \"%s\" has the shape of a derived key", business_key),
				 errdetail("Keys of 64 lowercase hexadecimal digits are reserved for keys the ledger derives.")));
}

/*
 * Computes the derived key of (run, tool, canonical args, occurrence) into
 * hex_out, which must have room for DL_KEY_HEX_LEN + 1 bytes.
 */
void
dl_derive_key(const char *run, const char *tool, const char *canon,
			  int canon_len, int32 occurrence, char *hex_out)
{
	pg_cryptohash_ctx *ctx;
	uint8		digest[PG_SHA256_DIGEST_LENGTH];
	char		header[128];
	char		middle[32];
	size_t		run_len = strlen(run);
	size_t		tool_len = strlen(tool);
	int			header_len;
	int			middle_len;

	header_len = snprintf(header, sizeof(header), KEY_MATERIAL_PREFIX "|%zu|", run_len);
	middle_len = snprintf(middle, sizeof(middle), "|%d|", occurrence);

	ctx = pg_cryptohash_create(PG_SHA256);
	if (pg_cryptohash_init(ctx) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) header, header_len) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) run, run_len) < 0)
		goto failed;

	header_len = snprintf(header, sizeof(header), "|%zu|", tool_len);
	if (pg_cryptohash_update(ctx, (const uint8 *) header, header_len) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) tool, tool_len) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) middle, middle_len) < 0 ||
		pg_cryptohash_update(ctx, (const uint8 *) canon, canon_len) < 0 ||
		pg_cryptohash_final(ctx, digest, sizeof(digest)) < 0)
		goto failed;
	pg_cryptohash_free(ctx);

	hex_encode((const char *) digest, PG_SHA256_DIGEST_LENGTH, hex_out);
	hex_out[DL_KEY_HEX_LEN] = '\0';
	return;

failed:
	pg_cryptohash_free(ctx);
	elog(ERROR, "could not compute SHA-256 of the key material");
}

/* canonical_args(args jsonb) RETURNS text */
Datum
dl_canonical_args(PG_FUNCTION_ARGS)
{
	Jsonb	   *args = dl_required_jsonb_arg(fcinfo, 0, "args");
	StringInfoData buf;

	initStringInfo(&buf);
	dl_append_canonical_args(&buf, args);
	PG_RETURN_TEXT_P(cstring_to_text_with_len(buf.data, buf.len));
}

/* effect_key(run text, tool text, args jsonb, occurrence integer) RETURNS text */
Datum
dl_effect_key(PG_FUNCTION_ARGS)
{
	char	   *run = dl_required_text_arg(fcinfo, 0, "run", DL_MAX_RUN_CHARS);
	char	   *tool = dl_required_text_arg(fcinfo, 1, "tool", DL_MAX_TOOL_CHARS);
	Jsonb	   *args = dl_required_jsonb_arg(fcinfo, 2, "args");
	int32		occurrence;
	StringInfoData canon;
	char		key[DL_KEY_HEX_LEN + 1];

	if (PG_ARGISNULL(3))
		ereport(ERROR,
				(errcode(ERRCODE_NULL_VALUE_NOT_ALLOWED),
				 errmsg("occurrence must not be null")));
	occurrence = PG_GETARG_INT32(3);
	if (occurrence < 1)
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("occurrence must be at least 1"),
				 errdetail("The occurrence given was %d.", occurrence)));

	initStringInfo(&canon);
	dl_append_canonical_args(&canon, args);
	dl_derive_key(run, tool, canon.data, canon.len, occurrence, key);
	PG_RETURN_TEXT_P(cstring_to_text(key));
}
