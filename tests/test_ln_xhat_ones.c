/* tests/test_ln_xhat_ones.c — HPC_LN_SAVE=xhat_ones (compiler/fuse_ln_dw.c):
 * a LayerNorm site whose dW GEMMs also make their bias gradient saves
 * [xhat | 1 | 0] (IR_XHAT_ONES_PAD more columns), the GEMM runs plain and an
 * LN_DW_FIX_DB takes db from its raw output's column `in`; on the cpu
 * backend.
 *
 *  - models/bert_tiny.model under fp16: the pass widens the sites that feed a
 *    Q/K/V GEMM (every layer but the first, whose Q/K/V reads the embedding
 *    LayerNorm), their xhat has H + 8 columns, no LINEAR_DW_BGRAD reads an
 *    xhat, each widened GEMM is followed by an LN_DW_FIX_DB; under bf16
 *    (dy bf16, xhat f16: the dW GEMMs keep y16) nothing is widened;
 *  - in f64 (the cpu backend rounds nothing there) every gradient of a step
 *    is xhat_dw's to 1e-12: the ones column gives colsum(dy) exactly, and
 *    the LayerNorm backward reads the wider rows;
 *  - under fp16 in f32 the loss is xhat_dw's bit for bit and every gradient
 *    within 1e-5 of it (the same values summed in another order), with
 *    dropout on and off; no NaN;
 *  - models/bert_base.model at 32 x 128: the widened xhat values hold
 *    exactly 11 x 4096 x 8 x 2 bytes more than under xhat_dw;
 *  - the fp16 module compiles with NVRTC (sm_80, sm_90) and has the
 *    ln_dw_fix_db kernel;
 *  - LN_DW_FIX_DB alone on random data: the cpu reference is the formula
 *    (db exactly raw's column in), and its kernel compiles in both forms
 *    (8 columns a thread at in 24, one element at in 20);
 *  - HPC_LN_SAVE=bogus is refused and names xhat_ones. */
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
#include "data/batch.h"
#include "fuse.h"
#include "fuse_qkv.h"
#include "ln_site_graph.h"
#include "module_compiles.h"
#include "pipeline.h"
#include "program/plan.h"
#include "program/spec.h"

/* Every layer runs every token (the first-token last layer has its own
 * tests, tests/test_first_token.c). */
__attribute__((constructor)) static void pin_last_layer_all(void) { setenv("HPC_LAST_LAYER", "all", 1); }

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static double uniform(void)
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0 * 2.0 - 1.0;   /* [-1, 1) */
}

static void build(const ModelSpec *s, SpecPrecision policy, const char *save, Pipeline *p)
{
    PipeOptions o = pipeline_defaults(policy);
    setenv("HPC_LN_SAVE", save, 1);
    HpcError err = {0};
    HpcStatus st = pipeline_build(s, &o, p, &err);
    unsetenv("HPC_LN_SAVE");
    cr_assert_eq(st, HPC_OK, "pipeline_build: %s", err.msg);
}

static int count_op(const IrGraph *g, IrOpKind op)
{
    int c = 0;
    for (int i = 0; i < g->n; i++) c += g->nodes[i].op == op;
    return c;
}

/* The LN_RESIDUAL sites with IrLnFusedAttr.ones, checking each one's xhat
 * (output 3) is (.., H + 8) and read only by dW GEMMs followed by their
 * LN_DW_FIX_DB and by LN_RESIDUAL_BWD. */
