/* runtime/cpu/cpu_fast_optim.c — see cpu_fast_optim.h.
 *
 * The tensors are laid end to end (element e of the whole set is element
 * e - start[k] of tensor k); chunk c covers [c * CHUNK, (c + 1) * CHUNK) of
 * that line, whatever tensors it crosses, so the chunks are equal work and
 * the threads (cpu_parallel_for: contiguous ranges of chunks) stay busy
 * together even though one tensor (the word embeddings) is half the model. */
#include "cpu/cpu_fast_optim.h"

#include <immintrin.h>
#include <math.h>
#include <stdlib.h>

#include "cpu/cpu_threads.h"
#include "util/error.h"

typedef struct {
    const OptimConfig *cfg;
    OptimTensor *tensors;
    int count;
    const int64_t *start;    /* (count + 1) first element of each tensor on the line; start[count] = total */
    float inv_scale;
    double lr, grad_norm;
    OptimState state;        /* before this step; each slice's optim_apply takes a copy */
    bool *found;             /* (chunks) per chunk: a non-finite unscaled gradient */
    double *sumsq;           /* (chunks) per chunk: sum of squares of the unscaled gradient */
    bool avx2;               /* the AdamW loop may use 4 f64 lanes */
} OptimJob;

/* Tensor k's part of [from, to) of the line as a tensor of its own. */
static OptimTensor slice_of(const OptimTensor *t, int64_t off, int64_t n)
{
    OptimTensor s = *t;
    s.master = t->master + off;
    s.grad = t->grad + off;
    s.m = t->m ? t->m + off : NULL;
    s.v = t->v ? t->v + off : NULL;
    s.low = t->low ? t->low + off : NULL;
    s.n = n;
    return s;
}

/* Calls fn on every tensor slice of chunk c, in line order. */
typedef void (*SliceFn)(OptimJob *j, int64_t chunk, OptimTensor *slice);

static void for_slices(OptimJob *j, int64_t c, SliceFn fn)
{
    int64_t from = c * FAST_OPTIM_CHUNK, to = from + FAST_OPTIM_CHUNK;
    if (to > j->start[j->count]) to = j->start[j->count];
    int k = 0;   /* the tensor holding `from`: start[k] <= from < start[k + 1] (bisection) */
    for (int lo = 0, hi = j->count - 1; lo <= hi;) {
        int mid = (lo + hi) / 2;
        if (j->start[mid] <= from) k = mid, lo = mid + 1;
        else hi = mid - 1;
    }
    for (; k < j->count && j->start[k] < to; k++) {
        int64_t a = from > j->start[k] ? from : j->start[k];
        int64_t b = to < j->start[k + 1] ? to : j->start[k + 1];
        if (b <= a) continue;   /* an empty tensor */
        OptimTensor s = slice_of(&j->tensors[k], a - j->start[k], b - a);
        fn(j, c, &s);
    }
}

static void scan_slice(OptimJob *j, int64_t c, OptimTensor *s)
{
    bool inf = false;
    double sq = 0;
    optim_scan(s, 1, j->inv_scale, &inf, &sq);
    j->found[c] |= inf;
    j->sumsq[c] += sq;
}

/* AdamW's element update: the very operations of optim.c's
 * optim_update_adamw + optim_adam_dir, in the same order and precision
 * (f32 unscale, f64 moments rounded to f32 when stored, f64 direction).
 * IEEE add, multiply, divide and sqrt round the same in a vector lane as
 * in a scalar, and the avx2 target has no FMA to contract them into, so
 * both versions are bitwise optim_apply (tests/test_cpu_fast_optim.c). */
typedef struct { double lr, decay, b1, b2, eps, bc1, bc2, coef; float inv_scale; } AdamwConsts;

static inline void adamw_one(const AdamwConsts *c, float *w, const float *grad, float *m, float *v, int64_t i)
{
    double g = (double)(grad[i] * c->inv_scale) * c->coef;
    double p = w[i] * c->decay;
    m[i] = (float)(c->b1 * m[i] + (1 - c->b1) * g);
    v[i] = (float)(c->b2 * v[i] + (1 - c->b2) * g * g);
    double d = ((double)m[i] / c->bc1) / (sqrt((double)v[i] / c->bc2) + c->eps);
    w[i] = (float)(p - c->lr * d);
}

static void adamw_plain(const AdamwConsts *c, float *w, const float *grad, float *m, float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++) adamw_one(c, w, grad, m, v, i);
}

