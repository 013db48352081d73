/* compiler/fuse.c — the fuse pass; see fuse.h.
 *
 * Two steps: match (decide, per node of the input graph, whether it is
 * removed, replaced by a fused node, copied, or becomes an output of a
 * fused node; fuse_internal.h), then rebuild (append the nodes in the input
 * order, so the output is still topologically sorted: a fused node takes
 * the place its rule chose, and every input it reads comes earlier).  This
 * file has the driver, the rebuild and the elementwise rules (softmax +
 * dropout, dropout + add); fuse_layernorm.c the LayerNorm sites, fuse_dw.c
 * the weight-gradient GEMM's bias gradient and the recomputed activations,
 * fuse_accum.c the gradient sums folded into the dX GEMMs. */
#include "fuse_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/ir_build.h"

static const IrNode *node(const Matcher *M, int id) { return fuse_node(M, id); }

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
    if (M->opts.embed_ln && M->opts.ln_save_xhat) fuse_match_embed(M);   /* it saves xhat, as the sites do */
    for (int i = 0; i < M->g->n; i++)
        if (node(M, i)->op == IR_OP_SOFTMAX && !node(M, i)->backward) match_softmax(M, i);
    /* The LayerNorm sites next: they take their DROPOUT + ADD with them, and
     * the bias gradient of the LINEAR before them (fuse_dw.c says why). */
    if (M->opts.layernorm) fuse_match_layernorm(M);
    for (int i = 0; i < M->g->n; i++)
        if (node(M, i)->op == IR_OP_ADD) match_add(M, i);
    fuse_match_dw(M);
    fuse_match_accum(M);   /* last: it checks the readers of the fused nodes placed above */
}

/* What a fused node's input v (an id of the input graph, or an output
 * reference) is in `out`. */
static int wired(const IrGraph *out, int v, const int *wire)
{
    return fuse_is_output_ref(v) ? ir_output(out, wire[fuse_ref_node(v)], fuse_ref_k(v)) : wire[v];
}

/* Appends the fused node that replaces `at` and, for a multi-output op, the
 * OUTPUT nodes of the bits of outputs[at]; returns the fused node's id. */
static int append_fused(const Matcher *M, IrGraph *out, int at, const int *wire)
{
    const IrNode *r = &M->repl[at];
    int in[IR_MAX_INPUTS];
    for (int k = 0; k < r->n_in; k++) {
        in[k] = wired(out, r->in[k], wire);
        HPC_ASSERT(in[k] >= 0);
    }
    int id = ir_add(out, r->op, in, r->n_in, &r->attr, r->name);
    IrNode *o = &out->nodes[id];
    o->dtype = r->dtype;
    o->requires_grad = r->requires_grad;
    o->backward = r->backward;
    o->region = r->region;
    for (int k = 1; k < ir_op_info(r->op)->n_outputs; k++) {
        if (!(M->outputs[at] >> k & 1u)) continue;
        char name[IR_NAME_MAX];
        const char *what = ir_output_name(r->op, k);
        if (r->op == IR_OP_LN_RESIDUAL && k == 3 && fuse_ln_attr_get(r).xhat) what = "xhat";   /* not s */
        snprintf(name, sizeof name, "%.*s.%s", IR_NAME_MAX - 16, r->name, what);
        IrAttr a = {.output = {k}};
        int j = ir_add(out, IR_OP_OUTPUT, &id, 1, &a, name);
        out->nodes[j].requires_grad = r->requires_grad;
        out->nodes[j].backward = r->backward;
        out->nodes[j].region = r->region;
    }
    return id;
}

/* Input node i (the REPLACE at `at` or one of its ALIAS members) is now
 * output out_k[i] of the fused node f. */
