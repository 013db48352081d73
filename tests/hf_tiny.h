/* tests/hf_tiny.h — the tiny Hugging Face folder the HF tests share: a
 * BertForSequenceClassification config (hidden 32, 2 layers, 4 heads, FFN 37,
 * 64 positions, the real 30522-token vocabulary), tokenizer_config.json
 * (do_lower_case true), vocab.txt copied from ROOT/data/vocab, and varied
 * random weights (LayerNorm gammas near 1) written through hf_names_save.
 * Header-only: each test binary includes it once. */
#ifndef HPC_TESTS_HF_TINY_H
#define HPC_TESTS_HF_TINY_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "formats/hf_config.h"
#include "formats/hf_names.h"
#include "lower.h"

#define HF_TINY_VOCAB "data/vocab/bert-base-uncased-vocab.txt"

static void hf_tiny_write(const char *dir, const char *name, const char *text)
{
    char p[4096 + 64];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    FILE *f = fopen(p, "w");
    cr_assert(f, "create %s", p);
    fputs(text, f);
    fclose(f);
}

/* Makes dir (which must not exist) as above; root is the repository. */
static void hf_tiny_make(const char *root, const char *dir)
{
    char path[4096 + 96], line[4096];
    cr_assert_eq(mkdir(dir, 0755), 0, "mkdir %s", dir);
    hf_tiny_write(dir, "config.json",
                  "{\"architectures\": [\"BertForSequenceClassification\"], \"model_type\": \"bert\",\n"
                  " \"vocab_size\": 30522, \"hidden_size\": 32, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,\n"
                  " \"intermediate_size\": 37, \"hidden_act\": \"gelu\", \"hidden_dropout_prob\": 0.1,\n"
                  " \"attention_probs_dropout_prob\": 0.1, \"max_position_embeddings\": 64, \"type_vocab_size\": 2,\n"
                  " \"layer_norm_eps\": 1e-12, \"pad_token_id\": 0, \"num_labels\": 2}\n");
    hf_tiny_write(dir, "tokenizer_config.json", "{\"do_lower_case\": true, \"tokenizer_class\": \"BertTokenizer\"}\n");
    snprintf(path, sizeof path, "%s/%s", root, HF_TINY_VOCAB);
    FILE *in = fopen(path, "r");
    snprintf(path, sizeof path, "%s/vocab.txt", dir);
    FILE *out = fopen(path, "w");
    cr_assert(in && out, "copy the vocabulary into %s", path);
    while (fgets(line, sizeof line, in)) fputs(line, out);
    fclose(in);
    fclose(out);
    ModelSpec spec;
    HfConfigInfo info;
    HpcError err = {0};
    snprintf(path, sizeof path, "%s/config.json", dir);
    cr_assert_eq(hf_config_load(path, NULL, &spec, &info, &err), HPC_OK, "%s", err.msg);
    IrGraph g;
    ParamList pl;
    ir_init(&g);
    params_init(&pl);
    cr_assert_eq(lower_model(&spec, &g, &pl, &err), HPC_OK, "%s", err.msg);
    float **w = calloc((size_t)pl.n, sizeof *w);
    uint64_t x = 88172645463325252ull;   /* xorshift: the weights only need to be varied */
    for (int i = 0; i < pl.n; i++) {
        if (pl.p[i].tied_to >= 0) continue;
        int64_t n = params_numel(&pl.p[i]);
        w[i] = malloc((size_t)n * sizeof **w);
        for (int64_t k = 0; k < n; k++) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            w[i][k] = (float)((double)(x >> 11) / 9007199254740992.0 - 0.5) * 0.1f;
        }
        if (pl.p[i].init == PARAM_INIT_ONES)   /* LayerNorm gamma near 1, as in a trained model */
            for (int64_t k = 0; k < n; k++) w[i][k] += 1.0f;
    }
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    cr_assert_eq(hf_names_save("bert", &spec, &pl, (const float *const *)w, path, &err), HPC_OK, "%s", err.msg);
    for (int i = 0; i < pl.n; i++) free(w[i]);
    free(w);
    params_free(&pl);
    ir_free(&g);
}

#endif
