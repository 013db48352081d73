/* tests/test_dist.c — data-parallel training logic on the cpu with the
 * in-process collectives (runtime/dist/): collectives agree bit for bit and
 * never hang, rows and optimizer state are divided exactly, and a small
 * model trained on 2 ranks equals one rank with the doubled batch to within
 * fp32 reduction-order noise, with bitwise-identical ranks, the same skipped
 * steps for an inf on one rank, and checkpoints that resume on another
 * number of ranks. */
#include <criterion/criterion.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dist/collectives.h"
#include "dist/dp_optim.h"
#include "dist/launch.h"
#include "dist/rendezvous.h"
#include "dist/shard.h"
#include "train/lossscale.h"

/* ---- running one function per rank on threads ---- */
typedef struct RankCtx RankCtx;
typedef void (*RankFn)(RankCtx *);
struct RankCtx {
    Collectives c;
    RankFn fn;
    void *shared;
    HpcStatus st;
    HpcError err;
};

static void *rank_main(void *arg)
{
    RankCtx *r = arg;
    r->fn(r);
    r->c.close(&r->c);
    return NULL;
}

static void run_world(int world, double timeout, RankFn fn, void *shared, RankCtx *ranks)
{
    CollLocalWorld *w;
    HpcError err;
    cr_assert_eq(coll_local_world_new(world, timeout, &w, &err), HPC_OK);
    pthread_t th[16];
    for (int r = 0; r < world; r++) {
        ranks[r] = (RankCtx){ .fn = fn, .shared = shared };
        coll_local_join(w, r, &ranks[r].c);
        pthread_create(&th[r], NULL, rank_main, &ranks[r]);
    }
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
    coll_local_world_free(w);
}

/* ---- collectives ---- */
static void sum_fn(RankCtx *r)
{
    float x[1000];
    for (int i = 0; i < 1000; i++) x[i] = (float)sin(i * 0.37 + r->c.rank) * 1e3f + 0.1f * (float)r->c.rank;
    r->st = r->c.allreduce_sum_f32(&r->c, x, 1000, &r->err);
    memcpy((float *)r->shared + 1000 * r->c.rank, x, sizeof x);
}

Test(dist, allreduce_is_the_rank_ordered_sum_on_every_rank)
{
    enum { W = 3 };
    float *out = calloc(W * 1000, sizeof *out);
    RankCtx ranks[W];
    run_world(W, 10, sum_fn, out, ranks);
    for (int i = 0; i < 1000; i++) {
        float want = 0;
        for (int r = 0; r < W; r++) want += (float)sin(i * 0.37 + r) * 1e3f + 0.1f * (float)r;
        for (int r = 0; r < W; r++) {
            cr_assert_eq(ranks[r].st, HPC_OK, "%s", ranks[r].err.msg);
            cr_assert(memcmp(&out[1000 * r + i], &want, sizeof want) == 0, "rank %d element %d: %g vs %g",
                      r, i, out[1000 * r + i], want);
        }
    }
    free(out);
}

static void late_fn(RankCtx *r)
{
    double x = 1;
    if (r->c.rank == 1) return;              /* never arrives */
    r->st = r->c.allreduce_sum_f64(&r->c, &x, 1, &r->err);
}

Test(dist, a_missing_rank_times_out_with_a_message)
{
    RankCtx ranks[2];
    run_world(2, 0.3, late_fn, NULL, ranks);
    cr_assert_eq(ranks[0].st, HPC_ERR_IO);
    cr_assert(strstr(ranks[0].err.msg, "rank 0 waited 0.3 s for the other ranks in all-reduce (sum, f64)"),
              "%s", ranks[0].err.msg);
}

static void abort_fn(RankCtx *r)
{
    double x = 1;
    if (r->c.rank == 1) {
        r->c.abort(&r->c, "cannot open data/cola/train.tsv");
        return;
    }
    r->st = r->c.allreduce_max_f64(&r->c, &x, 1, &r->err);
}

