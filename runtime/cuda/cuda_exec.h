/* runtime/cuda/cuda_exec.h — the cuda backend: runs an IR graph on one GPU.
 *
 * The device twin of runtime/cpu/cpu_exec.h, with the same semantics (it is
 * checked against it: tests/gpu/gpu_step.c).  cuda_exec_init binds a graph
 * once:
 *   - plans the step for the bounds B, L (program/plan.h: schedule,
 *     liveness, best-fit arena offsets) and allocates the arena in one
 *     cuMemAlloc, plus the parameter storage (f32 masters and the fp16/bf16
 *     copies the precision plan asks for) and a small control block;
 *   - compiles the step program's module of per-op kernels (specialised on
 *     the model's sizes, B and L are arguments) once for the device's arch
 *     through the NVRTC disk cache (runtime/cuda/nvrtc_compile.h), then
 *     looks up every kernel; launch shapes for a run's B, L come from the
 *     program's launch records (step_node_launch), never from new code;
 *   - sets up cuBLASLt (runtime/cuda/gemm_cublas.h) for LINEAR, MATMUL,
 *     LINEAR_DX and LINEAR_DW (fp32 accumulation, TF32 off).
 * cuda_exec_run then queues one step on the device's stream: the batch
 * fields and the control block (dropout seed and step, training flag, loss
 * scale) are copied to the device, then every node in schedule order is a
 * kernel launch or a GEMM.  Nothing in a step waits for the device; read
 * results with cuda_exec_loss / cuda_exec_read, which synchronise.  With
 * CudaRunOptions.graph the launches of a (B, L, backward) shape are
 * captured into a CUDA graph the second time that shape runs and replayed
 * afterwards (the control block lives in device memory, so a replay sees
 * the new seed, step and loss scale).
 *
 * Batch checks happen on the host before anything is queued: B and L within
 * the bounds, ids inside their tables, positions inside max_positions,
 * labels in range or -100 (HPC_ERR_INPUT, as the cpu backend).
 *
 * HPC_PROFILE=1: an eager run with per-node CUDA events; HPC_PROFILE=graph[:N]:
 * the nodes timed inside a CUDA graph, medians of N replays; tables to
 * stderr (runtime/cuda/cuda_exec_profile.c, docs/perf.md).
 *
 * Ownership: the executor borrows the graph, the parameter list and the
 * device (all must outlive it); it owns every device buffer it allocates.
 *
 * Usage:
 *   CudaExec ex;
 *   if (cuda_exec_init(&ex, &dev, &g, &pl, B_max, L_max, &err)) return err.code;
 *   cuda_exec_set_params(&ex, store.w, &err);       // host f32 per parameter
 *   CudaRunOptions o = {.training = true, .backward = true, .seed = 42, .loss_scale = 1};
 *   cuda_exec_run(&ex, batch, &o, &err);
 *   double loss; cuda_exec_loss(&ex, &loss, &err);
 *   cuda_exec_read(&ex, g.param_grad[p], host_f32, &err);
 *   cuda_exec_free(&ex);
 */
#ifndef HPC_RUNTIME_CUDA_EXEC_H
#define HPC_RUNTIME_CUDA_EXEC_H

#include <stdbool.h>
#include <stdint.h>

#include "data/batch.h"
#include "cuda/cuda_driver.h"
#include "cuda/device_arena.h"
#include "program/step_program.h"
#include "util/error.h"
#include "cuda/gemm_cublas.h"
#include "cuda/gemm_own.h"
#include "program/ir.h"
#include "program/params.h"
#include "program/plan.h"

/* Work queued after the step's own launches on the same stream and, when
 * the step runs as a CUDA graph, captured into that graph: the optimizer
 * step of runtime/cuda/cuda_optim.h, so nothing of the host runs between
 * the backward pass and the update.  `key` tells graphs apart: the same
 * (B, L, backward) with another tail is another graph (0 is no tail).
 * HPC_PROFILE times the tail as one row named `label`, its rate from
 * `bytes`. */
typedef struct {
    HpcStatus (*queue)(void *ctx, CUstream stream, HpcError *err);
    void *ctx;
    uint64_t key;
    const char *label;
    double bytes;
    bool applies_fixes;        /* the tail applies the trailing fixes itself (CudaExec.fix_from):
                                  the step's launches stop before them */
} CudaExecTail;

