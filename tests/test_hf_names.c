/* tests/test_hf_names.c — loading Hugging Face checkpoints into hpc's
 * parameters.  Each test writes a tiny checkpoint with the tensor names
 * and layouts transformers uses for that family (from its modeling code:
 * BertModel, RobertaForSequenceClassification, DistilBertFor...,
 * GPT2Model with Conv1D weights stored (in, out)), random values, then
 * checks every parameter resolves and that chosen parameters hold exactly
 * the expected elements, addressed independently of hf_names.c. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cpu/half.h"
#include "formats/hf_names.h"
#include "lower.h"
#include "cpu/philox.h"

enum { V = 11, P = 12, H = 8, F = 16, NL = 3 };

typedef struct {
    StWriter w;
    void *bufs[256];
    int n;
    StDtype dtype;
} Ckpt;

static void ck_add(Ckpt *c, const char *name, int64_t d0, int64_t d1)
{
    int64_t shape[2] = {d0, d1};
    int ndim = d1 ? 2 : 1;
    int64_t n = d0 * (d1 ? d1 : 1);
    HpcError err = {0};
    if (c->dtype == ST_BF16) {
        uint16_t *b = malloc((size_t)n * 2);
        for (int64_t k = 0; k < n; k++) b[k] = bf16_from_f32(philox_normal(5, (uint64_t)k, (uint32_t)c->n));
        c->bufs[c->n++] = b;
    } else {
        float *x = malloc((size_t)n * 4);
        for (int64_t k = 0; k < n; k++) x[k] = philox_normal(5, (uint64_t)k, (uint32_t)c->n);
        c->bufs[c->n++] = x;
    }
    cr_assert_eq(st_writer_add(&c->w, name, c->dtype, ndim, shape, c->bufs[c->n - 1], &err), HPC_OK, "%s", err.msg);
}

/* Writes c to a temporary file and opens it. */
static StFile *ck_open(Ckpt *c)
{
    char path[128];
    snprintf(path, sizeof path, "/tmp/hpc_test_names_%d.safetensors", (int)getpid());
    HpcError err = {0};
    cr_assert_eq(st_writer_save(&c->w, path, &err), HPC_OK, "%s", err.msg);
    StFile *f;
    cr_assert_eq(st_open(path, &f, &err), HPC_OK, "%s", err.msg);
    unlink(path);   /* the mapping stays valid */
    for (int i = 0; i < c->n; i++) free(c->bufs[i]);
    st_writer_free(&c->w);
    return f;
}

static void tiny_spec(ModelSpec *s, SpecStackKind kind, SpecHeadKind head)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "tiny");
    s->stack.kind = kind;
    s->stack.vocab_size = V;
    s->stack.max_positions = P;
    s->stack.hidden = H;
    s->stack.heads = 2;
    s->stack.ffn = F;
    s->stack.layers = 2;
    s->head.kind = head;
    s->head.num_labels = NL;
    if (kind == STACK_DECODER) {
        s->stack.norm = NORM_PRE;
        s->stack.attention = ATTN_CAUSAL;
        s->stack.embedding_ln = false;
        s->stack.final_ln = true;
        s->stack.type_vocab_size = 0;
        s->head.pooler = false;
        s->head.decoder_bias = false;
    }
}

static void lower_params(const ModelSpec *s, ParamList *pl)
{
    IrGraph g;
    HpcError err = {0};
    ir_init(&g);
    params_init(pl);
    cr_assert_eq(lower_model(s, &g, pl, &err), HPC_OK, "%s", err.msg);
    ir_free(&g);
}

static float hf_at(const StFile *f, const char *hf, int64_t k)
{
    const StTensor *t = st_find(f, hf);
    cr_assert_not_null(t, "fixture lacks %s", hf);
    cr_assert(k >= 0 && (uint64_t)k < t->numel);
    if (t->dtype == ST_BF16) {
        uint16_t b;
        memcpy(&b, (const char *)t->data + 2 * k, 2);
        return bf16_to_f32(b);
    }
    float x;
    memcpy(&x, (const char *)t->data + 4 * k, 4);
    return x;
}

