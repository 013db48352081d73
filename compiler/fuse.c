/* compiler/fuse.c — the fuse pass; see fuse.h.
 *
 * Two steps: match (decide, per node of the input graph, whether it is
 * removed, replaced by a fused node, or copied), then rebuild (append the
 * nodes in the input order, so the output is still topologically sorted:
 * a fused node takes the place of the last node of its pattern, and every
 * input it reads comes earlier). */
#include "fuse.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(IrFusedAttr) <= sizeof(IrAttr), "IrFusedAttr must fit in the IrAttr union");

IrFusedAttr fuse_attr_get(const IrNode *n)
{
    IrFusedAttr f;
    memcpy(&f, &n->attr, sizeof f);
    return f;
}

void fuse_attr_set(IrAttr *a, IrFusedAttr f)
{
    memset(a, 0, sizeof *a);
    memcpy(a, &f, sizeof f);
}

typedef enum { FUSE_COPY, FUSE_DROP, FUSE_REPLACE } FuseAction;

typedef struct {
    const IrGraph *g;
    int *n_uses;          /* (g->n) readers of each value, roles included */
    FuseAction *action;   /* (g->n) */
    IrNode *repl;         /* (g->n) the fused node for FUSE_REPLACE (inputs in g's ids) */
    int *out_k;           /* (g->n) which output of a multi-output fused node the value becomes */
    int *partner;         /* (g->n) FUSE_REPLACE of a multi-output node: the dropped node it absorbs, or -1 */
    int *recompute;       /* (g->n) forward ACT to copy right before this node, or -1 */
    bool recompute_act;   /* FuseOptions.recompute_act */
    FuseStats *stats;
} Matcher;

static const IrNode *node(const Matcher *M, int id) { return &M->g->nodes[id]; }

static void count_uses(Matcher *M)
{
    const IrGraph *g = M->g;
    for (int i = 0; i < g->n; i++)
        for (int k = 0; k < g->nodes[i].n_in; k++) M->n_uses[g->nodes[i].in[k]]++;
    if (g->loss >= 0) M->n_uses[g->loss]++;
    if (g->logits >= 0) M->n_uses[g->logits]++;
    for (int p = 0; p < g->n_params && g->param_grad; p++)
        if (g->param_grad[p] >= 0) M->n_uses[g->param_grad[p]]++;
}

/* The fused node that replaces `at`: its name, flags and dtype are at's. */
static void replace(Matcher *M, int at, IrOpKind op, const int *in, int n_in, IrFusedAttr fa)
{
    IrNode *r = &M->repl[at];
    *r = *node(M, at);
    r->op = op;
    r->n_in = n_in;
    for (int k = 0; k < IR_MAX_INPUTS; k++) r->in[k] = k < n_in ? in[k] : -1;
    fuse_attr_set(&r->attr, fa);
    M->action[at] = FUSE_REPLACE;
}

static bool is_dropout_free(const Matcher *M, int id)
{
    return node(M, id)->op == IR_OP_DROPOUT && M->action[id] == FUSE_COPY;
}

/* SOFTMAX y read by exactly one forward DROPOUT d and by SOFTMAX_BWD nodes
 * whose incoming gradient is DROPOUT(dy) with d's mask, read once. */
static void match_softmax(Matcher *M, int y)
{
    const IrGraph *g = M->g;
    const IrNode *sm = node(M, y);
    int d = -1, n_bwd = 0, bwd[8];
    for (int i = y + 1; i < g->n; i++) {
        const IrNode *u = node(M, i);
        for (int k = 0; k < u->n_in; k++) {
            if (u->in[k] != y) continue;
            if (u->op == IR_OP_DROPOUT && !u->backward && d < 0 && k == 0) d = i;
            else if (u->op == IR_OP_SOFTMAX_BWD && k == 1 && n_bwd < 8) bwd[n_bwd++] = i;
            else return;
        }
    }
    if (d < 0 || M->n_uses[y] != 1 + n_bwd || !is_dropout_free(M, d)) return;
    const IrDropoutAttr *da = &node(M, d)->attr.dropout;
    for (int j = 0; j < n_bwd; j++) {
        int gd = node(M, bwd[j])->in[0];
        const IrNode *gn = node(M, gd);
        if (!is_dropout_free(M, gd) || M->n_uses[gd] != 1 || gn->attr.dropout.salt != da->salt ||
            (float)gn->attr.dropout.p != (float)da->p)
            return;
    }
    IrFusedAttr fa = {(float)da->p, da->salt, sm->attr.softmax.causal, (uint8_t)sm->dtype, 0, 0};
    M->action[y] = FUSE_DROP;
    replace(M, d, IR_OP_SOFTMAX_DROPOUT, sm->in, 2, fa);
    M->stats->softmax_dropout++;
    for (int j = 0; j < n_bwd; j++) {
        int gd = node(M, bwd[j])->in[0];
        fa.mid2 = (uint8_t)node(M, gd)->dtype;
        M->action[gd] = FUSE_DROP;
        replace(M, bwd[j], IR_OP_SOFTMAX_DROPOUT_BWD, (int[]){node(M, gd)->in[0], sm->in[0], sm->in[1]},
                3, fa);
        M->stats->softmax_dropout_bwd++;
    }
}