typedef struct {
    bool training;             /* dropout on */
    bool backward;             /* run the backward part too */
    uint64_t seed;             /* dropout seed */
    uint32_t step;             /* micro-step counter for dropout */
    double loss_scale;         /* d(loss) seed of the backward pass */
    CUdeviceptr loss_scale_dev;/* if not 0: a device f32 that replaces loss_scale,
                                  read on the stream (the device loss scaler's) */
    bool graph;                /* capture / replay the step as a CUDA graph */
    const CudaExecTail *tail;  /* queued after the step (in its graph), or NULL */
} CudaRunOptions;

#define CUDA_EXEC_MAX_GRAPHS 8

/* Consecutive dW GEMMs of one shape run as one batched call
 * (runtime/cuda/cuda_exec_dw_batch.c). */
typedef struct {
    int first, count;          /* plan positions [first, first + count) */
    CUdeviceptr tables;        /* device: count dy pointers, count x pointers, count dW pointers */
    int align;                 /* the smallest alignment of those matrices, bytes */
} CudaExecDwRun;

typedef struct {
    int64_t B, L;
    bool backward;
    uint64_t tail_key;         /* CudaExecTail.key of the graph's tail, 0 for none */
    int runs;                  /* eager runs of this shape so far */
    CUgraphExec exec;          /* 0 until captured */
} CudaExecGraph;

typedef struct {
    const IrGraph *g;          /* borrowed */
    const ParamList *pl;       /* borrowed */
    CudaDevice *dev;           /* borrowed */
    StepPlan plan;
    DeviceArena arena;
    GemmContext gemm;
    bool gemm_ready;
    CUmodule module;
    GemmOwnKernel gemm_own;       /* hpc's own GEMM for f16 linear forwards (HPC_GEMM_OWN, runtime/cuda/gemm_own.h); fn NULL if none */
    GemmOwnKernel gemm_own_gelu;  /* its variant that also writes gelu(y) */
    GemmOwnKernel gemm_own_dx;    /* the ping-pong dX + GELU backward (HPC_GEMM_OWN_STORE=pingpong, the default); fn NULL if none */
    bool gemm_own_gelu_only;      /* HPC_GEMM_OWN=gelu (the default): only the linears that compute their GELU run on it */
    int *gelu_of;              /* (g->n) with gemm_own: the GELU node a LINEAR's launch computes too, or -1 */
    int *dgelu_of;             /* (g->n) with gemm_own: the ACT_BWD_BGRAD whose first phase a LINEAR_DX's
                                * launch computes too, or -1 (runtime/cuda/cuda_exec_own.c) */
    bool *computed_by_gemm;    /* (g->n) with gemm_own: whether that node's GEMM, at its last launch, did
                                * its work too (then its launch is skipped, or starts at the last phase) */
    const StepKernels *kernels;/* launch records and source (borrowed, or owned_kernels) */
    StepKernels *owned_kernels;/* cuda_exec_init's own, else NULL */
    CUfunction (*fn)[EOP_MAX_PHASES];   /* (g->n) kernels of each node */
    EopNodeCode *code;         /* (g->n) launch shapes for code_B, code_L */
    int64_t code_B, code_L;
    CUdeviceptr *param_dev;    /* (g->n) storage of each PARAM node, 0 for other nodes */
    CUdeviceptr *master;       /* (pl->n) f32 master of each parameter that owns storage */
    CUdeviceptr ctl;           /* EopCtl */
    EopCtl ctl_host;
    CudaExecGraph graphs[CUDA_EXEC_MAX_GRAPHS];
    int n_graphs;
    int fix_from;              /* the trailing fixes: nodes [fix_from, g->n) are the LN_DW_FIX(_DB)s that
                                * compiler/fuse_ln_dw.c put last, their views and outputs (g->n: none).
                                * A tail with applies_fixes reads their raw gradients and fixes them
                                * itself (runtime/cuda/cuda_optim.h), so a run with it stops there */
    bool fixes_pending;        /* the last run stopped before the trailing fixes: their values were
                                * never written (cuda_exec_read refuses them) */
    int64_t B, L;              /* binding of the last run */
    double compile_seconds;    /* NVRTC (or cache) time of the module */
    bool cache_hit;            /* no NVRTC ran: a cache hit or the program's cubin */
    bool cubin_from_program;   /* the program carried the cubin for this arch */
    bool module_sm90a;         /* the module was compiled for sm_90a (StepPhase.target) */
    bool dw_batch_off;         /* HPC_DW_BATCH=0: a group's dW GEMMs one by one */
    CudaExecDwRun *dw_runs;    /* the batched dW GEMMs (none under HPC_DW_BATCH=0) */
    int n_dw_runs;
    int *dw_run_at;            /* (plan.n_order) the run starting at that position, or -1; NULL if off */
} CudaExec;

