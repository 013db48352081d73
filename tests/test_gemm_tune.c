/* tests/test_gemm_tune.c — GEMM algorithm choice by timing and its disk
 * cache (runtime/cuda/gemm_tune.h), on the cpu with a fake timer: the
 * selection rule, a save/load round trip, every kind of damaged file
 * ignored with a warning that names the line, and the key: the epilogue,
 * the bias dtype and the bias alignment each make another key. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/gemm_tune.h"

/* ---- selection with a fake timer ---------------------------------------- */

typedef struct {
    double t[GEMM_TUNE_MAX_CANDIDATES][4];   /* [candidate][round] */
    int calls[GEMM_TUNE_MAX_CANDIDATES], round[GEMM_TUNE_MAX_CANDIDATES];
} Fake;

static double fake_timer(void *ctx, int i)
{
    Fake *f = ctx;
    f->calls[i]++;
    return f->t[i][f->round[i]++ % 4];
}

static Fake fake(const double *times, int n)
{
    Fake f;
    memset(&f, 0, sizeof f);
    for (int i = 0; i < n; i++)
        for (int r = 0; r < 4; r++) f.t[i][r] = times[i];
    return f;
}

Test(gemm_tune, picks_the_fastest)
{
    double t[] = {10, 9, 5, 7};
    Fake f = fake(t, 4);
    double best = 0;
    cr_expect_eq(gemm_tune_pick(4, 3, fake_timer, &f, &best), 2);
    cr_expect_eq(best, 5);
    for (int i = 0; i < 4; i++) cr_expect_eq(f.calls[i], 3, "candidate %d timed %d times", i, f.calls[i]);
}

Test(gemm_tune, keeps_the_heuristic_within_the_margin)
{
    double t[] = {10, 9.9, 9.85};   /* 1.5% faster: noise */
    Fake f = fake(t, 3);
    cr_expect_eq(gemm_tune_pick(3, 2, fake_timer, &f, NULL), 0);
    double u[] = {10, 9.7};        /* 3% faster: taken */
    f = fake(u, 2);
    cr_expect_eq(gemm_tune_pick(2, 2, fake_timer, &f, NULL), 1);
}

Test(gemm_tune, best_round_counts_and_ties_go_first)
{
    Fake f = fake((double[]){8, 8, 8}, 3);
    f.t[1][0] = 3;   /* candidate 1 is fast in one round only: its best counts */
    cr_expect_eq(gemm_tune_pick(3, 3, fake_timer, &f, NULL), 1);
    f = fake((double[]){9, 6, 6}, 3);
    cr_expect_eq(gemm_tune_pick(3, 1, fake_timer, &f, NULL), 1);
}

Test(gemm_tune, failing_candidates_are_never_chosen)
{
    Fake f = fake((double[]){-1, 4, 2}, 3);
    f.t[2][1] = -1;   /* candidate 2 fails in its second round */
    double best = 0;
    cr_expect_eq(gemm_tune_pick(3, 3, fake_timer, &f, &best), 1);
    cr_expect_eq(best, 4);
    f = fake((double[]){-1, -1}, 2);
    cr_expect_eq(gemm_tune_pick(2, 2, fake_timer, &f, NULL), -1);
    cr_expect_eq(gemm_tune_pick(0, 2, fake_timer, &f, NULL), -1);
}

/* ---- the cache file -------------------------------------------------------- */

static char g_dir[128], g_path[256];

static void make_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/hpc-gemm-tune-XXXXXX");
    cr_assert_not_null(mkdtemp(g_dir));
    snprintf(g_path, sizeof g_path, "%s/%s", g_dir, GEMM_TUNE_FILE);
}

static void remove_dir(void)
{
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    cr_expect_eq(system(cmd), 0);
}

static const char *const keys[] = {
    "NVIDIA H200|lt=130100|M=4096 N=768 K=768 b=1 tA=0 tB=1 f16->f16 epi=1",
    "NVIDIA H200|lt=130100|M=4096 N=3072 K=768 b=1 tA=0 tB=1 f16->f16 epi=0",
    "NVIDIA H200|lt=130100|M=128 N=128 K=64 b=384 tA=0 tB=1 f16->f16 epi=0",
};

