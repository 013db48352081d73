/* runtime/cuda/device_arena.h — device memory: one arena plus odd buffers.
 *
 * The planner (compiler/plan) gives every tensor of a step an offset in one
 * block; arena_init makes that block with a single cuMemAlloc and
 * arena_ptr turns an offset into a device pointer.  Buffers that live
 * outside the plan (cuBLASLt workspace, staging, loss-scaler state) come
 * from arena_alloc / arena_release, which count them so that the peak
 * device memory of a run can be reported (arena_stats).
 *
 * Offsets should be multiples of ARENA_ALIGN (256 bytes, what cuBLASLt and
 * vector loads want); arena_ptr asserts they are in range.
 *
 * A caller may supply its own device allocator (ArenaAllocator, e.g. the C
 * API's HpcDeviceAllocator): arena_init_with routes the block and every odd
 * buffer of that arena through it; arena_init uses cuMemAlloc.
 *
 * Out of memory is HPC_ERR_OOM with a message giving the bytes asked for,
 * the bytes free on the device and the remedy (a smaller batch or length).
 *
 *   DeviceArena a;
 *   arena_init(&a, "step", plan_bytes, &err);            // needs a current context
 *   CUdeviceptr x = arena_ptr(&a, off_x, bytes_x);       // (B, L, H) f16
 *   CUdeviceptr ws; arena_alloc(&a, &ws, 32 << 20, "cublas workspace", &err);
 *   ...
 *   arena_release(&a, ws);
 *   arena_free(&a);                                      // frees the block and odd buffers left
 */
#ifndef HPC_RUNTIME_DEVICE_ARENA_H
#define HPC_RUNTIME_DEVICE_ARENA_H

#include <stddef.h>
#include <stdint.h>

#include "cuda/cuda_driver.h"

#define ARENA_ALIGN 256

typedef struct {
    CUdeviceptr ptr;
    size_t bytes;
    char what[48];
} ArenaBuffer;

/* A caller's device memory: alloc returns 0 when it cannot serve `bytes`. */
typedef struct ArenaAllocator {
    CUdeviceptr (*alloc)(void *user, size_t bytes);
    void (*free)(void *user, CUdeviceptr ptr);
    void *user;
} ArenaAllocator;

typedef struct {
    ArenaAllocator allocator;  /* alloc NULL: cuMemAlloc / cuMemFree */
    CUdeviceptr base;          /* the planned block, or 0 when size is 0 */
    size_t size;               /* bytes of the planned block */
    ArenaBuffer *odd;          /* live odd buffers */
    int num_odd, cap_odd;
    size_t odd_bytes;          /* bytes in odd buffers now */
    size_t peak_bytes;         /* max of size + odd_bytes so far */
} DeviceArena;

typedef struct {
    size_t arena_bytes, odd_bytes, peak_bytes;
    size_t device_free, device_total;   /* from cuMemGetInfo; 0 if unknown */
} ArenaStats;

/* what: a short name for messages ("activations"). bytes may be 0. */
HpcStatus arena_init(DeviceArena *a, const char *what, size_t bytes, HpcError *err);
/* The same with the caller's allocator (NULL: cuMemAlloc). */
HpcStatus arena_init_with(DeviceArena *a, const ArenaAllocator *allocator, const char *what, size_t bytes,
                          HpcError *err);
void arena_free(DeviceArena *a);

/* base + offset, checked against the block. */
CUdeviceptr arena_ptr(const DeviceArena *a, size_t offset, size_t bytes);

/* A separate allocation of `bytes`, counted in the figures. */
HpcStatus arena_alloc(DeviceArena *a, CUdeviceptr *ptr, size_t bytes, const char *what,
                      HpcError *err);
void arena_release(DeviceArena *a, CUdeviceptr ptr);

/* n buffers of bytes[i] in ONE odd buffer, each at an ARENA_ALIGN offset:
 * ptrs[i] (0 where bytes[i] is 0), *block the allocation to arena_release
 * (0 when every size is 0).  Why: the driver hands cuMemAlloc memory out in
 * 2 MiB pages, so a buffer per parameter tensor (BERT-base: 201 tensors x
 * master, 16-bit copy, m, v; 48 of 2.25 MiB) left hundreds of MiB of the
 * device in rounding that no plan counted. */
HpcStatus arena_alloc_packed(DeviceArena *a, CUdeviceptr *block, CUdeviceptr *ptrs, const size_t *bytes, int n,
                             const char *what, HpcError *err);

/* Current and peak figures, plus the device's free/total memory. */
void arena_stats(const DeviceArena *a, ArenaStats *s);

/* One cuMemAlloc with the OOM message described above, not counted in the
 * arena's figures (the arena uses it).  what names the buffer in messages. */
HpcStatus arena_alloc_raw(CUdeviceptr *ptr, size_t bytes, const char *what, HpcError *err);

/* Rounds up to ARENA_ALIGN. */
size_t arena_align(size_t bytes);

#endif
