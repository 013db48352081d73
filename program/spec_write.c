/* program/spec_write.c — a ModelSpec as .model source; see spec_write in
 * spec.h.  Every number is written as the shortest decimal that reads back
 * as the same double, so spec_load of the output gives an equal spec. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program/spec.h"

/* The shortest decimal that reads back as exactly x, so that spec_load
 * of the written file gives bit-identical doubles. */
static void fmt_num(char *buf, size_t cap, double x, bool force_float)
{
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(buf, cap, "%.*g", prec, x);
        if (strtod(buf, NULL) == x) break;
    }
    /* "2e-05" -> "2e-5": the exponent without padding zeros or '+'. */
    char *e = strchr(buf, 'e');
    if (e) {
        char *d = e + 1 + (e[1] == '-');
        char *src = e[1] == '+' ? e + 2 : d;
        while (*src == '0' && src[1]) src++;
        memmove(d, src, strlen(src) + 1);
    }
    /* A ratio must not read as an integer (warmup = 1 means one step). */
    if (force_float && !strpbrk(buf, ".e")) strncat(buf, ".0", cap - strlen(buf) - 1);
}

/* before, "key = number", after */
static void put_num(FILE *out, const char *before, const char *key, double x, const char *after)
{
    char buf[40];
    fmt_num(buf, sizeof buf, x, false);
    fprintf(out, "%s%s = %s%s", before, key, buf, after);
}

static void write_stack(const SpecStack *s, FILE *out)
{
    fprintf(out, "  %s {\n", spec_stack_kind_name(s->kind));
    fprintf(out, "    vocab = %lld\n    max_positions = %lld\n    token_types = %lld\n", (long long)s->vocab_size,
            (long long)s->max_positions, (long long)s->type_vocab_size);
    if (s->position_offset) fprintf(out, "    position_offset = %lld\n", (long long)s->position_offset);
    fprintf(out, "    hidden = %lld\n    layers = %lld\n    heads = %lld\n    ffn = %lld\n", (long long)s->hidden,
            (long long)s->layers, (long long)s->heads, (long long)s->ffn);
    fprintf(out, "    activation = %s\n", spec_activation_name(s->activation));
    put_num(out, "    ", "dropout", s->hidden_dropout, "\n");
    put_num(out, "    ", "attention_dropout", s->attention_dropout, "\n");
    put_num(out, "    ", "layer_norm_eps", s->ln_eps, "\n");
    fprintf(out, "    norm = %s\n    attention = %s\n", spec_norm_name(s->norm), spec_attention_name(s->attention));
    fprintf(out, "    embedding_norm = %s\n    final_norm = %s\n", s->embedding_ln ? "true" : "false",
            s->final_ln ? "true" : "false");
    if (s->precision != PREC_DEFAULT) fprintf(out, "    precision = %s\n", spec_precision_name(s->precision));
    if (s->embedding_precision != PREC_DEFAULT)
        fprintf(out, "    embedding_precision = %s\n", spec_precision_name(s->embedding_precision));
    fputs("  }\n", out);
}

static void write_head(const SpecHead *h, FILE *out)
{
    bool lm = h->kind == HEAD_MASKED_LM || h->kind == HEAD_CAUSAL_LM;
    fprintf(out, "  head %s {", h->regression ? "regression" : spec_head_kind_name(h->kind));
    if (h->kind == HEAD_TOKEN_CLASSIFICATION || (h->kind == HEAD_SEQ_CLASSIFICATION && !h->regression))
        fprintf(out, " labels = %lld ", (long long)h->num_labels);
    if (h->kind == HEAD_SEQ_CLASSIFICATION)
        fprintf(out, " pooler = %s ", h->pooler ? spec_activation_name(h->pooler_activation) : "none");
    if (!lm) put_num(out, " ", "dropout", h->classifier_dropout, " ");
    if (lm)
        fprintf(out, " tie_embeddings = %s  decoder_bias = %s ", h->tie_word_embeddings ? "true" : "false",
                h->decoder_bias ? "true" : "false");
    if (h->precision != PREC_DEFAULT) fprintf(out, " precision = %s ", spec_precision_name(h->precision));
    fputs("}\n", out);
}

