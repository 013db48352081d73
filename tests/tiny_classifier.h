/* tests/tiny_classifier.h — the tiny BERT classifier and batch that the
 * graph-comparing tests (tests/test_fuse.c, tests/test_fuse_accum.c) run:
 * 2 layers, hidden TH, THEADS heads, vocabulary TV, dropout 0.1, 3 labels;
 * a TB x TL batch whose second row is padded, so the mask matters.
 * Header-only (static functions): each test is its own program. */
#ifndef HPC_TESTS_TINY_CLASSIFIER_H
#define HPC_TESTS_TINY_CLASSIFIER_H

#include <stdbool.h>
#include <stdio.h>

#include "cpu/philox.h"
#include "data/batch.h"
#include "program/spec.h"

enum { TB = 2, TL = 8, TV = 50, TH = 16, THEADS = 2, TC = 5 };

static void tiny_spec(ModelSpec *s)
{
    spec_defaults(s);
    snprintf(s->name, sizeof s->name, "tiny");
    s->stack.vocab_size = TV;
    s->stack.max_positions = 16;
    s->stack.hidden = TH;
    s->stack.heads = THEADS;
    s->stack.layers = 2;
    s->stack.ffn = 32;
    s->stack.ln_eps = 1e-5;
    s->stack.hidden_dropout = 0.1;
    s->stack.attention_dropout = 0.1;
    s->head.num_labels = 3;
}

static Batch *tiny_batch(void)
{
    Batch *b = batch_new(TB, TL, 1);
    int lens[TB] = {TL, 5}; /* row 1 is padded: the mask matters */
    for (int r = 0; r < TB; r++)
        for (int t = 0; t < TL; t++) {
            int i = r * TL + t;
            bool real = t < lens[r];
            b->input_ids[i] = real ? (int)(philox_uniform(7, (uint64_t)i, 0, 1) * TV) : 0;
            b->token_type_ids[i] = real && t >= 3;
            b->attention_mask[i] = real;
            b->labels[i] = real ? (int)(philox_uniform(7, (uint64_t)i, 0, 2) * TC) : -100;
        }
    b->labels[0] = 1;
    b->labels[1] = 2;
    return b;
}

#endif
