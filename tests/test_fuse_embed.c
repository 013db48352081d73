/* tests/test_fuse_embed.c — BERT's embedding layer fused (compiler/
 * fuse_embed.c; EMBED_LN and EMBED_LN_BWD in program/ops.def; the cpu
 * references in runtime/cpu/cpu_exec_ops.inc).
 *
 * Checked here:
 *   - the graph: under fp16 and bf16 one EMBED_LN and one EMBED_LN_BWD
 *     replace the three lookups, their sum, the LayerNorm, the dropout, the
 *     cast and every backward node of them; the tables' gradients, dgamma
 *     and dbeta are the backward's outputs; the fp32 policy and
 *     HPC_FUSE_EMB=0 keep the unfused layer;
 *   - the same function: a random bert_tiny-shaped model gives the unfused
 *     layer's loss and every parameter gradient, with the dropout on (the
 *     same masks) and off.  The one difference is the LayerNorm backward's
 *     xhat, read from f16 instead of recomputed from s in double, as the
 *     LayerNorm sites' HPC_LN_SAVE=xhat (tests/test_ln_xhat.c);
 *   - memory: BERT-base fp16 at 32 x 128 no longer keeps the f32 sum
 *     (12 MiB) for the backward, only xhat (6 MiB) and rstd. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attention_form.h"
#include "compiler/plan_graph.h"
#include "compiler/spec_load.h"
#include "cpu_step.h"
#include "pipeline.h"
#include "program/plan.h"

enum { TV = 50, TC = 3, L_MAX = 32 };

static void tiny_spec(ModelSpec *s) { cpu_step_tiny_spec(s, "tiny_embed", TV, L_MAX, TC); }

/* The pipeline with HPC_FUSE_EMB=`fuse` ("1" or "0"). */
static void build(const ModelSpec *s, SpecPrecision policy, const char *fuse, Pipeline *p)
{
    setenv("HPC_FUSE_EMB", fuse, 1);
    PipeOptions o = pipeline_defaults(policy);
    HpcError err = {0};
    cr_assert_eq(pipeline_build(s, &o, p, &err), HPC_OK, "%s", err.msg);
    unsetenv("HPC_FUSE_EMB");
}

static int count_op(const IrGraph *g, IrOpKind op) { return ir_count_op(g, op, 0); }

static const char *param_name(const Pipeline *p, int v)
{
    for (int q = 0; q < p->pl.n; q++)
        if (p->g.param_grad[q] == v) return p->pl.p[q].name;
    return NULL;
}

static void expect_fused(SpecPrecision policy, const char *tag)
{
    ModelSpec s;
    tiny_spec(&s);
    Pipeline p;
    build(&s, policy, "1", &p);
    cr_expect_eq(count_op(&p.g, IR_OP_EMBED_LN), 1, "%s", tag);
    cr_expect_eq(count_op(&p.g, IR_OP_EMBED_LN_BWD), 1, "%s", tag);
    cr_expect_eq(count_op(&p.g, IR_OP_EMBEDDING), 0, "%s: a lookup left", tag);
    cr_expect_eq(count_op(&p.g, IR_OP_EMBEDDING_BWD), 0, "%s: a lookup gradient left", tag);
    cr_expect_eq(p.fuse.embed_ln, 1, "%s", tag);
    for (int i = 0; i < p.g.n; i++) {
        const IrNode *n = &p.g.nodes[i];
        if (n->op == IR_OP_EMBED_LN) {
            cr_expect_eq(n->n_in, 8, "%s: word, position and token-type tables", tag);
            cr_expect(n->attr.embed_ln.p > 0.0f, "%s: the dropout folded", tag);
            int low = ir_output(&p.g, i, 3), xhat = ir_output(&p.g, i, 1);
            cr_expect(low >= 0 && p.g.nodes[low].dtype == (policy == PREC_BF16 ? DT_BF16 : DT_F16), "%s", tag);
            cr_expect(xhat >= 0 && p.g.nodes[xhat].dtype == DT_F16, "%s: xhat in f16", tag);
        }
        if (n->op == IR_OP_EMBED_LN_BWD) {
            static const char *const want[5] = {"bert.embeddings.word_embeddings.weight",
                                                "bert.embeddings.position_embeddings.weight",
                                                "bert.embeddings.token_type_embeddings.weight",
                                                "bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias"};
            for (int k = 0; k < 5; k++) {
                int o = ir_output(&p.g, i, k);
                const char *got = o >= 0 ? param_name(&p, o) : NULL;
                cr_expect(got && strcmp(got, want[k]) == 0, "%s: output %d is the gradient of %s (%s)", tag, k,
                          want[k], got ? got : "none");
            }
        }
    }
    pipeline_free(&p);
}

Test(fuse_embed, graph_fp16) { expect_fused(PREC_FP16, "fp16"); }
Test(fuse_embed, graph_bf16) { expect_fused(PREC_BF16, "bf16"); }

