/* runtime/data/metrics.h — evaluation metrics for GLUE-style tasks.
 *
 *   accuracy    fraction of pred == gold
 *   mcc         Matthews correlation (CoLA), multi-class form (Gorodkin 2004),
 *               equal to the binary phi coefficient for two classes; 0 when
 *               the denominator is 0 (one class predicted or present), as
 *               scikit-learn does
 *   f1          F1 of the positive class (1): 2TP / (2TP + FP + FN); 0 when
 *               there are no positives in pred and gold (scikit-learn's
 *               zero_division=0)
 *   pearson     Pearson correlation; 0 if either side is constant
 *   spearman    Pearson correlation of ranks, ties ranked by their average
 * All accumulate in double.  Classification rows whose gold label is
 * negative (-1 = unlabelled) are left out; no rows left gives 0.
 *
 * Main metric per task (what "best dev metric" means in the run log):
 *   cola: mcc; sst2, rte, qnli, mnli, wnli: accuracy; mrpc, qqp: f1; stsb: pearson;
 *   generic: accuracy (pearson for regression).
 */
#ifndef HPC_RUNTIME_METRICS_H
#define HPC_RUNTIME_METRICS_H

#include <stdbool.h>
#include <stdint.h>

#include "data/glue.h"

typedef enum { METRIC_ACCURACY, METRIC_MCC, METRIC_F1, METRIC_PEARSON, METRIC_SPEARMAN, METRIC_COUNT } MetricKind;

double metric_accuracy(const int32_t *pred, const int32_t *gold, int64_t n);
double metric_mcc(const int32_t *pred, const int32_t *gold, int64_t n);
double metric_f1(const int32_t *pred, const int32_t *gold, int64_t n);
double metric_pearson(const double *x, const double *y, int64_t n);
/* Spearman needs scratch space: returns NAN only if allocation fails. */
double metric_spearman(const double *x, const double *y, int64_t n);

/* Average ranks (1-based) of x into rank (n); ties share their mean rank.
 * Returns -1 on allocation failure, 0 otherwise. */
int metric_rank(const double *x, int64_t n, double *rank);

const char *metric_name(MetricKind m);            /* "accuracy", "mcc", "f1", "pearson", "spearman" */
MetricKind metric_main(GlueTask task, bool regression);

/* Every metric that applies, computed at once.  For classification pass pred
 * and gold class ids (values NULL); for regression pass pred_values and
 * gold_values (class arrays NULL).  Unused fields are NAN. */
typedef struct { double v[METRIC_COUNT]; MetricKind main; } MetricSet;
void metrics_classification(const int32_t *pred, const int32_t *gold, int64_t n,
                            MetricKind main, MetricSet *out);
void metrics_regression(const double *pred, const double *gold, int64_t n,
                        MetricKind main, MetricSet *out);

#endif
