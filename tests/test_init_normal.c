/* tests/test_init_normal.c — the batched init draws (runtime/train/init_normal.c)
 * give the same bits as the scalar definition philox_normal, for every
 * alignment, length, salt, seed and index range (including blocks that
 * cross a multiple of 2^32, where the counter's high word changes), on the
 * AVX2 path and on the SSE2/scalar one; the fast radius and cosine stay
 * within the bounds that make the rounding guard exact, for every input. */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/philox.h"
#include "train/init.h"
#include "train/init_normal.h"
#include "train/init_normal_guard.h"

static void expect_same(uint64_t seed, uint32_t salt, int64_t first, int64_t n)
{
    float *got = malloc((size_t)n * sizeof *got);
    init_normals(seed, salt, first, n, got);
    for (int64_t k = 0; k < n; k++) {
        float want = (float)(INIT_STD * philox_normal(seed, (uint64_t)(first + k), salt));
        uint32_t a, b;
        memcpy(&a, &got[k], 4);
        memcpy(&b, &want, 4);
        cr_assert_eq(a, b, "seed %llu salt %u index %lld: %.9g, want %.9g",
                     (unsigned long long)seed, salt, (long long)(first + k), got[k], want);
    }
    free(got);
}

Test(init_normal, matches_philox_normal_bit_for_bit)
{
    expect_same(1, 0, 0, 4000000);           /* a few values take the guard's exact path */
    expect_same(0x123456789abcdefull, 77, 3, 4099);           /* odd start and length */
    for (int64_t n = 0; n < 70; n++) expect_same(42, (uint32_t)n, n * 5, n); /* every tail length */
}

/* The SSE2 lanes alone (the path of a cpu without AVX2) give the same bits. */
Test(init_normal, sse2_path_matches_too)
{
    setenv("HPC_INIT_AVX2", "0", 1);
    expect_same(1, 0, 0, 400000);
    expect_same(9, 3, ((int64_t)1 << 32) - 37, 101);
    for (int64_t n = 0; n < 20; n++) expect_same(42, (uint32_t)n, n * 5, n);
    unsetenv("HPC_INIT_AVX2");
}

Test(init_normal, crosses_the_high_counter_word)
{
    expect_same(9, 3, ((int64_t)1 << 32) - 37, 101);
    expect_same(9, 0xFFFFFFFFu, ((int64_t)5 << 32) - 2, 9);
}

Test(init_normal, values_look_normal)
{
    enum { N = 200000 };
    float *v = malloc(N * sizeof *v);
    init_normals(5, 1, 0, N, v);
    double s = 0, s2 = 0;
    for (int i = 0; i < N; i++) { cr_assert(v[i] == v[i]); s += v[i]; s2 += (double)v[i] * v[i]; }
    double mean = s / N, sd = sqrt(s2 / N - mean * mean);
    cr_expect(fabs(mean) < 0.0005, "mean %g", mean);
    cr_expect(fabs(sd - INIT_STD) < 0.0005, "sd %g, want %g", sd, INIT_STD);
    free(v);
}

/* Where the cpu has AVX2 the draws run its lanes (so the tests below check
 * that code), unless HPC_INIT_AVX2=0 asks for the SSE2/scalar path. */
Test(init_normal, avx2_path_runs_where_the_cpu_has_it)
{
#if defined(__x86_64__) && defined(__GNUC__)
    cr_expect_eq(init_normal_uses_avx2(), (bool)__builtin_cpu_supports("avx2"));
#endif
}

Test(init_normal, avx2_off_takes_the_other_path)
{
    setenv("HPC_INIT_AVX2", "0", 1);
    cr_expect(!init_normal_uses_avx2());
    unsetenv("HPC_INIT_AVX2");
}

/* The rounding guard of init_normal.c is exact only if the fast radius and
 * cosine stay within their stated bounds of libm's: check all 2^24 inputs
 * of each (a = x[0] >> 8, b = x[1] >> 8), through the code the draws run. */
static void expect_parts_within_bounds(void)
{
    enum { CHUNK = 4096 };
    static uint32_t x0[CHUNK], x1[CHUNK];
    static double r[CHUNK], c[CHUNK];
    double er = 0, ec = 0;
    uint32_t wa = 0, wb = 0;
    for (uint32_t base = 0; base < (1u << 24); base += CHUNK) {
        for (uint32_t i = 0; i < CHUNK; i++) {
            x0[i] = ((base + i) << 8) | (i & 0xFF);   /* the low byte must not matter */
            x1[i] = ((base + i) << 8) | (~i & 0xFF);
        }
        init_normal_fast_parts(x0, x1, CHUNK, r, c);
        for (uint32_t i = 0; i < CHUNK; i++) {
            double want_r = init_normal_radius_exact(base + i);
            double dr = fabs(r[i] - want_r) / want_r, dc = fabs(c[i] - init_normal_cos_exact(base + i));
            if (!(dr <= er)) { er = dr; wa = base + i; }
            if (!(dc <= ec)) { ec = dc; wb = base + i; }
        }
    }
    cr_log_info("%s path: max radius error %.3g relative (a = %u), max cos error %.3g (b = %u)",
                init_normal_uses_avx2() ? "AVX2" : "scalar", er, wa, ec, wb);
    cr_expect(er <= INIT_NORMAL_R_ERR, "radius error %.3g at a = %u over %.3g", er, wa, INIT_NORMAL_R_ERR);
    cr_expect(ec <= INIT_NORMAL_C_ERR, "cos error %.3g at b = %u over %.3g", ec, wb, INIT_NORMAL_C_ERR);
}

Test(init_normal, fast_radius_and_cosine_within_their_bounds_for_every_input, .timeout = 120)
{
    expect_parts_within_bounds();
}

Test(init_normal, same_bounds_on_the_sse2_path, .timeout = 120)
{
    setenv("HPC_INIT_AVX2", "0", 1);
    expect_parts_within_bounds();
    unsetenv("HPC_INIT_AVX2");
}

/* The guard's exact path must stay rare, or the fast path buys nothing. */
static void expect_rare_fallbacks(void)
{
    enum { N = 1 << 22 };
    float *v = malloc(N * sizeof *v);
    init_normals(3, 2, 1000, N, v);
    double rate = (double)init_normal_fallback_count() / N;
    cr_log_info("%s path: %llu of %d values took the exact path (%.2g)", init_normal_uses_avx2() ? "AVX2" : "scalar",
                (unsigned long long)init_normal_fallback_count(), N, rate);
    cr_expect(rate < 1e-5, "fallback rate %.3g", rate);
    free(v);
}

Test(init_normal, guard_falls_back_rarely) { expect_rare_fallbacks(); }

Test(init_normal, guard_falls_back_rarely_on_the_sse2_path)
{
    setenv("HPC_INIT_AVX2", "0", 1);
    expect_rare_fallbacks();
    unsetenv("HPC_INIT_AVX2");
}
