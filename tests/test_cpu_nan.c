/* tests/test_cpu_nan.c — NaN and inf travel through every cpu kernel.
 *
 * A corrupt number must never come out of the cpu backend as a finite one:
 * PyTorch and the CUDA kernels propagate NaN, so the reference does too.
 * Each kernel gets random (never zero) inputs with one NaN (or inf) planted
 * at a random place; the test checks that the outputs that depend on it are
 * NaN and that the outputs that do not are finite (so a kernel that writes
 * NaN everywhere fails as well).  Then the pieces around the kernels: the
 * optimizer's found_inf and the loss scaler, the scoring of NaN
 * predictions, and a whole bert_tiny-shaped model whose query weight holds
 * one NaN (its logits and loss must be NaN, not finite as when the softmax
 * wrote a NaN row as if it were masked). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_exec.h"
#include "cpu/cpu_kernels.h"
#include "cpu/philox.h"
#include "data/batch.h"
#include "data/tasks.h"
#include "lower.h"
#include "train/lossscale.h"
#include "train/optim.h"

/* Uniform in [-1, 1) keyed by (seed, i), never 0. */
static double urand(uint64_t seed, uint64_t i)
{
    double u = 2.0 * philox_uniform(seed, i, 0, 7) - 1.0;
    return u == 0 ? 0.25 : u;
}

static float *rand_f32(int64_t n, uint64_t seed)
{
    float *x = malloc((size_t)n * sizeof *x);
    cr_assert(x);
    for (int64_t i = 0; i < n; i++) x[i] = (float)urand(seed, (uint64_t)i);
    return x;
}

static double *rand_f64(int64_t n, uint64_t seed)
{
    double *x = malloc((size_t)n * sizeof *x);
    cr_assert(x);
    for (int64_t i = 0; i < n; i++) x[i] = urand(seed, (uint64_t)i);
    return x;
}

/* A random index in [0, n). */
static int64_t pick(uint64_t seed, int64_t n) { return (int64_t)(philox_uniform(seed, 0, 1, 3) * (double)n) % n; }

static void expect_row_nan(const float *x, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++) cr_expect(isnan(x[i]), "%s[%lld] = %g, want NaN", what, (long long)i, x[i]);
}

static void expect_row_finite(const float *x, int64_t n, const char *what)
{
    for (int64_t i = 0; i < n; i++) cr_expect(isfinite(x[i]), "%s[%lld] = %g, want finite", what, (long long)i, x[i]);
}

/* ---- attention softmax -------------------------------------------------- */

/* Scores (B=2, NH=2, L=9, L=9), padding in batch row 1: a NaN (or inf) in
 * row `bad` makes that row's visible probs NaN; masked ones stay 0; every
 * other row is finite and sums to 1. */
static void softmax_case(float poison, bool causal)
{
    enum { B = 2, NH = 2, L = 9 };
    int64_t rows = B * NH * L, n = rows * L;
    float *s = rand_f32(n, 11), *p = malloc((size_t)n * sizeof *p);
    int32_t mask[B * L];
    for (int i = 0; i < B * L; i++) mask[i] = i < L || i % L < 6;
    int64_t bad = (B * NH - 1) * L + 7;        /* batch row 1, head 1, query 7 */
    int64_t key = 2;                          /* visible to query 7 in either mode */
    s[bad * L + key] = poison;
    ck_attn_softmax_fwd_f32(p, s, mask, causal, 0.125, B, NH, L, L);
    for (int64_t r = 0; r < rows; r++) {
        int64_t b = r / (NH * L), q = r % L;
        double sum = 0;
        for (int64_t k = 0; k < L; k++) {
            bool vis = mask[b * L + k] && (!causal || k <= q);
            float v = p[r * L + k];
            if (!vis) cr_expect_eq(v, 0.0f, "row %lld key %lld masked but %g", (long long)r, (long long)k, v);
            else if (r == bad) cr_expect(isnan(v), "row %lld key %lld: %g, want NaN", (long long)r, (long long)k, v);
            else cr_expect(isfinite(v), "row %lld key %lld: %g", (long long)r, (long long)k, v);
            sum += vis ? v : 0;
        }
        if (r != bad) cr_expect(fabs(sum - 1) < 1e-6, "row %lld sums to %g", (long long)r, sum);
    }
    free(s);
    free(p);
}

