/* tests/test_ln_xhat.c — HPC_LN_SAVE=xhat: the fused LayerNorm sites save
 * xhat = (s - mean) * rstd in f16 (and rstd) for the backward instead of the
 * f32 input s and mean (compiler/fuse_layernorm.c), on the cpu backend.
 *
 *  - one site (tests/ln_site_graph.h) under f16 and bf16 storage: the pass
 *    switches it (FuseStats.ln_saved_xhat), the graph has no mean and an f16
 *    output 3; the forward (y, y16, rstd) is bit for bit the default's, xhat
 *    is the f16 rounding of (s - mean) * rstd of the default run (within
 *    one f16 rounding step, |xhat| <= sqrt(D)); the backward values are
 *    within the f16 rounding of xhat of the default's (relative L2), the
 *    dropout zeros are the default's, nothing is NaN; in f64 (no rounding)
 *    it is the default's to 1e-12; the cpu fast mode runs the reference;
 *  - an f32 site (the fp32 policy) is left as it is;
 *  - HPC_LN_SAVE=bogus is refused, naming the choices;
 *  - models/bert_tiny.model, a random step under fp16 and bf16: the loss is
 *    the default's bit for bit (the forward is unchanged); without dropout
 *    (the f32 graph's salts differ) every gradient is about as close to the
 *    f32 reference as the default's (1.3x + 2^-11: one more f16 rounding and
 *    the 16-bit chain's noise) and the whole gradient within 1%; with
 *    dropout the gradients are within the 16-bit tolerance of the default's
 *    (5e-4 fp16, 2e-3 bf16; measured 6e-5, 1.4e-4); no NaN;
 *  - models/bert_base.model plans at 32 x 128 (fp16, bf16) and 256 x 128
 *    (fp16): the bytes live into the backward pass drop by exactly
 *    sites x (bytes of s - bytes of xhat + bytes of mean), from the shapes,
 *    and the arena by at least 95% of that; fp32's plan is unchanged;
 *  - HPC_LN_SAVE=xhat_dw (compiler/fuse_ln_dw.c): in f64 every bert_tiny
 *    gradient is the default's to 1e-12 (the algebra of LN_DW_FIX); under
 *    fp16 as close to f32 as above; bert_base's plan loses the 23 y16 that
 *    dW GEMMs read from the bytes live into the backward, exactly;
 *  - the site's CUDA kernels with xhat compile with NVRTC (sm_80, sm_90) at
 *    the row sizes tests/gpu/gpu_lnfuse.c runs, and their text differs from
 *    the default's (so the kernel cache keeps them apart); a whole bert_tiny
 *    fp16 module under xhat_dw compiles. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/plan_graph.h"
#include "compiler/spec_load.h"
#include "cpu/cpu_exec.h"
#include "cpu_step.h"
#include "cpu/half.h"
#include "cuda/nvrtc_compile.h"
#include "data/batch.h"
#include "emit_ops.h"
#include "fuse.h"
#include "fuse_qkv.h"
#include "ln_site_graph.h"
#include "module_compiles.h"
#include "pipeline.h"
#include "program/plan.h"
#include "program/spec.h"

/* The BERT-base plan sizes below assume every layer runs every token: the
 * last layer lowered for token 0 (compiler/lower.h) has its own tests,
 * tests/test_first_token.c. */
__attribute__((constructor)) static void pin_last_layer_all(void) { setenv("HPC_LAST_LAYER", "all", 1); }

