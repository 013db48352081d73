/* bench/mem_probe.c — where a BERT-base training step's device memory goes.
 *
 * Issue #15 asks that the plan's memory figure be within 5% of what the
 * device reports (cuMemGetInfo).  This program prints, in MiB, the device
 * memory in use above the bare primary context after each phase of one
 * run, beside the figures hpc itself counts, and three experiments that
 * explain the difference:
 *
 *   alloc   how much cuMemAlloc really takes for 32 buffers of a size
 *           (the driver's page rounding), for the sizes of BERT-base's
 *           parameter tensors;
 *   open    train_backend_open (plan arena, parameters, optimizer state,
 *           step module, cuBLASLt), then after 1 and 11 steps (kernels
 *           loaded lazily, local memory, the CUDA graph);
 *   lmem    the step module's kernels with local memory
 *           (CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES), then what launching a
 *           kernel of 256 B / 1 KiB / 4 KiB of local memory per thread adds
 *           (the driver's reservation for SMs x threads per SM).
 *
 * With `lmem` after the shape, only the local-memory launches (0, 40,
 * 256, 512, 1 KiB, 4 KiB per thread) in a context that has run nothing.
 * With `gemm` after the shape, first a cuBLASLt context of its own
 * (gemm_init, then gemm_free): what cuBLASLt takes, what stays after.
 *
 * Usage: mem_probe [BxL [gemm|lmem]] (default 32x128), fp16.  Exit 0, 1 on an error,
 * 4 without a GPU.  Not part of `make test`: an H200 measurement tool. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/step_program_build.h"
#include "cuda/cuda_driver.h"
#include "cuda/gemm_cublas.h"
#include "cuda/nvrtc_compile.h"
#include "data/batch.h"
#include "program/spec.h"
#include "train/train_backend.h"

#define MIB (1024.0 * 1024.0)

static size_t g_free0;   /* free bytes with only the context */

static double used_mib(void)
{
    size_t f = 0, t = 0;
    HpcError e = {0};
    if (cuda_mem_info(&f, &t, &e)) return -1;
    return ((double)g_free0 - (double)f) / MIB;
}

/* cuMemAlloc of n buffers of `bytes`: device memory taken per buffer. */
static void alloc_experiment(size_t bytes, int n)
{
    const CudaDriver *cu = cuda_driver();
    CUdeviceptr p[64];
    double before = used_mib();
    int got = 0;
    for (; got < n && got < 64; got++)
        if (cu->cuMemAlloc(&p[got], bytes) != CUDA_SUCCESS) break;
    double taken = used_mib() - before;
    for (int i = 0; i < got; i++) cu->cuMemFree(p[i]);
    printf("alloc  %2d x %9zu B (%7.3f MiB): device %8.3f MiB, %7.3f MiB each (%.2fx)\n", got, bytes,
           (double)bytes / MIB, taken, taken / got, taken * MIB / ((double)bytes * got));
}

/* A batch of token ids in [1000, vocab), never zeros. */
static Batch *probe_batch(const ModelSpec *s, int64_t B, int64_t L)
{
    Batch *b = batch_new(B, L, false);
    uint32_t x = 12345;
    for (int64_t i = 0; i < B * L; i++) {
        x = x * 1664525u + 1013904223u;
        b->input_ids[i] = (int32_t)(1000 + (x >> 8) % (uint32_t)(s->stack.vocab_size - 1000));
        b->token_type_ids[i] = 0;
        b->attention_mask[i] = 1;
    }
    for (int64_t r = 0; r < B; r++) b->labels[r] = (int32_t)(r % 2);
    return b;
}

static HpcStatus steps(TrainBackend *be, const Batch *b, int n, HpcError *err)
{
    TrainStepStat st[TRAIN_STAT_RING];
    int got = 0;
    HpcStatus s = HPC_OK;
    for (int i = 0; i < n && !s; i++) {
        s = be->micro(be, b, 0, err);
        if (!s) s = be->step(be, false, err);
    }
    return s ? s : be->collect(be, st, TRAIN_STAT_RING, &got, err);
}

/* The step module's local memory, per kernel: the module compiled again
 * (the disk cache's hit) and loaded a second time. */
