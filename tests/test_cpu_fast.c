/* tests/test_cpu_fast.c — the cpu executor's fast mode against the reference.
 *
 * Gemm (cpu_fast_gemm.h): random shapes with ragged edges, K past one k
 * block, every transpose, strided operands, alpha/beta cases; each element
 * within the bound the header states,
 *   |C - exact| <= (256 + K/256 + 2) 2^-24 sum_k |alpha a_ik b_kj| + 2^-23 |beta c|,
 * against an f64 product (the float dot-product bound: one rounding per
 * add inside a block, one per block add), and normwise within 2e-6 of the
 * f64 product (random data: errors grow like sqrt(K) 2^-24 ~ 2e-6 at
 * K = 1100, far under 1e-4).  The portable path is checked the same way and
 * is bitwise the reference gemm where it calls it.
 * Kernels (cpu_fast_kernels.h): bitwise equal to the ck_*_f32 kernel they
 * spread over the cores, on 1, 2 and 3 threads.
 * A whole training step of bert_tiny (hidden 128, 2 layers, vocab 30522,
 * dropout on, padded rows): the loss and every gradient of the fast mode
 * within 1e-5 relative (normwise) of the reference and no farther from the
 * f64 executor than the reference is (plus 1e-6): the gemms' FMA changes
 * roundings of ~6e-8 each, which a 2-layer backward pass grows to ~1e-6;
 * fp16 emulation: within 1e-6, and in fact bitwise: the gemm inputs are
 * fp16 values, whose products are exact in float, so an FMA rounds as a
 * multiply then add does, and both gemms sum in the same order.
 * Thread count: the whole step is bitwise the same on 1 and 3 threads.
 * NaN: a NaN in an input reaches the output as in the reference.
 * hpc run: --threads 1 and 3 log the same losses over 3 bert_tiny steps,
 * --cpu-reference runs the reference, within 1e-5 of the fast mode. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/cpu_exec.h"
#include "cpu/cpu_fast_gemm.h"
#include "cpu/cpu_fast_kernels.h"
#include "cpu/cpu_kernels.h"
#include "cpu/cpu_threads.h"
#include "cpu/half.h"
#include "cpu/philox.h"
#include "data/batch.h"
#include "program/params.h"
#include "pipeline.h"
#include "program/spec.h"

static uint64_t draws;

/* Uniform in [-1, 1), never zero-heavy. */
static float rnd(void) { return 2.0f * philox_uniform(2026, draws++, 0, 5) - 1.0f; }

static float *rnd_array(int64_t n)
{
    float *x = malloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = rnd();
    return x;
}

/* ---- the thread pool ---- */

typedef struct {
    int *hits;
} CoverCtx;

static void mark(void *ctx, int64_t b, int64_t e)
{
    CoverCtx *c = ctx;
    for (int64_t i = b; i < e; i++) __atomic_add_fetch(&c->hits[i], 1, __ATOMIC_RELAXED);
}

Test(cpu_fast, parallel_for_covers_every_index_once)
{
    int64_t sizes[] = {1, 2, 3, 7, 100, 1001, 65537};
    int threads[] = {1, 2, 3, 8};
    for (int t = 0; t < 4; t++) {
        cpu_threads_set(threads[t]);
        cr_expect_eq(cpu_threads_count(), threads[t]);
        for (int s = 0; s < 7; s++)
            for (int64_t grain = 1; grain <= 64; grain *= 8) {
                int64_t n = sizes[s];
                CoverCtx c = {calloc((size_t)n, sizeof(int))};
                cpu_parallel_for(n, grain, mark, &c);
                for (int64_t i = 0; i < n; i++)
                    cr_expect_eq(c.hits[i], 1, "n %lld grain %lld threads %d: index %lld hit %d times",
                                 (long long)n, (long long)grain, threads[t], (long long)i, c.hits[i]);
                free(c.hits);
            }
    }
    cpu_threads_set(0);
}

/* ---- gemm ---- */

/* op(X)[r][c] of a row-major X with leading dimension ld. */
static double at(const float *X, bool trans, int64_t ld, int64_t r, int64_t c)
{
    return trans ? X[c * ld + r] : X[r * ld + c];
}

/* Checks C (the fast result) against the f64 product of the inputs, with
 * C0 the matrix before the call; returns the normwise relative error. */