Test(nan_softmax, nan_score_gives_nan_row) { softmax_case(NAN, false); }
Test(nan_softmax, nan_score_gives_nan_row_causal) { softmax_case(NAN, true); }
Test(nan_softmax, inf_score_gives_nan_row) { softmax_case(INFINITY, false); }

Test(nan_softmax, fully_masked_row_stays_zero)
{
    enum { L = 5 };
    float s[L * L], p[L * L];
    for (int i = 0; i < L * L; i++) s[i] = (float)urand(3, (uint64_t)i);
    int32_t mask[L] = {0, 0, 0, 0, 0};
    ck_attn_softmax_fwd_f32(p, s, mask, false, 1.0, 1, 1, L, L);
    for (int i = 0; i < L * L; i++) cr_expect_eq(p[i], 0.0f);
}

Test(nan_softmax, f64_and_backward)
{
    enum { L = 6 };
    double *s = rand_f64(2 * L, 5), p[2 * L], dp[2 * L], ds[2 * L] = {0};
    s[3] = NAN;                                 /* row 0 */
    ck_attn_softmax_fwd_f64(p, s, NULL, false, 1.0, 1, 1, 2, L);
    for (int k = 0; k < L; k++) {
        cr_expect(isnan(p[k]), "f64 row 0 key %d: %g", k, p[k]);
        cr_expect(isfinite(p[L + k]));
    }
    float pf[2 * L], dpf[2 * L], dsf[2 * L] = {0};
    for (int i = 0; i < 2 * L; i++) {
        pf[i] = 1.0f / L;
        dpf[i] = (float)urand(6, (uint64_t)i);
        dp[i] = dpf[i];
    }
    dpf[L + 1] = NAN;                           /* row 1's upstream gradient */
    ck_attn_softmax_bwd_f32(dsf, pf, dpf, 1.0, 2, L);
    expect_row_finite(dsf, L, "dscores row 0");
    expect_row_nan(dsf + L, L, "dscores row 1");
    ck_attn_softmax_bwd_f64(ds, p, dp, 1.0, 2, L);
    for (int k = 0; k < L; k++) cr_expect(isnan(ds[k]) && isfinite(ds[L + k]));
    free(s);
}

/* ---- layernorm ---------------------------------------------------------- */

Test(nan_layernorm, forward_and_backward)
{
    enum { N = 4, D = 33 };
    float *x = rand_f32(N * D, 21), *g = rand_f32(D, 22), *be = rand_f32(D, 23), y[N * D], mean[N], rstd[N];
    int64_t bad = 2 * D + pick(24, D);
    x[bad] = NAN;
    ck_layernorm_fwd_f32(y, mean, rstd, x, g, be, N, D, 1e-12);
    for (int r = 0; r < N; r++) {
        if (r == 2) expect_row_nan(y + r * D, D, "y row 2");
        else expect_row_finite(y + r * D, D, "y");
    }
    cr_expect(isnan(mean[2]) && isfinite(mean[1]));
    /* Backward from a clean forward, a NaN in dy of row 1. */
    x[bad] = 0.5f;
    ck_layernorm_fwd_f32(y, mean, rstd, x, g, be, N, D, 1e-12);
    float *dy = rand_f32(N * D, 25), dx[N * D] = {0}, dg[D] = {0}, db[D] = {0};
    dy[1 * D + 4] = NAN;
    ck_layernorm_bwd_f32(dx, dg, db, dy, x, mean, rstd, g, N, D);
    for (int r = 0; r < N; r++) {
        if (r == 1) expect_row_nan(dx + r * D, D, "dx row 1");
        else expect_row_finite(dx + r * D, D, "dx");
    }
    cr_expect(isnan(dg[4]) && isnan(db[4]), "dgamma %g dbeta %g", dg[4], db[4]);
    cr_expect(isfinite(dg[5]) && isfinite(db[5]));
    free(x), free(g), free(be), free(dy);
}