static uint64_t g_rng = 0x853c49e6748fea9bull;
static double uniform(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

/* ---- one site ----------------------------------------------------------- */

/* The site fused with HPC_LN_SAVE set to `save` (NULL: "s", the rule
 * before xhat became the default, the baseline every case compares with). */
static int fuse_with(const LnSite *u, LnSite *f, const char *save, FuseStats *st)
{
    setenv("HPC_LN_SAVE", save ? save : "s", 1);
    HpcError err = {0};
    int n = ln_site_fuse(u, f, st, &err);
    unsetenv("HPC_LN_SAVE");
    cr_assert_eq(n, 2, "%s", err.msg);
    return n;
}

static void *site_data(const ParamList *pl, bool f64)
{
    void **w = calloc((size_t)pl->n, sizeof *w);
    for (int p = 0; p < pl->n; p++) {
        int64_t n = params_numel(&pl->p[p]);
        w[p] = malloc((size_t)n * (f64 ? sizeof(double) : sizeof(float)));
        for (int64_t i = 0; i < n; i++) {
            float v = (float)(pl->p[p].init == PARAM_INIT_ONES ? 1.0 + 0.5 * uniform() : 2.0 * uniform());
            if (p == 0 && i % 7 == 0) v *= 40.0f;   /* x: a few large entries, a wide row */
            if (f64) ((double *)w[p])[i] = v;
            else ((float *)w[p])[i] = v;
        }
    }
    return w;
}

static void run_site(CpuExec *ex, const LnSite *t, CpuExecPrecision prec, void **w, bool fast)
{
    cpu_exec_init(ex, &t->g, prec);
    if (fast) cpu_exec_set_mode(ex, CPU_EXEC_FAST);
    for (int p = 0; p < t->pl.n; p++) cpu_exec_bind_param(ex, p, w[p]);
    Batch *b = batch_new(1, 1, 0);
    CpuRunOptions o = {.training = true, .backward = true, .seed = 7, .step = 3, .loss_scale = 1};
    HpcError err = {0};
    cr_assert_eq(cpu_exec_run(ex, b, &o, &err), HPC_OK, "%s", err.msg);
    batch_free(b);
}

static double at(const CpuExec *ex, int v, int64_t i, CpuExecPrecision prec)
{
    const void *p = cpu_exec_value(ex, v);
    return prec == CPU_EXEC_F64 ? ((const double *)p)[i] : ((const float *)p)[i];
}

/* Relative L2 of value k of the xhat graph against the default's; NaN when
 * either side has a non-finite entry. */
static double rel_l2(const CpuExec *a, const LnSite *fa, const CpuExec *b, const LnSite *fb, int k,
                     CpuExecPrecision prec)
{
    int va = fa->v[k], vb = fb->v[k];
    cr_assert(va >= 0 && vb >= 0, "%s missing", ln_site_value_name[k]);
    int64_t n = cpu_exec_numel(a, va);
    cr_assert_eq(n, cpu_exec_numel(b, vb));
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        double x = at(a, va, i, prec), y = at(b, vb, i, prec);
        if (!isfinite(x) || !isfinite(y)) return NAN;
        d += (x - y) * (x - y);
        r += y * y;
    }
    return r > 0 ? sqrt(d / r) : sqrt(d);
}

static void xhat_site_case(int64_t R, int64_t D, DType low, CpuExecPrecision prec, bool fast)
{
    char what[96];
    snprintf(what, sizeof what, "R=%lld D=%lld %s %s%s", (long long)R, (long long)D, ir_dtype_name(low),
             prec == CPU_EXEC_F64 ? "f64" : "f32", fast ? " fast" : "");
    LnSite u, def, xh;
    ln_site_build(&u, R, D, low, 1e-12, 0.1f);
    FuseStats sd, sx;
    fuse_with(&u, &def, NULL, &sd);
    fuse_with(&u, &xh, "xhat", &sx);
    cr_expect_eq(sd.ln_saved_xhat, 0, "%s", what);
    cr_assert_eq(sx.ln_saved_xhat, 1, "%s", what);
    cr_expect_eq(xh.v[LNV_MEAN], -1, "%s: the xhat graph still has the mean", what);
    cr_assert_geq(xh.v[LNV_SUM], 0);
    cr_expect_eq(xh.g.nodes[xh.v[LNV_SUM]].dtype, DT_F16, "%s: xhat is not f16", what);
    cr_expect_eq(def.g.nodes[def.v[LNV_SUM]].dtype, DT_F32);
    bool f64 = prec == CPU_EXEC_F64;
    void **w = site_data(&u.pl, f64);
    CpuExec a, b;
    run_site(&a, &def, prec, w, false);
    run_site(&b, &xh, prec, w, fast);
    /* the forward is the default's */
    static const int same[] = {LNV_Y, LNV_RSTD, LNV_Y16};
    for (int q = 0; q < 3; q++) {
        int k = same[q];
        if (k == LNV_Y16 && low == DT_F32) continue;
        int64_t n = cpu_exec_numel(&a, def.v[k]);
        size_t bytes = (size_t)n * (f64 ? sizeof(double) : sizeof(float));
        cr_expect_eq(memcmp(cpu_exec_value(&a, def.v[k]), cpu_exec_value(&b, xh.v[k]), bytes), 0, "%s: %s differs",
                     what, ln_site_value_name[k]);
    }
    /* xhat against the default run's s, mean, rstd */
    int64_t bad = 0, over = 0;
    for (int64_t i = 0; i < R * D; i++) {
        double s = at(&a, def.v[LNV_SUM], i, prec), mu = at(&a, def.v[LNV_MEAN], i / D, prec);
        double rs = at(&a, def.v[LNV_RSTD], i / D, prec), want = (s - mu) * rs, got = at(&b, xh.v[LNV_SUM], i, prec);
        double tol = f64 ? 1e-12 * fmax(fabs(want), 1) : ldexp(fmax(fabs(want), 6.1e-5), -10);
        bad += !(fabs(got - want) <= tol);
        over += !(fabs(got) <= sqrt((double)D));
    }
    cr_expect_eq(bad, 0, "%s: %lld xhat entries are not (s - mean) rstd rounded to f16", what, (long long)bad);
    cr_expect_eq(over, 0, "%s: %lld |xhat| above sqrt(D)", what, (long long)over);
    /* the backward: f16 xhat costs at most its rounding (2^-11 relative) */
    static const int grads[] = {LNV_DS, LNV_DX, LNV_DGAMMA, LNV_DBETA, LNV_DBIAS};
    double tol = f64 ? 1e-12 : 2e-3;
    for (int q = 0; q < 5; q++) {
        double e = rel_l2(&b, &xh, &a, &def, grads[q], prec);
        cr_expect(e <= tol, "%s: %s is %.3g from the default's", what, ln_site_value_name[grads[q]], e);
    }
    int64_t mask_differs = 0;
    for (int64_t i = 0; i < R * D; i++)
        mask_differs += (at(&a, def.v[LNV_DX], i, prec) == 0) != (at(&b, xh.v[LNV_DX], i, prec) == 0);
    cr_expect_eq(mask_differs, 0, "%s: the dropout zeros of dx differ in %lld places", what, (long long)mask_differs);
    cpu_exec_free(&a);
    cpu_exec_free(&b);
    for (int p = 0; p < u.pl.n; p++) free(w[p]);
    free(w);
    ln_site_free(&u);
    ln_site_free(&def);
    ln_site_free(&xh);
}

