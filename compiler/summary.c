/* compiler/summary.c — see summary.h for the formulas. */
#include "summary.h"

#include <inttypes.h>

static int64_t layer_params(const SpecStack *s)
{
    int64_t H = s->hidden, F = s->ffn;
    int64_t attention = 4 * (H * H + H);
    int64_t ffn = H * F + F + F * H + H;
    return attention + ffn + 2 * (2 * H);
}

void summary_params(const ModelSpec *spec, SummaryParams *out)
{
    const SpecStack *s = &spec->stack;
    const SpecHead *h = &spec->head;
    int64_t H = s->hidden, V = s->vocab_size;
    out->embeddings = (V + s->max_positions + s->type_vocab_size) * H + (s->embedding_ln ? 2 * H : 0);
    out->per_layer = layer_params(s);
    out->layers = out->per_layer * s->layers;
    out->final_ln = s->final_ln ? 2 * H : 0;
    out->pooler = 0;
    out->head = 0;
    switch (h->kind) {
    case HEAD_SEQ_CLASSIFICATION:
        out->pooler = h->pooler ? H * H + H : 0;
        out->head = H * h->num_labels + h->num_labels;
        break;
    case HEAD_TOKEN_CLASSIFICATION:
        out->head = H * h->num_labels + h->num_labels;
        break;
    case HEAD_MASKED_LM:
        out->pooler = H * H + H + 2 * H;
        out->head = (h->tie_word_embeddings ? 0 : V * H) + (h->decoder_bias ? V : 0);
        break;
    case HEAD_CAUSAL_LM:
        out->head = (h->tie_word_embeddings ? 0 : V * H) + (h->decoder_bias ? V : 0);
        break;
    }
    out->total = out->embeddings + out->layers + out->final_ln + out->pooler + out->head;
}

int64_t summary_param_count(const ModelSpec *spec)
{
    SummaryParams p;
    summary_params(spec, &p);
    return p.total;
}

int64_t summary_layer_flops_per_token(const ModelSpec *spec)
{
    const SpecStack *s = &spec->stack;
    int64_t H = s->hidden, F = s->ffn, L = spec->train.max_seq_len;
    return 2 * (4 * H * H + 2 * H * F) + 4 * L * H;
}

/* Head matmul FLOPs per token (see summary.h). */
static double head_flops_per_token(const ModelSpec *spec)
{
    const SpecHead *h = &spec->head;
    double H = (double)spec->stack.hidden, V = (double)spec->stack.vocab_size;
    double L = (double)spec->train.max_seq_len;
    switch (h->kind) {
    case HEAD_SEQ_CLASSIFICATION: return 2.0 * ((h->pooler ? H * H : 0) + H * (double)h->num_labels) / L;
    case HEAD_TOKEN_CLASSIFICATION: return 2.0 * H * (double)h->num_labels;
    case HEAD_MASKED_LM: return 2.0 * (H * H + V * H);
    case HEAD_CAUSAL_LM: return 2.0 * V * H;
    }
    return 0;
}

double summary_forward_flops_per_token(const ModelSpec *spec)
{
    return (double)summary_layer_flops_per_token(spec) * (double)spec->stack.layers +
           head_flops_per_token(spec);
}

double summary_train_flops_per_token(const ModelSpec *spec)
{
    return 3.0 * summary_forward_flops_per_token(spec);
}

/* 1234567 -> "1,234,567" */
static const char *commas(int64_t v, char *buf)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%" PRId64, v < 0 ? -v : v), o = 0;
    if (v < 0) buf[o++] = '-';
    for (int i = 0; i < n; i++) {
        buf[o++] = tmp[i];
        if ((n - i - 1) % 3 == 0 && i < n - 1) buf[o++] = ',';
    }
    buf[o] = '\0';
    return buf;
}

static void print_row(FILE *out, const char *part, int64_t params, int64_t total)
{
    char b[40];
    fprintf(out, "  %-28s %16s  %5.1f%%\n", part, commas(params, b), total ? 100.0 * (double)params / (double)total : 0.0);
}

static void print_params(const ModelSpec *spec, const SummaryParams *p, FILE *out)
{
    char b[40];
    fputs("parameters:\n", out);
    print_row(out, "embeddings", p->embeddings, p->total);
    for (int64_t i = 0; i < spec->stack.layers; i++) {
        char name[48];
        snprintf(name, sizeof name, "layer %" PRId64, i);
        if (spec->stack.layers > 8 && i >= 2 && i < spec->stack.layers - 2) {
            if (i == 2) fprintf(out, "  %-28s %16s  (each)\n", "...", commas(p->per_layer, b));
            continue;
        }
        print_row(out, name, p->per_layer, p->total);
    }
    if (p->final_ln) print_row(out, "final layer norm", p->final_ln, p->total);
    if (p->pooler)
        print_row(out, spec->head.kind == HEAD_MASKED_LM ? "lm transform" : "pooler", p->pooler, p->total);
    if (p->head || spec->head.kind != HEAD_CAUSAL_LM)
        print_row(out, spec->head.kind == HEAD_SEQ_CLASSIFICATION || spec->head.kind == HEAD_TOKEN_CLASSIFICATION
                           ? "classifier" : "lm decoder", p->head, p->total);
    fprintf(out, "  %-28s %16s\n", "total", commas(p->total, b));
}

