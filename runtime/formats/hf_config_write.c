/* runtime/formats/hf_config_write.c — a ModelSpec as a transformers config.json
 * (the inverse of hf_config.c; see hf_config.h).  Each family writes the
 * field names its config class reads; every field that hf_config_parse
 * reads back is written, so export -> import gives the same architecture. */
#include "formats/hf_config.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "formats/atomic_file.h"
#include "formats/hf_names.h"

static bool fail_why(char *why, size_t cap, const char *text)
{
    if (why) snprintf(why, cap, "%s", text);
    return false;
}

/* The encoder shape every transformers encoder family here has. */
static bool post_ln_encoder(const SpecStack *s)
{
    return s->kind == STACK_ENCODER && s->norm == NORM_POST && s->attention == ATTN_BIDIRECTIONAL &&
           s->embedding_ln && !s->final_ln;
}

static bool gpt2_stack(const SpecStack *s)
{
    return s->kind == STACK_DECODER && s->norm == NORM_PRE && s->attention == ATTN_CAUSAL && !s->embedding_ln &&
           s->final_ln && s->type_vocab_size == 0 && s->position_offset == 0;
}

/* Can family `type` hold spec's stack and head?  why says what breaks. */
bool hf_config_fits(const ModelSpec *spec, const char *type, char *why, size_t cap)
{
    const SpecStack *s = &spec->stack;
    const SpecHead *h = &spec->head;
    bool gpt2 = strcmp(type, "gpt2") == 0, distil = strcmp(type, "distilbert") == 0;
    bool roberta = strcmp(type, "roberta") == 0;
    if (!hf_names_known(type)) return fail_why(why, cap, "unknown model_type (bert, roberta, distilbert, gpt2)");
    if (gpt2 != gpt2_stack(s) || (!gpt2 && !post_ln_encoder(s)))
        return fail_why(why, cap, gpt2 ? "gpt2 needs a pre-LN causal decoder without token types"
                                       : "encoder families need a post-LN bidirectional encoder with embedding LayerNorm");
    if (roberta != (s->position_offset > 0))
        return fail_why(why, cap, roberta ? "roberta needs position_offset >= 1 (pad_token_id + 1)"
                                          : "only roberta has a position offset");
    if (distil != (s->type_vocab_size == 0) && !gpt2)
        return fail_why(why, cap, distil ? "distilbert has no token type embedding" : "bert and roberta need token types");
    if (distil && s->ln_eps != 1e-12) return fail_why(why, cap, "distilbert's LayerNorm epsilon is fixed at 1e-12");
    if (h->kind == HEAD_MASKED_LM && (gpt2 || !h->decoder_bias))
        return fail_why(why, cap, "a masked-LM head needs an encoder family and a decoder bias");
    if (h->kind == HEAD_CAUSAL_LM && (!gpt2 || h->decoder_bias))
        return fail_why(why, cap, "a causal-LM head needs gpt2 and no decoder bias");
    if (h->kind == HEAD_SEQ_CLASSIFICATION && h->pooler == gpt2)
        return fail_why(why, cap, gpt2 ? "GPT2ForSequenceClassification has no pooler"
                                       : "encoder sequence classifiers have a pooler (pre_classifier)");
    if (h->kind == HEAD_SEQ_CLASSIFICATION && !gpt2 && h->pooler_activation != (distil ? ACT_RELU : ACT_TANH))
        return fail_why(why, cap, distil ? "distilbert's pre_classifier uses relu" : "bert's pooler uses tanh");
    return true;
}

const char *hf_config_family(const ModelSpec *spec, char *why, size_t cap)
{
    static const char *types[] = {"bert", "roberta", "distilbert", "gpt2"};
    const char *guess = spec->stack.kind == STACK_DECODER ? "gpt2"
                      : spec->stack.position_offset > 0 ? "roberta"
                      : spec->stack.type_vocab_size == 0 ? "distilbert" : "bert";
    for (int i = 0; i < 4; i++)
        if (strcmp(types[i], guess) == 0 && hf_config_fits(spec, guess, why, cap)) return types[i];
    return NULL;
}

static const char *act_name(SpecActivation a)
{
    static const char *const names[ACT_COUNT] = {
#define HF_ACT_NAME_(E, name, ffn, hf_name, ...) hf_name,
        HPC_ACTIVATIONS(HF_ACT_NAME_)
#undef HF_ACT_NAME_
    };
    return a >= 0 && a < ACT_COUNT ? names[a] : "?";
}

static const char *class_name(const ModelSpec *spec, const char *type, char *buf, size_t cap)
{
    const char *prefix = !strcmp(type, "bert") ? "Bert" : !strcmp(type, "roberta") ? "Roberta"
                       : !strcmp(type, "distilbert") ? "DistilBert" : "GPT2";
    switch (spec->head.kind) {
    case HEAD_SEQ_CLASSIFICATION: snprintf(buf, cap, "%sForSequenceClassification", prefix); break;
    case HEAD_TOKEN_CLASSIFICATION: snprintf(buf, cap, "%sForTokenClassification", prefix); break;
    case HEAD_MASKED_LM: snprintf(buf, cap, "%sForMaskedLM", prefix); break;
    case HEAD_CAUSAL_LM: snprintf(buf, cap, "GPT2LMHeadModel"); break;
    }
    return buf;
}

static void set_int(json_t *o, const char *k, int64_t v) { json_object_set_new(o, k, json_integer((json_int_t)v)); }
static void set_num(json_t *o, const char *k, double v) { json_object_set_new(o, k, json_real(v)); }
static void set_str(json_t *o, const char *k, const char *v) { json_object_set_new(o, k, json_string(v)); }
static void set_bool(json_t *o, const char *k, bool v) { json_object_set_new(o, k, json_boolean(v)); }

