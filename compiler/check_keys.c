/* compiler/check_keys.c — the key table: every key of every block, its type,
 * its range, and how a value is stored into the ModelSpec.  The limits here
 * are the ones documented in docs/language.md; keep the two in step. */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "check_internal.h"
#include "nearest.h"

typedef enum { KT_INT, KT_FLOAT, KT_BOOL, KT_ENUM, KT_FN } KeyType;

/* Float range ends: closed unless the flag says open. */
enum { F_LO_OPEN = 1, F_HI_OPEN = 2, F_REQUIRED = 4 };

typedef struct {
    const char *name;
    int value;
} EnumName;

typedef struct KeyDef KeyDef;
typedef void (*KeyFn)(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec);

struct KeyDef {
    CheckKey id;
    CheckBlock block;
    const char *name;
    KeyType type;
    size_t off;            /* into ModelSpec */
    double lo, hi;
    unsigned flags;
    const EnumName *names; /* KT_ENUM, NULL-terminated */
    KeyFn fn;              /* KT_FN */
};

/* The rows of program/activations.h a stack may use (ffn = 1). */
#define FFN_IF_1(...) __VA_ARGS__
#define FFN_IF_0(...)
#define FFN_ACT_(E, name, ffn, ...) FFN_IF_##ffn({#name, ACT_##E},)
static const EnumName ACTIVATIONS[] = {HPC_ACTIVATIONS(FFN_ACT_){NULL, 0}};
#undef FFN_ACT_
static const EnumName NORMS[] = {{"post", NORM_POST}, {"pre", NORM_PRE}, {NULL, 0}};
static const EnumName ATTENTIONS[] = {
    {"bidirectional", ATTN_BIDIRECTIONAL}, {"causal", ATTN_CAUSAL}, {NULL, 0}};
static const EnumName PRECISIONS[] = {
    {"default", PREC_DEFAULT}, {"fp32", PREC_FP32}, {"fp16", PREC_FP16}, {"bf16", PREC_BF16}, {NULL, 0}};
static const EnumName POOLERS[] = {{"tanh", ACT_TANH}, {"relu", ACT_RELU}, {"none", -1}, {NULL, 0}};
static const EnumName OPTIMIZERS[] = {
    {"adamw", OPT_ADAMW}, {"adam", OPT_ADAM}, {"sgd", OPT_SGD}, {"lamb", OPT_LAMB}, {NULL, 0}};
static const EnumName SCHEDULES[] = {
    {"constant", SCHED_CONSTANT}, {"linear", SCHED_LINEAR}, {"cosine", SCHED_COSINE}, {NULL, 0}};
static const EnumName SCALINGS[] = {
    {"dynamic", LOSS_SCALE_DYNAMIC}, {"static", LOSS_SCALE_STATIC}, {"none", LOSS_SCALE_NONE}, {NULL, 0}};

static void fn_pooler(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec);
static void fn_optimizer(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec);
static void fn_schedule(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec);
static void fn_loss_scale(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec);
static void fn_length(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec);
static void fn_freeze(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec);
static void fn_betas(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec);
static void fn_warmup(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec);

#define ST(f) offsetof(ModelSpec, stack.f)
#define HD(f) offsetof(ModelSpec, head.f)
#define TR(f) offsetof(ModelSpec, train.f)
#define P2(n) ((double)((int64_t)1 << (n)))

