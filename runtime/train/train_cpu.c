/* runtime/train/train_cpu.c — the cpu training backend: the cpu executor (in
 * the mode cpu_exec_training_mode() names: the reference unless the program
 * chose the fast mode), the host optimizer and loss scaler (train_backend.h).
 * With set_dist the step is data parallel over a Collectives
 * (runtime/dist/dp_optim.h): the gradients are averaged over the ranks,
 * found_inf and the norm agreed, the optimizer replicated or ZeRO-1 (then m
 * and v live in the DpOptim, sliced, and checkpoints gather them), the logged
 * loss averaged over the ranks. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_exec.h"
#include "cpu/cpu_fast_gemm.h"
#include "cpu/cpu_fast_kernels.h"
#include "cpu/cpu_fast_optim.h"
#include "cpu/cpu_kernels.h"
#include "cpu/cpu_threads.h"
#include "dist/dp_optim.h"
#include "train/lossscale.h"
#include "train/optim.h"
#include "train/schedule.h"
#include "train/train_backend.h"

typedef struct {
    CpuExec ex;
    float **grad;         /* (pl.n) f32 gradient sums, NULL where no gradient */
    OptimTensor *ot;      /* (n_ot) tensors the optimizer updates */
    int *ot_param;        /* (n_ot) parameter index of each */
    int n_ot;
    OptimConfig oc;
    OptimState os;
    LossScaler ls;
    ScheduleConfig sc;
    uint32_t micro;       /* micro-steps so far: the dropout step */
    int64_t steps, accum; /* optimizer steps so far; micro-batches in this one */
    double loss_sum;      /* over this step's micro-batches */
    TrainStepStat pending[TRAIN_STAT_RING];
    int n_pending;
    Collectives *coll;    /* data parallel (set_dist), else NULL */
    DpOptim dp;
    int64_t *dp_numel;    /* (n_ot) elements of each optimized tensor */
    float **dp_grad;      /* (n_ot) their gradient buffers */
} CpuTrain;

static CpuTrain *impl(TrainBackend *b) { return b->impl; }

/* Gradient buffers and optimizer state for every parameter with a gradient. */
static HpcStatus alloc_optim(TrainBackend *b, CpuTrain *t, HpcError *err)
{
    optim_config_from_spec(&t->oc, &b->spec->train);
    if (b->policy == PREC_BF16) t->oc.low_dtype = PREC_BF16;
    t->grad = xcalloc((size_t)b->pl.n + 1, sizeof *t->grad);
    t->ot = xcalloc((size_t)b->pl.n + 1, sizeof *t->ot);
    t->ot_param = xcalloc((size_t)b->pl.n + 1, sizeof *t->ot_param);
    for (int p = 0; p < b->pl.n; p++) {
        if (b->g.param_grad[p] < 0) continue;
        int64_t n = params_numel(&b->pl.p[p]);
        OptimTensor *o = &t->ot[t->n_ot];
        t->grad[p] = calloc((size_t)n, sizeof(float));
        o->m = optim_needs_m(&t->oc) ? calloc((size_t)n, sizeof(float)) : NULL;
        o->v = optim_needs_v(&t->oc) ? calloc((size_t)n, sizeof(float)) : NULL;
        if (!t->grad[p] || (optim_needs_m(&t->oc) && !o->m) || (optim_needs_v(&t->oc) && !o->v))
            return hpc_fail(err, HPC_ERR_OOM, "trainer: out of host memory for the optimizer "
                            "state of %s", b->pl.p[p].name);
        o->master = b->ps.w[p];
        o->grad = t->grad[p];
        o->n = n;
        o->decay = b->pl.p[p].decay;
        t->ot_param[t->n_ot++] = p;
    }
    return HPC_OK;
}

static void cpu_close(TrainBackend *b)
{
    CpuTrain *t = impl(b);
    if (!t) return;
    if (t->grad)
        for (int p = 0; p < b->pl.n; p++) free(t->grad[p]);
    for (int i = 0; i < t->n_ot; i++) {
        free(t->ot[i].m);
        free(t->ot[i].v);
    }
    if (t->coll) dp_optim_free(&t->dp);
    free(t->dp_numel);
    free(t->dp_grad);
    free(t->grad);
    free(t->ot);
    free(t->ot_param);
    cpu_exec_free(&t->ex);
    free(t);
    b->impl = NULL;
}