static double check_gemm(bool tA, bool tB, int64_t M, int64_t N, int64_t K, float alpha,
                         const float *A, int64_t lda, const float *B, int64_t ldb, float beta,
                         const float *C0, const float *C, int64_t ldc, const char *what)
{
    double num = 0, den = 0, u = ldexp(1.0, -24);
    int bad = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double s = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)alpha * at(A, tA, lda, i, k) * at(B, tB, ldb, k, j);
                s += p;
                mag += fabs(p);
            }
            double c0 = beta == 0 ? 0 : (double)beta * C0[i * ldc + j];
            double want = s + c0, got = C[i * ldc + j];
            double bound = (CPU_FAST_KC + (double)K / CPU_FAST_KC + 2) * u * mag + 2 * u * fabs(c0) + 1e-30;
            if (!(fabs(got - want) <= bound) && bad++ < 3)
                cr_expect(0, "%s: C[%lld][%lld] = %.9g, exact %.9g, error %.3g > bound %.3g", what,
                          (long long)i, (long long)j, got, want, fabs(got - want), bound);
            num += (got - want) * (got - want);
            den += want * want;
        }
    cr_expect_eq(bad, 0, "%s: %d elements outside the bound", what, bad);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

typedef struct {
    int64_t M, N, K;
} Shape;

static void gemm_cases(const char *kernel)
{
    /* Ragged tiles (not multiples of 6 or 16), K over one 256 block, tiny and empty. */
    Shape shapes[] = {{1, 1, 1}, {7, 17, 5}, {61, 45, 300}, {130, 33, 1100}, {25, 530, 64},
                      {0, 5, 3}, {4, 0, 3}, {5, 6, 0}, {200, 150, 40}};
    float alphas[] = {1.0f, 0.125f}, betas[] = {0.0f, 1.0f, -0.5f};
    int cases = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int t = 0; t < 4; t++) {
            bool tA = t & 1, tB = t & 2;
            int64_t M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
            int64_t pad = s % 2 ? 3 : 0; /* strided operands on every other shape */
            int64_t lda = (tA ? M : K) + pad, ldb = (tB ? K : N) + pad, ldc = N + pad;
            float *A = rnd_array((tA ? K : M) * lda), *B = rnd_array((tB ? N : K) * ldb);
            float *C0 = rnd_array(M * ldc), *C = malloc((size_t)(M * ldc + 1) * sizeof *C);
            for (int a = 0; a < 2; a++)
                for (int b = 0; b < 3; b++) {
                    memcpy(C, C0, (size_t)(M * ldc) * sizeof *C);
                    if (betas[b] == 0 && M * N > 0) C[0] = NAN; /* beta 0 must not read C */
                    cpu_fast_sgemm(tA, tB, M, N, K, alphas[a], A, lda, B, ldb, betas[b], C, ldc);
                    char what[160];
                    snprintf(what, sizeof what, "%s gemm %lldx%lldx%lld tA %d tB %d ld+%lld alpha %g beta %g",
                             kernel, (long long)M, (long long)N, (long long)K, tA, tB, (long long)pad,
                             alphas[a], betas[b]);
                    double rel = check_gemm(tA, tB, M, N, K, alphas[a], A, lda, B, ldb, betas[b], C0, C,
                                            ldc, what);
                    cr_expect(rel <= 2e-6, "%s: normwise relative error %.3g > 2e-6", what, rel);
                    cases++;
                }
            free(A);
            free(B);
            free(C0);
            free(C);
        }
    cr_log_info("%s: %d gemm cases within the bound", kernel, cases);
}

Test(cpu_fast, gemm_within_the_float_dot_product_bound, .timeout = 120)
{
    cpu_threads_set(3); /* more threads than this machine's cores: ranges still split */
    unsetenv("HPC_FAST_GEMM_PORTABLE");
    gemm_cases(cpu_fast_gemm_kernel());
    setenv("HPC_FAST_GEMM_PORTABLE", "1", 1);
    cr_expect_str_eq(cpu_fast_gemm_kernel(), "portable");
    gemm_cases("portable");
    unsetenv("HPC_FAST_GEMM_PORTABLE");
    cpu_threads_set(0);
}