static const KeyDef KEYS[K_COUNT] = {
    {K_VOCAB, BLK_STACK, "vocab", KT_INT, ST(vocab_size), 1, P2(24), F_REQUIRED, NULL, NULL},
    {K_MAX_POSITIONS, BLK_STACK, "max_positions", KT_INT, ST(max_positions), 1, P2(20), F_REQUIRED, NULL, NULL},
    {K_TOKEN_TYPES, BLK_STACK, "token_types", KT_INT, ST(type_vocab_size), 0, 1024, 0, NULL, NULL},
    {K_POSITION_OFFSET, BLK_STACK, "position_offset", KT_INT, ST(position_offset), 0, 1024, 0, NULL, NULL},
    {K_HIDDEN, BLK_STACK, "hidden", KT_INT, ST(hidden), 1, 65536, F_REQUIRED, NULL, NULL},
    {K_LAYERS, BLK_STACK, "layers", KT_INT, ST(layers), 1, 1024, F_REQUIRED, NULL, NULL},
    {K_HEADS, BLK_STACK, "heads", KT_INT, ST(heads), 1, 1024, F_REQUIRED, NULL, NULL},
    {K_FFN, BLK_STACK, "ffn", KT_INT, ST(ffn), 1, P2(20), F_REQUIRED, NULL, NULL},
    {K_ACTIVATION, BLK_STACK, "activation", KT_ENUM, ST(activation), 0, 0, 0, ACTIVATIONS, NULL},
    {K_DROPOUT, BLK_STACK, "dropout", KT_FLOAT, ST(hidden_dropout), 0, 1, F_HI_OPEN, NULL, NULL},
    {K_ATTENTION_DROPOUT, BLK_STACK, "attention_dropout", KT_FLOAT, ST(attention_dropout), 0, 1, F_HI_OPEN, NULL, NULL},
    {K_LN_EPS, BLK_STACK, "layer_norm_eps", KT_FLOAT, ST(ln_eps), 0, 1, F_LO_OPEN | F_HI_OPEN, NULL, NULL},
    {K_NORM, BLK_STACK, "norm", KT_ENUM, ST(norm), 0, 0, 0, NORMS, NULL},
    {K_ATTENTION, BLK_STACK, "attention", KT_ENUM, ST(attention), 0, 0, 0, ATTENTIONS, NULL},
    {K_EMBEDDING_NORM, BLK_STACK, "embedding_norm", KT_BOOL, ST(embedding_ln), 0, 0, 0, NULL, NULL},
    {K_FINAL_NORM, BLK_STACK, "final_norm", KT_BOOL, ST(final_ln), 0, 0, 0, NULL, NULL},
    {K_PRECISION, BLK_STACK, "precision", KT_ENUM, ST(precision), 0, 0, 0, PRECISIONS, NULL},
    {K_EMBEDDING_PRECISION, BLK_STACK, "embedding_precision", KT_ENUM, ST(embedding_precision), 0, 0, 0, PRECISIONS, NULL},

    {K_LABELS, BLK_HEAD, "labels", KT_INT, HD(num_labels), 1, P2(20), 0, NULL, NULL},
    {K_POOLER, BLK_HEAD, "pooler", KT_FN, 0, 0, 0, 0, POOLERS, fn_pooler},
    {K_HEAD_DROPOUT, BLK_HEAD, "dropout", KT_FLOAT, HD(classifier_dropout), 0, 1, F_HI_OPEN, NULL, NULL},
    {K_TIE, BLK_HEAD, "tie_embeddings", KT_BOOL, HD(tie_word_embeddings), 0, 0, 0, NULL, NULL},
    {K_DECODER_BIAS, BLK_HEAD, "decoder_bias", KT_BOOL, HD(decoder_bias), 0, 0, 0, NULL, NULL},
    {K_HEAD_PRECISION, BLK_HEAD, "precision", KT_ENUM, HD(precision), 0, 0, 0, PRECISIONS, NULL},

    {K_OPTIMIZER, BLK_TRAIN, "optimizer", KT_FN, 0, 0, 0, 0, OPTIMIZERS, fn_optimizer},
    {K_SCHEDULE, BLK_TRAIN, "schedule", KT_FN, 0, 0, 0, 0, SCHEDULES, fn_schedule},
    {K_LOSS_SCALE, BLK_TRAIN, "loss_scale", KT_FN, 0, 0, 0, 0, SCALINGS, fn_loss_scale},
    {K_CLIP, BLK_TRAIN, "clip_grad_norm", KT_FLOAT, TR(max_grad_norm), 0, 1e6, 0, NULL, NULL},
    {K_BATCH, BLK_TRAIN, "batch", KT_INT, TR(batch_size), 1, 65536, 0, NULL, NULL},
    {K_GRAD_ACCUM, BLK_TRAIN, "grad_accum", KT_INT, TR(grad_accum), 1, 65536, 0, NULL, NULL},
    {K_SEQ_LEN, BLK_TRAIN, "seq_len", KT_INT, TR(max_seq_len), 1, P2(20), 0, NULL, NULL},
    {K_SEED, BLK_TRAIN, "seed", KT_INT, TR(seed), 0, 9.2233720368547758e18, 0, NULL, NULL},
    {K_EPOCHS, BLK_TRAIN, "epochs", KT_FN, TR(epochs), 1, 1e6, 0, NULL, fn_length},
    {K_STEPS, BLK_TRAIN, "steps", KT_FN, TR(steps), 1, 1e12, 0, NULL, fn_length},
    {K_FREEZE, BLK_TRAIN, "freeze", KT_FN, 0, 0, 0, 0, NULL, fn_freeze},
    {K_PACK, BLK_TRAIN, "pack", KT_BOOL, TR(pack), 0, 0, 0, NULL, NULL},

    {K_LR, BLK_OPTIMIZER, "lr", KT_FLOAT, TR(lr), 0, 10, F_LO_OPEN, NULL, NULL},
    {K_BETAS, BLK_OPTIMIZER, "betas", KT_FN, 0, 0, 1, F_HI_OPEN, NULL, fn_betas},
    {K_EPS, BLK_OPTIMIZER, "eps", KT_FLOAT, TR(eps), 0, 1, F_LO_OPEN | F_HI_OPEN, NULL, NULL},
    {K_WEIGHT_DECAY, BLK_OPTIMIZER, "weight_decay", KT_FLOAT, TR(weight_decay), 0, 10, 0, NULL, NULL},
    {K_MOMENTUM, BLK_OPTIMIZER, "momentum", KT_FLOAT, TR(momentum), 0, 1, F_HI_OPEN, NULL, NULL},
    {K_NESTEROV, BLK_OPTIMIZER, "nesterov", KT_BOOL, TR(nesterov), 0, 0, 0, NULL, NULL},

    {K_WARMUP, BLK_SCHEDULE, "warmup", KT_FN, 0, 0, 1, F_HI_OPEN, NULL, fn_warmup},
    {K_MIN_LR_RATIO, BLK_SCHEDULE, "min_lr_ratio", KT_FLOAT, TR(min_lr_ratio), 0, 1, 0, NULL, NULL},

    {K_SCALE_INIT, BLK_SCALE, "init", KT_FLOAT, TR(scale_init), 0, 1.8446744073709552e19, F_LO_OPEN, NULL, NULL},
    {K_SCALE_GROWTH, BLK_SCALE, "growth", KT_FLOAT, TR(scale_growth), 1, 16, F_LO_OPEN, NULL, NULL},
    {K_SCALE_BACKOFF, BLK_SCALE, "backoff", KT_FLOAT, TR(scale_backoff), 0, 1, F_LO_OPEN | F_HI_OPEN, NULL, NULL},
    {K_SCALE_INTERVAL, BLK_SCALE, "interval", KT_INT, TR(scale_interval), 1, 1e9, 0, NULL, NULL},
    {K_MAX_SKIPS, BLK_SCALE, "max_skips", KT_INT, TR(max_skipped_steps), 1, 1e9, 0, NULL, NULL},
};

