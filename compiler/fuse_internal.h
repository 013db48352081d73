/* compiler/fuse_internal.h — private to the fuse pass (fuse.c and its rule
 * files fuse_layernorm.c, fuse_act.c, fuse_dw.c): the matcher's state.
 *
 * match decides per node of the input graph: COPY it, DROP it (its value is
 * read by nothing that survives), REPLACE it by a fused node (repl[id]),
 * or ALIAS it: its value becomes output out_k[id] of the fused node that
 * replaces alias_of[id] (a member of a multi-output pattern whose value is
 * still read: the LayerNorm site's s, its folded CAST, the backward's
 * dgamma, the bias gradient of a LINEAR_DW_BGRAD).  A REPLACE node's own
 * value is output out_k[id] of its fused node too (0 but for a
 * LINEAR_DW_BGRAD placed at its BIAS_GRAD: 1).  rebuild appends in input
 * order; a fused node takes the place given by its REPLACE, so every input
 * it reads comes earlier, and every ALIAS member's readers come after it
 * (the rules check both).
 *
 * Recompute: recompute[id] >= 0 names a forward ACT that rebuild copies
 * right before node id; readers appended after the copy read it.  Or,
 * hoist[id] >= 0: the ACT_BWD_BGRAD that replaces node hoist[id] is
 * appended right before node id (not at its own place) and its output 2 is
 * the recomputed ACT hoisted_act[hoist[id]] (fuse_act.c: one pass over h
 * for both). */
#ifndef HPC_COMPILER_FUSE_INTERNAL_H
#define HPC_COMPILER_FUSE_INTERNAL_H

#include "fuse.h"

typedef enum { FUSE_COPY, FUSE_DROP, FUSE_REPLACE, FUSE_ALIAS } FuseAction;

typedef struct {
    const IrGraph *g;
    int *n_uses;          /* (g->n) readers of each value, roles included */
    FuseAction *action;   /* (g->n) */
    IrNode *repl;         /* (g->n) the fused node for FUSE_REPLACE (inputs in g's ids) */
    unsigned *outputs;    /* (g->n) FUSE_REPLACE of a multi-output op: bit k = append output k */
    bool *named_outputs;  /* (g->n) FUSE_REPLACE: its OUTPUTs take the names of the values they
                           * stand for ("d.NAME.bias"), not "NAME.<output>" */
    int *alias_of;        /* (g->n) FUSE_ALIAS: the REPLACE node whose output it becomes */
    int *out_k;           /* (g->n) FUSE_ALIAS, FUSE_REPLACE: which output the value becomes */
    int *recompute;       /* (g->n) forward ACT to copy right before this node, or -1 */
    int *hoist;           /* (g->n) a REPLACE node to append right before this node instead of at
                           * its own place (its recomputed-ACT output stands for the copy), or -1 */
    int *hoisted_act;     /* (g->n) for such a REPLACE: the forward ACT its output 2 recomputes */
    FuseOptions opts;
    FuseStats *stats;
} Matcher;

static inline const IrNode *fuse_node(const Matcher *M, int id) { return &M->g->nodes[id]; }

/* Node id is an op of that kind and direction that no rule has taken yet. */
static inline bool fuse_is_free(const Matcher *M, int id, IrOpKind op, bool backward)
{
    const IrNode *n = fuse_node(M, id);
    return n->op == op && n->backward == backward && M->action[id] == FUSE_COPY;
}

/* Member `id` becomes output k of the fused node replacing `at`. */
static inline void fuse_alias(Matcher *M, int id, int at, int k)
{
    M->action[id] = FUSE_ALIAS;
    M->alias_of[id] = at;
    M->out_k[id] = k;
    M->outputs[at] |= 1u << k;
}

/* A fused node's input may be output k of another fused node (the
 * backward reads the forward's mean and rstd, which the input graph does
 * not have): repl inputs <= -2 encode (node `at` of the input graph, k). */
static inline int fuse_output_ref(int at, int k) { return -2 - (at * 8 + k); }
static inline bool fuse_is_output_ref(int v) { return v <= -2; }
static inline int fuse_ref_node(int v) { return (-2 - v) / 8; }
static inline int fuse_ref_k(int v) { return (-2 - v) % 8; }

/* The embedding layer rule (fuse_embed.c): runs first, so that no other
 * rule takes a node of its pattern. */
void fuse_match_embed(Matcher *M);

/* The LayerNorm site rules (fuse_layernorm.c): run before DROPOUT + ADD,
 * since a site takes its DROPOUT + ADD with it, and before the bias
 * gradient pairing (fuse_dw.c), which leaves a BIAS_GRAD a site took. */
void fuse_match_layernorm(Matcher *M);

/* The activation backward + bias gradient rule (fuse_act.c): runs before
 * the weight-gradient GEMM rules, which leave a BIAS_GRAD it took. */
void fuse_match_act(Matcher *M);
/* After the recompute rule: a recomputed ACT whose input an ACT_BWD_BGRAD
 * reads becomes that node's output 2, the node hoisted to the copy's place
 * (opts.act_merge). */
void fuse_match_act_recompute(Matcher *M);

/* The weight-gradient GEMM rules (fuse_dw.c): LINEAR_DW + BIAS_GRAD pairs,
 * then (opts.recompute_act) the ACTs recomputed before their dW GEMMs. */
void fuse_match_dw(Matcher *M);

/* The accumulating dX GEMM rule (fuse_accum.c): ADD(acc, LINEAR_DX) =>
 * LINEAR_DX_ACC; runs last (opts.accumulate), so it sees the fused nodes
 * the other rules placed.  fuse_accum_plan gives the fused nodes of `out`
 * their GEMM's precision class in the re-indexed plan. */
void fuse_match_accum(Matcher *M);

/* HPC_LN_SAVE=xhat_dw, after the rebuild (compiler/fuse_ln_dw.c): rewrites
 * g (and plan, when not NULL, node for node) so that each dW GEMM reading
 * the 16-bit y of a site that saves xhat reads xhat, followed by an
 * LN_DW_FIX that makes it dy^T y.  With `ones` (HPC_LN_SAVE=xhat_ones) the
 * GEMMs that make their own bias gradient read [xhat | 1 | 0] instead and
 * an LN_DW_FIX_DB makes dW and db from their raw output. */
void fuse_ln_dw(IrGraph *g, PrecisionPlan *plan, bool ones, FuseStats *st);

/* The end of a pass after the rebuild that copied g node for node into out
 * (map: g's ids to out's) with nodes inserted: out takes g's roles and
 * place, and plan (when not NULL) takes info, out's per-node precision,
 * with its input map re-indexed.  Frees g's old nodes; out is moved. */
void fuse_replace_graph(IrGraph *g, IrGraph *out, const int *map, PrecisionPlan *plan, PrecNodeInfo *info);

/* HPC_ATTN_KEEP=1, after the rebuild (compiler/fuse_attn_keep.c): gives each
 * qualifying ATTENTION its keep-bits output 2 and its ATTENTION_BWD that
 * value as input 7, in g (and plan, when not NULL, node for node). */
void fuse_attn_keep(IrGraph *g, PrecisionPlan *plan, FuseStats *st);
void fuse_accum_plan(const IrGraph *out, PrecisionPlan *plan);

#endif
