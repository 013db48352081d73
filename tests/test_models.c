/* tests/test_models.c — every shipped model loads and has exactly the
 * parameter count of its Hugging Face counterpart.
 *
 * The counts are those printed by transformers 5.17 for
 * sum(p.numel() for p in Model(config).parameters()) with the models' stock
 * configs (num_labels = 2 for the classifiers):
 *   BertForSequenceClassification bert-base-uncased      109,483,778
 *   BertForSequenceClassification bert-large-uncased     335,143,938
 *   BertForSequenceClassification google/bert_uncased_L-2_H-128_A-2  4,386,178
 *   BertForSequenceClassification microsoft/MiniLM-L12-H384-uncased  33,360,770
 *   DistilBertForSequenceClassification distilbert-base-uncased      66,955,010
 *   RobertaForSequenceClassification roberta-base        124,647,170
 *   GPT2LMHeadModel gpt2                                 124,439,808
 *   BertForMaskedLM bert-base-uncased                    109,514,298
 * Run from the repository root, or set HPC_ROOT. */
#include <criterion/criterion.h>
#include <glob.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "program/spec.h"
#include "compiler/spec_load.h"
#include "summary.h"

static void load_model(const char *name, ModelSpec *spec)
{
    const char *root = getenv("HPC_ROOT");
    char path[512];
    snprintf(path, sizeof path, "%s/models/%s.model", root ? root : ".", name);
    int rc = spec_load(path, spec, stderr);
    cr_assert_eq(rc, 0, "%s did not load (rc %d)", path, rc);
    cr_assert_str_eq(spec->name, name);
}

static void expect_count(const char *name, int64_t want)
{
    ModelSpec spec;
    load_model(name, &spec);
    int64_t got = summary_param_count(&spec);
    cr_expect_eq(got, want, "%s: %lld parameters, transformers has %lld", name, (long long)got, (long long)want);
}

Test(counts, bert_base) { expect_count("bert_base", 109483778); }
Test(counts, bert_large) { expect_count("bert_large", 335143938); }
Test(counts, bert_tiny) { expect_count("bert_tiny", 4386178); }
Test(counts, minilm_l12_h384) { expect_count("minilm_l12_h384", 33360770); }
Test(counts, distilbert_base) { expect_count("distilbert_base", 66955010); }
Test(counts, roberta_base) { expect_count("roberta_base", 124647170); }
Test(counts, gpt2_small) { expect_count("gpt2_small", 124439808); }
Test(counts, bert_base_mlm) { expect_count("bert_base_mlm", 109514298); }

/* The parts add up to the total, and match BertModel's modules. */
Test(parts, bert_base_parts)
{
    ModelSpec spec;
    load_model("bert_base", &spec);
    SummaryParams p;
    summary_params(&spec, &p);
    /* BertEmbeddings: (30522 + 512 + 2) * 768 + LayerNorm 2 * 768 */
    cr_expect_eq(p.embeddings, 23837184);
    /* BertLayer: 4 * (768*768 + 768) + 2 * 768*3072 + 3072 + 768 + 2 * 2 * 768 */
    cr_expect_eq(p.per_layer, 7087872);
    cr_expect_eq(p.layers, 12 * 7087872);
    cr_expect_eq(p.pooler, 768 * 768 + 768);
    cr_expect_eq(p.head, 768 * 2 + 2);
    cr_expect_eq(p.final_ln, 0);
    cr_expect_eq(p.total, p.embeddings + p.layers + p.pooler + p.head);
}

Test(parts, gpt2_has_final_ln_and_a_tied_head)
{
    ModelSpec spec;
    load_model("gpt2_small", &spec);
    SummaryParams p;
    summary_params(&spec, &p);
    cr_expect_eq(p.embeddings, (50257 + 1024) * 768);
    cr_expect_eq(p.final_ln, 2 * 768);
    cr_expect_eq(p.head, 0);
    cr_expect_eq(p.pooler, 0);
    /* Untying the decoder adds a vocab x hidden matrix. */
    spec.head.tie_word_embeddings = false;
    cr_expect_eq(summary_param_count(&spec), 124439808 + 50257LL * 768);
}

Test(spec, gpt2_small_is_a_pre_ln_decoder)
{
    ModelSpec s;
    load_model("gpt2_small", &s);
    cr_expect_eq(s.stack.kind, STACK_DECODER);
    cr_expect_eq(s.stack.norm, NORM_PRE);
    cr_expect_eq(s.stack.attention, ATTN_CAUSAL);
    cr_expect_eq(s.stack.activation, ACT_GELU_TANH);
    cr_expect(s.stack.final_ln && !s.stack.embedding_ln);
    cr_expect_eq(s.stack.type_vocab_size, 0);
    cr_expect_eq(s.head.kind, HEAD_CAUSAL_LM);
    cr_expect(s.head.tie_word_embeddings && !s.head.decoder_bias);
    cr_expect_eq(s.train.max_seq_len, 1024);
}

