/* runtime/cuda/gemm_own.h — hpc's own GEMM (compiler/kernels/gemm_wgmma_tma.cu:
 * TMA, wgmma, 128 x 256 tiles, a persistent grid, each tile stored
 * through shared memory by the TMA or directly; gemm_wgmma_pp.cu: 128 x
 * 128 tiles, one a multiplying warpgroup, each tile's epilogue beside the
 * other warpgroup's multiplications) in place of cuBLASLt for
 * the step's f16 linears followed by a GELU (the default, HPC_GEMM_OWN
 * unset or =gelu: the FFN-up with its bias and GELU, and with the
 * ping-pong kernels, the default store, the FFN-down's dX GEMM with the
 * GELU's backward; 1.7-2.9 % off BERT-base's step at 32 x 128 and
 * 256 x 128 on an H100, twenty-ninth session) or every f16 linear
 * forward it fits (HPC_GEMM_OWN=1); HPC_GEMM_OWN=0 leaves every GEMM to
 * cuBLASLt.
 *
 * The compiler appends the kernels to the step module of a graph with an
 * f16 linear + GELU (compiler/emit_ops.c), with the line STEP_SOURCE_GEMM_OWN_MARK
 * (program/step_program.h); the executor then
 * compiles the module for sm_90a (wgmma needs the architecture-specific
 * target) on an sm_90 device, and looks the kernel up.  Anywhere else
 * (another GPU, a program's own cubin) the GEMMs stay cuBLASLt's.
 * A LINEAR whose GELU node runs right after it computes that GELU too
 * (GEMM_OWN_GELU_KERNEL) and the GELU node's launch is skipped: the
 * executor asks the plan to give the GELU output its bytes from the
 * LINEAR on (PlanOptions.write_early), so `hpc compile --plan` and the
 * memory check, which plan without it, can differ from such a run by
 * those few ranges.  With the ping-pong kernels the FFN's second linear's
 * dX GEMM also does the GELU backward's first phase after it
 * (GEMM_OWN_PP_DX_DGELU_KERNEL).  Which node pairs, and when:
 * runtime/cuda/cuda_exec_own.c.
 *
 *   GemmOwnKernel k = {fn, GEMM_OWN_PINGPONG, 0};   // fn: GEMM_OWN_PP_KERNEL's function
 *   if (gemm_own_fits(&desc) && gemm_own_fills(&k, &desc, dev->sm_count))
 *       st = gemm_own_run(&k, &desc, 0, dev->sm_count, stream, &err);
 *   else st = gemm_run(&gemm, &desc, &err);
 */
#ifndef HPC_RUNTIME_CUDA_GEMM_OWN_H
#define HPC_RUNTIME_CUDA_GEMM_OWN_H

#include <stdbool.h>

#include "cuda/gemm_cublas.h"
#include "util/error.h"

/* How a kernel stores its tiles, and so which kernel it is
 * (HPC_GEMM_OWN_STORE picks, gemm_own_store): from registers; staged in
 * shared memory for TMA stores (the _ts kernels: the stores overlap the
 * warps' next work); or staged so, by the ping-pong kernels
 * (gemm_wgmma_pp.cu), whose whole epilogue overlaps the other
 * warpgroup's multiplications. */
typedef enum { GEMM_OWN_DIRECT, GEMM_OWN_TMA_STORE, GEMM_OWN_PINGPONG } GemmOwnStore;

#define GEMM_OWN_KERNEL "gemm_tma_bias_f16"
#define GEMM_OWN_GELU_KERNEL "gemm_tma_bias_gelu_f16"   /* also writes gelu(y) */
#define GEMM_OWN_TS_KERNEL "gemm_tma_bias_f16_ts"
#define GEMM_OWN_TS_GELU_KERNEL "gemm_tma_bias_gelu_f16_ts"
#define GEMM_OWN_PP_KERNEL "gemm_pp_bias_f16"
#define GEMM_OWN_PP_GELU_KERNEL "gemm_pp_bias_gelu_f16"
#define GEMM_OWN_SMEM_BYTES (4 * (128 + 256) * 64 * 2 + 1024 + 2 * 4 * 8)   /* GT_SMEM_BYTES */
#define GEMM_OWN_TS_SMEM_BYTES (4 * (128 + 256) * 64 * 2 + 128 * 128 * 2 + 1024 + (2 * 4 + 4) * 8)   /* GT_TS_SMEM_BYTES */
#define GEMM_OWN_PP_SMEM_BYTES (5 * (128 + 128) * 64 * 2 + 4 * 64 * 128 * 2 + 1024 + (2 * 5 + 10) * 8)   /* GP_SMEM_BYTES */

/* One of the kernels as looked up in a module. */
typedef struct {
    CUfunction fn;
    GemmOwnStore store;
    int64_t min_tiles;   /* 0: gemm_own_fills' rule; else the tiles a shape needs (HPC_GEMM_OWN_MIN_TILES) */
} GemmOwnKernel;

/* The name of the kernel that stores so, with or without the GELU. */
const char *gemm_own_kernel_name(GemmOwnStore store, bool gelu);

/* Kernel `name` of module mod into *k, allowed the shared memory its
 * store takes (the dX kernels: GEMM_OWN_DX_DGELU_KERNEL with
 * GEMM_OWN_DIRECT, GEMM_OWN_PP_DX_DGELU_KERNEL with GEMM_OWN_PINGPONG). */
