/* compiler/fuse_embed.c — the fuse rule of BERT's embedding layer (see
 * fuse.h for the rewrites, fuse_internal.h for the matcher).
 *
 * Forward: y = DROPOUT(LAYERNORM(s, gamma, beta)) (or the LAYERNORM alone),
 * s a chain of ADDs over two or three EMBEDDING lookups, becomes one
 * EMBED_LN(gamma, beta, table0, ids0, table1, ids1[, table2, ids2]) placed
 * at y, the lookups in the order the chain sums them; the CASTs of y to one
 * 16-bit dtype become its output 3.  Its outputs 1 and 2, xhat (f16) and
 * rstd, are what the backward reads instead of s, so the f32 sum is never
 * stored (12 MiB at BERT-base 32 x 128).
 *
 * Backward: DROPOUT(dy) with the forward's mask, ds = LAYERNORM_DX(., s,
 * gamma), LAYERNORM_DGAMMA and BIAS_GRAD of the dropped gradient (dgamma,
 * dbeta) and the EMBEDDING_BWD of ds for each table become one
 * EMBED_LN_BWD(dy, xhat, rstd, gamma, ids0, ids1[, ids2]) placed at the last
 * of those members; the tables' gradients are its outputs 0-2, dgamma and
 * dbeta 3 and 4.
 *
 * Both halves or neither: the fused forward no longer makes s, which the
 * unfused backward reads.  Every value the pattern removes must be f32 (so
 * the kernels round nothing the unfused chain does not) and read only
 * inside the pattern; y must have a 16-bit CAST (a mixed policy: the fp32
 * policy keeps the unfused layer, whose LayerNorm backward recomputes xhat
 * in double); the first table must have a gradient (the node's own value).
 * FuseOptions.embed_ln (HPC_FUSE_EMB=0 turns it off) with ln_save_xhat
 * (HPC_LN_SAVE=s, every LayerNorm keeping its f32 input, keeps this one's). */
#include "fuse_internal.h"

static const IrNode *nd(const Matcher *M, int id) { return fuse_node(M, id); }

typedef struct {
    int terms[3], n_terms;   /* EMBEDDING nodes in summation order */
    int adds[2], n_adds;
    int ln, drop, y;         /* y = drop, or ln without a dropout */
    DType low;               /* dtype of the folded CASTs */
    int dd, dx, dg, db;      /* backward: DROPOUT(dy) (-1 without), LAYERNORM_DX, dgamma, dbeta (-1: none) */
    int ebwd[3];             /* EMBEDDING_BWD of each table (-1: a frozen table) */
} EmbSite;

/* The EMBEDDING terms of the ADD chain at v, in the order it sums them: a
 * left-deep chain ((e0 + e1) + e2), either operand order (f32 addition
 * commutes).  Every member free, forward, f32 and read once (the root's
 * readers are checked by the caller). */
static bool collect_terms(const Matcher *M, int v, bool root, EmbSite *e)
{
    const IrNode *x = nd(M, v);
    if (M->action[v] != FUSE_COPY || x->backward || x->dtype != DT_F32 || (!root && M->n_uses[v] != 1)) return false;
    if (x->op == IR_OP_EMBEDDING) {
        if (e->n_terms == 3) return false;
        e->terms[e->n_terms++] = v;
        return true;
    }
    if (x->op != IR_OP_ADD || e->n_adds == 2) return false;
    e->adds[e->n_adds++] = v;
    int a = x->in[0], b = x->in[1];
    if (nd(M, b)->op != IR_OP_EMBEDDING) {
        int t = a;
        a = b;
        b = t;
    }
    if (a == b || nd(M, b)->op != IR_OP_EMBEDDING) return false;
    return collect_terms(M, a, false, e) && collect_terms(M, b, false, e);
}

/* The one node after `from` that reads v as input k and is a free op of
 * the given direction; -1 if none, -2 if more than one. */
static int only_reader(const Matcher *M, int v, int k, IrOpKind op, bool backward, int from)
{
    int found = -1;
    for (int j = from + 1; j < M->g->n; j++) {
        const IrNode *u = nd(M, j);
        if (u->n_in > k && u->in[k] == v && fuse_is_free(M, j, op, backward)) {
            if (found >= 0) return -2;
            found = j;
        }
    }
    return found;
}

/* Every node reading v comes after `at`. */
static bool read_after(const Matcher *M, int v, int at)
{
    for (int j = 0; j <= at; j++)
        for (int k = 0; k < nd(M, j)->n_in; k++)
            if (nd(M, j)->in[k] == v) return false;
    return true;
}

static bool is_f32(const Matcher *M, int v) { return v < 0 || nd(M, v)->dtype == DT_F32; }

