/* compiler/ir_build.c — appending nodes to a graph; see ir_build.h. */
#include "compiler/ir_build.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

static int ir_append(IrGraph *g, IrOpKind op, const char *name)
{
    if (g->n == g->cap) {
        g->cap = g->cap ? 2 * g->cap : 256;
        g->nodes = xrealloc(g->nodes, (size_t)g->cap * sizeof *g->nodes);
    }
    IrNode *n = &g->nodes[g->n];
    memset(n, 0, sizeof *n);
    n->op = op;
    n->region = g->region;
    for (int i = 0; i < IR_MAX_INPUTS; i++) n->in[i] = -1;
    snprintf(n->name, sizeof n->name, "%s", name ? name : ir_op_name(op));
    g->n_forward = g->n + 1; /* autodiff resets this after it appends */
    return g->n++;
}

int ir_add(IrGraph *g, IrOpKind op, const int *inputs, int n_in, const IrAttr *attr,
           const char *name)
{
    const IrOpInfo *info = ir_op_info(op);
    if (n_in < info->min_inputs || n_in > info->max_inputs)
        hpc_panic(__FILE__, __LINE__, "op %s given %d inputs (wants %d..%d)", info->name, n_in,
                  info->min_inputs, info->max_inputs);
    for (int i = 0; i < n_in; i++) HPC_ASSERT(inputs[i] >= 0 && inputs[i] < g->n);
    int id = ir_append(g, op, name);
    IrNode *n = &g->nodes[id];
    for (int i = 0; i < n_in; i++) n->in[i] = inputs[i];
    n->n_in = n_in;
    if (attr) n->attr = *attr;
    ir_shape_rule(op)(g, n);
    return id;
}

int ir_add_outputs(IrGraph *g, IrOpKind op, const int *inputs, int n_in, const IrAttr *attr,
                   const char *name, int *outs)
{
    int id = ir_add(g, op, inputs, n_in, attr, name);
    outs[0] = id;
    for (int k = 1; k < ir_op_info(op)->n_outputs; k++) {
        char pname[IR_NAME_MAX];
        snprintf(pname, sizeof pname, "%.*s.%s", IR_NAME_MAX - 16, g->nodes[id].name, ir_output_name(op, k));
        IrAttr a = {.output = {k}};
        outs[k] = ir_add(g, IR_OP_OUTPUT, &id, 1, &a, pname);
    }
    return id;
}

int ir_input(IrGraph *g, IrInputKind kind)
{
    IrAttr a = {.input = {kind}};
    return ir_add(g, IR_OP_INPUT, NULL, 0, &a, ir_input_name(kind));
}

int ir_param(IrGraph *g, int index, DType dtype, int rank, const int64_t *dims, const char *name)
{
    HPC_ASSERT(rank >= 1 && rank <= IR_MAX_RANK);
    int id = ir_append(g, IR_OP_PARAM, name);
    IrNode *n = &g->nodes[id];
    n->attr.param.index = index;
    n->dtype = dtype;
    n->rank = rank;
    memcpy(n->dims, dims, (size_t)rank * sizeof *dims);
    return id;
}

int ir_copy_node(IrGraph *g, const IrNode *n, const int *map)
{
    int id;
    if (n->op == IR_OP_PARAM) {
        id = ir_param(g, n->attr.param.index, n->dtype, n->rank, n->dims, n->name);
    } else {
        int in[IR_MAX_INPUTS];
        for (int k = 0; k < n->n_in; k++) in[k] = map[n->in[k]];
        id = ir_add(g, n->op, in, n->n_in, &n->attr, n->name);
    }
    g->nodes[id].requires_grad = n->requires_grad;
    g->nodes[id].backward = n->backward;
    g->nodes[id].region = n->region;
    return id;
}

int ir_cast(IrGraph *g, int v, DType to)
{
    if (g->nodes[v].dtype == to) return v;
    char name[IR_NAME_MAX];
    snprintf(name, sizeof name, "%.*s.%s", IR_NAME_MAX - 6, g->nodes[v].name, ir_dtype_name(to));
    IrAttr a = {.cast = {to}};
    int id = ir_add(g, IR_OP_CAST, &v, 1, &a, name);
    g->nodes[id].requires_grad = g->nodes[v].requires_grad;
    g->nodes[id].backward = g->nodes[v].backward;
    g->nodes[id].region = g->nodes[v].region;
    return id;
}