/* Forward + backward; the first micro-batch of a step overwrites the sums. */
static HpcStatus cpu_micro(TrainBackend *b, const Batch *batch, int64_t m, HpcError *err)
{
    CpuTrain *t = impl(b);
    CpuRunOptions o = {.training = true, .backward = true, .seed = b->spec->train.seed,
                       .step = t->micro++, .loss_scale = t->ls.scale};
    HpcStatus st = cpu_exec_run(&t->ex, batch, &o, err);
    if (st) return st;
    if (m == 0) {
        t->loss_sum = 0;
        t->accum = 0;
    }
    t->loss_sum += cpu_exec_loss(&t->ex);
    t->accum++;
    for (int i = 0; i < t->n_ot; i++) {
        int p = t->ot_param[i];
        const float *g = cpu_exec_value(&t->ex, b->g.param_grad[p]);
        if (t->ex.mode == CPU_EXEC_FAST) { /* the same sums on every core */
            if (m == 0) fast_zero(t->grad[p], t->ot[i].n);
            fast_axpy(t->grad[p], 1.0f, g, t->ot[i].n);
            continue;
        }
        if (m == 0) memset(t->grad[p], 0, (size_t)t->ot[i].n * sizeof(float));
        ck_axpy_f32(t->grad[p], 1.0f, g, t->ot[i].n);
    }
    return HPC_OK;
}

static HpcStatus cpu_step(TrainBackend *b, bool poison, HpcError *err)
{
    CpuTrain *t = impl(b);
    if (t->n_pending == TRAIN_STAT_RING)
        return hpc_fail(err, HPC_ERR_INTERNAL, "trainer: %d steps without collect", TRAIN_STAT_RING);
    if (poison && t->n_ot > 0) t->grad[t->ot_param[0]][0] = INFINITY;
    double lr = schedule_lr(&t->sc, t->os.step);
    int64_t accum = t->accum > 0 ? t->accum : 1;
    OptimReport rep;
    float inv_scale = (float)(1.0 / (t->ls.scale * (double)accum));
    double loss = t->loss_sum / (double)accum;
    if (t->coll) {   /* every rank reaches the same found_inf, norm and weights */
        HpcStatus st = dp_average_grads(&t->dp, t->dp_grad, err);
        if (!st) st = dp_optim_step(&t->dp, &t->oc, &t->os, t->ot, inv_scale, lr, &rep, err);
        if (!st) st = t->coll->allreduce_sum_f64(t->coll, &loss, 1, err);
        if (st) return st;
        loss /= (double)t->coll->world;
    } else {
        if (t->ex.mode == CPU_EXEC_FAST) fast_optim_step(&t->oc, &t->os, t->ot, t->n_ot, inv_scale, lr, &rep);
        else optim_step(&t->oc, &t->os, t->ot, t->n_ot, inv_scale, lr, &rep);
    }
    bool skipped = ls_update(&t->ls, rep.found_inf);
    t->pending[t->n_pending++] = (TrainStepStat){
        .step = ++t->steps, .loss = loss, .lr = lr, .loss_scale = t->ls.scale,
        .grad_norm = rep.grad_norm, .skipped = skipped, .total_skips = t->ls.total_skips,
        .consecutive_skips = t->ls.consecutive_skips};
    t->accum = 0;
    return HPC_OK;
}

static HpcStatus cpu_collect(TrainBackend *b, TrainStepStat *out, int max, int *n, HpcError *err)
{
    CpuTrain *t = impl(b);
    *n = t->n_pending < max ? t->n_pending : max;
    memcpy(out, t->pending, (size_t)*n * sizeof *out);
    memmove(t->pending, t->pending + *n, (size_t)(t->n_pending - *n) * sizeof *out);
    t->n_pending -= *n;
    return HPC_OK;
}

static HpcStatus cpu_forward(TrainBackend *b, const Batch *batch, double *loss, const float **logits,
                             HpcError *err)
{
    CpuTrain *t = impl(b);
    CpuRunOptions o = {.training = false, .backward = false, .loss_scale = 1.0};
    HpcStatus st = cpu_exec_run(&t->ex, batch, &o, err);
    if (st) return st;
    *loss = cpu_exec_loss(&t->ex);
    if (logits) *logits = b->g.logits >= 0 ? cpu_exec_value(&t->ex, b->g.logits) : NULL;
    return HPC_OK;
}

