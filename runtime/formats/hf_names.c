/* runtime/formats/hf_names.c — see hf_names.h.
 *
 * A parameter name is split into a stem and a suffix (".weight"/".bias");
 * the layer number in the stem becomes '#'.  Each family has a table from
 * hpc stems to candidate checkpoint stems; a stem no row names maps to
 * itself (which is all BERT needs).  Candidates are then tried with the
 * legacy LayerNorm suffixes and without the base-model prefix. */
#include "formats/hf_names.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu/half.h"

enum { R_TRANSPOSE = 1, R_NO_BIAS = 2 };

typedef struct {
    const char *hpc;          /* stem, '#' for the layer number */
    const char *hf[2];        /* candidate stems, first match wins */
    unsigned flags;
    int part, parts;          /* column block of a fused tensor */
} NameRule;

#define L "bert.encoder.layer.#."
#define RL "roberta.encoder.layer.#."
#define DL "distilbert.transformer.layer.#."
#define GL "transformer.encoder.layer.#."
#define GH "transformer.h.#."

static const NameRule roberta_rules[] = {
    {"bert.embeddings.word_embeddings", {"roberta.embeddings.word_embeddings"}, 0, 0, 1},
    {"bert.embeddings.position_embeddings", {"roberta.embeddings.position_embeddings"}, 0, 0, 1},
    {"bert.embeddings.token_type_embeddings", {"roberta.embeddings.token_type_embeddings"}, 0, 0, 1},
    {"bert.embeddings.LayerNorm", {"roberta.embeddings.LayerNorm"}, 0, 0, 1},
    {L "attention.self.query", {RL "attention.self.query"}, 0, 0, 1},
    {L "attention.self.key", {RL "attention.self.key"}, 0, 0, 1},
    {L "attention.self.value", {RL "attention.self.value"}, 0, 0, 1},
    {L "attention.output.dense", {RL "attention.output.dense"}, 0, 0, 1},
    {L "attention.output.LayerNorm", {RL "attention.output.LayerNorm"}, 0, 0, 1},
    {L "intermediate.dense", {RL "intermediate.dense"}, 0, 0, 1},
    {L "output.dense", {RL "output.dense"}, 0, 0, 1},
    {L "output.LayerNorm", {RL "output.LayerNorm"}, 0, 0, 1},
    /* RobertaClassificationHead: dense + tanh + out_proj on <s>. */
    {"bert.pooler.dense", {"classifier.dense", "roberta.pooler.dense"}, 0, 0, 1},
    {"classifier", {"classifier.out_proj", "classifier"}, 0, 0, 1},
    {"cls.predictions.transform.dense", {"lm_head.dense"}, 0, 0, 1},
    {"cls.predictions.transform.LayerNorm", {"lm_head.layer_norm"}, 0, 0, 1},
    {"cls.predictions.decoder", {"lm_head.decoder"}, 0, 0, 1},
    {"cls.predictions", {"lm_head", "lm_head.decoder"}, 0, 0, 1},
};

static const NameRule distilbert_rules[] = {
    {"bert.embeddings.word_embeddings", {"distilbert.embeddings.word_embeddings"}, 0, 0, 1},
    {"bert.embeddings.position_embeddings", {"distilbert.embeddings.position_embeddings"}, 0, 0, 1},
    {"bert.embeddings.LayerNorm", {"distilbert.embeddings.LayerNorm"}, 0, 0, 1},
    {L "attention.self.query", {DL "attention.q_lin"}, 0, 0, 1},
    {L "attention.self.key", {DL "attention.k_lin"}, 0, 0, 1},
    {L "attention.self.value", {DL "attention.v_lin"}, 0, 0, 1},
    {L "attention.output.dense", {DL "attention.out_lin"}, 0, 0, 1},
    {L "attention.output.LayerNorm", {DL "sa_layer_norm"}, 0, 0, 1},
    {L "intermediate.dense", {DL "ffn.lin1"}, 0, 0, 1},
    {L "output.dense", {DL "ffn.lin2"}, 0, 0, 1},
    {L "output.LayerNorm", {DL "output_layer_norm"}, 0, 0, 1},
    {"bert.pooler.dense", {"pre_classifier"}, 0, 0, 1},
    {"cls.predictions.transform.dense", {"vocab_transform"}, 0, 0, 1},
    {"cls.predictions.transform.LayerNorm", {"vocab_layer_norm"}, 0, 0, 1},
    {"cls.predictions.decoder", {"vocab_projector"}, 0, 0, 1},
    {"cls.predictions", {"vocab_projector"}, 0, 0, 1},
};

