/* runtime/trainer.c — the cpu training loop; see trainer.h. */
#include "trainer.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "cpu_exec.h"
#include "cpu_kernels.h"
#include "init.h"
#include "ir.h"
#include "loader.h"
#include "lossscale.h"
#include "lower.h"
#include "optim.h"
#include "precision.h"
#include "runlog.h"
#include "schedule.h"

typedef struct {
    const ModelSpec *spec;
    IrGraph g;
    ParamList pl;
    ParamStore ps;
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
    RunLog *log;
} Trainer;

static bool is_mixed(SpecPrecision p) { return p == PREC_FP16 || p == PREC_BF16; }

/* Replaces t->g by its mixed-precision plan. */
static HpcStatus trainer_precision(Trainer *t, SpecPrecision policy, HpcError *err)
{
    IrGraph mixed;
    PrecisionPlan plan;
    ir_init(&mixed);
    HpcStatus st = precision_plan(&t->g, t->spec, policy, &mixed, &plan, err);
    if (st) {
        ir_free(&mixed);
        return st;
    }
    precision_plan_free(&plan);
    ir_free(&t->g);
    t->g = mixed;
    return HPC_OK;
}

static HpcStatus trainer_compile(Trainer *t, SpecPrecision policy, HpcError *err)
{
    ir_init(&t->g);
    params_init(&t->pl);
    HpcStatus st = lower_model(t->spec, &t->g, &t->pl, err);
    if (!st) st = autodiff_build(&t->g, &t->pl, err);
    if (!st && is_mixed(policy)) st = trainer_precision(t, policy, err);
    if (!st) st = init_store(&t->ps, &t->pl, t->spec->train.seed, err);
    if (st) return st;
    cpu_exec_init(&t->ex, &t->g, CPU_EXEC_F32);
    for (int p = 0; p < t->pl.n; p++)
        if (t->pl.p[p].tied_to < 0) cpu_exec_bind_param(&t->ex, p, t->ps.w[p]);
    return HPC_OK;
}

/* Gradient buffers and optimizer state for every parameter with a gradient. */
static HpcStatus trainer_alloc_optim(Trainer *t, HpcError *err)
{
    optim_config_from_spec(&t->oc, &t->spec->train);
    t->grad = xcalloc((size_t)t->pl.n, sizeof *t->grad);
    t->ot = xcalloc((size_t)t->pl.n, sizeof *t->ot);
    t->ot_param = xcalloc((size_t)t->pl.n, sizeof *t->ot_param);
    for (int p = 0; p < t->pl.n; p++) {
        if (t->g.param_grad[p] < 0) continue;
        int64_t n = params_numel(&t->pl.p[p]);
        OptimTensor *o = &t->ot[t->n_ot];
        t->grad[p] = calloc((size_t)n, sizeof(float));
        o->m = optim_needs_m(&t->oc) ? calloc((size_t)n, sizeof(float)) : NULL;
        o->v = optim_needs_v(&t->oc) ? calloc((size_t)n, sizeof(float)) : NULL;
        if (!t->grad[p] || (optim_needs_m(&t->oc) && !o->m) || (optim_needs_v(&t->oc) && !o->v))
            return hpc_fail(err, HPC_ERR_OOM, "trainer: out of host memory for the optimizer "
                            "state of %s", t->pl.p[p].name);
        o->master = t->ps.w[p];
        o->grad = t->grad[p];
        o->n = n;
        o->decay = t->pl.p[p].decay;
        t->ot_param[t->n_ot++] = p;
    }
    return HPC_OK;
}

static void trainer_free(Trainer *t)
{
    if (t->grad)
        for (int p = 0; p < t->pl.n; p++) free(t->grad[p]);
    for (int i = 0; i < t->n_ot; i++) {
        free(t->ot[i].m);
        free(t->ot[i].v);
    }
    free(t->grad);
    free(t->ot);
    free(t->ot_param);
    cpu_exec_free(&t->ex);
    init_store_free(&t->ps);
    ir_free(&t->g);
    params_free(&t->pl);
}

