/* runtime/cuda/cuda_optim.h — the optimizer step and the loss scaler on the GPU.
 *
 * The device twin of runtime/train/optim.h + runtime/train/lossscale.h + schedule.h,
 * driving the fused multi-tensor kernels of compiler/kernels/optimizer.cu
 * (compiler/emit_kernels.h: opt_check_norm, [opt_lamb_norms,
 * opt_lamb_ratio,] opt_update, opt_finish).  Everything a step decides
 * lives in one device KemitOptState: the loss scale, the growth tracker,
 * found_inf, the applied-step counter (bias correction and the learning
 * rate, computed on the device from the schedule's parameters), the skip
 * counters, the last grad norm and lr.  So a step queues kernels and never
 * waits for the device; cuda_optim_read_state reads it when the host wants
 * to log.
 *
 * Gradients.  The executor leaves each parameter's f32 gradient (times the
 * loss scale) in its arena after a backward run, overwritten by the next
 * run.  With grad_accum == 1 the optimizer reads those directly.  With
 * grad_accum = A > 1 cuda_optim_accumulate, called after each micro-batch,
 * adds grad / A into a buffer per parameter (the first micro-batch
 * overwrites), so the optimizer sees the mean over micro-batches, as the
 * cpu trainer's inv_scale = 1 / (scale * A) does.
 *
 * The loss scale feeds the next backward pass without the host: pass
 * cuda_optim_scale_ptr() as CudaRunOptions.loss_scale_dev.
 *
 * Ownership: borrows the executor (which must outlive it); the device
 * buffers (m, v, accumulators, state, partials) come from the executor's
 * arena (counted in its peak) and are released by cuda_optim_free.
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

/* Blocks of the norm pass (opt_check_norm's P) and of the update pass. */
#define CUDA_OPTIM_PARTS 264
#define CUDA_OPTIM_UPDATE_BLOCKS 1056

typedef struct {
    CudaExec *ex;                 /* borrowed */
    CUmodule module;              /* kemit_source: the optimizer kernels */
    CUmodule acc_module;          /* the gradient accumulation kernel */
    CUfunction check, lamb_norms, lamb_ratio, update, finish, accumulate;
    int count;                    /* tensors updated */
    int *param;                   /* (count) ParamList index of each */
    KemitOptTensor *host_t;       /* (count) host copy of the table */
    CUdeviceptr *acc;             /* (count) f32 accumulators, 0 when grad_accum == 1 */
    CUdeviceptr tensors;          /* (count) KemitOptTensor */
    CUdeviceptr state;            /* KemitOptState */
    CUdeviceptr part_sq, part_inf;/* (PARTS) f64, i32 */
    CUdeviceptr part_pu, ratio;   /* LAMB: (count, PARTS, 2) f64, (count) f32 */
    KemitOptParams prm;
    int64_t grad_accum;
    double compile_seconds;
} CudaOptim;

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

/* Queues the optimizer step (check, update, scaler); no host wait. */
HpcStatus cuda_optim_step(CudaOptim *o, HpcError *err);

/* Test hook: writes +inf into element 0 of the first tensor's gradient
 * (what the next cuda_optim_step reads), so that step must be skipped. */
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
