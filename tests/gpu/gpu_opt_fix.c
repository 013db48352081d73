/* tests/gpu/gpu_opt_fix.c — the optimizer applying the LayerNorm weight-
 * gradient fixes itself (runtime/cuda/cuda_optim.h, "Deferred fixes")
 * trains as the executor running them does.
 *
 * bert_tiny fp16 (its FFN-up, fused Q/K/V and pooler dW GEMMs read their
 * LayerNorm's xhat, so their fixes end the graph), random parameters, two
 * executors with an optimizer each, one opened with HPC_OPT_LN_FIX=0; both
 * train 3 steps on the same batches with the same dropout seed, the
 * optimizer as the step's tail in a CUDA graph (the third step replays
 * it), as runtime/train/train_cuda.c does; then again with grad_accum = 2
 * (the fixes applied as the micro-batches' gradients are summed), and with
 * LAMB (its norm pass reads the gradients too).  Checks:
 *   - the fold is on in one and off in the other (the tail's
 *     applies_fixes), and it covers the tensors it should: the gradients
 *     of the FFN-up weights, the Q/K/V weights and biases and the pooler;
 *   - after a folded run the executor refuses to read a fixed gradient
 *     (it was never written);
 *   - each step's loss agrees, and after the last step every master
 *     weight: the change from the initial weights, relative L2 between the
 *     two <= 1e-3 (NaN fails).  On the emulator (one thread, no float
 *     atomics racing) the masters must be equal bit for bit; on a GPU the
 *     embedding backward's atomics make runs differ in the last bits, and
 *     a fix applied wrongly (a missing or doubled fix, gamma read after
 *     its own update) moves a tensor's change by far more than 1e-3.
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
static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) { return (uint32_t)(gpu_check_xorshift(&g_rng) >> 32); }
static float uniform(void) { return gpu_check_uniform24(rnd() >> 8); }

static void check_accum(ModelSpec spec, const IrGraph *g, const ParamList *pl, float **w, int accum,
                        SpecOptimizer kind)
{
    spec.train.grad_accum = accum;
    spec.train.max_grad_norm = 1.0;
    spec.train.optimizer = kind;
    char tag[80];
    snprintf(tag, sizeof tag, "bert_tiny fp16 B=%d L=%d %s grad_accum %d", B, L, spec_optimizer_name(kind), accum);
    GpuTrainer on, off;
    if (!gpu_train_open(&on, &g_dev, &spec, g, pl, B, L, w, "HPC_OPT_LN_FIX", NULL)) return;
    if (!gpu_train_open(&off, &g_dev, &spec, g, pl, B, L, w, "HPC_OPT_LN_FIX", "0")) {
        gpu_train_close(&on);
        return;
    }
    int fixed = 0, expected = 0;
    for (int i = 0; i < on.opt.count; i++) {
        const char *name = pl->p[on.opt.param[i]].name;
        fixed += on.opt.host_fix[i].raw != 0;
        expected += strstr(name, "intermediate.dense.weight") || strstr(name, "pooler.dense.weight") ||
                    (strstr(name, "attention.self.") && !strstr(name, "layer.0."));
    }
    result(on.opt.applies_fixes && on.opt.tails[2].applies_fixes && !off.opt.applies_fixes &&
               !off.opt.tails[2].applies_fixes,
           "%s: the tail applies the fixes with HPC_OPT_LN_FIX unset, not with 0", tag);
    result(fixed == expected && fixed > 0, "%s: %d gradients read through their fix (%d expected: the FFN-up, "
           "Q/K/V and pooler weights, the Q/K/V biases but layer 0's)", tag, fixed, expected);
    Batch *micro[STEPS][2];
    for (int s = 0; s < STEPS; s++)
        for (int m = 0; m < accum; m++) micro[s][m] = gpu_check_random_batch(&spec, B, L, true, rnd);
    if (gpu_train_both(&on, &off, micro, STEPS, accum, tag)) {
        int v = -1;
        for (int i = 0; i < on.opt.count && v < 0; i++)
            if (on.opt.host_fix[i].raw) v = g->param_grad[on.opt.param[i]];
        HpcError err = {0};
        float *tmp = xmalloc((size_t)ir_numel(&g->nodes[v], B, L) * sizeof *tmp);
        result(cuda_exec_read(&on.ex, v, tmp, &err) == HPC_ERR_USAGE,
               "%s: a fixed gradient is not read after a folded run (%s)", tag, err.msg);
        free(tmp);
        gpu_train_compare_masters(&on, &off, pl, w, STEPS, tag);
    }
    for (int s = 0; s < STEPS; s++)
        for (int m = 0; m < accum; m++) batch_free(micro[s][m]);
    gpu_train_close(&off);
    gpu_train_close(&on);
}

int main(void)
{
    gpu_check_flush = 1;
    if (!gpu_check_open_device("gpu_opt_fix", &g_dev)) return 4;
    ModelSpec spec;
    Pipeline p;
    float **w;
    if (!gpu_train_model("bert_tiny.model", &spec, &p, &w, uniform)) return gpu_check_summary();
    check_accum(spec, &p.g, &p.pl, w, 1, OPT_ADAMW);
    check_accum(spec, &p.g, &p.pl, w, 2, OPT_ADAMW);
    check_accum(spec, &p.g, &p.pl, w, 1, OPT_LAMB);
    gpu_check_free_params(&p.pl, w);
    pipeline_free(&p);
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
