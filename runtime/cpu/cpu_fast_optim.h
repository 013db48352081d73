/* runtime/cpu/cpu_fast_optim.h — the host optimizer step (runtime/train/optim.h)
 * on every core, for the cpu backend's fast mode.
 *
 * Promise: the contract of optim_step.  The update of each element is
 * optim_apply's own arithmetic (the tensors are cut into slices that are
 * updated by optim_apply), so with the same gradient norm every weight,
 * m and v is bitwise what optim_step writes.  The gradient norm is summed
 * in f64 over fixed chunks of FAST_OPTIM_CHUNK elements of the tensors laid
 * end to end, and the chunk sums are added in order: the norm, and hence
 * every result, is the same on any thread count, but may differ from
 * optim_step's single running sum in the last bits (f64 rounding).  LAMB
 * (a norm per tensor before any update) is updated by optim_apply whole.
 * AdamW (the fine-tuning default) has its own loop, four f64 lanes with
 * AVX2 (HPC_FAST_GEMM_PORTABLE=1: the scalar loop), doing optim_apply's
 * operations in its order: bitwise the same (perf, 20 MiniLM steps: 3.8x
 * fewer cycles than optim_apply's scalar loop). */
#ifndef HPC_RUNTIME_CPU_FAST_OPTIM_H
#define HPC_RUNTIME_CPU_FAST_OPTIM_H

#include "train/optim.h"

#define FAST_OPTIM_CHUNK ((int64_t)1 << 16)

void fast_optim_step(const OptimConfig *cfg, OptimState *state, OptimTensor *tensors, int count,
                     float inv_scale, double lr, OptimReport *report);

#endif
