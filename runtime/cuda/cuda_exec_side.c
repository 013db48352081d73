/* runtime/cuda/cuda_exec_side.c — the step's side work (CudaExecSide,
 * cuda_exec.h): groups on a second stream beside the step's own launches,
 * forked and joined node by node.
 *
 * Group g is forked once the node at start[g] is queued: an event recorded
 * on the executor's stream then (re-recorded at each fork point: a wait
 * takes the record current when it is queued), waited for by the side
 * stream, then the group and an event after it.  The node at wait[g] waits
 * for that event; groups whose wait is at or past the run's end are joined
 * after its last node, before the tail.  Under stream capture the records
 * and waits become the graph's edges (the side stream joins the capture at
 * its first fork), and every forked group is joined again before the
 * capture ends, as a capture requires.  Events are made without timing
 * (cheaper to record), once, for the largest side seen; the stream gets the
 * least priority the context offers, so that a block of the step's own
 * is dispatched before a side block wherever both wait for room on an SM. */
#include "cuda/cuda_exec_internal.h"

#include <stdlib.h>

/* The side stream, and at least n_groups + 1 events (the fork, then one
 * after each group). */
static HpcStatus side_resources(CudaExec *ex, int n_groups, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    HpcStatus st = HPC_OK;
    if (!ex->side_stream) {
        int least = 0, greatest = 0;
        st = CUDA_CHECK(err, cu->cuCtxGetStreamPriorityRange(&least, &greatest));
        int prio = ex->side_high ? greatest : least;
        if (!st) st = CUDA_CHECK(err, cu->cuStreamCreateWithPriority(&ex->side_stream, CU_STREAM_NON_BLOCKING, prio));
        if (st) return st;
    }
    if (ex->n_side_events >= n_groups + 1) return HPC_OK;
    CUevent *ev = xcalloc((size_t)n_groups + 1, sizeof *ev);
    for (int i = 0; i < ex->n_side_events; i++) ev[i] = ex->side_events[i];
    free(ex->side_events);
    ex->side_events = ev;
    for (int i = ex->n_side_events; i < n_groups + 1 && !st; i++) {
        st = CUDA_CHECK(err, cu->cuEventCreate(&ev[i], CU_EVENT_DISABLE_TIMING));
        if (!st) ex->n_side_events = i + 1;
    }
    return st;
}

/* ---- the schedule (no driver) -------------------------------------------- */

bool cuda_exec_side_valid(const CudaExecSide *s, int *bad)
{
    for (int g = 0; g < s->n_groups; g++)
        if (s->start[g] < -1 || s->start[g] >= s->wait[g] || (g > 0 && s->start[g] < s->start[g - 1])) {
            *bad = g;
            return false;
        }
    return true;
}

int cuda_exec_side_forks(const CudaExecSide *s, int pos, int next)
{
    while (next < s->n_groups && s->start[next] == pos) next++;
    return next;
}

bool cuda_exec_side_joins(const CudaExecSide *s, int g, int pos, bool rest)
{
    return rest ? s->wait[g] >= pos : s->wait[g] == pos;
}

/* ---- the launches ---------------------------------------------------------- */

HpcStatus cuda_exec_side_begin(CudaExec *ex, const CudaExecSide *s, HpcError *err)
{
    int g = 0;
    if (!cuda_exec_side_valid(s, &g))
        return hpc_fail(err, HPC_ERR_INTERNAL, "cuda_exec: side group %d starts after node %d and is waited "
                        "for at %d (the starts must not decrease, each before its wait)", g, s->start[g],
                        s->wait[g]);
    return s->n_groups ? side_resources(ex, s->n_groups, err) : HPC_OK;
}

HpcStatus cuda_exec_side_fork(CudaExec *ex, const CudaExecSide *s, int pos, int *next, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    int until = cuda_exec_side_forks(s, pos, *next);
    if (until == *next) return HPC_OK;
    HpcStatus st = CUDA_CHECK(err, cu->cuEventRecord(ex->side_events[0], ex->dev->stream));
    if (!st) st = CUDA_CHECK(err, cu->cuStreamWaitEvent(ex->side_stream, ex->side_events[0], 0));
    for (; !st && *next < until; (*next)++) {
        st = s->queue(s->ctx, *next, ex->side_stream, err);
        if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(ex->side_events[*next + 1], ex->side_stream));
    }
    return st;
}

HpcStatus cuda_exec_side_join(CudaExec *ex, const CudaExecSide *s, int pos, int forked, bool rest, HpcError *err)
{
    const CudaDriver *cu = cuda_driver();
    HpcStatus st = HPC_OK;
    for (int g = 0; g < forked && !st; g++)
        if (cuda_exec_side_joins(s, g, pos, rest))
            st = CUDA_CHECK(err, cu->cuStreamWaitEvent(ex->dev->stream, ex->side_events[g + 1], 0));
    return st;
}

HpcStatus cuda_exec_side_serial(CudaExec *ex, const CudaExecSide *s, bool started, HpcError *err)
{
    HpcStatus st = HPC_OK;
    for (int g = 0; g < s->n_groups && !st; g++)
        if ((s->start[g] >= 0) == started) st = s->queue(s->ctx, g, ex->dev->stream, err);
    return st;
}

void cuda_exec_side_free(CudaExec *ex)
{
    const CudaDriver *cu = cuda_driver();
    for (int i = 0; i < ex->n_side_events && cu; i++) cu->cuEventDestroy(ex->side_events[i]);
    free(ex->side_events);
    ex->side_events = NULL;
    ex->n_side_events = 0;
    if (ex->side_stream && cu) cu->cuStreamDestroy(ex->side_stream);
    ex->side_stream = NULL;
}
