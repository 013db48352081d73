/* tests/test_attn_keep.c — HPC_ATTN_KEEP=1 (compiler/fuse_attn_keep.c): the
 * attention forward saves its dropout's keep bits for the backward.
 *
 * The graph: only with the setting, only a padded attention of every query
 * with dropout under a 16-bit policy gets the keep output (ATTENTION's
 * output 2, (B, heads, L, 4) i32), and exactly its backward reads it (input
 * 7); fp32, no dropout and the first-token layer keep none; a bad value is
 * refused.
 *
 * The bits: the cpu reference writes them (runtime/cpu/
 * cpu_exec_attention.inc), and each must be the decision the dropout
 * really made.  That is read off runtime/cpu/cpu_attention.h's f64
 * attention (the CUDA kernels' oracle), run with V the identity: a query's
 * context is then its dropped-out probability row, nonzero exactly where a
 * visible key was kept.  At L 13, so rows do not start on a Philox group of
 * 8 (the kernels' two-draw case), with padded rows.
 *
 * The kernels: the step module with the bits compiles with NVRTC (the v2
 * forward stores them, the one-pass backward loads them); their values on
 * a GPU are checked by tests/gpu/gpu_step.c. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention_form.h"
#include "cpu/cpu_attention.h"
#include "cpu_step.h"
#include "module_compiles.h"
#include "pipeline.h"

enum { TV = 50, TC = 3 };

static void tiny_spec(ModelSpec *s, double attention_dropout)
{
    /* 2 heads of 16: the identity V of a 13-token row fits a head */
    cpu_step_tiny_spec(s, "tiny_keep", TV, 32, TC);
    s->stack.attention_dropout = attention_dropout;
}

/* The fused pipeline of s under policy, with HPC_ATTN_KEEP=keep (NULL: unset). */
static void build(const ModelSpec *s, SpecPrecision policy, const char *keep, Pipeline *p)
{
    if (keep) setenv("HPC_ATTN_KEEP", keep, 1);
    else unsetenv("HPC_ATTN_KEEP");
    PipeOptions o = pipeline_defaults(policy);
    o.attention = ATTN_FORM_FUSED;
    HpcError err = {0};
    HpcStatus st = pipeline_build(s, &o, p, &err);
    unsetenv("HPC_ATTN_KEEP");
    cr_assert_eq(st, HPC_OK, "pipeline_build: %s", err.msg);
}

/* Attentions with the keep output, each checked to feed its own backward. */
static int keep_sites(const IrGraph *g)
{
    int n = 0;
    for (int i = 0; i < g->n; i++) {
        const IrNode *a = &g->nodes[i];
        if (a->op == IR_OP_ATTENTION_BWD && a->n_in == 8) {
            const IrNode *k = &g->nodes[a->in[7]];
            cr_expect(k->op == IR_OP_OUTPUT && k->attr.output.index == 2 && ir_output(g, k->in[0], 1) == a->in[6],
                      "%s reads the keep bits of the forward whose lse it reads", a->name);
        }
        if (a->op != IR_OP_ATTENTION || ir_output(g, i, 2) < 0) continue;
        const IrNode *k = &g->nodes[ir_output(g, i, 2)];
        cr_expect(k->dtype == DT_I32 && k->rank == 4 && k->dims[0] == IR_DIM_B && k->dims[1] == a->attr.attn.heads &&
                      k->dims[2] == IR_DIM_L && k->dims[3] == IR_ATTN_KEEP_KEYS / 32,
                  "%s: keep is (B, heads, L, %d) i32", a->name, IR_ATTN_KEEP_KEYS / 32);
        cr_expect(!a->attr.attn.first_query && !a->attr.attn.varlen, "%s: a padded attention of every query", a->name);
        int readers = 0;
        for (int j = 0; j < g->n; j++)
            for (int q = 0; q < g->nodes[j].n_in; q++) readers += g->nodes[j].in[q] == ir_output(g, i, 2);
        cr_expect_eq(readers, 1, "%s: its backward alone reads the keep bits", a->name);
        n++;
    }
    return n;
}

Test(attn_keep, only_with_the_setting_and_where_the_kernels_take_it)
{
    /* bert_tiny's layer 1 is lowered for token 0 (first_query): layer 0 alone */
    static const struct {
        SpecPrecision policy;
        double dropout;
        const char *keep;
        int sites;
        const char *what;
    } cases[] = {
        {PREC_FP16, 0.1, NULL, 1, "unset: the bits saved (the default since 2026-12-05)"},
        {PREC_FP16, 0.1, "0", 0, "HPC_ATTN_KEEP=0"},
        {PREC_FP16, 0.1, "1", 1, "fp16: the full-length layer"},
        {PREC_BF16, 0.1, "1", 1, "bf16"},
        {PREC_FP32, 0.1, "1", 0, "fp32: the SIMT kernels draw"},
        {PREC_FP16, 0.0, "1", 0, "no attention dropout, no bits"},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        ModelSpec s;
        tiny_spec(&s, cases[c].dropout);
        Pipeline p;
        build(&s, cases[c].policy, cases[c].keep, &p);
        cr_expect_eq(ir_count_op(&p.g, IR_OP_ATTENTION, 0), 2, "%s: two attentions", cases[c].what);
        cr_expect_eq(keep_sites(&p.g), cases[c].sites, "%s", cases[c].what);
        pipeline_free(&p);
    }
}

