/* tests/test_cpu_kernels.c — the reference kernels of runtime/cpu/cpu_kernels.h.
 *
 * Four kinds of check:
 *   - every backward against central finite differences of its forward in
 *     f64, through a random projection L = sum(w * y) so one scalar is
 *     differentiated; gradient buffers start random, which also checks the
 *     "bwd accumulates" contract;
 *   - f32 forward against f64 forward on the same (f32-representable) inputs;
 *   - gemm against a naive triple loop, every transpose pair, odd sizes;
 *   - properties: softmax rows, masks, dropout rate and determinism,
 *     cross-entropy's ignore_index, error messages for bad ids and labels.
 * Inputs come from a seeded generator and are never zero. */
#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "program/activations.h"
#include "cpu/cpu_kernels.h"

/* ---- helpers ------------------------------------------------------------ */

static uint64_t rng_state;

static void rng_seed(uint64_t seed) { rng_state = seed * 0x9E3779B97F4A7C15ull + 1; }

/* splitmix64 -> uniform in [-1, 1), never exactly 0. */
static double rng_uniform(void)
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    double u = (double)(z >> 11) * 0x1.0p-53 * 2.0 - 1.0;
    return u == 0 ? 0.5 : u;
}

static double *rand_f64(int64_t n, double lo_abs, double scale)
{
    double *x = malloc((size_t)n * sizeof *x);
    cr_assert(x);
    for (int64_t i = 0; i < n; i++) {
        double u = rng_uniform();
        x[i] = scale * (u < 0 ? u - lo_abs : u + lo_abs);
    }
    return x;
}

/* Random f32 values and their exact f64 copies (same inputs for both). */
static float *rand_f32_pair(int64_t n, double scale, double **as_f64)
{
    float *x = malloc((size_t)n * sizeof *x);
    cr_assert(x);
    double *d = rand_f64(n, 0.0, scale);
    ck_copy_f64_to_f32(x, d, n);
    ck_copy_f32_to_f64(d, x, n);
    *as_f64 = d;
    return x;
}

static double *copy_f64(const double *x, int64_t n)
{
    double *y = malloc((size_t)n * sizeof *y);
    cr_assert(y);
    memcpy(y, x, (size_t)n * sizeof *y);
    return y;
}

/* ||a - b|| / max(||b||, tiny): NaN anywhere gives NaN, which fails every `<`. */
static double rel_err(const double *a, const double *b, int64_t n)
{
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        d += (a[i] - b[i]) * (a[i] - b[i]);
        r += b[i] * b[i];
    }
    return sqrt(d) / fmax(sqrt(r), 1e-300);
}

static double rel_err_f32(const float *a, const double *b, int64_t n)
{
    double *a64 = malloc((size_t)n * sizeof *a64);
    ck_copy_f32_to_f64(a64, a, n);
    double e = rel_err(a64, b, n);
    free(a64);
    return e;
}

static double dot(const double *a, const double *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* A forward under test: reads its inputs from ctx, writes `out`. */
typedef void (*FwdFn)(void *ctx);
typedef struct {
    FwdFn fwd;
    void *ctx;
    const double *out; /* (nout) the forward's output buffer */
    const double *w;   /* (nout) the random projection */
    int64_t nout;
} Probe;

static double probe_loss(const Probe *p)
{
    p->fwd(p->ctx);
    return dot(p->out, p->w, p->nout);
}

/* Relative error between `analytic` and central differences of the
 * projected loss with respect to x (n), which the forward reads. */
static double fd_check(const Probe *p, double *x, int64_t n, const double *analytic)
{
    const double h = 1e-5;
    double *num = malloc((size_t)n * sizeof *num);
    for (int64_t i = 0; i < n; i++) {
        double save = x[i];
        x[i] = save + h;
        double lp = probe_loss(p);
        x[i] = save - h;
        double lm = probe_loss(p);
        x[i] = save;
        num[i] = (lp - lm) / (2 * h);
    }
    probe_loss(p); /* leave the output for the unperturbed input */
    double e = rel_err(analytic, num, n);
    free(num);
    return e;
}

/* A gradient buffer that starts random: after bwd, grad_taken() returns
 * what the bwd added (the accumulation contract). */
typedef struct { double *g, *g0; int64_t n; } Grad;

static Grad grad_new(int64_t n)
{
    Grad g = {rand_f64(n, 0.0, 1.0), NULL, n};
    g.g0 = copy_f64(g.g, n);
    return g;
}

static double *grad_taken(Grad *g)
{
    for (int64_t i = 0; i < g->n; i++) g->g[i] -= g->g0[i];
    return g->g;
}

static void grad_free(Grad *g)
{
    free(g->g);
    free(g->g0);
}

#define FD_TOL 1e-6
#define F32_TOL 1e-5

/* ---- gemm --------------------------------------------------------------- */

/* C = alpha op(A) op(B) + beta C by the definition, in long double. */
static void naive_gemm(bool ta, bool tb, int64_t M, int64_t N, int64_t K, double alpha,
                       const double *A, const double *B, double beta, double *C)
{
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            long double s = 0;
            for (int64_t k = 0; k < K; k++)
                s += (long double)(ta ? A[k * M + i] : A[i * K + k]) *
                     (tb ? B[j * K + k] : B[k * N + j]);
            C[i * N + j] = (double)(alpha * s + (beta == 0 ? 0 : beta * C[i * N + j]));
        }
}

static void check_gemm_shape(int64_t M, int64_t N, int64_t K, double alpha, double beta)
{
    for (int t = 0; t < 4; t++) {
        bool ta = t & 1, tb = t & 2;
        double *A64, *B64, *C64;
        float *A = rand_f32_pair(M * K, 1.0, &A64);
        float *B = rand_f32_pair(K * N, 1.0, &B64);
        float *C = rand_f32_pair(M * N, 1.0, &C64);
        double *Cref = copy_f64(C64, M * N);
        naive_gemm(ta, tb, M, N, K, alpha, A64, B64, beta, Cref);
        ck_gemm_f64(ta, tb, M, N, K, alpha, A64, B64, beta, C64);
        ck_gemm_f32(ta, tb, M, N, K, (float)alpha, A, B, (float)beta, C);
        double e64 = rel_err(C64, Cref, M * N), e32 = rel_err_f32(C, Cref, M * N);
        cr_expect(e64 < 1e-13, "f64 gemm %s%s %lldx%lldx%lld: rel err %g", ta ? "T" : "N",
                  tb ? "T" : "N", (long long)M, (long long)N, (long long)K, e64);
        cr_expect(e32 < F32_TOL, "f32 gemm %s%s %lldx%lldx%lld: rel err %g", ta ? "T" : "N",
                  tb ? "T" : "N", (long long)M, (long long)N, (long long)K, e32);
        free(A), free(B), free(C), free(A64), free(B64), free(C64), free(Cref);
    }
}

