/* runtime/cuda/host_stage.c — see host_stage.h. */
#include "cuda/host_stage.h"

#include <stdlib.h>
#include <string.h>

#include "cpu/cpu_threads.h"
#include "util/phase_clock.h"

HpcStatus host_stage_open(HostStage *s, CUstream stream, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    memset(s, 0, sizeof *s);
    s->stream = stream;
    s->opened = phase_clock_now();
    if (!cu)
        return hpc_fail(err, HPC_ERR_NO_GPU, "host_stage_open: the CUDA driver is not loaded (open the device first)");
    s->pinned = true;
    for (int k = 0; k < HOST_STAGE_BUFFERS && s->pinned; k++)
        s->pinned = cu->cuMemAllocHost(&s->buf[k], HOST_STAGE_BYTES) == CUDA_SUCCESS;
    if (!s->pinned) {   /* a locked-memory limit: ordinary buffers, the driver's pageable copies */
        for (int k = 0; k < HOST_STAGE_BUFFERS; k++) {
            if (s->buf[k]) cu->cuMemFreeHost(s->buf[k]);
            s->buf[k] = NULL;
        }
        for (int k = 0; k < HOST_STAGE_BUFFERS; k++) {
            s->buf[k] = malloc(HOST_STAGE_BYTES);
            if (!s->buf[k]) return host_stage_close(s, hpc_fail(err, HPC_ERR_OOM, "host_stage_open: out of host "
                                                                "memory for %zu MiB of upload buffers",
                                                                (HOST_STAGE_BYTES >> 20) * HOST_STAGE_BUFFERS), err);
        }
    }
    HpcStatus st = HPC_OK;
    for (int k = 0; k < HOST_STAGE_BUFFERS && !st; k++)
        st = CUDA_CHECK(err, cu->cuEventCreate(&s->free_again[k], CU_EVENT_DISABLE_TIMING));
    return st ? host_stage_close(s, st, err) : HPC_OK;
}

/* The next buffer, once the copy out of it has finished. */
static HpcStatus take_buffer(HostStage *s, int *k, HpcError *err)
{
    *k = s->next;
    s->next = (s->next + 1) % HOST_STAGE_BUFFERS;
    if (!s->in_flight[*k]) return HPC_OK;
    s->in_flight[*k] = false;
    return CUDA_CHECK(err, cuda_driver()->cuEventSynchronize(s->free_again[*k]));
}

static HpcStatus send_buffer(HostStage *s, int k, CUdeviceptr dst, size_t bytes, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    HpcStatus st = CUDA_CHECK(err, cu->cuMemcpyHtoDAsync(dst, s->buf[k], bytes, s->stream));
    if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(s->free_again[k], s->stream));
    if (!st) {
        s->in_flight[k] = true;
        s->bytes_moved += (int64_t)bytes;
    }
    return st;
}

typedef struct {
    HostStageFill fill;
    void *ctx;
    int64_t first;      /* the chunk's first item */
    size_t item_size;
    char *out;
} FillJob;

static void fill_range(void *ctx, int64_t b, int64_t e)
{
    const FillJob *j = ctx;
    j->fill(j->ctx, j->first + b, e - b, j->out + (size_t)b * j->item_size);
}

HpcStatus host_stage_fill(HostStage *s, CUdeviceptr dst, int64_t n, size_t item_size, HostStageFill fill,
                          void *ctx, HpcError *err)
{
    HPC_ASSERT(item_size >= 1 && item_size <= HOST_STAGE_BYTES);
    int64_t per = (int64_t)(HOST_STAGE_BYTES / item_size);
    HpcStatus st = HPC_OK;
    for (int64_t first = 0; first < n && !st; first += per) {
        int64_t count = n - first < per ? n - first : per;
        int k;
        st = take_buffer(s, &k, err);
        if (st) break;
        FillJob job = {.fill = fill, .ctx = ctx, .first = first, .item_size = item_size, .out = s->buf[k]};
        cpu_parallel_for(count, 1 << 15, fill_range, &job);
        st = send_buffer(s, k, dst + (CUdeviceptr)((size_t)first * item_size), (size_t)count * item_size, err);
    }
    return st;
}

static void copy_bytes(void *ctx, int64_t first, int64_t count, void *out)
{
    memcpy(out, (const char *)ctx + first, (size_t)count);
}

HpcStatus host_stage_copy(HostStage *s, CUdeviceptr dst, const void *src, size_t bytes, HpcError *err)
{
    return host_stage_fill(s, dst, (int64_t)bytes, 1, copy_bytes, (void *)(uintptr_t)src, err);
}

HpcStatus host_stage_close(HostStage *s, HpcStatus st, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    HpcError ignore = {0};
    for (int k = 0; k < HOST_STAGE_BUFFERS; k++) {
        if (s->in_flight[k]) {   /* never free a buffer the copy engine still reads */
            HpcStatus w = CUDA_CHECK(st ? &ignore : err, cu->cuEventSynchronize(s->free_again[k]));
            if (!st) st = w;
        }
        if (s->free_again[k]) cu->cuEventDestroy(s->free_again[k]);
        if (s->buf[k] && s->pinned) cu->cuMemFreeHost(s->buf[k]);
        else free(s->buf[k]);
    }
    if (!st && s->bytes_moved)
        phase_spanf(s->opened, phase_clock_now(), "host-to-device upload: %.0f MB through %s buffers on %d threads",
                    (double)s->bytes_moved / 1e6, s->pinned ? "page-locked" : "pageable (no locked memory)",
                    cpu_threads_count());
    memset(s, 0, sizeof *s);
    return st;
}
