/* runtime/cuda/cuda_exec_internal.h — what the executor's own files share
 * (cuda_exec.c launches; cuda_exec_profile.c times those launches).  Not
 * for callers of the cuda backend: they use cuda_exec.h. */
#ifndef HPC_RUNTIME_CUDA_EXEC_INTERNAL_H
#define HPC_RUNTIME_CUDA_EXEC_INTERNAL_H

#include "cuda/cuda_exec.h"

/* The GEMM node `id` runs, at the executor's current B and L. */
void cuda_exec_gemm_desc(const CudaExec *ex, int id, GemmDesc *d);

/* Queues node `id`'s work (its GEMM and/or kernels; nothing for uploads and
 * views) on the device stream. */
HpcStatus cuda_exec_launch_node(CudaExec *ex, int id, HpcError *err);

/* Queues nodes [0, end) of the plan's order, then the tail if any. */
HpcStatus cuda_exec_launch_step(CudaExec *ex, int end, const CudaExecTail *tail, HpcError *err);

/* HPC_PROFILE (docs/cuda.md): unset, "" or "0" is off; "graph" or
 * "graph:N" times the step inside a CUDA graph, over N replays (default
 * CUDA_EXEC_PROFILE_REPLAYS); anything else the eager profile.  A bad N
 * fails with HPC_ERR_USAGE. */
typedef enum { CUDA_PROFILE_OFF, CUDA_PROFILE_EAGER, CUDA_PROFILE_GRAPH } CudaProfileMode;
#define CUDA_EXEC_PROFILE_REPLAYS 5
#define CUDA_EXEC_PROFILE_MAX_REPLAYS 100
HpcStatus cuda_exec_profile_mode(CudaProfileMode *mode, int *replays, HpcError *err);

/* The eager profile: nodes [0, end) with a CUDA event after each, then the
 * tail as one row; waits, and prints the tables to stderr. */
HpcStatus cuda_exec_profile_eager(CudaExec *ex, int end, const CudaExecTail *tail, HpcError *err);

/* The graph profile: nodes [0, end) captured twice, once with an event
 * record node after each launching node and once without; both replayed
 * `replays` times in turn (no side effects: a replay without the tail only
 * rewrites the step's own values), then the tail queued once after the last
 * replay, so the call is one step.  Prints the per-node medians as the
 * eager tables, with the plain replay's median beside their sum.  The
 * shape's GEMM algorithms must be chosen already (an eager run first). */
HpcStatus cuda_exec_profile_graph(CudaExec *ex, int end, const CudaExecTail *tail, int replays, HpcError *err);

#endif