static const char *block_name(CheckBlock b, const ModelSpec *spec)
{
    switch (b) {
    case BLK_STACK: return spec->stack.kind == STACK_DECODER ? "decoder block" : "encoder block";
    case BLK_HEAD: return "head block";
    case BLK_TRAIN: return "train block";
    case BLK_OPTIMIZER: return "optimizer block";
    case BLK_SCHEDULE: return "schedule block";
    case BLK_SCALE: return "loss_scale block";
    }
    return "block";
}

static const KeyDef *find_key(CheckBlock blk, const char *name)
{
    for (int i = 0; i < K_COUNT; i++)
        if (KEYS[i].block == blk && strcmp(KEYS[i].name, name) == 0) return &KEYS[i];
    return NULL;
}

/* ---- value conversion ---------------------------------------------------- */

const char *check_describe(const AstValue *v, char *buf, size_t size)
{
    switch (v->kind) {
    case AST_VAL_INT: snprintf(buf, size, "%lld", (long long)v->i); break;
    case AST_VAL_FLOAT: snprintf(buf, size, "%g", v->f); break;
    case AST_VAL_IDENT: snprintf(buf, size, "'%.40s'", v->text); break;
    case AST_VAL_TUPLE: snprintf(buf, size, "a tuple"); break;
    case AST_VAL_RANGE: snprintf(buf, size, "the range %lld..%lld", (long long)v->i, (long long)v->i2); break;
    case AST_VAL_CALL: snprintf(buf, size, "'%.40s %s'", v->text, v->has_body ? "{ ... }" : "..."); break;
    }
    return buf;
}

