/* runtime/formats/hf_config.c — see hf_config.h.
 *
 * One reader per model family fills the stack from that family's field
 * names; the head comes from "architectures" and is shared.  Defaults are
 * the transformers config classes' own (BertConfig, RobertaConfig,
 * DistilBertConfig, GPT2Config), because a config.json may omit any field
 * that equals its class default.
 */
#include "formats/hf_config.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    const char *file;       /* for messages */
    json_t *root;
    HfConfigInfo *info;
    HpcError *err;
} Cfg;

/* The language's limits (docs/language.md), so that an import either fails
 * here with the config's field name or produces a file that loads. */
#define MAX_VOCAB ((int64_t)1 << 24)
#define MAX_POSITIONS ((int64_t)1 << 20)
#define MAX_HIDDEN 65536
#define MAX_LAYERS 1024
#define MAX_FFN ((int64_t)1 << 20)
#define MAX_TOKEN_TYPES 1024
#define MAX_OFFSET 1024

static void note(Cfg *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void note(Cfg *c, const char *fmt, ...)
{
    if (c->info->n_notes >= HF_MAX_NOTES) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->info->notes[c->info->n_notes++], sizeof c->info->notes[0], fmt, ap);
    va_end(ap);
}

static const char *json_kind(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "?";
}

/* The field, or NULL when absent or null (both mean "class default"). */
static json_t *field(const Cfg *c, const char *key)
{
    json_t *v = json_object_get(c->root, key);
    return v && !json_is_null(v) ? v : NULL;
}

static HpcStatus cfg_int(Cfg *c, const char *key, int64_t dflt, int64_t lo, int64_t hi, int64_t *out)
{
    json_t *v = field(c, key);
    if (!v) {
        *out = dflt;
        return HPC_OK;
    }
    if (!json_is_integer(v))
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"%s\" must be an integer, found %s", c->file, key,
                        json_kind(v));
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"%s\" = %lld is outside the range hpc supports [%lld, %lld]",
                        c->file, key, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return HPC_OK;
}

static HpcStatus cfg_num(Cfg *c, const char *key, double dflt, double *out)
{
    json_t *v = field(c, key);
    *out = dflt;
    if (v && !json_is_number(v))
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"%s\" must be a number, found %s", c->file, key,
                        json_kind(v));
    if (v) *out = json_number_value(v);
    return HPC_OK;
}

/* A probability of dropping: [0, 1). */
static HpcStatus cfg_dropout(Cfg *c, const char *key, double dflt, double *out)
{
    HpcStatus st = cfg_num(c, key, dflt, out);
    if (!st && !(*out >= 0 && *out < 1))
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"%s\" = %g must be in [0, 1)", c->file, key, *out);
    return st;
}

/* A LayerNorm epsilon: (0, 1). */
static HpcStatus cfg_eps(Cfg *c, const char *key, double dflt, double *out)
{
    HpcStatus st = cfg_num(c, key, dflt, out);
    if (!st && !(*out > 0 && *out < 1))
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"%s\" = %g must be in (0, 1)", c->file, key, *out);
    return st;
}

static HpcStatus cfg_bool(Cfg *c, const char *key, bool dflt, bool *out)
{
    json_t *v = field(c, key);
    if (!v) {
        *out = dflt;
        return HPC_OK;
    }
    if (!json_is_boolean(v))
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"%s\" must be true or false, found %s", c->file, key,
                        json_kind(v));
    *out = json_is_true(v);
    return HPC_OK;
}

static HpcStatus cfg_str(Cfg *c, const char *key, const char *dflt, const char **out)
{
    json_t *v = field(c, key);
    if (!v) {
        *out = dflt;
        return HPC_OK;
    }
    if (!json_is_string(v))
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"%s\" must be a string, found %s", c->file, key,
                        json_kind(v));
    *out = json_string_value(v);
    return HPC_OK;
}