/* Pre-LN layers keep BERT's LayerNorm names: attention.output.LayerNorm is
 * GPT-2's ln_1 (before attention), output.LayerNorm its ln_2. */
static const NameRule gpt2_rules[] = {
    {"transformer.embeddings.word_embeddings", {"transformer.wte"}, 0, 0, 1},
    {"transformer.embeddings.position_embeddings", {"transformer.wpe"}, 0, 0, 1},
    {GL "attention.output.LayerNorm", {GH "ln_1"}, 0, 0, 1},
    {GL "attention.self.query", {GH "attn.c_attn"}, R_TRANSPOSE, 0, 3},
    {GL "attention.self.key", {GH "attn.c_attn"}, R_TRANSPOSE, 1, 3},
    {GL "attention.self.value", {GH "attn.c_attn"}, R_TRANSPOSE, 2, 3},
    {GL "attention.output.dense", {GH "attn.c_proj"}, R_TRANSPOSE, 0, 1},
    {GL "output.LayerNorm", {GH "ln_2"}, 0, 0, 1},
    {GL "intermediate.dense", {GH "mlp.c_fc"}, R_TRANSPOSE, 0, 1},
    {GL "output.dense", {GH "mlp.c_proj"}, R_TRANSPOSE, 0, 1},
    {"classifier", {"score", "classifier"}, R_NO_BIAS, 0, 1},
};

typedef struct {
    const char *model_type;
    const char *base;          /* base_model_prefix, stripped for bare-model files */
    const NameRule *rules;
    size_t n_rules;
} FamilyNames;

static const FamilyNames families[] = {
    {"bert", "bert.", NULL, 0},
    {"roberta", "roberta.", roberta_rules, sizeof roberta_rules / sizeof roberta_rules[0]},
    {"distilbert", "distilbert.", distilbert_rules, sizeof distilbert_rules / sizeof distilbert_rules[0]},
    {"gpt2", "transformer.", gpt2_rules, sizeof gpt2_rules / sizeof gpt2_rules[0]},
};

static const FamilyNames *family(const char *model_type)
{
    for (size_t i = 0; i < sizeof families / sizeof families[0]; i++)
        if (strcmp(model_type, families[i].model_type) == 0) return &families[i];
    return NULL;
}

bool hf_names_known(const char *model_type)
{
    return family(model_type) != NULL;
}

/* "x.encoder.layer.11.output.dense.weight" -> stem "x.encoder.layer.#.output.dense",
 * layer "11", suffix "weight". */
typedef struct {
    char stem[160];
    char layer[24];
    const char *suffix;
} ParsedName;

static bool parse_param(const char *param, ParsedName *pn)
{
    const char *dot = strrchr(param, '.');
    if (!dot || (strcmp(dot, ".weight") != 0 && strcmp(dot, ".bias") != 0)) return false;
    pn->suffix = dot + 1;
    pn->layer[0] = '\0';
    size_t n = (size_t)(dot - param);
    if (n >= sizeof pn->stem) return false;
    const char *lay = strstr(param, ".layer.");
    if (lay && lay < dot) {
        const char *num = lay + 7;
        size_t digits = strspn(num, "0123456789");
        if (digits == 0 || digits >= sizeof pn->layer || num + digits > dot) return false;
        memcpy(pn->layer, num, digits);
        pn->layer[digits] = '\0';
        snprintf(pn->stem, sizeof pn->stem, "%.*s#%.*s", (int)(num - param), param, (int)(dot - num - digits),
                 num + digits);
    } else {
        snprintf(pn->stem, sizeof pn->stem, "%.*s", (int)n, param);
    }
    return true;
}

