/* runtime/cuda/gemm_tune.c — see gemm_tune.h. */
#include "cuda/gemm_tune.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "formats/atomic_file.h"

#define TUNE_MAGIC "hpc-gemm-tune 1"

/* ---- selection ----------------------------------------------------------- */

int gemm_tune_pick(int n, int rounds, GemmTuneTimer timer, void *ctx, double *best)
{
    if (n < 1) return -1;
    if (n > GEMM_TUNE_MAX_CANDIDATES) n = GEMM_TUNE_MAX_CANDIDATES;
    if (rounds < 1) rounds = 1;
    double t[GEMM_TUNE_MAX_CANDIDATES];
    for (int i = 0; i < n; i++) t[i] = -1;
    for (int r = 0; r < rounds; r++)
        for (int i = 0; i < n; i++) {
            double x = timer(ctx, i);
            if (!(x >= 0) || !isfinite(x)) { t[i] = -2; continue; }   /* failed once: out */
            if (t[i] != -2 && (t[i] < 0 || x < t[i])) t[i] = x;
        }
    int win = -1;   /* the fastest usable one; ties go to the earlier */
    for (int i = 0; i < n; i++)
        if (t[i] >= 0 && (win < 0 || t[i] < t[win])) win = i;
    /* The heuristic's first choice stays unless beaten by more than the margin. */
    if (win > 0 && t[0] >= 0 && t[win] >= t[0] * (1.0 - GEMM_TUNE_MARGIN)) win = 0;
    if (best) *best = win >= 0 ? t[win] : 0;
    return win;
}

/* ---- keys ------------------------------------------------------------------- */

/* The key text with the sizes given (s's own, or their buckets) after prefix. */
static void key_text(const GemmTuneShape *s, const char *prefix, int64_t M, int64_t N, int64_t K, char *buf,
                     size_t size)
{
    snprintf(buf, size, "%s%s|lt=%zu|M=%lld N=%lld K=%lld b=%lld lda=%lld ldb=%lld ldc=%lld sa=%lld sb=%lld "
             "sc=%lld aux=%lld tA=%d tB=%d %s->%s epi=%s bias=%s tf32=%d al=%d/%d/%d/%d/%d ws=%zu%s",
             prefix, s->gpu, s->lt_version, (long long)M, (long long)N, (long long)K, (long long)s->batch,
             (long long)s->lda, (long long)s->ldb, (long long)s->ldc, (long long)s->stride_a,
             (long long)s->stride_b, (long long)s->stride_c, (long long)s->ld_aux, s->trans_a, s->trans_b,
             s->ab_type, s->c_type, s->epilogue, s->bias_type, s->tf32, s->align_a, s->align_b, s->align_c,
             s->align_bias, s->align_aux, s->workspace, s->pointer_array ? " ptrs" : "");
}

void gemm_tune_key(const GemmTuneShape *s, char *buf, size_t size)
{
    key_text(s, "", s->M, s->N, s->K, buf, size);
}

/* ceil(2^(j / GEMM_TUNE_CLASS_STEPS)) */
static int64_t bucket_size(int j) { return (int64_t)ceil(exp2((double)j / GEMM_TUNE_CLASS_STEPS) - 1e-9); }

int64_t gemm_tune_bucket(int64_t x)
{
    if (x <= 1) return x;
    /* the smallest bucket_size(j) at or above x; log2 gives j to within one */
    int j = (int)floor(GEMM_TUNE_CLASS_STEPS * log2((double)x)) - 1;
    while (bucket_size(j) < x) j++;
    return bucket_size(j);
}

void gemm_tune_class_key(const GemmTuneShape *s, char *buf, size_t size)
{
    key_text(s, "class|", gemm_tune_bucket(s->M), gemm_tune_bucket(s->N), gemm_tune_bucket(s->K), buf, size);
}

/* ---- the cache ------------------------------------------------------------ */

static uint64_t fnv1a(const char *p, size_t n)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint8_t)p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static bool key_ok(const char *key)
{
    size_t n = strlen(key);
    if (n == 0 || n >= GEMM_TUNE_KEY_MAX) return false;
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)key[i] < 0x20 || (unsigned char)key[i] > 0x7e) return false;
    return true;
}

