/* compiler/fuse.h — the fuse pass: pattern rewrites of a graph into the
 * fused op kinds of program/ops.def (section "Fused ops").
 *
 * Rewrites (docs/fuse.md has the full table and the reasons):
 *   SOFTMAX(s, mask) -> DROPOUT            => SOFTMAX_DROPOUT(s, mask)
 *   SOFTMAX_BWD(DROPOUT(dy), y)            => SOFTMAX_DROPOUT_BWD(dy, s, mask)
 *       (the backward recomputes the probabilities from the scores, so the
 *        undropped probabilities y are never stored)
 *   ADD(DROPOUT(x), r) or ADD(r, DROPOUT(x)) => DROPOUT_ADD(x, r)
 *       (the bias + dropout + residual epilogue: the bias is already in the
 *        LINEAR's GEMM epilogue)
 *   LAYERNORM(ADD(DROPOUT(x), r)) [-> CAST to 16 bits]
 *                                          => LN_RESIDUAL(x, r, gamma, beta)
 *       outputs y, mean, rstd, s = r + dropout(x) and y in 16 bits (the cast
 *       folded; compiler/fuse_layernorm.c); uses of s elsewhere (pre-LN
 *       models) read output s;
 *   DROPOUT(LAYERNORM(ADD chain of 2-3 EMBEDDINGs)) [-> CAST to 16 bits]
 *                                          => EMBED_LN(gamma, beta, table, ids, ...)
 *       with its backward (the dropout, LayerNorm and lookup gradients)
 *                                          => EMBED_LN_BWD(dy, xhat, rstd, gamma, ids, ...)
 *       (compiler/fuse_embed.c; mixed policies only; HPC_FUSE_EMB=0 or HPC_LN_SAVE=s turns it off)
 *   LAYERNORM_DX(dy, s, gamma), LAYERNORM_DGAMMA(dy, s), BIAS_GRAD(dy),
 *   DROPOUT(LAYERNORM_DX) [, BIAS_GRAD of it]
 *                                          => LN_RESIDUAL_BWD(dy, s, mean, rstd, gamma)
 *       outputs the residual gradient, the gradient into x (dropout mask
 *       reapplied), dgamma, dbeta and the bias gradient of x's LINEAR.
 *   HPC_FUSE_LN=0 in the environment turns the two LayerNorm rules off (for
 *   comparisons; FuseOptions.layernorm); the other rules stay.
 *   LINEAR_DW(dy, x) and BIAS_GRAD(dy)     => LINEAR_DW_BGRAD(dy, x): dW, db
 *       (db = the column sums of dy, from the dW GEMM's epilogue: cuBLASLt's
 *        BGRADB; the node's fallback kernel where cuBLASLt has none)
 *   g = ACT(h) read backward only by LINEAR_DW(dy, g) => a copy of the ACT
 *       right before the first of them, which they read instead, so the
 *       forward g is not kept for the backward pass (FuseOptions.recompute_act)
 *   BIAS_GRAD(ACT_BWD(dy, x))              => ACT_BWD_BGRAD(dy, x): dx, db
 *       (the column sums of dx from the kernel that writes it; runs before
 *        the pairing above, so that LINEAR's dW GEMM runs plain;
 *        compiler/fuse_act.c; HPC_FUSE_ACT_BGRAD=0 turns it off)
 *   and with the recompute rule below: the recomputed g = ACT(h) becomes
 *   output 2 of the ACT_BWD_BGRAD that reads h, that node moved to the
 *   copy's place (its dy comes earlier), so one kernel reads h once for
 *   both (HPC_FUSE_ACT_BGRAD=nomerge keeps them apart)
 *   The bias gradient of a LINEAR that feeds a LayerNorm site is wanted by
 *   both LN_RESIDUAL_BWD (output 4) and LINEAR_DW_BGRAD; the LayerNorm rule
 *   runs first and takes it (compiler/fuse_dw.c says why).
 *   ADD(acc, LINEAR_DX(dy, W)), acc f32     => LINEAR_DX_ACC(dy, W, acc) = acc + dy W
 *       (compiler/fuse_accum.c: the residual gradient summed inside the dX
 *        GEMM, beta = 1, written over acc in place; dX is never rounded to
 *        16 bits.  HPC_FUSE_ACCUM=0 turns it off: FuseOptions.accumulate)
 * Cross-entropy needs no rewrite: CROSS_ENTROPY already takes logits and
 * computes its log-softmax inside (forward and backward).
 *
 * Where it runs: after precision (compiler/pipeline.c), on the whole graph
 * (forward and backward), so every fused op records the storage dtype of
 * the intermediate value it removes (IrFusedAttr.mid, .mid2) and its CPU
 * reference rounds there exactly as the unfused chain stores it.  It also
 * runs on a forward-only f32 graph before autodiff: the fused ops have
 * backward rules (compiler/ops.c), and both orders give the same graph
 * semantics (tests/test_fuse.c checks it).
 *
 * A value is fused away only when every use of it is part of the pattern
 * (a softmax read by its dropout and by its own backward; a dropout read
 * only by the ADD), so no rewrite changes what any other node reads.
 *
 * Ownership: `out` must be initialised and empty (ir_init); the caller
 * frees it with ir_free.  `pout` (optional) receives the precision plan
 * re-indexed for `out` (free with precision_plan_free); `pin` may be NULL
 * for a graph that precision has not planned (then pout must be NULL).
 * In pout, info is per node of `out`, and map[u] (u an id of the graph
 * precision planned) is -1 for a value that was fused away.
 *
 * Usage:
 *   IrGraph fused; ir_init(&fused); FuseStats st;
 *   if (fuse_graph(&mixed, &plan, &fused, &fused_plan, &st, &err)) return err.code;
 */
