/* tests/gpu/gpu_runtime.c — the CUDA runtime foundation on a real GPU:
 * driver + device, NVRTC compile (through the disk cache) and launch of a
 * kernel checked against the CPU, cuBLASLt GEMMs of every dtype, layout,
 * batch and epilogue against a double-precision CPU reference, the same
 * GEMMs after their first calls were paid ahead on several threads
 * (gemm_prime), the cuBLASLt workspace sized to the chosen algorithms,
 * CUDA graph capture, device memory figures and the out-of-memory message.
 *
 * Tolerances (max |gpu - ref| / max |ref|, ref in double from the very
 * inputs the GPU saw, i.e. after their rounding to fp16/bf16):
 *   f32 output               1e-5   (fp32 accumulation; TF32 must be off)
 *   fp16 output              2e-3   (fp16 unit roundoff 4.9e-4, plus fp32 sums)
 *   bf16 output              1.6e-2 (bf16 unit roundoff 3.9e-3)
 * Every check runs; the program prints each result and exits 1 if any
 * failed, 4 if no GPU is usable. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_kernels.h"
#include "cuda/cuda_driver.h"
#include "cuda/device_arena.h"
#include "cuda/gemm_cublas.h"
#include "cpu/half.h"
#include "cuda/nvrtc_compile.h"
#include "gpu_check.h"

static CudaDevice g_dev;
static DeviceArena g_arena;
static const CudaDriver *cu;

/* Fails the check (and returns 0) when st is an error. */
static int ok_status(HpcStatus st, const HpcError *err, const char *what)
{
    if (st == HPC_OK) return 1;
    result(0, "%s: %s", what, err->msg);
    return 0;
}

/* ---- host helpers ----------------------------------------------------------- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
/* in [-1, 1); the same values as the f64 formula this had (k 2^-23 - 1 is exact in f32) */
static float uniform(void) { return gpu_check_uniform24((uint32_t)(gpu_check_xorshift(&g_rng) >> 40)); }

static float round_to(GemmDtype t, float x)
{
    return t == GEMM_F16 ? half_round(x) : t == GEMM_BF16 ? bf16_round(x) : x;
}

/* Packs f32 values into the storage of type t (malloc'd). */
static void *pack(GemmDtype t, const float *x, int64_t n)
{
    void *out = xmalloc((size_t)(n > 0 ? n : 1) * gemm_dtype_size(t));
    for (int64_t i = 0; i < n; i++) {
        if (t == GEMM_F32) ((float *)out)[i] = x[i];
        else if (t == GEMM_F16) ((uint16_t *)out)[i] = half_from_f32(x[i]);
        else ((uint16_t *)out)[i] = bf16_from_f32(x[i]);
    }
    return out;
}

static void unpack(GemmDtype t, const void *in, float *x, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = t == GEMM_F32 ? ((const float *)in)[i]
             : t == GEMM_F16 ? half_to_f32(((const uint16_t *)in)[i])
                             : bf16_to_f32(((const uint16_t *)in)[i]);
}

/* Random values already rounded to t. */
static float *random_array(GemmDtype t, int64_t n, float scale)
{
    float *x = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *x);
    for (int64_t i = 0; i < n; i++) x[i] = round_to(t, scale * uniform());
    return x;
}

/* ---- device helpers --------------------------------------------------------- */

static HpcStatus sync_stream(HpcError *err)
{
    return CUDA_CHECK(err, cu->cuStreamSynchronize(g_dev.stream));
}

/* Copies run on the run's stream (non-blocking, so the legacy stream's
 * synchronous copies would not order with its kernels). */
static CUdeviceptr upload(const void *host, size_t bytes, const char *what)
{
    HpcError err;
    CUdeviceptr p = 0;
    if (!ok_status(arena_alloc(&g_arena, &p, bytes, what, &err), &err, what)) return 0;
    HpcStatus st = CUDA_CHECK(&err, cu->cuMemcpyHtoDAsync(p, host, bytes, g_dev.stream));
    if (!st) st = sync_stream(&err);
    ok_status(st, &err, what);
    return p;
}

static HpcStatus download(void *host, CUdeviceptr p, size_t bytes, HpcError *err)
{
    HpcStatus st = CUDA_CHECK(err, cu->cuMemcpyDtoHAsync(host, p, bytes, g_dev.stream));
    return st ? st : sync_stream(err);
}

static CUdeviceptr upload_typed(GemmDtype t, const float *x, int64_t n, const char *what)
{
    void *packed = pack(t, x, n);
    CUdeviceptr p = upload(packed, (size_t)(n > 0 ? n : 1) * gemm_dtype_size(t), what);
    free(packed);
    return p;
}

static int download_typed(GemmDtype t, CUdeviceptr p, float *x, int64_t n, const char *what)
{
    HpcError err;
    void *raw = xmalloc((size_t)n * gemm_dtype_size(t));
    int ok = ok_status(download(raw, p, (size_t)n * gemm_dtype_size(t), &err), &err, what);
    if (ok) unpack(t, raw, x, n);
    free(raw);
    return ok;
}

/* max |got - ref| / max |ref| over n values (strided rows); NaN gives inf. */
static double rel_err(const float *got, const double *ref, int64_t rows, int64_t cols,
                      int64_t ld_got, int64_t ld_ref)
{
    double num = 0, den = 1e-30;
    for (int64_t r = 0; r < rows; r++)
        for (int64_t c = 0; c < cols; c++) {
            double g = got[r * ld_got + c], x = ref[r * ld_ref + c];
            if (!isfinite(g)) return INFINITY;
            if (fabs(g - x) > num) num = fabs(g - x);
            if (fabs(x) > den) den = fabs(x);
        }
    return num / den;
}

