/* tests/test_fuse.c — the fuse pass, the fused ops and the pipeline.
 *
 * Equality: a bert_tiny-shaped model (hidden 16, 2 heads, 2 layers, vocab
 * 50, B 2, L 8 with padding, dropout 0.1 everywhere, training mode) with
 * random weights runs fused and unfused on the cpu backend; the loss and
 * every parameter gradient must agree:
 *   f64 executor, fp32 and fp16 policies   relative 1e-12
 *   f32 executor, fp32 policy              relative 1e-5
 *   f32 executor, fp16 policy              relative 1e-6 (the fused ops
 *     round at the same points as the unfused chain, so the results are in
 *     fact bit-identical; the tolerance only absorbs summation order)
 * and fusing the forward before autodiff (fused backward rules) must equal
 * fusing after (1e-12, f64).
 * Gradients: each fused op's backward rule against central differences in
 * f64 (h = 1e-6, relative 1e-6), as tests/test_autodiff.c.
 * Counts: BERT-base launches (nodes that run work) drop by at least 4 per
 * layer under fp16; the numbers are printed.
 * Golden: the fused bert_tiny listing equals tests/golden/bert_tiny_fused.ir,
 * made by `bin/hpc compile models/bert_tiny.model --ir --no-artifact` (fusion on), while
 * `--no-fuse` still gives tests/golden/bert_tiny.ir (checked here through
 * the pipeline with fuse off).
 * CUDA: the fused graphs' modules compile with NVRTC for sm_80 and sm_90
 * and every fused kernel is in the cubin. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "data/batch.h"
#include "cpu/cpu_exec.h"
#include "cpu_step.h"
#include "tiny_classifier.h"
#include "emit_ops.h"
#include "fuse.h"
#include "compiler/ir_build.h"
#include "program/ir.h"
#include "compiler/ir_print.h"
#include "lower.h"
#include "cuda/nvrtc_compile.h"
#include "program/params.h"
#include "cpu/philox.h"
#include "pipeline.h"
#include "program/plan.h"
#include "compiler/plan_graph.h"
#include "program/spec.h"
#include "compiler/spec_load.h"

/* These tests hold the fusion rules to exactness (the fused graphs must equal the unfused ones
 * to rounding), so the LayerNorm sites keep their f32 input: saving it as
 * 16-bit xhat (the default) rounds on purpose and has its own tests,
 * tests/test_ln_xhat.c.  Set before main, for every test of this file. */
__attribute__((constructor)) static void pin_ln_save_s(void) { setenv("HPC_LN_SAVE", "s", 1); }
/* Their BERT-base counts and sizes assume every layer runs every token:
 * the last layer lowered for token 0 (compiler/lower.h) has its own tests,
 * tests/test_first_token.c. */
__attribute__((constructor)) static void pin_last_layer_all(void) { setenv("HPC_LAST_LAYER", "all", 1); }

/* Random weights for every parameter (f64 master copy); gammas around 1. */
static double **random_weights(const ParamList *pl, double scale) { return cpu_step_random_weights(pl, 1234, scale); }

static void free_weights(const ParamList *pl, double **w) { cpu_step_free_weights(pl, w); }

/* The loss and every parameter gradient (as f64) of one training step. */
/* The step on the reference executor, loss scale 1 (tests/cpu_step.h). */
static StepOut run_step(const IrGraph *g, const ParamList *pl, double **w, CpuExecPrecision prec,
                        const Batch *b)
{
    return cpu_step_run(g, pl, w, prec, CPU_EXEC_REFERENCE, 1.0, b);
}

