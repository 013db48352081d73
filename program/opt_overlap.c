/* program/opt_overlap.c — the switch, and the wait and ready positions of
 * the optimizer beside the step; see opt_overlap.h. */
#include "program/opt_overlap.h"

#include <stdlib.h>
#include <string.h>

#include "program/plan.h"

HpcStatus opt_overlap_from_env(bool *on, HpcError *err)
{
    const char *v = getenv("HPC_OPT_OVERLAP");
    *on = v && strcmp(v, "1") == 0;
    if (!v || !*v || strcmp(v, "0") == 0 || *on) return HPC_OK;
    return hpc_fail(err, HPC_ERR_USAGE, "HPC_OPT_OVERLAP=%s: expected 0 (the optimizer at the end of its step) "
                    "or 1 (beside the step: the check beside the backward pass, the update beside the next "
                    "forward pass)", v);
}

/* Parameter indices x stands for: a PARAM node's, or the three of a STACK
 * of parameters (a view, program/plan.h); none for any other value. */
static int params_of_value(const IrGraph *g, int x, int out[3])
{
    const IrNode *n = &g->nodes[x];
    if (n->op == IR_OP_PARAM) {
        out[0] = n->attr.param.index;
        return 1;
    }
    int base;
    int64_t off;
    if (n->op != IR_OP_STACK || !plan_view_of(g, x, &base, &off)) return 0;
    for (int k = 0; k < 3; k++) out[k] = g->nodes[n->in[k]].attr.param.index;
    return 3;
}

void opt_overlap_wait_positions(const IrGraph *g, int *wait)
{
    for (int q = 0; q < g->n_params; q++) wait[q] = g->n_forward;
    for (int i = 0; i < g->n_forward; i++) {
        const IrNode *n = &g->nodes[i];
        int own[3];
        if (params_of_value(g, i, own) > 0) continue;   /* a parameter or a view of some: no kernel reads here */
        for (int k = 0; k < n->n_in; k++) {
            int q[3];
            int m = params_of_value(g, n->in[k], q);
            for (int j = 0; j < m; j++)
                if (q[j] >= 0 && q[j] < g->n_params && wait[q[j]] > i) wait[q[j]] = i;
        }
    }
}

void opt_overlap_ready_positions(const IrGraph *g, const StepPlan *p, int *ready)
{
    for (int q = 0; q < g->n_params; q++)
        ready[q] = g->param_grad && g->param_grad[q] >= 0 ? p->v[g->param_grad[q]].def : -1;
}
