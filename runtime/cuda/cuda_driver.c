/* runtime/cuda/cuda_driver.c — see cuda_driver.h. */
#include "cuda/cuda_driver.h"

#include "cuda/cublaslt_load.h"
#include "util/phase_clock.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- loading ---------------------------------------------------------- */

static CudaDriver g_driver;
static bool g_cublaslt_ahead;   /* cuda_device_open_ahead asked for cuBLASLt too */
static HpcError g_load_error;
static HpcStatus g_load_status = HPC_ERR_INTERNAL;
static pthread_once_t g_load_once = PTHREAD_ONCE_INIT;

#define CUDA_DRIVER_STR_(x) #x
#define CUDA_DRIVER_STR(x) CUDA_DRIVER_STR_(x)

/* Resolves one symbol; the name is <cuda.h>'s expansion of the API name
 * (cuMemAlloc -> "cuMemAlloc_v2"), which is the ABI the prototypes match. */
static HpcStatus resolve(void *lib, const char *symbol, void **slot, HpcError *err)
{
    *slot = dlsym(lib, symbol);
    if (*slot) return HPC_OK;
    return hpc_fail(err, HPC_ERR_NO_GPU,
                    "the CUDA driver %s lacks the function %s: it is older than hpc needs "
                    "(built against CUDA %d.%d); update the NVIDIA driver",
                    g_driver.path, symbol, CUDA_VERSION / 1000, CUDA_VERSION % 1000 / 10);
}

static HpcStatus open_library(HpcError *err)
{
    const char *path = getenv("HPC_CUDA_DRIVER");
    if (!path || !*path) path = "libcuda.so.1";
    snprintf(g_driver.path, sizeof g_driver.path, "%s", path);
    g_driver.lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (g_driver.lib) return HPC_OK;
    const char *why = dlerror();
    return hpc_fail(err, HPC_ERR_NO_GPU,
                    "no CUDA driver: cannot load %s (%s). The cuda backend needs the NVIDIA "
                    "driver: install it (`nvidia-smi` should then list a GPU), set "
                    "HPC_CUDA_DRIVER to the full path of libcuda.so.1 if it is installed "
                    "elsewhere, or use the cpu backend",
                    path, why ? why : "unknown reason");
}

static HpcStatus init_driver(HpcError *err)
{
    CUresult r = g_driver.cuInit(0);
    if (r == CUDA_SUCCESS) return HPC_OK;
    if (r == CUDA_ERROR_NO_DEVICE)
        return hpc_fail(err, HPC_ERR_NO_GPU,
                        "the CUDA driver (%s) found no GPU: cuInit(0) returned "
                        "CUDA_ERROR_NO_DEVICE. Check `nvidia-smi`, CUDA_VISIBLE_DEVICES, and "
                        "that /dev/nvidia* exist (containers need --gpus), or use the cpu backend",
                        g_driver.path);
    HpcStatus st = cuda_check_cu(r, "cuInit(0)", __FILE__, __LINE__, err);
    if (err) err->code = HPC_ERR_NO_GPU;
    return st == HPC_OK ? HPC_OK : HPC_ERR_NO_GPU;
}

static void load_once(void)
{
    HpcError *err = &g_load_error;
    g_load_status = open_library(err);
    if (g_load_status) return;
    /* Opening ahead and a driver is there: cuBLASLt's initialisers (0.1 s)
     * on another thread while cuInit runs here (never on machines without
     * a driver: CI). */
    if (g_cublaslt_ahead) cublaslt_load_ahead();
#define CUDA_DRIVER_RESOLVE(name)                                                         \
    if (!g_load_status)                                                                   \
        g_load_status = resolve(g_driver.lib, CUDA_DRIVER_STR(name), (void **)&g_driver.name, err);
    CUDA_DRIVER_FUNCTIONS(CUDA_DRIVER_RESOLVE)
#undef CUDA_DRIVER_RESOLVE
    if (!g_load_status) g_load_status = init_driver(err);
    if (!g_load_status && g_driver.cuDriverGetVersion(&g_driver.version) != CUDA_SUCCESS)
        g_driver.version = 0;
    if (g_load_status) {
        dlclose(g_driver.lib);
        g_driver.lib = NULL;
    }
}

