/* runtime/cpu/half.c — exact fp16/bf16 rounding by bit manipulation (no
 * hardware half type, so it works with any C11 compiler). */
#include "cpu/half.h"

#include <string.h>

#include "util/error.h"

static uint32_t f32_bits(float x)
{
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    return u;
}

static float f32_from_bits(uint32_t u)
{
    float x;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* |x| < 2^-14 (the smallest normal half): round to a multiple of 2^-24. */
static uint16_t half_subnormal(uint32_t a)
{
    if (a <= 0x33000000u) return 0;   /* <= 2^-25: half of the least subnormal ties to 0 (even) */
    uint32_t e = a >> 23;                           /* biased f32 exponent, 102..112 */
    uint32_t m = (a & 0x7fffffu) | 0x800000u;       /* value = m * 2^(e - 150) */
    uint32_t shift = 126 - e;                       /* value / 2^-24 = m >> shift, 14..24 */
    uint32_t q = m >> shift, rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
    if (rem > halfway || (rem == halfway && (q & 1))) q++;  /* q == 0x400 is the least normal: right */
    return (uint16_t)q;
}

uint16_t half_from_f32(float x)
{
    uint32_t f = f32_bits(x);
    uint16_t sign = (uint16_t)((f >> 16) & 0x8000u);
    uint32_t a = f & 0x7fffffffu;
    if (a > 0x7f800000u)                      /* NaN: keep the top payload bits, force quiet */
        return (uint16_t)(sign | 0x7e00u | ((a >> 13) & 0x3ffu));
    if (a >= 0x477ff000u) return sign | 0x7c00u;  /* >= 65520 (halfway above 65504) and inf */
    if (a < 0x38800000u) return sign | half_subnormal(a);
    /* Normal: rebias the exponent (127 -> 15), round 23 -> 10 mantissa bits
     * to nearest even; a carry correctly moves into the exponent. */
    uint32_t r = a - (112u << 23);
    r += 0xfffu + ((r >> 13) & 1u);
    return (uint16_t)(sign | (r >> 13));
}

float half_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
    if (e == 0x1f) return f32_from_bits(sign | 0x7f800000u | (m << 13));
    if (e == 0) {
        float mag = (float)m * 5.9604644775390625e-08f;  /* m * 2^-24, exact */
        return sign ? -mag : mag;
    }
    return f32_from_bits(sign | ((e + 112u) << 23) | (m << 13));
}

uint16_t bf16_from_f32(float x)
{
    uint32_t f = f32_bits(x);
    if ((f & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((f >> 16) | 0x40u); /* quiet NaN */
    f += 0x7fffu + ((f >> 16) & 1u);   /* ties to even; overflow carries into inf */
    return (uint16_t)(f >> 16);
}

float bf16_to_f32(uint16_t b)
{
    return f32_from_bits((uint32_t)b << 16);
}

float half_round(float x)
{
    return half_to_f32(half_from_f32(x));
}

float bf16_round(float x)
{
    return bf16_to_f32(bf16_from_f32(x));
}

void half_round_array(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] = half_round(x[i]);
}

void bf16_round_array(float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++) x[i] = bf16_round(x[i]);
}

float prec_round(SpecPrecision p, float x)
{
    switch (p) {
    case PREC_FP16: return half_round(x);
    case PREC_BF16: return bf16_round(x);
    case PREC_FP32:
    case PREC_DEFAULT: return x;
    }
    return x;
}

void prec_round_array(SpecPrecision p, float *x, int64_t n)
{
    if (p == PREC_FP16) half_round_array(x, n);
    else if (p == PREC_BF16) bf16_round_array(x, n);
}

uint16_t prec_from_f32(SpecPrecision p, float x)
{
    HPC_ASSERT(p == PREC_FP16 || p == PREC_BF16);
    return p == PREC_FP16 ? half_from_f32(x) : bf16_from_f32(x);
}

float prec_to_f32(SpecPrecision p, uint16_t bits)
{
    HPC_ASSERT(p == PREC_FP16 || p == PREC_BF16);
    return p == PREC_FP16 ? half_to_f32(bits) : bf16_to_f32(bits);
}
