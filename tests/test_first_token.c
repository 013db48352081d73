/* tests/test_first_token.c — the last layer lowered for token 0
 * (compiler/lower.h, last_layer_first_only; ATTENTION first_query in
 * program/ir.h; runtime/cpu/cpu_exec_attention.inc).
 *
 * A sequence-classification head reads the last layer's output at token 0
 * only, so that layer computes its attention for query 0 over every key,
 * and its output dense, residual, LayerNorms and FFN for one row a batch
 * row.  Checked here:
 *   - the graph: the last layer's ATTENTION (forward and backward) is
 *     first_query with a (B, H) context, the earlier layers' are not, the
 *     layer's FFN values are (B, ...) and the head slices nothing;
 *   - when it applies: fused attention, a post-LN bidirectional encoder
 *     under a sequence-classification head, padded or packed; on by
 *     default in the pipeline, off with HPC_LAST_LAYER=all;
 *   - packed (docs/packing.md): the last layer's ATTENTION is varlen
 *     first_query, its residual each span's first slot (SPAN_TOKEN), and
 *     on the padded test batch's rows packed back to back the same function
 *     holds at the same tolerances;
 *   - the same function: with dropout off, a random bert_tiny-shaped model
 *     gives the full layer's loss and every parameter gradient (f64
 *     executor 1e-12; fp32 policy on the f32 executor 1e-5; fp16 policy
 *     2e-3: there the pooler's dW reads the last site's xhat through
 *     ln_dw_fix in one graph and its sliced 16-bit output in the other,
 *     measured 5e-4);
 *   - precision: the scatter of the f32 residual gradient back to (B, L, H)
 *     (SLICE_FIRST_BWD) stays f32 under fp16, and the dX GEMM of the
 *     layer's Q/K/V accumulates into it (LINEAR_DX_ACC);
 *   - memory: BERT-base fp16 at 32 x 128 plans an arena smaller by at least
 *     3/4 of the last layer's saved FFN input (B L ffn x 2 bytes). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_form.h"
#include "compiler/lower.h"
#include "compiler/plan_graph.h"
#include "compiler/spec_load.h"
#include "cpu_step.h"
#include "pipeline.h"
#include "program/plan.h"

enum { TV = 50, TC = 3, L_MAX = 32 };

static void tiny_spec(ModelSpec *s) { cpu_step_tiny_spec(s, "tiny_first", TV, L_MAX, TC); }

/* The pipeline with the fused attention node, HPC_LAST_LAYER=`last`. */
static void build(const ModelSpec *s, SpecPrecision policy, const char *last, Pipeline *p)
{
    setenv("HPC_LAST_LAYER", last, 1);
    PipeOptions o = pipeline_defaults(policy);
    o.attention = ATTN_FORM_FUSED;
    HpcError err = {0};
    cr_assert_eq(pipeline_build(s, &o, p, &err), HPC_OK, "%s", err.msg);
    unsetenv("HPC_LAST_LAYER");
}

/* tests/cpu_step.h's padded batch with this file's vocabulary and classes. */
static Batch *make_batch(int B, int L) { return cpu_step_padded_batch(B, L, TV, TC); }

static int count_first_query(const IrGraph *g, IrOpKind op)
{
    int n = 0;
    for (int i = 0; i < g->n; i++) n += g->nodes[i].op == op && g->nodes[i].attr.attn.first_query;
    return n;
}

static const IrNode *named(const IrGraph *g, const char *name)
{
    for (int i = 0; i < g->n; i++)
        if (strcmp(g->nodes[i].name, name) == 0) return &g->nodes[i];
    return NULL;
}

/* The two-layer model's ATTENTION nodes: layer 1's (the last) first_query
 * with a (B, H) context, layer 0's of every query; varlen where packed. */
static void expect_first_query_last(const IrGraph *g, bool varlen)
{
    cr_expect_eq(count_first_query(g, IR_OP_ATTENTION), 1);
    cr_expect_eq(count_first_query(g, IR_OP_ATTENTION_BWD), 1);
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = &g->nodes[i];
        if (n->op != IR_OP_ATTENTION) continue;
        bool last = strncmp(n->name, "layer.1.", 8) == 0;
        cr_expect_eq(n->attr.attn.varlen, varlen, "%s: varlen", n->name);
        cr_expect_eq(n->attr.attn.first_query, last, "%s", n->name);
        cr_expect_eq(n->rank, last ? 2 : 3, "%s: ctx rank %d", n->name, n->rank);
    }
}

