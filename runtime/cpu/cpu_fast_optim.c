/* runtime/cpu/cpu_fast_optim.c — see cpu_fast_optim.h.
 *
 * The tensors are laid end to end (element e of the whole set is element
 * e - start[k] of tensor k); chunk c covers [c * CHUNK, (c + 1) * CHUNK) of
 * that line, whatever tensors it crosses, so the chunks are equal work and
 * the threads (cpu_parallel_for: contiguous ranges of chunks) stay busy
 * together even though one tensor (the word embeddings) is half the model. */
#include "cpu/cpu_fast_optim.h"

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

static void apply_slice(OptimJob *j, int64_t c, OptimTensor *s)
{
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
                  .sumsq = xcalloc((size_t)chunks + 1, sizeof *j.sumsq)};
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
