/* tests/test_trainer.c — the shared training loop (runtime/train/trainer.h) on
 * the cpu backend: the injected-inf hook skips exactly its step, the device
 * switch falls back to the cpu and says why, weights_out returns the trained
 * weights, and grad_accum averages micro-batches (A = 2 with half the batch
 * takes the same first step as A = 1 on the whole batch, up to rounding).
 * The GPU twin of these checks is tests/gpu/gpu_train.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "train/init.h"
#include "cpu/cpu_threads.h"
#include "cpu/philox.h"
#include "lower.h"
#include "data/synthetic.h"
#include "train/trainer.h"

static void tiny(ModelSpec *s, int64_t steps)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "bert_tiny");
    s->stack.hidden = 32;
    s->stack.layers = 1;
    s->stack.heads = 2;
    s->stack.ffn = 64;
    s->stack.vocab_size = 64;
    s->stack.max_positions = 64;
    s->stack.hidden_dropout = 0;
    s->stack.attention_dropout = 0;
    s->head.classifier_dropout = 0;
    s->train.lr = 1e-3;
    s->train.batch_size = 16;
    s->train.max_seq_len = 16;
    s->train.seed = 3;
    s->train.steps = steps;
    s->train.epochs = 0;
    s->train.schedule = SCHED_CONSTANT;
    s->train.warmup_ratio = 0;
}

static Dataset g_train, g_dev;

static void data(void)
{
    HpcError err = {0};
    dataset_init(&g_train, "t");
    dataset_init(&g_dev, "d");
    cr_assert_eq(synthetic_make(SYN_CONTAINS, &g_train, 256, 64, 16, 1, false, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(synthetic_make(SYN_CONTAINS, &g_dev, 64, 64, 16, 2, false, &err), HPC_OK, "%s", err.msg);
}

static void data_free(void)
{
    dataset_free(&g_train);
    dataset_free(&g_dev);
}

TestSuite(trainer, .init = data, .fini = data_free);

Test(trainer, injected_inf_skips_exactly_that_step)
{
    ModelSpec s;
    tiny(&s, 6);
    TrainOptions o = {.policy = PREC_FP16, .inject_inf_step = 3};
    TrainResult r;
    HpcError err = {0};
    cr_assert_eq(trainer_run(&s, &g_train, &g_dev, &o, &r, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(r.skipped, 1);
    cr_expect_eq(r.last_skipped_step, 3);
    cr_expect_eq(r.final_scale, 32768.0);
    cr_expect_eq(r.steps, 6);
    cr_expect(isfinite(r.last_loss));
}

Test(trainer, auto_without_gpu_says_cpu)
{
    setenv("HPC_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
    ModelSpec s;
    tiny(&s, 1);
    TrainOptions o = {.device = TRAIN_DEVICE_AUTO};
    TrainResult r;
    HpcError err = {0};
    cr_assert_eq(trainer_run(&s, &g_train, NULL, &o, &r, &err), HPC_OK, "%s", err.msg);
    cr_expect(strncmp(r.backend, "cpu (no usable GPU: ", 20) == 0, "%s", r.backend);
    o.device = TRAIN_DEVICE_CUDA;
    cr_expect_eq(trainer_run(&s, &g_train, NULL, &o, &r, &err), HPC_ERR_NO_GPU, "%s", err.msg);
}

/* Returns the weights after `steps` (caller frees with free_weights). */
static float **train_weights(const ModelSpec *s, ParamList *pl)
{
    IrGraph g;
    HpcError err = {0};
    ir_init(&g);
    params_init(pl);
    cr_assert_eq(lower_model(s, &g, pl, &err), HPC_OK);
    ir_free(&g);
    float **w = calloc((size_t)pl->n, sizeof *w);
    for (int p = 0; p < pl->n; p++) w[p] = calloc((size_t)params_numel(&pl->p[p]), sizeof(float));
    TrainOptions o = {.weights_out = w};
    TrainResult r;
    cr_assert_eq(trainer_run(s, &g_train, NULL, &o, &r, &err), HPC_OK, "%s", err.msg);
    return w;
}

static void free_weights(float **w, ParamList *pl)
{
    for (int p = 0; p < pl->n; p++) free(w[p]);
    free(w);
    params_free(pl);
}

/* One SGD step (update = lr * mean gradient): A = 2 micro-batches of 8 rows
 * against one batch of 16.  The loader's order differs with the batch size,
 * so the data are made to be the same rows: 16 rows, one epoch. */
Test(trainer, grad_accum_averages_micro_batches)
{
    Dataset small;
    HpcError err = {0};
    dataset_init(&small, "s");
    cr_assert_eq(synthetic_make(SYN_CONTAINS, &small, 16, 64, 16, 5, false, &err), HPC_OK);
    Dataset keep = g_train;
    g_train = small;
    ModelSpec a, b;
    tiny(&a, 1);
    a.train.optimizer = OPT_SGD;
    a.train.lr = 0.5;
    a.train.momentum = 0;
    a.train.max_grad_norm = 0;
    b = a;
    b.train.batch_size = 8;
    b.train.grad_accum = 2;
    ParamList pa, pb;
    float **wa = train_weights(&a, &pa), **wb = train_weights(&b, &pb);
    ParamStore w0;
    cr_assert_eq(init_store(&w0, &pa, a.train.seed, &err), HPC_OK);
    double d = 0, u = 0;
    for (int p = 0; p < pa.n; p++)
        for (int64_t i = 0; i < params_numel(&pa.p[p]); i++) {
            d += pow((double)wa[p][i] - wb[p][i], 2);
            u += pow((double)wa[p][i] - w0.w[p][i], 2);
        }
    cr_expect(u > 0, "the step changed nothing");
    cr_expect(sqrt(d / u) < 1e-3, "update rel diff %.3g (A=2 x 8 rows vs A=1 x 16 rows)", sqrt(d / u));
    init_store_free(&w0);
    free_weights(wa, &pa);
    free_weights(wb, &pb);
    g_train = keep;
    dataset_free(&small);
}

/* Parameter init runs on every core; each value is still normal(seed, its
 * index, the parameter's index) * 0.02, the same bits on any thread count. */
Test(trainer, init_is_the_same_on_any_thread_count)
{
    ParamInfo p = {.name = "w", .rank = 2, .dims = {300, 1001}, .init = PARAM_INIT_NORMAL, .tied_to = -1};
    int64_t n = 300 * 1001;
    float *one = malloc((size_t)n * sizeof *one), *three = malloc((size_t)n * sizeof *three);
    cpu_threads_set(1);
    init_param_f32(&p, 7, one, 42);
    cpu_threads_set(3);
    init_param_f32(&p, 7, three, 42);
    cpu_threads_set(0);
    cr_assert(memcmp(one, three, (size_t)n * sizeof *one) == 0, "1 and 3 threads differ");
    const int64_t at[] = {0, 1, 65535, 65536, n - 1};
    for (size_t k = 0; k < sizeof at / sizeof at[0]; k++) {
        float want = (float)(INIT_STD * philox_normal(42, (uint64_t)at[k], 7));
        cr_assert(memcmp(&one[at[k]], &want, sizeof want) == 0, "element %lld", (long long)at[k]);
    }
    double sq = 0;
    for (int64_t i = 0; i < n; i++) sq += (double)one[i] * one[i];
    cr_expect(fabs(sqrt(sq / n) - INIT_STD) < 1e-3 * 5, "std %g", sqrt(sq / n));
    free(one), free(three);
}