/* transformers' ACT2FN names that hpc computes exactly.  gelu_new,
 * gelu_fast and gelu_pytorch_tanh are all the tanh approximation. */
static HpcStatus cfg_activation(Cfg *c, const char *key, const char *dflt, SpecActivation *out)
{
    const char *name;
    HpcStatus st = cfg_str(c, key, dflt, &name);
    if (st) return st;
    if (strcmp(name, "gelu") == 0) *out = ACT_GELU;
    else if (!strcmp(name, "gelu_new") || !strcmp(name, "gelu_fast") || !strcmp(name, "gelu_pytorch_tanh"))
        *out = ACT_GELU_TANH;
    else {
        /* Any other FFN activation under its own Hugging Face name (program/activations.h). */
#define HF_ACT_(E, nm, ffn, hf_name, ...) if (ffn && strcmp(name, hf_name) == 0) { *out = ACT_##E; return HPC_OK; }
        HPC_ACTIVATIONS(HF_ACT_)
#undef HF_ACT_
#define HF_IF_1(...) __VA_ARGS__
#define HF_IF_0(...)
#define HF_LIST_(E, nm, ffn, hf_name, ...) HF_IF_##ffn(", " hf_name)
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"%s\" = \"%.40s\" is not supported by hpc "
                        "(supported: gelu_fast, gelu_pytorch_tanh" HPC_ACTIVATIONS(HF_LIST_) ")",
                        c->file, key, name);
#undef HF_LIST_
    }
    return HPC_OK;
}

static HpcStatus check_heads(Cfg *c, const SpecStack *s, const char *hidden_key, const char *heads_key)
{
    if (s->hidden % s->heads != 0)
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"%s\" = %lld is not a multiple of \"%s\" = %lld",
                        c->file, hidden_key, (long long)s->hidden, heads_key, (long long)s->heads);
    return HPC_OK;
}

static HpcStatus forbid_true(Cfg *c, const char *key, const char *what)
{
    bool v = false;
    HpcStatus st = cfg_bool(c, key, false, &v);
    if (!st && v)
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"%s\" is true: %s is not supported by hpc", c->file, key, what);
    return st;
}

/* ------------------------------------------------------------------ */
/* Stacks                                                               */

/* BERT and RoBERTa share BertConfig's field names and defaults. */
static HpcStatus read_bert_like(Cfg *c, ModelSpec *spec, bool roberta)
{
    SpecStack *s = &spec->stack;
    const char *pos_type;
    int64_t pad;
    HpcStatus st = HPC_OK;
    s->kind = STACK_ENCODER;
    s->norm = NORM_POST;
    s->attention = ATTN_BIDIRECTIONAL;
    s->embedding_ln = true;
    s->final_ln = false;
    if (!st) st = cfg_int(c, "vocab_size", roberta ? 50265 : 30522, 1, MAX_VOCAB, &s->vocab_size);
    if (!st) st = cfg_int(c, "hidden_size", 768, 1, MAX_HIDDEN, &s->hidden);
    if (!st) st = cfg_int(c, "num_hidden_layers", 12, 1, MAX_LAYERS, &s->layers);
    if (!st) st = cfg_int(c, "num_attention_heads", 12, 1, MAX_LAYERS, &s->heads);
    if (!st) st = cfg_int(c, "intermediate_size", 3072, 1, MAX_FFN, &s->ffn);
    if (!st) st = cfg_activation(c, "hidden_act", "gelu", &s->activation);
    if (!st) st = cfg_dropout(c, "hidden_dropout_prob", 0.1, &s->hidden_dropout);
    if (!st) st = cfg_dropout(c, "attention_probs_dropout_prob", 0.1, &s->attention_dropout);
    if (!st) st = cfg_int(c, "max_position_embeddings", 512, 1, MAX_POSITIONS, &s->max_positions);
    if (!st) st = cfg_int(c, "type_vocab_size", 2, 0, MAX_TOKEN_TYPES, &s->type_vocab_size);
    if (!st) st = cfg_eps(c, "layer_norm_eps", 1e-12, &s->ln_eps);
    if (!st) st = cfg_int(c, "pad_token_id", roberta ? 1 : 0, 0, MAX_VOCAB, &pad);
    if (!st) st = cfg_str(c, "position_embedding_type", "absolute", &pos_type);
    if (!st) st = forbid_true(c, "is_decoder", "a BERT-style decoder (causal BERT/RoBERTa)");
    if (!st) st = forbid_true(c, "add_cross_attention", "cross-attention");
    if (st) return st;
    if (strcmp(pos_type, "absolute") != 0)
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"position_embedding_type\" = \"%.40s\": only absolute "
                        "position embeddings are supported by hpc", c->file, pos_type);
    /* RoBERTa numbers positions from padding_idx + 1, so its table has
     * max_position_embeddings rows of which the first pad + 1 are unused. */
    s->position_offset = roberta ? pad + 1 : 0;
    if (s->position_offset >= s->max_positions || s->position_offset > MAX_OFFSET)
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"pad_token_id\" = %lld leaves no positions of the %lld in "
                        "\"max_position_embeddings\"", c->file, (long long)pad, (long long)s->max_positions);
    return check_heads(c, s, "hidden_size", "num_attention_heads");
}

