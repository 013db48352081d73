/* tests/gpu/gpu_accum.c — the accumulating dX GEMM (LINEAR_DX_ACC,
 * compiler/fuse_accum.c): cuBLASLt with f16/bf16 A, B, f32 C = D, beta = 1
 * (runtime/cuda/gemm_cublas.h), and the node on the cuda executor, against
 * f64 and cpu references.
 *
 * Part 1, the GEMM: D (R, N) = C + dy (R, K) W (K, N) as cuda_exec.c runs
 * LINEAR_DX_ACC, for f16 and bf16 operands (random in [-1, 1), rounded to
 * the format) and a random f32 C, at BERT-base shapes (4096 rows: B32 x
 * L128; K = 768 for Q/K/V, 3072 for the FFN input) and odd ones.  In place
 * (D = C, what the plan gives) and out of place (D separate, poisoned with
 * NaN; C must come back unchanged).  Error ||got - ref||_2 / ||ref||_2
 * against the f64 sum, limit 1e-5 (f32 accumulation); NaN never passes.
 * The first call of a shape is autotuned on the call's own buffers (the
 * in-place C is saved and restored around the timing), so a wrong restore
 * shows as a wrong sum.  A NaN put in C must come out in D at its place.
 *
 * Part 2, the node on the executor: a fused bert_tiny-shaped classifier
 * (hidden 128, ffn 512, 2 layers, B=8, L=64, padding, dropout 0.1) under
 * fp32, fp16 and bf16 trains one step on the GPU and on the cpu backend.
 *   in place: the plan writes every LINEAR_DX_ACC over its acc (checked);
 *     every parameter gradient (all flow through the accumulated residual
 *     gradients) is compared, rel L2 with a floor of 1e-3 of the largest
 *     gradient norm (tests/gpu/gpu_step.c says why);
 *   PlanOptions.keep_all: nothing shares memory, the GEMMs write out of
 *     place, and every LINEAR_DX_ACC value itself is compared.
 * Tolerances as gpu_step: fp32 1e-4, fp16 1e-2, bf16 4e-2.
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

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd(void) { return (uint32_t)(gpu_check_xorshift(&g_rng) >> 32); }
static float uniform(void) { return gpu_check_uniform24(rnd() >> 8); }

static void die(const char *what, const HpcError *err)
{
    fprintf(stderr, "gpu_accum: %s: %s\n", what, err->msg);
    exit(1);
}

/* ---- part 1: the GEMM ------------------------------------------------------ */

/* n random values in [-1, 1) rounded to t, as f32 (host) and as t's bytes (device). */
static float *random_operand(GemmDtype t, int64_t n, CUdeviceptr *dev)
{
    float *h = malloc((size_t)n * sizeof *h);
    uint16_t *low = malloc((size_t)n * sizeof *low);
    for (int64_t i = 0; i < n; i++) {
        h[i] = uniform();
        if (t == GEMM_F16) h[i] = half_to_f32(low[i] = half_from_f32(h[i]));
        if (t == GEMM_BF16) h[i] = bf16_to_f32(low[i] = bf16_from_f32(h[i]));
    }
    size_t bytes = (size_t)n * gemm_dtype_size(t);
    HpcError err;
    if (CUDA_CHECK(&err, cuda_driver()->cuMemAlloc(dev, bytes)) ||
        CUDA_CHECK(&err, cuda_driver()->cuMemcpyHtoD(*dev, t == GEMM_F32 ? (const void *)h : (const void *)low, bytes)))
        die("device memory", &err);
    free(low);
    return h;
}

static void upload(CUdeviceptr p, const float *h, int64_t n)
{
    HpcError err;
    if (CUDA_CHECK(&err, cuda_driver()->cuMemcpyHtoDAsync(p, h, (size_t)n * 4, g_dev.stream)) ||
        CUDA_CHECK(&err, cuda_driver()->cuStreamSynchronize(g_dev.stream)))
        die("upload", &err);
}

static float *download(CUdeviceptr p, int64_t n)
{
    float *h = malloc((size_t)n * sizeof *h);
    HpcError err;
    if (CUDA_CHECK(&err, cuda_driver()->cuStreamSynchronize(g_dev.stream)) ||
        CUDA_CHECK(&err, cuda_driver()->cuMemcpyDtoH(h, p, (size_t)n * 4)))
        die("download", &err);
    return h;
}

