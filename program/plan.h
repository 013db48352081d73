/* program/plan.h — the step plan: schedule, liveness and arena offsets.
 *
 * plan_build_scratch takes a finished graph (a step program's, or lower +
 * autodiff [+ precision] in the compiler), each node's scratch bytes and
 * the upper bounds B, L of a run (the model's batch and max_seq_len) and
 * decides:
 *   - the schedule: the node order of one training step.  The IR keeps
 *     inputs before their users, so the schedule is the node array order
 *     (forward nodes first, so an evaluation runs the prefix
 *     [0, n_forward) of the same plan), but for the weight-gradient GEMMs
 *     of one shape (the layers' LINEAR_DWs), which move side by side to
 *     the last one's place (program/plan_order.c), so the CUDA executor
 *     runs each group as one batched call, where PlanOptions.dw_group or
 *     HPC_DW_GROUP asks for it (AUTO by default).  That keeps their inputs
 *     alive longer (and all of a group's inputs and outputs at once:
 *     plan_dw_spans), so under AUTO the plan is made both ways and the
 *     grouped one kept only where its arena grows by at most 5 %
 *     (BERT-base fp16: at 32 x 32, not at 32 x 128).  Grouped or not,
 *     the forward prefix and the nodes after the last dW GEMM keep their
 *     positions;
 *   - the lifetime of every value, as schedule positions [def, last]
 *     (StepPlan.position maps a node to its position): def
 *     the position of the node that writes it (-1 for batch inputs, which
 *     are uploaded before the first launch), last the position of its last
 *     reader.  The loss, the logits, every parameter gradient and every
 *     batch input are pinned live to the end of the step (the host or the
 *     optimizer reads them after the step: the optimizer reads the token
 *     ids to skip the embedding rows the step did not touch);
 *   - an offset in one device block (the arena) for every value the step
 *     computes, and for the scratch memory of each node (emit_ops.h says
 *     how much a kernel needs): knowing every lifetime, the ranges are
 *     placed one by one, each at the lowest offset free of the ranges
 *     already placed that live at the same time, so values whose lifetimes
 *     do not overlap share memory; of several orders (largest first, the
 *     fullest positions' ranges first, largest first with perturbed sizes)
 *     the one with the smallest arena is kept.  Parameters (f32
 *     masters and their fp16/bf16 copies) live outside the arena.
 *   - in-place writes: a node whose op writes over one of its inputs
 *     (plan_inplace_input: LINEAR_DX_ACC's acc, the GEMM's C = D; the
 *     activation backward's dy and x; LN_DW_FIX's raw weight gradient)
 *     gets that input's storage when the
 *     node is the input's last reader (and the input is no role pinned to
 *     the end, same dtype and size); a chain of
 *     them (residual + dXq + dXk + dXv) is one range that lives from the
 *     first value's definition to the last one's last reader.  Otherwise
 *     (PlanOptions.keep_all, a reader after the node) the value has its own
 *     range and the executor writes out of place;
 *   - views (plan_view_of): a stack of adjacent parameters, the parts of
 *     an unstacked gradient, stored inside another value (PLAN_VIEW);
 *   - the memory figure of a training step: arena, parameters, gradients,
 *     optimizer state (plan_print prints it; `hpc compile --plan`).
 *
 * Sizes in the plan are for the bounds B, L; a run with a smaller batch or a
 * shorter padded length uses the same offsets (every value shrinks).  All
 * offsets and sizes are multiples of PLAN_ALIGN (256 bytes, what cuBLASLt
 * and 16-byte vector loads want).
 *
 * Ownership: the plan owns its arrays; plan_free releases them.  The graph
 * is only read.
 *
 * Usage:
 *   StepPlan p;
 *   step_kernels_scratch(&prog.kernels, B, L, scratch);      // (n) bytes per node
 *   if (plan_build_scratch(&prog.g, B, L, scratch, &p, &err)) return err.code;
 *   CUdeviceptr x = arena_base + p.v[id].offset;     // (dims of id) in prog.g.nodes[id].dtype
 *   plan_print(&p, &prog.g, &prog.pl, &prog.spec.train, stdout);
 *   plan_free(&p);
 */
#ifndef HPC_PROGRAM_PLAN_H
#define HPC_PROGRAM_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "error.h"
#include "program/ir.h"
#include "program/params.h"
#include "program/spec.h"

