/* runtime/train/predict.h — prediction files in the format of the GLUE benchmark's
 * submission server.
 *
 * A file is a header line "index<TAB>prediction" and one line per row of the
 * split, in file order: the row's position (GLUE's test files number their
 * rows 0..n-1 in order, and task_load never skips test rows) and the
 * prediction as GLUE expects it:
 *   cola sst2 mrpc qqp wnli   the class id, 0 or 1
 *   rte qnli                  entailment | not_entailment
 *   mnli, mnli-mm             entailment | neutral | contradiction
 *   stsb                      the score clipped to [0, 5], "%.3f"
 *   tsv:DIR                   the class id, or the value ("%.6g") for a score
 * The file is replaced atomically (atomic_file.h): an error leaves any old
 * file as it was.
 *
 * Usage:
 *   // pred: (t.test.n) class ids by example index, e.g. from batch->example_index
 *   if (predict_write_glue(&t, pred, NULL, "CoLA.tsv", &err)) return err.code;
 */
#ifndef HPC_RUNTIME_PREDICT_H
#define HPC_RUNTIME_PREDICT_H

#include <stdint.h>

#include "util/error.h"
#include "data/tasks.h"

/* Writes predictions for t->test.  pred_labels (t->test.n) for classification
 * or pred_values (t->test.n) for regression; the other may be NULL.
 * HPC_ERR_USAGE when the task has no test split, the needed array is NULL or
 * a class id is out of range; HPC_ERR_NUMERIC for a non-finite value;
 * HPC_ERR_IO when the file cannot be written. */
HpcStatus predict_write_glue(const TaskData *t, const int32_t *pred_labels, const float *pred_values,
                             const char *path, HpcError *err);

/* The same for any split of t (e.g. &t->dev, to inspect dev predictions). */
HpcStatus predict_write(const TaskData *t, const Dataset *split, const int32_t *pred_labels,
                        const float *pred_values, const char *path, HpcError *err);

/* The file name GLUE's server expects for the task: "CoLA.tsv", "SST-2.tsv",
 * "MNLI-m.tsv", "MNLI-mm.tsv", ...; "predictions.tsv" for tsv:DIR. */
const char *predict_glue_filename(const TaskData *t);

#endif
