/* tests/test_half.c — fp16/bf16 conversion: IEEE edge values, an exhaustive
 * round trip of all 65536 bit patterns, and random floats against two
 * independent references: rounding with rint() in double (the FPU's
 * round-to-nearest-even) and, where the compiler has it, the compiler's own
 * _Float16 conversion. */
#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

#include "cpu/half.h"

static uint32_t bits_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float float_of(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Reference rounding of a finite x to a format with `mant` stored mantissa
 * bits, least normal exponent emin and largest finite value maxv:
 * scale so that one unit in the last place is 1, rint() (ties to even),
 * scale back; overflow to inf when the rounded magnitude exceeds maxv. */
static double ref_round(double x, int mant, int emin, double maxv)
{
    if (x == 0) return x;
    int e;
    frexp(x, &e);                 /* |x| in [2^(e-1), 2^e) */
    int exp = e - 1 < emin ? emin : e - 1;
    double ulp = ldexp(1.0, exp - mant);
    double r = rint(x / ulp) * ulp;
    if (fabs(r) > maxv) return copysign(INFINITY, x);
    if (r == 0) return copysign(0.0, x);
    return r;
}

static double ref_half(float x) { return ref_round(x, 10, -14, 65504.0); }
static double ref_bf16(float x) { return ref_round(x, 7, -126, 3.3895313892515355e38); }

/* A deterministic random float: random sign/exponent/mantissa bits in the
 * exponent range [elo, ehi] (biased f32 exponents). */
static float random_float(uint64_t *s, int elo, int ehi)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t r = (uint32_t)(*s >> 32);
    uint32_t e = (uint32_t)elo + (r >> 8) % (uint32_t)(ehi - elo + 1);
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    uint32_t m = (uint32_t)(*s >> 41);
    return float_of(((r & 1u) << 31) | (e << 23) | (m & 0x7fffffu));
}

Test(half, edge_values_exact)
{
    cr_expect_eq(half_from_f32(65504.0f), 0x7bff);
    cr_expect_eq(half_to_f32(0x7bff), 65504.0f);
    cr_expect_eq(half_from_f32(6.103515625e-05f), 0x0400);
    cr_expect_eq(half_to_f32(0x0400), 6.103515625e-05f);
    cr_expect_eq(half_from_f32(5.960464477539063e-08f), 0x0001);
    cr_expect_eq(half_to_f32(0x0001), 5.960464477539063e-08f);
    cr_expect_eq(half_from_f32(65520.0f), 0x7c00, "65520 must overflow to inf");
    cr_expect_eq(half_from_f32(-65520.0f), 0xfc00);
    cr_expect_eq(half_from_f32(65519.99f), 0x7bff, "65519.99 must round down to 65504");
    cr_expect_eq(half_from_f32(1e30f), 0x7c00);
    cr_expect_eq(half_from_f32(INFINITY), 0x7c00);
    cr_expect_eq(half_from_f32(-INFINITY), 0xfc00);
    cr_expect(isinf(half_to_f32(0x7c00)) && half_to_f32(0x7c00) > 0);
    cr_expect_eq(half_from_f32(-0.0f), 0x8000);
    cr_expect(signbit(half_to_f32(0x8000)) && half_to_f32(0x8000) == 0.0f);
    cr_expect_eq(half_from_f32(0.0f), 0x0000);
    cr_expect_eq(half_from_f32(1.0f), 0x3c00);
    cr_expect_eq(half_from_f32(-2.0f), 0xc000);
    cr_expect_eq(half_to_f32(0x3555), 0.333251953125f);
}