/* C of a fast gemm on `threads` threads. */
static float *fast_product(int threads, bool tA, bool tB, int64_t M, int64_t N, int64_t K,
                           const float *A, const float *B)
{
    cpu_threads_set(threads);
    float *C = malloc((size_t)(M * N) * sizeof *C);
    cpu_fast_sgemm(tA, tB, M, N, K, 1, A, tA ? M : K, B, tB ? K : N, 0, C, N);
    cpu_threads_set(0);
    return C;
}

Test(cpu_fast, gemm_bits_do_not_depend_on_threads)
{
    /* Tall (split by rows) and wide (split by columns) products. */
    Shape shapes[] = {{300, 70, 400}, {20, 500, 300}};
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < 4; t++) {
            bool tA = t & 1, tB = t & 2;
            int64_t M = shapes[s].M, N = shapes[s].N, K = shapes[s].K;
            float *A = rnd_array(M * K), *B = rnd_array(K * N);
            float *one = fast_product(1, tA, tB, M, N, K, A, B);
            for (int threads = 2; threads <= 5; threads += 3) {
                float *many = fast_product(threads, tA, tB, M, N, K, A, B);
                cr_expect(memcmp(one, many, (size_t)(M * N) * sizeof *one) == 0,
                          "gemm %lldx%lldx%lld tA %d tB %d: %d threads differ from 1", (long long)M,
                          (long long)N, (long long)K, tA, tB, threads);
                free(many);
            }
            free(one);
            free(A);
            free(B);
        }
}

Test(cpu_fast, gemm_portable_is_the_reference_bitwise)
{
    setenv("HPC_FAST_GEMM_PORTABLE", "1", 1);
    int64_t M = 150, N = 90, K = 333;
    float *A = rnd_array(M * K), *B = rnd_array(K * N);
    for (int t = 0; t < 4; t++) {
        bool tA = t & 1, tB = t & 2;
        float *ref = malloc((size_t)(M * N) * sizeof *ref);
        ck_gemm_f32(tA, tB, M, N, K, 1, A, B, 0, ref);
        float *fast = fast_product(2, tA, tB, M, N, K, A, B);
        cr_expect(memcmp(ref, fast, (size_t)(M * N) * sizeof *ref) == 0, "tA %d tB %d", tA, tB);
        free(ref);
        free(fast);
    }
    free(A);
    free(B);
    unsetenv("HPC_FAST_GEMM_PORTABLE");
}

Test(cpu_fast, gemm_propagates_nan_and_inf)
{
    int64_t M = 40, N = 50, K = 300;
    float *A = rnd_array(M * K), *B = rnd_array(K * N), *C = malloc((size_t)(M * N) * sizeof *C);
    A[7 * K + 299] = NAN;       /* row 7, in the second k block */
    B[3 * N + 20] = INFINITY;   /* column 20 */
    cpu_fast_sgemm(false, false, M, N, K, 1, A, K, B, N, 0, C, N);
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            float c = C[i * N + j];
            if (i == 7) cr_expect(isnan(c), "C[7][%lld] = %g, not NaN", (long long)j, c);
            else if (j == 20) cr_expect(isinf(c) || isnan(c), "C[%lld][20] = %g, not inf", (long long)i, c);
            else cr_expect(isfinite(c), "C[%lld][%lld] = %g", (long long)i, (long long)j, c);
        }
    free(A);
    free(B);
    free(C);
}

/* ---- the other kernels: bitwise ---- */

static void expect_bits(const float *a, const float *b, int64_t n, const char *what, int threads)
{
    int64_t first = -1;
    for (int64_t i = 0; i < n && first < 0; i++)
        if (memcmp(&a[i], &b[i], sizeof *a) != 0) first = i;
    cr_expect(first < 0, "%s on %d threads: element %lld is %.9g, reference %.9g", what, threads,
              (long long)first, first >= 0 ? a[first] : 0.0, first >= 0 ? b[first] : 0.0);
}