static HpcStatus read_bert(Cfg *c, ModelSpec *spec) { return read_bert_like(c, spec, false); }
static HpcStatus read_roberta(Cfg *c, ModelSpec *spec) { return read_bert_like(c, spec, true); }

static HpcStatus read_distilbert(Cfg *c, ModelSpec *spec)
{
    SpecStack *s = &spec->stack;
    bool sinusoidal;
    HpcStatus st = HPC_OK;
    s->kind = STACK_ENCODER;
    s->norm = NORM_POST;
    s->attention = ATTN_BIDIRECTIONAL;
    s->embedding_ln = true;
    s->final_ln = false;
    s->type_vocab_size = 0;
    s->position_offset = 0;
    s->ln_eps = 1e-12;   /* fixed in DistilBERT's modeling code, not in the config */
    if (!st) st = cfg_int(c, "vocab_size", 30522, 1, MAX_VOCAB, &s->vocab_size);
    if (!st) st = cfg_int(c, "dim", 768, 1, MAX_HIDDEN, &s->hidden);
    if (!st) st = cfg_int(c, "n_layers", 6, 1, MAX_LAYERS, &s->layers);
    if (!st) st = cfg_int(c, "n_heads", 12, 1, MAX_LAYERS, &s->heads);
    if (!st) st = cfg_int(c, "hidden_dim", 3072, 1, MAX_FFN, &s->ffn);
    if (!st) st = cfg_activation(c, "activation", "gelu", &s->activation);
    if (!st) st = cfg_dropout(c, "dropout", 0.1, &s->hidden_dropout);
    if (!st) st = cfg_dropout(c, "attention_dropout", 0.1, &s->attention_dropout);
    if (!st) st = cfg_int(c, "max_position_embeddings", 512, 1, MAX_POSITIONS, &s->max_positions);
    if (!st) st = cfg_bool(c, "sinusoidal_pos_embds", false, &sinusoidal);
    if (st) return st;
    if (sinusoidal)
        note(c, "sinusoidal_pos_embds: the fixed sinusoidal position table is imported as a learned "
                "embedding; set freeze_embeddings to keep it fixed as transformers does");
    return check_heads(c, s, "dim", "n_heads");
}

