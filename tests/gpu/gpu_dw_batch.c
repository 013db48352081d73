/* tests/gpu/gpu_dw_batch.c — the layers' dW GEMMs of one shape as one
 * batched cuBLASLt call (program/plan_order.c puts them side by side,
 * runtime/cuda/cuda_exec_dw_batch.c runs them through pointer arrays)
 * train as the GEMMs one by one do.
 *
 * BERT-tiny's shape with 5 layers in fp16 at 4 x 32 tokens, and on a GPU
 * BERT-base at 32 x 32 and 32 x 128, random parameters, three
 * executors with an optimizer each: the schedule grouped and batched
 * (HPC_DW_GROUP=1, or auto at BERT-base 32 x 32), grouped but each GEMM
 * alone (the same and HPC_DW_BATCH=0), and the graph's order
 * (HPC_DW_GROUP=0).  All train 3
 * steps on the same batches, the optimizer as the step's
 * tail in a CUDA graph (the third step replays it).  Checks:
 *   - the grouped plans hold every dW GEMM group side by side and pass
 *     plan_check; the batched executor found at least 4 runs (the four
 *     weight shapes of layers 0-3; the last layer sees only token 0), the
 *     other two none;
 *   - no step was skipped (the loss scaler found every gradient finite);
 *   - before training, one forward and backward pass without the
 *     optimizer (which would apply the LayerNorm fix to the gradients
 *     itself, leaving them unreadable): every parameter gradient agrees
 *     with the graph-order run's to 1e-3 relative L2 (NaN fails), the
 *     direct check of the batched GEMMs and of the plan around them;
 *   - each step's loss agrees with the graph-order run's; after the last
 *     step every master's change from the initial weights agrees to 1e-3
 *     relative L2 (NaN fails), or on a GPU to SPREAD times the run-to-run
 *     spread where that is larger; bit for bit on the emulator (one
 *     thread).  On a GPU the embedding backward's float atomics sum in
 *     another order each run, and training amplifies that last-bit
 *     difference: on an H100 (2026-12-07) BERT-base at 32 x 128 gave one
 *     pass's gradients equal bit for bit but for the position embeddings
 *     (7e-8), and after 3 steps no master equal, the worst change 0.0036
 *     apart.  So on a GPU a fourth trainer runs the graph's order again
 *     and its masters' difference from the first is the spread.  The
 *     attention key biases are left out of the masters' check (their
 *     difference is printed): softmax ignores a shift of a score row, so
 *     their exact gradient is zero (tests/test_autodiff.c holds it) and
 *     the computed one is rounding noise, and Adam's first steps move a
 *     weight by about lr times the sign of its gradient whatever its
 *     size, so a last-bit difference anywhere before step 2 can change
 *     their masters' change wholesale (0.27 in that run).
 * And a misspelt HPC_DW_GROUP or HPC_DW_BATCH stops the executor's set-up
 * with a usage error naming it.
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

enum { STEPS = 3 };
/* On a GPU the masters may differ from the graph order's by this many times
 * the graph order's own run-to-run difference (the top of this file). */
#define SPREAD 4.0
#define KEY_BIAS "attention.self.key.bias"   /* the masters' check leaves these out (above) */

static CudaDevice g_dev;
static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) { return (uint32_t)(gpu_check_xorshift(&g_rng) >> 32); }
static float uniform(void) { return gpu_check_uniform24(rnd() >> 8); }

/* HPC_DW_GROUP=group while the executor plans; var=value beside it. */
static bool open_trainer(GpuTrainer *t, const ModelSpec *spec, const Pipeline *p, float **w, int64_t B, int64_t L,
                         const char *group, const char *var, const char *value)
{
    setenv("HPC_DW_GROUP", group, 1);
    bool ok = gpu_trainer_open(t, &g_dev, spec, &p->g, &p->pl, w, B, L, var, value);
    unsetenv("HPC_DW_GROUP");
    return ok;
}

static bool is_identity(const StepPlan *p)
{
    for (int t = 0; t < p->n_order; t++)
        if (p->order[t] != t) return false;
    return true;
}

/* One forward and backward pass of t on batch b without the optimizer:
 * the weights stay, the gradients can be read. */
static bool gradients_only(GpuTrainer *t, Batch *b, HpcError *err)
{
    CudaRunOptions o = {.training = true, .backward = true, .seed = 11, .step = 0,
                        .loss_scale_dev = cuda_optim_scale_ptr(&t->opt)};
    return !cuda_exec_run(&t->ex, b, &o, err);
}

/* Every parameter gradient of a's last pass against b's, one check that
 * the worst relative L2 is at most 1e-3 (NaN fails). */
