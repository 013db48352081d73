/* compiler/fuse_qkv.h — Q, K and V from one GEMM (issue 15 item 1,
 * docs/fuse_qkv.md): a rewrite of the forward graph, run right after
 * lowering (compiler/pipeline.c); on by default (FUSE_QKV_DEFAULT),
 * HPC_FUSE_QKV=0 turns it off.
 *
 * Pattern, per attention block (lower_attention_fused):
 *   q = LINEAR(x, Wq, bq), k = LINEAR(x, Wk, bk), v = LINEAR(x, Wv, bv),
 *   ctx = ATTENTION(q, k, v, mask), each projection read by nothing else,
 *   the six parameters a query/key/value group of program/param_pack.h
 *   whose members lie back to back in every packed family
 *   (param_pack_adjacent_everywhere: H a multiple of 128), so the cuda
 *   executor can read each stack in place.
 * Rewrite:
 *   W = STACK(Wq, Wk, Wv) (3H, H), b = STACK(bq, bk, bv) (3H),
 *   qkv = LINEAR(x, W, b) (B, L, 3H), ctx = ATTENTION(qkv, qkv, qkv, mask)
 *   with attr.attn.packed set.
 * Autodiff then makes one dX GEMM (K = 3H), one dW GEMM (3H, H) and one
 * bias gradient, and the UNSTACK that splits them into the three
 * parameters' gradients; the fuse pass pairs and accumulates them as
 * before (LINEAR_DW_BGRAD, LINEAR_DX_ACC).
 *
 * Run before autodiff, on the graph lowering made, because dropout salts
 * are node ids fixed at lowering: every node is copied with its attribute,
 * so every mask (the attention's too) stays where it was, and the fused
 * and unfused graphs compute the same function.  The STACK nodes and the
 * LINEAR go where the value projection was (all six parameters exist
 * there); nothing else moves relative to the rest.
 *
 * The cpu backend runs the result (STACK, UNSTACK and packed attention
 * have cpu references, tests/test_fuse_qkv.c).  On the cuda backend the
 * stacks of parameters and the unstacked gradients are views
 * (program/plan.h plan_view_of: no kernel, no copy), and the packed q, k,
 * v and dq, dk, dv go to the attention kernels with row stride 3H; the
 * packed backward has one (B, L, 3H) output and no dk, dv outputs
 * (docs/fuse_qkv.md). */
#ifndef HPC_COMPILER_FUSE_QKV_H
#define HPC_COMPILER_FUSE_QKV_H

#include <stdbool.h>

#include "error.h"
#include "program/ir.h"
#include "program/params.h"

/* The rewrite's default for every backend (the cpu references run the
 * same graph the GPU runs).  On since the whole `make test-gpu` passed
 * with HPC_FUSE_QKV=1 on the H200 (2026-12-01, seventh session;
 * docs/fuse_qkv.md). */
#define FUSE_QKV_DEFAULT true

/* HPC_FUSE_QKV=1 on, HPC_FUSE_QKV=0 off, anything else or unset:
 * FUSE_QKV_DEFAULT. */
bool fuse_qkv_requested(void);

/* Rewrites forward graph g (lowered, before autodiff) in place; *sites
 * (optional) receives how many attention blocks were rewritten. */
HpcStatus fuse_qkv_graph(IrGraph *g, const ParamList *pl, int *sites, HpcError *err);

#endif