Test(nan_layernorm, inf_input_is_not_finite)
{
    enum { D = 16 };
    float *x = rand_f32(D, 26), g[D], b[D], y[D], mean[1], rstd[1];
    for (int d = 0; d < D; d++) g[d] = 1, b[d] = 0.1f;
    x[pick(27, D)] = INFINITY;
    ck_layernorm_fwd_f32(y, mean, rstd, x, g, b, 1, D, 1e-5);
    for (int d = 0; d < D; d++) cr_expect(!isfinite(y[d]), "y[%d] = %g", d, y[d]);
    free(x);
}

/* ---- activations -------------------------------------------------------- */

typedef void (*ActFwd)(float *, const float *, int64_t);
typedef void (*ActBwd)(float *, const float *, const float *, int64_t);

/* NaN in x: y NaN there only; NaN in dy: dx NaN there only. */
static void activation_case(const char *name, ActFwd fwd, ActBwd bwd, uint64_t seed)
{
    enum { N = 257 };
    float *x = rand_f32(N, seed), y[N], *dy = rand_f32(N, seed + 1), dx[N] = {0};
    int64_t i = pick(seed, N), j = (i + 100) % N;
    x[i] = NAN;
    fwd(y, x, N);
    for (int64_t k = 0; k < N; k++)
        cr_expect(k == i ? isnan(y[k]) : isfinite(y[k]), "%s(x)[%lld] = %g", name, (long long)k, y[k]);
    x[i] = 0.3f;
    fwd(y, x, N);
    dy[j] = NAN;
    bwd(dx, dy, name[0] == 't' ? y : x, N);   /* tanh's bwd takes the output */
    for (int64_t k = 0; k < N; k++)
        if (k == j) cr_expect(isnan(dx[k]) || (name[0] == 'r' && x[k] <= 0), "%s dx[%lld] = %g", name, (long long)k, dx[k]);
        else cr_expect(isfinite(dx[k]), "%s dx[%lld] = %g", name, (long long)k, dx[k]);
    free(x);
    free(dy);
}

Test(nan_activation, gelu) { activation_case("gelu", ck_gelu_fwd_f32, ck_gelu_bwd_f32, 31); }
Test(nan_activation, gelu_tanh) { activation_case("gelu_tanh", ck_gelu_tanh_fwd_f32, ck_gelu_tanh_bwd_f32, 32); }
Test(nan_activation, relu) { activation_case("relu", ck_relu_fwd_f32, ck_relu_bwd_f32, 33); }
Test(nan_activation, tanh) { activation_case("tanh", ck_tanh_fwd_f32, ck_tanh_bwd_f32, 34); }

Test(nan_activation, relu_keeps_nan_in_f64_and_passes_dy_at_nan)
{
    double x[3] = {NAN, -1.0, 2.0}, y[3], dy[3] = {0.5, 0.5, 0.5}, dx[3] = {0};
    ck_relu_fwd_f64(y, x, 3);
    cr_expect(isnan(y[0]) && y[1] == 0 && y[2] == 2);
    ck_relu_bwd_f64(dx, dy, x, 3);
    cr_expect(dx[0] == 0.5 && dx[1] == 0 && dx[2] == 0.5, "%g %g %g", dx[0], dx[1], dx[2]);
}

/* ---- dropout, embedding, layout ----------------------------------------- */