static double tolerance(GemmDtype c) { return c == GEMM_F32 ? 1e-5 : c == GEMM_F16 ? 2e-3 : 1.6e-2; }

/* ---- the kernel --------------------------------------------------------------- */

static const char *kernel_src =
    "#include <cuda_fp16.h>\n"
    "// out (n) f32 = a * x + y; blocksum (grid) f32 = per-block sums of out.\n"
    "// Dynamic shared memory beyond 48 KiB is requested to exercise the opt-in.\n"
    "extern \"C\" __global__ void axpy_blocksum_f16(float *out, float *blocksum,\n"
    "        const __half *x, const float *y, float a, int n)\n"
    "{\n"
    "    extern __shared__ float sh[];\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    float v = 0.0f;\n"
    "    if (i < n) { v = a * __half2float(x[i]) + y[i]; out[i] = v; }\n"
    "    sh[threadIdx.x] = v;\n"
    "    __syncthreads();\n"
    "    for (int s = blockDim.x / 2; s > 0; s >>= 1) {\n"
    "        if (threadIdx.x < s) sh[threadIdx.x] += sh[threadIdx.x + s];\n"
    "        __syncthreads();\n"
    "    }\n"
    "    if (threadIdx.x == 0) blocksum[blockIdx.x] = sh[0];\n"
    "}\n";

typedef struct {
    CUmodule module;
    CUfunction fn;
} Kernel;

static int compile_and_load(Kernel *k, KcacheResult expect)
{
    HpcError err;
    NvrtcCacheInfo info;
    void *cubin;
    size_t n;
    HpcStatus st = nvrtc_compile_cached(kernel_src, "axpy_blocksum_f16", g_dev.arch, NULL, 0,
                                        &cubin, &n, &info, &err);
    if (!ok_status(st, &err, "nvrtc_compile_cached")) return 0;
    result(info.result == expect, "kernel cache: result %d (want %d), %zu-byte cubin, stored %d %s",
           (int)info.result, (int)expect, n, info.stored, info.note);
    st = CUDA_CHECK(&err, cu->cuModuleLoadData(&k->module, cubin));
    free(cubin);
    if (!ok_status(st, &err, "cuModuleLoadData")) return 0;
    st = CUDA_CHECK(&err, cu->cuModuleGetFunction(&k->fn, k->module, "axpy_blocksum_f16"));
    return ok_status(st, &err, "cuModuleGetFunction");
}

static void test_kernel(void)
{
    enum { N = 100003, BLOCK = 256 };
    const unsigned grid[3] = {(N + BLOCK - 1) / BLOCK, 1, 1}, block[3] = {BLOCK, 1, 1};
    Kernel k;
    if (!compile_and_load(&k, KCACHE_MISS)) return;
    float *x = random_array(GEMM_F16, N, 4.0f), *y = random_array(GEMM_F32, N, 1.0f);
    float a = 1.75f;
    CUdeviceptr dx = upload_typed(GEMM_F16, x, N, "x"), dy = upload_typed(GEMM_F32, y, N, "y");
    CUdeviceptr dout, dsum;
    HpcError err;
    if (!ok_status(arena_alloc(&g_arena, &dout, N * 4, "out", &err), &err, "alloc out") ||
        !ok_status(arena_alloc(&g_arena, &dsum, grid[0] * 4, "sums", &err), &err, "alloc sums"))
        return;
    int n = N;
    void *args[] = {&dout, &dsum, &dx, &dy, &a, &n};
    /* over 48 KiB of dynamic shared memory is refused until the function's
     * limit is raised (once, cuda_func_allow_shared), then launches */
    HpcStatus st = cuda_launch(k.fn, grid, block, 64 * 1024, g_dev.stream, args, &err);
    result(st == HPC_ERR_CUDA, "64 KiB of dynamic shared memory refused before cuda_func_allow_shared: %s",
           st ? err.msg : "(accepted!)");
    st = cuda_func_allow_shared(k.fn, 64 * 1024, &err);
    if (!st) st = cuda_launch(k.fn, grid, block, 64 * 1024, g_dev.stream, args, &err);
    if (!ok_status(st, &err, "cuda_launch (64 KiB dynamic shared)")) return;
    float *out = xmalloc(N * 4), *sums = xmalloc(grid[0] * 4);
    if (!ok_status(download(out, dout, N * 4, &err), &err, "download out") ||
        !ok_status(download(sums, dsum, grid[0] * 4, &err), &err, "download sums"))
        return;
    double max_err = 0, max_sum_err = 0;
    for (int i = 0; i < N; i++) {
        double ref = (double)a * x[i] + y[i];
        double e = fabs(out[i] - ref) / (fabs(ref) + 1e-6);
        if (!(e <= max_err)) max_err = e;
    }
    for (unsigned b = 0; b < grid[0]; b++) {
        double ref = 0, mag = 0;
        for (int i = (int)b * BLOCK; i < (int)(b + 1) * BLOCK && i < N; i++) {
            ref += (double)a * x[i] + y[i];
            mag += fabs((double)a * x[i] + y[i]);
        }
        double e = fabs(sums[b] - ref) / (mag + 1e-6);
        if (!(e <= max_sum_err)) max_sum_err = e;
    }
    result(max_err < 1e-6, "kernel axpy: max rel err %.2e (< 1e-6)", max_err);
    result(max_sum_err < 1e-6, "kernel block sums: max rel err %.2e vs sum|terms| (< 1e-6)", max_sum_err);

    /* a bad launch configuration is a clean HPC_ERR_CUDA naming the call */
    const unsigned huge[3] = {4096, 1, 1};
    st = cuda_launch(k.fn, grid, huge, 0, g_dev.stream, args, &err);
    result(st == HPC_ERR_CUDA && strstr(err.msg, "cuLaunchKernel"),
           "block of 4096 threads refused: %s", st ? err.msg : "(accepted!)");

    Kernel again;
    if (compile_and_load(&again, KCACHE_HIT)) cu->cuModuleUnload(again.module);
    cu->cuModuleUnload(k.module);

    /* a cubin for another major architecture does not load, with a remedy */
    void *cubin;
    size_t nb;
    int other = g_dev.arch >= 90 ? 80 : 90;
    if (nvrtc_compile(kernel_src, "other_arch", other, NULL, 0, &cubin, &nb, NULL, &err) == HPC_OK) {
        CUmodule m;
        st = CUDA_CHECK(&err, cu->cuModuleLoadData(&m, cubin));
        printf("info  sm_%d cubin on sm_%d: %s\n", other, g_dev.arch, st ? err.msg : "loaded");
        if (!st) cu->cuModuleUnload(m);
        free(cubin);
    }
    free(x); free(y); free(out); free(sums);
}

