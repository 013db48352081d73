/* runtime/cpu/cpu_attention.c — see cpu_attention.h. */
#include "cpu/cpu_attention.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "util/error.h"

static double *alloc0(int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    HPC_ASSERT(p != NULL);
    return p;
}

/* (B, NH, L, D) heads of a strided (B, L, ld) projection. */
static double *split_strided(const double *x, int64_t ld, const CkAttnShape *s)
{
    int64_t H = s->NH * s->D, rows = s->B * s->L;
    double *dense = alloc0(rows * H), *heads = alloc0(rows * H);
    for (int64_t r = 0; r < rows; r++) memcpy(dense + r * H, x + r * ld, (size_t)H * sizeof *x);
    ck_heads_split_f64(heads, dense, s->B, s->L, s->NH, s->D);
    free(dense);
    return heads;
}

/* Adds (B, NH, L, D) heads into a strided (B, L, ld) gradient. */
static void merge_add_strided(double *dx, int64_t ld, const double *heads, const CkAttnShape *s)
{
    int64_t H = s->NH * s->D, rows = s->B * s->L;
    double *dense = alloc0(rows * H);
    ck_heads_split_bwd_f64(dense, heads, s->B, s->L, s->NH, s->D);
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < H; c++) dx[r * ld + c] += dense[r * H + c];
    free(dense);
}

static bool visible(const int32_t *mask, const CkAttnShape *s, int64_t b, int64_t q, int64_t k)
{
    if (mask && mask[b * s->L + k] == 0) return false;
    return !s->causal || k <= q;
}

typedef struct { double *Qh, *Kh, *Vh, *S, *P, *Z; } Fwd;

static void forward(Fwd *f, const double *q, const double *k, const double *v, int64_t ld,
                    const int32_t *mask, const CkAttnShape *s)
{
    int64_t L = s->L, D = s->D, bh = s->B * s->NH, n = bh * L * L;
    f->Qh = split_strided(q, ld, s);
    f->Kh = split_strided(k, ld, s);
    f->Vh = split_strided(v, ld, s);
    f->S = alloc0(n);
    f->P = alloc0(n);
    f->Z = alloc0(n);
    ck_gemm_batched_f64(false, true, L, L, D, 1.0 / sqrt((double)D), f->Qh, L * D, f->Kh, L * D, 0.0,
                        f->S, L * L, bh);
    ck_attn_softmax_fwd_f64(f->P, f->S, mask, s->causal, 1.0, s->B, s->NH, L, L);
    ck_dropout_fwd_f64(f->Z, f->P, n, s->p, s->seed, s->step, s->salt);
}

static void fwd_free(Fwd *f)
{
    free(f->Qh);
    free(f->Kh);
    free(f->Vh);
    free(f->S);
    free(f->P);
    free(f->Z);
}

void ck_attention_fwd_f64(double *ctx, double *lse, const double *q, const double *k,
                          const double *v, int64_t ld, const int32_t *mask, const CkAttnShape *s)
{
    int64_t L = s->L, D = s->D, bh = s->B * s->NH;
    Fwd f;
    forward(&f, q, k, v, ld, mask, s);
    double *ch = alloc0(bh * L * D);
    ck_gemm_batched_f64(false, false, L, D, L, 1.0, f.Z, L * L, f.Vh, L * D, 0.0, ch, L * D, bh);
    ck_heads_merge_f64(ctx, ch, s->B, L, s->NH, D);
    free(ch);
    if (lse)
        for (int64_t r = 0; r < bh * L; r++) {
            int64_t b = r / (s->NH * L), qi = r % L;
            const double *row = f.S + r * L;
            double m = -INFINITY, sum = 0;
            for (int64_t j = 0; j < L; j++)
                if (visible(mask, s, b, qi, j) && !(row[j] <= m)) m = row[j];   /* NaN wins */
            for (int64_t j = 0; j < L; j++)
                if (visible(mask, s, b, qi, j)) sum += exp(row[j] - m);
            lse[r] = m == -INFINITY ? INFINITY : m + log(sum);
        }
    fwd_free(&f);
}

void ck_attention_bwd_f64(double *dq, double *dk, double *dv, int64_t ldg, const double *dctx,
                          const double *q, const double *k, const double *v, int64_t ld,
                          const int32_t *mask, const CkAttnShape *s)
{
    int64_t L = s->L, D = s->D, bh = s->B * s->NH, n = bh * L * L;
    Fwd f;
    forward(&f, q, k, v, ld, mask, s);
    double *dOh = alloc0(bh * L * D), *g = alloc0(bh * L * D);
    ck_heads_merge_bwd_f64(dOh, dctx, s->B, L, s->NH, D);   /* (B, L, H) -> heads */
    double *dZ = alloc0(n), *dP = alloc0(n), *dS = alloc0(n);
    ck_gemm_batched_f64(true, false, L, D, L, 1.0, f.Z, L * L, dOh, L * D, 0.0, g, L * D, bh);
    merge_add_strided(dv, ldg, g, s);
    ck_gemm_batched_f64(false, true, L, L, D, 1.0, dOh, L * D, f.Vh, L * D, 0.0, dZ, L * L, bh);
    ck_dropout_bwd_f64(dP, dZ, n, s->p, s->seed, s->step, s->salt);
    ck_attn_softmax_bwd_f64(dS, f.P, dP, 1.0 / sqrt((double)D), bh * L, L);
    ck_gemm_batched_f64(false, false, L, D, L, 1.0, dS, L * L, f.Kh, L * D, 0.0, g, L * D, bh);
    merge_add_strided(dq, ldg, g, s);
    ck_gemm_batched_f64(true, false, L, D, L, 1.0, dS, L * L, f.Qh, L * D, 0.0, g, L * D, bh);
    merge_add_strided(dk, ldg, g, s);
    free(dOh);
    free(g);
    free(dZ);
    free(dP);
    free(dS);
    fwd_free(&f);
}
