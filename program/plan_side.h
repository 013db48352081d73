/* program/plan_side.h — the weight-gradient GEMMs a step may run on a
 * second stream beside its other work.
 *
 * A LINEAR_DW's value (a weight gradient) is read only at the end of the
 * backward pass (by the optimizer, or the LN_DW_FIX nodes that end the
 * graph), so nothing on the dX chain waits for it.  At small batches one
 * GEMM leaves much of an H100 idle, and a dW GEMM beside the next dX GEMM,
 * LayerNorm and attention kernels fills some of that: in a probe of
 * BERT-base's backward GEMMs (bench/results/2026-12-07-session39.txt,
 * call 2) the dW GEMMs on a second stream took 6.6 % off at 32 x 32
 * tokens, 2.6 % at 32 x 128 and nothing at 256 x 128.
 *
 * plan_side_nodes picks the side nodes: the LINEAR_DW nodes with no
 * scratch memory.  Side node s (at its position in the schedule, the node
 * order) is forked there and joined (the step's stream waits for the side
 * stream) at plan_side_join: the first later side node with a launch of
 * the step's own between them (side nodes next to each other run back to
 * back on the side stream: BERT's two FFN dW GEMMs), or the first reader
 * of s's value (or of a view of it), whichever comes first; g->n (the end
 * of the step's nodes) when neither exists.  Until that join nothing the
 * step's stream runs may write over what s reads:
 * PlanOptions.side keeps every input of s alive to its join
 * (program/plan.h), which can make the arena larger; the executor
 * (runtime/cuda/cuda_exec.h) uses the side stream only where it grows
 * little (CUDA_EXEC_SIDE_GROWTH_PCT), unless told to.
 */
#ifndef HPC_PROGRAM_PLAN_SIDE_H
#define HPC_PROGRAM_PLAN_SIDE_H

#include <stdbool.h>
#include <stdint.h>

#include "program/ir.h"

/* side[i] (g->n) set for each side node of g; scratch[i]: node i's
 * scratch bytes (NULL: none has any).  Returns how many. */
int plan_side_nodes(const IrGraph *g, const int64_t *scratch, bool *side);

/* Where side node i is joined (see the top): a position after i, at most
 * g->n. */
int plan_side_join(const IrGraph *g, const bool *side, int i);

#endif
