/* compiler/fuse.c — the fuse pass; see fuse.h.
 *
 * Two steps: match (decide, per node of the input graph, whether it is
 * removed, replaced by a fused node, or copied), then rebuild (append the
 * nodes in the input order, so the output is still topologically sorted:
 * a fused node takes the place of the last node of its pattern, and every
 * input it reads comes earlier). */
#include "fuse_internal.h"

#include <stdlib.h>
#include <string.h>

_Static_assert(sizeof(IrFusedAttr) <= sizeof(IrAttr), "IrFusedAttr must fit in the IrAttr union");
_Static_assert(sizeof(IrLnFusedAttr) <= sizeof(IrAttr), "IrLnFusedAttr must fit in the IrAttr union");

IrLnFusedAttr fuse_ln_attr_get(const IrNode *n)
{
    IrLnFusedAttr f;
    memcpy(&f, &n->attr, sizeof f);
    return f;
}

void fuse_ln_attr_set(IrAttr *a, IrLnFusedAttr f)
{
    memset(a, 0, sizeof *a);
    memcpy(a, &f, sizeof f);
}

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

static void match_all(Matcher *M)
{
    for (int i = 0; i < M->g->n; i++)
        if (node(M, i)->op == IR_OP_SOFTMAX && !node(M, i)->backward) match_softmax(M, i);
    /* The LayerNorm sites first: they take their DROPOUT + ADD with them. */
    const char *ln = getenv("HPC_FUSE_LN");   /* a hook for comparisons, as HPC_KEEP_F32 */
    if (!ln || strcmp(ln, "0") != 0) fuse_match_layernorm(M);
    for (int i = 0; i < M->g->n; i++)
        if (node(M, i)->op == IR_OP_ADD) match_add(M, i);
}

/* Appends the fused node r (inputs in the input graph's ids) and, for a
 * multi-output op, the OUTPUT nodes of the bits of `outputs`. */
static int append_fused(IrGraph *out, const IrNode *r, unsigned outputs, const int *map)
{
    int in[IR_MAX_INPUTS];
    for (int k = 0; k < r->n_in; k++) {
        int v = r->in[k];
        in[k] = fuse_is_output_ref(v) ? ir_output(out, map[fuse_ref_node(v)], fuse_ref_k(v)) : map[v];
        HPC_ASSERT(in[k] >= 0);
    }
    int id = ir_add(out, r->op, in, r->n_in, &r->attr, r->name);
    IrNode *o = &out->nodes[id];
    o->dtype = r->dtype;
    o->requires_grad = r->requires_grad;
    o->backward = r->backward;
    o->region = r->region;
    for (int k = 1; k < ir_op_info(r->op)->n_outputs; k++) {
        if (!(outputs >> k & 1u)) continue;
        char name[IR_NAME_MAX];
        snprintf(name, sizeof name, "%.*s.%s", IR_NAME_MAX - 16, r->name, ir_output_name(r->op, k));
        IrAttr a = {.output = {k}};
        int j = ir_add(out, IR_OP_OUTPUT, &id, 1, &a, name);
        out->nodes[j].requires_grad = r->requires_grad;
        out->nodes[j].backward = r->backward;
        out->nodes[j].region = r->region;
    }
    return id;
}

/* The ALIAS members of the fused node that replaced `at` now read its outputs. */
static void bind_aliases(const Matcher *M, const IrGraph *out, int at, int *map)
{
    for (int i = 0; i < M->g->n; i++) {
        if (M->action[i] != FUSE_ALIAS || M->alias_of[i] != at) continue;
        map[i] = ir_output(out, map[at], M->alias_k[i]);
        HPC_ASSERT(map[i] >= 0);
        /* the storage dtype of the value it stands for (the op's shape rule agrees) */
        HPC_ASSERT(out->nodes[map[i]].dtype == M->g->nodes[i].dtype);
    }
}

