/* tests/gpu/gpu_opt_early.c — the optimizer's norm pass beside the
 * backward (runtime/cuda/cuda_optim_early.h) trains as the pass in the
 * optimizer's tail does.
 *
 * bert_tiny fp16, random parameters, two executors with an optimizer each,
 * opened with HPC_OPT_EARLY_NORM=1 and =0; both train 3 steps on the same
 * batches with the same dropout seed, the optimizer as the step's tail in a
 * CUDA graph (the third step replays it), as runtime/train/train_cuda.c
 * does; with AdamW and with LAMB, the optimizer applying the LayerNorm
 * weight-gradient fixes (the default: a group then waits for raw and db)
 * and with HPC_OPT_LN_FIX=0 (the executor's fixes, in place).  Checks:
 *   - the pass is cut into groups with the variable 1, not with 0; the
 *     groups cover the check's blocks once each, in the order of their
 *     positions, and some start before the step's last launch;
 *   - each step's loss agrees, the last step's gradient norm (relative
 *     1e-5 on a GPU, the same bits on the emulator) and every master weight
 *     (gpu_train_compare_masters: bit for bit on the emulator, where a
 *     group launched before its gradients' last write reads them unwritten
 *     and the masters differ);
 *   - a poisoned step (cuda_optim_poison: +inf in the first gradient, read
 *     by a group left to the tail) is skipped by both;
 *   - HPC_OPT_EARLY_NORM=2 is refused with a message naming it.
 * Exit 0 when every check passes, 1 on a failure, 4 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_exec.h"
#include "cuda/cuda_optim.h"
#include "pipeline.h"
#include "precision.h"
#include "program/ir.h"
#include "program/params.h"
#include "gpu_check.h"
#include "gpu_check_model.h"
#include "gpu_check_train.h"

enum { B = 4, L = 32, STEPS = 3 };

static CudaDevice g_dev;
static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { return (uint32_t)(gpu_check_xorshift(&g_rng) >> 32); }
static float uniform(void) { return gpu_check_uniform24(rnd() >> 8); }

/* The groups of o: a partition of the check's blocks, by position. */
static void check_groups(const CudaOptim *o, const char *tag)
{
    const CudaOptEarly *e = &o->early;
    int parts = o->plan.parts, covered = 0, early = 0, ordered = 1;
    char *seen = calloc((size_t)parts, 1);
    for (int i = 0; i < e->n; i++) {
        const CudaOptEarlyGroup *g = &e->group[i];
        for (int b = g->block0; b < g->block0 + g->blocks; b++)
            if (b >= 0 && b < parts && !seen[b]) seen[b] = 1, covered++;
        early += g->ready < e->last;
        ordered &= i == 0 || e->group[i - 1].ready <= g->ready;
    }
    int blocks = 0;
    for (int i = 0; i < e->n; i++) blocks += e->group[i].blocks;
    free(seen);
    result(covered == parts && blocks == parts && ordered && early > 0,
           "%s: %d groups cover the %d blocks once each (%d covered, %d in all), by position (%s); %d start "
           "before the step's last launch (position %d)", tag, e->n, parts, covered, blocks, ordered ? "yes" : "no",
           early, e->last);
}

static bool read_state(GpuTrainer *t, CudaOptState *s, const char *tag)
{
    HpcError err = {0};
    if (!cuda_optim_read_state(&t->opt, s, &err)) return true;
    result(0, "%s: read the optimizer state: %s", tag, err.msg);
    return false;
}