/* Expands '#' in a rule stem to the layer number. */
static void expand(const char *stem, const char *layer, char *out, size_t cap)
{
    const char *hash = strchr(stem, '#');
    if (hash) snprintf(out, cap, "%.*s%s%s", (int)(hash - stem), stem, layer, hash + 1);
    else snprintf(out, cap, "%s", stem);
}

/* The first tensor of f among: stem.suffix, stem.gamma/beta (legacy
 * LayerNorm), and both again without the base prefix. */
static const StTensor *try_stem(const FamilyNames *fam, const StFile *f, const char *stem, const char *suffix,
                                char *tried, size_t cap)
{
    const char *legacy = !strstr(stem, "LayerNorm") ? NULL : strcmp(suffix, "weight") == 0 ? "gamma" : "beta";
    size_t base_len = strlen(fam->base);
    bool strippable = strncmp(stem, fam->base, base_len) == 0;
    for (int strip = 0; strip <= (strippable ? 1 : 0); strip++)
        for (int alt = 0; alt <= (legacy ? 1 : 0); alt++) {
            char name[224];
            snprintf(name, sizeof name, "%s.%s", stem + (strip ? base_len : 0), alt ? legacy : suffix);
            const StTensor *t = st_find(f, name);
            if (t) return t;
            size_t used = strlen(tried);
            if (used + strlen(name) + 3 < cap) snprintf(tried + used, cap - used, "%s%s", used ? ", " : "", name);
        }
    return NULL;
}

static const NameRule *find_rule(const FamilyNames *fam, const char *stem)
{
    for (size_t i = 0; i < fam->n_rules; i++)
        if (strcmp(fam->rules[i].hpc, stem) == 0) return &fam->rules[i];
    return NULL;
}

HpcStatus hf_names_find(const char *model_type, const StFile *f, const char *param, HfTensorRef *ref,
                        HpcError *err)
{
    const FamilyNames *fam = family(model_type);
    ParsedName pn;
    memset(ref, 0, sizeof *ref);
    ref->parts = 1;
    if (!fam)
        return hpc_fail(err, HPC_ERR_USAGE, "hf_names: model_type \"%s\" has no name mapping (bert, roberta, "
                        "distilbert, gpt2)", model_type);
    if (!parse_param(param, &pn))
        return hpc_fail(err, HPC_ERR_USAGE, "hf_names: \"%s\" is not an hpc parameter name", param);
    const NameRule *rule = find_rule(fam, pn.stem);
    char tried[1024] = "";
    for (int c = 0; c < 2; c++) {
        const char *cand = rule ? rule->hf[c] : c == 0 ? pn.stem : NULL;
        if (!cand) break;
        char stem[192];
        expand(cand, pn.layer, stem, sizeof stem);
        ref->t = try_stem(fam, f, stem, pn.suffix, tried, sizeof tried);
        if (!ref->t && rule && (rule->flags & R_NO_BIAS) && strcmp(pn.suffix, "bias") == 0 &&
            try_stem(fam, f, stem, "weight", tried, sizeof tried))
            ref->zeros = true;   /* the weight is here, the bias never existed */
        if (ref->t || ref->zeros) {
            ref->transpose = rule && (rule->flags & R_TRANSPOSE) && strcmp(pn.suffix, "weight") == 0;
            ref->part = rule ? rule->part : 0;
            ref->parts = rule ? rule->parts : 1;
            return HPC_OK;
        }
    }
    return hpc_fail(err, HPC_ERR_INPUT, "checkpoint has no tensor for parameter %s (tried %s); is it a %s "
                    "checkpoint for this model's head?", param, tried, model_type);
}

/* ------------------------------------------------------------------ */
/* Loading                                                              */