static void bind(const Matcher *M, IrGraph *out, int i, int at, int f, int *wire, int *map)
{
    int j = ir_output(out, f, M->out_k[i]);
    HPC_ASSERT(j >= 0);
    /* the storage dtype of the value it stands for (the op's shape rule agrees) */
    HPC_ASSERT(out->nodes[j].dtype == M->g->nodes[i].dtype);
    if (M->named_outputs[at] && j != f) {
        snprintf(out->nodes[j].name, sizeof out->nodes[j].name, "%s", M->g->nodes[i].name);
        out->nodes[j].requires_grad = M->g->nodes[i].requires_grad;
    }
    wire[i] = j;
    if (map[i] < 0) map[i] = j;
}

/* Appends the fused node replacing `at`; it and its ALIAS members now read
 * as its outputs. */
static void append_replace(const Matcher *M, IrGraph *out, int at, int *wire, int *map)
{
    int f = append_fused(M, out, at, wire);
    bind(M, out, at, at, f, wire, map);
    for (int i = 0; i < M->g->n; i++)
        if (M->action[i] == FUSE_ALIAS && M->alias_of[i] == at) bind(M, out, i, at, f, wire, map);
}

static int append_copy(IrGraph *out, const IrNode *n, const int *wire)
{
    for (int k = 0; k < n->n_in; k++) HPC_ASSERT(wire[n->in[k]] >= 0);
    int id = ir_copy_node(out, n, wire);
    out->nodes[id].dtype = n->dtype;   /* the storage dtype precision chose */
    return id;
}

/* The copy of forward ACT a; readers appended after it read it. */
static void append_recompute(const Matcher *M, IrGraph *out, int a, int *wire, int *src_of)
{
    int r = append_copy(out, node(M, a), wire);
    IrNode *o = &out->nodes[r];
    o->backward = true;
    snprintf(o->name, sizeof o->name, "%.*s.recompute", IR_NAME_MAX - 11, node(M, a)->name);
    src_of[r] = a;
    wire[a] = r;
}

/* The fused node replacing `at`, appended early: its output 2 is the
 * recomputed forward ACT hoisted_act[at], which readers appended after it
 * read (as append_recompute's copy) and whose precision plan it takes. */
static void append_hoisted(const Matcher *M, IrGraph *out, int at, int *wire, int *map, int *src_of)
{
    append_replace(M, out, at, wire, map);
    int a = M->hoisted_act[at], y = ir_output(out, wire[at], 2);
    HPC_ASSERT(a >= 0 && y >= 0 && out->nodes[y].dtype == node(M, a)->dtype);
    out->nodes[y].requires_grad = node(M, a)->requires_grad;
    snprintf(out->nodes[y].name, sizeof out->nodes[y].name, "%.*s.recompute", IR_NAME_MAX - 11, node(M, a)->name);
    src_of[y] = a;
    wire[a] = y;
}

/* The precision plan of `in` re-indexed for `out` through map (each input
 * value's first image); a recomputed copy (src_of[j] >= 0) takes the plan
 * of what it copies, and an output that stands for no input value (a fused
 * site's mean, rstd) its op's. */
static void remap_plan(const PrecisionPlan *pin, const int *map, const int *src_of, const IrGraph *in,
                       const IrGraph *out, PrecisionPlan *pout)
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
    for (int j = 0; j < out->n; j++)
        if (src_of[j] >= 0) {
            pout->info[j] = pin->info[src_of[j]];
            set[j] = true;
        }
    for (int j = 0; j < out->n; j++)
        if (!set[j] && out->nodes[j].op == IR_OP_OUTPUT) pout->info[j] = pout->info[out->nodes[j].in[0]];
    free(set);
    pout->map = xmalloc((size_t)(pin->n_in > 0 ? pin->n_in : 1) * sizeof *pout->map);
    for (int u = 0; u < pin->n_in; u++) pout->map[u] = pin->map[u] >= 0 ? map[pin->map[u]] : -1;
    pout->param_low = xmalloc((size_t)(pin->n_params > 0 ? pin->n_params : 1) * sizeof *pout->param_low);
    if (pin->n_params > 0)
        memcpy(pout->param_low, pin->param_low, (size_t)pin->n_params * sizeof *pout->param_low);
}