static void compare_grads(GpuTrainer *a, GpuTrainer *b, const Pipeline *p, const char *tag)
{
    HpcError err = {0};
    double worst = 0;
    int worst_q = -1, count = 0, same = 0;
    for (int q = 0; q < p->pl.n; q++) {
        int v = p->g.param_grad[q];
        if (v < 0) continue;
        int64_t n = ir_numel(&p->g.nodes[v], a->ex.B, a->ex.L);
        float *x = xmalloc((size_t)n * sizeof *x), *y = xmalloc((size_t)n * sizeof *y);
        if (cuda_exec_read(&a->ex, v, x, &err) || cuda_exec_read(&b->ex, v, y, &err)) {
            result(0, "%s: read the gradient of %s: %s", tag, p->pl.p[q].name, err.msg);
        } else {
            double e = gpu_check_rel_l2(x, y, n);
            same += memcmp(x, y, (size_t)n * sizeof *x) == 0;
            count++;
            if (!(e <= worst)) {   /* NaN becomes the worst */
                worst = isnan(worst) ? worst : e;
                worst_q = q;
            }
        }
        free(x);
        free(y);
    }
    result(count > 0 && worst <= 1e-3, "%s: %d gradients, worst rel L2 %.3g <= 1e-03 (%s); %d equal bit for bit",
           tag, count, worst, worst_q >= 0 ? p->pl.p[worst_q].name : "-", same);
}

/* The model `file` with `layers` (0: its own), fp16, random weights, at B x
 * L: the three trainers above, grouped by HPC_DW_GROUP=group ("1" always,
 * "auto" where the plan keeps it), min_runs batched runs at least. */
static void check_model(const char *file, int layers, int64_t B, int64_t L, const char *group, int min_runs)
{
    ModelSpec spec;
    Pipeline p;
    HpcError err = {0};
    if (!gpu_check_load_model(file, &spec)) return;
    if (layers) spec.stack.layers = layers;
    spec.train.max_grad_norm = 1.0;
    char tag[120];
    snprintf(tag, sizeof tag, "%s (%lld layers) fp16 B=%lld L=%lld HPC_DW_GROUP=%s", file,
             (long long)spec.stack.layers, (long long)B, (long long)L, group);
    PipeOptions po = pipeline_defaults(PREC_FP16);
    if (pipeline_build(&spec, &po, &p, &err)) {
        result(0, "%s: build the graph: %s", tag, err.msg);
        return;
    }
    float **w = gpu_check_random_params(&p.pl, PREC_FP16, uniform);
    GpuTrainer batched, alone, plain, again = {0};
    bool twice = !getenv("HPC_CUDA_EMU");   /* the graph's order run again: the spread (above) */
    bool opened = open_trainer(&batched, &spec, &p, w, B, L, group, "HPC_DW_BATCH", NULL);
    opened = open_trainer(&alone, &spec, &p, w, B, L, group, "HPC_DW_BATCH", "0") && opened;
    opened = open_trainer(&plain, &spec, &p, w, B, L, "0", "HPC_DW_BATCH", NULL) && opened;
    if (twice) opened = open_trainer(&again, &spec, &p, w, B, L, "0", "HPC_DW_BATCH", NULL) && opened;
    if (opened) {
        char why[512] = "";
        bool valid = plan_check(&batched.ex.plan, &p.g, why, sizeof why) &&
                     plan_check(&alone.ex.plan, &p.g, why, sizeof why);
        result(valid && !is_identity(&batched.ex.plan) && !is_identity(&alone.ex.plan) &&
                   is_identity(&plain.ex.plan),
               "%s: the grouped schedule, valid (%s); HPC_DW_GROUP=0 the graph's", tag, why);
        int members = 0;
        for (int r = 0; r < batched.ex.n_dw_runs; r++) members += batched.ex.dw_runs[r].count;
        result(batched.ex.n_dw_runs >= min_runs && alone.ex.n_dw_runs == 0 && plain.ex.n_dw_runs == 0,
               "%s: %d batched runs of %d dW GEMMs (want >= %d); %d with HPC_DW_BATCH=0, %d in the graph's "
               "order", tag, batched.ex.n_dw_runs, members, min_runs, alone.ex.n_dw_runs, plain.ex.n_dw_runs);
        Batch *batch[STEPS];
        for (int s = 0; s < STEPS; s++) batch[s] = gpu_check_random_batch(&spec, B, L, true, rnd);
        HpcError run_err = {0};
        bool ran = gradients_only(&batched, batch[0], &run_err) && gradients_only(&alone, batch[0], &run_err) &&
                   gradients_only(&plain, batch[0], &run_err) && (!twice || gradients_only(&again, batch[0], &run_err));
        if (ran) {
            char what[200];
            snprintf(what, sizeof what, "%s, one pass's gradients, batched against the graph's order", tag);
            compare_grads(&batched, &plain, &p, what);
            snprintf(what, sizeof what, "%s, one pass's gradients, batched against the grouped GEMMs alone", tag);
            compare_grads(&batched, &alone, &p, what);
        } else {
            result(0, "%s: a pass without the optimizer: %s", tag, run_err.msg);
        }
        uint32_t ms[4] = {0, 0, 0, 0};
        double worst = 0;
        for (int s = 0; s < STEPS && ran; s++) {
            double lb = 0, la = 0, lp = 0, lg = 0;
            ran = gpu_trainer_step(&batched, &batch[s], 1, &ms[0], &lb) &&
                  gpu_trainer_step(&alone, &batch[s], 1, &ms[1], &la) &&
                  gpu_trainer_step(&plain, &batch[s], 1, &ms[2], &lp) &&
                  (!twice || gpu_trainer_step(&again, &batch[s], 1, &ms[3], &lg));
            double e = fmax(fabs(lb - lp), fabs(la - lp)) / fmax(fabs(lp), 1e-30);
            worst = isnan(e) || e > worst ? e : worst;
        }
        if (ran) {
            CudaOptState sb = {0}, sa = {0}, sp = {0};
            bool read = !cuda_optim_read_state(&batched.opt, &sb, &err) &&
                        !cuda_optim_read_state(&alone.opt, &sa, &err) && !cuda_optim_read_state(&plain.opt, &sp, &err);
            result(read && sb.total_skips == 0 && sa.total_skips == 0 && sp.total_skips == 0,
                   "%s: no step skipped (finite gradients): %lld batched, %lld alone, %lld in the graph's order %s",
                   tag, (long long)sb.total_skips, (long long)sa.total_skips, (long long)sp.total_skips, err.msg);
            result(worst <= 1e-3, "%s: %d steps' losses agree: worst rel %.3g <= 1e-3", tag, STEPS, worst);
            double bound = 1e-3;
            GpuMastersDiff spread;
            if (twice && gpu_trainer_masters_error(&again, &plain, &p.pl, w, KEY_BIAS, &spread)) {
                /* NaN in the spread fails the checks below, as NaN in them would */
                bound = isnan(spread.worst) ? NAN : fmax(bound, SPREAD * spread.worst);
                printf("       %s: the graph's order run twice, %d steps: the change's worst rel L2 %.3g (%s), "
                       "%.3g on the key biases, %d of %d masters equal bit for bit: the run-to-run spread\n",
                       tag, STEPS, spread.worst, spread.worst_q >= 0 ? p.pl.p[spread.worst_q].name : "-",
                       spread.worst_apart, spread.same, spread.count);
            }
            char what[200];
            snprintf(what, sizeof what, "%s, %d steps, batched against the graph's order", tag, STEPS);
            gpu_trainer_compare_masters(&batched, &plain, &p.pl, w, what, bound, KEY_BIAS);
            snprintf(what, sizeof what, "%s, %d steps, batched against the grouped GEMMs alone", tag, STEPS);
            gpu_trainer_compare_masters(&batched, &alone, &p.pl, w, what, bound, KEY_BIAS);
        }
        for (int s = 0; s < STEPS; s++) batch_free(batch[s]);
    }
    if (twice) gpu_trainer_close(&again);
    gpu_trainer_close(&plain);
    gpu_trainer_close(&alone);
    gpu_trainer_close(&batched);
    gpu_check_free_params(&p.pl, w);
    pipeline_free(&p);
}