static float *load(const char *family, const StFile *f, const ParamList *pl, const char *param, int64_t *out,
                   int64_t *in)
{
    int i = params_find(pl, param);
    cr_assert(i >= 0, "lowering has no parameter %s", param);
    const ParamInfo *p = &pl->p[i];
    *out = p->dims[0];
    *in = p->rank == 2 ? p->dims[1] : 1;
    float *dst = malloc((size_t)(*out * *in) * sizeof *dst);
    HpcError err = {0};
    cr_assert_eq(hf_names_load(family, f, p, dst, &err), HPC_OK, "%s", err.msg);
    return dst;
}

/* hpc param (out, in) == HF tensor (out, in) element for element. */
static void expect_copy(const char *family, const StFile *f, const ParamList *pl, const char *param, const char *hf)
{
    int64_t out, in;
    float *x = load(family, f, pl, param, &out, &in);
    for (int64_t k = 0; k < out * in; k++)
        cr_assert_eq(x[k], hf_at(f, hf, k), "%s[%lld] != %s", param, (long long)k, hf);
    free(x);
}

/* hpc param (out, in) == block `part` of a Conv1D weight (in, parts*out), transposed. */
static void expect_conv1d(const StFile *f, const ParamList *pl, const char *param, const char *hf, int part,
                          int parts)
{
    int64_t out, in;
    float *x = load("gpt2", f, pl, param, &out, &in);
    bool bias = in == 1;
    for (int64_t o = 0; o < out; o++)
        for (int64_t i = 0; i < in; i++) {
            int64_t k = bias ? part * out + o : i * (parts * out) + part * out + o;
            cr_assert_eq(x[o * in + i], hf_at(f, hf, k), "%s[%lld, %lld] != %s", param, (long long)o,
                         (long long)i, hf);
        }
    free(x);
}

static void expect_all_resolve(const char *family, const StFile *f, const ParamList *pl)
{
    HpcError err = {0};
    cr_expect_eq(hf_names_check(family, f, pl, NULL, 0, NULL, &err), HPC_OK, "%s", err.msg);
}

static void bert_layer(Ckpt *c, const char *pre, int l, bool legacy_ln)
{
    char n[160];
    const char *lin[] = {"attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"};
    for (int i = 0; i < 4; i++) {
        snprintf(n, sizeof n, "%s.encoder.layer.%d.%s.weight", pre, l, lin[i]);
        ck_add(c, n, H, H);
        snprintf(n, sizeof n, "%s.encoder.layer.%d.%s.bias", pre, l, lin[i]);
        ck_add(c, n, H, 0);
    }
    const char *lns[] = {"attention.output.LayerNorm", "output.LayerNorm"};
    for (int i = 0; i < 2; i++) {
        snprintf(n, sizeof n, "%s.encoder.layer.%d.%s.%s", pre, l, lns[i], legacy_ln ? "gamma" : "weight");
        ck_add(c, n, H, 0);
        snprintf(n, sizeof n, "%s.encoder.layer.%d.%s.%s", pre, l, lns[i], legacy_ln ? "beta" : "bias");
        ck_add(c, n, H, 0);
    }
    snprintf(n, sizeof n, "%s.encoder.layer.%d.intermediate.dense.weight", pre, l);
    ck_add(c, n, F, H);
    snprintf(n, sizeof n, "%s.encoder.layer.%d.intermediate.dense.bias", pre, l);
    ck_add(c, n, F, 0);
    snprintf(n, sizeof n, "%s.encoder.layer.%d.output.dense.weight", pre, l);
    ck_add(c, n, H, F);
    snprintf(n, sizeof n, "%s.encoder.layer.%d.output.dense.bias", pre, l);
    ck_add(c, n, H, 0);
}