Test(first_token, graph_of_the_last_layer)
{
    ModelSpec s;
    tiny_spec(&s);
    Pipeline p;
    build(&s, PREC_FP16, "first", &p);
    expect_first_query_last(&p.g, false);
    const IrNode *ffn0 = named(&p.g, "layer.0.ffn.in"), *ffn1 = named(&p.g, "layer.1.ffn.in");
    cr_assert(ffn0 && ffn1);
    cr_expect(ffn0->rank == 3 && ffn1->rank == 2 && ffn1->dims[0] == IR_DIM_B && ffn1->dims[1] == s.stack.ffn,
              "the FFN of layer 0 runs every token, of layer 1 one row a batch row");
    cr_expect(named(&p.g, "layer.1.first_token") != NULL, "the residual of token 0");
    cr_expect(named(&p.g, "head.first_token") == NULL, "the head slices nothing");
    pipeline_free(&p);

    build(&s, PREC_FP16, "all", &p);
    cr_expect_eq(count_first_query(&p.g, IR_OP_ATTENTION), 0, "HPC_LAST_LAYER=all");
    cr_expect(named(&p.g, "head.first_token") != NULL);
    pipeline_free(&p);
}

Test(first_token, where_it_applies)
{
    ModelSpec s;
    tiny_spec(&s);
    unsetenv("HPC_LAST_LAYER");
    cr_expect(last_layer_first_only(&s, true), "BERT-style sequence classification, fused attention");
    cr_expect_not(last_layer_first_only(&s, false), "the unfused chain has no query-0 form");
    ModelSpec t = s;
    t.train.pack = true;
    cr_expect(last_layer_first_only(&t, true), "packed: each span's first slot");
    t = s;
    t.stack.attention = ATTN_CAUSAL;
    cr_expect_not(last_layer_first_only(&t, true), "causal: the head reads the last token");
    t = s;
    t.stack.norm = NORM_PRE;
    cr_expect_not(last_layer_first_only(&t, true), "pre-LN");
    t = s;
    t.head.kind = HEAD_TOKEN_CLASSIFICATION;
    cr_expect_not(last_layer_first_only(&t, true), "a head that reads every token");
    t = s;
    t.head.kind = HEAD_MASKED_LM;
    cr_expect_not(last_layer_first_only(&t, true), "a head that reads every token");
    cr_expect(last_layer_first_requested(), "on by default");
    setenv("HPC_LAST_LAYER", "all", 1);
    cr_expect_not(last_layer_first_requested(), "HPC_LAST_LAYER=all");
    cr_expect_not(pipeline_defaults(PREC_FP16).first_token_last_layer, "HPC_LAST_LAYER=all: the pipeline's default");
    unsetenv("HPC_LAST_LAYER");
    cr_expect(pipeline_defaults(PREC_FP16).first_token_last_layer);
}

/* A packed program (docs/packing.md): the last layer's ATTENTION is
 * varlen first_query with a (B, H) context, its residual each span's first
 * slot (SPAN_TOKEN), and the head takes no token of its own. */
Test(first_token, graph_of_the_last_layer_packed)
{
    ModelSpec s;
    tiny_spec(&s);
    s.train.pack = true;
    Pipeline p;
    build(&s, PREC_FP16, "first", &p);
    expect_first_query_last(&p.g, true);
    const IrNode *tok = named(&p.g, "layer.1.first_token"), *ffn1 = named(&p.g, "layer.1.ffn.in");
    cr_assert(tok && ffn1);
    cr_expect_eq(tok->op, IR_OP_SPAN_TOKEN, "the residual of each span's first slot");
    cr_expect(ffn1->rank == 2 && ffn1->dims[0] == IR_DIM_B, "the last FFN runs one row a sequence");
    cr_expect(named(&p.g, "head.first_token") == NULL, "the head slices nothing");
    pipeline_free(&p);
}

