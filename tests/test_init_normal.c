/* tests/test_init_normal.c — the batched init draws (runtime/train/init_normal.c)
 * give the same bits as the scalar definition philox_normal, for every
 * alignment, length, salt, seed and index range (including blocks that
 * cross a multiple of 2^32, where the counter's high word changes). */
#include <criterion/criterion.h>
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
    expect_same(1, 0, 0, 4000000);           /* ~4 values take the guard's exact path */
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

/* The rounding guard of init_normal.c is exact only if the fast cosine
 * stays within its stated bound of libm's: check all 2^24 inputs. */
Test(init_normal, fast_cosine_within_its_bound_for_every_input, .timeout = 120)
{
    double ec = 0;
    uint32_t wb = 0;
    for (uint32_t b = 0; b < (1u << 24); b++) {
        double d = fabs(init_normal_cos_fast(b) - init_normal_cos_exact(b));
        if (!(d <= ec)) { ec = d; wb = b; }
    }
    cr_log_info("max cos error %.3g (b = %u)", ec, wb);
    cr_expect(ec <= INIT_NORMAL_C_ERR, "cos error %.3g at b = %u over %.3g", ec, wb, INIT_NORMAL_C_ERR);
}
