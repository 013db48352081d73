/* runtime/train/init.c — see init.h. */
#include "train/init.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_threads.h"
#include "train/init_normal.h"

typedef struct { const ParamInfo *p; int index; float *w; uint64_t seed; } InitJob;

/* Elements [s, e): each value depends only on (seed, its index, the
 * parameter's index), so the split over threads never changes a bit. */
static void init_range(void *ctx, int64_t s, int64_t e)
{
    const InitJob *j = ctx;
    switch (j->p->init) {
    case PARAM_INIT_NORMAL: /* == (float)(INIT_STD * philox_normal(seed, i, index)) */
        init_normals(j->seed, (uint32_t)j->index, s, e - s, j->w + s);
        break;
    case PARAM_INIT_ZEROS:
        for (int64_t i = s; i < e; i++) j->w[i] = 0.0f;
        break;
    case PARAM_INIT_ONES:
        for (int64_t i = s; i < e; i++) j->w[i] = 1.0f;
        break;
    }
}

/* On every core: BERT-base's 110M normal draws took seconds on one, before
 * the first step of every run. */
void init_param_f32(const ParamInfo *p, int index, float *w, uint64_t seed)
{
    InitJob j = {.p = p, .index = index, .w = w, .seed = seed};
    cpu_parallel_for(params_numel(p), 1 << 16, init_range, &j);
}

HpcStatus init_store(ParamStore *ps, const ParamList *pl, uint64_t seed, HpcError *err)
{
    ps->pl = pl;
    ps->w = xcalloc((size_t)(pl->n > 0 ? pl->n : 1), sizeof *ps->w);
    for (int i = 0; i < pl->n; i++) {
        const ParamInfo *p = &pl->p[i];
        if (p->tied_to >= 0) continue;
        ps->w[i] = malloc((size_t)params_numel(p) * sizeof(float));
        if (!ps->w[i]) {
            init_store_free(ps);
            return hpc_fail(err, HPC_ERR_OOM, "init: out of host memory for parameter %s "
                            "(%lld elements)", p->name, (long long)params_numel(p));
        }
        init_param_f32(p, i, ps->w[i], seed);
    }
    for (int i = 0; i < pl->n; i++)
        if (pl->p[i].tied_to >= 0) ps->w[i] = ps->w[pl->p[i].tied_to];
    return HPC_OK;
}

void init_store_free(ParamStore *ps)
{
    if (ps->w && ps->pl)
        for (int i = 0; i < ps->pl->n; i++)
            if (ps->pl->p[i].tied_to < 0) free(ps->w[i]);
    free(ps->w);
    memset(ps, 0, sizeof *ps);
}