static int append_copy(IrGraph *out, const IrNode *n, const int *map)
{
    for (int k = 0; k < n->n_in; k++) HPC_ASSERT(map[n->in[k]] >= 0);
    int id = ir_copy_node(out, n, map);
    out->nodes[id].dtype = n->dtype;   /* the storage dtype precision chose */
    return id;
}

/* The precision plan of `in` re-indexed for `out` through map. */
static void remap_plan(const PrecisionPlan *pin, const int *map, const IrGraph *in, const IrGraph *out,
                       PrecisionPlan *pout)
{
    *pout = *pin;
    pout->n = out->n;
    pout->info = xcalloc((size_t)(out->n > 0 ? out->n : 1), sizeof *pout->info);
    bool *set = xcalloc((size_t)(out->n > 0 ? out->n : 1), sizeof *set);
    for (int i = 0; i < in->n; i++)
        if (map[i] >= 0) {
            pout->info[map[i]] = pin->info[i];
            set[map[i]] = true;
        }
    /* outputs that stand for no input value (a fused site's mean, rstd): their op's */
    for (int j = 0; j < out->n; j++)
        if (!set[j] && out->nodes[j].op == IR_OP_OUTPUT) pout->info[j] = pout->info[out->nodes[j].in[0]];
    free(set);
    pout->map = xmalloc((size_t)(pin->n_in > 0 ? pin->n_in : 1) * sizeof *pout->map);
    for (int u = 0; u < pin->n_in; u++) pout->map[u] = pin->map[u] >= 0 ? map[pin->map[u]] : -1;
    pout->param_low = xmalloc((size_t)(pin->n_params > 0 ? pin->n_params : 1) * sizeof *pout->param_low);
    if (pin->n_params > 0)
        memcpy(pout->param_low, pin->param_low, (size_t)pin->n_params * sizeof *pout->param_low);
}

static void rebuild(const Matcher *M, IrGraph *out, int *map)
{
    const IrGraph *in = M->g;
    int n_forward = 0;
    for (int i = 0; i < in->n; i++) map[i] = -1;
    for (int i = 0; i < in->n; i++) {
        const IrNode *n = node(M, i);
        if (M->action[i] == FUSE_REPLACE) {
            map[i] = append_fused(out, &M->repl[i], M->outputs[i], map);
            bind_aliases(M, out, i, map);
        } else if (M->action[i] == FUSE_COPY) {
            map[i] = append_copy(out, n, map);
        } else if (M->action[i] == FUSE_ALIAS && M->alias_of[i] < i) {
            HPC_ASSERT(map[i] >= 0);   /* bound when its fused node was appended */
        }
        if (i == in->n_forward - 1) n_forward = out->n;
    }
    ir_copy_roles(out, in, map);
    out->n_forward = n_forward;
}

HpcStatus fuse_graph(const IrGraph *in, const PrecisionPlan *pin, IrGraph *out, PrecisionPlan *pout,
                     FuseStats *stats, HpcError *err)
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
                 xcalloc(n, sizeof(unsigned)), xcalloc(n, sizeof(int)), xcalloc(n, sizeof(int)), stats};
    count_uses(&M);
    match_all(&M);
    int *map = xmalloc(n * sizeof *map);
    rebuild(&M, out, map);
    if (pout) remap_plan(pin, map, in, out, pout);
    stats->nodes_before = in->n;
    stats->nodes_after = out->n;
    free(map);
    free(M.n_uses);
    free(M.action);
    free(M.repl);
    free(M.outputs);
    free(M.alias_of);
    free(M.alias_k);
    return HPC_OK;
}

int fuse_count_launches(const IrGraph *g)
{
    int n = 0;
    for (int i = 0; i < g->n; i++) {
        const IrNode *v = &g->nodes[i];
        if (v->op == IR_OP_PARAM || v->op == IR_OP_OUTPUT) continue;   /* a projection launches nothing */
        if (v->op == IR_OP_INPUT && v->attr.input.kind != IR_IN_LOSS_SCALE) continue;
        n++;
    }
    return n;
}