static void same_function_batch(SpecPrecision policy, CpuExecPrecision prec, double tol, const char *tag, bool pack)
{
    ModelSpec s;
    tiny_spec(&s);
    s.train.pack = pack;
    Pipeline first, all;
    build(&s, policy, "first", &first);
    build(&s, policy, "all", &all);
    cr_assert_eq(first.pl.n, all.pl.n);
    cr_assert_eq(count_first_query(&first.g, IR_OP_ATTENTION), 1, "%s: the last layer for token 0", tag);
    double **w = cpu_step_random_weights(&first.pl, 11, 0.5);
    /* packed: the padded rows back to back (13, 10, 7 tokens in 10 x 3 slots) */
    Batch *b = pack ? cpu_step_packed_batch(3, 13, TV, TC) : make_batch(3, 13);
    StepOut a = cpu_step_run_dropout(&all.g, &all.pl, w, prec, CPU_EXEC_REFERENCE, 1.0, b, false);
    StepOut f = cpu_step_run_dropout(&first.g, &first.pl, w, prec, CPU_EXEC_REFERENCE, 1.0, b, false);
    const char *which;
    int compared;
    double e = cpu_step_worst_rel(&a, &f, &first.pl, &which, &compared);
    printf("first_token %s: loss %.9g vs %.9g, worst relative error %.3g (%s) over %d nonzero gradients\n", tag,
           f.loss, a.loss, e, which, compared);
    cr_expect(e <= tol, "%s: worst relative error %.3g (%s) > %.0e", tag, e, which, tol);
    cr_expect_eq(compared, first.pl.n, "%s: %d nonzero gradients compared of %d parameters", tag, compared,
                 first.pl.n);
    cr_expect(isfinite(f.loss) && f.loss > 0);
    step_free(&a);
    step_free(&f);
    batch_free(b);
    cpu_step_free_weights(&first.pl, w);
    pipeline_free(&first);
    pipeline_free(&all);
}

static void same_function(SpecPrecision policy, CpuExecPrecision prec, double tol, const char *tag)
{
    same_function_batch(policy, prec, tol, tag, false);
}

Test(first_token, same_function_f64) { same_function(PREC_FP32, CPU_EXEC_F64, 1e-12, "fp32/f64"); }
Test(first_token, same_function_f32) { same_function(PREC_FP32, CPU_EXEC_F32, 1e-5, "fp32/f32"); }
Test(first_token, same_function_fp16) { same_function(PREC_FP16, CPU_EXEC_F32, 2e-3, "fp16/f32"); }
Test(first_token, same_function_packed_f64) { same_function_batch(PREC_FP32, CPU_EXEC_F64, 1e-12, "packed fp32/f64", true); }
Test(first_token, same_function_packed_f32) { same_function_batch(PREC_FP32, CPU_EXEC_F32, 1e-5, "packed fp32/f32", true); }
Test(first_token, same_function_packed_fp16) { same_function_batch(PREC_FP16, CPU_EXEC_F32, 2e-3, "packed fp16/f32", true); }

Test(first_token, residual_gradient_stays_f32)
{
    ModelSpec s;
    tiny_spec(&s);
    Pipeline p;
    build(&s, PREC_FP16, "first", &p);
    int scatters = 0;
    for (int i = 0; i < p.g.n; i++) {
        const IrNode *n = &p.g.nodes[i];
        if (n->op != IR_OP_SLICE_FIRST_BWD) continue;
        scatters++;
        cr_expect_eq(n->dtype, DT_F32, "%s: the residual gradient rounded to %s", n->name, ir_dtype_name(n->dtype));
        bool accumulated = false;
        for (int j = i + 1; j < p.g.n; j++)
            accumulated |= p.g.nodes[j].op == IR_OP_LINEAR_DX_ACC && p.g.nodes[j].in[2] == i;
        cr_expect(accumulated, "%s: the Q/K/V dX GEMM accumulates into it", n->name);
    }
    cr_expect_eq(scatters, 1);
    pipeline_free(&p);
}

Test(first_token, bert_base_arena)
{
    ModelSpec s;
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/models/bert_base.model", root ? root : ".");
    cr_assert_eq(spec_load(path, &s, stderr), 0, "cannot load %s", path);
    Pipeline first, all;
    build(&s, PREC_FP16, "first", &first);
    build(&s, PREC_FP16, "all", &all);
    StepPlan pf, pa;
    HpcError err = {0};
    cr_assert_eq(plan_build(&first.g, 32, 128, &pf, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build(&all.g, 32, 128, &pa, &err), HPC_OK, "%s", err.msg);
    /* at least 3/4 of the last layer's FFN input (24 MiB): the arena's peak
     * moves to layer 10's FFN backward (measured 2026-12-02: 791.0 -> 766.8
     * MiB under the default HPC_LN_SAVE=xhat_dw, 929.0 -> 892.8 under xhat) */
    int64_t ffn_in = (int64_t)32 * 128 * s.stack.ffn * 2 * 3 / 4;
    printf("first_token bert_base fp16 32x128: arena %.1f MiB all tokens, %.1f MiB token 0 in the last layer\n",
           pa.arena_bytes / 1048576.0, pf.arena_bytes / 1048576.0);
    cr_expect_leq(pf.arena_bytes, pa.arena_bytes - ffn_in, "arena %lld -> %lld", (long long)pa.arena_bytes,
                  (long long)pf.arena_bytes);
    plan_free(&pf);
    plan_free(&pa);
    pipeline_free(&first);
    pipeline_free(&all);
}