Test(ln_xhat_site, f16_site) { xhat_site_case(37, 24, DT_F16, CPU_EXEC_F32, false); }
Test(ln_xhat_site, bf16_site) { xhat_site_case(29, 40, DT_BF16, CPU_EXEC_F32, false); }
Test(ln_xhat_site, f16_site_bert_width) { xhat_site_case(19, 768, DT_F16, CPU_EXEC_F32, false); }
Test(ln_xhat_site, f16_site_f64_exact) { xhat_site_case(37, 24, DT_F16, CPU_EXEC_F64, false); }
Test(ln_xhat_site, f16_site_fast_mode) { xhat_site_case(300, 64, DT_F16, CPU_EXEC_F32, true); }

Test(ln_xhat_site, f32_site_left_alone)
{
    LnSite u, f;
    ln_site_build(&u, 8, 16, DT_F32, 1e-12, 0.1f);
    FuseStats st;
    fuse_with(&u, &f, "xhat", &st);
    cr_expect_eq(st.ln_saved_xhat, 0);
    cr_expect_geq(f.v[LNV_MEAN], 0);
    cr_expect_eq(f.g.nodes[f.v[LNV_SUM]].dtype, DT_F32);
    ln_site_free(&u);
    ln_site_free(&f);
}

/* xhat_dw is the default since 2026-12-02 (xhat since the H200 suite
 * passed with it); xhat keeps the sites' y16 for the dW GEMMs, s turns
 * both off. */
Test(ln_xhat_site, default_is_xhat_dw)
{
    unsetenv("HPC_LN_SAVE");
    cr_expect(fuse_defaults().ln_save_xhat && fuse_defaults().ln_save_xhat_dw);
    setenv("HPC_LN_SAVE", "xhat", 1);
    cr_expect(fuse_defaults().ln_save_xhat);
    cr_expect_not(fuse_defaults().ln_save_xhat_dw);
    setenv("HPC_LN_SAVE", "s", 1);
    cr_expect_not(fuse_defaults().ln_save_xhat);
    cr_expect_not(fuse_defaults().ln_save_xhat_dw);
    setenv("HPC_LN_SAVE", "xhat_dw", 1);
    cr_expect(fuse_defaults().ln_save_xhat && fuse_defaults().ln_save_xhat_dw);
    unsetenv("HPC_LN_SAVE");
}