static HpcStatus cpu_read_param(TrainBackend *b, int p, float *out, HpcError *err)
{
    int q = b->pl.p[p].tied_to >= 0 ? b->pl.p[p].tied_to : p;
    memcpy(out, b->ps.w[q], (size_t)params_numel(&b->pl.p[q]) * sizeof(float));
    return HPC_OK;
}

static double cpu_peak_bytes(TrainBackend *b) { return 0; }

/* Copies between the backend's state and a checkpoint's buffers; to_ts
 * chooses the direction. */
static void cpu_copy_state(TrainBackend *b, const TrainState *ts, bool to_ts)
{
    CpuTrain *t = impl(b);
    for (int p = 0; p < b->pl.n; p++) {
        if (b->pl.p[p].tied_to >= 0 || !ts->w[p]) continue;
        size_t bytes = (size_t)params_numel(&b->pl.p[p]) * sizeof(float);
        memcpy(to_ts ? ts->w[p] : b->ps.w[p], to_ts ? b->ps.w[p] : ts->w[p], bytes);
    }
    for (int i = 0; i < t->n_ot; i++) {
        int p = t->ot_param[i];
        size_t bytes = (size_t)t->ot[i].n * sizeof(float);
        if (t->ot[i].m && ts->m && ts->m[p]) memcpy(to_ts ? ts->m[p] : t->ot[i].m, to_ts ? t->ot[i].m : ts->m[p], bytes);
        if (t->ot[i].v && ts->v && ts->v[p]) memcpy(to_ts ? ts->v[p] : t->ot[i].v, to_ts ? t->ot[i].v : ts->v[p], bytes);
    }
}

/* ZeRO-1: the whole m and v <-> the checkpoint's per-tensor buffers (to_ts
 * gathers the slices from all ranks first: a collective call). */
static HpcStatus zero1_state(CpuTrain *t, const TrainState *ts, bool to_ts, HpcError *err)
{
    float *full_m = calloc((size_t)t->dp.total + 1, sizeof(float));
    float *full_v = calloc((size_t)t->dp.total + 1, sizeof(float));
    if (!full_m || !full_v) {
        free(full_m);
        free(full_v);
        return hpc_fail(err, HPC_ERR_OOM, "trainer: out of host memory gathering the optimizer state");
    }
    HpcStatus st = to_ts ? dp_gather_state(&t->dp, full_m, full_v, err) : HPC_OK;
    int64_t off = 0;
    for (int i = 0; !st && i < t->n_ot; off += t->ot[i].n, i++) {
        int p = t->ot_param[i];
        size_t bytes = (size_t)t->ot[i].n * sizeof(float);
        float *mine[2] = {full_m + off, full_v + off}, *theirs[2] = {ts->m ? ts->m[p] : NULL, ts->v ? ts->v[p] : NULL};
        for (int k = 0; k < 2; k++)
            if (theirs[k]) memcpy(to_ts ? theirs[k] : mine[k], to_ts ? mine[k] : theirs[k], bytes);
    }
    if (!st && !to_ts) dp_take_state(&t->dp, full_m, full_v);
    free(full_m);
    free(full_v);
    return st;
}

static HpcStatus cpu_state_out(TrainBackend *b, TrainState *ts, HpcError *err)
{
    CpuTrain *t = impl(b);
    cpu_copy_state(b, ts, true);
    if (t->coll && t->dp.zero1) {
        HpcStatus st = zero1_state(t, ts, true, err);
        if (st) return st;
    }
    ts->opt = t->os;
    ts->ls = t->ls;
    ts->micro_step = t->micro;
    return HPC_OK;
}

static HpcStatus cpu_state_in(TrainBackend *b, const TrainState *ts, HpcError *err)
{
    CpuTrain *t = impl(b);
    if (ts->micro_step < 0 || ts->micro_step > (int64_t)UINT32_MAX)
        return hpc_fail(err, HPC_ERR_INPUT, "trainer: checkpoint micro-step %lld out of range",
                        (long long)ts->micro_step);
    cpu_copy_state(b, ts, false);
    if (t->coll && t->dp.zero1) {
        HpcStatus st = zero1_state(t, ts, false, err);
        if (st) return st;
    }
    LossScaleConfig cfg = t->ls.cfg;
    t->os = ts->opt;
    t->ls = ts->ls;
    t->ls.cfg = cfg;
    t->micro = (uint32_t)ts->micro_step;
    t->steps = ts->step;
    return HPC_OK;
}