/* The most nodes rebuild can append: every input node, the recomputed
 * copies and every output of every fused node. */
static int max_out_nodes(const Matcher *M)
{
    int n = M->g->n;
    for (int i = 0; i < M->g->n; i++) {
        if (M->recompute[i] >= 0) n++;   /* a hoisted node's outputs are counted at its REPLACE */
        if (M->action[i] == FUSE_REPLACE) n += ir_op_info(M->repl[i].op)->n_outputs;
    }
    return n;
}

/* map[i]: the first image of input node i (the plan and the roles follow
 * it); wire[i]: what a reader appended now reads (a recomputed ACT's copy
 * once it exists).  An ALIAS member is bound when its fused node is
 * appended, before or after its own place. */
static void rebuild(const Matcher *M, IrGraph *out, int *map, int *src_of)
{
    const IrGraph *in = M->g;
    int n_forward = 0;
    int *wire = xmalloc((size_t)(in->n > 0 ? in->n : 1) * sizeof *wire);
    for (int i = 0; i < in->n; i++) map[i] = wire[i] = -1;
    for (int i = 0; i < in->n; i++) {
        if (M->recompute[i] >= 0) append_recompute(M, out, M->recompute[i], wire, src_of);
        if (M->hoist[i] >= 0) append_hoisted(M, out, M->hoist[i], wire, map, src_of);
        if (M->action[i] == FUSE_REPLACE && M->hoisted_act[i] < 0) append_replace(M, out, i, wire, map);
        else if (M->action[i] == FUSE_COPY) wire[i] = append_copy(out, node(M, i), wire);
        if (map[i] < 0) map[i] = wire[i];
        if (i == in->n_forward - 1) n_forward = out->n;
    }
    for (int i = 0; i < in->n; i++)
        HPC_ASSERT(M->action[i] != FUSE_ALIAS || map[i] >= 0);   /* bound by its fused node */
    ir_copy_roles(out, in, map);   /* roles are never recomputed: map == wire there */
    out->n_forward = n_forward;
    free(wire);
}

void fuse_replace_graph(IrGraph *g, IrGraph *out, const int *map, PrecisionPlan *plan, PrecNodeInfo *info)
{
    ir_copy_roles(out, g, map);
    if (plan) {
        free(plan->info);
        plan->info = info;
        plan->n = out->n;
        for (int u = 0; u < plan->n_in; u++) plan->map[u] = plan->map[u] >= 0 ? map[plan->map[u]] : -1;
    }
    ir_free(g);
    *g = *out;
}

HpcStatus fuse_graph(const IrGraph *in, const PrecisionPlan *pin, IrGraph *out, PrecisionPlan *pout,
                     FuseStats *stats, HpcError *err)
{
    const char *save = getenv("HPC_LN_SAVE");
    if (save && *save && strcmp(save, "s") != 0 && strcmp(save, "xhat") != 0 && strcmp(save, "xhat_dw") != 0 &&
        strcmp(save, "xhat_ones") != 0)
        return hpc_fail(err, HPC_ERR_INPUT, "fuse_graph: HPC_LN_SAVE=%s is not a choice; set it to s (the "
                        "LayerNorm sites save their f32 input), xhat (they save the normalised "
                        "input in f16), xhat_dw (xhat, and the weight gradients of the GEMMs after "
                        "them read it instead of their 16-bit output) or xhat_ones (xhat_dw, and a "
                        "column of ones on xhat gives those GEMMs' bias gradients: the default), "
                        "or leave it unset", save);
    const char *keep = getenv("HPC_ATTN_KEEP");
    if (keep && *keep && strcmp(keep, "0") != 0 && strcmp(keep, "1") != 0)
        return hpc_fail(err, HPC_ERR_INPUT, "fuse_graph: HPC_ATTN_KEEP=%s is not a choice; set it to 1 or "
                        "leave it unset (the attention forward saves its dropout's keep bits for the "
                        "backward: the default) or 0 (the backward draws them again)", keep);
    FuseOptions o = fuse_defaults();
    return fuse_graph_with(in, pin, out, pout, stats, &o, err);
}

