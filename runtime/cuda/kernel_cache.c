/* runtime/cuda/kernel_cache.c — see kernel_cache.h. */
#include "cuda/kernel_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- SHA-256 (FIPS 180-4) ------------------------------------------------ */

typedef struct {
    uint32_t h[8];
    uint8_t block[64];
    size_t fill;       /* bytes in block */
    uint64_t total;    /* bytes hashed */
} Sha256;

static const uint32_t sha_k[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static void sha_init(Sha256 *s)
{
    static const uint32_t h0[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, h0, sizeof h0);
    s->fill = 0;
    s->total = 0;
}

static void sha_compress(Sha256 *s, const uint8_t *p)
{
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    /* The eight working words in locals (not an array shifted by memmove
     * each round, which cost 40 % of a 2.5 MB cubin's check). */
    uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3], e = s->h[4], f = s->h[5], g = s->h[6],
             h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t S1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
        uint32_t ch = (e & f) ^ (~e & g);
        uint32_t t1 = h + S1 + ch + sha_k[i] + w[i];
        uint32_t S0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
        uint32_t maj = (a & b) ^ (a & c) ^ (b & c);
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + S0 + maj;
    }
    s->h[0] += a;
    s->h[1] += b;
    s->h[2] += c;
    s->h[3] += d;
    s->h[4] += e;
    s->h[5] += f;
    s->h[6] += g;
    s->h[7] += h;
}

static void sha_update(Sha256 *s, const void *data, size_t n)
{
    const uint8_t *p = data;
    s->total += n;
    while (n > 0) {
        if (s->fill == 0 && n >= 64) {   /* whole blocks straight from the input */
            sha_compress(s, p);
            p += 64;
            n -= 64;
            continue;
        }
        size_t take = 64 - s->fill < n ? 64 - s->fill : n;
        memcpy(s->block + s->fill, p, take);
        s->fill += take;
        p += take;
        n -= take;
        if (s->fill == 64) {
            sha_compress(s, s->block);
            s->fill = 0;
        }
    }
}

static void sha_final(Sha256 *s, uint8_t out[32])
{
    uint64_t bits = s->total * 8;
    uint8_t pad = 0x80, zero = 0, len[8];
    sha_update(s, &pad, 1);
    while (s->fill != 56) sha_update(s, &zero, 1);
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(bits >> (56 - 8 * i));
    sha_update(s, len, 8);
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (uint8_t)(s->h[i] >> 24);
        out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
        out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
        out[4 * i + 3] = (uint8_t)s->h[i];
    }
}

void kcache_sha256(const void *data, size_t size, uint8_t out[32])
{
    Sha256 s;
    sha_init(&s);
    sha_update(&s, data, size);
    sha_final(&s, out);
}

/* ---- keys ----------------------------------------------------------------- */

/* Each field goes in with a tag and its length, so no two different inputs
 * share a byte stream (e.g. source "ab" + option "c" vs source "a" + "bc"). */
static void sha_field(Sha256 *s, char tag, const void *data, uint64_t n)
{
    uint8_t len[8];
    for (int i = 0; i < 8; i++) len[i] = (uint8_t)(n >> (8 * i));
    sha_update(s, &tag, 1);
    sha_update(s, len, 8);
    sha_update(s, data, n);
}

void kcache_key(KcacheKey *key, const char *source, const char *const *options,
                int num_options, int arch, int nvrtc_version)
{
    Sha256 s;
    char num[64];
    sha_init(&s);
    sha_field(&s, 'F', "hpc-kernel-cache-1", 18);
    sha_field(&s, 'S', source, strlen(source));
    for (int i = 0; i < num_options; i++) sha_field(&s, 'O', options[i], strlen(options[i]));
    int n = snprintf(num, sizeof num, "sm_%d nvrtc %d", arch, nvrtc_version);
    sha_field(&s, 'A', num, (uint64_t)n);
    sha_final(&s, key->b);
}