Test(ln_xhat_site, bad_value_refused)
{
    LnSite u, f;
    ln_site_build(&u, 4, 16, DT_F16, 1e-12, 0.1f);
    setenv("HPC_LN_SAVE", "half", 1);
    HpcError err = {0};
    ir_init(&f.g);
    params_init(&f.pl);
    cr_expect_eq(fuse_graph(&u.g, NULL, &f.g, NULL, NULL, &err), HPC_ERR_INPUT);
    unsetenv("HPC_LN_SAVE");
    cr_expect(strstr(err.msg, "HPC_LN_SAVE=half") && strstr(err.msg, "xhat"), "%s", err.msg);
    ln_site_free(&u);
    ln_site_free(&f);
}

/* ---- bert_tiny: a whole step -------------------------------------------- */

static void build(const ModelSpec *s, SpecPrecision policy, const char *save, Pipeline *p)
{
    PipeOptions o = pipeline_defaults(policy);
    setenv("HPC_LN_SAVE", save ? save : "s", 1);   /* NULL: the old rule, the baseline */
    HpcError err = {0};
    HpcStatus st = pipeline_build(s, &o, p, &err);
    unsetenv("HPC_LN_SAVE");
    cr_assert_eq(st, HPC_OK, "pipeline_build: %s", err.msg);
}

/* One training step of P on the cpu (tests/cpu_step.h). */
static StepOutF32 step(const Pipeline *P, float **w, const Batch *b, bool training)
{
    return cpu_step_run_f32(&P->g, &P->pl, w, b, training);
}

/* sum (a - b)^2 and sum b^2 over parameter p into *d, *r; false if not finite. */
static bool grad_sums(const StepOutF32 *a, const StepOutF32 *b, int p, int64_t n, double *d, double *r)
{
    *d = *r = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(a->grad[p][i]) || !isfinite(b->grad[p][i])) return false;
        double e = (double)a->grad[p][i] - b->grad[p][i];
        *d += e * e;
        *r += (double)b->grad[p][i] * b->grad[p][i];
    }
    return true;
}

