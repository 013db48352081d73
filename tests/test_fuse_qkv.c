/* tests/test_fuse_qkv.c — Q, K and V from one GEMM (compiler/fuse_qkv.c,
 * HPC_FUSE_QKV=1) on the cpu executor.
 *
 * A bert_tiny-shaped classifier (tests/tiny_classifier.h, but hidden 128 so
 * the biases form a param_pack group too; 2 layers, dropout 0.1 on, the
 * batch's second row padded) with fused attention:
 *   - counts: per layer one packed ATTENTION, one QKV LINEAR where there
 *     were three, two STACKs, two UNSTACKs; after the fuse pass one
 *     LINEAR_DW_BGRAD and one LINEAR_DX_ACC for the three projections;
 *     the parameter table is unchanged and nothing changes without the
 *     switch (or with unfused attention);
 *   - numbers: the loss and every parameter gradient of one training step,
 *     same weights and batch, with the switch on against off, under the
 *     fp32, fp16 and bf16 plans, on the f64 and f32 executors (reference
 *     and fast kernels).  What differs is only the dX sum: one GEMM of
 *     K = 3H against three accumulating GEMMs whose partial sums are
 *     stored in f32, so the f64 executor agrees to f32 rounding (measured
 *     and printed; limit 1e-6), the f32 one to f32 rounding of the sums
 *     (limit 1e-5: the brief asks far under 1e-4).  The dropout masks must
 *     be the same: a wrong salt shows as an O(1) difference.
 * key.bias is compared by its norm only: its gradient is 0 up to rounding
 * (softmax's shift invariance), so a relative error of it means nothing. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/fuse_qkv.h"
#include "compiler/plan_graph.h"
#include "compiler/step_program_build.h"
#include "cpu/cpu_exec.h"
#include "cpu_step.h"
#include "tiny_classifier.h"
#include "data/batch.h"
#include "pipeline.h"
#include "program/ir.h"
#include "program/params.h"
#include "program/spec.h"
#include "program/step_program.h"

static void qkv_spec(ModelSpec *s)
{
    tiny_spec(s);
    s->stack.hidden = 128;
    s->stack.heads = 2;
    s->stack.ffn = 256;
}

static void build(const ModelSpec *s, SpecPrecision policy, bool qkv, AttnForm form, Pipeline *p)
{
    PipeOptions o = pipeline_defaults(policy);
    o.fuse_qkv = qkv;
    o.attention = form;
    HpcError err = {0};
    cr_assert_eq(pipeline_build(s, &o, p, &err), HPC_OK, "pipeline_build: %s", err.msg);
}

static int count_packed(const IrGraph *g)
{
    int n = 0;
    for (int i = 0; i < g->n; i++)
        n += (g->nodes[i].op == IR_OP_ATTENTION || g->nodes[i].op == IR_OP_ATTENTION_BWD) && g->nodes[i].attr.attn.packed;
    return n;
}

Test(fuse_qkv, counts)
{
    ModelSpec s;
    qkv_spec(&s);
    int L = (int)s.stack.layers;
    Pipeline off, on;
    build(&s, PREC_FP16, false, ATTN_FORM_FUSED, &off);
    build(&s, PREC_FP16, true, ATTN_FORM_FUSED, &on);
    cr_assert_eq(off.qkv_sites, 0);
    cr_assert_eq(on.qkv_sites, L);
    cr_assert_eq(count_packed(&off.g), 0);
    cr_assert_eq(count_packed(&on.g), 2 * L, "a packed ATTENTION and ATTENTION_BWD per layer");
    /* the packed backward's one output is dqkv (B, L, 3H): no dk, dv
     * OUTPUT nodes, which nothing would write */
    for (int i = 0; i < on.g.n; i++) {
        const IrNode *n = &on.g.nodes[i];
        if (n->op != IR_OP_ATTENTION_BWD) continue;
        cr_assert(n->attr.attn.packed);
        cr_assert_eq(n->dims[2], 3 * s.stack.hidden, "%s: output 0 covers q, k and v", n->name);
        cr_assert_eq(ir_output(&on.g, i, 1), -1, "%s has a dk output", n->name);
        cr_assert_eq(ir_output(&on.g, i, 2), -1, "%s has a dv output", n->name);
    }
    for (int i = 0; i < off.g.n; i++)
        if (off.g.nodes[i].op == IR_OP_ATTENTION_BWD)
            cr_assert(ir_output(&off.g, i, 1) >= 0 && ir_output(&off.g, i, 2) >= 0, "unpacked: dk, dv outputs");
    cr_assert_eq(ir_count_op(&on.g, IR_OP_STACK, 0), 2 * L);
    cr_assert_eq(ir_count_op(&on.g, IR_OP_UNSTACK, 0), 2 * L);
    cr_assert_eq(ir_count_op(&off.g, IR_OP_LINEAR, 0) - ir_count_op(&on.g, IR_OP_LINEAR, 0), 2 * L);
    /* dW GEMMs of either kind: under HPC_LN_SAVE=xhat_ones (the default) a
     * Q/K/V dW after a LayerNorm site is a LINEAR_DW whose ones column
     * gives the bias gradient, elsewhere a LINEAR_DW_BGRAD */
    int dw_off = ir_count_op(&off.g, IR_OP_LINEAR_DW_BGRAD, 0) + ir_count_op(&off.g, IR_OP_LINEAR_DW, 0);
    int dw_on = ir_count_op(&on.g, IR_OP_LINEAR_DW_BGRAD, 0) + ir_count_op(&on.g, IR_OP_LINEAR_DW, 0);
    cr_assert_eq(dw_off - dw_on, 2 * L, "dW GEMMs %d unpacked, %d packed", dw_off, dw_on);
    cr_assert_eq(off.fuse.linear_dx_acc, 4 * L);
    cr_assert_eq(on.fuse.linear_dx_acc, 2 * L, "one accumulating dX GEMM for Q, K, V per layer");
    /* the parameter table and the roles are untouched */
    cr_assert_eq(on.pl.n, off.pl.n);
    for (int p = 0; p < on.pl.n; p++) cr_assert_str_eq(on.pl.p[p].name, off.pl.p[p].name);
    for (int p = 0; p < on.g.n_params; p++)
        cr_assert_eq(on.g.param_grad[p] >= 0, off.g.param_grad[p] >= 0, "%s", on.pl.p[p].name);
    pipeline_free(&off);
    pipeline_free(&on);
    /* unfused attention has no ATTENTION node to feed: nothing to rewrite */
    build(&s, PREC_FP16, true, ATTN_FORM_UNFUSED, &on);
    cr_assert_eq(on.qkv_sites, 0);
    cr_assert_eq(ir_count_op(&on.g, IR_OP_STACK, 0), 0);
    pipeline_free(&on);
    /* hidden 16: 16-bit biases of 32 bytes would not lie back to back, so no rewrite */
    tiny_spec(&s);
    build(&s, PREC_FP16, true, ATTN_FORM_FUSED, &on);
    cr_assert_eq(on.qkv_sites, 0);
    pipeline_free(&on);
}

