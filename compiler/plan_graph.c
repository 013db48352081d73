/* compiler/plan_graph.c — plan_build (plan_graph.h): the plan of a graph with
 * each node's scratch asked of the emitter (compiler/emit_ops.h).  The
 * runtime plans from a step program's records instead (plan_build_scratch),
 * so it needs no emitter. */
#include "plan_graph.h"

#include <stdlib.h>

#include "emit_ops.h"

HpcStatus plan_build(const IrGraph *g, int64_t B, int64_t L, StepPlan *p, HpcError *err)
{
    return plan_build_with(g, B, L, NULL, p, err);
}

HpcStatus plan_build_with(const IrGraph *g, int64_t B, int64_t L, const PlanOptions *opt, StepPlan *p,
                          HpcError *err)
{
    int64_t *scratch = xcalloc((size_t)(g->n > 0 ? g->n : 1), sizeof *scratch);
    for (int i = 0; i < g->n; i++) scratch[i] = eop_scratch_bytes(g, i, B, L);
    HpcStatus st = plan_build_scratch_with(g, B, L, scratch, opt, p, err);
    free(scratch);
    return st;
}
