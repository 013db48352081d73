/* tests/test_cpu_fast_optim.c — the fast mode's optimizer step
 * (runtime/cpu/cpu_fast_optim.h) against optim_step (runtime/train/optim.h).
 *
 * Random tensors whose sizes cross the chunk boundaries (one larger than
 * three chunks, odd sizes, an empty one, one of a single element), random
 * weights, gradients scaled by a loss scale, nonzero m and v, decay on some:
 *  - without clipping the norm is not used, so every weight, m and v must be
 *    bitwise optim_step's, for AdamW, Adam, SGD with momentum and LAMB;
 *  - with clipping (max norm far below the gradient's norm) the norm is
 *    summed in another order: the reported norm within 1e-12 relative of
 *    optim_step's, the weights within 1e-6 relative (normwise);
 *  - the results are bitwise the same on 1, 2 and 3 threads;
 *  - a NaN or an inf in any gradient: found_inf, nothing written, the step
 *    count unchanged. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_fast_optim.h"
#include "cpu/cpu_threads.h"
#include "cpu/philox.h"

enum { NT = 6 };
static const int64_t SIZES[NT] = {3 * FAST_OPTIM_CHUNK + 777, 5, 0, FAST_OPTIM_CHUNK - 1, 1, 40001};

typedef struct {
    OptimTensor t[NT];
    float *grad[NT];
} Set;

static uint64_t draws;

static float rnd(void) { return 2.0f * philox_uniform(2027, draws++, 0, 9) - 1.0f; }

static float *rnd_array(int64_t n, float scale, float offset)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = offset + scale * rnd();
    return x;
}

/* A fresh set with the same random contents each time (draws reset). */
static void set_make(Set *s, bool sgd)
{
    draws = 0;
    for (int k = 0; k < NT; k++) {
        int64_t n = SIZES[k];
        s->grad[k] = rnd_array(n, 1024.0f, 0);   /* scaled by a loss scale of 1024 */
        s->t[k] = (OptimTensor){.master = rnd_array(n, 0.5f, 0), .grad = s->grad[k],
                                .m = rnd_array(n, 0.01f, 0), .v = sgd ? NULL : rnd_array(n, 1e-4f, 2e-4f),
                                .n = n, .decay = k % 2 == 0};
    }
}

static void set_free(Set *s)
{
    for (int k = 0; k < NT; k++) {
        free(s->t[k].master);
        free(s->grad[k]);
        free(s->t[k].m);
        free(s->t[k].v);
    }
}

static OptimConfig config(SpecOptimizer kind, double clip)
{
    return (OptimConfig){.kind = kind, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                         .momentum = 0.9, .max_grad_norm = clip, .low_dtype = PREC_FP16};
}

static bool bitwise(const float *a, const float *b, int64_t n)
{
    return n == 0 || (a && b && memcmp(a, b, (size_t)n * sizeof *a) == 0);
}

static double rel_diff(const Set *a, const Set *b)
{
    double num = 0, den = 0;
    for (int k = 0; k < NT; k++)
        for (int64_t i = 0; i < SIZES[k]; i++) {
            double d = (double)a->t[k].master[i] - b->t[k].master[i];
            num += d * d;
            den += (double)b->t[k].master[i] * b->t[k].master[i];
        }
    return sqrt(num / den);
}

/* Two steps of each, from the same state; ref by optim_step, fast by fast_optim_step. */
static void run_both(const OptimConfig *c, Set *ref, Set *fast, OptimReport *rr, OptimReport *fr)
{
    bool sgd = c->kind == OPT_SGD;
    set_make(ref, sgd);
    set_make(fast, sgd);
    OptimState sr = {.step = 3}, sf = {.step = 3};
    for (int s = 0; s < 2; s++) {
        optim_step(c, &sr, ref->t, NT, 1.0f / 1024, 1e-3, rr);
        fast_optim_step(c, &sf, fast->t, NT, 1.0f / 1024, 1e-3, fr);
    }
    cr_expect_eq(sr.step, 5);
    cr_expect_eq(sf.step, 5);
}

