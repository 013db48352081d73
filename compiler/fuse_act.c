/* compiler/fuse_act.c — the fuse rule of the activation backward and the
 * bias gradient of the LINEAR before it (see fuse.h for the rewrites,
 * fuse_internal.h for the matcher).
 *
 *   BIAS_GRAD(ACT_BWD(dy, x))  => ACT_BWD_BGRAD(dy, x): dx, db
 *
 * In a FFN, h = LINEAR(x, W1, b1), g = ACT(h); the backward pass computes
 * dh = ACT_BWD(dg, h) and b1's gradient is the column sums of dh.  The
 * kernel that writes dh holds it in registers, so it adds each column into
 * a per-block f32 partial sum on the way and a small second kernel adds
 * the partials in a fixed order (no float atomics: the same bits every
 * run).  Before this rule the bias gradient came from the dW1 GEMM's
 * BGRADB epilogue, which made that GEMM ~40% slower on the H200 (292 vs
 * 211 us at BERT-base 256 x 128); the dW1 GEMM now runs plain.  So this
 * rule runs before the LINEAR_DW + BIAS_GRAD pairing (fuse_dw.c), which
 * leaves a BIAS_GRAD that is already an ALIAS.
 *
 * The fused node takes ACT_BWD's place and name; db is its output 1 and
 * keeps the BIAS_GRAD's name and dtype (f32 for a parameter gradient).
 * The cpu reference rounds dx to its storage dtype before summing, as the
 * unfused BIAS_GRAD reads the stored dx, so fused and unfused graphs agree
 * bit for bit on the cpu backend.  FuseOptions.act_bgrad (HPC_FUSE_ACT_BGRAD=0
 * in the environment turns it off) is the switch for comparisons. */
#include "fuse_internal.h"

#include <string.h>

static bool is_float(DType d) { return d == DT_F32 || d == DT_F16 || d == DT_BF16 || d == DT_F64; }

static void match_act_bias_grad(Matcher *M, int bg)
{
    const IrNode *b = fuse_node(M, bg);
    if (!b->backward || M->action[bg] != FUSE_COPY) return;
    int a = b->in[0];
    const IrNode *ab = fuse_node(M, a);
    if (ab->op != IR_OP_ACT_BWD || !ab->backward || M->action[a] != FUSE_COPY || !is_float(ab->dtype) ||
        !is_float(b->dtype))
        return;
    IrNode *r = &M->repl[a];
    *r = *ab;   /* dx: name, dtype, flags, inputs (dy, x) */
    r->op = IR_OP_ACT_BWD_BGRAD;
    memset(&r->attr, 0, sizeof r->attr);
    r->attr.act_bgrad = (IrActBgradAttr){.kind = ab->attr.act.kind, .db = (uint8_t)b->dtype};
    M->action[a] = FUSE_REPLACE;
    M->named_outputs[a] = true;   /* db keeps "d.NAME.bias" */
    M->out_k[a] = 0;
    fuse_alias(M, bg, a, 1);
    M->stats->act_bwd_bgrad++;
}

void fuse_match_act(Matcher *M)
{
    for (int i = 0; i < M->g->n; i++)
        if (fuse_node(M, i)->op == IR_OP_BIAS_GRAD) match_act_bias_grad(M, i);
}
