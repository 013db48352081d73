/* compiler/check_internal.h — what the checker's files share (private).
 *
 * check.c       loading, `extends` resolution, the model level, entry points
 * check_keys.c  the key table, value conversion, applying blocks to a spec
 * check_rules.c cross-key rules run once the whole chain is applied
 */
#ifndef HPC_COMPILER_CHECK_INTERNAL_H
#define HPC_COMPILER_CHECK_INTERNAL_H

#include "ast.h"
#include "diag.h"
#include "program/spec.h"

/* Which block a key belongs to. */
typedef enum {
    BLK_STACK,     /* encoder { } / decoder { } */
    BLK_HEAD,      /* head KIND { } */
    BLK_TRAIN,     /* train { } */
    BLK_OPTIMIZER, /* optimizer = adamw { } */
    BLK_SCHEDULE,  /* schedule = linear { } */
    BLK_SCALE,     /* loss_scale = dynamic { } */
} CheckBlock;

typedef enum {
    K_VOCAB, K_MAX_POSITIONS, K_TOKEN_TYPES, K_POSITION_OFFSET, K_HIDDEN, K_LAYERS,
    K_HEADS, K_FFN, K_ACTIVATION, K_DROPOUT, K_ATTENTION_DROPOUT, K_LN_EPS, K_NORM,
    K_ATTENTION, K_EMBEDDING_NORM, K_FINAL_NORM, K_PRECISION, K_EMBEDDING_PRECISION,
    K_LABELS, K_POOLER, K_HEAD_DROPOUT, K_TIE, K_DECODER_BIAS, K_HEAD_PRECISION,
    K_OPTIMIZER, K_SCHEDULE, K_LOSS_SCALE, K_CLIP, K_BATCH, K_GRAD_ACCUM, K_SEQ_LEN,
    K_SEED, K_EPOCHS, K_STEPS, K_FREEZE, K_PACK,
    K_LR, K_BETAS, K_EPS, K_WEIGHT_DECAY, K_MOMENTUM, K_NESTEROV,
    K_WARMUP, K_MIN_LR_RATIO,
    K_SCALE_INIT, K_SCALE_GROWTH, K_SCALE_BACKOFF, K_SCALE_INTERVAL, K_MAX_SKIPS,
    K_COUNT
} CheckKey;

typedef struct {
    Diag *diag;
    SrcLoc set_at[K_COUNT];  /* where each key was last set (src NULL: default) */
    bool bad[K_COUNT];       /* its last setting was rejected (value unchanged) */
    bool stack_unknown;      /* an unknown key in a stack block: skip "missing" */
    SrcLoc stack_loc;        /* the last encoder/decoder block, or the model */
    SrcLoc head_loc;         /* the last head block, or the model */
    SrcLoc model_loc;        /* the model being loaded */
    bool has_stack;
} Checker;

/* Applies one block's items (a model-level block body, or a call's body). */
void check_apply_block(Checker *c, CheckBlock blk, const AstItem *items, ModelSpec *spec);

/* Head and stack forms entered by a block's name/label; they reset the
 * fields whose defaults differ between forms. */
bool check_enter_head(Checker *c, const AstItem *block, ModelSpec *spec);
void check_enter_stack(ModelSpec *spec, SpecStackKind kind);

/* Key facts from the table: required in its block?  its spelling. */
bool check_key_required(CheckKey id);
const char *check_key_name(CheckKey id);
/* The block a key name belongs to (the first, if several); false if none. */
bool check_key_block(const char *name, CheckBlock *blk);
/* The key table is indexed by CheckKey; true if its rows are in order. */
bool check_table_ok(void);

/* The cross-key rules (divisibility, seq_len vs positions, ...). */
void check_rules(Checker *c, ModelSpec *spec);

/* "did you mean" helper: the closest of names[0..n) to word, or NULL. */
const char *check_closest(const char *word, const char *const *names, int n);

/* Describes a value for messages: "7", "0.5", "'gelu'", "a tuple". */
const char *check_describe(const AstValue *v, char *buf, size_t size);

/* Checked int64 arithmetic for derived sizes; false on overflow. */
bool check_mul(int64_t a, int64_t b, int64_t *out);
bool check_add(int64_t a, int64_t b, int64_t *out);

/* The largest model hpc accepts, in parameters. */
#define CHECK_MAX_PARAMS ((int64_t)1 << 36)

#endif