static int widened_sites(const IrGraph *g)
{
    int sites = 0;
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = &g->nodes[i];
        if (n->op != IR_OP_LN_RESIDUAL || !fuse_ln_attr_get(n).ones) continue;
        sites++;
        int xh = ir_output(g, i, 3);
        cr_assert_geq(xh, 0, "%s: no xhat", n->name);
        cr_expect_eq(g->nodes[xh].dims[g->nodes[xh].rank - 1], n->dims[n->rank - 1] + IR_XHAT_ONES_PAD,
                     "%s: xhat is not H + 8 wide", n->name);
        for (int j = xh + 1; j < g->n; j++) {
            const IrNode *u = &g->nodes[j];
            for (int k = 0; k < u->n_in; k++) {
                if (u->in[k] != xh) continue;
                if (u->op == IR_OP_LINEAR_DW) {
                    /* the fix comes right after the GEMM, or among the
                     * fixes and views that end the graph (fuse_ln_dw.c) */
                    int fix = -1;
                    for (int f = j + 1; f < g->n; f++)
                        if (g->nodes[f].op == IR_OP_LN_DW_FIX_DB && g->nodes[f].in[0] == j) fix = f;
                    cr_expect(fix >= 0, "%s: no ln_dw_fix_db after it", u->name);
                    for (int f = fix + 1; fix > j + 2 && f < g->n; f++) {
                        IrOpKind op = g->nodes[f].op;
                        cr_expect(op == IR_OP_LN_DW_FIX || op == IR_OP_LN_DW_FIX_DB || op == IR_OP_UNSTACK ||
                                      op == IR_OP_OUTPUT,
                                  "%s: its fix is not among the last nodes (%s after it)", u->name,
                                  ir_op_name(op));
                    }
                } else {
                    cr_expect_eq(u->op, IR_OP_LN_RESIDUAL_BWD, "%s reads a widened xhat (%s)", u->name,
                                 ir_op_name(u->op));
                }
            }
        }
    }
    return sites;
}

Test(ln_xhat_ones, bert_tiny_graph)
{
    ModelSpec s;
    cpu_step_load_model("bert_tiny.model", &s);
    Pipeline dw, on, bf;
    build(&s, PREC_FP16, "xhat_dw", &dw);
    build(&s, PREC_FP16, "xhat_ones", &on);
    build(&s, PREC_BF16, "xhat_ones", &bf);
    int qkv = fuse_qkv_requested() ? 1 : 3, layers = (int)s.stack.layers;
    cr_expect_eq(on.fuse.ln_db_from_ones, qkv * (layers - 1), "%d bias gradients from ones",
                 on.fuse.ln_db_from_ones);
    cr_expect_eq(on.fuse.ln_dw_from_xhat, dw.fuse.ln_dw_from_xhat);
    cr_expect_eq(dw.fuse.ln_db_from_ones, 0);
    cr_expect_eq(widened_sites(&on.g), layers - 1);
    cr_expect_eq(widened_sites(&dw.g), 0);
    cr_expect_eq(count_op(&on.g, IR_OP_LN_DW_FIX_DB), qkv * (layers - 1));
    cr_expect_eq(count_op(&on.g, IR_OP_LINEAR_DW_BGRAD) + qkv * (layers - 1), count_op(&dw.g, IR_OP_LINEAR_DW_BGRAD));
    cr_expect_eq(bf.fuse.ln_db_from_ones, 0, "bf16: the dW GEMMs keep y16");
    cr_expect_eq(widened_sites(&bf.g), 0);
    pipeline_free(&dw);
    pipeline_free(&on);
    pipeline_free(&bf);
}

/* One bert_tiny step under xhat_dw and under xhat_ones on the cpu, the
 * same weights, batch and dropout (on or off), in precision prec: the
 * loss must be the same bits and every gradient within tol of xhat_dw's. */
