/* runtime/train/checkpoint_hash.h — SHA-256 of bytes and of files, for the
 * checksums in a checkpoint's manifest (runtime/train/checkpoint.h).
 *
 * FIPS 180-4 SHA-256, written here so the runtime needs no crypto library;
 * the digests are those of `sha256sum`, so a user can check a step
 * directory by hand (`cd DIR/step-N && sha256sum -c SHA256SUMS`).  It
 * detects corruption (a flipped bit, a truncated copy), not tampering by
 * someone who can also rewrite the manifest.
 *
 * Usage:
 *   Sha256 h;
 *   sha256_init(&h);
 *   sha256_update(&h, buf, n);      // any number of times
 *   char hex[SHA256_HEX_LEN + 1];
 *   sha256_final_hex(&h, hex);
 * or sha256_file(path, hex, &err) for a whole file.
 */
#ifndef HPC_RUNTIME_CHECKPOINT_HASH_H
#define HPC_RUNTIME_CHECKPOINT_HASH_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

#define SHA256_HEX_LEN 64

typedef struct {
    uint32_t h[8];
    uint64_t bytes;        /* message length so far */
    uint8_t block[64];     /* pending partial block */
    size_t fill;           /* bytes in block */
} Sha256;

void sha256_init(Sha256 *s);
void sha256_update(Sha256 *s, const void *data, size_t n);
/* The digest as 64 lower-case hex digits and a NUL. */
void sha256_final_hex(Sha256 *s, char hex[SHA256_HEX_LEN + 1]);

/* The digest of the file at path; HPC_ERR_IO naming it when it cannot be read. */
HpcStatus sha256_file(const char *path, char hex[SHA256_HEX_LEN + 1], HpcError *err);

#endif
