/* compiler/plan_graph.h — the step plan (program/plan.h) of a graph built in
 * this process, each node's scratch asked of the emitter
 * (compiler/emit_ops.h).  The runtime plans from a step program's launch
 * records instead (plan_build_scratch), so it needs no emitter.
 *
 * Usage:
 *   StepPlan p;
 *   if (plan_build(&g, spec.train.batch_size, spec.train.max_seq_len, &p, &err)) return err.code;
 *   plan_free(&p);
 */
#ifndef HPC_COMPILER_PLAN_GRAPH_H
#define HPC_COMPILER_PLAN_GRAPH_H

#include <stdint.h>

#include "error.h"
#include "program/ir.h"
#include "program/plan.h"

/* plan_build_scratch with the emitter's scratch per node; the same errors. */
HpcStatus plan_build(const IrGraph *g, int64_t B, int64_t L, StepPlan *p, HpcError *err);
/* The same with options (program/plan.h; opt may be NULL). */
HpcStatus plan_build_with(const IrGraph *g, int64_t B, int64_t L, const PlanOptions *opt, StepPlan *p,
                          HpcError *err);

#endif
