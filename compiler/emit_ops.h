/* compiler/emit_ops.h — CUDA source for every IR op kind, one kernel per
 * (op, dtypes, constant sizes, attributes), and how to launch it.
 *
 * The cuda executor (runtime/cuda/cuda_exec.h) runs a graph node by node:
 *   EOP_NONE     PARAM: storage bound by the executor, nothing to run;
 *   EOP_UPLOAD   a batch INPUT: the executor copies the field from the host;
 *   EOP_GEMM     LINEAR, MATMUL, LINEAR_DX, LINEAR_DX_ACC, LINEAR_DW, LINEAR_DW_BGRAD: one
 *                cuBLASLt GEMM (runtime/cuda/gemm_cublas.h), then the node's
 *                phases if any (a bias add when the bias cannot use the GEMM
 *                epilogue; LINEAR_DW_BGRAD's column sums into db, only where
 *                cuBLASLt has no BGRADB algorithm);
 *   EOP_KERNELS  everything else: 1..EOP_MAX_PHASES emitted kernels launched
 *                in order on the stream.
 * Every emitted kernel has the one signature
 *   extern "C" __global__ void NAME(EopArgs a)
 * so the executor launches any of them the same way: a.y is the node's
 * output, a.x[k] its inputs, a.scratch the node's scratch in the arena
 * (eop_scratch_bytes; the planner places it), a.ctl the step's EopCtl in
 * device memory (dropout seed and step, training flag, loss scale: read on
 * the device so a captured CUDA graph replays any step), a.B and a.L the
 * run's batch and padded length.  Every other size is a constant in the
 * kernel's text.
 *
 * Names say what a kernel does, its output dtype and its row size, plus six
 * hex digits of an FNV-1a hash of its text: `add_f16_n128_3fa9c1`,
 * `ln_fwd_f32_h768_0b12ee`.  Nodes with identical kernels share one.
 *
 * Semantics are those of runtime/cpu/cpu_exec.c (the cpu backend): compute in
 * f32 (sums of losses and column reductions in double), inputs converted
 * from their storage dtype, the result rounded once to the output's dtype;
 * dropout draws runtime/cpu/philox.h's mask with the device Philox of
 * compiler/kernels/philox.cu (index = flat element index, salt = the op's
 * salt attribute).  Known difference: an embedding id outside the table
 * gives NaN on the device (the executor checks ids on the host first).
 *
 * Usage:
 *   char *src;
 *   if (eop_module_source(&g, &src, &err)) return err.code;   // NVRTC, sm_80+
 *   StepKernels k;                             // records + source, for B, L open
 *   eop_kernels_build(&g, &k, &err);
 *   EopNodeCode c;
 *   step_node_launch(&k.node[id], B, L, &c);  // grids for one run
 *   free(src);
 */
#ifndef HPC_COMPILER_EMIT_OPS_H
#define HPC_COMPILER_EMIT_OPS_H

#include <stdbool.h>
#include <stdint.h>

#include "error.h"
#include "program/ir.h"
#include "program/step_program.h"   /* EopKind, EopArgs, EopCtl, StepNodeCode */

/* One translation unit with every kernel the graph needs (malloc'd, caller
 * frees), for NVRTC with --gpu-architecture=sm_80 or newer; it includes no
 * headers.  HPC_ERR_INPUT for a node the GPU path does not support (an f64
 * value, a GEMM with mixed operand dtypes); HPC_ERR_INTERNAL if the device
 * Philox template (compiler/kernels/philox.cu) is missing from the build. */
HpcStatus eop_module_source(const IrGraph *g, char **source, HpcError *err);

/* The launch record of node id: kind, kernel names, launch types, and
 * counts and scratch as functions of B and L.  Same errors as
 * eop_module_source for that node. */
HpcStatus eop_node_record(const IrGraph *g, int id, StepNodeCode *rec, HpcError *err);

/* Every node's record and the module source (what a StepProgram carries). */
HpcStatus eop_kernels_build(const IrGraph *g, StepKernels *k, HpcError *err);

/* How to run node id for a run of B, L: eop_node_record evaluated by
 * step_node_launch, as from a module not built for sm_90a. */
HpcStatus eop_node_code(const IrGraph *g, int id, int64_t B, int64_t L, EopNodeCode *code,
                        HpcError *err);

/* Bytes of scratch node id's kernels need for B, L (0 for most ops). */
int64_t eop_scratch_bytes(const IrGraph *g, int id, int64_t B, int64_t L);

/* Number of distinct kernels in the module of g (for reports and tests). */
int eop_kernel_count(const IrGraph *g);

#endif