void kcache_key_hex(const KcacheKey *key, char hex[65])
{
    for (int i = 0; i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", key->b[i]);
}

/* ---- directories -------------------------------------------------------- */

static HpcStatus mkdir_p(const char *path, HpcError *err)
{
    char buf[KCACHE_PATH_MAX];
    if (snprintf(buf, sizeof buf, "%s", path) >= (int)sizeof buf)
        return hpc_fail(err, HPC_ERR_IO, "kernel cache path too long: %s", path);
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0') continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, 0755) != 0 && errno != EEXIST)
            return hpc_fail(err, HPC_ERR_IO,
                            "cannot create the kernel cache directory %s: %s; set HPC_CACHE_DIR "
                            "to a writable directory", buf, strerror(errno));
        *p = c;
        if (c == '\0') break;
    }
    return HPC_OK;
}

HpcStatus kcache_dir(char *buf, size_t size, HpcError *err)
{
    const char *env = getenv("HPC_CACHE_DIR"), *xdg = getenv("XDG_CACHE_HOME");
    const char *home = getenv("HOME");
    int n;
    if (env && *env) n = snprintf(buf, size, "%s", env);
    else if (xdg && *xdg) n = snprintf(buf, size, "%s/hpc", xdg);
    else if (home && *home) n = snprintf(buf, size, "%s/.cache/hpc", home);
    else
        return hpc_fail(err, HPC_ERR_IO, "no kernel cache directory: HPC_CACHE_DIR, "
                        "XDG_CACHE_HOME and HOME are all unset; set HPC_CACHE_DIR");
    if (n < 0 || (size_t)n >= size)
        return hpc_fail(err, HPC_ERR_IO, "kernel cache path too long (%d bytes)", n);
    return mkdir_p(buf, err);
}

void kcache_entry_path(char *buf, size_t size, const char *dir, const KcacheKey *key)
{
    char hex[65];
    kcache_key_hex(key, hex);
    snprintf(buf, size, "%s/kernels/%s.cubin", dir, hex);
}

/* ---- entry format ------------------------------------------------------- */

#define KCACHE_MAGIC "HPCKCUB1"
#define KCACHE_FORMAT 1u

