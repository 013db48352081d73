/* runtime/train/best_model.c — see best_model.h. */
#include "train/best_model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

HpcStatus best_model_init(BestModel *bm, TrainBackend *be, bool higher_is_better, HpcError *err)
{
    memset(bm, 0, sizeof *bm);
    bm->be = be;
    bm->higher_is_better = higher_is_better;
    bm->metric = NAN;
    const ParamList *pl = &be->pl;
    bm->w = xcalloc((size_t)pl->n + 1, sizeof *bm->w);
    for (int p = 0; p < pl->n; p++) {
        if (pl->p[p].tied_to >= 0) continue;
        bm->w[p] = malloc((size_t)params_numel(&pl->p[p]) * sizeof(float));   // (numel) f32
        if (!bm->w[p])
            return hpc_fail(err, HPC_ERR_OOM, "trainer: out of host memory for the best-model copy of %s",
                            pl->p[p].name);
    }
    return HPC_OK;
}

void best_model_free(BestModel *bm)
{
    for (int p = 0; bm->w && p < bm->be->pl.n; p++) free(bm->w[p]);
    free(bm->w);
    memset(bm, 0, sizeof *bm);
}

static HpcStatus copy_now(BestModel *bm, int64_t step, double metric, HpcError *err)
{
    HpcStatus st = HPC_OK;
    for (int p = 0; p < bm->be->pl.n && !st; p++)
        if (bm->w[p]) st = bm->be->read_param(bm->be, p, bm->w[p], err);
    bm->have = st == HPC_OK;
    bm->step = step;
    bm->metric = metric;
    return st;
}

HpcStatus best_model_offer(BestModel *bm, int64_t step, double metric, bool *taken, HpcError *err)
{
    bool better = !isnan(metric) && (!bm->have || isnan(bm->metric) ||
                                     (bm->higher_is_better ? metric > bm->metric : metric < bm->metric));
    if (taken) *taken = better;
    return better ? copy_now(bm, step, metric, err) : HPC_OK;
}

HpcStatus best_model_take_final(BestModel *bm, int64_t step, HpcError *err)
{
    return bm->have ? HPC_OK : copy_now(bm, step, NAN, err);
}

HpcStatus best_model_write(const BestModel *bm, const char *dir, const char *vocab_path, bool lower_case,
                           HpcError *err)
{
    if (!bm->have) return hpc_fail(err, HPC_ERR_INTERNAL, "trainer: no weights kept for --output %s", dir);
    HfFolder f = {.spec = bm->be->spec, .pl = &bm->be->pl, .w = (const float *const *)bm->w,
                  .vocab_path = vocab_path, .lower_case = lower_case};
    return hf_folder_write(dir, &f, err);
}