static HpcStatus module_lmem(const ModelSpec *spec, int arch, HpcError *err)
{
    typedef CUresult (*CountFn)(unsigned *, CUmodule);
    typedef CUresult (*EnumFn)(CUfunction *, unsigned, CUmodule);
    typedef CUresult (*NameFn)(const char **, CUfunction);
    const CudaDriver *cu = cuda_driver();
    CountFn count = (CountFn)dlsym(cu->lib, "cuModuleGetFunctionCount");
    EnumFn enumerate = (EnumFn)dlsym(cu->lib, "cuModuleEnumerateFunctions");
    NameFn name = (NameFn)dlsym(cu->lib, "cuFuncGetName");
    StepProgram prog;
    HpcStatus st = step_program_compile(spec, PREC_FP16, true, &prog, err);
    if (st) return st;
    void *cubin = NULL;
    size_t size = 0;
    NvrtcCacheInfo info;
    st = nvrtc_compile_cached(prog.kernels.cuda_source, "hpc_ops", arch, NULL, 0, &cubin, &size, &info, err);
    step_program_free(&prog);
    if (st) return st;
    double before = used_mib();
    CUmodule m;
    st = CUDA_CHECK(err, cu->cuModuleLoadData(&m, cubin));
    free(cubin);
    if (st) return st;
    printf("lmem   step module: cubin %.2f MiB; a second copy loaded: +%.2f MiB\n", (double)size / MIB,
           used_mib() - before);
    unsigned n = 0;
    if (!count || !enumerate || !name || count(&n, m) != CUDA_SUCCESS) {
        printf("lmem   this driver has no cuModuleEnumerateFunctions: kernels not listed\n");
        cu->cuModuleUnload(m);
        return HPC_OK;
    }
    CUfunction *f = xcalloc(n + 1, sizeof *f);
    int max_local = 0, with_local = 0, groups = 0;
    struct { char stem[96]; int local, count; } group[32];   /* kernels with local memory, by name less its hash */
    if (enumerate(f, n, m) == CUDA_SUCCESS)
        for (unsigned i = 0; i < n; i++) {
            int local = 0;
            const char *nm = "?";
            cu->cuFuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, f[i]);
            name(&nm, f[i]);
            if (local > max_local) max_local = local;
            if (local == 0) continue;
            with_local++;
            char stem[96];
            snprintf(stem, sizeof stem, "%s", nm);
            size_t len = strlen(stem);
            if (len > 7 && stem[len - 7] == '_') stem[len - 7] = '\0';
            int k = 0;
            while (k < groups && !(strcmp(group[k].stem, stem) == 0 && group[k].local == local)) k++;
            if (k == groups && groups < 32) {
                snprintf(group[groups].stem, sizeof group[groups].stem, "%s", stem);
                group[groups].local = local;
                group[groups++].count = 0;
            }
            if (k < groups) group[k].count++;
        }
    for (int k = 0; k < groups; k++)
        printf("lmem   %3d x %-44s %4d B local per thread\n", group[k].count, group[k].stem, group[k].local);
    printf("lmem   %u kernels, %d with local memory, the most %d B per thread; after touching them: +%.2f MiB\n", n,
           with_local, max_local, used_mib() - before);
    free(f);
    cu->cuModuleUnload(m);
    return HPC_OK;
}

/* What a kernel with `bytes` of local memory per thread (0: none) adds
 * when launched. */
static HpcStatus lmem_experiment(int arch, int bytes, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    char src[512];
    int n = bytes / 4;
    if (n > 0)
        snprintf(src, sizeof src,
                 "extern \"C\" __global__ void lm(float *out, int k) {\n"
                 "  volatile float a[%d];\n"
                 "  for (int i = 0; i < %d; i++) a[i] = (float)(i * k);\n"
                 "  out[threadIdx.x] = a[(k + threadIdx.x) %% %d];\n}\n", n, n, n);
    else
        snprintf(src, sizeof src, "extern \"C\" __global__ void lm(float *out, int k) { out[threadIdx.x] = k; }\n");
    void *cubin = NULL;
    size_t size = 0;
    HpcStatus st = nvrtc_compile(src, "lmem_probe", arch, NULL, 0, &cubin, &size, NULL, err);
    CUmodule m;
    CUfunction fn;
    if (!st) st = CUDA_CHECK(err, cu->cuModuleLoadData(&m, cubin));
    free(cubin);
    if (st) return st;
    double before = used_mib();
    int local = 0;
    CUdeviceptr out = 0;
    st = CUDA_CHECK(err, cu->cuModuleGetFunction(&fn, m, "lm"));
    if (!st) st = CUDA_CHECK(err, cu->cuFuncGetAttribute(&local, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, fn));
    if (!st) st = CUDA_CHECK(err, cu->cuMemAlloc(&out, 4096));
    double mid = used_mib();
    int k = 3;
    void *args[] = {&out, &k};
    if (!st) st = CUDA_CHECK(err, cu->cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, NULL, args, NULL));
    if (!st) st = CUDA_CHECK(err, cu->cuCtxSynchronize());
    double after = used_mib();
    if (!st)
        printf("lmem   a kernel of %4d B local per thread (attribute %4d B): launch adds %8.2f MiB, now %8.2f "
               "(module+buffer %.2f)\n", bytes, local, after - mid, after, mid - before);
    if (out) cu->cuMemFree(out);
    cu->cuModuleUnload(m);
    return st;
}

static const int lmem_sizes[] = {0, 40, 256, 512, 1024, 4096};

