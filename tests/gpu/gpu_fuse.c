/* tests/gpu/gpu_fuse.c — the fused graph (compiler/pipeline.h with the fuse
 * pass on) trained one step on the GPU (runtime/cuda/cuda_exec.h) against the
 * cpu backend on the same parameters, batch and dropout seed.
 *
 * The fused ops (SOFTMAX_DROPOUT, SOFTMAX_DROPOUT_BWD, DROPOUT_ADD) only
 * exist in fused graphs, so this is where their CUDA kernels meet the CPU
 * reference; their outputs feed the loss, the logits and every gradient,
 * which are compared (intermediate values may be reused by the arena).
 * Cases: bert_tiny-shaped classifier (hidden 128, 2 layers, 2 heads, B=8,
 * L=64 with padding, dropout 0.1) under fp32, fp16 and bf16, and a 2-layer
 * GPT-2 causal LM under fp16 (causal softmax).  Checks per case: the train
 * loss, logits and every parameter gradient (rel L2, NaN fails; gradients
 * with a floor of 1e-3 of the largest gradient norm, as tests/gpu/gpu_step.c
 * explains), the eval loss (dropout off), and that the graph really holds
 * fused ops.  Tolerances as gpu_step: fp32 1e-4, fp16 1e-2, bf16 4e-2.
 * The LayerNorm sites (LN_RESIDUAL, LN_RESIDUAL_BWD: compiler/fuse_layernorm.c)
 * are checked the same way at hidden 128 and at BERT-base's 768 (one block
 * of 96 threads per row) and 1024, with 8 x 61 rows (odd L: rows not a
 * multiple of the column-partial blocks); every LayerNorm gamma/beta
 * gradient and every output-dense bias gradient comes from their kernels,
 * and a run with HPC_FUSE_LN=0 must hold none of them.  The fused embedding
 * layer (EMBED_LN, EMBED_LN_BWD: compiler/fuse_embed.c) is in every BERT
 * case under fp16 and bf16: its tables', dgamma's and dbeta's gradients
 * are among those compared.
 *
 * Exit 0 when every check passes, 1 on a failed check, 4 without a GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/batch.h"
#include "cpu/cpu_exec.h"
#include "cuda/cuda_driver.h"
#include "cuda/cuda_exec.h"
#include "cpu/half.h"
#include "program/ir.h"
#include "program/params.h"
#include "pipeline.h"
#include "program/spec.h"
#include "compiler/spec_load.h"
#include "gpu_check.h"
#include "gpu_check_model.h"

static CudaDevice g_dev;

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { return (uint32_t)(gpu_check_xorshift(&g_rng) >> 32); }
static float uniform(void) { return gpu_check_uniform24(rnd() >> 8); }

static int64_t g_hidden = 128;   /* the cases' hidden size (ffn = 4 x hidden) */
static int g_no_ln;              /* the case ran with HPC_FUSE_LN=0 */

static int make_spec(ModelSpec *s, bool causal)
{
    spec_defaults(s);
    if (causal) {
        const char *root = getenv("HPC_ROOT");
        char path[512];
        snprintf(path, sizeof path, "%s/models/gpt2_small.model", root ? root : ".");
        if (spec_load(path, s, stderr) != 0) {
            result(0, "cannot load %s (run from the repository root or set HPC_ROOT)", path);
            return 0;
        }
    }
    snprintf(s->name, sizeof s->name, causal ? "gpt2_tiny causal-lm" : "bert_tiny classifier");
    s->stack.hidden = g_hidden;
    s->stack.layers = 2;
    s->stack.heads = 2;
    s->stack.ffn = 4 * g_hidden;
    s->stack.hidden_dropout = 0.1;
    s->stack.attention_dropout = 0.1;
    return 1;
}

static double value_err(CudaExec *ex, const CpuExec *cx, int v, double floor_norm)
{
    HpcError err = {0};
    int64_t n = cpu_exec_numel(cx, v);
    float *gpu = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *gpu);
    double e = NAN;
    if (cuda_exec_read(ex, v, gpu, &err)) result(0, "read value %d: %s", v, err.msg);
    else e = gpu_check_rel_l2_floor(gpu, cpu_exec_value(cx, v), n, floor_norm);
    free(gpu);
    return e;
}

