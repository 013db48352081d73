/* runtime/cuda/cuda_exec_own.c — where the executor runs hpc's own GEMM
 * (runtime/cuda/gemm_own.h) in place of cuBLASLt, and which neighbouring
 * node's work that GEMM then does too:
 *  - an f16 LINEAR whose GELU node runs right after it writes gelu(y) as
 *    well, and the GELU node's launch is skipped (pair_gelu);
 *  - with the ping-pong kernels (HPC_GEMM_OWN_STORE=pingpong, the default), an f16
 *    LINEAR_DX whose one reader is the GELU's ACT_BWD_BGRAD right after it
 *    writes that node's dU, its recomputed gelu(u) and its column
 *    partials (program/act_parts.h), so of that node only the last phase
 *    (the partials' sum) runs, and the dX output itself is never written
 *    (pair_dgelu).
 * Each pairing holds only where the plan lets the GEMM write those bytes
 * one node early, and only at shapes the own GEMM fills the GPU with
 * (gemm_own_fills): elsewhere the node keeps cuBLASLt's GEMM and its
 * neighbour runs its own launch, decided at every launch. */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_exec_internal.h"
#include "cuda/gemm_own.h"
#include "program/act_parts.h"
#include "util/error.h"

#define NODE(id) (&ex->g->nodes[(id)])

/* Whether byte ranges [pa, pa + na) and [pb, pb + nb) overlap. */
static bool ranges_overlap(CUdeviceptr pa, int64_t na, CUdeviceptr pb, int64_t nb)
{
    return pa < pb + (CUdeviceptr)nb && pb < pa + (CUdeviceptr)na;
}

/* Whether the arena bytes of values a and b overlap. */
static bool values_overlap(const CudaExec *ex, int a, int b)
{
    return ranges_overlap(cuda_exec_ptr(ex, a), ex->plan.v[a].bytes, cuda_exec_ptr(ex, b), ex->plan.v[b].bytes);
}

/* Whether node lin is an f16 LINEAR on cuBLASLt with a bias whose output
 * feeds the GELU node right after it (the graph's order is the plan's),
 * and whose weight's shape the own GEMM takes: the same answer before the
 * plan (cuda_exec_own_written_early) and after it (pair_gelu). */
static bool gelu_pair_candidate(const CudaExec *ex, int lin)
{
    if (lin + 1 >= ex->g->n) return false;
    const IrNode *l = NODE(lin), *a = NODE(lin + 1);
    return l->op == IR_OP_LINEAR && a->op == IR_OP_ACT && a->attr.act.kind == IR_ACT_GELU && a->in[0] == lin &&
           l->dtype == DT_F16 && a->dtype == DT_F16 && ex->kernels->node[lin].kind == EOP_GEMM &&
           ex->kernels->node[lin].bias_epilogue && NODE(l->in[1])->dims[0] % 256 == 0 &&
           NODE(l->in[1])->dims[1] % 64 == 0;
}

/* The LINEAR + GELU pairs: gemm_tma_bias_gelu_f16 (or its _ts or
 * ping-pong form) computes the same act_gelu of the same rounded values as
 * the GELU kernel.  Only where writing the GELU's output at the LINEAR
 * cannot touch anything still live: the plan gives that output bytes from
 * the GELU's position on, which at the LINEAR's can only be the LINEAR's
 * input's: cuda_exec_own_written_early has the plan start that output at
 * the LINEAR, and the overlap is checked again here. */
static void pair_gelu(CudaExec *ex)
{
    for (int lin = 0; lin < ex->g->n; lin++) {
        int act = lin + 1;
        if (!gelu_pair_candidate(ex, lin) || ex->plan.v[act].kind != PLAN_ARENA ||
            values_overlap(ex, act, NODE(lin)->in[0]))
            continue;
        GemmDesc d;   /* the shape but M is every run's (no run is bound yet: M may be 0 here) */
        cuda_exec_gemm_desc(ex, lin, &d);
        d.M = 1;
        if (!gemm_own_fits(&d)) continue;
        ex->gelu_of[lin] = act;   /* computed_by_gemm[act] is set per launch: small M stays cuBLASLt's */
    }
}

/* Whether node dx is an f16 LINEAR_DX on cuBLASLt whose one reader is the
 * GELU's f16 ACT_BWD_BGRAD right after it, of an f16 u, and whose weight's
 * shape the ping-pong dX kernel takes. */