Test(half, ties_to_even)
{
    /* between 1 (mantissa 0, even) and 1 + 2^-10 (odd): down */
    cr_expect_eq(half_from_f32(1.0f + 0x1p-11f), 0x3c00);
    /* between 1 + 2^-10 (odd) and 1 + 2^-9 (even): up */
    cr_expect_eq(half_from_f32(1.0f + 3 * 0x1p-11f), 0x3c02);
    /* just above a tie goes up, just below goes down */
    cr_expect_eq(half_from_f32(nextafterf(1.0f + 0x1p-11f, 2.0f)), 0x3c01);
    cr_expect_eq(half_from_f32(nextafterf(1.0f + 3 * 0x1p-11f, 0.0f)), 0x3c01);
    /* carry out of the mantissa into the exponent: 2 - 2^-11 ties up to 2 */
    cr_expect_eq(half_from_f32(2.0f - 0x1p-11f), 0x4000);
    /* subnormal ties: 2^-25 is half of the least subnormal -> 0 (even) */
    cr_expect_eq(half_from_f32(0x1p-25f), 0x0000);
    cr_expect_eq(half_from_f32(-0x1p-25f), 0x8000);
    cr_expect_eq(half_from_f32(nextafterf(0x1p-25f, 1.0f)), 0x0001);
    cr_expect_eq(half_from_f32(3 * 0x1p-25f), 0x0002);   /* 1.5 ulp -> 2 (even) */
    cr_expect_eq(half_from_f32(5 * 0x1p-25f), 0x0002);   /* 2.5 ulp -> 2 (even) */
    /* the largest subnormal rounds up into the least normal */
    cr_expect_eq(half_from_f32(0x1p-14f - 0x1p-26f), 0x0400);
    cr_expect_eq(half_from_f32(1e-10f), 0x0000);
}