#define PLAN_ALIGN 256

typedef enum {
    PLAN_NONE,     /* not stored: a value the step never computes */
    PLAN_ARENA,    /* in the arena at `offset` */
    PLAN_PARAM,    /* parameter storage (master or low copy), outside the arena */
    PLAN_VIEW,     /* bytes [view_off, view_off + bytes) of value `storage` (plan_view_of):
                    * no kernel writes it; arena views also have their `offset` */
} PlanKind;

/* Whether the schedule puts the dW GEMMs of one shape side by side (see the
 * top): NEVER, AUTO (where the arena grows by at most 1/PLAN_DW_GROUP_GROWTH)
 * or ALWAYS; DEFAULT takes HPC_DW_GROUP (1 always, 0 never; unset, empty
 * or auto: AUTO; any other value: plan_build fails with HPC_ERR_USAGE
 * naming it). */
typedef enum { PLAN_DW_GROUP_DEFAULT, PLAN_DW_GROUP_NEVER, PLAN_DW_GROUP_AUTO, PLAN_DW_GROUP_ALWAYS } PlanDwGroup;
#define PLAN_DW_GROUP_GROWTH 20   /* 5 %: BERT-base fp16 at 32 x 32, 425.1 -> 444.6 MiB; not 32 x 128 (+51 %) */

typedef struct {
    PlanKind kind;
    int64_t bytes;     /* at the plan's B, L; rounded up to PLAN_ALIGN */
    int64_t offset;    /* PLAN_ARENA, and PLAN_VIEW of an arena value: byte offset in the arena; else -1 */
    int def, last;     /* schedule positions, def <= last; -1 = before the first node */
    int storage;       /* the value whose arena range holds this one: itself, or for an
                        * in-place write (plan_inplace_input) the first value of its chain;
                        * PLAN_VIEW: the value it is a view of */
    int64_t view_off;  /* PLAN_VIEW: byte offset inside `storage`; else 0 */
} PlanValue;

/* The memory a training step needs, bytes. */
typedef struct {
    int64_t arena;          /* the planned block (activations, gradients, scratch) */
    int64_t unshared;       /* what the arena would be with no sharing */
    int64_t gradients;      /* parameter gradients (f32), inside the arena */
    int64_t params_master;  /* f32 master weights */
    int64_t params_low;     /* fp16/bf16 weight copies */
    int64_t optimizer;      /* optimizer state (Adam m, v; SGD momentum) */
    int64_t total;          /* arena + parameters + optimizer state */
} PlanMemory;

typedef struct {
    int64_t B, L;           /* the bounds the plan was made for */
    int *order;             /* (n_order) node ids in schedule order */
    int *position;          /* (n) node i's position in order */
    int *dw_span_end;       /* (n_order) plan_dw_spans of order: where a batchable span of dW GEMMs ends */
    int n_order;
    int n_forward;          /* the first n_forward positions are the forward pass */
    PlanValue *v;           /* (n) per value (node) of the graph */
    int64_t *scratch_off;   /* (n) arena offset of node i's scratch, -1 if none */
    int64_t *scratch_bytes; /* (n) bytes of node i's scratch (0 if none) */
    int n;
    int64_t arena_bytes;    /* size of the planned block */
    /* The dW GEMMs side by side or not (plan_print says which, and why): */
    PlanDwGroup dw_mode;    /* the mode the plan was made under (never DEFAULT) */
    int dw_moved;           /* dW GEMMs the grouped schedule moves (plan_order_dw_groups); 0: no groups */
    bool dw_grouped;        /* the schedule holds them side by side */
    int64_t dw_other_arena; /* the arena of the schedule not taken; 0 where none was planned
                             * (no groups, or NEVER) */
} StepPlan;

/* Builds the plan of g for bounds B, L with node i's scratch bytes at B, L
 * given as scratch[i] (NULL: none): the runtime takes them from a step
 * program's records (step_kernels_scratch), the compiler from the emitter
 * (plan_build, compiler/plan_graph.h).  HPC_ERR_USAGE if B or L < 1 or the
 * graph is empty; HPC_ERR_INPUT for a value of a dtype the GPU does not
 * store (f64). */
HpcStatus plan_build_scratch(const IrGraph *g, int64_t B, int64_t L, const int64_t *scratch, StepPlan *p,
                             HpcError *err);

