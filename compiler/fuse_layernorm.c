/* compiler/fuse_layernorm.c — the fuse rules of the LayerNorm sites (see
 * fuse.h for the rewrites, fuse_internal.h for the matcher).
 *
 * Forward: y = LAYERNORM(s, gamma, beta) with s = ADD(DROPOUT(x), r) (either
 * order) becomes one LN_RESIDUAL(x, r, gamma, beta) placed at the LAYERNORM.
 * The DROPOUT is dropped (it must have no other reader), s becomes output 3
 * (its readers must all come after the LAYERNORM), and the CASTs of y to
 * one 16-bit dtype become output 4.  In a graph without a backward part
 * (fused before autodiff) a site whose s or 16-bit y has other readers stays
 * unfused, because only output 0 carries a gradient.
 *
 * Backward: at a LAYERNORM_DX(dy, s, gamma) of a fused site, one
 * LN_RESIDUAL_BWD(dy, s, mean, rstd, gamma) takes the place of the
 * LAYERNORM_DX (the first node of the pattern, so every reader of a member
 * comes later) and its members become its outputs: the DROPOUT of the
 * LAYERNORM_DX with the forward's mask (the gradient into x, output 1),
 * LAYERNORM_DGAMMA(dy, s) (2), BIAS_GRAD(dy) (3, dbeta) and BIAS_GRAD of
 * the DROPOUT (4, the bias gradient of the LINEAR that made x).  Members 2-4
 * are optional (a frozen gamma has none); each must come after the
 * LAYERNORM_DX and share one dtype.  Member 4 is also what LINEAR_DW_BGRAD
 * (fuse_dw.c) would take; these rules run first and keep it (fuse_dw.c
 * says why).
 *
 * HPC_LN_SAVE=xhat (FuseOptions.ln_save_xhat; a 16-bit policy only): at a
 * site whose backward fuses and whose s nothing else reads, the forward
 * saves xhat = (s - mean) rstd in f16 as output 3 instead of s (|xhat| <=
 * sqrt(H), so f16 holds it under bf16 too, with 8x finer rounding) and no
 * mean; the backward reads (dy, xhat, rstd, gamma).  Half the bytes of s
 * per site stay live into the backward pass. */
#include <string.h>

#include "fuse_internal.h"

static const IrNode *nd(const Matcher *M, int id) { return &M->g->nodes[id]; }

static bool has_backward(const Matcher *M) { return M->g->n_forward < M->g->n; }

/* Readers of s other than the LAYERNORM ln and the backward ops of ln that
 * read s as x; -1 if a reader comes before ln (the fused node could not
 * precede it). */
static int other_readers_of_sum(const Matcher *M, int s, int ln)
{
    int others = 0, seen = 0;
    for (int j = s + 1; j < M->g->n; j++) {
        const IrNode *u = nd(M, j);
        for (int k = 0; k < u->n_in; k++) {
            if (u->in[k] != s) continue;
            seen++;
            if (j == ln) continue;
            if (j < ln) return -1;
            bool ln_bwd = (u->op == IR_OP_LAYERNORM_DX || u->op == IR_OP_LAYERNORM_DGAMMA) && k == 1;
            if (!ln_bwd) others++;
        }
    }
    return others + (M->n_uses[s] - seen);   /* roles (loss, logits) count as readers */
}

/* The 16-bit dtype of the CASTs of y to fold (DT_F32: none). */
static DType cast_dtype(const Matcher *M, int ln)
{
    if (nd(M, ln)->dtype != DT_F32 || !has_backward(M)) return DT_F32;
    for (int j = ln + 1; j < M->g->n; j++) {
        const IrNode *u = nd(M, j);
        if (u->in[0] == ln && fuse_is_free(M, j, IR_OP_CAST, false) &&
            (u->attr.cast.to == DT_F16 || u->attr.cast.to == DT_BF16))
            return u->attr.cast.to;
    }
    return DT_F32;
}

static void match_site(Matcher *M, int ln)
{
    const IrNode *l = nd(M, ln);
    int s = l->in[0];
    if (!fuse_is_free(M, s, IR_OP_ADD, false)) return;
    const IrNode *sn = nd(M, s);
    for (int k = 0; k < 2; k++) {
        int d = sn->in[k], r = sn->in[1 - k];
        if (d == r || !fuse_is_free(M, d, IR_OP_DROPOUT, false) || M->n_uses[d] != 1) continue;
        int others = other_readers_of_sum(M, s, ln);
        if (others < 0 || (others > 0 && !has_backward(M))) return;
        const IrNode *dn = nd(M, d);
        DType low = cast_dtype(M, ln);
        if (dn->attr.dropout.salt < 0 || dn->attr.dropout.salt > FUSE_LN_SALT_MAX) return;
        IrLnFusedAttr la = {l->attr.norm.eps, (float)dn->attr.dropout.p, (uint32_t)dn->attr.dropout.salt, 0,
                            dn->dtype, low == DT_F32 ? DT_F16 : low, sn->dtype, 0};
        IrNode *rp = &M->repl[ln];
        *rp = *l;
        rp->op = IR_OP_LN_RESIDUAL;
        rp->n_in = 4;
        int in[4] = {dn->in[0], r, l->in[1], l->in[2]};
        for (int q = 0; q < IR_MAX_INPUTS; q++) rp->in[q] = q < 4 ? in[q] : -1;
        fuse_ln_attr_set(&rp->attr, la);
        M->action[ln] = FUSE_REPLACE;
        M->outputs[ln] = 1u << 1 | 1u << 2 | 1u << 3;   /* mean, rstd, s: the backward reads them */
        M->action[d] = FUSE_DROP;
        fuse_alias(M, s, ln, 3);
        if (low != DT_F32)
            for (int j = ln + 1; j < M->g->n; j++)
                if (nd(M, j)->in[0] == ln && fuse_is_free(M, j, IR_OP_CAST, false) && nd(M, j)->attr.cast.to == low) {
                    fuse_alias(M, j, ln, 4);
                    M->stats->ln_casts_folded++;
                }
        M->stats->ln_residual++;
        return;
    }
}