static void check_case(ModelSpec spec, const IrGraph *g, const ParamList *pl, float **w, SpecOptimizer kind,
                       const char *ln_fix)
{
    spec.train.max_grad_norm = 1.0;
    spec.train.optimizer = kind;
    char tag[96];
    snprintf(tag, sizeof tag, "bert_tiny fp16 B=%d L=%d %s%s", B, L, spec_optimizer_name(kind),
             ln_fix ? " HPC_OPT_LN_FIX=0" : "");
    if (ln_fix) setenv("HPC_OPT_LN_FIX", ln_fix, 1);
    GpuTrainer on, off;
    bool opened = gpu_train_open(&on, &g_dev, &spec, g, pl, B, L, w, "HPC_OPT_EARLY_NORM", "1");
    if (opened && !gpu_train_open(&off, &g_dev, &spec, g, pl, B, L, w, "HPC_OPT_EARLY_NORM", "0")) {
        gpu_train_close(&on);
        opened = false;
    }
    unsetenv("HPC_OPT_LN_FIX");
    if (!opened) return;
    result(on.opt.early.n > 0 && on.opt.tails[2].after && off.opt.early.n == 0 && !off.opt.tails[2].after,
           "%s: the norm pass is cut into groups with HPC_OPT_EARLY_NORM=1 (%d), not with 0", tag,
           on.opt.early.n);
    if (on.opt.early.n > 0) check_groups(&on.opt, tag);
    Batch *micro[STEPS][2] = {{0}};
    for (int s = 0; s < STEPS; s++) micro[s][0] = gpu_check_random_batch(&spec, B, L, true, rnd);
    CudaOptState so, sf;
    if (gpu_train_both(&on, &off, micro, STEPS, 1, tag) && read_state(&on, &so, tag) && read_state(&off, &sf, tag)) {
        double e = fabs(so.grad_norm - sf.grad_norm) / fmax(sf.grad_norm, 1e-30);
        bool emulated = getenv("HPC_CUDA_EMU") != NULL;
        result(isfinite(so.grad_norm) && (emulated ? so.grad_norm == sf.grad_norm : e <= 1e-5),
               "%s: the last step's gradient norm %.9g against %.9g (rel %.3g; %s)", tag, so.grad_norm,
               sf.grad_norm, e, emulated ? "the same bits on the emulator" : "<= 1e-5");
        gpu_train_compare_masters(&on, &off, pl, w, STEPS, tag);
        /* a poisoned step: +inf in the first gradient, which a group left to the tail reads */
        HpcError err = {0};
        uint32_t ms = 100;
        double loss;
        bool ran = !cuda_optim_poison(&on.opt, &err) && gpu_train_step(&on, micro[0], 1, &ms, &loss) &&
                   read_state(&on, &so, tag);
        if (ran)
            result(so.found_inf == 1 && so.total_skips == sf.total_skips + 1,
                   "%s: a poisoned step is skipped (found_inf %d, skips %lld)", tag, so.found_inf,
                   (long long)so.total_skips);
    }
    for (int s = 0; s < STEPS; s++) batch_free(micro[s][0]);
    gpu_train_close(&off);
    gpu_train_close(&on);
}

static void check_bad_value(const ModelSpec *spec, const IrGraph *g, const ParamList *pl, float **w)
{
    CudaExec ex;
    CudaOptim o;
    HpcError err = {0};
    if (cuda_exec_init(&ex, &g_dev, g, pl, B, L, &err) || cuda_exec_set_params(&ex, w, &err)) {
        result(0, "HPC_OPT_EARLY_NORM=2: open the executor: %s", err.msg);
        return;
    }
    setenv("HPC_OPT_EARLY_NORM", "2", 1);
    HpcStatus st = cuda_optim_init(&o, &ex, spec, PREC_FP16, 100, &err);
    unsetenv("HPC_OPT_EARLY_NORM");
    result(st == HPC_ERR_INPUT && strstr(err.msg, "HPC_OPT_EARLY_NORM=2") != NULL,
           "HPC_OPT_EARLY_NORM=2 is refused, naming the value: %s", st ? err.msg : "(taken)");
    if (!st) cuda_optim_free(&o);
    cuda_exec_free(&ex);
}

int main(void)
{
    gpu_check_flush = 1;
    if (!gpu_check_open_device("gpu_opt_early", &g_dev)) return 4;
    ModelSpec spec;
    Pipeline p;
    float **w;
    if (!gpu_train_model("bert_tiny.model", &spec, &p, &w, uniform)) return gpu_check_summary();
    check_case(spec, &p.g, &p.pl, w, OPT_ADAMW, NULL);
    check_case(spec, &p.g, &p.pl, w, OPT_ADAMW, "0");
    check_case(spec, &p.g, &p.pl, w, OPT_LAMB, NULL);
    check_bad_value(&spec, &p.g, &p.pl, w);
    gpu_check_free_params(&p.pl, w);
    pipeline_free(&p);
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