Test(cpu_fast, kernels_are_the_reference_bitwise, .timeout = 60)
{
    enum { N = 190, D = 384, B = 5, NH = 3, L = 23 };
    const int64_t n = (int64_t)N * D, sm = (int64_t)B * NH * L * L;
    float *x = rnd_array(n), *dy = rnd_array(n), *gamma = rnd_array(D), *beta = rnd_array(D);
    float *scores = rnd_array(sm), *dprobs = rnd_array(sm);
    int32_t mask[B * L];
    for (int i = 0; i < B * L; i++) mask[i] = i % L < L - i / L * 3; /* rows of different length */
    x[5] = NAN;            /* NaN must land where the reference puts it */
    scores[L + 2] = NAN;
    float *r1 = malloc((size_t)n * sizeof(float)), *f1 = malloc((size_t)n * sizeof(float));
    float *r2 = malloc((size_t)n * sizeof(float)), *f2 = malloc((size_t)n * sizeof(float));
    float rm[N], rr[N], fm[N], fr[N], rg[D], fg[D], rb[D], fb[D];
    for (int threads = 1; threads <= 3; threads++) {
        cpu_threads_set(threads);
        ck_gelu_fwd_f32(r1, x, n);
        fast_unary(ck_gelu_fwd_f32, f1, x, n);
        expect_bits(f1, r1, n, "gelu", threads);
        memset(r1, 0, (size_t)n * sizeof(float));
        memset(f1, 0, (size_t)n * sizeof(float));
        ck_gelu_bwd_f32(r1, dy, x, n);
        fast_binary(ck_gelu_bwd_f32, f1, dy, x, n);
        expect_bits(f1, r1, n, "gelu bwd", threads);
        for (int64_t i = 0; i < n; i++) r1[i] = x[i] + dy[i];
        fast_add_f32(f1, x, dy, n);
        expect_bits(f1, r1, n, "add", threads);
        ck_dropout_fwd_f32(r1, x, n, 0.1f, 99, 7, 3);
        fast_dropout_fwd(f1, x, n, 0.1f, 99, 7, 3);
        expect_bits(f1, r1, n, "dropout", threads);
        memcpy(r1, x, (size_t)n * sizeof(float));
        memcpy(f1, x, (size_t)n * sizeof(float));
        half_round_array(r1, n);
        fast_round(f1, n, false);
        expect_bits(f1, r1, n, "fp16 rounding", threads);
        memcpy(r1, x, (size_t)n * sizeof(float));
        memcpy(f1, x, (size_t)n * sizeof(float));
        ck_bias_add_f32(r1, beta, N, D);
        fast_bias_add(f1, beta, N, D);
        expect_bits(f1, r1, n, "bias add", threads);
        memcpy(rb, gamma, sizeof rb);
        memcpy(fb, gamma, sizeof fb);
        ck_bias_grad_f32(rb, dy, N, D);
        fast_bias_grad(fb, dy, N, D);
        expect_bits(fb, rb, D, "bias grad", threads);
        ck_layernorm_fwd_f32(r1, rm, rr, x, gamma, beta, N, D, 1e-12);
        fast_layernorm_fwd(f1, fm, fr, x, gamma, beta, N, D, 1e-12);
        expect_bits(f1, r1, n, "layernorm", threads);
        expect_bits(fm, rm, N, "layernorm mean", threads);
        expect_bits(fr, rr, N, "layernorm rstd", threads);
        memset(r2, 0, (size_t)n * sizeof(float));
        memset(f2, 0, (size_t)n * sizeof(float));
        memset(rg, 0, sizeof rg), memset(fg, 0, sizeof fg), memset(rb, 0, sizeof rb), memset(fb, 0, sizeof fb);
        ck_layernorm_bwd_f32(r2, rg, rb, dy, x, rm, rr, gamma, N, D);
        fast_layernorm_bwd(f2, fg, fb, dy, x, rm, rr, gamma, N, D);
        expect_bits(f2, r2, n, "layernorm dx", threads);
        expect_bits(fg, rg, D, "layernorm dgamma", threads);
        expect_bits(fb, rb, D, "layernorm dbeta", threads);
        for (int causal = 0; causal <= 1; causal++) {
            ck_attn_softmax_fwd_f32(r1, scores, mask, causal, 0.5, B, NH, L, L);
            fast_softmax_fwd(f1, scores, mask, causal, 0.5, B, NH, L, L);
            expect_bits(f1, r1, sm, causal ? "causal softmax" : "softmax", threads);
        }
        memset(r2, 0, (size_t)sm * sizeof(float));
        memset(f2, 0, (size_t)sm * sizeof(float));
        ck_attn_softmax_bwd_f32(r2, r1, dprobs, 0.5, (int64_t)B * NH * L, L);
        fast_softmax_bwd(f2, r1, dprobs, 0.5, (int64_t)B * NH * L, L);
        expect_bits(f2, r2, sm, "softmax bwd", threads);
        ck_heads_split_f32(r1, x, B, L, NH, 64);
        fast_heads_split(f1, x, B, L, NH, 64);
        expect_bits(f1, r1, (int64_t)B * L * NH * 64, "split heads", threads);
        ck_heads_merge_f32(r1, x, B, L, NH, 64);
        fast_heads_merge(f1, x, B, L, NH, 64);
        expect_bits(f1, r1, (int64_t)B * L * NH * 64, "merge heads", threads);
    }
    /* The NaN went somewhere: gelu's output and layernorm's row 0 carry it. */
    ck_gelu_fwd_f32(r1, x, n);
    cr_expect(isnan(r1[5]));
    fast_layernorm_fwd(f1, fm, fr, x, gamma, beta, N, D, 1e-12);
    cr_expect(isnan(f1[0]) && isnan(f1[D - 1]), "layernorm row with a NaN: %g %g", f1[0], f1[D - 1]);
    cpu_threads_set(0);
    free(x), free(dy), free(gamma), free(beta), free(scores), free(dprobs);
    free(r1), free(f1), free(r2), free(f2);
}