static HpcStatus read_gpt2(Cfg *c, ModelSpec *spec)
{
    SpecStack *s = &spec->stack;
    double embd_pdrop;
    HpcStatus st = HPC_OK;
    s->kind = STACK_DECODER;
    s->norm = NORM_PRE;
    s->attention = ATTN_CAUSAL;
    s->embedding_ln = false;
    s->final_ln = true;
    s->type_vocab_size = 0;
    s->position_offset = 0;
    if (!st) st = cfg_int(c, "vocab_size", 50257, 1, MAX_VOCAB, &s->vocab_size);
    if (!st) st = cfg_int(c, "n_embd", 768, 1, MAX_HIDDEN, &s->hidden);
    if (!st) st = cfg_int(c, "n_layer", 12, 1, MAX_LAYERS, &s->layers);
    if (!st) st = cfg_int(c, "n_head", 12, 1, MAX_LAYERS, &s->heads);
    /* n_inner: null means 4 * n_embd. */
    if (!st) st = cfg_int(c, "n_inner", 4 * s->hidden, 1, MAX_FFN, &s->ffn);
    if (!st) st = cfg_int(c, "n_positions", 1024, 1, MAX_POSITIONS, &s->max_positions);
    if (!st) st = cfg_activation(c, "activation_function", "gelu_new", &s->activation);
    if (!st) st = cfg_dropout(c, "resid_pdrop", 0.1, &s->hidden_dropout);
    if (!st) st = cfg_dropout(c, "embd_pdrop", 0.1, &embd_pdrop);
    if (!st) st = cfg_dropout(c, "attn_pdrop", 0.1, &s->attention_dropout);
    if (!st) st = cfg_eps(c, "layer_norm_epsilon", 1e-5, &s->ln_eps);
    if (!st) st = forbid_true(c, "scale_attn_by_inverse_layer_idx", "attention scaled by 1/layer");
    if (!st) st = forbid_true(c, "add_cross_attention", "cross-attention");
    if (st) return st;
    bool scale_attn;
    st = cfg_bool(c, "scale_attn_weights", true, &scale_attn);
    if (!st && !scale_attn)
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"scale_attn_weights\" is false: unscaled attention is not "
                        "supported by hpc", c->file);
    if (embd_pdrop != s->hidden_dropout)
        note(c, "embd_pdrop = %g differs from resid_pdrop = %g; hpc uses one hidden dropout (%g) for both",
             embd_pdrop, s->hidden_dropout, s->hidden_dropout);
    return st ? st : check_heads(c, s, "n_embd", "n_head");
}

/* ------------------------------------------------------------------ */
/* Families and heads                                                   */

typedef enum { FAM_BERT, FAM_ROBERTA, FAM_DISTILBERT, FAM_GPT2 } Family;

static const struct {
    const char *model_type;
    const char *class_prefix;   /* "Bert" in "BertForMaskedLM" */
    HpcStatus (*read)(Cfg *, ModelSpec *);
    SpecHeadKind bare_head;     /* head for a bare "...Model" checkpoint */
} families[] = {
    [FAM_BERT] = {"bert", "Bert", read_bert, HEAD_SEQ_CLASSIFICATION},
    [FAM_ROBERTA] = {"roberta", "Roberta", read_roberta, HEAD_SEQ_CLASSIFICATION},
    [FAM_DISTILBERT] = {"distilbert", "DistilBert", read_distilbert, HEAD_SEQ_CLASSIFICATION},
    [FAM_GPT2] = {"gpt2", "GPT2", read_gpt2, HEAD_CAUSAL_LM},
};

static bool ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* "BertModel" for prefix "Bert": the base model, no task head. */
static bool is_bare_model(const char *arch, const char *prefix)
{
    size_t n = strlen(prefix);
    return strncmp(arch, prefix, n) == 0 && strcmp(arch + n, "Model") == 0;
}

static bool parse_head_name(const char *name, SpecHeadKind *out)
{
    static const char *names[] = {"classifier", "token_classifier", "masked_lm", "causal_lm"};
    static const SpecHeadKind kinds[] = {HEAD_SEQ_CLASSIFICATION, HEAD_TOKEN_CLASSIFICATION, HEAD_MASKED_LM,
                                         HEAD_CAUSAL_LM};
    for (int i = 0; i < 4; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = kinds[i];
            return true;
        }
    return false;
}

