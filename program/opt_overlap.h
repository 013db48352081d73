/* program/opt_overlap.h — when the optimizer's work may run beside the
 * step's (HPC_OPT_OVERLAP=1, docs/cuda.md, docs/cuda_exec.md).
 *
 * The deferred update: the cuda trainer ends step N with the optimizer's
 * decision only, and queues step N's update at the start of step
 * N + 1, on a second stream, in groups of parameters, while the forward
 * pass runs; the forward node that first reads a parameter waits for the
 * group that updates it, and the backward pass (which writes the gradients
 * again) waits for all of them.  Any other use of the parameters between
 * two steps (evaluation, reading them, a checkpoint) applies the pending
 * update first (runtime/train/train_cuda.c).  The numbers are the same as
 * with the update at the end of its own step: the same kernel on the same
 * gradients and decision.
 *
 * The optimizer's norm check, which reads every gradient, runs beside the
 * backward pass too, in runs that each start once their gradients are
 * final, so the step's tail is the decision alone.
 *
 * What that asks of the graph, per parameter q:
 *   - its wait position: the schedule position (program/plan.h: the node
 *     order) of the first forward node that reads q, directly or through a
 *     STACK of parameters (a view: its reader counts, not the view),
 *     clamped to n_forward; n_forward for a parameter no forward node
 *     reads;
 *   - its gradient kept from the step's end into the next step up to that
 *     position: the plan's wrap (PlanOptions.wrap_grads), so no value the
 *     next forward pass writes before then shares the gradient's memory;
 *   - its ready position: the schedule position of the gradient's value,
 *     after which no node writes it (a view's position comes after its
 *     base's writer; an in-place chain's last value is the gradient).
 *
 * Usage:
 *   bool on;
 *   if (opt_overlap_from_env(&on, &err)) return err.code;
 *   int *wait = xcalloc(g->n_params, sizeof *wait), *ready = xcalloc(g->n_params, sizeof *ready);
 *   opt_overlap_wait_positions(g, wait);
 *   opt_overlap_ready_positions(g, &plan, ready);   // plan: the step's (program/plan.h)
 */
#ifndef HPC_PROGRAM_OPT_OVERLAP_H
#define HPC_PROGRAM_OPT_OVERLAP_H

#include <stdbool.h>

#include "error.h"
#include "program/ir.h"
#include "program/plan.h"

/* HPC_OPT_OVERLAP from the environment: unset, "" or "0" off, "1" on;
 * anything else HPC_ERR_USAGE naming the variable and its forms. */
HpcStatus opt_overlap_from_env(bool *on, HpcError *err);

/* wait[q] for every parameter q < g->n_params, as above. */
void opt_overlap_wait_positions(const IrGraph *g, int *wait);

/* ready[q] for every parameter q < g->n_params: as above, -1 for a
 * parameter without a gradient. */
void opt_overlap_ready_positions(const IrGraph *g, const StepPlan *p, int *ready);

#endif
