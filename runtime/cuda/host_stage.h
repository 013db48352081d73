/* runtime/cuda/host_stage.h — host-to-device uploads through page-locked
 * staging buffers, filled on every core.
 *
 * Why: cuMemcpyHtoDAsync from pageable memory is a copy the driver makes
 * by itself through a small pinned buffer of its own, on one thread,
 * before it returns: BERT-base's parameters (440 MB of f32 masters and
 * 220 MB of 16-bit copies) took 0.16 s that way on the H200 host.  Here
 * the bytes are written (copied, or converted on the fly by a fill
 * function) by the cpu pool (runtime/cpu/cpu_threads.h) into one of
 * HOST_STAGE_BUFFERS page-locked buffers of HOST_STAGE_BYTES each, while
 * the copy engine moves the buffer filled before; an event per buffer says
 * when it may be filled again.  The copies run on the caller's stream, in
 * order with its kernels.
 *
 * If page-locked memory cannot be had (a locked-memory limit), the stage
 * fills ordinary buffers and the copies are the driver's pageable ones:
 * slower, the same bytes.  HostStage.pinned says which.
 *
 * The device bytes are there once the stream reaches them;
 * host_stage_close waits for every copy, then frees the buffers (also
 * after a failure: nothing is freed under a copy in flight).
 *
 *   HostStage s;
 *   HpcStatus st = host_stage_open(&s, stream, err);
 *   if (!st) st = host_stage_copy(&s, dst, src, bytes, err);
 *   if (!st) st = host_stage_fill(&s, dst16, n, 2, to_half, &job, err);
 *   st = host_stage_close(&s, st, err);   // waits; keeps the first error
 */
#ifndef HPC_RUNTIME_CUDA_HOST_STAGE_H
#define HPC_RUNTIME_CUDA_HOST_STAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cuda/cuda_driver.h"
#include "util/error.h"

#define HOST_STAGE_BUFFERS 4
#define HOST_STAGE_BYTES ((size_t)8 << 20)

/* Writes items [first, first + count) of the source into out (count
 * items of the stage's item size).  Called from several threads at once
 * on disjoint ranges. */
typedef void (*HostStageFill)(void *ctx, int64_t first, int64_t count, void *out);

typedef struct {
    CUstream stream;
    void *buf[HOST_STAGE_BUFFERS];
    CUevent free_again[HOST_STAGE_BUFFERS];   /* recorded after the copy out of buf[k] */
    bool in_flight[HOST_STAGE_BUFFERS];
    int next;
    bool pinned;            /* the buffers are page-locked (else malloc'd) */
    int64_t bytes_moved;
    double opened;          /* phase_clock_now() at open: the close records a span */
} HostStage;

HpcStatus host_stage_open(HostStage *s, CUstream stream, HpcError *err);

/* Queues bytes from src (any host memory) to dst. */
HpcStatus host_stage_copy(HostStage *s, CUdeviceptr dst, const void *src, size_t bytes, HpcError *err);

/* Queues n items of item_size bytes (<= HOST_STAGE_BYTES), made by fill,
 * to dst. */
HpcStatus host_stage_fill(HostStage *s, CUdeviceptr dst, int64_t n, size_t item_size, HostStageFill fill,
                          void *ctx, HpcError *err);

/* Waits for every queued copy and frees the stage.  Returns st if it is a
 * failure (its message kept), else the wait's own status. */
HpcStatus host_stage_close(HostStage *s, HpcStatus st, HpcError *err);

#endif