HpcStatus gemm_own_kernel(CUmodule mod, const char *name, GemmOwnStore store, GemmOwnKernel *k, HpcError *err);

/* HPC_GEMM_OWN_STORE: "pingpong" (the default), "tma" or "direct"; which
 * kernels the step takes.  Fails on any other value. */
HpcStatus gemm_own_store(GemmOwnStore *store, HpcError *err);

/* Whether the module source carries the kernel (the compiler's mark), and
 * whether it asks for it only where the linear's GELU comes with it
 * (HPC_GEMM_OWN=gelu). */
bool gemm_own_in_source(const char *source);
bool gemm_own_gelu_only(const char *source);

/* Whether the kernel computes d: y (M, N) = x (M, K) W^T + b, f16 in and
 * out, packed, one matrix, N a multiple of 256 and K of 64 (M any). */
bool gemm_own_fits(const GemmDesc *d);

/* The output tiles of d for a kernel that stores so: 128 x 256, or
 * 128 x 128 for the ping-pong kernels. */
int64_t gemm_own_tiles(GemmOwnStore store, const GemmDesc *d);

/* Whether d has a tile of k's for every SM at least (ping-pong: for
 * each of its two multiplying warpgroups), or k->min_tiles tiles where
 * that is set: below that the step keeps cuBLASLt's GEMM, which splits
 * small products finer (the 2026-12-05 H200 A/B: the shared-tile own
 * GEMMs on 24-96 tiles made the 32 x 32 step 14 % slower; 2026-12-07,
 * H100: the ping-pong GELU pairs on 192 tiles, HPC_GEMM_OWN_MIN_TILES=192,
 * 3.568 against 3.525 ms, the FFN-up with its GELU 19.9 us a layer
 * against 13.9 + 7.7 for cuBLASLt and the GELU pass, event records in
 * each). */
bool gemm_own_fills(const GemmOwnKernel *k, const GemmDesc *d, int sm_count);

/* HPC_GEMM_OWN_MIN_TILES: unset or empty gives 0 (gemm_own_fills' rule), else
 * a count of output tiles from 1 up, so that an A/B can try the own
 * kernels on smaller products (BERT-base at 32 x 32: 192 tiles).  Fails
 * on anything else. */
HpcStatus gemm_own_min_tiles(int64_t *min_tiles, HpcError *err);

/* The TMA map of a (rows, cols) row-major f16 matrix as the kernels read
 * or write it: boxes of 64 columns by box_rows rows in the 128-byte
 * swizzle (128 rows of x and 256 of W by 64 k for the forward, 128 of W
 * for the ping-pong kernels; 64 k rows of W by 64 n for the dX kernel; 64
 * rows of y by 64 n for the TMA store); rows past the matrix read as zeros
 * and are not written. */
HpcStatus gemm_own_tensor_map(CUtensorMap *map, CUdeviceptr p, int64_t rows, int64_t cols, unsigned box_rows,
                              HpcError *err);

/* The blocks gemm_own_run launches for d given at most `blocks` (the
 * device's SM count): one a tile at most. */
int gemm_own_grid(GemmOwnStore store, const GemmDesc *d, int blocks);

/* Queues it on stream: the tensor maps of x and W (and with a staging
 * kernel of y and gelu), then the launch of gemm_own_grid(k->store, d,
 * blocks) blocks (the grid is persistent: one block an SM); k is
 * gemm_own_kernel_name(k->store, gelu != 0)'s, gelu (gelu(y), y's layout)
 * 0 or not. */
HpcStatus gemm_own_run(const GemmOwnKernel *k, const GemmDesc *d, CUdeviceptr gelu, int blocks, CUstream stream,
                       HpcError *err);

/* dU = (dY W) * gelu'(u), all f16: the FFN's second linear's dX with the
 * GELU backward in its epilogue (GEMM_OWN_DX_DGELU_KERNEL, or with the
 * ping-pong schedule GEMM_OWN_PP_DX_DGELU_KERNEL).  dy (M, K), w (K, N)
 * as a linear with K outputs stores its weight, u the GELU's input and du
 * (M, N); N a multiple of 256, K of 64.  Optional (0: not written): y
 * (M, N) f16 gets gelu(u), and part (ceil(M / part_rows), N) f32 the
 * column sums of the stored dU over each part_rows rows, as the step's
 * ACT_BWD_BGRAD writes them for its bias gradient (program/act_parts.h);
 * part_rows 16 (0 means 16), or with the ping-pong kernel also 32 or 64. */
#define GEMM_OWN_DX_DGELU_KERNEL "gemm_tma_dx_dgelu_f16"
#define GEMM_OWN_PP_MAX_PART_ROWS 64   /* the ping-pong kernel's largest part_rows: half its tile */
#define GEMM_OWN_PP_DX_DGELU_KERNEL "gemm_pp_dx_dgelu_f16"
typedef struct {
    CUdeviceptr dy, w, u, du, y, part;
    int64_t M, N, K;
    int part_rows;
} GemmOwnDxDgelu;

/* Queues it on stream, as gemm_own_run does (k: one of the two kernels,
 * looked up with the store GEMM_OWN_DIRECT or GEMM_OWN_PINGPONG). */
HpcStatus gemm_own_dx_dgelu_run(const GemmOwnKernel *k, const GemmOwnDxDgelu *g, int blocks, CUstream stream,
                                HpcError *err);

#endif