/* "[a, b]" for the first ndim (at most 2 shown) of dims. */
static void dims_text(const int64_t *dims, int ndim, char *out, size_t cap)
{
    if (ndim <= 0) snprintf(out, cap, "[]");
    else if (ndim == 1) snprintf(out, cap, "[%lld]", (long long)dims[0]);
    else snprintf(out, cap, "[%lld, %lld%s]", (long long)dims[0], (long long)dims[1], ndim > 2 ? ", ..." : "");
}

static HpcStatus check_shape(const char *model_type, const ParamInfo *p, const HfTensorRef *r, HpcError *err)
{
    const StTensor *t = r->t;
    int64_t out = p->dims[0] * r->parts;
    int64_t want[2] = {out, p->rank == 2 ? p->dims[1] : 0};
    if (r->transpose) {
        want[0] = p->dims[1];
        want[1] = out;
    }
    bool ok = t->ndim == p->rank && t->shape[0] == want[0] && (p->rank == 1 || t->shape[1] == want[1]);
    if (!ok) {
        char got[64], need[64];
        dims_text(t->shape, t->ndim, got, sizeof got);
        dims_text(want, p->rank, need, sizeof need);
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint tensor %s has shape %s but parameter %s needs %s; "
                        "the config and the weights disagree", t->name, got, p->name, need);
    }
    if (t->dtype != ST_F32 && t->dtype != ST_F16 && t->dtype != ST_BF16 && t->dtype != ST_F64)
        return hpc_fail(err, HPC_ERR_INPUT, "checkpoint tensor %s is %s; %s weights must be F32, F16, BF16 or F64",
                        t->name, st_dtype_name(t->dtype), model_type);
    return HPC_OK;
}

/* Element k of t as f32; memcpy because mapped data may be unaligned. */
static float element(const StTensor *t, int64_t k)
{
    const unsigned char *p = (const unsigned char *)t->data + (size_t)k * st_dtype_size(t->dtype);
    switch (t->dtype) {
    case ST_F32: { float x; memcpy(&x, p, 4); return x; }
    case ST_F64: { double x; memcpy(&x, p, 8); return (float)x; }
    case ST_F16: { uint16_t h; memcpy(&h, p, 2); return half_to_f32(h); }
    case ST_BF16: { uint16_t b; memcpy(&b, p, 2); return bf16_to_f32(b); }
    default: HPC_ASSERT(!"dtype checked by check_shape"); return 0;
    }
}

HpcStatus hf_names_load(const char *model_type, const StFile *f, const ParamInfo *p, float *dst, HpcError *err)
{
    HPC_ASSERT(p->tied_to < 0);
    HfTensorRef r;
    HpcStatus st = hf_names_find(model_type, f, p->name, &r, err);
    if (st) return st;
    int64_t out = p->dims[0], in = p->rank == 2 ? p->dims[1] : 1;
    if (r.zeros) {
        memset(dst, 0, (size_t)(out * in) * sizeof *dst);
        return HPC_OK;
    }
    st = check_shape(model_type, p, &r, err);
    if (!st) st = st_tensor_check_finite(f, r.t, err);
    if (st) return st;
    int64_t row0 = (int64_t)r.part * out, full = out * r.parts;
    for (int64_t o = 0; o < out; o++)          // dst: (out, in) f32
        for (int64_t i = 0; i < in; i++)
            dst[o * in + i] = element(r.t, r.transpose ? i * full + row0 + o : (row0 + o) * in + i);
    return HPC_OK;
}

bool hf_names_is_head(const char *param)
{
    static const char *stack[] = {"bert.embeddings.", "bert.encoder.", "transformer.embeddings.",
                                  "transformer.encoder.", "transformer.ln_f."};
    for (size_t i = 0; i < sizeof stack / sizeof stack[0]; i++)
        if (strncmp(param, stack[i], strlen(stack[i])) == 0) return false;
    return true;
}