/* ---- GEMMs -------------------------------------------------------------------- */

typedef struct {
    const char *name;
    int64_t M, N, K, batch;
    bool ta, tb;
    GemmDtype ab, c;
    GemmEpilogue epi;
    float alpha, beta;
    int64_t pad;          /* extra elements per row in A, B and C (ld > cols) */
} GemmCase;

typedef struct {
    int64_t a_rows, a_cols, b_rows, b_cols;   /* as stored */
    int64_t lda, ldb, ldc, sa, sb, sc, ld_aux;
} GemmShape;

static void case_shape(const GemmCase *g, GemmShape *s)
{
    s->a_rows = g->ta ? g->K : g->M;
    s->a_cols = g->ta ? g->M : g->K;
    s->b_rows = g->tb ? g->N : g->K;
    s->b_cols = g->tb ? g->K : g->N;
    s->lda = s->a_cols + g->pad;
    s->ldb = s->b_cols + g->pad;
    s->ldc = g->N + g->pad;
    /* batch strides leave a gap of 8 elements between matrices */
    s->sa = s->a_rows * s->lda + 8;
    s->sb = s->b_rows * s->ldb + 8;
    s->sc = g->M * s->ldc + 8;
    s->ld_aux = (g->N + 7) / 8 * 8;
}

static double op_a(const GemmCase *g, const GemmShape *s, const float *A, int64_t m, int64_t k)
{
    return g->ta ? A[k * s->lda + m] : A[m * s->lda + k];
}

static double op_b(const GemmCase *g, const GemmShape *s, const float *B, int64_t k, int64_t n)
{
    return g->tb ? B[n * s->ldb + k] : B[k * s->ldb + n];
}

/* ref (batch, M, ldc) = alpha op(A) op(B) + beta C0, then the epilogue;
 * bias_ref receives the epilogue's bias gradient, aux_ref (M, ld_aux) the GELU input. */
static void gemm_reference(const GemmCase *g, const GemmShape *s, const float *A, const float *B,
                           const float *C0, const float *bias, const float *aux, double *ref,
                           double *bias_ref, double *aux_ref, double *alt)
{
    for (int64_t b = 0; b < g->batch; b++)
        for (int64_t m = 0; m < g->M; m++)
            for (int64_t n = 0; n < g->N; n++) {
                double acc = 0;
                for (int64_t k = 0; k < g->K; k++)
                    acc += op_a(g, s, A + b * s->sa, m, k) * op_b(g, s, B + b * s->sb, k, n);
                double v = g->alpha * acc + g->beta * (double)C0[b * s->sc + m * s->ldc + n];
                if (g->epi == GEMM_EPI_BIAS || g->epi == GEMM_EPI_GELU_BIAS ||
                    g->epi == GEMM_EPI_GELU_AUX_BIAS)
                    v += bias[n];
                int64_t at = b * s->sc + m * s->ldc + n;
                if (g->epi == GEMM_EPI_GELU_AUX_BIAS) aux_ref[m * s->ld_aux + n] = v;
                alt[at] = v;   /* diagnosis: exact-erf GELU, or the bias grad before dgelu */
                if (g->epi == GEMM_EPI_GELU_BIAS || g->epi == GEMM_EPI_GELU_AUX_BIAS) {
                    ck_gelu_fwd_f64(&alt[at], &v, 1);
                    ck_gelu_tanh_fwd_f64(&v, &v, 1);
                }
                if (g->epi == GEMM_EPI_DGELU_BGRAD) {
                    double x = aux[m * s->ld_aux + n], dx = 0, dx_erf = 0;
                    ck_gelu_tanh_bwd_f64(&dx, &v, &x, 1);
                    ck_gelu_bwd_f64(&dx_erf, &v, &x, 1);
                    alt[at] = dx_erf;
                    v = dx;
                }
                ref[b * s->sc + m * s->ldc + n] = v;
            }
    if (g->epi == GEMM_EPI_DGELU_BGRAD)
        for (int64_t n = 0; n < g->N; n++) {
            bias_ref[n] = 0;
            for (int64_t m = 0; m < g->M; m++) bias_ref[n] += ref[m * s->ldc + n];
        }
    if (g->epi == GEMM_EPI_BGRAD_A)
        for (int64_t m = 0; m < g->M; m++) {
            bias_ref[m] = 0;
            for (int64_t k = 0; k < g->K; k++) bias_ref[m] += op_a(g, s, A, m, k);
        }
}

typedef struct {
    float *A, *B, *C0, *bias, *aux;
    CUdeviceptr dA, dB, dC, dbias, daux;
    int64_t nA, nB, nC, nbias, naux;
} GemmData;

