/* tests/test_philox.c — Philox-4x32-10 against the Random123 known-answer
 * vectors, and the dropout draw's rate. */
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

Test(philox, dropout_rate_close_to_p)
{
    int kept = 0, n = 200000;
    for (int i = 0; i < n; i++) kept += philox_dropout_keep(42, (uint64_t)i, 3, 7, 0.1f);
    double rate = 1.0 - (double)kept / n;
    cr_expect(rate > 0.097 && rate < 0.103, "drop rate %f", rate);
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
