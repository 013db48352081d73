/* runtime/cuda/kernel_cache.h — compiled kernels (cubins) cached on disk.
 *
 * An entry is keyed by the SHA-256 of everything that decides the cubin:
 * the CUDA source, the NVRTC options (in order), the target arch and the
 * NVRTC version.  Change any of them and the key changes.
 *
 * Where: $HPC_CACHE_DIR if set, else $XDG_CACHE_HOME/hpc, else
 * $HOME/.cache/hpc; entries live in DIR/kernels/KEYHEX.cubin.
 *
 * An entry file is a 96-byte header followed by the payload:
 *   "HPCKCUB1" magic (8) | u32 format version | u32 0 | u64 payload length |
 *   32-byte key | 32-byte SHA-256 of the payload | 8 bytes 0 | payload
 * Writes are atomic (temporary file in the same directory, fsync, rename,
 * fsync of the directory), so concurrent writers of one key leave one whole
 * entry and a reader never sees half a file.  A corrupt entry (bad magic,
 * wrong length, other key, checksum mismatch) reads as KCACHE_CORRUPT; the
 * caller recompiles and kcache_store replaces it.
 *
 * The payload buffer returned by kcache_load is malloc'd; the caller frees it.
 *
 *   KcacheKey key;
 *   kcache_key(&key, src, opts, nopts, 90, nvrtc_ver);
 *   char dir[KCACHE_PATH_MAX];
 *   if (kcache_dir(dir, sizeof dir, &err)) return err.code;
 *   void *cubin; size_t size; KcacheResult r;
 *   if (kcache_load(dir, &key, &cubin, &size, &r, &err)) return err.code;
 *   if (r != KCACHE_HIT) { compile...; kcache_store(dir, &key, cubin, size, &err); }
 */
#ifndef HPC_RUNTIME_KERNEL_CACHE_H
#define HPC_RUNTIME_KERNEL_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

#define KCACHE_PATH_MAX 4096
#define KCACHE_HEADER_BYTES 96

typedef struct { uint8_t b[32]; } KcacheKey;

typedef enum {
    KCACHE_MISS,      /* no entry */
    KCACHE_HIT,       /* entry read and verified */
    KCACHE_CORRUPT,   /* entry was damaged; removed, treat as a miss */
} KcacheResult;

/* Hashes source, options (each with its length, so ["-a", "b"] differs
 * from ["-ab"]), arch (e.g. 90) and the NVRTC version (major*1000+minor*10). */
void kcache_key(KcacheKey *key, const char *source, const char *const *options,
                int num_options, int arch, int nvrtc_version);

/* 64 hex digits and a NUL. */
void kcache_key_hex(const KcacheKey *key, char hex[65]);

/* Resolves and creates (mkdir -p) the cache directory, without the
 * "kernels" part.  HPC_ERR_IO if it cannot be created. */
HpcStatus kcache_dir(char *buf, size_t size, HpcError *err);

/* Path of an entry's file (whether or not it exists). */
void kcache_entry_path(char *buf, size_t size, const char *dir, const KcacheKey *key);

/* Reads an entry.  HPC_OK with *result = MISS, HIT or CORRUPT; on HIT,
 * *data (malloc'd) and *size hold the payload, otherwise *data is NULL.
 * Fails only for errors other than "not there" (e.g. permission denied). */
HpcStatus kcache_load(const char *dir, const KcacheKey *key, void **data, size_t *size,
                      KcacheResult *result, HpcError *err);

/* Writes an entry atomically, creating DIR/kernels if needed. */
HpcStatus kcache_store(const char *dir, const KcacheKey *key, const void *data, size_t size,
                       HpcError *err);

/* SHA-256 of a buffer; exposed for tests and for naming generated kernels. */
void kcache_sha256(const void *data, size_t size, uint8_t out[32]);

#endif
