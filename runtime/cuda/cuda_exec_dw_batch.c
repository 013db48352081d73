/* runtime/cuda/cuda_exec_dw_batch.c — the layers' dW GEMMs of one shape as
 * one batched cuBLASLt call.
 *
 * The plan's schedule puts the LINEAR_DWs of one operand shape side by
 * side where HPC_DW_GROUP asks for it (program/plan_order.c; BERT-base:
 * 11 Q/K/V, 11 attention-output, 11 FFN up, 11 FFN down).  At small
 * token counts each such GEMM leaves most SMs idle (768 x 768 x 1024:
 * 36-48 tiles for 132 SMs); one call of batch 11 fills them.  Their operands lie anywhere in the arena, so the call takes
 * cuBLASLt's pointer arrays (GemmDesc.pointer_array): device tables of the
 * members' dy, x and dW pointers, written once here since the arena never
 * moves.  The token count (the GEMMs' K) is the call's, so one table
 * serves every B and L.
 *
 * A run is a maximal stretch of consecutive plan positions, inside one of
 * the plan's spans (StepPlan.dw_span_end), whose nodes are LINEAR_DWs on
 * cuBLASLt with equal GEMM descriptors but for their pointers; no member
 * reads another's output (a dW GEMM reads dy and x, never a weight
 * gradient), so the members may run in any order, or at once.  At once
 * needs the plan's span: there every member's inputs live to its end and
 * every output owns its bytes from its start.  Without that (the first
 * form, 2026-12-07) a member's output could share bytes with an earlier
 * member's input, dead by the plan once that member had run: the batched
 * call wrote one over the other (non-finite gradients on an H100; the
 * emulator, computing the members in order, could not show it).
 *
 * cuBLASLt computes each matrix of a batch as a call of its own would
 * with the same algorithm; the batched call may choose another
 * algorithm than the single calls, so the gradients may differ from the
 * unbatched ones in the last bits (fp32 sums in another order), as a new
 * cuBLASLt version's choice would (bench/dw_ptr_check found every
 * candidate equal to one call a layer on an H100).  HPC_DW_BATCH=0 runs
 * every member alone. */
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_exec_internal.h"
#include "util/error.h"

#define NODE(id) (&ex->g->nodes[(id)])

/* Whether node id is a dW GEMM the batch can take: cuBLASLt's plain GEMM,
 * no kernels after it. */
static bool batchable(const CudaExec *ex, int id)
{
    return NODE(id)->op == IR_OP_LINEAR_DW && ex->code[id].kind == EOP_GEMM && ex->code[id].n_phases == 0;
}

/* Whether two dW GEMM descriptors differ only in their pointers. */
static bool same_call(const GemmDesc *a, const GemmDesc *b)
{
    GemmDesc x = *a, y = *b;
    x.A = y.A = x.B = y.B = x.C = y.C = x.D = y.D = 0;
    return memcmp(&x, &y, sizeof x) == 0;
}

/* The run's three pointer tables in one device buffer: dy pointers, x
 * pointers, dW pointers. */
static HpcStatus make_tables(CudaExec *ex, CudaExecDwRun *r, HpcError *err)
{
    int n = r->count;
    CUdeviceptr *host = xmalloc((size_t)3 * n * sizeof *host);
    r->align = 256;
    for (int k = 0; k < n; k++) {
        GemmDesc d;
        cuda_exec_gemm_desc(ex, ex->plan.order[r->first + k], &d);
        host[k] = d.A;
        host[n + k] = d.B;
        host[2 * n + k] = d.C;
        for (int t = 0; t < 3; t++) {
            int a = gemm_alignment(host[t * n + k]);
            if (a < r->align) r->align = a;
        }
    }
    size_t bytes = (size_t)3 * n * sizeof *host;
    HpcStatus st = arena_alloc(&ex->arena, &r->tables, bytes, "dW batch pointer tables", err);
    if (!st) st = CUDA_CHECK(err, cuda_driver()->cuMemcpyHtoD(r->tables, host, bytes));
    free(host);
    return st;
}

HpcStatus cuda_exec_dw_batch_setting(CudaExec *ex, HpcError *err)
{
    const char *env = getenv("HPC_DW_BATCH");
    ex->dw_batch_off = env && strcmp(env, "0") == 0;
    if (env && *env && !ex->dw_batch_off && strcmp(env, "1") != 0)
        return hpc_fail(err, HPC_ERR_USAGE, "HPC_DW_BATCH=%s: expected 1 (a group's dW GEMMs as one batched call, "
                        "the default) or 0 (one by one)", env);
    return HPC_OK;
}

HpcStatus cuda_exec_dw_batch_init(CudaExec *ex, HpcError *err)
{
    if (ex->dw_batch_off) return HPC_OK;
    int n = ex->plan.n_order;
    ex->dw_run_at = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *ex->dw_run_at);
    for (int t = 0; t < n; t++) ex->dw_run_at[t] = -1;
    HpcStatus st = HPC_OK;
    for (int t = 0; t < n && !st;) {
        int id = ex->plan.order[t], len = 1, span_end = ex->plan.dw_span_end[t];
        if (batchable(ex, id)) {
            GemmDesc first, d;
            cuda_exec_gemm_desc(ex, id, &first);
            /* only inside the plan's span, whose inputs live and outputs are written across it (plan.h) */
            while (t + len <= span_end && batchable(ex, ex->plan.order[t + len])) {
                cuda_exec_gemm_desc(ex, ex->plan.order[t + len], &d);
                if (!same_call(&first, &d)) break;
                len++;
            }
        }
        if (len > 1) {
            ex->dw_runs = xrealloc(ex->dw_runs, (size_t)(ex->n_dw_runs + 1) * sizeof *ex->dw_runs);
            CudaExecDwRun *r = &ex->dw_runs[ex->n_dw_runs];
            *r = (CudaExecDwRun){.first = t, .count = len};
            st = make_tables(ex, r, err);
            ex->dw_run_at[t] = ex->n_dw_runs++;
        }
        t += len;
    }
    return st;
}

void cuda_exec_dw_batch_free(CudaExec *ex)
{
    free(ex->dw_runs);
    free(ex->dw_run_at);
    ex->dw_runs = NULL;
    ex->dw_run_at = NULL;
    ex->n_dw_runs = 0;
}

int cuda_exec_dw_batch_len(const CudaExec *ex, int t, int end)
{
    if (!ex->dw_run_at || ex->dw_run_at[t] < 0) return 0;
    const CudaExecDwRun *r = &ex->dw_runs[ex->dw_run_at[t]];
    return t + r->count <= end ? r->count : 0;
}

HpcStatus cuda_exec_dw_batch_launch(CudaExec *ex, int t, HpcError *err)
{
    const CudaExecDwRun *r = &ex->dw_runs[ex->dw_run_at[t]];
    GemmDesc d;
    cuda_exec_gemm_desc(ex, ex->plan.order[t], &d);   /* the shape, K at this run's B and L */
    CUdeviceptr step = (CUdeviceptr)r->count * sizeof(CUdeviceptr);
    d.A = r->tables;
    d.B = r->tables + step;
    d.C = r->tables + 2 * step;
    d.D = 0;
    d.batch = r->count;
    d.pointer_array = true;
    d.pointer_align = r->align;
    return gemm_run(&ex->gemm, &d, err);
}