static void fill(GemmTuneCache *c)
{
    for (int k = 0; k < 3; k++) {
        uint8_t algo[GEMM_TUNE_ALGO_BYTES];
        for (int b = 0; b < GEMM_TUNE_ALGO_BYTES; b++) algo[b] = (uint8_t)(37 * k + 11 * b + 1);
        HpcError err;
        cr_assert_eq(gemm_tune_put(c, keys[k], algo, 12.5 + k, &err), HPC_OK, "%s", err.msg);
    }
}

static void write_text(const char *text, size_t n)
{
    FILE *f = fopen(g_path, "wb");
    cr_assert_not_null(f);
    cr_assert_eq(fwrite(text, 1, n, f), n);
    fclose(f);
}

/* Loads g_path; returns the entries and the warning text in warn. */
static int load_with_warning(char *warn, size_t size)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *w = open_memstream(&buf, &len);
    GemmTuneCache c;
    gemm_tune_load(&c, g_path, w);
    fclose(w);
    snprintf(warn, size, "%s", buf ? buf : "");
    free(buf);
    int n = c.n;
    gemm_tune_free(&c);
    return n;
}

Test(gemm_tune, round_trip, .init = make_dir, .fini = remove_dir)
{
    GemmTuneCache c;
    gemm_tune_load(&c, g_path, stderr);   /* absent: empty, no warning */
    cr_expect_eq(c.n, 0);
    fill(&c);
    HpcError err;
    cr_assert_eq(gemm_tune_save(&c, &err), HPC_OK, "%s", err.msg);
    GemmTuneCache d;
    char warn[512];
    cr_expect_eq(load_with_warning(warn, sizeof warn), 3);
    cr_expect_str_empty(warn);
    gemm_tune_load(&d, g_path, stderr);
    cr_assert_eq(d.n, 3);
    for (int k = 0; k < 3; k++) {
        const GemmTuneEntry *a = gemm_tune_find(&c, keys[k]), *b = gemm_tune_find(&d, keys[k]);
        cr_assert(a && b, "key %d lost", k);
        cr_expect_eq(memcmp(a->algo, b->algo, GEMM_TUNE_ALGO_BYTES), 0);
        cr_expect_eq(a->us, b->us);
    }
    cr_expect_null(gemm_tune_find(&d, "NVIDIA H200|other"));
    /* Replacing keeps one entry per key. */
    uint8_t zero[GEMM_TUNE_ALGO_BYTES] = {0};
    cr_assert_eq(gemm_tune_put(&d, keys[1], zero, 3.0, &err), HPC_OK);
    cr_expect_eq(d.n, 3);
    cr_expect_eq(gemm_tune_find(&d, keys[1])->us, 3.0);
    gemm_tune_free(&c);
    gemm_tune_free(&d);
}

Test(gemm_tune, bad_keys_refused)
{
    GemmTuneCache c;
    gemm_tune_load(&c, NULL, NULL);
    uint8_t algo[GEMM_TUNE_ALGO_BYTES] = {0};
    HpcError err;
    cr_expect_eq(gemm_tune_put(&c, "", algo, 1, &err), HPC_ERR_USAGE);
    cr_expect_eq(gemm_tune_put(&c, "a\tb", algo, 1, &err), HPC_ERR_USAGE);
    cr_expect_eq(gemm_tune_put(&c, "a\nb", algo, 1, &err), HPC_ERR_USAGE);
    char longkey[GEMM_TUNE_KEY_MAX + 1];
    memset(longkey, 'k', GEMM_TUNE_KEY_MAX);
    longkey[GEMM_TUNE_KEY_MAX] = 0;
    cr_expect_eq(gemm_tune_put(&c, longkey, algo, 1, &err), HPC_ERR_USAGE);
    cr_expect_eq(c.n, 0);
    gemm_tune_free(&c);
}

/* A good file, damaged one way: ignored, and the warning names the file,
 * the line and the fault. */