static void gemm_data_make(const GemmCase *g, const GemmShape *s, GemmData *d)
{
    d->nA = (g->batch - 1) * s->sa + s->a_rows * s->lda;
    d->nB = (g->batch - 1) * s->sb + s->b_rows * s->ldb;
    d->nC = (g->batch - 1) * s->sc + g->M * s->ldc;
    d->nbias = g->epi == GEMM_EPI_BGRAD_A ? g->M : g->N;
    d->naux = g->M * s->ld_aux;
    d->A = random_array(g->ab, d->nA, 1.0f);
    d->B = random_array(g->ab, d->nB, 1.0f);
    d->C0 = random_array(g->c, d->nC, 1.0f);
    d->bias = random_array(g->c, d->nbias, 1.0f);
    d->aux = random_array(g->c, d->naux, 2.0f);
    d->dA = upload_typed(g->ab, d->A, d->nA, "gemm A");
    d->dB = upload_typed(g->ab, d->B, d->nB, "gemm B");
    d->dC = upload_typed(g->c, d->C0, d->nC, "gemm C");
    d->dbias = upload_typed(g->c, d->bias, d->nbias, "gemm bias");
    d->daux = upload_typed(g->c, d->aux, d->naux, "gemm aux");
}

static void gemm_data_free(GemmData *d)
{
    CUdeviceptr p[] = {d->dA, d->dB, d->dC, d->dbias, d->daux};
    for (int i = 0; i < 5; i++) arena_release(&g_arena, p[i]);
    free(d->A); free(d->B); free(d->C0); free(d->bias); free(d->aux);
}

static void gemm_desc_for(const GemmCase *g, const GemmShape *s, const GemmData *d, GemmDesc *desc)
{
    memset(desc, 0, sizeof *desc);
    desc->M = g->M; desc->N = g->N; desc->K = g->K; desc->batch = g->batch;
    desc->trans_a = g->ta; desc->trans_b = g->tb;
    desc->ab_type = g->ab; desc->c_type = g->c;
    desc->A = d->dA; desc->lda = s->lda; desc->stride_a = s->sa;
    desc->B = d->dB; desc->ldb = s->ldb; desc->stride_b = s->sb;
    desc->C = d->dC; desc->ldc = s->ldc; desc->stride_c = s->sc;
    desc->alpha = g->alpha; desc->beta = g->beta;
    desc->epilogue = g->epi;
    desc->bias = g->epi != GEMM_EPI_NONE ? d->dbias : 0;
    desc->aux = d->daux;
    desc->ld_aux = s->ld_aux;
}

static void gemm_check(GemmContext *ctx, const GemmCase *g)
{
    GemmShape s;
    GemmData d;
    GemmDesc desc;
    HpcError err;
    case_shape(g, &s);
    gemm_data_make(g, &s, &d);
    gemm_desc_for(g, &s, &d, &desc);
    double *ref = xcalloc((size_t)d.nC, sizeof *ref), *bias_ref = xcalloc((size_t)d.nbias, 8);
    double *aux_ref = xcalloc((size_t)d.naux, sizeof *aux_ref);
    double *alt = xcalloc((size_t)d.nC, sizeof *alt);
    gemm_reference(g, &s, d.A, d.B, d.C0, d.bias, d.aux, ref, bias_ref, aux_ref, alt);
    HpcStatus st = gemm_run(ctx, &desc, &err);
    if (!st) st = sync_stream(&err);
    char label[200];
    snprintf(label, sizeof label, "gemm %-26s %s->%s M=%lld N=%lld K=%lld batch=%lld %c%c",
             g->name, gemm_dtype_name(g->ab), gemm_dtype_name(g->c), (long long)g->M,
             (long long)g->N, (long long)g->K, (long long)g->batch, g->ta ? 'T' : 'N',
             g->tb ? 'T' : 'N');
    if (ok_status(st, &err, label)) {
        double tol = tolerance(g->c), worst = 0;
        float *got = xmalloc((size_t)d.nC * sizeof *got);
        if (download_typed(g->c, d.dC, got, d.nC, label))
            for (int64_t b = 0; b < g->batch; b++) {
                double e = rel_err(got + b * s.sc, ref + b * s.sc, g->M, g->N, s.ldc, s.ldc);
                if (!(e <= worst)) worst = e;
            }
        result(worst <= tol, "%s: rel err %.2e (tol %.0e)", label, worst, tol);
        if (g->epi == GEMM_EPI_GELU_BIAS || g->epi == GEMM_EPI_GELU_AUX_BIAS ||
            g->epi == GEMM_EPI_DGELU_BGRAD)
            printf("info  %s: rel err vs the exact-erf GELU instead: %.2e\n", label,
                   rel_err(got, alt, g->M, g->N, s.ldc, s.ldc));
        int bias_out = g->epi == GEMM_EPI_DGELU_BGRAD || g->epi == GEMM_EPI_BGRAD_A;
        if (bias_out && download_typed(g->c, d.dbias, got, d.nbias, label)) {
            double e = rel_err(got, bias_ref, 1, d.nbias, 0, 0);
            result(e <= tol, "%s: bias gradient rel err %.2e (tol %.0e)", label, e, tol);
            if (g->epi == GEMM_EPI_DGELU_BGRAD && !(e <= tol)) {
                for (int64_t n = 0; n < g->N; n++) {   /* column sums before the dgelu */
                    bias_ref[n] = 0;
                    for (int64_t m = 0; m < g->M; m++) {
                        double acc = 0;
                        for (int64_t k = 0; k < g->K; k++)
                            acc += op_a(g, &s, d.A, m, k) * op_b(g, &s, d.B, k, n);
                        bias_ref[n] += acc;
                    }
                }
                printf("info  %s: bias gradient vs sums before dgelu: %.2e\n", label,
                       rel_err(got, bias_ref, 1, d.nbias, 0, 0));
            }
        }
        if (g->epi == GEMM_EPI_GELU_AUX_BIAS && download_typed(g->c, d.daux, got, d.naux, label)) {
            double e = rel_err(got, aux_ref, g->M, g->N, s.ld_aux, s.ld_aux);
            result(e <= tol, "%s: GELU input (aux) rel err %.2e (tol %.0e)", label, e, tol);
        }
        free(got);
    }
    free(ref); free(bias_ref); free(aux_ref); free(alt);
    gemm_data_free(&d);
}

