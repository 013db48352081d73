/* runtime/data/glue.h — GLUE task readers and a generic TSV/CSV reader: a text
 * file in, a tokenized Dataset (dataset.h) out.
 *
 * Formats (as written by GLUE's download script; docs/data.md lists them):
 *   cola   no header; source, label, original mark, sentence.  test.tsv has a
 *          header "index<TAB>sentence" and no labels.
 *   sst2   header sentence, label                       (test: index, sentence)
 *   mrpc   header Quality, #1 ID, #2 ID, #1 String, #2 String (may start with
 *          a UTF-8 BOM); label = Quality                 (test: index, ...)
 *   rte    index, sentence1, sentence2, label (entailment / not_entailment)
 *   qnli   index, question, sentence, label (entailment / not_entailment)
 *   qqp    id, qid1, qid2, question1, question2, is_duplicate
 *   stsb   index, genre, filename, year, old_index, source1, source2,
 *          sentence1, sentence2, score (regression, 0..5)
 *   mnli   index, promptID, pairID, genre, 4 parse columns, sentence1,
 *          sentence2, label1(..label5), gold_label (entailment / neutral /
 *          contradiction); dev_matched.tsv and dev_mismatched.tsv alike
 *   wnli   index, sentence1, sentence2, label (0/1)
 *   generic  any TSV/CSV: named text column(s) and an optional label column
 *          (GlueOptions below); CSV fields may be double-quoted (RFC 4180).
 * Header-based tasks find their columns by name, so column order does not
 * matter; a file without the label column is read as unlabelled (label -1).
 * Lines end in LF or CRLF; the last line may lack its newline.
 *
 * Errors: every problem in a row is reported as "FILE:LINE: reason" (wrong
 * column count, bad label, bad UTF-8, empty text...).  By default the first
 * bad row stops the read (HPC_ERR_INPUT); with skip_bad_rows it is skipped,
 * counted in GlueReport and the first one's message kept.  A missing file is
 * HPC_ERR_IO, an empty file (or header only) HPC_ERR_INPUT.
 *
 * Ownership: glue_read appends to a Dataset the caller initialised and frees;
 * the tokenizer is borrowed.
 *
 * Usage:
 *   GlueOptions o = glue_options(GLUE_COLA, 128);
 *   Dataset d; dataset_init(&d, "cola/train");
 *   if (glue_read("data/cola/train.tsv", &o, tok, &d, NULL, &err)) return err.code;
 */
#ifndef HPC_RUNTIME_GLUE_H
#define HPC_RUNTIME_GLUE_H

#include <stdbool.h>
#include <stdint.h>

#include "data/dataset.h"
#include "util/error.h"
#include "data/tokenizer.h"

typedef enum {
    GLUE_COLA, GLUE_SST2, GLUE_MRPC, GLUE_RTE, GLUE_QNLI, GLUE_QQP, GLUE_STSB,
    GLUE_MNLI, GLUE_WNLI,
    GLUE_GENERIC,
    GLUE_TASK_COUNT
} GlueTask;

typedef struct {
    GlueTask task;
    int64_t max_len;          /* tokens per row including [CLS]/[SEP]; longer rows are truncated */
    bool skip_bad_rows;       /* skip and count malformed rows instead of stopping */
    /* generic only (ignored by the GLUE tasks): */
    char delimiter;           /* '\t' (default) or ','; ',' turns on CSV quoting */
    bool header;              /* first line names the columns (default true) */
    const char *text_a;       /* column name (or 0-based index without a header), required */
    const char *text_b;       /* second text column, NULL for single sentences */
    const char *label;        /* label column, NULL for unlabelled data */
    const char *label_names;  /* "neg,pos": label strings in id order; NULL = integers 0..num_labels-1 */
    int64_t num_labels;       /* classes when label_names is NULL (default 2) */
    bool regression;          /* label column holds a float target */
} GlueOptions;

typedef struct {
    int64_t lines;            /* data lines read (excluding the header) */
    int64_t rows;             /* rows added to the dataset */
    int64_t skipped;          /* bad rows skipped (skip_bad_rows) */
    int64_t truncated;        /* rows cut to max_len */
    char first_bad[512];      /* "FILE:LINE: reason" of the first skipped row, "" if none */
} GlueReport;

/* Defaults for a task: skip_bad_rows false, '\t', header true, num_labels 2. */
GlueOptions glue_options(GlueTask task, int64_t max_len);

/* Reads path and appends its rows to d (also sets d->num_labels and
 * d->regression).  rep may be NULL. */
HpcStatus glue_read(const char *path, const GlueOptions *opt, const Tokenizer *tok, Dataset *d,
                    GlueReport *rep, HpcError *err);

/* "cola", "sst2" (or "sst-2"), "mrpc", "rte", "qnli", "qqp", "stsb" (or
 * "sts-b"), "mnli", "wnli", "generic"; case-insensitive.  GLUE_TASK_COUNT when unknown. */
GlueTask glue_task_from_name(const char *name);
const char *glue_task_name(GlueTask task);
int64_t glue_num_labels(GlueTask task);   /* 1 for stsb */
bool glue_is_regression(GlueTask task);
bool glue_is_pair(GlueTask task);

#endif
