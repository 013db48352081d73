/* runtime/cpu/cpu_fast_kernels.c — the f32 reference kernels on every core;
 * see cpu_fast_kernels.h.  Each function packs its arguments into a job
 * and hands one range function to cpu_parallel_for.  Dropout draws its
 * Philox words eight at a time with AVX2 where the CPU has it (the same
 * words as philox.c). */
#include "cpu/cpu_fast_kernels.h"

#include <string.h>

#include "cpu/cpu_kernels.h"
#include "cpu/cpu_threads.h"
#include "cpu/half.h"
#include "cpu/philox.h"

/* Elements (or row elements) one range should get at least: below this the
 * hand-off to a worker costs about as much as the work. */
#define GRAIN 16384
#define COL_CHUNK 256  /* columns summed together (as cpu_kernels_norm.c) */

static int64_t rows_grain(int64_t D) { return D >= GRAIN ? 1 : GRAIN / (D > 0 ? D : 1); }

/* ---- elementwise ---- */

typedef struct {
    CkUnaryFn un;
    CkBinaryFn bin;
    float *y;
    const float *a, *b;
    float alpha;
    bool bf16;
    float p;
    uint64_t seed;
    uint32_t step, salt;
} ElemJob;

static void unary_range(void *ctx, int64_t s, int64_t e)
{
    const ElemJob *j = ctx;
    j->un(j->y + s, j->a + s, e - s);
}

void fast_unary(CkUnaryFn fn, float *y, const float *x, int64_t n)
{
    ElemJob j = {.un = fn, .y = y, .a = x};
    cpu_parallel_for(n, GRAIN, unary_range, &j);
}

static void binary_range(void *ctx, int64_t s, int64_t e)
{
    const ElemJob *j = ctx;
    j->bin(j->y + s, j->a + s, j->b + s, e - s);
}

void fast_binary(CkBinaryFn fn, float *y, const float *a, const float *b, int64_t n)
{
    ElemJob j = {.bin = fn, .y = y, .a = a, .b = b};
    cpu_parallel_for(n, GRAIN, binary_range, &j);
}

static void add_range(void *ctx, int64_t s, int64_t e)
{
    const ElemJob *j = ctx;
    for (int64_t i = s; i < e; i++) j->y[i] = j->a[i] + j->b[i];
}

void fast_add_f32(float *y, const float *a, const float *b, int64_t n)
{
    ElemJob j = {.y = y, .a = a, .b = b};
    cpu_parallel_for(n, GRAIN, add_range, &j);
}

static void axpy_range(void *ctx, int64_t s, int64_t e)
{
    const ElemJob *j = ctx;
    ck_axpy_f32(j->y + s, j->alpha, j->a + s, e - s);
}

void fast_axpy(float *y, float alpha, const float *x, int64_t n)
{
    ElemJob j = {.y = y, .a = x, .alpha = alpha};
    cpu_parallel_for(n, GRAIN, axpy_range, &j);
}

static void round_range(void *ctx, int64_t s, int64_t e)
{
    const ElemJob *j = ctx;
    if (j->bf16) bf16_round_array(j->y + s, e - s);
    else half_round_array(j->y + s, e - s);
}

void fast_round(float *x, int64_t n, bool bf16)
{
    ElemJob j = {.y = x, .bf16 = bf16};
    cpu_parallel_for(n, GRAIN, round_range, &j);
}

static void zero_range(void *ctx, int64_t s, int64_t e)
{
    const ElemJob *j = ctx;
    memset(j->y + s, 0, (size_t)(e - s) * sizeof(float));
}

void fast_zero(float *x, int64_t n)
{
    ElemJob j = {.y = x};
    cpu_parallel_for(n, 4 * GRAIN, zero_range, &j);
}

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define FAST_PHILOX_AVX2 1

