/* compiler/artifact.c — NAME.hpc: write, read, and the resolved model
 * text; see artifact.h. */
#include "artifact.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

/* ---- the resolved model text --------------------------------------------- */

typedef struct { char *s; size_t n, cap; } Buf;

static void bprintf(Buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(Buf *b, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int need = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (b->n + (size_t)need + 1 > b->cap) {
        b->cap = (b->n + (size_t)need + 1) * 2;
        b->s = xrealloc(b->s, b->cap);
    }
    va_start(ap, fmt);
    vsnprintf(b->s + b->n, (size_t)need + 1, fmt, ap);
    va_end(ap);
    b->n += (size_t)need;
}

static const char *bool_name(bool v) { return v ? "true" : "false"; }

static const char *prec_key(SpecPrecision p)
{
    static const char *const names[] = {"default", "fp32", "fp16", "bf16"};
    return names[p];
}

static const char *act_key(SpecActivation a)
{
    static const char *const names[] = {"gelu", "gelu_tanh", "relu", "tanh"};
    return names[a];
}

/* %.17g round-trips a double; the DSL reads 1e-05 and 65536 as numbers. */
static void stack_text(Buf *b, const SpecStack *s)
{
    bprintf(b, "  %s {\n", s->kind == STACK_DECODER ? "decoder" : "encoder");
    bprintf(b, "    vocab = %" PRId64 "  max_positions = %" PRId64 "  token_types = %" PRId64
               "  position_offset = %" PRId64 "\n", s->vocab_size, s->max_positions, s->type_vocab_size,
            s->position_offset);
    bprintf(b, "    hidden = %" PRId64 "  layers = %" PRId64 "  heads = %" PRId64 "  ffn = %" PRId64 "\n",
            s->hidden, s->layers, s->heads, s->ffn);
    bprintf(b, "    activation = %s  dropout = %.17g  attention_dropout = %.17g  layer_norm_eps = %.17g\n",
            act_key(s->activation), s->hidden_dropout, s->attention_dropout, s->ln_eps);
    bprintf(b, "    norm = %s  attention = %s  embedding_norm = %s  final_norm = %s\n",
            s->norm == NORM_PRE ? "pre" : "post", s->attention == ATTN_CAUSAL ? "causal" : "bidirectional",
            bool_name(s->embedding_ln), bool_name(s->final_ln));
    bprintf(b, "    precision = %s  embedding_precision = %s\n  }\n", prec_key(s->precision),
            prec_key(s->embedding_precision));
}

static void head_text(Buf *b, const SpecHead *h)
{
    static const char *const kinds[] = {"classifier", "token_classifier", "masked_lm", "causal_lm"};
    bool lm = h->kind == HEAD_MASKED_LM || h->kind == HEAD_CAUSAL_LM;
    bprintf(b, "  head %s {\n   ", h->regression ? "regression" : kinds[h->kind]);
    if (!lm) bprintf(b, " labels = %" PRId64, h->num_labels);
    if (h->kind == HEAD_SEQ_CLASSIFICATION)
        bprintf(b, " pooler = %s", h->pooler ? act_key(h->pooler_activation) : "none");
    if (lm) bprintf(b, " tie_embeddings = %s decoder_bias = %s", bool_name(h->tie_word_embeddings),
                    bool_name(h->decoder_bias));
    bprintf(b, " dropout = %.17g precision = %s\n  }\n", h->classifier_dropout, prec_key(h->precision));
}

static void scale_text(Buf *b, const SpecTraining *t)
{
    if (t->loss_scaling == LOSS_SCALE_NONE) {
        bprintf(b, "    loss_scale = none\n");
    } else if (t->loss_scaling == LOSS_SCALE_STATIC) {
        bprintf(b, "    loss_scale = static %.17g\n", t->scale_init);
    } else {
        bprintf(b, "    loss_scale = dynamic { init = %.17g growth = %.17g backoff = %.17g interval = %" PRId64,
                t->scale_init, t->scale_growth, t->scale_backoff, t->scale_interval);
        if (t->max_skipped_steps > 0) bprintf(b, " max_skips = %" PRId64, t->max_skipped_steps);
        bprintf(b, " }\n");
    }
}

static void train_text(Buf *b, const SpecTraining *t)
{
    static const char *const opts[] = {"adamw", "adam", "sgd", "lamb"};
    static const char *const scheds[] = {"constant", "linear", "cosine"};
    bprintf(b, "  train {\n    optimizer = %s { lr = %.17g weight_decay = %.17g", opts[t->optimizer], t->lr,
            t->weight_decay);
    if (t->optimizer == OPT_SGD)   /* the checker allows these per kind */
        bprintf(b, " momentum = %.17g nesterov = %s }\n", t->momentum, bool_name(t->nesterov));
    else
        bprintf(b, " betas = (%.17g, %.17g) eps = %.17g }\n", t->beta1, t->beta2, t->eps);
    if (t->warmup_steps > 0)
        bprintf(b, "    schedule = %s { warmup = %" PRId64, scheds[t->schedule], t->warmup_steps);
    else
        bprintf(b, "    schedule = %s { warmup = %.17g", scheds[t->schedule], t->warmup_ratio);
    if (t->schedule == SCHED_COSINE) bprintf(b, " min_lr_ratio = %.17g", t->min_lr_ratio);
    bprintf(b, " }\n");
    scale_text(b, t);
    bprintf(b, "    clip_grad_norm = %.17g  batch = %" PRId64 "  grad_accum = %" PRId64 "  seq_len = %" PRId64
               "  seed = %" PRIu64 "\n", t->max_grad_norm, t->batch_size, t->grad_accum, t->max_seq_len, t->seed);
    if (t->steps > 0) bprintf(b, "    steps = %" PRId64 "\n", t->steps);
    else bprintf(b, "    epochs = %" PRId64 "\n", t->epochs);
    if (t->freeze_embeddings && t->freeze_layers > 0)
        bprintf(b, "    freeze = (embeddings, layers %" PRId64 ")\n", t->freeze_layers);
    else if (t->freeze_embeddings) bprintf(b, "    freeze = embeddings\n");
    else if (t->freeze_layers > 0) bprintf(b, "    freeze = layers %" PRId64 "\n", t->freeze_layers);
    bprintf(b, "  }\n");
}

char *artifact_model_text(const ModelSpec *spec)
{
    Buf b = {0};
    bprintf(&b, "# resolved by hpc compile from %s\nmodel %s {\n", spec->source[0] ? spec->source : "(memory)",
            spec->name);
    stack_text(&b, &spec->stack);
    head_text(&b, &spec->head);
    train_text(&b, &spec->train);
    bprintf(&b, "}\n");
    return b.s;
}

void artifact_path_for(const char *model_name, char *buf, size_t size)
{
    size_t n = 0;
    for (const char *p = model_name; *p && n + sizeof ARTIFACT_EXT < size; p++) {
        char c = *p;
        bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '_' || c == '-' || c == '.';
        buf[n++] = ok ? c : '_';
    }
    snprintf(buf + n, size - n, "%s", ARTIFACT_EXT);
}

/* ---- the container --------------------------------------------------------- */

static void put_section(FILE *f, const char *kind, const char *text)
{
    if (!text) return;
    fprintf(f, "@@ %s %zu\n", kind, strlen(text));
    fwrite(text, 1, strlen(text), f);
    fputc('\n', f);
}

HpcStatus artifact_write(const char *path, const Artifact *a, HpcError *err)
{
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return hpc_fail(err, HPC_ERR_IO, "artifact: open %s for writing: %s; check the directory is writable",
                        tmp, strerror(errno));
    fprintf(f, "%s %d\nname %s\npolicy %s\n", ARTIFACT_MAGIC, ARTIFACT_VERSION, a->name, prec_key(a->policy));
    put_section(f, "model", a->model_text);
    put_section(f, "plan", a->plan_text);
    put_section(f, "cuda", a->cuda_source);
    bool bad = ferror(f) != 0;
    if (fclose(f) != 0 || bad || rename(tmp, path) != 0) {
        int e = errno;
        remove(tmp);
        return hpc_fail(err, HPC_ERR_IO, "artifact: write %s: %s; check the disk space", path, strerror(e));
    }
    return HPC_OK;
}

static char *read_all(const char *path, size_t *len, HpcError *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        hpc_fail(err, HPC_ERR_IO, "artifact: open %s: %s", path, strerror(errno));
        return NULL;
    }
    Buf b = {0};
    char chunk[65536];
    size_t n;
    while ((n = fread(chunk, 1, sizeof chunk, f)) > 0) bprintf(&b, "%.*s", (int)n, chunk);
    fclose(f);
    if (!b.s) b.s = xcalloc(1, 1);
    *len = b.n;
    return b.s;
}

