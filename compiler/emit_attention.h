/* compiler/emit_attention.h — the CUDA source of the fused attention kernels
 * alone (compiler/kernels/attention*.cu with the helpers they need), and the
 * list of those templates.
 *
 * The step module holds the kernels' bodies through its own generator
 * (compiler/emit_ops_attention.h, which takes the same templates in the same
 * order); kemit_source() leaves them out.  This translation unit has the
 * step module's constants, common.cu, philox.cu and the attention templates,
 * with a kernel for every body: what tests/gpu/gpu_attention.c checks and
 * times.  Kernel names are BASE + suffix as kemit_name() builds them, the
 * suffix hashing this unit; the bases and their launch shapes are in the
 * templates and docs/cuda_kernels.md:
 *   attn_simt_fwd      grid (ceil(L / 16), NH, B) x 128
 *   attn_simt_bwd_dot  grid ceil(B * L * NH / 4) x 128
 *   attn_simt_bwd_dq   grid (ceil(L / 16), NH, B) x 128
 *   attn_simt_bwd_dkv  grid (ceil(L / 32), NH, B) x 32
 *   attn_mma_fwd       grid (ceil(L / 64), NH, B) x 128   (fp16/bf16, D % 16 == 0)
 *   attn_mma_bwd_dq    grid (ceil(L / 64), NH, B) x 128   (fp16/bf16, D % 16 == 0)
 *   attn_mma_bwd_dkv   grid (ceil(L / 64), NH, B) x 128   (fp16/bf16, D % 16 == 0)
 *   attn_mma2_fwd, attn_mma2_bwd_dq, attn_mma2_bwd_dkv: the second
 *                      tensor-core family (v2), the grids of attn_mma_*
 *   attn_mma3_bwd, attn_mma3_bwd_r128   grid (1, NH, B) x 256 (L <= 128, D <= 64)
 *   attn_mma2_fwd_keep, attn_mma3_bwd_keep   as attn_mma2_fwd and attn_mma3_bwd, one
 *                      argument more: the dropout's keep bits, written by the one and
 *                      read by the other (HPC_ATTN_KEEP=1 in the step)
 *   attn_head_bwd_dot  grid (1, NH, B) x 256
 *   attn_first_fwd, attn_first_bwd      grid (1, NH, B) x 128 (query 0 alone)
 * At head size 128 attn_simt_bwd_dq and attn_mma_bwd_dq are not in the
 * unit (their tiles pass 48 KiB of shared memory); v2 covers it.
 * Head sizes up to KEMIT_ATTN_MAX_HEAD_DIM. */
#ifndef HPC_COMPILER_EMIT_ATTENTION_H
#define HPC_COMPILER_EMIT_ATTENTION_H

#include "emit_kernels.h"

#define KEMIT_ATTN_MAX_HEAD_DIM 128

/* The attention templates in compiler/kernels/, in the order each builds on
 * the ones before: the contract, its helpers and the SIMT family; the
 * tensor-core families (v1, v2, the one-pass backward, the one-pass
 * backward with dS of every query); query 0 alone.  A translation unit
 * takes them after common.cu (and philox.cu) and the constants HPC_DTYPE,
 * HPC_HIDDEN, HPC_HEADS, HPC_HEAD_DIM, HPC_CAUSAL and
 * HPC_ATTN4_SMEM_BYTES (and HPC_ATTN5_SMEM_BYTES). */
#define KEMIT_ATTN_PARTS 8
extern const char *const kemit_attn_parts[KEMIT_ATTN_PARTS];

/* Dynamic shared memory a block of the whole-dS one-pass backward
 * (attn_mma4_bwd, compiler/kernels/attention_mma4.cu) asks for at head size
 * head_dim: K, Q and dO of 128 rows (head_dim + 8 elements a row), dS^T of
 * 128 keys x 136, lse and delta of 128 queries (f32).  Both module
 * preambles define it as HPC_ATTN4_SMEM_BYTES, and the kernel asserts that
 * its layout is that size. */
static inline int kemit_attn4_smem_bytes(long long head_dim)
{
    return (int)((3 * 128 * (head_dim + 8) + 128 * 136) * 2 + 2 * 128 * 4);
}

/* Dynamic shared memory a block of the warpgroup-MMA backward (attn_wg5_bwd,
 * compiler/kernels/attention_wgmma.cu; head size 64 only) asks for: two
 * buffers of K, V, Q and dO (128 rows of 128 bytes), the keep bits, lse,
 * delta and key mask of 128 rows (each buffer padded to a multiple of
 * 1 KiB), one 16 KiB dS^T box and 1 KiB to align them.
 * Under sm_80's 163 KiB: the executor allows every phase its shared
 * memory when it loads a module, launched there or not (cuda_exec.c's
 * lookup_kernels).  HPC_ATTN5_SMEM_BYTES in the modules, asserted by the
 * kernel. */
static inline int kemit_attn5_smem_bytes(void)
{
    return 2 * (4 * 128 * 128 + 128 * 16 + 3 * 128 * 4 + 1536) + 128 * 128 + 1024;
}

/* *source (malloc'd) and suffix for config cfg; HPC_ERR_INPUT when cfg is
 * refused by kemit_source or its head size is above the maximum. */
HpcStatus kemit_attention_source(const KernelConfig *cfg, char **source, char suffix[KEMIT_SUFFIX_MAX],
                                 HpcError *err);

#endif