#define E GEMM_EPI_NONE
static const GemmCase gemm_cases[] = {
    /* name                      M    N    K  batch  ta     tb     ab         c          epi  alpha beta pad */
    {"f32 NN odd",               37,  53, 129, 1, false, false, GEMM_F32,  GEMM_F32,  E, 1, 0, 0},
    {"f32 NT odd",               37,  53, 129, 1, false, true,  GEMM_F32,  GEMM_F32,  E, 1, 0, 0},
    {"f32 TN odd",               37,  53, 129, 1, true,  false, GEMM_F32,  GEMM_F32,  E, 1, 0, 0},
    {"f32 TT odd",               37,  53, 129, 1, true,  true,  GEMM_F32,  GEMM_F32,  E, 1, 0, 0},
    {"f32 padded ld alpha beta", 64,  48,  96, 1, false, true,  GEMM_F32,  GEMM_F32,  E, 0.5f, 0.75f, 3},
    {"f32 batched",              19,  23,  41, 3, false, false, GEMM_F32,  GEMM_F32,  E, 1, 0, 0},
    {"f32 batched TT",           19,  23,  41, 5, true,  true,  GEMM_F32,  GEMM_F32,  E, 1, 0, 0},
    {"f32 large",               256, 384, 1024, 1, false, true, GEMM_F32,  GEMM_F32,  E, 1, 0, 0},
    {"f16 to f32 NT",            37,  53, 129, 1, false, true,  GEMM_F16,  GEMM_F32,  E, 1, 0, 0},
    {"f16 to f32 batched",       17,  33,  65, 4, false, false, GEMM_F16,  GEMM_F32,  E, 1, 0, 0},
    {"f16 NN odd",               37,  53, 129, 1, false, false, GEMM_F16,  GEMM_F16,  E, 1, 0, 0},
    {"f16 NT aligned",           64,  96, 128, 1, false, true,  GEMM_F16,  GEMM_F16,  E, 1, 0, 0},
    {"f16 TN batched beta",      24,  40,  56, 3, true,  false, GEMM_F16,  GEMM_F16,  E, 1, 1, 0},
    {"f16 large",               512, 768, 768, 1, false, true,  GEMM_F16,  GEMM_F16,  E, 1, 0, 0},
    {"bf16 NT odd",              37,  53, 129, 1, false, true,  GEMM_BF16, GEMM_BF16, E, 1, 0, 0},
    {"bf16 TN batched",          21,  34,  55, 3, true,  false, GEMM_BF16, GEMM_BF16, E, 1, 0, 0},
    {"bf16 to f32",             100,  80, 300, 1, false, false, GEMM_BF16, GEMM_F32,  E, 1, 0, 0},
    {"bf16 to f32 batched TT",   13,  29,  47, 2, true,  true,  GEMM_BF16, GEMM_F32,  E, 1, 0, 0},
    /* epilogues (batch 1) */
    {"f16 bias",                 33,  72,  48, 1, false, true,  GEMM_F16,  GEMM_F16,  GEMM_EPI_BIAS, 1, 0, 0},
    {"f16 bias odd",             33,  37,  45, 1, false, true,  GEMM_F16,  GEMM_F16,  GEMM_EPI_BIAS, 1, 0, 0},
    {"bf16 bias",                33,  72,  48, 1, false, true,  GEMM_BF16, GEMM_BF16, GEMM_EPI_BIAS, 1, 0, 0},
    {"f32 bias",                 33,  37,  45, 1, false, true,  GEMM_F32,  GEMM_F32,  GEMM_EPI_BIAS, 1, 0, 0},
    {"f16 to f32 bias",          33,  72,  48, 1, false, true,  GEMM_F16,  GEMM_F32,  GEMM_EPI_BIAS, 1, 0, 0},
    {"f16 gelu bias",            32,  64,  48, 1, false, true,  GEMM_F16,  GEMM_F16,  GEMM_EPI_GELU_BIAS, 1, 0, 0},
    {"f16 to f32 gelu bias",     32,  64,  48, 1, false, true,  GEMM_F16,  GEMM_F32,  GEMM_EPI_GELU_BIAS, 1, 0, 0},
    {"f16 gelu aux bias",        33,  40,  48, 1, false, true,  GEMM_F16,  GEMM_F16,  GEMM_EPI_GELU_AUX_BIAS, 1, 0, 0},
    {"bf16 gelu aux bias",       33,  40,  48, 1, false, true,  GEMM_BF16, GEMM_BF16, GEMM_EPI_GELU_AUX_BIAS, 1, 0, 0},
    {"f16 to f32 gelu aux bias", 33,  40,  48, 1, false, true,  GEMM_F16,  GEMM_F32,  GEMM_EPI_GELU_AUX_BIAS, 1, 0, 0},
    {"f16 dgelu bgrad",          33,  40,  24, 1, false, false, GEMM_F16,  GEMM_F16,  GEMM_EPI_DGELU_BGRAD, 1, 0, 0},
    {"bf16 dgelu bgrad",         33,  40,  24, 1, false, false, GEMM_BF16, GEMM_BF16, GEMM_EPI_DGELU_BGRAD, 1, 0, 0},
    {"f16 to f32 dgelu bgrad",   33,  40,  24, 1, false, false, GEMM_F16,  GEMM_F32,  GEMM_EPI_DGELU_BGRAD, 1, 0, 0},
    {"f16 dW bgrad (dY^T X)",    40,  24,  33, 1, true,  false, GEMM_F16,  GEMM_F16,  GEMM_EPI_BGRAD_A, 1, 0, 0},
    {"f16 to f32 dW bgrad",      40,  24,  64, 1, true,  false, GEMM_F16,  GEMM_F32,  GEMM_EPI_BGRAD_A, 1, 0, 0},
    {"bf16 dW bgrad",            40,  24,  64, 1, true,  false, GEMM_BF16, GEMM_BF16, GEMM_EPI_BGRAD_A, 1, 0, 0},
};
#undef E