Test(dist, a_failing_rank_stops_the_others_with_its_message)
{
    RankCtx ranks[2];
    run_world(2, 30, abort_fn, NULL, ranks);
    cr_assert_eq(ranks[0].st, HPC_ERR_IO);
    cr_assert(strstr(ranks[0].err.msg, "rank 1 stopped: cannot open data/cola/train.tsv"), "%s", ranks[0].err.msg);
}

static void agree_fn(RankCtx *r)
{
    bool global;
    r->st = dp_agree_found_inf(&r->c, r->c.rank == 2, &global, &r->err);
    ((bool *)r->shared)[r->c.rank] = global;
}

Test(dist, found_inf_on_one_rank_is_found_on_all)
{
    bool got[4] = { 0 };
    RankCtx ranks[4];
    run_world(4, 10, agree_fn, got, ranks);
    for (int r = 0; r < 4; r++) cr_assert(got[r] && ranks[r].st == HPC_OK, "rank %d", r);
}

/* ---- division of work ---- */
Test(dist, rows_of_a_global_batch_are_divided_exactly)
{
    HpcError err;
    int64_t off, n, next = 0;
    for (int r = 0; r < 4; r++) {
        cr_assert_eq(dist_rank_rows(32, r, 4, &off, &n, &err), HPC_OK);
        cr_assert_eq(off, next);
        next += n;
    }
    cr_assert_eq(next, 32);
    cr_assert_eq(dist_rank_rows(30, 0, 4, &off, &n, &err), HPC_ERR_USAGE);
    cr_assert_str_eq(err.msg, "batch 30 does not divide among 4 GPUs: use a multiple of 4 (each GPU takes "
                              "batch / 4 rows a step)");
}

Test(dist, slices_cover_the_parameters_once)
{
    int64_t total = 109483778;   /* BERT-base with a 2-label classifier */
    for (int world = 1; world <= 8; world++) {
        int64_t next = 0, len = dist_slice_len(total, world, 64);
        cr_assert_eq(len % 64, 0);
        for (int r = 0; r < world; r++) {
            DistSlice s = dist_slice(total, world, 64, r);
            cr_assert_eq(s.begin, next);
            cr_assert(s.end - s.begin <= len);
            next = s.end;
        }
        cr_assert_eq(next, total, "world %d", world);
    }
}

Test(dist, buckets_run_backwards_over_whole_parameters)
{
    int64_t numel[6] = { 10, 50, 5, 5, 30, 1 };
    DistBucket b[6];
    int n = dist_buckets(numel, 6, 40, b);
    cr_assert_eq(n, 3);
    /* a bucket closes once it holds bucket_elems or more */
    cr_assert(b[0].first == 2 && b[0].last == 5 && b[0].elems == 41);
    cr_assert(b[1].first == 1 && b[1].last == 1 && b[1].elems == 50);
    cr_assert(b[2].first == 0 && b[2].last == 0 && b[2].elems == 10);
}

/* ---- a small model trained data-parallel ----
 * Least squares y ~ X w with w held as three tensors (so ZeRO-1 slices cut
 * through tensors), AdamW with weight decay on two of them, gradients
 * multiplied by a loss scale of 1024 as the trainer's are. */
enum { ROWS = 96, DIM = 19, STEPS = 50, GB = 12 };
static const int64_t toy_numel[3] = { 7, 8, 4 };

typedef struct {
    int world;
    bool zero1;
    double max_norm;
    int inf_rank, inf_step;       /* inject +inf into this rank's gradient at this step */
    int start_step, end_step;     /* resume: steps (start, end] */
    float w_in[DIM], m_in[DIM], v_in[DIM];
    int64_t opt_step_in;
    LossScaler ls_in;
    /* results per rank */
    float w[8][DIM], m[8][DIM], v[8][DIM];
    int64_t opt_step[8], skipped[8];
    double scale[8];
} Toy;

static float toy_x(int row, int j) { return (float)sin(0.7 * row + 1.3 * j) + 0.05f * (float)j; }
static float toy_y(int row) { return (float)cos(0.45 * row); }