/* ---- a whole bert_tiny training step ---- */

static void bert_tiny(ModelSpec *s)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "bert_tiny");
    s->stack.hidden = 128;
    s->stack.layers = 2;
    s->stack.heads = 2;
    s->stack.ffn = 512;
}

enum { SB = 4, SL = 24 };

static Batch *step_batch(void)
{
    Batch *b = batch_new(SB, SL, false);
    int lens[SB] = {SL, 17, 9, 20};
    for (int r = 0; r < SB; r++) {
        for (int t = 0; t < SL; t++) {
            int i = r * SL + t;
            bool real = t < lens[r];
            b->input_ids[i] = real ? 1000 + (int)(philox_uniform(3, (uint64_t)i, 0, 1) * 20000) : 0;
            b->token_type_ids[i] = real && t > lens[r] / 2;
            b->attention_mask[i] = real;
        }
        b->labels[r] = r % 2;
    }
    return b;
}

typedef struct {
    double loss;
    double **grad;  /* (n) as double; NULL where no gradient */
    int n;
} Step;

/* One forward+backward in `prec`/`mode` on `threads` threads from weights w. */
static Step run_step(const IrGraph *g, const ParamList *pl, float **w, CpuExecPrecision prec,
                     CpuExecMode mode, int threads, const Batch *b)
{
    cpu_threads_set(threads);
    CpuExec ex;
    cpu_exec_init(&ex, g, prec);
    cpu_exec_set_mode(&ex, mode);
    double **wd = calloc((size_t)pl->n, sizeof *wd);
    for (int p = 0; p < pl->n; p++) {
        if (pl->p[p].tied_to >= 0) continue;
        if (prec == CPU_EXEC_F32) {
            cpu_exec_bind_param(&ex, p, w[p]);
            continue;
        }
        int64_t n = params_numel(&pl->p[p]);
        wd[p] = malloc((size_t)n * sizeof(double));
        ck_copy_f32_to_f64(wd[p], w[p], n);
        cpu_exec_bind_param(&ex, p, wd[p]);
    }
    CpuRunOptions o = {.training = true, .backward = true, .seed = 5, .step = 2, .loss_scale = 1};
    HpcError err = {0};
    cr_assert_eq(cpu_exec_run(&ex, b, &o, &err), HPC_OK, "cpu_exec_run: %s", err.msg);
    Step s = {cpu_exec_loss(&ex), calloc((size_t)pl->n, sizeof(double *)), pl->n};
    for (int p = 0; p < pl->n; p++) {
        if (g->param_grad[p] < 0) continue;
        int64_t n = params_numel(&pl->p[p]);
        const void *v = cpu_exec_value(&ex, g->param_grad[p]);
        s.grad[p] = malloc((size_t)n * sizeof(double));
        for (int64_t k = 0; k < n; k++)
            s.grad[p][k] = prec == CPU_EXEC_F64 ? ((const double *)v)[k] : ((const float *)v)[k];
    }
    for (int p = 0; p < pl->n; p++) free(wd[p]);
    free(wd);
    cpu_exec_free(&ex);
    cpu_threads_set(0);
    return s;
}