static void gemm_case(GemmContext *ctx, GemmDtype t, int64_t R, int64_t K, int64_t N)
{
    const CudaDriver *cu = cuda_driver();
    CUdeviceptr ddy, dw, dc, dd;
    float *dy = random_operand(t, R * K, &ddy), *w = random_operand(t, K * N, &dw);
    float *c = malloc((size_t)(R * N) * sizeof *c);
    for (int64_t i = 0; i < R * N; i++) c[i] = 2.0f * uniform();
    double *ref = malloc((size_t)(R * N) * sizeof *ref);
    for (int64_t r = 0; r < R; r++)
        for (int64_t j = 0; j < N; j++) {
            double s = c[r * N + j];
            for (int64_t k = 0; k < K; k++) s += (double)dy[r * K + k] * w[k * N + j];
            ref[r * N + j] = s;
        }
    HpcError err = {0};
    if (CUDA_CHECK(&err, cu->cuMemAlloc(&dc, (size_t)(R * N) * 4)) || CUDA_CHECK(&err, cu->cuMemAlloc(&dd, (size_t)(R * N) * 4)))
        die("device memory", &err);
    char tag[96];
    snprintf(tag, sizeof tag, "gemm %s x %s + f32 C (%lld, %lld), K %lld", gemm_dtype_name(t), gemm_dtype_name(t),
             (long long)R, (long long)N, (long long)K);
    for (int pass = 0; pass < 3; pass++) {
        bool in_place = pass != 1;
        upload(dc, c, R * N);
        cu->cuMemsetD8Async(dd, 0xFF, (size_t)(R * N) * 4, g_dev.stream);
        GemmDesc d;   /* as cuda_exec.c's LINEAR_DX_ACC */
        gemm_desc_rm(&d, t, GEMM_F32, R, N, K, ddy, dw, dc);
        d.D = in_place ? 0 : dd;
        d.beta = 1.0f;
        HpcStatus st = gemm_run(ctx, &d, &err);
        if (!st) st = CUDA_CHECK(&err, cu->cuStreamSynchronize(g_dev.stream));
        if (st) {
            result(0, "%s: %s", tag, err.msg);
            continue;
        }
        float *got = download(in_place ? dc : dd, R * N);
        double e = gpu_check_rel_l2_f64(got, ref, R * N, 0);
        const char *how = pass == 0 ? "in place, first call (autotuned)" : pass == 1 ? "out of place" : "in place, again";
        result(e <= 1e-5, "%s, %s: rel %.3g <= 1e-5", tag, how, e);
        if (!in_place) {
            float *c_after = download(dc, R * N);
            result(memcmp(c_after, c, (size_t)(R * N) * 4) == 0, "%s, out of place: C unchanged", tag);
            free(c_after);
        }
        free(got);
    }
    /* a NaN in C reaches D at its place (beta = 1 reads C) */
    int64_t at = (R * N) / 3;
    float keep = c[at];
    c[at] = NAN;
    upload(dc, c, R * N);
    c[at] = keep;
    GemmDesc d;
    gemm_desc_rm(&d, t, GEMM_F32, R, N, K, ddy, dw, dc);
    d.beta = 1.0f;
    if (gemm_run(ctx, &d, &err)) {
        result(0, "%s, NaN in C: %s", tag, err.msg);
    } else {
        float *got = download(dc, R * N);
        int others_nan = 0;
        for (int64_t i = 0; i < R * N; i++) others_nan += i != at && isnan(got[i]);
        result(isnan(got[at]) && others_nan == 0, "%s: a NaN in C comes out at its place (%s), nowhere else (%d)", tag,
               isnan(got[at]) ? "yes" : "no", others_nan);
        free(got);
    }
    cu->cuMemFree(ddy);
    cu->cuMemFree(dw);
    cu->cuMemFree(dc);
    cu->cuMemFree(dd);
    free(dy);
    free(w);
    free(c);
    free(ref);
}

static void part_gemm(void)
{
    GemmContext ctx;
    HpcError err = {0};
    if (gemm_init(&ctx, g_dev.stream, 0, &err)) {
        result(0, "gemm_init: %s", err.msg);
        return;
    }
    static const GemmDtype types[] = {GEMM_F16, GEMM_BF16};
    static const int64_t shapes[][3] = {{4096, 768, 768}, {4096, 3072, 768}, {300, 40, 24}, {37, 13, 9}};
    for (int t = 0; t < 2; t++)
        for (int s = 0; s < 4; s++) gemm_case(&ctx, types[t], shapes[s][0], shapes[s][1], shapes[s][2]);
    printf("      (shapes autotuned: %d, from the tuning cache: %d)\n", ctx.tuned, ctx.tune_hits);
    gemm_free(&ctx);
}

/* ---- part 2: LINEAR_DX_ACC on the cuda executor ---------------------------- */

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

/* The values compared: every parameter gradient (in place), or every
 * LINEAR_DX_ACC value (keep_all). */
static int values(const IrGraph *g, bool keep_all, int *v, int cap)
{
    int n = 0;
    for (int i = 0; i < g->n && n < cap; i++)
        if (keep_all && g->nodes[i].op == IR_OP_LINEAR_DX_ACC) v[n++] = i;
    for (int p = 0; !keep_all && p < g->n_params && n < cap; p++)
        if (g->param_grad[p] >= 0) v[n++] = g->param_grad[p];
    return n;
}

