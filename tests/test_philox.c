/* tests/test_philox.c — Philox-4x32-10 against the Random123 known-answer
 * vectors, the dropout contract of philox.h (8 decisions of 16 bits per
 * draw) spelled out here from the raw draw, its threshold and its rate. */
#include <criterion/criterion.h>
#include <math.h>
#include "cpu/philox.h"

Test(philox, known_answer_zero)
{
    Philox4x32 c = {{0, 0, 0, 0}};
    PhiloxKey k = {{0, 0}};
    Philox4x32 r = philox4x32_10(c, k);
    cr_expect_eq(r.x[0], 0x6627e8d5u);
    cr_expect_eq(r.x[1], 0xe169c58du);
    cr_expect_eq(r.x[2], 0xbc57ac4cu);
    cr_expect_eq(r.x[3], 0x9b00dbd8u);
}

Test(philox, known_answer_ones)
{
    Philox4x32 c = {{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}};
    PhiloxKey k = {{0xffffffffu, 0xffffffffu}};
    Philox4x32 r = philox4x32_10(c, k);
    cr_expect_eq(r.x[0], 0x408f276du);
    cr_expect_eq(r.x[1], 0x41c83b0eu);
    cr_expect_eq(r.x[2], 0xa20bc7c6u);
    cr_expect_eq(r.x[3], 0x6d5451fdu);
}

/* The contract of philox.h written out independently of philox.c. */
static bool contract_keep(uint64_t seed, uint64_t i, uint32_t step, uint32_t salt, uint32_t t)
{
    uint64_t g = i >> 3;
    Philox4x32 c = {{(uint32_t)g, (uint32_t)(g >> 32), step, salt}};
    PhiloxKey k = {{(uint32_t)seed, (uint32_t)(seed >> 32)}};
    Philox4x32 r = philox4x32_10(c, k);
    uint32_t word = r.x[(i & 7) >> 1];
    uint32_t u = (i & 1) ? word >> 16 : word & 0xFFFFu;
    return u >= t;
}

Test(philox, threshold_is_p_rounded_to_16_bits)
{
    cr_expect_eq(philox_dropout_threshold(0.0f), 0u);
    cr_expect_eq(philox_dropout_threshold(0.1f), 6554u);    /* 6553.6 */
    cr_expect_eq(philox_dropout_threshold(0.5f), 32768u);
    cr_expect_eq(philox_dropout_threshold(0.25f), 16384u);
    cr_expect_eq(philox_dropout_threshold(1.0f), 65536u);   /* everything dropped */
    cr_expect_eq(philox_dropout_threshold(1.0f / 131072.0f), 1u);  /* a tie rounds up */
    for (int k = 1; k < 1000; k++) {
        float p = (float)k / 1000.0f;
        double err = fabs(philox_dropout_threshold(p) / 65536.0 - (double)p);
        cr_expect(err <= 0.5 / 65536.0 + 1e-9, "p %g: threshold off by %g", (double)p, err);
    }
}

Test(philox, keep_follows_the_contract)
{
    const float ps[] = {0.1f, 0.5f, 0.9f, 0.013f};
    for (size_t q = 0; q < sizeof ps / sizeof ps[0]; q++) {
        uint32_t t = philox_dropout_threshold(ps[q]);
        /* Indices across the 32-bit boundary of the group counter too. */
        const uint64_t bases[] = {0, 8ull * 0xFFFFFFF0ull, 12345};
        for (int b = 0; b < 3; b++)
            for (uint64_t i = bases[b]; i < bases[b] + 4099; i++) {
                uint64_t seed = 0x0123456789abcdefull + q;
                bool want = contract_keep(seed, i, 11, 5, t);
                cr_assert_eq(philox_dropout_keep(seed, i, 11, 5, ps[q]), want, "p %g i %llu",
                             (double)ps[q], (unsigned long long)i);
                bool bit = philox_dropout_mask8(seed, i >> 3, 11, 5, ps[q]) >> (i & 7) & 1u;
                cr_assert_eq(bit, want, "mask8 bit of i %llu", (unsigned long long)i);
            }
    }
}

/* Pins the contract: a change to it changes every mask, so it must change
 * the cpu reference and every CUDA kernel together (and this value). */
Test(philox, mask_known_values)
{
    cr_expect_eq(philox_dropout_mask8(42, 0, 3, 7, 0.5f), 0x07u);   /* also from a Python Philox */
    cr_expect_eq(philox_dropout_mask8(1, 2, 0, 0, 0.0f), 0xFFu);
    cr_expect_eq(philox_dropout_mask8(1, 2, 0, 0, 1.0f), 0x00u);
}

Test(philox, dropout_rate_is_the_threshold)
{
    const float ps[] = {0.1f, 0.3f};
    for (int q = 0; q < 2; q++) {
        int64_t kept = 0, n = 1 << 22;
        for (int64_t g = 0; g < n / 8; g++)
            kept += __builtin_popcount(philox_dropout_mask8(42, (uint64_t)g, 3, 7, ps[q]));
        double rate = 1.0 - (double)kept / (double)n;
        double want = philox_dropout_threshold(ps[q]) / 65536.0;
        double sigma = sqrt(want * (1 - want) / (double)n);
        cr_expect(fabs(rate - want) < 5 * sigma, "p %g: drop rate %f, want %f (sigma %g)", (double)ps[q],
                  rate, want, sigma);
    }
}

Test(philox, normal_has_unit_variance)
{
    double s = 0, s2 = 0;
    int n = 200000;
    for (int i = 0; i < n; i++) {
        double x = philox_normal(1, (uint64_t)i, 5);
        s += x;
        s2 += x * x;
    }
    double mean = s / n, var = s2 / n - mean * mean;
    cr_expect(fabs(mean) < 0.01 && fabs(var - 1.0) < 0.02, "mean %f var %f", mean, var);
}
