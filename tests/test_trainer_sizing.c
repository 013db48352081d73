/* tests/test_trainer_sizing.c — the trainer sizes the backend and the memory
 * check by the longest batch the data can make (runtime/train/trainer.h,
 * "Sizing"), not by the model's seq_len, on the cpu backend:
 *  - short rows (at most 16 tokens) under seq_len 64: sized for 16, and
 *    both the cpu need (memcheck_cpu_need) and the GPU plan (plan_memory's
 *    arena) at 16 are smaller than at 64;
 *  - the memory check's refusal names the sized length;
 *  - a dev row at seq_len (the longest allowed) trains and evaluates, sized
 *    for seq_len rounded up to 8; with and without bucketing. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/pipeline.h"
#include "program/plan.h"
#include "compiler/plan_graph.h"
#include "data/synthetic.h"
#include "train/memcheck.h"
#include "train/trainer.h"

static void tiny(ModelSpec *s, int64_t seq_len)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "size_tiny");
    s->stack.hidden = 32;
    s->stack.layers = 1;
    s->stack.heads = 2;
    s->stack.ffn = 64;
    s->stack.vocab_size = 64;
    s->stack.max_positions = 64;
    s->train.batch_size = 8;
    s->train.max_seq_len = seq_len;
    s->train.steps = 3;
    s->train.epochs = 0;
}

/* Synthetic rows of at most max_len tokens ([CLS] + up to max_len - 2 + [SEP]). */
static void rows(Dataset *d, const char *name, int64_t n, int64_t max_len, uint64_t seed)
{
    HpcError err = {0};
    dataset_init(d, name);
    cr_assert_eq(synthetic_make(SYN_CONTAINS, d, n, 64, max_len, seed, false, &err), HPC_OK, "%s", err.msg);
}

/* A row of exactly len tokens (ids 5..), label 1. */
static void add_row(Dataset *d, int32_t len)
{
    int32_t ids[64];
    HpcError err = {0};
    for (int i = 0; i < len; i++) ids[i] = 5 + i % 50;
    cr_assert_eq(dataset_add(d, ids, NULL, len, 1, 0, &err), HPC_OK, "%s", err.msg);
}

Test(trainer_sizing, short_rows_size_the_run_below_seq_len, .timeout = 120)
{
    ModelSpec s;
    tiny(&s, 64);
    Dataset train, dev;
    rows(&train, "t", 64, 16, 1);
    rows(&dev, "d", 16, 16, 2);
    TrainOptions o = {0};
    TrainResult r;
    HpcError err = {0};
    cr_assert_eq(trainer_run(&s, &train, &dev, &o, &r, &err), HPC_OK, "%s", err.msg);
    cr_expect_leq(r.longest_row, 16);
    cr_expect_gt(r.longest_row, 8);
    cr_expect_eq(r.sized_len, 16, "sized for %lld", (long long)r.sized_len);
    cr_expect_eq(r.steps, 3);
    cr_expect(isfinite(r.last_loss));

    /* what that saves: host bytes of the cpu run, arena bytes of the GPU plan */
    PipeOptions po = pipeline_defaults(PREC_FP16);
    Pipeline p;
    cr_assert_eq(pipeline_build(&s, &po, &p, &err), HPC_OK, "%s", err.msg);
    int64_t cpu16 = memcheck_cpu_need(&p.g, &p.pl, &s.train, 8, 16, false);
    int64_t cpu64 = memcheck_cpu_need(&p.g, &p.pl, &s.train, 8, 64, false);
    cr_expect_lt(cpu16, cpu64, "cpu need %lld at 16 vs %lld at 64", (long long)cpu16, (long long)cpu64);
    StepPlan a, b;
    PlanMemory ma, mb;
    cr_assert_eq(plan_build(&p.g, 8, 16, &a, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build(&p.g, 8, 64, &b, &err), HPC_OK, "%s", err.msg);
    plan_memory(&a, &p.g, &p.pl, &s.train, &ma);
    plan_memory(&b, &p.g, &p.pl, &s.train, &mb);
    cr_expect_lt(ma.arena * 2, mb.arena, "arena %lld at 16 vs %lld at 64", (long long)ma.arena, (long long)mb.arena);
    cr_expect_lt(ma.total, mb.total);
    plan_free(&a);
    plan_free(&b);
    pipeline_free(&p);

    /* the memory check is made for the sized length */
    setenv("HPC_MEMCHECK_AVAILABLE_MIB", "0.01", 1);
    cr_expect_eq(trainer_run(&s, &train, &dev, &o, &r, &err), HPC_ERR_OOM);
    cr_expect(strstr(err.msg, "(batch 8, sequence 16) needs"), "%s", err.msg);
    unsetenv("HPC_MEMCHECK_AVAILABLE_MIB");
    dataset_free(&train);
    dataset_free(&dev);
}

Test(trainer_sizing, a_row_at_seq_len_trains_bucketed_or_not, .timeout = 120)
{
    ModelSpec s;
    tiny(&s, 20);   /* not a multiple of 8: batches cap at 20, the backend is sized for 24 */
    for (int bucket = 0; bucket < 2; bucket++) {
        Dataset train, dev;
        rows(&train, "t", 40, 16, 3);
        add_row(&train, 20);
        rows(&dev, "d", 9, 16, 4);
        add_row(&dev, 20);
        TrainOptions o = {.bucket = bucket, .steps = 6};   /* more than an epoch of 41 rows */
        TrainResult r;
        HpcError err = {0};
        cr_assert_eq(trainer_run(&s, &train, &dev, &o, &r, &err), HPC_OK, "bucket %d: %s", bucket, err.msg);
        cr_expect_eq(r.longest_row, 20);
        cr_expect_eq(r.sized_len, 24, "bucket %d: sized for %lld", bucket, (long long)r.sized_len);
        cr_expect_eq(r.steps, 6);
        cr_expect(isfinite(r.last_loss) && isfinite(r.eval_loss), "bucket %d", bucket);
        dataset_free(&train);
        dataset_free(&dev);
    }
}
