/* tests/test_plan.c — the step planner and the per-op CUDA emitter.
 *
 * Planner: on bert_tiny (fp32 and fp16 graphs) no two values or scratch
 * ranges that are live at the same time overlap in the arena, every value
 * is live where it is read, gradients/loss/logits survive to the end, the
 * arena is much smaller than the sum of all values (sharing works), and
 * plan_check notices a plan that was broken on purpose; the invariants also
 * hold for GPT-2, BERT masked-LM and BERT-base at B=32, L=128, and the
 * arena is within 2 % of the bytes live at the peak on BERT-base.
 * Emitter: the module of every graph compiles with NVRTC for sm_80 and
 * sm_90 (no GPU needed) under fp32, fp16 and bf16, and every kernel a node
 * launches is in the cubin; also the causal-LM (GPT-2), masked-LM and
 * regression heads, which use ops the classifier does not. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autodiff.h"
#include "emit_ops.h"
#include "compiler/ir_build.h"
#include "program/ir.h"
#include "lower.h"
#include "cuda/nvrtc_compile.h"
#include "program/params.h"
#include "program/plan.h"
#include "compiler/plan_graph.h"
#include "precision.h"
#include "program/spec.h"
#include "compiler/spec_load.h"
#include "pipeline.h"
#include "cpu_step.h"

static void bert_tiny(ModelSpec *s)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "bert_tiny");
    s->stack.hidden = 128;
    s->stack.layers = 2;
    s->stack.heads = 2;
    s->stack.ffn = 512;
}

/* lower + autodiff (+ precision unless fp32); g and pl are initialised here. */
static void build(const ModelSpec *s, SpecPrecision prec, IrGraph *g, ParamList *pl)
{
    IrGraph raw;
    HpcError err = {0};
    ir_init(&raw);
    params_init(pl);
    cr_assert_eq(lower_model(s, &raw, pl, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(autodiff_build(&raw, pl, &err), HPC_OK, "%s", err.msg);
    ir_init(g);
    PrecisionPlan pp;
    cr_assert_eq(precision_plan(&raw, s, prec, g, &pp, &err), HPC_OK, "%s", err.msg);
    precision_plan_free(&pp);
    ir_free(&raw);
}

static void check_plan(SpecPrecision prec)
{
    ModelSpec s;
    IrGraph g;
    ParamList pl;
    StepPlan p;
    HpcError err = {0};
    char why[512] = "";
    bert_tiny(&s);
    build(&s, prec, &g, &pl);
    cr_assert_eq(plan_build(&g, 8, 128, &p, &err), HPC_OK, "%s", err.msg);
    cr_expect(plan_check(&p, &g, why, sizeof why), "%s", why);
    cr_expect_eq(p.v[g.loss].last, p.n_order);
    cr_expect_eq(p.v[g.logits].last, p.n_order);
    int grads = 0;
    int64_t trainable = 0;
    for (int q = 0; q < g.n_params; q++)
        if (g.param_grad[q] >= 0) {
            grads++;
            trainable += params_numel(&pl.p[q]);
            cr_expect_eq(p.v[g.param_grad[q]].last, p.n_order, "gradient of %s not pinned",
                         pl.p[q].name);
        }
    cr_expect_gt(grads, 30);
    int inputs = 0;
    for (int i = 0; i < g.n; i++)
        if (g.nodes[i].op == IR_OP_INPUT && g.nodes[i].attr.input.kind == IR_IN_INPUT_IDS) {
            inputs++;
            cr_expect_eq(p.v[i].last, p.n_order, "the token ids (%s) are not pinned: the optimizer reads them",
                         g.nodes[i].name);
        }
    cr_expect_eq(inputs, 1);
    PlanMemory m;
    plan_memory(&p, &g, &pl, &s.train, &m);
    cr_expect_lt(m.arena * 2, m.unshared, "arena %lld vs unshared %lld: little sharing",
                 (long long)m.arena, (long long)m.unshared);
    cr_expect_geq(m.arena, m.gradients);
    cr_expect_eq(m.params_master, params_total(&pl) * 4);
    cr_expect_eq(m.optimizer, 8 * trainable, "AdamW keeps m and v (f32) per trainable element");
    cr_expect_geq(m.gradients, 4 * trainable);
    plan_free(&p);
    params_free(&pl);
    ir_free(&g);
}

Test(plan, bert_tiny_fp32_invariants) { check_plan(PREC_FP32); }
Test(plan, bert_tiny_fp16_invariants) { check_plan(PREC_FP16); }

/* The other heads and the full BERT-base shape at its training bounds. */
Test(plan, other_models_invariants)
{
    static const char *files[] = {"gpt2_small.model", "bert_base_mlm.model", "bert_base.model"};
    for (int f = 0; f < 3; f++) {
        ModelSpec s;
        IrGraph g;
        ParamList pl;
        StepPlan p;
        HpcError err = {0};
        char why[512] = "";
        cpu_step_load_model(files[f], &s);
        build(&s, f == 1 ? PREC_BF16 : PREC_FP16, &g, &pl);
        cr_assert_eq(plan_build(&g, 32, 128, &p, &err), HPC_OK, "%s", err.msg);
        cr_expect(plan_check(&p, &g, why, sizeof why), "%s: %s", files[f], why);
        plan_free(&p);
        params_free(&pl);
        ir_free(&g);
    }
}

Test(plan, check_catches_overlap)
{
    ModelSpec s;
    IrGraph g;
    ParamList pl;
    StepPlan p;
    HpcError err = {0};
    char why[512] = "";
    bert_tiny(&s);
    build(&s, PREC_FP32, &g, &pl);
    cr_assert_eq(plan_build(&g, 4, 32, &p, &err), HPC_OK, "%s", err.msg);
    cr_assert(plan_check(&p, &g, why, sizeof why), "%s", why);
    /* The input of the loss and the loss itself are live together: make
     * them share memory and the checker must complain. */
    int x = g.nodes[g.loss].in[0];
    p.v[g.loss].offset = p.v[x].offset;
    cr_expect_not(plan_check(&p, &g, why, sizeof why));
    cr_expect(strstr(why, "overlap") != NULL, "%s", why);
    plan_free(&p);
    params_free(&pl);
    ir_free(&g);
}

Test(plan, values_with_disjoint_lifetimes_share)
{
    /* x -> a -> b -> c: a and c are never live together, so c may reuse a. */
    IrGraph g;
    ir_init(&g);
    int x = ir_param(&g, 0, DT_F32, 2, (int64_t[]){1024, 256}, "x");
    IrAttr act = {.act = {IR_ACT_RELU}};
    int a = ir_add(&g, IR_OP_ACT, &x, 1, &act, "a");
    int b = ir_add(&g, IR_OP_ACT, &a, 1, &act, "b");
    int c = ir_add(&g, IR_OP_ACT, &b, 1, &act, "c");
    g.loss = c;
    StepPlan p;
    HpcError err = {0};
    char why[256] = "";
    cr_assert_eq(plan_build(&g, 1, 1, &p, &err), HPC_OK, "%s", err.msg);
    cr_expect(plan_check(&p, &g, why, sizeof why), "%s", why);
    cr_expect_eq(p.v[c].offset, p.v[a].offset);
    cr_expect_eq(p.arena_bytes, 2 * 1024 * 256 * 4);
    plan_free(&p);
    ir_free(&g);
}

Test(plan, rejects_bad_bounds)
{
    IrGraph g;
    ir_init(&g);
    ir_param(&g, 0, DT_F32, 1, (int64_t[]){4}, "w");
    StepPlan p;
    HpcError err = {0};
    cr_expect_eq(plan_build(&g, 0, 8, &p, &err), HPC_ERR_USAGE);
    cr_expect(strstr(err.msg, "batch 0") != NULL, "%s", err.msg);
    ir_free(&g);
}

/* ---- emitted kernels compile ------------------------------------------ */

static void expect_compiles(const ModelSpec *s, SpecPrecision prec, int arch)
{
    IrGraph g;
    ParamList pl;
    HpcError err = {0};
    char *src;
    build(s, prec, &g, &pl);
    cr_assert_eq(eop_module_source(&g, &src, &err), HPC_OK, "%s", err.msg);
    void *cubin;
    size_t size;
    char *log = NULL;
    HpcStatus st = nvrtc_compile(src, "hpc_ops_test", arch, NULL, 0, &cubin, &size, &log, &err);
    cr_assert_eq(st, HPC_OK, "%s %s sm_%d: %s", s->name, spec_precision_name(prec), arch, err.msg);
    int kernels = 0;
    for (int id = 0; id < g.n; id++) {
        EopNodeCode c;
        cr_assert_eq(eop_node_code(&g, id, 4, 16, &c, &err), HPC_OK, "%s", err.msg);
        for (int k = 0; k < c.n_phases; k++) {
            const char *name = c.phase[k].name;
            cr_expect(memmem(cubin, size, name, strlen(name)) != NULL, "%s not in the cubin", name);
            cr_expect_gt(c.phase[k].block[0], 0);
            kernels++;
        }
    }
    cr_expect_gt(kernels, 10);
    cr_expect_gt(eop_kernel_count(&g), 10);
    free(cubin);
    free(log);
    free(src);
    params_free(&pl);
    ir_free(&g);
}

Test(emit_ops, bert_tiny_fp32_sm80_sm90, .timeout = 300)
{
    ModelSpec s;
    bert_tiny(&s);
    expect_compiles(&s, PREC_FP32, 80);
    expect_compiles(&s, PREC_FP32, 90);
}

Test(emit_ops, bert_tiny_fp16_sm80_sm90, .timeout = 300)
{
    ModelSpec s;
    bert_tiny(&s);
    expect_compiles(&s, PREC_FP16, 80);
    expect_compiles(&s, PREC_FP16, 90);
}

Test(emit_ops, bert_tiny_bf16_sm80_sm90, .timeout = 300)
{
    ModelSpec s;
    bert_tiny(&s);
    expect_compiles(&s, PREC_BF16, 80);
    expect_compiles(&s, PREC_BF16, 90);
}

Test(emit_ops, other_heads_compile, .timeout = 300)
{
    ModelSpec s;
    cpu_step_load_model("gpt2_small.model", &s);     /* causal, shift_labels, gelu_tanh, tied decoder */
    s.stack.layers = 1;
    expect_compiles(&s, PREC_FP16, 90);
    cpu_step_load_model("bert_base_mlm.model", &s);  /* masked LM, tied decoder, transform LN */
    s.stack.layers = 1;
    expect_compiles(&s, PREC_BF16, 80);
    cpu_step_load_model("gpt2_small.model", &s);     /* causal classifier: slice_last(_bwd) */
    s.stack.layers = 1;
    s.head.kind = HEAD_SEQ_CLASSIFICATION;
    s.head.pooler = false;
    s.head.num_labels = 3;
    expect_compiles(&s, PREC_BF16, 80);
    expect_compiles(&s, PREC_FP32, 90);
    bert_tiny(&s);                           /* regression: MSE */
    s.head.regression = true;
    s.head.num_labels = 1;
    expect_compiles(&s, PREC_FP32, 90);
}

Test(emit_ops, names_say_what_they_do)
{
    ModelSpec s;
    IrGraph g;
    ParamList pl;
    HpcError err = {0};
    bert_tiny(&s);
    build(&s, PREC_FP16, &g, &pl);
    bool seen_ln = false, seen_gemm = false;
    for (int id = 0; id < g.n; id++) {
        EopNodeCode c;
        cr_assert_eq(eop_node_code(&g, id, 2, 8, &c, &err), HPC_OK, "%s", err.msg);
        if (g.nodes[id].op == IR_OP_LAYERNORM) {
            seen_ln = true;
            char want[32];   /* the output's storage dtype: f32 under fp16's default plan */
            snprintf(want, sizeof want, "ln_fwd_%s_h128_", ir_dtype_name(g.nodes[id].dtype));
            cr_expect(strncmp(c.phase[0].name, want, strlen(want)) == 0, "%s", c.phase[0].name);
            cr_expect_eq(strlen(c.phase[0].name), strlen(want) + 6);
            cr_expect_eq(c.phase[0].grid[0], 16u, "one block per row of B*L = 16");
        }
        if (g.nodes[id].op == IR_OP_LINEAR) {
            seen_gemm = true;
            cr_expect_eq(c.kind, EOP_GEMM);
        }
    }
    cr_expect(seen_ln && seen_gemm);
    params_free(&pl);
    ir_free(&g);
}

/* PlanOptions.keep_all (a debugging aid for tests that read intermediate
 * values after a step): every arena value lives to the end, so no two
 * share memory and the arena is at least the sum of their sizes. */
Test(plan, keep_all_shares_nothing)
{
    ModelSpec s;
    IrGraph g;
    ParamList pl;
    StepPlan shared, kept;
    HpcError err = {0};
    char why[512] = "";
    bert_tiny(&s);
    build(&s, PREC_FP16, &g, &pl);
    cr_assert_eq(plan_build(&g, 4, 32, &shared, &err), HPC_OK, "%s", err.msg);
    HpcStatus st = plan_build_with(&g, 4, 32, &(PlanOptions){.keep_all = true}, &kept, &err);
    cr_assert_eq(st, HPC_OK, "%s", err.msg);
    cr_expect(plan_check(&kept, &g, why, sizeof why), "%s", why);
    int64_t sum = 0;
    for (int i = 0; i < g.n; i++)
        if (kept.v[i].kind == PLAN_ARENA && kept.v[i].def >= 0) {
            cr_expect_eq(kept.v[i].last, kept.n_order, "value %d (%s) is not kept", i, g.nodes[i].name);
            sum += kept.v[i].bytes;
        }
    cr_expect_geq(kept.arena_bytes, sum);
    cr_expect_lt(shared.arena_bytes, kept.arena_bytes, "sharing saves nothing: %lld vs %lld",
                 (long long)shared.arena_bytes, (long long)kept.arena_bytes);
    plan_free(&shared);
    plan_free(&kept);
    ir_free(&g);
    params_free(&pl);
}

/* The arena's placement (program/plan.c: first fit in several orders, the
 * smallest kept) comes within 1.5 % of the bytes live at the peak on
 * BERT-base fp16 at 32 x 128 with the last layer for token 0 (766.7 MiB
 * for 757.7 live, 1.2 %; largest first alone: 772.7, 2.0 %; before
 * xhat_ones and the keep bits were the default, 752.1 for 748.8 against
 * 757.8), and within 0.1 % with every token (the breadth order reaches
 * the peak there; largest first alone left 3 MiB, 0.4 %).  The placement
 * before both (best fit in definition order) gave 958.9 MiB for 887.5
 * live with the first-token layer (+8 %). */
static void arena_near_peak(bool first_token)
{
    ModelSpec s;
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/models/bert_base.model", root ? root : ".");
    cr_assert_eq(spec_load(path, &s, stderr), 0, "cannot load %s", path);
    PipeOptions o = pipeline_defaults(PREC_FP16);
    o.first_token_last_layer = first_token;
    Pipeline pp;
    HpcError err = {0};
    cr_assert_eq(pipeline_build(&s, &o, &pp, &err), HPC_OK, "%s", err.msg);
    StepPlan p;
    cr_assert_eq(plan_build(&pp.g, 32, 128, &p, &err), HPC_OK, "%s", err.msg);
    char why[512] = "";
    cr_expect(plan_check(&p, &pp.g, why, sizeof why), "%s", why);
    int64_t live = plan_peak_live_bytes(&p);
    printf("plan bert_base fp16 32x128%s: arena %.1f MiB, %.1f MiB live at the peak\n",
           first_token ? " (last layer for token 0)" : "", p.arena_bytes / 1048576.0, live / 1048576.0);
    cr_expect_geq(p.arena_bytes, live);
    int64_t slack = first_token ? live * 3 / 200 : live / 1000;
    cr_expect_leq(p.arena_bytes, live + slack, "arena %lld for %lld live", (long long)p.arena_bytes,
                  (long long)live);
    plan_free(&p);
    pipeline_free(&pp);
}

Test(plan, bert_base_arena_near_live_peak) { arena_near_peak(false); }
Test(plan, bert_base_arena_near_live_peak_first_token) { arena_near_peak(true); }