Test(gemm, matches_naive_small_odd_sizes)
{
    rng_seed(1);
    check_gemm_shape(1, 1, 1, 1.0, 0.0);
    check_gemm_shape(7, 5, 3, 0.5, 0.0);
    check_gemm_shape(37, 53, 29, 1.25, -0.75);
    check_gemm_shape(3, 70, 1, -2.0, 1.0);
}

Test(gemm, matches_naive_across_block_edges)
{
    rng_seed(2);
    /* Past the i (128), k (256) and j (512) blocks, none a tile multiple. */
    check_gemm_shape(131, 517, 259, 1.0, 0.5);
}

Test(gemm, baseline_path_matches_naive)
{
    rng_seed(7);
    setenv("HPC_GEMM_BASELINE", "1", 1);
    check_gemm_shape(37, 53, 29, 1.25, -0.75);
    check_gemm_shape(131, 517, 259, 1.0, 0.5);
}

Test(gemm, beta_zero_ignores_nan_in_c)
{
    rng_seed(3);
    double *A = rand_f64(6 * 4, 0.1, 1.0), *B = rand_f64(4 * 5, 0.1, 1.0);
    double C[30], ref[30];
    for (int i = 0; i < 30; i++) C[i] = NAN;
    naive_gemm(false, false, 6, 5, 4, 1.0, A, B, 0.0, ref);
    ck_gemm_f64(false, false, 6, 5, 4, 1.0, A, B, 0.0, C);
    cr_expect(rel_err(C, ref, 30) < 1e-14);
    free(A), free(B);
}

Test(gemm, zero_sizes_are_no_ops)
{
    double C[4] = {1, 2, 3, 4};
    ck_gemm_f64(false, false, 2, 2, 0, 1.0, NULL, NULL, 1.0, C); /* K = 0: C = beta C */
    cr_expect(C[0] == 1 && C[3] == 4);
    ck_gemm_f64(false, false, 0, 2, 3, 1.0, NULL, NULL, 0.0, C);
    cr_expect(C[0] == 1);
}

Test(gemm, batched_strided_and_broadcast)
{
    rng_seed(4);
    const int64_t nb = 3, M = 9, N = 11, K = 6, sA = M * K + 5, sC = M * N + 2;
    double *A = rand_f64(nb * sA, 0.1, 1.0), *B = rand_f64(K * N, 0.1, 1.0);
    double *C = rand_f64(nb * sC, 0.1, 1.0), *ref = copy_f64(C, nb * sC);
    /* QK^T-like: A strided per batch, B shared (stride 0), C strided. */
    ck_gemm_batched_f64(false, false, M, N, K, 0.5, A, sA, B, 0, 1.0, C, sC, nb);
    for (int64_t b = 0; b < nb; b++) naive_gemm(false, false, M, N, K, 0.5, A + b * sA, B, 1.0, ref + b * sC);
    cr_expect(rel_err(C, ref, nb * sC) < 1e-14, "batched err %g", rel_err(C, ref, nb * sC));
    free(A), free(B), free(C), free(ref);
}

/* The portable and the AVX2 paths sum in the same order: equal bits.  (On a
 * machine without AVX2 both runs take the portable path.) */
Test(gemm, baseline_and_simd_paths_agree_bitwise)
{
    rng_seed(6);
    const int64_t M = 67, N = 45, K = 300;
    double *a64, *b64;
    float *A = rand_f32_pair(M * K, 1, &a64), *B = rand_f32_pair(N * K, 1, &b64);
    float *C1 = malloc(M * N * 4), *C2 = malloc(M * N * 4);
    double *D1 = malloc(M * N * 8), *D2 = malloc(M * N * 8);
    unsetenv("HPC_GEMM_BASELINE");
    ck_gemm_f32(true, true, M, N, K, 0.3f, A, B, 0.0f, C1);
    ck_gemm_f64(false, true, M, N, K, 0.3, a64, b64, 0.0, D1);
    setenv("HPC_GEMM_BASELINE", "1", 1);
    ck_gemm_f32(true, true, M, N, K, 0.3f, A, B, 0.0f, C2);
    ck_gemm_f64(false, true, M, N, K, 0.3, a64, b64, 0.0, D2);
    cr_expect(memcmp(C1, C2, M * N * 4) == 0);
    cr_expect(memcmp(D1, D2, M * N * 8) == 0);
    cr_expect(!ck_any_nonfinite_f32(C1, M * N) && ck_max_abs_f32(C1, M * N) > 0);
    free(A), free(B), free(a64), free(b64), free(C1), free(C2), free(D1), free(D2);
}

/* The linear-layer recipe in the header's example, checked end to end. */
typedef struct { double *x, *W, *b, *y; int64_t N, in, out; } LinearCtx;

static void linear_fwd(void *p)
{
    LinearCtx *c = p;
    ck_gemm_f64(false, true, c->N, c->out, c->in, 1.0, c->x, c->W, 0.0, c->y);
    ck_bias_add_f64(c->y, c->b, c->N, c->out);
}

