/* tests/test_dp_train.c — data-parallel training through the trainer on the
 * cpu backend (runtime/train/trainer.h coll/zero1, runtime/dist/): the ranks
 * are threads of this process over the local collectives (coll_local).
 *
 * The model is models/bert_tiny.model (4.4M parameters) on 120 synthetic
 * rows of up to 16 tokens, a global batch of 12 (10 batches an epoch, so
 * 50 steps cross 5 epochs and 5 reshuffles), all in f32 (policy fp32).
 * Dropout is off: the cpu executor draws a mask element by its index inside
 * the batch it runs (seed, micro-step, index), so rank 1's row 0 would get
 * the mask of the single process's row 0, not of its row 6; drawing by
 * global row would need the row offset inside the compiled step (compiler/,
 * not this change).  Without dropout both runs compute the same function.
 *
 * The bound.  1 rank with batch 12 and 2 ranks with batch 6 each compute
 * the same mean gradient, but summed in another order (each rank's GEMMs
 * and reductions run over its 6 rows, then the two halves are added and
 * halved), so every gradient element differs by a few f32 ulps; AdamW
 * turns the update into roughly m / sqrt(v), which keeps such relative
 * differences relative, and 50 steps add them up.  The test takes the
 * largest weight difference over all tensors relative to the largest
 * weight: the measured values are printed (2.4e-6 for 2 ranks, 3.8e-6 and
 * 7.0e-6 for the resumed runs when this was written); the bound, 2e-5, is
 * about 170 f32 epsilons (1.2e-7) and still far below what a data
 * or an averaging mistake does (other rows in the batches move the weights
 * by 9e-3 relative after 10 steps: the `detects` test checks that this
 * is caught).
 */
#include <criterion/criterion.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "data/dataset.h"
#include "data/synthetic.h"
#include "dist/collectives.h"
#include "lower.h"
#include "train/trainer.h"
#include "compiler/spec_load.h"

#define ROWS 120
#define GLOBAL_BATCH 12
#define BOUND 2e-5

typedef struct {
    ModelSpec spec;
    Dataset train;
    ParamList pl;
    IrGraph g;
} Setup;

static void setup(Setup *s, int64_t steps)
{
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/models/bert_tiny.model", root ? root : ".");
    cr_assert_eq(spec_load(path, &s->spec, stderr), 0, "%s did not load", path);
    ModelSpec *m = &s->spec;
    m->stack.hidden_dropout = m->stack.attention_dropout = m->head.classifier_dropout = 0;
    m->train.batch_size = GLOBAL_BATCH;
    m->train.max_seq_len = 16;
    m->train.steps = steps;
    m->train.epochs = 0;
    m->train.seed = 5;
    HpcError err = {0};
    dataset_init(&s->train, "dp/train");
    cr_assert_eq(synthetic_make(SYN_CONTAINS, &s->train, ROWS, 64, 16, 3, false, &err), HPC_OK, "%s", err.msg);
    ir_init(&s->g);
    params_init(&s->pl);
    cr_assert_eq(lower_model(m, &s->g, &s->pl, &err), HPC_OK, "%s", err.msg);
}

static void teardown(Setup *s)
{
    dataset_free(&s->train);
    params_free(&s->pl);
    ir_free(&s->g);
}

static float **weights(const Setup *s)
{
    float **w = calloc((size_t)s->pl.n, sizeof *w);
    for (int i = 0; i < s->pl.n; i++)
        if (s->pl.p[i].tied_to < 0) w[i] = calloc((size_t)params_numel(&s->pl.p[i]), sizeof(float));
    return w;
}

static void weights_free(const Setup *s, float **w)
{
    for (int i = 0; i < s->pl.n; i++) free(w[i]);
    free(w);
}

