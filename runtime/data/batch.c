/* runtime/data/batch.c — see batch.h. */
#include "data/batch.h"

#include <stdlib.h>

Batch *batch_new(int64_t B, int64_t L, int with_targets)
{
    Batch *b = calloc(1, sizeof *b);
    if (!b) return NULL;
    size_t n = (size_t)(B * L);
    b->B = B;
    b->L = L;
    b->input_ids = calloc(n, sizeof(int32_t));
    b->token_type_ids = calloc(n, sizeof(int32_t));
    b->attention_mask = calloc(n, sizeof(int32_t));
    b->labels = calloc(n, sizeof(int32_t));
    b->example_index = calloc((size_t)B, sizeof(int64_t));
    if (with_targets) b->targets = calloc((size_t)B, sizeof(float));
    if (!b->input_ids || !b->token_type_ids || !b->attention_mask || !b->labels ||
        !b->example_index || (with_targets && !b->targets)) {
        batch_free(b);
        return NULL;
    }
    return b;
}

Batch *batch_new_packed(int64_t B, int64_t L, int with_targets)
{
    Batch *b = batch_new(B, L, with_targets);
    if (!b) return NULL;
    b->seq_spans = calloc((size_t)(2 * B), sizeof(int32_t));
    if (!b->seq_spans) {
        batch_free(b);
        return NULL;
    }
    return b;
}

void batch_free(Batch *b)
{
    if (!b) return;
    free(b->seq_spans);
    free(b->input_ids);
    free(b->token_type_ids);
    free(b->attention_mask);
    free(b->labels);
    free(b->targets);
    free(b->example_index);
    free(b);
}