Test(gemm, linear_layer_recipe_gradients)
{
    rng_seed(5);
    LinearCtx c = {rand_f64(5 * 7, 0, 1), rand_f64(3 * 7, 0, 1), rand_f64(3, 0, 1),
                   rand_f64(5 * 3, 0, 1), 5, 7, 3};
    double *w = rand_f64(5 * 3, 0, 1);
    Probe p = {linear_fwd, &c, c.y, w, 5 * 3};
    Grad dx = grad_new(5 * 7), dW = grad_new(3 * 7), db = grad_new(3);
    ck_gemm_f64(false, false, c.N, c.in, c.out, 1.0, w, c.W, 1.0, dx.g);
    ck_gemm_f64(true, false, c.out, c.in, c.N, 1.0, w, c.x, 1.0, dW.g);
    ck_bias_grad_f64(db.g, w, c.N, c.out);
    cr_expect(fd_check(&p, c.x, 5 * 7, grad_taken(&dx)) < FD_TOL);
    cr_expect(fd_check(&p, c.W, 3 * 7, grad_taken(&dW)) < FD_TOL);
    cr_expect(fd_check(&p, c.b, 3, grad_taken(&db)) < FD_TOL);
    grad_free(&dx), grad_free(&dW), grad_free(&db);
    free(c.x), free(c.W), free(c.b), free(c.y), free(w);
}

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* Logs the f32 gemm speed for the report (no floor: machines differ), and
 * checks that the timed product is right on a sample of entries. */
Test(gemm, speed_512_f32)
{
    const int64_t n = 512;
    double *a64, *b64;
    float *A = rand_f32_pair(n * n, 1.0, &a64), *B = rand_f32_pair(n * n, 1.0, &b64);
    float *C = malloc((size_t)(n * n) * sizeof *C);
    ck_gemm_f32(false, true, n, n, n, 1.0f, A, B, 0.0f, C);
    double best = 1e30;
    for (int r = 0; r < 3; r++) {
        double t0 = now_s();
        ck_gemm_f32(false, true, n, n, n, 1.0f, A, B, 0.0f, C);
        best = fmin(best, now_s() - t0);
    }
    cr_log_info("ck_gemm_f32 512x512x512 (NT): %.1f GFLOP/s", 2.0 * n * n * n / best * 1e-9);
    cr_expect(!ck_any_nonfinite_f32(C, n * n));
    double num = 0, den = 0;
    for (int64_t s = 0; s < 257; s++) {   /* C = A B^T at entries spread over the matrix */
        int64_t i = (s * 131) % n, j = (s * 197 + 7) % n;
        double ref = 0;
        for (int64_t k = 0; k < n; k++) ref += a64[i * n + k] * b64[j * n + k];
        num += (C[i * n + j] - ref) * (C[i * n + j] - ref);
        den += ref * ref;
    }
    cr_expect(sqrt(num / den) < 1e-5, "timed gemm rel error %.3g", sqrt(num / den));
    free(A), free(B), free(C), free(a64), free(b64);
}

/* ---- layernorm ---------------------------------------------------------- */

typedef struct { double *x, *gamma, *beta, *y, *mean, *rstd; int64_t N, D; } LnCtx;

static void ln_fwd(void *p)
{
    LnCtx *c = p;
    ck_layernorm_fwd_f64(c->y, c->mean, c->rstd, c->x, c->gamma, c->beta, c->N, c->D, 1e-5);
}

Test(layernorm, bwd_matches_finite_differences)
{
    rng_seed(10);
    const int64_t N = 4, D = 9;
    LnCtx c = {rand_f64(N * D, 0, 2), rand_f64(D, 0.5, 1), rand_f64(D, 0, 1),
               rand_f64(N * D, 0, 1), rand_f64(N, 0, 1), rand_f64(N, 0, 1), N, D};
    double *w = rand_f64(N * D, 0, 1);
    Probe p = {ln_fwd, &c, c.y, w, N * D};
    probe_loss(&p);
    Grad dx = grad_new(N * D), dg = grad_new(D), db = grad_new(D);
    ck_layernorm_bwd_f64(dx.g, dg.g, db.g, w, c.x, c.mean, c.rstd, c.gamma, N, D);
    cr_expect(fd_check(&p, c.x, N * D, grad_taken(&dx)) < FD_TOL);
    cr_expect(fd_check(&p, c.gamma, D, grad_taken(&dg)) < FD_TOL);
    cr_expect(fd_check(&p, c.beta, D, grad_taken(&db)) < FD_TOL);
    grad_free(&dx), grad_free(&dg), grad_free(&db);
    free(c.x), free(c.gamma), free(c.beta), free(c.y), free(c.mean), free(c.rstd), free(w);
}

Test(layernorm, saves_mean_and_rstd_and_normalizes)
{
    rng_seed(11);
    const int64_t N = 3, D = 300; /* D past one column chunk */
    double *x = rand_f64(N * D, 0, 3), g[300], b[300], y[900], mean[3], rstd[3];
    for (int d = 0; d < D; d++) g[d] = 1, b[d] = 0;
    ck_layernorm_fwd_f64(y, mean, rstd, x, g, b, N, D, 1e-5);
    for (int64_t i = 0; i < N; i++) {
        double s = 0, ss = 0;
        for (int64_t d = 0; d < D; d++) s += x[i * D + d];
        double mu = s / D;
        for (int64_t d = 0; d < D; d++) ss += (x[i * D + d] - mu) * (x[i * D + d] - mu);
        cr_expect(fabs(mean[i] - mu) < 1e-12);
        cr_expect(fabs(rstd[i] - 1 / sqrt(ss / D + 1e-5)) < 1e-10);
        double ys = 0, yss = 0;
        for (int64_t d = 0; d < D; d++) ys += y[i * D + d], yss += y[i * D + d] * y[i * D + d];
        cr_expect(fabs(ys / D) < 1e-12 && fabs(yss / D - 1) < 1e-4, "row %lld: %g %g",
                  (long long)i, ys / D, yss / D);
    }
    free(x);
}

Test(layernorm, f32_matches_f64)
{
    rng_seed(12);
    const int64_t N = 5, D = 700;
    double *x64, *g64, *b64, *dy64;
    float *x = rand_f32_pair(N * D, 2, &x64), *g = rand_f32_pair(D, 1, &g64);
    float *b = rand_f32_pair(D, 1, &b64), *dy = rand_f32_pair(N * D, 1, &dy64);
    float *y = calloc(N * D, 4), *dx = calloc(N * D, 4), *dg = calloc(D, 4), *db = calloc(D, 4);
    float mean[5], rstd[5];
    double *y64 = calloc(N * D, 8), *dx64 = calloc(N * D, 8), *dg64 = calloc(D, 8),
           *db64 = calloc(D, 8), mean64[5], rstd64[5];
    ck_layernorm_fwd_f32(y, mean, rstd, x, g, b, N, D, 1e-12);
    ck_layernorm_fwd_f64(y64, mean64, rstd64, x64, g64, b64, N, D, 1e-12);
    ck_layernorm_bwd_f32(dx, dg, db, dy, x, mean, rstd, g, N, D);
    ck_layernorm_bwd_f64(dx64, dg64, db64, dy64, x64, mean64, rstd64, g64, N, D);
    cr_expect(rel_err_f32(y, y64, N * D) < F32_TOL);
    cr_expect(rel_err_f32(dx, dx64, N * D) < F32_TOL);
    cr_expect(rel_err_f32(dg, dg64, D) < F32_TOL);
    cr_expect(rel_err_f32(db, db64, D) < F32_TOL);
    free(x), free(g), free(b), free(dy), free(y), free(dx), free(dg), free(db);
    free(x64), free(g64), free(b64), free(dy64), free(y64), free(dx64), free(dg64), free(db64);
}