const GemmTuneEntry *gemm_tune_find(const GemmTuneCache *c, const char *key)
{
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->e[i].key, key) == 0) return &c->e[i];
    return NULL;
}

HpcStatus gemm_tune_put(GemmTuneCache *c, const char *key, const void *algo, double us, HpcError *err)
{
    if (!key_ok(key))
        return hpc_fail(err, HPC_ERR_USAGE, "gemm_tune_put: key \"%.80s\" is empty, longer than %d bytes or "
                        "not printable ASCII without tabs", key, GEMM_TUNE_KEY_MAX - 1);
    GemmTuneEntry *e = (GemmTuneEntry *)gemm_tune_find(c, key);
    if (!e) {
        if (c->n == c->cap) {
            c->cap = c->cap ? 2 * c->cap : 16;
            c->e = xrealloc(c->e, (size_t)c->cap * sizeof *c->e);
        }
        e = &c->e[c->n++];
        snprintf(e->key, sizeof e->key, "%s", key);
    }
    memcpy(e->algo, algo, GEMM_TUNE_ALGO_BYTES);
    e->us = us;
    return HPC_OK;
}

void gemm_tune_free(GemmTuneCache *c)
{
    free(c->e);
    c->e = NULL;
    c->n = c->cap = 0;
}

char *gemm_tune_format(const GemmTuneCache *c, size_t *len)
{
    size_t cap = 64 + (size_t)c->n * (GEMM_TUNE_KEY_MAX + 2 * GEMM_TUNE_ALGO_BYTES + 40);
    char *buf = xmalloc(cap);
    size_t n = (size_t)snprintf(buf, cap, "%s\n", TUNE_MAGIC);
    for (int i = 0; i < c->n; i++) {
        n += (size_t)snprintf(buf + n, cap - n, "%s\t", c->e[i].key);
        for (int b = 0; b < GEMM_TUNE_ALGO_BYTES; b++) n += (size_t)snprintf(buf + n, cap - n, "%02x", c->e[i].algo[b]);
        n += (size_t)snprintf(buf + n, cap - n, "\t%.3f\n", c->e[i].us);
    }
    uint64_t h = fnv1a(buf, n);
    n += (size_t)snprintf(buf + n, cap - n, "end %d %016llx\n", c->n, (unsigned long long)h);
    *len = n;
    return buf;
}

static int hexval(char ch)
{
    if (ch >= '0' && ch <= '9') return ch - '0';
    if (ch >= 'a' && ch <= 'f') return ch - 'a' + 10;
    return -1;
}

/* One "KEY\tALGO\tUS" line (without its newline) into e; NULL if good,
 * else what is wrong. */
static const char *parse_entry(const char *line, size_t len, GemmTuneEntry *e)
{
    const char *tab1 = memchr(line, '\t', len);
    if (!tab1) return "no tab after the key";
    size_t klen = (size_t)(tab1 - line);
    if (klen == 0 || klen >= GEMM_TUNE_KEY_MAX) return "empty or over-long key";
    memcpy(e->key, line, klen);
    e->key[klen] = 0;
    if (!key_ok(e->key)) return "key holds a byte outside printable ASCII";
    const char *hex = tab1 + 1, *end = line + len;
    if (end - hex < 2 * GEMM_TUNE_ALGO_BYTES + 2 || hex[2 * GEMM_TUNE_ALGO_BYTES] != '\t')
        return "the algorithm is not 128 hex digits followed by a tab";
    for (int b = 0; b < GEMM_TUNE_ALGO_BYTES; b++) {
        int hi = hexval(hex[2 * b]), lo = hexval(hex[2 * b + 1]);
        if (hi < 0 || lo < 0) return "the algorithm holds a character that is not a lower-case hex digit";
        e->algo[b] = (uint8_t)(hi << 4 | lo);
    }
    const char *us = hex + 2 * GEMM_TUNE_ALGO_BYTES + 1;
    char num[64];
    size_t ulen = (size_t)(end - us);
    if (ulen == 0 || ulen >= sizeof num) return "no time after the algorithm";
    memcpy(num, us, ulen);
    num[ulen] = 0;
    char *stop;
    errno = 0;
    e->us = strtod(num, &stop);
    if (*stop || errno || !isfinite(e->us) || e->us <= 0) return "the time is not a finite number > 0";
    return NULL;
}

