/* runtime/cuda/cuda_optim.h — the optimizer step and the loss scaler on the GPU.
 *
 * The device twin of runtime/train/optim.h + runtime/train/lossscale.h + schedule.h,
 * driving the multi-tensor kernels of compiler/kernels/optimizer.cu
 * (compiler/emit_kernels.h): opt_check_norm, opt_decide, [opt_lamb_norms,
 * opt_lamb_ratio,] opt_update, and opt_accumulate for gradient accumulation.
 * Every parameter tensor is cut into chunks of at most CUDA_OPTIM_CHUNK
 * elements (cuda_optim_chunks), so each pass is one launch over all of
 * them with 16-byte accesses.  Everything a step decides lives on the
 * device: the KemitOptState (loss scale, growth tracker, found_inf, the
 * applied-step counter from which bias correction and the learning rate
 * follow, skip counters, last grad norm and lr) and the step's decision
 * that opt_decide writes for the update.  So a step queues kernels and
 * never waits for the device; cuda_optim_read_state reads the state when
 * the host wants to log.
 *
 * Inside the step's CUDA graph.  cuda_optim_step_tail() is a CudaExecTail
 * (runtime/cuda/cuda_exec.h): passed to cuda_exec_launch it queues the
 * optimizer after the backward pass inside the same captured graph, so no
 * host work separates them; train_cuda.c does that.  cuda_optim_step queues
 * the same kernels on their own.
 *
 * Gradients.  The executor leaves each parameter's f32 gradient (times the
 * loss scale) in its arena after a backward run, overwritten by the next
 * run.  With grad_accum == 1 the optimizer reads those directly.  With
 * grad_accum = A > 1 each micro-batch adds grad / A into a buffer per
 * parameter (the first micro-batch overwrites): cuda_optim_accumulate, or
 * the tails, so the optimizer sees the mean over micro-batches, as the cpu
 * trainer's inv_scale = 1 / (scale * A) does.
 *
 * The loss scale feeds the next backward pass without the host: pass
 * cuda_optim_scale_ptr() as CudaRunOptions.loss_scale_dev.
 *
 * Ownership: borrows the executor (which must outlive it); the device
 * buffers (m, v, accumulators, tables, state, partials) come from the
 * executor's arena (counted in its peak) and are released by
 * cuda_optim_free.  A CudaOptim must not move after init (its tails point
 * into it); each init gets new tail keys, so graphs captured with an
 * earlier optimizer are never replayed for a new one.
 *
 * Usage:
 *   CudaOptim o;
 *   if (cuda_optim_init(&o, &ex, &spec, PREC_FP16, total_steps, &err)) return err.code;
 *   for each step: for m in 0..A-1 { cuda_exec_run(...loss_scale_dev = cuda_optim_scale_ptr(&o));
 *                                    cuda_optim_accumulate(&o, m, &err); }
 *                  cuda_optim_step(&o, &err);
 *   KemitOptState s; cuda_optim_read_state(&o, &s, &err);   // waits
 *   cuda_optim_free(&o);
 */
#ifndef HPC_RUNTIME_CUDA_OPTIM_H
#define HPC_RUNTIME_CUDA_OPTIM_H

#include <stdbool.h>
#include <stdint.h>

#include "cuda/cuda_exec.h"
#include "compiler/emit_kernels.h"
#include "util/error.h"
#include "compiler/spec.h"

/* Elements per chunk (OPT_CHUNK in optimizer.cu) and chunks per block of
 * the norm pass (OPT_CHECK_CHUNKS). */
#define CUDA_OPTIM_CHUNK 4096
#define CUDA_OPTIM_CHECK_CHUNKS 4
/* Bytes of the device step decision (opt_step, at most this). */
#define CUDA_OPTIM_DECISION_BYTES 128

/* One chunk: elements [begin, begin + len) of tensor `tensor` (device
 * layout of optimizer.cu's opt_chunk). */
typedef struct {
    uint32_t tensor, len;
    uint64_t begin;
} CudaOptChunk;

/* Cuts tensors of numel[k] elements (k < count) into chunks of at most
 * CUDA_OPTIM_CHUNK, in tensor order, each starting at a multiple of
 * CUDA_OPTIM_CHUNK within its tensor; empty tensors get none.  Writes
 * chunks[] (when not NULL) and chunk_first[0..count] (when not NULL:
 * tensor k's chunks are chunk_first[k] .. chunk_first[k + 1] - 1).
 * Returns the number of chunks. */
int cuda_optim_chunks(const int64_t *numel, int count, CudaOptChunk *chunks, int *chunk_first);

/* Blocks of the norm pass (and partials) for n_chunks chunks. */
int cuda_optim_check_blocks(int n_chunks);

/* Bytes one step moves for these tensors, each element once per pass
 * (AdamW with a 16-bit copy: 34 per parameter); the profile's rate. */
double cuda_optim_step_bytes(const KemitOptTensor *t, int count, SpecOptimizer kind);

/* The kernels of one compiled module. */
typedef struct {
    CUfunction check, decide, lamb_norms, lamb_ratio, update, accumulate;
} CudaOptKernels;

/* Looks the kernels up in a module made from kemit_source(suffix). */
HpcStatus cuda_optim_kernels(CUmodule module, const char *suffix, CudaOptKernels *k, HpcError *err);

