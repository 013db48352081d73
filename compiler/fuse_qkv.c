/* compiler/fuse_qkv.c — see fuse_qkv.h. */
#include "fuse_qkv.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "compiler/ir_build.h"
#include "program/param_pack.h"

bool fuse_qkv_requested(void)
{
    const char *e = getenv("HPC_FUSE_QKV");
    if (e && strcmp(e, "1") == 0) return true;
    if (e && strcmp(e, "0") == 0) return false;
    return FUSE_QKV_DEFAULT;
}

typedef struct {
    int attn;          /* the ATTENTION node */
    int lin[3];        /* its q, k, v LINEARs */
} QkvSite;

static bool is_role(const IrGraph *g, int v) { return v == g->loss || v == g->logits; }

/* Parameter index of PARAM node v, or -1. */
static int param_of(const IrGraph *g, int v)
{
    return v >= 0 && g->nodes[v].op == IR_OP_PARAM ? g->nodes[v].attr.param.index : -1;
}

/* Whether PARAM nodes p[0..2] are the query, key, value of one group. */
static bool group_of(const IrGraph *g, const ParamList *pl, const int p[3])
{
    int q[3], members[3];
    for (int k = 0; k < 3; k++)
        if ((q[k] = param_of(g, p[k])) < 0 || g->nodes[p[k]].dtype != g->nodes[p[0]].dtype) return false;
    if (!param_pack_qkv_group(pl, q[0], members)) return false;
    /* the cuda executor can then read the three as one tensor in place */
    if (!param_pack_adjacent_everywhere(params_numel(&pl->p[q[0]]))) return false;
    return members[0] == q[0] && members[1] == q[1] && members[2] == q[2];
}

static bool match(const IrGraph *g, const ParamList *pl, int a, QkvSite *s)
{
    const IrNode *n = &g->nodes[a];
    if (n->op != IR_OP_ATTENTION || n->attr.attn.packed) return false;
    int w[3], b[3];
    for (int k = 0; k < 3; k++) {
        int l = n->in[k];
        const IrNode *ln = &g->nodes[l];
        if (ln->op != IR_OP_LINEAR || ln->n_in != 3 || ir_readers(g, l) != 1 || is_role(g, l)) return false;
        if (ln->in[0] != g->nodes[n->in[0]].in[0]) return false;   /* one x */
        w[k] = ln->in[1];
        b[k] = ln->in[2];
        s->lin[k] = l;
    }
    s->attn = a;
    return group_of(g, pl, w) && group_of(g, pl, b);
}

HpcStatus fuse_qkv_graph(IrGraph *g, const ParamList *pl, int *sites, HpcError *err)
{
    (void)err;
    int n = g->n, found = 0;
    QkvSite *site = xcalloc((size_t)n + 1, sizeof *site);
    int *site_of_lin = xmalloc((size_t)n * sizeof *site_of_lin);   /* LINEAR -> its site, or -1 */
    for (int i = 0; i < n; i++) site_of_lin[i] = -1;
    for (int i = 0; i < n; i++)
        if (match(g, pl, i, &site[found])) {
            for (int k = 0; k < 3; k++) site_of_lin[site[found].lin[k]] = found;
            found++;
        }
    if (sites) *sites = found;
    if (!found) {
        free(site);
        free(site_of_lin);
        return HPC_OK;
    }
    IrGraph out;
    ir_init(&out);
    int *map = xmalloc((size_t)n * sizeof *map);
    int *qkv = xmalloc((size_t)found * sizeof *qkv);   /* the site's packed value in out */
    for (int i = 0; i < n; i++) {
        map[i] = -1;
        const IrNode *nd = &g->nodes[i];
        out.region = nd->region;   /* what ir_add gives the nodes made here */
        int s = site_of_lin[i];
        if (s >= 0) {
            const QkvSite *st = &site[s];
            if (i != st->lin[2]) continue;   /* q and k go, v's place takes the packed GEMM */
            char name[IR_NAME_MAX];
            int w[3], b[3];
            for (int k = 0; k < 3; k++) {
                w[k] = map[g->nodes[st->lin[k]].in[1]];
                b[k] = map[g->nodes[st->lin[k]].in[2]];
            }
            snprintf(name, sizeof name, "%.*s.qkv_weight", IR_NAME_MAX - 12, nd->name);
            int W = ir_add(&out, IR_OP_STACK, w, 3, NULL, name);
            snprintf(name, sizeof name, "%.*s.qkv_bias", IR_NAME_MAX - 10, nd->name);
            int B = ir_add(&out, IR_OP_STACK, b, 3, NULL, name);
            snprintf(name, sizeof name, "%.*s.qkv", IR_NAME_MAX - 5, nd->name);
            qkv[s] = ir_add(&out, IR_OP_LINEAR, (int[]){map[nd->in[0]], W, B}, 3, NULL, name);
            continue;
        }
        int as = -1;
        for (int k = 0; k < found && as < 0; k++)
            if (site[k].attn == i) as = k;
        if (as >= 0) {
            IrNode c = *nd;
            c.attr.attn.packed = 1;
            int id = ir_add(&out, IR_OP_ATTENTION, (int[]){qkv[as], qkv[as], qkv[as], map[nd->in[3]]}, 4, &c.attr,
                            nd->name);
            HPC_ASSERT(out.nodes[id].attr.attn.salt == nd->attr.attn.salt);
            out.nodes[id].region = nd->region;
            map[i] = id;
            continue;
        }
        map[i] = ir_copy_node(&out, nd, map);
    }
    ir_copy_roles(&out, g, map);
    out.region = g->region;
    ir_free(g);
    *g = out;
    free(qkv);
    free(map);
    free(site);
    free(site_of_lin);
    return HPC_OK;
}