static void bert_embeddings(Ckpt *c, const char *pre, int64_t types, bool legacy_ln)
{
    char n[160];
    snprintf(n, sizeof n, "%s.embeddings.word_embeddings.weight", pre);
    ck_add(c, n, V, H);
    snprintf(n, sizeof n, "%s.embeddings.position_embeddings.weight", pre);
    ck_add(c, n, P, H);
    if (types) {
        snprintf(n, sizeof n, "%s.embeddings.token_type_embeddings.weight", pre);
        ck_add(c, n, types, H);
    }
    snprintf(n, sizeof n, "%s.embeddings.LayerNorm.%s", pre, legacy_ln ? "gamma" : "weight");
    ck_add(c, n, H, 0);
    snprintf(n, sizeof n, "%s.embeddings.LayerNorm.%s", pre, legacy_ln ? "beta" : "bias");
    ck_add(c, n, H, 0);
}

Test(hf_names, bert_for_sequence_classification_with_legacy_layernorm)
{
    Ckpt c = {.dtype = ST_F32};
    st_writer_init(&c.w);
    bert_embeddings(&c, "bert", 2, true);
    for (int l = 0; l < 2; l++) bert_layer(&c, "bert", l, true);
    ck_add(&c, "bert.pooler.dense.weight", H, H);
    ck_add(&c, "bert.pooler.dense.bias", H, 0);
    ck_add(&c, "classifier.weight", NL, H);
    ck_add(&c, "classifier.bias", NL, 0);
    ck_add(&c, "cls.seq_relationship.weight", 2, H);   /* a head hpc does not have */
    StFile *f = ck_open(&c);
    ModelSpec s;
    ParamList pl;
    tiny_spec(&s, STACK_ENCODER, HEAD_SEQ_CLASSIFICATION);
    lower_params(&s, &pl);
    expect_all_resolve("bert", f, &pl);
    expect_copy("bert", f, &pl, "bert.embeddings.word_embeddings.weight", "bert.embeddings.word_embeddings.weight");
    expect_copy("bert", f, &pl, "bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.gamma");
    expect_copy("bert", f, &pl, "bert.encoder.layer.1.attention.output.LayerNorm.bias",
                "bert.encoder.layer.1.attention.output.LayerNorm.beta");
    expect_copy("bert", f, &pl, "bert.encoder.layer.1.intermediate.dense.weight",
                "bert.encoder.layer.1.intermediate.dense.weight");
    expect_copy("bert", f, &pl, "classifier.weight", "classifier.weight");
    const char *unused[4];
    cr_expect_eq(hf_names_unused("bert", f, &pl, unused, 4), 1);
    cr_expect_str_eq(unused[0], "cls.seq_relationship.weight");
    params_free(&pl);
    st_close(f);
}

Test(hf_names, roberta_classification_head)
{
    Ckpt c = {.dtype = ST_F32};
    st_writer_init(&c.w);
    bert_embeddings(&c, "roberta", 1, false);
    for (int l = 0; l < 2; l++) bert_layer(&c, "roberta", l, false);
    ck_add(&c, "classifier.dense.weight", H, H);
    ck_add(&c, "classifier.dense.bias", H, 0);
    ck_add(&c, "classifier.out_proj.weight", NL, H);
    ck_add(&c, "classifier.out_proj.bias", NL, 0);
    StFile *f = ck_open(&c);
    ModelSpec s;
    ParamList pl;
    tiny_spec(&s, STACK_ENCODER, HEAD_SEQ_CLASSIFICATION);
    s.stack.type_vocab_size = 1;
    s.stack.position_offset = 2;
    lower_params(&s, &pl);
    expect_all_resolve("roberta", f, &pl);
    expect_copy("roberta", f, &pl, "bert.embeddings.token_type_embeddings.weight",
                "roberta.embeddings.token_type_embeddings.weight");
    expect_copy("roberta", f, &pl, "bert.encoder.layer.0.attention.self.value.bias",
                "roberta.encoder.layer.0.attention.self.value.bias");
    expect_copy("roberta", f, &pl, "bert.pooler.dense.weight", "classifier.dense.weight");
    expect_copy("roberta", f, &pl, "classifier.weight", "classifier.out_proj.weight");
    expect_copy("roberta", f, &pl, "classifier.bias", "classifier.out_proj.bias");
    cr_expect_eq(hf_names_unused("roberta", f, &pl, NULL, 0), 0);
    params_free(&pl);
    st_close(f);
}