static int fail_at(GemmTuneCache *c, int line, const char *what, char *why, size_t why_size)
{
    snprintf(why, why_size, "%s", what);
    c->n = 0;
    return line;
}

int gemm_tune_parse(GemmTuneCache *c, const char *text, size_t len, char *why, size_t why_size)
{
    const char *p = text, *end = text + len;
    int line = 0, entries = 0;
    if (memchr(text, 0, len)) return fail_at(c, 1, "the file holds a NUL byte", why, why_size);
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        line++;
        if (!nl) return fail_at(c, line, "the last line has no newline (a cut file)", why, why_size);
        size_t n = (size_t)(nl - p);
        if (line == 1) {
            if (n != strlen(TUNE_MAGIC) || memcmp(p, TUNE_MAGIC, n) != 0)
                return fail_at(c, 1, "not \"" TUNE_MAGIC "\" (another format or version)", why, why_size);
        } else if (n >= 4 && memcmp(p, "end ", 4) == 0) {
            char tail[64];
            if (n >= sizeof tail) return fail_at(c, line, "malformed end line", why, why_size);
            memcpy(tail, p, n);
            tail[n] = 0;
            int count = -1, used = 0;
            unsigned long long h = 0;
            if (sscanf(tail, "end %d %16llx%n", &count, &h, &used) != 2 || (size_t)used != n)
                return fail_at(c, line, "malformed end line", why, why_size);
            if (count != entries) return fail_at(c, line, "the entry count does not match", why, why_size);
            if (h != fnv1a(text, (size_t)(p - text)))
                return fail_at(c, line, "checksum mismatch (the file was changed or damaged)", why, why_size);
            if (nl + 1 != end) return fail_at(c, line + 1, "text after the end line", why, why_size);
            return 0;
        } else {
            GemmTuneEntry e;
            const char *bad = parse_entry(p, n, &e);
            if (bad) return fail_at(c, line, bad, why, why_size);
            if (gemm_tune_find(c, e.key)) return fail_at(c, line, "a key listed twice", why, why_size);
            HpcError err;
            if (gemm_tune_put(c, e.key, e.algo, e.us, &err)) return fail_at(c, line, err.msg, why, why_size);
            entries++;
        }
        p = nl + 1;
    }
    return fail_at(c, line + 1, "no end line (a cut file)", why, why_size);
}

void gemm_tune_load(GemmTuneCache *c, const char *path, FILE *warn)
{
    memset(c, 0, sizeof *c);
    if (!path || !*path) return;
    snprintf(c->path, sizeof c->path, "%s", path);
    FILE *f = fopen(path, "rb");
    if (!f) return;   /* no cache yet */
    size_t cap = 1 << 16, len = 0;
    char *buf = xmalloc(cap);
    for (size_t got; (got = fread(buf + len, 1, cap - len, f)) > 0;) {
        len += got;
        if (len == cap) buf = xrealloc(buf, cap *= 2);
    }
    bool read_err = ferror(f);
    fclose(f);
    char why[256];
    int bad = read_err ? -1 : gemm_tune_parse(c, buf, len, why, sizeof why);
    if (bad > 0 && warn)
        fprintf(warn, "hpc: warning: GEMM algorithm cache %s:%d: %s; ignored, it will be rebuilt\n", path, bad, why);
    if (bad < 0 && warn)
        fprintf(warn, "hpc: warning: GEMM algorithm cache %s: read error; ignored, it will be rebuilt\n", path);
    free(buf);
}

HpcStatus gemm_tune_save(const GemmTuneCache *c, HpcError *err)
{
    if (!c->path[0]) return HPC_OK;
    size_t len;
    char *text = gemm_tune_format(c, &len);
    HpcStatus st = atomic_write_file(c->path, text, len, err);
    free(text);
    return st;
}