/* Integer limits live in doubles in the table; the top one is INT64_MAX,
 * which a double cannot hold exactly, so print it from the integer. */
static long long int_limit(double x)
{
    return x >= 9.2233720368547758e18 ? (long long)INT64_MAX : (long long)x;
}

static bool get_int(Checker *c, const char *key, const AstValue *v, double lo, double hi, int64_t *out)
{
    char buf[96];
    if (v->bad) return false;
    if (v->kind != AST_VAL_INT) {
        diag_error(c->diag, v->loc, "'%s' expects an integer, got %s", key, check_describe(v, buf, sizeof buf));
        return false;
    }
    if ((double)v->i < lo || (double)v->i > hi) {
        diag_error(c->diag, v->loc, "'%s' must be between %lld and %lld, got %lld", key, int_limit(lo),
                   int_limit(hi), (long long)v->i);
        return false;
    }
    *out = v->i;
    return true;
}

static bool get_float(Checker *c, const char *key, const AstValue *v, double lo, double hi,
                      unsigned flags, double *out)
{
    char buf[96];
    if (v->bad) return false;
    if (v->kind != AST_VAL_INT && v->kind != AST_VAL_FLOAT) {
        diag_error(c->diag, v->loc, "'%s' expects a number, got %s", key, check_describe(v, buf, sizeof buf));
        return false;
    }
    double x = v->f;
    bool low_ok = (flags & F_LO_OPEN) ? x > lo : x >= lo;
    bool high_ok = (flags & F_HI_OPEN) ? x < hi : x <= hi;
    if (!low_ok || !high_ok) {
        diag_error(c->diag, v->loc, "'%s' must be in %c%g, %g%c, got %g", key,
                   (flags & F_LO_OPEN) ? '(' : '[', lo, hi, (flags & F_HI_OPEN) ? ')' : ']', x);
        return false;
    }
    *out = x;
    return true;
}

/* "a, b or c" */
static void list_names(const EnumName *names, char *buf, size_t size)
{
    size_t len = 0;
    buf[0] = '\0';
    for (int i = 0; names[i].name && len < size; i++)
        len += (size_t)snprintf(buf + len, size - len, "%s%s",
                                i == 0 ? "" : names[i + 1].name ? ", " : " or ", names[i].name);
}

static const char *closest_name(const char *word, const EnumName *names)
{
    const char *list[16];
    int n = 0;
    for (; names[n].name && n < 16; n++) list[n] = names[n].name;
    return check_closest(word, list, n);
}