/* Device tables and scratch of one set of tensors. */
typedef struct {
    int count, n_chunks, parts;
    CUdeviceptr tensors;      /* (count) KemitOptTensor */
    CUdeviceptr src_grads;    /* (count) u64: the executor's gradients, for opt_accumulate; 0 if unused */
    CUdeviceptr chunks;       /* (n_chunks) CudaOptChunk */
    CUdeviceptr chunk_first;  /* (count + 1) i32 */
    CUdeviceptr state;        /* KemitOptState */
    CUdeviceptr decision;     /* CUDA_OPTIM_DECISION_BYTES */
    CUdeviceptr part_sq, part_inf;   /* (parts) f64, i32 */
    CUdeviceptr part_pu, ratio;      /* LAMB: (n_chunks, 2) f64, (count) f32; else 0 */
    CUdeviceptr poison;       /* i32: set = the next check writes +inf into the first gradient */
    KemitOptParams prm;
} CudaOptPlan;

/* Device allocation for cuda_optim_plan_build (the arena in the trainer,
 * plain cuMemAlloc in tests/gpu). */
typedef HpcStatus (*CudaOptAlloc)(void *ctx, CUdeviceptr *p, size_t bytes, const char *what, HpcError *err);

/* Allocates the tables and scratch for t[0..count) (device pointers in t;
 * src_grads may be NULL), uploads them and *init with the parameters prm,
 * zeroes poison, and waits for the stream. */
HpcStatus cuda_optim_plan_build(CudaOptPlan *p, const KemitOptTensor *t, const uint64_t *src_grads, int count,
                                const KemitOptParams *prm, const KemitOptState *init, CudaOptAlloc alloc,
                                void *ctx, CUstream s, HpcError *err);

/* Queues one optimizer step of plan p: check, decide, [LAMB,] update. */
HpcStatus cuda_optim_queue_step(const CudaOptKernels *k, const CudaOptPlan *p, CUstream s, HpcError *err);

/* Queues acc = (first ? 0 : acc) + src * mul for every tensor (acc is the
 * tensor's grad, src its src_grads entry). */
HpcStatus cuda_optim_queue_accumulate(const CudaOptKernels *k, const CudaOptPlan *p, float mul, int first,
                                      CUstream s, HpcError *err);

typedef struct CudaOptim CudaOptim;

/* What a tail needs: the optimizer and which work it queues. */
typedef struct {
    CudaOptim *o;
    int what;                     /* 0: accumulate (first), 1: accumulate, 2: [accumulate +] step */
} CudaOptTailCtx;

struct CudaOptim {
    CudaExec *ex;                 /* borrowed */
    CUmodule module;              /* kemit_source: the optimizer kernels */
    CudaOptKernels k;
    int count;                    /* tensors updated */
    int *param;                   /* (count) ParamList index of each */
    KemitOptTensor *host_t;       /* (count) host copy of the table */
    CUdeviceptr *acc;             /* (count) f32 accumulators, 0 when grad_accum == 1 */
    CudaOptPlan plan;
    int64_t grad_accum;
    double compile_seconds;
    CudaOptTailCtx tail_ctx[3];
    CudaExecTail tails[3];
};

/* Builds the tensor table from the executor's graph (every parameter with
 * a gradient), allocates zeroed m/v (as the optimizer needs), compiles the
 * kernels for the executor's device (NVRTC disk cache) and uploads the
 * initial state: scale from the spec's loss scaling (1 for none), step 0.
 * policy picks the low copy's dtype (PREC_FP16/PREC_BF16) or none.
 * HPC_ERR_INPUT when the kernels do not support the model's sizes. */
HpcStatus cuda_optim_init(CudaOptim *o, CudaExec *ex, const ModelSpec *spec, SpecPrecision policy,
                          int64_t total_steps, HpcError *err);
void cuda_optim_free(CudaOptim *o);

/* After micro-batch `micro` (0-based) of a step: acc (=|+=) grad / A.
 * Nothing to do when grad_accum == 1. */
HpcStatus cuda_optim_accumulate(CudaOptim *o, int64_t micro, HpcError *err);

/* Queues the optimizer step (check, decide, update); no host wait. */
HpcStatus cuda_optim_step(CudaOptim *o, HpcError *err);

/* The same work as tails of cuda_exec_launch (inside the step's graph):
 * for micro-batch m < A - 1 the accumulation (NULL when A == 1); for the
 * last micro-batch its accumulation (A > 1) and then the step. */
const CudaExecTail *cuda_optim_accumulate_tail(CudaOptim *o, int64_t micro);
const CudaExecTail *cuda_optim_step_tail(CudaOptim *o);

/* Test hook: the next step's check writes +inf into element 0 of the first
 * tensor's gradient (what that step reads), so the step must be skipped.
 * Queued on the stream; works inside a graph replay. */
HpcStatus cuda_optim_poison(CudaOptim *o, HpcError *err);

/* The device loss scale (f32), for CudaRunOptions.loss_scale_dev. */
CUdeviceptr cuda_optim_scale_ptr(const CudaOptim *o);
/* The device state; a DtoD copy source for per-step snapshots. */
CUdeviceptr cuda_optim_state_ptr(const CudaOptim *o);

/* Waits for the stream and reads the state. */
HpcStatus cuda_optim_read_state(CudaOptim *o, KemitOptState *s, HpcError *err);

/* Copies parameter p's f32 master (numel floats) to host memory (waits). */
HpcStatus cuda_optim_read_master(CudaOptim *o, int p, float *out, HpcError *err);

#endif
