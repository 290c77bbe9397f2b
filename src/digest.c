/*
 * digest.c: SHA-256 for derived keys and the audit chain.
 *
 * PostgreSQL's cryptohash (common/cryptohash.h) registers a context with the
 * resource owner and, with OpenSSL 3, fetches the algorithm from the default
 * provider again at every initialisation (EVP_DigestInit_ex with
 * EVP_sha256()): most of what a key's or an audit row's hash costs.  A
 * server built with OpenSSL gets here the same OpenSSL SHA-256, fetched once
 * per backend, through one context kept for the backend's life (OpenSSL's
 * memory, not a transaction's; an error between begin and end leaves it to
 * the next begin, which starts over).  A server built without OpenSSL gets
 * PostgreSQL's own implementation, as before.
 */
#include "postgres.h"

#include "digest.h"

#ifdef USE_OPENSSL

#include <openssl/evp.h>

static EVP_MD_CTX *sha256_ctx;
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
static EVP_MD *sha256_md;
#endif

static void
digest_failed(void)
{
	ereport(ERROR,
			(errcode(ERRCODE_INTERNAL_ERROR),
			 errmsg("could not compute a SHA-256 digest with OpenSSL")));
}

void
dl_sha256_begin(void)
{
	if (sha256_ctx == NULL)
	{
		EVP_MD_CTX *ctx = EVP_MD_CTX_new();

		if (ctx == NULL)
			ereport(ERROR,
					(errcode(ERRCODE_OUT_OF_MEMORY),
					 errmsg("out of memory")));
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
		sha256_md = EVP_MD_fetch(NULL, "SHA256", NULL);
		if (sha256_md == NULL)
		{
			EVP_MD_CTX_free(ctx);
			digest_failed();
		}
#endif
		sha256_ctx = ctx;
	}
#if OPENSSL_VERSION_NUMBER >= 0x30000000L
	if (EVP_DigestInit_ex2(sha256_ctx, sha256_md, NULL) != 1)
#else
	if (EVP_DigestInit_ex(sha256_ctx, EVP_sha256(), NULL) != 1)
#endif
		digest_failed();
}

void
dl_sha256_add(const void *data, size_t len)
{
	if (EVP_DigestUpdate(sha256_ctx, data, len) != 1)
		digest_failed();
}

void
dl_sha256_end(uint8 digest[PG_SHA256_DIGEST_LENGTH])
{
	unsigned int len;

	if (EVP_DigestFinal_ex(sha256_ctx, digest, &len) != 1 || len != PG_SHA256_DIGEST_LENGTH)
		digest_failed();
}

#else							/* !USE_OPENSSL */

#include "common/cryptohash.h"

static pg_cryptohash_ctx *sha256_ctx;

static void
digest_failed(void)
{
	const char *why = pg_cryptohash_error(sha256_ctx);

	pg_cryptohash_free(sha256_ctx);
	sha256_ctx = NULL;
	elog(ERROR, "could not compute a SHA-256 digest: %s", why);
}

void
dl_sha256_begin(void)
{
	/* a context left by an error is the resource owner's to free */
	sha256_ctx = pg_cryptohash_create(PG_SHA256);
	if (pg_cryptohash_init(sha256_ctx) < 0)
		digest_failed();
}

void
dl_sha256_add(const void *data, size_t len)
{
	if (pg_cryptohash_update(sha256_ctx, data, len) < 0)
		digest_failed();
}

void
dl_sha256_end(uint8 digest[PG_SHA256_DIGEST_LENGTH])
{
	if (pg_cryptohash_final(sha256_ctx, digest, PG_SHA256_DIGEST_LENGTH) < 0)
		digest_failed();
	pg_cryptohash_free(sha256_ctx);
	sha256_ctx = NULL;
}

#endif							/* USE_OPENSSL */
