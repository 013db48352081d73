/* program/plan_side.c — which dW GEMMs run beside the step; see
 * plan_side.h. */
#include "program/plan_side.h"

#include "program/plan.h"

/* Whether node m reads value v or a view of it (a view itself reads
 * nothing: it is bytes of its base, plan_view_of). */
static bool reads(const IrGraph *g, int m, int v)
{
    const IrNode *n = &g->nodes[m];
    int base;
    int64_t off;
    if (plan_view_of(g, m, &base, &off)) return false;
    for (int k = 0; k < n->n_in; k++)
        if (n->in[k] == v || (plan_view_of(g, n->in[k], &base, &off) && base == v)) return true;
    return false;
}

/* Whether node m launches work of its own (a view or a multi-output
 * node's OUTPUT is written by another node's launch). */
static bool launches(const IrGraph *g, int m)
{
    int base;
    int64_t off;
    IrOpKind op = g->nodes[m].op;
    return op != IR_OP_OUTPUT && op != IR_OP_INPUT && op != IR_OP_PARAM && !plan_view_of(g, m, &base, &off);
}

int plan_side_nodes(const IrGraph *g, const int64_t *scratch, bool *side)
{
    int n = 0;
    for (int i = 0; i < g->n; i++) {
        side[i] = g->nodes[i].op == IR_OP_LINEAR_DW && !(scratch && scratch[i] > 0);
        n += side[i];
    }
    return n;
}

int plan_side_join(const IrGraph *g, const bool *side, int i)
{
    bool step_between = false;   /* the step's stream launched something since i */
    for (int m = i + 1; m < g->n; m++) {
        if (reads(g, m, i)) return m;
        if (side[m] && step_between) return m;
        if (!side[m] && launches(g, m)) step_between = true;
    }
    return g->n;
}
