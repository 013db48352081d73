/* compiler/fuse_ln_dw.c — HPC_LN_SAVE=xhat_dw: the weight gradient of a GEMM
 * that reads a LayerNorm site's 16-bit y, from the site's saved xhat.
 *
 * A site that saves xhat (fuse_layernorm.c) still keeps its 16-bit y16
 * (output 4) for the backward when the LINEARs after it need it for their
 * dW = dy^T y16.  With y = xhat * gamma + beta,
 *     dy^T y = (dy^T xhat) diag(gamma) + outer(colsum(dy), beta),
 * so the dW GEMM (LINEAR_DW or LINEAR_DW_BGRAD, unchanged) reads xhat and an
 * LN_DW_FIX(raw, gamma, beta, db) right after it makes the gradient, db
 * being the LINEAR's bias gradient the graph already computes (colsum of
 * that dy: a BIAS_GRAD of it, the GEMM's own db output, or the db of the
 * ACT_BWD_BGRAD that made dy).  y16 then dies in the forward pass.
 *
 * Only where the GEMM's operands stay one dtype: dy f16 (the fp16 policy;
 * under bf16 dy is bf16 and xhat f16, so those GEMMs keep y16), and only
 * where db comes before the GEMM or is its own output, so the fix can follow
 * the GEMM's outputs before anything reads the gradient.
 *
 * Runs on the rebuilt graph (after fuse.c's rebuild): a copy node for node
 * with the fix nodes inserted, the precision plan re-indexed alike. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuse_internal.h"

#include "compiler/ir_build.h"

typedef struct {
    int gemm;   /* the LINEAR_DW / LINEAR_DW_BGRAD (old id) */
    int xhat, gamma, beta, db;
} DwSite;

static const IrNode *nd(const IrGraph *g, int id) { return &g->nodes[id]; }

/* The LN_RESIDUAL saving xhat whose output 4 (y16) is x, or -1. */
static int site_of_y16(const IrGraph *g, int x)
{
    const IrNode *o = nd(g, x);
    if (o->op != IR_OP_OUTPUT || o->attr.output.index != 4) return -1;
    int ln = o->in[0];
    return nd(g, ln)->op == IR_OP_LN_RESIDUAL && fuse_ln_attr_get(nd(g, ln)).xhat ? ln : -1;
}

/* A value holding colsum(dy) (the bias gradient of the LINEAR whose output
 * gradient dy is), or -1. */
static int colsum_of(const IrGraph *g, int dy)
{
    const IrNode *d = nd(g, dy);
    if (d->op == IR_OP_ACT_BWD_BGRAD) return ir_output(g, dy, 1);   /* colsum of dx as stored = dy */
    for (int j = dy + 1; j < g->n; j++) {
        const IrNode *u = nd(g, j);
        if (u->n_in < 1 || u->in[0] != dy) continue;
        if (u->op == IR_OP_BIAS_GRAD) return j;
        if (u->op == IR_OP_LINEAR_DW_BGRAD) {
            int db = ir_output(g, j, 1);
            if (db >= 0) return db;
        }
    }
    return -1;
}

/* Whether node i is a dW GEMM this rule rewrites; fills *s. */
static bool match(const IrGraph *g, int i, DwSite *s)
{
    const IrNode *n = nd(g, i);
    if ((n->op != IR_OP_LINEAR_DW && n->op != IR_OP_LINEAR_DW_BGRAD) || !n->backward) return false;
    int ln = site_of_y16(g, n->in[1]);
    if (ln < 0 || nd(g, n->in[0])->dtype != DT_F16) return false;
    int xh = ir_output(g, ln, 3), db = colsum_of(g, n->in[0]);
    if (xh < 0 || nd(g, xh)->dtype != DT_F16 || db < 0) return false;
    bool own = nd(g, db)->op == IR_OP_OUTPUT && nd(g, db)->in[0] == i;
    if (!(db < i || own) || nd(g, db)->dims[0] != n->dims[0]) return false;
    *s = (DwSite){i, xh, nd(g, ln)->in[2], nd(g, ln)->in[3], db};
    return true;
}

/* Appends the fix of site s to out; later readers of the gradient read it. */
static void append_fix(const IrGraph *g, IrGraph *out, const DwSite *s, int *map, PrecNodeInfo *info)
{
    int raw = map[s->gemm];
    int in[4] = {raw, map[s->gamma], map[s->beta], map[s->db]};
    int f = ir_add(out, IR_OP_LN_DW_FIX, in, 4, NULL, nd(g, s->gemm)->name);
    IrNode *o = &out->nodes[f];
    o->backward = true;
    o->region = nd(g, s->gemm)->region;
    snprintf(out->nodes[raw].name, sizeof out->nodes[raw].name, "%.*s.raw", IR_NAME_MAX - 5, nd(g, s->gemm)->name);
    if (info) info[f] = (PrecNodeInfo){PREC_CLASS_F32_COMPUTE, info[raw].region, DT_F32, -1};
    map[s->gemm] = f;
}

void fuse_ln_dw(IrGraph *g, PrecisionPlan *plan, FuseStats *st)
{
    DwSite *sites = xcalloc((size_t)(g->n > 0 ? g->n : 1), sizeof *sites);
    int n_sites = 0;
    for (int i = 0; i < g->n; i++)
        if (match(g, i, &sites[n_sites])) n_sites++;
    if (n_sites == 0) {
        free(sites);
        return;
    }
    IrGraph out;
    ir_init(&out);
    out.region = g->region;
    int *map = xmalloc((size_t)g->n * sizeof *map);
    PrecNodeInfo *info = plan ? xcalloc((size_t)(g->n + n_sites), sizeof *info) : NULL;
    int next = 0, pending = -1;
    for (int j = 0; j < g->n; j++) {
        /* a site's fix goes after the GEMM's outputs, before any other node */
        if (pending >= 0 && nd(g, j)->op != IR_OP_OUTPUT) {
            append_fix(g, &out, &sites[pending], map, info);
            pending = -1;
        }
        IrNode c = *nd(g, j);
        bool site = next < n_sites && sites[next].gemm == j;
        if (site) c.in[1] = sites[next].xhat;
        int id = ir_copy_node(&out, &c, map);
        out.nodes[id].dtype = nd(g, j)->dtype;
        map[j] = id;
        if (info) info[id] = plan->info[j];
        if (site) pending = next++;
    }
    if (pending >= 0) append_fix(g, &out, &sites[pending], map, info);
    ir_copy_roles(&out, g, map);
    if (plan) {
        free(plan->info);
        plan->info = info;
        plan->n = out.n;
        for (int u = 0; u < plan->n_in; u++) plan->map[u] = plan->map[u] >= 0 ? map[plan->map[u]] : -1;
    }
    st->ln_dw_from_xhat = n_sites;
    ir_free(g);
    *g = out;
    free(map);
    free(sites);
}