static void step_against_xhat_dw(CpuExecPrecision prec, bool training, double tol)
{
    ModelSpec s;
    cpu_step_load_model("bert_tiny.model", &s);
    Pipeline dw, on;
    build(&s, PREC_FP16, "xhat_dw", &dw);
    build(&s, PREC_FP16, "xhat_ones", &on);
    cr_assert_gt(on.fuse.ln_db_from_ones, 0);
    double **w = cpu_step_random_weights(&dw.pl, 5, 0.05);
    Batch *b = cpu_step_padded_batch(3, 16, (int)s.stack.vocab_size, s.head.num_labels > 1 ? s.head.num_labels : 1);
    StepOut a = cpu_step_run_dropout(&dw.g, &dw.pl, w, prec, CPU_EXEC_REFERENCE, 1, b, training);
    StepOut c = cpu_step_run_dropout(&on.g, &on.pl, w, prec, CPU_EXEC_REFERENCE, 1, b, training);
    const char *pname = prec == CPU_EXEC_F64 ? "f64" : "f32";
    cr_expect(isfinite(c.loss) && c.loss == a.loss, "%s, dropout %d: loss %.17g with ones, %.17g xhat_dw", pname,
              training, c.loss, a.loss);
    const char *which = "";
    int compared = 0;
    double worst = cpu_step_worst_rel(&a, &c, &dw.pl, &which, &compared);
    printf("bert_tiny fp16 graphs in %s, dropout %d: worst %.3g from xhat_dw's (%s) over %d gradients\n", pname,
           training, worst, which, compared);
    cr_expect(worst <= tol, "%s, dropout %d, %s: %.3g from xhat_dw's", pname, training, which, worst);   /* NaN fails */
    cr_expect_gt(compared, 30);
    step_free(&a);
    step_free(&c);
    batch_free(b);
    cpu_step_free_weights(&dw.pl, w);
    pipeline_free(&dw);
    pipeline_free(&on);
}

/* The algebra, exactly: in f64 (no rounding) every gradient is xhat_dw's
 * to 1e-12.  In f32 with the fp16 graphs' roundings, up to summation
 * order (1e-5). */
Test(ln_xhat_ones, bert_tiny_exact_in_f64, .timeout = 600) { step_against_xhat_dw(CPU_EXEC_F64, true, 1e-12); }
Test(ln_xhat_ones, bert_tiny_fp16_step, .timeout = 600)
{
    step_against_xhat_dw(CPU_EXEC_F32, false, 1e-5);
    step_against_xhat_dw(CPU_EXEC_F32, true, 1e-5);
}

/* The bytes of LN_RESIDUAL's output 3 (xhat) over the plan's graph. */
static int64_t xhat_bytes(const Pipeline *p, int64_t B, int64_t L)
{
    int64_t bytes = 0;
    for (int i = 0; i < p->g.n; i++) {
        const IrNode *n = &p->g.nodes[i];
        if (n->op == IR_OP_OUTPUT && n->attr.output.index == 3 && p->g.nodes[n->in[0]].op == IR_OP_LN_RESIDUAL)
            bytes += ir_numel(n, B, L) * (int64_t)plan_dtype_size(n->dtype);
    }
    return bytes;
}

Test(ln_xhat_ones, bert_base_xhat_bytes)
{
    ModelSpec s;
    cpu_step_load_model("bert_base.model", &s);
    Pipeline dw, on;
    build(&s, PREC_FP16, "xhat_dw", &dw);
    build(&s, PREC_FP16, "xhat_ones", &on);
    int sites = widened_sites(&on.g);
    cr_expect_eq(sites, (int)s.stack.layers - 1);
    int64_t grown = xhat_bytes(&on, 32, 128) - xhat_bytes(&dw, 32, 128);
    cr_expect_eq(grown, (int64_t)sites * 32 * 128 * IR_XHAT_ONES_PAD * 2, "xhat grew by %lld bytes", (long long)grown);
    /* the arena: the wider xhat, and the raw (out, in + 8) gradient beside
     * dW at its fix (LN_DW_FIX writes over its raw, LN_DW_FIX_DB cannot) */
    int64_t raw = 0;
    for (int i = 0; i < on.g.n; i++)
        if (on.g.nodes[i].op == IR_OP_LN_DW_FIX_DB) {
            const IrNode *r = &on.g.nodes[on.g.nodes[i].in[0]];
            raw = ir_numel(r, 32, 128) * (int64_t)plan_dtype_size(r->dtype);
        }
    StepPlan pd, po;
    HpcError err = {0};
    cr_assert_eq(plan_build(&dw.g, 32, 128, &pd, &err), HPC_OK, "%s", err.msg);
    cr_assert_eq(plan_build(&on.g, 32, 128, &po, &err), HPC_OK, "%s", err.msg);
    printf("bert_base fp16 32x128: arena %.2f -> %.2f MiB with xhat_ones (xhat +%.2f, raw %.2f MiB)\n",
           pd.arena_bytes / 1048576.0, po.arena_bytes / 1048576.0, grown / 1048576.0, raw / 1048576.0);
    cr_expect_gt(raw, 0);
    cr_expect_leq(po.arena_bytes - pd.arena_bytes, grown + raw + PLAN_ALIGN, "arena %lld -> %lld",
                  (long long)pd.arena_bytes, (long long)po.arena_bytes);
    plan_free(&pd);
    plan_free(&po);
    pipeline_free(&dw);
    pipeline_free(&on);
}

