/* tests/test_attention_step.c — the fused ATTENTION node in the training
 * step (compiler/lower.c, ops.def, runtime/cpu/cpu_exec_attention.inc).
 *
 * Equality: a bert_tiny-shaped model (hidden 32, 2 heads of 16, 2 layers)
 * with random weights runs lowered with the fused node and with the
 * unfused chain on the cpu backend; the loss and every parameter gradient
 * must agree.  Dropout is off (eval-mode run, backward on): the two forms
 * draw their attention dropout from different salts, and the hidden
 * dropouts' salts (node ids) move too, so only a dropout-free step is the
 * same function.  Tolerances:
 *   f64 executor, fp32 policy   1e-12 (same operations, double rounding)
 *   f32 executor, fp32 policy   1e-5  (the fused reference makes the same
 *     kernel calls in the same order as the unfused chain, so the result
 *     is in fact bitwise equal; the tolerance is the brief's, and would
 *     absorb a summation-order change)
 *   f32 executor, fp16 policy   5e-3 on the loss and 2e-2 on gradients
 *     (measured: 1.1e-3 and 3.7e-3):
 *     the unfused chain stores scores, probabilities and their gradients
 *     in fp16 while the fused node keeps them in f32 (as the kernel keeps
 *     them on chip), so the two differ by fp16 rounding of those values;
 *     a key bias (true gradient 0) is measured against its layer's
 *     query-bias gradient
 * at L 8 with padding, an odd length 13 with a padded row, and causal.
 * Dropout bits: with dropout on, the fused node's ctx/lse and its backward
 * equal runtime/cpu/cpu_attention.h's f64 reference (the one the CUDA
 * kernels are checked against) for the node's own salt and step.
 * Memory: BERT-base fp16 at 32 x 128 plans a smaller arena fused than
 * unfused, by at least one (B, heads, L, L) fp16 tensor, and the fused
 * graph has no value of that shape.
 * CUDA: the fused fp16/bf16 modules compile with NVRTC for sm_80 / sm_90
 * with the attention wrappers in the cubin; the launch shapes follow B, L. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_form.h"
#include "cpu/cpu_attention.h"
#include "cpu/cpu_exec.h"
#include "cpu/philox.h"
#include "cpu_step.h"
#include "cuda/nvrtc_compile.h"
#include "data/batch.h"
#include "emit_attention.h"
#include "emit_ops.h"
#include "program/ir.h"
#include "program/params.h"
#include "pipeline.h"
#include "program/plan.h"
#include "compiler/plan_graph.h"
#include "program/spec.h"
#include "compiler/spec_load.h"

enum { TV = 50, TC = 3 };

static void tiny_spec(ModelSpec *s, bool causal)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "tiny_attn");
    s->stack.vocab_size = TV;
    s->stack.max_positions = 32;
    s->stack.hidden = 32;
    s->stack.heads = 2;
    s->stack.layers = 2;
    s->stack.ffn = 64;
    s->stack.ln_eps = 1e-5;
    s->stack.hidden_dropout = 0.1;
    s->stack.attention_dropout = 0.1;
    s->stack.attention = causal ? ATTN_CAUSAL : ATTN_BIDIRECTIONAL;
    s->head.num_labels = TC;
}

/* tests/cpu_step.h's padded batch with this file's vocabulary and classes. */
static Batch *make_batch(int B, int L) { return cpu_step_padded_batch(B, L, TV, TC); }

static double **random_weights(const ParamList *pl, double scale)
{
    double **w = calloc((size_t)pl->n, sizeof *w);
    uint64_t ctr = 0;
    for (int i = 0; i < pl->n; i++) {
        const ParamInfo *p = &pl->p[i];
        if (p->tied_to >= 0) continue;
        int64_t n = params_numel(p);
        bool gamma = strstr(p->name, "LayerNorm.weight") != NULL;
        w[i] = malloc((size_t)n * sizeof(double));
        for (int64_t k = 0; k < n; k++)
            w[i][k] = (gamma ? 1.0 : 0.0) + scale * (2.0 * philox_uniform(4321, ctr++, 0, 99) - 1.0);
    }
    for (int i = 0; i < pl->n; i++)
        if (pl->p[i].tied_to >= 0) w[i] = w[pl->p[i].tied_to];
    return w;
}

static void free_weights(const ParamList *pl, double **w)
{
    for (int i = 0; i < pl->n; i++)
        if (pl->p[i].tied_to < 0) free(w[i]);
    free(w);
}

