/* runtime/dist/dp_optim.c — gradient averaging, rank agreement and the
 * replicated or ZeRO-1 optimizer step over host memory. */
#include "dist/dp_optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/half.h"

HpcStatus dp_optim_init(DpOptim *d, Collectives *coll, const OptimConfig *cfg, const int64_t *numel,
                        int count, bool zero1, HpcError *err)
{
    *d = (DpOptim){ .coll = coll, .count = count, .numel = numel, .zero1 = zero1 };
    if (zero1 && cfg->kind == OPT_LAMB)
        return hpc_fail(err, HPC_ERR_USAGE, "ZeRO-1 sharding needs an element-wise optimizer (adamw, adam, "
                        "sgd): lamb's trust ratio needs whole tensors; train lamb without sharding");
    for (int p = 0; p < count; p++) d->total += numel[p];
    d->buckets = xmalloc((size_t)(count > 0 ? count : 1) * sizeof *d->buckets);
    d->nbuckets = dist_buckets(numel, count, DP_BUCKET_ELEMS, d->buckets);
    int64_t scratch = 1;
    for (int b = 0; b < d->nbuckets; b++) if (d->buckets[b].elems > scratch) scratch = d->buckets[b].elems;
    if (zero1) {
        d->slice_len = dist_slice_len(d->total, coll->world, DP_SLICE_ALIGN);
        d->slice = dist_slice(d->total, coll->world, DP_SLICE_ALIGN, coll->rank);
        d->m = calloc((size_t)d->slice_len, sizeof *d->m);
        d->v = calloc((size_t)d->slice_len, sizeof *d->v);
        d->gathered = malloc((size_t)d->slice_len * (size_t)coll->world * sizeof *d->gathered);
        if (d->slice_len > scratch) scratch = d->slice_len;
    }
    d->scratch = malloc((size_t)scratch * sizeof *d->scratch);
    if (!d->scratch || (zero1 && (!d->m || !d->v || !d->gathered))) {
        dp_optim_free(d);
        return hpc_fail(err, HPC_ERR_OOM, "no host memory for the data-parallel optimizer state "
                        "(%lld parameters)", (long long)d->total);
    }
    return HPC_OK;
}

void dp_optim_free(DpOptim *d)
{
    free(d->m);
    free(d->v);
    free(d->buckets);
    free(d->scratch);
    free(d->gathered);
    *d = (DpOptim){ 0 };
}

HpcStatus dp_average_grads(DpOptim *d, float *const *grads, HpcError *err)
{
    float inv_world = 1.0f / (float)d->coll->world;
    for (int b = 0; b < d->nbuckets; b++) {
        const DistBucket *bk = &d->buckets[b];
        int64_t at = 0;
        for (int p = bk->first; p <= bk->last; p++) {
            memcpy(d->scratch + at, grads[p], (size_t)d->numel[p] * sizeof(float));
            at += d->numel[p];
        }
        HpcStatus st = d->coll->allreduce_sum_f32(d->coll, d->scratch, bk->elems, err);
        if (st) return st;
        at = 0;
        for (int p = bk->first; p <= bk->last; p++) {
            for (int64_t i = 0; i < d->numel[p]; i++) grads[p][i] = d->scratch[at + i] * inv_world;
            at += d->numel[p];
        }
    }
    return HPC_OK;
}

HpcStatus dp_agree_found_inf(Collectives *coll, bool local, bool *global, HpcError *err)
{
    double flag = local ? 1.0 : 0.0;
    HpcStatus st = coll->allreduce_max_f64(coll, &flag, 1, err);
    *global = flag != 0.0;
    return st;
}

/* The pieces of the tensors that fall in this rank's slice, with m and v
 * pointing into the slice's state; returns how many. */
static int slice_pieces(const DpOptim *d, const OptimTensor *tensors, OptimTensor *pieces)
{
    int n = 0;
    int64_t off = 0;
    for (int p = 0; p < d->count; off += tensors[p].n, p++) {
        int64_t lo = d->slice.begin > off ? d->slice.begin - off : 0;
        int64_t hi = d->slice.end < off + tensors[p].n ? d->slice.end - off : tensors[p].n;
        if (lo >= hi) continue;
        int64_t s = off + lo - d->slice.begin;
        pieces[n++] = (OptimTensor){
            .master = tensors[p].master + lo, .grad = tensors[p].grad + lo,
            .m = d->m + s, .v = d->v + s, .low = tensors[p].low ? tensors[p].low + lo : NULL,
            .n = hi - lo, .decay = tensors[p].decay,
        };
    }
    return n;
}