static void toy_rank(RankCtx *r)
{
    Toy *t = r->shared;
    int rank = r->c.rank;
    OptimConfig cfg = { .kind = OPT_ADAMW, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                        .max_grad_norm = t->max_norm, .low_dtype = PREC_FP16 };
    float w[DIM], grad[DIM], m[DIM], v[DIM];
    uint16_t low[DIM];
    memcpy(w, t->w_in, sizeof w);
    memcpy(m, t->m_in, sizeof m);
    memcpy(v, t->v_in, sizeof v);
    OptimState os = { t->opt_step_in };
    LossScaler ls = t->ls_in;
    DpOptim d;
    r->st = dp_optim_init(&d, &r->c, &cfg, toy_numel, 3, t->zero1, &r->err);
    if (r->st) return;
    if (t->zero1) dp_take_state(&d, m, v);
    float *gp[3] = { grad, grad + 7, grad + 15 };
    OptimTensor ten[3];
    for (int k = 0, off = 0; k < 3; off += (int)toy_numel[k], k++)
        ten[k] = (OptimTensor){ .master = w + off, .grad = grad + off, .m = t->zero1 ? NULL : m + off,
                                .v = t->zero1 ? NULL : v + off, .low = low + off, .n = toy_numel[k],
                                .decay = k != 2 };
    for (int step = t->start_step + 1; step <= t->end_step && !r->st; step++) {
        int64_t off, n;
        r->st = dist_rank_rows(GB, rank, t->world, &off, &n, &r->err);
        memset(grad, 0, sizeof grad);
        for (int64_t i = 0; i < n; i++) {        /* local mean gradient, times the loss scale */
            int row = (int)(((int64_t)step * GB + off + i) % ROWS);
            float e = -toy_y(row);
            for (int j = 0; j < DIM; j++) e += toy_x(row, j) * w[j];
            for (int j = 0; j < DIM; j++) grad[j] += (float)ls.scale * e * toy_x(row, j) / (float)n;
        }
        if (rank == t->inf_rank && step == t->inf_step) grad[3] = INFINITY;
        if (!r->st) r->st = dp_average_grads(&d, gp, &r->err);
        OptimReport rep;
        if (!r->st) r->st = dp_optim_step(&d, &cfg, &os, ten, (float)(1.0 / ls.scale), 1e-2, &rep, &r->err);
        if (!r->st) ls_update(&ls, rep.found_inf);
    }
    if (t->zero1 && !r->st) r->st = dp_gather_state(&d, m, v, &r->err);
    memcpy(t->w[rank], w, sizeof w);
    memcpy(t->m[rank], m, sizeof m);
    memcpy(t->v[rank], v, sizeof v);
    t->opt_step[rank] = os.step;
    t->skipped[rank] = ls.total_skips;
    t->scale[rank] = ls.scale;
    dp_optim_free(&d);
}

static void toy_init(Toy *t, int world, bool zero1)
{
    memset(t, 0, sizeof *t);
    t->world = world;
    t->zero1 = zero1;
    t->max_norm = 1.0;
    t->inf_rank = -1;
    t->end_step = STEPS;
    for (int j = 0; j < DIM; j++) t->w_in[j] = 0.1f * (float)sin(3.1 * j);
    LossScaleConfig lc;
    ls_config_default(&lc);
    lc.init = 1024;
    ls_init(&t->ls_in, &lc);
}

static void toy_run(Toy *t)
{
    RankCtx ranks[8];
    run_world(t->world, 30, toy_rank, t, ranks);
    for (int r = 0; r < t->world; r++) cr_assert_eq(ranks[r].st, HPC_OK, "rank %d: %s", r, ranks[r].err.msg);
}

static double max_rel_diff(const float *a, const float *b, int n)
{
    double worst = 0, scale = 0;
    for (int i = 0; i < n; i++) scale = fmax(scale, fabs(b[i]));
    for (int i = 0; i < n; i++) {
        cr_assert(isfinite(a[i]) && isfinite(b[i]), "element %d not finite", i);
        worst = fmax(worst, fabs((double)a[i] - b[i]) / scale);
    }
    return worst;
}