/* The head kind from "architectures", or the family's default for a bare
 * model; an override from the command line wins. */
static HpcStatus pick_head(Cfg *c, Family fam, const HfImportOptions *opt, SpecHeadKind *kind)
{
    if (opt && opt->head) {
        if (!parse_head_name(opt->head, kind))
            return hpc_fail(c->err, HPC_ERR_USAGE, "--head %s: unknown head (use classifier, token_classifier, "
                            "masked_lm or causal_lm)", opt->head);
        if (*kind == HEAD_CAUSAL_LM && fam != FAM_GPT2)   /* the spec check: causal attention only */
            return hpc_fail(c->err, HPC_ERR_USAGE, "--head causal_lm: %s is a %s encoder, whose attention is "
                            "bidirectional; a causal LM head needs a causal decoder (gpt2); use classifier, "
                            "token_classifier or masked_lm", c->file, families[fam].model_type);
        return HPC_OK;
    }
    const char *arch = c->info->architecture;
    *kind = families[fam].bare_head;
    if (!*arch) return HPC_OK;
    if (ends_with(arch, "ForSequenceClassification")) *kind = HEAD_SEQ_CLASSIFICATION;
    else if (ends_with(arch, "ForTokenClassification")) *kind = HEAD_TOKEN_CLASSIFICATION;
    else if (ends_with(arch, "ForMaskedLM")) *kind = HEAD_MASKED_LM;
    else if (ends_with(arch, "ForPreTraining")) {
        *kind = HEAD_MASKED_LM;
        note(c, "%s: the next-sentence head is dropped; the masked-LM head is kept", arch);
    } else if (strcmp(arch, "GPT2LMHeadModel") == 0) *kind = HEAD_CAUSAL_LM;
    else if (strcmp(arch, "GPT2DoubleHeadsModel") == 0) {
        *kind = HEAD_CAUSAL_LM;
        note(c, "%s: the multiple-choice head is dropped; the LM head is kept", arch);
    } else if (is_bare_model(arch, families[fam].class_prefix)) {
        note(c, "%s has no task head; a new %s head is added (choose another with --head)", arch,
             spec_head_kind_name(*kind));
    } else
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: architecture \"%.60s\" is not supported by hpc (supported: "
                        "...ForSequenceClassification, ...ForTokenClassification, ...ForMaskedLM, "
                        "...ForPreTraining, GPT2LMHeadModel, and bare ...Model); pass --head to choose one",
                        c->file, arch);
    return HPC_OK;
}

/* id2label {"0": "NEGATIVE", "1": "POSITIVE"}: the keys must be 0..n-1. */
static HpcStatus read_labels(Cfg *c, int64_t *count)
{
    json_t *map = field(c, "id2label");
    *count = 0;
    if (!map) return HPC_OK;
    if (!json_is_object(map))
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"id2label\" must be an object, found %s", c->file,
                        json_kind(map));
    int64_t n = (int64_t)json_object_size(map);
    bool keep = n <= HF_MAX_LABELS;
    for (int64_t i = 0; i < n; i++) {
        char key[24];
        snprintf(key, sizeof key, "%lld", (long long)i);
        json_t *v = json_object_get(map, key);
        if (!v || !json_is_string(v))
            return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"id2label\" has %lld entries but no string for id \"%s\"",
                            c->file, (long long)n, key);
        if (keep) snprintf(c->info->labels[i], sizeof c->info->labels[0], "%s", json_string_value(v));
    }
    c->info->n_labels = keep ? (int)n : 0;
    *count = n;
    return HPC_OK;
}

