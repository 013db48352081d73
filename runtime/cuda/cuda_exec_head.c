/* runtime/cuda/cuda_exec_head.c — the step's head (CudaExecHead,
 * cuda_exec.h): work on a second stream beside the forward pass, joined
 * node by node.
 *
 * The fork: an event recorded on the executor's stream, waited for by the
 * head's stream, so the head starts after whatever the stream holds before
 * the step (the batch upload, the previous step).  Then each group is
 * queued on the head's stream with an event after it; the executor's
 * stream waits for group g's event before the node at wait[g], and for the
 * last group's before the first backward node.  Under stream capture these
 * records and waits become the graph's edges (the head's stream joins the
 * capture through the fork), and the last wait joins it back, as a capture
 * requires.  Events are made without timing (cheaper to record) once, for
 * the largest head seen; the stream gets the least priority the context
 * offers, so that a block of the forward pass is dispatched before the
 * head's wherever both wait for room on an SM. */
#include "cuda/cuda_exec_internal.h"

#include <stdlib.h>

/* The head's stream, and at least n_groups + 1 events. */
static HpcStatus head_resources(CudaExec *ex, int n_groups, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    HpcStatus st = HPC_OK;
    if (!ex->head_stream) {
        int least = 0, greatest = 0;
        st = CUDA_CHECK(err, cu->cuCtxGetStreamPriorityRange(&least, &greatest));
        if (!st) st = CUDA_CHECK(err, cu->cuStreamCreateWithPriority(&ex->head_stream, CU_STREAM_NON_BLOCKING, least));
        if (st) return st;
    }
    if (ex->n_head_events >= n_groups + 1) return HPC_OK;
    CUevent *ev = xcalloc((size_t)n_groups + 1, sizeof *ev);
    for (int i = 0; i < ex->n_head_events; i++) ev[i] = ex->head_events[i];
    free(ex->head_events);
    ex->head_events = ev;
    for (int i = ex->n_head_events; i < n_groups + 1 && !st; i++) {
        st = CUDA_CHECK(err, cu->cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
        if (!st) ex->n_head_events = i + 1;
    }
    return st;
}

HpcStatus cuda_exec_head_fork(CudaExec *ex, const CudaExecHead *h, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    if (h->n_groups == 0) return HPC_OK;   /* no fork: a captured fork must be joined again */
    HpcStatus st = head_resources(ex, h->n_groups, err);
    if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(ex->head_events[0], ex->dev->stream));
    if (!st) st = CUDA_CHECK(err, cu->cuStreamWaitEvent(ex->head_stream, ex->head_events[0], 0));
    for (int g = 0; g < h->n_groups && !st; g++) {
        st = h->queue(h->ctx, g, ex->head_stream, err);
        if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(ex->head_events[g + 1], ex->head_stream));
    }
    return st;
}

HpcStatus cuda_exec_head_join(CudaExec *ex, const CudaExecHead *h, int pos, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    if (h->n_groups == 0) return HPC_OK;
    if (pos >= ex->plan.n_forward)   /* the backward pass (or the run's end): all of them */
        return CUDA_CHECK(err, cu->cuStreamWaitEvent(ex->dev->stream, ex->head_events[h->n_groups], 0));
    HpcStatus st = HPC_OK;
    for (int g = 0; g < h->n_groups && !st; g++)
        if (h->wait[g] == pos) st = CUDA_CHECK(err, cu->cuStreamWaitEvent(ex->dev->stream, ex->head_events[g + 1], 0));
    return st;
}

HpcStatus cuda_exec_head_queue_all(CudaExec *ex, const CudaExecHead *h, HpcError *err)
{
    HpcStatus st = HPC_OK;
    for (int g = 0; g < h->n_groups && !st; g++) st = h->queue(h->ctx, g, ex->dev->stream, err);
    return st;
}

void cuda_exec_head_free(CudaExec *ex)
{
    const CudaDriver *cu = cuda_driver();
    for (int i = 0; i < ex->n_head_events && cu; i++) cu->cuEventDestroy(ex->head_events[i]);
    free(ex->head_events);
    ex->head_events = NULL;
    ex->n_head_events = 0;
    if (ex->head_stream && cu) cu->cuStreamDestroy(ex->head_stream);
    ex->head_stream = NULL;
}