static void expect_rejected(const char *text, size_t n, int line, const char *fault)
{
    write_text(text, n);
    char warn[512], want[300];
    cr_expect_eq(load_with_warning(warn, sizeof warn), 0, "damaged file accepted: %s", fault);
    snprintf(want, sizeof want, "%s:%d:", g_path, line);
    cr_expect(strstr(warn, want) != NULL, "warning \"%s\" lacks %s", warn, want);
    cr_expect(strstr(warn, fault) != NULL, "warning \"%s\" lacks \"%s\"", warn, fault);
    cr_expect(strstr(warn, "rebuilt") != NULL, "%s", warn);
}

Test(gemm_tune, damaged_files_ignored, .init = make_dir, .fini = remove_dir)
{
    GemmTuneCache c;
    gemm_tune_load(&c, g_path, NULL);
    fill(&c);
    size_t len;
    char *good = gemm_tune_format(&c, &len);
    char *t = malloc(len + 64);
    /* Line 1: another version. */
    memcpy(t, good, len);
    t[14] = '2';
    expect_rejected(t, len, 1, "another format or version");
    /* A flipped byte in an algorithm: the checksum catches it on the end line. */
    memcpy(t, good, len);
    char *hex = strchr(strchr(t, '\n') + 1, '\t') + 1;
    hex[5] = hex[5] == 'a' ? 'b' : 'a';
    expect_rejected(t, len, 5, "checksum mismatch");
    /* An upper-case hex digit on line 3. */
    memcpy(t, good, len);
    hex = strchr(strchr(strchr(t, '\n') + 1, '\n') + 1, '\t') + 1;
    hex[0] = 'G';
    expect_rejected(t, len, 3, "not a lower-case hex digit");
    /* A cut file: no end line. */
    memcpy(t, good, len);
    char *end = strstr(t, "end ");
    expect_rejected(t, (size_t)(end - t), 5, "no end line");
    /* Cut in the middle of a line. */
    expect_rejected(t, (size_t)(end - t) - 10, 4, "no newline");
    /* A wrong entry count. */
    size_t head = (size_t)(end - t);
    int n2 = snprintf(t + head, 64, "end 2 %s", strchr(strstr(good, "end ") + 4, ' ') + 1);
    expect_rejected(t, head + (size_t)n2, 5, "entry count");
    /* A negative time on line 2. */
    memcpy(t, good, len);
    char *line2 = strchr(t, '\n') + 1, *tab2 = strchr(strchr(line2, '\t') + 1, '\t') + 1;
    *tab2 = '-';
    expect_rejected(t, len, 2, "finite number > 0");
    /* Text after the end line. */
    memcpy(t, good, len);
    memcpy(t + len, "x\n", 2);
    expect_rejected(t, len + 2, 6, "after the end line");
    /* An empty file. */
    expect_rejected("", 0, 1, "no end line");
    /* And the good one still loads. */
    write_text(good, len);
    char warn[256];
    cr_expect_eq(load_with_warning(warn, sizeof warn), 3);
    cr_expect_str_empty(warn);
    free(t);
    free(good);
    gemm_tune_free(&c);
}

/* ---- the key: every field that decides the algorithm, the epilogue too ---- */

static GemmTuneShape dw_shape(void)
{
    return (GemmTuneShape){.gpu = "NVIDIA H200", .lt_version = 130000, .M = 768, .N = 3072, .K = 4096,
                           .batch = 1, .lda = 768, .ldb = 3072, .ldc = 3072, .trans_a = 1, .ab_type = "f16",
                           .c_type = "f32", .bias_type = "f32", .epilogue = "bgrad_a", .align_a = 256,
                           .align_b = 256, .align_c = 256, .align_bias = 256, .workspace = 32u << 20};
}

