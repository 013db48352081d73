/* runtime/cpu/cpu_fast_gemm.c — the fast mode's threaded f32 gemm; see
 * cpu_fast_gemm.h.
 *
 * The GotoBLAS loop nest: for each j block (NC columns) and k block (KC):
 * pack op(B) into strips of NR columns; for each i block (MC rows): pack
 * op(A) into strips of MR rows; each MR x NR tile of C gets one micro-kernel
 * over the k block (12 vector accumulators), whose sum times alpha is added
 * to C.  The B strip (KC x NR floats, 16 KiB) stays in L1 while the A block
 * (MC x KC, 120 KiB) streams from L2.
 *
 * Threads split the rows of C (or its columns when C is wide and short) in
 * whole tiles; each thread packs its own copies into thread-local buffers,
 * so the threads share nothing but the read-only inputs. */
#include "cpu/cpu_fast_gemm.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_threads.h"
#include "util/error.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FAST_GEMM_X86 1
#else
#define FAST_GEMM_X86 0
#endif

#define MR 6                /* micro-tile rows */
#define NR 16               /* micro-tile columns: two 8-float vectors */
#define KC CPU_FAST_KC      /* k block */
#define MC 120              /* i block, a multiple of MR */
#define NC 512              /* j block, a multiple of NR */

/* ---- packing ---- */

/* bp = op(B)[k0:k0+kc, j0:j0+nc] as strips of NR columns, strip s at
 * bp + s*kc*NR, row k of the strip at + k*NR; columns past nc are zero. */
static void pack_b(float *restrict bp, const float *restrict B, int64_t ldb, bool transB,
                   int64_t k0, int64_t kc, int64_t j0, int64_t nc)
{
    for (int64_t s = 0; s * NR < nc; s++) {
        float *dst = bp + s * kc * NR;
        int64_t w = nc - s * NR < NR ? nc - s * NR : NR, c0 = j0 + s * NR;
        for (int64_t k = 0; k < kc; k++, dst += NR) {
            int64_t j = 0;
            if (transB)
                for (; j < w; j++) dst[j] = B[(c0 + j) * ldb + k0 + k];
            else
                for (; j < w; j++) dst[j] = B[(k0 + k) * ldb + c0 + j];
            for (; j < NR; j++) dst[j] = 0;
        }
    }
}

/* ap = op(A)[i0:i0+mc, k0:k0+kc] as strips of MR rows, strip s at
 * ap + s*kc*MR, k-major inside; rows past mc are zero. */
static void pack_a(float *restrict ap, const float *restrict A, int64_t lda, bool transA,
                   int64_t i0, int64_t mc, int64_t k0, int64_t kc)
{
    for (int64_t s = 0; s * MR < mc; s++) {
        float *dst = ap + s * kc * MR;
        int64_t h = mc - s * MR < MR ? mc - s * MR : MR, r0 = i0 + s * MR;
        for (int64_t k = 0; k < kc; k++, dst += MR) {
            int64_t i = 0;
            if (transA)
                for (; i < h; i++) dst[i] = A[(k0 + k) * lda + r0 + i];
            else
                for (; i < h; i++) dst[i] = A[(r0 + i) * lda + k0 + k];
            for (; i < MR; i++) dst[i] = 0;
        }
    }
}

/* ---- micro-kernels: C[0:h, 0:w] += alpha * a (kc, MR)^T @ b (kc, NR) ----
 * Both kernels add a tile's sum to C as c + alpha * sum (a rounded product,
 * then a rounded add), so full and partial tiles round alike. */

/* The partial-tile (or portable) update from a finished accumulator tile. */
static void tile_add(float *C, int64_t ldc, float alpha, const float acc[MR][NR], int h, int w)
{
    for (int i = 0; i < h; i++)
        for (int j = 0; j < w; j++) C[i * ldc + j] += alpha * acc[i][j];
}

/* Four floats (GCC vector extension): SSE2 or NEON registers, no flags. */
typedef float v4f __attribute__((vector_size(16)));

static void micro_portable(int64_t kc, const float *restrict a, const float *restrict b, float *C,
                           int64_t ldc, float alpha, int h, int w)
{
    v4f acc[MR][NR / 4];
    memset(acc, 0, sizeof acc);
    for (int64_t k = 0; k < kc; k++, a += MR, b += NR) {
        v4f bv[NR / 4];
        memcpy(bv, b, sizeof bv);
        for (int i = 0; i < MR; i++)
            for (int v = 0; v < NR / 4; v++) acc[i][v] += a[i] * bv[v];
    }
    float out[MR][NR];
    memcpy(out, acc, sizeof out);
    tile_add(C, ldc, alpha, out, h, w);
}