Test(hf_names, roberta_masked_lm_head)
{
    Ckpt c = {.dtype = ST_F32};
    st_writer_init(&c.w);
    bert_embeddings(&c, "roberta", 1, false);
    for (int l = 0; l < 2; l++) bert_layer(&c, "roberta", l, false);
    ck_add(&c, "lm_head.dense.weight", H, H);
    ck_add(&c, "lm_head.dense.bias", H, 0);
    ck_add(&c, "lm_head.layer_norm.weight", H, 0);
    ck_add(&c, "lm_head.layer_norm.bias", H, 0);
    ck_add(&c, "lm_head.bias", V, 0);
    StFile *f = ck_open(&c);
    ModelSpec s;
    ParamList pl;
    tiny_spec(&s, STACK_ENCODER, HEAD_MASKED_LM);
    s.stack.type_vocab_size = 1;
    s.head.decoder_bias = true;
    lower_params(&s, &pl);
    expect_all_resolve("roberta", f, &pl);
    expect_copy("roberta", f, &pl, "cls.predictions.transform.dense.weight", "lm_head.dense.weight");
    expect_copy("roberta", f, &pl, "cls.predictions.transform.LayerNorm.bias", "lm_head.layer_norm.bias");
    expect_copy("roberta", f, &pl, "cls.predictions.bias", "lm_head.bias");
    params_free(&pl);
    st_close(f);
}

Test(hf_names, distilbert_bf16_converts)
{
    Ckpt c = {.dtype = ST_BF16};
    char n[160];
    st_writer_init(&c.w);
    ck_add(&c, "distilbert.embeddings.word_embeddings.weight", V, H);
    ck_add(&c, "distilbert.embeddings.position_embeddings.weight", P, H);
    ck_add(&c, "distilbert.embeddings.LayerNorm.weight", H, 0);
    ck_add(&c, "distilbert.embeddings.LayerNorm.bias", H, 0);
    for (int l = 0; l < 2; l++) {
        const char *lin[] = {"attention.q_lin", "attention.k_lin", "attention.v_lin", "attention.out_lin"};
        for (int i = 0; i < 4; i++) {
            snprintf(n, sizeof n, "distilbert.transformer.layer.%d.%s.weight", l, lin[i]);
            ck_add(&c, n, H, H);
            snprintf(n, sizeof n, "distilbert.transformer.layer.%d.%s.bias", l, lin[i]);
            ck_add(&c, n, H, 0);
        }
        const char *lns[] = {"sa_layer_norm", "output_layer_norm"};
        for (int i = 0; i < 2; i++) {
            snprintf(n, sizeof n, "distilbert.transformer.layer.%d.%s.weight", l, lns[i]);
            ck_add(&c, n, H, 0);
            snprintf(n, sizeof n, "distilbert.transformer.layer.%d.%s.bias", l, lns[i]);
            ck_add(&c, n, H, 0);
        }
        snprintf(n, sizeof n, "distilbert.transformer.layer.%d.ffn.lin1.weight", l);
        ck_add(&c, n, F, H);
        snprintf(n, sizeof n, "distilbert.transformer.layer.%d.ffn.lin1.bias", l);
        ck_add(&c, n, F, 0);
        snprintf(n, sizeof n, "distilbert.transformer.layer.%d.ffn.lin2.weight", l);
        ck_add(&c, n, H, F);
        snprintf(n, sizeof n, "distilbert.transformer.layer.%d.ffn.lin2.bias", l);
        ck_add(&c, n, H, 0);
    }
    ck_add(&c, "pre_classifier.weight", H, H);
    ck_add(&c, "pre_classifier.bias", H, 0);
    ck_add(&c, "classifier.weight", NL, H);
    ck_add(&c, "classifier.bias", NL, 0);
    StFile *f = ck_open(&c);
    ModelSpec s;
    ParamList pl;
    tiny_spec(&s, STACK_ENCODER, HEAD_SEQ_CLASSIFICATION);
    s.stack.type_vocab_size = 0;
    s.head.pooler_activation = ACT_RELU;
    lower_params(&s, &pl);
    expect_all_resolve("distilbert", f, &pl);
    expect_copy("distilbert", f, &pl, "bert.encoder.layer.1.attention.self.key.weight",
                "distilbert.transformer.layer.1.attention.k_lin.weight");
    expect_copy("distilbert", f, &pl, "bert.encoder.layer.0.attention.output.LayerNorm.weight",
                "distilbert.transformer.layer.0.sa_layer_norm.weight");
    expect_copy("distilbert", f, &pl, "bert.encoder.layer.1.output.dense.weight",
                "distilbert.transformer.layer.1.ffn.lin2.weight");
    expect_copy("distilbert", f, &pl, "bert.encoder.layer.1.output.LayerNorm.bias",
                "distilbert.transformer.layer.1.output_layer_norm.bias");
    expect_copy("distilbert", f, &pl, "bert.pooler.dense.bias", "pre_classifier.bias");
    params_free(&pl);
    st_close(f);
}