/* Looks up an IDENT (or the name of a CALL when allow_call) in names. */
static bool get_enum(Checker *c, const char *key, const AstValue *v, const EnumName *names, int *out)
{
    char buf[96], list[160];
    list_names(names, list, sizeof list);
    if (v->kind != AST_VAL_IDENT && v->kind != AST_VAL_CALL) {
        diag_error(c->diag, v->loc, "'%s' must be %s, got %s", key, list, check_describe(v, buf, sizeof buf));
        return false;
    }
    for (int i = 0; names[i].name; i++)
        if (strcmp(names[i].name, v->text) == 0) {
            *out = names[i].value;
            return true;
        }
    const char *near = closest_name(v->text, names);
    if (near)
        diag_error(c->diag, v->loc, "'%s' must be %s, got '%.40s'; did you mean '%s'?", key, list, v->text, near);
    else
        diag_error(c->diag, v->loc, "'%s' must be %s, got '%.40s'", key, list, v->text);
    return false;
}

/* Enum values that take no argument and no block. */
static bool get_plain_enum(Checker *c, const char *key, const AstValue *v, const EnumName *names, int *out)
{
    if (!get_enum(c, key, v, names, out)) return false;
    if (v->kind == AST_VAL_CALL) {
        diag_error(c->diag, v->loc, "'%s' takes no %s", v->text, v->has_body ? "block" : "argument");
        return false;
    }
    return true;
}

static bool get_bool(Checker *c, const char *key, const AstValue *v, bool *out)
{
    char buf[96];
    if (v->kind == AST_VAL_IDENT && strcmp(v->text, "true") == 0) return *out = true, true;
    if (v->kind == AST_VAL_IDENT && strcmp(v->text, "false") == 0) return *out = false, true;
    diag_error(c->diag, v->loc, "'%s' expects true or false, got %s", key, check_describe(v, buf, sizeof buf));
    return false;
}

/* ---- generic store ------------------------------------------------------- */

static void store(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec)
{
    char *field = (char *)spec + k->off;
    const AstValue *v = it->value;
    switch (k->type) {
    case KT_INT: {
        int64_t x;
        if (get_int(c, k->name, v, k->lo, k->hi, &x)) {
            if (k->id == K_SEED) *(uint64_t *)(void *)field = (uint64_t)x;
            else *(int64_t *)(void *)field = x;
        }
        break;
    }
    case KT_FLOAT: get_float(c, k->name, v, k->lo, k->hi, k->flags, (double *)(void *)field); break;
    case KT_BOOL: get_bool(c, k->name, v, (bool *)field); break;
    case KT_ENUM: {
        int x;
        if (get_plain_enum(c, k->name, v, k->names, &x)) memcpy(field, &x, sizeof x);
        break;
    }
    case KT_FN: k->fn(c, k, it, spec); break;
    }
}

/* ---- keys with their own syntax ----------------------------------------- */

static void fn_pooler(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec)
{
    int x;
    if (!get_plain_enum(c, k->name, it->value, k->names, &x)) return;
    spec->head.pooler = x >= 0;
    if (x >= 0) spec->head.pooler_activation = (SpecActivation)x;
}

/* A value `NAME`, `NAME { items }`: the kind, then the body in block blk. */
static bool get_kind_block(Checker *c, const KeyDef *k, const AstValue *v, CheckBlock blk,
                           ModelSpec *spec, int *kind)
{
    if (!get_enum(c, k->name, v, k->names, kind)) return false;
    if (v->kind == AST_VAL_CALL && v->arg) {
        diag_error(c->diag, v->arg->loc, "'%s' takes no argument; write %s { ... }", v->text, v->text);
        return false;
    }
    return true;
}

static void fn_optimizer(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec)
{
    int kind;
    if (!get_kind_block(c, k, it->value, BLK_OPTIMIZER, spec, &kind)) return;
    spec->train.optimizer = (SpecOptimizer)kind;
    check_apply_block(c, BLK_OPTIMIZER, it->value->body, spec);
}

static void fn_schedule(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec)
{
    int kind;
    if (!get_kind_block(c, k, it->value, BLK_SCHEDULE, spec, &kind)) return;
    spec->train.schedule = (SpecSchedule)kind;
    check_apply_block(c, BLK_SCHEDULE, it->value->body, spec);
}