FuseOptions fuse_defaults(void)
{
    const char *ln = getenv("HPC_FUSE_LN");   /* a hook for comparisons, as HPC_KEEP_F32 */
    const char *acc = getenv("HPC_FUSE_ACCUM");
    const char *ab = getenv("HPC_FUSE_ACT_BGRAD");   /* 0: off; nomerge: no recompute output */
    const char *save = getenv("HPC_LN_SAVE");   /* xhat_ones (default), xhat_dw, xhat or s: what the LayerNorm sites keep */
    const char *emb = getenv("HPC_FUSE_EMB");
    const char *keep = getenv("HPC_ATTN_KEEP");   /* 1 or unset: the attention's keep bits saved (fuse_attn_keep.c) */
    bool act = !ab || strcmp(ab, "0") != 0;
    return (FuseOptions){.recompute_act = true, .layernorm = !ln || strcmp(ln, "0") != 0,
                         .accumulate = !acc || strcmp(acc, "0") != 0,
                         .act_bgrad = act, .act_merge = act && !(ab && strcmp(ab, "nomerge") == 0),
                         .ln_save_xhat = !(save && strcmp(save, "s") == 0),
                         .ln_save_xhat_dw = !save || !*save || strcmp(save, "xhat_dw") == 0 ||
                                            strcmp(save, "xhat_ones") == 0,
                         .ln_xhat_ones = !save || !*save || strcmp(save, "xhat_ones") == 0,
                         .embed_ln = !emb || strcmp(emb, "0") != 0,
                         .attn_keep = !keep || !*keep || strcmp(keep, "1") == 0};
}

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
    Matcher M = {.g = in,
                 .n_uses = xcalloc(n, sizeof(int)),
                 .action = xcalloc(n, sizeof(FuseAction)),
                 .repl = xcalloc(n, sizeof(IrNode)),
                 .outputs = xcalloc(n, sizeof(unsigned)),
                 .named_outputs = xcalloc(n, sizeof(bool)),
                 .alias_of = xcalloc(n, sizeof(int)),
                 .out_k = xcalloc(n, sizeof(int)),
                 .recompute = xmalloc(n * sizeof(int)),
                 .hoist = xmalloc(n * sizeof(int)),
                 .hoisted_act = xmalloc(n * sizeof(int)),
                 .opts = *opts,
                 .stats = stats};
    for (size_t i = 0; i < n; i++) M.recompute[i] = M.hoist[i] = M.hoisted_act[i] = -1;
    count_uses(&M);
    match_all(&M);
    int *map = xmalloc(n * sizeof *map);
    size_t n_out = (size_t)max_out_nodes(&M) + 1;
    int *src_of = xmalloc(n_out * sizeof *src_of);
    for (size_t i = 0; i < n_out; i++) src_of[i] = -1;
    rebuild(&M, out, map, src_of);
    HPC_ASSERT((size_t)out->n < n_out);
    if (pout) remap_plan(pin, map, src_of, in, out, pout);
    if (pout) fuse_accum_plan(out, pout);
    if (opts->ln_save_xhat && opts->ln_save_xhat_dw) fuse_ln_dw(out, pout, opts->ln_xhat_ones, stats);
    if (opts->attn_keep) fuse_attn_keep(out, pout, stats);
    stats->nodes_before = in->n;
    stats->nodes_after = out->n;
    free(map);
    free(src_of);
    free(M.n_uses);
    free(M.action);
    free(M.repl);
    free(M.outputs);
    free(M.named_outputs);
    free(M.alias_of);
    free(M.out_k);
    free(M.recompute);
    free(M.hoist);
    free(M.hoisted_act);
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