Test(cpu_fast_optim, without_clipping_every_result_is_optim_steps_bitwise, .timeout = 60)
{
    const SpecOptimizer kinds[] = {OPT_ADAMW, OPT_ADAM, OPT_SGD, OPT_LAMB};
    cpu_threads_set(3);
    for (int q = 0; q < 4; q++) {
        OptimConfig c = config(kinds[q], 0);
        Set ref, fast;
        OptimReport rr, fr;
        run_both(&c, &ref, &fast, &rr, &fr);
        cr_expect(!fr.found_inf && fr.clip_coef == 1.0);
        cr_expect(fabs(fr.grad_norm - rr.grad_norm) <= 1e-12 * rr.grad_norm, "norm %.17g vs %.17g", fr.grad_norm,
                  rr.grad_norm);
        for (int k = 0; k < NT; k++) {
            cr_expect(bitwise(fast.t[k].master, ref.t[k].master, SIZES[k]), "optimizer %d tensor %d weights", q, k);
            cr_expect(bitwise(fast.t[k].m, ref.t[k].m, SIZES[k]), "optimizer %d tensor %d m", q, k);
            if (kinds[q] != OPT_SGD)
                cr_expect(bitwise(fast.t[k].v, ref.t[k].v, SIZES[k]), "optimizer %d tensor %d v", q, k);
        }
        set_free(&ref);
        set_free(&fast);
    }
    cpu_threads_set(0);
}

Test(cpu_fast_optim, with_clipping_within_rounding_of_optim_step, .timeout = 60)
{
    OptimConfig c = config(OPT_ADAMW, 1.0);
    Set ref, fast;
    OptimReport rr, fr;
    cpu_threads_set(2);
    run_both(&c, &ref, &fast, &rr, &fr);
    cr_expect_lt(rr.clip_coef, 0.01, "the test clips: coefficient %g", rr.clip_coef);
    cr_expect(fabs(fr.grad_norm - rr.grad_norm) <= 1e-12 * rr.grad_norm, "norm %.17g vs %.17g", fr.grad_norm,
              rr.grad_norm);
    cr_expect(fabs(fr.clip_coef - rr.clip_coef) <= 1e-12 * rr.clip_coef);
    double d = rel_diff(&fast, &ref);
    cr_expect(d <= 1e-6, "weights %g relative from optim_step's", d);
    set_free(&ref);
    set_free(&fast);
    cpu_threads_set(0);
}

Test(cpu_fast_optim, the_same_bits_on_any_thread_count, .timeout = 60)
{
    OptimConfig c = config(OPT_ADAMW, 1.0);
    Set one, other;
    OptimReport r1, r2;
    set_make(&one, false);
    OptimState s1 = {0};
    cpu_threads_set(1);
    fast_optim_step(&c, &s1, one.t, NT, 1.0f / 1024, 1e-3, &r1);
    for (int threads = 2; threads <= 3; threads++) {
        set_make(&other, false);
        OptimState s2 = {0};
        cpu_threads_set(threads);
        fast_optim_step(&c, &s2, other.t, NT, 1.0f / 1024, 1e-3, &r2);
        cr_expect_eq(memcmp(&r1.grad_norm, &r2.grad_norm, sizeof r1.grad_norm), 0, "%d threads: norm", threads);
        for (int k = 0; k < NT; k++) {
            cr_expect(bitwise(one.t[k].master, other.t[k].master, SIZES[k]), "%d threads, tensor %d", threads, k);
            cr_expect(bitwise(one.t[k].v, other.t[k].v, SIZES[k]), "%d threads, tensor %d v", threads, k);
        }
        set_free(&other);
    }
    set_free(&one);
    cpu_threads_set(0);
}

Test(cpu_fast_optim, a_non_finite_gradient_changes_nothing, .timeout = 60)
{
    const float bad[] = {NAN, INFINITY, -INFINITY};
    cpu_threads_set(2);
    for (int b = 0; b < 3; b++) {
        OptimConfig c = config(OPT_ADAMW, 1.0);
        Set s, clean;
        set_make(&s, false);
        set_make(&clean, false);
        s.grad[b % 2 ? 5 : 0][b * 1000 + 17] = bad[b];
        OptimState st = {.step = 7};
        OptimReport r;
        fast_optim_step(&c, &st, s.t, NT, 1.0f / 1024, 1e-3, &r);
        cr_expect(r.found_inf, "gradient %g", bad[b]);
        cr_expect_eq(st.step, 7);
        for (int k = 0; k < NT; k++) {
            cr_expect(bitwise(s.t[k].master, clean.t[k].master, SIZES[k]), "tensor %d written", k);
            cr_expect(bitwise(s.t[k].m, clean.t[k].m, SIZES[k]) && bitwise(s.t[k].v, clean.t[k].v, SIZES[k]));
        }
        set_free(&s);
        set_free(&clean);
    }
    cpu_threads_set(0);
}