/* loss_scale = dynamic [{ ... }] | static NUMBER | none */
static void fn_loss_scale(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec)
{
    const AstValue *v = it->value;
    int kind;
    if (!get_enum(c, k->name, v, k->names, &kind)) return;
    if (kind == LOSS_SCALE_STATIC) {
        if (v->kind != AST_VAL_CALL || !v->arg) {
            diag_error(c->diag, v->loc, "'static' needs the scale: write static 1024");
            return;
        }
        if (get_float(c, "static", v->arg, 0, 1.8446744073709552e19, F_LO_OPEN, &spec->train.scale_init))
            spec->train.loss_scaling = LOSS_SCALE_STATIC;
        return;
    }
    if (v->kind == AST_VAL_CALL && (v->arg || kind == LOSS_SCALE_NONE)) {
        diag_error(c->diag, v->arg ? v->arg->loc : v->loc, "'%s' takes no %s", v->text,
                   v->arg ? "argument" : "block");
        return;
    }
    spec->train.loss_scaling = (SpecLossScaling)kind;
    if (v->kind == AST_VAL_CALL) check_apply_block(c, BLK_SCALE, v->body, spec);
}

/* epochs and steps: setting one clears the other. */
static void fn_length(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec)
{
    int64_t x;
    if (!get_int(c, k->name, it->value, k->lo, k->hi, &x)) return;
    spec->train.epochs = k->id == K_EPOCHS ? x : 0;
    spec->train.steps = k->id == K_STEPS ? x : 0;
}

/* One freeze item: embeddings | layers N | layers 0..N | none */
static void freeze_one(Checker *c, const AstValue *v, ModelSpec *spec)
{
    char buf[96];
    if (v->bad) return;
    const char *what = v->kind == AST_VAL_IDENT || v->kind == AST_VAL_CALL ? v->text : "";
    if (v->kind == AST_VAL_IDENT && strcmp(what, "embeddings") == 0) {
        spec->train.freeze_embeddings = true;
    } else if (v->kind == AST_VAL_IDENT && strcmp(what, "none") == 0) {
        spec->train.freeze_embeddings = false;
        spec->train.freeze_layers = 0;
    } else if (v->kind == AST_VAL_CALL && strcmp(what, "layers") == 0 && v->arg) {
        const AstValue *a = v->arg;
        if (a->kind == AST_VAL_RANGE && a->i != 0)
            diag_error(c->diag, a->loc, "only the first layers can be frozen: the range must start at 0, got %lld..%lld",
                       (long long)a->i, (long long)a->i2);
        else if (a->kind == AST_VAL_RANGE && a->i2 > 1023)
            diag_error(c->diag, a->loc, "the range %lld..%lld is past the last possible layer (1023)",
                       (long long)a->i, (long long)a->i2);
        else if (a->kind == AST_VAL_RANGE)
            spec->train.freeze_layers = a->i2 + 1;
        else
            get_int(c, "layers", a, 0, 1024, &spec->train.freeze_layers);
    } else {
        diag_error(c->diag, v->loc, "'freeze' must be embeddings, layers N, layers 0..N or none, got %s",
                   check_describe(v, buf, sizeof buf));
    }
}

static void fn_freeze(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec)
{
    spec->train.freeze_embeddings = false;
    spec->train.freeze_layers = 0;
    if (it->value->kind != AST_VAL_TUPLE) {
        freeze_one(c, it->value, spec);
        return;
    }
    for (const AstValue *e = it->value->elems; e; e = e->next) freeze_one(c, e, spec);
}

static void fn_betas(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec)
{
    const AstValue *v = it->value;
    char buf[96];
    if (v->kind != AST_VAL_TUPLE || !v->elems || !v->elems->next || v->elems->next->next) {
        diag_error(c->diag, v->loc, "'betas' expects two numbers like (0.9, 0.999), got %s",
                   check_describe(v, buf, sizeof buf));
        return;
    }
    get_float(c, "betas", v->elems, 0, 1, F_HI_OPEN, &spec->train.beta1);
    get_float(c, "betas", v->elems->next, 0, 1, F_HI_OPEN, &spec->train.beta2);
}