#ifndef HPC_COMPILER_FUSE_H
#define HPC_COMPILER_FUSE_H

#include <stdbool.h>
#include <stdint.h>

#include "error.h"
#include "program/ir.h"
#include "precision.h"

/* The fused ops' attributes (IrFusedAttr, IrLnFusedAttr) and their
 * accessors live in ir.h with the other node attributes. */

typedef struct {
    int softmax_dropout;      /* SOFTMAX + DROPOUT pairs fused */
    int softmax_dropout_bwd;  /* SOFTMAX_BWD + DROPOUT pairs fused */
    int dropout_add;          /* DROPOUT + ADD pairs fused */
    int ln_residual;          /* LayerNorm sites fused (forward) */
    int ln_residual_bwd;      /* their backward fused */
    int ln_saved_xhat;        /* of those, sites that save xhat, not s (HPC_LN_SAVE=xhat) */
    int ln_dw_from_xhat;      /* dW GEMMs that read xhat, not y16 (HPC_LN_SAVE=xhat_dw) */
    int ln_db_from_ones;      /* of those, bias gradients from xhat's ones column (HPC_LN_SAVE=xhat_ones) */
    int ln_casts_folded;      /* CASTs of a site's y that became its output 4 */
    int linear_dw_bgrad;      /* LINEAR_DW + BIAS_GRAD pairs of one dy fused */
    int act_recompute;        /* forward ACTs recomputed before their dW GEMMs */
    int linear_dx_acc;        /* ADD + LINEAR_DX pairs summed in the GEMM (fuse_accum.c) */
    int act_bwd_bgrad;        /* ACT_BWD + BIAS_GRAD of its dx fused (fuse_act.c) */
    int act_merged;           /* recomputed ACTs that became an ACT_BWD_BGRAD's output 2 */
    int embed_ln;             /* embedding layers fused, forward and backward (fuse_embed.c) */
    int attn_keep;            /* attentions whose backward reads the forward's keep bits (HPC_ATTN_KEEP=1) */
    int nodes_before, nodes_after;
} FuseStats;

HpcStatus fuse_graph(const IrGraph *in, const PrecisionPlan *pin, IrGraph *out, PrecisionPlan *pout,
                     FuseStats *stats, HpcError *err);

/* Optional rules (fuse_defaults: all on, but HPC_FUSE_LN=0 in the
 * environment turns layernorm off, HPC_FUSE_ACCUM=0 accumulate,
 * HPC_FUSE_ACT_BGRAD=0 act_bgrad and act_merge, HPC_FUSE_ACT_BGRAD=nomerge
 * act_merge only; ln_save_xhat is on unless HPC_LN_SAVE=s (the H200 suite
 * passed with it, 2026-12-01), ln_save_xhat_dw on unless HPC_LN_SAVE=xhat or
 * s (since 2026-12-02: BERT-base at 32 x 128 fits 2200 MiB with it, for
 * 0.1 ms a step; xhat is the faster choice), ln_xhat_ones with it unless
 * HPC_LN_SAVE=xhat_dw, and attn_keep unless HPC_ATTN_KEEP=0 (both since
 * 2026-12-05: -0.33 ms at BERT-base 256 x 128, the CoLA fine-tune's dev MCC
 * unchanged, 2198 MiB at 32 x 128); fuse_graph refuses any other
 * HPC_LN_SAVE or HPC_ATTN_KEEP). */
typedef struct {
    bool recompute_act;       /* recompute an ACT before its dW GEMMs instead of keeping it */
    bool layernorm;           /* the LayerNorm site rules (fuse_layernorm.c) */
    bool accumulate;          /* ADD(acc, LINEAR_DX) => LINEAR_DX_ACC (fuse_accum.c) */
    bool act_bgrad;           /* the activation backward + bias gradient rule (fuse_act.c) */
    bool act_merge;           /* with act_bgrad and recompute_act: the recomputed ACT is that
                               * node's output 2 (one pass over h; fuse_act.c) */
    bool ln_save_xhat;        /* default (HPC_LN_SAVE=s: off): a LayerNorm site whose backward fuses saves
                               * xhat in f16 and rstd, not s and mean (fuse_layernorm.c) */
    bool ln_save_xhat_dw;     /* default (HPC_LN_SAVE=xhat or s: off; with ln_save_xhat): the dW GEMMs
                               * reading such a site's 16-bit y read xhat instead (fuse_ln_dw.c) */
    bool ln_xhat_ones;        /* default (HPC_LN_SAVE=xhat_dw: off; with ln_save_xhat_dw): where such
                               * a GEMM also makes its bias gradient (LINEAR_DW_BGRAD, the Q/K/V's), the
                               * site's xhat gets a column of ones and the plain GEMM's raw output holds
                               * the bias gradient (fuse_ln_dw.c) */
    bool embed_ln;            /* default (HPC_FUSE_EMB=0: off; with ln_save_xhat only, since it saves xhat
                               * too): BERT's embedding layer, lookups + LayerNorm + dropout and its
                               * backward, as EMBED_LN / EMBED_LN_BWD (fuse_embed.c) */
    bool attn_keep;           /* default (HPC_ATTN_KEEP=0: off): the attention forward saves its
                               * dropout's keep bits for the backward (fuse_attn_keep.c) */
} FuseOptions;

FuseOptions fuse_defaults(void);
HpcStatus fuse_graph_with(const IrGraph *in, const PrecisionPlan *pin, IrGraph *out, PrecisionPlan *pout,
                          FuseStats *stats, const FuseOptions *opts, HpcError *err);

/* Nodes that launch work on a device: every node but PARAM, OUTPUT (its
 * multi-output op writes it) and the batch INPUTs (the loss-scale seed
 * counts: it is a kernel). */
int fuse_count_launches(const IrGraph *g);

#endif