HpcStatus hf_names_check(const char *model_type, const StFile *f, const ParamList *pl, const char **new_head,
                         int cap, int *n_new, HpcError *err)
{
    if (n_new) *n_new = 0;
    for (int i = 0; i < pl->n; i++) {
        if (pl->p[i].tied_to >= 0) continue;
        HfTensorRef r;
        HpcStatus st = hf_names_find(model_type, f, pl->p[i].name, &r, err);
        if (st == HPC_ERR_INPUT && new_head && hf_names_is_head(pl->p[i].name)) {
            if (*n_new < cap) new_head[*n_new] = pl->p[i].name;
            (*n_new)++;
            continue;
        }
        if (!st && !r.zeros) st = check_shape(model_type, &pl->p[i], &r, err);
        if (st) return st;
    }
    return HPC_OK;
}

/* Tensors transformers drops or re-derives when loading. */
static bool ignorable(const char *name)
{
    static const char *suffixes[] = {".attn.bias", ".attn.masked_bias", "position_ids", "decoder.bias",
                                     "lm_head.weight", "decoder.weight", "vocab_projector.weight"};
    for (size_t i = 0; i < sizeof suffixes / sizeof suffixes[0]; i++) {
        size_t n = strlen(name), m = strlen(suffixes[i]);
        if (n >= m && strcmp(name + n - m, suffixes[i]) == 0) return true;
    }
    return false;
}

int hf_names_unused(const char *model_type, const StFile *f, const ParamList *pl, const char **names, int cap)
{
    int64_t n = st_count(f);
    bool *used = xcalloc((size_t)n + 1, sizeof *used);
    for (int i = 0; i < pl->n; i++) {
        HfTensorRef r;
        if (hf_names_find(model_type, f, pl->p[i].name, &r, NULL) == HPC_OK && r.t)
            used[st_tensor_index(f, r.t)] = true;
    }
    int count = 0;
    for (int64_t k = 0; k < n; k++) {
        const char *name = st_tensor(f, k)->name;
        if (used[k] || ignorable(name)) continue;
        if (count < cap) names[count] = name;
        count++;
    }
    free(used);
    return count;
}

/* ------------------------------------------------------------------ */
/* Saving in a family's layout                                          */

typedef struct {
    char name[224];
    int ndim;
    int64_t shape[2];
    float *buf;             /* shape f32, in the checkpoint's layout */
} OutTensor;

typedef struct {
    OutTensor *t;
    int n, cap;
} OutList;

/* The checkpoint name parameter p is saved under; false when the family
 * has no such tensor (GPT-2 score bias). */
static bool export_name(const FamilyNames *fam, const ModelSpec *spec, const ParamInfo *p, char *name, size_t cap,
                        const NameRule **rule_out)
{
    ParsedName pn;
    bool parsed = parse_param(p->name, &pn);
    HPC_ASSERT(parsed);   /* the lowering names every parameter NAME.weight/.bias */
    const NameRule *rule = find_rule(fam, pn.stem);
    /* Every family's ...ForTokenClassification calls its linear "classifier". */
    if (spec->head.kind == HEAD_TOKEN_CLASSIFICATION && strcmp(pn.stem, "classifier") == 0) rule = NULL;
    if (rule && (rule->flags & R_NO_BIAS) && strcmp(pn.suffix, "bias") == 0) return false;
    char stem[192];
    expand(rule ? rule->hf[0] : pn.stem, pn.layer, stem, sizeof stem);
    snprintf(name, cap, "%s.%s", stem, pn.suffix);
    *rule_out = rule;
    return true;
}

static OutTensor *out_get(OutList *ol, const char *name, int ndim, int64_t d0, int64_t d1)
{
    for (int i = 0; i < ol->n; i++)
        if (strcmp(ol->t[i].name, name) == 0) return &ol->t[i];
    if (ol->n == ol->cap) {
        ol->cap = ol->cap ? 2 * ol->cap : 64;
        ol->t = xrealloc(ol->t, (size_t)ol->cap * sizeof *ol->t);
    }
    OutTensor *t = &ol->t[ol->n++];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->buf = NULL;
    return t;
}

