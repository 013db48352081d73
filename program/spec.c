/* program/spec.c — ModelSpec defaults and names.  See spec.h.  The load
 * entry points are in spec_load.c (they need the parser), so a program that
 * only reads a step program links no front end. */
#include "program/spec.h"

#include <string.h>


void spec_defaults(ModelSpec *spec)
{
    memset(spec, 0, sizeof *spec);
    SpecStack *s = &spec->stack;
    s->kind = STACK_ENCODER;
    s->vocab_size = 30522;
    s->max_positions = 512;
    s->type_vocab_size = 2;
    s->position_offset = 0;
    s->hidden = 768;
    s->layers = 12;
    s->heads = 12;
    s->ffn = 3072;
    s->activation = ACT_GELU;
    s->hidden_dropout = 0.1;
    s->attention_dropout = 0.1;
    s->ln_eps = 1e-12;
    s->norm = NORM_POST;
    s->attention = ATTN_BIDIRECTIONAL;
    s->embedding_ln = true;
    s->final_ln = false;
    s->precision = PREC_DEFAULT;
    s->embedding_precision = PREC_DEFAULT;

    SpecHead *h = &spec->head;
    h->kind = HEAD_SEQ_CLASSIFICATION;
    h->num_labels = 2;
    h->regression = false;
    h->pooler = true;
    h->pooler_activation = ACT_TANH;
    h->classifier_dropout = 0.1;
    h->tie_word_embeddings = true;
    h->decoder_bias = true;
    h->precision = PREC_DEFAULT;

    /* Fine-tuning defaults of the BERT paper / HF run_glue on CoLA. */
    SpecTraining *t = &spec->train;
    t->optimizer = OPT_ADAMW;
    t->lr = 2e-5;
    t->beta1 = 0.9;
    t->beta2 = 0.999;
    t->eps = 1e-8;
    t->weight_decay = 0.01;
    t->momentum = 0.0;
    t->nesterov = false;
    t->schedule = SCHED_LINEAR;
    t->warmup_steps = 0;
    t->warmup_ratio = 0.1;
    t->min_lr_ratio = 0.0;
    /* PyTorch GradScaler's defaults. */
    t->loss_scaling = LOSS_SCALE_DYNAMIC;
    t->scale_init = 65536.0;
    t->scale_growth = 2.0;
    t->scale_backoff = 0.5;
    t->scale_interval = 2000;
    t->max_skipped_steps = 100;
    t->max_grad_norm = 1.0;
    t->batch_size = 32;
    t->grad_accum = 1;
    t->max_seq_len = 128;
    t->seed = 42;
    t->epochs = 3;
    t->steps = 0;
    t->freeze_embeddings = false;
    t->freeze_layers = 0;
    t->pack = false;
}

const char *spec_activation_name(SpecActivation a)
{
    static const char *const names[ACT_COUNT] = {
#define SPEC_ACT_NAME_(E, name, ...) #name,
        HPC_ACTIVATIONS(SPEC_ACT_NAME_)
#undef SPEC_ACT_NAME_
    };
    return a >= 0 && a < ACT_COUNT ? names[a] : "?";
}

const char *spec_head_kind_name(SpecHeadKind k)
{
    switch (k) {
    case HEAD_SEQ_CLASSIFICATION: return "classifier";
    case HEAD_TOKEN_CLASSIFICATION: return "token_classifier";
    case HEAD_MASKED_LM: return "masked_lm";
    case HEAD_CAUSAL_LM: return "causal_lm";
    }
    return "?";
}

const char *spec_optimizer_name(SpecOptimizer o)
{
    switch (o) {
    case OPT_ADAMW: return "adamw";
    case OPT_ADAM: return "adam";
    case OPT_SGD: return "sgd";
    case OPT_LAMB: return "lamb";
    }
    return "?";
}

const char *spec_schedule_name(SpecSchedule s)
{
    switch (s) {
    case SCHED_CONSTANT: return "constant";
    case SCHED_LINEAR: return "linear";
    case SCHED_COSINE: return "cosine";
    }
    return "?";
}

const char *spec_precision_name(SpecPrecision p)
{
    switch (p) {
    case PREC_DEFAULT: return "default";
    case PREC_FP32: return "fp32";
    case PREC_FP16: return "fp16";
    case PREC_BF16: return "bf16";
    }
    return "?";
}

const char *spec_stack_kind_name(SpecStackKind k)
{
    return k == STACK_DECODER ? "decoder" : "encoder";
}

const char *spec_norm_name(SpecNormPlacement n)
{
    return n == NORM_PRE ? "pre" : "post";
}

const char *spec_attention_name(SpecAttention a)
{
    return a == ATTN_CAUSAL ? "causal" : "bidirectional";
}

const char *spec_loss_scaling_name(SpecLossScaling m)
{
    switch (m) {
    case LOSS_SCALE_DYNAMIC: return "dynamic";
    case LOSS_SCALE_STATIC: return "static";
    case LOSS_SCALE_NONE: return "none";
    }
    return "?";
}
