/* compiler/fuse_internal.h — private to the fuse pass (fuse.c and its rule
 * files such as fuse_layernorm.c): the matcher's state.
 *
 * match decides per node of the input graph: COPY it, DROP it (its value is
 * read by nothing that survives), REPLACE it by a fused node (repl[id]),
 * or ALIAS it: its value becomes output alias_k[id] of the fused node that
 * replaces alias_of[id] (a member of a multi-output pattern whose value is
 * still read: the LayerNorm site's s, its folded CAST, the backward's
 * dgamma).  rebuild appends in input order; a fused node takes the place
 * given by its REPLACE, so every input it reads comes earlier, and every
 * ALIAS member's readers come after it (the rules check both). */
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
    int *alias_of;        /* (g->n) FUSE_ALIAS: the REPLACE node whose output it becomes */
    int *alias_k;         /* (g->n) FUSE_ALIAS: which output (0 = the fused node itself) */
    FuseStats *stats;
} Matcher;

/* A fused node's input may be output k of another fused node (the
 * backward reads the forward's mean and rstd, which the input graph does
 * not have): repl inputs <= -2 encode (node `at` of the input graph, k). */
static inline int fuse_output_ref(int at, int k) { return -2 - (at * 8 + k); }
static inline bool fuse_is_output_ref(int v) { return v <= -2; }
static inline int fuse_ref_node(int v) { return (-2 - v) / 8; }
static inline int fuse_ref_k(int v) { return (-2 - v) % 8; }

/* The LayerNorm site rules (fuse_layernorm.c): run after the other rules,
 * so a DROPOUT + ADD already claimed is left alone. */
void fuse_match_layernorm(Matcher *M);

#endif