Test(attn_keep, a_bad_value_is_refused)
{
    ModelSpec s;
    tiny_spec(&s, 0.1);
    setenv("HPC_ATTN_KEEP", "yes", 1);
    PipeOptions o = pipeline_defaults(PREC_FP16);
    Pipeline p;
    HpcError err = {0};
    HpcStatus st = pipeline_build(&s, &o, &p, &err);
    unsetenv("HPC_ATTN_KEEP");
    cr_expect_eq(st, HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "HPC_ATTN_KEEP=yes") != NULL, "names the value: %s", err.msg);
    if (st == HPC_OK) pipeline_free(&p);
}

/* Every visible key's bit is the decision the f64 reference's dropout made. */
Test(attn_keep, bits_are_the_dropouts_decisions)
{
    ModelSpec s;
    tiny_spec(&s, 0.3);
    Pipeline p;
    build(&s, PREC_FP16, "1", &p);
    const int B = 3, L = 13, H = 32, NH = 2, D = 16;
    Batch *b = cpu_step_padded_batch(B, L, TV, TC);
    double **w = cpu_step_random_weights(&p.pl, 5, 0.5);
    CpuExec ex;
    cpu_exec_init(&ex, &p.g, CPU_EXEC_F32);
    float **wf = cpu_step_bind(&ex, &p.pl, w, CPU_EXEC_F32);
    cpu_step_exec(&ex, b, 1.0, true);   /* seed 77, step 3 */
    /* V the identity per head (key j -> column j), Q and K small random */
    double *q = calloc((size_t)B * L * H, sizeof *q), *k = calloc((size_t)B * L * H, sizeof *k);
    double *v = calloc((size_t)B * L * H, sizeof *v), *ctx = calloc((size_t)B * L * H, sizeof *ctx);
    for (int64_t i = 0; i < (int64_t)B * L * H; i++) {
        q[i] = 0.1 * sin(0.7 * (double)i);
        k[i] = 0.1 * cos(0.3 * (double)i);
    }
    for (int r = 0; r < B; r++)
        for (int j = 0; j < L; j++)
            for (int h = 0; h < NH; h++) v[((int64_t)r * L + j) * H + h * D + j] = 1.0;
    int sites = 0, kept = 0, dropped = 0;
    for (int id = 0; id < p.g.n; id++) {
        const IrNode *n = &p.g.nodes[id];
        int ko = n->op == IR_OP_ATTENTION ? ir_output(&p.g, id, 2) : -1;
        if (ko < 0) continue;
        sites++;
        CkAttnShape sh = {B, L, NH, D, false, n->attr.attn.p, 77, 3, (uint32_t)n->attr.attn.salt};
        ck_attention_fwd_f64(ctx, NULL, q, k, v, H, b->attention_mask, &sh);
        const int32_t *keep = cpu_exec_value(&ex, ko);
        cr_assert_eq(cpu_exec_numel(&ex, ko), (int64_t)B * NH * L * (IR_ATTN_KEEP_KEYS / 32));
        for (int r = 0; r < B; r++)
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < L; i++)
                    for (int j = 0; j < L; j++) {
                        if (!b->attention_mask[r * L + j]) continue;   /* a hidden key's context is 0 either way */
                        int64_t row = ((int64_t)r * NH + h) * L + i;
                        int bit = (int)((uint32_t)keep[row * (IR_ATTN_KEEP_KEYS / 32) + j / 32] >> (j % 32) & 1u);
                        int made = ctx[((int64_t)r * L + i) * H + h * D + j] != 0.0;
                        cr_expect_eq(bit, made, "row %d head %d query %d key %d: bit %d, the dropout %s it", r, h,
                                     i, j, bit, made ? "kept" : "dropped");
                        kept += made;
                        dropped += !made;
                    }
    }
    cr_expect_eq(sites, 1, "one attention saves its bits");
    cr_expect(kept > 0 && dropped > 0, "both decisions seen: %d kept, %d dropped", kept, dropped);
    free(q);
    free(k);
    free(v);
    free(ctx);
    cpu_exec_free(&ex);
    cpu_step_unbind(&p.pl, wf);
    cpu_step_free_weights(&p.pl, w);
    batch_free(b);
    pipeline_free(&p);
}

/* The default one-pass backward (v4, attn4_bwd) reads the bits. */
Test(attn_keep, the_module_with_the_bits_compiles, .timeout = 300)
{
    ModelSpec s;
    tiny_spec(&s, 0.1);
    for (int pol = 0; pol < 2; pol++) {
        Pipeline p;
        build(&s, pol ? PREC_BF16 : PREC_FP16, "1", &p);
        expect_module_compiles(&p.g, pol ? "tiny bf16 keep" : "tiny fp16 keep", "attn4_bwd");
        pipeline_free(&p);
    }
}