/* ADD a (forward) with one input a DROPOUT d read only by a. */
static void match_add(Matcher *M, int a)
{
    const IrNode *add = node(M, a);
    if (add->backward || M->action[a] != FUSE_COPY) return;
    for (int k = 0; k < 2; k++) {
        int d = add->in[k], r = add->in[1 - k];
        if (d == r || !is_dropout_free(M, d) || M->n_uses[d] != 1 || node(M, d)->backward) continue;
        const IrNode *dn = node(M, d);
        IrFusedAttr fa = {(float)dn->attr.dropout.p, dn->attr.dropout.salt, 0, (uint8_t)dn->dtype, 0, 0};
        M->action[d] = FUSE_DROP;
        replace(M, a, IR_OP_DROPOUT_ADD, (int[]){dn->in[0], r}, 2, fa);
        M->stats->dropout_add++;
        return;
    }
}

/* ---- bias gradients from the weight-gradient GEMM ---------------------
 * LINEAR_DW(dy, x) and BIAS_GRAD(dy) of the same dy => LINEAR_DW_BGRAD(dy, x)
 * with dW as output 0 and db as output 1.  The column sums of dy do not
 * depend on whose bias they are, so any such pair is exact; both must still
 * be plain copies (no other rule took them) and store in one dtype (the
 * epilogue writes db in dW's type).  The fused node takes the later one's
 * place; nothing between the two may read the earlier one, so moving it
 * keeps the order valid. */
static bool read_between(const Matcher *M, int v, int from, int to)
{
    for (int i = from + 1; i < to; i++)
        for (int k = 0; k < node(M, i)->n_in; k++)
            if (node(M, i)->in[k] == v) return true;
    return false;
}

static void match_bias_grad(Matcher *M, int bg)
{
    const IrNode *b = node(M, bg);
    if (!b->backward || M->action[bg] != FUSE_COPY) return;
    int dy = b->in[0];
    for (int dw = dy + 1; dw < M->g->n; dw++) {
        const IrNode *w = node(M, dw);
        if (w->op != IR_OP_LINEAR_DW || w->in[0] != dy || !w->backward || M->action[dw] != FUSE_COPY ||
            w->dtype != b->dtype)
            continue;
        int first = dw < bg ? dw : bg, at = dw < bg ? bg : dw;
        if (read_between(M, first, first, at)) continue;
        replace(M, at, IR_OP_LINEAR_DW_BGRAD, w->in, 2, (IrFusedAttr){0});
        IrNode *r = &M->repl[at];
        snprintf(r->name, sizeof r->name, "%s", w->name);   /* the node is dW; db is its output */
        r->dtype = w->dtype;
        r->requires_grad = w->requires_grad;
        r->backward = true;
        r->region = w->region;
        M->action[first] = FUSE_DROP;
        M->partner[at] = first;
        M->out_k[dw] = 0;
        M->out_k[bg] = 1;
        M->stats->linear_dw_bgrad++;
        return;
    }
}