Test(half, nan_stays_nan)
{
    uint32_t nans[] = {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7fbfffffu, 0xff800001u};
    for (size_t i = 0; i < sizeof nans / sizeof nans[0]; i++) {
        uint16_t h = half_from_f32(float_of(nans[i]));
        cr_expect((h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0, "NaN %08x -> %04x", nans[i], h);
        cr_expect(isnan(half_round(float_of(nans[i]))));
        uint16_t b = bf16_from_f32(float_of(nans[i]));
        cr_expect((b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0, "NaN %08x -> bf16 %04x", nans[i], b);
        cr_expect(isnan(bf16_round(float_of(nans[i]))));
    }
    cr_expect(isnan(half_to_f32(0x7e00)) && isnan(half_to_f32(0xfc01)));
}

Test(half, exhaustive_round_trip)
{
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float f = half_to_f32((uint16_t)h);
        bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
        if (is_nan) {
            if (!isnan(f) || !isnan(half_to_f32(half_from_f32(f)))) bad++;
            continue;
        }
        if (half_from_f32(f) != h) bad++;
        /* the float must equal the IEEE value of the pattern */
        int e = (int)((h >> 10) & 0x1f), m = (int)(h & 0x3ff);
        double v = e == 0 ? ldexp(m, -24) : e == 31 ? INFINITY : ldexp(1024 + m, e - 25);
        if ((double)fabsf(f) != v || (signbit(f) != 0) != ((h & 0x8000) != 0)) bad++;
    }
    cr_expect_eq(bad, 0, "%d of 65536 half patterns did not round-trip", bad);
}

Test(bf16, exhaustive_round_trip)
{
    int bad = 0;
    for (uint32_t b = 0; b < 65536; b++) {
        float f = bf16_to_f32((uint16_t)b);
        cr_assert_eq(bits_of(f), b << 16);
        if (isnan(f)) {
            if (!isnan(bf16_round(f))) bad++;
        } else if (bf16_from_f32(f) != b) {
            bad++;
        }
    }
    cr_expect_eq(bad, 0, "%d of 65536 bf16 patterns did not round-trip", bad);
}

Test(half, random_against_rint_reference)
{
    uint64_t s = 12345;
    int bad = 0;
    for (int i = 0; i < 2000000; i++) {
        /* exponents 2^-30 .. 2^17: subnormal, normal and overflow ranges */
        float x = random_float(&s, 97, 144);
        double want = ref_half(x);
        float got = half_round(x);
        if (!((double)got == want && !signbit(got) == !signbit(want))) {
            if (bad++ < 5) cr_log_error("x=%.9g (%08x): got %.9g want %.9g", x, bits_of(x), got, want);
        }
    }
    cr_expect_eq(bad, 0);
}

/* Exact ties are rare among random floats; build them on purpose. */
Test(half, all_ties_in_some_binades)
{
    int bad = 0;
    for (int e = -24; e <= 15; e++)
        for (int m = 0; m < 1024; m++) {
            double ulp = ldexp(1.0, (e < -14 ? -14 : e) - 10);
            double base = e < -14 ? m * ulp : ldexp(1.0, e) + m * ulp;
            float x = (float)(base + ulp / 2);   /* exact in f32 */
            if ((double)half_round(x) != ref_half(x)) bad++;
            if ((double)half_round(-x) != ref_half(-x)) bad++;
        }
    cr_expect_eq(bad, 0);
}

#ifdef __FLT16_MAX__
Test(half, random_against_compiler_float16)
{
    uint64_t s = 99;
    int bad = 0;
    for (int i = 0; i < 2000000; i++) {
        float x = random_float(&s, 97, 144);
        _Float16 h = (_Float16)x;
        uint16_t want;
        memcpy(&want, &h, sizeof want);
        if (half_from_f32(x) != want) bad++;
    }
    cr_expect_eq(bad, 0);
}
#endif

Test(bf16, edge_values_and_ties)
{
    cr_expect_eq(bf16_from_f32(1.0f), 0x3f80);
    cr_expect_eq(bf16_from_f32(1.0f + 0x1p-8f), 0x3f80);          /* tie, down to even */
    cr_expect_eq(bf16_from_f32(1.0f + 3 * 0x1p-8f), 0x3f82);      /* tie, up to even */
    cr_expect_eq(bf16_from_f32(nextafterf(1.0f + 0x1p-8f, 2.0f)), 0x3f81);
    cr_expect_eq(bf16_from_f32(2.0f - 0x1p-9f), 0x4000);          /* carry into the exponent */
    cr_expect_eq(bf16_from_f32(3.3895313892515355e38f), 0x7f7f);  /* largest bf16 */
    cr_expect_eq(bf16_from_f32(3.3961775292304835e38f), 0x7f80);  /* halfway above it: inf */
    cr_expect_eq(bf16_from_f32(3.4028234663852886e38f), 0x7f80);  /* FLT_MAX -> inf */
    cr_expect_eq(bf16_from_f32(-3.4028234663852886e38f), 0xff80);
    cr_expect_eq(bf16_from_f32(INFINITY), 0x7f80);
    cr_expect_eq(bf16_from_f32(-INFINITY), 0xff80);
    cr_expect_eq(bf16_from_f32(-0.0f), 0x8000);
    cr_expect_eq(bf16_from_f32(0x1p-133f), 0x0001);               /* least bf16 subnormal */
    cr_expect_eq(bf16_from_f32(0x1p-134f), 0x0000);               /* its half: tie to 0 */
    cr_expect_eq(bf16_from_f32(3 * 0x1p-134f), 0x0002);
    cr_expect_eq(bf16_to_f32(0x4049), 3.140625f);
}

Test(bf16, random_against_rint_reference)
{
    uint64_t s = 777;
    int bad = 0;
    for (int i = 0; i < 2000000; i++) {
        float x = random_float(&s, 1, 254);
        double want = ref_bf16(x);
        float got = bf16_round(x);
        if (!((double)got == want && !signbit(got) == !signbit(want))) {
            if (bad++ < 5) cr_log_error("x=%.9g (%08x): got %.9g want %.9g", x, bits_of(x), got, want);
        }
    }
    cr_expect_eq(bad, 0);
}

Test(half, arrays_and_dispatch)
{
    float a[5] = {1.0f + 0x1p-11f, 70000.0f, -3e-8f, 0.1f, 1.0f + 0x1p-8f};
    float b[5];
    memcpy(b, a, sizeof a);
    half_round_array(a, 5);
    for (int i = 0; i < 5; i++) cr_expect_eq(bits_of(a[i]), bits_of(half_round(b[i])));
    cr_expect(isinf(a[1]));
    memcpy(a, b, sizeof a);
    bf16_round_array(a, 5);
    for (int i = 0; i < 5; i++) cr_expect_eq(bits_of(a[i]), bits_of(bf16_round(b[i])));
    cr_expect_eq(prec_round(PREC_FP32, 0.1f), 0.1f);
    cr_expect_eq(prec_round(PREC_FP16, 0.1f), half_round(0.1f));
    cr_expect_eq(prec_round(PREC_BF16, 0.1f), bf16_round(0.1f));
    cr_expect_eq(prec_to_f32(PREC_BF16, prec_from_f32(PREC_BF16, 0.1f)), bf16_round(0.1f));
    cr_expect_neq(half_round(0.1f), 0.1f);
}