static void write_optimizer(const SpecTraining *t, FILE *out)
{
    fprintf(out, "    optimizer = %s { ", spec_optimizer_name(t->optimizer));
    put_num(out, "", "lr", t->lr, "");
    if (t->optimizer != OPT_SGD) {
        char b1[40], b2[40];
        fmt_num(b1, sizeof b1, t->beta1, false);
        fmt_num(b2, sizeof b2, t->beta2, false);
        fprintf(out, "  betas = (%s, %s)", b1, b2);
    } else {
        put_num(out, "  ", "momentum", t->momentum, "");
        fprintf(out, "  nesterov = %s", t->nesterov ? "true" : "false");
    }
    put_num(out, "  ", "eps", t->eps, "");
    put_num(out, "  ", "weight_decay", t->weight_decay, " }\n");
}

static void write_schedule(const SpecTraining *t, FILE *out)
{
    char buf[40];
    fprintf(out, "    schedule = %s { ", spec_schedule_name(t->schedule));
    if (t->warmup_steps > 0) {
        fprintf(out, "warmup = %lld", (long long)t->warmup_steps);
    } else {
        fmt_num(buf, sizeof buf, t->warmup_ratio, true);
        fprintf(out, "warmup = %s", buf);
    }
    if (t->schedule == SCHED_COSINE) put_num(out, "  ", "min_lr_ratio", t->min_lr_ratio, "");
    fputs(" }\n", out);
}

static void write_loss_scale(const SpecTraining *t, FILE *out)
{
    char buf[40];
    switch (t->loss_scaling) {
    case LOSS_SCALE_NONE: fputs("    loss_scale = none\n", out); return;
    case LOSS_SCALE_STATIC:
        fmt_num(buf, sizeof buf, t->scale_init, false);
        fprintf(out, "    loss_scale = static %s\n", buf);
        return;
    case LOSS_SCALE_DYNAMIC:
        fputs("    loss_scale = dynamic { ", out);
        put_num(out, "", "init", t->scale_init, "");
        put_num(out, "  ", "growth", t->scale_growth, "");
        put_num(out, "  ", "backoff", t->scale_backoff, "");
        fprintf(out, "  interval = %lld  max_skips = %lld }\n", (long long)t->scale_interval,
                (long long)t->max_skipped_steps);
        return;
    }
}

static void write_train(const SpecTraining *t, FILE *out)
{
    fputs("  train {\n", out);
    write_optimizer(t, out);
    write_schedule(t, out);
    write_loss_scale(t, out);
    put_num(out, "    ", "clip_grad_norm", t->max_grad_norm, "\n");
    fprintf(out, "    batch = %lld  grad_accum = %lld  seq_len = %lld  seed = %llu\n", (long long)t->batch_size,
            (long long)t->grad_accum, (long long)t->max_seq_len, (unsigned long long)t->seed);
    if (t->steps > 0) fprintf(out, "    steps = %lld\n", (long long)t->steps);
    else fprintf(out, "    epochs = %lld\n", (long long)t->epochs);
    if (t->freeze_embeddings && t->freeze_layers)
        fprintf(out, "    freeze = (embeddings, layers %lld)\n", (long long)t->freeze_layers);
    else if (t->freeze_embeddings) fputs("    freeze = embeddings\n", out);
    else if (t->freeze_layers) fprintf(out, "    freeze = layers %lld\n", (long long)t->freeze_layers);
    if (t->pack) fputs("    pack = true\n", out);
    fputs("  }\n", out);
}

void spec_write(const ModelSpec *spec, FILE *out)
{
    fprintf(out, "model %s {\n", *spec->name ? spec->name : "imported");
    write_stack(&spec->stack, out);
    write_head(&spec->head, out);
    write_train(&spec->train, out);
    fputs("}\n", out);
}
