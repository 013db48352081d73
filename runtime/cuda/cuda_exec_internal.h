/* runtime/cuda/cuda_exec_internal.h — what the executor's own files share
 * (cuda_exec.c launches; cuda_exec_own.c decides where hpc's own GEMM runs;
 * cuda_exec_profile.c times the launches).  Not
 * for callers of the cuda backend: they use cuda_exec.h. */
#ifndef HPC_RUNTIME_CUDA_EXEC_INTERNAL_H
#define HPC_RUNTIME_CUDA_EXEC_INTERNAL_H

#include "cuda/cuda_exec.h"

/* The GEMM node `id` runs, at the executor's current B and L. */
void cuda_exec_gemm_desc(const CudaExec *ex, int id, GemmDesc *d);

/* Queues node `id`'s work (its GEMM and/or kernels; nothing for uploads and
 * views) on the device stream. */
HpcStatus cuda_exec_launch_node(CudaExec *ex, int id, HpcError *err);

/* Queues the launch at plan position *t, as the step makes it: a batched
 * run of dW GEMMs (cuda_exec_dw_batch.c) starting there is one launch, and
 * *t moves to its last member. */
HpcStatus cuda_exec_launch_at(CudaExec *ex, int *t, int end, HpcError *err);

/* Queues nodes [0, end) of the plan's order, then the tail if any. */
HpcStatus cuda_exec_launch_step(CudaExec *ex, int end, const CudaExecTail *tail, HpcError *err);

/* hpc's own GEMM in the executor (cuda_exec_own.c).  Before the plan:
 * which values its GEMMs write one node early (PlanOptions.write_early;
 * NULL when none, or when the module lacks the kernel, the device is no
 * sm_90 or the program brings its own cubin).  After the module loads: its kernels, as HPC_GEMM_OWN_STORE
 * picks.  After the plan: the pairs (gelu_of, dgelu_of).  At a GEMM
 * node's launch: runs it on the own GEMM where that applies (*done), and
 * notes what it computed of the node after it; that node's launch then
 * starts at cuda_exec_own_first_phase (its phase count: nothing left). */
bool *cuda_exec_own_written_early(const CudaExec *ex);
HpcStatus cuda_exec_own_kernels(CudaExec *ex, HpcError *err);
void cuda_exec_own_pair(CudaExec *ex);
HpcStatus cuda_exec_own_launch(CudaExec *ex, int id, const GemmDesc *d, bool *done, HpcError *err);
int cuda_exec_own_first_phase(const CudaExec *ex, int id);

/* The batched dW GEMMs (cuda_exec_dw_batch.c).  _setting, first thing
 * in set-up: reads HPC_DW_BATCH into ex->dw_batch_off (HPC_ERR_USAGE for
 * a value other than 0, 1 or empty).  _init, after the kernels are looked
 * up: finds the runs and writes their pointer tables (nothing under
 * HPC_DW_BATCH=0).  _len: the length of the run that starts at plan
 * position t, if it ends by `end`; else 0 (its members then run alone).
 * _launch: queues that run as one call. */
HpcStatus cuda_exec_dw_batch_setting(CudaExec *ex, HpcError *err);
HpcStatus cuda_exec_dw_batch_init(CudaExec *ex, HpcError *err);
void cuda_exec_dw_batch_free(CudaExec *ex);
int cuda_exec_dw_batch_len(const CudaExec *ex, int t, int end);
HpcStatus cuda_exec_dw_batch_launch(CudaExec *ex, int t, HpcError *err);

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