/* The next batch, starting the next epoch when one ends. */
static Batch *next_batch(Loader *ld, HpcError *err)
{
    Batch *b = loader_next(ld);
    if (!b) b = loader_next(ld);
    if (!b) hpc_fail(err, HPC_ERR_OOM, "trainer: out of host memory for a batch");
    return b;
}

static int64_t real_tokens(const Batch *b)
{
    int64_t n = 0;
    for (int64_t i = 0; i < b->B * b->L; i++) n += b->attention_mask[i] != 0;
    return n;
}

/* One micro-batch: forward + backward, gradients added into t->grad. */
static HpcStatus micro_step(Trainer *t, const Batch *b, double *loss, HpcError *err)
{
    CpuRunOptions o = {.training = true, .backward = true, .seed = t->spec->train.seed,
                       .step = t->micro++, .loss_scale = t->ls.scale};
    HpcStatus st = cpu_exec_run(&t->ex, b, &o, err);
    if (st) return st;
    *loss = cpu_exec_loss(&t->ex);
    for (int i = 0; i < t->n_ot; i++) {
        int p = t->ot_param[i];
        ck_axpy_f32(t->grad[p], 1.0f, cpu_exec_value(&t->ex, t->g.param_grad[p]), t->ot[i].n);
    }
    return HPC_OK;
}

/* Counts argmax(logits) == label over a batch of sequence logits (B, C). */
static int64_t count_correct(const Trainer *t, const Batch *b)
{
    const float *lg = cpu_exec_value(&t->ex, t->g.logits);
    int64_t C = t->g.nodes[t->g.logits].dims[1], ok = 0;
    for (int64_t r = 0; r < b->B; r++) {
        int64_t best = 0;
        for (int64_t c = 1; c < C; c++)
            if (lg[r * C + c] > lg[r * C + best]) best = c;
        ok += best == b->labels[r];
    }
    return ok;
}

static const char *eval_metric_name(const ModelSpec *s)
{
    if (s->head.kind != HEAD_SEQ_CLASSIFICATION) return "loss";
    return s->head.regression ? "mse" : "accuracy";
}

static HpcStatus evaluate(Trainer *t, const Dataset *d, double *metric, double *loss, HpcError *err)
{
    Loader ld;
    HpcStatus st = loader_init(&ld, d, t->spec->train.batch_size, t->spec->train.max_seq_len,
                               t->spec->train.seed, false, false, err);
    if (st) return st;
    CpuRunOptions o = {.training = false, .backward = false, .loss_scale = 1.0};
    double loss_sum = 0;
    int64_t rows = 0, correct = 0;
    bool accuracy = strcmp(eval_metric_name(t->spec), "accuracy") == 0;
    for (Batch *b; st == HPC_OK && (b = loader_next(&ld)); batch_free(b)) {
        st = cpu_exec_run(&t->ex, b, &o, err);
        if (st) continue;
        loss_sum += cpu_exec_loss(&t->ex) * (double)b->B;
        rows += b->B;
        if (accuracy) correct += count_correct(t, b);
    }
    loader_free(&ld);
    *loss = rows ? loss_sum / (double)rows : 0;
    *metric = accuracy ? (rows ? (double)correct / (double)rows : 0) : *loss;
    return st;
}

static int64_t total_steps(const Trainer *t, const Dataset *train, const TrainOptions *opts)
{
    const SpecTraining *tr = &t->spec->train;
    if (opts->steps > 0) return opts->steps;
    if (tr->steps > 0) return tr->steps;
    int64_t per_epoch = (train->n + tr->batch_size - 1) / tr->batch_size;
    int64_t steps = tr->epochs * per_epoch / tr->grad_accum;
    return steps > 0 ? steps : 1;
}

