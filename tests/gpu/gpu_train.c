/* tests/gpu/gpu_train.c — training on the GPU (runtime/train/trainer.h with
 * TRAIN_DEVICE_CUDA: cuda_exec + the device optimizer and loss scaler of
 * runtime/cuda/cuda_optim.h) against the cpu trainer.
 *
 * The model is bert_tiny (hidden 128, 2 layers, 2 heads, FFN 512) with a
 * 64-token vocabulary and 64 positions on the synthetic "contains" task
 * (runtime/data/synthetic.h: does token 5 occur?), as tests/test_train_cpu.c.
 * Checks:
 *   1. the full step with the optimizer: 3 steps in fp32 (AdamW, constant
 *      lr 1e-3, no warmup, dropout on, clipping at 1.0) on the GPU and on
 *      the cpu from the same initial weights and dropout masks; per
 *      parameter tensor ||w_gpu - w_cpu|| / ||w_cpu|| <= 1e-4 (except the
 *      attention key biases, whose true gradient is 0: see noise_only), and the
 *      update itself (w - w0) within 2e-2 relative (Adam normalises each
 *      element, so a gradient near 0 amplifies summation-order noise);
 *      for the fused graph (compiler/fuse.h), the unfused graph and with
 *      grad_accum = 2 (the accumulation path); and once with SGD + momentum
 *      (lr 0.1), whose update is proportional to the gradient; with Adam;
 *      with LAMB and grad_accum = 3.  The optimizer runs inside the step's
 *      CUDA graph (runtime/cuda/cuda_optim.h): step 1 eager, step 2
 *      captured, step 3 replayed;
 *   2. the injected inf (TrainOptions.inject_inf_step = 4, 8 steps of fp16
 *      and of fp32): exactly one step skipped on each backend, the same
 *      step (4), the same loss scale afterwards (65536 / 2), and in fp32
 *      the same weights after the run (1e-4);
 *   3. 300 steps of fp16 and of fp32 on the GPU: both reach dev accuracy
 *      > 0.95 (chance 0.5), no step skipped in fp16, and their dev losses
 *      are within 0.05 of each other (measured distance printed).
 * GPU_TRAIN_SELFTEST=1 runs every comparison with the cpu in place of the
 * GPU (no GPU needed): the checks must pass trivially, which tests this
 * program's plumbing.
 * Exit 0 when every check passes, 1 on a failed check, 4 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_driver.h"
#include "data/dataset.h"
#include "train/init.h"
#include "lower.h"
#include "program/params.h"
#include "program/spec.h"
#include "data/synthetic.h"
#include "train/trainer.h"
#include "gpu_check.h"

static TrainDevice g_gpu = TRAIN_DEVICE_CUDA;

static void bert_tiny(ModelSpec *s, int64_t steps)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "bert_tiny");
    s->stack.hidden = 128;
    s->stack.layers = 2;
    s->stack.heads = 2;
    s->stack.ffn = 512;
    s->stack.vocab_size = 64;
    s->stack.max_positions = 64;
    s->train.lr = 1e-3;
    s->train.batch_size = 32;
    s->train.max_seq_len = 16;
    s->train.seed = 7;
    s->train.steps = steps;
    s->train.epochs = 0;
}

typedef struct {
    Dataset train, dev;
} Data;

static int data_make(Data *d)
{
    HpcError err = {0};
    dataset_init(&d->train, "contains/train");
    dataset_init(&d->dev, "contains/dev");
    if (synthetic_make(SYN_CONTAINS, &d->train, 2000, 64, 16, 1, false, &err) ||
        synthetic_make(SYN_CONTAINS, &d->dev, 500, 64, 16, 2, false, &err)) {
        result(0, "synthetic data: %s", err.msg);
        return 0;
    }
    return 1;
}

/* Host buffers for every parameter (tied ones included: read_param gives
 * the tensor they share). */
typedef struct {
    ParamList pl;
    float **w;
} Weights;

static void weights_init(Weights *w, const ModelSpec *s)
{
    IrGraph g;
    HpcError err = {0};
    ir_init(&g);
    params_init(&w->pl);
    HPC_ASSERT(lower_model(s, &g, &w->pl, &err) == HPC_OK);
    ir_free(&g);
    w->w = xcalloc((size_t)w->pl.n, sizeof *w->w);
    for (int p = 0; p < w->pl.n; p++) w->w[p] = xcalloc((size_t)params_numel(&w->pl.p[p]), sizeof(float));
}

static void weights_free(Weights *w)
{
    for (int p = 0; p < w->pl.n; p++) free(w->w[p]);
    free(w->w);
    params_free(&w->pl);
}