static void check_grads(const Pipeline *P, CudaExec *ex, const CpuExec *cx, const char *tag, double tol)
{
    double floor_norm = 1e-3 * gpu_check_max_grad_norm(&P->g, cx), worst = 0;
    int count = 0, worst_p = -1;
    for (int p = 0; p < P->g.n_params; p++) {
        int v = P->g.param_grad[p];
        if (v < 0) continue;
        double e = value_err(ex, cx, v, floor_norm);
        count++;
        if (isnan(worst)) continue;          /* a NaN sticks */
        if (isnan(e) || e > worst) {
            worst = e;
            worst_p = p;
        }
    }
    result(!isnan(worst) && worst <= tol && count > 10, "%s: %d gradients, worst rel L2 %.3g (%s) <= %.0e",
           tag, count, worst, worst_p >= 0 ? P->pl.p[worst_p].name : "-", tol);
}

static void check_loss(CudaExec *ex, double cpu, const char *tag, const char *what, double tol)
{
    HpcError err = {0};
    double gpu = NAN;
    if (cuda_exec_loss(ex, &gpu, &err)) result(0, "%s: %s: %s", tag, what, err.msg);
    double e = fabs(gpu - cpu) / fmax(fabs(cpu), 1e-30);
    result(e <= tol, "%s: %s gpu %.7f cpu %.7f rel %.3g <= %.0e", tag, what, gpu, cpu, e, tol);
}

static int count_fused(const IrGraph *g)
{
    int n = 0;
    for (int i = 0; i < g->n; i++) {
        IrOpKind op = g->nodes[i].op;
        n += op == IR_OP_SOFTMAX_DROPOUT || op == IR_OP_SOFTMAX_DROPOUT_BWD || op == IR_OP_DROPOUT_ADD ||
             op == IR_OP_LN_RESIDUAL || op == IR_OP_LN_RESIDUAL_BWD;
    }
    return n;
}

static int run_cpu(CpuExec *cx, const Batch *b, bool train, float scale)
{
    HpcError err = {0};
    CpuRunOptions o = {.training = train, .backward = train, .seed = 99, .step = 7, .loss_scale = scale};
    if (!cpu_exec_run(cx, b, &o, &err)) return 1;
    result(0, "cpu step: %s", err.msg);
    return 0;
}

