/* runtime/cpu/cpu_fast_gemm.h — the fast mode's f32 gemm: packed, cache
 * blocked, an FMA micro-kernel where the CPU has one, and every core
 * (runtime/cpu/cpu_threads.h).
 *
 * The contract of ck_gemm_f32 (runtime/cpu/cpu_kernels.h) with leading
 * dimensions: C = alpha op(A) op(B) + beta C, row-major, op(A) (M, K),
 * op(B) (K, N), C (M, N); A is stored (M, K) with row stride lda, or (K, M)
 * when transA; B (K, N) with stride ldb, or (N, K) when transB; C stride
 * ldc.  beta == 0 overwrites C without reading it.
 *
 * Numerics: NOT bitwise equal to ck_gemm_f32.  Each C element sums its
 * products in k order inside blocks of CPU_FAST_KC k (with fused
 * multiply-adds on AVX2+FMA machines), each block's sum times alpha is
 * added to C in k order.  The error bound is therefore that of a float dot
 * product of CPU_FAST_KC terms plus K / CPU_FAST_KC block additions:
 *   |C - exact| <= (CPU_FAST_KC + K / CPU_FAST_KC + 2) * 2^-24 * sum_k |alpha a_ik b_kj|
 *   (+ the rounding of beta C);
 * ck_gemm_f32's bound is the same with its own block of 256.
 * Every C element is computed by one thread with the same operations
 * whatever the thread count, so results do not depend on it (bitwise).
 *
 * HPC_FAST_GEMM_PORTABLE=1 in the environment forces the portable C
 * micro-kernel (tests compare the two). */
#ifndef HPC_RUNTIME_CPU_FAST_GEMM_H
#define HPC_RUNTIME_CPU_FAST_GEMM_H

#include <stdbool.h>
#include <stdint.h>

#define CPU_FAST_KC 256

void cpu_fast_sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                    float *C, int64_t ldc);

/* `batch` gemms with contiguous matrices (lda, ldb, ldc from the shapes);
 * matrix i uses A + i*strideA, B + i*strideB, C + i*strideC (0 broadcasts
 * A or B).  Spreads the batch over the threads when it is large enough. */
void cpu_fast_sgemm_batched(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                            float alpha, const float *A, int64_t strideA, const float *B,
                            int64_t strideB, float beta, float *C, int64_t strideC, int64_t batch);

/* Which kernel runs: "avx2+fma" or "portable" (see above). */
const char *cpu_fast_gemm_kernel(void);

#endif
