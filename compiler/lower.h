/* compiler/lower.h — ModelSpec -> forward graph (IR) and parameter list.
 *
 * lower_model builds the forward graph of a checked ModelSpec: embeddings,
 * the encoder/decoder stack (post-LN BERT or pre-LN GPT-2 layers), the head
 * and its loss.  All values are f32 (the precision pass chooses lower
 * precisions later).  It sets g->loss (a scalar) and g->logits, and fills
 * params with one entry per named tensor (see params.h for names, freezing
 * and tying).  Dropout ops with p = 0 are left out.
 *
 * Inputs are bound from a Batch (runtime/data/batch.h) at run time: input_ids,
 * token_type_ids (only if type_vocab_size > 0), attention_mask, and the
 * labels the head needs (labels, token labels or targets).
 *
 * Ownership: g and params must be initialised (ir_init, params_init) and
 * empty; the caller frees both.
 *
 * Usage:
 *   IrGraph g; ParamList pl; ir_init(&g); params_init(&pl);
 *   if (lower_model(&spec, &g, &pl, &err)) return err.code;
 *   autodiff_build(&g, &pl, &err);
 */
#ifndef HPC_COMPILER_LOWER_H
#define HPC_COMPILER_LOWER_H

#include "error.h"
#include "program/ir.h"
#include "program/params.h"
#include "program/spec.h"

HpcStatus lower_model(const ModelSpec *spec, IrGraph *g, ParamList *params, HpcError *err);

/* lower_model with the attention's form chosen, and with first_token the
 * last layer for token 0 where last_layer_first_only allows it.
 * fused_attention false is lower_model (linear q/k/v -> split_heads ->
 * matmul -> softmax (+dropout) -> matmul -> merge_heads); true puts one
 * ATTENTION node (ops.def: ctx and its log-sum-exp;
 * compiler/kernels/attention.cu) between the projections and the output
 * dense, with no (B, heads, L, L) value in the graph.  Its attention
 * dropout draws its own Philox stream (salt = the ATTENTION node's id), so
 * with dropout on the two forms draw different, equally exact masks; with
 * dropout off they compute the same function. */
HpcStatus lower_model_attention(const ModelSpec *spec, bool fused_attention, bool first_token, IrGraph *g,
                                ParamList *params, HpcError *err);

/* Whether lower_model_attention(..., first_token = true, ...) lowers the
 * last layer for token 0 alone.  A sequence-classification head reads the
 * last layer's output at token 0 ([CLS]) only, so in a post-LN
 * bidirectional stack that layer's attention needs query 0 alone (over
 * every key: ATTENTION first_query), and its output dense, residual,
 * LayerNorms and FFN one row per batch row instead of L.  The loss and
 * every gradient are those of the full layer; only the dropout draws of
 * that layer's hidden dropouts differ (other shapes, so other indices;
 * equally exact).  Fused attention only; in a packed graph (docs/packing.md)
 * the token is each span's first slot (SPAN_TOKEN, varlen first_query).
 * What it costs:
 * the layer's other tokens have no hidden state (the C API's
 * hpc_model_hidden needs them, so its programs ask for every token). */
bool last_layer_first_only(const ModelSpec *spec, bool fused_attention);

/* The default of PipeOptions.first_token_last_layer: true unless
 * HPC_LAST_LAYER=all. */
bool last_layer_first_requested(void);

/* The IR activation for a spec activation. */
IrActKind lower_act(SpecActivation a);

#endif
