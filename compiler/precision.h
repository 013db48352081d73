/* compiler/precision.h — the precision planner: which value is stored in
 * which float format, where CAST ops go, which parameters need a
 * low-precision copy.
 *
 * Input: an all-f32 graph from lower + autodiff.  Output: a new graph with
 * the same nodes in the same order, dtypes set, CAST nodes inserted where
 * producer and consumer disagree, and PARAM nodes of dtype f16/bf16 for the
 * low-precision weight copies; plus a PrecisionPlan with, per node of the
 * new graph, its class and compute dtype.
 *
 * A policy table maps each op kind to a class (precision_op_class):
 *   PREC_CLASS_LOW          low-precision compute (tensor cores, f32
 *                           accumulate): linear, matmul and their backward
 *                           GEMMs.  Every float input, weights and bias
 *                           included, is low; the output is low.
 *   PREC_CLASS_F32_COMPUTE  computed in f32, stored low: LayerNorm, softmax,
 *                           activations, dropout, add, embedding gathers,
 *                           layout ops, row reductions (bias/gamma grads).
 *                           Activation inputs are low; parameter inputs
 *                           (gamma, beta, embedding tables) are the f32
 *                           master weights.  Output low.
 *   PREC_CLASS_F32          f32 in, f32 compute, f32 out: losses and their
 *                           backward, and the ADDs that accumulate a
 *                           parameter's gradient from several uses.
 * "Low" is the region's dtype: the policy's (f16 for PREC_FP16, bf16 for
 * PREC_BF16), or a pin from the ModelSpec: stack.embedding_precision for the
 * embeddings, stack.precision for the layers (and a final LayerNorm),
 * head.precision for the head and the loss.  A pin of PREC_FP32 makes its
 * region all f32.  Under the PREC_FP32 policy nothing changes and pins are
 * ignored: the output graph equals the input.
 *
 * Regions come from value names (lower.c's scheme): "emb.*" -> embeddings,
 * "layer.*" and "final_ln" -> stack, everything else ("head.*", "logits",
 * "loss") -> head.  A backward node belongs to the region of the forward op
 * whose backward rule made it: the name of its incoming gradient "d.X"
 * names that op's output X.  An ADD that sums the gradient contributions
 * of a value used several times goes with its first contribution, so a
 * gradient that crosses a region boundary is summed on the producers' side
 * and cast once.
 *
 * Two further rules:
 *   - parameter gradients are stored in f32 (the optimizer's input) by the
 *     op that produces them (LINEAR_DW writes f32 from f16 operands), so no
 *     cast node is needed; when a parameter is used twice, its gradient
 *     contributions are summed in f32 (as PyTorch autocast does);
 *   - a LOW op that reads a parameter reads its low-precision copy: a PARAM
 *     node of the same index and dtype f16/bf16, which the optimizer writes
 *     after each update (runtime/train/optim.h, OptimTensor.low).  plan->param_low
 *     says which parameters have one and in which dtype.  If a parameter is
 *     wanted in two low dtypes (pins of fp16 and bf16 on a tied weight), the
 *     second comes from a CAST of the master.
 *
 * After this pass node->dtype is the storage dtype of each value; the
 * compute dtype is plan->info[id].compute.  The cpu backend computes every
 * op in f32 from its inputs' values and rounds the result to node->dtype
 * (runtime/cpu/half.h, prec_round_array).
 *
 * Ownership: `out` must be initialised and empty (ir_init); the caller
 * frees it with ir_free and the plan with precision_plan_free.
 *
 * Usage:
 *   IrGraph mixed; PrecisionPlan plan; ir_init(&mixed);
 *   if (precision_plan(&g, &spec, PREC_FP16, &mixed, &plan, &err)) return err.code;
 *   precision_report(&mixed, &plan, stdout);     // hpc compile --precision-report
 *   ... precision_plan_free(&plan); ir_free(&mixed);
 */
#ifndef HPC_COMPILER_PRECISION_H
#define HPC_COMPILER_PRECISION_H

#include <stdio.h>

#include "error.h"
#include "ir.h"
#include "spec.h"

typedef enum {
    PREC_CLASS_NONE,          /* leaves (inputs, parameters) and integer ops */
    PREC_CLASS_LOW,
    PREC_CLASS_F32_COMPUTE,   /* f32 compute, low-precision storage */
    PREC_CLASS_F32,
    PREC_CLASS_CAST,          /* a cast inserted by this pass */
} PrecClass;

typedef enum { PREC_REGION_EMBEDDINGS, PREC_REGION_STACK, PREC_REGION_HEAD } PrecRegion;

typedef struct {
    PrecClass cls;
    PrecRegion region;
    DType compute;            /* f16/bf16 for LOW ops in a low region, else f32 */
    int origin;               /* id in the input graph; -1 for inserted nodes */
} PrecNodeInfo;

typedef struct {
    SpecPrecision policy;     /* PREC_FP32, PREC_FP16 or PREC_BF16 */
    DType region_dtype[3];    /* (PrecRegion) the "low" dtype of each region */
    PrecNodeInfo *info;       /* (out->n) per node of the planned graph */
    int n;
    int *map;                 /* (in->n) id in the planned graph of each input node */
    int n_in;
    DType *param_low;         /* (n_params) low copy per parameter, DT_F32 = none */
    int n_params;
    int n_casts;              /* CAST nodes inserted */
} PrecisionPlan;

/* The class of an op kind in the policy table (before the parameter
 * gradient rule, which makes some ADDs PREC_CLASS_F32). */
PrecClass precision_op_class(IrOpKind op);
const char *precision_class_name(PrecClass c);     /* "low", "f32-compute", "f32", ... */
const char *precision_region_name(PrecRegion r);   /* "embeddings", "stack", "head" */

/* Plans `in` under `policy` (PREC_FP32, PREC_FP16 or PREC_BF16) and the pins
 * of `spec` into `out`.  Returns HPC_ERR_USAGE for PREC_DEFAULT or an input
 * graph that is not all f32 (the pass runs once, after autodiff). */
HpcStatus precision_plan(const IrGraph *in, const ModelSpec *spec, SpecPrecision policy,
                         IrGraph *out, PrecisionPlan *plan, HpcError *err);
void precision_plan_free(PrecisionPlan *plan);

/* `hpc compile --precision-report`: a header (policy, region dtypes, casts,
 * low copies), then one line per op of g with its class, the dtypes of its
 * inputs, its compute dtype and its output dtype. */
void precision_report(const IrGraph *g, const PrecisionPlan *plan, FILE *out);

#endif
