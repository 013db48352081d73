/* compiler/fuse_attn_keep.c — HPC_ATTN_KEEP=1: the attention forward saves
 * its dropout's keep bits for the backward, which then reads them instead
 * of drawing them again.
 *
 * The fused attention (program/ops.def ATTENTION) drops probabilities out
 * with Philox-4x32-10 draws keyed by the element's flat index in (B, heads,
 * L, L), and its backward draws the same bits again: at BERT-base 256 x 128
 * those draws were 15 % of the one-pass backward's time (H200, BENCHMARKS.md
 * eighth session: 434 us a layer with attention dropout 0.1, 371 with 0).
 * Saved, they cost one bit an element, IR_ATTN_KEEP_KEYS / 8 = 16 bytes a
 * query row: 0.75 MiB a layer at 32 x 128.
 *
 * The rule: an ATTENTION with dropout that is padded (not varlen), of
 * every query (not first_query), in f16 or bf16 with a head size the
 * one-pass backward takes (at most ATTN_KEEP_MAX_HEAD), and its
 * ATTENTION_BWD (the one reading its lse) gets the keep output: ATTENTION's
 * output 2, (B, heads, L, IR_ATTN_KEEP_KEYS / 32) i32, becomes the
 * backward's input 7.  Only the kernels of rows up to IR_ATTN_KEEP_KEYS
 * keys use it (the v2 forward writes it, the one-pass backward reads it);
 * longer rows and the other kernel families draw as before, and so does
 * the cpu reference's backward (its forward writes the same bits), so the
 * bits and every result are the same either way.
 *
 * Runs on the rebuilt graph (after fuse.c's rebuild), as fuse_ln_dw.c: a
 * copy node for node with the keep outputs inserted, the precision plan
 * re-indexed alike. */
#include <stdio.h>
#include <stdlib.h>

#include "fuse_internal.h"

#include "compiler/ir_build.h"

#define ATTN_KEEP_MAX_HEAD 64   /* compiler/emit_ops_attention.c's AT_ONE_PASS_MAX_D */

static const IrNode *nd(const IrGraph *g, int id) { return &g->nodes[id]; }

/* Whether ATTENTION node i qualifies (before its backward is looked for). */
static bool keeps(const IrGraph *g, int i)
{
    const IrNode *n = nd(g, i);
    if (n->op != IR_OP_ATTENTION || n->attr.attn.varlen || n->attr.attn.first_query || !(n->attr.attn.p > 0))
        return false;
    if (ir_output(g, i, 2) >= 0) return false;
    const IrNode *q = nd(g, n->in[0]);
    int64_t head = q->dims[2] / (n->attr.attn.packed ? 3 : 1) / n->attr.attn.heads;
    return (q->dtype == DT_F16 || q->dtype == DT_BF16) && head <= ATTN_KEEP_MAX_HEAD;
}

/* The ATTENTION_BWD of forward node i (the one reading its lse), or -1. */
static int backward_of(const IrGraph *g, int i)
{
    int lse = ir_output(g, i, 1);
    if (lse < 0) return -1;
    for (int j = lse + 1; j < g->n; j++) {
        const IrNode *u = nd(g, j);
        if (u->op == IR_OP_ATTENTION_BWD && u->n_in == 7 && u->in[6] == lse) return j;
    }
    return -1;
}

void fuse_attn_keep(IrGraph *g, PrecisionPlan *plan, FuseStats *st)
{
    int *bwd_of = xmalloc((size_t)(g->n > 0 ? g->n : 1) * sizeof *bwd_of);   /* forward i -> its backward */
    int *fwd_of = xmalloc((size_t)(g->n > 0 ? g->n : 1) * sizeof *fwd_of);   /* backward j -> its forward */
    int n_sites = 0;
    for (int i = 0; i < g->n; i++) bwd_of[i] = fwd_of[i] = -1;
    for (int i = 0; i < g->n; i++) {
        int j = keeps(g, i) ? backward_of(g, i) : -1;
        if (j < 0) continue;
        bwd_of[i] = j;
        fwd_of[j] = i;
        n_sites++;
    }
    if (n_sites == 0) {
        free(bwd_of);
        free(fwd_of);
        return;
    }
    IrGraph out;
    ir_init(&out);
    out.region = g->region;
    int *map = xmalloc((size_t)g->n * sizeof *map);
    int *keep = xmalloc((size_t)g->n * sizeof *keep);   /* forward i -> its keep output in out */
    PrecNodeInfo *info = plan ? xcalloc((size_t)(g->n + n_sites), sizeof *info) : NULL;
    int pending = -1;   /* a forward whose keep output goes after its OUTPUT nodes */
    for (int j = 0; j <= g->n; j++) {
        bool output_of_pending = j < g->n && pending >= 0 && nd(g, j)->op == IR_OP_OUTPUT && nd(g, j)->in[0] == pending;
        if (pending >= 0 && !output_of_pending) {
            IrAttr a = {.output = {2}};
            char name[IR_NAME_MAX];
            snprintf(name, sizeof name, "%.*s.%s", IR_NAME_MAX - 16, nd(g, pending)->name,
                     ir_output_name(IR_OP_ATTENTION, 2));
            int k = ir_add(&out, IR_OP_OUTPUT, &map[pending], 1, &a, name);
            out.nodes[k].region = nd(g, pending)->region;
            if (info) info[k] = (PrecNodeInfo){PREC_CLASS_NONE, info[map[pending]].region, DT_I32, -1};
            keep[pending] = k;
            pending = -1;
        }
        if (j == g->n) break;
        const IrNode *c = nd(g, j);
        int id;
        if (fwd_of[j] >= 0) {   /* the backward: its inputs mapped, then the keep bits */
            int in[IR_MAX_INPUTS];
            for (int k = 0; k < c->n_in; k++) in[k] = map[c->in[k]];
            in[c->n_in] = keep[fwd_of[j]];
            id = ir_add(&out, c->op, in, c->n_in + 1, &c->attr, c->name);
            out.nodes[id].requires_grad = c->requires_grad;
            out.nodes[id].backward = c->backward;
            out.nodes[id].region = c->region;
        } else {
            id = ir_copy_node(&out, c, map);
        }
        out.nodes[id].dtype = c->dtype;
        map[j] = id;
        if (info) info[id] = plan->info[j];
        if (bwd_of[j] >= 0) pending = j;
    }
    fuse_replace_graph(g, &out, map, plan, info);
    st->attn_keep = n_sites;
    free(map);
    free(keep);
    free(bwd_of);
    free(fwd_of);
}
