/* runtime/api/api_cpu.c — the cpu backend of the C API (api_backend.h): the
 * reference executor, the host optimizer and the loss scaler. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_backend.h"
#include "cpu/cpu_exec.h"
#include "cpu/cpu_kernels.h"
#include "train/init.h"
#include "train/lossscale.h"
#include "train/optim.h"
#include "train/schedule.h"

typedef struct {
    ParamStore ps;        /* f32 masters, bound to the executor */
    CpuExec ex;
    float **grad;         /* (pl.n) gradient copies, NULL where no gradient */
    OptimTensor *ot;      /* (n_ot) tensors the optimizer updates */
    int n_ot;
    OptimConfig oc;
    OptimState os;
    LossScaleConfig lc;
    LossScaler ls;
    ScheduleConfig sc;
    uint32_t micro;       /* training forwards so far: the dropout step */
} ApiCpu;

static ApiCpu *cpu_of(HpcModel *m) { return m->impl; }

static void api_cpu_close(HpcModel *m)
{
    ApiCpu *c = cpu_of(m);
    if (!c) return;
    if (c->grad)
        for (int p = 0; p < m->prog.pl.n; p++) free(c->grad[p]);
    for (int i = 0; i < c->n_ot; i++) {
        free(c->ot[i].m);
        free(c->ot[i].v);
    }
    free(c->grad);
    free(c->ot);
    cpu_exec_free(&c->ex);
    init_store_free(&c->ps);
    free(c);
    m->impl = NULL;
}

/* Zero moments, step count and a fresh scaler: the state of a new run. */
static void reset_optim(HpcModel *m, ApiCpu *c)
{
    for (int i = 0; i < c->n_ot; i++) {
        size_t bytes = (size_t)c->ot[i].n * sizeof(float);
        if (c->ot[i].m) memset(c->ot[i].m, 0, bytes);
        if (c->ot[i].v) memset(c->ot[i].v, 0, bytes);
    }
    c->os.step = 0;
    ls_init(&c->ls, &c->lc);
    m->steps = 0;
    m->loss_scale = c->ls.scale;
}

static HpcStatus alloc_optim(HpcModel *m, ApiCpu *c, HpcError *err)
{
    const ParamList *pl = &m->prog.pl;
    const IrGraph *g = &m->prog.g;
    c->grad = xcalloc((size_t)pl->n + 1, sizeof *c->grad);
    c->ot = xcalloc((size_t)pl->n + 1, sizeof *c->ot);
    for (int p = 0; p < pl->n; p++) {
        if (g->param_grad[p] < 0) continue;
        int64_t n = params_numel(&pl->p[p]);
        OptimTensor *o = &c->ot[c->n_ot++];
        c->grad[p] = calloc((size_t)n, sizeof(float));
        o->m = optim_needs_m(&c->oc) ? calloc((size_t)n, sizeof(float)) : NULL;
        o->v = optim_needs_v(&c->oc) ? calloc((size_t)n, sizeof(float)) : NULL;
        if (!c->grad[p] || (optim_needs_m(&c->oc) && !o->m) || (optim_needs_v(&c->oc) && !o->v))
            return hpc_fail(err, HPC_ERR_OOM, "hpc_model_open: out of host memory for the optimizer "
                            "state of %s (%lld floats)", pl->p[p].name, (long long)n);
        o->master = c->ps.w[p];
        o->grad = c->grad[p];
        o->n = n;
        o->decay = pl->p[p].decay;
    }
    return HPC_OK;
}

static void copy_outputs(HpcModel *m, ApiCpu *c, double *loss, float *logits, float *hidden)
{
    const IrGraph *g = &m->prog.g;
    if (loss) *loss = cpu_exec_loss(&c->ex);
    if (logits)
        memcpy(logits, cpu_exec_value(&c->ex, g->logits),
               (size_t)cpu_exec_numel(&c->ex, g->logits) * sizeof(float));
    if (hidden)
        memcpy(hidden, cpu_exec_value(&c->ex, m->hidden_value),
               (size_t)cpu_exec_numel(&c->ex, m->hidden_value) * sizeof(float));
}

