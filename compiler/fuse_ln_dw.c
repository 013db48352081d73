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
 * HPC_LN_SAVE=xhat_ones (`ones`): where every such GEMM of a site makes its
 * own db (LINEAR_DW_BGRAD: cuBLASLt's BGRADB epilogue, which made BERT's
 * Q/K/V dW GEMM about 95 us a layer slower on the H200 at 32768 rows), the
 * site saves [xhat | 1 | 0] (IR_XHAT_ONES_PAD more columns) instead, the
 * GEMM runs plain (LINEAR_DW), its raw output's column `in` is
 * dy^T 1 = colsum(dy) = db, and an LN_DW_FIX_DB makes dW and db from raw.
 * Nothing reads dy a second time; the GEMM does 1 % more work.
 *
 * The fixes come last.  A fix whose gradient nothing reads but UNSTACK
 * views (the parameters' gradients, BERT's Q/K/V parts) goes to the end of
 * the graph with those views, after every other node, so its inputs (raw,
 * db, gamma and beta) live to the end of the step: the CUDA optimizer can
 * then read raw where it lies and apply the fix itself, and the executor
 * stops before the trailing fixes (runtime/cuda/cuda_optim.h, "Deferred
 * fixes").  Other fixes (the gradient of a tied weight, summed after) stay
 * right after their GEMM.
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
    int ln;     /* the LN_RESIDUAL site whose xhat it reads */
    int xhat, gamma, beta, db;
    bool ones;  /* db from xhat's ones column: LINEAR_DW + LN_DW_FIX_DB */
    bool last;  /* the fix goes to the graph's end (can_go_last) */
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
    *s = (DwSite){i, ln, xh, nd(g, ln)->in[2], nd(g, ln)->in[3], db, false, false};
    return true;
}

/* Whether site s's db can come from a ones column on its xhat: it is the
 * GEMM's own output, and so for every other GEMM of the same LayerNorm
 * site (they all read the widened xhat then), and xhat's other readers
 * are the site's backward, which reads it with its wider rows. */
static bool ones_ok(const IrGraph *g, const DwSite *sites, int n_sites, const DwSite *s)
{
    for (int k = 0; k < n_sites; k++) {
        const DwSite *o = &sites[k];
        if (o->ln != s->ln) continue;
        if (nd(g, o->gemm)->op != IR_OP_LINEAR_DW_BGRAD || nd(g, o->db)->op != IR_OP_OUTPUT ||
            nd(g, o->db)->in[0] != o->gemm)
            return false;
    }
    for (int j = s->xhat + 1; j < g->n; j++) {
        const IrNode *u = nd(g, j);
        for (int k = 0; k < u->n_in; k++)
            if (u->in[k] == s->xhat && u->op != IR_OP_LN_RESIDUAL_BWD) return false;
    }
    return true;
}

/* Whether nothing reads the parts of UNSTACK u (part 0 is u itself, parts
 * 1 and 2 its OUTPUTs, which read u). */
static bool parts_unread(const IrGraph *g, int u)
{
    for (int q = u + 1; q < g->n; q++) {
        const IrNode *w = nd(g, q);
        for (int k = 0; k < w->n_in; k++) {
            const IrNode *x = nd(g, w->in[k]);
            if (w->in[k] == u ? w->op != IR_OP_OUTPUT : x->op == IR_OP_OUTPUT && x->in[0] == u) return false;
        }
    }
    return true;
}

/* Whether v's readers are UNSTACKs whose parts nothing reads (a parameter's
 * gradient, alone or cut into its Q/K/V parts), but for v's own OUTPUTs
 * with `own_outputs`. */
static bool readers_only_views(const IrGraph *g, int v, bool own_outputs)
{
    for (int j = v + 1; j < g->n; j++) {
        const IrNode *u = nd(g, j);
        bool reads = false;
        for (int k = 0; k < u->n_in; k++) reads |= u->in[k] == v;
        if (!reads || (own_outputs && u->op == IR_OP_OUTPUT && u->in[0] == v)) continue;
        if (u->op != IR_OP_UNSTACK || !parts_unread(g, j)) return false;
    }
    return true;
}

/* Whether site s's fix can go last: its gradient (the GEMM's value as the
 * graph's readers see it) and, with `ones`, the db it makes are read by
 * views alone.  The GEMM's own db output (no `ones`) stays in place. */
static bool can_go_last(const IrGraph *g, const DwSite *s)
{
    return readers_only_views(g, s->gemm, true) && (!s->ones || readers_only_views(g, s->db, false));
}

static bool site_widened(const DwSite *sites, int n_sites, int ln)
{
    for (int k = 0; k < n_sites; k++)
        if (sites[k].ln == ln && sites[k].ones) return true;
    return false;
}

static int add_backward(IrGraph *out, IrOpKind op, const int *in, int n_in, const IrAttr *attr, const IrNode *like)
{
    int f = ir_add(out, op, in, n_in, attr, like->name);
    out->nodes[f].backward = true;
    out->nodes[f].region = like->region;
    return f;
}

/* Appends the fix of site s to out; later readers of the gradient (and,
 * with s->ones, of the GEMM's old db output) read it. */