static void node_case(SpecPrecision prec, bool keep_all, double tol)
{
    const int64_t B = 8, L = 64;
    ModelSpec s;
    tiny_spec(&s);
    char tag[128];
    snprintf(tag, sizeof tag, "executor %s B=%lld L=%lld, %s", spec_precision_name(prec), (long long)B, (long long)L,
             keep_all ? "PlanOptions.keep_all (out of place)" : "in place");
    PipeOptions po = pipeline_defaults(prec);
    po.fuse_qkv = false;   /* the node counts below are of Q, K and V as three GEMMs */
    Pipeline P;
    HpcError err = {0};
    if (pipeline_build(&s, &po, &P, &err)) {
        result(0, "%s: pipeline_build: %s", tag, err.msg);
        return;
    }
    int want = 4 * (int)s.stack.layers;
    result(P.fuse.linear_dx_acc == want, "%s: %d linear_dx_acc nodes (%d expected)", tag, P.fuse.linear_dx_acc, want);
    int vals[256], nv = values(&P.g, keep_all, vals, 256);
    float **w = gpu_check_random_params(&P.pl, prec, uniform);
    Batch *b = gpu_check_random_batch(&s, B, L, true, rnd);
    CpuExec cx;
    cpu_exec_init(&cx, &P.g, CPU_EXEC_F32);
    for (int q = 0; q < P.pl.n; q++)
        if (P.pl.p[q].tied_to < 0) cpu_exec_bind_param(&cx, q, w[q]);
    CudaExec ex;
    double t0 = gpu_check_seconds();
    HpcStatus st = cuda_exec_init_with(&ex, &g_dev, &P.g, &P.pl, B, L, &(PlanOptions){.keep_all = keep_all}, &err);
    if (!st) st = cuda_exec_set_params(&ex, w, &err);
    if (!st) {
        /* where a slow run's time goes (2026-12-07: this program ran past 150 s on an H100 once) */
        double t1 = gpu_check_seconds();
        printf("      %s: set up in %.2f s, the module %s in %.2f s\n", tag, t1 - t0,
               ex.cache_hit ? "from the cache" : "compiled", ex.compile_seconds);
        t0 = t1;
        int in_place = 0;
        for (int i = 0; i < P.g.n; i++) in_place += P.g.nodes[i].op == IR_OP_LINEAR_DX_ACC && ex.plan.v[i].storage != i;
        result(in_place == (keep_all ? 0 : want), "%s: %d values written in place (%d expected)", tag, in_place,
               keep_all ? 0 : want);
        /* a loss scale as training uses (gpu_bgrad.c says why) */
        CudaRunOptions o = {.training = true, .backward = true, .seed = 99, .step = 7, .loss_scale = 128};
        CpuRunOptions co = {.training = true, .backward = true, .seed = 99, .step = 7, .loss_scale = 128};
        st = cuda_exec_run(&ex, b, &o, &err);
        if (!st && cpu_exec_run(&cx, b, &co, &err)) st = HPC_ERR_INTERNAL;
        if (!st) {
            double fl = 1e-3 * gpu_check_max_grad_norm(&P.g, &cx), worst = 0;
            int worst_v = -1;
            for (int k = 0; k < nv; k++) {
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
            printf("      %s: the step and the cpu reference in %.2f s\n", tag, gpu_check_seconds() - t0);
            result(!isnan(worst) && worst <= tol && nv > 0, "%s: %d %s, worst rel L2 %.3g (%s) <= %.0e", tag, nv,
                   keep_all ? "linear_dx_acc values" : "parameter gradients", worst,
                   worst_v >= 0 ? P.g.nodes[worst_v].name : "-", tol);
        }
        cuda_exec_free(&ex);
    }
    if (st) result(0, "%s: %s", tag, err.msg);
    cpu_exec_free(&cx);
    batch_free(b);
    gpu_check_free_params(&P.pl, w);
    pipeline_free(&P);
}

int main(void)
{
    gpu_check_flush = 1;   /* each line reaches a log at once, also when a time limit stops the program */
    if (!gpu_check_open_device("gpu_accum", &g_dev)) return 4;
    printf("gpu_accum on %s (sm_%d)\n", g_dev.name, g_dev.arch);
    unsetenv("HPC_FUSE_ACCUM");   /* the rule on, whatever the caller set */
    part_gemm();
    static const SpecPrecision precs[] = {PREC_FP32, PREC_FP16, PREC_BF16};
    static const double tols[] = {1e-4, 1e-2, 4e-2};
    for (int p = 0; p < 3; p++)
        for (int k = 0; k < 2; k++) node_case(precs[p], k, tols[p]);
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
