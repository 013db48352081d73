/* tests/ln_site_graph.h — one LayerNorm site as a small graph, for the
 * fused-LayerNorm tests on the cpu (tests/test_fuse_ln.c, test_ln_xhat.c,
 * test_ln_xhat_ones.c) and on the GPU (tests/gpu/gpu_lnfuse.c), and the
 * weight-gradient fix after such a site alone (ln_dw_fix_graph).
 * Header-only (static inline functions): each test is its own program.
 *
 * The unfused site, as lowering + precision make it for a post-LN layer,
 * with every input a parameter of constant shape (R, D) or (D) so any data
 * can be bound:
 *   forward   xs = CAST(x) to `low` (absent for an f32 site), d = DROPOUT(xs),
 *             s = ADD(d, r) (f32), y = LAYERNORM(s, gamma, beta) (f32),
 *             y16 = CAST(y) to `low`
 *   backward  ds = LAYERNORM_DX(dy, s, gamma), dgamma = LAYERNORM_DGAMMA(dy, s),
 *             dbeta = BIAS_GRAD(dy), dx = DROPOUT(ds) stored as `low`,
 *             dbias = BIAS_GRAD(dx) (f32)
 * ln_site_fuse runs the fuse pass on it (LN_RESIDUAL + LN_RESIDUAL_BWD) and
 * finds the same values in the fused graph. */
#ifndef HPC_TESTS_LN_SITE_GRAPH_H
#define HPC_TESTS_LN_SITE_GRAPH_H

#include <string.h>

#include "fuse.h"
#include "compiler/ir_build.h"
#include "program/ir.h"
#include "program/params.h"

#define LN_SITE_SALT 1234

/* The values compared, in both graphs. */
enum { LNV_Y, LNV_MEAN, LNV_RSTD, LNV_SUM, LNV_Y16, LNV_DS, LNV_DX, LNV_DGAMMA, LNV_DBETA, LNV_DBIAS, LNV_COUNT };
static const char *const ln_site_value_name[LNV_COUNT] = {"y", "mean", "rstd", "s", "y16", "ds", "dx",
                                                          "dgamma", "dbeta", "dbias"};

typedef struct {
    IrGraph g;
    ParamList pl;        /* x, r, gamma, beta, dy [, bias] */
    int v[LNV_COUNT];    /* value ids, -1 where the graph has none (unfused mean, rstd) */
    int n_forward;
} LnSite;

static inline int ln_site_param(LnSite *t, const char *name, int rank, int64_t d0, int64_t d1, bool ones)
{
    int64_t dims[2] = {d0, d1};
    int p = params_add(&t->pl, name, rank, dims, ones ? PARAM_INIT_ONES : PARAM_INIT_NORMAL, false, false);
    return ir_param(&t->g, p, DT_F32, rank, dims, name);
}

static inline int ln_site_add(LnSite *t, IrOpKind op, const int *in, int n_in, const IrAttr *a, const char *name,
                       bool backward)
{
    int id = ir_add(&t->g, op, in, n_in, a, name);
    t->g.nodes[id].backward = backward;
    t->g.nodes[id].requires_grad = !backward;
    return id;
}

/* The unfused site of R rows of D with 16-bit storage `low` (DT_F32: none). */
static inline void ln_site_build(LnSite *t, int64_t R, int64_t D, DType low, double eps, float p)
{
    ir_init(&t->g);
    params_init(&t->pl);
    for (int k = 0; k < LNV_COUNT; k++) t->v[k] = -1;
    int x = ln_site_param(t, "x", 2, R, D, false), r = ln_site_param(t, "r", 2, R, D, false);
    int gamma = ln_site_param(t, "gamma", 1, D, 0, true), beta = ln_site_param(t, "beta", 1, D, 0, false);
    int dy = ln_site_param(t, "dy", 2, R, D, false);
    IrAttr cast = {.cast = {low}}, drop = {.dropout = {p, LN_SITE_SALT}}, norm = {.norm = {eps}};
    int xs = low == DT_F32 ? x : ln_site_add(t, IR_OP_CAST, &x, 1, &cast, "x.low", false);
    int d = ln_site_add(t, IR_OP_DROPOUT, &xs, 1, &drop, "x.dropout", false);
    int s = ln_site_add(t, IR_OP_ADD, (int[]){d, r}, 2, NULL, "s", false);
    int y = ln_site_add(t, IR_OP_LAYERNORM, (int[]){s, gamma, beta}, 3, &norm, "y", false);
    t->v[LNV_SUM] = s;
    t->v[LNV_Y] = y;
    if (low != DT_F32) t->v[LNV_Y16] = ln_site_add(t, IR_OP_CAST, &y, 1, &cast, "y.low", false);
    t->n_forward = t->g.n;
    int ds = ln_site_add(t, IR_OP_LAYERNORM_DX, (int[]){dy, s, gamma}, 3, &norm, "ds", true);
    t->v[LNV_DS] = ds;
    t->v[LNV_DGAMMA] = ln_site_add(t, IR_OP_LAYERNORM_DGAMMA, (int[]){dy, s}, 2, &norm, "dgamma", true);
    t->v[LNV_DBETA] = ln_site_add(t, IR_OP_BIAS_GRAD, &dy, 1, NULL, "dbeta", true);
    int dx = ln_site_add(t, IR_OP_DROPOUT, &ds, 1, &drop, "dx", true);
    t->g.nodes[dx].dtype = low;                  /* precision stores it as the GEMM's dtype */
    t->v[LNV_DX] = dx;
    int dbias = ln_site_add(t, IR_OP_BIAS_GRAD, &dx, 1, NULL, "dbias", true);
    t->g.nodes[dbias].dtype = DT_F32;            /* parameter gradients stay f32 */
    t->v[LNV_DBIAS] = dbias;
    t->g.n_forward = t->n_forward;
    t->g.n_params = t->pl.n;
}

