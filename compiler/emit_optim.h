/* compiler/emit_optim.h — the optimizer and the loss scaler as part of the
 * step's CUDA module.
 *
 * A training graph's module (compiler/emit_ops.h, eop_module_source) ends
 * with these kernels, so the whole step is one NVRTC compile and one cubin
 * (`hpc compile --arch`), and `--emit-cuda`'s NAME_step.cuh exports the
 * optimizer hpc runs.  They are rendered from one block of CUDA text with
 * one choice: the dtype of the parameters' 16-bit copy the update writes
 * (the graph's f16 or bf16 parameter values; none for an f32 graph).  No
 * model size is baked in: every tensor is described by a device table.
 *
 * Kernels (names fixed; runtime/cuda/cuda_optim.h holds the device structs
 * CudaOptTensor, CudaOptParams, CudaOptState, CudaOptChunk, CudaOptFix and
 * launches them; C = chunks of at most 4096 elements, T = tensors; F = a
 * CudaOptFix per tensor, or NULL: the gradients a fix describes are read as
 * raw * gamma + db * beta, "Deferred fixes" in cuda_optim.h):
 *   opt_check_norm(double *part_sq, int *part_inf, const CudaOptTensor *t, const CudaOptChunk *c,
 *                  int C, const CudaOptState *state, const int *poison, F)   ceil(C/4) x 256
 *       per 4 chunks: sum of (grad / scale)^2 (f64) and a non-finite flag;
 *       copies each fix's gamma and beta into its snap
 *   opt_decide(void *decision, CudaOptState *state, const double *part_sq, const int *part_inf,
 *              int P, CudaOptParams prm, int *poison)                        1 x 1024
 *       skip, norm, clip, lr, bias corrections; loss scaler and step counters
 *   opt_lamb_norms(double *part_pu, const void *decision, const CudaOptTensor *t,
 *                  const CudaOptChunk *c, CudaOptParams prm, F)              C x 256 (LAMB)
 *   opt_lamb_ratio(float *ratio, const double *part_pu, const int *chunk_first,
 *                  const void *decision)                                     T x 256 (LAMB)
 *   opt_update(const void *decision, const CudaOptTensor *t, const CudaOptChunk *c,
 *              const float *lamb_ratio|NULL, CudaOptParams prm, F)           C x 256
 *       AdamW, Adam, SGD(-momentum), LAMB: master, m, v and the 16-bit copy
 *   opt_accumulate(const CudaOptTensor *t, const uint64_t *src, const CudaOptChunk *c,
 *                  float mul, int first, F)                                  C x 256
 *       grad (=|+=) src * mul: gradient accumulation
 *
 * Usage:
 *   eop_module_source(&g, &src, &err);            // a training graph: optimizer included
 *   eopt_module_source(DT_F16, &src, &err);       // the optimizer alone (tests, timing)
 */
#ifndef HPC_COMPILER_EMIT_OPTIM_H
#define HPC_COMPILER_EMIT_OPTIM_H

#include <stdbool.h>

#include "error.h"
#include "program/ir.h"
#include "strbuf.h"

extern const char *const eopt_kernel_names[];
extern const int eopt_kernel_count;

/* Whether g trains anything (some parameter has a gradient). */
bool eopt_wanted(const IrGraph *g);

/* The dtype of g's 16-bit parameter copies (DT_F32 when it has none);
 * HPC_ERR_INTERNAL when g mixes f16 and bf16 copies. */
HpcStatus eopt_low_dtype(const IrGraph *g, DType *low, HpcError *err);

/* Appends the optimizer block writing `low` copies (DT_F32: none). */
void eopt_append(StrBuf *src, DType low);

/* Appends g's optimizer block when g trains; nothing otherwise. */
HpcStatus eopt_render(const IrGraph *g, StrBuf *src, HpcError *err);

/* A whole module: the step prelude and the optimizer block (malloc'd). */
HpcStatus eopt_module_source(DType low, char **source, HpcError *err);

#endif