Test(fuse_qkv, switch_reads_the_environment)
{
    unsetenv("HPC_FUSE_QKV");
    cr_assert_eq(pipeline_defaults(PREC_FP16).fuse_qkv, FUSE_QKV_DEFAULT);
    setenv("HPC_FUSE_QKV", "yes", 1);
    cr_assert_eq(pipeline_defaults(PREC_FP16).fuse_qkv, FUSE_QKV_DEFAULT, "only 0 and 1 mean something");
    setenv("HPC_FUSE_QKV", "0", 1);
    cr_assert_not(pipeline_defaults(PREC_FP16).fuse_qkv);
    setenv("HPC_FUSE_QKV", "1", 1);
    cr_assert(pipeline_defaults(PREC_FP16).fuse_qkv);
    unsetenv("HPC_FUSE_QKV");
}

static double rel_err(const double *a, const double *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t k = 0; k < n; k++) {
        num += (a[k] - b[k]) * (a[k] - b[k]);
        den += b[k] * b[k];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static double norm(const double *a, int64_t n)
{
    double s = 0;
    for (int64_t k = 0; k < n; k++) s += a[k] * a[k];
    return sqrt(s);
}

static void expect_on_equals_off_frozen(SpecPrecision policy, CpuExecPrecision prec, CpuExecMode mode, double tol,
                                        int64_t frozen, const char *what)
{
    ModelSpec s;
    qkv_spec(&s);
    s.train.freeze_layers = frozen;
    Pipeline off, on;
    build(&s, policy, false, ATTN_FORM_FUSED, &off);
    build(&s, policy, true, ATTN_FORM_FUSED, &on);
    cr_assert_eq(on.qkv_sites, (int)s.stack.layers, "%s", what);
    Batch *b = tiny_batch();
    double **w = cpu_step_random_weights(&off.pl, 4321, 0.5);
    double scale = policy == PREC_FP32 ? 1.0 : 1024.0;   /* 16-bit gradients underflow at 1 */
    StepOut a = cpu_step_run(&off.g, &off.pl, w, prec, mode, scale, b);
    StepOut f = cpu_step_run(&on.g, &on.pl, w, prec, mode, scale, b);
    double worst = fabs(f.loss - a.loss) / fabs(a.loss), big = 0;
    if (!isfinite(f.loss) || !isfinite(a.loss)) worst = NAN;
    int compared = 0;
    for (int p = 0; p < off.pl.n; p++) {
        cr_expect_eq(f.grad[p] == NULL, a.grad[p] == NULL, "%s: %s has a gradient on one side only", what,
                     off.pl.p[p].name);
        if (!f.grad[p] || !a.grad[p]) continue;
        int64_t n = params_numel(&off.pl.p[p]);
        if (strstr(off.pl.p[p].name, "key.bias")) {   /* ~0 on both sides */
            big = fmax(big, fabs(norm(f.grad[p], n) - norm(a.grad[p], n)));
            continue;
        }
        double e = rel_err(f.grad[p], a.grad[p], n);
        if (isnan(e) || isnan(worst)) worst = NAN;
        else if (e > worst) worst = e;
        compared++;
    }
    printf("fuse_qkv %s: loss %.9g vs %.9g, worst relative error over the loss and %d gradients %.3g "
           "(key.bias norms differ by %.3g)\n", what, f.loss, a.loss, compared, worst, big);
    cr_expect_gt(compared, frozen ? 20 : 30, "%s: gradients compared", what);   /* a frozen layer has 15 fewer */
    cr_expect(worst <= tol, "%s: QKV as one GEMM differs from three by %.3g > %.3g", what, worst, tol);
    cr_expect(big <= 1e-3, "%s: key.bias gradient norms differ by %.3g", what, big);
    step_free(&a);
    step_free(&f);
    cpu_step_free_weights(&off.pl, w);
    batch_free(b);
    pipeline_free(&off);
    pipeline_free(&on);
}

static void expect_on_equals_off(SpecPrecision policy, CpuExecPrecision prec, CpuExecMode mode, double tol,
                                 const char *what)
{
    expect_on_equals_off_frozen(policy, prec, mode, tol, 0, what);
}

/* A frozen first layer (train.freeze_layers = 1): its Q, K, V are still
 * stacked and read in place, but have no gradient, so no UNSTACK; the
 * second layer's are split as before. */
Test(fuse_qkv, frozen_layer)
{
    ModelSpec s;
    qkv_spec(&s);
    s.train.freeze_layers = 1;
    Pipeline on;
    build(&s, PREC_FP16, true, ATTN_FORM_FUSED, &on);
    cr_assert_eq(on.qkv_sites, (int)s.stack.layers);
    cr_assert_eq(ir_count_op(&on.g, IR_OP_STACK, 0), 2 * (int)s.stack.layers);
    cr_assert_eq(ir_count_op(&on.g, IR_OP_UNSTACK, 0), 2, "only the trained layer's gradients are split");
    for (int p = 0; p < on.pl.n; p++)
        if (strstr(on.pl.p[p].name, "layer.0.attention.self."))
            cr_assert_lt(on.g.param_grad[p], 0, "%s has a gradient", on.pl.p[p].name);
    pipeline_free(&on);
    expect_on_equals_off_frozen(PREC_FP16, CPU_EXEC_F64, CPU_EXEC_REFERENCE, 1e-12, 1, "fp16/f64 layer 0 frozen");
    expect_on_equals_off_frozen(PREC_FP16, CPU_EXEC_F32, CPU_EXEC_REFERENCE, 1e-5, 1, "fp16/f32 layer 0 frozen");
}

Test(fuse_qkv, on_equals_off_fp32_f64) { expect_on_equals_off(PREC_FP32, CPU_EXEC_F64, CPU_EXEC_REFERENCE, 1e-12, "fp32/f64"); }
Test(fuse_qkv, on_equals_off_fp16_f64) { expect_on_equals_off(PREC_FP16, CPU_EXEC_F64, CPU_EXEC_REFERENCE, 1e-12, "fp16/f64"); }
Test(fuse_qkv, on_equals_off_bf16_f64) { expect_on_equals_off(PREC_BF16, CPU_EXEC_F64, CPU_EXEC_REFERENCE, 1e-12, "bf16/f64"); }
Test(fuse_qkv, on_equals_off_fp32_f32) { expect_on_equals_off(PREC_FP32, CPU_EXEC_F32, CPU_EXEC_REFERENCE, 1e-5, "fp32/f32"); }
Test(fuse_qkv, on_equals_off_fp32_f32_fast) { expect_on_equals_off(PREC_FP32, CPU_EXEC_F32, CPU_EXEC_FAST, 1e-5, "fp32/f32 fast"); }
Test(fuse_qkv, on_equals_off_fp16_f32) { expect_on_equals_off(PREC_FP16, CPU_EXEC_F32, CPU_EXEC_REFERENCE, 1e-5, "fp16/f32"); }
Test(fuse_qkv, on_equals_off_bf16_f32) { expect_on_equals_off(PREC_BF16, CPU_EXEC_F32, CPU_EXEC_REFERENCE, 1e-5, "bf16/f32"); }

/* The CUDA module of the rewritten fp16 graph: built (`hpc compile --arch
 * 90` also runs NVRTC on it), with q, k, v and dq, dk, dv as column blocks
 * of stride 3H and no stack/unstack kernels.  Not run here: no GPU
 * (tests/gpu/gpu_attention_step.c, gpu_param_pack.c run it). */
Test(fuse_qkv, cuda_module_takes_the_packed_form)
{
    ModelSpec s;
    qkv_spec(&s);
    Pipeline on;
    build(&s, PREC_FP16, true, ATTN_FORM_FUSED, &on);
    StepKernels k;
    HpcError err = {0};
    cr_assert_eq(step_program_kernels_build(&on.g, &k, &err), HPC_OK, "%s", err.msg);
    const char *src = k.cuda_source;
    cr_assert(src);
    cr_assert(strstr(src, "(const T *)a.x[0] + 128, (const T *)a.x[0] + 256, 384"), "forward q, k, v at stride 3H");
    cr_assert(strstr(src, "(T *)a.y + 128, (T *)a.y + 256"), "backward dk, dv beside dq");
    /* the stacks of parameters and the unstacked gradients are views
     * (program/plan.h): no copy kernel, no launch */
    cr_assert_null(strstr(src, "stack_"), "no stack or unstack copy kernel");
    for (int i = 0; i < on.g.n; i++)
        if (on.g.nodes[i].op == IR_OP_STACK || on.g.nodes[i].op == IR_OP_UNSTACK)
            cr_assert(k.node[i].kind == EOP_NONE && k.node[i].n_phases == 0, "%s launches", on.g.nodes[i].name);
    step_kernels_free(&k);
    pipeline_free(&on);
}

/* The plan of the rewritten fp16 graph: every STACK is a view of its first
 * parameter (the three are 16-bit copies, adjacent on the device), every
 * UNSTACK part a view k parts into the (3H, H) dW or (3H) bias gradient,
 * so the three gradients are that value; the base lives to the end (the
 * gradients are pinned), plan_check holds, and a view moved by one
 * alignment unit or a base that dies early fails it. */
Test(fuse_qkv, stacks_and_unstacks_are_views)
{
    ModelSpec s;
    qkv_spec(&s);
    Pipeline on, off;
    build(&s, PREC_FP16, true, ATTN_FORM_FUSED, &on);
    build(&s, PREC_FP16, false, ATTN_FORM_FUSED, &off);
    StepPlan p, q;
    HpcError err = {0};
    cr_assert_eq(plan_build(&on.g, 4, 16, &p, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build(&off.g, 4, 16, &q, &err), HPC_OK, "%s", err.msg);
    int stacks = 0, parts = 0;
    for (int i = 0; i < on.g.n; i++) {
        const IrNode *n = &on.g.nodes[i];
        if (n->op == IR_OP_STACK) {
            cr_assert_eq(p.v[i].kind, PLAN_VIEW, "%s", n->name);
            cr_assert_eq(p.v[i].storage, n->in[0]);
            cr_assert_eq(p.v[i].view_off, 0);
            for (int k = 0; k < 3; k++) {
                cr_assert_eq(on.g.nodes[n->in[k]].op, IR_OP_PARAM);
                cr_assert_eq(on.g.nodes[n->in[k]].dtype, DT_F16, "the stack reads the 16-bit copies");
            }
            stacks++;
        }
        int u = n->op == IR_OP_OUTPUT ? n->in[0] : i;
        if (on.g.nodes[u].op != IR_OP_UNSTACK) continue;
        int k = n->op == IR_OP_OUTPUT ? n->attr.output.index : 0;
        int x = on.g.nodes[u].in[0];
        int64_t part = ir_numel(n, 1, 1) * 4;
        cr_assert_eq(n->dtype, DT_F32);
        cr_assert_eq(p.v[i].kind, PLAN_VIEW, "%s", n->name);
        cr_assert_eq(p.v[i].storage, x);
        cr_assert_eq(p.v[i].view_off, k * part);
        cr_assert_eq(p.v[i].offset, p.v[x].offset + k * part);
        cr_assert_eq(p.v[x].kind, PLAN_ARENA);
        cr_assert_eq(p.v[x].last, p.n_order, "the stacked gradient lives to the end");
        parts++;
    }
    cr_assert_eq(stacks, 2 * (int)s.stack.layers);
    cr_assert_eq(parts, 6 * (int)s.stack.layers);
    int grads = 0;
    for (int g = 0; g < on.g.n_params; g++) {
        int v = on.g.param_grad[g];
        if (v >= 0 && strstr(on.pl.p[g].name, "attention.self.")) {
            cr_assert_eq(p.v[v].kind, PLAN_VIEW, "%s: the gradient is a view", on.pl.p[g].name);
            grads++;
        }
    }
    cr_assert_eq(grads, 6 * (int)s.stack.layers);
    char why[256] = "";
    cr_assert(plan_check(&p, &on.g, why, sizeof why), "%s", why);
    /* printed, not checked: at this size the one bias-gradient scratch of
     * the fused dW GEMM (partial column sums over 3H) decides the peak;
     * at BERT-base B32 L128 the arenas are equal (docs/fuse_qkv.md) */
    printf("fuse_qkv plan B=4 L=16: arena %lld bytes fused, %lld unfused\n", (long long)p.arena_bytes,
           (long long)q.arena_bytes);
    int view = -1;
    for (int i = 0; i < on.g.n && view < 0; i++)
        if (p.v[i].kind == PLAN_VIEW && p.v[i].offset >= 0 && p.v[i].view_off > 0) view = i;
    cr_assert_geq(view, 0);
    p.v[view].offset += PLAN_ALIGN;
    cr_assert_not(plan_check(&p, &on.g, why, sizeof why), "a moved view passes the check");
    p.v[view].offset -= PLAN_ALIGN;
    int base = p.v[view].storage, saved = p.v[base].last;
    p.v[base].last = p.v[view].def;
    cr_assert_not(plan_check(&p, &on.g, why, sizeof why), "a base that dies before its view passes");
    p.v[base].last = saved;
    cr_assert(plan_check(&p, &on.g, why, sizeof why), "%s", why);
    plan_free(&p);
    plan_free(&q);
    pipeline_free(&on);
    pipeline_free(&off);
}