/* Places parameter p (out, in) into its checkpoint tensor. */
static HpcStatus place(OutList *ol, const char *name, const NameRule *rule, const ParamInfo *p, const float *src,
                       HpcError *err)
{
    int parts = rule ? rule->parts : 1, part = rule ? rule->part : 0;
    bool transpose = rule && (rule->flags & R_TRANSPOSE) && p->rank == 2;
    int64_t out = p->dims[0], in = p->rank == 2 ? p->dims[1] : 1, full = out * parts, row0 = part * out;
    OutTensor *t = p->rank == 1 ? out_get(ol, name, 1, full, 0)
                 : transpose ? out_get(ol, name, 2, in, full) : out_get(ol, name, 2, full, in);
    if (!t->buf) {
        t->buf = calloc((size_t)(full * in), sizeof *t->buf);
        if (!t->buf)
            return hpc_fail(err, HPC_ERR_OOM, "hf_names_save: no memory for %s (%lld floats)", name,
                            (long long)(full * in));
    }
    for (int64_t o = 0; o < out; o++)           // src: (out, in) f32
        for (int64_t i = 0; i < in; i++)
            t->buf[transpose ? i * full + row0 + o : (row0 + o) * in + i] = src[o * in + i];
    return HPC_OK;
}

HpcStatus hf_names_save(const char *model_type, const ModelSpec *spec, const ParamList *pl,
                        const float *const *data, const char *path, HpcError *err)
{
    const FamilyNames *fam = family(model_type);
    if (!fam)
        return hpc_fail(err, HPC_ERR_USAGE, "hf_names_save: model_type \"%s\" has no name mapping (bert, roberta, "
                        "distilbert, gpt2)", model_type);
    OutList ol = {0};
    HpcStatus st = HPC_OK;
    for (int i = 0; i < pl->n && !st; i++) {
        const NameRule *rule = NULL;
        char name[224];
        if (pl->p[i].tied_to >= 0 || !export_name(fam, spec, &pl->p[i], name, sizeof name, &rule)) continue;
        st = place(&ol, name, rule, &pl->p[i], data[i], err);
    }
    StWriter w;
    st_writer_init(&w);
    for (int i = 0; i < ol.n && !st; i++)
        st = st_writer_add(&w, ol.t[i].name, ST_F32, ol.t[i].ndim, ol.t[i].shape, ol.t[i].buf, err);
    if (!st) st = st_writer_meta(&w, "format", "pt", err);
    if (!st) st = st_writer_save(&w, path, err);
    st_writer_free(&w);
    for (int i = 0; i < ol.n; i++) free(ol.t[i].buf);
    free(ol.t);
    return st;
}

/* ------------------------------------------------------------------ */
/* Whole-model loading and family detection                             */

HpcStatus hf_names_load_all(const char *model_type, const StFile *f, const ParamList *pl, float *const *w,
                            int *n_new, HpcError *err)
{
    const char *fresh[1];
    int count = 0;
    HpcStatus st = hf_names_check(model_type, f, pl, fresh, 0, &count, err);
    if (n_new) *n_new = count;
    for (int i = 0; i < pl->n && !st; i++) {
        if (pl->p[i].tied_to >= 0) continue;
        HfTensorRef r;
        if (hf_names_is_head(pl->p[i].name) && hf_names_find(model_type, f, pl->p[i].name, &r, NULL))
            continue;   /* a new head parameter: keeps its initializer */
        st = hf_names_load(model_type, f, &pl->p[i], w[i], err);
    }
    return st;
}

static bool any_name(const StFile *f, const char *needle, bool prefix)
{
    for (int64_t i = 0; i < st_count(f); i++) {
        const char *name = st_tensor(f, i)->name;
        if (prefix ? strncmp(name, needle, strlen(needle)) == 0 : strstr(name, needle) != NULL) return true;
    }
    return false;
}

const char *hf_names_detect(const StFile *f)
{
    if (any_name(f, "roberta.", true)) return "roberta";
    if (any_name(f, "distilbert.", true) || any_name(f, ".attention.q_lin.", false)) return "distilbert";
    if (any_name(f, ".attn.c_attn.", false)) return "gpt2";
    return "bert";
}