Test(ln_xhat_ones, fp16_module_compiles, .timeout = 300)
{
    ModelSpec s;
    cpu_step_load_model("bert_tiny.model", &s);
    Pipeline p;
    build(&s, PREC_FP16, "xhat_ones", &p);
    cr_assert_gt(p.fuse.ln_db_from_ones, 0);
    expect_module_compiles(&p.g, "hpc_ln_xhat_ones", "ln_dw_fix_db");
    pipeline_free(&p);
}

/* LN_DW_FIX_DB alone on random data, its cpu reference against the formula
 * in double, and its kernel text (the 8-column loop at in 24, the scalar
 * loop at in 20) compiling with NVRTC. */
static void fix_db_case(int64_t out, int64_t in)
{
    IrGraph g;
    ParamList pl;
    int outs[2];
    ln_dw_fix_graph(&g, &pl, out, in, true, outs);
    int64_t ldr = in + IR_XHAT_ONES_PAD, numel[3] = {out * ldr, in, in};
    float *w[3];
    CpuExec ex;
    cpu_exec_init(&ex, &g, CPU_EXEC_F32);
    for (int k = 0; k < 3; k++) {
        w[k] = malloc((size_t)numel[k] * sizeof *w[k]);
        for (int64_t i = 0; i < numel[k]; i++) w[k][i] = (float)uniform();
        cpu_exec_bind_param(&ex, k, w[k]);
    }
    Batch *b = batch_new(1, 1, 0);
    CpuRunOptions o = {.training = false, .backward = false, .loss_scale = 1};
    HpcError err = {0};
    cr_assert_eq(cpu_exec_run(&ex, b, &o, &err), HPC_OK, "%s", err.msg);
    const float *dw = cpu_exec_value(&ex, outs[0]), *db = cpu_exec_value(&ex, outs[1]);
    for (int64_t r = 0; r < out; r++) {
        double want_db = w[0][r * ldr + in];   /* a NaN fails both checks */
        cr_expect(db[r] == (float)want_db, "db[%lld] %g, raw's column %lld %g", (long long)r, db[r], (long long)in,
                  want_db);
        for (int64_t c = 0; c < in; c++) {
            double want = (double)w[0][r * ldr + c] * w[1][c] + want_db * w[2][c];
            cr_expect(fabs(dw[r * in + c] - want) <= 1e-6 * (1 + fabs(want)), "dW[%lld][%lld] %g, want %g",
                      (long long)r, (long long)c, dw[r * in + c], want);
        }
    }
    expect_module_compiles(&g, "hpc_ln_dw_fix_db", "o_db[o]");
    cpu_exec_free(&ex);
    batch_free(b);
    for (int k = 0; k < 3; k++) free(w[k]);
    ir_free(&g);
    params_free(&pl);
}

Test(ln_xhat_ones, ln_dw_fix_db_alone, .timeout = 120)
{
    fix_db_case(7, 24);
    fix_db_case(5, 20);
}

Test(ln_xhat_ones, bogus_value_names_the_choice)
{
    ModelSpec s;
    cpu_step_load_model("bert_tiny.model", &s);
    PipeOptions o = pipeline_defaults(PREC_FP16);
    setenv("HPC_LN_SAVE", "ones", 1);
    Pipeline p;
    HpcError err = {0};
    HpcStatus st = pipeline_build(&s, &o, &p, &err);
    unsetenv("HPC_LN_SAVE");
    cr_assert_neq(st, HPC_OK, "HPC_LN_SAVE=ones was taken");
    cr_expect(strstr(err.msg, "xhat_ones") != NULL, "the message does not name xhat_ones: %s", err.msg);
}