/* ---- bias --------------------------------------------------------------- */

Test(bias, grad_is_column_sums_accumulated)
{
    rng_seed(13);
    const int64_t N = 7, D = 600;
    double *dy64;
    float *dy = rand_f32_pair(N * D, 1, &dy64);
    double *db64 = rand_f64(D, 0, 1), *ref = copy_f64(db64, D);
    float *db = malloc(D * 4);
    ck_copy_f64_to_f32(db, db64, D);
    ck_copy_f32_to_f64(ref, db, D);
    ck_copy_f32_to_f64(db64, db, D);
    for (int64_t i = 0; i < N; i++)
        for (int64_t d = 0; d < D; d++) ref[d] += dy64[i * D + d];
    ck_bias_grad_f64(db64, dy64, N, D);
    ck_bias_grad_f32(db, dy, N, D);
    cr_expect(rel_err(db64, ref, D) < 1e-14);
    cr_expect(rel_err_f32(db, ref, D) < F32_TOL);
    free(dy), free(dy64), free(db64), free(ref), free(db);
}

/* ---- attention softmax -------------------------------------------------- */

typedef struct { double *s, *p; const int32_t *mask; bool causal; double scale;
                 int64_t B, NH, Lq, Lk; } SmCtx;

static void sm_fwd(void *q)
{
    SmCtx *c = q;
    ck_attn_softmax_fwd_f64(c->p, c->s, c->mask, c->causal, c->scale, c->B, c->NH, c->Lq, c->Lk);
}

Test(softmax, bwd_matches_finite_differences_with_masks)
{
    rng_seed(20);
    const int64_t B = 2, NH = 2, Lq = 3, Lk = 5, n = B * NH * Lq * Lk;
    int32_t mask[10] = {1, 1, 1, 0, 0, 1, 1, 1, 1, 1};
    for (int causal = 0; causal < 2; causal++) {
        SmCtx c = {rand_f64(n, 0, 3), rand_f64(n, 0, 1), mask, causal, 0.7, B, NH, Lq, Lk};
        double *w = rand_f64(n, 0, 1);
        Probe p = {sm_fwd, &c, c.p, w, n};
        probe_loss(&p);
        Grad ds = grad_new(n);
        ck_attn_softmax_bwd_f64(ds.g, c.p, w, c.scale, B * NH * Lq, Lk);
        double e = fd_check(&p, c.s, n, grad_taken(&ds));
        cr_expect(e < FD_TOL, "causal=%d: rel err %g", causal, e);
        grad_free(&ds), free(c.s), free(c.p), free(w);
    }
}

Test(softmax, rows_sum_to_one_and_masked_entries_are_zero)
{
    rng_seed(21);
    const int64_t B = 2, NH = 3, L = 6, n = B * NH * L * L;
    int32_t mask[12] = {1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1, 1};
    double *s = rand_f64(n, 0, 10), *p = malloc(n * sizeof *p);
    ck_attn_softmax_fwd_f64(p, s, mask, true, 1.0, B, NH, L, L);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t q = 0; q < L; q++) {
                const double *row = p + ((b * NH + h) * L + q) * L;
                double sum = 0;
                for (int64_t k = 0; k < L; k++) {
                    bool hidden = mask[b * L + k] == 0 || k > q;
                    if (hidden) cr_expect(row[k] == 0, "b%lld h%lld q%lld k%lld: %g", (long long)b,
                                          (long long)h, (long long)q, (long long)k, row[k]);
                    else cr_expect(row[k] > 0);
                    sum += row[k];
                }
                cr_expect(fabs(sum - 1) < 1e-14, "row sum %.17g", sum);
            }
    free(s), free(p);
}

