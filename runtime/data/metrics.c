/* runtime/data/metrics.c — see metrics.h. */
#include "data/metrics.h"

#include <math.h>
#include <stdlib.h>

double metric_accuracy(const int32_t *pred, const int32_t *gold, int64_t n)
{
    int64_t right = 0, total = 0;
    for (int64_t i = 0; i < n; i++) {
        if (gold[i] < 0) continue;
        total++;
        right += pred[i] == gold[i];
    }
    return total ? (double)right / (double)total : 0.0;
}

/* Class index for the MCC counts: negative predictions get their own class. */
static int64_t mcc_class(int32_t v, int64_t k) { return v < 0 ? k - 1 : v; }

double metric_mcc(const int32_t *pred, const int32_t *gold, int64_t n)
{
    int32_t top = 0;
    for (int64_t i = 0; i < n; i++) {
        if (gold[i] > top) top = gold[i];
        if (gold[i] >= 0 && pred[i] > top) top = pred[i];
    }
    int64_t k = (int64_t)top + 2;
    double *t = calloc((size_t)k, sizeof *t), *p = calloc((size_t)k, sizeof *p);
    if (!t || !p) {
        free(t);
        free(p);
        return NAN;
    }
    double s = 0, c = 0;
    for (int64_t i = 0; i < n; i++) {
        if (gold[i] < 0) continue;
        s++;
        c += pred[i] == gold[i];
        t[mcc_class(gold[i], k)]++;
        p[mcc_class(pred[i], k)]++;
    }
    double pt = 0, pp = 0, tt = 0;
    for (int64_t j = 0; j < k; j++) {
        pt += p[j] * t[j];
        pp += p[j] * p[j];
        tt += t[j] * t[j];
    }
    free(t);
    free(p);
    double den = sqrt((s * s - pp) * (s * s - tt));
    return den > 0 ? (c * s - pt) / den : 0.0;
}

double metric_f1(const int32_t *pred, const int32_t *gold, int64_t n)
{
    double tp = 0, fp = 0, fn = 0;
    for (int64_t i = 0; i < n; i++) {
        if (gold[i] < 0) continue;
        tp += pred[i] == 1 && gold[i] == 1;
        fp += pred[i] == 1 && gold[i] != 1;
        fn += pred[i] != 1 && gold[i] == 1;
    }
    return 2 * tp + fp + fn > 0 ? 2 * tp / (2 * tp + fp + fn) : 0.0;
}

double metric_pearson(const double *x, const double *y, int64_t n)
{
    if (n < 1) return 0.0;
    double mx = 0, my = 0;
    for (int64_t i = 0; i < n; i++) {
        mx += x[i];
        my += y[i];
    }
    mx /= (double)n;
    my /= (double)n;
    double sxy = 0, sxx = 0, syy = 0;
    for (int64_t i = 0; i < n; i++) {
        double dx = x[i] - mx, dy = y[i] - my;
        sxy += dx * dy;
        sxx += dx * dx;
        syy += dy * dy;
    }
    if (isnan(sxy) || isnan(sxx) || isnan(syy)) return NAN;
    return sxx > 0 && syy > 0 ? sxy / sqrt(sxx * syy) : 0.0;
}

/* qsort context-free: sort indices by the value they point at. */
typedef struct { double v; int64_t i; } RankItem;

static int rank_cmp(const void *pa, const void *pb)
{
    const RankItem *a = pa, *b = pb;
    if (a->v != b->v) return a->v < b->v ? -1 : 1;
    return (a->i > b->i) - (a->i < b->i);
}

int metric_rank(const double *x, int64_t n, double *rank)
{
    RankItem *it = malloc((size_t)(n ? n : 1) * sizeof *it);
    if (!it) return -1;
    for (int64_t i = 0; i < n; i++) it[i] = (RankItem){x[i], i};
    qsort(it, (size_t)n, sizeof *it, rank_cmp);
    for (int64_t s = 0; s < n;) {
        int64_t e = s + 1;
        while (e < n && it[e].v == it[s].v) e++;
        double avg = 0.5 * (double)(s + 1 + e);  /* mean of ranks s+1 .. e */
        for (int64_t j = s; j < e; j++) rank[it[j].i] = avg;
        s = e;
    }
    free(it);
    return 0;
}

double metric_spearman(const double *x, const double *y, int64_t n)
{
    double *rx = malloc((size_t)(n ? n : 1) * sizeof *rx), *ry = malloc((size_t)(n ? n : 1) * sizeof *ry);
    double r = NAN;
    if (rx && ry && metric_rank(x, n, rx) == 0 && metric_rank(y, n, ry) == 0) r = metric_pearson(rx, ry, n);
    free(rx);
    free(ry);
    return r;
}

const char *metric_name(MetricKind m)
{
    static const char *const names[METRIC_COUNT] = {"accuracy", "mcc", "f1", "pearson", "spearman"};
    return m < METRIC_COUNT ? names[m] : "unknown";
}

MetricKind metric_main(GlueTask task, bool regression)
{
    switch (task) {
    case GLUE_COLA: return METRIC_MCC;
    case GLUE_MRPC:
    case GLUE_QQP: return METRIC_F1;
    case GLUE_STSB: return METRIC_PEARSON;
    default: return regression ? METRIC_PEARSON : METRIC_ACCURACY;
    }
}

void metrics_classification(const int32_t *pred, const int32_t *gold, int64_t n, MetricKind main, MetricSet *out)
{
    for (int m = 0; m < METRIC_COUNT; m++) out->v[m] = NAN;
    out->v[METRIC_ACCURACY] = metric_accuracy(pred, gold, n);
    out->v[METRIC_MCC] = metric_mcc(pred, gold, n);
    out->v[METRIC_F1] = metric_f1(pred, gold, n);
    out->main = main;
}

void metrics_regression(const double *pred, const double *gold, int64_t n, MetricKind main, MetricSet *out)
{
    for (int m = 0; m < METRIC_COUNT; m++) out->v[m] = NAN;
    out->v[METRIC_PEARSON] = metric_pearson(pred, gold, n);
    out->v[METRIC_SPEARMAN] = metric_spearman(pred, gold, n);
    out->main = main;
}