/* max |a - b| over every weight, relative to max |b|. */
static double rel_diff(const Setup *s, float **a, float **b)
{
    double d = 0, big = 0;
    for (int i = 0; i < s->pl.n; i++)
        for (int64_t k = 0; a[i] && k < params_numel(&s->pl.p[i]); k++) {
            double x = a[i][k], y = b[i][k];
            if (isnan(x) || isnan(y)) return INFINITY;
            d = fmax(d, fabs(x - y));
            big = fmax(big, fabs(y));
        }
    return d / big;
}

static bool same_bits(const Setup *s, float **a, float **b)
{
    for (int i = 0; i < s->pl.n; i++)
        if (a[i] && memcmp(a[i], b[i], (size_t)params_numel(&s->pl.p[i]) * sizeof(float)) != 0) return false;
    return true;
}

/* ---- running a world of ranks as threads ---- */
typedef struct {
    const Setup *s;
    TrainOptions o;
    TrainResult r;
    HpcError err;
    HpcStatus st;
    Collectives c;
} Rank;

static void *rank_main(void *arg)
{
    Rank *k = arg;
    k->o.coll = &k->c;
    k->st = trainer_run(&k->s->spec, &k->s->train, NULL, &k->o, &k->r, &k->err);
    k->c.close(&k->c);
    return NULL;
}

/* world ranks with base's options (rank r's weights into w[r]); inject_rank
 * alone gets base's inject_inf_step. */
static void run_world(const Setup *s, int world, const TrainOptions *base, int inject_rank, float ***w, Rank *ranks)
{
    CollLocalWorld *lw;
    HpcError err = {0};
    cr_assert_eq(coll_local_world_new(world, 120.0, &lw, &err), HPC_OK, "%s", err.msg);
    pthread_t th[4];
    for (int r = 0; r < world; r++) {
        ranks[r] = (Rank){.s = s, .o = *base};
        ranks[r].o.weights_out = w[r];
        if (r != inject_rank) ranks[r].o.inject_inf_step = 0;
        coll_local_join(lw, r, &ranks[r].c);
    }
    for (int r = 0; r < world; r++) pthread_create(&th[r], NULL, rank_main, &ranks[r]);
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
    coll_local_world_free(lw);
    for (int r = 0; r < world; r++) cr_assert_eq(ranks[r].st, HPC_OK, "rank %d: %s", r, ranks[r].err.msg);
}

static void run_single(const Setup *s, const TrainOptions *base, float **w, TrainResult *r)
{
    TrainOptions o = *base;
    o.weights_out = w;
    HpcError err = {0};
    cr_assert_eq(trainer_run(&s->spec, &s->train, NULL, &o, r, &err), HPC_OK, "%s", err.msg);
}

static const TrainOptions BASE = {.policy = PREC_FP32, .device = TRAIN_DEVICE_CPU};