/* The fused graph of u (fuse pass with the LayerNorm rules on) into t;
 * returns the number of LN_RESIDUAL + LN_RESIDUAL_BWD nodes (2 expected). */
static inline int ln_site_fuse(const LnSite *u, LnSite *t, FuseStats *st, HpcError *err)
{
    ir_init(&t->g);
    params_init(&t->pl);
    for (int p = 0; p < u->pl.n; p++)
        params_add(&t->pl, u->pl.p[p].name, u->pl.p[p].rank, u->pl.p[p].dims, u->pl.p[p].init, false, false);
    for (int k = 0; k < LNV_COUNT; k++) t->v[k] = -1;
    if (fuse_graph(&u->g, NULL, &t->g, NULL, st, err)) return -1;
    t->n_forward = t->g.n_forward;
    int n = 0;
    for (int i = 0; i < t->g.n; i++) {
        if (t->g.nodes[i].op == IR_OP_LN_RESIDUAL) {
            static const int k_of[] = {LNV_Y, LNV_MEAN, LNV_RSTD, LNV_SUM, LNV_Y16};
            for (int k = 0; k < 5; k++) t->v[k_of[k]] = ir_output(&t->g, i, k);
            n++;
        }
        if (t->g.nodes[i].op == IR_OP_LN_RESIDUAL_BWD) {
            static const int k_of[] = {LNV_DS, LNV_DX, LNV_DGAMMA, LNV_DBETA, LNV_DBIAS};
            for (int k = 0; k < 5; k++) t->v[k_of[k]] = ir_output(&t->g, i, k);
            n++;
        }
    }
    return n;
}

static inline void ln_site_free(LnSite *t)
{
    ir_free(&t->g);
    params_free(&t->pl);
}

/* The weight-gradient fix after a dW GEMM that read a site's xhat
 * (compiler/fuse_ln_dw.c), alone, every input an f32 parameter:
 * LN_DW_FIX(raw (out, in), gamma, beta, db (out)) or, with `ones`,
 * LN_DW_FIX_DB(raw (out, in + IR_XHAT_ONES_PAD), gamma, beta) and its db
 * output.  Parameters in order raw, gamma (PARAM_INIT_ONES), beta[, db];
 * outs[0] is dW, outs[1] db (-1 without `ones`). */
static inline void ln_dw_fix_graph(IrGraph *g, ParamList *pl, int64_t out, int64_t in, bool ones, int outs[2])
{
    ir_init(g);
    params_init(pl);
    int64_t d[4][2] = {{out, in + (ones ? IR_XHAT_ONES_PAD : 0)}, {in, 0}, {in, 0}, {out, 0}};
    static const char *const nm[4] = {"raw", "gamma", "beta", "db"};
    int n_in = ones ? 3 : 4, v[4];
    for (int k = 0; k < n_in; k++) {
        int rank = k == 0 ? 2 : 1;
        int p = params_add(pl, nm[k], rank, d[k], k == 1 ? PARAM_INIT_ONES : PARAM_INIT_NORMAL, false, false);
        v[k] = ir_param(g, p, DT_F32, rank, d[k], nm[k]);
    }
    outs[1] = -1;
    ir_add_outputs(g, ones ? IR_OP_LN_DW_FIX_DB : IR_OP_LN_DW_FIX, v, n_in, NULL, "dw", outs);
    g->n_forward = g->n;
    g->n_params = pl->n;
}

#endif
