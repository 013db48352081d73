/* tests/gpu/gpu_gemm.c — hpc's own GEMM (compiler/kernels/gemm_wgmma.cu,
 * wgmma on sm_90a) against a host reference, then timed beside cuBLASLt
 * (the GEMM the step runs today, with its bias epilogue) at BERT-base's
 * linear-layer shapes.
 *
 * Checks: C = A W^T + bias (f16 out, f32 accumulate) for shapes from one
 * 128 x 128 tile with one k tile to several tiles each way and more k
 * tiles than the ring has stages; A, W, bias random in [-1, 1] rounded to
 * f16 (bias f32), C poisoned with NaN first.  Error = ||got - ref||_2 /
 * ||ref||_2 against a double reference of the rounded inputs; limit 2e-3
 * (f16 output rounding is 2^-11 relative; f32 sums over K <= 1024 add far
 * less); a NaN fails.
 *
 * Timing (on a GPU; HPC_GPU_TEST_NO_TIMING=1 skips it, as tools/cuemu/run.sh
 * does): median of 20 of each kernel alone, CUDA events, at M = 4096 and
 * 32768 tokens: TFLOP/s of ours and of cuBLASLt's (its choice, bias
 * epilogue).  Printed, not checked: the numbers decide what comes next.
 *
 * Exit 0 when every check passes, 1 on a failure, 4 without an sm_90 GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/half.h"
#include "cuda/cuda_driver.h"
#include "cuda/gemm_cublas.h"
#include "cuda/nvrtc_compile.h"
#include "gpu_check.h"
#include "kernel_sources.h"

enum { TILE = 128, KTILE = 64, THREADS = 256 };

static CudaDevice g_dev;
static CUfunction g_fn;
static int g_smem_bytes;

#define DRV(call)                                                                                            \
    do {                                                                                                     \
        HpcError e_ = {0};                                                                                   \
        if (CUDA_CHECK(&e_, call)) {                                                                         \
            printf("FAIL  %s: %s\n", #call, e_.msg);                                                         \
            exit(1);                                                                                         \
        }                                                                                                    \
    } while (0)

/* GW_SMEM_BYTES of the kernel source: stages x (128 + 128) x 64 x 2 + 1024. */
static int smem_bytes_of(const char *src)
{
    const char *p = strstr(src, "#define GW_STAGES ");
    int stages = p ? atoi(p + strlen("#define GW_STAGES ")) : 0;
    return stages * (TILE + TILE) * KTILE * 2 + 1024;
}

static void load_kernel(void)
{
    const char *src = kernel_source_find("gemm_wgmma.cu");
    if (!src) {
        printf("FAIL  gemm_wgmma.cu is not among the embedded kernel sources\n");
        exit(1);
    }
    const char *opts[] = {"--gpu-architecture=sm_90a"};
    void *cubin;
    size_t size;
    char *log = NULL;
    HpcError err = {0};
    if (nvrtc_compile(src, "gemm_wgmma", 90, opts, 1, &cubin, &size, &log, &err)) {
        printf("FAIL  nvrtc_compile gemm_wgmma: %s\n%s\n", err.msg, log ? log : "");
        exit(1);
    }
    free(log);
    CUmodule mod;
    DRV(cuda_driver()->cuModuleLoadData(&mod, cubin));
    free(cubin);
    DRV(cuda_driver()->cuModuleGetFunction(&g_fn, mod, "gemm_wgmma_bias_f16"));
    g_smem_bytes = smem_bytes_of(src);
    DRV(cuda_driver()->cuFuncSetAttribute(g_fn, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, g_smem_bytes));
}

static void launch(CUdeviceptr c, CUdeviceptr a, CUdeviceptr w, CUdeviceptr bias, int m, int n, int k)
{
    void *args[] = {&c, &a, &w, &bias, &m, &n, &k};
    HpcError err = {0};
    if (cuda_launch(g_fn, (unsigned[3]){(unsigned)(n / TILE), (unsigned)(m / TILE), 1}, (unsigned[3]){THREADS, 1, 1},
                    (unsigned)g_smem_bytes, g_dev.stream, args, &err)) {
        printf("FAIL  launch gemm_wgmma_bias_f16 %d x %d x %d: %s\n", m, n, k, err.msg);
        exit(1);
    }
}