/* The forward half at LAYERNORM ln: the chain, the dropout, the 16-bit cast. */
static bool match_forward(const Matcher *M, int ln, EmbSite *e)
{
    const IrNode *l = nd(M, ln);
    if (l->dtype != DT_F32 || !collect_terms(M, l->in[0], true, e) || e->n_terms < 2) return false;
    for (int k = 0; k < e->n_terms; k++) {
        const IrNode *t = nd(M, e->terms[k]);
        if (k == 2 && nd(M, t->in[0])->dims[0] > EMBED_LN_ROWS2_MAX) return false;
        if (nd(M, t->in[0])->dims[0] > INT32_MAX) return false;
    }
    e->ln = ln;
    e->drop = -1;
    int d = only_reader(M, ln, 0, IR_OP_DROPOUT, false, ln);
    if (d >= 0 && M->n_uses[ln] == 1 && nd(M, d)->dtype == DT_F32 && nd(M, d)->attr.dropout.salt >= 0 &&
        nd(M, d)->attr.dropout.salt <= FUSE_LN_SALT_MAX)
        e->drop = d;
    e->y = e->drop >= 0 ? e->drop : ln;
    e->low = DT_F32;
    for (int j = e->y + 1; j < M->g->n && e->low == DT_F32; j++) {
        const IrNode *u = nd(M, j);
        bool to16 = u->attr.cast.to == DT_F16 || u->attr.cast.to == DT_BF16;
        if (u->in[0] == e->y && fuse_is_free(M, j, IR_OP_CAST, false) && to16) e->low = u->attr.cast.to;
    }
    return e->low != DT_F32;
}

/* The backward half: the LayerNorm's gradient nodes and the lookups'. */
static bool match_backward(const Matcher *M, EmbSite *e)
{
    const IrNode *l = nd(M, e->ln);
    int s = l->in[0];
    e->dx = only_reader(M, s, 1, IR_OP_LAYERNORM_DX, true, e->ln);
    if (e->dx < 0 || nd(M, e->dx)->in[2] != l->in[1] || nd(M, e->dx)->attr.norm.eps != l->attr.norm.eps) return false;
    int dln = nd(M, e->dx)->in[0];
    e->dd = -1;
    if (e->drop >= 0) {
        const IrNode *dd = nd(M, dln), *fd = nd(M, e->drop);
        if (!fuse_is_free(M, dln, IR_OP_DROPOUT, true) || dd->attr.dropout.salt != fd->attr.dropout.salt ||
            (float)dd->attr.dropout.p != (float)fd->attr.dropout.p)
            return false;
        e->dd = dln;
    }
    e->dg = only_reader(M, dln, 0, IR_OP_LAYERNORM_DGAMMA, true, dln);
    e->db = only_reader(M, dln, 0, IR_OP_BIAS_GRAD, true, dln);
    if (e->dg == -2 || e->db == -2) return false;
    if (e->dg >= 0 && (nd(M, e->dg)->in[1] != s || nd(M, e->dg)->attr.norm.eps != l->attr.norm.eps)) return false;
    if (e->dd >= 0 && M->n_uses[dln] != 1 + (e->dg >= 0) + (e->db >= 0)) return false;
    /* s: read by the LAYERNORM, its LAYERNORM_DX and LAYERNORM_DGAMMA only */
    if (M->n_uses[s] != 2 + (e->dg >= 0)) return false;
    int n_bwd = 0;
    for (int k = 0; k < e->n_terms; k++) {
        const IrNode *t = nd(M, e->terms[k]);
        e->ebwd[k] = -1;   /* the lookup backward of these ids and this table */
        for (int j = e->dx + 1; j < M->g->n; j++) {
            const IrNode *u = nd(M, j);
            if (fuse_is_free(M, j, IR_OP_EMBEDDING_BWD, true) && u->in[0] == e->dx && u->in[1] == t->in[1] &&
                u->attr.embed_bwd.rows == nd(M, t->in[0])->dims[0]) {
                if (e->ebwd[k] >= 0) return false;
                e->ebwd[k] = j;
            }
        }
        if (e->ebwd[k] >= 0) n_bwd++;
        if (!is_f32(M, e->ebwd[k])) return false;
    }
    if (e->ebwd[0] < 0 || M->n_uses[e->dx] != n_bwd) return false;
    return is_f32(M, e->dx) && is_f32(M, e->dd) && is_f32(M, e->dg) && is_f32(M, e->db) &&
           nd(M, nd(M, e->dx)->in[0])->rank == 3;
}