/* The linear layer convenience: y = x W^T + b, W (out, in). */
static void test_linear(GemmContext *ctx)
{
    enum { T = 45, OUT = 72, IN = 56 };
    float *x = random_array(GEMM_F16, T * IN, 1.0f), *W = random_array(GEMM_F16, OUT * IN, 1.0f);
    float *b = random_array(GEMM_F16, OUT, 1.0f), *y = xmalloc(T * OUT * sizeof *y);
    double *ref = xmalloc(T * OUT * sizeof *ref);
    for (int t = 0; t < T; t++)
        for (int o = 0; o < OUT; o++) {
            double acc = b[o];
            for (int i = 0; i < IN; i++) acc += (double)x[t * IN + i] * W[o * IN + i];
            ref[t * OUT + o] = acc;
        }
    CUdeviceptr dx = upload_typed(GEMM_F16, x, T * IN, "x"), dW = upload_typed(GEMM_F16, W, OUT * IN, "W");
    CUdeviceptr db = upload_typed(GEMM_F16, b, OUT, "b"), dy;
    HpcError err;
    GemmDesc d;
    if (!ok_status(arena_alloc(&g_arena, &dy, T * OUT * 2, "y", &err), &err, "alloc y")) return;
    gemm_desc_linear(&d, GEMM_F16, GEMM_F16, T, OUT, IN, dx, dW, db, dy);
    HpcStatus st = gemm_run(ctx, &d, &err);
    if (!st) st = sync_stream(&err);
    if (ok_status(st, &err, "gemm_desc_linear") && download_typed(GEMM_F16, dy, y, T * OUT, "y")) {
        double e = rel_err(y, ref, T, OUT, OUT, OUT);
        result(e <= 2e-3, "linear y = x W^T + b f16 (45x56 @ 72x56^T): rel err %.2e (tol 2e-3)", e);
    }
    CUdeviceptr p[] = {dx, dW, db, dy};
    for (int i = 0; i < 4; i++) arena_release(&g_arena, p[i]);
    free(x); free(W); free(b); free(y); free(ref);
}

/* A GEMM captured into a CUDA graph and replayed gives the same bits. */
static void test_graph(GemmContext *ctx)
{
    enum { M = 128, N = 256, K = 192 };
    float *a = random_array(GEMM_BF16, M * K, 1.0f), *b = random_array(GEMM_BF16, K * N, 1.0f);
    float *c1 = xmalloc(M * N * 4), *c2 = xmalloc(M * N * 4);
    CUdeviceptr dA = upload_typed(GEMM_BF16, a, M * K, "A"), dB = upload_typed(GEMM_BF16, b, K * N, "B");
    CUdeviceptr dC;
    HpcError err;
    GemmDesc d;
    CUgraph graph = NULL;
    CUgraphExec exec = NULL;
    if (!ok_status(arena_alloc(&g_arena, &dC, M * N * 4, "C", &err), &err, "alloc C")) return;
    gemm_desc_rm(&d, GEMM_BF16, GEMM_F32, M, N, K, dA, dB, dC);
    HpcStatus st = gemm_run(ctx, &d, &err);   /* plans the GEMM outside the capture */
    if (!st) st = sync_stream(&err);
    if (!st) st = download(c1, dC, M * N * 4, &err);
    if (!st) st = CUDA_CHECK(&err, cu->cuMemsetD8Async(dC, 0, M * N * 4, g_dev.stream));
    if (!st) st = CUDA_CHECK(&err, cu->cuStreamBeginCapture(g_dev.stream, CU_STREAM_CAPTURE_MODE_GLOBAL));
    if (!st) {
        HpcStatus run = gemm_run(ctx, &d, &err);
        st = CUDA_CHECK(&err, cu->cuStreamEndCapture(g_dev.stream, &graph));
        if (run) st = run;
    }
    if (!st) st = CUDA_CHECK(&err, cu->cuGraphInstantiate(&exec, graph, 0));
    if (!st) st = CUDA_CHECK(&err, cu->cuGraphLaunch(exec, g_dev.stream));
    if (!st) st = sync_stream(&err);
    if (!st) st = download(c2, dC, M * N * 4, &err);
    if (ok_status(st, &err, "graph capture of a cuBLASLt GEMM"))
        result(memcmp(c1, c2, M * N * 4) == 0, "graph replay of a bf16 GEMM matches the direct call bit for bit");
    if (exec) cu->cuGraphExecDestroy(exec);
    if (graph) cu->cuGraphDestroy(graph);
    arena_release(&g_arena, dA); arena_release(&g_arena, dB); arena_release(&g_arena, dC);
    free(a); free(b); free(c1); free(c2);
}

