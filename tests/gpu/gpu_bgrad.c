/* tests/gpu/gpu_bgrad.c — bias gradients from the weight-gradient GEMM
 * (cuBLASLt's BGRADB epilogue, runtime/cuda/gemm_cublas.h) and the node that
 * uses it (LINEAR_DW_BGRAD, compiler/fuse_dw.c), against f64 references.
 *
 * Part 1, the GEMM: dW (out, in) = dy^T x with db (out) = column sums of
 * dy from the epilogue, for f16, bf16 and f32 inputs with f32 dW and db, at
 * BERT-base shapes (4096 rows: B32 x L128) and at odd ones (rows, out, in
 * not multiples of 8).  dW and db are poisoned with NaN first; error =
 * ||got - ref||_2 / ||ref||_2, limit 1e-5 (f32 accumulation of exactly
 * representable products; NaN never passes).  Each shape runs twice: with
 * the epilogue where cuBLASLt has an algorithm (the line says whether it
 * did), and with the context's bgrad_off set (what HPC_GEMM_BGRAD=0 sets):
 * then gemm_run_optional must report the epilogue not done, dW must still
 * be right and db must be untouched (still NaN).
 *
 * Part 2, the node on the cuda executor: a fused bert_tiny-shaped
 * classifier (hidden 128, ffn 512, 2 layers, B=8, L=64, padding, dropout
 * 0.1) under fp32 and fp16 trains one step on the GPU and on the cpu
 * backend; every gradient that a LINEAR_DW_BGRAD writes (dW and db) is
 * compared, rel L2 with a floor of 1e-3 of the largest gradient norm
 * (tests/gpu/gpu_step.c says why), fp32 1e-4, fp16 1e-2.  It runs once
 * with the epilogue and once with HPC_GEMM_BGRAD=0 set, so the fallback
 * column-sum kernels (the node's phases) run and are checked too.
 *
 * Exit 0 when every check passes, 1 on a failed check, 4 without a GPU.
 * Seed fixed (the data are random, not tuned). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_exec.h"
#include "cpu/half.h"
#include "cuda/cuda_driver.h"
#include "cuda/cuda_exec.h"
#include "cuda/gemm_cublas.h"
#include "compiler/fuse.h"
#include "data/batch.h"
#include "program/ir.h"
#include "program/params.h"
#include "pipeline.h"
#include "program/spec.h"
#include "gpu_check.h"
#include "gpu_check_model.h"

static CudaDevice g_dev;

static uint64_t g_rng = 0x2545f4914f6cdd1dull;
static uint32_t rnd(void) { return (uint32_t)(gpu_check_xorshift(&g_rng) >> 32); }
static float uniform(void) { return gpu_check_uniform24(rnd() >> 8); }

/* ---- part 1: the GEMM ------------------------------------------------------ */

/* n random values in [-1, 1) rounded to t, as f32 (host) and as t's bytes (device). */
static float *random_operand(GemmDtype t, int64_t n, CUdeviceptr *dev)
{
    const CudaDriver *cu = cuda_driver();
    float *h = malloc((size_t)n * sizeof *h);
    uint16_t *low = malloc((size_t)n * sizeof *low);
    for (int64_t i = 0; i < n; i++) {
        h[i] = uniform();
        if (t == GEMM_F16) h[i] = half_to_f32(low[i] = half_from_f32(h[i]));
        if (t == GEMM_BF16) h[i] = bf16_to_f32(low[i] = bf16_from_f32(h[i]));
    }
    size_t bytes = (size_t)n * gemm_dtype_size(t);
    HpcError err;
    if (CUDA_CHECK(&err, cu->cuMemAlloc(dev, bytes)) ||
        CUDA_CHECK(&err, cu->cuMemcpyHtoD(*dev, t == GEMM_F32 ? (const void *)h : (const void *)low, bytes))) {
        fprintf(stderr, "gpu_bgrad: device memory: %s\n", err.msg);
        exit(1);
    }
    free(low);
    return h;
}

static float *download(CUdeviceptr p, int64_t n)
{
    float *h = malloc((size_t)n * sizeof *h);
    HpcError err;
    if (CUDA_CHECK(&err, cuda_driver()->cuMemcpyDtoH(h, p, (size_t)n * 4))) {
        fprintf(stderr, "gpu_bgrad: download: %s\n", err.msg);
        exit(1);
    }
    return h;
}