static HpcStatus bad_file(HpcError *err, const char *path, size_t off, const char *why)
{
    return hpc_fail(err, HPC_ERR_INPUT, "artifact: %s at byte %zu: %s; recompile it with `hpc compile MODEL`",
                    path, off, why);
}

/* The header lines: magic + version, name, policy. */
static HpcStatus parse_header(const char *path, const char *s, size_t len, size_t *pos, Artifact *a, HpcError *err)
{
    int version = 0, used = 0;
    if (sscanf(s, ARTIFACT_MAGIC " %d\n%n", &version, &used) < 1 || used == 0)
        return bad_file(err, path, 0, "not an hpc artifact (no " ARTIFACT_MAGIC " header)");
    if (version > ARTIFACT_VERSION)
        return bad_file(err, path, 0, "written by a newer hpc (format version too new)");
    char name[128] = "", pol[16] = "";
    int n2 = 0;
    if (sscanf(s + used, "name %127s\npolicy %15s\n%n", name, pol, &n2) < 2 || n2 == 0)
        return bad_file(err, path, (size_t)used, "the name and policy lines are missing");
    snprintf(a->name, sizeof a->name, "%s", name);
    a->policy = PREC_DEFAULT;
    for (SpecPrecision p = PREC_DEFAULT; p <= PREC_BF16; p++)
        if (strcmp(pol, prec_key(p)) == 0) a->policy = p;
    *pos = (size_t)(used + n2);
    return *pos <= len ? HPC_OK : bad_file(err, path, len, "truncated header");
}

