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
 *                           included, is low (a value stored in f32 is cast
 *                           once for them); the output is low, or f32 where
 *                           the storage rules below want f32 (cuBLASLt
 *                           writes f32 from 16-bit operands, no cast).
 *   PREC_CLASS_F32_COMPUTE  computed in f32: LayerNorm, softmax,
 *                           activations, dropout, add, embedding gathers,
 *                           layout ops, row reductions (bias/gamma grads).
 *                           Every input is read in the format it is stored
 *                           in (no cast: the kernel converts on load);
 *                           parameter inputs (gamma, beta, embedding
 *                           tables) are the f32 master weights.  The output
 *                           format follows the storage rules below.
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
 * Storage of f32-compute outputs (PrecisionOptions.keep_f32, default
 * PREC_KEEP_DEFAULT, which is what PyTorch autocast stores):
 *   - PREC_KEEP_EMBEDDINGS: embedding gathers and their sums in f32 (the
 *     tables are f32 masters), and the embedding LayerNorm's output;
 *   - PREC_KEEP_RESIDUAL: the residual sums (forward ADDs) in f32; a
 *     forward ADD with an f32 input is f32 anyway (type promotion);
 *   - PREC_KEEP_NORM_OUT: LayerNorm outputs (the hidden states that the
 *     residual carries) in f32; the GEMMs that read them get one cast;
 *   - PREC_KEEP_PROBS / PREC_KEEP_ACT: softmax / activation outputs in f32
 *     (not in the default: autocast stores them in 16 bits too);
 *   - PREC_KEEP_SCORES: the attention scores (the GEMM feeding a softmax
 *     writes f32) and the probabilities' gradient in f32, the scores'
 *     gradient low (what a flash-attention kernel keeps on chip; not in
 *     the default);
 *   - dropout and layout ops (split/merge heads, token slices) store their
 *     input's format; anything else f32-compute stores low.
 *   - PREC_KEEP_GRADS: a gradient is stored in the format of the value it
 *     is the gradient of (autograd's rule): the backward op finds that value
 *     from its forward inputs (see grad_target in precision.c); gradient
 *     contributions are summed in the wider of their formats.  A GEMM's
 *     input gradient stays low (its input was low: autograd stores the
 *     gradient of autocast's cast in 16 bits).  Without it, every gradient
 *     but a parameter's is low.
 * With keep_f32 = 0 every activation and gradient is low (the plan before
 * these rules existed, `hpc`'s fp16 until 2026-12).
 *
 * Regions come from value names (lower.c's scheme): "emb.*" -> embeddings,
 * "layer.*" and "final_ln" -> stack, everything else ("head.*", "logits",
 * "loss") -> head.  A backward node belongs to the region of the forward op
 * whose backward rule made it: the name of its incoming gradient "d.X"
 * names that op's output X.  An ADD that sums the gradient contributions
 * of a value used several times goes with its first contribution, so a
 * gradient that crosses a region boundary is summed on the producers' side.
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

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "error.h"
#include "program/ir.h"
#include "program/spec.h"

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

/* Values a low-precision policy stores in f32 (see the top of this file). */
enum {
    PREC_KEEP_EMBEDDINGS = 1u << 0,
    PREC_KEEP_RESIDUAL = 1u << 1,
    PREC_KEEP_NORM_OUT = 1u << 2,
    PREC_KEEP_GRADS = 1u << 3,
    PREC_KEEP_PROBS = 1u << 4,
    PREC_KEEP_ACT = 1u << 5,
    PREC_KEEP_SCORES = 1u << 6,
    PREC_KEEP_ALL = (1u << 7) - 1,
};
#define PREC_KEEP_DEFAULT (PREC_KEEP_EMBEDDINGS | PREC_KEEP_RESIDUAL | PREC_KEEP_NORM_OUT | PREC_KEEP_GRADS)

typedef struct {
    unsigned keep_f32;        /* PREC_KEEP_* bits */
    bool low_weight_grads;    /* a weight gradient that one LINEAR_DW writes is stored low (the dW
                               * GEMM's 16-bit output, as PyTorch AMP keeps it before .grad), not
                               * f32, and so is a stacked Q/K/V bias's (the other bias gradients
                               * stay f32: precision.c, mark_linear_grads); HPC_WEIGHT_GRAD=low in
                               * place of opts (not by default: NOTES.md) */
} PrecisionOptions;

typedef struct {
    SpecPrecision policy;     /* PREC_FP32, PREC_FP16 or PREC_BF16 */
    unsigned keep_f32;        /* the PrecisionOptions it was planned with */
    bool low_weight_grads;    /* likewise (and the policy is not fp32) */
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
 * of `spec` into `out`, with the default options (PREC_KEEP_DEFAULT, or the
 * list in the environment variable HPC_KEEP_F32, a hook for comparisons
 * such as bench/finetune_quality.sh; a bad list is HPC_ERR_USAGE).
 * Returns HPC_ERR_USAGE for PREC_DEFAULT or an input graph that is not all
 * f32 (the pass runs once, after autodiff). */
HpcStatus precision_plan(const IrGraph *in, const ModelSpec *spec, SpecPrecision policy,
                         IrGraph *out, PrecisionPlan *plan, HpcError *err);
/* The same with explicit options (opts NULL = the defaults); HPC_ERR_USAGE
 * for keep_f32 bits outside PREC_KEEP_ALL. */
HpcStatus precision_plan_opts(const IrGraph *in, const ModelSpec *spec, SpecPrecision policy,
                              const PrecisionOptions *opts, IrGraph *out, PrecisionPlan *plan,
                              HpcError *err);
PrecisionOptions precision_defaults(void);

/* The keep_f32 bits as "embeddings,residual,norm,grads" ("none" for 0). */
void precision_keep_format(unsigned keep, char *buf, size_t size);
/* Parses such a list (also "none", "default", "all") into *keep; false on
 * an unknown name. */
bool precision_keep_parse(const char *list, unsigned *keep);
void precision_plan_free(PrecisionPlan *plan);

/* `hpc compile --precision-report`: a header (policy, region dtypes, casts,
 * low copies), then one line per op of g with its class, the dtypes of its
 * inputs, its compute dtype and its output dtype. */
void precision_report(const IrGraph *g, const PrecisionPlan *plan, FILE *out);

#endif