/* Relative error of a against b, ||a - b|| / ||b||; NaN never passes. */
static double rel_err(const double *a, const double *b, int64_t n, double *norm_b)
{
    double num = 0, den = 0;
    for (int64_t k = 0; k < n; k++) {
        num += (a[k] - b[k]) * (a[k] - b[k]);
        den += b[k] * b[k];
    }
    *norm_b = sqrt(den);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* Every gradient and the loss of `got` within tol of `want`; returns the
 * number of gradients compared. */
static int expect_same(const StepOut *got, const StepOut *want, const ParamList *pl, double tol,
                       const char *what)
{
    double lerr = fabs(got->loss - want->loss) / fabs(want->loss);
    cr_expect(isfinite(got->loss) && want->loss > 0 && lerr <= tol, "%s: loss %.17g vs %.17g (rel %.3g)",
              what, got->loss, want->loss, lerr);
    int compared = 0;
    double worst = 0;
    for (int p = 0; p < pl->n; p++) {
        cr_expect_eq(got->grad[p] == NULL, want->grad[p] == NULL, "%s: %s has a gradient on one side",
                     what, pl->p[p].name);
        if (!got->grad[p] || !want->grad[p]) continue;
        double norm;
        double e = rel_err(got->grad[p], want->grad[p], params_numel(&pl->p[p]), &norm);
        cr_expect(e <= tol, "%s: gradient of %s differs, relative %.3g > %.3g", what, pl->p[p].name, e, tol);
        if (!strstr(pl->p[p].name, "key.bias")) /* softmax shift invariance: exactly 0 */
            cr_expect(norm > 0, "%s: gradient of %s is all zero", what, pl->p[p].name);
        if (e > worst) worst = e;
        compared++;
    }
    cr_log_info("%s: loss rel %.3g, worst gradient rel %.3g over %d tensors", what, lerr, worst, compared);
    return compared;
}

static void build(const ModelSpec *s, SpecPrecision policy, bool fuse, Pipeline *p)
{
    PipeOptions o = pipeline_defaults(policy);
    o.fuse = fuse;
    o.attention = ATTN_FORM_UNFUSED;   /* the fuse pass's own pairs (tests/test_attention_step.c: the node) */
    HpcError err = {0};
    cr_assert_eq(pipeline_build(s, &o, p, &err), HPC_OK, "pipeline_build: %s", err.msg);
}

/* build with the LayerNorm site rules off (HPC_FUSE_LN=0): the other rules only. */
static void build_no_ln(const ModelSpec *s, SpecPrecision policy, Pipeline *p)
{
    setenv("HPC_FUSE_LN", "0", 1);
    build(s, policy, true, p);
    unsetenv("HPC_FUSE_LN");
}

static void check_equal(SpecPrecision policy, CpuExecPrecision prec, double tol, const char *what)
{
    ModelSpec s;
    tiny_spec(&s);
    Pipeline plain, fused;
    build(&s, policy, false, &plain);
    /* The accumulating dX GEMMs round less than the ADDs they replace (dX is
     * never stored in 16 bits), so the bitwise claim of a 16-bit plan on the
     * f32 executor holds with that rule off (tests/test_fuse_accum.c checks
     * it on); f64 and the fp32 plan round nowhere else and keep it on. */
    bool accum_off = prec == CPU_EXEC_F32 && policy != PREC_FP32;
    if (accum_off) setenv("HPC_FUSE_ACCUM", "0", 1);
    build(&s, policy, true, &fused);
    cr_assert_eq(fused.fuse.softmax_dropout, 2);
    cr_assert_eq(fused.fuse.softmax_dropout_bwd, 2);
    cr_assert_eq(fused.fuse.ln_residual, 4);       /* two sites per post-LN layer */
    cr_assert_eq(fused.fuse.ln_residual_bwd, 4);
    cr_assert_eq(fused.fuse.dropout_add, 0);       /* the LayerNorm sites took them */
    cr_assert_eq(fused.fuse.ln_casts_folded, policy == PREC_FP32 ? 0 : 3);   /* the last y feeds the head in f32 */
    cr_assert_lt(fuse_count_launches(&fused.g), fuse_count_launches(&plain.g));
    Pipeline no_ln;
    build_no_ln(&s, policy, &no_ln);
    unsetenv("HPC_FUSE_ACCUM");
    cr_assert_eq(no_ln.fuse.dropout_add, 4);
    cr_assert_eq(no_ln.fuse.ln_residual, 0);
    cr_assert_eq(ir_count_op(&no_ln.g, IR_OP_LN_RESIDUAL, 0), 0);
    Batch *b = tiny_batch();
    double **w = random_weights(&plain.pl, 0.5);
    StepOut a = run_step(&plain.g, &plain.pl, w, prec, b);
    StepOut f = run_step(&fused.g, &fused.pl, w, prec, b);
    StepOut q = run_step(&no_ln.g, &no_ln.pl, w, prec, b);
    cr_expect_gt(expect_same(&f, &a, &plain.pl, tol, what), 30);
    cr_expect_gt(expect_same(&f, &q, &plain.pl, tol, what), 30);
    cr_expect_eq(fused.fuse.act_bwd_bgrad, 3);   /* FFN1 of both layers, the pooler */
    Pipeline no_act;
    setenv("HPC_FUSE_ACT_BGRAD", "0", 1);
    if (accum_off) setenv("HPC_FUSE_ACCUM", "0", 1);   /* as `fused` was built */
    build(&s, policy, true, &no_act);
    unsetenv("HPC_FUSE_ACT_BGRAD");
    unsetenv("HPC_FUSE_ACCUM");
    cr_expect_eq(no_act.fuse.act_bwd_bgrad, 0);
    StepOut na = run_step(&no_act.g, &no_act.pl, w, prec, b);
    cr_expect_gt(expect_same(&f, &na, &plain.pl, tol, what), 30);
    step_free(&na);
    pipeline_free(&no_act);
    step_free(&a);
    step_free(&f);
    step_free(&q);
    pipeline_free(&no_ln);
    free_weights(&plain.pl, w);
    batch_free(b);
    pipeline_free(&plain);
    pipeline_free(&fused);
}

Test(fuse_equal, fp32_policy_f64) { check_equal(PREC_FP32, CPU_EXEC_F64, 1e-12, "fp32/f64"); }
Test(fuse_equal, fp32_policy_f32) { check_equal(PREC_FP32, CPU_EXEC_F32, 1e-5, "fp32/f32"); }
Test(fuse_equal, fp16_policy_f64) { check_equal(PREC_FP16, CPU_EXEC_F64, 1e-12, "fp16/f64"); }
Test(fuse_equal, fp16_policy_f32) { check_equal(PREC_FP16, CPU_EXEC_F32, 1e-6, "fp16/f32"); }
Test(fuse_equal, bf16_policy_f32) { check_equal(PREC_BF16, CPU_EXEC_F32, 1e-6, "bf16/f32"); }

/* Fusing the forward graph before autodiff uses the fused ops' backward
 * rules; the result must equal fusing the whole graph afterwards. */
Test(fuse_equal, before_autodiff_equals_after)
{
    ModelSpec s;
    tiny_spec(&s);
    Pipeline after;
    build(&s, PREC_FP32, true, &after);
    IrGraph raw, early;
    ParamList pl;
    ir_init(&raw);
    ir_init(&early);
    params_init(&pl);
    HpcError err = {0};
    FuseStats st;
    cr_assert_eq(lower_model(&s, &raw, &pl, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(fuse_graph(&raw, NULL, &early, NULL, &st, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(st.softmax_dropout, 2);
    cr_expect_eq(st.dropout_add, 0);
    cr_expect_eq(st.ln_residual, 4);
    cr_assert_eq(autodiff_build(&early, &pl, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(ir_count_op(&early, IR_OP_SOFTMAX_DROPOUT_BWD, 0), 2);
    cr_expect_eq(ir_count_op(&early, IR_OP_LN_RESIDUAL_BWD, 0), 4);   /* from LN_RESIDUAL's backward rule */
    Batch *b = tiny_batch();
    double **w = random_weights(&pl, 0.5);
    StepOut x = run_step(&early, &pl, w, CPU_EXEC_F64, b);
    StepOut y = run_step(&after.g, &after.pl, w, CPU_EXEC_F64, b);
    expect_same(&x, &y, &pl, 1e-12, "before/after autodiff");
    step_free(&x);
    step_free(&y);
    free_weights(&pl, w);
    batch_free(b);
    ir_free(&raw);
    ir_free(&early);
    params_free(&pl);
    pipeline_free(&after);
}

/* ---- finite differences of each fused op's backward rule ------------- */

typedef struct {
    IrGraph g;
    ParamList pl;
    int ids, mask;
} Fx;

static int fx_param(Fx *fx, const char *name, int64_t d0, int64_t d1)
{
    int64_t dims[2] = {d0, d1};
    int rank = d1 ? 2 : 1;
    int idx = params_add(&fx->pl, name, rank, dims, PARAM_INIT_NORMAL, true, false);
    return ir_param(&fx->g, idx, DT_F32, rank, dims, name);
}

static int fx_embed(Fx *fx, const char *name)
{
    int t = fx_param(fx, name, TV, TH);
    return ir_add(&fx->g, IR_OP_EMBEDDING, (int[]){t, fx->ids}, 2, NULL, name);
}

static void fx_init(Fx *fx)
{
    ir_init(&fx->g);
    params_init(&fx->pl);
    fx->ids = ir_input(&fx->g, IR_IN_INPUT_IDS);
    fx->mask = ir_input(&fx->g, IR_IN_ATTN_MASK);
}

/* loss = cross-entropy(x W^T + b) against token labels. */
static void fx_loss(Fx *fx, int x)
{
    int w = fx_param(fx, "head.w", TC, TH), b = fx_param(fx, "head.b", TC, 0);
    int logits = ir_add(&fx->g, IR_OP_LINEAR, (int[]){x, w, b}, 3, NULL, "logits");
    int labels = ir_input(&fx->g, IR_IN_TOKEN_LABELS);
    fx->g.loss = ir_add(&fx->g, IR_OP_CROSS_ENTROPY, (int[]){logits, labels}, 2, NULL, "loss");
}

static double fx_loss_at(CpuExec *ex, const Batch *b, bool backward)
{
    CpuRunOptions o = {.training = true, .backward = backward, .seed = 77, .step = 3, .loss_scale = 1.0};
    HpcError err = {0};
    cr_assert_eq(cpu_exec_run(ex, b, &o, &err), HPC_OK, "%s", err.msg);
    return cpu_exec_loss(ex);
}

/* Autodiff, then every parameter's gradient against central differences. */
static void fx_gradcheck(Fx *fx, IrOpKind must_have)
{
    HpcError err = {0};
    fx->g.n_params = fx->pl.n;
    cr_assert_eq(autodiff_build(&fx->g, &fx->pl, &err), HPC_OK, "%s", err.msg);
    bool found = false;
    for (int i = 0; i < fx->g.n; i++) found |= fx->g.nodes[i].op == must_have;
    cr_assert(found, "the graph has no %s", ir_op_name(must_have));
    Batch *b = tiny_batch();
    double **w = random_weights(&fx->pl, 0.5);
    CpuExec ex;
    cpu_exec_init(&ex, &fx->g, CPU_EXEC_F64);
    for (int p = 0; p < fx->pl.n; p++) cpu_exec_bind_param(&ex, p, w[p]);
    const double h = 1e-6;
    for (int p = 0; p < fx->pl.n; p++) {
        int gv = fx->g.param_grad[p];
        cr_assert_geq(gv, 0);
        int64_t n = params_numel(&fx->pl.p[p]);
        fx_loss_at(&ex, b, true);
        double *ad = malloc((size_t)n * sizeof *ad), *fd = malloc((size_t)n * sizeof *fd);
        memcpy(ad, cpu_exec_value(&ex, gv), (size_t)n * sizeof *ad);
        for (int64_t k = 0; k < n; k++) {
            double keep = w[p][k];
            w[p][k] = keep + h;
            double lp = fx_loss_at(&ex, b, false);
            w[p][k] = keep - h;
            double lm = fx_loss_at(&ex, b, false);
            w[p][k] = keep;
            fd[k] = (lp - lm) / (2 * h);
        }
        double norm, e = rel_err(ad, fd, n, &norm);
        cr_expect(norm > 0, "%s: finite-difference gradient is all zero", fx->pl.p[p].name);
        cr_expect(e < 1e-6, "%s: relative error %.3g against finite differences", fx->pl.p[p].name, e);
        free(ad);
        free(fd);
    }
    cpu_exec_free(&ex);
    free_weights(&fx->pl, w);
    batch_free(b);
    ir_free(&fx->g);
    params_free(&fx->pl);
}

static IrAttr fused_attr(float p, int salt, bool causal)
{
    IrAttr a;
    fuse_attr_set(&a, (IrFusedAttr){p, salt, causal, DT_F32, DT_F32, 0});
    return a;
}

/* x -> q, k heads -> scores -> SOFTMAX_DROPOUT -> context with v -> loss. */
static void softmax_dropout_case(bool causal)
{
    Fx fx;
    fx_init(&fx);
    IrGraph *g = &fx.g;
    IrAttr heads = {.heads = {THEADS}};
    int q = fx_embed(&fx, "q"), k = fx_embed(&fx, "k"), v = fx_embed(&fx, "v");
    int qh = ir_add(g, IR_OP_SPLIT_HEADS, &q, 1, &heads, "qh");
    int kh = ir_add(g, IR_OP_SPLIT_HEADS, &k, 1, &heads, "kh");
    int vh = ir_add(g, IR_OP_SPLIT_HEADS, &v, 1, &heads, "vh");
    IrAttr mm = {.matmul = {false, true, 0.5}};
    int sc = ir_add(g, IR_OP_MATMUL, (int[]){qh, kh}, 2, &mm, "scores");
    IrAttr fa = fused_attr(0.25f, 11, causal);
    int pr = ir_add(g, IR_OP_SOFTMAX_DROPOUT, (int[]){sc, fx.mask}, 2, &fa, "probs");
    IrAttr pv = {.matmul = {false, false, 1.0}};
    int c = ir_add(g, IR_OP_MATMUL, (int[]){pr, vh}, 2, &pv, "ctx_heads");
    c = ir_add(g, IR_OP_MERGE_HEADS, &c, 1, NULL, "ctx");
    fx_loss(&fx, c);
    fx_gradcheck(&fx, IR_OP_SOFTMAX_DROPOUT_BWD);
}

Test(fuse_grad, softmax_dropout) { softmax_dropout_case(false); }
Test(fuse_grad, softmax_dropout_causal) { softmax_dropout_case(true); }

Test(fuse_grad, dropout_add)
{
    Fx fx;
    fx_init(&fx);
    int x = fx_embed(&fx, "x"), r = fx_embed(&fx, "r");
    IrAttr fa = fused_attr(0.3f, 5, false);
    int y = ir_add(&fx.g, IR_OP_DROPOUT_ADD, (int[]){x, r}, 2, &fa, "y");
    IrAttr act = {.act = {IR_ACT_GELU}};
    y = ir_add(&fx.g, IR_OP_ACT, &y, 1, &act, "act"); /* so the residual's gradient is not constant */
    fx_loss(&fx, y);
    fx_gradcheck(&fx, IR_OP_DROPOUT);
}

/* The fused ops really drop: at p = 0.5 about half of the elements are 0. */
Test(fuse_grad, dropout_mask_is_live)
{
    Fx fx;
    fx_init(&fx);
    int x = fx_embed(&fx, "x"), r = fx_embed(&fx, "r");
    IrAttr fa = fused_attr(0.5f, 9, false);
    int y = ir_add(&fx.g, IR_OP_DROPOUT_ADD, (int[]){x, r}, 2, &fa, "y");
    fx.g.loss = -1;
    fx.g.n_params = fx.pl.n;
    Batch *b = tiny_batch();
    double **w = random_weights(&fx.pl, 0.5);
    CpuExec ex;
    cpu_exec_init(&ex, &fx.g, CPU_EXEC_F64);
    for (int p = 0; p < fx.pl.n; p++) cpu_exec_bind_param(&ex, p, w[p]);
    CpuRunOptions o = {.training = true, .seed = 77, .step = 3, .loss_scale = 1.0};
    HpcError err = {0};
    cr_assert_eq(cpu_exec_run(&ex, b, &o, &err), HPC_OK, "%s", err.msg);
    const double *yv = cpu_exec_value(&ex, y), *xv = cpu_exec_value(&ex, x), *rv = cpu_exec_value(&ex, r);
    int64_t n = TB * TL * TH, dropped = 0, kept = 0;
    for (int64_t i = 0; i < n; i++) {
        if (yv[i] == rv[i]) dropped++;
        else if (fabs(yv[i] - (rv[i] + 2.0 * xv[i])) < 1e-12) kept++;
    }
    cr_expect_eq(dropped + kept, n);
    cr_expect(dropped > n / 4 && kept > n / 4, "dropped %lld kept %lld of %lld", (long long)dropped,
              (long long)kept, (long long)n);
    cpu_exec_free(&ex);
    free_weights(&fx.pl, w);
    batch_free(b);
    ir_free(&fx.g);
    params_free(&fx.pl);
}

/* ---- what must not fuse ---------------------------------------------- */

/* Without dropout no dropout rule fires: every op but the weight and bias
 * gradients (which the bias-gradient rule pairs) and the recomputed FFN
 * activations is kept as it was. */
Test(fuse_negative, no_dropout_no_change)
{
    ModelSpec s;
    tiny_spec(&s);
    s.stack.hidden_dropout = 0;
    s.stack.attention_dropout = 0;
    Pipeline plain, fused;
    build(&s, PREC_FP16, false, &plain);
    build(&s, PREC_FP16, true, &fused);
    cr_expect_eq(fused.fuse.softmax_dropout + fused.fuse.dropout_add, 0);
    int acc = fused.fuse.linear_dx_acc;   /* ADD + LINEAR_DX => LINEAR_DX_ACC (no dropout needed) */
    cr_expect_gt(acc, 0);
    for (int op = 0; op < IR_OP_COUNT; op++) {
        if (op == IR_OP_LINEAR_DW || op == IR_OP_BIAS_GRAD || op == IR_OP_LINEAR_DW_BGRAD || op == IR_OP_OUTPUT ||
            op == IR_OP_ACT_BWD || op == IR_OP_ACT_BWD_BGRAD)
            continue;
        int extra = op == IR_OP_ACT ? fused.fuse.act_recompute - fused.fuse.act_merged : 0;
        extra += op == IR_OP_LINEAR_DX_ACC ? acc : op == IR_OP_ADD || op == IR_OP_LINEAR_DX ? -acc : 0;
        cr_expect_eq(ir_count_op(&fused.g, (IrOpKind)op, 0), ir_count_op(&plain.g, (IrOpKind)op, 0) + extra, "%s",
                     ir_op_name((IrOpKind)op));
    }
    cr_expect_eq(ir_count_op(&fused.g, IR_OP_ACT_BWD, 0) + ir_count_op(&fused.g, IR_OP_ACT_BWD_BGRAD, 0),
                 ir_count_op(&plain.g, IR_OP_ACT_BWD, 0));
    cr_expect_eq(fused.g.n, plain.g.n + fused.fuse.act_recompute - acc, "each pair is one node and its output");
    pipeline_free(&plain);
    pipeline_free(&fused);
}

/* A softmax or dropout output read by anything outside the pattern stays. */
Test(fuse_negative, extra_readers_block_fusion)
{
    Fx fx;
    fx_init(&fx);
    IrGraph *g = &fx.g;
    IrAttr heads = {.heads = {THEADS}};
    int q = fx_embed(&fx, "q");
    int qh = ir_add(g, IR_OP_SPLIT_HEADS, &q, 1, &heads, "qh");
    IrAttr mm = {.matmul = {false, true, 0.5}};
    int sc = ir_add(g, IR_OP_MATMUL, (int[]){qh, qh}, 2, &mm, "scores");
    IrAttr sm = {.softmax = {false}};
    int pr = ir_add(g, IR_OP_SOFTMAX, (int[]){sc, fx.mask}, 2, &sm, "probs");
    IrAttr dr = {.dropout = {0.1, -1}};
    int pd = ir_add(g, IR_OP_DROPOUT, &pr, 1, &dr, "probs_dropout");
    IrAttr act = {.act = {IR_ACT_TANH}};
    int both = ir_add(g, IR_OP_ACT, &pr, 1, &act, "probs_again"); /* probs read twice */
    (void)pd;
    int x = fx_embed(&fx, "x");
    int xd = ir_add(g, IR_OP_DROPOUT, &x, 1, &dr, "x_dropout");
    int r1 = ir_add(g, IR_OP_ADD, (int[]){xd, x}, 2, NULL, "r1");
    int r2 = ir_add(g, IR_OP_ADD, (int[]){xd, r1}, 2, NULL, "r2"); /* x_dropout read twice */
    (void)both;
    (void)r2;
    IrGraph out;
    ir_init(&out);
    FuseStats st;
    HpcError err = {0};
    cr_assert_eq(fuse_graph(g, NULL, &out, NULL, &st, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(st.softmax_dropout, 0);
    cr_expect_eq(st.dropout_add, 0);
    cr_expect_eq(out.n, g->n);
    ir_free(&out);
    ir_free(&fx.g);
    params_free(&fx.pl);
}

Test(fuse_negative, rejects_bad_arguments)
{
    IrGraph a, b;
    ir_init(&a);
    ir_init(&b);
    ir_input(&b, IR_IN_INPUT_IDS);
    HpcError err = {0};
    PrecisionPlan pp;
    cr_expect_eq(fuse_graph(&a, NULL, &b, NULL, NULL, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "must be empty") != NULL, "%s", err.msg);
    ir_free(&b);
    ir_init(&b);
    cr_expect_eq(fuse_graph(&a, NULL, &b, &pp, NULL, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "pass pin") != NULL, "%s", err.msg);
    ir_free(&b);
}

/* ---- launch counts, goldens ------------------------------------------ */

Test(fuse_count, bert_base_launches_drop)
{
    ModelSpec s;
    cpu_step_load_model("bert_base.model", &s);
    Pipeline plain, fused;
    build(&s, PREC_FP16, false, &plain);
    build(&s, PREC_FP16, true, &fused);
    int before = fuse_count_launches(&plain.g), after = fuse_count_launches(&fused.g);
    printf("bert_base fp16: %d launches unfused, %d fused (%d fewer; %d values -> %d)\n", before, after,
           before - after, plain.g.n, fused.g.n);
    /* per layer: softmax+dropout (1), its backward (1), and per LayerNorm
     * site dropout + add + layernorm + cast (3) and layernorm_dx + dgamma +
     * bias_grad + dropout + bias_grad (4), the last site without a cast
     * (-1 in all); one launch less per LINEAR_DW_BGRAD pair (query, key,
     * value per layer: the attention output and FFN2 bias gradients went to
     * their LayerNorm sites, the classifier's dW reads the f16 copy of
     * dlogits) and per ACT_BWD_BGRAD (FFN1 per layer and the pooler); one
     * more per recomputed FFN ACT, unless it is an ACT_BWD_BGRAD's output 2
     * (merged: every layer). */
    int L = (int)s.stack.layers;
    /* and one ADD less per accumulating dX GEMM (FFN input, Q, K, V per layer) */
    int accum = 4 * L;
    cr_expect_eq(fused.fuse.linear_dx_acc, accum);
    cr_expect_eq(fused.fuse.act_merged, L);
    cr_expect_eq(before - after, 2 * L + 2 * 7 * L - 1 + 3 * L + (L + 1) - L + fused.fuse.act_merged + accum,
                 "%d -> %d", before, after);
    cr_expect_eq(fused.fuse.linear_dw_bgrad, 3 * L);
    cr_expect_eq(fused.fuse.act_bwd_bgrad, L + 1);
    cr_expect_eq(fused.fuse.act_recompute, L);
    cr_expect_eq(fused.fuse.softmax_dropout, s.stack.layers);
    cr_expect_eq(fused.fuse.ln_residual, 2 * s.stack.layers);
    cr_expect_eq(fused.fuse.ln_residual_bwd, 2 * s.stack.layers);
    cr_expect_eq(fused.fuse.ln_casts_folded, 2 * s.stack.layers - 1);
    pipeline_free(&plain);
    pipeline_free(&fused);
}

/* HPC_WEIGHT_GRAD=low changes dtypes only: BERT-base's fused fp16 graph has
 * the default's ops and inputs node for node, so the attention-output and
 * FFN-down bias gradients stay with their LayerNorm sites and no dW GEMM
 * gains a bias epilogue (compiler/precision.c, mark_linear_grads). */
Test(fuse_count, low_weight_grads_fuse_as_default)
{
    ModelSpec s;
    cpu_step_load_model("bert_base.model", &s);
    PipeOptions o = pipeline_defaults(PREC_FP16);
    HpcError err = {0};
    Pipeline def, low;
    cr_assert_eq(pipeline_build(&s, &o, &def, &err), HPC_OK, "%s", err.msg);
    setenv("HPC_WEIGHT_GRAD", "low", 1);
    HpcStatus st = pipeline_build(&s, &o, &low, &err);
    unsetenv("HPC_WEIGHT_GRAD");
    cr_assert_eq(st, HPC_OK, "%s", err.msg);
    cr_assert(low.prec.low_weight_grads && !def.prec.low_weight_grads);
    cr_assert_eq(low.g.n, def.g.n);
    int retyped = 0;
    for (int i = 0; i < def.g.n; i++) {
        const IrNode *a = &def.g.nodes[i], *b = &low.g.nodes[i];
        cr_expect_eq(a->op, b->op, "%s: %s against %s", a->name, ir_op_name(a->op), ir_op_name(b->op));
        cr_expect_eq(a->n_in, b->n_in, "%s", a->name);
        for (int k = 0; k < a->n_in && k < b->n_in; k++)
            cr_expect_eq(a->in[k], b->in[k], "%s: input %d", a->name, k);
        retyped += a->dtype != b->dtype;
    }
    cr_expect_gt(retyped, 0, "the option changed no dtype");
    cr_expect_eq(low.fuse.linear_dw_bgrad, def.fuse.linear_dw_bgrad);
    pipeline_free(&def);
    pipeline_free(&low);
}

static char *read_all(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    size_t got = fread(s, 1, (size_t)n, f);
    s[got] = '\0';
    fclose(f);
    return s;
}

static void expect_golden(bool fuse, const char *golden_rel)
{
    ModelSpec s;
    cpu_step_load_model("bert_tiny.model", &s);
    Pipeline p;
    build(&s, PREC_FP32, fuse, &p);
    char *got = NULL;
    size_t len = 0;
    FILE *mem = open_memstream(&got, &len);
    ir_print(&p.g, mem);
    fclose(mem);
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root ? root : ".", golden_rel);
    char *want = read_all(path);
    cr_assert(want, "cannot read %s", path);
    const char *a = got, *b = want, *la = got, *lb = want;
    int line = 1;
    for (; *a && *a == *b; a++, b++)
        if (*a == '\n') line++, la = a + 1, lb = b + 1;
    int na = (int)strcspn(la, "\n"), nb = (int)strcspn(lb, "\n");
    cr_expect(*a == '\0' && *b == '\0', "listing differs from %s at line %d:\n got: %.*s\nwant: %.*s",
              path, line, na, la, nb, lb);
    free(got);
    free(want);
    pipeline_free(&p);
}

Test(fuse_golden, unfused_listing_unchanged) { expect_golden(false, "tests/golden/bert_tiny.ir"); }
Test(fuse_golden, fused_listing_matches) { expect_golden(true, "tests/golden/bert_tiny_fused.ir"); }

/* ---- bias gradients from the weight-gradient GEMM ----------------------
 * LINEAR_DW + BIAS_GRAD of one dy => LINEAR_DW_BGRAD (dW, db).  The
 * equality tests above already run graphs with these pairs fused; here:
 * the counts, that the fp16 plan's error against an f64 reference does
 * not grow, the node itself against a hand-built column sum (NaN in dy
 * reaches db), and what must not pair. */

/* tiny_spec has 6 linears with bias per layer and a pooler; two of each
 * layer's (the attention output and FFN2, which feed the LayerNorm sites)
 * give their bias gradient to LN_RESIDUAL_BWD instead (fuse_dw.c says
 * why), and FFN1 and the pooler (a LINEAR before an activation) theirs to
 * ACT_BWD_BGRAD (fuse_act.c); the classifier's bias gradient reads the f32
 * dlogits while its dW reads the f16 copy (or, under fp32, they share it). */
static int tiny_pairs(SpecPrecision policy) { return (6 - 3) * 2 + (policy == PREC_FP32); }
static int tiny_act_bgrads(void) { return 2 + 1; }

static void check_bgrad_counts(SpecPrecision policy)
{
    ModelSpec s;
    tiny_spec(&s);
    Pipeline plain, fused;
    build(&s, policy, false, &plain);
    build(&s, policy, true, &fused);
    int pairs = tiny_pairs(policy);
    cr_expect_eq(fused.fuse.linear_dw_bgrad, pairs);
    cr_expect_eq(ir_count_op(&fused.g, IR_OP_LINEAR_DW_BGRAD, 0), pairs);
    cr_expect_eq(fused.fuse.act_bwd_bgrad, tiny_act_bgrads());
    cr_expect_eq(ir_count_op(&fused.g, IR_OP_ACT_BWD_BGRAD, 0), tiny_act_bgrads());
    cr_expect_eq(ir_count_op(&fused.g, IR_OP_ACT_BWD, 0), 0);
    /* the pairs', the activations' and, per LayerNorm site (2 per layer), its dbeta and dbias */
    cr_expect_eq(ir_count_op(&plain.g, IR_OP_BIAS_GRAD, 0) - ir_count_op(&fused.g, IR_OP_BIAS_GRAD, 0),
                 pairs + tiny_act_bgrads() + 2 * 2 * 2);
    cr_expect_eq(ir_count_op(&plain.g, IR_OP_LINEAR_DW, 0) - ir_count_op(&fused.g, IR_OP_LINEAR_DW, 0), pairs);
    /* no LINEAR_DW and BIAS_GRAD of one dy are left apart */
    for (int i = 0; i < fused.g.n; i++) {
        if (fused.g.nodes[i].op != IR_OP_BIAS_GRAD) continue;
        for (int j = 0; j < fused.g.n; j++)
            cr_expect(!(fused.g.nodes[j].op == IR_OP_LINEAR_DW && fused.g.nodes[j].in[0] == fused.g.nodes[i].in[0]),
                      "%s and %s read one dy", fused.g.nodes[i].name, fused.g.nodes[j].name);
    }
    /* every bias gradient a pair made is the db output, stored in f32; the
     * other projected gradients are the LayerNorm sites' dgamma, dbeta and
     * the dbias of the LINEAR before each (2 sites per layer) */
    int from_pairs = 0, from_sites = 0, from_acts = 0;
    for (int p = 0; p < fused.pl.n; p++) {
        int v = fused.g.param_grad[p];
        if (v < 0 || fused.g.nodes[v].op != IR_OP_OUTPUT) continue;
        const IrNode *src = &fused.g.nodes[fused.g.nodes[v].in[0]];
        cr_expect_eq(fused.g.nodes[v].dtype, DT_F32, "%s", fused.pl.p[p].name);
        if (src->op == IR_OP_LN_RESIDUAL_BWD) {
            from_sites += fused.g.nodes[v].attr.output.index == 4;
            continue;
        }
        if (src->op == IR_OP_ACT_BWD_BGRAD) {
            cr_expect_eq(fused.g.nodes[v].attr.output.index, 1, "%s", fused.pl.p[p].name);
            cr_expect(strstr(fused.pl.p[p].name, ".bias") != NULL, "%s", fused.pl.p[p].name);
            from_acts++;
            continue;
        }
        cr_expect_eq(src->op, IR_OP_LINEAR_DW_BGRAD, "%s", fused.pl.p[p].name);
        cr_expect(strstr(fused.pl.p[p].name, ".bias") != NULL, "%s", fused.pl.p[p].name);
        from_pairs++;
    }
    cr_expect_eq(from_pairs, pairs);
    cr_expect_eq(from_sites, 2 * 2);
    cr_expect_eq(from_acts, tiny_act_bgrads());
    pipeline_free(&plain);
    pipeline_free(&fused);
}

Test(fuse_bgrad, pairs_counted_fp32) { check_bgrad_counts(PREC_FP32); }
Test(fuse_bgrad, pairs_counted_fp16) { check_bgrad_counts(PREC_FP16); }
Test(fuse_bgrad, pairs_counted_bf16) { check_bgrad_counts(PREC_BF16); }

/* BERT-base: 12 x 3 linears (query, key, value) pair their BIAS_GRAD
 * with the dW GEMM; FFN1 and the pooler give theirs to the activation's
 * backward (so no BGRADB GEMM reads a dy that an ACT_BWD_BGRAD wrote);
 * each of the 2 LayerNorm sites per layer takes two (its dbeta and the
 * dbias of the LINEAR before it).  With HPC_FUSE_ACT_BGRAD=0 the FFN1 and
 * pooler bias gradients go back to the BGRADB GEMM. */
Test(fuse_bgrad, bert_base_bias_grad_nodes_drop)
{
    ModelSpec s;
    cpu_step_load_model("bert_base.model", &s);
    Pipeline plain, fused;
    build(&s, PREC_FP16, false, &plain);
    build(&s, PREC_FP16, true, &fused);
    int before = ir_count_op(&plain.g, IR_OP_BIAS_GRAD, 0), after = ir_count_op(&fused.g, IR_OP_BIAS_GRAD, 0);
    printf("bert_base fp16: %d bias_grad nodes unfused, %d fused (%d linear_dw_bgrad)\n", before, after,
           fused.fuse.linear_dw_bgrad);
    int L = (int)s.stack.layers;
    cr_expect_eq(fused.fuse.linear_dw_bgrad, 3 * L);
    cr_expect_eq(fused.fuse.act_bwd_bgrad, L + 1);
    cr_expect_eq(ir_count_op(&fused.g, IR_OP_ACT_BWD_BGRAD, 0), L + 1);
    cr_expect_eq(fused.fuse.ln_residual_bwd, 2 * L);
    cr_expect_eq(before - after, 3 * L + (L + 1) + 2 * 2 * L);
    for (int i = 0; i < fused.g.n; i++)   /* no BGRADB GEMM reads the fused activation's dx */
        if (fused.g.nodes[i].op == IR_OP_LINEAR_DW_BGRAD)
            cr_expect_neq(fused.g.nodes[fused.g.nodes[i].in[0]].op, IR_OP_ACT_BWD_BGRAD, "%s", fused.g.nodes[i].name);
    Pipeline off;
    setenv("HPC_FUSE_ACT_BGRAD", "0", 1);
    build(&s, PREC_FP16, true, &off);
    unsetenv("HPC_FUSE_ACT_BGRAD");
    cr_expect_eq(off.fuse.act_bwd_bgrad, 0);
    cr_expect_eq(off.fuse.linear_dw_bgrad, 4 * L + 1);
    cr_expect_eq(ir_count_op(&off.g, IR_OP_BIAS_GRAD, 0), after);
    pipeline_free(&off);
    pipeline_free(&plain);
    pipeline_free(&fused);
}

/* Largest relative gradient error (and the loss's) of `got` against `ref`;
 * the key biases are left out (their true gradient is 0: rounding noise
 * over nothing). */
static double worst_err(const StepOut *got, const StepOut *ref, const ParamList *pl)
{
    double worst = fabs(got->loss - ref->loss) / fabs(ref->loss);
    for (int p = 0; p < pl->n; p++) {
        if (!got->grad[p] || !ref->grad[p] || strstr(pl->p[p].name, "key.bias")) continue;
        double norm, e = rel_err(got->grad[p], ref->grad[p], params_numel(&pl->p[p]), &norm);
        if (isnan(e) || e > worst) worst = isnan(e) ? INFINITY : e;
    }
    return worst;
}

/* The fp16 plan fused is no further from the f64 fp32 step than unfused. */
Test(fuse_bgrad, fp16_error_not_worse)
{
    ModelSpec s;
    tiny_spec(&s);
    Pipeline ref, plain, fused;
    build(&s, PREC_FP32, false, &ref);
    build(&s, PREC_FP16, false, &plain);
    setenv("HPC_FUSE_ACCUM", "0", 1);   /* its rounding differs: tests/test_fuse_accum.c measures it */
    build(&s, PREC_FP16, true, &fused);
    unsetenv("HPC_FUSE_ACCUM");
    cr_assert_gt(fused.fuse.linear_dw_bgrad, 0);
    Batch *b = tiny_batch();
    double **w = random_weights(&ref.pl, 0.5);
    StepOut r = run_step(&ref.g, &ref.pl, w, CPU_EXEC_F64, b);
    StepOut a = run_step(&plain.g, &plain.pl, w, CPU_EXEC_F32, b);
    StepOut f = run_step(&fused.g, &fused.pl, w, CPU_EXEC_F32, b);
    double ea = worst_err(&a, &r, &ref.pl), ef = worst_err(&f, &r, &ref.pl);
    cr_log_info("fp16 vs f64 fp32: unfused %.3g, fused %.3g", ea, ef);
    cr_expect(isfinite(ef) && ef > 0 && ef <= ea * (1 + 1e-6), "fused fp16 error %.3g, unfused %.3g", ef, ea);
    cr_expect(ef < 0.05, "the fp16 step is %.3g from the f32 reference", ef);
    step_free(&r);
    step_free(&a);
    step_free(&f);
    free_weights(&ref.pl, w);
    batch_free(b);
    pipeline_free(&ref);
    pipeline_free(&plain);
    pipeline_free(&fused);
}

/* A hand-built LINEAR_DW_BGRAD on an embedding output: dW = dy^T x and db
 * the column sums of dy against a direct f64 sum, and a NaN in dy reaches
 * db's column (the column sum never hides it). */
Test(fuse_bgrad, node_against_direct_sums)
{
    Fx fx;
    fx_init(&fx);
    int dy = fx_embed(&fx, "dy"), x = fx_embed(&fx, "x");
    int outs[2];
    ir_add_outputs(&fx.g, IR_OP_LINEAR_DW_BGRAD, (int[]){dy, x}, 2, NULL, "dw", outs);
    cr_assert_eq(outs[1], outs[0] + 1);
    cr_expect_eq(fx.g.nodes[outs[1]].rank, 1);
    cr_expect_eq(fx.g.nodes[outs[1]].dims[0], TH);
    fx.g.loss = -1;
    fx.g.n_params = fx.pl.n;
    Batch *b = tiny_batch();
    double **w = random_weights(&fx.pl, 0.5);
    for (int nan_pass = 0; nan_pass < 2; nan_pass++) {
        if (nan_pass) w[0][(int64_t)b->input_ids[3] * TH + 5] = NAN;   /* row 3's token, column 5 of dy */
        CpuExec ex;
        cpu_exec_init(&ex, &fx.g, CPU_EXEC_F64);
        for (int p = 0; p < fx.pl.n; p++) cpu_exec_bind_param(&ex, p, w[p]);
        CpuRunOptions o = {.training = true, .seed = 77, .step = 3, .loss_scale = 1.0};
        HpcError err = {0};
        cr_assert_eq(cpu_exec_run(&ex, b, &o, &err), HPC_OK, "%s", err.msg);
        const double *dv = cpu_exec_value(&ex, dy), *xv = cpu_exec_value(&ex, x);
        const double *dw = cpu_exec_value(&ex, outs[0]), *db = cpu_exec_value(&ex, outs[1]);
        int64_t R = TB * TL;
        double ew = 0, nw = 0, eb = 0, nb = 0;
        for (int o_ = 0; o_ < TH; o_++) {
            double sb = 0;
            for (int64_t r = 0; r < R; r++) sb += dv[r * TH + o_];
            if (nan_pass) {
                cr_expect_eq(isnan(db[o_]), o_ == 5, "db[%d] = %g", o_, db[o_]);
                continue;
            }
            eb += (db[o_] - sb) * (db[o_] - sb);
            nb += sb * sb;
            for (int i = 0; i < TH; i++) {
                double sw = 0;
                for (int64_t r = 0; r < R; r++) sw += dv[r * TH + o_] * xv[r * TH + i];
                ew += (dw[o_ * TH + i] - sw) * (dw[o_ * TH + i] - sw);
                nw += sw * sw;
            }
        }
        if (!nan_pass) {
            cr_expect(nb > 0 && sqrt(eb / nb) < 1e-12, "db rel %.3g", sqrt(eb / nb));
            cr_expect(nw > 0 && sqrt(ew / nw) < 1e-12, "dW rel %.3g", sqrt(ew / nw));
        }
        cpu_exec_free(&ex);
    }
    free_weights(&fx.pl, w);
    batch_free(b);
    ir_free(&fx.g);
    params_free(&fx.pl);
}

/* ---- the activation backward with the bias gradient ------------------
 * For every activation of the table: x -> LINEAR(W, b) -> ACT -> loss,
 * autodiff, then the graph fused (BIAS_GRAD(ACT_BWD) => ACT_BWD_BGRAD)
 * and unfused run on the cpu backend: every gradient bit for bit (f64 and
 * f32), and a NaN in one value of x reaches db (a column sum never hides
 * a NaN). */
static void act_bgrad_case(IrActKind kind, CpuExecPrecision prec)
{
    Fx fx;
    fx_init(&fx);
    int x = fx_embed(&fx, "x");
    int w = fx_param(&fx, "ffn.w", TH, TH), b = fx_param(&fx, "ffn.b", TH, 0);   /* IR ids */
    int h = ir_add(&fx.g, IR_OP_LINEAR, (int[]){x, w, b}, 3, NULL, "ffn.in");
    IrAttr act = {.act = {kind}};
    int y = ir_add(&fx.g, IR_OP_ACT, &h, 1, &act, "ffn.act");
    fx_loss(&fx, y);
    fx.g.n_params = fx.pl.n;
    HpcError err = {0};
    cr_assert_eq(autodiff_build(&fx.g, &fx.pl, &err), HPC_OK, "%s", err.msg);
    IrGraph out, off;
    ir_init(&out);
    ir_init(&off);
    FuseStats st;
    cr_assert_eq(fuse_graph(&fx.g, NULL, &out, NULL, &st, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(st.act_bwd_bgrad, 1, "%s", ir_act_name(kind));
    cr_expect_eq(ir_count_op(&out, IR_OP_ACT_BWD_BGRAD, 0), 1);
    cr_expect_eq(ir_count_op(&out, IR_OP_ACT_BWD, 0), 0);
    FuseOptions fo = fuse_defaults();
    fo.act_bgrad = false;
    cr_assert_eq(fuse_graph_with(&fx.g, NULL, &off, NULL, &st, &fo, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(st.act_bwd_bgrad, 0);
    cr_expect_eq(ir_count_op(&off, IR_OP_ACT_BWD_BGRAD, 0), 0);
    cr_expect_eq(ir_count_op(&off, IR_OP_LINEAR_DW_BGRAD, 0), 2);   /* ffn and head pair with their dW GEMM */
    Batch *bt = tiny_batch();
    double **wt = random_weights(&fx.pl, 0.5);
    for (int nan_pass = 0; nan_pass < 2; nan_pass++) {
        if (nan_pass) wt[0][(int64_t)bt->input_ids[2] * TH + 3] = NAN;   /* one x value: a NaN row of h */
        StepOut f = run_step(&out, &fx.pl, wt, prec, bt), u = run_step(&fx.g, &fx.pl, wt, prec, bt);
        for (int p = 0; p < fx.pl.n; p++) {
            int64_t n = params_numel(&fx.pl.p[p]);
            cr_assert(f.grad[p] && u.grad[p], "%s", fx.pl.p[p].name);
            int nans = 0;
            for (int64_t k = 0; k < n; k++) {
                nans += isnan(f.grad[p][k]);
                cr_expect(memcmp(&f.grad[p][k], &u.grad[p][k], sizeof(double)) == 0 ||
                              (isnan(f.grad[p][k]) && isnan(u.grad[p][k])),
                          "%s %s[%lld]: fused %.17g, unfused %.17g", ir_act_name(kind), fx.pl.p[p].name,
                          (long long)k, f.grad[p][k], u.grad[p][k]);
            }
            if (nan_pass && strcmp(fx.pl.p[p].name, "ffn.b") == 0)
                cr_expect_gt(nans, 0, "%s: no NaN reached %s", ir_act_name(kind), fx.pl.p[p].name);
            if (!nan_pass) cr_expect_eq(nans, 0);
        }
        step_free(&f);
        step_free(&u);
    }
    free_weights(&fx.pl, wt);
    batch_free(bt);
    ir_free(&out);
    ir_free(&off);
    ir_free(&fx.g);
    params_free(&fx.pl);
}

Test(fuse_act, every_activation_fused_equals_unfused)
{
    for (int k = 0; k < IR_ACT_COUNT; k++) {
        act_bgrad_case((IrActKind)k, CPU_EXEC_F64);
        act_bgrad_case((IrActKind)k, CPU_EXEC_F32);
    }
}

/* Pairs that must stay apart: a db stored in another dtype than dW, and a
 * dW read by a node between it and the BIAS_GRAD (moving it would break
 * the order); the next LINEAR_DW of the same dy pairs instead. */
Test(fuse_bgrad, what_must_not_pair)
{
    Fx fx;
    fx_init(&fx);
    IrGraph *g = &fx.g;
    int dy = fx_embed(&fx, "dy"), x = fx_embed(&fx, "x");
    int dw_read = ir_add(g, IR_OP_LINEAR_DW, (int[]){dy, x}, 2, NULL, "dw_read");
    int reader = ir_add(g, IR_OP_ADD, (int[]){dw_read, dw_read}, 2, NULL, "reads_dw");
    int dw_free = ir_add(g, IR_OP_LINEAR_DW, (int[]){dy, x}, 2, NULL, "dw_free");
    int db_f16 = ir_add(g, IR_OP_BIAS_GRAD, &dy, 1, NULL, "db_f16");
    int db = ir_add(g, IR_OP_BIAS_GRAD, &dy, 1, NULL, "db");
    int bwd[] = {dw_read, reader, dw_free, db_f16, db};
    for (int i = 0; i < 5; i++) g->nodes[bwd[i]].backward = true;
    g->nodes[db_f16].dtype = DT_F16;
    IrGraph out;
    ir_init(&out);
    FuseStats st;
    HpcError err = {0};
    cr_assert_eq(fuse_graph(g, NULL, &out, NULL, &st, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(st.linear_dw_bgrad, 1);
    int f = -1;
    for (int i = 0; i < out.n; i++)
        if (out.nodes[i].op == IR_OP_LINEAR_DW_BGRAD) f = i;
    cr_assert_geq(f, 0);
    cr_expect_str_eq(out.nodes[f].name, "dw_free");
    cr_expect_eq(out.nodes[f + 1].op, IR_OP_OUTPUT);
    cr_expect_eq(ir_count_op(&out, IR_OP_LINEAR_DW, 0), 1);    /* dw_read */
    cr_expect_eq(ir_count_op(&out, IR_OP_BIAS_GRAD, 0), 1);    /* db_f16 */
    ir_free(&out);
    ir_free(&fx.g);
    params_free(&fx.pl);
}

/* ---- the FFN activation recomputed in the backward pass ---------------- */

/* Each layer's GELU output is recomputed before its dW GEMM, never kept:
 * the copy (or, merged, output 2 of the ACT_BWD_BGRAD that reads the same
 * h) is computed from the forward input in the backward part, the dW GEMM
 * reads it, the forward value's last reader is forward, and its precision
 * plan entry is the forward ACT's. */
static void check_recomputed(bool merge)
{
    ModelSpec s;
    tiny_spec(&s);
    Pipeline p;
    if (!merge) setenv("HPC_FUSE_ACT_BGRAD", "nomerge", 1);
    build(&s, PREC_FP16, true, &p);
    unsetenv("HPC_FUSE_ACT_BGRAD");
    cr_expect_eq(p.fuse.act_recompute, s.stack.layers);
    cr_expect_eq(p.fuse.act_merged, merge ? s.stack.layers : 0);
    int copies = 0;
    for (int i = 0; i < p.g.n; i++) {
        const IrNode *n = &p.g.nodes[i];
        bool copy = n->op == IR_OP_ACT && n->backward;
        bool out2 = n->op == IR_OP_OUTPUT && p.g.nodes[n->in[0]].op == IR_OP_ACT_BWD_BGRAD && n->attr.output.index == 2;
        if (!copy && !out2) continue;
        copies++;
        cr_expect(strstr(n->name, ".recompute") != NULL, "%s", n->name);
        int h_id = copy ? n->in[0] : p.g.nodes[n->in[0]].in[1];
        const IrNode *h = &p.g.nodes[h_id];
        cr_expect(!h->backward && i >= p.g.n_forward, "%s reads a forward value, runs in the backward part", n->name);
        cr_expect_eq(n->dtype, DT_F16);
        cr_expect_eq(p.prec.info[i].cls, PREC_CLASS_F32_COMPUTE, "%s", n->name);
        int fwd = -1;   /* the forward ACT it recomputes: same input */
        for (int j = 0; j < p.g.n_forward; j++)
            if (p.g.nodes[j].op == IR_OP_ACT && p.g.nodes[j].in[0] == h_id) fwd = j;
        cr_assert_geq(fwd, 0);
        int dw = 0;
        for (int j = p.g.n_forward; j < p.g.n; j++)
            for (int k = 0; k < p.g.nodes[j].n_in; k++) {
                cr_expect_neq(p.g.nodes[j].in[k], fwd, "%s reads the forward %s", p.g.nodes[j].name,
                              p.g.nodes[fwd].name);
                dw += p.g.nodes[j].in[k] == i && p.g.nodes[j].op == IR_OP_LINEAR_DW;
            }
        cr_expect_eq(dw, 1, "%s: read by %d dW GEMMs", n->name, dw);
    }
    cr_expect_eq(copies, s.stack.layers);
    pipeline_free(&p);
}

Test(fuse_recompute, ffn_act_recomputed_in_backward) { check_recomputed(false); }
Test(fuse_recompute, ffn_act_merged_into_act_bwd) { check_recomputed(true); }

/* BERT-base fp16 at B32 L128: the planned arena shrinks by at least the
 * GELU outputs of all layers but one (the last layer's backward holds its
 * copy while the others' are gone), or but two when the copy is an
 * ACT_BWD_BGRAD's output 2 (g and dh are then live together for the dW2
 * GEMM: one such tensor more at that moment). */
Test(fuse_recompute, bert_base_arena_shrinks)
{
    ModelSpec s;
    cpu_step_load_model("bert_base.model", &s);
    Pipeline keep, re;
    PipeOptions o = pipeline_defaults(PREC_FP16);
    HpcError err = {0};
    setenv("HPC_FUSE_ACT_BGRAD", "nomerge", 1);
    cr_assert_eq(pipeline_build(&s, &o, &re, &err), HPC_OK, "%s", err.msg);
    unsetenv("HPC_FUSE_ACT_BGRAD");
    Pipeline merged;
    cr_assert_eq(pipeline_build(&s, &o, &merged, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(merged.fuse.act_merged, s.stack.layers);
    /* the same graph fused without the recompute */
    PipeOptions u = pipeline_defaults(PREC_FP16);
    u.fuse = false;
    cr_assert_eq(pipeline_build(&s, &u, &keep, &err), HPC_OK, "%s", err.msg);
    IrGraph kg;
    PrecisionPlan kp;
    ir_init(&kg);
    FuseOptions fo = fuse_defaults();
    fo.recompute_act = false;
    FuseStats st;
    cr_assert_eq(fuse_graph_with(&keep.g, &keep.prec, &kg, &kp, &st, &fo, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(st.act_recompute, 0);
    StepPlan a, b, c;
    /* in the graph's order: AUTO's choice of the dW GEMM groups (plan.h) would differ between the graphs */
    const PlanOptions order = {.dw_group = PLAN_DW_GROUP_NEVER};
    cr_assert_eq(plan_build_scratch_with(&kg, 32, 128, NULL, &order, &a, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build_scratch_with(&re.g, 32, 128, NULL, &order, &b, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build_scratch_with(&merged.g, 32, 128, NULL, &order, &c, &err), HPC_OK, "%s", err.msg);
    int64_t g_bytes = (int64_t)32 * 128 * s.stack.ffn * 2;
    printf("bert_base fp16 B32 L128 arena: %.1f MiB keeping the GELU outputs, %.1f MiB recomputing them, "
           "%.1f MiB recomputing them in the activation's backward kernel\n",
           (double)a.arena_bytes / 1048576.0, (double)b.arena_bytes / 1048576.0, (double)c.arena_bytes / 1048576.0);
    cr_expect_geq(a.arena_bytes - b.arena_bytes, (s.stack.layers - 1) * g_bytes, "%lld -> %lld",
                  (long long)a.arena_bytes, (long long)b.arena_bytes);
    cr_expect_geq(a.arena_bytes - c.arena_bytes, (s.stack.layers - 2) * g_bytes, "%lld -> %lld",
                  (long long)a.arena_bytes, (long long)c.arena_bytes);
    plan_free(&a);
    plan_free(&b);
    plan_free(&c);
    pipeline_free(&merged);
    precision_plan_free(&kp);
    ir_free(&kg);
    pipeline_free(&keep);
    pipeline_free(&re);
}

/* ---- pipeline --------------------------------------------------------- */

Test(pipeline, stop_after_and_dump)
{
    ModelSpec s;
    tiny_spec(&s);
    PipeOptions o = pipeline_defaults(PREC_FP16);
    o.stop_after = PIPE_AUTODIFF;
    o.dump = PIPE_BIT(PIPE_LOWER);
    char *text = NULL;
    size_t len = 0;
    o.dump_out = open_memstream(&text, &len);
    Pipeline p;
    HpcError err = {0};
    cr_assert_eq(pipeline_build(&s, &o, &p, &err), HPC_OK, "%s", err.msg);
    fclose(o.dump_out);
    cr_expect_eq(p.reached, PIPE_AUTODIFF);
    cr_expect_not(p.fused);
    cr_expect_gt(p.g.n, p.g.n_forward);
    cr_expect(strncmp(text, "# after lower\n", 14) == 0, "%.40s", text);
    cr_expect(strstr(text, "# backward") == NULL, "the lower dump has no backward part");
    free(text);
    pipeline_free(&p);
    cr_expect_eq(pipeline_stage_parse("precision"), PIPE_PRECISION);
    cr_expect_eq(pipeline_stage_parse("emit"), PIPE_NONE);
    cr_expect_str_eq(pipeline_stage_name(PIPE_FUSE), "fuse");
}

/* The re-indexed precision plan describes the fused graph. */
Test(pipeline, plan_follows_fused_graph)
{
    ModelSpec s;
    tiny_spec(&s);
    Pipeline p;
    build(&s, PREC_FP16, true, &p);
    cr_assert_eq(p.prec.n, p.g.n);
    for (int i = 0; i < p.g.n; i++) {
        IrOpKind op = p.g.nodes[i].op;
        if (op == IR_OP_SOFTMAX_DROPOUT || op == IR_OP_DROPOUT_ADD || op == IR_OP_SOFTMAX_DROPOUT_BWD ||
            op == IR_OP_LN_RESIDUAL || op == IR_OP_LN_RESIDUAL_BWD)
            cr_expect_eq(p.prec.info[i].cls, PREC_CLASS_F32_COMPUTE, "node %d", i);
        if (op == IR_OP_SOFTMAX_DROPOUT) cr_expect_eq(fuse_attr_get(&p.g.nodes[i]).mid, DT_F16);
        cr_expect_neq(op, IR_OP_SOFTMAX, "node %d: a softmax survived fusion", i);
    }
    pipeline_free(&p);
}

/* ---- CUDA: the fused graphs' kernels compile -------------------------- */

static void expect_compiles(const ModelSpec *s, SpecPrecision prec, int arch)
{
    Pipeline p;
    build(s, prec, true, &p);
    HpcError err = {0};
    char *src;
    cr_assert_eq(eop_module_source(&p.g, &src, &err), HPC_OK, "%s", err.msg);
    void *cubin;
    size_t size;
    char *log = NULL;
    HpcStatus st = nvrtc_compile(src, "hpc_fuse_test", arch, NULL, 0, &cubin, &size, &log, &err);
    cr_assert_eq(st, HPC_OK, "%s %s sm_%d: %s\n%s", s->name, spec_precision_name(prec), arch, err.msg,
                 log ? log : "");
    int fused = 0;
    for (int id = 0; id < p.g.n; id++) {
        IrOpKind op = p.g.nodes[id].op;
        if (op != IR_OP_SOFTMAX_DROPOUT && op != IR_OP_SOFTMAX_DROPOUT_BWD && op != IR_OP_DROPOUT_ADD &&
            op != IR_OP_LN_RESIDUAL && op != IR_OP_LN_RESIDUAL_BWD && op != IR_OP_ACT_BWD_BGRAD && op != IR_OP_ACT &&
            op != IR_OP_ACT_BWD)
            continue;
        EopNodeCode c;
        cr_assert_eq(eop_node_code(&p.g, id, 4, 16, &c, &err), HPC_OK, "%s", err.msg);
        cr_expect_eq(c.kind, EOP_KERNELS);
        for (int k = 0; k < c.n_phases; k++) {
            const char *name = c.phase[k].name;
            cr_expect(memmem(cubin, size, name, strlen(name)) != NULL, "%s not in the cubin", name);
        }
        fused++;
    }
    cr_expect_gt(fused, 3);
    free(cubin);
    free(log);
    free(src);
    pipeline_free(&p);
}

Test(fuse_cuda, tiny_fp32_fp16_bf16_sm80_sm90, .timeout = 300)
{
    ModelSpec s;
    tiny_spec(&s);
    expect_compiles(&s, PREC_FP32, 80);
    expect_compiles(&s, PREC_FP16, 90);
    expect_compiles(&s, PREC_BF16, 80);
    expect_compiles(&s, PREC_FP16, 80);
}

/* The activation kernels in each form: the fused backward + bias gradient
 * with the recompute merged (vector path), kept apart (nomerge), the
 * scalar path (an FFN of 333, not a multiple of 8, with SiLU), and the
 * rule off (the plain act_bwd vector kernel). */
Test(fuse_cuda, act_kernels_every_form, .timeout = 300)
{
    ModelSpec s;
    tiny_spec(&s);
    s.stack.layers = 1;
    expect_compiles(&s, PREC_BF16, 90);
    setenv("HPC_FUSE_ACT_BGRAD", "nomerge", 1);
    expect_compiles(&s, PREC_FP16, 80);
    setenv("HPC_FUSE_ACT_BGRAD", "0", 1);
    expect_compiles(&s, PREC_FP16, 90);
    unsetenv("HPC_FUSE_ACT_BGRAD");
    s.stack.ffn = 333;
    s.stack.activation = ACT_SILU;
    expect_compiles(&s, PREC_FP16, 80);
    expect_compiles(&s, PREC_FP32, 90);
}

Test(fuse_cuda, gpt2_causal_sm90, .timeout = 300)
{
    ModelSpec s;
    cpu_step_load_model("gpt2_small.model", &s);
    s.stack.layers = 1;
    expect_compiles(&s, PREC_FP16, 90);
}

/* A causal classifier: fusion leaves slice_last and its backward alone,
 * and the fused module compiles. */
Test(fuse_cuda, gpt2_classifier_keeps_slice_last_sm80, .timeout = 300)
{
    ModelSpec s;
    cpu_step_load_model("gpt2_small.model", &s);
    s.stack.layers = 1;
    s.head.kind = HEAD_SEQ_CLASSIFICATION;
    s.head.pooler = false;
    s.head.num_labels = 3;
    Pipeline p;
    build(&s, PREC_FP16, true, &p);
    int fwd = 0, bwd = 0;
    for (int id = 0; id < p.g.n; id++) {
        fwd += p.g.nodes[id].op == IR_OP_SLICE_LAST;
        bwd += p.g.nodes[id].op == IR_OP_SLICE_LAST_BWD;
    }
    cr_expect_eq(fwd, 1);
    cr_expect_eq(bwd, 1);
    pipeline_free(&p);
    expect_compiles(&s, PREC_FP16, 80);
}
