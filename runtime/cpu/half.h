/* runtime/cpu/half.h — exact fp16 and bf16 conversion on the CPU.
 *
 * The cpu backend stores every value the precision plan puts in low
 * precision as an f32 that has been rounded to fp16 or bf16, so that its
 * results match a GPU that really stores 16 bits.  All conversions are
 * exact IEEE 754 round-to-nearest-even (the rounding of CUDA's
 * __float2half_rn / __float2bfloat16_rn):
 *   fp16 (binary16: 1 sign, 5 exponent, 10 mantissa bits): values whose
 *     magnitude rounds above 65504 become +-inf (65520 is the first such
 *     value), values under 2^-14 become subnormals (exact multiples of 2^-24,
 *     ties to even), -0 stays -0, NaN stays a (quiet) NaN, inf stays inf.
 *   bf16 (1 sign, 8 exponent, 7 mantissa bits: the top half of an f32):
 *     ties to even; overflow above the largest bf16 goes to inf; f32
 *     subnormals round like any other value; NaN stays a (quiet) NaN.
 * Functions are pure and thread-safe; nothing is allocated.
 *
 * Usage:
 *   uint16_t h = half_from_f32(x);      // store
 *   float y = half_to_f32(h);           // load
 *   half_round_array(act, n);           // emulate an fp16 store in place
 */
#ifndef HPC_RUNTIME_HALF_H
#define HPC_RUNTIME_HALF_H

#include <stdint.h>

#include "util/dtype.h"

uint16_t half_from_f32(float x);  /* IEEE binary16, round-to-nearest-even, overflow -> inf, subnormals exact, NaN stays NaN */
float    half_to_f32(uint16_t h);
uint16_t bf16_from_f32(float x);  /* round-to-nearest-even, NaN stays NaN */
float    bf16_to_f32(uint16_t b);
float    half_round(float x);     /* == half_to_f32(half_from_f32(x)) */
float    bf16_round(float x);
void     half_round_array(float *x, int64_t n);   /* x: (n) f32, rounded in place */
void     bf16_round_array(float *x, int64_t n);

/* Dispatch on a storage precision: PREC_FP16 -> fp16, PREC_BF16 -> bf16;
 * prec_round/prec_round_array leave the value unchanged for PREC_FP32 and
 * PREC_DEFAULT.  prec_from_f32/prec_to_f32 accept only the two 16-bit
 * formats (anything else is a bug: HPC_ASSERT). */
float    prec_round(SpecPrecision p, float x);
void     prec_round_array(SpecPrecision p, float *x, int64_t n);
uint16_t prec_from_f32(SpecPrecision p, float x);  /* p must be PREC_FP16 or PREC_BF16 */
float    prec_to_f32(SpecPrecision p, uint16_t bits);

#endif