/* The weights every run starts from (runtime/train/init.h: seeded, per index). */
static void initial_weights(Weights *w, const ModelSpec *s)
{
    ParamStore ps;
    HpcError err = {0};
    HPC_ASSERT(init_store(&ps, &w->pl, s->train.seed, &err) == HPC_OK);
    for (int p = 0; p < w->pl.n; p++)
        memcpy(w->w[p], ps.w[p], (size_t)params_numel(&w->pl.p[p]) * sizeof(float));
    init_store_free(&ps);
}

static int train(const ModelSpec *s, const Data *d, TrainDevice dev, SpecPrecision policy, bool fuse,
                 int64_t inject, Weights *w, TrainResult *r)
{
    HpcError err = {0};
    TrainOptions o = {.log_every = 100, .out = NULL, .policy = policy, .device = dev,
                      .inject_inf_step = inject, .no_fuse = !fuse, .weights_out = w ? w->w : NULL};
    HpcStatus st = trainer_run(s, &d->train, &d->dev, &o, r, &err);
    if (st) result(0, "trainer_run on %s (%s): %s", train_device_name(dev), spec_precision_name(policy), err.msg);
    return st == HPC_OK;
}

/* attention.self.key.bias gets a gradient that is exactly 0 in exact
 * arithmetic (adding a bias to every key adds the same q.b to a whole row
 * of scores, which softmax ignores); both backends hold rounding noise
 * there, which Adam normalises to +-lr.  Its error is printed, not checked. */
static bool noise_only(const char *name) { return strstr(name, "attention.self.key.bias") != NULL; }

/* max over the checked tensors of ||a - b|| / ||b|| (weight_err) and of
 * ||(a - w0) - (b - w0)|| / ||b - w0|| (update_err); prints the three
 * largest weight errors. */
static void compare(const Weights *a, const Weights *b, const Weights *w0, double *weight_err, double *update_err,
                    const char **worst)
{
    double top[3] = {0, 0, 0}, noise = 0;
    const char *top_name[3] = {"", "", ""};
    *weight_err = *update_err = 0;
    *worst = "";
    for (int p = 0; p < a->pl.n; p++) {
        int64_t n = params_numel(&a->pl.p[p]);
        double d = 0, ref = 0, ru = 0;
        for (int64_t i = 0; i < n; i++) {
            double x = a->w[p][i], y = b->w[p][i], z = w0->w[p][i];
            d += (x - y) * (x - y);
            ref += y * y;
            ru += (y - z) * (y - z);
        }
        /* (a - w0) - (b - w0) = a - b: the update error has the same numerator. */
        double e = ref > 0 ? sqrt(d / ref) : sqrt(d), u = ru > 0 ? sqrt(d / ru) : sqrt(d);
        if (noise_only(a->pl.p[p].name)) {
            noise = fmax(noise, isnan(e) ? INFINITY : e);
            continue;
        }
        if (!(e <= *weight_err)) {
            *weight_err = e;
            *worst = a->pl.p[p].name;
        }
        if (!(u <= *update_err)) *update_err = u;
        for (int k = 0; k < 3; k++)
            if (!(e <= top[k])) {
                for (int j = 2; j > k; j--) {
                    top[j] = top[j - 1];
                    top_name[j] = top_name[j - 1];
                }
                top[k] = e;
                top_name[k] = a->pl.p[p].name;
                break;
            }
    }
    printf("      largest weight errors: %s %.2e, %s %.2e, %s %.2e; key biases (noise only) %.2e\n",
           top_name[0], top[0], top_name[1], top[1], top_name[2], top[2], noise);
}

/* Check 1: three fp32 steps, GPU against cpu. */
static void check_three_steps(const Data *d, bool fuse, int64_t accum, SpecOptimizer opt)
{
    ModelSpec s;
    bert_tiny(&s, 3);
    s.train.optimizer = opt;
    if (opt == OPT_SGD) {   /* an update proportional to the gradient: no normalisation */
        s.train.lr = 0.1;
        s.train.momentum = 0.9;
    }
    s.train.schedule = SCHED_CONSTANT;
    s.train.warmup_ratio = 0;
    s.train.warmup_steps = 0;
    s.train.grad_accum = accum;
    Weights w0, wc, wg;
    weights_init(&w0, &s);
    weights_init(&wc, &s);
    weights_init(&wg, &s);
    initial_weights(&w0, &s);
    TrainResult rc, rg;
    if (train(&s, d, TRAIN_DEVICE_CPU, PREC_FP32, fuse, 0, &wc, &rc) &&
        train(&s, d, g_gpu, PREC_FP32, fuse, 0, &wg, &rg)) {
        double we, ue;
        const char *worst;
        compare(&wg, &wc, &w0, &we, &ue, &worst);
        result(we <= 1e-4 && ue <= 2e-2,
               "3 fp32 %s steps (%s graph, grad_accum %lld): weights rel err %.2e (max, %s; want <= 1e-4), "
               "update rel err %.2e (want <= 2e-2); loss gpu %.6f cpu %.6f", spec_optimizer_name(opt),
               fuse ? "fused" : "unfused", (long long)accum, we, worst, ue, rg.last_loss, rc.last_loss);
        result(fabs(rg.last_loss - rc.last_loss) <= 1e-4 * fabs(rc.last_loss),
               "3 fp32 steps (%s graph, grad_accum %lld): last loss gpu %.7f cpu %.7f",
               fuse ? "fused" : "unfused", (long long)accum, rg.last_loss, rc.last_loss);
    }
    weights_free(&w0);
    weights_free(&wc);
    weights_free(&wg);
}

