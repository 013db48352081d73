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

HpcStatus batch_spans_check(const int32_t *spans, int64_t B, int64_t L, int64_t span_max, const char *who,
                            HpcError *err)
{
    if (!spans)
        return hpc_fail(err, HPC_ERR_INPUT, "%s: the program is packed (docs/packing.md) but the batch has no "
                        "seq_spans; make its batches with a packing loader (loader_set_pack)", who);
    int64_t BL = B * L, end = 0;
    for (int64_t b = 0; b < B; b++) {
        int64_t s = spans[2 * b], n = spans[2 * b + 1];
        if (s != end || n < 0 || s + n > BL)
            return hpc_fail(err, HPC_ERR_INPUT,
                            "%s: seq_spans row %lld is [%lld, %lld): it must lie inside the batch's %lld x "
                            "%lld = %lld token slots, starting where the previous span ends (%lld); a packed "
                            "batch from runtime/data/loader.h keeps its spans so",
                            who, (long long)b, (long long)s, (long long)(s + n), (long long)B, (long long)L,
                            (long long)BL, (long long)end);
        if (span_max > 0 && n > span_max)
            return hpc_fail(err, HPC_ERR_INPUT,
                            "%s: seq_spans row %lld holds %lld tokens, but this packed program was compiled for "
                            "sequences of at most %lld (the model's seq_len); compile it again from a model with "
                            "seq_len = %lld or more (hpc run MODEL.model --seq-len %lld does), or truncate the "
                            "sequences",
                            who, (long long)b, (long long)n, (long long)span_max, (long long)n, (long long)n);
        end = s + n;
    }
    return HPC_OK;
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
