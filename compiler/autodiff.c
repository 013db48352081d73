/* compiler/autodiff.c — reverse mode over the IR; see autodiff.h. */
#include "autodiff.h"

#include <stdio.h>
#include <stdlib.h>

#include "compiler/ir_build.h"

static void mark_requires_grad(IrGraph *g, const ParamList *pl)
{
    for (int i = 0; i < g->n_forward; i++) {
        IrNode *n = &g->nodes[i];
        if (n->op == IR_OP_PARAM) {
            n->requires_grad = !pl->p[n->attr.param.index].frozen;
            continue;
        }
        n->requires_grad = false;
        for (int k = 0; k < n->n_in; k++) n->requires_grad |= g->nodes[n->in[k]].requires_grad;
    }
}

/* grad[v] += d, appending an ADD when v already has a gradient. */
static void accumulate(IrGraph *g, int *grad, int v, int d)
{
    if (grad[v] < 0) {
        grad[v] = d;
        return;
    }
    char name[IR_NAME_MAX];
    snprintf(name, sizeof name, "d.%.*s", IR_NAME_MAX - 3, g->nodes[v].name);
    grad[v] = ir_add(g, IR_OP_ADD, (int[]){grad[v], d}, 2, NULL, name);
    g->nodes[grad[v]].backward = true;
    g->nodes[grad[v]].region = g->nodes[v].region;
}

HpcStatus autodiff_build(IrGraph *g, const ParamList *pl, HpcError *err)
{
    if (g->loss < 0 || g->nodes[g->loss].rank != 0)
        return hpc_fail(err, HPC_ERR_INPUT, "autodiff: the graph has no scalar loss");
    int n_fwd = g->n_forward;
    mark_requires_grad(g, pl);
    if (!g->nodes[g->loss].requires_grad)
        return hpc_fail(err, HPC_ERR_INPUT,
                        "autodiff: no trainable parameter reaches the loss (all frozen?); "
                        "unfreeze some layers");
    int *grad = xmalloc((size_t)n_fwd * sizeof *grad);
    for (int i = 0; i < n_fwd; i++) grad[i] = -1;
    g->region = IR_REGION_HEAD;  /* the seed belongs to the loss */
    grad[g->loss] = ir_input(g, IR_IN_LOSS_SCALE);
    g->nodes[grad[g->loss]].backward = true;
    for (int i = n_fwd - 1; i >= 0; i--) {
        if (grad[i] < 0 || !g->nodes[i].requires_grad || g->nodes[i].op == IR_OP_PARAM) continue;
        int dx[IR_MAX_INPUTS];
        ir_backward(g, i, grad[i], dx);
        for (int k = 0; k < IR_MAX_INPUTS; k++)
            if (dx[k] >= 0) accumulate(g, grad, g->nodes[i].in[k], dx[k]);
    }
    free(g->param_grad);
    g->n_params = pl->n;
    g->param_grad = xmalloc((size_t)pl->n * sizeof *g->param_grad);
    for (int p = 0; p < pl->n; p++) g->param_grad[p] = -1;
    for (int i = 0; i < n_fwd; i++)
        if (g->nodes[i].op == IR_OP_PARAM && g->nodes[i].requires_grad)
            g->param_grad[g->nodes[i].attr.param.index] = grad[i];
    g->n_forward = n_fwd;
    free(grad);
    return HPC_OK;
}
