/* sha256.h: SHA-256 (FIPS 180-4), for the digests an AOT bundle's manifest records of its cubins, sources, spec and
 * plan: a digest anyone can check with sha256sum. */
#ifndef CP_SHA256_H
#define CP_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define CP_SHA256_HEX 65 /* 64 hex digits and the NUL */

typedef struct {
    uint32_t h[8];
    uint64_t bytes;        /* message length so far */
    unsigned char buf[64]; /* the block being filled */
    size_t nbuf;
} cp_sha256_ctx;

void cp_sha256_init(cp_sha256_ctx *c);
void cp_sha256_update(cp_sha256_ctx *c, const void *data, size_t n);
void cp_sha256_final(cp_sha256_ctx *c, unsigned char digest[32]);
/* The digest of data[0, n) as 64 lowercase hex digits into hex (CP_SHA256_HEX bytes). Returns hex. */
char *cp_sha256_hex(const void *data, size_t n, char hex[CP_SHA256_HEX]);
/* The same for a finished context. */
char *cp_sha256_final_hex(cp_sha256_ctx *c, char hex[CP_SHA256_HEX]);

#endif
