/* tests/test_init_threads.c — a parameter store (runtime/train/init.h) holds
 * the same bits whichever way it was drawn: on 1, 2 or N threads of the cpu
 * pool, in the background (init_store_start / init_store_wait), started
 * ahead (init_store_ahead, adopted by the next start), in the caller
 * (HPC_START_OVERLAP=0); every value is checked against the scalar
 * definition (philox_normal, 0, 1), and draws started ahead for another
 * seed or another model are never adopted. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_threads.h"
#include "cpu/philox.h"
#include "train/init.h"

/* Sizes that cut the element space at odd places: tensors smaller than one
 * thread's share, one much larger, a tie, all three kinds. */
static void make_list(ParamList *pl, int64_t big)
{
    params_init(pl);
    const int64_t emb[2] = {big, 3}, w1[2] = {17, 129}, b1[1] = {129}, g1[1] = {5}, w2[2] = {1, 70001};
    params_add(pl, "emb", 2, emb, PARAM_INIT_NORMAL, true, false);
    params_add(pl, "w1", 2, w1, PARAM_INIT_NORMAL, true, false);
    params_add(pl, "b1", 1, b1, PARAM_INIT_ZEROS, false, false);
    params_add(pl, "g1", 1, g1, PARAM_INIT_ONES, false, false);
    params_add_tied(pl, "decoder", 0);
    params_add(pl, "w2", 2, w2, PARAM_INIT_NORMAL, true, false);
}

static void expect_exact(const ParamStore *ps, const ParamList *pl, uint64_t seed, const char *how)
{
    for (int i = 0; i < pl->n; i++) {
        const ParamInfo *p = &pl->p[i];
        if (p->tied_to >= 0) {
            cr_assert_eq(ps->w[i], ps->w[p->tied_to], "%s: %s is not its tie's tensor", how, p->name);
            continue;
        }
        for (int64_t k = 0; k < params_numel(p); k++) {
            float want = p->init == PARAM_INIT_ZEROS ? 0.0f
                         : p->init == PARAM_INIT_ONES ? 1.0f
                                                      : (float)(INIT_STD * philox_normal(seed, (uint64_t)k, (uint32_t)i));
            uint32_t a, b;
            memcpy(&a, &ps->w[i][k], 4);
            memcpy(&b, &want, 4);
            cr_assert_eq(a, b, "%s: %s[%lld] = %.9g, want %.9g", how, p->name, (long long)k, ps->w[i][k], want);
        }
    }
}

Test(init_threads, same_bits_on_1_2_and_n_threads)
{
    ParamList pl;
    make_list(&pl, 200001);   /* enough elements for 7 pieces of the split */
    const int counts[] = {1, 2, 7};
    for (size_t c = 0; c < sizeof counts / sizeof counts[0]; c++) {
        cpu_threads_set(counts[c]);
        cr_assert_eq(cpu_threads_count(), counts[c]);
        ParamStore ps;
        HpcError err = {0};
        cr_assert_eq(init_store(&ps, &pl, 42, &err), HPC_OK, "%s", err.msg);
        char how[32];
        snprintf(how, sizeof how, "%d threads", counts[c]);
        expect_exact(&ps, &pl, 42, how);
        init_store_free(&ps);
    }
    cpu_threads_set(0);
    params_free(&pl);
}

Test(init_threads, background_start_then_wait)
{
    ParamList pl;
    make_list(&pl, 200001);
    cpu_threads_set(9);   /* in the background two threads stay out of the split: 7 pieces */
    ParamStore ps;
    HpcError err = {0};
    cr_assert_eq(init_store_start(&ps, &pl, 7, &err), HPC_OK, "%s", err.msg);
    init_store_wait(&ps);
    cr_expect(init_store_ready(&ps));
    expect_exact(&ps, &pl, 7, "background");
    init_store_free(&ps);
    /* freed while the draws may still run: the free waits for them */
    cr_assert_eq(init_store_start(&ps, &pl, 8, &err), HPC_OK, "%s", err.msg);
    init_store_free(&ps);
    cpu_threads_set(0);
    params_free(&pl);
}

Test(init_threads, started_ahead_is_adopted_only_when_it_matches)
{
    ParamList pl, other;
    make_list(&pl, 30001);
    make_list(&other, 30002);   /* one tensor one row longer: other values */
    HpcError err = {0};
    ParamStore ps;

    init_store_ahead(&pl, 5);
    cr_expect_gt(init_store_ahead_bytes(), 0, "nothing started ahead");
    cr_assert_eq(init_store_start(&ps, &pl, 5, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(init_store_ahead_bytes(), 0, "the start did not adopt the draws");
    init_store_wait(&ps);
    expect_exact(&ps, &pl, 5, "adopted");
    init_store_free(&ps);

    init_store_ahead(&pl, 5);   /* another seed asked for: drawn again */
    cr_assert_eq(init_store(&ps, &pl, 6, &err), HPC_OK, "%s", err.msg);
    expect_exact(&ps, &pl, 6, "ahead for another seed");
    init_store_free(&ps);

    init_store_ahead(&other, 5);   /* another model asked for */
    cr_assert_eq(init_store(&ps, &pl, 5, &err), HPC_OK, "%s", err.msg);
    expect_exact(&ps, &pl, 5, "ahead for another model");
    init_store_free(&ps);

    params_free(&pl);
    params_free(&other);
}

Test(init_threads, overlap_off_draws_in_the_caller)
{
    setenv("HPC_START_OVERLAP", "0", 1);
    ParamList pl;
    make_list(&pl, 20001);
    init_store_ahead(&pl, 9);
    cr_expect_eq(init_store_ahead_bytes(), 0, "HPC_START_OVERLAP=0 still started draws ahead");
    ParamStore ps;
    HpcError err = {0};
    cr_assert_eq(init_store_start(&ps, &pl, 9, &err), HPC_OK, "%s", err.msg);
    cr_expect(init_store_ready(&ps), "HPC_START_OVERLAP=0: the start returned before the draws were done");
    init_store_wait(&ps);
    expect_exact(&ps, &pl, 9, "in the caller");
    init_store_free(&ps);
    params_free(&pl);
    unsetenv("HPC_START_OVERLAP");
}