static HpcStatus cpu_set_dist(TrainBackend *b, Collectives *coll, bool zero1, HpcError *err)
{
    CpuTrain *t = impl(b);
    HPC_ASSERT(!t->coll && t->steps == 0 && t->n_pending == 0);
    if (strcmp(coll->kind, "local") != 0)
        return hpc_fail(err, HPC_ERR_USAGE, "trainer: the cpu backend reduces host memory over the local "
                        "collectives (threads), not %s", coll->kind);
    t->dp_numel = xcalloc((size_t)t->n_ot + 1, sizeof *t->dp_numel);
    t->dp_grad = xcalloc((size_t)t->n_ot + 1, sizeof *t->dp_grad);
    for (int i = 0; i < t->n_ot; i++) {
        t->dp_numel[i] = t->ot[i].n;
        t->dp_grad[i] = t->grad[t->ot_param[i]];
    }
    HpcStatus st = dp_optim_init(&t->dp, coll, &t->oc, t->dp_numel, t->n_ot, zero1, err);
    if (st) return st;
    t->coll = coll;
    for (int i = 0; zero1 && i < t->n_ot; i++) {   /* the slices in t->dp replace the whole m and v */
        free(t->ot[i].m);
        free(t->ot[i].v);
        t->ot[i].m = t->ot[i].v = NULL;
    }
    return HPC_OK;
}

static HpcStatus cpu_read_value(TrainBackend *b, int v, float *out, HpcError *err)
{
    CpuTrain *t = impl(b);
    memcpy(out, cpu_exec_value(&t->ex, v), (size_t)cpu_exec_numel(&t->ex, v) * sizeof(float));
    return HPC_OK;
}

/* New masters, and the optimizer and scaler of a new run. */
static HpcStatus cpu_set_weights(TrainBackend *b, float *const *w, HpcError *err)
{
    CpuTrain *t = impl(b);
    if (t->coll || t->n_pending || t->accum)
        return hpc_fail(err, HPC_ERR_USAGE, "trainer: new weights in the middle of a step, with records "
                        "uncollected, or under data parallel");
    for (int p = 0; p < b->pl.n; p++)
        if (b->pl.p[p].tied_to < 0) memcpy(b->ps.w[p], w[p], (size_t)params_numel(&b->pl.p[p]) * sizeof(float));
    for (int i = 0; i < t->n_ot; i++) {
        size_t bytes = (size_t)t->ot[i].n * sizeof(float);
        if (t->ot[i].m) memset(t->ot[i].m, 0, bytes);
        if (t->ot[i].v) memset(t->ot[i].v, 0, bytes);
    }
    t->os.step = 0;
    t->steps = 0;
    LossScaleConfig cfg = t->ls.cfg;
    ls_init(&t->ls, &cfg);
    return HPC_OK;
}

HpcStatus train_cpu_open(TrainBackend *b, int64_t total_steps, HpcError *err)
{
    CpuTrain *t = xcalloc(1, sizeof *t);
    b->impl = t;
    b->micro = cpu_micro;
    b->step = cpu_step;
    b->collect = cpu_collect;
    b->forward = cpu_forward;
    b->read_param = cpu_read_param;
    b->peak_bytes = cpu_peak_bytes;
    b->state_out = cpu_state_out;
    b->state_in = cpu_state_in;
    b->set_dist = cpu_set_dist;
    b->read_value = cpu_read_value;
    b->set_weights = cpu_set_weights;
    b->close = cpu_close;
    cpu_exec_init(&t->ex, &b->g, CPU_EXEC_F32);
    cpu_exec_set_mode(&t->ex, cpu_exec_training_mode());
    if (t->ex.mode == CPU_EXEC_FAST)
        snprintf(b->name, sizeof b->name, "cpu (fast: %d thread%s, %s gemm)", cpu_threads_count(),
                 cpu_threads_count() == 1 ? "" : "s", cpu_fast_gemm_kernel());
    else
        snprintf(b->name, sizeof b->name, "cpu");
    for (int p = 0; p < b->pl.n; p++)
        if (b->pl.p[p].tied_to < 0) cpu_exec_bind_param(&t->ex, p, b->ps.w[p]);
    schedule_config_from_spec(&t->sc, &b->spec->train, total_steps);
    LossScaleConfig lc;
    ls_config_from_spec(&lc, &b->spec->train);
    ls_init(&t->ls, &lc);
    return alloc_optim(b, t, err);
}