static float uniform(uint64_t *rng) { return gpu_check_uniform24((uint32_t)(gpu_check_xorshift(rng) >> 40)); }

static void check_shape(int m, int n, int k, uint64_t seed)
{
    const CudaDriver *cu = cuda_driver();
    uint16_t *a = malloc((size_t)m * k * 2), *w = malloc((size_t)n * k * 2), *c = malloc((size_t)m * n * 2);
    float *bias = malloc((size_t)n * 4);
    double *ref = malloc((size_t)m * n * sizeof *ref);
    uint64_t rng = seed;
    for (size_t i = 0; i < (size_t)m * k; i++) a[i] = half_from_f32(uniform(&rng));
    for (size_t i = 0; i < (size_t)n * k; i++) w[i] = half_from_f32(uniform(&rng));
    for (int i = 0; i < n; i++) bias[i] = uniform(&rng);
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double s = bias[j];
            for (int q = 0; q < k; q++) s += (double)half_to_f32(a[(size_t)i * k + q]) * half_to_f32(w[(size_t)j * k + q]);
            ref[(size_t)i * n + j] = s;
        }
    CUdeviceptr da, dw, db, dc;
    DRV(cu->cuMemAlloc(&da, (size_t)m * k * 2));
    DRV(cu->cuMemAlloc(&dw, (size_t)n * k * 2));
    DRV(cu->cuMemAlloc(&db, (size_t)n * 4));
    DRV(cu->cuMemAlloc(&dc, (size_t)m * n * 2));
    DRV(cu->cuMemcpyHtoD(da, a, (size_t)m * k * 2));
    DRV(cu->cuMemcpyHtoD(dw, w, (size_t)n * k * 2));
    DRV(cu->cuMemcpyHtoD(db, bias, (size_t)n * 4));
    DRV(cu->cuMemsetD8(dc, 0xFF, (size_t)m * n * 2));   /* NaN in f16 */
    launch(dc, da, dw, db, m, n, k);
    DRV(cu->cuStreamSynchronize(g_dev.stream));
    DRV(cu->cuMemcpyDtoH(c, dc, (size_t)m * n * 2));
    double num = 0, den = 0;
    int nan = 0;
    for (size_t i = 0; i < (size_t)m * n; i++) {
        double got = half_to_f32(c[i]);
        if (got != got) nan++;
        num += (got - ref[i]) * (got - ref[i]);
        den += ref[i] * ref[i];
    }
    double rel = sqrt(num / den);
    result(nan == 0 && rel <= 2e-3, "gemm_wgmma_bias_f16 M=%d N=%d K=%d: rel L2 %.2e <= 2e-3, %d NaN", m, n, k,
           rel, nan);
    cu->cuMemFree(da);
    cu->cuMemFree(dw);
    cu->cuMemFree(db);
    cu->cuMemFree(dc);
    free(a);
    free(w);
    free(c);
    free(bias);
    free(ref);
}

/* ---- timing ----------------------------------------------------------------- */

static int cmp_float(const void *x, const void *y)
{
    float a = *(const float *)x, b = *(const float *)y;
    return (a > b) - (a < b);
}

/* Median ms of 20 runs of ours (cublas 0) or cuBLASLt's (1). */
static float time_one(GemmContext *g, int cublas, int m, int n, int k, CUdeviceptr a, CUdeviceptr w,
                      CUdeviceptr b32, CUdeviceptr b16, CUdeviceptr c)
{
    const CudaDriver *cu = cuda_driver();
    GemmDesc desc;
    gemm_desc_linear(&desc, GEMM_F16, GEMM_F16, m, n, k, a, w, b16, c);
    CUevent e0, e1;
    DRV(cu->cuEventCreate(&e0, CU_EVENT_DEFAULT));
    DRV(cu->cuEventCreate(&e1, CU_EVENT_DEFAULT));
    float ms[20];
    for (int r = -3; r < 20; r++) {
        HpcError err = {0};
        DRV(cu->cuEventRecord(e0, g_dev.stream));
        if (cublas) {
            if (gemm_run(g, &desc, &err)) {
                printf("FAIL  cuBLASLt %d x %d x %d: %s\n", m, n, k, err.msg);
                return -1;
            }
        } else {
            launch(c, a, w, b32, m, n, k);
        }
        DRV(cu->cuEventRecord(e1, g_dev.stream));
        DRV(cu->cuEventSynchronize(e1));
        if (r >= 0) DRV(cu->cuEventElapsedTime(&ms[r], e0, e1));
    }
    cu->cuEventDestroy(e0);
    cu->cuEventDestroy(e1);
    qsort(ms, 20, sizeof ms[0], cmp_float);
    return 0.5f * (ms[9] + ms[10]);
}