static bool dgelu_pair_candidate(const CudaExec *ex, int dx)
{
    if (dx + 1 >= ex->g->n) return false;
    const IrNode *l = NODE(dx), *a = NODE(dx + 1);
    int y = ir_output(ex->g, dx + 1, 2);
    return l->op == IR_OP_LINEAR_DX && a->op == IR_OP_ACT_BWD_BGRAD && a->attr.act_bgrad.kind == IR_ACT_GELU &&
           a->in[0] == dx && l->dtype == DT_F16 && a->dtype == DT_F16 && NODE(a->in[1])->dtype == DT_F16 &&
           (y < 0 || NODE(y)->dtype == DT_F16) && ex->kernels->node[dx].kind == EOP_GEMM &&
           ex->code[dx + 1].n_phases == 2 && ir_readers(ex->g, dx) == 1 && NODE(l->in[1])->dims[1] % 256 == 0 &&
           NODE(l->in[1])->dims[0] % 64 == 0;
}

/* The LINEAR_DX + ACT_BWD_BGRAD pairs, where the plan lets the dX GEMM
 * write the ACT_BWD_BGRAD's outputs (dU, gelu(u)) and scratch (the
 * partials) one node early: none of them may share bytes with the dX
 * GEMM's input dY, and each either keeps clear of u or lies exactly on it
 * (the kernel reads a tile's u before it writes that tile).  The plan
 * gives those ranges from the ACT_BWD_BGRAD on, so this holds unless a
 * value that dies at the dX GEMM lends them its bytes. */
static void pair_dgelu(CudaExec *ex)
{
    for (int dx = 0; dx < ex->g->n; dx++) {
        int act = dx + 1;
        if (!dgelu_pair_candidate(ex, dx) || ex->plan.v[act].kind != PLAN_ARENA || ex->plan.scratch_off[act] < 0)
            continue;
        int dy = NODE(dx)->in[0], u = NODE(act)->in[1], y = ir_output(ex->g, act, 2);
        CUdeviceptr pdy = cuda_exec_ptr(ex, dy), pu = cuda_exec_ptr(ex, u);
        int64_t ndy = ex->plan.v[dy].bytes, nu = ex->plan.v[u].bytes;
        struct { CUdeviceptr p; int64_t n; } w[3] = {
            {cuda_exec_ptr(ex, act), ex->plan.v[act].bytes},
            {ex->arena.base + (CUdeviceptr)ex->plan.scratch_off[act], ex->plan.scratch_bytes[act]},
            {y >= 0 ? cuda_exec_ptr(ex, y) : 0, y >= 0 ? ex->plan.v[y].bytes : 0},
        };
        bool clear = ex->plan.v[dy].kind == PLAN_ARENA && ex->plan.v[u].kind == PLAN_ARENA &&
                     (y < 0 || ex->plan.v[y].kind == PLAN_ARENA);
        for (int k = 0; k < 3 && clear; k++)
            if (w[k].n > 0)
                clear = !ranges_overlap(w[k].p, w[k].n, pdy, ndy) &&
                        (!ranges_overlap(w[k].p, w[k].n, pu, nu) || (k != 1 && w[k].p == pu && w[k].n == nu));
        if (clear) ex->dgelu_of[dx] = act;
    }
}

bool *cuda_exec_own_written_early(const CudaExec *ex)
{
    const IrGraph *g = ex->g;
    if (!gemm_own_in_source(ex->kernels->cuda_source) || ex->dev->arch != 90) return NULL;
    /* a program's own cubin (`hpc compile --arch`) is built without sm_90a:
     * no own GEMM runs, so its plan keeps every GELU output where it was */
    if (step_kernels_cubin(ex->kernels, ex->dev->arch)) return NULL;
    bool *early = xcalloc((size_t)g->n, sizeof *early), any = false;
    for (int lin = 0; lin < g->n; lin++)
        if (gelu_pair_candidate(ex, lin)) early[lin + 1] = any = true;
    if (!any) {
        free(early);
        return NULL;
    }
    return early;
}