static bool all_nan(const float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i])) return false;
    return true;
}

/* One shape, one input dtype; the epilogue on (ctx) and forced off (off). */
static void gemm_case(GemmContext *ctx, GemmContext *off, GemmDtype t, int64_t R, int64_t out, int64_t in)
{
    const CudaDriver *cu = cuda_driver();
    CUdeviceptr ddy, dx, ddw, ddb;
    float *dy = random_operand(t, R * out, &ddy), *x = random_operand(t, R * in, &dx);
    double *rw = calloc((size_t)(out * in), sizeof *rw), *rb = calloc((size_t)out, sizeof *rb);
    for (int64_t r = 0; r < R; r++)
        for (int64_t o = 0; o < out; o++) {
            double g = dy[r * out + o];
            rb[o] += g;
            for (int64_t i = 0; i < in; i++) rw[o * in + i] += g * x[r * in + i];
        }
    HpcError err = {0};
    if (CUDA_CHECK(&err, cu->cuMemAlloc(&ddw, (size_t)(out * in) * 4)) ||
        CUDA_CHECK(&err, cu->cuMemAlloc(&ddb, (size_t)out * 4))) {
        fprintf(stderr, "gpu_bgrad: device memory: %s\n", err.msg);
        exit(1);
    }
    char tag[96];
    snprintf(tag, sizeof tag, "gemm %s->f32 dW (%lld, %lld) over %lld rows", gemm_dtype_name(t),
             (long long)out, (long long)in, (long long)R);
    for (int pass = 0; pass < 2; pass++) {
        GemmContext *g = pass ? off : ctx;
        GemmDesc d;   /* as cuda_exec.c's LINEAR_DW_BGRAD */
        gemm_desc_rm(&d, t, GEMM_F32, out, in, R, ddy, dx, ddw);
        d.trans_a = true;
        d.lda = out;
        d.epilogue = GEMM_EPI_BGRAD_A;
        d.bias = ddb;
        cu->cuMemsetD8Async(ddw, 0xFF, (size_t)(out * in) * 4, g_dev.stream);
        cu->cuMemsetD8Async(ddb, 0xFF, (size_t)out * 4, g_dev.stream);
        bool done = false;
        HpcStatus st = gemm_run_optional(g, &d, &done, &err);
        if (!st) st = CUDA_CHECK(&err, cu->cuStreamSynchronize(g_dev.stream));
        if (st) {
            result(0, "%s: %s", tag, err.msg);
            continue;
        }
        float *gw = download(ddw, out * in), *gb = download(ddb, out);
        double ew = gpu_check_rel_l2_f64(gw, rw, out * in, 0);
        if (pass == 0) {
            result(ew <= 1e-5, "%s, epilogue %s: dW rel %.3g <= 1e-5", tag,
                   done ? "used" : "not available (column sums by the fallback kernel)", ew);
            if (done) {
                double eb = gpu_check_rel_l2_f64(gb, rb, out, 0);
                result(eb <= 1e-5, "%s: db from the epilogue rel %.3g <= 1e-5", tag, eb);
            }
        } else {
            result(!done && ew <= 1e-5 && all_nan(gb, out),
                   "%s, epilogue forced off: reported %s, dW rel %.3g <= 1e-5, db untouched: %s", tag,
                   done ? "done (wrong)" : "not done", ew, all_nan(gb, out) ? "yes" : "no");
        }
        free(gw);
        free(gb);
    }
    cu->cuMemFree(ddy);
    cu->cuMemFree(dx);
    cu->cuMemFree(ddw);
    cu->cuMemFree(ddb);
    free(dy);
    free(x);
    free(rw);
    free(rb);
}