static void tiny_step_case(SpecPrecision policy, const char *save)
{
    ModelSpec s;
    cpu_step_load_model("bert_tiny.model", &s);
    Pipeline ref, def, xh;
    build(&s, PREC_FP32, NULL, &ref);
    build(&s, policy, NULL, &def);
    build(&s, policy, save, &xh);
    cr_assert_eq(xh.fuse.ln_saved_xhat, 2 * s.stack.layers, "%d sites save xhat", xh.fuse.ln_saved_xhat);
    /* xhat_dw under fp16: each layer's FFN-in dW, and the Q, K, V dW (one packed, HPC_FUSE_QKV=1) of
     * every layer after the first */
    int qkv = fuse_qkv_requested() ? 1 : 3;
    int dw = strcmp(save, "xhat_dw") == 0 && policy == PREC_FP16 ? (int)(s.stack.layers + qkv * (s.stack.layers - 1)) : 0;
    cr_assert_eq(xh.fuse.ln_dw_from_xhat, dw, "%d dW GEMMs read xhat", xh.fuse.ln_dw_from_xhat);
    cr_assert_eq(def.fuse.ln_saved_xhat, 0);
    float **w = calloc((size_t)ref.pl.n, sizeof *w);
    for (int p = 0; p < ref.pl.n; p++) {
        if (ref.pl.p[p].tied_to >= 0) continue;
        int64_t n = params_numel(&ref.pl.p[p]);
        w[p] = malloc((size_t)n * sizeof **w);
        for (int64_t i = 0; i < n; i++)
            w[p][i] = ref.pl.p[p].init == PARAM_INIT_ONES ? (float)(1 + 0.1 * uniform()) : (float)(0.05 * uniform());
        prec_round_array(policy, w[p], n);   /* masters equal to their 16-bit copies */
    }
    Batch *b = batch_new(3, 16, 0);
    for (int64_t i = 0; i < 3 * 16; i++) {
        b->input_ids[i] = (int32_t)(1 + (uint64_t)(uniform() * 1e6 + 1e6) % (uint64_t)(s.stack.vocab_size - 1));
        b->attention_mask[i] = (i % 16) < 16 - 2 * (i / 16);
        b->token_type_ids[i] = (i % 16) >= 8;
    }
    for (int64_t r = 0; r < 3 && s.head.num_labels > 0; r++) b->labels[r] = (int32_t)(r % s.head.num_labels);
    /* against f32 without dropout: the salts (node ids) of the f32 graph are not the 16-bit graphs' */
    StepOutF32 sr = step(&ref, w, b, false), sd = step(&def, w, b, false), sx = step(&xh, w, b, false);
    cr_expect(isfinite(sx.loss) && sx.loss == sd.loss, "loss %.9g with xhat, %.9g default", sx.loss, sd.loss);
    double dd_all = 0, dx_all = 0, r_all = 0, worst = 0;
    const char *worst_name = "";
    int compared = 0;
    for (int p = 0; p < sr.n; p++) {
        if (!sr.grad[p]) continue;
        int64_t n = params_numel(&ref.pl.p[p]);
        const char *name = ref.pl.p[p].name;
        double dd, dx, r;
        bool fin = grad_sums(&sd, &sr, p, n, &dd, &r) && grad_sums(&sx, &sr, p, n, &dx, &r);
        cr_expect(fin, "%s: a non-finite gradient", name);
        if (!fin) continue;
        double e_def = r > 0 ? sqrt(dd / r) : sqrt(dd), e_x = r > 0 ? sqrt(dx / r) : sqrt(dx);
        if (strstr(name, "key.bias") == NULL) {   /* softmax shift invariance: noise only */
            /* one f16 rounding of xhat (2^-11) more, and the 16-bit chain's own noise: a
             * changed rounding downstream moves a small gradient's error by up to ~30% */
            cr_expect(e_x <= 1.3 * e_def + 0x1p-11, "%s: %.4g from f32 with xhat, %.4g default", name, e_x, e_def);
            dd_all += dd;
            dx_all += dx;
            r_all += r;
        }
        if (e_x / fmax(e_def, 1e-30) > worst) {
            worst = e_x / fmax(e_def, 1e-30);
            worst_name = name;
        }
        compared++;
    }
    cr_expect_gt(compared, 30);
    double all_def = sqrt(dd_all / r_all), all_x = sqrt(dx_all / r_all);
    printf("bert_tiny %s: whole gradient %.4g from f32 (default), %.4g (%s); worst ratio %.4f (%s)\n",
           policy == PREC_FP16 ? "fp16" : "bf16", all_def, all_x, save, worst, worst_name);
    cr_expect(all_x <= 1.01 * all_def, "whole gradient: %.4g with xhat, %.4g default", all_x, all_def);
    /* with dropout on (the same salts in both 16-bit graphs): the same loss, gradients close */
    StepOutF32 td = step(&def, w, b, true), tx = step(&xh, w, b, true);
    cr_expect(isfinite(tx.loss) && tx.loss == td.loss, "dropout on: loss %.9g with xhat, %.9g default", tx.loss,
              td.loss);
    double dt = 0, rt = 0, d, r;
    for (int p = 0; p < td.n; p++) {
        if (!td.grad[p] || strstr(ref.pl.p[p].name, "key.bias")) continue;
        cr_expect(grad_sums(&tx, &td, p, params_numel(&ref.pl.p[p]), &d, &r), "%s: not finite", ref.pl.p[p].name);
        dt += d;
        rt += r;
    }
    double tol = policy == PREC_FP16 ? 5e-4 : 2e-3;
    printf("  dropout on: whole gradient with xhat %.4g from the default's\n", sqrt(dt / rt));
    cr_expect(sqrt(dt / rt) <= tol, "dropout on: the gradient with xhat is %.4g from the default's", sqrt(dt / rt));
    step_free_f32(&td);
    step_free_f32(&tx);
    step_free_f32(&sr);
    step_free_f32(&sd);
    step_free_f32(&sx);
    batch_free(b);
    for (int p = 0; p < ref.pl.n; p++) free(w[p]);
    free(w);
    pipeline_free(&ref);
    pipeline_free(&def);
    pipeline_free(&xh);
}

Test(ln_xhat_model, bert_tiny_fp16_gradients, .timeout = 600) { tiny_step_case(PREC_FP16, "xhat"); }
Test(ln_xhat_model, bert_tiny_bf16_gradients, .timeout = 600) { tiny_step_case(PREC_BF16, "xhat"); }
Test(ln_xhat_model, bert_tiny_fp16_gradients_dw, .timeout = 600) { tiny_step_case(PREC_FP16, "xhat_dw"); }
/* bf16: dy is bf16, xhat f16: the dW GEMMs keep y16 (none rewritten), the step is xhat's */
Test(ln_xhat_model, bert_tiny_bf16_gradients_dw, .timeout = 600) { tiny_step_case(PREC_BF16, "xhat_dw"); }

/* xhat_dw's algebra, exactly: in f64 (the cpu backend rounds nothing there)
 * dW from xhat and LN_DW_FIX is the default's dy^T y to 1e-12, so the only
 * change under fp16 is where the rounding happens. */
