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
 * in the environment turns it off) is the switch for comparisons.
 *
 * The recomputed activation (fuse_dw.c): the backward pass copies
 * g = ACT(h) right before dW2 = dy^T g and later runs dh = ACT_BWD(dg, h):
 * two passes over h.  dg (FFN2's LINEAR_DX) comes before the copy, so the
 * fused node can move up to the copy's place and write g as its output 2:
 * one kernel reads dg and h once and writes dh and g (BERT-base fp16,
 * 256 x 128: 805 MB instead of 403 + 604 MB per layer).  The price is
 * memory: g and dh are live together for the dW2 GEMM, one B x L x ffn
 * tensor more at that moment.  FuseOptions.act_merge
 * (HPC_FUSE_ACT_BGRAD=nomerge keeps the copy) decides. */
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

/* Input v is in `out` before node `at` is appended: appended earlier as
 * itself (a copy or a fused node at its own place). */
static bool ready_before(const Matcher *M, int v, int at)
{
    return v < at && (M->action[v] == FUSE_COPY || (M->action[v] == FUSE_REPLACE && M->hoisted_act[v] < 0));
}

/* The recompute copy of forward ACT a, due right before node `first`,
 * becomes output 2 of the ACT_BWD_BGRAD that reads a's input with a's
 * activation, moved to `first`: its dy and x must come before it, its own
 * readers all come after its old place (later than `first`). */
static void merge_recompute(Matcher *M, int first)
{
    int a = M->recompute[first];
    const IrNode *fa = fuse_node(M, a);
    for (int ab = first + 1; ab < M->g->n; ab++) {
        IrNode *r = &M->repl[ab];
        if (M->action[ab] != FUSE_REPLACE || r->op != IR_OP_ACT_BWD_BGRAD || M->hoisted_act[ab] >= 0 ||
            r->in[1] != fa->in[0] || r->attr.act_bgrad.kind != fa->attr.act.kind ||
            !ready_before(M, r->in[0], first) || !ready_before(M, r->in[1], first))
            continue;
        r->attr.act_bgrad.y = (uint8_t)fa->dtype;
        M->outputs[ab] |= 1u << 2;
        M->hoist[first] = ab;
        M->hoisted_act[ab] = a;
        M->recompute[first] = -1;
        M->stats->act_merged++;
        return;
    }
}

void fuse_match_act_recompute(Matcher *M)
{
    for (int i = 0; i < M->g->n; i++)
        if (M->recompute[i] >= 0) merge_recompute(M, i);
}

void fuse_match_act(Matcher *M)
{
    for (int i = 0; i < M->g->n; i++)
        if (fuse_node(M, i)->op == IR_OP_BIAS_GRAD) match_act_bias_grad(M, i);
}
