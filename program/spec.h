/* program/spec.h — ModelSpec: one checked, fully defaulted model description.
 *
 * The front end (grammar/ + compiler/check.c, entered through
 * compiler/spec_load.h) turns a .model file into a ModelSpec; every later stage (lower, precision, training, the runtime)
 * reads only this struct, never the AST.  All sizes are int64_t and were
 * range-checked by the checker (limits in compiler/check_keys.c and docs/language.md), so later
 * stages may multiply them without overflow checks of their own.
 *
 * A ModelSpec owns no heap memory: copy it by value, no free needed.
 *
 * This header is part of the step program (program/): the runtime reads a
 * ModelSpec's sizes and training settings; reading one from .model text is
 * the compiler's (compiler/spec_load.h).
 *
 * Usage:
 *   ModelSpec spec;
 *   if (spec_load("models/bert_base.model", &spec, stderr) != 0) return 1;   // compiler/spec_load.h
 */
#ifndef HPC_PROGRAM_SPEC_H
#define HPC_PROGRAM_SPEC_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "program/activations.h"
#include "dtype.h"

typedef enum { STACK_ENCODER, STACK_DECODER } SpecStackKind;
/* The activations, one per row of program/activations.h (the same order as
 * IrActKind, so lowering maps one to the other by value). */
typedef enum {
#define SPEC_ACT_ENUM_(E, ...) ACT_##E,
    HPC_ACTIVATIONS(SPEC_ACT_ENUM_)
#undef SPEC_ACT_ENUM_
    ACT_COUNT
} SpecActivation;
typedef enum { NORM_POST, NORM_PRE } SpecNormPlacement; /* post: BERT; pre: GPT-2 */
typedef enum { ATTN_BIDIRECTIONAL, ATTN_CAUSAL } SpecAttention;
typedef enum {
    HEAD_SEQ_CLASSIFICATION,   /* pooler (optional) + linear to labels, or regression */
    HEAD_TOKEN_CLASSIFICATION, /* linear to labels at every position */
    HEAD_MASKED_LM,            /* transform (dense+act+LN) + decoder tied to word embeddings */
    HEAD_CAUSAL_LM,            /* final LN lives in the stack; decoder tied to word embeddings */
} SpecHeadKind;
typedef enum { OPT_ADAMW, OPT_ADAM, OPT_SGD, OPT_LAMB } SpecOptimizer;
typedef enum { SCHED_CONSTANT, SCHED_LINEAR, SCHED_COSINE } SpecSchedule;
typedef enum { LOSS_SCALE_DYNAMIC, LOSS_SCALE_STATIC, LOSS_SCALE_NONE } SpecLossScaling;
/* SpecPrecision (PREC_DEFAULT: follow the run's policy) is in util/dtype.h. */

typedef struct {
    SpecStackKind kind;
    int64_t vocab_size;      /* word embedding rows */
    int64_t max_positions;   /* learned position embedding rows */
    int64_t type_vocab_size; /* token type rows; 0 = no token type embedding */
    int64_t position_offset; /* first position id (RoBERTa: padding_idx + 1 = 2) */
    int64_t hidden;
    int64_t layers;
    int64_t heads;           /* hidden % heads == 0 */
    int64_t ffn;             /* intermediate size */
    SpecActivation activation; /* FFN activation: a row of activations.h with ffn = 1 */
    double hidden_dropout;   /* embeddings, attention output, FFN output */
    double attention_dropout;/* on the attention probabilities */
    double ln_eps;
    SpecNormPlacement norm;
    SpecAttention attention;
    bool embedding_ln;       /* LayerNorm after the embedding sum (BERT: yes, GPT-2: no) */
    bool final_ln;           /* LayerNorm after the last layer (pre-LN stacks) */
    SpecPrecision precision; /* pin for the whole stack */
    SpecPrecision embedding_precision; /* pin for the embeddings */
} SpecStack;

typedef struct {
    SpecHeadKind kind;
    int64_t num_labels;      /* classification; 1 with regression */
    bool regression;         /* sequence regression with MSE loss (STS-B) */
    bool pooler;             /* seq classification: dense H->H + activation on the first token */
    SpecActivation pooler_activation; /* ACT_TANH (BERT, RoBERTa) or ACT_RELU (DistilBERT) */
    double classifier_dropout; /* dropout before the classifier */
    bool tie_word_embeddings;  /* LM heads: decoder weight is the word embedding */
    bool decoder_bias;       /* MLM: a bias of vocab_size on the decoder (BERT: yes, GPT-2: no) */
    SpecPrecision precision; /* pin, e.g. keep the classifier in fp32 */
} SpecHead;

typedef struct {
    SpecOptimizer optimizer;
    double lr;
    double beta1, beta2, eps;  /* adam, adamw, lamb */
    double weight_decay;       /* decoupled for adamw and lamb, L2 for adam and sgd */
    double momentum;           /* sgd */
    bool nesterov;             /* sgd */
    SpecSchedule schedule;
    int64_t warmup_steps;      /* if both warmup fields are 0, no warmup */
    double warmup_ratio;       /* fraction of total steps; used when warmup_steps == 0 */
    double min_lr_ratio;       /* cosine floor as a fraction of lr */
    SpecLossScaling loss_scaling;
    double scale_init;         /* dynamic: 65536; static: the scale */
    double scale_growth;       /* 2.0 */
    double scale_backoff;      /* 0.5 */
    int64_t scale_interval;    /* 2000 consecutive finite steps before growth */
    int64_t max_skipped_steps; /* consecutive skipped steps before hpc gives up */
    double max_grad_norm;      /* 0 = no clipping */
    int64_t batch_size;
    int64_t grad_accum;        /* micro-batches per optimizer step, >= 1 */
    int64_t max_seq_len;
    uint64_t seed;
    int64_t epochs;            /* exactly one of epochs, steps is > 0 */
    int64_t steps;
    bool freeze_embeddings;
    int64_t freeze_layers;     /* the first N layers get no update */
    bool pack;                 /* packed batches, no padding (docs/packing.md) */
} SpecTraining;

typedef struct {
    char name[64];
    char source[256];          /* file the model was read from */
    SpecStack stack;
    SpecHead head;
    SpecTraining train;
} ModelSpec;

/* Fills every field with the documented default (a BERT-base-like encoder
 * with a 2-label sequence classifier and AdamW); the checker starts here. */
void spec_defaults(ModelSpec *spec);

/* Writes spec as .model source ("model NAME { ... }", every field
 * explicit): spec_load of the text gives back an equal spec (not the
 * source file name).  Used for artifacts, imports and checkpoints. */
void spec_write(const ModelSpec *spec, FILE *out);

/* Names for printing and for the artifact ("gelu", "adamw", ...). */
const char *spec_activation_name(SpecActivation a);
const char *spec_head_kind_name(SpecHeadKind k);
const char *spec_optimizer_name(SpecOptimizer o);
const char *spec_schedule_name(SpecSchedule s);
const char *spec_precision_name(SpecPrecision p);
const char *spec_stack_kind_name(SpecStackKind k);      /* "encoder", "decoder" */
const char *spec_norm_name(SpecNormPlacement n);       /* "post", "pre" */
const char *spec_attention_name(SpecAttention a);      /* "bidirectional", "causal" */
const char *spec_loss_scaling_name(SpecLossScaling m); /* "dynamic", "static", "none" */

#endif