/* The 32-bit halves of a * m for eight lanes: *hi the high words, return the low. */
__attribute__((target("avx2")))
static __m256i mul_hilo(__m256i a, __m256i m, __m256i *hi)
{
    __m256i even = _mm256_mul_epu32(a, m);                       /* lanes 0, 2, 4, 6 as 64 bits */
    __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), m); /* lanes 1, 3, 5, 7 */
    *hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
    return _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

/* Elements [s, e) of the dropout with eight Philox-4x32-10 draws at a time:
 * the rounds of runtime/cpu/philox.c on vectors, the same words, the same
 * keep test ((x0 >> 8) * 2^-24 >= p, exact in float) and the same x * scale. */
__attribute__((target("avx2")))
static int64_t dropout_avx2(const ElemJob *j, int64_t s, int64_t e, float scale)
{
    const __m256i m0 = _mm256_set1_epi32((int)0xD2511F53u), m1 = _mm256_set1_epi32((int)0xCD9E8D57u);
    const __m256 p = _mm256_set1_ps(j->p), vscale = _mm256_set1_ps(scale);
    const __m256 inv24 = _mm256_set1_ps(1.0f / 16777216.0f);
    int64_t i = s;
    for (; i + 8 <= e; i += 8) {
        uint32_t lo[8], hi[8];
        for (int l = 0; l < 8; l++) {
            lo[l] = (uint32_t)(i + l);
            hi[l] = (uint32_t)((uint64_t)(i + l) >> 32);
        }
        __m256i x0 = _mm256_loadu_si256((const __m256i *)lo), x1 = _mm256_loadu_si256((const __m256i *)hi);
        __m256i x2 = _mm256_set1_epi32((int)j->step), x3 = _mm256_set1_epi32((int)j->salt);
        uint32_t k0 = (uint32_t)j->seed, k1 = (uint32_t)(j->seed >> 32);
        for (int r = 0; r < 10; r++) {
            if (r > 0) {
                k0 += 0x9E3779B9u;
                k1 += 0xBB67AE85u;
            }
            __m256i h0, h1, l0 = mul_hilo(x0, m0, &h0), l1 = mul_hilo(x2, m1, &h1);
            __m256i n0 = _mm256_xor_si256(_mm256_xor_si256(h1, x1), _mm256_set1_epi32((int)k0));
            __m256i n2 = _mm256_xor_si256(_mm256_xor_si256(h0, x3), _mm256_set1_epi32((int)k1));
            x0 = n0, x1 = l1, x2 = n2, x3 = l0;
        }
        __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(x0, 8)), inv24);
        __m256 keep = _mm256_cmp_ps(u, p, _CMP_GE_OQ);
        __m256 y = _mm256_mul_ps(_mm256_loadu_ps(j->a + i), vscale);
        _mm256_storeu_ps(j->y + i, _mm256_and_ps(y, keep));
    }
    return i;
}
#else
#define FAST_PHILOX_AVX2 0
#endif

/* ck_dropout_fwd_f32's formula with i the global index (the Philox counter). */
static void dropout_range(void *ctx, int64_t s, int64_t e)
{
    const ElemJob *j = ctx;
    float scale = (float)(1.0 / (1.0 - (double)j->p));
    int64_t i = s;
#if FAST_PHILOX_AVX2
    if (__builtin_cpu_supports("avx2")) i = dropout_avx2(j, s, e, scale);
#endif
    for (; i < e; i++)
        j->y[i] = philox_dropout_keep(j->seed, (uint64_t)i, j->step, j->salt, j->p) ? j->a[i] * scale : 0;
}

void fast_dropout_fwd(float *y, const float *x, int64_t n, float p, uint64_t seed, uint32_t step,
                      uint32_t salt)
{
    HPC_ASSERT(p >= 0.0f && p < 1.0f);
    if (p == 0.0f) {
        if (y != x) memmove(y, x, (size_t)n * sizeof *y);
        return;
    }
    ElemJob j = {.y = y, .a = x, .p = p, .seed = seed, .step = step, .salt = salt};
    cpu_parallel_for(n, GRAIN / 8, dropout_range, &j);
}