Test(softmax, fully_masked_row_is_finite_zero)
{
    rng_seed(22);
    int32_t mask[4] = {0, 0, 0, 0};
    double *s = rand_f64(2 * 4, 0, 1), p[8], ds[8] = {0}, dp[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    ck_attn_softmax_fwd_f64(p, s, mask, false, 1.0, 1, 1, 2, 4);
    for (int i = 0; i < 8; i++) cr_expect(p[i] == 0, "p[%d] = %g", i, p[i]);
    ck_attn_softmax_bwd_f64(ds, p, dp, 1.0, 2, 4);
    for (int i = 0; i < 8; i++) cr_expect(ds[i] == 0);
    float s32[8], p32[8];
    ck_copy_f64_to_f32(s32, s, 8);
    ck_attn_softmax_fwd_f32(p32, s32, mask, true, 1.0, 1, 1, 2, 4);
    cr_expect(!ck_any_nonfinite_f32(p32, 8));
    free(s);
}

Test(softmax, large_scores_do_not_overflow_and_alias_in_place)
{
    double s[4] = {1000, 999, -1000, 998}, ref[4];
    double z = exp(0.0) + exp(-1.0) + exp(-2000.0) + exp(-2.0);
    ref[0] = 1 / z, ref[1] = exp(-1.0) / z, ref[2] = exp(-2000.0) / z, ref[3] = exp(-2.0) / z;
    ck_attn_softmax_fwd_f64(s, s, NULL, false, 1.0, 1, 1, 1, 4); /* probs aliases scores */
    cr_expect(rel_err(s, ref, 4) < 1e-15);
}

Test(softmax, f32_matches_f64)
{
    rng_seed(23);
    const int64_t B = 2, NH = 4, L = 33, n = B * NH * L * L;
    int32_t mask[66];
    for (int i = 0; i < 66; i++) mask[i] = (i % 33) < 29;
    double *s64, *dp64;
    float *s = rand_f32_pair(n, 4, &s64), *dp = rand_f32_pair(n, 1, &dp64);
    float *p = malloc(n * 4), *ds = calloc(n, 4);
    double *p64 = malloc(n * 8), *ds64 = calloc(n, 8);
    ck_attn_softmax_fwd_f32(p, s, mask, false, 0.125, B, NH, L, L);
    ck_attn_softmax_fwd_f64(p64, s64, mask, false, 0.125, B, NH, L, L);
    ck_attn_softmax_bwd_f32(ds, p, dp, 0.125, B * NH * L, L);
    ck_attn_softmax_bwd_f64(ds64, p64, dp64, 0.125, B * NH * L, L);
    cr_expect(rel_err_f32(p, p64, n) < F32_TOL);
    cr_expect(rel_err_f32(ds, ds64, n) < F32_TOL);
    free(s), free(dp), free(p), free(ds), free(s64), free(dp64), free(p64), free(ds64);
}

/* ---- activations -------------------------------------------------------- */

typedef void (*ActFwd64)(double *, const double *, int64_t);
typedef void (*ActBwd64)(double *, const double *, const double *, int64_t);
typedef void (*ActFwd32)(float *, const float *, int64_t);
typedef struct { ActFwd64 fwd; double *x, *y; int64_t n; } ActCtx;

static void act_fwd(void *p)
{
    ActCtx *c = p;
    c->fwd(c->y, c->x, c->n);
}

/* bwd_takes_output: tanh's bwd reads y, the others read x. */
static void check_activation(const char *name, ActFwd64 fwd, ActBwd64 bwd, ActFwd32 fwd32,
                             bool bwd_takes_output)
{
    const int64_t n = 64;
    /* |x| >= 0.05 keeps relu's kink out of the central differences. */
    ActCtx c = {fwd, rand_f64(n, 0.05, 3), rand_f64(n, 0, 1), n};
    double *w = rand_f64(n, 0, 1);
    Probe p = {act_fwd, &c, c.y, w, n};
    probe_loss(&p);
    Grad dx = grad_new(n);
    bwd(dx.g, w, bwd_takes_output ? c.y : c.x, n);
    double e = fd_check(&p, c.x, n, grad_taken(&dx));
    cr_expect(e < FD_TOL, "%s bwd: rel err %g", name, e);

    float x32[64], y32[64];
    ck_copy_f64_to_f32(x32, c.x, n);
    ck_copy_f32_to_f64(c.x, x32, n);
    fwd(c.y, c.x, n);
    fwd32(y32, x32, n);
    e = rel_err_f32(y32, c.y, n);
    cr_expect(e < F32_TOL, "%s f32 fwd: rel err %g", name, e);
    grad_free(&dx), free(c.x), free(c.y), free(w);
}

Test(activations, bwd_matches_finite_differences_and_f32_matches_f64)
{
    rng_seed(30);
    check_activation("gelu", ck_gelu_fwd_f64, ck_gelu_bwd_f64, ck_gelu_fwd_f32, false);
    check_activation("gelu_tanh", ck_gelu_tanh_fwd_f64, ck_gelu_tanh_bwd_f64,
                     ck_gelu_tanh_fwd_f32, false);
    check_activation("relu", ck_relu_fwd_f64, ck_relu_bwd_f64, ck_relu_fwd_f32, false);
    check_activation("tanh", ck_tanh_fwd_f64, ck_tanh_bwd_f64, ck_tanh_fwd_f32, true);
}

Test(activations, known_values)
{
    /* Reference values from Python's math module:
     *   python3 -c 'import math; print(0.5*(1+math.erf(1/math.sqrt(2))))'
     *     -> 0.8413447460685429 (gelu(1) = Phi(1))
     *   python3 -c 'import math; print(0.5*(1+math.tanh(math.sqrt(2/math.pi)*1.044715)))'
     *     -> 0.8411919906082768 (gelu_tanh(1)) */
    double x[3] = {1.0, -1.0, 0.0}, y[3];
    ck_gelu_fwd_f64(y, x, 3);
    cr_expect(fabs(y[0] - 0.841344746068543) < 1e-14 && fabs(y[1] + 0.158655253931457) < 1e-14
              && y[2] == 0);
    ck_gelu_tanh_fwd_f64(y, x, 3);
    cr_expect(fabs(y[0] - 0.8411919906082768) < 1e-12, "gelu_tanh(1) = %.17g", y[0]);
}

/* SiLU through the generic kernels and the row of program/activations.h:
 * known values, the derivative against central differences of the
 * reference, and f32 against f64. */
Test(activations, silu)
{
    /* python3 -c 'import math; print(1/(1+math.exp(-1)), -1/(1+math.exp(1)))'
     *   -> 0.7310585786300049 -0.2689414213699951 */
    double x[3] = {1.0, -1.0, 0.0}, y[3];
    ck_act_fwd_f64(act_ref_silu, y, x, 3);
    cr_expect(fabs(y[0] - 0.7310585786300049) < 1e-15 && fabs(y[1] + 0.2689414213699951) < 1e-15 &&
              y[2] == 0, "silu: %.17g %.17g %.17g", y[0], y[1], y[2]);
    rng_seed(31);
    const int64_t n = 64;
    double *xs = rand_f64(n, 0, 4), *dy = rand_f64(n, 0, 1), dx[64] = {0}, worst = 0;
    ck_act_bwd_f64(act_grad_ref_silu, dx, dy, xs, n);
    for (int64_t i = 0; i < n; i++) {
        double h = 1e-5, fd = (act_ref_silu(xs[i] + h) - act_ref_silu(xs[i] - h)) / (2 * h) * dy[i];
        double e = fabs(dx[i] - fd) / (fabs(fd) + 1e-12);
        cr_expect(e == e, "NaN at %lld", (long long)i);
        if (e > worst) worst = e;
    }
    cr_expect(worst < 1e-7, "silu bwd vs finite differences: rel err %g", worst);
    float x32[64], y32[64];
    double y64[64];
    ck_copy_f64_to_f32(x32, xs, n);
    ck_copy_f32_to_f64(xs, x32, n);
    ck_act_fwd_f64(act_ref_silu, y64, xs, n);
    ck_act_fwd_f32(act_ref_silu, y32, x32, n);
    cr_expect(rel_err_f32(y32, y64, n) < F32_TOL);
    free(xs), free(dy);
}

/* gelu_cdf, the GPU's exact GELU (program/activations.h), through its C
 * twin act_gelu_cdf_f32 (the same constants and f32 operations, exact
 * division and exp2f where the GPU uses .approx): Phi, phi, x Phi(x) and
 * its derivative against the double reference on a grid over [-12, 12]
 * and on random inputs, and NaN in, NaN out.  Bounds: the fit's f32 errors
 * (scripts/fit_gelu_cdf.py: Phi 2.5e-7, x Phi(x) 3.9e-7) with a margin; a
 * wrong digit in a constant moves them by far more. */
static void gelu_cdf_errors(double x, double err[4])
{
    float pdf;
    const float xf = (float)x;
    const double xd = xf;
    const float cdf = act_gelu_cdf_f32(xf, &pdf);
    const double exact_cdf = 0.5 * (1.0 + erf(xd * ACT_SQRT1_2));
    const double exact_pdf = ACT_INV_SQRT_2PI * exp(-0.5 * xd * xd);
    const double got[4] = {cdf, pdf, (double)(xf * cdf), (double)(cdf + xf * pdf)};
    const double want[4] = {exact_cdf, exact_pdf, act_ref_gelu(xd), act_grad_ref_gelu(xd)};
    for (int k = 0; k < 4; k++) {
        double e = fabs(got[k] - want[k]);
        err[k] = e == e ? e : INFINITY;   /* a NaN never passes */
    }
}

Test(activations, gelu_cdf_twin_matches_erf)
{
    static const char *what[4] = {"Phi", "phi", "gelu", "gelu'"};
    static const double bound[4] = {4e-7, 1e-7, 6e-7, 6e-7};
    double worst[4] = {0}, at[4] = {0}, err[4];
    rng_seed(32);
    for (int i = 0; i <= 240000; i++) {
        double x = i < 240000 ? -12.0 + i * 1e-4 : 12.0;
        if (i % 2) x = 3.0 * rng_uniform();   /* every other input random in [-3, 3) */
        gelu_cdf_errors(x, err);
        for (int k = 0; k < 4; k++)
            if (err[k] > worst[k]) worst[k] = err[k], at[k] = x;
    }
    for (int k = 0; k < 4; k++)
        cr_expect(worst[k] <= bound[k], "gelu_cdf %s: |error| %.3g at x = %.9g (bound %.1g)", what[k], worst[k],
                  at[k], bound[k]);
    float pdf;
    cr_expect(isnan(act_gelu_cdf_f32(NAN, &pdf)) && isnan(pdf), "NaN in, NaN out");
    cr_expect(act_gelu_cdf_f32(INFINITY, &pdf) == 1.0f && pdf == 0.0f, "Phi(+inf) = 1, phi = 0");
    cr_expect(act_gelu_cdf_f32(-INFINITY, &pdf) == 0.0f && pdf == 0.0f, "Phi(-inf) = 0, phi = 0");
}

/* ---- dropout ------------------------------------------------------------ */

Test(dropout, rate_scale_and_determinism)
{
    rng_seed(40);
    const int64_t n = 100000;
    const float p = 0.2f;
    double *x = rand_f64(n, 0.01, 1), *y = malloc(n * 8), *y2 = malloc(n * 8), *y3 = malloc(n * 8);
    ck_dropout_fwd_f64(y, x, n, p, 1234, 7, 3);
    ck_dropout_fwd_f64(y2, x, n, p, 1234, 7, 3);
    ck_dropout_fwd_f64(y3, x, n, p, 1234, 8, 3);
    int64_t dropped = 0, same_as_next_step = 0;
    for (int64_t i = 0; i < n; i++) {
        bool kept = y[i] != 0;
        dropped += !kept;
        if (kept) cr_assert(fabs(y[i] - x[i] / (1.0 - (double)p)) < 1e-15);
        cr_assert(y[i] == y2[i], "same seed/step/salt must give the same mask");
        same_as_next_step += (y[i] != 0) == (y3[i] != 0);
    }
    double rate = (double)dropped / n;
    cr_expect(fabs(rate - p) < 0.005, "drop rate %g for p = %g", rate, p);
    /* Independent masks agree on p^2 + (1-p)^2 = 68% of elements, not all. */
    cr_expect(same_as_next_step < n * 0.75, "step 8 mask equals step 7 mask on %lld of %lld",
              (long long)same_as_next_step, (long long)n);
    free(x), free(y), free(y2), free(y3);
}

Test(dropout, bwd_uses_the_fwd_mask_and_p_zero_is_identity)
{
    rng_seed(41);
    const int64_t n = 1000;
    double *x = rand_f64(n, 0.01, 1), *y = malloc(n * 8), *dy = rand_f64(n, 0.01, 1);
    Grad dx = grad_new(n);
    ck_dropout_fwd_f64(y, x, n, 0.5f, 99, 1, 2);
    ck_dropout_bwd_f64(dx.g, dy, n, 0.5f, 99, 1, 2);
    double *d = grad_taken(&dx);
    for (int64_t i = 0; i < n; i++) cr_assert(fabs(d[i] - dy[i] * y[i] / x[i]) < 1e-14);
    ck_dropout_fwd_f64(y, x, n, 0.0f, 99, 1, 2);
    cr_expect(memcmp(y, x, n * 8) == 0);
    float x32[8] = {1, -2, 3, -4, 5, -6, 7, -8}, y32[8];
    ck_dropout_fwd_f32(y32, x32, 8, 0.0f, 5, 5, 5);
    cr_expect(memcmp(y32, x32, sizeof x32) == 0);
    grad_free(&dx), free(x), free(y), free(dy);
}

Test(dropout, f32_mask_equals_f64_mask)
{
    rng_seed(42);
    double *x64;
    float *x = rand_f32_pair(4096, 1, &x64), y[4096];
    double y64[4096];
    ck_dropout_fwd_f32(y, x, 4096, 0.1f, 77, 3, 9);
    ck_dropout_fwd_f64(y64, x64, 4096, 0.1f, 77, 3, 9);
    for (int i = 0; i < 4096; i++) cr_assert((y[i] == 0) == (y64[i] == 0));
    cr_expect(rel_err_f32(y, y64, 4096) < F32_TOL);
    free(x), free(x64);
}

/* ---- embedding ---------------------------------------------------------- */

typedef struct { double *table, *out; const int32_t *ids; int64_t n, V, D; } EmbCtx;

static void emb_fwd(void *p)
{
    EmbCtx *c = p;
    cr_assert(ck_embedding_fwd_f64(c->out, c->table, c->ids, c->n, c->V, c->D, NULL) == HPC_OK);
}

Test(embedding, gather_and_scatter_add_with_repeated_ids)
{
    rng_seed(50);
    const int32_t ids[6] = {3, 0, 3, 4, 1, 3};
    EmbCtx c = {rand_f64(5 * 4, 0, 1), rand_f64(6 * 4, 0, 1), ids, 6, 5, 4};
    emb_fwd(&c);
    for (int i = 0; i < 6; i++) cr_expect(memcmp(c.out + i * 4, c.table + ids[i] * 4, 32) == 0);
    double *w = rand_f64(6 * 4, 0, 1);
    Probe p = {emb_fwd, &c, c.out, w, 6 * 4};
    Grad dt = grad_new(5 * 4);
    HpcError err;
    cr_assert(ck_embedding_bwd_f64(dt.g, w, ids, 6, 5, 4, &err) == HPC_OK);
    cr_expect(fd_check(&p, c.table, 5 * 4, grad_taken(&dt)) < FD_TOL);
    grad_free(&dt), free(c.table), free(c.out), free(w);
}

Test(embedding, bad_id_is_an_input_error_naming_it)
{
    const int32_t ids[3] = {1, 9, 2};
    float table[8 * 2] = {0}, out[3 * 2] = {7, 7, 7, 7, 7, 7}, dtable[16] = {0};
    HpcError err;
    cr_assert(ck_embedding_fwd_f32(out, table, ids, 3, 8, 2, &err) == HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "token id 9 at position 1") != NULL, "message: %s", err.msg);
    cr_expect(strstr(err.msg, "[0, 8)") != NULL, "message: %s", err.msg);
    cr_expect(out[0] == 7, "nothing is written on error");
    const int32_t neg[1] = {-1};
    cr_assert(ck_embedding_bwd_f32(dtable, out, neg, 1, 8, 2, &err) == HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "embedding gradient: token id -1") != NULL, "message: %s", err.msg);
}