Test(nan_misc, dropout_keeps_a_kept_nan)
{
    enum { N = 64 };
    float *x = rand_f32(N, 41), y[N];
    for (int i = 0; i < N; i++) x[i] = NAN;
    ck_dropout_fwd_f32(y, x, N, 0.25f, 9, 1, 2);
    int kept = 0;
    for (int i = 0; i < N; i++) {
        bool keep = philox_dropout_keep(9, (uint64_t)i, 1, 2, 0.25f);
        kept += keep;
        cr_expect(keep ? isnan(y[i]) : y[i] == 0, "y[%d] = %g", i, y[i]);
    }
    cr_expect(kept > 0);
    free(x);
}

Test(nan_misc, embedding_copies_a_nan_row)
{
    enum { V = 7, D = 5 };
    float *t = rand_f32(V * D, 42), out[3 * D];
    t[4 * D + 2] = NAN;
    int32_t ids[3] = {1, 4, 6};
    cr_assert_eq(ck_embedding_fwd_f32(out, t, ids, 3, V, D, NULL), HPC_OK);
    for (int i = 0; i < 3 * D; i++) cr_expect(i == D + 2 ? isnan(out[i]) : isfinite(out[i]));
    free(t);
}

/* ---- gemm and bias ------------------------------------------------------ */

Test(nan_gemm, nan_in_a_poisons_its_row_nan_in_b_its_column)
{
    enum { M = 5, N = 6, K = 300 };   /* K past one 256 block */
    float *A = rand_f32(M * K, 51), *B = rand_f32(K * N, 52), C[M * N];
    A[2 * K + 280] = NAN;
    B[17 * N + 4] = INFINITY;
    ck_gemm_f32(false, false, M, N, K, 1.0f, A, B, 0.0f, C);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float v = C[i * N + j];
            if (i == 2) cr_expect(isnan(v), "C[%d][%d] = %g", i, j, v);
            else if (j == 4) cr_expect(!isfinite(v), "C[%d][%d] = %g", i, j, v);
            else cr_expect(isfinite(v), "C[%d][%d] = %g", i, j, v);
        }
    free(A);
    free(B);
}

Test(nan_gemm, bias_add_and_grad)
{
    enum { N = 3, D = 300 };
    float *y = rand_f32(N * D, 53), *b = rand_f32(D, 54), db[D] = {0};
    b[7] = NAN;
    ck_bias_add_f32(y, b, N, D);
    for (int i = 0; i < N * D; i++) cr_expect(i % D == 7 ? isnan(y[i]) : isfinite(y[i]));
    y[D + 290] = NAN;   /* column 290, in the second chunk */
    ck_bias_grad_f32(db, y, N, D);
    for (int d = 0; d < D; d++) cr_expect(d == 7 || d == 290 ? isnan(db[d]) : isfinite(db[d]), "db[%d]", d);
    free(y);
    free(b);
}

/* ---- losses and reductions ---------------------------------------------- */

Test(nan_loss, cross_entropy)
{
    enum { N = 4, C = 3 };
    float *lg = rand_f32(N * C, 61), dl[N * C] = {0};
    int32_t labels[N] = {0, 2, CK_IGNORE_INDEX, 1};
    double loss = 0;
    lg[1 * C + 0] = NAN;                         /* row 1, not its label */
    cr_assert_eq(ck_xent_fwd_f32(&loss, lg, labels, N, C, NULL), HPC_OK);
    cr_expect(isnan(loss), "loss %g", loss);
    ck_xent_bwd_f32(dl, lg, labels, N, C, 1.0);
    for (int i = 0; i < N * C; i++) {
        int r = i / C;
        if (r == 1) cr_expect(isnan(dl[i]), "dlogits[%d] = %g", i, dl[i]);
        else if (r == 2) cr_expect_eq(dl[i], 0.0f);
        else cr_expect(isfinite(dl[i]), "dlogits[%d] = %g", i, dl[i]);
    }
    lg[1 * C + 0] = INFINITY;                    /* +inf logit: loss not finite either */
    cr_assert_eq(ck_xent_fwd_f32(&loss, lg, labels, N, C, NULL), HPC_OK);
    cr_expect(!isfinite(loss), "loss %g", loss);
    lg[1 * C + 0] = 0.5f;
    lg[2 * C + 1] = NAN;                         /* an ignored row: does not count */
    cr_assert_eq(ck_xent_fwd_f32(&loss, lg, labels, N, C, NULL), HPC_OK);
    cr_expect(isfinite(loss), "loss %g", loss);
    free(lg);
}

