/* runtime/cpu/cpu_kernels_gemm.c — C = alpha op(A) op(B) + beta C on the CPU
 * (contract in cpu_kernels.h).
 *
 * No BLAS.  The classic packed, blocked loop nest (cpu_kernels_gemm.inc):
 *   for each j block (CK_NC) and k block (CK_KC): pack op(B) into strips of
 *   CK_NR columns; for each i block (CK_MC): pack op(A) into strips of CK_MR
 *   rows; every CK_MR x CK_NR tile of C gets one register-blocked micro
 *   kernel over the k block, whose sum (times alpha) is added to C.
 * Packing handles both transposes, so all four cases run the same kernel.
 *
 * Each C element sums its products in k order within a k block, whatever
 * the vector width, and ISO C mode (-std=c11) never contracts a*b+c into
 * an FMA: the SSE2 and AVX2 paths give bit-identical results.  The AVX2 copy
 * is compiled with a target pragma and picked at run time, so the build
 * needs no -march flag; HPC_GEMM_BASELINE=1 in the environment forces the
 * portable path (tests compare the two). */
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_kernels_tmpl.h"

/* The micro-tile is CK_MR rows by two vectors of CK_VBYTES bytes: eight
 * vector accumulators, which fit the 16 registers of SSE2, AVX2 or NEON
 * with room for the B row and the A broadcast. */
#define CK_VLEN ((int)(CK_VBYTES / sizeof(REAL)))   /* elements per vector */
#define CK_MR 4                                      /* micro-tile rows */
#define CK_NR (2 * CK_VLEN)                          /* micro-tile columns */
#define CK_MC 128   /* i block: packed A is CK_MC x CK_KC (L2) */
#define CK_KC 256   /* k block */
#define CK_NC 512   /* j block: packed B is CK_KC x CK_NC; a multiple of every CK_NR */

/* gemm_packed_f32_v16 while REAL is float and CK_VBYTES is 16. */
#define CK_G(name) CK_CAT(CK_CAT(CK_CAT(name, CK_SFX), _v), CK_VBYTES)

#define CK_VBYTES 16
#define REAL float
#define CK_SFX _f32
#include "cpu/cpu_kernels_gemm.inc"
#undef REAL
#undef CK_SFX
#define REAL double
#define CK_SFX _f64
#include "cpu/cpu_kernels_gemm.inc"
#undef REAL
#undef CK_SFX
#undef CK_VBYTES

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CK_GEMM_AVX2 1
#pragma GCC push_options
#pragma GCC target("avx2")
#define CK_VBYTES 32
#define REAL float
#define CK_SFX _f32
#include "cpu/cpu_kernels_gemm.inc"
#undef REAL
#undef CK_SFX
#define REAL double
#define CK_SFX _f64
#include "cpu/cpu_kernels_gemm.inc"
#undef REAL
#undef CK_SFX
#undef CK_VBYTES
#pragma GCC pop_options
#else
#define CK_GEMM_AVX2 0
#endif

/* Whether this call may take the AVX2 path. */
static bool ck_gemm_use_avx2(void)
{
#if CK_GEMM_AVX2
    const char *force = getenv("HPC_GEMM_BASELINE");
    return __builtin_cpu_supports("avx2") && !(force && force[0] == '1');
#else
    return false;
#endif
}

void ck_gemm_batched_f32(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                         float alpha, const float *A, int64_t strideA,
                         const float *B, int64_t strideB, float beta,
                         float *C, int64_t strideC, int64_t batch)
{
    HPC_ASSERT(M >= 0 && N >= 0 && K >= 0 && batch >= 0);
    bool avx2 = ck_gemm_use_avx2();
    float *ap = xmalloc((size_t)CK_MC * CK_KC * sizeof *ap);
    float *bp = xmalloc((size_t)CK_KC * CK_NC * sizeof *bp);
    for (int64_t b = 0; b < batch; b++) {
        const float *Ab = A + b * strideA, *Bb = B + b * strideB;
        float *Cb = C + b * strideC;
#if CK_GEMM_AVX2
        if (avx2) {
            gemm_packed_f32_v32(ap, bp, transA, transB, M, N, K, alpha, Ab, Bb, beta, Cb);
            continue;
        }
#endif
        gemm_packed_f32_v16(ap, bp, transA, transB, M, N, K, alpha, Ab, Bb, beta, Cb);
    }
    free(ap);
    free(bp);
    (void)avx2;
}

void ck_gemm_batched_f64(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                         double alpha, const double *A, int64_t strideA,
                         const double *B, int64_t strideB, double beta,
                         double *C, int64_t strideC, int64_t batch)
{
    HPC_ASSERT(M >= 0 && N >= 0 && K >= 0 && batch >= 0);
    bool avx2 = ck_gemm_use_avx2();
    double *ap = xmalloc((size_t)CK_MC * CK_KC * sizeof *ap);
    double *bp = xmalloc((size_t)CK_KC * CK_NC * sizeof *bp);
    for (int64_t b = 0; b < batch; b++) {
        const double *Ab = A + b * strideA, *Bb = B + b * strideB;
        double *Cb = C + b * strideC;
#if CK_GEMM_AVX2
        if (avx2) {
            gemm_packed_f64_v32(ap, bp, transA, transB, M, N, K, alpha, Ab, Bb, beta, Cb);
            continue;
        }
#endif
        gemm_packed_f64_v16(ap, bp, transA, transB, M, N, K, alpha, Ab, Bb, beta, Cb);
    }
    free(ap);
    free(bp);
    (void)avx2;
}

void ck_gemm_f32(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                 float alpha, const float *A, const float *B, float beta, float *C)
{
    ck_gemm_batched_f32(transA, transB, M, N, K, alpha, A, 0, B, 0, beta, C, 0, 1);
}

void ck_gemm_f64(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                 double alpha, const double *A, const double *B, double beta, double *C)
{
    ck_gemm_batched_f64(transA, transB, M, N, K, alpha, A, 0, B, 0, beta, C, 0, 1);
}