static void part_gemm(void)
{
    GemmContext ctx, off;
    HpcError err = {0};
    if (gemm_init(&ctx, g_dev.stream, 0, &err) || gemm_init(&off, g_dev.stream, 0, &err)) {
        result(0, "gemm_init: %s", err.msg);
        return;
    }
    ctx.bgrad_off = false;   /* whatever HPC_GEMM_BGRAD says: this part sets both ways itself */
    off.bgrad_off = true;
    static const GemmDtype types[] = {GEMM_F16, GEMM_BF16, GEMM_F32};
    static const int64_t shapes[][3] = {{4096, 768, 3072}, {4096, 3072, 768}, {4096, 768, 768},
                                        {300, 40, 24}, {37, 13, 9}};
    for (int t = 0; t < 3; t++)
        for (int s = 0; s < 5; s++) gemm_case(&ctx, &off, types[t], shapes[s][0], shapes[s][1], shapes[s][2]);
    printf("      (epilogues cuBLASLt had no algorithm for: %d)\n", ctx.bgrad_dropped);
    gemm_free(&ctx);
    gemm_free(&off);
}

/* ---- part 2: LINEAR_DW_BGRAD on the cuda executor -------------------------- */

static void tiny_spec(ModelSpec *s)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "bert_tiny classifier");
    s->stack.hidden = 128;
    s->stack.layers = 2;
    s->stack.heads = 2;
    s->stack.ffn = 512;
    s->stack.hidden_dropout = 0.1;
    s->stack.attention_dropout = 0.1;
}

/* The values LINEAR_DW_BGRAD nodes write (dW and their db outputs). */
static int fused_values(const IrGraph *g, int *v, int cap)
{
    int n = 0;
    for (int i = 0; i < g->n && n + 2 <= cap; i++)
        if (g->nodes[i].op == IR_OP_LINEAR_DW_BGRAD) {
            v[n++] = i;
            v[n++] = ir_output(g, i, 1);
        }
    return n;
}

/* Under HPC_LN_SAVE=xhat_dw a dW GEMM's raw output (dy^T xhat) dies at its
 * LN_DW_FIX (compiler/fuse_ln_dw.c), and the arena gives its bytes to a
 * later value (H200 2026-12-01: they held the fixed dW, rel L2 28 against
 * the cpu's raw), so it cannot be read after the step; the fixed dW is
 * checked by gpu_step and gpu_lnfuse. */
static bool fixed_in_place(const IrGraph *g, int v)
{
    for (int i = 0; i < g->n; i++)
        if (g->nodes[i].op == IR_OP_LN_DW_FIX && g->nodes[i].in[0] == v) return true;
    return false;
}

static double floor_of(const IrGraph *g, const CpuExec *cx) { return 1e-3 * gpu_check_max_grad_norm(g, cx); }

