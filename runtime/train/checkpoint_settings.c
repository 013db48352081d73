/* runtime/train/checkpoint_settings.c — the training settings a checkpoint
 * records and a resume compares (checkpoint.h, CheckpointSettings).  Keys
 * are the .model file's names (docs/language.md) where one exists, so a
 * refusal reads "lr 0.0001 -> 0.0002" or "batch 32 -> 16". */
#include "train/checkpoint.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The shortest %g text that reads back to x (equal values give equal text). */
static void put_double(CheckpointSettings *cs, const char *key, double x)
{
    char buf[40];
    for (int digits = 6; digits <= 17; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, x);
        if (strtod(buf, NULL) == x) break;
    }
    checkpoint_settings_add(cs, key, "%s", buf);
}

static void put_int(CheckpointSettings *cs, const char *key, long long v) { checkpoint_settings_add(cs, key, "%lld", v); }

void checkpoint_settings_add(CheckpointSettings *cs, const char *key, const char *fmt, ...)
{
    int i = 0;
    while (i < cs->n && strcmp(cs->s[i].key, key) != 0) i++;
    HPC_ASSERT(i < CHECKPOINT_SETTINGS_MAX);
    if (i == cs->n) cs->n++;
    snprintf(cs->s[i].key, sizeof cs->s[i].key, "%s", key);
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cs->s[i].value, sizeof cs->s[i].value, fmt, ap);
    va_end(ap);
}

const char *checkpoint_settings_get(const CheckpointSettings *cs, const char *key)
{
    for (int i = 0; i < cs->n; i++)
        if (strcmp(cs->s[i].key, key) == 0) return cs->s[i].value;
    return NULL;
}

void checkpoint_settings_init(CheckpointSettings *cs, const ModelSpec *spec, SpecPrecision policy,
                              int64_t total_steps)
{
    const SpecTraining *t = &spec->train;
    cs->n = 0;
    put_int(cs, "steps", (long long)total_steps);
    checkpoint_settings_add(cs, "seed", "%llu", (unsigned long long)t->seed);
    checkpoint_settings_add(cs, "policy", "%s", spec_precision_name(policy == PREC_DEFAULT ? PREC_FP32 : policy));
    checkpoint_settings_add(cs, "optimizer", "%s", spec_optimizer_name(t->optimizer));
    put_double(cs, "lr", t->lr);
    put_double(cs, "beta1", t->beta1);
    put_double(cs, "beta2", t->beta2);
    put_double(cs, "eps", t->eps);
    put_double(cs, "weight_decay", t->weight_decay);
    put_double(cs, "momentum", t->momentum);
    checkpoint_settings_add(cs, "nesterov", "%s", t->nesterov ? "true" : "false");
    checkpoint_settings_add(cs, "schedule", "%s", spec_schedule_name(t->schedule));
    put_int(cs, "warmup_steps", (long long)t->warmup_steps);
    put_double(cs, "warmup_ratio", t->warmup_ratio);
    put_double(cs, "min_lr_ratio", t->min_lr_ratio);
    put_double(cs, "clip_grad_norm", t->max_grad_norm);
    checkpoint_settings_add(cs, "loss_scale", "%s", spec_loss_scaling_name(t->loss_scaling));
    put_double(cs, "scale_init", t->scale_init);
    put_double(cs, "scale_growth", t->scale_growth);
    put_double(cs, "scale_backoff", t->scale_backoff);
    put_int(cs, "scale_interval", (long long)t->scale_interval);
    put_int(cs, "max_skips", (long long)t->max_skipped_steps);
    put_int(cs, "batch", (long long)t->batch_size);
    put_int(cs, "grad_accum", (long long)t->grad_accum);
    put_int(cs, "seq_len", (long long)t->max_seq_len);
    checkpoint_settings_add(cs, "freeze_embeddings", "%s", t->freeze_embeddings ? "true" : "false");
    put_int(cs, "freeze_layers", (long long)t->freeze_layers);
    put_double(cs, "dropout", spec->stack.hidden_dropout);
    put_double(cs, "attention_dropout", spec->stack.attention_dropout);
    put_double(cs, "classifier_dropout", spec->head.classifier_dropout);
}