HpcStatus cuda_exec_own_kernels(CudaExec *ex, HpcError *err)
{
    GemmOwnStore store = GEMM_OWN_TMA_STORE;
    HpcStatus st = gemm_own_store(&store, err);
    if (!st) st = gemm_own_kernel(ex->module, gemm_own_kernel_name(store, false), store, &ex->gemm_own, err);
    if (!st) st = gemm_own_kernel(ex->module, gemm_own_kernel_name(store, true), store, &ex->gemm_own_gelu, err);
    if (!st && store == GEMM_OWN_PINGPONG)
        st = gemm_own_kernel(ex->module, GEMM_OWN_PP_DX_DGELU_KERNEL, store, &ex->gemm_own_dx, err);
    int64_t min_tiles = 0;
    if (!st) st = gemm_own_min_tiles(&min_tiles, err);
    ex->gemm_own.min_tiles = ex->gemm_own_gelu.min_tiles = ex->gemm_own_dx.min_tiles = min_tiles;
    ex->gemm_own_gelu_only = gemm_own_gelu_only(ex->kernels->cuda_source);
    return st;
}

void cuda_exec_own_pair(CudaExec *ex)
{
    const int n = ex->g->n;
    ex->gelu_of = xmalloc((size_t)n * sizeof *ex->gelu_of);
    ex->dgelu_of = xmalloc((size_t)n * sizeof *ex->dgelu_of);
    ex->computed_by_gemm = xcalloc((size_t)n, sizeof *ex->computed_by_gemm);
    for (int i = 0; i < n; i++) ex->gelu_of[i] = ex->dgelu_of[i] = -1;
    pair_gelu(ex);
    if (ex->gemm_own_dx.fn) pair_dgelu(ex);
}

/* The LINEAR_DX id with its ACT_BWD_BGRAD act on the ping-pong dX kernel,
 * where the rows fill the GPU and the partials' groups are the kernel's. */
static HpcStatus launch_dgelu(CudaExec *ex, int id, int act, const GemmDesc *d, bool *done, HpcError *err)
{
    const int64_t G = act_part_group_rows(d->M);
    *done = G <= GEMM_OWN_PP_MAX_PART_ROWS && gemm_own_fills(&ex->gemm_own_dx, d, ex->dev->sm_count);
    ex->computed_by_gemm[act] = *done;
    if (!*done) return HPC_OK;
    int y = ir_output(ex->g, act, 2);
    GemmOwnDxDgelu g = {
        .dy = d->A, .w = d->B, .u = cuda_exec_ptr(ex, NODE(act)->in[1]), .du = cuda_exec_ptr(ex, act),
        .y = y >= 0 ? cuda_exec_ptr(ex, y) : 0, .part = ex->arena.base + (CUdeviceptr)ex->plan.scratch_off[act],
        .M = d->M, .N = d->N, .K = d->K, .part_rows = (int)G,
    };
    return gemm_own_dx_dgelu_run(&ex->gemm_own_dx, &g, ex->dev->sm_count, ex->dev->stream, err);
}

HpcStatus cuda_exec_own_launch(CudaExec *ex, int id, const GemmDesc *d, bool *done, HpcError *err)
{
    *done = false;
    if (!ex->gemm_own.fn) return HPC_OK;
    if (ex->dgelu_of[id] >= 0) return launch_dgelu(ex, id, ex->dgelu_of[id], d, done, err);
    int act = ex->gelu_of[id];
    if (NODE(id)->op != IR_OP_LINEAR || !gemm_own_fits(d) || !gemm_own_fills(&ex->gemm_own, d, ex->dev->sm_count) ||
        (ex->gemm_own_gelu_only && act < 0)) {
        if (act >= 0) ex->computed_by_gemm[act] = false;   /* at this M cuBLASLt's GEMM: the GELU runs its own launch */
        return HPC_OK;
    }
    *done = true;
    CUdeviceptr gelu = act >= 0 ? cuda_exec_ptr(ex, act) : 0;
    if (act >= 0) ex->computed_by_gemm[act] = true;
    return gemm_own_run(gelu ? &ex->gemm_own_gelu : &ex->gemm_own, d, gelu, ex->dev->sm_count, ex->dev->stream, err);
}

int cuda_exec_own_first_phase(const CudaExec *ex, int id)
{
    if (!ex->computed_by_gemm || !ex->computed_by_gemm[id]) return 0;
    return NODE(id)->op == IR_OP_ACT_BWD_BGRAD ? 1 : ex->code[id].n_phases;   /* pair_dgelu's, pair_gelu's */
}
