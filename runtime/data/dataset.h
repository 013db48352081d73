/* runtime/data/dataset.h — a tokenized dataset held in memory: one Example per row.
 *
 * The GLUE readers (glue.h) fill a Dataset from TSV files through the
 * tokenizer; tests and synthetic tasks may fill one directly with
 * dataset_add.  The loader (loader.h) turns a Dataset into padded Batches.
 *
 * Ownership: the Dataset owns every Example and its two id arrays
 * (dataset_add copies what it is given).  dataset_free releases everything
 * and leaves an empty, re-usable Dataset.
 *
 * Usage:
 *   Dataset d;
 *   dataset_init(&d, "cola/train");
 *   int32_t ids[] = {101, 2023, 102}, types[] = {0, 0, 0};
 *   if (dataset_add(&d, ids, types, 3, 1, 0.0f, &err) != HPC_OK) ...;
 *   ...
 *   dataset_free(&d);
 */
#ifndef HPC_RUNTIME_DATASET_H
#define HPC_RUNTIME_DATASET_H

#include <stdbool.h>
#include <stdint.h>

#include "util/error.h"

typedef struct {
    int32_t *ids;       /* (len) token ids, including [CLS] and [SEP] */
    int32_t *type_ids;  /* (len) segment ids: 0 for the first text, 1 for the second */
    int32_t len;        /* number of real tokens, >= 1 */
    int32_t label;      /* class id in [0, num_labels); -1 = unlabelled (test sets) */
    float target;       /* regression target (STS-B); 0 for classification */
} Example;

typedef struct {
    Example *ex;        /* (n) rows in file order */
    int64_t n, cap;
    int64_t num_labels; /* classes (2 for CoLA); 1 for regression */
    bool regression;    /* true: use Example.target, label is -1 */
    char name[64];      /* for messages, e.g. "cola/dev" */
} Dataset;

/* An empty dataset with num_labels = 2 and regression = false; the reader
 * that fills it sets both.  name is copied (truncated to 63 bytes). */
void dataset_init(Dataset *d, const char *name);

/* Appends a copy of (ids, type_ids) of length len (>= 1).  type_ids may be
 * NULL for all zeros.  Returns HPC_ERR_USAGE for len < 1, HPC_ERR_OOM when
 * memory runs out (the dataset is unchanged then). */
HpcStatus dataset_add(Dataset *d, const int32_t *ids, const int32_t *type_ids, int32_t len,
                      int32_t label, float target, HpcError *err);

/* Longest Example.len, 0 for an empty dataset. */
int32_t dataset_max_len(const Dataset *d);

/* Total real tokens over all rows (for tokens/s figures). */
int64_t dataset_total_tokens(const Dataset *d);

void dataset_free(Dataset *d);

#endif