static void step_free(Step *s)
{
    for (int p = 0; p < s->n; p++) free(s->grad[p]);
    free(s->grad);
}

static double rel(const double *a, const double *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t k = 0; k < n; k++) {
        num += (a[k] - b[k]) * (a[k] - b[k]);
        den += b[k] * b[k];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* The largest normwise relative error of a's gradients against b's (NaN
 * if any is NaN), key biases aside; the loss's relative error in *loss_rel. */
static double worst_rel(const Step *a, const Step *b, const ParamList *pl, double *loss_rel)
{
    *loss_rel = fabs(a->loss - b->loss) / fabs(b->loss);
    double worst = 0;
    for (int p = 0; p < pl->n; p++) {
        if (!a->grad[p] || !b->grad[p]) continue;
        /* The key bias's exact gradient is 0 (softmax is shift invariant):
         * what each executor gets is rounding noise, relative to nothing. */
        if (strstr(pl->p[p].name, "key.bias")) continue;
        double e = rel(a->grad[p], b->grad[p], params_numel(&pl->p[p]));
        if (!(e <= worst)) worst = e; /* NaN sticks */
    }
    return worst;
}

static float **tiny_weights(const ParamList *pl)
{
    float **w = calloc((size_t)pl->n, sizeof *w);
    for (int p = 0; p < pl->n; p++) {
        if (pl->p[p].tied_to >= 0) continue;
        int64_t n = params_numel(&pl->p[p]);
        bool gamma = strstr(pl->p[p].name, "LayerNorm.weight") != NULL;
        w[p] = malloc((size_t)n * sizeof(float));
        for (int64_t k = 0; k < n; k++) w[p][k] = (gamma ? 1.0f : 0.0f) + 0.08f * rnd();
    }
    return w;
}

static void step_compare(SpecPrecision policy, double tol)
{
    ModelSpec s;
    bert_tiny(&s);
    Pipeline pipe;
    PipeOptions po = pipeline_defaults(policy);
    HpcError err = {0};
    cr_assert_eq(pipeline_build(&s, &po, &pipe, &err), HPC_OK, "%s", err.msg);
    float **w = tiny_weights(&pipe.pl);
    Batch *b = step_batch();
    Step ref = run_step(&pipe.g, &pipe.pl, w, CPU_EXEC_F32, CPU_EXEC_REFERENCE, 1, b);
    Step fast = run_step(&pipe.g, &pipe.pl, w, CPU_EXEC_F32, CPU_EXEC_FAST, 3, b);
    double lrel, grel = worst_rel(&fast, &ref, &pipe.pl, &lrel);
    cr_expect(lrel <= tol && grel <= tol, "%s: fast vs reference: loss rel %.3g, worst gradient rel %.3g > %.3g",
              spec_precision_name(policy), lrel, grel, tol);
    cr_log_info("%s: fast vs reference: loss rel %.3g, worst gradient rel %.3g", spec_precision_name(policy),
                lrel, grel);
    if (policy == PREC_FP32) {
        /* As close to exact as the reference is. */
        Step exact = run_step(&pipe.g, &pipe.pl, w, CPU_EXEC_F64, CPU_EXEC_REFERENCE, 1, b);
        double lf, lr, gf = worst_rel(&fast, &exact, &pipe.pl, &lf), gr = worst_rel(&ref, &exact, &pipe.pl, &lr);
        cr_expect(gf <= gr + 1e-6 && lf <= lr + 1e-6, "fast vs f64: loss %.3g grad %.3g; reference vs f64: "
                  "loss %.3g grad %.3g", lf, gf, lr, gr);
        cr_log_info("vs f64: fast loss %.3g grad %.3g, reference loss %.3g grad %.3g", lf, gf, lr, gr);
        step_free(&exact);
        /* The thread count changes nothing. */
        Step one = run_step(&pipe.g, &pipe.pl, w, CPU_EXEC_F32, CPU_EXEC_FAST, 1, b);
        cr_expect(memcmp(&one.loss, &fast.loss, sizeof one.loss) == 0, "loss %.17g on 1 thread, %.17g on 3",
                  one.loss, fast.loss);
        for (int p = 0; p < pipe.pl.n; p++)
            if (one.grad[p])
                cr_expect(memcmp(one.grad[p], fast.grad[p], (size_t)params_numel(&pipe.pl.p[p]) * sizeof(double)) == 0,
                          "gradient of %s differs between 1 and 3 threads", pipe.pl.p[p].name);
        step_free(&one);
        /* A NaN weight makes the loss NaN in both modes. */
        w[pipe.pl.n - 1][0] = NAN; /* the classifier's last tensor */
        Step nr = run_step(&pipe.g, &pipe.pl, w, CPU_EXEC_F32, CPU_EXEC_REFERENCE, 1, b);
        Step nf = run_step(&pipe.g, &pipe.pl, w, CPU_EXEC_F32, CPU_EXEC_FAST, 2, b);
        cr_expect(isnan(nr.loss) && isnan(nf.loss), "NaN weight: loss %g (reference), %g (fast)", nr.loss, nf.loss);
        step_free(&nr);
        step_free(&nf);
    }
    step_free(&ref);
    step_free(&fast);
    batch_free(b);
    for (int p = 0; p < pipe.pl.n; p++) free(w[p]);
    free(w);
    pipeline_free(&pipe);
}

Test(cpu_fast, bert_tiny_step_fp32_matches_the_reference, .timeout = 120)
{
    step_compare(PREC_FP32, 1e-5);
}

Test(cpu_fast, bert_tiny_step_fp16_matches_the_reference, .timeout = 120)
{
    step_compare(PREC_FP16, 1e-6);
}

/* ---- hpc run: --threads and --cpu-reference reach the executor ---- */

/* Runs bin/hpc run on bert_tiny (3 steps) with extra options; the step
 * losses from its JSONL log into loss[3]; the console into out. */
static void cli_losses(const char *extra, double loss[3], char *out, size_t cap)
{
    const char *root = getenv("HPC_ROOT") ? getenv("HPC_ROOT") : ".";
    char log[256], cmd[2048];
    snprintf(log, sizeof log, "/tmp/hpc_test_cpu_fast_%d.jsonl", (int)getpid());
    snprintf(cmd, sizeof cmd, "cd %s && bin/hpc run models/bert_tiny.model --device cpu --steps 3 "
             "--seq-len 16 --train-rows 96 --log %s %s 2>&1", root, log, extra);
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen");
    size_t n = fread(out, 1, cap - 1, p);
    out[n] = 0;
    cr_assert_eq(pclose(p), 0, "%s:\n%s", cmd, out);
    FILE *f = fopen(log, "r");
    cr_assert(f, "no log %s", log);
    char line[4096];
    int got = 0;
    while (fgets(line, sizeof line, f) && got < 3) {
        const char *l = strstr(line, "\"loss\":");
        if (strstr(line, "\"event\":\"step\"") && l && sscanf(l + 7, "%lf", &loss[got]) == 1) got++;
    }
    fclose(f);
    remove(log);
    cr_assert_eq(got, 3, "%d step losses in the log of `%s`", got, extra);
}

Test(cpu_fast, hpc_run_threads_and_reference_options, .timeout = 300)
{
    char out[16384];
    double one[3], three[3], ref[3];
    cli_losses("--threads 1", one, out, sizeof out);
    cr_expect(strstr(out, "cpu (fast: 1 thread,"), "%s", out);
    cli_losses("--threads 3", three, out, sizeof out);
    cr_expect(strstr(out, "cpu (fast: 3 threads"), "%s", out);
    cli_losses("--cpu-reference", ref, out, sizeof out);
    cr_expect(strstr(out, "backend cpu, ") || strstr(out, "on cpu,"), "%s", out);
    cr_expect(!strstr(out, "fast:"), "--cpu-reference still ran the fast mode:\n%s", out);
    for (int s = 0; s < 3; s++) {
        cr_expect(one[s] == three[s], "step %d: loss %.17g on 1 thread, %.17g on 3", s + 1, one[s], three[s]);
        cr_expect(fabs(one[s] - ref[s]) <= 1e-5 * fabs(ref[s]), "step %d: fast %.17g, reference %.17g",
                  s + 1, one[s], ref[s]);
    }
}