/* ---- losses ------------------------------------------------------------- */

typedef struct { double *logits, loss; const int32_t *labels; int64_t N, C; } XentCtx;

static void xent_fwd(void *p)
{
    XentCtx *c = p;
    cr_assert(ck_xent_fwd_f64(&c->loss, c->logits, c->labels, c->N, c->C, NULL) == HPC_OK);
}

Test(xent, value_and_gradient_with_ignore_index)
{
    rng_seed(60);
    const int32_t labels[5] = {2, CK_IGNORE_INDEX, 0, 3, CK_IGNORE_INDEX};
    XentCtx c = {rand_f64(5 * 4, 0, 3), 0, labels, 5, 4};
    xent_fwd(&c);
    /* The definition, row by row: -log(exp(z_y) / sum exp(z)), mean over 3 rows. */
    double ref = 0;
    for (int i = 0; i < 5; i++) {
        if (labels[i] < 0) continue;
        double z = 0;
        for (int k = 0; k < 4; k++) z += exp(c.logits[i * 4 + k]);
        ref -= log(exp(c.logits[i * 4 + labels[i]]) / z);
    }
    cr_expect(fabs(c.loss - ref / 3) < 1e-14, "loss %.17g, expected %.17g", c.loss, ref / 3);

    double w = 1.7; /* upstream gradient of the scalar loss */
    Probe p = {xent_fwd, &c, &c.loss, &w, 1};
    Grad dl = grad_new(5 * 4);
    ck_xent_bwd_f64(dl.g, c.logits, labels, 5, 4, w);
    double *g = grad_taken(&dl);
    cr_expect(fd_check(&p, c.logits, 5 * 4, g) < FD_TOL);
    for (int k = 0; k < 4; k++) cr_expect(g[4 + k] == 0 && g[16 + k] == 0, "ignored rows get 0");
    grad_free(&dl), free(c.logits);
}