/* warmup = 0.1 (a ratio of the total steps) | warmup = 500 (steps) */
static void fn_warmup(Checker *c, const KeyDef *k, const AstItem *it, ModelSpec *spec)
{
    const AstValue *v = it->value;
    if (v->kind == AST_VAL_INT) {
        if (get_int(c, "warmup", v, 0, 1e12, &spec->train.warmup_steps)) spec->train.warmup_ratio = 0;
        return;
    }
    if (get_float(c, "warmup", v, 0, 1, F_HI_OPEN, &spec->train.warmup_ratio)) spec->train.warmup_steps = 0;
}

/* ---- blocks -------------------------------------------------------------- */

static void unknown_key(Checker *c, CheckBlock blk, const AstItem *it, const ModelSpec *spec)
{
    const char *names[K_COUNT];
    int n = 0;
    for (int i = 0; i < K_COUNT; i++)
        if (KEYS[i].block == blk) names[n++] = KEYS[i].name;
    const char *near = check_closest(it->key, names, n);
    if (near)
        diag_error(c->diag, it->loc, "unknown key '%.40s' in %s; did you mean '%s'?", it->key,
                   block_name(blk, spec), near);
    else
        diag_error(c->diag, it->loc, "unknown key '%.40s' in %s", it->key, block_name(blk, spec));
}

/* Keys that exist only for some optimizers or schedules (the kind is
 * stored before its block is applied). */
static bool applies(Checker *c, const KeyDef *k, const AstItem *it, const ModelSpec *spec)
{
    bool sgd = spec->train.optimizer == OPT_SGD;
    if ((k->id == K_MOMENTUM || k->id == K_NESTEROV) && !sgd)
        diag_error(c->diag, it->loc, "'%s' applies only to the sgd optimizer", k->name);
    else if (k->id == K_BETAS && sgd)
        diag_error(c->diag, it->loc, "'betas' does not apply to the sgd optimizer");
    else if (k->id == K_MIN_LR_RATIO && spec->train.schedule != SCHED_COSINE)
        diag_error(c->diag, it->loc, "'min_lr_ratio' applies only to the cosine schedule");
    else
        return true;
    return false;
}

void check_apply_block(Checker *c, CheckBlock blk, const AstItem *items, ModelSpec *spec)
{
    int first_line[K_COUNT] = {0};
    for (const AstItem *it = items; it && !diag_full(c->diag); it = it->next) {
        const KeyDef *k = find_key(blk, it->key);
        if (!k) {
            if (blk == BLK_STACK) c->stack_unknown = true;
            unknown_key(c, blk, it, spec);
            continue;
        }
        if (it->kind == AST_BLOCK) {
            diag_error(c->diag, it->loc, "'%s' is a setting: write %s = ...", it->key, it->key);
            continue;
        }
        if (!applies(c, k, it, spec)) continue;
        bool exclusive = k->id == K_EPOCHS || k->id == K_STEPS;
        int other = k->id == K_EPOCHS ? K_STEPS : K_EPOCHS;
        if (first_line[k->id]) {
            diag_error(c->diag, it->loc, "duplicate key '%s' (first set on line %d)", it->key, first_line[k->id]);
            continue;
        }
        if (exclusive && first_line[other]) {
            diag_error(c->diag, it->loc, "'epochs' and 'steps' are exclusive ('%s' is set on line %d)",
                       KEYS[other].name, first_line[other]);
            continue;
        }
        first_line[k->id] = it->loc.line;
        c->set_at[k->id] = it->value->loc;
        int before = c->diag->errors;
        store(c, k, it, spec);
        c->bad[k->id] = c->diag->errors != before;
    }
}

