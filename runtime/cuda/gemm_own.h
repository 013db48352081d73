/* runtime/cuda/gemm_own.h — hpc's own GEMM (compiler/kernels/gemm_wgmma_tma.cu:
 * TMA, wgmma, 128 x 256 tiles, a persistent grid) in place of cuBLASLt for the step's f16
 * linear forwards, under HPC_GEMM_OWN=1.  An experiment until its A/B on a
 * GPU says otherwise: off by default.
 *
 * The compiler appends the kernel to the step module when HPC_GEMM_OWN=1
 * (compiler/emit_ops.c), with the line STEP_SOURCE_GEMM_OWN_MARK
 * (program/step_program.h); the executor then
 * compiles the module for sm_90a (wgmma needs the architecture-specific
 * target) on an sm_90 device, and looks the kernel up.  Anywhere else
 * (another GPU, a program's own cubin) the GEMMs stay cuBLASLt's.
 * A LINEAR whose GELU node runs right after it computes that GELU too
 * (GEMM_OWN_GELU_KERNEL) and the GELU node's launch is skipped: the
 * executor asks the plan to give the GELU output its bytes from the
 * LINEAR on (PlanOptions.write_early), so `hpc compile --plan` and the
 * memory check, which plan without it, can differ from such a run by
 * those few ranges.
 *
 *   if (gemm_own_fits(&desc)) st = gemm_own_run(fn, &desc, 0, dev->sm_count, stream, &err);
 *   else st = gemm_run(&gemm, &desc, &err);
 */
#ifndef HPC_RUNTIME_CUDA_GEMM_OWN_H
#define HPC_RUNTIME_CUDA_GEMM_OWN_H

#include <stdbool.h>

#include "cuda/gemm_cublas.h"
#include "util/error.h"

#define GEMM_OWN_KERNEL "gemm_tma_bias_f16"
#define GEMM_OWN_GELU_KERNEL "gemm_tma_bias_gelu_f16"   /* also writes gelu(y) */
#define GEMM_OWN_SMEM_BYTES (4 * (128 + 256) * 64 * 2 + 1024 + 2 * 4 * 8)   /* GT_SMEM_BYTES */

/* Whether the module source carries the kernel (the compiler's mark). */
bool gemm_own_in_source(const char *source);

/* Whether the kernel computes d: y (M, N) = x (M, K) W^T + b, f16 in and
 * out, packed, one matrix, N a multiple of 256 and K of 64 (M any). */
bool gemm_own_fits(const GemmDesc *d);

/* The TMA map of a (rows, k) row-major f16 operand as the kernel reads it:
 * boxes of 64 k by box_rows rows (128 for x, 256 for W) in the 128-byte
 * swizzle; rows past the matrix read as zeros. */
HpcStatus gemm_own_tensor_map(CUtensorMap *map, CUdeviceptr p, int64_t rows, int64_t k, unsigned box_rows,
                              HpcError *err);

/* Queues it on stream: the tensor maps of x and W, then the launch of at
 * most `blocks` blocks (the device's SM count: the grid is persistent,
 * one block an SM); f is GEMM_OWN_KERNEL's function, or with gelu
 * (gelu(y), y's layout) not 0 GEMM_OWN_GELU_KERNEL's. */
HpcStatus gemm_own_run(CUfunction f, const GemmDesc *d, CUdeviceptr gelu, int blocks, CUstream stream,
                       HpcError *err);

#endif
