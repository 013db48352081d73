/* runtime/cpu/cpu_fast_gelu.h — the exact (erf) GELU and its derivative for
 * the cpu executor's fast mode, on every core and four values at a time.
 *
 * Promise: the formulas of program/activations.h's act_ref_gelu and
 * act_grad_ref_gelu, in double, in their order of operations, rounded once
 * to float, exactly as ck_act_fwd_f32 / ck_act_bwd_f32 do with them; only
 * erf and exp come from glibc's vector math library (libmvec, glibc >=
 * 2.35: _ZGVdN4v_erf and _ZGVdN4v_exp, AVX2, within 4 double ulps of the
 * correctly rounded value) instead of the scalar libm.  After the rounding
 * to float the result is the reference's bits but for values within a few
 * double ulps of a float rounding boundary: at most 1 float ulp apart
 * (tests/test_cpu_fast_gelu.c: 200003 random values, all bitwise), NaN and
 * inf as the reference.  Groups of four holding an x below -4 (where
 * 1 + erf cancels and a few double ulps of erf would show) or a NaN take
 * the scalar reference, as does the tail of a range.  Where
 * libmvec or AVX2 is missing (or HPC_FAST_GEMM_PORTABLE=1) both run the
 * reference kernels on slices, bitwise.  Results never depend on the
 * thread count (each element is computed by itself). */
#ifndef HPC_RUNTIME_CPU_FAST_GELU_H
#define HPC_RUNTIME_CPU_FAST_GELU_H

#include <stdbool.h>
#include <stdint.h>

/* y = gelu(x) (n elements; y may alias x). */
void fast_gelu_fwd(float *y, const float *x, int64_t n);
/* dx += dy * gelu'(x) (n elements; dx aliases neither input). */
void fast_gelu_bwd(float *dx, const float *dy, const float *x, int64_t n);
/* Whether the vector path runs (libmvec found, AVX2, not forced off). */
bool fast_gelu_vectorised(void);

#endif
