/* compiler/check_rules.c — rules that involve more than one key, run after
 * a model and all its bases are applied.  Each error points at the setting
 * that made the rule fail (or at the block, when the value is a default). */
#include <string.h>

#include "check_internal.h"

/* Where key k was set, or fallback when it still has its default. */
static SrcLoc at(const Checker *c, CheckKey k, SrcLoc fallback)
{
    return c->set_at[k].src ? c->set_at[k] : fallback;
}

static bool is_set(const Checker *c, CheckKey k)
{
    return c->set_at[k].src != NULL;
}

static void rule_required(Checker *c, const ModelSpec *spec)
{
    if (!c->has_stack) {
        diag_error(c->diag, c->model_loc, "model '%s' has no encoder or decoder block", spec->name);
        return;
    }
    if (c->stack_unknown) return; /* the misspelt key was reported already */
    const char *block = spec->stack.kind == STACK_DECODER ? "decoder" : "encoder";
    for (int k = 0; k < K_COUNT; k++)
        if (check_key_required((CheckKey)k) && !is_set(c, (CheckKey)k))
            diag_error(c->diag, c->stack_loc, "missing required key '%s' in %s block",
                       check_key_name((CheckKey)k), block);
}

static void rule_stack(Checker *c, const ModelSpec *spec)
{
    const SpecStack *s = &spec->stack;
    if (c->bad[K_HIDDEN] || c->bad[K_HEADS] || c->bad[K_MAX_POSITIONS] || c->bad[K_POSITION_OFFSET])
        return; /* judged against a default the user did not write */
    if (s->hidden % s->heads != 0)
        diag_error(c->diag, at(c, K_HEADS, at(c, K_HIDDEN, c->stack_loc)),
                   "'hidden' (%lld) is not divisible by 'heads' (%lld)", (long long)s->hidden,
                   (long long)s->heads);
    if (s->position_offset >= s->max_positions)
        diag_error(c->diag, at(c, K_POSITION_OFFSET, c->stack_loc),
                   "'position_offset' (%lld) leaves no rows of the position table (max_positions = %lld)",
                   (long long)s->position_offset, (long long)s->max_positions);
}

static void rule_head(Checker *c, const ModelSpec *spec)
{
    const SpecHead *h = &spec->head;
    const char *kind = h->regression ? "regression" : spec_head_kind_name(h->kind);
    bool lm = h->kind == HEAD_MASKED_LM || h->kind == HEAD_CAUSAL_LM;
    if (lm && is_set(c, K_LABELS))
        diag_error(c->diag, c->set_at[K_LABELS], "'labels' does not apply to a %s head", kind);
    if (h->regression && is_set(c, K_LABELS) && h->num_labels != 1)
        diag_error(c->diag, c->set_at[K_LABELS], "a regression head has 1 label, got %lld",
                   (long long)h->num_labels);
    if (h->kind != HEAD_SEQ_CLASSIFICATION && is_set(c, K_POOLER))
        diag_error(c->diag, c->set_at[K_POOLER], "'pooler' applies only to classifier and regression heads");
    if (!lm && is_set(c, K_TIE))
        diag_error(c->diag, c->set_at[K_TIE], "'tie_embeddings' applies only to masked_lm and causal_lm heads");
    if (!lm && is_set(c, K_DECODER_BIAS))
        diag_error(c->diag, c->set_at[K_DECODER_BIAS], "'decoder_bias' applies only to masked_lm and causal_lm heads");
    if (h->kind == HEAD_CAUSAL_LM && spec->stack.attention != ATTN_CAUSAL)
        diag_error(c->diag, c->head_loc,
                   "a causal_lm head needs causal attention (use a decoder block or attention = causal)");
}

static void rule_train(Checker *c, ModelSpec *spec)
{
    SpecTraining *t = &spec->train;
    const SpecStack *s = &spec->stack;
    int64_t room = s->max_positions - s->position_offset;
    /* The default seq_len (128) shrinks to fit a short position table. */
    if ((!is_set(c, K_SEQ_LEN) || c->bad[K_SEQ_LEN]) && t->max_seq_len > room && room > 0)
        t->max_seq_len = room;
    if (t->max_seq_len > room && room > 0 && !c->bad[K_MAX_POSITIONS] && !c->bad[K_POSITION_OFFSET])
        diag_error(c->diag, at(c, K_SEQ_LEN, at(c, K_MAX_POSITIONS, c->stack_loc)),
                   "'seq_len' (%lld) is longer than the position table allows (%lld = max_positions - position_offset)",
                   (long long)t->max_seq_len, (long long)room);
    if (t->freeze_layers > s->layers && !c->bad[K_LAYERS])
        diag_error(c->diag, at(c, K_FREEZE, c->model_loc),
                   "'freeze' covers %lld layers but the model has %lld", (long long)t->freeze_layers,
                   (long long)s->layers);
    if (t->steps > 0 && t->warmup_steps > t->steps)
        diag_error(c->diag, at(c, K_WARMUP, c->model_loc), "warmup (%lld steps) is longer than the run (%lld steps)",
                   (long long)t->warmup_steps, (long long)t->steps);
}

/* Parameter count with overflow checks; the per-key limits keep it far
 * from overflow today, but the limits may grow. */
static bool total_params(const ModelSpec *spec, int64_t *out)
{
    const SpecStack *s = &spec->stack;
    int64_t rows, emb, hh, hf, layer, all;
    bool ok = check_add(s->vocab_size, s->max_positions, &rows) && check_add(rows, s->type_vocab_size, &rows) &&
              check_mul(rows, s->hidden, &emb) && check_mul(s->hidden, s->hidden, &hh) &&
              check_mul(s->hidden, s->ffn, &hf) && check_mul(hh, 4, &layer) &&
              check_mul(hf, 2, &hf) && check_add(layer, hf, &layer) &&
              check_add(layer, s->ffn + 10 * s->hidden, &layer) && check_mul(layer, s->layers, &all) &&
              check_add(all, emb, &all) && check_add(all, 2 * hh, &all);
    *out = all;
    return ok;
}

static void rule_size(Checker *c, const ModelSpec *spec)
{
    int64_t n = 0;
    if (!total_params(spec, &n) || n > CHECK_MAX_PARAMS)
        diag_error(c->diag, c->stack_loc, "the model is too large: about %.3g parameters (the limit is 2^36 = %lld)",
                   (double)spec->stack.vocab_size * (double)spec->stack.hidden +
                       (double)spec->stack.layers * spec->stack.hidden * (4.0 * spec->stack.hidden + 2.0 * spec->stack.ffn),
                   (long long)CHECK_MAX_PARAMS);
}

void check_rules(Checker *c, ModelSpec *spec)
{
    rule_required(c, spec);
    rule_stack(c, spec);
    rule_head(c, spec);
    rule_train(c, spec);
    rule_size(c, spec);
}