/* The fields whose defaults differ between an encoder and a decoder. */
void check_enter_stack(ModelSpec *spec, SpecStackKind kind)
{
    SpecStack *s = &spec->stack;
    if (s->kind == kind) return;
    bool dec = kind == STACK_DECODER;
    s->kind = kind;
    s->attention = dec ? ATTN_CAUSAL : ATTN_BIDIRECTIONAL;
    s->norm = dec ? NORM_PRE : NORM_POST;
    s->embedding_ln = !dec;
    s->final_ln = dec;
    s->type_vocab_size = dec ? 0 : 2;
}

static const char *const HEAD_FORMS[] = {"classifier", "regression", "token_classifier", "masked_lm", "causal_lm"};

static int head_form(const SpecHead *h)
{
    switch (h->kind) {
    case HEAD_SEQ_CLASSIFICATION: return h->regression ? 1 : 0;
    case HEAD_TOKEN_CLASSIFICATION: return 2;
    case HEAD_MASKED_LM: return 3;
    case HEAD_CAUSAL_LM: return 4;
    }
    return 0;
}

/* A head block of another form resets the head to that form's defaults. */
static void head_defaults(SpecHead *h, int form)
{
    static const SpecHeadKind kinds[] = {HEAD_SEQ_CLASSIFICATION, HEAD_SEQ_CLASSIFICATION,
                                         HEAD_TOKEN_CLASSIFICATION, HEAD_MASKED_LM, HEAD_CAUSAL_LM};
    SpecPrecision prec = h->precision;
    memset(h, 0, sizeof *h);
    h->kind = kinds[form];
    h->regression = form == 1;
    h->num_labels = form == 1 ? 1 : form <= 2 ? 2 : 0;
    h->pooler = form <= 1;
    h->pooler_activation = ACT_TANH;
    h->classifier_dropout = 0.1;
    h->tie_word_embeddings = true;
    h->decoder_bias = form == 3;
    h->precision = prec;
}

bool check_enter_head(Checker *c, const AstItem *block, ModelSpec *spec)
{
    int n = (int)(sizeof HEAD_FORMS / sizeof HEAD_FORMS[0]);
    if (!block->label) {
        diag_error(c->diag, block->loc,
                   "'head' needs a kind: classifier, regression, token_classifier, masked_lm or causal_lm");
        return false;
    }
    for (int f = 0; f < n; f++) {
        if (strcmp(block->label, HEAD_FORMS[f]) != 0) continue;
        if (head_form(&spec->head) == f) return true;
        head_defaults(&spec->head, f);
        for (int i = 0; i < K_COUNT; i++)
            if (KEYS[i].block == BLK_HEAD) c->set_at[i] = (SrcLoc){0};
        return true;
    }
    const char *near = check_closest(block->label, HEAD_FORMS, n);
    if (near)
        diag_error(c->diag, block->label_loc, "unknown head kind '%.40s'; did you mean '%s'?", block->label, near);
    else
        diag_error(c->diag, block->label_loc,
                   "unknown head kind '%.40s' (known: classifier, regression, token_classifier, masked_lm, causal_lm)",
                   block->label);
    return false;
}

const char *check_closest(const char *word, const char *const *names, int n)
{
    return nearest_name(word, names, n);
}

bool check_mul(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_mul_overflow(a, b, out);
}

bool check_add(int64_t a, int64_t b, int64_t *out)
{
    return !__builtin_add_overflow(a, b, out);
}

bool check_key_required(CheckKey id)
{
    return (KEYS[id].flags & F_REQUIRED) != 0;
}

const char *check_key_name(CheckKey id)
{
    return KEYS[id].name;
}

bool check_key_block(const char *name, CheckBlock *blk)
{
    for (int i = 0; i < K_COUNT; i++)
        if (strcmp(KEYS[i].name, name) == 0) {
            *blk = KEYS[i].block;
            return true;
        }
    return false;
}

bool check_table_ok(void)
{
    for (int i = 0; i < K_COUNT; i++)
        if (KEYS[i].id != (CheckKey)i) return false;
    return true;
}
