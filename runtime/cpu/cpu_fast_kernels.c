/* runtime/cpu/cpu_fast_kernels.c — the f32 reference kernels on every core;
 * see cpu_fast_kernels.h.  Each function packs its arguments into a job
 * and hands one range function to cpu_parallel_for.  Dropout follows
 * philox.h's rule (one draw decides 8 elements), the reference's bits. */
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

/* ck_dropout_fwd_f32's rule with i the global index: one Philox draw
 * decides the 8 elements of group i >> 3 (runtime/cpu/philox.h), so a range
 * may start inside a group and still give the reference's bits. */
static void dropout_range(void *ctx, int64_t s, int64_t e)
{
    const ElemJob *j = ctx;
    float scale = (float)(1.0 / (1.0 - (double)j->p));
    uint32_t mask = 0;
    for (int64_t i = s; i < e; i++) {
        if (i == s || (i & 7) == 0) mask = philox_dropout_mask8(j->seed, (uint64_t)i >> 3, j->step, j->salt, j->p);
        j->y[i] = mask >> (i & 7) & 1u ? j->a[i] * scale : 0;
    }
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