static void run_timing(void)
{
    static const int shapes[][3] = {
        {4096, 2304, 768}, {4096, 768, 768}, {4096, 3072, 768}, {4096, 768, 3072},        /* B32 L128 */
        {32768, 2304, 768}, {32768, 768, 768}, {32768, 3072, 768}, {32768, 768, 3072},    /* B256 L128 */
    };
    const CudaDriver *cu = cuda_driver();
    GemmContext g;
    HpcError err = {0};
    if (gemm_init(&g, g_dev.stream, 0, &err)) {
        printf("FAIL  gemm_init: %s\n", err.msg);
        return;
    }
    CUdeviceptr a, w, b32, b16, c;
    DRV(cu->cuMemAlloc(&a, (size_t)32768 * 3072 * 2));
    DRV(cu->cuMemAlloc(&w, (size_t)3072 * 3072 * 2));
    DRV(cu->cuMemAlloc(&b32, 3072 * 4));
    DRV(cu->cuMemAlloc(&b16, 3072 * 2));
    DRV(cu->cuMemAlloc(&c, (size_t)32768 * 3072 * 2));
    DRV(cu->cuMemsetD8(a, 0x3c, (size_t)32768 * 3072 * 2));   /* small finite values */
    DRV(cu->cuMemsetD8(w, 0x1c, (size_t)3072 * 3072 * 2));
    DRV(cu->cuMemsetD8(b32, 0, 3072 * 4));
    DRV(cu->cuMemsetD8(b16, 0, 3072 * 2));
    printf("      timing (median of 20, each kernel alone): M x N x K: ours ms (TFLOP/s) | cuBLASLt bias ms (TFLOP/s)\n");
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        int m = shapes[i][0], n = shapes[i][1], k = shapes[i][2];
        float ours = time_one(&g, 0, m, n, k, a, w, b32, b16, c);
        float lt = time_one(&g, 1, m, n, k, a, w, b32, b16, c);
        double flop = 2.0 * m * n * k;
        printf("      %5d x %4d x %4d: %7.3f ms (%5.0f) | %7.3f ms (%5.0f)\n", m, n, k, ours,
               flop / (ours * 1e-3) / 1e12, lt, flop / (lt * 1e-3) / 1e12);
    }
    cu->cuMemFree(a);
    cu->cuMemFree(w);
    cu->cuMemFree(b32);
    cu->cuMemFree(b16);
    cu->cuMemFree(c);
    gemm_free(&g);
}

int main(void)
{
    if (!gpu_check_open_device("gpu_gemm", &g_dev)) return 4;
    if (g_dev.arch != 90) {
        printf("gpu_gemm: wgmma needs an sm_90 GPU; this is sm_%d\n", g_dev.arch);
        return 4;
    }
    printf("gpu_gemm on %s (sm_%d)\n", g_dev.name, g_dev.arch);
    load_kernel();
    check_shape(128, 128, 64, 1);      /* one tile, one k tile */
    check_shape(128, 128, 320, 2);     /* more k tiles than stages */
    check_shape(256, 384, 192, 3);     /* tiles each way */
    check_shape(384, 768, 768, 4);     /* BERT-base's width */
    if (!getenv("HPC_GPU_TEST_NO_TIMING")) run_timing();
    cuda_device_close(&g_dev);
    return gpu_check_summary();
}