static HpcStatus parse_sections(const char *path, const char *s, size_t len, size_t pos, Artifact *a, HpcError *err)
{
    while (pos < len) {
        char kind[16];
        size_t bytes = 0;
        int used = 0;
        if (sscanf(s + pos, "@@ %15s %zu\n%n", kind, &bytes, &used) < 2 || used == 0)
            return bad_file(err, path, pos, "expected a section line '@@ KIND BYTES'");
        pos += (size_t)used;
        if (bytes > len - pos) return bad_file(err, path, pos, "truncated section");
        char *text = xmalloc(bytes + 1);
        memcpy(text, s + pos, bytes);
        text[bytes] = '\0';
        char **slot = strcmp(kind, "model") == 0 ? &a->model_text : strcmp(kind, "plan") == 0 ? &a->plan_text
                    : strcmp(kind, "cuda") == 0 ? &a->cuda_source : NULL;
        if (slot) {
            free(*slot);
            *slot = text;
        } else {
            free(text);   /* a newer writer's section: skipped */
        }
        pos += bytes + (pos + bytes < len && s[pos + bytes] == '\n');
    }
    return a->model_text ? HPC_OK : bad_file(err, path, len, "no model section");
}

HpcStatus artifact_read(const char *path, Artifact *a, HpcError *err)
{
    memset(a, 0, sizeof *a);
    size_t len = 0, pos = 0;
    char *s = read_all(path, &len, err);
    if (!s) return err->code;
    HpcStatus st = parse_header(path, s, len, &pos, a, err);
    if (!st) st = parse_sections(path, s, len, pos, a, err);
    free(s);
    if (st) artifact_free(a);
    return st;
}

void artifact_free(Artifact *a)
{
    free(a->model_text);
    free(a->plan_text);
    free(a->cuda_source);
    memset(a, 0, sizeof *a);
}

HpcStatus artifact_load_spec(const char *path, ModelSpec *spec, SpecPrecision *policy, FILE *diag,
                             HpcError *err)
{
    Artifact a;
    HpcStatus st = artifact_read(path, &a, err);
    if (st) return st;
    int nerr = spec_load_string(path, a.model_text, strlen(a.model_text), NULL, spec, diag);
    if (nerr)
        st = hpc_fail(err, HPC_ERR_INPUT, "artifact: the model text in %s does not check (%d errors above); "
                      "recompile it with `hpc compile MODEL`", path, nerr);
    if (!st && policy) *policy = a.policy;
    artifact_free(&a);
    return st;
}