/* ---- activations recomputed in the backward pass ----------------------
 * A forward ACT g = act(h) whose backward readers are all weight-gradient
 * GEMMs (the FFN's dW2 = dy^T g) is not kept from the forward pass: a copy
 * of the ACT runs right before the first of them and they read the copy.
 * The forward g then dies at the forward LINEAR that reads it, so the step
 * keeps h (ACT_BWD needs it anyway) but not g: B*L*ffn values per layer
 * less at the peak, for one elementwise pass more.  The copy computes the
 * same values (same op, input and storage dtype), so the results do not
 * change.  Roles (loss, logits, gradients) are never recomputed. */
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
    if (node(M, a)->backward || M->action[a] != FUSE_COPY || is_role(g, a)) return;
    int first = -1;
    for (int i = a + 1; i < g->n; i++) {
        const IrNode *u = node(M, i);
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

static void match_all(Matcher *M)
{
    for (int i = 0; i < M->g->n; i++)
        if (node(M, i)->op == IR_OP_SOFTMAX && !node(M, i)->backward) match_softmax(M, i);
    for (int i = 0; i < M->g->n; i++)
        if (node(M, i)->op == IR_OP_ADD) match_add(M, i);
    for (int i = 0; i < M->g->n; i++)
        if (node(M, i)->op == IR_OP_BIAS_GRAD) match_bias_grad(M, i);
    for (int i = 0; M->recompute_act && i < M->g->n_forward; i++)
        if (node(M, i)->op == IR_OP_ACT) match_recompute(M, i);
}

/* Appends the fused node r (inputs in the input graph's ids). */
static int append_fused(IrGraph *out, const IrNode *r, const int *map)
{
    int in[IR_MAX_INPUTS];
    for (int k = 0; k < r->n_in; k++) {
        in[k] = map[r->in[k]];
        HPC_ASSERT(in[k] >= 0);
    }
    int id = ir_add(out, r->op, in, r->n_in, &r->attr, r->name);
    IrNode *o = &out->nodes[id];
    o->dtype = r->dtype;
    o->requires_grad = r->requires_grad;
    o->backward = r->backward;
    return id;
}

static int append_copy(IrGraph *out, const IrNode *n, const int *map)
{
    for (int k = 0; k < n->n_in; k++) HPC_ASSERT(map[n->in[k]] >= 0);
    int id = ir_copy_node(out, n, map);
    out->nodes[id].dtype = n->dtype;   /* the storage dtype precision chose */
    return id;
}

/* The precision plan of `in` re-indexed for `out` through map (each
 * value's first image); a recomputed copy (src_of[j] >= 0) takes the plan
 * of what it copies. */
static void remap_plan(const PrecisionPlan *pin, const int *map, const int *src_of, const IrGraph *in,
                       const IrGraph *out, PrecisionPlan *pout)
{
    *pout = *pin;
    pout->n = out->n;
    pout->info = xmalloc((size_t)(out->n > 0 ? out->n : 1) * sizeof *pout->info);
    for (int i = 0; i < in->n; i++)
        if (map[i] >= 0) pout->info[map[i]] = pin->info[i];
    for (int j = 0; j < out->n; j++)
        if (src_of[j] >= 0) pout->info[j] = pin->info[src_of[j]];
    pout->map = xmalloc((size_t)(pin->n_in > 0 ? pin->n_in : 1) * sizeof *pout->map);
    for (int u = 0; u < pin->n_in; u++) pout->map[u] = pin->map[u] >= 0 ? map[pin->map[u]] : -1;
    pout->param_low = xmalloc((size_t)(pin->n_params > 0 ? pin->n_params : 1) * sizeof *pout->param_low);
    if (pin->n_params > 0)
        memcpy(pout->param_low, pin->param_low, (size_t)pin->n_params * sizeof *pout->param_low);
}

/* A multi-output fused node at i (LINEAR_DW_BGRAD): the node, then its
 * OUTPUT nodes; i and its partner map to the outputs they became, and each
 * output keeps the dtype and flags of the node it replaces. */
static void append_fused_outputs(const Matcher *M, IrGraph *out, int i, int *map)
{
    const IrNode *r = &M->repl[i];
    int in[IR_MAX_INPUTS], outs[4];
    for (int k = 0; k < r->n_in; k++) {
        in[k] = map[r->in[k]];
        HPC_ASSERT(in[k] >= 0);
    }
    HPC_ASSERT(ir_op_info(r->op)->n_outputs <= 4);
    ir_add_outputs(out, r->op, in, r->n_in, &r->attr, r->name, outs);
    int src[2] = {i, M->partner[i]};
    for (int s = 0; s < 2; s++) {
        const IrNode *was = node(M, src[s]);
        IrNode *o = &out->nodes[outs[M->out_k[src[s]]]];
        o->dtype = was->dtype;
        o->requires_grad = was->requires_grad;
        o->backward = was->backward;
        o->region = was->region;
        snprintf(o->name, sizeof o->name, "%s", was->name);   /* "d.NAME.weight", "d.NAME.bias" */
        map[src[s]] = outs[M->out_k[src[s]]];
    }
}

/* The copy of forward ACT a before node `at`; later readers of a read it. */
static int append_recompute(const Matcher *M, IrGraph *out, int a, int *wire, int *src_of)
{
    int r = append_copy(out, node(M, a), wire);
    IrNode *o = &out->nodes[r];
    o->backward = true;
    snprintf(o->name, sizeof o->name, "%.*s.recompute", IR_NAME_MAX - 11, node(M, a)->name);
    src_of[r] = a;
    wire[a] = r;
    return r;
}

/* map[i]: the first image of input node i (the plan follows it); wire: what
 * a reader appended now reads (a recomputed ACT's copy once it exists). */
static void rebuild(const Matcher *M, IrGraph *out, int *map, int *src_of)
{
    const IrGraph *in = M->g;
    int n_forward = 0;
    int *wire = xmalloc((size_t)(in->n > 0 ? in->n : 1) * sizeof *wire);
    for (int i = 0; i < in->n; i++) map[i] = wire[i] = -1;
    for (int i = 0; i < in->n; i++) {
        const IrNode *n = node(M, i);
        if (M->recompute[i] >= 0) append_recompute(M, out, M->recompute[i], wire, src_of);
        if (M->action[i] == FUSE_REPLACE && M->partner[i] >= 0) append_fused_outputs(M, out, i, wire);
        else if (M->action[i] == FUSE_REPLACE) wire[i] = append_fused(out, &M->repl[i], wire);
        else if (M->action[i] == FUSE_COPY) wire[i] = append_copy(out, n, wire);
        if (map[i] < 0) map[i] = wire[i];
        if (M->partner[i] >= 0 && map[M->partner[i]] < 0) map[M->partner[i]] = wire[M->partner[i]];
        if (i == in->n_forward - 1) n_forward = out->n;
    }
    ir_copy_roles(out, in, map);   /* roles are never recomputed: map == wire there */
    out->n_forward = n_forward;
    free(wire);
}

HpcStatus fuse_graph(const IrGraph *in, const PrecisionPlan *pin, IrGraph *out, PrecisionPlan *pout,
                     FuseStats *stats, HpcError *err)
{
    FuseOptions o = fuse_defaults();
    return fuse_graph_with(in, pin, out, pout, stats, &o, err);
}

FuseOptions fuse_defaults(void) { return (FuseOptions){.recompute_act = true}; }

HpcStatus fuse_graph_with(const IrGraph *in, const PrecisionPlan *pin, IrGraph *out, PrecisionPlan *pout,
                          FuseStats *stats, const FuseOptions *opts, HpcError *err)
{
    FuseStats local;
    if (!stats) stats = &local;
    memset(stats, 0, sizeof *stats);
    if (out->n != 0)
        return hpc_fail(err, HPC_ERR_USAGE, "fuse_graph: the output graph must be empty (ir_init)");
    if (pout && (!pin || pin->n != in->n))
        return hpc_fail(err, HPC_ERR_USAGE, "fuse_graph: a precision plan can only be re-indexed "
                        "from the plan of the input graph (pass pin, or pout = NULL)");
    size_t n = (size_t)(in->n > 0 ? in->n : 1);
    Matcher M = {in, xcalloc(n, sizeof(int)), xcalloc(n, sizeof(FuseAction)), xcalloc(n, sizeof(IrNode)),
                 xcalloc(n, sizeof(int)), xmalloc(n * sizeof(int)), xmalloc(n * sizeof(int)),
                 opts->recompute_act, stats};
    for (size_t i = 0; i < n; i++) M.partner[i] = M.recompute[i] = -1;
    count_uses(&M);
    match_all(&M);
    int *map = xmalloc(n * sizeof *map), *src_of = xmalloc(2 * n * sizeof *src_of);
    for (size_t i = 0; i < 2 * n; i++) src_of[i] = -1;   /* out has at most 2 n nodes (n + copies) */
    rebuild(&M, out, map, src_of);
    if (pout) remap_plan(pin, map, src_of, in, out, pout);
    stats->nodes_before = in->n;
    stats->nodes_after = out->n;
    free(map);
    free(src_of);
    free(M.recompute);
    free(M.n_uses);
    free(M.action);
    free(M.repl);
    free(M.out_k);
    free(M.partner);
    return HPC_OK;
}

int fuse_count_launches(const IrGraph *g)
{
    int n = 0;
    for (int i = 0; i < g->n; i++) {
        const IrNode *v = &g->nodes[i];
        if (v->op == IR_OP_PARAM || v->op == IR_OP_OUTPUT) continue;   /* an OUTPUT is written by its op */
        if (v->op == IR_OP_INPUT && v->attr.input.kind != IR_IN_LOSS_SCALE) continue;
        n++;
    }
    return n;
}