HpcStatus cuda_driver_load(HpcError *err)
{
    pthread_once(&g_load_once, load_once);
    if (g_load_status && err) *err = g_load_error;
    return g_load_status;
}

const CudaDriver *cuda_driver(void)
{
    return g_driver.lib && g_load_status == HPC_OK ? &g_driver : NULL;
}

/* ---- devices ---------------------------------------------------------- */

HpcStatus cuda_device_count(int *count, HpcError *err)
{
    *count = 0;
    HpcStatus st = cuda_driver_load(err);
    if (st) return st;
    return CUDA_CHECK(err, g_driver.cuDeviceGetCount(count));
}

static HpcStatus device_attr(const CudaDevice *d, CUdevice_attribute a, int *v, HpcError *err)
{
    return CUDA_CHECK(err, g_driver.cuDeviceGetAttribute(v, a, d->dev));
}

HpcStatus cuda_device_query(CudaDevice *d, int ordinal, HpcError *err)
{
    memset(d, 0, sizeof *d);
    d->ordinal = ordinal;
    int count;
    HpcStatus st = cuda_device_count(&count, err);
    if (st) return st;
    if (ordinal < 0 || ordinal >= count)
        return hpc_fail(err, HPC_ERR_NO_GPU,
                        "CUDA device %d does not exist: the driver sees %d device%s "
                        "(CUDA_VISIBLE_DEVICES=%s); pick one from `hpc devices`",
                        ordinal, count, count == 1 ? "" : "s",
                        getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
    if ((st = CUDA_CHECK(err, g_driver.cuDeviceGet(&d->dev, ordinal)))) return st;
    if ((st = CUDA_CHECK(err, g_driver.cuDeviceGetName(d->name, (int)sizeof d->name, d->dev))))
        return st;
    if ((st = device_attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, &d->cc_major, err)) ||
        (st = device_attr(d, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, &d->cc_minor, err)) ||
        (st = device_attr(d, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, &d->sm_count, err)))
        return st;
    if ((st = CUDA_CHECK(err, g_driver.cuDeviceTotalMem(&d->total_mem, d->dev)))) return st;
    d->arch = d->cc_major * 10 + d->cc_minor;
    d->driver_version = g_driver.version;
    return HPC_OK;
}

static void ahead_wait(void);

HpcStatus cuda_device_open(CudaDevice *d, int ordinal, HpcError *err)
{
    ahead_wait();   /* the open started ahead, if any, has retained the context */
    HpcStatus st = cuda_device_query(d, ordinal, err);
    if (st) return st;
    if (d->arch < CUDA_MIN_ARCH)
        return hpc_fail(err, HPC_ERR_NO_GPU,
                        "CUDA device %d (%s) has compute capability %d.%d; hpc needs %d.%d or "
                        "newer (A100, RTX 30xx, H100 and later); use another device or the cpu backend",
                        ordinal, d->name, d->cc_major, d->cc_minor,
                        CUDA_MIN_ARCH / 10, CUDA_MIN_ARCH % 10);
    if ((st = CUDA_CHECK(err, g_driver.cuDevicePrimaryCtxRetain(&d->ctx, d->dev)))) return st;
    if ((st = CUDA_CHECK(err, g_driver.cuCtxSetCurrent(d->ctx))) ||
        (st = CUDA_CHECK(err, g_driver.cuStreamCreate(&d->stream, CU_STREAM_NON_BLOCKING)))) {
        g_driver.cuDevicePrimaryCtxRelease(d->dev);
        d->ctx = NULL;
        return st;
    }
    return HPC_OK;
}