static void ranks_identical(const Toy *t)
{
    for (int r = 1; r < t->world; r++) {
        cr_assert(memcmp(t->w[r], t->w[0], sizeof t->w[0]) == 0, "rank %d's weights differ from rank 0's", r);
        cr_assert_eq(t->opt_step[r], t->opt_step[0]);
        cr_assert_eq(t->scale[r], t->scale[0]);
    }
}

/* Reduction-order noise: the 2-rank mean gradient rounds differently from
 * the 1-rank one (a few f32 ulps, ~1e-7 relative), and 50 Adam steps of
 * lr 1e-2 on weights of size ~0.1 carry that into the weights; 2e-5 of the
 * largest weight bounds it with room (measured: under 1e-6). */
#define DP_NOISE 2e-5

Test(dist, two_ranks_equal_one_with_the_doubled_batch)
{
    static Toy one, two, two_z;
    toy_init(&one, 1, false);
    toy_run(&one);
    toy_init(&two, 2, false);
    toy_run(&two);
    toy_init(&two_z, 2, true);
    toy_run(&two_z);
    ranks_identical(&two);
    ranks_identical(&two_z);
    cr_assert_eq(one.opt_step[0], STEPS);
    double d = max_rel_diff(two.w[0], one.w[0], DIM), dz = max_rel_diff(two_z.w[0], one.w[0], DIM);
    cr_log_info("2 ranks vs 1: %.3g (replicated), %.3g (ZeRO-1)", d, dz);
    cr_assert(d < DP_NOISE && dz < DP_NOISE, "%g %g", d, dz);
    double moved = max_rel_diff(one.w[0], one.w_in, DIM);
    cr_assert(moved > 100 * DP_NOISE, "the weights barely moved (%g): the test proves nothing", moved);
}

Test(dist, zero1_equals_replicated_bitwise_without_clipping)
{
    static Toy rep, z;
    toy_init(&rep, 2, false);
    rep.max_norm = 0;
    toy_run(&rep);
    toy_init(&z, 2, true);
    z.max_norm = 0;
    toy_run(&z);
    cr_assert(memcmp(rep.w[0], z.w[0], sizeof z.w[0]) == 0);
    cr_assert(memcmp(rep.m[0], z.m[0], sizeof z.m[0]) == 0 && memcmp(rep.v[0], z.v[0], sizeof z.v[0]) == 0);
}

Test(dist, an_inf_on_one_rank_skips_the_step_on_both)
{
    static Toy t, clean;
    toy_init(&t, 2, true);
    t.inf_rank = 1;
    t.inf_step = 7;
    toy_run(&t);
    ranks_identical(&t);
    for (int r = 0; r < 2; r++) {
        cr_assert_eq(t.skipped[r], 1, "rank %d skipped %lld", r, (long long)t.skipped[r]);
        cr_assert_eq(t.opt_step[r], STEPS - 1);
        cr_assert_eq(t.scale[r], 512.0);
    }
    toy_init(&clean, 2, true);
    toy_run(&clean);
    cr_assert(memcmp(clean.w[0], t.w[0], sizeof t.w[0]) != 0, "the skipped step changed nothing?");
}

/* A ZeRO-1 run on 2 ranks saves its whole state after 20 steps; the rest
 * runs on 3 ranks and on 1, and both land where the 2-rank run does. */