Test(gemm_tune, key_names_epilogue_and_bias_type)
{
    char a[GEMM_TUNE_KEY_MAX], b[GEMM_TUNE_KEY_MAX];
    GemmTuneShape s = dw_shape();
    gemm_tune_key(&s, a, sizeof a);
    cr_expect(strstr(a, "epi=bgrad_a") && strstr(a, "bias=f32") && strstr(a, "f16->f32"), "%s", a);
    cr_expect(strstr(a, "M=768 N=3072 K=4096") && strstr(a, "tA=1") && strstr(a, "NVIDIA H200"), "%s", a);
    HpcError err;
    GemmTuneCache c;
    memset(&c, 0, sizeof c);
    uint8_t algo[GEMM_TUNE_ALGO_BYTES] = {1};
    cr_expect_eq(gemm_tune_put(&c, a, algo, 1.0, &err), HPC_OK, "the key is a valid cache key: %s", a);
    gemm_tune_free(&c);
    /* the same GEMM without the epilogue, or with another bias dtype or
     * bias alignment, is another key */
    s.epilogue = "none";
    s.bias_type = "-";
    s.align_bias = 0;
    gemm_tune_key(&s, b, sizeof b);
    cr_expect_str_neq(a, b);
    s = dw_shape();
    s.bias_type = "f16";
    gemm_tune_key(&s, b, sizeof b);
    cr_expect_str_neq(a, b);
    s = dw_shape();
    s.align_bias = 16;
    gemm_tune_key(&s, b, sizeof b);
    cr_expect_str_neq(a, b);
    s = dw_shape();
    gemm_tune_key(&s, b, sizeof b);
    cr_expect_str_eq(a, b, "the key is a function of the shape");
}

/* Buckets: ceil(2^(j / 4)), powers of two their own; every size at most
 * its bucket and within 19 % (plus the rounding) below it. */
Test(gemm_tune, buckets_are_quarter_octaves)
{
    cr_expect_eq(gemm_tune_bucket(1), 1);
    cr_expect_eq(gemm_tune_bucket(1024), 1024);
    cr_expect_eq(gemm_tune_bucket(4096), 4096);
    cr_expect_eq(gemm_tune_bucket(3), 3);         /* 2^1.5 = 2.83, rounded up */
    cr_expect_eq(gemm_tune_bucket(1025), 1218);   /* 2^10.25 = 1217.75 */
    cr_expect_eq(gemm_tune_bucket(1218), 1218);
    cr_expect_eq(gemm_tune_bucket(1219), 1449);   /* 2^10.5 = 1448.15 */
    int64_t prev = 0;
    for (int64_t x = 2; x <= 40000; x++) {
        int64_t b = gemm_tune_bucket(x);
        cr_assert(b >= x && (double)b < 1.19 * (double)x + 1.0, "bucket(%lld) = %lld", (long long)x, (long long)b);
        cr_assert(b >= prev, "buckets grow: bucket(%lld) = %lld after %lld", (long long)x, (long long)b,
                  (long long)prev);
        prev = b;
    }
}

/* A class key differs from every shape key, and shapes share it exactly
 * when their sizes share buckets and everything else is equal. */
Test(gemm_tune, class_keys_group_sizes_and_nothing_else)
{
    char a[GEMM_TUNE_KEY_MAX], b[GEMM_TUNE_KEY_MAX], k[GEMM_TUNE_KEY_MAX];
    GemmTuneShape s = dw_shape();   /* K = 4096 tokens */
    gemm_tune_class_key(&s, a, sizeof a);
    gemm_tune_key(&s, k, sizeof k);
    cr_expect(strncmp(a, "class|", 6) == 0 && strstr(a, "M=862 N=3445 K=4096 "), "%s against %s", a, k);
    s.K = 3500;   /* 4096's bucket: 2^11.75 = 3444 < 3500 */
    gemm_tune_class_key(&s, b, sizeof b);
    cr_expect_str_eq(a, b, "K 3500 and 4096 share a class");
    gemm_tune_key(&s, b, sizeof b);
    cr_expect_str_neq(k, b, "but not a shape key");
    s.K = 3400;
    gemm_tune_class_key(&s, b, sizeof b);
    cr_expect_str_neq(a, b, "K 3400 is the class below");
    s = dw_shape();
    s.epilogue = "none";
    gemm_tune_class_key(&s, b, sizeof b);
    cr_expect_str_neq(a, b, "another epilogue, another class");
    s = dw_shape();
    s.align_a = 16;
    gemm_tune_class_key(&s, b, sizeof b);
    cr_expect_str_neq(a, b, "another alignment, another class");
}