/* An executor over g with the weights bound (f32 copies in an f32 run). */
typedef struct {
    CpuExec ex;
    float **wf;
    int n;
} Exec;

static void exec_open(Exec *e, const IrGraph *g, const ParamList *pl, double **w, CpuExecPrecision prec)
{
    cpu_exec_init(&e->ex, g, prec);
    e->n = pl->n;
    e->wf = calloc((size_t)pl->n, sizeof *e->wf);
    for (int p = 0; p < pl->n; p++) {
        if (pl->p[p].tied_to >= 0) continue;
        if (prec == CPU_EXEC_F64) {
            cpu_exec_bind_param(&e->ex, p, w[p]);
            continue;
        }
        int64_t n = params_numel(&pl->p[p]);
        e->wf[p] = malloc((size_t)n * sizeof(float));
        for (int64_t k = 0; k < n; k++) e->wf[p][k] = (float)w[p][k];
        cpu_exec_bind_param(&e->ex, p, e->wf[p]);
    }
}

static void exec_close(Exec *e)
{
    for (int p = 0; p < e->n; p++) free(e->wf[p]);
    free(e->wf);
    cpu_exec_free(&e->ex);
}

static void exec_run(Exec *e, const Batch *b, bool training)
{
    CpuRunOptions o = {.training = training, .backward = true, .seed = 99, .step = 5, .loss_scale = 1.0};
    HpcError err = {0};
    cr_assert_eq(cpu_exec_run(&e->ex, b, &o, &err), HPC_OK, "cpu_exec_run: %s", err.msg);
}

/* Value v of the executor as doubles (malloc'd). */
static double *value_f64(const Exec *e, int v, CpuExecPrecision prec)
{
    int64_t n = cpu_exec_numel(&e->ex, v);
    double *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
    const void *p = cpu_exec_value(&e->ex, v);
    for (int64_t k = 0; k < n; k++)
        out[k] = prec == CPU_EXEC_F64 ? ((const double *)p)[k] : ((const float *)p)[k];
    return out;
}