/* One optimizer step over grad_accum micro-batches. */
static HpcStatus train_step(Trainer *t, Loader *ld, int64_t step, int64_t total, double *mean_loss,
                            HpcError *err)
{
    int64_t accum = t->spec->train.grad_accum, tokens = 0;
    for (int i = 0; i < t->n_ot; i++) memset(t->grad[t->ot_param[i]], 0, (size_t)t->ot[i].n * sizeof(float));
    double loss_sum = 0;
    for (int64_t m = 0; m < accum; m++) {
        Batch *b = next_batch(ld, err);
        if (!b) return err->code;
        double loss = 0;
        HpcStatus st = micro_step(t, b, &loss, err);
        tokens += real_tokens(b);
        batch_free(b);
        if (st) return st;
        loss_sum += loss;
    }
    *mean_loss = loss_sum / (double)accum;
    double lr = schedule_lr(&t->sc, t->os.step);
    OptimReport rep;
    optim_step(&t->oc, &t->os, t->ot, t->n_ot, (float)(1.0 / (t->ls.scale * (double)accum)), lr, &rep);
    if (ls_update(&t->ls, rep.found_inf)) {
        runlog_skip(t->log, step + 1, t->ls.scale);
        if (ls_gave_up(&t->ls)) {
            char why[256];
            ls_describe_give_up(&t->ls, why, sizeof why);
            return hpc_fail(err, HPC_ERR_NUMERIC, "trainer: %s", why);
        }
    }
    RunLogStep s = {.step = step + 1, .total_steps = total, .epoch = (int)ld->epoch,
                    .loss = *mean_loss, .lr = lr, .loss_scale = t->ls.scale,
                    .skipped_total = t->ls.total_skips, .tokens = tokens};
    runlog_step(t->log, &s);
    return HPC_OK;
}

static HpcStatus train_loop(Trainer *t, const Dataset *train, const Dataset *eval,
                            const TrainOptions *opts, TrainResult *res, HpcError *err)
{
    const SpecTraining *tr = &t->spec->train;
    Loader ld;
    HpcStatus st = loader_init(&ld, train, tr->batch_size, tr->max_seq_len, tr->seed, true, false, err);
    if (st) return st;
    int64_t total = total_steps(t, train, opts);
    schedule_config_from_spec(&t->sc, tr, total);
    LossScaleConfig lc;
    ls_config_from_spec(&lc, tr);
    ls_init(&t->ls, &lc);
    for (int64_t step = 0; step < total && st == HPC_OK; step++) {
        double loss = 0;
        st = train_step(t, &ld, step, total, &loss, err);
        if (step == 0) res->first_loss = loss;
        res->last_loss = loss;
        res->steps = step + 1;
        bool last = step + 1 == total;
        if (!st && eval && (last || (opts->eval_every > 0 && (step + 1) % opts->eval_every == 0))) {
            st = evaluate(t, eval, &res->eval_metric, &res->eval_loss, err);
            if (!st) runlog_eval(t->log, step + 1, (int)ld.epoch, res->metric, res->eval_metric, res->eval_loss);
        }
    }
    res->skipped = t->ls.total_skips;
    loader_free(&ld);
    return st;
}

HpcStatus trainer_run(const ModelSpec *spec, const Dataset *train, const Dataset *eval,
                      const TrainOptions *opts, TrainResult *res, HpcError *err)
{
    Trainer t;
    memset(&t, 0, sizeof t);
    memset(res, 0, sizeof *res);
    t.spec = spec;
    res->metric = eval_metric_name(spec);
    HpcStatus st = trainer_compile(&t, opts->policy, err);
    if (!st) st = trainer_alloc_optim(&t, err);
    if (!st) t.log = runlog_open(opts->jsonl, opts->out, opts->progress_bar, err);
    if (!st && !t.log) st = err->code;
    if (!st) {
        res->params = params_total(&t.pl);
        runlog_set_interval(t.log, opts->log_every > 0 ? opts->log_every : 50);
        runlog_set_higher_is_better(t.log, strcmp(res->metric, "accuracy") == 0);
        runlog_message(t.log, "%s: %lld parameters, %d values in the graph, cpu backend (%s)",
                       spec->name, (long long)res->params, t.g.n,
                       is_mixed(opts->policy) ? spec_precision_name(opts->policy) : "fp32");
        st = train_loop(&t, train, eval, opts, res, err);
    }
    if (t.log) runlog_close(t.log, 0);
    trainer_free(&t);
    return st;
}