Test(fuse_embed, unfused_where_it_does_not_apply)
{
    ModelSpec s;
    tiny_spec(&s);
    Pipeline p;
    build(&s, PREC_FP32, "1", &p);
    cr_expect_eq(count_op(&p.g, IR_OP_EMBED_LN), 0, "fp32 keeps the unfused layer");
    cr_expect_eq(count_op(&p.g, IR_OP_EMBEDDING), 3);
    pipeline_free(&p);
    build(&s, PREC_FP16, "0", &p);
    cr_expect_eq(count_op(&p.g, IR_OP_EMBED_LN), 0, "HPC_FUSE_EMB=0");
    cr_expect_eq(count_op(&p.g, IR_OP_EMBEDDING_BWD), 3);
    pipeline_free(&p);
    setenv("HPC_LN_SAVE", "s", 1);   /* every LayerNorm keeps its f32 input, this one too */
    build(&s, PREC_FP16, "1", &p);
    unsetenv("HPC_LN_SAVE");
    cr_expect_eq(count_op(&p.g, IR_OP_EMBED_LN), 0, "HPC_LN_SAVE=s");
    pipeline_free(&p);
}

/* dropout: the step in training mode (the masks drawn); hidden_dropout 0
 * lowers no DROPOUT node at all, so the fused node is the LayerNorm's y. */
static void same_function(SpecPrecision policy, bool dropout, double hidden_dropout, double tol, const char *tag)
{
    ModelSpec s;
    tiny_spec(&s);
    s.stack.hidden_dropout = hidden_dropout;
    Pipeline fused, plain;
    build(&s, policy, "1", &fused);
    build(&s, policy, "0", &plain);
    cr_assert_eq(fused.pl.n, plain.pl.n);
    cr_assert_eq(count_op(&fused.g, IR_OP_EMBED_LN), 1);
    double **w = cpu_step_random_weights(&fused.pl, 5, 0.5);
    Batch *b = cpu_step_padded_batch(3, 13, TV, TC);
    StepOut a = cpu_step_run_dropout(&plain.g, &plain.pl, w, CPU_EXEC_F32, CPU_EXEC_REFERENCE, 1.0, b, dropout);
    StepOut f = cpu_step_run_dropout(&fused.g, &fused.pl, w, CPU_EXEC_F32, CPU_EXEC_REFERENCE, 1.0, b, dropout);
    const char *which;
    int compared;
    double e = cpu_step_worst_rel(&a, &f, &fused.pl, &which, &compared);
    printf("fuse_embed %s: loss %.9g vs %.9g, worst relative error %.3g (%s) over %d nonzero gradients\n", tag,
           f.loss, a.loss, e, which, compared);
    cr_expect(e <= tol, "%s: worst relative error %.3g (%s) > %.0e", tag, e, which, tol);
    cr_expect_geq(compared, fused.pl.n - 1, "%s: %d nonzero gradients of %d parameters", tag, compared, fused.pl.n);
    cr_expect(isfinite(f.loss) && f.loss > 0);
    step_free(&a);
    step_free(&f);
    batch_free(b);
    cpu_step_free_weights(&fused.pl, w);
    pipeline_free(&fused);
    pipeline_free(&plain);
}

Test(fuse_embed, same_function_fp16_dropout) { same_function(PREC_FP16, true, 0.1, 1e-3, "fp16 dropout"); }
Test(fuse_embed, same_function_fp16) { same_function(PREC_FP16, false, 0.1, 1e-3, "fp16"); }
Test(fuse_embed, same_function_fp16_no_dropout_node) { same_function(PREC_FP16, true, 0, 1e-3, "fp16 no dropout node"); }
Test(fuse_embed, same_function_bf16_dropout) { same_function(PREC_BF16, true, 0.1, 1e-3, "bf16 dropout"); }

Test(fuse_embed, bert_base_arena)
{
    ModelSpec s;
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/models/bert_base.model", root ? root : ".");
    cr_assert_eq(spec_load(path, &s, stderr), 0, "cannot load %s", path);
    Pipeline fused, plain;
    build(&s, PREC_FP16, "1", &fused);
    build(&s, PREC_FP16, "0", &plain);
    StepPlan pf, pp;
    HpcError err = {0};
    cr_assert_eq(plan_build(&fused.g, 32, 128, &pf, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build(&plain.g, 32, 128, &pp, &err), HPC_OK, "%s", err.msg);
    int64_t live_f = plan_peak_live_bytes(&pf), live_p = plan_peak_live_bytes(&pp);
    printf("fuse_embed bert_base fp16 32x128: arena %.1f MiB unfused, %.1f MiB fused; live at the peak %.1f, %.1f\n",
           pp.arena_bytes / 1048576.0, pf.arena_bytes / 1048576.0, live_p / 1048576.0, live_f / 1048576.0);
    /* the f32 sum (B L H x 4 = 12 MiB) lived all step; xhat (6 MiB) does
     * now: at least 5 MiB off the bytes live at the peak, and the arena no
     * larger (how much of it comes off depends on the packing) */
    cr_expect_leq(live_f, live_p - 5 * 1048576LL, "live at the peak %lld -> %lld", (long long)live_p,
                  (long long)live_f);
    cr_expect_leq(pf.arena_bytes, pp.arena_bytes, "arena %lld -> %lld", (long long)pp.arena_bytes,
                  (long long)pf.arena_bytes);
    plan_free(&pf);
    plan_free(&pp);
    pipeline_free(&fused);
    pipeline_free(&plain);
}