/* GPT2Model as the Hub stores gpt2: bare names (no "transformer."),
 * Conv1D (in, out) weights, c_attn holding q|k|v, causal-mask buffers. */
static StFile *gpt2_checkpoint(bool score_head)
{
    Ckpt c = {.dtype = ST_F32};
    char n[160];
    st_writer_init(&c.w);
    ck_add(&c, "wte.weight", V, H);
    ck_add(&c, "wpe.weight", P, H);
    for (int l = 0; l < 2; l++) {
        struct { const char *name; int64_t d0, d1; } t[] = {
            {"ln_1.weight", H, 0}, {"ln_1.bias", H, 0}, {"attn.c_attn.weight", H, 3 * H}, {"attn.c_attn.bias", 3 * H, 0},
            {"attn.c_proj.weight", H, H}, {"attn.c_proj.bias", H, 0}, {"ln_2.weight", H, 0}, {"ln_2.bias", H, 0},
            {"mlp.c_fc.weight", H, F}, {"mlp.c_fc.bias", F, 0}, {"mlp.c_proj.weight", F, H}, {"mlp.c_proj.bias", H, 0},
            {"attn.bias", P, P}};
        for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
            snprintf(n, sizeof n, "h.%d.%s", l, t[i].name);
            ck_add(&c, n, t[i].d0, t[i].d1);
        }
    }
    ck_add(&c, "ln_f.weight", H, 0);
    ck_add(&c, "ln_f.bias", H, 0);
    if (score_head) ck_add(&c, "score.weight", NL, H);
    return ck_open(&c);
}

Test(hf_names, gpt2_conv1d_split_and_transpose)
{
    StFile *f = gpt2_checkpoint(false);
    ModelSpec s;
    ParamList pl;
    tiny_spec(&s, STACK_DECODER, HEAD_CAUSAL_LM);
    lower_params(&s, &pl);
    expect_all_resolve("gpt2", f, &pl);
    expect_copy("gpt2", f, &pl, "transformer.embeddings.word_embeddings.weight", "wte.weight");
    expect_copy("gpt2", f, &pl, "transformer.embeddings.position_embeddings.weight", "wpe.weight");
    expect_copy("gpt2", f, &pl, "transformer.encoder.layer.1.attention.output.LayerNorm.weight", "h.1.ln_1.weight");
    expect_copy("gpt2", f, &pl, "transformer.encoder.layer.1.output.LayerNorm.bias", "h.1.ln_2.bias");
    expect_copy("gpt2", f, &pl, "transformer.ln_f.weight", "ln_f.weight");
    const char *qkv[] = {"query", "key", "value"};
    for (int part = 0; part < 3; part++) {
        char p[128];
        snprintf(p, sizeof p, "transformer.encoder.layer.1.attention.self.%s.weight", qkv[part]);
        expect_conv1d(f, &pl, p, "h.1.attn.c_attn.weight", part, 3);
        snprintf(p, sizeof p, "transformer.encoder.layer.0.attention.self.%s.bias", qkv[part]);
        expect_conv1d(f, &pl, p, "h.0.attn.c_attn.bias", part, 3);
    }
    expect_conv1d(f, &pl, "transformer.encoder.layer.0.attention.output.dense.weight", "h.0.attn.c_proj.weight", 0, 1);
    expect_conv1d(f, &pl, "transformer.encoder.layer.0.intermediate.dense.weight", "h.0.mlp.c_fc.weight", 0, 1);
    expect_conv1d(f, &pl, "transformer.encoder.layer.1.output.dense.weight", "h.1.mlp.c_proj.weight", 0, 1);
    expect_conv1d(f, &pl, "transformer.encoder.layer.1.output.dense.bias", "h.1.mlp.c_proj.bias", 0, 1);
    /* lm_head.weight is tied (no storage); attn.bias is a mask buffer. */
    cr_expect_eq(hf_names_unused("gpt2", f, &pl, NULL, 0), 0);
    params_free(&pl);
    st_close(f);
}

