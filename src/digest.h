/*
 * digest.h: SHA-256 of bytes given in pieces (digest.c), for derived keys
 * (keys.c) and the audit chain (audit_chain.c).  One digest at a time per
 * backend: begin, add the pieces, end.
 */
#ifndef DURABLE_LEDGER_DIGEST_H
#define DURABLE_LEDGER_DIGEST_H

#include "common/sha2.h"

extern void dl_sha256_begin(void);
extern void dl_sha256_add(const void *data, size_t len);
extern void dl_sha256_end(uint8 digest[PG_SHA256_DIGEST_LENGTH]);

#endif							/* DURABLE_LEDGER_DIGEST_H */
