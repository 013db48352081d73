/* runtime/train/predict.c — see predict.h. */
#include "train/predict.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "formats/atomic_file.h"

/* STS-B scores live in [0, 5]; GLUE's scorer expects predictions there too. */
#define PREDICT_STSB_MAX 5.0

/* Label strings per class id (NULL: print the id). */
static const char *const *predict_names(const TaskData *t)
{
    static const char *const nli2[] = {"entailment", "not_entailment"};
    static const char *const nli3[] = {"entailment", "neutral", "contradiction"};
    switch (t->glue) {
    case GLUE_RTE:
    case GLUE_QNLI: return nli2;
    case GLUE_MNLI: return nli3;
    default: return NULL;
    }
}

const char *predict_glue_filename(const TaskData *t)
{
    if (!strcmp(t->name, "mnli-mm")) return "MNLI-mm.tsv";
    switch (t->glue) {
    case GLUE_COLA: return "CoLA.tsv";
    case GLUE_SST2: return "SST-2.tsv";
    case GLUE_MRPC: return "MRPC.tsv";
    case GLUE_RTE: return "RTE.tsv";
    case GLUE_QNLI: return "QNLI.tsv";
    case GLUE_QQP: return "QQP.tsv";
    case GLUE_STSB: return "STS-B.tsv";
    case GLUE_MNLI: return "MNLI-m.tsv";
    case GLUE_WNLI: return "WNLI.tsv";
    default: return "predictions.tsv";
    }
}

/* One prediction as text into buf; false with err filled when it is invalid. */
static bool predict_cell(const TaskData *t, int64_t i, const int32_t *labels, const float *values, char *buf,
                         size_t n, HpcError *err)
{
    if (t->regression) {
        double v = values[i];
        if (!isfinite(v))
            return hpc_fail(err, HPC_ERR_NUMERIC, "prediction for row %lld is not finite (%g); nothing written",
                            (long long)i, v), false;
        if (t->glue == GLUE_STSB) {
            v = v < 0 ? 0 : v > PREDICT_STSB_MAX ? PREDICT_STSB_MAX : v;
            snprintf(buf, n, "%.3f", v + 0.0);  /* + 0.0 turns -0 into 0 */
        } else {
            snprintf(buf, n, "%.6g", v + 0.0);
        }
        return true;
    }
    int32_t c = labels[i];
    if (c == TASK_PRED_NONFINITE)
        return hpc_fail(err, HPC_ERR_NUMERIC, "--predict: the model's output for row %lld of %s is NaN or inf, so "
                        "it has no class; nothing written (the weights overflow or diverged)", (long long)i,
                        t->info[TASK_SPLIT_TEST].path), false;
    if (c < 0 || c >= t->num_labels)
        return hpc_fail(err, HPC_ERR_USAGE, "prediction for row %lld is class %d, outside 0..%lld", (long long)i,
                        (int)c, (long long)t->num_labels - 1), false;
    const char *const *names = predict_names(t);
    if (names) snprintf(buf, n, "%s", names[c]);
    else snprintf(buf, n, "%d", (int)c);
    return true;
}

/* The whole file in memory: header + one line per row. */
static HpcStatus predict_format(const TaskData *t, const Dataset *d, const int32_t *labels, const float *values,
                                char **out, size_t *len, HpcError *err)
{
    size_t cap = 32 + (size_t)d->n * 48, k = 0;
    char *buf = malloc(cap);
    if (!buf) return hpc_fail(err, HPC_ERR_OOM, "predictions for %s: out of host memory", d->name);
    k += (size_t)snprintf(buf, cap, "index\tprediction\n");
    for (int64_t i = 0; i < d->n; i++) {
        char cell[32];
        if (!predict_cell(t, i, labels, values, cell, sizeof cell, err)) {
            free(buf);
            return err->code;
        }
        k += (size_t)snprintf(buf + k, cap - k, "%lld\t%s\n", (long long)i, cell);
    }
    *out = buf;
    *len = k;
    return HPC_OK;
}

HpcStatus predict_write(const TaskData *t, const Dataset *split, const int32_t *pred_labels,
                        const float *pred_values, const char *path, HpcError *err)
{
    if (t->regression ? !pred_values : !pred_labels)
        return hpc_fail(err, HPC_ERR_USAGE, "predict_write(%s): no %s predictions given", path,
                        t->regression ? "value" : "class");
    char *buf = NULL;
    size_t len = 0;
    HpcStatus st = predict_format(t, split, pred_labels, pred_values, &buf, &len, err);
    if (st) return st;
    st = atomic_write_file(path, buf, len, err);
    free(buf);
    return st;
}

HpcStatus predict_write_glue(const TaskData *t, const int32_t *pred_labels, const float *pred_values,
                             const char *path, HpcError *err)
{
    if (!t->info[TASK_SPLIT_TEST].present)
        return hpc_fail(err, HPC_ERR_USAGE, "task %s has no test split (%s not found); nothing to predict",
                        t->name, t->info[TASK_SPLIT_TEST].path);
    return predict_write(t, &t->test, pred_labels, pred_values, path, err);
}