static void rewrite_forward(Matcher *M, const EmbSite *e)
{
    const IrNode *l = nd(M, e->ln);
    IrEmbedLnAttr a = {.eps = l->attr.norm.eps, .low = (uint32_t)e->low};
    if (e->drop >= 0) {
        a.p = (float)nd(M, e->drop)->attr.dropout.p;
        a.salt = (uint32_t)nd(M, e->drop)->attr.dropout.salt;
    }
    IrNode *rp = &M->repl[e->y];
    *rp = *nd(M, e->y);
    rp->op = IR_OP_EMBED_LN;
    rp->n_in = 2 + 2 * e->n_terms;
    for (int q = 0; q < IR_MAX_INPUTS; q++) rp->in[q] = -1;
    rp->in[0] = l->in[1];
    rp->in[1] = l->in[2];
    for (int k = 0; k < e->n_terms; k++) {
        rp->in[2 + 2 * k] = nd(M, e->terms[k])->in[0];
        rp->in[3 + 2 * k] = nd(M, e->terms[k])->in[1];
    }
    fuse_embed_attr_set(&rp->attr, a);
    M->action[e->y] = FUSE_REPLACE;
    M->outputs[e->y] = 1u << 1 | 1u << 2;   /* xhat, rstd: the backward reads them */
    if (e->drop >= 0) M->action[e->ln] = FUSE_DROP;
    for (int k = 0; k < e->n_terms; k++) M->action[e->terms[k]] = FUSE_DROP;
    for (int k = 0; k < e->n_adds; k++) M->action[e->adds[k]] = FUSE_DROP;
    for (int j = e->y + 1; j < M->g->n; j++)
        if (nd(M, j)->in[0] == e->y && fuse_is_free(M, j, IR_OP_CAST, false) && nd(M, j)->attr.cast.to == e->low)
            fuse_alias(M, j, e->y, 3);
}

/* The backward node goes to the last member that stays a value (a table's
 * gradient, dgamma or dbeta); it stands for that member's output. */
static bool rewrite_backward(Matcher *M, const EmbSite *e)
{
    int member[5] = {e->ebwd[0], e->n_terms > 1 ? e->ebwd[1] : -1, e->n_terms > 2 ? e->ebwd[2] : -1, e->dg, e->db};
    int at = -1, at_k = 0;
    for (int k = 0; k < 5; k++)
        if (member[k] > at) {
            at = member[k];
            at_k = k;
        }
    for (int k = 0; k < 5; k++)
        if (member[k] >= 0 && !read_after(M, member[k], at)) return false;
    const IrNode *l = nd(M, e->ln);
    IrEmbedLnBwdAttr a = {.rows0 = (int32_t)nd(M, nd(M, e->terms[0])->in[0])->dims[0],
                          .rows1 = (int32_t)nd(M, nd(M, e->terms[1])->in[0])->dims[0]};
    if (e->n_terms > 2) a.rows2 = (uint32_t)nd(M, nd(M, e->terms[2])->in[0])->dims[0];
    if (e->drop >= 0) {
        a.p = (float)nd(M, e->drop)->attr.dropout.p;
        a.salt = (uint32_t)nd(M, e->drop)->attr.dropout.salt;
    }
    IrNode *rp = &M->repl[at];
    *rp = *nd(M, at);
    rp->op = IR_OP_EMBED_LN_BWD;
    rp->n_in = 4 + e->n_terms;
    for (int q = 0; q < IR_MAX_INPUTS; q++) rp->in[q] = -1;
    int dln = nd(M, e->dx)->in[0];
    rp->in[0] = e->dd >= 0 ? nd(M, e->dd)->in[0] : dln;
    rp->in[1] = fuse_output_ref(e->y, 1);
    rp->in[2] = fuse_output_ref(e->y, 2);
    rp->in[3] = l->in[1];
    for (int k = 0; k < e->n_terms; k++) rp->in[4 + k] = nd(M, e->terms[k])->in[1];
    fuse_embed_bwd_attr_set(&rp->attr, a);
    M->action[at] = FUSE_REPLACE;
    M->out_k[at] = at_k;
    if (at_k) M->outputs[at] |= 1u << at_k;
    M->named_outputs[at] = true;
    for (int k = 0; k < 5; k++)
        if (member[k] >= 0 && member[k] != at) fuse_alias(M, member[k], at, k);
    M->action[e->dx] = FUSE_DROP;
    if (e->dd >= 0) M->action[e->dd] = FUSE_DROP;
    return true;
}

void fuse_match_embed(Matcher *M)
{
    if (M->g->n_forward >= M->g->n) return;   /* a forward-only graph: the backward half is the point */
    for (int i = 0; i < M->g->n; i++) {
        if (!fuse_is_free(M, i, IR_OP_LAYERNORM, false)) continue;
        EmbSite e = {0};
        if (!match_forward(M, i, &e) || !match_backward(M, &e)) continue;
        /* the backward's placement is checked before anything is rewritten */
        if (!rewrite_backward(M, &e)) continue;
        rewrite_forward(M, &e);
        M->stats->embed_ln++;
    }
}
