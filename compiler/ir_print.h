/* compiler/ir_print.h — the graph (program/ir.h) as text for people: the
 * listing of `hpc compile --ir` and `--dump-STAGE` (ir_print.c) and the
 * Graphviz dot of `--dot FILE` (dot.c).  Compiler side: the runtime names
 * a node by its name and op (ir_op_name), never prints the graph.
 *
 * Usage:
 *   ir_print(&g, stdout);
 */
#ifndef HPC_COMPILER_IR_PRINT_H
#define HPC_COMPILER_IR_PRINT_H

#include <stddef.h>
#include <stdio.h>

#include "program/ir.h"

/* Writes the node's attributes as text ("trans_b alpha=0.125", "p=0.1
 * salt=17", ...), empty for ops without attributes. */
void ir_attr_str(const IrNode *n, char *buf, size_t size);

/* The readable listing: one line per value with id, name, op, inputs,
 * attributes, shape and dtype. */
void ir_print(const IrGraph *g, FILE *out);
/* Graphviz dot of the whole graph. */
void ir_dot(const IrGraph *g, FILE *out);

#endif