static void node_case(SpecPrecision prec, bool force_fallback, double tol)
{
    const int64_t B = 8, L = 64;
    ModelSpec s;
    tiny_spec(&s);
    char tag[128];
    snprintf(tag, sizeof tag, "executor %s B=%lld L=%lld, %s", spec_precision_name(prec), (long long)B,
             (long long)L, force_fallback ? "HPC_GEMM_BGRAD=0 (fallback kernels)" : "epilogue");
    if (force_fallback) setenv("HPC_GEMM_BGRAD", "0", 1);
    else unsetenv("HPC_GEMM_BGRAD");
    PipeOptions po = pipeline_defaults(prec);
    po.fuse_qkv = false;   /* the node counts below are of Q, K and V as three GEMMs */
    Pipeline P;
    HpcError err = {0};
    if (pipeline_build(&s, &po, &P, &err)) {
        result(0, "%s: pipeline_build: %s", tag, err.msg);
        return;
    }
    int vals[64], nv = fused_values(&P.g, vals, 64);
    /* 6 linears with bias per layer, less the 2 that feed a LayerNorm site
     * (LN_RESIDUAL_BWD takes their bias gradient: compiler/fuse_dw.c) and
     * FFN1 (ACT_BWD_BGRAD takes it: compiler/fuse_act.c), the pooler
     * (likewise an activation's unless HPC_FUSE_ACT_BGRAD=0), and under fp32
     * the classifier (its dW and bias gradient then read one dlogits); and
     * in 16 bits under HPC_LN_SAVE=xhat_ones (the default) less the Q, K and
     * V of every layer after the first, which read the xhat of an encoder
     * LayerNorm site with its ones column and make their bias gradients in
     * a plain LINEAR_DW (compiler/fuse_ln_dw.c; the first layer's follow
     * the embedding's LayerNorm, which saves no ones column) */
    FuseOptions fo = fuse_defaults();
    int per_layer = (fo.layernorm ? 6 - 2 : 6) - fo.act_bgrad;
    bool ones = prec != PREC_FP32 && fo.layernorm && fo.ln_save_xhat_dw && fo.ln_xhat_ones;
    int ones_qkv = ones ? 3 * ((int)s.stack.layers - 1) : 0;
    int want = per_layer * (int)s.stack.layers + !fo.act_bgrad + (prec == PREC_FP32) - ones_qkv;
    result(nv == 2 * want, "%s: %d linear_dw_bgrad nodes (%d expected)", tag, nv / 2, want);
    float **w = gpu_check_random_params(&P.pl, prec, uniform);
    Batch *b = gpu_check_random_batch(&s, B, L, true, rnd);
    CpuExec cx;
    cpu_exec_init(&cx, &P.g, CPU_EXEC_F32);
    for (int q = 0; q < P.pl.n; q++)
        if (P.pl.p[q].tied_to < 0) cpu_exec_bind_param(&cx, q, w[q]);
    CudaExec ex;
    HpcStatus st = cuda_exec_init(&ex, &g_dev, &P.g, &P.pl, B, L, &err);
    if (!st) st = cuda_exec_set_params(&ex, w, &err);
    if (!st) {
        result(ex.gemm.bgrad_off == force_fallback, "%s: the GEMM context's bgrad_off is %d", tag, ex.gemm.bgrad_off);
        /* A loss scale as training uses (both sides see the same scaled
         * gradients): at scale 1 the fp16 attention gradients of this tiny
         * model sit in fp16's subnormals, and the check measured that
         * underflow instead of the GEMM (H200: key.weight 4.5e-2). */
        CudaRunOptions o = {.training = true, .backward = true, .seed = 99, .step = 7, .loss_scale = 128};
        CpuRunOptions co = {.training = true, .backward = true, .seed = 99, .step = 7, .loss_scale = 128};
        st = cuda_exec_run(&ex, b, &o, &err);
        if (!st && cpu_exec_run(&cx, b, &co, &err)) st = HPC_ERR_INTERNAL;
        if (!st) {
            double fl = floor_of(&P.g, &cx), worst = 0;
            int worst_v = -1;
            for (int k = 0; k < nv; k++) {
                if (fixed_in_place(&P.g, vals[k])) continue;
                int64_t n = cpu_exec_numel(&cx, vals[k]);
                float *gpu = xmalloc((size_t)n * sizeof *gpu);
                double *ref = xmalloc((size_t)n * sizeof *ref);
                const float *c = cpu_exec_value(&cx, vals[k]);
                for (int64_t i = 0; i < n; i++) ref[i] = c[i];
                double e = cuda_exec_read(&ex, vals[k], gpu, &err) ? NAN : gpu_check_rel_l2_f64(gpu, ref, n, fl);
                if (isnan(e) || (!isnan(worst) && e > worst)) {
                    worst = e;
                    worst_v = vals[k];
                }
                free(gpu);
                free(ref);
            }
            result(!isnan(worst) && worst <= tol && nv > 0,
                   "%s: %d dW/db values, worst rel L2 %.3g (%s) <= %.0e (shapes without a BGRADB algorithm: %d)",
                   tag, nv, worst, worst_v >= 0 ? P.g.nodes[worst_v].name : "-", tol, ex.gemm.bgrad_dropped);
        }
        cuda_exec_free(&ex);
    }
    if (st) result(0, "%s: %s", tag, err.msg);
    cpu_exec_free(&cx);
    batch_free(b);
    gpu_check_free_params(&P.pl, w);
    pipeline_free(&P);
    unsetenv("HPC_GEMM_BGRAD");
}

int main(void)
{
    if (!gpu_check_open_device("gpu_bgrad", &g_dev)) return 4;
    printf("gpu_bgrad on %s (sm_%d)\n", g_dev.name, g_dev.arch);
    part_gemm();
    for (int f = 0; f < 2; f++) {
        node_case(PREC_FP32, f, 1e-4);
        node_case(PREC_FP16, f, 1e-2);
    }
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