Test(nan_loss, mse)
{
    enum { N = 9 };
    float *p = rand_f32(N, 62), *t = rand_f32(N, 63), d[N] = {0};
    t[4] = NAN;
    cr_expect(isnan(ck_mse_fwd_f32(p, t, N)));
    ck_mse_bwd_f32(d, p, t, N, 1.0);
    for (int i = 0; i < N; i++) cr_expect(i == 4 ? isnan(d[i]) : isfinite(d[i]));
    free(p);
    free(t);
}

Test(nan_loss, reductions)
{
    enum { N = 100 };
    float *x = rand_f32(N, 64);
    cr_expect(isfinite(ck_sum_f32(x, N)) && !ck_any_nonfinite_f32(x, N) && isfinite(ck_max_abs_f32(x, N)));
    x[pick(65, N)] = NAN;
    cr_expect(isnan(ck_sum_f32(x, N)));
    cr_expect(isnan(ck_max_abs_f32(x, N)));
    cr_expect(ck_any_nonfinite_f32(x, N));
    x[0] = -INFINITY;
    cr_expect(ck_any_nonfinite_f32(x, 1) && isinf(ck_max_abs_f32(x, 1)));
    double *y = rand_f64(N, 66);
    y[N - 1] = NAN;
    cr_expect(isnan(ck_sum_f64(y, N)) && isnan(ck_max_abs_f64(y, N)) && ck_any_nonfinite_f64(y, N));
    free(x);
    free(y);
}

/* ---- optimizer, loss scaler, scoring ------------------------------------ */

Test(nan_train, found_inf_skips_the_step_and_backs_off)
{
    enum { N = 40 };
    float *w = rand_f32(N, 71), *g = rand_f32(N, 72), m[N] = {0}, v[N] = {0}, w0[N];
    memcpy(w0, w, sizeof w0);
    g[pick(73, N)] = NAN;
    OptimConfig cfg = {.kind = OPT_ADAMW, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .weight_decay = 0.01,
                       .max_grad_norm = 1.0};
    OptimState st = {0};
    OptimTensor t = {.master = w, .grad = g, .m = m, .v = v, .n = N, .decay = true};
    OptimReport rep;
    optim_step(&cfg, &st, &t, 1, 1.0f / 1024, 1e-3, &rep);
    cr_expect(rep.found_inf, "a NaN gradient must be found");
    cr_expect(!isfinite(rep.grad_norm), "grad norm %g", rep.grad_norm);
    cr_expect_eq(st.step, 0);
    cr_expect(memcmp(w, w0, sizeof w0) == 0, "weights changed on a skipped step");
    for (int i = 0; i < N; i++) cr_expect(m[i] == 0 && v[i] == 0);
    LossScaleConfig lc;
    ls_config_default(&lc);
    LossScaler ls;
    ls_init(&ls, &lc);
    double before = ls.scale;
    cr_expect(ls_update(&ls, rep.found_inf), "the step must be skipped");
    cr_expect_eq(ls.scale, before * 0.5);
    free(w);
    free(g);
}

