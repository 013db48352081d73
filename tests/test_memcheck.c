/* tests/test_memcheck.c — the memory check before a run (runtime/train/memcheck.h):
 * the cpu need counts what the cpu backend allocates, a run that does not fit
 * is refused with exit 6 and the figures in MiB, the override starts it.  The
 * available figure is faked (HPC_MEMCHECK_AVAILABLE_MIB): nothing large is
 * allocated. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/pipeline.h"
#include "data/synthetic.h"
#include "train/memcheck.h"
#include "train/trainer.h"

static void tiny(ModelSpec *s)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "mem_tiny");
    s->stack.hidden = 32;
    s->stack.layers = 1;
    s->stack.heads = 2;
    s->stack.ffn = 64;
    s->stack.vocab_size = 64;
    s->stack.max_positions = 64;
    s->train.batch_size = 8;
    s->train.max_seq_len = 16;
    s->train.steps = 2;
    s->train.epochs = 0;
}

Test(memcheck, the_cpu_need_grows_with_the_batch_and_counts_the_optimizer)
{
    ModelSpec s;
    tiny(&s);
    PipeOptions o = pipeline_defaults(PREC_FP32);
    Pipeline p;
    HpcError err = {0};
    cr_assert_eq(pipeline_build(&s, &o, &p, &err), HPC_OK, "%s", err.msg);
    int64_t params = params_total(&p.pl);
    int64_t small = memcheck_cpu_need(&p.g, &p.pl, &s.train, 8, 16, false);
    int64_t big = memcheck_cpu_need(&p.g, &p.pl, &s.train, 64, 16, false);
    int64_t ckpt = memcheck_cpu_need(&p.g, &p.pl, &s.train, 8, 16, true);
    /* AdamW: master, gradient, m, v = 16 bytes per parameter, and the activations on top */
    cr_expect_gt(small, 16 * params, "need %lld for %lld parameters", (long long)small, (long long)params);
    /* the activations scale with B: 8x the batch is more than 4x the activation part */
    cr_expect_gt(big - 16 * params, 4 * (small - 16 * params));
    cr_expect_eq(ckpt - small, 12 * params, "the checkpoint copy holds w, m, v");
    pipeline_free(&p);
}

Test(memcheck, refusal_names_both_figures_in_mib)
{
    HpcError err = {0};
    cr_expect_eq(memcheck_compare("training x", 100 << 20, 200 << 20, "test", &err), HPC_OK);
    cr_expect_eq(memcheck_compare("training x", (int64_t)37000 << 20, (int64_t)24000 << 20,
                                  "MemAvailable in /proc/meminfo", &err), HPC_ERR_OOM);
    cr_expect(strstr(err.msg, "needs 37000 MiB, 24000 MiB available (MemAvailable in /proc/meminfo)") &&
              strstr(err.msg, "--no-memory-check"), "%s", err.msg);
    int64_t avail = 0;
    char source[160];
    cr_assert_eq(memcheck_host_available(&avail, source, sizeof source, &err), HPC_OK, "%s", err.msg);
    cr_expect_gt(avail, 0, "this machine has some memory available");
    setenv("HPC_MEMCHECK_AVAILABLE_MIB", "3", 1);
    cr_assert_eq(memcheck_host_available(&avail, source, sizeof source, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(avail, 3 << 20);
    cr_expect_str_eq(source, "HPC_MEMCHECK_AVAILABLE_MIB");
    unsetenv("HPC_MEMCHECK_AVAILABLE_MIB");
}

Test(memcheck, a_run_that_does_not_fit_is_refused_before_training, .timeout = 60)
{
    ModelSpec s;
    tiny(&s);
    Dataset train, dev;
    HpcError err = {0};
    dataset_init(&train, "t");
    dataset_init(&dev, "d");
    cr_assert_eq(synthetic_make(SYN_CONTAINS, &train, 32, 64, 16, 1, false, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(synthetic_make(SYN_CONTAINS, &dev, 8, 64, 16, 2, false, &err), HPC_OK, "%s", err.msg);
    setenv("HPC_MEMCHECK_AVAILABLE_MIB", "0.01", 1);
    TrainOptions o = {0};
    TrainResult r;
    cr_expect_eq(trainer_run(&s, &train, &dev, &o, &r, &err), HPC_ERR_OOM);
    cr_expect(strstr(err.msg, "training mem_tiny on the cpu (batch 8, sequence 16) needs") &&
              strstr(err.msg, "MiB, 0 MiB available (HPC_MEMCHECK_AVAILABLE_MIB)"), "%s", err.msg);
    cr_expect_eq(r.steps, 0);
    o.no_memory_check = true;
    cr_expect_eq(trainer_run(&s, &train, &dev, &o, &r, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(r.steps, 2);
    unsetenv("HPC_MEMCHECK_AVAILABLE_MIB");
    dataset_free(&train);
    dataset_free(&dev);
}
