/* runtime/data/tasks.h — a GLUE task for `hpc run --task`: its files, tokenized
 * splits, the model check and the task's evaluation metric.
 *
 * task_load finds the task's files, loads the vocabulary and tokenizes the
 * train, dev and (if present) test splits into Datasets (dataset.h) with the
 * task's label count or regression flag.  docs/tasks.md lists every task.
 *
 *   name      files in data_dir (default "data/<name>", relative to the
 *             working directory)                           labels
 *   cola sst2 mrpc qqp wnli   train.tsv dev.tsv [test.tsv]   2
 *   rte qnli                  train.tsv dev.tsv [test.tsv]   entailment, not_entailment
 *   stsb                      train.tsv dev.tsv [test.tsv]   regression 0..5
 *   mnli      train.tsv dev_matched.tsv [test_matched.tsv]   entailment, neutral, contradiction
 *   mnli-mm   train.tsv dev_mismatched.tsv [test_mismatched.tsv] (data_dir default data/mnli)
 *   tsv:DIR   DIR/train.tsv DIR/dev.tsv [DIR/test.tsv] with a header naming
 *             the text column(s) (sentence | text, or sentence1+sentence2 |
 *             text_a+text_b | question1+question2 | premise+hypothesis) and
 *             the target: "label" (integer classes 0..K-1, K = largest label
 *             in train/dev + 1, at least 2) or "score" (a float: regression)
 * The test split is optional: a missing test file means no test split.  A
 * missing train or dev file (or directory) is HPC_ERR_IO with a message that
 * names the path and how to get the data.  Test rows are never skipped:
 * GLUE wants a prediction for every index, so a bad test row is an error even
 * with skip_bad_rows.
 *
 * The vocabulary defaults to data/vocab/bert-base-uncased-vocab.txt
 * (bert-base-cased-vocab.txt when cased); cased = false lower-cases and
 * strips accents (tokenizer.h).
 *
 * Ownership: a TaskData owns its tokenizer and its three Datasets; task_free
 * releases them (and is safe on a zeroed or failed TaskData).  On failure
 * task_load frees what it made and leaves *out zeroed.
 *
 * Usage:
 *   TaskData t;
 *   if (task_load("cola", NULL, NULL, false, 128, false, &t, &err)) return err.code;
 *   if (task_check_model(&t, &spec, &err)) { task_free(&t); return err.code; }
 *   char line[512];
 *   for (int s = 0; s < TASK_SPLIT_COUNT; s++)
 *       if (task_split_line(&t, s, line, sizeof line)) runlog_message(log, "%s", line);
 *   ... train on t.train; predict t.dev into pred (by example index) ...
 *   TaskScores sc;
 *   task_evaluate(&t, &t.dev, pred, NULL, &sc);   // sc.text = "mcc 0.5231, accuracy 0.8150"
 *   task_free(&t);
 */
#ifndef HPC_RUNTIME_TASKS_H
#define HPC_RUNTIME_TASKS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"
#include "util/error.h"
#include "data/glue.h"
#include "data/metrics.h"
#include "program/spec.h"
#include "data/tokenizer.h"

#define TASK_PATH_MAX 1024

typedef enum { TASK_SPLIT_TRAIN, TASK_SPLIT_DEV, TASK_SPLIT_TEST, TASK_SPLIT_COUNT } TaskSplit;

/* What reading one split found, for the run log. */
typedef struct {
    bool present;             /* false: no such file (test only) */
    char path[TASK_PATH_MAX]; /* the file read */
    int64_t lines;            /* data lines (excluding a header) */
    int64_t rows;             /* rows in the Dataset */
    int64_t skipped;          /* bad rows skipped (skip_bad_rows) */
    int64_t truncated;        /* rows cut to max_len tokens */
    int32_t longest;          /* tokens in the longest row */
    double mean_len;          /* mean tokens per row */
    char first_bad[512];      /* "FILE:LINE: reason" of the first skipped row, "" if none */
} TaskSplitInfo;

typedef struct {
    char name[64];            /* "cola", "mnli-mm", "tsv" */
    GlueTask glue;            /* GLUE_GENERIC for tsv:DIR */
    char data_dir[TASK_PATH_MAX];
    char vocab_path[TASK_PATH_MAX];
    Tokenizer *tok;           /* owned */
    Dataset train, dev, test; /* owned; test.n == 0 when there is no test file */
    TaskSplitInfo info[TASK_SPLIT_COUNT];
    int64_t num_labels;       /* classes; 1 for regression */
    bool regression;
    bool pair;                /* rows are sentence pairs (type ids 0 and 1) */
    int64_t max_len;          /* tokens per row, [CLS]/[SEP] included */
    MetricKind main_metric;   /* metrics.h: what "best dev metric" means */
} TaskData;

HpcStatus task_load(const char *task, const char *data_dir, const char *vocab_path, bool cased, int64_t max_len,
                    bool skip_bad_rows, TaskData *out, HpcError *err);
void task_free(TaskData *t);

/* The Dataset of a split (never NULL for a valid split). */
const Dataset *task_split(const TaskData *t, TaskSplit s);
const char *task_split_name(TaskSplit s);   /* "train", "dev", "test" */

/* One log line about a split ("cola train: 8551 rows from data/cola/train.tsv,
 * 0 skipped, 0 truncated to 128 tokens; tokens per row max 47, mean 11.3").
 * Returns false (buf = "") for an absent split. */
bool task_split_line(const TaskData *t, TaskSplit s, char *buf, size_t n);

/* Whether the model's head fits the task: a sequence classification head with
 * the task's label count, or a regression head for a regression task; the
 * vocabulary fits the word embeddings, max_len the positions, and a pair
 * task has two token types (or none).  HPC_ERR_INPUT naming both sides. */
HpcStatus task_check_model(const TaskData *t, const ModelSpec *spec, HpcError *err);

/* Scores of one evaluation.  v[m] is NAN for the metrics the task does not
 * report: cola mcc + accuracy; sst2 rte qnli mnli wnli accuracy; mrpc qqp f1
 * + accuracy; stsb (and regression) pearson + spearman; tsv accuracy. */
typedef struct {
    MetricKind main;
    double main_value;        /* v[main] */
    double v[METRIC_COUNT];
    int64_t n;                /* rows scored (labelled rows) */
    char text[160];           /* "mcc 0.5231, accuracy 0.8150": main first */
} TaskScores;

/* The predicted class of a row whose logits are NaN or inf: it has no
 * argmax.  task_evaluate scores a split holding one as NaN (every metric),
 * so corrupt numbers never look like a result. */
#define TASK_PRED_NONFINITE (-1)

/* Scores predictions for split (a Dataset of t, usually &t->dev), indexed by
 * example index: pred_labels (split->n) for classification, pred_values
 * (split->n) for regression; the other may be NULL.  A NaN predicted value
 * or a TASK_PRED_NONFINITE class on a labelled row makes every score NaN
 * (HPC_OK).  Returns HPC_ERR_USAGE
 * when the needed array is NULL or a predicted class is out of range,
 * HPC_ERR_INPUT when the split has no labelled rows, HPC_ERR_OOM when scratch
 * memory runs out; *out is filled with NANs then. */
HpcStatus task_evaluate(const TaskData *t, const Dataset *split, const int32_t *pred_labels,
                        const float *pred_values, TaskScores *out);

#endif
