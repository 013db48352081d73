/* runtime/cuda/cuda_exec_side.c — the weight-gradient GEMMs on a second
 * stream of the step's CUDA graph (program/plan_side.h; CudaExecSide in
 * cuda_exec.h).
 *
 * Only inside a capture: an eager run (a shape's first, which times the
 * GEMM algorithms, and every run without CudaRunOptions.graph) launches
 * every node on the device stream in schedule order, which is always
 * right.  In a capture a side node is forked from the device stream at its
 * position by an event and runs on the side stream with a workspace of its
 * own (the device stream's GEMMs use the context's); the device stream
 * waits for the side stream at the first join of the side work queued
 * (plan_side_join) and after the last node, so the graph ends joined. */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_exec_internal.h"
#include "program/plan_side.h"

/* HPC_DW_STREAM: unset or "" auto, "0" off, "1" on. */
typedef enum { SIDE_AUTO, SIDE_OFF, SIDE_ON } SideMode;

static HpcStatus side_mode(SideMode *mode, HpcError *err)
{
    const char *v = getenv("HPC_DW_STREAM");
    *mode = !v || !*v ? SIDE_AUTO : strcmp(v, "0") == 0 ? SIDE_OFF : strcmp(v, "1") == 0 ? SIDE_ON : SIDE_AUTO;
    if (v && *v && strcmp(v, "0") != 0 && strcmp(v, "1") != 0)
        return hpc_fail(err, HPC_ERR_USAGE, "HPC_DW_STREAM=%s: expected 0 (every weight-gradient GEMM on the "
                        "step's stream), 1 (on a second stream even where that makes the arena larger) or "
                        "unset (on a second stream where the arena grows by at most %d %%)", v,
                        CUDA_EXEC_SIDE_GROWTH_PCT);
    return HPC_OK;
}

HpcStatus cuda_exec_side_plan(CudaExec *ex, int64_t max_B, int64_t max_L, const int64_t *scratch,
                              const PlanOptions *opt, HpcError *err)
{
    SideMode mode;
    HpcStatus st = side_mode(&mode, err);
    if (st) return st;
    const IrGraph *g = ex->g;
    bool *side = xcalloc((size_t)(g->n > 0 ? g->n : 1), sizeof *side);
    int n = mode == SIDE_OFF ? 0 : plan_side_nodes(g, scratch, side);
    st = plan_build_scratch_with(g, max_B, max_L, scratch, opt, &ex->plan, err);
    if (st || n == 0) {
        free(side);
        return st;
    }
    PlanOptions with = *opt;
    with.side = side;
    StepPlan beside;
    st = plan_build_scratch_with(g, max_B, max_L, scratch, &with, &beside, err);
    if (st) {
        free(side);
        return st;
    }
    int64_t allowed = ex->plan.arena_bytes + ex->plan.arena_bytes / 100 * CUDA_EXEC_SIDE_GROWTH_PCT;
    if (mode == SIDE_AUTO && beside.arena_bytes > allowed) {   /* too much memory for it */
        plan_free(&beside);
        free(side);
        return HPC_OK;
    }
    plan_free(&ex->plan);
    ex->plan = beside;
    CudaExecSide *s = &ex->side;
    s->node = side;
    s->n = n;
    s->join = xcalloc((size_t)g->n, sizeof *s->join);
    for (int i = 0; i < g->n; i++) s->join[i] = side[i] ? plan_side_join(g, side, i) : -1;
    const CudaDriver *cu = cuda_driver();
    st = CUDA_CHECK(err, cu->cuStreamCreate(&s->stream, CU_STREAM_NON_BLOCKING));
    if (!st) st = CUDA_CHECK(err, cu->cuEventCreate(&s->fork, CU_EVENT_DISABLE_TIMING));
    if (!st) st = CUDA_CHECK(err, cu->cuEventCreate(&s->done, CU_EVENT_DISABLE_TIMING));
    return st;
}

/* A workspace of at least `need` bytes for the side stream's GEMMs; the one
 * it replaces stays allocated (a graph captured earlier may use it). */
static HpcStatus side_workspace(CudaExecSide *s, size_t need, HpcError *err)
{
    if (need <= s->ws_bytes) return HPC_OK;
    CUdeviceptr w;
    HpcStatus st = CUDA_CHECK(err, cuda_driver()->cuMemAlloc(&w, need));
    if (st) return st;
    if (s->ws) {
        s->retired = xrealloc(s->retired, (size_t)(s->n_retired + 1) * sizeof *s->retired);
        s->retired[s->n_retired++] = s->ws;
    }
    s->ws = w;
    s->ws_bytes = need;
    return HPC_OK;
}

HpcStatus cuda_exec_side_launch(CudaExec *ex, int id, bool *beside, HpcError *err)
{
    CudaExecSide *s = &ex->side;
    *beside = false;
    if (!s->node || !s->node[id] || ex->code[id].kind != EOP_GEMM || ex->code[id].n_phases > 0) return HPC_OK;
    GemmDesc d;
    cuda_exec_gemm_desc(ex, id, &d);
    size_t need;
    if (!gemm_plan_workspace(&ex->gemm, &d, &need)) return HPC_OK;   /* no plan yet: the step's stream */
    HpcStatus st = side_workspace(s, need, err);
    const CudaDriver *cu = cuda_driver();
    if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(s->fork, ex->dev->stream));
    if (!st) st = CUDA_CHECK(err, cu->cuStreamWaitEvent(s->stream, s->fork, 0));
    bool ran = false;
    if (!st) st = gemm_run_on(&ex->gemm, &d, s->stream, s->ws, s->ws_bytes, &ran, err);
    /* recorded even if nothing ran: the forked stream must rejoin the capture */
    if (!st) st = CUDA_CHECK(err, cu->cuEventRecord(s->done, s->stream));
    if (!st && !ran) st = cuda_exec_launch_node(ex, id, err);   /* on the step's stream, in order */
    s->queued += ran;
    *beside = !st;   /* a join is due either way */
    return st;
}

HpcStatus cuda_exec_side_join(CudaExec *ex, HpcError *err)
{
    return CUDA_CHECK(err, cuda_driver()->cuStreamWaitEvent(ex->dev->stream, ex->side.done, 0));
}

void cuda_exec_side_free(CudaExec *ex)
{
    const CudaDriver *cu = cuda_driver();
    CudaExecSide *s = &ex->side;
    if (cu) {
        if (s->ws) cu->cuMemFree(s->ws);
        for (int i = 0; i < s->n_retired; i++) cu->cuMemFree(s->retired[i]);
        if (s->fork) cu->cuEventDestroy(s->fork);
        if (s->done) cu->cuEventDestroy(s->done);
        if (s->stream) cu->cuStreamDestroy(s->stream);
    }
    free(s->node);
    free(s->join);
    free(s->retired);
    memset(s, 0, sizeof *s);
}