static HpcStatus read_num_labels(Cfg *c, const HfImportOptions *opt, SpecHead *h)
{
    int64_t from_map, n;
    HpcStatus st = read_labels(c, &from_map);
    if (!st) st = cfg_int(c, "num_labels", from_map ? from_map : 2, 1, 1 << 20, &n);
    if (st) return st;
    if (from_map) n = from_map;   /* transformers derives num_labels from id2label */
    if (opt && opt->num_labels > 0) n = opt->num_labels;
    const char *problem;
    st = cfg_str(c, "problem_type", "", &problem);
    if (st) return st;
    if (strcmp(problem, "multi_label_classification") == 0)
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"problem_type\" = \"multi_label_classification\" is not "
                        "supported by hpc (single-label classification and regression are)", c->file);
    h->regression = h->kind == HEAD_SEQ_CLASSIFICATION &&
                    (strcmp(problem, "regression") == 0 || (!*problem && n == 1));
    h->num_labels = h->regression ? 1 : n;
    return HPC_OK;
}

/* Dropout before the classifier, as each transformers head class picks it. */
static HpcStatus read_classifier_dropout(Cfg *c, Family fam, ModelSpec *spec)
{
    SpecHead *h = &spec->head;
    bool seq = h->kind == HEAD_SEQ_CLASSIFICATION;
    switch (fam) {
    case FAM_BERT:
    case FAM_ROBERTA:
        return cfg_dropout(c, "classifier_dropout", spec->stack.hidden_dropout, &h->classifier_dropout);
    case FAM_DISTILBERT:
        return seq ? cfg_dropout(c, "seq_classif_dropout", 0.2, &h->classifier_dropout)
                   : cfg_dropout(c, "dropout", 0.1, &h->classifier_dropout);
    case FAM_GPT2:
        if (seq) {
            h->classifier_dropout = 0.0;   /* GPT2ForSequenceClassification has none */
            return HPC_OK;
        }
        return cfg_dropout(c, "classifier_dropout", 0.1, &h->classifier_dropout);
    }
    return HPC_OK;
}

/* The head fields a `head KIND { }` block starts from when KIND is not the
 * default form (compiler/check_keys.c, head_defaults): the imported spec
 * must equal what spec_load makes of the written file. */
static void head_form_defaults(SpecHead *h, SpecHeadKind kind, bool regression)
{
    if (kind == HEAD_SEQ_CLASSIFICATION && !regression) return;   /* spec_defaults' form */
    SpecPrecision prec = h->precision;
    memset(h, 0, sizeof *h);
    h->kind = kind;
    h->regression = regression;
    h->num_labels = regression ? 1 : kind == HEAD_TOKEN_CLASSIFICATION ? 2 : 0;
    h->pooler = kind == HEAD_SEQ_CLASSIFICATION;
    h->pooler_activation = ACT_TANH;
    h->classifier_dropout = 0.1;
    h->tie_word_embeddings = true;
    h->decoder_bias = kind == HEAD_MASKED_LM;
    h->precision = prec;
}

static HpcStatus read_head(Cfg *c, Family fam, const HfImportOptions *opt, ModelSpec *spec)
{
    SpecHead *h = &spec->head;
    SpecHeadKind kind = HEAD_SEQ_CLASSIFICATION;
    HpcStatus st = pick_head(c, fam, opt, &kind);
    if (st) return st;
    SpecHead got = *h;
    got.kind = kind;
    switch (kind) {
    case HEAD_SEQ_CLASSIFICATION:
    case HEAD_TOKEN_CLASSIFICATION:
        st = read_num_labels(c, opt, &got);
        if (!st) {
            head_form_defaults(h, kind, got.regression);
            h->kind = kind;
            h->regression = got.regression;
            h->num_labels = got.num_labels;
            st = read_classifier_dropout(c, fam, spec);
        }
        /* BERT: pooler (dense + tanh); RoBERTa: classification head dense +
         * tanh; DistilBERT: pre_classifier + ReLU; GPT-2: none (last token). */
        if (kind == HEAD_SEQ_CLASSIFICATION) {
            h->pooler = fam != FAM_GPT2;
            h->pooler_activation = fam == FAM_DISTILBERT ? ACT_RELU : ACT_TANH;
        }
        /* The token read needs no setting: compiler/lower.c pools the last
         * token with attention_mask 1 under causal attention (GPT-2), the
         * first otherwise, as transformers does. */
        return st;
    case HEAD_MASKED_LM:
    case HEAD_CAUSAL_LM:
        head_form_defaults(h, kind, false);
        h->decoder_bias = fam != FAM_GPT2;
        return cfg_bool(c, "tie_word_embeddings", true, &h->tie_word_embeddings);
    }
    return HPC_OK;
}

