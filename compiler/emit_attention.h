/* compiler/emit_attention.h — the CUDA source of the fused attention kernels
 * alone (compiler/kernels/attention.cu with the helpers it needs).
 *
 * The step module does not hold these kernels yet (nothing in the IR calls
 * them; kemit_source() leaves attention.cu out, so step compiles do not pay
 * for it).  This translation unit has the step module's constants and only
 * common.cu, philox.cu and attention.cu.  Kernel names are BASE + suffix
 * as kemit_name() builds them, the suffix hashing this unit; the bases and
 * their launch shapes are in attention.cu and docs/cuda_kernels.md:
 *   attn_simt_fwd      grid (ceil(L / 16), NH, B) x 128
 *   attn_simt_bwd_dot  grid ceil(B * L * NH / 4) x 128
 *   attn_simt_bwd_dq   grid (ceil(L / 16), NH, B) x 128
 *   attn_simt_bwd_dkv  grid (ceil(L / 32), NH, B) x 32
 *   attn_mma_fwd       grid (ceil(L / 64), NH, B) x 128   (fp16/bf16, D % 16 == 0)
 *   attn_mma_bwd_dq    grid (ceil(L / 64), NH, B) x 128   (fp16/bf16, D % 16 == 0)
 *   attn_mma_bwd_dkv   grid (ceil(L / 64), NH, B) x 128   (fp16/bf16, D % 16 == 0)
 *   attn_mma2_fwd, attn_mma2_bwd_dq, attn_mma2_bwd_dkv: the second
 *                      tensor-core family (v2), the grids of attn_mma_*
 * At head size 128 attn_simt_bwd_dq and attn_mma_bwd_dq are not in the
 * unit (their tiles pass 48 KiB of shared memory); v2 covers it.
 * Head sizes up to KEMIT_ATTN_MAX_HEAD_DIM. */
#ifndef HPC_COMPILER_EMIT_ATTENTION_H
#define HPC_COMPILER_EMIT_ATTENTION_H

#include "emit_kernels.h"

#define KEMIT_ATTN_MAX_HEAD_DIM 128

/* *source (malloc'd) and suffix for config cfg; HPC_ERR_INPUT when cfg is
 * refused by kemit_source or its head size is above the maximum. */
HpcStatus kemit_attention_source(const KernelConfig *cfg, char **source, char suffix[KEMIT_SUFFIX_MAX],
                                 HpcError *err);

#endif