Test(xent, all_rows_ignored_gives_zero_loss_and_no_gradient)
{
    const int32_t labels[2] = {CK_IGNORE_INDEX, CK_IGNORE_INDEX};
    float logits[6] = {1, 2, 3, 4, 5, 6}, d[6] = {0};
    double loss = -1;
    cr_assert(ck_xent_fwd_f32(&loss, logits, labels, 2, 3, NULL) == HPC_OK);
    cr_expect(loss == 0);
    ck_xent_bwd_f32(d, logits, labels, 2, 3, 1.0);
    cr_expect(!ck_any_nonfinite_f32(d, 6) && ck_max_abs_f32(d, 6) == 0);
    cr_assert(ck_xent_fwd_f32(&loss, logits, labels, 0, 3, NULL) == HPC_OK);
    cr_expect(loss == 0);
}

Test(xent, bad_label_is_an_input_error_naming_it)
{
    const int32_t labels[2] = {1, 5};
    float logits[6] = {1, 2, 3, 4, 5, 6};
    double loss;
    HpcError err;
    cr_assert(ck_xent_fwd_f32(&loss, logits, labels, 2, 3, &err) == HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "label 5 in row 1 of the batch is outside [0, 3)") != NULL, "message: %s", err.msg);
}

Test(xent, f32_matches_f64)
{
    rng_seed(61);
    const int64_t N = 16, C = 1000;
    int32_t labels[16];
    for (int i = 0; i < 16; i++) labels[i] = i % 5 == 4 ? CK_IGNORE_INDEX : (i * 37) % 1000;
    double *z64, l64, l32;
    float *z = rand_f32_pair(N * C, 8, &z64), *d = calloc(N * C, 4);
    double *d64 = calloc(N * C, 8);
    ck_xent_fwd_f32(&l32, z, labels, N, C, NULL);
    ck_xent_fwd_f64(&l64, z64, labels, N, C, NULL);
    ck_xent_bwd_f32(d, z, labels, N, C, 0.5);
    ck_xent_bwd_f64(d64, z64, labels, N, C, 0.5);
    cr_expect(fabs(l32 - l64) < F32_TOL * fabs(l64));
    cr_expect(rel_err_f32(d, d64, N * C) < F32_TOL);
    free(z), free(d), free(z64), free(d64);
}