static void print_layer_table(const ModelSpec *spec, FILE *out)
{
    const SpecStack *s = &spec->stack;
    int64_t H = s->hidden, F = s->ffn;
    char b[40];
    fprintf(out, "each layer (%s-LN, %s attention, %s):\n", spec_norm_name(s->norm),
            spec_attention_name(s->attention), spec_activation_name(s->activation));
    fprintf(out, "  %-28s %16s %16s\n", "part", "params", "fwd FLOPs/token");
    fprintf(out, "  %-28s %16s", "attention q,k,v,out", commas(4 * (H * H + H), b));
    fprintf(out, " %16s\n", commas(8 * H * H, b));
    fprintf(out, "  %-28s %16s", "attention scores+context", "0");
    fprintf(out, " %16s\n", commas(4 * spec->train.max_seq_len * H, b));
    fprintf(out, "  %-28s %16s", "ffn", commas(2 * H * F + F + H, b));
    fprintf(out, " %16s\n", commas(4 * H * F, b));
    fprintf(out, "  %-28s %16s %16s\n", "layer norms", commas(4 * H, b), "-");
}

void summary_print(const ModelSpec *spec, FILE *out)
{
    const SpecStack *s = &spec->stack;
    const SpecHead *h = &spec->head;
    const SpecTraining *t = &spec->train;
    SummaryParams p;
    summary_params(spec, &p);
    fprintf(out, "model %s (%s)\n", spec->name, spec->source);
    fprintf(out, "  %s: %" PRId64 " layers, hidden %" PRId64 ", %" PRId64 " heads of %" PRId64 ", ffn %" PRId64
                 ", vocab %" PRId64 ", %" PRId64 " positions, %" PRId64 " token types\n",
            spec_stack_kind_name(s->kind), s->layers, s->hidden, s->heads, s->hidden / s->heads, s->ffn,
            s->vocab_size, s->max_positions, s->type_vocab_size);
    fprintf(out, "  head: %s", h->regression ? "regression" : spec_head_kind_name(h->kind));
    if (h->kind == HEAD_SEQ_CLASSIFICATION || h->kind == HEAD_TOKEN_CLASSIFICATION)
        fprintf(out, ", %" PRId64 " labels", h->num_labels);
    if (h->kind == HEAD_SEQ_CLASSIFICATION)
        fprintf(out, ", pooler %s", h->pooler ? spec_activation_name(h->pooler_activation) : "none");
    if (h->kind == HEAD_MASKED_LM || h->kind == HEAD_CAUSAL_LM)
        fprintf(out, ", decoder %s", h->tie_word_embeddings ? "tied to the word embeddings" : "untied");
    fputs("\n", out);
    print_params(spec, &p, out);
    print_layer_table(spec, out);
    double fwd = summary_forward_flops_per_token(spec);
    double tokens = (double)t->batch_size * (double)t->max_seq_len;
    fprintf(out, "FLOPs per token (seq_len %" PRId64 "): forward %.4g, training step %.4g (3x forward)\n",
            t->max_seq_len, fwd, 3.0 * fwd);
    fprintf(out, "FLOPs per optimizer step (%" PRId64 " x %" PRId64 " tokens x %" PRId64 " micro-batches): %.4g\n",
            t->batch_size, t->max_seq_len, t->grad_accum, 3.0 * fwd * tokens * (double)t->grad_accum);
    fprintf(out, "training: %s lr %g", spec_optimizer_name(t->optimizer), t->lr);
    if (t->optimizer != OPT_SGD) fprintf(out, " betas (%g, %g) eps %g", t->beta1, t->beta2, t->eps);
    fprintf(out, " weight_decay %g; %s schedule", t->weight_decay, spec_schedule_name(t->schedule));
    if (t->warmup_steps) fprintf(out, ", warmup %" PRId64 " steps", t->warmup_steps);
    else if (t->warmup_ratio > 0) fprintf(out, ", warmup %g of the steps", t->warmup_ratio);
    fputs("\n", out);
    fprintf(out, "  loss scale %s", spec_loss_scaling_name(t->loss_scaling));
    if (t->loss_scaling == LOSS_SCALE_DYNAMIC)
        fprintf(out, " (init %g, x%g every %" PRId64 " clean steps, x%g on overflow)", t->scale_init,
                t->scale_growth, t->scale_interval, t->scale_backoff);
    else if (t->loss_scaling == LOSS_SCALE_STATIC)
        fprintf(out, " %g", t->scale_init);
    fprintf(out, "; clip_grad_norm %g; batch %" PRId64 " x %" PRId64 " tokens", t->max_grad_norm, t->batch_size,
            t->max_seq_len);
    if (t->grad_accum > 1) fprintf(out, ", %" PRId64 " micro-batches per step", t->grad_accum);
    if (t->steps) fprintf(out, "; %" PRId64 " steps", t->steps);
    else fprintf(out, "; %" PRId64 " epochs", t->epochs);
    fprintf(out, "; seed %" PRIu64 "\n", t->seed);
    if (t->freeze_embeddings || t->freeze_layers)
        fprintf(out, "  frozen: %s%s%" PRId64 " layers\n", t->freeze_embeddings ? "embeddings" : "",
                t->freeze_embeddings ? ", " : "", t->freeze_layers);
}