void cuda_device_close(CudaDevice *d)
{
    if (!d->ctx) return;
    if (d->stream) g_driver.cuStreamDestroy(d->stream);
    g_driver.cuDevicePrimaryCtxRelease(d->dev);
    d->stream = NULL;
    d->ctx = NULL;
}

/* One primary context kept past its device's close (see cuda_driver.h). */
static pthread_mutex_t kept_lock = PTHREAD_MUTEX_INITIALIZER;
static bool kept_ctx;
static CUdevice kept_dev;

void cuda_device_close_keep_context(CudaDevice *d)
{
    if (!d->ctx) return;
    if (d->stream) g_driver.cuStreamDestroy(d->stream);
    pthread_mutex_lock(&kept_lock);
    bool keep = !kept_ctx;
    if (keep) {
        kept_ctx = true;
        kept_dev = d->dev;
    }
    pthread_mutex_unlock(&kept_lock);
    if (!keep) g_driver.cuDevicePrimaryCtxRelease(d->dev);
    d->stream = NULL;
    d->ctx = NULL;
}

void cuda_kept_context_release(void)
{
    pthread_mutex_lock(&kept_lock);
    bool had = kept_ctx;
    kept_ctx = false;
    pthread_mutex_unlock(&kept_lock);
    if (had) g_driver.cuDevicePrimaryCtxRelease(kept_dev);
}

/* ---- opening ahead (see cuda_driver.h) ---------------------------------- */

static pthread_mutex_t ahead_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_t ahead_thread;
static bool ahead_started, ahead_running;

static void *ahead_main(void *arg)
{
    int ordinal = (int)(intptr_t)arg;
    double t0 = phase_clock_now();
    CudaDevice d;
    HpcError ignore = {0};   /* the open that waits for this thread reports */
    if (cuda_driver_load(&ignore)) return NULL;
    double t1 = phase_clock_now();
    if (cuda_device_query(&d, ordinal, &ignore) || d.arch < CUDA_MIN_ARCH) return NULL;
    CUcontext ctx;
    if (g_driver.cuDevicePrimaryCtxRetain(&ctx, d.dev) != CUDA_SUCCESS) return NULL;
    double t2 = phase_clock_now();
    pthread_mutex_lock(&kept_lock);
    bool keep = !kept_ctx;
    if (keep) {
        kept_ctx = true;
        kept_dev = d.dev;
    }
    pthread_mutex_unlock(&kept_lock);
    if (!keep) g_driver.cuDevicePrimaryCtxRelease(d.dev);
    phase_spanf(t0, t1, "GPU opened ahead: CUDA driver loaded, cuInit (%s)", g_driver.path);
    phase_spanf(t1, t2, "GPU opened ahead: device %d's primary context created", ordinal);
    return NULL;
}

static void ahead_wait(void)
{
    pthread_mutex_lock(&ahead_lock);
    if (ahead_running) {
        pthread_join(ahead_thread, NULL);
        ahead_running = false;
    }
    pthread_mutex_unlock(&ahead_lock);
}

void cuda_device_open_ahead(int ordinal)
{
    const char *off = getenv("HPC_START_OVERLAP");
    if (off && strcmp(off, "0") == 0) return;
    pthread_mutex_lock(&ahead_lock);
    if (!ahead_started) {
        ahead_started = true;
        g_cublaslt_ahead = true;
        ahead_running = pthread_create(&ahead_thread, NULL, ahead_main, (void *)(intptr_t)ordinal) == 0;
        if (ahead_running) atexit(ahead_wait);   /* a fallback: callers end with cuda_ahead_join */
    }
    pthread_mutex_unlock(&ahead_lock);
}

void cuda_ahead_join(void)
{
    ahead_wait();
    cublaslt_load_join();
}

HpcStatus cuda_mem_info(size_t *free_bytes, size_t *total_bytes, HpcError *err)
{
    *free_bytes = *total_bytes = 0;
    if (!cuda_driver())
        return hpc_fail(err, HPC_ERR_NO_GPU, "cuda_mem_info: the CUDA driver is not loaded "
                        "(call cuda_device_open first)");
    return CUDA_CHECK(err, g_driver.cuMemGetInfo(free_bytes, total_bytes));
}

