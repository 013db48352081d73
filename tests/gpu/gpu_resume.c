/* tests/gpu/gpu_resume.c — checkpoint and resume on the cuda backend
 * (TrainBackend.state_out/state_in of runtime/train/train_cuda.c).
 *
 * A tiny BERT (vocab 64, hidden 32, 2 layers, dropout 0.1, fp16, grad_accum
 * 2, an injected inf gradient at step 4) trains 12 steps in one go (A),
 * then 5 steps saving a checkpoint (B), then resumes B to step 12 (C), and
 * runs A twice more (A2, A3).  C's loss scale and last loss must equal A's,
 * and each final weight tensor of C must be as close to the nearest of A,
 * A2, A3 as those three are to each other (within 4x their largest pairwise
 * distance, or within 1e-5 relative L2 where they are closer than that):
 * with one re-run only, a tensor whose two plain runs happened to agree
 * closely failed a correct resume now and then (query.bias: 1.4e-4 after
 * resume, 7.2e-6 between A and A2, in 1 of 3 runs on an H200).  GPU runs
 * are not bitwise reproducible (the embedding backward adds with float
 * atomics), and since fp16 keeps the embeddings and the residual stream in
 * f32 (2026-12-01) that noise reaches every layer: the attention key
 * biases, whose true gradient is 0, take AdamW steps of about lr from noise
 * alone, so two plain runs differ there by ~4e-2 (measured on an H200:
 * key.bias 0.035 between A and A2, 0.079 between A and C) while the other
 * tensors agree far closer.  A resume that lost state would differ far
 * beyond the re-run spread (on the emulator, which runs bitwise
 * reproducibly, a resume with its step counter one ahead puts every tensor
 * 3e-4 to 0.6 away).  Whether C is bitwise A is printed, and each tensor
 * beyond its limit with the three plain runs' distances: the check has
 * failed twice in many runs on a GPU (worst ratios 1.29 and 2.04, passing
 * when rerun alone), and the next failure should say which tensor.
 *
 * Exit 0 when every check passes, 1 on a failed check, 4 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cuda/cuda_driver.h"
#include "lower.h"
#include "data/synthetic.h"
#include "train/trainer.h"
#include "gpu_check.h"   /* gpu_check_rel_l2 */

static int g_fail;

static void check(int ok, const char *what, double detail)
{
    printf("%s %s (%.3g)\n", ok ? "ok  " : "FAIL", what, detail);
    g_fail += !ok;
}