/* Four elements per iteration in f64 lanes. */
__attribute__((target("avx2"))) static void adamw_avx2(const AdamwConsts *c, float *w, const float *grad,
                                                       float *m, float *v, int64_t n)
{
    const __m128 inv = _mm_set1_ps(c->inv_scale);
    const __m256d coef = _mm256_set1_pd(c->coef), decay = _mm256_set1_pd(c->decay), b1 = _mm256_set1_pd(c->b1),
                  b2 = _mm256_set1_pd(c->b2), nb1 = _mm256_set1_pd(1 - c->b1), nb2 = _mm256_set1_pd(1 - c->b2),
                  bc1 = _mm256_set1_pd(c->bc1), bc2 = _mm256_set1_pd(c->bc2), eps = _mm256_set1_pd(c->eps),
                  lr = _mm256_set1_pd(c->lr);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) {
        __m256d g = _mm256_mul_pd(_mm256_cvtps_pd(_mm_mul_ps(_mm_loadu_ps(grad + i), inv)), coef);
        __m256d p = _mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(w + i)), decay);
        __m256d mm = _mm256_add_pd(_mm256_mul_pd(b1, _mm256_cvtps_pd(_mm_loadu_ps(m + i))), _mm256_mul_pd(nb1, g));
        __m256d vv = _mm256_add_pd(_mm256_mul_pd(b2, _mm256_cvtps_pd(_mm_loadu_ps(v + i))),
                                   _mm256_mul_pd(_mm256_mul_pd(nb2, g), g));
        __m128 mf = _mm256_cvtpd_ps(mm), vf = _mm256_cvtpd_ps(vv);
        _mm_storeu_ps(m + i, mf);
        _mm_storeu_ps(v + i, vf);
        __m256d den = _mm256_add_pd(_mm256_sqrt_pd(_mm256_div_pd(_mm256_cvtps_pd(vf), bc2)), eps);
        __m256d d = _mm256_div_pd(_mm256_div_pd(_mm256_cvtps_pd(mf), bc1), den);
        _mm_storeu_ps(w + i, _mm256_cvtpd_ps(_mm256_sub_pd(p, _mm256_mul_pd(lr, d))));
    }
    for (; i < n; i++) adamw_one(c, w, grad, m, v, i);
}

/* The step constants as optim_apply computes them. */
static AdamwConsts adamw_consts(const OptimJob *j, bool decay)
{
    const OptimConfig *cfg = j->cfg;
    double coef = 1.0;
    if (cfg->max_grad_norm > 0) {
        double raw = cfg->max_grad_norm / (j->grad_norm + 1e-6);
        if (raw < 1.0) coef = raw;
    }
    double t = (double)(j->state.step + 1), wd = decay ? cfg->weight_decay : 0.0;
    return (AdamwConsts){.lr = j->lr, .decay = 1 - j->lr * wd, .b1 = cfg->beta1, .b2 = cfg->beta2, .eps = cfg->eps,
                         .bc1 = 1 - pow(cfg->beta1, t), .bc2 = 1 - pow(cfg->beta2, t), .coef = coef,
                         .inv_scale = j->inv_scale};
}

static void apply_slice(OptimJob *j, int64_t c, OptimTensor *s)
{
    if (j->cfg->kind == OPT_ADAMW && !s->low && s->m && s->v) {
        AdamwConsts k = adamw_consts(j, s->decay);
        (j->avx2 ? adamw_avx2 : adamw_plain)(&k, s->master, s->grad, s->m, s->v, s->n);
        return;
    }
    OptimState st = j->state;
    OptimReport ignore;
    optim_apply(j->cfg, &st, s, 1, j->inv_scale, j->lr, j->grad_norm, &ignore);
}

static void scan_range(void *ctx, int64_t b, int64_t e)
{
    for (int64_t c = b; c < e; c++) for_slices(ctx, c, scan_slice);
}

static void apply_range(void *ctx, int64_t b, int64_t e)
{
    for (int64_t c = b; c < e; c++) for_slices(ctx, c, apply_slice);
}

void fast_optim_step(const OptimConfig *cfg, OptimState *state, OptimTensor *tensors, int count,
                     float inv_scale, double lr, OptimReport *report)
{
    int64_t *start = xmalloc((size_t)(count + 1) * sizeof *start);
    start[0] = 0;
    for (int k = 0; k < count; k++) start[k + 1] = start[k] + tensors[k].n;
    int64_t chunks = (start[count] + FAST_OPTIM_CHUNK - 1) / FAST_OPTIM_CHUNK;
    OptimJob j = {.cfg = cfg, .tensors = tensors, .count = count, .start = start, .inv_scale = inv_scale,
                  .lr = lr, .state = *state, .found = xcalloc((size_t)chunks + 1, sizeof *j.found),
                  .sumsq = xcalloc((size_t)chunks + 1, sizeof *j.sumsq),
                  .avx2 = __builtin_cpu_supports("avx2") && !getenv("HPC_FAST_GEMM_PORTABLE")};
    cpu_parallel_for(chunks, 1, scan_range, &j);
    bool found_inf = false;
    double sumsq = 0;
    for (int64_t c = 0; c < chunks; c++) {   /* in chunk order: the same sum on any thread count */
        found_inf |= j.found[c];
        sumsq += j.sumsq[c];
    }
    *report = (OptimReport){.found_inf = true, .grad_norm = INFINITY, .clip_coef = 1.0};
    if (!found_inf) {
        j.grad_norm = sqrt(sumsq);
        if (cfg->kind == OPT_LAMB) {
            optim_apply(cfg, state, tensors, count, inv_scale, lr, j.grad_norm, report);
        } else {
            cpu_parallel_for(chunks, 1, apply_range, &j);
            optim_apply(cfg, state, tensors, 0, inv_scale, lr, j.grad_norm, report);   /* report, step + 1 */
        }
    }
    free(j.found);
    free(j.sumsq);
    free(start);
}
