/* runtime/data/batch.h — one batch of token ids, the unit the trainer consumes.
 *
 * Produced by the data loaders (synthetic tasks, GLUE readers) and consumed
 * by every backend.  Row-major, batch-major: element (b, t) is at b * L + t.
 * L is the padded length of this batch (data loaders pad to a multiple of 8,
 * never beyond the model's max_seq_len).  A Batch owns its arrays; free it
 * with batch_free.
 *
 * A packed batch (seq_spans != NULL; docs/packing.md) holds B sequences
 * back to back in its B x L slots read as one flat array: sequence b is
 * slots [seq_spans[2b], seq_spans[2b] + seq_spans[2b + 1]); the slots after
 * the last sequence are padding (pad id, type 0, mask 0, token label -100).
 * Token-wise fields (ids, types, mask, token labels) are per flat slot;
 * labels[b], targets[b] and example_index[b] are per sequence as before.
 */
#ifndef HPC_RUNTIME_BATCH_H
#define HPC_RUNTIME_BATCH_H

#include <stdint.h>

#include "error.h"

typedef struct {
    int64_t B, L;             /* rows, padded length */
    int32_t *input_ids;       /* (B, L) token ids, pad id where masked out */
    int32_t *token_type_ids;  /* (B, L) segment ids, 0 or 1 */
    int32_t *attention_mask;  /* (B, L) 1 = real token, 0 = padding */
    int32_t *labels;          /* classification: (B) class ids;
                                 token classification: (B, L), -100 = ignore;
                                 masked LM: (B, L) target ids, -100 = not masked;
                                 causal LM: unused (targets are input_ids shifted) */
    float *targets;           /* regression: (B) values; otherwise NULL */
    int64_t *example_index;   /* (B) which dataset row each batch row came from */
    int32_t *seq_spans;       /* packed batches: (B, 2) [start, len] in flat slots; else NULL */
} Batch;

/* Allocates all arrays for B x L (labels as (B, L) so every head fits),
 * zero-filled; targets only when with_targets.  Returns NULL on OOM. */
Batch *batch_new(int64_t B, int64_t L, int with_targets);
/* batch_new plus seq_spans (zero-filled): a packed batch. */
Batch *batch_new_packed(int64_t B, int64_t L, int with_targets);
void batch_free(Batch *batch);

/* A packed batch's spans (B rows, L slots a row; its seq_spans) as the
 * executors need them: present (a padded batch has none), back to back from slot 0 (start_0 = 0, start_b =
 * start_{b-1} + len_{b-1}), each len_b >= 0, the last ending by B L, and,
 * where span_max > 0 (the program's bound: program/ir.h IrInputAttr), no
 * len_b above span_max.  `who` names the caller in the message. */
HpcStatus batch_spans_check(const int32_t *spans, int64_t B, int64_t L, int64_t span_max, const char *who,
                            HpcError *err);

#endif