static void tmp_dir(char *out, size_t cap, const char *tag)
{
    snprintf(out, cap, "/tmp/hpc_dp_%s_%d", tag, (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", out);
    cr_assert_eq(system(cmd), 0);
}

/* 2 ranks x batch 6 = 1 rank x batch 12 within BOUND; ranks bitwise equal;
 * ZeRO-1 the same. */
Test(dp_train, two_ranks_equal_one_with_double_batch, .timeout = 900)
{
    Setup s;
    setup(&s, 50);
    float **one = weights(&s), **rep[2] = {weights(&s), weights(&s)}, **z1[2] = {weights(&s), weights(&s)};
    TrainResult r1;
    run_single(&s, &BASE, one, &r1);
    cr_assert_eq(r1.steps, 50);
    cr_assert(r1.last_loss < r1.first_loss, "1 rank did not train: %g -> %g", r1.first_loss, r1.last_loss);
    Rank ranks[2];
    run_world(&s, 2, &BASE, -1, rep, ranks);
    cr_expect(same_bits(&s, rep[0], rep[1]), "replicated: the ranks' weights differ");
    double d_rep = rel_diff(&s, rep[0], one);
    cr_expect_eq(ranks[0].r.steps, 50);
    cr_expect(fabs(ranks[0].r.last_loss - r1.last_loss) <= 1e-4 * fabs(r1.last_loss),
              "logged loss (mean over ranks) %.9g vs 1 rank %.9g", ranks[0].r.last_loss, r1.last_loss);
    TrainOptions z = BASE;
    z.zero1 = true;
    run_world(&s, 2, &z, -1, z1, ranks);
    cr_expect(same_bits(&s, z1[0], z1[1]), "zero1: the ranks' weights differ");
    double d_z1 = rel_diff(&s, z1[0], one);
    fprintf(stderr, "dp_train: 2 ranks vs 1 rank after 50 steps, max |dw| / max |w|: replicated %.3g, zero1 %.3g "
            "(bound %.0e)\n", d_rep, d_z1, BOUND);
    cr_expect(d_rep <= BOUND, "replicated: %g > %g", d_rep, BOUND);
    cr_expect(d_z1 <= BOUND, "zero1: %g > %g", d_z1, BOUND);
    weights_free(&s, one);
    for (int r = 0; r < 2; r++) weights_free(&s, rep[r]), weights_free(&s, z1[r]);
    teardown(&s);
}

/* Lines of the JSONL log at path with "event":"step". */
static int step_lines(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "no log %s", path);
    char line[4096];
    int n = 0;
    while (fgets(line, sizeof line, f)) n += strstr(line, "\"event\":\"step\"") != NULL;
    fclose(f);
    return n;
}

/* An inf in rank 1's gradient before step 7: both ranks skip step 7 only.
 * Both ranks are given the same --log: rank 0 alone writes it. */
Test(dp_train, inf_on_one_rank_skips_on_both, .timeout = 600)
{
    Setup s;
    setup(&s, 12);
    float **w[2] = {weights(&s), weights(&s)};
    TrainOptions o = BASE;
    o.inject_inf_step = 7;
    char log[256];
    snprintf(log, sizeof log, "/tmp/hpc_dp_log_%d.jsonl", (int)getpid());
    o.jsonl = log;
    Rank ranks[2];
    for (int zero1 = 0; zero1 < 2; zero1++) {
        o.zero1 = zero1;
        run_world(&s, 2, &o, 1, w, ranks);
        cr_expect_eq(step_lines(log), 12, "the log has %d step lines, not rank 0's 12", step_lines(log));
        for (int r = 0; r < 2; r++) {
            cr_expect_eq(ranks[r].r.skipped, 1, "zero1 %d rank %d skipped %lld steps", zero1, r,
                         (long long)ranks[r].r.skipped);
            cr_expect_eq(ranks[r].r.last_skipped_step, 7, "zero1 %d rank %d", zero1, r);
        }
        cr_expect(ranks[0].r.final_scale == ranks[1].r.final_scale);
        cr_expect(same_bits(&s, w[0], w[1]), "zero1 %d: the ranks' weights differ after the skip", zero1);
    }
    unlink(log);
    weights_free(&s, w[0]);
    weights_free(&s, w[1]);
    teardown(&s);
}

/* The data position in a checkpoint's state.json, as "epoch/cursor". */
static void saved_position(const char *dir, int64_t step, char *out, size_t cap)
{
    char path[600];
    snprintf(path, sizeof path, "%s/step-%08lld/state.json", dir, (long long)step);
    json_error_t je;
    json_t *root = json_load_file(path, 0, &je);
    cr_assert_not_null(root, "%s: %s", path, je.text);
    json_t *ld = json_object_get(root, "loader");
    cr_assert(json_is_object(ld), "%s has no loader position", path);
    snprintf(out, cap, "%lld/%lld", (long long)json_integer_value(json_object_get(ld, "epoch")),
             (long long)json_integer_value(json_object_get(ld, "cursor")));
    json_decref(root);
}

/* A ZeRO-1 checkpoint of 2 ranks after 17 steps (epoch 1, row 84) resumes
 * on 1 rank and on 3 ranks (batch 4 each) and lands within BOUND of the
 * uninterrupted 1-rank run; its data position is the 1-rank run's. */
Test(dp_train, checkpoint_of_two_resumes_on_one_and_three, .timeout = 900)
{
    Setup s;
    setup(&s, 50);
    char dir2[256], dir1[256], dir3[256];
    tmp_dir(dir2, sizeof dir2, "two");
    tmp_dir(dir1, sizeof dir1, "one");
    tmp_dir(dir3, sizeof dir3, "three");
    float **full = weights(&s), **w[3] = {weights(&s), weights(&s), weights(&s)};
    TrainResult r1;
    TrainOptions o = BASE;
    o.checkpoint_dir = dir1;
    o.stop_after = 17;
    run_single(&s, &o, full, &r1);   /* the 1-rank checkpoint: the reference data position */
    o = BASE;
    run_single(&s, &o, full, &r1);   /* the uninterrupted 1-rank run */

    Rank ranks[3];
    o.zero1 = true;
    o.checkpoint_dir = dir2;
    o.stop_after = 17;
    run_world(&s, 2, &o, -1, w, ranks);
    cr_assert_str_eq(ranks[0].r.saved[0] ? "saved" : "", "saved");
    cr_expect_eq(ranks[1].r.saved[0], 0, "rank 1 wrote %s", ranks[1].r.saved);
    char pos1[64], pos2[64];
    saved_position(dir1, 17, pos1, sizeof pos1);
    saved_position(dir2, 17, pos2, sizeof pos2);
    cr_expect_str_eq(pos2, pos1, "2-rank data position %s, 1-rank %s", pos2, pos1);
    cr_expect_str_eq(pos1, "1/84");

    o = BASE;
    o.resume_dir = dir2;
    TrainResult rr;
    run_single(&s, &o, w[0], &rr);
    cr_expect_eq(rr.resumed_from, 17);
    double d1 = rel_diff(&s, w[0], full);

    o.checkpoint_dir = dir3;
    o.zero1 = true;            /* 3 slices taken from the whole state the 2 ranks gathered */
    run_world(&s, 3, &o, -1, w, ranks);
    cr_expect_eq(ranks[2].r.resumed_from, 17);
    cr_expect(same_bits(&s, w[0], w[1]) && same_bits(&s, w[0], w[2]), "3 ranks: the weights differ");
    double d3 = rel_diff(&s, w[0], full);
    fprintf(stderr, "dp_train: 2-rank zero1 checkpoint at step 17 resumed to 50, vs 1 rank uninterrupted: "
            "on 1 rank %.3g, on 3 ranks %.3g (bound %.0e)\n", d1, d3, BOUND);
    cr_expect(d1 <= BOUND, "resumed on 1: %g > %g", d1, BOUND);
    cr_expect(d3 <= BOUND, "resumed on 3: %g > %g", d3, BOUND);
    weights_free(&s, full);
    for (int r = 0; r < 3; r++) weights_free(&s, w[r]);
    char cmd[900];
    snprintf(cmd, sizeof cmd, "rm -rf %s %s %s", dir1, dir2, dir3);
    cr_expect_eq(system(cmd), 0);
    teardown(&s);
}

/* The bound can fail: the same rows in another file order (so other rows
 * in every batch, the same initial weights) land far outside it. */
Test(dp_train, detects_other_batches, .timeout = 600)
{
    Setup s;
    setup(&s, 10);
    float **a = weights(&s), **b[2] = {weights(&s), weights(&s)};
    TrainResult r1;
    run_single(&s, &BASE, a, &r1);
    for (int64_t i = 0; i < s.train.n / 2; i++) {   /* reverse the rows */
        Example x = s.train.ex[i];
        s.train.ex[i] = s.train.ex[s.train.n - 1 - i];
        s.train.ex[s.train.n - 1 - i] = x;
    }
    Rank ranks[2];
    run_world(&s, 2, &BASE, -1, b, ranks);
    double d = rel_diff(&s, b[0], a);
    fprintf(stderr, "dp_train: other batches after 10 steps: %.3g\n", d);
    cr_expect(d > 100 * BOUND, "other data moved the weights only %g", d);
    weights_free(&s, a);
    weights_free(&s, b[0]);
    weights_free(&s, b[1]);
    teardown(&s);
}

/* A global batch that does not divide among the ranks: every rank refuses
 * it with the remedy, none hangs. */
Test(dp_train, batch_that_does_not_divide_is_refused, .timeout = 300)
{
    Setup s;
    setup(&s, 2);
    s.spec.train.batch_size = 10;   /* 10 rows over 3 ranks */
    CollLocalWorld *lw;
    HpcError err = {0};
    cr_assert_eq(coll_local_world_new(3, 10.0, &lw, &err), HPC_OK);
    Rank ranks[3];
    pthread_t th[3];
    for (int r = 0; r < 3; r++) {
        ranks[r] = (Rank){.s = &s, .o = BASE};
        coll_local_join(lw, r, &ranks[r].c);
    }
    for (int r = 0; r < 3; r++) pthread_create(&th[r], NULL, rank_main, &ranks[r]);
    for (int r = 0; r < 3; r++) pthread_join(th[r], NULL);
    coll_local_world_free(lw);
    for (int r = 0; r < 3; r++) {
        cr_expect_eq(ranks[r].st, HPC_ERR_USAGE, "rank %d: %s", r, ranks[r].err.msg);
        cr_expect(strstr(ranks[r].err.msg, "divide"), "rank %d: %s", r, ranks[r].err.msg);
    }
    teardown(&s);
}

/* ---- hpc run --gpus (the real binary; no GPU is needed for these) ---- */

/* Runs `ENV bin/hpc ARGS` from the repository root; output into out; the exit code. */
static int hpc(const char *env, const char *args, char *out, size_t cap)
{
    const char *root = getenv("HPC_ROOT") ? getenv("HPC_ROOT") : ".";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "cd %s && env %s bin/hpc %s 2>&1", root, env, args);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen");
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(dp_cli, gpus_with_the_cpu_device_is_a_usage_error)
{
    char out[8192];
    int rc = hpc("", "run models/bert_tiny.model --device cpu --gpus 2 --steps 1", out, sizeof out);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "--device cpu trains in one process") && strstr(out, "--gpus 2"), "%s", out);
    rc = hpc("RANK=1 WORLD_SIZE=2 HPC_RENDEZVOUS=file:/tmp/hpc_dp_unused", "run models/bert_tiny.model --device cpu "
             "--steps 1", out, sizeof out);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "WORLD_SIZE 2"), "%s", out);
}

Test(dp_cli, gpus_against_world_size_is_a_usage_error)
{
    char out[8192];
    int rc = hpc("RANK=0 WORLD_SIZE=2 HPC_RENDEZVOUS=file:/tmp/hpc_dp_unused", "run models/bert_tiny.model --gpus 3 "
                 "--steps 1", out, sizeof out);
    cr_expect_eq(rc, 2, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "--gpus 3, but WORLD_SIZE=2"), "%s", out);
}

/* Without a GPU (CI): more GPUs than the host has is refused before any rank starts. */
Test(dp_cli, gpus_without_enough_gpus_names_what_is_missing)
{
    char out[8192];
    int rc = hpc("HPC_CUDA_DRIVER=/nonexistent/libcuda.so.1", "run models/bert_tiny.model --gpus 2 --steps 1", out,
                 sizeof out);
    cr_expect_eq(rc, HPC_ERR_NO_GPU, "exit %d: %s", rc, out);
    cr_expect(strstr(out, "--gpus 2 needs 2 GPUs") && strstr(out, "libcuda"), "%s", out);
}
