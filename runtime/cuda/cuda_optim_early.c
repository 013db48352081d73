/* runtime/cuda/cuda_optim_early.c — see cuda_optim_early.h. */
#include "cuda/cuda_optim_early.h"

#include <stdlib.h>
#include <string.h>

/* Groups the pass is cut into, about: fewer launches beside the backward
 * against a later start for the first blocks of each (a group waits for
 * its latest gradient). */
#define EARLY_GROUPS 16

/* What HPC_OPT_EARLY_NORM unset means. */
#define EARLY_DEFAULT false

/* HPC_OPT_EARLY_NORM: 1, the pass beside the backward; 0, in the tail;
 * unset, EARLY_DEFAULT. */
static HpcStatus early_wanted(bool *on, HpcError *err)
{
    const char *e = getenv("HPC_OPT_EARLY_NORM");
    *on = e && *e ? strcmp(e, "1") == 0 : EARLY_DEFAULT;
    if (e && *e && strcmp(e, "0") != 0 && strcmp(e, "1") != 0)
        return hpc_fail(err, HPC_ERR_INPUT, "HPC_OPT_EARLY_NORM=%s: set it to 1 (the optimizer's norm pass beside "
                        "the backward) or 0 (in the optimizer's tail), or leave it unset (%s)", e,
                        EARLY_DEFAULT ? "1" : "0");
    return HPC_OK;
}

static int by_ready(const void *a, const void *b)
{
    const CudaOptEarlyGroup *x = a, *y = b;
    if (x->ready != y->ready) return x->ready < y->ready ? -1 : 1;
    return x->block0 < y->block0 ? -1 : x->block0 > y->block0;
}

/* Block b's position: the latest of its chunks' tensors'. */
static int *block_ready(const CudaOptim *o)
{
    int parts = o->plan.parts;
    int64_t *numel = xcalloc((size_t)o->count + 1, sizeof *numel);
    int *first = xcalloc((size_t)o->count + 1, sizeof *first), *ready = xmalloc((size_t)parts * sizeof *ready);
    for (int k = 0; k < o->count; k++) numel[k] = o->host_t[k].n;
    cuda_optim_chunks(numel, o->count, NULL, first);
    for (int b = 0; b < parts; b++) ready[b] = -1;
    for (int k = 0; k < o->count; k++)
        for (int c = first[k]; c < first[k + 1]; c++) {
            int b = c / CUDA_OPTIM_CHECK_CHUNKS;
            if (o->ready[k] > ready[b]) ready[b] = o->ready[k];
        }
    free(numel);
    free(first);
    return ready;
}

HpcStatus cuda_optim_early_init(CudaOptim *o, int last, HpcError *err)
{
    bool on;
    HpcStatus st = early_wanted(&on, err);
    if (st || !on || o->grad_accum > 1 || o->plan.parts == 0) return st;
    int parts = o->plan.parts, *ready = block_ready(o), min_size = parts / EARLY_GROUPS, n = 0, early = 0;
    if (min_size < 1) min_size = 1;
    CudaOptEarlyGroup *g = xcalloc((size_t)parts, sizeof *g);
    /* from the last block down (the backward's first gradients): a group
     * closes at min_size blocks, or where blocks that can start early meet
     * those that cannot */
    for (int b = parts - 1; b >= 0; b--) {
        bool can = ready[b] < last;
        if (n > 0) {
            CudaOptEarlyGroup *c = &g[n - 1];
            if (c->blocks < min_size && (c->ready < last) == can) {
                c->block0 = b;
                c->blocks++;
                if (ready[b] > c->ready) c->ready = ready[b];
                continue;
            }
        }
        g[n++] = (CudaOptEarlyGroup){.block0 = b, .blocks = 1, .ready = ready[b]};
        early += can;
    }
    free(ready);
    if (early == 0) {
        free(g);
        return HPC_OK;
    }
    qsort(g, (size_t)n, sizeof *g, by_ready);
    const CudaDriver *cu = cuda_driver();
    CudaOptEarly *e = &o->early;
    *e = (CudaOptEarly){.group = g, .n = n, .last = last};
    st = CUDA_CHECK(err, cu->cuStreamCreate(&e->side, CU_STREAM_NON_BLOCKING));
    if (!st) st = CUDA_CHECK(err, cu->cuEventCreate(&e->fork, CU_EVENT_DISABLE_TIMING));
    if (!st) st = CUDA_CHECK(err, cu->cuEventCreate(&e->join, CU_EVENT_DISABLE_TIMING));
    if (st) cuda_optim_early_free(o);
    return st;
}

void cuda_optim_early_free(CudaOptim *o)
{
    CudaOptEarly *e = &o->early;
    const CudaDriver *cu = cuda_driver();
    if (e->fork) cu->cuEventDestroy(e->fork);
    if (e->join) cu->cuEventDestroy(e->join);
    if (e->side) cu->cuStreamDestroy(e->side);
    free(e->group);
    memset(e, 0, sizeof *e);
}

HpcStatus cuda_optim_early_after(CudaOptim *o, int pos, bool fixed, CUstream s, HpcError *err)
{
    CudaOptEarly *e = &o->early;
    if (pos == 0) e->queued = 0;   /* a new sequence of launches (an earlier one may have failed) */
    HpcStatus st = HPC_OK;
    bool forked = false;
    const CudaDriver *cu = cuda_driver();
    while (!st && e->queued < e->n && e->group[e->queued].ready <= pos && e->group[e->queued].ready < e->last) {
        if (!forked) {
            st = CUDA_CHECK(err, cu->cuEventRecord(e->fork, s));
            if (!st) st = CUDA_CHECK(err, cu->cuStreamWaitEvent(e->side, e->fork, 0));
            forked = true;
        }
        const CudaOptEarlyGroup *g = &e->group[e->queued++];
        if (!st) st = cuda_optim_queue_check(&o->k, &o->plan, fixed, g->block0, g->blocks, e->side, err);
    }
    return st;
}

HpcStatus cuda_optim_early_finish(CudaOptim *o, bool fixed, CUstream s, HpcError *err)
{
    CudaOptEarly *e = &o->early;
    HpcStatus st = HPC_OK;
    for (int i = e->queued; i < e->n && !st; i++)
        st = cuda_optim_queue_check(&o->k, &o->plan, fixed, e->group[i].block0, e->group[i].blocks, s, err);
    const CudaDriver *cu = cuda_driver();
    if (!st && e->queued > 0) {
        st = CUDA_CHECK(err, cu->cuEventRecord(e->join, e->side));
        if (!st) st = CUDA_CHECK(err, cu->cuStreamWaitEvent(s, e->join, 0));
    }
    e->queued = 0;
    return st;
}