/* Check 2: the injected inf is skipped at the same step on both backends. */
static void check_inject(const Data *d, SpecPrecision policy)
{
    ModelSpec s;
    bert_tiny(&s, 8);
    Weights wc, wg;
    weights_init(&wc, &s);
    weights_init(&wg, &s);
    TrainResult rc, rg;
    const char *pn = spec_precision_name(policy);
    if (train(&s, d, TRAIN_DEVICE_CPU, policy, true, 4, &wc, &rc) &&
        train(&s, d, g_gpu, policy, true, 4, &wg, &rg)) {
        result(rg.skipped == 1 && rc.skipped == 1 && rg.last_skipped_step == 4 && rc.last_skipped_step == 4,
               "inf injected before step 4 (%s): skipped gpu %lld (step %lld), cpu %lld (step %lld)", pn,
               (long long)rg.skipped, (long long)rg.last_skipped_step, (long long)rc.skipped,
               (long long)rc.last_skipped_step);
        result(rg.final_scale == rc.final_scale && rc.final_scale == 32768.0,
               "inf injected (%s): loss scale afterwards gpu %g, cpu %g (want 32768)", pn, rg.final_scale,
               rc.final_scale);
        if (policy == PREC_FP32) {
            double we, ue;
            const char *worst;
            compare(&wg, &wc, &wc, &we, &ue, &worst);
            result(we <= 1e-4, "inf injected (fp32): weights after 8 steps rel err %.2e (max, %s; want <= 1e-4)",
                   we, worst);
        }
    }
    weights_free(&wc);
    weights_free(&wg);
}

/* Check 3: 300 steps of fp16 and fp32 on the GPU. */
static void check_300_steps(const Data *d)
{
    ModelSpec s;
    bert_tiny(&s, 300);
    TrainResult r16, r32;
    if (!train(&s, d, g_gpu, PREC_FP16, true, 0, NULL, &r16) || !train(&s, d, g_gpu, PREC_FP32, true, 0, NULL, &r32))
        return;
    result(r16.eval_metric > 0.95 && r32.eval_metric > 0.95,
           "300 steps on %s: dev accuracy fp16 %.4f, fp32 %.4f (want > 0.95)", r32.backend, r16.eval_metric,
           r32.eval_metric);
    result(r16.skipped == 0, "300 steps fp16: %lld steps skipped (want 0), final scale %g", (long long)r16.skipped,
           r16.final_scale);
    double dist = fabs(r16.eval_loss - r32.eval_loss);
    result(isfinite(dist) && dist <= 0.05,
           "300 steps: dev loss fp16 %.5f, fp32 %.5f, distance %.5f (want <= 0.05); train loss %.4f -> %.4f (fp16), "
           "%.4f -> %.4f (fp32)", r16.eval_loss, r32.eval_loss, dist, r16.first_loss, r16.last_loss,
           r32.first_loss, r32.last_loss);
}

int main(void)
{
    gpu_check_flush = 1;   /* long runs: each line reaches the log at once */
    if (getenv("GPU_TRAIN_SELFTEST")) {
        g_gpu = TRAIN_DEVICE_CPU;
        printf("self-test: the cpu stands in for the GPU\n");
    } else {
        int count = 0;
        HpcError err = {0};
        if (cuda_device_count(&count, &err) || count == 0) {
            printf("skip: no usable GPU (%s)\n", err.msg[0] ? err.msg : "0 devices");
            return 4;
        }
    }
    Data d;
    if (!data_make(&d)) return 1;
    check_three_steps(&d, true, 1, OPT_ADAMW);
    check_three_steps(&d, false, 1, OPT_ADAMW);
    check_three_steps(&d, true, 2, OPT_ADAMW);
    check_three_steps(&d, true, 1, OPT_SGD);
    check_three_steps(&d, true, 1, OPT_ADAM);
    check_three_steps(&d, true, 3, OPT_LAMB);   /* every accumulation tail: first, middle, last */
    check_inject(&d, PREC_FP16);
    check_inject(&d, PREC_FP32);
    if (g_gpu == TRAIN_DEVICE_CUDA) check_300_steps(&d);
    dataset_free(&d.train);
    dataset_free(&d.dev);
    return gpu_check_summary();
}