Test(nan_train, nan_predictions_score_as_nan)
{
    TaskData t;
    memset(&t, 0, sizeof t);
    t.num_labels = 2;
    t.main_metric = METRIC_ACCURACY;
    Example ex[3] = {{.label = 0}, {.label = 1}, {.label = 1}};
    Dataset d = {.n = 3, .ex = ex};
    int32_t pred[3] = {0, TASK_PRED_NONFINITE, 1};
    TaskScores sc;
    cr_assert_eq(task_evaluate(&t, &d, pred, NULL, &sc), HPC_OK);
    cr_expect(isnan(sc.main_value), "accuracy %g from a NaN prediction", sc.main_value);
    pred[1] = 1;
    cr_assert_eq(task_evaluate(&t, &d, pred, NULL, &sc), HPC_OK);
    cr_expect_eq(sc.main_value, 1.0);
}

/* ---- a whole model ------------------------------------------------------ */

/* bert_tiny-shaped classifier (hidden 16, 2 heads, 2 layers), random
 * weights, one NaN in layer 0's query weight: every logit and the loss are
 * NaN.  Before, the softmax wrote the NaN rows as if masked and the model
 * printed finite numbers. */
Test(nan_model, nan_query_weight_gives_nan_logits, .timeout = 60)
{
    enum { B = 2, L = 8 };
    ModelSpec s;
    spec_defaults(&s);
    snprintf(s.name, sizeof s.name, "nan_tiny");
    s.stack.vocab_size = 50;
    s.stack.max_positions = 16;
    s.stack.hidden = 16;
    s.stack.heads = 2;
    s.stack.layers = 2;
    s.stack.ffn = 32;
    s.head.num_labels = 3;
    IrGraph g;
    ParamList pl;
    ir_init(&g);
    params_init(&pl);
    HpcError err = {0};
    cr_assert_eq(lower_model(&s, &g, &pl, &err), HPC_OK, "%s", err.msg);
    float **w = calloc((size_t)pl.n, sizeof *w);
    int query = -1;
    for (int i = 0; i < pl.n; i++) {
        if (pl.p[i].tied_to >= 0) continue;
        int64_t n = params_numel(&pl.p[i]);
        w[i] = rand_f32(n, 100 + (uint64_t)i);
        for (int64_t k = 0; k < n; k++) w[i][k] *= 0.3f;
        if (strcmp(pl.p[i].name, "bert.encoder.layer.0.attention.self.query.weight") == 0) query = i;
    }
    cr_assert(query >= 0, "no query weight among %d parameters", pl.n);
    Batch *b = batch_new(B, L, 1);
    for (int i = 0; i < B * L; i++) {
        b->input_ids[i] = 1 + (int32_t)(philox_uniform(5, (uint64_t)i, 0, 0) * 49);
        b->token_type_ids[i] = 0;
        b->attention_mask[i] = i < L + 5;   /* row 1 padded */
    }
    b->labels[0] = 1, b->labels[1] = 2;
    CpuExec ex;
    g.n_params = pl.n;
    CpuRunOptions o = {.training = false, .backward = false, .seed = 1, .loss_scale = 1};
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) w[query][pick(7, params_numel(&pl.p[query]))] = NAN;
        cpu_exec_init(&ex, &g, CPU_EXEC_F32);
        for (int p = 0; p < pl.n; p++) cpu_exec_bind_param(&ex, p, w[pl.p[p].tied_to >= 0 ? pl.p[p].tied_to : p]);
        cr_assert_eq(cpu_exec_run(&ex, b, &o, &err), HPC_OK, "%s", err.msg);
        const float *lg = cpu_exec_value(&ex, g.logits);
        for (int i = 0; i < B * 3; i++)
            cr_expect(pass ? isnan(lg[i]) : isfinite(lg[i]), "pass %d logit %d = %g", pass, i, lg[i]);
        double loss = cpu_exec_loss(&ex);
        cr_expect(pass ? isnan(loss) : isfinite(loss), "pass %d loss %g", pass, loss);
        cpu_exec_free(&ex);
    }
    batch_free(b);
    for (int i = 0; i < pl.n; i++) free(w[i]);
    free(w);
    params_free(&pl);
    ir_free(&g);
}