static void put_u32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p)
{
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static void header_make(uint8_t h[KCACHE_HEADER_BYTES], const KcacheKey *key,
                        const void *data, size_t size)
{
    memset(h, 0, KCACHE_HEADER_BYTES);
    memcpy(h, KCACHE_MAGIC, 8);
    put_u32(h + 8, KCACHE_FORMAT);
    put_u64(h + 16, size);
    memcpy(h + 24, key->b, 32);
    kcache_sha256(data, size, h + 56);
}

/* True if the file's bytes are a whole, intact entry for key. */
static int entry_valid(const uint8_t *buf, size_t n, const KcacheKey *key)
{
    if (n < KCACHE_HEADER_BYTES || memcmp(buf, KCACHE_MAGIC, 8) != 0) return 0;
    if (get_u32(buf + 8) != KCACHE_FORMAT) return 0;
    if (get_u64(buf + 16) != n - KCACHE_HEADER_BYTES) return 0;
    if (memcmp(buf + 24, key->b, 32) != 0) return 0;
    uint8_t sum[32];
    kcache_sha256(buf + KCACHE_HEADER_BYTES, n - KCACHE_HEADER_BYTES, sum);
    return memcmp(sum, buf + 56, 32) == 0;
}

/* ---- load --------------------------------------------------------------- */

static HpcStatus read_file(const char *path, uint8_t **buf, size_t *n, int *missing,
                           HpcError *err)
{
    *buf = NULL;
    *n = 0;
    *missing = 0;
    FILE *f = fopen(path, "rb");
    if (!f) {
        if (errno == ENOENT) {
            *missing = 1;
            return HPC_OK;
        }
        return hpc_fail(err, HPC_ERR_IO, "cannot read kernel cache entry %s: %s; "
                        "fix its permissions or set HPC_CACHE_DIR elsewhere", path, strerror(errno));
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || st.st_size < 0) {
        fclose(f);
        return hpc_fail(err, HPC_ERR_IO, "cannot stat kernel cache entry %s: %s", path,
                        strerror(errno));
    }
    *n = (size_t)st.st_size;
    *buf = malloc(*n ? *n : 1);
    if (!*buf) {
        fclose(f);
        return hpc_fail(err, HPC_ERR_OOM, "out of host memory reading %s (%zu bytes)", path, *n);
    }
    *n = fread(*buf, 1, *n, f);
    fclose(f);
    return HPC_OK;
}

HpcStatus kcache_load(const char *dir, const KcacheKey *key, void **data, size_t *size,
                      KcacheResult *result, HpcError *err)
{
    char path[KCACHE_PATH_MAX];
    uint8_t *buf;
    size_t n;
    int missing;
    *data = NULL;
    *size = 0;
    *result = KCACHE_MISS;
    kcache_entry_path(path, sizeof path, dir, key);
    HpcStatus st = read_file(path, &buf, &n, &missing, err);
    if (st || missing) return st;
    if (!entry_valid(buf, n, key)) {
        /* Not unlinked here: a concurrent writer may have just renamed a good
         * entry into place; kcache_store replaces a damaged one atomically. */
        free(buf);
        *result = KCACHE_CORRUPT;
        return HPC_OK;
    }
    memmove(buf, buf + KCACHE_HEADER_BYTES, n - KCACHE_HEADER_BYTES);
    *data = buf;
    *size = n - KCACHE_HEADER_BYTES;
    *result = KCACHE_HIT;
    return HPC_OK;
}

/* ---- store -------------------------------------------------------------- */

static HpcStatus write_all(int fd, const void *data, size_t n, const char *path, HpcError *err)
{
    const uint8_t *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0)
            return hpc_fail(err, HPC_ERR_IO, "cannot write kernel cache entry %s: %s", path,
                            w < 0 ? strerror(errno) : "short write");
        p += w;
        n -= (size_t)w;
    }
    return HPC_OK;
}

/* Makes the rename durable: a crash must not leave a name pointing nowhere. */
static void fsync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return;
    fsync(fd);
    close(fd);
}

static HpcStatus write_temp(int fd, const char *tmp, const KcacheKey *key, const void *data,
                            size_t size, HpcError *err)
{
    uint8_t header[KCACHE_HEADER_BYTES];
    header_make(header, key, data, size);
    HpcStatus st = write_all(fd, header, sizeof header, tmp, err);
    if (!st) st = write_all(fd, data, size, tmp, err);
    if (!st && fsync(fd) != 0)
        st = hpc_fail(err, HPC_ERR_IO, "fsync of kernel cache entry %s: %s", tmp, strerror(errno));
    return st;
}

HpcStatus kcache_store(const char *dir, const KcacheKey *key, const void *data, size_t size,
                       HpcError *err)
{
    char sub[KCACHE_PATH_MAX], path[KCACHE_PATH_MAX], tmp[KCACHE_PATH_MAX + 32];
    snprintf(sub, sizeof sub, "%s/kernels", dir);
    HpcStatus st = mkdir_p(sub, err);
    if (st) return st;
    kcache_entry_path(path, sizeof path, dir, key);
    snprintf(tmp, sizeof tmp, "%s.tmp.XXXXXX", path);
    int fd = mkstemp(tmp);
    if (fd < 0)
        return hpc_fail(err, HPC_ERR_IO, "cannot create a temporary file in %s: %s; set "
                        "HPC_CACHE_DIR to a writable directory", sub, strerror(errno));
    st = write_temp(fd, tmp, key, data, size, err);
    if (close(fd) != 0 && !st)
        st = hpc_fail(err, HPC_ERR_IO, "close of %s: %s", tmp, strerror(errno));
    if (!st && rename(tmp, path) != 0)
        st = hpc_fail(err, HPC_ERR_IO, "cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (st) {
        unlink(tmp);
        return st;
    }
    fsync_dir(sub);
    return HPC_OK;
}