/* The context's stack-size, printf and heap limits (cuCtxGetLimit). */
static void print_limits(const char *when)
{
    typedef CUresult (*LimitFn)(size_t *, CUlimit);
    LimitFn get = (LimitFn)dlsym(cuda_driver()->lib, "cuCtxGetLimit");
    size_t stack = 0, fifo = 0, heap = 0;
    if (!get || get(&stack, CU_LIMIT_STACK_SIZE) || get(&fifo, CU_LIMIT_PRINTF_FIFO_SIZE) ||
        get(&heap, CU_LIMIT_MALLOC_HEAP_SIZE)) {
        printf("limits %s: cuCtxGetLimit failed\n", when);
        return;
    }
    printf("limits %s: stack %zu B per thread, printf fifo %.1f MiB, malloc heap %.1f MiB\n", when, stack,
           (double)fifo / MIB, (double)heap / MIB);
}

int main(int argc, char **argv)
{
    long long B = 32, L = 128;
    if (argc > 1 && sscanf(argv[1], "%lldx%lld", &B, &L) != 2) {
        fprintf(stderr, "usage: mem_probe [BxL [gemm|lmem]]\n");
        return 1;
    }
    HpcError err = {0};
    CudaDevice dev;
    if (cuda_device_open(&dev, 0, &err)) {
        fprintf(stderr, "mem_probe: %s\n", err.msg);
        return err.code == HPC_ERR_NO_GPU ? 4 : 1;
    }
    size_t total = 0;
    int threads_per_sm = 0;
    cuda_mem_info(&g_free0, &total, &err);
    cuda_driver()->cuDeviceGetAttribute(&threads_per_sm, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR, dev.dev);
    printf("device %s, %d SMs x %d threads; with the context: %.1f MiB used of %.1f\n", dev.name, dev.sm_count,
           threads_per_sm, (double)(total - g_free0) / MIB, (double)total / MIB);
    const size_t sizes[] = {3072, 1179648, 2359296, 4718592, 9437184, 2 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) alloc_experiment(sizes[i], 32);

    print_limits("with the context");
    if (argc > 2 && strcmp(argv[2], "lmem") == 0) {   /* in a fresh context, nothing else */
        HpcStatus st = HPC_OK;
        for (size_t i = 0; i < sizeof lmem_sizes / sizeof lmem_sizes[0] && !st; i++)
            st = lmem_experiment(dev.arch, lmem_sizes[i], &err);
        if (st) fprintf(stderr, "mem_probe: %s\n", err.msg);
        print_limits("after the launches");
        cuda_device_close(&dev);
        return st ? 1 : 0;
    }
    if (argc > 2 && strcmp(argv[2], "gemm") == 0) {
        GemmContext g;
        if (gemm_init(&g, dev.stream, 0, &err)) {
            fprintf(stderr, "mem_probe: %s\n", err.msg);
            return 1;
        }
        printf("gemm   cuBLASLt handle + %.0f MiB workspace: %.1f MiB\n", (double)GEMM_DEFAULT_WORKSPACE / MIB,
               used_mib());
        gemm_free(&g);
        printf("gemm   after gemm_free: %.1f MiB\n", used_mib());
    }
    ModelSpec spec;
    spec_defaults(&spec);
    snprintf(spec.name, sizeof spec.name, "bert_base");
    TrainBackend be;
    HpcStatus st = train_backend_open(&be, TRAIN_DEVICE_CUDA, &spec, PREC_FP16, true, 100000, B, L, &err);
    if (st) {
        fprintf(stderr, "mem_probe: %s\n", err.msg);
        return 1;
    }
    printf("open   %lldx%lld fp16: device %.1f MiB above the context; hpc counts %.1f MiB (arena peak)\n", B, L,
           used_mib(), be.peak_bytes(&be) / MIB);
    Batch *b = probe_batch(&spec, B, L);
    st = steps(&be, b, 1, &err);
    if (!st) printf("step   after 1 step: %.1f MiB; hpc counts %.1f\n", used_mib(), be.peak_bytes(&be) / MIB);
    if (!st) st = steps(&be, b, 10, &err);
    if (!st) printf("step   after 11 steps: %.1f MiB; hpc counts %.1f\n", used_mib(), be.peak_bytes(&be) / MIB);
    if (!st) print_limits("after the steps");
    if (!st) st = module_lmem(&spec, dev.arch, &err);
    for (size_t i = 2; i < sizeof lmem_sizes / sizeof lmem_sizes[0] && !st; i++)
        st = lmem_experiment(dev.arch, lmem_sizes[i], &err);
    batch_free(b);
    train_backend_close(&be);
    printf("close  after the backend's close: %.1f MiB still used\n", used_mib());
    if (st) fprintf(stderr, "mem_probe: %s\n", err.msg);
    cuda_device_close(&dev);
    return st ? 1 : 0;
}