Test(dist, a_checkpoint_from_two_ranks_resumes_on_three_and_on_one)
{
    static Toy whole, first, on3, on1;
    toy_init(&whole, 2, true);
    toy_run(&whole);
    toy_init(&first, 2, true);
    first.end_step = 20;
    toy_run(&first);
    Toy *resumed[2] = { &on3, &on1 };
    int worlds[2] = { 3, 1 };
    for (int k = 0; k < 2; k++) {
        Toy *t = resumed[k];
        toy_init(t, worlds[k], worlds[k] > 1);
        t->start_step = 20;
        memcpy(t->w_in, first.w[0], sizeof t->w_in);
        memcpy(t->m_in, first.m[0], sizeof t->m_in);
        memcpy(t->v_in, first.v[0], sizeof t->v_in);
        t->opt_step_in = first.opt_step[0];
        t->ls_in.scale = first.scale[0];
        t->ls_in.total_skips = first.skipped[0];
        toy_run(t);
        ranks_identical(t);
        double d = max_rel_diff(t->w[0], whole.w[0], DIM);
        cr_log_info("resumed on %d ranks vs uninterrupted: %.3g", worlds[k], d);
        cr_assert(d < DP_NOISE, "world %d: %g", worlds[k], d);
        cr_assert_eq(t->opt_step[0], STEPS);
    }
}

/* ---- rendezvous ---- */
static const char *fake_env[16][2];
static const char *fake_getenv(const char *name)
{
    for (int i = 0; fake_env[i][0]; i++) if (!strcmp(fake_env[i][0], name)) return fake_env[i][1];
    return NULL;
}
static void set_env(const char *kv[][2], int n)
{
    memset(fake_env, 0, sizeof fake_env);
    for (int i = 0; i < n; i++) { fake_env[i][0] = kv[i][0]; fake_env[i][1] = kv[i][1]; }
}

Test(dist, the_environment_names_rank_and_rendezvous)
{
    DistEnv env;
    HpcError err;
    set_env(NULL, 0);
    cr_assert_eq(dist_env_read(&env, fake_getenv, &err), HPC_OK);
    cr_assert(env.world == 1 && env.rank == 0);
    const char *torchrun[][2] = { { "RANK", "1" }, { "WORLD_SIZE", "2" }, { "MASTER_ADDR", "127.0.0.1" },
                                  { "MASTER_PORT", "29500" } };
    set_env(torchrun, 4);
    cr_assert_eq(dist_env_read(&env, fake_getenv, &err), HPC_OK, "%s", err.msg);
    cr_assert(env.kind == RDV_TCP && env.port == 29500 && !strcmp(env.host, "127.0.0.1") && env.local_rank == 1);
    const char *bad[][2] = { { "RANK", "2" }, { "WORLD_SIZE", "2" }, { "HPC_RENDEZVOUS", "file:/tmp/x" } };
    set_env(bad, 3);
    cr_assert_eq(dist_env_read(&env, fake_getenv, &err), HPC_ERR_USAGE);
    cr_assert_str_eq(err.msg, "RANK=2: expected a whole number from 0 to 1");
    const char *none[][2] = { { "RANK", "0" }, { "WORLD_SIZE", "4" } };
    set_env(none, 2);
    cr_assert_eq(dist_env_read(&env, fake_getenv, &err), HPC_ERR_USAGE);
    cr_assert(strstr(err.msg, "WORLD_SIZE=4 but no rendezvous"), "%s", err.msg);
}

typedef struct { DistEnv env; unsigned char blob[128]; HpcStatus st; HpcError err; } Peer;
static void *peer_main(void *arg)
{
    Peer *p = arg;
    p->st = dist_exchange(&p->env, p->blob, sizeof p->blob, &p->err);
    return NULL;
}

static void exchange_among(DistEnv base, int world)
{
    Peer peers[4];
    pthread_t th[4];
    for (int r = 0; r < world; r++) {
        peers[r] = (Peer){ .env = base };
        peers[r].env.rank = r;
        peers[r].env.world = world;
        for (int i = 0; i < 128; i++) peers[r].blob[i] = r == 0 ? (unsigned char)(i * 7 + 3) : 0;
        pthread_create(&th[r], NULL, peer_main, &peers[r]);
    }
    for (int r = 0; r < world; r++) pthread_join(th[r], NULL);
    for (int r = 0; r < world; r++) {
        cr_assert_eq(peers[r].st, HPC_OK, "rank %d: %s", r, peers[r].err.msg);
        cr_assert(memcmp(peers[r].blob, peers[0].blob, 128) == 0, "rank %d got another id", r);
    }
}