Test(ln_xhat_model, bert_tiny_dw_fix_exact_in_f64, .timeout = 600)
{
    ModelSpec s;
    cpu_step_load_model("bert_tiny.model", &s);
    Pipeline def, dw;
    build(&s, PREC_FP16, NULL, &def);
    build(&s, PREC_FP16, "xhat_dw", &dw);
    cr_assert_gt(dw.fuse.ln_dw_from_xhat, 0);
    double **w = calloc((size_t)def.pl.n, sizeof *w);
    for (int p = 0; p < def.pl.n; p++) {
        if (def.pl.p[p].tied_to >= 0) continue;
        int64_t n = params_numel(&def.pl.p[p]);
        w[p] = malloc((size_t)n * sizeof **w);
        for (int64_t i = 0; i < n; i++)
            w[p][i] = def.pl.p[p].init == PARAM_INIT_ONES ? 1 + 0.1 * uniform() : 0.05 * uniform();
    }
    Batch *b = batch_new(2, 12, 0);
    for (int64_t i = 0; i < 2 * 12; i++) {
        b->input_ids[i] = (int32_t)(1 + (uint64_t)(uniform() * 1e6 + 1e6) % (uint64_t)(s.stack.vocab_size - 1));
        b->attention_mask[i] = (i % 12) < 12 - (i / 12);
    }
    b->labels[0] = 0;
    b->labels[1] = s.head.num_labels > 1;
    CpuExec ea, eb;
    const Pipeline *P[2] = {&def, &dw};
    CpuExec *E[2] = {&ea, &eb};
    for (int k = 0; k < 2; k++) {
        cpu_exec_init(E[k], &P[k]->g, CPU_EXEC_F64);
        for (int p = 0; p < P[k]->pl.n; p++)
            if (P[k]->pl.p[p].tied_to < 0) cpu_exec_bind_param(E[k], p, w[p]);
        CpuRunOptions o = {.training = true, .backward = true, .seed = 3, .step = 1, .loss_scale = 1};
        HpcError err = {0};
        cr_assert_eq(cpu_exec_run(E[k], b, &o, &err), HPC_OK, "%s", err.msg);
    }
    int compared = 0;
    for (int p = 0; p < def.pl.n; p++) {
        int va = def.g.param_grad[p], vb = dw.g.param_grad[p];
        if (va < 0) continue;
        cr_assert_geq(vb, 0);
        const double *a = cpu_exec_value(&ea, va), *c = cpu_exec_value(&eb, vb);
        double d = 0, r = 0;
        for (int64_t i = 0; i < params_numel(&def.pl.p[p]); i++) {
            d += (a[i] - c[i]) * (a[i] - c[i]);
            r += a[i] * a[i];
        }
        double e = sqrt(d) / fmax(sqrt(r), 1e-300);
        cr_expect(e <= 1e-12, "%s: %.3g from the default's in f64", def.pl.p[p].name, e);   /* NaN fails */
        compared++;
    }
    cr_expect_gt(compared, 30);
    cpu_exec_free(&ea);
    cpu_exec_free(&eb);
    batch_free(b);
    for (int p = 0; p < def.pl.n; p++) free(w[p]);
    free(w);
    pipeline_free(&def);
    pipeline_free(&dw);
}

/* ---- bert_base: the plan ----------------------------------------------- */