#if FAST_GEMM_X86
__attribute__((target("avx2,fma")))
static void micro_avx2(int64_t kc, const float *restrict a, const float *restrict b, float *C,
                       int64_t ldc, float alpha, int h, int w)
{
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00;
    __m256 c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    for (int64_t k = 0; k < kc; k++, a += MR, b += NR) {
        __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8), x;
        x = _mm256_broadcast_ss(a + 0);
        c00 = _mm256_fmadd_ps(x, b0, c00);
        c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(a + 1);
        c10 = _mm256_fmadd_ps(x, b0, c10);
        c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(a + 2);
        c20 = _mm256_fmadd_ps(x, b0, c20);
        c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(a + 3);
        c30 = _mm256_fmadd_ps(x, b0, c30);
        c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_broadcast_ss(a + 4);
        c40 = _mm256_fmadd_ps(x, b0, c40);
        c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_broadcast_ss(a + 5);
        c50 = _mm256_fmadd_ps(x, b0, c50);
        c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    __m256 rows[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
    if (h == MR && w == NR) {
        __m256 va = _mm256_set1_ps(alpha);
        for (int i = 0; i < MR; i++)
            for (int v = 0; v < 2; v++) {
                float *c = C + i * ldc + 8 * v;
                _mm256_storeu_ps(c, _mm256_add_ps(_mm256_loadu_ps(c), _mm256_mul_ps(va, rows[i][v])));
            }
        return;
    }
    float acc[MR][NR];
    for (int i = 0; i < MR; i++) {
        _mm256_storeu_ps(acc[i], rows[i][0]);
        _mm256_storeu_ps(acc[i] + 8, rows[i][1]);
    }
    tile_add(C, ldc, alpha, acc, h, w);
}
#endif

typedef void (*MicroFn)(int64_t kc, const float *a, const float *b, float *C, int64_t ldc,
                        float alpha, int h, int w);

static MicroFn pick_micro(void)
{
    const char *force = getenv("HPC_FAST_GEMM_PORTABLE");
    if (force && force[0] == '1') return micro_portable;
#if FAST_GEMM_X86
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return micro_avx2;
#endif
    return micro_portable;
}

const char *cpu_fast_gemm_kernel(void)
{
    return pick_micro() == micro_portable ? "portable" : "avx2+fma";
}

/* ---- one thread's gemm ---- */

/* Pack buffers, one pair per thread, kept for the thread's life. */
static _Thread_local float *tl_ap, *tl_bp;

static void pack_buffers(float **ap, float **bp)
{
    if (!tl_ap) {
        tl_ap = aligned_alloc(64, (size_t)MC * KC * sizeof(float));
        tl_bp = aligned_alloc(64, (size_t)KC * NC * sizeof(float));
        if (!tl_ap || !tl_bp)
            hpc_panic(__FILE__, __LINE__, "cpu_fast_gemm: out of memory for 0.6 MiB of pack buffers");
    }
    *ap = tl_ap;
    *bp = tl_bp;
}

/* C[i0:i0+mc, j0:j0+nc] += alpha * packed A block @ packed B block. */
static void gemm_block(MicroFn micro, float *C, int64_t ldc, const float *ap, const float *bp,
                       float alpha, int64_t i0, int64_t mc, int64_t j0, int64_t nc, int64_t kc)
{
    for (int64_t s = 0; s * NR < nc; s++)
        for (int64_t r = 0; r * MR < mc; r++) {
            int h = mc - r * MR < MR ? (int)(mc - r * MR) : MR;
            int w = nc - s * NR < NR ? (int)(nc - s * NR) : NR;
            micro(kc, ap + r * kc * MR, bp + s * kc * NR, C + (i0 + r * MR) * ldc + j0 + s * NR, ldc,
                  alpha, h, w);
        }
}

static void gemm_serial(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                        const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                        float *C, int64_t ldc)
{
    for (int64_t i = 0; i < M; i++) {
        float *c = C + i * ldc;
        if (beta == 0) memset(c, 0, (size_t)N * sizeof *c);
        else if (beta != 1)
            for (int64_t j = 0; j < N; j++) c[j] *= beta;
    }
    if (alpha == 0 || M == 0 || N == 0 || K == 0) return;
    MicroFn micro = pick_micro();
    float *ap, *bp;
    pack_buffers(&ap, &bp);
    for (int64_t j0 = 0; j0 < N; j0 += NC) {
        int64_t nc = N - j0 < NC ? N - j0 : NC;
        for (int64_t k0 = 0; k0 < K; k0 += KC) {
            int64_t kc = K - k0 < KC ? K - k0 : KC;
            pack_b(bp, B, ldb, transB, k0, kc, j0, nc);
            for (int64_t i0 = 0; i0 < M; i0 += MC) {
                int64_t mc = M - i0 < MC ? M - i0 : MC;
                pack_a(ap, A, lda, transA, i0, mc, k0, kc);
                gemm_block(micro, C, ldc, ap, bp, alpha, i0, mc, j0, nc, kc);
            }
        }
    }
}

/* ---- threads ---- */

typedef struct {
    bool transA, transB, by_rows;
    int64_t M, N, K, lda, ldb, ldc;
    float alpha, beta;
    const float *A, *B;
    float *C;
} GemmJob;

/* Tiles [begin, end) of rows (by_rows) or columns of C. */
static void gemm_range(void *ctx, int64_t begin, int64_t end)
{
    const GemmJob *j = ctx;
    if (j->by_rows) {
        int64_t r0 = begin * MR, r1 = end * MR < j->M ? end * MR : j->M;
        const float *A = j->transA ? j->A + r0 : j->A + r0 * j->lda;
        gemm_serial(j->transA, j->transB, r1 - r0, j->N, j->K, j->alpha, A, j->lda, j->B, j->ldb,
                    j->beta, j->C + r0 * j->ldc, j->ldc);
    } else {
        int64_t c0 = begin * NR, c1 = end * NR < j->N ? end * NR : j->N;
        const float *B = j->transB ? j->B + c0 * j->ldb : j->B + c0;
        gemm_serial(j->transA, j->transB, j->M, c1 - c0, j->K, j->alpha, j->A, j->lda, B, j->ldb,
                    j->beta, j->C + c0, j->ldc);
    }
}

/* Rows [begin, end) of C through the reference gemm (contiguous operands). */
static void reference_rows(void *ctx, int64_t begin, int64_t end)
{
    const GemmJob *j = ctx;
    ck_gemm_f32(false, j->transB, end - begin, j->N, j->K, j->alpha, j->A + begin * j->K, j->B,
                j->beta, j->C + begin * j->N);
}

void cpu_fast_sgemm(bool transA, bool transB, int64_t M, int64_t N, int64_t K, float alpha,
                    const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                    float *C, int64_t ldc)
{
    HPC_ASSERT(M >= 0 && N >= 0 && K >= 0);
    bool contiguous = lda == (transA ? M : K) && ldb == (transB ? K : N) && ldc == N;
    if (pick_micro() == micro_portable && contiguous) {
        /* No FMA unit: the reference gemm (its SSE2/AVX2 kernel beats the
         * portable one), on every core where rows of A are contiguous. */
        GemmJob r = {.transB = transB, .M = M, .N = N, .K = K, .alpha = alpha, .beta = beta,
                     .A = A, .B = B, .C = C};
        if (transA) ck_gemm_f32(true, transB, M, N, K, alpha, A, B, beta, C);
        else cpu_parallel_for(M, 16, reference_rows, &r);
        return;
    }
    GemmJob j = {.transA = transA, .transB = transB, .by_rows = M >= N, .M = M, .N = N, .K = K,
                 .lda = lda, .ldb = ldb, .ldc = ldc, .alpha = alpha, .beta = beta,
                 .A = A, .B = B, .C = C};
    /* Small products are not worth waking the workers: below about 2^18
     * multiply-adds per thread the hand-off costs more than it saves. */
    if (M * N * (K > 0 ? K : 1) < ((int64_t)1 << 19)) {
        gemm_serial(transA, transB, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
        return;
    }
    int64_t tiles = j.by_rows ? (M + MR - 1) / MR : (N + NR - 1) / NR;
    cpu_parallel_for(tiles, 2, gemm_range, &j);
}

typedef struct {
    bool transA, transB;
    int64_t M, N, K, strideA, strideB, strideC;
    float alpha, beta;
    const float *A, *B;
    float *C;
} BatchJob;

static void batch_range(void *ctx, int64_t begin, int64_t end)
{
    const BatchJob *j = ctx;
    int64_t lda = j->transA ? j->M : j->K, ldb = j->transB ? j->K : j->N;
    for (int64_t b = begin; b < end; b++)
        gemm_serial(j->transA, j->transB, j->M, j->N, j->K, j->alpha, j->A + b * j->strideA, lda,
                    j->B + b * j->strideB, ldb, j->beta, j->C + b * j->strideC, j->N);
}

void cpu_fast_sgemm_batched(bool transA, bool transB, int64_t M, int64_t N, int64_t K,
                            float alpha, const float *A, int64_t strideA, const float *B,
                            int64_t strideB, float beta, float *C, int64_t strideC, int64_t batch)
{
    HPC_ASSERT(M >= 0 && N >= 0 && K >= 0 && batch >= 0);
    BatchJob j = {.transA = transA, .transB = transB, .M = M, .N = N, .K = K, .strideA = strideA,
                  .strideB = strideB, .strideC = strideC, .alpha = alpha, .beta = beta,
                  .A = A, .B = B, .C = C};
    if (batch >= 2 * cpu_threads_count()) {
        cpu_parallel_for(batch, 1, batch_range, &j);
        return;
    }
    int64_t lda = transA ? M : K, ldb = transB ? K : N;
    for (int64_t b = 0; b < batch; b++)
        cpu_fast_sgemm(transA, transB, M, N, K, alpha, A + b * strideA, lda, B + b * strideB, ldb,
                       beta, C + b * strideC, N);
}
