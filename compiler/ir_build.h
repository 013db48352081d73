/* compiler/ir_build.h — building graphs of program/ir.h: appending nodes
 * (each runs its op's shape rule, compiler/ops.c) and the backward rules
 * autodiff calls.  The compiler's half of the IR: a program that only runs
 * a step program never needs these.
 *
 * Builders validate and record: ir_add computes the output shape and dtype
 * with the op's shape rule and panics (HPC_ASSERT regime) on a shape
 * mismatch, because graphs are built by the compiler from a checked
 * ModelSpec, never from user input directly. */
#ifndef HPC_COMPILER_IR_BUILD_H
#define HPC_COMPILER_IR_BUILD_H

#include "program/ir.h"

/* Shape and dtype rule of an op: fills node->dtype, rank, dims from the
 * inputs (already in g) and the attribute; panics on a mismatch. */
typedef void (*IrShapeFn)(const IrGraph *g, IrNode *node);
/* Backward rule of an op: see ir_backward. */
typedef void (*IrGradFn)(IrGraph *g, int node, int dy, int *dx);

/* The rules of ops.def's rows (compiler/ops.c). */
IrShapeFn ir_shape_rule(IrOpKind op);
IrGradFn ir_grad_rule(IrOpKind op);

/* Appends a node, runs its shape rule, returns its id.  attr may be NULL for
 * ops without attributes.  name is copied (truncated); NULL = op name. */
int ir_add(IrGraph *g, IrOpKind op, const int *inputs, int n_in, const IrAttr *attr,
           const char *name);
/* For an op with several outputs: ir_add, then one OUTPUT node per output
 * 1 .. n_outputs-1 right after it, named "<name>.<output name>".  Writes the
 * value ids of all outputs into outs[0 .. n_outputs) (outs[0] is the node)
 * and returns the node's id. */
int ir_add_outputs(IrGraph *g, IrOpKind op, const int *inputs, int n_in, const IrAttr *attr,
                   const char *name, int *outs);
int ir_input(IrGraph *g, IrInputKind kind);
int ir_param(IrGraph *g, int index, DType dtype, int rank, const int64_t *dims, const char *name);

/* Backward rule of node's op (compiler/ops.c): given dy, the gradient value
 * of node, appends the nodes that compute the gradient of each input whose
 * requires_grad is set and writes their ids into dx[i] (-1 for the others).
 * Autodiff calls it once per forward node, in reverse order. */
void ir_backward(IrGraph *g, int node, int dy, int dx[IR_MAX_INPUTS]);

/* For passes that rebuild a graph (precision, fuse): appends a copy of
 * node n of another graph with its inputs remapped through map (old id ->
 * id in g) and runs its shape rule again, so dtypes follow the new inputs
 * (a PARAM keeps its dims and dtype; set node->dtype afterwards to store a
 * value in another precision).  Flags, name and attributes are copied; a
 * dropout keeps its salt, so its mask does not change.  Returns the id. */
int ir_copy_node(IrGraph *g, const IrNode *n, const int *map);
/* CAST(v) to `to`, or v itself when it already has that dtype. */
int ir_cast(IrGraph *g, int v, DType to);

#endif