HpcStatus cuda_func_allow_shared(CUfunction f, unsigned shmem, HpcError *err)
{
    if (shmem <= 48u * 1024) return HPC_OK;
    return CUDA_CHECK(err, g_driver.cuFuncSetAttribute(
                               f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, (int)shmem));
}

static _Atomic long launch_calls;
static _Atomic long long launch_ns;

static long long mono_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (long long)t.tv_sec * 1000000000LL + t.tv_nsec;
}

HpcStatus cuda_launch(CUfunction f, const unsigned grid[3], const unsigned block[3],
                      unsigned shmem, CUstream stream, void **args, HpcError *err)
{
    long long t0 = phase_clock_on() ? mono_ns() : -1;
    HpcStatus st = CUDA_CHECK(err, g_driver.cuLaunchKernel(f, grid[0], grid[1], grid[2], block[0], block[1],
                                                           block[2], shmem, stream, args, NULL));
    if (t0 >= 0) {
        launch_calls++;
        launch_ns += mono_ns() - t0;
    }
    return st;
}

void cuda_launch_stats(long *calls, double *seconds)
{
    *calls = launch_calls;
    *seconds = 1e-9 * (double)launch_ns;
}

/* ---- the checking functions --------------------------------------------- */

typedef struct {
    CUresult code;
    const char *name;
} CuName;