/* The first free node j > after of op `op` reading `v` as input k (-1: none). */
static int find_reader(const Matcher *M, int v, int k, IrOpKind op, int after)
{
    for (int j = after + 1; j < M->g->n; j++)
        if (nd(M, j)->n_in > k && nd(M, j)->in[k] == v && fuse_is_free(M, j, op, true)) return j;
    return -1;
}

static bool is_16bit(DType t) { return t == DT_F16 || t == DT_BF16; }

/* HPC_LN_SAVE=xhat at a site whose backward fuses: only under a 16-bit
 * policy (the site's x or dx is 16-bit; fp32 keeps s), and only when s is
 * read by nothing but the LAYERNORM ln, its LAYERNORM_DX and the
 * LAYERNORM_DGAMMA dg the fused backward takes (a pre-LN stack's residual
 * stream keeps s). */
static bool save_xhat(const Matcher *M, int s, int dg, IrLnFusedAttr la, DType dx)
{
    if (!M->opts.ln_save_xhat || !(is_16bit((DType)la.mid) || is_16bit(dx))) return false;
    return M->n_uses[s] == 2 + (dg >= 0);
}

/* The forward site ln saves xhat (f16) and rstd: output 3 is xhat, output
 * 1 (mean) is not made, and s, read by nothing now, is dropped. */
static void switch_to_xhat(Matcher *M, int ln, int s)
{
    IrLnFusedAttr la = fuse_ln_attr_get(&M->repl[ln]);
    la.xhat = 1;
    fuse_ln_attr_set(&M->repl[ln].attr, la);
    M->outputs[ln] &= ~(1u << 1);
    M->action[s] = FUSE_DROP;
    M->stats->ln_saved_xhat++;
}

static void match_site_bwd(Matcher *M, int dxn)
{
    const IrNode *x = nd(M, dxn);
    int s = x->in[1], dy = x->in[0];
    if (M->action[s] != FUSE_ALIAS || M->out_k[s] != 3) return;
    int ln = M->alias_of[s];
    const IrNode *f = &M->repl[ln];
    IrLnFusedAttr la = fuse_ln_attr_get(f);
    if (f->op != IR_OP_LN_RESIDUAL || x->in[2] != f->in[2] || x->attr.norm.eps != la.eps) return;
    int dd = -1;
    for (int j = dxn + 1; j < M->g->n && dd < 0; j++) {
        const IrNode *u = nd(M, j);
        if (u->in[0] == dxn && fuse_is_free(M, j, IR_OP_DROPOUT, true) && u->attr.dropout.salt == (int)la.salt &&
            (float)u->attr.dropout.p == la.p)
            dd = j;
    }
    if (dd < 0) return;
    int dg = find_reader(M, dy, 0, IR_OP_LAYERNORM_DGAMMA, dxn);
    if (dg >= 0 && (nd(M, dg)->in[1] != s || nd(M, dg)->attr.norm.eps != la.eps)) dg = -1;
    int members[3] = {dg, find_reader(M, dy, 0, IR_OP_BIAS_GRAD, dxn), find_reader(M, dd, 0, IR_OP_BIAS_GRAD, dd)};
    DType aux = DT_F32;
    for (int q = 2; q >= 0; q--)
        if (members[q] >= 0) aux = nd(M, members[q])->dtype;
    bool xhat = save_xhat(M, s, dg, la, nd(M, dd)->dtype);
    IrNode *rp = &M->repl[dxn];
    *rp = *x;
    rp->op = IR_OP_LN_RESIDUAL_BWD;
    rp->n_in = xhat ? 4 : 5;
    int in[5] = {dy, s, fuse_output_ref(ln, 1), fuse_output_ref(ln, 2), x->in[2]};
    if (xhat) {   /* (dy, xhat, rstd, gamma) */
        in[1] = fuse_output_ref(ln, 3);
        in[2] = fuse_output_ref(ln, 2);
        in[3] = x->in[2];
        switch_to_xhat(M, ln, s);
    }
    for (int q = 0; q < IR_MAX_INPUTS; q++) rp->in[q] = q < rp->n_in ? in[q] : -1;
    IrLnFusedAttr lb = {la.eps, la.p, la.salt, xhat, nd(M, dd)->dtype, 0, aux, 0};
    fuse_ln_attr_set(&rp->attr, lb);
    M->action[dxn] = FUSE_REPLACE;
    fuse_alias(M, dd, dxn, 1);
    for (int q = 0; q < 3; q++)
        if (members[q] >= 0 && nd(M, members[q])->dtype == aux) fuse_alias(M, members[q], dxn, 2 + q);
    M->stats->ln_residual_bwd++;
}

void fuse_match_layernorm(Matcher *M)
{
    for (int i = 0; i < M->g->n; i++)
        if (fuse_is_free(M, i, IR_OP_LAYERNORM, false)) match_site(M, i);
    for (int i = 0; i < M->g->n; i++)
        if (fuse_is_free(M, i, IR_OP_LAYERNORM_DX, true)) match_site_bwd(M, i);
}
