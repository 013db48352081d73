/* runtime/cuda/cuda_exec_graph.c — cuda_exec_init for a graph built in the
 * same process (tests and tools): the emitter, through the compiler's door
 * (compiler/step_program_build.h, step_program_kernels_build), makes the
 * launch records and source a step program would carry, then
 * cuda_exec_init_kernels runs as for a program.  Apart from cuda_exec.c so
 * that a program running a compiled artifact does not link the emitter. */
#include "cuda/cuda_exec.h"

#include <stdlib.h>

#include "compiler/step_program_build.h"

HpcStatus cuda_exec_init(CudaExec *ex, CudaDevice *dev, const IrGraph *g, const ParamList *pl,
                         int64_t max_B, int64_t max_L, HpcError *err)
{
    return cuda_exec_init_with(ex, dev, g, pl, max_B, max_L, NULL, err);
}

HpcStatus cuda_exec_init_with(CudaExec *ex, CudaDevice *dev, const IrGraph *g, const ParamList *pl,
                              int64_t max_B, int64_t max_L, const PlanOptions *plan, HpcError *err)
{
    StepKernels *k = xcalloc(1, sizeof *k);
    HpcStatus st = step_program_kernels_build(g, k, err);
    if (st) {
        free(k);
        return st;
    }
    st = cuda_exec_init_kernels_with(ex, dev, g, pl, k, max_B, max_L, plan, err);
    if (st) {
        step_kernels_free(k);
        free(k);
        return st;
    }
    ex->owned_kernels = k;
    return HPC_OK;
}