/* Throughput of a large GEMM, for information (events on the run's stream). */
static void time_gemm(GemmContext *ctx, GemmDtype t, int64_t n)
{
    HpcError err;
    CUdeviceptr dA, dB, dC;
    size_t bytes = (size_t)(n * n) * gemm_dtype_size(t);
    if (arena_alloc(&g_arena, &dA, bytes, "A", &err) || arena_alloc(&g_arena, &dB, bytes, "B", &err) ||
        arena_alloc(&g_arena, &dC, bytes, "C", &err)) {
        printf("info  timing skipped: %s\n", err.msg);
        return;
    }
    cu->cuMemsetD8Async(dA, 0x3c, bytes, g_dev.stream);  /* small finite values */
    cu->cuMemsetD8Async(dB, 0x3c, bytes, g_dev.stream);
    GemmDesc d;
    gemm_desc_rm(&d, t, t, n, n, n, dA, dB, dC);
    d.trans_b = true;
    CUevent e0 = NULL, e1 = NULL;
    float ms = 0;
    enum { REPS = 20 };
    HpcStatus st = gemm_run(ctx, &d, &err);
    if (!st) st = CUDA_CHECK(&err, cu->cuEventCreate(&e0, CU_EVENT_DEFAULT));
    if (!st) st = CUDA_CHECK(&err, cu->cuEventCreate(&e1, CU_EVENT_DEFAULT));
    if (!st) st = CUDA_CHECK(&err, cu->cuEventRecord(e0, g_dev.stream));
    for (int i = 0; i < REPS && !st; i++) st = gemm_run(ctx, &d, &err);
    if (!st) st = CUDA_CHECK(&err, cu->cuEventRecord(e1, g_dev.stream));
    if (!st) st = CUDA_CHECK(&err, cu->cuEventSynchronize(e1));
    if (!st) st = CUDA_CHECK(&err, cu->cuEventElapsedTime(&ms, e0, e1));
    if (ok_status(st, &err, "timed GEMM"))
        printf("info  %s GEMM %lld^3 (NT): %.3f ms, %.0f TFLOP/s\n", gemm_dtype_name(t), (long long)n,
               ms / REPS, 2.0 * n * n * n * REPS / (ms * 1e-3) / 1e12);
    if (e0) cu->cuEventDestroy(e0);
    if (e1) cu->cuEventDestroy(e1);
    arena_release(&g_arena, dA); arena_release(&g_arena, dB); arena_release(&g_arena, dC);
}

static void test_gemms(void)
{
    GemmContext ctx;
    HpcError err;
    if (!ok_status(gemm_init(&ctx, g_dev.stream, 0, &err), &err, "gemm_init")) return;
    for (size_t i = 0; i < sizeof gemm_cases / sizeof gemm_cases[0]; i++) gemm_check(&ctx, &gemm_cases[i]);
    /* the same shapes again hit the plan cache */
    int plans = ctx.num_plans;
    gemm_check(&ctx, &gemm_cases[0]);
    result(ctx.num_plans == plans, "plan cache: %d plans for %zu cases, none added on a repeat", plans,
           sizeof gemm_cases / sizeof gemm_cases[0]);
    /* the workspace is what the chosen algorithms need (64 KiB steps), not the limit */
    size_t need = gemm_workspace_needed(&ctx), step = (size_t)64 << 10;
    result(ctx.workspace_held >= need && ctx.workspace_held < need + step && ctx.workspace_held <= ctx.workspace_bytes,
           "workspace: the chosen algorithms need %zu bytes, the context's buffer holds %zu (limit %zu)", need,
           ctx.workspace_held, ctx.workspace_bytes);
    test_linear(&ctx);
    test_graph(&ctx);
    /* misuse is a usage error naming the shape */
    GemmDesc bad;
    gemm_desc_rm(&bad, GEMM_F16, GEMM_BF16, 8, 8, 8, 256, 256, 256);
    HpcStatus st = gemm_run(&ctx, &bad, &err);
    result(st == HPC_ERR_USAGE && strstr(err.msg, "M=8"), "f16->bf16 refused: %s", st ? err.msg : "(accepted!)");
    if (!getenv("HPC_GPU_TEST_NO_TIMING")) {   /* tools/cuemu/run.sh sets it: minutes there */
        time_gemm(&ctx, GEMM_BF16, 4096);
        time_gemm(&ctx, GEMM_F16, 4096);
    }
    gemm_free(&ctx);
}

/* gemm_prime (runtime/cuda/gemm_prime.c): every case's call recorded under
 * record_only, the plans and first calls made ahead on 4 threads, then every
 * case run for real against its reference with no plan added.  Three
 * rounds: an empty tuning cache (plans made, and timed, while recording),
 * the cache that round filled (plans made by the threads), and that cache
 * with every algorithm garbled (cuBLASLt's check fails on the threads:
 * made on the calling thread the ordinary way, and still right). */
