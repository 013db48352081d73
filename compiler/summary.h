/* compiler/summary.h — parameter counts and FLOPs of a ModelSpec.
 *
 * Counts follow Hugging Face transformers exactly (checked in
 * tests/test_models.c against the *ForSequenceClassification,
 * GPT2LMHeadModel and BertForMaskedLM numbers):
 *   embeddings = (vocab + max_positions + token_types) * H  (+ 2H LayerNorm if embedding_norm)
 *   layer      = 4 (H*H + H) attention + 2 LN (4H) + H*F + F + F*H + H
 *   final LN   = 2H when final_norm
 *   head       = classifier: pooler (H*H + H if any) + H*labels + labels
 *                token_classifier: H*labels + labels
 *                masked_lm: transform H*H + H + LN 2H, decoder bias vocab (if
 *                  decoder_bias), decoder weight V*H only when not tied
 *                causal_lm: decoder weight V*H only when not tied, bias if asked
 *
 * FLOPs (multiply-add = 2 FLOPs), per token, L = train.max_seq_len:
 *   forward = 2 * (matmul weights per token) + layers * 4 * L * H
 *     matmul weights per token: every layer's 4H^2 + 2HF, the LM decoder
 *     V*H (and MLM transform H^2), token classifier H*labels; the
 *     sequence classifier's pooler and classifier run once per sequence,
 *     so they count (H^2 + H*labels) / L per token.
 *     4*L*H per layer is QK^T and PV (causal attention counted in full).
 *   train step = 3 * forward (backward = 2 * forward).
 * Embedding lookups, LayerNorm, softmax, activations and biases are not
 * counted (they are O(H) per token).
 *
 * Pure functions of the spec; no allocation.
 */
#ifndef HPC_COMPILER_SUMMARY_H
#define HPC_COMPILER_SUMMARY_H

#include <stdint.h>
#include <stdio.h>

#include "program/spec.h"

typedef struct {
    int64_t embeddings;  /* word + position + token type + embedding LN */
    int64_t per_layer;   /* one transformer layer (all layers are equal) */
    int64_t layers;      /* per_layer * stack.layers */
    int64_t final_ln;    /* pre-LN stacks' last LayerNorm */
    int64_t pooler;      /* classifier heads' pooler, or MLM transform */
    int64_t head;        /* classifier / decoder weights and biases */
    int64_t total;
} SummaryParams;

void summary_params(const ModelSpec *spec, SummaryParams *out);
int64_t summary_param_count(const ModelSpec *spec);

/* Forward FLOPs of one layer, per token, at L = max_seq_len. */
int64_t summary_layer_flops_per_token(const ModelSpec *spec);
/* Forward / training-step FLOPs per token, whole model. */
double summary_forward_flops_per_token(const ModelSpec *spec);
double summary_train_flops_per_token(const ModelSpec *spec);

/* The human-readable summary `hpc check` prints: the model, a per-part
 * parameter table, a per-layer table, FLOPs and the training settings. */
void summary_print(const ModelSpec *spec, FILE *out);

#endif