/* Plans, allocates and compiles as described above, from a step program's
 * launch records and CUDA source (program/step_program.h; borrowed, must
 * outlive ex): one NVRTC compile (or cache hit) for every B, L.  HPC_ERR_OOM
 * when the plan does not fit (the message gives the figure), HPC_ERR_CUDA
 * for a failed compile or load, HPC_ERR_INPUT for records that do not match
 * the graph. */
HpcStatus cuda_exec_init_kernels(CudaExec *ex, CudaDevice *dev, const IrGraph *g, const ParamList *pl,
                                 const StepKernels *kernels, int64_t max_B, int64_t max_L, HpcError *err);
/* The same with the step plan's options (program/plan.h, PlanOptions;
 * NULL = the default): keep_all for a test that reads every value. */
HpcStatus cuda_exec_init_kernels_with(CudaExec *ex, CudaDevice *dev, const IrGraph *g, const ParamList *pl,
                                      const StepKernels *kernels, int64_t max_B, int64_t max_L,
                                      const PlanOptions *plan, HpcError *err);

/* The same for a graph built in-process (tests, tools): generates the
 * records and source with the emitter first (runtime/cuda/cuda_exec_graph.c,
 * through compiler/step_program_build.h); _with takes the plan's options. */
HpcStatus cuda_exec_init(CudaExec *ex, CudaDevice *dev, const IrGraph *g, const ParamList *pl,
                         int64_t max_B, int64_t max_L, HpcError *err);
HpcStatus cuda_exec_init_with(CudaExec *ex, CudaDevice *dev, const IrGraph *g, const ParamList *pl,
                              int64_t max_B, int64_t max_L, const PlanOptions *plan, HpcError *err);
void cuda_exec_free(CudaExec *ex);

/* Uploads every parameter from host f32 tensors w[p] (laid out as the
 * parameter's dims; tied parameters are skipped) into its master, and
 * writes the fp16/bf16 copies (round to nearest even, runtime/cpu/half.h).
 * Synchronous. */
HpcStatus cuda_exec_set_params(CudaExec *ex, float *const *w, HpcError *err);

/* Queues one step (see the header comment); returns without waiting.
 * The same as cuda_exec_stage then cuda_exec_launch with the same opts. */
HpcStatus cuda_exec_run(CudaExec *ex, const Batch *batch, const CudaRunOptions *opts, HpcError *err);

/* The two halves of cuda_exec_run: stage checks the batch and queues its
 * upload and the control block (the batch may be freed on return); launch
 * queues the step's kernels (and opts->tail).  A trainer stages the last
 * micro-batch, then launches it with the optimizer as the tail once it
 * knows the step (train_cuda.c).  Nothing may run on the executor between
 * the two. */
HpcStatus cuda_exec_stage(CudaExec *ex, const Batch *batch, const CudaRunOptions *opts, HpcError *err);
HpcStatus cuda_exec_launch(CudaExec *ex, const CudaRunOptions *opts, HpcError *err);

/* Waits for the stream. */
HpcStatus cuda_exec_sync(CudaExec *ex, HpcError *err);

/* The scalar loss of the last run (waits). */
HpcStatus cuda_exec_loss(CudaExec *ex, double *loss, HpcError *err);

/* Copies float value v of the last run to out (numel under the last run's
 * B, L), converted to f32 (waits).  HPC_ERR_USAGE for an integer value,
 * and for a value of the trailing fixes after a run whose tail applied
 * them (the optimizer has changed gamma and beta since: run without the
 * tail to read those gradients). */
HpcStatus cuda_exec_read(CudaExec *ex, int v, float *out, HpcError *err);

/* Device pointer of value v (arena or parameter storage).  After a
 * backward run, cuda_exec_ptr(ex, g->param_grad[p]) is parameter p's
 * gradient (times the loss scale) in its node's dtype (f32, or 16 bits
 * for a LINEAR's weight or a Q/K/V bias under HPC_WEIGHT_GRAD=low:
 * compiler/precision.h), valid until the next run; but not for a value
 * of the trailing fixes (v >= fix_from) after a run whose tail applied
 * them: that run never wrote it. */
CUdeviceptr cuda_exec_ptr(const CudaExec *ex, int v);

/* Storage of parameter p (an index of the ParamList that owns storage) in
 * dtype dt: the f32 master for DT_F32, the low copy the graph reads for
 * DT_F16 / DT_BF16, or 0 when the graph has no such copy.  This is what a
 * fused optimizer updates (CudaOptTensor.master / .low). */
CUdeviceptr cuda_exec_param_ptr(const CudaExec *ex, int p, DType dt);

#endif
