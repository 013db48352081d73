/* runtime/cuda/gemm_tune.h — choosing a GEMM algorithm by timing, and the
 * disk cache of the choices.  No CUDA here: runtime/cuda/gemm_cublas.c
 * supplies the candidates (cuBLASLt's heuristic, up to GEMM_TUNE_MAX_CANDIDATES)
 * and a timer; tests/test_gemm_tune.c a fake one.
 *
 * Selection (gemm_tune_pick): every candidate is timed `rounds` times,
 * interleaved (candidate 0, 1, .., n-1, then again), keeping each one's
 * best time.  The fastest wins (ties: the earlier), except that the
 * heuristic's first candidate stays unless the fastest beats it by more
 * than GEMM_TUNE_MARGIN (2%: below that the difference is timing noise).
 * A candidate whose timer fails in any round is never chosen.
 *
 * The cache: one file, DIR/gemm_algos.txt beside the kernel cache
 * (runtime/cuda/kernel_cache.h's directory), text:
 *   hpc-gemm-tune 1
 *   KEY<TAB>ALGO<TAB>US        one line per shape
 *   end N FNV
 * KEY is printable ASCII without tabs (gemm_tune_key: the GPU name, the
 * cuBLASLt version, shape, dtypes, layout, alignments, epilogue, bias dtype
 * and workspace size), ALGO the 64 bytes of the cuBLASLt algorithm in hex
 * (128 digits), US the time it measured (microseconds, finite, > 0), N the
 * number of entries and FNV the FNV-1a 64 hash (16 hex digits) of every
 * byte before the "end" line.  gemm_tune_load validates all of it: a file
 * that fails any check is ignored with a warning naming the file, the line
 * and the fault, and the cache starts empty (the next save rebuilds it).
 * gemm_tune_save writes the whole file atomically (runtime/formats/atomic_file.h).
 *
 * Shape classes (gemm_tune_class_key, below) are entries like any other.
 *
 * Ownership: a GemmTuneCache owns its entries; gemm_tune_free releases them.
 *
 *   GemmTuneCache c;
 *   gemm_tune_load(&c, path, stderr);
 *   const GemmTuneEntry *e = gemm_tune_find(&c, key);
 *   if (!e) { int i = gemm_tune_pick(n, 3, timer, ctx, &us); gemm_tune_put(&c, key, algo[i], us);
 *             gemm_tune_save(&c, &err); }
 *   gemm_tune_free(&c);
 */
#ifndef HPC_RUNTIME_GEMM_TUNE_H
#define HPC_RUNTIME_GEMM_TUNE_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "util/error.h"

#define GEMM_TUNE_MAX_CANDIDATES 8
#define GEMM_TUNE_ALGO_BYTES 64    /* sizeof(cublasLtMatmulAlgo_t) */
#define GEMM_TUNE_KEY_MAX 512
#define GEMM_TUNE_MARGIN 0.02
#define GEMM_TUNE_FILE "gemm_algos.txt"

typedef struct {
    char key[GEMM_TUNE_KEY_MAX];
    uint8_t algo[GEMM_TUNE_ALGO_BYTES];
    double us;
} GemmTuneEntry;

typedef struct {
    char path[4096];           /* the cache file; "" = memory only */
    GemmTuneEntry *e;
    int n, cap;
} GemmTuneCache;

/* What a tuning key is made of: everything that decides which algorithms
 * are valid and fast for a GEMM call (gemm_cublas.c fills it).  epilogue
 * and the dtypes are names ("bgrad_a", "f16"), so a renumbered enum cannot
 * make an old entry match another call. */
typedef struct {
    const char *gpu;            /* device name */
    size_t lt_version;          /* cublasLtGetVersion() */
    int64_t M, N, K, batch, lda, ldb, ldc, stride_a, stride_b, stride_c, ld_aux;
    int trans_a, trans_b, tf32;
    const char *ab_type, *c_type, *bias_type;   /* bias_type "-" without a bias vector */
    const char *epilogue;       /* the epilogue the algorithm runs ("none" for a plain GEMM) */
    int align_a, align_b, align_c, align_bias, align_aux;
    size_t workspace;
    int pointer_array;          /* a batch of pointer arrays ("ptrs" in the key), not strided */
} GemmTuneShape;

/* The key of s, printable ASCII without tabs (truncated to size). */
void gemm_tune_key(const GemmTuneShape *s, char *buf, size_t size);

/* Shape classes.  A packed batch's token count, and so the M (or K) of its
 * GEMMs, changes from step to step (docs/packing.md): timing the
 * candidates for every count costs more than a choice for that count can
 * win back (each count recurs in only some of the steps).  So a timed
 * choice is also kept under its class key: s's key with M, N and K each
 * rounded up to its bucket, the next of GEMM_TUNE_CLASS_STEPS sizes a
 * doubling, ceil(2^(j / 4)) (a size is at most 19 % below its bucket, plus
 * the rounding), behind "class|" so that it never equals a shape's key.
 * Another shape of the class takes that choice, untimed, where cuBLASLt's
 * heuristic proposes it for that shape too (gemm_cublas.c). */
#define GEMM_TUNE_CLASS_STEPS 4
int64_t gemm_tune_bucket(int64_t x);
void gemm_tune_class_key(const GemmTuneShape *s, char *buf, size_t size);

/* Seconds (or any unit) one run of candidate i takes; < 0 if it failed. */
typedef double (*GemmTuneTimer)(void *ctx, int candidate);

/* The chosen candidate's index as described above, its best time in *best
 * (may be NULL); -1 when every candidate failed or n < 1. */
int gemm_tune_pick(int n, int rounds, GemmTuneTimer timer, void *ctx, double *best);

/* Reads path into c (an absent file is an empty cache, silently; a bad one
 * an empty cache and a line on `warn`, when not NULL).  path "" or NULL:
 * memory only. */
void gemm_tune_load(GemmTuneCache *c, const char *path, FILE *warn);
void gemm_tune_free(GemmTuneCache *c);

/* The entry for key, or NULL. */
const GemmTuneEntry *gemm_tune_find(const GemmTuneCache *c, const char *key);

/* Adds or replaces key's entry.  HPC_ERR_USAGE for a key that is empty,
 * too long, or holds a tab, a newline or a byte outside printable ASCII. */
HpcStatus gemm_tune_put(GemmTuneCache *c, const char *key, const void *algo, double us, HpcError *err);

/* Writes the whole cache to its path atomically (nothing when path is ""). */
HpcStatus gemm_tune_save(const GemmTuneCache *c, HpcError *err);

/* The text of the file gemm_tune_save writes (malloc'd, NUL-terminated). */
char *gemm_tune_format(const GemmTuneCache *c, size_t *len);

/* Parses text of length len into c (entries appended to an empty c).
 * Returns 0 if it is a valid file, else the 1-based line of the first
 * fault with its description in why (c is then left empty). */
int gemm_tune_parse(GemmTuneCache *c, const char *text, size_t len, char *why, size_t why_size);

#endif