static void append_fix(const IrGraph *g, IrGraph *out, const DwSite *s, int *map, PrecNodeInfo *info,
                       const PrecisionPlan *plan)
{
    int raw = map[s->gemm];
    int f;
    if (s->ones) {
        int in[3] = {raw, map[s->gamma], map[s->beta]};
        f = add_backward(out, IR_OP_LN_DW_FIX_DB, in, 3, NULL, nd(g, s->gemm));
        IrAttr a = {.output = {1}};
        int db = add_backward(out, IR_OP_OUTPUT, &f, 1, &a, nd(g, s->db));
        out->nodes[db].dtype = nd(g, s->db)->dtype;
        if (info) info[db] = plan->info[s->db];
        map[s->db] = db;
    } else {
        int in[4] = {raw, map[s->gamma], map[s->beta], map[s->db]};
        f = add_backward(out, IR_OP_LN_DW_FIX, in, 4, NULL, nd(g, s->gemm));
    }
    snprintf(out->nodes[raw].name, sizeof out->nodes[raw].name, "%.*s.raw", IR_NAME_MAX - 5, nd(g, s->gemm)->name);
    if (info) info[f] = (PrecNodeInfo){PREC_CLASS_F32_COMPUTE, info[raw].region, DT_F32, -1};
    map[s->gemm] = f;
}

void fuse_ln_dw(IrGraph *g, PrecisionPlan *plan, bool ones, FuseStats *st)
{
    DwSite *sites = xcalloc((size_t)(g->n > 0 ? g->n : 1), sizeof *sites);
    int n_sites = 0, n_ones = 0;
    for (int i = 0; i < g->n; i++)
        if (match(g, i, &sites[n_sites])) n_sites++;
    if (n_sites == 0) {
        free(sites);
        return;
    }
    for (int k = 0; ones && k < n_sites; k++) {
        sites[k].ones = ones_ok(g, sites, n_sites, &sites[k]);
        n_ones += sites[k].ones;
    }
    /* late[v]: v's readers wait for the end (its fix goes last); moved[j]:
     * node j reads such a value and is appended after the last fixes */
    bool *late = xcalloc((size_t)g->n, sizeof *late), *moved = xcalloc((size_t)g->n, sizeof *moved);
    int *gemm_site = xmalloc((size_t)g->n * sizeof *gemm_site);
    for (int j = 0; j < g->n; j++) gemm_site[j] = -1;
    for (int k = 0; k < n_sites; k++) {
        sites[k].last = can_go_last(g, &sites[k]);
        late[sites[k].gemm] = sites[k].last;
        if (sites[k].ones) late[sites[k].db] = sites[k].last;
        gemm_site[sites[k].gemm] = k;
    }
    IrGraph out;
    ir_init(&out);
    out.region = g->region;
    int *map = xmalloc((size_t)g->n * sizeof *map);
    PrecNodeInfo *info = plan ? xcalloc((size_t)(g->n + 2 * n_sites), sizeof *info) : NULL;
    int next = 0, pending = -1;
    for (int j = 0; j < g->n; j++) {
        const IrNode *n = nd(g, j);
        /* a site's fix goes after the GEMM's outputs, before any other node */
        if (pending >= 0 && n->op != IR_OP_OUTPUT) {
            if (!sites[pending].last) append_fix(g, &out, &sites[pending], map, info, plan);
            pending = -1;
        }
        /* a widened site's GEMM has no db output: its fix makes db */
        if (pending >= 0 && sites[pending].ones && j == sites[pending].db) continue;
        bool own_output = n->op == IR_OP_OUTPUT && gemm_site[n->in[0]] >= 0;   /* the GEMM's db, not its fix's */
        for (int k = 0; k < n->n_in && !own_output; k++) moved[j] |= late[n->in[k]] || moved[n->in[k]];
        if (moved[j]) continue;
        IrNode c = *n;
        bool site = next < n_sites && sites[next].gemm == j;
        if (site) {
            c.in[1] = sites[next].xhat;
            if (sites[next].ones) c.op = IR_OP_LINEAR_DW;
        }
        if (n->op == IR_OP_LN_RESIDUAL && site_widened(sites, n_sites, j)) {
            IrLnFusedAttr la = fuse_ln_attr_get(n);
            la.ones = 1;   /* its output 3 (copied next) gets the wider shape */
            fuse_ln_attr_set(&c.attr, la);
        }
        int id = ir_copy_node(&out, &c, map);
        out.nodes[id].dtype = n->dtype;
        map[j] = id;
        if (info) info[id] = plan->info[j];
        if (site) pending = next++;
    }
    if (pending >= 0 && !sites[pending].last) append_fix(g, &out, &sites[pending], map, info, plan);
    for (int k = 0; k < n_sites; k++)
        if (sites[k].last) append_fix(g, &out, &sites[k], map, info, plan);
    for (int j = 0; j < g->n; j++) {   /* the views of the last fixes, in their order */
        if (!moved[j]) continue;
        int id = ir_copy_node(&out, nd(g, j), map);
        out.nodes[id].dtype = nd(g, j)->dtype;
        map[j] = id;
        if (info) info[id] = plan->info[j];
    }
    fuse_replace_graph(g, &out, map, plan, info);
    st->ln_dw_from_xhat = n_sites;
    st->ln_db_from_ones = n_ones;
    free(map);
    free(sites);
    free(late);
    free(moved);
    free(gemm_site);
}