static void put_bert_like(json_t *o, const ModelSpec *spec, bool roberta)
{
    const SpecStack *s = &spec->stack;
    set_int(o, "vocab_size", s->vocab_size);
    set_int(o, "hidden_size", s->hidden);
    set_int(o, "num_hidden_layers", s->layers);
    set_int(o, "num_attention_heads", s->heads);
    set_int(o, "intermediate_size", s->ffn);
    set_str(o, "hidden_act", act_name(s->activation));
    set_num(o, "hidden_dropout_prob", s->hidden_dropout);
    set_num(o, "attention_probs_dropout_prob", s->attention_dropout);
    set_int(o, "max_position_embeddings", s->max_positions);
    set_int(o, "type_vocab_size", s->type_vocab_size);
    set_num(o, "layer_norm_eps", s->ln_eps);
    set_int(o, "pad_token_id", roberta ? s->position_offset - 1 : 0);
    if (roberta) {
        set_int(o, "bos_token_id", 0);
        set_int(o, "eos_token_id", 2);
    }
    set_str(o, "position_embedding_type", "absolute");
    set_num(o, "classifier_dropout", spec->head.classifier_dropout);
}

static void put_distilbert(json_t *o, const ModelSpec *spec)
{
    const SpecStack *s = &spec->stack;
    set_int(o, "vocab_size", s->vocab_size);
    set_int(o, "dim", s->hidden);
    set_int(o, "n_layers", s->layers);
    set_int(o, "n_heads", s->heads);
    set_int(o, "hidden_dim", s->ffn);
    set_str(o, "activation", act_name(s->activation));
    set_num(o, "dropout", s->hidden_dropout);
    set_num(o, "attention_dropout", s->attention_dropout);
    set_int(o, "max_position_embeddings", s->max_positions);
    set_bool(o, "sinusoidal_pos_embds", false);
    set_num(o, "seq_classif_dropout", spec->head.classifier_dropout);
    set_int(o, "pad_token_id", 0);
}

static void put_gpt2(json_t *o, const ModelSpec *spec)
{
    const SpecStack *s = &spec->stack;
    set_int(o, "vocab_size", s->vocab_size);
    set_int(o, "n_embd", s->hidden);
    set_int(o, "n_layer", s->layers);
    set_int(o, "n_head", s->heads);
    set_int(o, "n_inner", s->ffn);
    set_int(o, "n_positions", s->max_positions);
    set_str(o, "activation_function", act_name(s->activation));
    set_num(o, "resid_pdrop", s->hidden_dropout);
    set_num(o, "embd_pdrop", s->hidden_dropout);
    set_num(o, "attn_pdrop", s->attention_dropout);
    set_num(o, "layer_norm_epsilon", s->ln_eps);
    set_bool(o, "scale_attn_weights", true);
    set_num(o, "classifier_dropout", spec->head.classifier_dropout);
    set_int(o, "bos_token_id", s->vocab_size - 1);
    set_int(o, "eos_token_id", s->vocab_size - 1);
    if (spec->head.kind == HEAD_SEQ_CLASSIFICATION) set_int(o, "pad_token_id", 0);
}

/* num_labels, id2label/label2id ("LABEL_i", transformers' defaults), problem_type. */
static void put_labels(json_t *o, const SpecHead *h)
{
    if (h->kind != HEAD_SEQ_CLASSIFICATION && h->kind != HEAD_TOKEN_CLASSIFICATION) return;
    json_t *id2 = json_object(), *l2id = json_object();
    for (int64_t i = 0; i < h->num_labels; i++) {
        char k[24], v[40];
        snprintf(k, sizeof k, "%lld", (long long)i);
        snprintf(v, sizeof v, "LABEL_%lld", (long long)i);
        json_object_set_new(id2, k, json_string(v));
        json_object_set_new(l2id, v, json_integer((json_int_t)i));
    }
    json_object_set_new(o, "id2label", id2);
    json_object_set_new(o, "label2id", l2id);
    set_int(o, "num_labels", h->num_labels);
    if (h->kind == HEAD_SEQ_CLASSIFICATION)
        set_str(o, "problem_type", h->regression ? "regression" : "single_label_classification");
}

HpcStatus hf_config_write(const ModelSpec *spec, const char *model_type, const char *path, HpcError *err)
{
    char why[160], arch[64];
    if (!hf_config_fits(spec, model_type, why, sizeof why))
        return hpc_fail(err, HPC_ERR_USAGE, "hf_config_write: model %s cannot be written as a %s config: %s",
                        spec->name, model_type, why);
    json_t *o = json_object();
    json_t *archs = json_array();
    json_array_append_new(archs, json_string(class_name(spec, model_type, arch, sizeof arch)));
    json_object_set_new(o, "architectures", archs);
    set_str(o, "model_type", model_type);
    if (!strcmp(model_type, "gpt2")) put_gpt2(o, spec);
    else if (!strcmp(model_type, "distilbert")) put_distilbert(o, spec);
    else put_bert_like(o, spec, !strcmp(model_type, "roberta"));
    put_labels(o, &spec->head);
    if (spec->head.kind == HEAD_MASKED_LM || spec->head.kind == HEAD_CAUSAL_LM)
        set_bool(o, "tie_word_embeddings", spec->head.tie_word_embeddings);
    set_str(o, "torch_dtype", "float32");
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
    json_decref(o);
    if (!text) return hpc_fail(err, HPC_ERR_OOM, "hf_config_write: out of memory");
    size_t n = strlen(text);
    char *buf = xmalloc(n + 2);
    memcpy(buf, text, n);
    buf[n] = '\n';
    free(text);
    HpcStatus st = atomic_write_file(path, buf, n + 1, err);
    free(buf);
    return st;
}
