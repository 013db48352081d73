/* program/plan_order.c — the schedule with the weight-gradient GEMMs of one
 * shape side by side (plan.h, "the schedule").
 *
 * Each group of LINEAR_DWs with the same output and operand shapes and
 * dtypes (BERT-base: the Q/K/V, attention-output, FFN-up and FFN-down dW
 * GEMMs of 11 layers; the last layer's FFN, which sees only the first
 * token, and layer 0's Q/K/V, which reads the embeddings, differ) moves to
 * the position of its last member, so the CUDA executor can run it as one
 * batched cuBLASLt call (runtime/cuda/cuda_exec_dw_batch.c).
 *
 * Why: at small token counts a dW GEMM such as 768 x 768 x 1024 has 36-48
 * output tiles for an H100's 132 SMs, so each call leaves most of the GPU
 * idle; batched, the layers fill it (bench/dw_batched: 553 -> 298 us for
 * BERT-base's 48 calls at 1024 tokens, alone and warm).  A dW GEMM feeds
 * nothing in the backward pass but the optimizer (its gradient) or an
 * LN_DW_FIX at the graph's end, so it may run later; its operands (dy and
 * x) then live longer, which the memory plan sees: plan.c takes this order
 * only where asked (HPC_DW_GROUP), under `auto` where the arena grows by at
 * most 5 %.
 *
 * A member moves only where no node between it and the group's last
 * member reads it; the moved members keep their order among themselves,
 * and nothing else moves, so every node still comes after its inputs, the
 * forward pass is the same prefix and the trailing nodes (the LN_DW_FIXes)
 * stay where they were. */
#include <stdlib.h>

#include "program/plan.h"
#include "util/error.h"

static const IrNode *nd(const IrGraph *g, int id) { return &g->nodes[id]; }

/* Whether LINEAR_DWs a and b compute the same shape from the same kinds of operands. */
static bool same_group(const IrGraph *g, int a, int b)
{
    const IrNode *x = nd(g, a), *y = nd(g, b);
    if (x->dtype != y->dtype || !ir_same_shape(x, y)) return false;
    for (int k = 0; k < 2; k++) {
        const IrNode *u = nd(g, x->in[k]), *v = nd(g, y->in[k]);
        if (u->dtype != v->dtype || !ir_same_shape(u, v)) return false;
    }
    return true;
}

/* group[i]: the last member of node i's group, or i itself (a node that
 * stays where it is, or that last member).  Returns the members that move. */
static int find_groups(const IrGraph *g, int *group)
{
    int moved = 0;
    for (int i = 0; i < g->n; i++) group[i] = i;
    /* first_reader[v]: the first node reading value v, or g->n */
    int *first_reader = xmalloc((size_t)(g->n > 0 ? g->n : 1) * sizeof *first_reader);
    for (int i = 0; i < g->n; i++) first_reader[i] = g->n;
    for (int j = g->n - 1; j >= 0; j--)
        for (int k = 0; k < nd(g, j)->n_in; k++) first_reader[nd(g, j)->in[k]] = j;
    for (int i = g->n - 1; i >= g->n_forward; i--) {
        if (nd(g, i)->op != IR_OP_LINEAR_DW || group[i] != i) continue;
        /* i is the last of its group: the earlier members join it where nothing up to i reads them */
        for (int m = i - 1; m >= g->n_forward; m--)
            if (nd(g, m)->op == IR_OP_LINEAR_DW && group[m] == m && first_reader[m] > i && same_group(g, m, i)) {
                group[m] = i;
                moved++;
            }
    }
    free(first_reader);
    return moved;
}

int plan_order_dw_groups(const IrGraph *g, int *order)
{
    int *group = xmalloc((size_t)(g->n > 0 ? g->n : 1) * sizeof *group);
    int moved = find_groups(g, group), t = 0;
    for (int j = 0; j < g->n; j++) {
        if (group[j] != j) continue;   /* it goes right before its group's last member */
        for (int m = 0; m < j && moved && nd(g, j)->op == IR_OP_LINEAR_DW; m++)
            if (group[m] == j) order[t++] = m;
        order[t++] = j;
    }
    free(group);
    return moved;
}

void plan_dw_spans(const IrGraph *g, const int *order, int n, int *span_end)
{
    for (int t = 0; t < n;) {
        int len = 1, a = order[t];
        while (nd(g, a)->op == IR_OP_LINEAR_DW && t + len < n && nd(g, order[t + len])->op == IR_OP_LINEAR_DW &&
               same_group(g, a, order[t + len]))
            len++;
        for (int k = 0; k < len; k++) span_end[t + k] = len > 1 ? t + len - 1 : -1;
        t += len;
    }
}
