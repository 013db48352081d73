/* compiler/fuse_dw.c — the fuse rules around the weight-gradient GEMM (see
 * fuse.h for the rewrites, fuse_internal.h for the matcher).
 *
 * Bias gradients: LINEAR_DW(dy, x) and BIAS_GRAD(dy) of the same dy =>
 * LINEAR_DW_BGRAD(dy, x) with dW as output 0 and db as output 1.  The
 * column sums of dy do not depend on whose bias they are, so any such pair
 * is exact; both must still be plain copies (no other rule took them) and
 * store in one dtype (the epilogue writes db in dW's type).  The fused node
 * takes the later one's place; nothing between the two may read the earlier
 * one, so moving it keeps the order valid.
 *
 * Who takes a bias gradient both rules want.  The LINEAR that feeds a
 * LayerNorm site (BERT's attention output and FFN2 projections) has its
 * bias gradient BIAS_GRAD(DROPOUT(LAYERNORM_DX)): LN_RESIDUAL_BWD's output 4
 * and also a LINEAR_DW_BGRAD partner.  The LayerNorm rule keeps it.  Its
 * kernel sums the columns of dx while dx is in registers, next to the
 * dgamma and dbeta sums it makes anyway: one more accumulator per column
 * and D partial sums per row block, on every road.  The GEMM epilogue is
 * free only where cuBLASLt has BGRADB for that GEMM (it also narrows the
 * algorithms cuBLASLt may pick); elsewhere, and under HPC_GEMM_BGRAD=0,
 * LINEAR_DW_BGRAD runs its column-sum kernel, which reads dy again.  So
 * the LayerNorm rules run first and this rule skips a BIAS_GRAD that is an
 * ALIAS already.  The activation backward's rule (fuse_act.c) runs first
 * too, for the same reason: BIAS_GRAD(ACT_BWD) (the FFN's first LINEAR, the
 * pooler) becomes ACT_BWD_BGRAD's output 1 and that dW GEMM stays plain.
 *
 * Activations recomputed in the backward pass: a forward ACT g = act(h)
 * whose backward readers are all weight-gradient GEMMs (the FFN's
 * dW2 = dy^T g) is not kept from the forward pass: a copy of the ACT runs
 * right before the first of them and they read the copy.  The forward g
 * then dies at the forward LINEAR that reads it, so the step keeps h
 * (ACT_BWD needs it anyway) but not g: B*L*ffn values per layer less at the
 * peak, for one elementwise pass more.  The copy computes the same values
 * (same op, input and storage dtype), so the results do not change.  Roles
 * (loss, logits, gradients) are never recomputed. */
#include <stdio.h>
#include <string.h>

#include "fuse_internal.h"

static bool read_between(const Matcher *M, int v, int from, int to)
{
    for (int i = from + 1; i < to; i++)
        for (int k = 0; k < fuse_node(M, i)->n_in; k++)
            if (fuse_node(M, i)->in[k] == v) return true;
    return false;
}

static void match_bias_grad(Matcher *M, int bg)
{
    const IrNode *b = fuse_node(M, bg);
    if (!b->backward || M->action[bg] != FUSE_COPY) return;
    int dy = b->in[0];
    for (int dw = dy + 1; dw < M->g->n; dw++) {
        const IrNode *w = fuse_node(M, dw);
        if (w->op != IR_OP_LINEAR_DW || w->in[0] != dy || !w->backward || M->action[dw] != FUSE_COPY ||
            w->dtype != b->dtype)
            continue;
        int first = dw < bg ? dw : bg, at = dw < bg ? bg : dw;
        if (read_between(M, first, first, at)) continue;
        IrNode *r = &M->repl[at];
        *r = *w;   /* the node is dW (name, dtype, flags); db is its output 1 */
        r->op = IR_OP_LINEAR_DW_BGRAD;
        memset(&r->attr, 0, sizeof r->attr);
        M->action[at] = FUSE_REPLACE;
        M->named_outputs[at] = true;   /* "d.NAME.bias" */
        M->out_k[at] = at == bg;
        fuse_alias(M, first, at, first == bg);
        M->outputs[at] |= 1u << 1;
        M->stats->linear_dw_bgrad++;
        return;
    }
}

static bool is_role(const IrGraph *g, int v)
{
    if (v == g->loss || v == g->logits) return true;
    for (int p = 0; p < g->n_params && g->param_grad; p++)
        if (g->param_grad[p] == v) return true;
    return false;
}

static void match_recompute(Matcher *M, int a)
{
    const IrGraph *g = M->g;
    if (fuse_node(M, a)->backward || M->action[a] != FUSE_COPY || is_role(g, a)) return;
    int first = -1;
    for (int i = a + 1; i < g->n; i++) {
        const IrNode *u = fuse_node(M, i);
        for (int k = 0; k < u->n_in; k++) {
            if (u->in[k] != a || !u->backward) continue;
            if (u->op != IR_OP_LINEAR_DW || k != 1) return;   /* another backward reader: keep g */
            if (first < 0) first = i;
        }
    }
    if (first < 0 || M->recompute[first] >= 0) return;
    M->recompute[first] = a;
    M->stats->act_recompute++;
}

void fuse_match_dw(Matcher *M)
{
    /* The activation backward takes its bias gradient first (fuse_act.c):
     * its kernel sums dx's columns for free, while the BGRADB epilogue
     * slows the dW GEMM down. */
    if (M->opts.act_bgrad) fuse_match_act(M);
    for (int i = 0; i < M->g->n; i++)
        if (fuse_node(M, i)->op == IR_OP_BIAS_GRAD) match_bias_grad(M, i);
    for (int i = 0; M->opts.recompute_act && i < M->g->n_forward; i++)
        if (fuse_node(M, i)->op == IR_OP_ACT) match_recompute(M, i);
    if (M->opts.act_bgrad && M->opts.act_merge && M->opts.recompute_act) fuse_match_act_recompute(M);
}