/* ||a - b|| / ||b||; NaN never passes (it makes the result NaN). */
static double rel_err(const double *a, const double *b, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t k = 0; k < n; k++) {
        num += (a[k] - b[k]) * (a[k] - b[k]);
        den += b[k] * b[k];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

/* ||a - r|| / ||gradient of the query bias||, the query bias being two
 * parameters before the key bias (query.weight, query.bias, key.weight, key.bias). */
static double key_bias_err(const double *a, const double *r, int64_t n, const Exec *e, const Pipeline *p,
                           int param, CpuExecPrecision prec)
{
    int qb = param - 2;
    HPC_ASSERT(strstr(p->pl.p[qb].name, "query.bias") != NULL && p->g.param_grad[qb] >= 0);
    double *q = value_f64(e, p->g.param_grad[qb], prec), num = 0, den = 0;
    for (int64_t k = 0; k < n; k++) {
        num += (a[k] - r[k]) * (a[k] - r[k]);
        den += q[k] * q[k];
    }
    free(q);
    return sqrt(num / den);
}

static void build(const ModelSpec *s, SpecPrecision policy, AttnForm form, Pipeline *p)
{
    PipeOptions o = pipeline_defaults(policy);
    o.attention = form;
    HpcError err = {0};
    cr_assert_eq(pipeline_build(s, &o, p, &err), HPC_OK, "pipeline_build: %s", err.msg);
}

/* Fused and unfused steps of spec s on batch (B, L): loss and every
 * parameter gradient within tol_loss / tol_grad. */
static void check_same_step(const ModelSpec *s, SpecPrecision policy, CpuExecPrecision prec, int B, int L,
                            double tol_loss, double tol_grad, const char *what)
{
    Pipeline un, fu;
    build(s, policy, ATTN_FORM_UNFUSED, &un);
    build(s, policy, ATTN_FORM_FUSED, &fu);
    cr_assert_eq(ir_count_op(&fu.g, IR_OP_ATTENTION, 0), 2, "%s: one ATTENTION per layer", what);
    cr_assert_eq(ir_count_op(&fu.g, IR_OP_ATTENTION_BWD, 0), 2, "%s: one ATTENTION_BWD per layer", what);
    cr_assert_eq(ir_count_op(&fu.g, IR_OP_SPLIT_HEADS, 0) + ir_count_op(&fu.g, IR_OP_MERGE_HEADS, 0), 0,
                 "%s: no head split/merge left", what);
    cr_assert_eq(ir_count_op(&un.g, IR_OP_ATTENTION, 0), 0);
    cr_assert_eq(un.pl.n, fu.pl.n, "the same parameters");
    Batch *b = make_batch(B, L);
    double **w = random_weights(&un.pl, 0.5);
    Exec eu, ef;
    exec_open(&eu, &un.g, &un.pl, w, prec);
    exec_open(&ef, &fu.g, &fu.pl, w, prec);
    exec_run(&eu, b, false);
    exec_run(&ef, b, false);
    double lu = cpu_exec_loss(&eu.ex), lf = cpu_exec_loss(&ef.ex);
    double lerr = fabs(lf - lu) / fabs(lu);
    cr_expect(isfinite(lf) && lu > 0 && lerr <= tol_loss, "%s: loss %.17g fused vs %.17g unfused (rel %.3g)",
              what, lf, lu, lerr);
    double worst = 0;
    int compared = 0;
    for (int p = 0; p < un.pl.n; p++) {
        int gu = un.g.param_grad[p], gf = fu.g.param_grad[p];
        cr_expect_eq(gu < 0, gf < 0, "%s: %s has a gradient on one side only", what, un.pl.p[p].name);
        if (gu < 0 || gf < 0) continue;
        int64_t n = params_numel(&un.pl.p[p]);
        double *a = value_f64(&ef, gf, prec), *r = value_f64(&eu, gu, prec);
        double e = rel_err(a, r, n), norm = 0;
        for (int64_t k = 0; k < n; k++) norm += r[k] * r[k];
        /* A key bias's true gradient is 0 (softmax shift invariance): what is
         * there is rounding noise, so it is held against the size of the
         * same layer's query-bias gradient instead of its own. */
        if (strstr(un.pl.p[p].name, "key.bias") && p >= 2) e = key_bias_err(a, r, n, &eu, &un, p, prec);
        cr_expect(e <= tol_grad, "%s: gradient of %s: relative %.3g > %.3g", what, un.pl.p[p].name, e, tol_grad);
        if (!strstr(un.pl.p[p].name, "key.bias")) /* softmax shift invariance: exactly 0 */
            cr_expect(norm > 0, "%s: gradient of %s is all zero", what, un.pl.p[p].name);
        if (e > worst) worst = e;
        compared++;
        free(a);
        free(r);
    }
    cr_expect_gt(compared, 30, "%s: gradients compared", what);
    cr_log_info("%s: loss rel %.3g, worst gradient rel %.3g over %d tensors", what, lerr, worst, compared);
    fprintf(stderr, "[attention_step] %s: loss rel %.3g, worst gradient rel %.3g over %d tensors\n", what,
            lerr, worst, compared);
    exec_close(&eu);
    exec_close(&ef);
    free_weights(&un.pl, w);
    batch_free(b);
    pipeline_free(&un);
    pipeline_free(&fu);
}

Test(attention_step, fused_equals_unfused_fp32_f32)
{
    ModelSpec s;
    tiny_spec(&s, false);
    check_same_step(&s, PREC_FP32, CPU_EXEC_F32, 2, 8, 1e-5, 1e-5, "fp32/f32 L8");
}

Test(attention_step, fused_equals_unfused_fp32_f64)
{
    ModelSpec s;
    tiny_spec(&s, false);
    check_same_step(&s, PREC_FP32, CPU_EXEC_F64, 2, 8, 1e-12, 1e-12, "fp32/f64 L8");
}

Test(attention_step, fused_equals_unfused_odd_length_padded)
{
    ModelSpec s;
    tiny_spec(&s, false);
    check_same_step(&s, PREC_FP32, CPU_EXEC_F32, 3, 13, 1e-5, 1e-5, "fp32/f32 L13");
}

Test(attention_step, fused_equals_unfused_causal)
{
    ModelSpec s;
    tiny_spec(&s, true);
    check_same_step(&s, PREC_FP32, CPU_EXEC_F32, 2, 11, 1e-5, 1e-5, "fp32/f32 causal L11");
}

Test(attention_step, fused_close_to_unfused_fp16)
{
    ModelSpec s;
    tiny_spec(&s, false);
    check_same_step(&s, PREC_FP16, CPU_EXEC_F32, 2, 13, 5e-3, 2e-2, "fp16/f32 L13");
}

/* With dropout on, the node's outputs are cpu_attention.h's f64 reference
 * (the CUDA kernels' oracle) for the node's salt and the run's step. */
Test(attention_step, dropout_bits_match_the_kernels_reference)
{
    ModelSpec s;
    tiny_spec(&s, false);
    s.stack.attention_dropout = 0.3;
    Pipeline fu;
    build(&s, PREC_FP32, ATTN_FORM_FUSED, &fu);
    int B = 2, L = 13;
    Batch *b = make_batch(B, L);
    double **w = random_weights(&fu.pl, 0.5);
    Exec e;
    exec_open(&e, &fu.g, &fu.pl, w, CPU_EXEC_F64);
    exec_run(&e, b, true);
    int checked = 0;
    for (int id = 0; id < fu.g.n; id++) {
        const IrNode *n = &fu.g.nodes[id];
        if (n->op != IR_OP_ATTENTION && n->op != IR_OP_ATTENTION_BWD) continue;
        int q0 = n->op == IR_OP_ATTENTION ? 0 : 1;
        CkAttnShape sh = {B, L, n->attr.attn.heads, 32 / n->attr.attn.heads, n->attr.attn.causal,
                          n->attr.attn.p, 99, 5, (uint32_t)n->attr.attn.salt};
        cr_assert_gt(sh.p, 0.29f);
        double *q = value_f64(&e, n->in[q0], CPU_EXEC_F64), *k = value_f64(&e, n->in[q0 + 1], CPU_EXEC_F64);
        double *v = value_f64(&e, n->in[q0 + 2], CPU_EXEC_F64);
        const int32_t *mask = b->attention_mask;
        int64_t nv = (int64_t)B * L * 32, nl = (int64_t)B * sh.NH * L;
        /* the last layer is lowered for token 0 (compiler/lower.h): its
         * node is query 0 of the full reference */
        bool first = n->attr.attn.first_query;
        cr_expect_eq(first, strncmp(n->name, "layer.1.", 8) == 0 || strncmp(n->name, "d.layer.1.", 10) == 0,
                     "%s: first_query exactly in the last layer", n->name);
        if (n->op == IR_OP_ATTENTION) {
            double *ctx = calloc((size_t)nv, sizeof *ctx), *lse = calloc((size_t)nl, sizeof *lse);
            ck_attention_fwd_f64(ctx, lse, q, k, v, 32, mask, &sh);
            if (first) {   /* keep query 0's rows, packed as the node stores them */
                for (int r = 0; r < B; r++) memmove(ctx + r * 32, ctx + (int64_t)r * L * 32, 32 * sizeof *ctx);
                for (int64_t r = 0; r < B * sh.NH; r++) lse[r] = lse[r * L];
                nv = (int64_t)B * 32;
                nl = (int64_t)B * sh.NH;
            }
            double *got = value_f64(&e, id, CPU_EXEC_F64), *gl = value_f64(&e, ir_output(&fu.g, id, 1), CPU_EXEC_F64);
            cr_expect_lt(rel_err(got, ctx, nv), 1e-12, "ctx of %s", n->name);
            double lerr = 0;
            for (int64_t r = 0; r < nl; r++) {
                cr_expect(isfinite(lse[r]), "no fully masked row here");
                lerr = fmax(lerr, fabs(gl[r] - lse[r]) / fmax(1.0, fabs(lse[r])));
            }
            cr_expect_lt(lerr, 1e-6, "lse of %s (stored f32): %.3g", n->name, lerr);   /* f32 storage */
            free(ctx);
            free(lse);
            free(got);
            free(gl);
        } else {
            double *dctx = value_f64(&e, n->in[0], CPU_EXEC_F64);
            if (first) {   /* query 0's dctx; the other queries' are zero */
                double *full = calloc((size_t)nv, sizeof *full);
                for (int r = 0; r < B; r++) memcpy(full + (int64_t)r * L * 32, dctx + r * 32, 32 * sizeof *full);
                free(dctx);
                dctx = full;
            }
            double *g[3];
            for (int j = 0; j < 3; j++) g[j] = calloc((size_t)nv, sizeof(double));
            ck_attention_bwd_f64(g[0], g[1], g[2], 32, dctx, q, k, v, 32, mask, &sh);
            for (int j = 0; j < 3; j++) {
                double *got = value_f64(&e, ir_output(&fu.g, id, j), CPU_EXEC_F64);
                cr_expect_lt(rel_err(got, g[j], nv), 1e-10, "d%c of %s", "qkv"[j], n->name);
                free(got);
                free(g[j]);
            }
            free(dctx);
        }
        free(q);
        free(k);
        free(v);
        checked++;
    }
    cr_expect_eq(checked, 4, "two layers: two forward and two backward nodes");
    exec_close(&e);
    free_weights(&fu.pl, w);
    batch_free(b);
    pipeline_free(&fu);
}

/* No (B, heads, L, L) value, and a smaller arena by at least one of them. */
Test(attention_step, bert_base_plan_has_no_score_tensor)
{
    ModelSpec s;
    cpu_step_load_model("bert_base.model", &s);
    Pipeline un, fu;
    build(&s, PREC_FP16, ATTN_FORM_UNFUSED, &un);
    build(&s, PREC_FP16, ATTN_FORM_AUTO, &fu);   /* fp16, head size 64: auto is fused */
    cr_assert_eq(ir_count_op(&fu.g, IR_OP_ATTENTION, 0), 12);
    for (int i = 0; i < fu.g.n; i++) {
        const IrNode *v = &fu.g.nodes[i];
        bool scores = v->rank == 4 && v->dims[2] == IR_DIM_L && v->dims[3] == IR_DIM_L;
        cr_expect(!scores, "value %d (%s) is a (B, heads, L, L) tensor", i, v->name);
    }
    int64_t B = 32, L = 128;
    StepPlan pu, pf;
    HpcError err = {0};
    cr_assert_eq(plan_build(&un.g, B, L, &pu, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build(&fu.g, B, L, &pf, &err), HPC_OK, "%s", err.msg);
    char why[256];
    cr_expect(plan_check(&pf, &fu.g, why, sizeof why), "fused plan: %s", why);
    int64_t score = B * 12 * L * L * 2;   /* one fp16 (B, heads, L, L) tensor */
    fprintf(stderr, "[attention_step] BERT-base fp16 32x128 arena: unfused %.1f MiB, fused %.1f MiB\n",
            pu.arena_bytes / 1048576.0, pf.arena_bytes / 1048576.0);
    cr_expect_lt(pf.arena_bytes, pu.arena_bytes - score, "arena fused %lld vs unfused %lld",
                 (long long)pf.arena_bytes, (long long)pu.arena_bytes);
    plan_free(&pu);
    plan_free(&pf);
    pipeline_free(&un);
    pipeline_free(&fu);
}

Test(attention_step, auto_form_follows_policy_and_head_size)
{
    ModelSpec s;
    bool fused;
    HpcError err = {0};
    unsetenv("HPC_ATTENTION");
    tiny_spec(&s, false);   /* head size 16 */
    cr_assert_eq(attention_form_choose(&s, PREC_FP16, ATTN_FORM_AUTO, &fused, &err), HPC_OK);
    cr_expect(fused);
    cr_assert_eq(attention_form_choose(&s, PREC_FP32, ATTN_FORM_AUTO, &fused, &err), HPC_OK);
    cr_expect(!fused, "fp32 keeps the unfused chain");
    s.stack.precision = PREC_FP32;   /* stack pinned to fp32 */
    cr_assert_eq(attention_form_choose(&s, PREC_BF16, ATTN_FORM_AUTO, &fused, &err), HPC_OK);
    cr_expect(!fused);
    s.stack.precision = PREC_DEFAULT;
    s.stack.hidden = 24;             /* head size 12: no tensor-core kernel */
    cr_assert_eq(attention_form_choose(&s, PREC_FP16, ATTN_FORM_AUTO, &fused, &err), HPC_OK);
    cr_expect(!fused);
    cr_assert_eq(attention_form_choose(&s, PREC_FP16, ATTN_FORM_FUSED, &fused, &err), HPC_OK);
    cr_expect(fused, "forced");
    setenv("HPC_ATTENTION", "unfused", 1);
    s.stack.hidden = 32;
    cr_assert_eq(attention_form_choose(&s, PREC_FP16, ATTN_FORM_AUTO, &fused, &err), HPC_OK);
    cr_expect(!fused, "HPC_ATTENTION=unfused overrides auto");
    cr_assert_eq(attention_form_choose(&s, PREC_FP16, ATTN_FORM_FUSED, &fused, &err), HPC_OK);
    cr_expect(fused, "an explicit request wins over the variable");
    setenv("HPC_ATTENTION", "flash", 1);
    cr_expect_eq(attention_form_choose(&s, PREC_FP16, ATTN_FORM_AUTO, &fused, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "HPC_ATTENTION=flash") && strstr(err.msg, "auto, fused or unfused"), "%s", err.msg);
    unsetenv("HPC_ATTENTION");
}

/* ---- CUDA: the step module with the fused node compiles --------------- */

/* variant: HPC_ATTN_KERNELS for the emitter ("v1", "v2", "v3", "v4" or
 * NULL, unset: v4; v3 is v2 with the one-pass backward phase, which
 * computes delta alone for long rows, in place of v2's dot phase; v4, the
 * default, is v3 with that phase's whole-dS kernel, which asks for dynamic
 * shared memory and runs only up to L 128, and a delta phase of its own
 * above).  v2's forward asks for four blocks an SM (head size 16 here). */
static void expect_module_compiles_as(const ModelSpec *s, SpecPrecision policy, int arch, const char *variant)
{
    if (variant) setenv("HPC_ATTN_KERNELS", variant, 1);
    else unsetenv("HPC_ATTN_KERNELS");
    if (!variant) variant = "v4";
    bool v4 = strcmp(variant, "v4") == 0;
    bool v3 = v4 || strcmp(variant, "v3") == 0, v2 = v3 || strcmp(variant, "v2") == 0;
    long long head_dim = s->stack.hidden / s->stack.heads;
    unsigned shared = v4 ? (unsigned)kemit_attn4_smem_bytes(head_dim) : 0u;
    Pipeline p;
    build(s, policy, ATTN_FORM_FUSED, &p);
    HpcError err = {0};
    char *src;
    cr_assert_eq(eop_module_source(&p.g, &src, &err), HPC_OK, "%s", err.msg);
    /* the module calls the chosen family's bodies, and only those */
    static const char *const calls[2][3] = {
        {"hpc_attn::attn_mma_fwd_run(", "hpc_attn::attn_mma_bwd_dq_run(", "hpc_attn::attn_mma_bwd_dkv_run("},
        {"hpc_attn::attn_mma2_fwd_run(", "hpc_attn::attn_mma2_bwd_dq_run(", "hpc_attn::attn_mma2_bwd_dkv_run("}};
    for (int k = 0; k < 3; k++) {
        cr_expect(strstr(src, calls[v2][k]) != NULL, "%s: no call %s", variant, calls[v2][k]);
        cr_expect(strstr(src, calls[!v2][k]) == NULL, "%s: calls %s", variant, calls[!v2][k]);
    }
    cr_expect((strstr(src, "hpc_attn::attn_mma3_bwd_run(") != NULL) == (v3 && !v4), "%s: one-pass backward %s",
              variant, v3 && !v4 ? "missing" : "called");
    cr_expect((strstr(src, "hpc_attn::attn_mma4_bwd_run(") != NULL) == v4, "%s: whole-dS backward %s", variant,
              v4 ? "missing" : "called");
    cr_expect(!v2 || strstr(src, "__launch_bounds__(128, 4) attn2_fwd_") != NULL,
              "%s: the forward's launch bounds are not (128, 4)", variant);
    void *cubin;
    size_t size;
    char *log = NULL;
    HpcStatus st = nvrtc_compile(src, "hpc_attention_step_test", arch, NULL, 0, &cubin, &size, &log, &err);
    cr_assert_eq(st, HPC_OK, "%s sm_%d: %s\n%s", spec_precision_name(policy), arch, err.msg, log ? log : "");
    int nodes = 0;
    for (int id = 0; id < p.g.n; id++) {
        IrOpKind op = p.g.nodes[id].op;
        if (op != IR_OP_ATTENTION && op != IR_OP_ATTENTION_BWD) continue;
        EopNodeCode c;
        cr_assert_eq(eop_node_code(&p.g, id, 3, 70, &c, &err), HPC_OK, "%s", err.msg);
        cr_expect_eq(c.kind, EOP_KERNELS);
        nodes++;
        if (p.g.nodes[id].attr.attn.first_query) {   /* the last layer: one block a (b, head), no scratch */
            const char *name = c.phase[0].name;
            cr_expect_eq(c.n_phases, 1);
            cr_expect(strstr(name, op == IR_OP_ATTENTION ? "attn_first_fwd" : "attn_first_bwd") != NULL, "%s", name);
            cr_expect(memmem(cubin, size, name, strlen(name)) != NULL, "%s not in the cubin", name);
            cr_expect(c.phase[0].grid[0] == 1 && c.phase[0].grid[1] == 2 && c.phase[0].grid[2] == 3 &&
                      c.phase[0].block[0] == 128, "%s grid (%u, %u, %u) x %u", name, c.phase[0].grid[0],
                      c.phase[0].grid[1], c.phase[0].grid[2], c.phase[0].block[0]);
            cr_expect_eq(eop_scratch_bytes(&p.g, id, 3, 70), 0);
            continue;
        }
        cr_expect_eq(c.n_phases, op == IR_OP_ATTENTION ? 1 : v4 ? 4 : 3);
        EopNodeCode longer;
        cr_assert_eq(eop_node_code(&p.g, id, 3, 200, &longer, &err), HPC_OK, "%s", err.msg);
        for (int k = 0; k < c.n_phases; k++) {
            const char *name = c.phase[k].name;
            cr_expect(memmem(cubin, size, name, strlen(name)) != NULL, "%s not in the cubin", name);
            if (strstr(name, "dot")) {   /* one warp per (b, t, head): 3 * 70 * 2 / 4 blocks */
                cr_expect_eq(c.phase[k].grid[0], 105u);
                continue;
            }
            bool whole = strstr(name, "attn4_bwd") != NULL, delta = strstr(name, "attn_bwd_delta") != NULL;
            if (strstr(name, "attn3_bwd") || whole || delta) {   /* one block of 256 per (b, head) */
                /* v4's phases split by L: the one-pass up to 128, delta above */
                const EopNodeCode *at = delta ? &longer : &c, *not_at = whole ? &longer : delta ? &c : NULL;
                cr_expect(at->phase[k].grid[0] == 1 && at->phase[k].grid[1] == 2 && at->phase[k].grid[2] == 3 &&
                          at->phase[k].block[0] == 256, "%s grid (%u, %u, %u) x %u", name, at->phase[k].grid[0],
                          at->phase[k].grid[1], at->phase[k].grid[2], at->phase[k].block[0]);
                if (not_at) cr_expect_eq(not_at->phase[k].grid[0], 0u, "%s launched at L %d", name, whole ? 200 : 70);
                cr_expect_eq(c.phase[k].shared_bytes, delta ? 0u : shared, "%s: %u bytes of dynamic shared memory",
                             name, c.phase[k].shared_bytes);
                continue;
            }
            cr_expect_eq(c.phase[k].shared_bytes, 0u, "%s", name);
            /* ceil(L / 64) tiles, 2 heads, 3 rows; after the one-pass
             * phase only where L > 128 (not launched at 70: grid 0) */
            bool one_pass = strstr(c.phase[0].name, "attn3_bwd") != NULL ||
                            strstr(c.phase[0].name, "attn4_bwd") != NULL;
            unsigned want = one_pass ? 0 : 2, g0 = c.phase[k].grid[0];
            cr_expect(g0 == want && (!want || (c.phase[k].grid[1] == 2 && c.phase[k].grid[2] == 3 &&
                                               c.phase[k].block[0] == 128)),
                      "%s at L 70: grid (%u, %u, %u) x %u", name, g0, c.phase[k].grid[1], c.phase[k].grid[2],
                      c.phase[k].block[0]);
            cr_expect(longer.phase[k].grid[0] == 4 && longer.phase[k].grid[1] == 2 && longer.phase[k].grid[2] == 3 &&
                          longer.phase[k].block[0] == 128,
                      "%s at L 200: grid (%u, %u, %u) x %u", name, longer.phase[k].grid[0], longer.phase[k].grid[1],
                      longer.phase[k].grid[2], longer.phase[k].block[0]);
        }
        if (op == IR_OP_ATTENTION_BWD)   /* delta: B * heads * L floats */
            cr_expect_eq(eop_scratch_bytes(&p.g, id, 3, 70), 3 * 2 * 70 * 4);
    }
    cr_expect_eq(nodes, 4);
    free(cubin);
    free(log);
    free(src);
    pipeline_free(&p);
    unsetenv("HPC_ATTN_KERNELS");
}

static void expect_module_compiles(const ModelSpec *s, SpecPrecision policy, int arch)
{
    expect_module_compiles_as(s, policy, arch, "v1");
}

Test(attention_step_cuda, tiny_fp16_sm90, .timeout = 300)
{
    ModelSpec s;
    tiny_spec(&s, false);
    expect_module_compiles(&s, PREC_FP16, 90);
}

Test(attention_step_cuda, tiny_bf16_causal_sm80, .timeout = 300)
{
    ModelSpec s;
    tiny_spec(&s, true);
    expect_module_compiles(&s, PREC_BF16, 80);
}

/* Dropout 0 everywhere (an eval-style or dropout-free model): every
 * probability is still a valid float literal in the module (a bare "0f" is
 * a C++ user-defined literal NVRTC rejects; found on the H200). */
Test(attention_step_cuda, no_dropout_fp16_sm90, .timeout = 300)
{
    ModelSpec s;
    tiny_spec(&s, false);
    s.stack.hidden_dropout = 0;
    s.stack.attention_dropout = 0;
    expect_module_compiles(&s, PREC_FP16, 90);
}

/* HPC_ATTN_KERNELS=v2: the second tensor-core family (ldmatrix, cp.async)
 * in the step module, both dtypes, both architectures, causal too. */
Test(attention_step_cuda, v2_tiny_fp16_sm90, .timeout = 300)
{
    ModelSpec s;
    tiny_spec(&s, false);
    expect_module_compiles_as(&s, PREC_FP16, 90, "v2");
}

Test(attention_step_cuda, v2_tiny_bf16_causal_sm80, .timeout = 300)
{
    ModelSpec s;
    tiny_spec(&s, true);
    expect_module_compiles_as(&s, PREC_BF16, 80, "v2");
}

/* v3: the one-pass backward in the step module. */
Test(attention_step_cuda, v3_tiny_fp16_sm90, .timeout = 300)
{
    ModelSpec s;
    tiny_spec(&s, false);
    expect_module_compiles_as(&s, PREC_FP16, 90, "v3");
}

Test(attention_step_cuda, v3_tiny_bf16_causal_sm80, .timeout = 300)
{
    ModelSpec s;
    tiny_spec(&s, true);
    expect_module_compiles_as(&s, PREC_BF16, 80, "v3");
}

/* v4, the default (HPC_ATTN_KERNELS unset): the whole-dS one-pass
 * backward, with its dynamic shared memory. */
Test(attention_step_cuda, v4_default_tiny_fp16_sm90, .timeout = 300)
{
    ModelSpec s;
    tiny_spec(&s, false);
    expect_module_compiles_as(&s, PREC_FP16, 90, NULL);
}

Test(attention_step_cuda, v4_tiny_bf16_causal_sm80, .timeout = 300)
{
    ModelSpec s;
    tiny_spec(&s, true);
    expect_module_compiles_as(&s, PREC_BF16, 80, "v4");
}

/* env=value is refused by the emitter, naming the setting and the values
 * it takes (choices). */
static void expect_variant_refused(const char *env, const char *value, const char *choices)
{
    ModelSpec s;
    tiny_spec(&s, false);
    Pipeline p;
    build(&s, PREC_FP16, ATTN_FORM_FUSED, &p);
    setenv(env, value, 1);
    HpcError err = {0};
    char *src = NULL;
    cr_expect_eq(eop_module_source(&p.g, &src, &err), HPC_ERR_INPUT);
    char named[64];
    snprintf(named, sizeof named, "%s=%s", env, value);
    cr_expect(strstr(err.msg, named) != NULL && strstr(err.msg, choices) != NULL, "%s", err.msg);
    unsetenv(env);
    free(src);
    pipeline_free(&p);
}

Test(attention_step_cuda, unknown_kernel_variant_is_refused)
{
    expect_variant_refused("HPC_ATTN_KERNELS", "v9", "v1, v2, v3, v4 or v5");
}

/* The fp32 step keeps the unfused chain; forcing the node there is refused
 * by the emitter with the way out. */
Test(attention_step_cuda, f32_fused_is_refused_with_the_way_out)
{
    ModelSpec s;
    tiny_spec(&s, false);
    Pipeline p;
    build(&s, PREC_FP32, ATTN_FORM_FUSED, &p);
    HpcError err = {0};
    char *src = NULL;
    cr_expect_eq(eop_module_source(&p.g, &src, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "HPC_ATTENTION=unfused") != NULL, "%s", err.msg);
    free(src);
    pipeline_free(&p);
}
