/* compiler/emit_ops_attention.h — private to emit_ops: the fused attention
 * nodes (ATTENTION, ATTENTION_BWD) in the step module.
 *
 * The kernel bodies are compiler/kernels/attention*.cu's tensor-core family
 * (attn_mma_*, with attn_simt_bwd_dot for the backward's row dots), put into
 * the step module once, inside `namespace hpc_attn` with the constants of
 * the graph's attention (dtype, hidden, heads, head size, causal) and
 * HPC_ATTN_NO_KERNELS, so only their __device__ *_run bodies are there.
 * Each node's phases are EopArgs wrappers around them:
 *   ATTENTION      attn_mma_fwd            HEAD_TILES ceil(L/64) x heads x B
 *                  (a.y ctx, a.yk[0] lse; a.x = q, k, v, mask)
 *   ATTENTION_BWD  attn_simt_bwd_dot       WARP_ROWS B*L*heads (delta -> scratch)
 *                  attn_mma_bwd_dq         HEAD_TILES (a.y dq)
 *                  attn_mma_bwd_dkv        HEAD_TILES (a.yk[0] dk, a.yk[1] dv)
 * HPC_ATTN_KERNELS (read when the module is generated) picks the family:
 *   v5 (the default)  v4, but for padded f16 rows at head size 64, from a
 *                  module built for sm_90a (StepPhase.target; the module
 *                  carries STEP_SOURCE_SM90A_MARK) and for 64 < L <= 128:
 *                  attn5_fwd: attn_wg5_fwd_run, the forward on Hopper's
 *                  warpgroup MMA, HEAD_TILES as v2's (128 threads); v2's
 *                  attn2_fwd at every other length and from any other
 *                  module (three records, one kernel);
 *                  where the keep bits are saved or there is no dropout,
 *                  attn5_bwd: attn_wg5_bwd_run, the backward on the same
 *                  (delta inside), ROWS min(heads x B, 132) x 256; v4's
 *                  attn4_bwd up to L 64, and up to 128 from any other module
 *   v4             attn_mma2_fwd (phase attn2_fwd); ATTENTION_BWD up to
 *                  head size 64:
 *                  attn4_bwd: attn_mma4_bwd, the one-pass backward (delta
 *                     inside, dS of every query in dynamic shared memory),
 *                     HEAD_BLOCKS 1 x heads x B (256 threads), launched only
 *                     for L <= 128 (StepPhase.at_most_l)
 *                  attn_bwd_delta: attn_head_bwd_dot (delta -> scratch),
 *                     attn2_bwd_dq, attn2_bwd_dkv: v2's, launched only for
 *                     L > 128 (StepPhase.above_l; each checks L too)
 *                  above head size 64 v3's backward;
 *   v3             as v4 with attn3_bwd: attn_mma3_bwd (48 KiB of static
 *                  shared memory, one dS tile at a time), which computes
 *                  delta alone above L 128 (no attn_bwd_delta phase);
 *                  above head size 64 the backward is v2's;
 *   v2             attn_mma2_* (phases attn2_fwd, attn2_bwd_dq, attn2_bwd_dkv)
 *                  with the dot phase above: the path before v3;
 *   v1             attn_mma_* above (refused above head size 64);
 * any other value is refused.
 * Dropout reads the seed, step and training flag from the EopCtl on the
 * device, so a captured CUDA graph replays any step; the salt and p are
 * the node's (the cpu reference's).
 *
 * What the kernels need, and the emitter refuses otherwise (HPC_ERR_INPUT,
 * naming HPC_ATTENTION=unfused): f16 or bf16 values, head size a multiple
 * of 16 and at most 128, one attention configuration per graph, every
 * output projection present.
 */
#ifndef HPC_COMPILER_EMIT_OPS_ATTENTION_H
#define HPC_COMPILER_EMIT_OPS_ATTENTION_H

#include "emit_ops_body.h"

/* The shared block (constants, common.cu, the attention templates of
 * emit_attention.h's kemit_attn_parts) when g has an
 * attention node; nothing otherwise. */
HpcStatus eopa_module_part(const IrGraph *g, StrBuf *src, HpcError *err);

HpcStatus eopa_gen_attention(EopGen *gen, HpcError *err);
HpcStatus eopa_gen_attention_bwd(EopGen *gen, HpcError *err);

#endif
