/* tests/gpu/gpu_dw_stream.c — the weight-gradient GEMMs on a second stream
 * of the step's CUDA graph (program/plan_side.h, HPC_DW_STREAM) train as
 * the step with every GEMM on one stream does.
 *
 * bert_tiny fp16, random parameters, two executors with an optimizer
 * each, one opened with HPC_DW_STREAM=1 (the side stream even where the
 * arena grows) and one with 0; both train 3 steps on the same batches of
 * 8 x 32 tokens with the optimizer as the step's tail in a CUDA graph (the
 * first step eager, the second captured, the third replayed: the last two
 * run the side stream), with AdamW.  Checks:
 *   - the one executor has side nodes (every LINEAR_DW of the backward),
 *     the other none, and both plans pass plan_check;
 *   - each step's loss agrees, and after the last step every master's
 *     change from the initial weights agrees to 1e-3 relative L2 (NaN
 *     fails); bit for bit on the emulator, which runs the streams in the
 *     order their work was queued; on a GPU the embedding backward's
 *     atomics differ in the last bits, and a side GEMM that raced a
 *     kernel writing its inputs (a join too late, an input not kept
 *     alive) would put a weight far off.
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
#include "program/plan.h"
#include "gpu_check.h"
#include "gpu_check_model.h"
#include "gpu_check_trainer.h"

enum { B = 8, L = 32, STEPS = 3 };

static CudaDevice g_dev;
static uint64_t g_rng = 0xd1b54a32d192ed03ull;
static uint32_t rnd(void) { return (uint32_t)(gpu_check_xorshift(&g_rng) >> 32); }
static float uniform(void) { return gpu_check_uniform24(rnd() >> 8); }

static bool open_trainer(GpuTrainer *t, const ModelSpec *spec, const IrGraph *g, const ParamList *pl, float **w,
                         const char *mode)
{
    return gpu_trainer_open(t, &g_dev, spec, g, pl, w, B, L, "HPC_DW_STREAM", mode);
}

int main(void)
{
    gpu_check_flush = 1;
    if (!gpu_check_open_device("gpu_dw_stream", &g_dev)) return 4;
    ModelSpec spec;
    HpcError err = {0};
    if (!gpu_check_load_model("bert_tiny.model", &spec)) return gpu_check_summary();
    spec.train.max_grad_norm = 1.0;
    PipeOptions po = pipeline_defaults(PREC_FP16);
    Pipeline p;
    if (pipeline_build(&spec, &po, &p, &err)) {
        result(0, "bert_tiny fp16: build the graph: %s", err.msg);
        return gpu_check_summary();
    }
    const char *tag = "bert_tiny fp16 B=8 L=32 adamw";
    float **w = gpu_check_random_params(&p.pl, PREC_FP16, uniform);
    GpuTrainer on, off;
    if (!open_trainer(&on, &spec, &p.g, &p.pl, w, "1")) return gpu_check_summary();
    if (!open_trainer(&off, &spec, &p.g, &p.pl, w, "0")) {
        gpu_trainer_close(&on);
        return gpu_check_summary();
    }
    int dw = 0;
    for (int i = 0; i < p.g.n; i++) dw += p.g.nodes[i].op == IR_OP_LINEAR_DW;
    char why_on[512] = "", why_off[512] = "";
    result(on.ex.side.n == dw && dw > 0 && off.ex.side.n == 0 && !off.ex.side.node,
           "%s: %d side nodes with HPC_DW_STREAM=1 (%d LINEAR_DW), %d with 0", tag, on.ex.side.n, dw, off.ex.side.n);
    result(plan_check(&on.ex.plan, &p.g, why_on, sizeof why_on) && plan_check(&off.ex.plan, &p.g, why_off,
                                                                              sizeof why_off),
           "%s: both plans pass plan_check %s%s", tag, why_on, why_off);
    Batch *batch[STEPS];
    for (int s = 0; s < STEPS; s++) batch[s] = gpu_check_random_batch(&spec, B, L, true, rnd);
    uint32_t ms_on = 0, ms_off = 0;
    double worst_loss = 0;
    bool ran = true;
    for (int s = 0; s < STEPS && ran; s++) {
        double lo = 0, lf = 0;
        ran = gpu_trainer_step(&on, &batch[s], 1, &ms_on, &lo) && gpu_trainer_step(&off, &batch[s], 1, &ms_off, &lf);
        double e = fabs(lo - lf) / fmax(fabs(lf), 1e-30);
        worst_loss = isnan(e) || e > worst_loss ? e : worst_loss;
    }
    if (ran) {
        result(on.ex.side.queued >= on.ex.side.n && off.ex.side.queued == 0, "%s: %ld GEMMs queued on the side "
               "stream (the capture's), none without it", tag, on.ex.side.queued);
        result(worst_loss <= 1e-3, "%s: %d steps' losses agree: worst rel %.3g <= 1e-3", tag, STEPS, worst_loss);
        char what[120];
        snprintf(what, sizeof what, "%s, %d steps", tag, STEPS);
        gpu_trainer_compare_masters(&on, &off, &p.pl, w, what, 1e-3);
    }
    for (int s = 0; s < STEPS; s++) batch_free(batch[s]);
    gpu_trainer_close(&off);
    gpu_trainer_close(&on);
    gpu_check_free_params(&p.pl, w);
    pipeline_free(&p);
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