/* HPC_DW_GROUP and HPC_DW_BATCH misspelt: the executor's set-up stops
 * with a usage error naming the setting, not the default measured. */
static void check_settings(void)
{
    ModelSpec spec;
    Pipeline p;
    float **w;
    if (!gpu_trainer_bert_tiny(&spec, &p, &w, uniform)) return;
    static const char *const var[] = {"HPC_DW_GROUP", "HPC_DW_BATCH"};
    for (int k = 0; k < 2; k++) {
        CudaExec ex;
        HpcError err = {0};
        setenv(var[k], "yes", 1);
        HpcStatus st = cuda_exec_init(&ex, &g_dev, &p.g, &p.pl, 4, 32, &err);
        unsetenv(var[k]);
        char want[40];
        snprintf(want, sizeof want, "%s=yes", var[k]);
        result(st == HPC_ERR_USAGE && strstr(err.msg, want), "%s=yes: the set-up stops with a usage error (%s)",
               var[k], err.msg);
        if (!st) cuda_exec_free(&ex);
    }
    gpu_check_free_params(&p.pl, w);
    pipeline_free(&p);
}

int main(void)
{
    gpu_check_flush = 1;
    if (!gpu_check_open_device("gpu_dw_batch", &g_dev)) return 4;
    check_settings();
    /* BERT-tiny's shape with 5 layers: the four weight shapes of layers 0-3 */
    check_model("bert_tiny.model", 5, 4, 32, "1", 4);
    /* BERT-base on a GPU (the emulator would take hours): at 32 x 32 as the
     * plan's AUTO chooses (grouped: no larger arena), at 32 x 128 forced, where
     * hpc's own GEMM pairs run and the kept inputs lie elsewhere */
    if (!getenv("HPC_CUDA_EMU")) {
        check_model("bert_base.model", 0, 32, 32, "auto", 4);
        check_model("bert_base.model", 0, 32, 128, "1", 4);
    }
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