static HpcStatus api_cpu_forward(HpcModel *m, const Batch *b, double *loss, float *logits, float *hidden,
                                 HpcError *err)
{
    ApiCpu *c = cpu_of(m);
    CpuRunOptions o = {.training = false, .backward = false, .loss_scale = 1.0};
    HpcStatus st = cpu_exec_run(&c->ex, b, &o, err);
    if (st) return st;
    copy_outputs(m, c, loss, logits, hidden);
    return HPC_OK;
}

static HpcStatus api_cpu_train(HpcModel *m, const Batch *b, HpcStepReport *rep, HpcError *err)
{
    ApiCpu *c = cpu_of(m);
    const IrGraph *g = &m->prog.g;
    CpuRunOptions o = {.training = true, .backward = true, .seed = m->spec.train.seed,
                       .step = c->micro, .loss_scale = c->ls.scale};
    HpcStatus st = cpu_exec_run(&c->ex, b, &o, err);
    if (st) return st;
    c->micro++;
    /* The executor's gradient buffers are rewritten by the next run; the
     * optimizer reads stable copies. */
    for (int i = 0, k = 0; k < c->n_ot; i++) {
        if (!c->grad[i]) continue;
        memcpy(c->grad[i], cpu_exec_value(&c->ex, g->param_grad[i]), (size_t)c->ot[k].n * sizeof(float));
        k++;
    }
    double lr = schedule_lr(&c->sc, c->os.step);
    OptimReport r;
    optim_step(&c->oc, &c->os, c->ot, c->n_ot, (float)(1.0 / c->ls.scale), lr, &r);
    bool skipped = ls_update(&c->ls, r.found_inf);
    m->steps = c->os.step;
    m->loss_scale = c->ls.scale;
    *rep = (HpcStepReport){.loss = cpu_exec_loss(&c->ex), .lr = lr, .loss_scale = c->ls.scale,
                           .grad_norm = r.grad_norm, .skipped = skipped, .step = c->os.step};
    if (ls_gave_up(&c->ls)) {
        char why[512];
        ls_describe_give_up(&c->ls, why, sizeof why);
        return hpc_fail(err, HPC_ERR_NUMERIC, "hpc_model_train_step: %s", why);
    }
    return HPC_OK;
}

static HpcStatus api_cpu_get_param(HpcModel *m, int p, float *out, HpcError *err)
{
    ApiCpu *c = cpu_of(m);
    memcpy(out, c->ps.w[p], (size_t)params_numel(&m->prog.pl.p[p]) * sizeof(float));
    return HPC_OK;
}

static HpcStatus api_cpu_set_params(HpcModel *m, float *const *w, HpcError *err)
{
    ApiCpu *c = cpu_of(m);
    for (int p = 0; p < m->prog.pl.n; p++)
        if (m->prog.pl.p[p].tied_to < 0)
            memcpy(c->ps.w[p], w[p], (size_t)params_numel(&m->prog.pl.p[p]) * sizeof(float));
    reset_optim(m, c);
    return HPC_OK;
}

static const ApiBackendOps api_cpu_ops = {
    .name = "cpu",
    .forward = api_cpu_forward,
    .train = api_cpu_train,
    .get_param = api_cpu_get_param,
    .set_params = api_cpu_set_params,
    .close = api_cpu_close,
};

HpcStatus api_cpu_open(HpcModel *m, HpcError *err)
{
    ApiCpu *c = xcalloc(1, sizeof *c);
    m->impl = c;
    m->ops = &api_cpu_ops;
    snprintf(m->backend_name, sizeof m->backend_name, "cpu");
    HpcStatus st = init_store(&c->ps, &m->prog.pl, m->spec.train.seed, err);
    if (st) return st;
    cpu_exec_init(&c->ex, &m->prog.g, CPU_EXEC_F32);
    for (int p = 0; p < m->prog.pl.n; p++)
        if (m->prog.pl.p[p].tied_to < 0) cpu_exec_bind_param(&c->ex, p, c->ps.w[p]);
    optim_config_from_spec(&c->oc, &m->spec.train);
    if (m->policy == PREC_BF16) c->oc.low_dtype = PREC_BF16;
    schedule_config_from_spec(&c->sc, &m->spec.train, m->total_steps);
    ls_config_from_spec(&c->lc, &m->spec.train);
    st = alloc_optim(m, c, err);
    if (st) return st;
    reset_optim(m, c);
    return HPC_OK;
}