Test(spec, roberta_and_distilbert_quirks)
{
    ModelSpec s;
    load_model("roberta_base", &s);
    cr_expect_eq(s.stack.position_offset, 2);
    cr_expect_eq(s.stack.max_positions, 514);
    cr_expect_eq(s.stack.type_vocab_size, 1);
    cr_expect_eq(s.stack.ln_eps, 1e-5);
    load_model("distilbert_base", &s);
    cr_expect_eq(s.stack.type_vocab_size, 0);
    cr_expect_eq(s.stack.layers, 6);
    cr_expect(s.head.pooler);
    cr_expect_eq(s.head.pooler_activation, ACT_RELU);
    cr_expect_eq(s.head.classifier_dropout, 0.2);
}

Test(spec, bert_large_extends_bert_base)
{
    ModelSpec s;
    load_model("bert_large", &s);
    cr_expect_eq(s.stack.hidden, 1024);
    cr_expect_eq(s.stack.layers, 24);
    cr_expect_eq(s.stack.heads, 16);
    cr_expect_eq(s.stack.ffn, 4096);
    cr_expect_eq(s.stack.vocab_size, 30522);   /* from bert_base */
    cr_expect_eq(s.train.lr, 2e-5);            /* from bert_base */
    cr_expect_eq(s.train.batch_size, 16);
    cr_expect_eq(s.train.grad_accum, 2);
}

Test(spec, classifiers_use_cola_fine_tuning_settings)
{
    static const char *const names[] = {"bert_base", "bert_large", "distilbert_base", "roberta_base"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        ModelSpec s;
        load_model(names[i], &s);
        cr_expect_eq(s.head.kind, HEAD_SEQ_CLASSIFICATION, "%s", names[i]);
        cr_expect_eq(s.head.num_labels, 2, "%s", names[i]);
        cr_expect_eq(s.train.lr, 2e-5, "%s", names[i]);
        cr_expect_eq(s.train.max_seq_len, 128, "%s", names[i]);
        cr_expect_eq(s.train.epochs, 3, "%s", names[i]);
        cr_expect_eq(s.train.schedule, SCHED_LINEAR, "%s", names[i]);
        cr_expect_eq(s.train.loss_scaling, LOSS_SCALE_DYNAMIC, "%s", names[i]);
    }
    ModelSpec t;
    load_model("bert_tiny", &t);
    cr_expect_eq(t.train.lr, 1e-3);
    cr_expect_eq(t.train.max_seq_len, 64);
}

/* FLOPs per token from the formula in summary.h, computed here longhand. */
Test(flops, bert_base_and_gpt2)
{
    ModelSpec s;
    load_model("bert_base", &s);
    double H = 768, F = 3072, L = 128, layers = 12;
    double per_layer = 2 * (4 * H * H + 2 * H * F) + 4 * L * H;
    double head = 2 * (H * H + H * 2) / L;
    cr_expect_float_eq(summary_forward_flops_per_token(&s), layers * per_layer + head, 1e-6);
    cr_expect_float_eq(summary_train_flops_per_token(&s), 3 * (layers * per_layer + head), 1e-6);
    load_model("gpt2_small", &s);
    L = 1024;
    per_layer = 2 * (4 * H * H + 2 * H * F) + 4 * L * H;
    cr_expect_float_eq(summary_forward_flops_per_token(&s), layers * per_layer + 2 * 50257 * H, 1e-6);
}

/* Any model file anyone adds must at least load. */
Test(all, every_model_file_loads)
{
    const char *root = getenv("HPC_ROOT");
    char pattern[512];
    snprintf(pattern, sizeof pattern, "%s/models/*.model", root ? root : ".");
    glob_t g;
    cr_assert_eq(glob(pattern, 0, NULL, &g), 0, "no models under %s", pattern);
    cr_expect_geq(g.gl_pathc, 8u);
    for (size_t i = 0; i < g.gl_pathc; i++) {
        ModelSpec s;
        cr_expect_eq(spec_load(g.gl_pathv[i], &s, stderr), 0, "%s", g.gl_pathv[i]);
        cr_expect_gt(summary_param_count(&s), 0);
    }
    globfree(&g);
}

Test(summary, print_names_the_parts)
{
    ModelSpec s;
    load_model("bert_base", &s);
    char *buf = NULL;
    size_t size = 0;
    FILE *f = open_memstream(&buf, &size);
    summary_print(&s, f);
    fclose(f);
    cr_expect_not_null(strstr(buf, "model bert_base"));
    cr_expect_not_null(strstr(buf, "  total                             109,483,778\n"));
    cr_expect_not_null(strstr(buf, "  embeddings                         23,837,184"));
    cr_expect_not_null(strstr(buf, "  pooler                                590,592"));
    free(buf);
}