int main(void)
{
    CudaDevice d;
    HpcError err = {0};
    if (cuda_device_open(&d, 0, &err)) {
        printf("skip: %s\n", err.msg);
        return 4;
    }
    cuda_device_close(&d);
    ModelSpec m;
    spec_defaults(&m);
    snprintf(m.name, sizeof m.name, "resume_tiny");
    m.stack.vocab_size = 64; m.stack.max_positions = 64; m.stack.hidden = 32; m.stack.layers = 2;
    m.stack.heads = 2; m.stack.ffn = 64;
    m.train.batch_size = 16; m.train.grad_accum = 2; m.train.max_seq_len = 16; m.train.seed = 11;
    m.train.steps = 12; m.train.epochs = 0; m.train.lr = 1e-3;
    Dataset train, dev;
    dataset_init(&train, "resume/train");
    dataset_init(&dev, "resume/dev");
    if (synthetic_make(SYN_CONTAINS, &train, 100, 64, 16, 1, false, &err) ||
        synthetic_make(SYN_CONTAINS, &dev, 40, 64, 16, 2, false, &err)) {
        printf("FAIL data: %s\n", err.msg);
        return 1;
    }
    IrGraph g; ParamList pl;
    ir_init(&g); params_init(&pl);
    if (lower_model(&m, &g, &pl, &err)) { printf("FAIL lower: %s\n", err.msg); return 1; }
    float **wa = calloc((size_t)pl.n, sizeof *wa), **wc = calloc((size_t)pl.n, sizeof *wc);
    float **wa2 = calloc((size_t)pl.n, sizeof *wa2), **wa3 = calloc((size_t)pl.n, sizeof *wa3);
    for (int i = 0; i < pl.n; i++)
        if (pl.p[i].tied_to < 0) {
            wa[i] = calloc((size_t)params_numel(&pl.p[i]), 4);
            wc[i] = calloc((size_t)params_numel(&pl.p[i]), 4);
            wa2[i] = calloc((size_t)params_numel(&pl.p[i]), 4);
            wa3[i] = calloc((size_t)params_numel(&pl.p[i]), 4);
        }
    char dir[128];
    snprintf(dir, sizeof dir, "/tmp/gpu_resume_%d", (int)getpid());
    TrainResult ra, rb, rc;
    TrainOptions a = {.device = TRAIN_DEVICE_CUDA, .policy = PREC_FP16, .inject_inf_step = 4, .weights_out = wa};
    TrainOptions b = a;
    b.weights_out = NULL; b.checkpoint_dir = dir; b.stop_after = 5;
    TrainOptions c = a;
    c.weights_out = wc; c.resume_dir = dir;
    TrainOptions a2 = a, a3 = a;   /* A again, no checkpoint: the run-to-run spread (float atomics) */
    a2.weights_out = wa2;
    a3.weights_out = wa3;
    TrainResult ra2, ra3;
    if (trainer_run(&m, &train, &dev, &a, &ra, &err) || trainer_run(&m, &train, &dev, &b, &rb, &err) ||
        trainer_run(&m, &train, &dev, &c, &rc, &err) || trainer_run(&m, &train, &dev, &a2, &ra2, &err) ||
        trainer_run(&m, &train, &dev, &a3, &ra3, &err)) {
        printf("FAIL trainer: %s\n", err.msg);
        return 1;
    }
    printf("backend %s; A: %lld steps, %lld skipped; C resumed from %lld\n", ra.backend, (long long)ra.steps,
           (long long)ra.skipped, (long long)rc.resumed_from);
    double worst = 0, spread = 0, worst_excess = 0;
    int identical = 1, worst_at = -1, spread_at = -1, beyond = 0, excess_at = -1;
    double excess_rel = 0, excess_rel2 = 0;
    for (int i = 0; i < pl.n; i++) {
        if (!wa[i]) continue;
        int64_t n = params_numel(&pl.p[i]);
        identical &= memcmp(wa[i], wc[i], (size_t)n * 4) == 0;
        /* rel: C to the nearest plain run; rel2: the plain runs' largest spread */
        double rel = fmin(gpu_check_rel_l2(wc[i], wa[i], n),
                          fmin(gpu_check_rel_l2(wc[i], wa2[i], n), gpu_check_rel_l2(wc[i], wa3[i], n)));
        double rel2 = fmax(gpu_check_rel_l2(wa2[i], wa[i], n),
                           fmax(gpu_check_rel_l2(wa3[i], wa[i], n), gpu_check_rel_l2(wa3[i], wa2[i], n)));
        if (!(rel <= worst)) { worst = rel; worst_at = i; }   /* NaN becomes the worst */
        if (!(rel2 <= spread)) { spread = rel2; spread_at = i; }
        double allowed = fmax(1e-5, 4 * rel2);
        if (!(rel <= allowed)) {   /* NaN counts; each one named, so a rare failure says where */
            beyond++;
            printf("beyond its limit: %s: after resume %.3g, A run three times %.3g (A-A2 %.3g, A-A3 %.3g, "
                   "A2-A3 %.3g)\n", pl.p[i].name, rel, rel2, gpu_check_rel_l2(wa2[i], wa[i], n),
                   gpu_check_rel_l2(wa3[i], wa[i], n), gpu_check_rel_l2(wa3[i], wa2[i], n));
        }
        if (!(rel / allowed <= worst_excess)) {
            worst_excess = rel / allowed;
            excess_at = i;
            excess_rel = rel;
            excess_rel2 = rel2;
        }
    }
    /* Which tensor, and how far two uninterrupted runs of A already are:
     * a resume that loses state differs far beyond that spread. */
    printf("worst tensor after resume: %s (%.3g); A run three times: worst %s (%.3g)\n",
           worst_at >= 0 ? pl.p[worst_at].name : "-", worst, spread_at >= 0 ? pl.p[spread_at].name : "-", spread);
    printf("closest to its limit: %s (after resume %.3g, A run three times %.3g)\n",
           excess_at >= 0 ? pl.p[excess_at].name : "-", excess_rel, excess_rel2);
    check(rc.resumed_from == 5 && rc.steps == 12, "resumed after step 5 and ran to 12", (double)rc.resumed_from);
    check(ra.skipped == 1 && rc.skipped == 1, "the injected step skipped in both", (double)rc.skipped);
    check(ra.final_scale == rc.final_scale, "final loss scale equal", rc.final_scale);
    check(fabs(ra.last_loss - rc.last_loss) <= 1e-5 * fabs(ra.last_loss), "last loss equal", rc.last_loss - ra.last_loss);
    check(beyond == 0, "final weights within the re-run spread (worst ratio to max(1e-5, 4 x spread))",
          worst_excess);
    printf("weights bitwise identical: %s\n", identical ? "yes" : "no");
    char cmd[200];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) printf("note: could not remove %s\n", dir);
    return g_fail ? 1 : 0;
}
