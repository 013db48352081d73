/* runtime/cuda/device_arena.c — see device_arena.h. */
#include "cuda/device_arena.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static double gib(size_t bytes) { return (double)bytes / (1024.0 * 1024.0 * 1024.0); }

size_t arena_align(size_t bytes)
{
    return (bytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
}

HpcStatus arena_alloc_raw(CUdeviceptr *ptr, size_t bytes, const char *what, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    *ptr = 0;
    if (!cu)
        return hpc_fail(err, HPC_ERR_NO_GPU, "cannot allocate %s: the CUDA driver is not "
                        "loaded (open the device first)", what);
    if (bytes == 0) return HPC_OK;
    CUresult r = cu->cuMemAlloc(ptr, bytes);
    if (r != CUDA_ERROR_OUT_OF_MEMORY) return CUDA_CHECK(err, r);
    size_t free_b = 0, total_b = 0;
    cu->cuMemGetInfo(&free_b, &total_b);
    return hpc_fail(err, HPC_ERR_OOM,
                    "out of GPU memory: cuMemAlloc of %zu bytes (%.2f GiB) for %s failed with "
                    "CUDA_ERROR_OUT_OF_MEMORY; the GPU has %.2f GiB free of %.2f GiB. Use a "
                    "smaller batch size or sequence length, or free the GPU of other processes "
                    "(`nvidia-smi`)", bytes, gib(bytes), what, gib(free_b), gib(total_b));
}

/* From the caller's allocator when there is one, else cuMemAlloc. */
static HpcStatus arena_get(const DeviceArena *a, CUdeviceptr *ptr, size_t bytes, const char *what, HpcError *err)
{
    if (!a->allocator.alloc) return arena_alloc_raw(ptr, bytes, what, err);
    *ptr = bytes ? a->allocator.alloc(a->allocator.user, bytes) : 0;
    if (bytes && !*ptr)
        return hpc_fail(err, HPC_ERR_OOM, "out of GPU memory: the caller's allocator returned no memory for "
                        "%s (%zu bytes, %.2f GiB); give it more memory or use a smaller batch size or "
                        "sequence length", what, bytes, gib(bytes));
    return HPC_OK;
}

static void arena_put(const DeviceArena *a, CUdeviceptr ptr)
{
    if (!ptr) return;
    if (a->allocator.alloc) {
        a->allocator.free(a->allocator.user, ptr);
        return;
    }
    const CudaDriver *cu = cuda_driver();
    if (cu) cu->cuMemFree(ptr);
}

static void note_peak(DeviceArena *a)
{
    size_t now = a->size + a->odd_bytes;
    if (now > a->peak_bytes) a->peak_bytes = now;
}

HpcStatus arena_init(DeviceArena *a, const char *what, size_t bytes, HpcError *err)
{
    return arena_init_with(a, NULL, what, bytes, err);
}

HpcStatus arena_init_with(DeviceArena *a, const ArenaAllocator *allocator, const char *what, size_t bytes,
                          HpcError *err)
{
    memset(a, 0, sizeof *a);
    if (allocator) a->allocator = *allocator;
    HpcStatus st = arena_get(a, &a->base, bytes, what, err);
    if (st) return st;
    a->size = bytes;
    note_peak(a);
    return HPC_OK;
}

void arena_free(DeviceArena *a)
{
    arena_put(a, a->base);
    for (int i = 0; i < a->num_odd; i++) arena_put(a, a->odd[i].ptr);
    free(a->odd);
    memset(a, 0, sizeof *a);
}

CUdeviceptr arena_ptr(const DeviceArena *a, size_t offset, size_t bytes)
{
    HPC_ASSERT(offset <= a->size && bytes <= a->size - offset);
    return a->base + offset;
}

HpcStatus arena_alloc(DeviceArena *a, CUdeviceptr *ptr, size_t bytes, const char *what,
                      HpcError *err)
{
    HpcStatus st = arena_get(a, ptr, bytes, what, err);
    if (st || bytes == 0) return st;
    if (a->num_odd == a->cap_odd) {
        a->cap_odd = a->cap_odd ? 2 * a->cap_odd : 16;
        a->odd = xrealloc(a->odd, (size_t)a->cap_odd * sizeof *a->odd);
    }
    ArenaBuffer *b = &a->odd[a->num_odd++];
    b->ptr = *ptr;
    b->bytes = bytes;
    snprintf(b->what, sizeof b->what, "%s", what);
    a->odd_bytes += bytes;
    note_peak(a);
    return HPC_OK;
}

HpcStatus arena_alloc_packed(DeviceArena *a, CUdeviceptr *block, CUdeviceptr *ptrs, const size_t *bytes, int n,
                             const char *what, HpcError *err)
{
    size_t total = 0;
    for (int i = 0; i < n; i++) total += arena_align(bytes[i]);
    HpcStatus st = arena_alloc(a, block, total, what, err);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        ptrs[i] = !st && bytes[i] ? *block + off : 0;
        off += arena_align(bytes[i]);
    }
    return st;
}

void arena_release(DeviceArena *a, CUdeviceptr ptr)
{
    if (!ptr) return;
    for (int i = 0; i < a->num_odd; i++) {
        if (a->odd[i].ptr != ptr) continue;
        arena_put(a, ptr);
        a->odd_bytes -= a->odd[i].bytes;
        a->odd[i] = a->odd[--a->num_odd];
        return;
    }
    HPC_ASSERT(!"arena_release: pointer was not allocated by this arena");
}

void arena_stats(const DeviceArena *a, ArenaStats *s)
{
    memset(s, 0, sizeof *s);
    s->arena_bytes = a->size;
    s->odd_bytes = a->odd_bytes;
    s->peak_bytes = a->peak_bytes;
    const CudaDriver *cu = cuda_driver();
    if (cu && cu->cuMemGetInfo(&s->device_free, &s->device_total) != CUDA_SUCCESS)
        s->device_free = s->device_total = 0;
}
