/* compiler/dot.c — the graph as Graphviz dot (`hpc compile --dot FILE`).
 *
 * Forward ops are boxes, backward ops grey boxes, parameters ellipses,
 * batch inputs green, the loss red; each label shows op, name, shape and
 * dtype.  Render with `dot -Tsvg FILE -o graph.svg`. */
#include <stdio.h>

#include "program/ir.h"
#include "ir_print.h"

static const char *node_style(const IrGraph *g, int id)
{
    const IrNode *n = &g->nodes[id];
    if (id == g->loss) return "shape=box, style=filled, fillcolor=\"#f4a6a6\"";
    if (n->op == IR_OP_PARAM) return "shape=ellipse, style=filled, fillcolor=\"#fff2b3\"";
    if (n->op == IR_OP_INPUT) return "shape=ellipse, style=filled, fillcolor=\"#c6ebc6\"";
    if (n->backward) return "shape=box, style=filled, fillcolor=\"#e6e6e6\"";
    return "shape=box";
}

void ir_dot(const IrGraph *g, FILE *out)
{
    fprintf(out, "digraph hpc {\n  rankdir=TB;\n  node [fontname=\"Helvetica\", fontsize=10];\n");
    for (int i = 0; i < g->n; i++) {
        const IrNode *n = &g->nodes[i];
        char shape[64], attr[96];
        ir_shape_str(n, shape, sizeof shape);
        ir_attr_str(n, attr, sizeof attr);
        fprintf(out, "  n%d [%s, label=\"%%%d %s %s\\n%s\\n%s %s\"];\n", i, node_style(g, i), i,
                ir_op_name(n->op), attr, n->name, shape, ir_dtype_name(n->dtype));
        for (int k = 0; k < n->n_in; k++) fprintf(out, "  n%d -> n%d;\n", n->in[k], i);
    }
    fprintf(out, "}\n");
}
