/* tools/cuemu/emu_driver.c — the device, its context and its memory, as the
 * CUDA driver API presents them (cuemu.h says what the emulator is).
 *
 * One device, "cuemu (CPU)", compute capability 9.0 with 132
 * multiprocessors like an H100/H200, so hpc picks the launch shapes it
 * picks there.  Device memory is host memory from aligned_alloc; every
 * allocation is recorded so that copies (and cuBLASLt's operands) are
 * checked to lie inside one.  HPC_EMU_MEM_GIB sets the memory the device
 * reports (default 16). */
#define _GNU_SOURCE
#include "cuemu.h"
#include "emu_tmap.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define EMU_API __attribute__((visibility("default")))

void emu_die(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("cuemu: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

/* ---- errors ------------------------------------------------------------- */

static const struct { CUresult r; const char *name, *text; } g_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_IMAGE, "CUDA_ERROR_INVALID_IMAGE", "device kernel image is invalid"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_FOUND, "CUDA_ERROR_NOT_FOUND", "named symbol not found"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES", "too many resources requested for launch"},
    {CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", "operation failed due to a previous error during capture"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
};

EMU_API CUresult cuGetErrorName(CUresult r, const char **s)
{
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].r == r) { *s = g_errors[i].name; return CUDA_SUCCESS; }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

EMU_API CUresult cuGetErrorString(CUresult r, const char **s)
{
    for (size_t i = 0; i < sizeof g_errors / sizeof g_errors[0]; i++)
        if (g_errors[i].r == r) { *s = g_errors[i].text; return CUDA_SUCCESS; }
    *s = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

/* ---- the device and its context ------------------------------------------ */

static int g_initialised;
struct CUctx_st { int device; };
static struct CUctx_st g_ctx;
static __thread CUcontext g_current;

EMU_API CUresult cuInit(unsigned flags)
{
    if (flags) return CUDA_ERROR_INVALID_VALUE;
    g_initialised = 1;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuDriverGetVersion(int *v) { *v = CUDA_VERSION; return CUDA_SUCCESS; }

EMU_API CUresult cuDeviceGetCount(int *n)
{
    if (!g_initialised) return CUDA_ERROR_NOT_INITIALIZED;
    *n = 1;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGet(CUdevice *d, int ordinal)
{
    if (!g_initialised) return CUDA_ERROR_NOT_INITIALIZED;
    if (ordinal != 0) return CUDA_ERROR_INVALID_DEVICE;
    *d = 0;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuDeviceGetName(char *name, int len, CUdevice d)
{
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "cuemu (CPU)");
    return CUDA_SUCCESS;
}

static size_t reported_bytes(void)
{
    const char *v = getenv("HPC_EMU_MEM_GIB");
    long gib = v && *v ? strtol(v, NULL, 10) : 16;
    return (size_t)(gib > 0 ? gib : 16) << 30;
}

EMU_API CUresult cuDeviceTotalMem(size_t *bytes, CUdevice d)
{
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = reported_bytes();
    return CUDA_SUCCESS;
}

/* An H100 SXM's 132, or HPC_EMU_SM_COUNT: a smaller GPU makes the step
 * take paths it keeps for shapes that fill the GPU (gemm_own_fills) at
 * the small shapes an emulated run can afford. */
static int sm_count(void)
{
    const char *v = getenv("HPC_EMU_SM_COUNT");
    char *end;
    long n = v && *v ? strtol(v, &end, 10) : 132;
    if (v && *v && (*end || n < 1 || n > 1024)) emu_die("HPC_EMU_SM_COUNT=%s: want a number of SMs from 1 to 1024", v);
    return (int)n;
}

EMU_API CUresult cuDeviceGetAttribute(int *v, CUdevice_attribute a, CUdevice d)
{
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    switch (a) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *v = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *v = 0; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *v = sm_count(); break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *v = 2048; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *v = 232448; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_MULTIPROCESSOR: *v = 233472; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *v = 50 << 20; break;
    default: emu_die("cuDeviceGetAttribute: attribute %d is not emulated", (int)a);
    }
    return CUDA_SUCCESS;
}

EMU_API CUresult cuDevicePrimaryCtxRetain(CUcontext *c, CUdevice d)
{
    if (d != 0) return CUDA_ERROR_INVALID_DEVICE;
    *c = &g_ctx;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuDevicePrimaryCtxRelease(CUdevice d) { return d == 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_DEVICE; }
EMU_API CUresult cuCtxSetCurrent(CUcontext c) { g_current = c; return CUDA_SUCCESS; }
EMU_API CUresult cuCtxGetCurrent(CUcontext *c) { *c = g_current; return CUDA_SUCCESS; }
EMU_API CUresult cuCtxSynchronize(void) { return g_current ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE; }

EMU_API CUresult cuCtxGetDevice(CUdevice *d)
{
    if (!g_current) return CUDA_ERROR_INVALID_HANDLE;
    *d = 0;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuCtxGetStreamPriorityRange(int *least, int *greatest)
{
    if (least) *least = 0;
    if (greatest) *greatest = -5;
    return CUDA_SUCCESS;
}

/* ---- memory ------------------------------------------------------------- */

typedef struct { uintptr_t base; size_t bytes; } Allocation;

static pthread_mutex_t g_mem_lock = PTHREAD_MUTEX_INITIALIZER;
static Allocation *g_allocs;   /* sorted by base */
static size_t g_n_allocs, g_cap_allocs, g_in_use;

static size_t find_at_or_below(uintptr_t p)   /* index of the last base <= p, or n */
{
    size_t lo = 0, hi = g_n_allocs;
    while (lo < hi) {
        size_t mid = (lo + hi) / 2;
        if (g_allocs[mid].base <= p) lo = mid + 1;
        else hi = mid;
    }
    return lo ? lo - 1 : g_n_allocs;
}

int emu_mem_valid(const void *p, size_t bytes)
{
    pthread_mutex_lock(&g_mem_lock);
    size_t i = find_at_or_below((uintptr_t)p);
    int ok = i < g_n_allocs && (uintptr_t)p + bytes <= g_allocs[i].base + g_allocs[i].bytes;
    pthread_mutex_unlock(&g_mem_lock);
    return ok;
}

EMU_API CUresult cuMemAlloc(CUdeviceptr *dptr, size_t bytes)
{
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&g_mem_lock);
    if (g_in_use + bytes > reported_bytes()) {
        pthread_mutex_unlock(&g_mem_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    void *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    if (!p) {
        pthread_mutex_unlock(&g_mem_lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* never zeros: a kernel that reads memory nobody wrote should not pass by luck */
    memset(p, 0xA5, bytes < 4096 ? bytes : 4096);
    if (g_n_allocs == g_cap_allocs) {
        g_cap_allocs = g_cap_allocs ? 2 * g_cap_allocs : 64;
        g_allocs = realloc(g_allocs, g_cap_allocs * sizeof *g_allocs);
        if (!g_allocs) emu_die("out of host memory for the allocation table");
    }
    size_t at = g_n_allocs;
    while (at > 0 && g_allocs[at - 1].base > (uintptr_t)p) at--;
    memmove(g_allocs + at + 1, g_allocs + at, (g_n_allocs - at) * sizeof *g_allocs);
    g_allocs[at] = (Allocation){(uintptr_t)p, bytes};
    g_n_allocs++;
    g_in_use += bytes;
    pthread_mutex_unlock(&g_mem_lock);
    *dptr = (CUdeviceptr)(uintptr_t)p;
    return CUDA_SUCCESS;
}

EMU_API CUresult cuMemFree(CUdeviceptr dptr)
{
    if (!dptr) return CUDA_SUCCESS;
    pthread_mutex_lock(&g_mem_lock);
    size_t i = find_at_or_below((uintptr_t)dptr);
    if (i == g_n_allocs || g_allocs[i].base != (uintptr_t)dptr) {
        pthread_mutex_unlock(&g_mem_lock);
        return CUDA_ERROR_INVALID_VALUE;
    }
    g_in_use -= g_allocs[i].bytes;
    memmove(g_allocs + i, g_allocs + i + 1, (g_n_allocs - i - 1) * sizeof *g_allocs);
    g_n_allocs--;
    pthread_mutex_unlock(&g_mem_lock);
    free((void *)(uintptr_t)dptr);
    return CUDA_SUCCESS;
}

EMU_API CUresult cuMemGetInfo(size_t *free_bytes, size_t *total)
{
    pthread_mutex_lock(&g_mem_lock);
    *total = reported_bytes();
    *free_bytes = *total - g_in_use;
    pthread_mutex_unlock(&g_mem_lock);
    return CUDA_SUCCESS;
}

EMU_API CUresult cuMemAllocHost(void **p, size_t bytes)
{
    *p = aligned_alloc(256, (bytes + 255) / 256 * 256);
    return *p ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

EMU_API CUresult cuMemFreeHost(void *p)
{
    free(p);
    return CUDA_SUCCESS;
}

/* ---- tensor maps (TMA) ------------------------------------------------------ */

/* The 2-D tiled maps hpc's kernels use: no interleave, element strides 1,
 * no swizzle or the 128-byte one (whose box rows must be 128 bytes). */
EMU_API CUresult cuTensorMapEncodeTiled(CUtensorMap *map, CUtensorMapDataType type, cuuint32_t rank, void *address,
                                        const cuuint64_t *dim, const cuuint64_t *strides, const cuuint32_t *box,
                                        const cuuint32_t *element_strides, CUtensorMapInterleave interleave,
                                        CUtensorMapSwizzle swizzle, CUtensorMapL2promotion l2,
                                        CUtensorMapFloatOOBfill oob)
{
    (void)l2;
    _Static_assert(sizeof(EmuTensorMap) <= sizeof(CUtensorMap), "the emulator's map fits a CUtensorMap");
    uint32_t esize = type == CU_TENSOR_MAP_DATA_TYPE_FLOAT16 || type == CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 ? 2
                     : type == CU_TENSOR_MAP_DATA_TYPE_FLOAT32                                            ? 4
                                                                                                          : 0;
    if (!map || !address || rank != 2 || !esize || interleave != CU_TENSOR_MAP_INTERLEAVE_NONE ||
        element_strides[0] != 1 || element_strides[1] != 1 || oob != CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE ||
        (swizzle != CU_TENSOR_MAP_SWIZZLE_NONE && swizzle != CU_TENSOR_MAP_SWIZZLE_128B))
        emu_die("cuTensorMapEncodeTiled: only 2-D f16/bf16/f32 maps without interleave, element strides or "
                "OOB NaN fill, unswizzled or in the 128-byte swizzle, are emulated");
    if ((uintptr_t)address % 16 || strides[0] % 16 || box[0] == 0 || box[1] == 0 || box[0] > 256 || box[1] > 256 ||
        (box[0] * esize) % 16 || (swizzle == CU_TENSOR_MAP_SWIZZLE_128B && box[0] * esize > 128))
        return CUDA_ERROR_INVALID_VALUE;   /* as the driver documents */
    EmuTensorMap m = {EMU_TMAP_MAGIC, esize, swizzle == CU_TENSOR_MAP_SWIZZLE_128B ? 128u : 0u, {box[0], box[1]},
                      (uint64_t)(uintptr_t)address, {dim[0], dim[1]}, strides[0]};
    memset(map, 0, sizeof *map);
    memcpy(map, &m, sizeof m);
    return CUDA_SUCCESS;
}