static void check_case(bool causal, SpecPrecision prec, int64_t B, int64_t L, double tol, float scale)
{
    ModelSpec s;
    if (!make_spec(&s, causal)) return;
    char tag[128];
    snprintf(tag, sizeof tag, "%s %s fused B=%lld L=%lld", s.name, spec_precision_name(prec),
             (long long)B, (long long)L);
    PipeOptions po = pipeline_defaults(prec);
    po.attention = ATTN_FORM_UNFUSED;   /* the fuse pass's ops (gpu_attention_step: the fused node) */
    Pipeline P;
    HpcError err = {0};
    if (pipeline_build(&s, &po, &P, &err)) {
        result(0, "%s: pipeline_build: %s", tag, err.msg);
        pipeline_free(&P);
        return;
    }
    result(count_fused(&P.g) >= 4 * (int)s.stack.layers, "%s: %d fused ops in the graph", tag, count_fused(&P.g));
    int ln_f = 0, ln_b = 0;
    for (int i = 0; i < P.g.n; i++) {
        ln_f += P.g.nodes[i].op == IR_OP_LN_RESIDUAL;
        ln_b += P.g.nodes[i].op == IR_OP_LN_RESIDUAL_BWD;
    }
    if (g_no_ln) result(ln_f + ln_b == 0, "%s: HPC_FUSE_LN=0 leaves %d LayerNorm sites fused", tag, ln_f + ln_b);
    else if (!causal) /* post-LN: two sites per layer, forward and backward */
        result(ln_f == 2 * (int)s.stack.layers && ln_b == ln_f, "%s: %d + %d fused LayerNorm sites", tag, ln_f, ln_b);
    else /* pre-LN: forward sites only (the residual gradient is a sum) */
        result(ln_f > 0, "%s: %d fused LayerNorm sites (forward)", tag, ln_f);
    /* the embedding layer (compiler/fuse_embed.c): fused under fp16/bf16 in BERT (its LayerNorm), at
     * hidden 128 (one warp a row), 768 (three) and 1024 (four); GPT-2 has no embedding LayerNorm */
    int emb = ir_count_op(&P.g, IR_OP_EMBED_LN, 0) + ir_count_op(&P.g, IR_OP_EMBED_LN_BWD, 0);
    int emb_want = !causal && prec != PREC_FP32 ? 2 : 0;
    result(emb == emb_want, "%s: %d fused embedding nodes (want %d)", tag, emb, emb_want);
    float **w = gpu_check_random_params(&P.pl, prec, uniform);
    Batch *b = gpu_check_random_batch(&s, B, L, !causal, rnd);
    CpuExec cx;
    cpu_exec_init(&cx, &P.g, CPU_EXEC_F32);
    for (int q = 0; q < P.pl.n; q++)
        if (P.pl.p[q].tied_to < 0) cpu_exec_bind_param(&cx, q, w[q]);
    CudaExec ex;
    HpcStatus st = cuda_exec_init(&ex, &g_dev, &P.g, &P.pl, B, L, &err);
    if (!st) st = cuda_exec_set_params(&ex, w, &err);
    if (st) {
        result(0, "%s: bind: %s", tag, err.msg);
    } else {
        CudaRunOptions o = {.training = true, .backward = true, .seed = 99, .step = 7, .loss_scale = scale};
        if (run_cpu(&cx, b, true, scale) && !(st = cuda_exec_run(&ex, b, &o, &err))) {
            check_loss(&ex, cpu_exec_loss(&cx), tag, "train loss", tol);
            check_grads(&P, &ex, &cx, tag, tol);
            double e = value_err(&ex, &cx, P.g.logits, 0);
            result(e <= tol, "%s: train logits rel L2 %.3g <= %.0e", tag, e, tol);
        }
        o.training = o.backward = false;
        if (!st && run_cpu(&cx, b, false, 1) && !(st = cuda_exec_run(&ex, b, &o, &err)))
            check_loss(&ex, cpu_exec_loss(&cx), tag, "eval loss", tol);
        if (st) result(0, "%s: run: %s", tag, err.msg);
        cuda_exec_free(&ex);
    }
    cpu_exec_free(&cx);
    batch_free(b);
    gpu_check_free_params(&P.pl, w);
    pipeline_free(&P);
}

int main(void)
{
    if (!gpu_check_open_device("gpu_fuse", &g_dev)) return 4;
    printf("gpu_fuse on %s (sm_%d)\n", g_dev.name, g_dev.arch);
    check_case(false, PREC_FP32, 8, 64, 1e-4, 1);
    check_case(false, PREC_FP16, 8, 64, 1e-2, 128);
    check_case(false, PREC_BF16, 8, 64, 4e-2, 128);
    check_case(true, PREC_FP16, 4, 32, 1e-2, 128);
    for (int h = 0; h < 2; h++) {   /* the LayerNorm site kernels at BERT-base's and BERT-large's rows */
        g_hidden = h ? 1024 : 768;
        check_case(false, PREC_FP32, 8, 61, 1e-4, 1);
        check_case(false, PREC_FP16, 8, 61, 1e-2, 128);
        check_case(false, PREC_BF16, 8, 61, 4e-2, 128);
    }
    g_hidden = 768;                 /* the same step without them: the reference road */
    setenv("HPC_FUSE_LN", "0", 1);
    g_no_ln = 1;
    check_case(false, PREC_FP16, 8, 61, 1e-2, 128);
    unsetenv("HPC_FUSE_LN");
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