/* For messages when the driver (and so cuGetErrorName) is not available. */
static const CuName cu_names[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"},
    {CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED"},
    {CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH"},
    {CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"},
    {CUDA_ERROR_NO_BINARY_FOR_GPU, "CUDA_ERROR_NO_BINARY_FOR_GPU"},
    {CUDA_ERROR_INVALID_PTX, "CUDA_ERROR_INVALID_PTX"},
    {CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "CUDA_ERROR_UNSUPPORTED_PTX_VERSION"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN"},
};

const char *cuda_result_name(CUresult r)
{
    const char *name = NULL;
    if (cuda_driver() && g_driver.cuGetErrorName(r, &name) == CUDA_SUCCESS && name) return name;
    for (size_t i = 0; i < sizeof cu_names / sizeof cu_names[0]; i++)
        if (cu_names[i].code == r) return cu_names[i].name;
    return "CUDA_ERROR_(unnamed)";
}

static HpcStatus cu_class(CUresult r)
{
    switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY: return HPC_ERR_OOM;
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE: return HPC_ERR_NO_GPU;
    default: return HPC_ERR_CUDA;
    }
}

static const char *cu_remedy(CUresult r)
{
    switch (r) {
    case CUDA_ERROR_OUT_OF_MEMORY:
        return "the GPU is out of memory: use a smaller batch size or sequence length, "
               "or free the GPU of other processes (see `nvidia-smi`)";
    case CUDA_ERROR_NO_DEVICE:
    case CUDA_ERROR_INVALID_DEVICE:
        return "no usable GPU: check `nvidia-smi` and CUDA_VISIBLE_DEVICES";
    case CUDA_ERROR_SYSTEM_DRIVER_MISMATCH:
    case CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE:
        return "the NVIDIA kernel module and libcuda disagree, or the driver is too old for "
               "this CUDA toolkit: update or reinstall the NVIDIA driver";
    case CUDA_ERROR_INVALID_IMAGE:
    case CUDA_ERROR_NO_BINARY_FOR_GPU:
    case CUDA_ERROR_INVALID_PTX:
    case CUDA_ERROR_UNSUPPORTED_PTX_VERSION:
        return "the compiled kernel does not fit this GPU or driver: delete the kernel cache "
               "(`hpc devices` shows where) and update the NVIDIA driver if it persists";
    case CUDA_ERROR_ILLEGAL_ADDRESS:
    case CUDA_ERROR_LAUNCH_FAILED:
        return "a kernel crashed and the CUDA context is lost: rerun with "
               "CUDA_LAUNCH_BLOCKING=1 under compute-sanitizer to find it, and report the bug";
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES:
        return "the kernel asks for more registers, threads or shared memory than the GPU "
               "has: a bug in hpc's launch configuration, please report it";
    case CUDA_ERROR_NOT_INITIALIZED:
    case CUDA_ERROR_INVALID_CONTEXT:
        return "no CUDA context is current on this thread: open the device first "
               "(a bug in hpc if you see this from the hpc tool)";
    default:
        return "check `nvidia-smi` for a driver problem; otherwise this is a bug in hpc";
    }
}

HpcStatus cuda_check_cu(CUresult r, const char *call, const char *file, int line, HpcError *err)
{
    if (r == CUDA_SUCCESS) return HPC_OK;
    const char *text = NULL;
    if (!cuda_driver() || g_driver.cuGetErrorString(r, &text) != CUDA_SUCCESS || !text)
        text = "no description";
    return hpc_fail(err, cu_class(r), "%s failed at %s:%d: %s (%d: %s); %s", call, file, line,
                    cuda_result_name(r), (int)r, text, cu_remedy(r));
}

HpcStatus cuda_check_nvrtc(nvrtcResult r, const char *call, const char *file, int line,
                           HpcError *err)
{
    if (r == NVRTC_SUCCESS) return HPC_OK;
    const char *remedy =
        r == NVRTC_ERROR_OUT_OF_MEMORY ? "the host is out of memory: close other programs"
        : r == NVRTC_ERROR_INVALID_OPTION
            ? "NVRTC rejected an option: the NVRTC library may be older than hpc expects"
            : "check the CUDA toolkit installation (libnvrtc); otherwise this is a bug in hpc";
    return hpc_fail(err, r == NVRTC_ERROR_OUT_OF_MEMORY ? HPC_ERR_OOM : HPC_ERR_CUDA,
                    "%s failed at %s:%d: %s (%d); %s", call, file, line,
                    nvrtcGetErrorString(r), (int)r, remedy);
}

static const char *cublas_remedy(cublasStatus_t r)
{
    switch (r) {
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "the GPU is out of memory: use a smaller batch size or sequence length";
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "cuBLASLt has no kernel for this shape, dtype, alignment or epilogue: "
               "a bug in hpc's GEMM lowering, please report it";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "the GPU lacks a feature this GEMM needs (e.g. bf16 before sm_80)";
    case CUBLAS_STATUS_NOT_INITIALIZED:
        return "cuBLAS could not start: check `nvidia-smi` and that a context is current";
    case CUBLAS_STATUS_EXECUTION_FAILED:
        return "the GEMM kernel failed: an earlier kernel may have crashed; rerun with "
               "CUDA_LAUNCH_BLOCKING=1";
    default:
        return "a bug in hpc's GEMM call (bad argument), please report it";
    }
}

/* For messages when cuBLASLt is not loaded (cuda/cublaslt_load.h). */
static const char *cublas_name(cublasStatus_t r)
{
    const CublasLt *lt = cublaslt();
    if (lt) return lt->cublasLtGetStatusName(r);
    switch (r) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
    default: return "CUBLAS_STATUS_(unnamed)";
    }
}

HpcStatus cuda_check_cublas(cublasStatus_t r, const char *call, const char *file, int line,
                            HpcError *err)
{
    if (r == CUBLAS_STATUS_SUCCESS) return HPC_OK;
    const CublasLt *lt = cublaslt();
    return hpc_fail(err, r == CUBLAS_STATUS_ALLOC_FAILED ? HPC_ERR_OOM : HPC_ERR_CUDA,
                    "%s failed at %s:%d: %s (%d: %s); %s", call, file, line, cublas_name(r), (int)r,
                    lt ? lt->cublasLtGetStatusString(r) : "no description", cublas_remedy(r));
}