/* ---- rows ---- */

typedef struct {
    float *y, *mean, *rstd, *dgamma, *dbeta;
    const float *x, *dy, *gamma, *beta, *cmean, *crstd;
    const int32_t *mask;
    int64_t N, D, NH, Lq, Lk, L;
    double eps, scale;
    bool causal;
} RowJob;

static void bias_add_range(void *ctx, int64_t s, int64_t e)
{
    const RowJob *j = ctx;
    ck_bias_add_f32(j->y + s * j->D, j->beta, e - s, j->D);
}

void fast_bias_add(float *y, const float *b, int64_t N, int64_t D)
{
    RowJob j = {.y = y, .beta = b, .D = D};
    cpu_parallel_for(N, rows_grain(D), bias_add_range, &j);
}

static void ln_fwd_range(void *ctx, int64_t s, int64_t e)
{
    const RowJob *j = ctx;
    ck_layernorm_fwd_f32(j->y + s * j->D, j->mean + s, j->rstd + s, j->x + s * j->D, j->gamma,
                         j->beta, e - s, j->D, j->eps);
}

void fast_layernorm_fwd(float *y, float *mean, float *rstd, const float *x, const float *gamma,
                        const float *beta, int64_t N, int64_t D, double eps)
{
    RowJob j = {.y = y, .mean = mean, .rstd = rstd, .x = x, .gamma = gamma, .beta = beta,
                .D = D, .eps = eps};
    cpu_parallel_for(N, rows_grain(D), ln_fwd_range, &j);
}

static void ln_dx_range(void *ctx, int64_t s, int64_t e)
{
    const RowJob *j = ctx;
    int64_t o = s * j->D;
    ck_layernorm_bwd_f32(j->y + o, NULL, NULL, j->dy + o, j->x + o, j->cmean + s, j->crstd + s,
                         j->gamma, e - s, j->D);
}

/* Columns [s, e) of dgamma += sum_i dy * xhat and dbeta += sum_i dy, the
 * reference's sums (double, rows in order) column by column. */
static void ln_param_range(void *ctx, int64_t s, int64_t e)
{
    const RowJob *j = ctx;
    double ag[COL_CHUNK], ab[COL_CHUNK];
    for (int64_t d0 = s; d0 < e; d0 += COL_CHUNK) {
        int64_t w = e - d0 < COL_CHUNK ? e - d0 : COL_CHUNK;
        memset(ag, 0, sizeof ag);
        memset(ab, 0, sizeof ab);
        for (int64_t i = 0; i < j->N; i++) {
            const float *dyr = j->dy + i * j->D + d0, *xr = j->x + i * j->D + d0;
            double mu = j->cmean[i], rs = j->crstd[i];
            for (int64_t d = 0; d < w; d++) {
                ag[d] += (double)dyr[d] * ((xr[d] - mu) * rs);
                ab[d] += dyr[d];
            }
        }
        for (int64_t d = 0; d < w; d++) {
            if (j->dgamma) j->dgamma[d0 + d] += (float)ag[d];
            if (j->dbeta) j->dbeta[d0 + d] += (float)ab[d];
        }
    }
}

void fast_layernorm_bwd(float *dx, float *dgamma, float *dbeta, const float *dy, const float *x,
                        const float *mean, const float *rstd, const float *gamma, int64_t N,
                        int64_t D)
{
    RowJob j = {.y = dx, .dgamma = dgamma, .dbeta = dbeta, .dy = dy, .x = x, .cmean = mean,
                .crstd = rstd, .gamma = gamma, .N = N, .D = D};
    if (dx) cpu_parallel_for(N, rows_grain(D), ln_dx_range, &j);
    /* Split columns only when each range still gets a few chunks' work. */
    if (dgamma || dbeta) cpu_parallel_for(D, N * D >= GRAIN ? 32 : D, ln_param_range, &j);
}