Test(dist, rank_zero_hands_the_id_over_a_file_and_over_tcp)
{
    DistEnv env = { .kind = RDV_FILE, .timeout_s = 10 };
    snprintf(env.path, sizeof env.path, "/tmp/hpc-test-rdv-%ld", (long)getpid());
    unlink(env.path);
    exchange_among(env, 3);
    unlink(env.path);
    DistEnv tcp = { .kind = RDV_TCP, .timeout_s = 10, .port = 20000 + (int)(getpid() % 20000) };
    snprintf(tcp.host, sizeof tcp.host, "127.0.0.1");
    exchange_among(tcp, 4);
}

Test(dist, a_rank_waiting_for_a_dead_rank_zero_gives_up)
{
    DistEnv env = { .kind = RDV_FILE, .timeout_s = 0.2, .rank = 1, .world = 2 };
    snprintf(env.path, sizeof env.path, "/tmp/hpc-test-rdv-none-%ld", (long)getpid());
    unsigned char blob[128];
    HpcError err;
    cr_assert_eq(dist_exchange(&env, blob, sizeof blob, &err), HPC_ERR_IO);
    cr_assert(strstr(err.msg, "rank 1 waited 0.2 s for rank 0 to write"), "%s", err.msg);
}

Test(dist, missing_nccl_is_a_clear_error)
{
    setenv("HPC_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1);
    HpcError err;
    cr_assert_eq(coll_nccl_load(&err), HPC_ERR_NO_GPU);
    cr_assert(strstr(err.msg, "cannot load NCCL (/nonexistent/libnccl.so.2)"), "%s", err.msg);
    cr_assert(strstr(err.msg, "set HPC_NCCL_LIBRARY"), "%s", err.msg);
}

/* ---- one process per rank ---- */
Test(dist, launch_runs_every_rank_with_its_environment)
{
    char dir[] = "/tmp/hpc-test-launch-XXXXXX";
    cr_assert(mkdtemp(dir));
    char script[400], rdv[400];
    snprintf(rdv, sizeof rdv, "%s/rdv", dir);
    snprintf(script, sizeof script, "echo \"$RANK $WORLD_SIZE $LOCAL_RANK $HPC_RENDEZVOUS ${HPC_QUIET_RANK:-0}\" "
             "> %s/rank$RANK", dir);
    char *argv[] = { "/bin/sh", "-c", script, NULL };
    int code;
    HpcError err;
    cr_assert_eq(dist_launch(3, argv, rdv, 5, &code, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(code, 0);
    for (int r = 0; r < 3; r++) {
        char path[500], line[600], want[600];
        snprintf(path, sizeof path, "%s/rank%d", dir, r);
        FILE *f = fopen(path, "r");
        cr_assert(f, "rank %d did not run", r);
        cr_assert(fgets(line, sizeof line, f));
        fclose(f);
        unlink(path);
        snprintf(want, sizeof want, "%d 3 %d file:%s %d\n", r, r, rdv, r > 0);
        cr_assert_str_eq(line, want);
    }
    rmdir(dir);
}

Test(dist, launch_stops_the_others_when_one_rank_fails)
{
    /* rank 1 fails at once; the others would sleep for a minute */
    char *argv[] = { "/bin/sh", "-c", "if [ \"$RANK\" = 1 ]; then exit 5; fi; sleep 60", NULL };
    int code;
    HpcError err;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    cr_assert_eq(dist_launch(3, argv, "/tmp/hpc-test-launch-rdv", 1, &code, &err), HPC_ERR_IO);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    cr_assert_eq(code, 5);
    cr_assert_str_eq(err.msg, "rank 1 of 3 failed (exit 5); the other ranks were stopped");
    cr_assert(t1.tv_sec - t0.tv_sec < 20, "the other ranks were not stopped");
}