static void test_prime(void)
{
    enum { NCASE = sizeof gemm_cases / sizeof gemm_cases[0] };
    static const char *round_name[3] = {"empty tuning cache", "warm tuning cache", "garbled tuning cache"};
    const char *outer = getenv("HPC_CACHE_DIR");
    char saved[4096], fresh[] = "/tmp/hpc-gpu-prime-XXXXXX";
    snprintf(saved, sizeof saved, "%s", outer ? outer : "");
    if (!mkdtemp(fresh)) {
        result(0, "gemm_prime: mkdtemp failed");
        return;
    }
    setenv("HPC_CACHE_DIR", fresh, 1);
    /* the check is of the tuning cache, so tuning is on whatever the caller
     * set (tools/cuemu/run.sh turns it off) */
    const char *tune = getenv("HPC_GEMM_AUTOTUNE");
    char saved_tune[16];
    snprintf(saved_tune, sizeof saved_tune, "%s", tune ? tune : "");
    setenv("HPC_GEMM_AUTOTUNE", "1", 1);
    for (int round = 0; round < 3; round++) {
        GemmContext ctx;
        HpcError err;
        if (!ok_status(gemm_init(&ctx, g_dev.stream, 0, &err), &err, "gemm_init (gemm_prime)")) break;
        if (round == 2)
            for (int i = 0; i < ctx.tune.n; i++) memset(ctx.tune.e[i].algo, 0xFF, GEMM_TUNE_ALGO_BYTES);
        GemmShape shape[NCASE];
        GemmData data[NCASE];
        size_t made = 0;
        HpcStatus st = HPC_OK;
        ctx.record_only = true;
        for (; made < NCASE && !st; made++) {
            GemmDesc desc;
            case_shape(&gemm_cases[made], &shape[made]);
            gemm_data_make(&gemm_cases[made], &shape[made], &data[made]);
            gemm_desc_for(&gemm_cases[made], &shape[made], &data[made], &desc);
            st = gemm_run(&ctx, &desc, &err);
        }
        ctx.record_only = false;
        int plans = ctx.num_plans;
        GemmPrimeStats ps;
        if (!st) st = gemm_prime(&ctx, g_dev.ctx, 4, &ps, &err);
        if (!st) st = sync_stream(&err);
        if (ok_status(st, &err, round_name[round])) {
            bool where = round == 0   ? ps.made == 0 && ps.made_here == 0
                         : round == 1 ? ps.made > 0 && ps.made_here == 0
                                      : ps.made == 0 && ps.made_here > 0;
            result(ps.calls == plans && where,
                   "gemm_prime, %s: %d first calls for %d plans on %d threads; plans made there %d, on the caller %d",
                   round_name[round], ps.calls, plans, ps.threads, ps.made, ps.made_here);
            for (size_t i = 0; i < NCASE; i++) gemm_check(&ctx, &gemm_cases[i]);
            result(ctx.num_plans == plans, "gemm_prime, %s: the %d cases ran on the primed plans (%d plans now)",
                   round_name[round], (int)NCASE, ctx.num_plans);
        }
        for (size_t i = 0; i < made; i++) gemm_data_free(&data[i]);
        gemm_free(&ctx);
    }
    if (saved[0]) setenv("HPC_CACHE_DIR", saved, 1);
    else unsetenv("HPC_CACHE_DIR");
    if (saved_tune[0]) setenv("HPC_GEMM_AUTOTUNE", saved_tune, 1);
    else unsetenv("HPC_GEMM_AUTOTUNE");
}

/* ---- memory ------------------------------------------------------------------- */

static void test_memory(void)
{
    DeviceArena a;
    HpcError err;
    ArenaStats s0, s1;
    size_t gib = (size_t)1 << 30;
    if (!ok_status(arena_init(&a, "test arena", gib, &err), &err, "arena_init 1 GiB")) return;
    CUdeviceptr p = arena_ptr(&a, 4096, 256);
    result(p == a.base + 4096, "arena_ptr offsets from the base");
    HpcStatus st = CUDA_CHECK(&err, cu->cuMemsetD8(arena_ptr(&a, gib - 256, 256), 7, 256));
    ok_status(st, &err, "memset at the arena's end");
    arena_stats(&a, &s0);
    CUdeviceptr x, y;
    st = arena_alloc(&a, &x, 100 << 20, "odd 100 MiB", &err);
    if (!st) st = arena_alloc(&a, &y, 50 << 20, "odd 50 MiB", &err);
    if (!ok_status(st, &err, "arena_alloc")) return;
    arena_release(&a, x);
    arena_stats(&a, &s1);
    result(s1.arena_bytes == gib && s1.odd_bytes == (50u << 20) && s1.peak_bytes == gib + (150u << 20),
           "figures: arena %zu, odd %zu, peak %zu bytes", s1.arena_bytes, s1.odd_bytes, s1.peak_bytes);
    result(s0.device_total > 0 && s0.device_free > 0 && s0.device_free < s0.device_total,
           "device memory: %.1f GiB free of %.1f GiB", s0.device_free / 1073741824.0,
           s0.device_total / 1073741824.0);
    printf("info  device free before odd buffers %.3f GiB, after %.3f GiB\n",
           s0.device_free / 1073741824.0, s1.device_free / 1073741824.0);
    arena_free(&a);

    /* out of memory names the request, the free memory and the remedy */
    CUdeviceptr huge;
    st = arena_alloc_raw(&huge, (size_t)1 << 50, "activations", &err);
    result(st == HPC_ERR_OOM && strstr(err.msg, "activations") && strstr(err.msg, "GiB free") &&
               strstr(err.msg, "smaller batch"),
           "1 PiB allocation: %s", st ? err.msg : "(succeeded!)");
}

int main(void)
{
    gpu_check_flush = 1;   /* long runs: each line reaches the log at once */
    HpcError err;
    char cache[] = "/tmp/hpc-gpu-runtime-XXXXXX";
    if (!mkdtemp(cache)) return HPC_ERR_IO;
    setenv("HPC_CACHE_DIR", cache, 1);   /* a fresh cache: the first compile must miss */
    if (cuda_device_open(&g_dev, 0, &err)) {
        fprintf(stderr, "gpu_runtime: %s\n", err.msg);
        return err.code;
    }
    cu = cuda_driver();
    printf("info  device 0: %s, sm_%d, %d SMs, %.1f GiB, driver %d, NVRTC %d\n", g_dev.name,
           g_dev.arch, g_dev.sm_count, g_dev.total_mem / 1073741824.0, g_dev.driver_version,
           nvrtc_version_number());
    if (!ok_status(arena_init(&g_arena, "test buffers", 0, &err), &err, "arena_init 0")) return 1;
    test_kernel();
    test_gemms();
    test_prime();
    test_memory();
    ArenaStats s;
    arena_stats(&g_arena, &s);
    printf("info  test buffers: peak %.1f MiB outside the arena\n", s.peak_bytes / 1048576.0);
    arena_free(&g_arena);
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