/* ------------------------------------------------------------------ */
/* Entry points                                                         */

static HpcStatus read_identity(Cfg *c, Family *fam)
{
    const char *type;
    HpcStatus st = cfg_str(c, "model_type", "", &type);
    if (st) return st;
    if (!*type)
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: no \"model_type\"; is this a transformers config.json?", c->file);
    snprintf(c->info->model_type, sizeof c->info->model_type, "%s", type);
    int i = 0;
    for (; i < (int)(sizeof families / sizeof families[0]); i++)
        if (strcmp(type, families[i].model_type) == 0) break;
    if (i == (int)(sizeof families / sizeof families[0]))
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: model_type \"%.40s\" is not supported by hpc import "
                        "(supported: bert, roberta, distilbert, gpt2)", c->file, type);
    *fam = (Family)i;
    json_t *arch = field(c, "architectures");
    if (arch && !(json_is_array(arch) && json_array_size(arch) > 0 && json_is_string(json_array_get(arch, 0))))
        return hpc_fail(c->err, HPC_ERR_INPUT, "%s: \"architectures\" must be a list of class names", c->file);
    if (arch) {
        snprintf(c->info->architecture, sizeof c->info->architecture, "%s", json_string_value(json_array_get(arch, 0)));
        if (json_array_size(arch) > 1)
            note(c, "\"architectures\" lists %zu classes; the first, %s, is used", json_array_size(arch),
                 c->info->architecture);
    }
    const char *dtype;
    st = cfg_str(c, "torch_dtype", "", &dtype);      /* "dtype" in newer transformers */
    if (!st && !*dtype) st = cfg_str(c, "dtype", "", &dtype);
    if (!st) snprintf(c->info->torch_dtype, sizeof c->info->torch_dtype, "%s", dtype);
    return st;
}

HpcStatus hf_config_parse(const char *text, size_t len, const char *name, const HfImportOptions *opt,
                          ModelSpec *spec, HfConfigInfo *info, HpcError *err)
{
    spec_defaults(spec);
    memset(info, 0, sizeof *info);
    snprintf(spec->source, sizeof spec->source, "%s", name);
    json_error_t jerr;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return hpc_fail(err, HPC_ERR_INPUT, "%s:%d:%d: not valid JSON: %s", name, jerr.line, jerr.column, jerr.text);
    Cfg c = {name, root, info, err};
    Family fam = FAM_BERT;
    HpcStatus st = json_is_object(root) ? HPC_OK
                 : hpc_fail(err, HPC_ERR_INPUT, "%s: a config.json must hold a JSON object", name);
    if (!st) st = read_identity(&c, &fam);
    if (!st) st = families[fam].read(&c, spec);
    if (!st) st = read_head(&c, fam, opt, spec);
    json_decref(root);
    if (st) return st;
    int64_t usable = spec->stack.max_positions - spec->stack.position_offset;
    if (spec->train.max_seq_len > usable) spec->train.max_seq_len = usable;
    return HPC_OK;
}