/* The schedule with those groups (program/plan_order.c): fills order (g->n
 * node ids) and returns how many dW GEMMs moved (0: the graph's order). */
int plan_order_dw_groups(const IrGraph *g, int *order);

/* The spans of a grouped schedule (order: n node ids; plan.c marks none in
 * the graph's order) that one batched call may run: maximal stretches of
 * consecutive LINEAR_DWs of one group's shapes.
 * span_end[t]: the position of the last node of t's span, or -1 where t is
 * in none.  The plan treats a span as one node: every member's output is
 * written from the span's first position and every member's inputs live to
 * its last (a batched call reads all inputs and writes all outputs at
 * once), so the executor may batch any run inside one (StepPlan.dw_span_end). */
void plan_dw_spans(const IrGraph *g, const int *order, int n, int *span_end);

/* How a plan may differ from the default (NULL or zeroed = the default). */
typedef struct {
    bool keep_all;   /* every value lives to the end of the step, nothing shares memory:
                      * a test reads any value after a step (the arena grows to the sum) */
    const bool *write_early; /* (g->n) or NULL: value i is also written by the node just before
                              * it (hpc's own GEMM writes gelu(y) with y: runtime/cuda/gemm_own.h),
                              * so its bytes are its own from that node on */
    PlanDwGroup dw_group;    /* the dW GEMMs side by side (see above) */
} PlanOptions;

/* plan_build_scratch with options (opt may be NULL). */
HpcStatus plan_build_scratch_with(const IrGraph *g, int64_t B, int64_t L, const int64_t *scratch,
                                  const PlanOptions *opt, StepPlan *p, HpcError *err);
void plan_free(StepPlan *p);

/* The value that value v is written over when the plan lets it (the cuda
 * executor then runs its node in place), or -1: LINEAR_DX_ACC's acc (the
 * GEMM's C = D); ACT_BWD_BGRAD's dy for its dx and, for its output 2 (the
 * recomputed act(x)), its x. */
int plan_inplace_input(const IrGraph *g, int v);

/* Views (Q, K and V from one GEMM, compiler/fuse_qkv.c): value v needs no
 * storage or kernel of its own because it is bytes [*byte_off, + its size)
 * of value *base, which is no view itself:
 *   - a STACK of three PARAM nodes of its dtype: the first one's storage
 *     (the executor lays stacked parameters out back to back,
 *     program/param_pack.h, and checks that at bind time);
 *   - part k of an UNSTACK (the node for k = 0, its OUTPUT k else) of a
 *     value x of its dtype and a shape without B or L, each part a
 *     multiple of PLAN_ALIGN bytes: x's bytes from k parts on.
 * The rule reads only the graph, so the emitter (no kernel) and the
 * planner (no range) agree.  The base lives as long as its views. */
bool plan_view_of(const IrGraph *g, int v, int *base, int64_t *byte_off);

/* Bytes of one element of dt. */
size_t plan_dtype_size(DType dt);

/* The memory figure: optimizer state words per trainable element follow
 * the optimizer (Adam/AdamW/LAMB 2, SGD 1 with momentum, else 0). */
void plan_memory(const StepPlan *p, const IrGraph *g, const ParamList *pl,
                 const SpecTraining *train, PlanMemory *m);

/* The most arena bytes live at one schedule position: each storage range
 * once (a value written in place over another shares its range, which
 * lives as long as the whole chain), plus that node's scratch.  What the
 * graph needs before the arena's packing; arena_bytes is at least this. */
int64_t plan_peak_live_bytes(const StepPlan *p);

/* Checks the plan's invariants: every arena range inside the arena and
 * aligned, def <= last, each value live at its readers' positions, and no
 * two arena ranges (values or scratch) overlap in memory while both are
 * live, and every value stored in another's range (storage) is an in-place
 * write the rules above allow.  Returns true if they hold; otherwise false
 * with a sentence in why. */
bool plan_check(const StepPlan *p, const IrGraph *g, char *why, size_t why_size);

/* `hpc compile --plan`: the memory figure, then one line per value in
 * schedule order (position, id, name, bytes, offset, lifetime). */
void plan_print(const StepPlan *p, const IrGraph *g, const ParamList *pl,
                const SpecTraining *train, FILE *out);

#endif