static int64_t aligned(int64_t b) { return (b + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN; }

/* Bytes of the arena values made in the forward pass and read in the backward. */
static int64_t live_into_backward(const StepPlan *p)
{
    int64_t sum = 0;
    for (int i = 0; i < p->n; i++)
        if (p->v[i].kind == PLAN_ARENA && p->v[i].def < p->n_forward && p->v[i].last >= p->n_forward)
            sum += p->v[i].bytes;
    return sum;
}

static void plan_case(SpecPrecision policy, int64_t B, int64_t L)
{
    ModelSpec s;
    cpu_step_load_model("bert_base.model", &s);
    Pipeline def, xh;
    build(&s, policy, NULL, &def);
    build(&s, policy, "xhat", &xh);
    int sites = policy == PREC_FP32 ? 0 : 2 * (int)s.stack.layers;
    cr_assert_eq(xh.fuse.ln_saved_xhat, sites);
    StepPlan pd, px;
    HpcError err = {0};
    cr_assert_eq(plan_build(&def.g, B, L, &pd, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build(&xh.g, B, L, &px, &err), HPC_OK, "%s", err.msg);
    int64_t rows = B * L, H = s.stack.hidden;
    /* per site: s (f32) and mean (f32 a row) go, xhat (f16) comes */
    int64_t want = sites * (aligned(rows * H * 4) + aligned(rows * 4) - aligned(rows * H * 2));
    /* HPC_LN_SAVE=xhat also fuses the embedding layer (compiler/fuse_embed.c), which keeps xhat (f16)
     * and rstd instead of its f32 sum; the baseline (s) keeps it unfused */
    if (xh.fuse.embed_ln) want += aligned(rows * H * 4) - aligned(rows * H * 2) - aligned(rows * 4);
    int64_t ld = live_into_backward(&pd), lx = live_into_backward(&px);
    printf("bert_base %s %lldx%lld: live into backward %.1f -> %.1f MiB (predicted -%.1f), arena %.1f -> %.1f MiB\n",
           policy == PREC_FP16 ? "fp16" : policy == PREC_BF16 ? "bf16" : "fp32", (long long)B, (long long)L,
           ld / 1048576.0, lx / 1048576.0, want / 1048576.0, pd.arena_bytes / 1048576.0, px.arena_bytes / 1048576.0);
    cr_expect_eq(ld - lx, want, "live into backward %lld -> %lld, predicted %lld less", (long long)ld, (long long)lx,
                 (long long)want);
    if (sites) cr_expect_leq(px.arena_bytes, pd.arena_bytes - want + want / 20, "arena %lld -> %lld",
                             (long long)pd.arena_bytes, (long long)px.arena_bytes);
    else cr_expect_eq(px.arena_bytes, pd.arena_bytes);
    plan_free(&pd);
    plan_free(&px);
    pipeline_free(&def);
    pipeline_free(&xh);
}

Test(ln_xhat_model, bert_base_fp16_plan_32x128) { plan_case(PREC_FP16, 32, 128); }
Test(ln_xhat_model, bert_base_bf16_plan_32x128) { plan_case(PREC_BF16, 32, 128); }
Test(ln_xhat_model, bert_base_fp16_plan_256x128) { plan_case(PREC_FP16, 256, 128); }
Test(ln_xhat_model, bert_base_fp32_plan_unchanged) { plan_case(PREC_FP32, 32, 128); }

/* y16 values (output 4 of a site saving xhat) read by a backward dW GEMM. */
static int y16_read_by_dw(const IrGraph *g, int64_t *bytes_each, const StepPlan *p)
{
    int count = 0;
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = &g->nodes[i];
        if (n->op != IR_OP_LN_RESIDUAL || !fuse_ln_attr_get(n).xhat) continue;
        int y16 = ir_output(g, i, 4);
        bool read = false;
        for (int j = g->n_forward; j < g->n && y16 >= 0; j++) {
            IrOpKind op = g->nodes[j].op;
            read |= (op == IR_OP_LINEAR_DW || op == IR_OP_LINEAR_DW_BGRAD) && g->nodes[j].in[1] == y16;
        }
        if (read) {
            count++;
            *bytes_each = p->v[y16].bytes;
        }
    }
    return count;
}

/* HPC_LN_SAVE=xhat_dw against xhat: the y16 that dW GEMMs read are no
 * longer live into the backward pass (their bytes, from the shapes). */
static void plan_dw_case(int64_t B, int64_t L)
{
    ModelSpec s;
    cpu_step_load_model("bert_base.model", &s);
    Pipeline xh, dw;
    build(&s, PREC_FP16, "xhat", &xh);
    build(&s, PREC_FP16, "xhat_dw", &dw);
    StepPlan px, pw;
    HpcError err = {0};
    cr_assert_eq(plan_build(&xh.g, B, L, &px, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build(&dw.g, B, L, &pw, &err), HPC_OK, "%s", err.msg);
    int64_t each = 0, none = 0;
    int read = y16_read_by_dw(&xh.g, &each, &px);
    cr_expect_eq(read, 2 * (int)s.stack.layers - 1, "%d y16 read by dW GEMMs", read);   /* the last feeds the pooler only */
    cr_expect_eq(each, aligned(B * L * s.stack.hidden * 2));
    cr_expect_eq(y16_read_by_dw(&dw.g, &none, &pw), 0, "xhat_dw: a dW GEMM still reads y16");
    cr_expect_eq(dw.fuse.ln_dw_from_xhat, (int)(s.stack.layers + (fuse_qkv_requested() ? 1 : 3) * (s.stack.layers - 1)));
    int64_t want = read * aligned(B * L * s.stack.hidden * 2), lx = live_into_backward(&px), lw = live_into_backward(&pw);
    printf("bert_base fp16 %lldx%lld xhat_dw: live into backward %.1f -> %.1f MiB (predicted -%.1f), arena %.1f -> "
           "%.1f MiB\n", (long long)B, (long long)L, lx / 1048576.0, lw / 1048576.0, want / 1048576.0,
           px.arena_bytes / 1048576.0, pw.arena_bytes / 1048576.0);
    cr_expect_eq(lx - lw, want, "live into backward %lld -> %lld, predicted %lld less", (long long)lx, (long long)lw,
                 (long long)want);
    cr_expect_leq(pw.arena_bytes, px.arena_bytes - want + want / 20, "arena %lld -> %lld", (long long)px.arena_bytes,
                  (long long)pw.arena_bytes);
    plan_free(&px);
    plan_free(&pw);
    pipeline_free(&xh);
    pipeline_free(&dw);
}

Test(ln_xhat_model, bert_base_fp16_plan_dw_32x128) { plan_dw_case(32, 128); }
Test(ln_xhat_model, bert_base_fp16_plan_dw_256x128) { plan_dw_case(256, 128); }

/* ---- CUDA text ---------------------------------------------------------- */

static char *site_source(int64_t D, DType low, const char *save, LnSite *f)
{
    LnSite u;
    ln_site_build(&u, 488, D, low, 1e-12, 0.1f);
    FuseStats st;
    fuse_with(&u, f, save, &st);
    cr_assert_eq(st.ln_saved_xhat, save ? 1 : 0);
    char *src;
    HpcError err = {0};
    cr_assert_eq(eop_module_source(&f->g, &src, &err), HPC_OK, "%s", err.msg);
    ln_site_free(&u);
    return src;
}

static void expect_xhat_site_compiles(int64_t D, DType low, int arch)
{
    LnSite f, d;
    char *src = site_source(D, low, "xhat", &f), *dsrc = site_source(D, low, NULL, &d);
    cr_expect(strcmp(src, dsrc) != 0, "D=%lld: the xhat kernels' text is the default's", (long long)D);
    void *cubin;
    size_t size;
    char *log = NULL;
    HpcError err = {0};
    HpcStatus st = nvrtc_compile(src, "hpc_ln_xhat_test", arch, NULL, 0, &cubin, &size, &log, &err);
    cr_assert_eq(st, HPC_OK, "D=%lld %s sm_%d: %s\n%s", (long long)D, ir_dtype_name(low), arch, err.msg, log ? log : "");
    int phases = 0;
    for (int id = 0; id < f.g.n; id++) {
        IrOpKind op = f.g.nodes[id].op;
        if (op != IR_OP_LN_RESIDUAL && op != IR_OP_LN_RESIDUAL_BWD) continue;
        EopNodeCode c;
        cr_assert_eq(eop_node_code(&f.g, id, 1, 1, &c, &err), HPC_OK, "%s", err.msg);
        for (int k = 0; k < c.n_phases; k++) {
            cr_expect(memmem(cubin, size, c.phase[k].name, strlen(c.phase[k].name)) != NULL, "%s not in the cubin",
                      c.phase[k].name);
            phases++;
        }
    }
    cr_expect_eq(phases, 3);
    free(cubin);
    free(log);
    free(src);
    free(dsrc);
    ln_site_free(&f);
    ln_site_free(&d);
}

/* A whole bert_tiny fp16 step under xhat_dw (LN_DW_FIX's kernel among them)
 * compiles for sm_80 and sm_90. */
Test(ln_xhat_cuda, bert_tiny_xhat_dw_module_compiles, .timeout = 300)
{
    ModelSpec s;
    cpu_step_load_model("bert_tiny.model", &s);
    Pipeline p;
    build(&s, PREC_FP16, "xhat_dw", &p);
    cr_assert_gt(p.fuse.ln_dw_from_xhat, 0);
    expect_module_compiles(&p.g, "hpc_ln_xhat_dw", "ln_dw_fix");
    pipeline_free(&p);
}

Test(ln_xhat_cuda, site_kernels_compile, .timeout = 300)
{
    expect_xhat_site_compiles(128, DT_F16, 80);
    expect_xhat_site_compiles(768, DT_F16, 90);
    expect_xhat_site_compiles(1024, DT_BF16, 80);
    expect_xhat_site_compiles(4096, DT_F16, 90);   /* two 8-column chunks per thread */
}