/* The directory above config.json names the model: "hub/bert-base-uncased/config.json". */
static void name_from_path(const char *path, char *out, size_t cap)
{
    const char *end = strrchr(path, '/');
    if (!end) {
        hf_model_name("imported", out, cap);
        return;
    }
    const char *start = end;
    while (start > path && start[-1] != '/') start--;
    char dir[256];
    size_t n = (size_t)(end - start) < sizeof dir - 1 ? (size_t)(end - start) : sizeof dir - 1;
    memcpy(dir, start, n);
    dir[n] = '\0';
    hf_model_name(n && strcmp(dir, ".") && strcmp(dir, "..") ? dir : "imported", out, cap);
}

HpcStatus hf_config_load(const char *path, const HfImportOptions *opt, ModelSpec *spec,
                         HfConfigInfo *info, HpcError *err)
{
    FILE *fp = fopen(path, "rb");
    if (!fp) return hpc_fail(err, HPC_ERR_INPUT, "open %s: %m", path);
    char *buf = NULL;
    size_t len = 0, cap = 0;
    for (;;) {
        if (len + 4096 > cap) {
            cap = cap ? 2 * cap : 65536;
            if (cap > ((size_t)64 << 20)) {
                fclose(fp);
                free(buf);
                return hpc_fail(err, HPC_ERR_INPUT, "%s: larger than 64 MiB; not a config.json", path);
            }
            buf = xrealloc(buf, cap);
        }
        size_t got = fread(buf + len, 1, cap - len, fp);
        len += got;
        if (got == 0) break;
    }
    bool bad = ferror(fp);
    fclose(fp);
    HpcStatus st = bad ? hpc_fail(err, HPC_ERR_IO, "read %s: I/O error", path)
                       : hf_config_parse(buf, len, path, opt, spec, info, err);
    free(buf);
    if (!st) name_from_path(path, spec->name, sizeof spec->name);
    return st;
}

void hf_model_name(const char *text, char *out, size_t cap)
{
    size_t n = 0;
    if (cap < 2) return;
    if (!(text[0] >= 'A' && text[0] <= 'Z') && !(text[0] >= 'a' && text[0] <= 'z') && text[0] != '_')
        out[n++] = 'm';
    for (const char *p = text; *p && n + 1 < cap; p++) {
        char ch = *p;
        bool ok = (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_';
        out[n++] = ok ? ch : '_';
    }
    out[n] = '\0';
    /* The language's keywords cannot name a model. */
    if ((strcmp(out, "model") == 0 || strcmp(out, "extends") == 0) && n + 3 < cap) strcat(out, "_hf");
}

/* ------------------------------------------------------------------ */
/* Writing a .model file                                                */

/* Comments must be ASCII (the scanner rejects other bytes outside them,
 * and a stray newline would end the comment). */
static void put_comment(FILE *out, const char *prefix, const char *text)
{
    fputs(prefix, out);
    for (const unsigned char *p = (const unsigned char *)text; *p; p++)
        fputc(*p >= 32 && *p < 127 ? *p : '?', out);
    fputc('\n', out);
}

static void write_header(const ModelSpec *spec, const HfConfigInfo *info, FILE *out)
{
    char line[512];
    put_comment(out, "# Imported by `hpc import` from ", spec->source);
    snprintf(line, sizeof line, "transformers model_type %s, architecture %s%s%s.", info->model_type,
             *info->architecture ? info->architecture : "(none)", *info->torch_dtype ? ", weights in " : "",
             info->torch_dtype);
    put_comment(out, "# ", line);
    for (int i = 0; i < info->n_labels; i++) {
        snprintf(line, sizeof line, "label %d: %s", i, info->labels[i]);
        put_comment(out, "# ", line);
    }
    for (int i = 0; i < info->n_notes; i++) put_comment(out, "# note: ", info->notes[i]);
}

void hf_model_write(const ModelSpec *spec, const HfConfigInfo *info, FILE *out)
{
    if (info) write_header(spec, info, out);
    spec_write(spec, out);
}
