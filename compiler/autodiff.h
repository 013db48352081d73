/* compiler/autodiff.h — reverse-mode differentiation over the IR.
 *
 * autodiff_build appends the backward graph to a lowered forward graph:
 *   1. marks requires_grad on every value that depends on a parameter that
 *      is not frozen;
 *   2. seeds d(loss) with a new INPUT node IR_IN_LOSS_SCALE (so the backward
 *      pass computes the gradient of loss * scale, as mixed-precision
 *      training needs; bind 1 for plain gradients);
 *   3. walks the forward nodes in reverse and applies each op's backward
 *      rule (ir_backward, compiler/ops.c), summing the contributions to a
 *      value used more than once with ADD nodes; this is also how a tied
 *      weight (word embeddings = LM decoder) gets the sum of both gradients;
 *   4. sets g->param_grad[p] for every parameter index p (-1 when frozen,
 *      tied to another parameter, or unused by the loss).
 * Nodes it appends have `backward` set; g->n_forward is left at the number
 * of forward nodes.
 *
 * Returns HPC_ERR_INPUT if the graph has no loss or nothing to train.
 */
#ifndef HPC_COMPILER_AUTODIFF_H
#define HPC_COMPILER_AUTODIFF_H

#include "error.h"
#include "program/ir.h"
#include "program/params.h"

HpcStatus autodiff_build(IrGraph *g, const ParamList *params, HpcError *err);

#endif
