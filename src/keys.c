/*
 * keys.c: the idempotency key of a call.
 *
 * A derived key is the lowercase hex SHA-256 (digest.c)
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

#include "mb/pg_wchar.h"
#include "utils/builtins.h"
#include "utils/jsonb.h"

#include "common.h"
#include "digest.h"

#define KEY_MATERIAL_PREFIX "durable_ledger.v1"

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
dl_check_business_key(const char *business_key, bool call_id)
{
	if (looks_like_derived_key(business_key))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("business key \"%s\" has the shape of a derived key", business_key),
				 errdetail("Keys of 64 lowercase hexadecimal digits are reserved for keys the ledger derives.")));
	if (call_id && (!dl_is_call_key(business_key) ||
					business_key[sizeof(DL_CALL_KEY_PREFIX) - 1] == '\0'))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("the business key of a call id must begin with \"%s\", and name the call after it", DL_CALL_KEY_PREFIX),
				 errdetail("Business key \"%s\" was passed with call_id => true.", business_key),
				 errhint("Make the key of the run, the tool and the framework's id of the call, as the clients' callKey and call_key do.")));
	if (!call_id && dl_is_call_key(business_key))
		ereport(ERROR,
				(errcode(ERRCODE_INVALID_PARAMETER_VALUE),
				 errmsg("business key \"%s\" has the shape of a call id's key", business_key),
				 errdetail("Keys that begin with \"%s\" are reserved for calls a framework names by its own id.",
						   DL_CALL_KEY_PREFIX),
				 errhint("Pass call_id => true to begin_effect, or name the operation otherwise.")));
}

/* Whether key has the shape of a call id's key (begin_effect's call_id). */
bool
dl_is_call_key(const char *key)
{
	return strncmp(key, DL_CALL_KEY_PREFIX, sizeof(DL_CALL_KEY_PREFIX) - 1) == 0;
}

/*
 * Writes before, value in decimal (as %d and %zu write it) and "|" into out,
 * which has room for strlen(before) + MAXINT8LEN + 2 bytes; returns the
 * length written.
 */
static int
material_number(char *out, const char *before, int64 value)
{
	int			len = strlen(before);

	memcpy(out, before, len);
	len += pg_lltoa(value, out + len);
	out[len++] = '|';
	out[len] = '\0';
	return len;
}

/*
 * Computes the derived key of (run, tool, canonical args, occurrence) into
 * hex_out, which must have room for DL_KEY_HEX_LEN + 1 bytes.
 */
void
dl_derive_key(const char *run, const char *tool, const char *canon,
			  int canon_len, int32 occurrence, char *hex_out)
{
	uint8		digest[PG_SHA256_DIGEST_LENGTH];
	char		header[128];
	char		middle[32];
	size_t		run_len = strlen(run);
	size_t		tool_len = strlen(tool);
	int			header_len;
	int			middle_len;

	/* "PREFIX|<run length>|" and "|<occurrence>|", without a printf */
	header_len = material_number(header, KEY_MATERIAL_PREFIX "|", (int64) run_len);
	middle_len = material_number(middle, "|", occurrence);

	dl_sha256_begin();
	dl_sha256_add(header, header_len);
	dl_sha256_add(run, run_len);
	header_len = material_number(header, "|", (int64) tool_len);
	dl_sha256_add(header, header_len);
	dl_sha256_add(tool, tool_len);
	dl_sha256_add(middle, middle_len);
	dl_sha256_add(canon, canon_len);
	dl_sha256_end(digest);

	hex_encode((const char *) digest, PG_SHA256_DIGEST_LENGTH, hex_out);
	hex_out[DL_KEY_HEX_LEN] = '\0';
}

/*
 * The key to pass downstream (the provider's idempotency key): a derived
 * key's first attempt, the key itself; a business key, and any next attempt,
 * the key with its attempt, "INV-9#2", since a provider that keeps its
 * answers to a key (card processors do, for a day) would answer the next
 * attempt, after a refusal, with the refusal again.
 */
char *
dl_downstream_key(const char *key, bool business_key, int32 attempt)
{
	return business_key || attempt > 1 ? psprintf("%s#%d", key, attempt) : pstrdup(key);
}