Test(hf_names, gpt2_score_has_no_bias)
{
    StFile *f = gpt2_checkpoint(true);
    ModelSpec s;
    ParamList pl;
    tiny_spec(&s, STACK_DECODER, HEAD_SEQ_CLASSIFICATION);
    lower_params(&s, &pl);
    expect_all_resolve("gpt2", f, &pl);
    expect_copy("gpt2", f, &pl, "classifier.weight", "score.weight");
    int64_t out, in;
    float *b = load("gpt2", f, &pl, "classifier.bias", &out, &in);
    for (int k = 0; k < NL; k++) cr_expect_eq(b[k], 0.0f);
    free(b);
    params_free(&pl);
    st_close(f);
}

Test(hf_names, mismatches_are_named)
{
    StFile *f = gpt2_checkpoint(false);
    ModelSpec s;
    ParamList pl;
    HpcError err = {0};
    tiny_spec(&s, STACK_DECODER, HEAD_CAUSAL_LM);
    s.stack.ffn = 2 * F;   /* config says 32, weights hold 16 */
    lower_params(&s, &pl);
    cr_expect_eq(hf_names_check("gpt2", f, &pl, NULL, 0, NULL, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "h.0.mlp.c_fc.weight") && strstr(err.msg, "intermediate.dense.weight") &&
              strstr(err.msg, "[8, 16]") && strstr(err.msg, "[8, 32]"), "%s", err.msg);
    params_free(&pl);

    tiny_spec(&s, STACK_DECODER, HEAD_TOKEN_CLASSIFICATION);   /* no classifier in the file */
    lower_params(&s, &pl);
    cr_expect_eq(hf_names_check("gpt2", f, &pl, NULL, 0, NULL, &err), HPC_ERR_INPUT);
    cr_expect(strstr(err.msg, "classifier.weight") && strstr(err.msg, "score.weight"), "%s", err.msg);
    /* ... unless new head parameters are allowed, as for a bare model. */
    const char *fresh[4];
    int n_new = -1;
    cr_expect_eq(hf_names_check("gpt2", f, &pl, fresh, 4, &n_new, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(n_new, 2);
    cr_expect(!strcmp(fresh[0], "classifier.weight") && !strcmp(fresh[1], "classifier.bias"));
    cr_expect(hf_names_is_head("bert.pooler.dense.weight") && hf_names_is_head("lm_head.weight"));
    cr_expect(!hf_names_is_head("transformer.ln_f.bias") && !hf_names_is_head("bert.encoder.layer.0.output.dense.bias"));
    HfTensorRef r;
    cr_expect_eq(hf_names_find("t5", f, "classifier.weight", &r, &err), HPC_ERR_USAGE);
    cr_expect_eq(hf_names_find("gpt2", f, "classifier", &r, &err), HPC_ERR_USAGE);
    params_free(&pl);
    st_close(f);
}

/* ---------------------------------------------------------------- */
/* hf_names_save -> hf_names_load gives every parameter back bitwise,  */
/* under the names transformers expects.                               */

static void save_and_reload(const char *family, const ModelSpec *s, const char *must_have, int64_t d0, int64_t d1,
                            const char *must_not_have)
{
    ParamList pl;
    lower_params(s, &pl);
    float **data = calloc((size_t)pl.n, sizeof *data);
    for (int i = 0; i < pl.n; i++) {
        if (pl.p[i].tied_to >= 0) continue;
        int64_t n = params_numel(&pl.p[i]);
        data[i] = malloc((size_t)n * sizeof **data);
        for (int64_t k = 0; k < n; k++) data[i][k] = philox_normal(9, (uint64_t)k, (uint32_t)i);
    }
    char path[128];
    snprintf(path, sizeof path, "/tmp/hpc_test_export_%d.safetensors", (int)getpid());
    HpcError err = {0};
    cr_assert_eq(hf_names_save(family, s, &pl, (const float *const *)data, path, &err), HPC_OK, "%s", err.msg);
    StFile *f;
    cr_assert_eq(st_open(path, &f, &err), HPC_OK, "%s", err.msg);
    unlink(path);
    cr_expect_str_eq(st_metadata_get(f, "format"), "pt");
    const StTensor *t = st_find(f, must_have);
    cr_expect(t && t->shape[0] == d0 && (d1 == 0 || t->shape[1] == d1), "%s: %s missing or misshapen", family,
              must_have);
    if (must_not_have) cr_expect_null(st_find(f, must_not_have), "%s: %s must not be written", family, must_not_have);
    expect_all_resolve(family, f, &pl);
    cr_expect_eq(hf_names_unused(family, f, &pl, NULL, 0), 0, "%s: every written tensor is used", family);
    for (int i = 0; i < pl.n; i++) {
        if (pl.p[i].tied_to >= 0) continue;
        int64_t n = params_numel(&pl.p[i]);
        float *back = malloc((size_t)n * sizeof *back);
        cr_assert_eq(hf_names_load(family, f, &pl.p[i], back, &err), HPC_OK, "%s", err.msg);
        bool dropped = must_not_have && strcmp(must_not_have, "score.bias") == 0 &&
                       strcmp(pl.p[i].name, "classifier.bias") == 0;   /* GPT-2 score has no bias */
        for (int64_t k = 0; k < n; k++)
            cr_assert_eq(back[k], dropped ? 0.0f : data[i][k], "%s: %s[%lld] changed", family, pl.p[i].name,
                         (long long)k);
        free(back);
        free(data[i]);
    }
    free(data);
    st_close(f);
    params_free(&pl);
}

Test(hf_names, save_reload_every_family)
{
    ModelSpec s;
    tiny_spec(&s, STACK_ENCODER, HEAD_SEQ_CLASSIFICATION);
    save_and_reload("bert", &s, "bert.pooler.dense.weight", H, H, NULL);
    s.head.kind = HEAD_MASKED_LM;
    s.head.decoder_bias = true;
    save_and_reload("bert", &s, "cls.predictions.transform.LayerNorm.weight", H, 0, "cls.predictions.decoder.weight");

    tiny_spec(&s, STACK_ENCODER, HEAD_SEQ_CLASSIFICATION);
    s.stack.type_vocab_size = 1;
    s.stack.position_offset = 2;
    save_and_reload("roberta", &s, "classifier.out_proj.weight", NL, H, NULL);
    s.head.kind = HEAD_TOKEN_CLASSIFICATION;
    save_and_reload("roberta", &s, "classifier.weight", NL, H, "classifier.out_proj.weight");

    tiny_spec(&s, STACK_ENCODER, HEAD_MASKED_LM);
    s.stack.type_vocab_size = 0;
    s.head.tie_word_embeddings = false;
    s.head.decoder_bias = true;
    save_and_reload("distilbert", &s, "vocab_projector.weight", V, H, NULL);

    tiny_spec(&s, STACK_DECODER, HEAD_CAUSAL_LM);
    save_and_reload("gpt2", &s, "transformer.h.1.attn.c_attn.weight", H, 3 * H, "lm_head.weight");
    s.head.kind = HEAD_SEQ_CLASSIFICATION;
    save_and_reload("gpt2", &s, "score.weight", NL, H, "score.bias");
}

Test(hf_names, detect_families)
{
    StFile *f = gpt2_checkpoint(false);
    cr_expect_str_eq(hf_names_detect(f), "gpt2");
    st_close(f);
    Ckpt c = {.dtype = ST_F32};
    st_writer_init(&c.w);
    bert_embeddings(&c, "roberta", 1, false);
    f = ck_open(&c);
    cr_expect_str_eq(hf_names_detect(f), "roberta");
    st_close(f);
    st_writer_init(&c.w);
    c.n = 0;
    ck_add(&c, "transformer.layer.0.attention.q_lin.weight", H, H);   /* bare DistilBertModel */
    f = ck_open(&c);
    cr_expect_str_eq(hf_names_detect(f), "distilbert");
    st_close(f);
    st_writer_init(&c.w);
    c.n = 0;
    bert_embeddings(&c, "bert", 2, false);
    f = ck_open(&c);
    cr_expect_str_eq(hf_names_detect(f), "bert");
    st_close(f);
}

/* hpc's own checkpoint (its parameter names, as a trainer would save them)
 * of a decoder reads back through the "bert" identity mapping. */
Test(hf_names, load_all_native_and_new_head)
{
    ModelSpec s;
    ParamList pl;
    tiny_spec(&s, STACK_DECODER, HEAD_CAUSAL_LM);
    lower_params(&s, &pl);
    StWriter w;
    HpcError err = {0};
    st_writer_init(&w);
    float **orig = calloc((size_t)pl.n, sizeof *orig), **back = calloc((size_t)pl.n, sizeof *back);
    for (int i = 0; i < pl.n; i++) {
        if (pl.p[i].tied_to >= 0) continue;
        int64_t n = params_numel(&pl.p[i]);
        orig[i] = malloc((size_t)n * sizeof **orig);
        back[i] = calloc((size_t)n, sizeof **back);
        for (int64_t k = 0; k < n; k++) orig[i][k] = philox_normal(13, (uint64_t)k, (uint32_t)i);
        cr_assert_eq(st_writer_add(&w, pl.p[i].name, ST_F32, pl.p[i].rank, pl.p[i].dims, orig[i], &err), HPC_OK);
    }
    char path[128];
    snprintf(path, sizeof path, "/tmp/hpc_test_native_%d.safetensors", (int)getpid());
    cr_assert_eq(st_writer_save(&w, path, &err), HPC_OK, "%s", err.msg);
    st_writer_free(&w);
    StFile *f;
    cr_assert_eq(st_open(path, &f, &err), HPC_OK, "%s", err.msg);
    unlink(path);
    cr_expect_str_eq(hf_names_detect(f), "bert");
    int n_new = -1;
    cr_assert_eq(hf_names_load_all(hf_names_detect(f), f, &pl, back, &n_new, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(n_new, 0);
    for (int i = 0; i < pl.n; i++) {
        if (orig[i])
            cr_expect_eq(memcmp(orig[i], back[i], (size_t)params_numel(&pl.p[i]) * sizeof(float)), 0, "%s",
                         pl.p[i].name);
        free(orig[i]);
        free(back[i]);
    }
    st_close(f);
    params_free(&pl);

    /* A token-classifier spec over the GPT-2 LM checkpoint: the classifier
     * is new and keeps what the store held; the rest loads. */
    f = gpt2_checkpoint(false);
    tiny_spec(&s, STACK_DECODER, HEAD_TOKEN_CLASSIFICATION);
    lower_params(&s, &pl);
    float **store = calloc((size_t)pl.n, sizeof *store);
    for (int i = 0; i < pl.n; i++) {
        store[i] = malloc((size_t)params_numel(&pl.p[i]) * sizeof **store);
        for (int64_t k = 0; k < params_numel(&pl.p[i]); k++) store[i][k] = 42.0f;
    }
    cr_assert_eq(hf_names_load_all("gpt2", f, &pl, store, &n_new, &err), HPC_OK, "%s", err.msg);
    cr_expect_eq(n_new, 2);
    int cls = params_find(&pl, "classifier.weight"), wte = params_find(&pl, "transformer.embeddings.word_embeddings.weight");
    cr_expect_eq(store[cls][0], 42.0f, "a new head parameter keeps its initial value");
    cr_expect_eq(store[wte][3], hf_at(f, "wte.weight", 3));
    for (int i = 0; i < pl.n; i++) free(store[i]);
    free(store);
    st_close(f);
    params_free(&pl);
    free(orig);
    free(back);
}
