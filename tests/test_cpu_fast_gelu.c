/* tests/test_cpu_fast_gelu.c — the fast mode's exact GELU
 * (runtime/cpu/cpu_fast_gelu.h) against the reference kernels
 * ck_act_fwd_f32 / ck_act_bwd_f32 with act_ref_gelu / act_grad_ref_gelu.
 *
 * Random inputs over [-12, 12] (both tails, where 1 + erf cancels), near 0,
 * large magnitudes, an odd count (the scalar tail), and the specials NaN,
 * +-inf, +-0: every output within 1 float ulp of the reference's (NaN where
 * it is NaN), and at least 99.9% bitwise; the derivative the same, from
 * dx = 0 (as the executor starts it) and accumulated onto random dx (then
 * within one rounding of each term); bitwise the same on 1 and 3 threads.
 * Where libmvec is missing the fast path is the reference and must be
 * bitwise everywhere. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "program/activations.h"
#include "cpu/cpu_fast_gelu.h"
#include "cpu/cpu_kernels.h"
#include "cpu/cpu_threads.h"
#include "cpu/philox.h"

#define N 200003

static uint64_t draws;

static float uni(float lo, float hi) { return lo + (hi - lo) * philox_uniform(77, draws++, 0, 3); }

/* Inputs: mostly [-12, 12], some near 0, some huge, and the specials. */
static float *inputs(void)
{
    float *x = malloc(N * sizeof *x);
    const float special[] = {NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1e-30f, -1e-30f, 3e38f, -3e38f};
    for (int64_t i = 0; i < N; i++) {
        int64_t k = i % 10;
        x[i] = k < 7 ? uni(-12, 12) : k < 9 ? uni(-1e-3f, 1e-3f) : uni(-1e4f, 1e4f);
    }
    for (int s = 0; s < 9; s++) x[N / 2 + 17 * s] = special[s];
    x[N - 1] = NAN;   /* in the scalar tail too */
    return x;
}

/* Distance in units in the last place between two floats of the same sign
 * (or both zero); large for different signs. */
static int64_t ulps(float a, float b)
{
    if (a == b) return 0;
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    if ((ia < 0) != (ib < 0)) return INT64_MAX;
    return llabs((long long)ia - ib);
}

/* Every fast value within max_ulp of the reference (NaN iff NaN); the share of bitwise-equal ones. */
static double compare(const float *fast, const float *ref, int64_t max_ulp, const char *what)
{
    int64_t same = 0, bad = 0;
    for (int64_t i = 0; i < N; i++) {
        bool ok = isnan(ref[i]) ? isnan(fast[i]) : !isnan(fast[i]) && ulps(fast[i], ref[i]) <= max_ulp;
        if (!ok && bad++ < 5)
            cr_log_error("%s[%lld]: fast %.9g, reference %.9g", what, (long long)i, fast[i], ref[i]);
        same += memcmp(&fast[i], &ref[i], 4) == 0 || (isnan(fast[i]) && isnan(ref[i]));
    }
    cr_expect_eq(bad, 0, "%s: %lld values more than %lld ulp away", what, (long long)bad, (long long)max_ulp);
    return (double)same / N;
}

Test(cpu_fast_gelu, forward_and_derivative_within_one_ulp, .timeout = 60)
{
    float *x = inputs(), *dy = malloc(N * sizeof *dy), *y = malloc(N * sizeof *y), *yr = malloc(N * sizeof *yr);
    float *dx = calloc(N, sizeof *dx), *dxr = calloc(N, sizeof *dxr);
    for (int64_t i = 0; i < N; i++) dy[i] = uni(-2, 2);
    bool vec = fast_gelu_vectorised();
    cr_log_info("vector path: %s", vec ? "libmvec" : "none (reference)");
    cpu_threads_set(2);
    fast_gelu_fwd(y, x, N);
    ck_act_fwd_f32(act_ref_gelu, yr, x, N);
    double same = compare(y, yr, vec ? 1 : 0, "gelu");
    cr_log_info("gelu: %.5f%% of the values bitwise the reference's", 100 * same);
    cr_expect_geq(same, 0.999, "only %.4f%% bitwise", 100 * same);
    fast_gelu_bwd(dx, dy, x, N);
    ck_act_bwd_f32(act_grad_ref_gelu, dxr, dy, x, N);
    same = compare(dx, dxr, vec ? 1 : 0, "gelu'");
    cr_expect_geq(same, 0.999, "only %.4f%% bitwise", 100 * same);
    /* accumulating onto dx: one rounding of the term, one of the sum */
    for (int64_t i = 0; i < N; i++) dx[i] = dxr[i] = uni(-1, 1);
    fast_gelu_bwd(dx, dy, x, N);
    ck_act_bwd_f32(act_grad_ref_gelu, dxr, dy, x, N);
    int64_t bad = 0;
    for (int64_t i = 0; i < N; i++) {
        double term = fabs((double)dy[i] * act_grad_ref_gelu(x[i]));
        double tol = vec ? 0x1p-23 * (term + fabs((double)dxr[i])) : 0;
        bool ok = isnan(dxr[i]) ? isnan(dx[i]) : fabs((double)dx[i] - dxr[i]) <= tol;
        bad += !ok;
    }
    cr_expect_eq(bad, 0, "%lld accumulated values off", (long long)bad);
    cpu_threads_set(0);
    free(x);
    free(dy);
    free(y);
    free(yr);
    free(dx);
    free(dxr);
}

Test(cpu_fast_gelu, the_same_bits_on_any_thread_count, .timeout = 60)
{
    float *x = inputs(), *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b);
    float *da = calloc(N, sizeof *da), *db = calloc(N, sizeof *db);
    cpu_threads_set(1);
    fast_gelu_fwd(a, x, N);
    fast_gelu_bwd(da, x, x, N);
    cpu_threads_set(3);
    fast_gelu_fwd(b, x, N);
    fast_gelu_bwd(db, x, x, N);
    cr_expect_eq(memcmp(a, b, N * sizeof *a), 0);
    cr_expect_eq(memcmp(da, db, N * sizeof *da), 0);
    cpu_threads_set(0);
    free(x);
    free(a);
    free(b);
    free(da);
    free(db);
}