static void bias_grad_range(void *ctx, int64_t s, int64_t e)
{
    const RowJob *j = ctx;
    double acc[COL_CHUNK];
    for (int64_t d0 = s; d0 < e; d0 += COL_CHUNK) {
        int64_t w = e - d0 < COL_CHUNK ? e - d0 : COL_CHUNK;
        memset(acc, 0, sizeof acc);
        for (int64_t i = 0; i < j->N; i++)
            for (int64_t d = 0; d < w; d++) acc[d] += j->dy[i * j->D + d0 + d];
        for (int64_t d = 0; d < w; d++) j->y[d0 + d] += (float)acc[d];
    }
}

void fast_bias_grad(float *db, const float *dy, int64_t N, int64_t D)
{
    RowJob j = {.y = db, .dy = dy, .N = N, .D = D};
    cpu_parallel_for(D, N * D >= GRAIN ? 32 : D, bias_grad_range, &j);
}

/* Batch entries [s, e) of the softmax: the mask rows of those entries. */
static void softmax_fwd_range(void *ctx, int64_t s, int64_t e)
{
    const RowJob *j = ctx;
    int64_t per = j->NH * j->Lq * j->Lk;
    ck_attn_softmax_fwd_f32(j->y + s * per, j->x + s * per, j->mask ? j->mask + s * j->Lk : NULL,
                            j->causal, j->scale, e - s, j->NH, j->Lq, j->Lk);
}

void fast_softmax_fwd(float *probs, const float *scores, const int32_t *mask, bool causal,
                      double scale, int64_t B, int64_t NH, int64_t Lq, int64_t Lk)
{
    RowJob j = {.y = probs, .x = scores, .mask = mask, .causal = causal, .scale = scale,
                .NH = NH, .Lq = Lq, .Lk = Lk};
    cpu_parallel_for(B, rows_grain(NH * Lq * Lk), softmax_fwd_range, &j);
}

static void softmax_bwd_range(void *ctx, int64_t s, int64_t e)
{
    const RowJob *j = ctx;
    int64_t o = s * j->Lk;
    ck_attn_softmax_bwd_f32(j->y + o, j->x + o, j->dy + o, j->scale, e - s, j->Lk);
}

void fast_softmax_bwd(float *dscores, const float *probs, const float *dprobs, double scale,
                      int64_t rows, int64_t Lk)
{
    RowJob j = {.y = dscores, .x = probs, .dy = dprobs, .scale = scale, .Lk = Lk};
    cpu_parallel_for(rows, rows_grain(Lk), softmax_bwd_range, &j);
}

static void split_range(void *ctx, int64_t s, int64_t e)
{
    const RowJob *j = ctx;
    int64_t per = j->L * j->NH * j->D;
    ck_heads_split_f32(j->y + s * per, j->x + s * per, e - s, j->L, j->NH, j->D);
}

void fast_heads_split(float *out, const float *in, int64_t B, int64_t L, int64_t NH, int64_t D)
{
    RowJob j = {.y = out, .x = in, .L = L, .NH = NH, .D = D};
    cpu_parallel_for(B, rows_grain(L * NH * D), split_range, &j);
}

static void merge_range(void *ctx, int64_t s, int64_t e)
{
    const RowJob *j = ctx;
    int64_t per = j->L * j->NH * j->D;
    ck_heads_merge_f32(j->y + s * per, j->x + s * per, e - s, j->L, j->NH, j->D);
}

void fast_heads_merge(float *out, const float *in, int64_t B, int64_t L, int64_t NH, int64_t D)
{
    RowJob j = {.y = out, .x = in, .L = L, .NH = NH, .D = D};
    cpu_parallel_for(B, rows_grain(L * NH * D), merge_range, &j);
}