/* Every rank sends its updated slice of the masters; all write all of them
 * back (their own slice included, unchanged) and rebuild the 16-bit copies. */
static HpcStatus gather_masters(DpOptim *d, const OptimConfig *cfg, OptimTensor *tensors, HpcError *err)
{
    int64_t len = d->slice.end - d->slice.begin, off = 0;
    memset(d->scratch, 0, (size_t)d->slice_len * sizeof *d->scratch);
    for (int p = 0; p < d->count; off += tensors[p].n, p++)
        for (int64_t i = 0; i < tensors[p].n; i++)
            if (off + i >= d->slice.begin && off + i < d->slice.begin + len)
                d->scratch[off + i - d->slice.begin] = tensors[p].master[i];
    HpcStatus st = d->coll->allgather_f32(d->coll, d->scratch, d->slice_len, d->gathered, err);
    if (st) return st;
    off = 0;
    for (int p = 0; p < d->count; off += tensors[p].n, p++)
        for (int64_t i = 0; i < tensors[p].n; i++) {
            int64_t flat = off + i, r = flat / d->slice_len;
            tensors[p].master[i] = d->gathered[r * d->slice_len + flat % d->slice_len];
            if (tensors[p].low) tensors[p].low[i] = prec_from_f32(cfg->low_dtype, tensors[p].master[i]);
        }
    return HPC_OK;
}

HpcStatus dp_optim_step(DpOptim *d, const OptimConfig *cfg, OptimState *state, OptimTensor *tensors,
                        float inv_scale, double lr, OptimReport *report, HpcError *err)
{
    *report = (OptimReport){ .found_inf = true, .grad_norm = INFINITY, .clip_coef = 1.0 };
    OptimTensor *mine = tensors;
    int nmine = d->count;
    if (d->zero1) {
        mine = xmalloc((size_t)(d->count > 0 ? d->count : 1) * sizeof *mine);
        nmine = slice_pieces(d, tensors, mine);
    }
    bool local_inf, found;
    double sumsq;
    optim_scan(mine, nmine, inv_scale, &local_inf, &sumsq);
    HpcStatus st = dp_agree_found_inf(d->coll, local_inf, &found, err);
    /* Replicated ranks hold identical gradients, so each one's own norm is the
     * global norm; sharded ranks add their slices' squares. */
    if (!st && !found && d->zero1) st = d->coll->allreduce_sum_f64(d->coll, &sumsq, 1, err);
    if (!st && !found) {
        optim_apply(cfg, state, mine, nmine, inv_scale, lr, sqrt(sumsq), report);
        if (d->zero1) st = gather_masters(d, cfg, tensors, err);
    }
    if (mine != tensors) free(mine);
    return st;
}

HpcStatus dp_gather_state(DpOptim *d, float *full_m, float *full_v, HpcError *err)
{
    HPC_ASSERT(d->zero1);
    float *dst[2] = { full_m, full_v };
    const float *src[2] = { d->m, d->v };
    for (int k = 0; k < 2; k++) {
        HpcStatus st = d->coll->allgather_f32(d->coll, src[k], d->slice_len, d->gathered, err);
        if (st) return st;
        memcpy(dst[k], d->gathered, (size_t)d->total * sizeof(float));   /* slices are in flat order */
    }
    return HPC_OK;
}

void dp_take_state(DpOptim *d, const float *full_m, const float *full_v)
{
    HPC_ASSERT(d->zero1);
    int64_t len = d->slice.end - d->slice.begin;
    memset(d->m, 0, (size_t)d->slice_len * sizeof *d->m);
    memset(d->v, 0, (size_t)d->slice_len * sizeof *d->v);
    memcpy(d->m, full_m + d->slice.begin, (size_t)len * sizeof *d->m);
    memcpy(d->v, full_v + d->slice.begin, (size_t)len * sizeof *d->v);
}