typedef struct { double *pred, *target, loss; int64_t n; } MseCtx;

static void mse_fwd(void *p)
{
    MseCtx *c = p;
    c->loss = ck_mse_fwd_f64(c->pred, c->target, c->n);
}

Test(mse, value_and_gradient)
{
    rng_seed(62);
    MseCtx c = {rand_f64(9, 0, 2), rand_f64(9, 0, 2), 0, 9};
    mse_fwd(&c);
    double ref = 0;
    for (int i = 0; i < 9; i++) ref += (c.pred[i] - c.target[i]) * (c.pred[i] - c.target[i]);
    cr_expect(fabs(c.loss - ref / 9) < 1e-15);
    double w = -0.6;
    Probe p = {mse_fwd, &c, &c.loss, &w, 1};
    Grad dp = grad_new(9);
    ck_mse_bwd_f64(dp.g, c.pred, c.target, 9, w);
    cr_expect(fd_check(&p, c.pred, 9, grad_taken(&dp)) < FD_TOL);
    cr_expect(ck_mse_fwd_f64(c.pred, c.target, 0) == 0);
    float p32[9], t32[9];
    ck_copy_f64_to_f32(p32, c.pred, 9);
    ck_copy_f64_to_f32(t32, c.target, 9);
    ck_copy_f32_to_f64(c.pred, p32, 9);
    ck_copy_f32_to_f64(c.target, t32, 9);
    cr_expect(fabs(ck_mse_fwd_f32(p32, t32, 9) - ck_mse_fwd_f64(c.pred, c.target, 9)) <
              F32_TOL * ck_mse_fwd_f64(c.pred, c.target, 9));
    grad_free(&dp), free(c.pred), free(c.target);
}

/* ---- layout ------------------------------------------------------------- */

typedef struct { double *in, *out; int64_t B, L, NH, D; bool merge; } HeadsCtx;

static void heads_fwd(void *p)
{
    HeadsCtx *c = p;
    if (c->merge) ck_heads_merge_f64(c->out, c->in, c->B, c->L, c->NH, c->D);
    else ck_heads_split_f64(c->out, c->in, c->B, c->L, c->NH, c->D);
}

Test(layout, heads_split_merge_round_trip_and_gradients)
{
    rng_seed(70);
    const int64_t B = 2, L = 3, NH = 4, D = 5, n = B * L * NH * D;
    double *x = rand_f64(n, 0, 1), *h = malloc(n * 8), *back = malloc(n * 8);
    ck_heads_split_f64(h, x, B, L, NH, D);
    /* element (b, l, head, d) moves to (b, head, l, d) */
    cr_expect(h[((1 * NH + 2) * L + 1) * D + 3] == x[((1 * L + 1) * NH + 2) * D + 3]);
    ck_heads_merge_f64(back, h, B, L, NH, D);
    cr_expect(memcmp(back, x, n * 8) == 0);
    for (int merge = 0; merge < 2; merge++) {
        HeadsCtx c = {x, h, B, L, NH, D, merge};
        double *w = rand_f64(n, 0, 1);
        Probe p = {heads_fwd, &c, h, w, n};
        Grad dx = grad_new(n);
        if (merge) ck_heads_merge_bwd_f64(dx.g, w, B, L, NH, D);
        else ck_heads_split_bwd_f64(dx.g, w, B, L, NH, D);
        cr_expect(fd_check(&p, x, n, grad_taken(&dx)) < FD_TOL, "merge=%d", merge);
        grad_free(&dx), free(w);
    }
    free(x), free(h), free(back);
}

typedef struct { double *in, *out; int64_t B, L, H; } FirstCtx;

static void first_fwd(void *p)
{
    FirstCtx *c = p;
    ck_first_token_f64(c->out, c->in, c->B, c->L, c->H);
}

Test(layout, first_token_and_gradient)
{
    rng_seed(71);
    FirstCtx c = {rand_f64(3 * 4 * 5, 0, 1), rand_f64(3 * 5, 0, 1), 3, 4, 5};
    first_fwd(&c);
    cr_expect(memcmp(c.out + 2 * 5, c.in + 2 * 4 * 5, 5 * 8) == 0);
    double *w = rand_f64(3 * 5, 0, 1);
    Probe p = {first_fwd, &c, c.out, w, 3 * 5};
    Grad dx = grad_new(3 * 4 * 5);
    ck_first_token_bwd_f64(dx.g, w, 3, 4, 5);
    cr_expect(fd_check(&p, c.in, 3 * 4 * 5, grad_taken(&dx)) < FD_TOL);
    grad_free(&dx), free(c.in), free(c.out), free(w);
}

/* ---- array helpers ------------------------------------------------------ */

Test(helpers, fill_scale_axpy_sum_maxabs_nonfinite)
{
    float x[5], y[5] = {1, 2, 3, 4, 5};
    ck_fill_f32(x, 5, 2.0f);
    ck_scale_f32(x, 5, 1.5f);
    ck_axpy_f32(y, -2.0f, x, 5); /* y = {-5, -4, -3, -2, -1} */
    cr_expect(ck_sum_f32(y, 5) == -15);
    cr_expect(ck_max_abs_f32(y, 5) == 5);
    cr_expect(!ck_any_nonfinite_f32(y, 5));
    y[3] = INFINITY;
    cr_expect(ck_any_nonfinite_f32(y, 5));
    y[3] = NAN;
    cr_expect(ck_any_nonfinite_f32(y, 5) && isnan(ck_max_abs_f32(y, 5)));
    double d[3] = {1e300, -3, 0.1};
    float f[3];
    ck_copy_f64_to_f32(f, d, 3);
    cr_expect(isinf(f[0]) && f[1] == -3 && f[2] == 0.1f);
    cr_expect(ck_any_nonfinite_f32(f, 3) && !ck_any_nonfinite_f64(d, 3));
    cr_expect(ck_sum_f64(d + 1, 2) == -2.9 && ck_max_abs_f64(d, 0) == 0);
}
