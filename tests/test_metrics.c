/* tests/test_metrics.c — metrics against values worked out by hand (the
 * arithmetic is in the comments), degenerate cases, and properties on random
 * data. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

#include "data/metrics.h"

#define CLOSE(a, b) cr_expect(fabs((a) - (b)) < 1e-9, "%s = %.12f, want %.12f", #a, (double)(a), (double)(b))

/* TP = 3 (rows 0, 2, 6), FN = 1 (row 1), FP = 1 (row 4), TN = 3.
 * accuracy 6/8; F1 = 6 / (6 + 1 + 1) = 0.75;
 * MCC = (3*3 - 1*1) / sqrt(4 * 4 * 4 * 4) = 8 / 16 = 0.5 */
Test(metrics, binary_hand_computed)
{
    int32_t gold[] = {1, 1, 1, 0, 0, 0, 1, 0};
    int32_t pred[] = {1, 0, 1, 0, 1, 0, 1, 0};
    CLOSE(metric_accuracy(pred, gold, 8), 0.75);
    CLOSE(metric_f1(pred, gold, 8), 0.75);
    CLOSE(metric_mcc(pred, gold, 8), 0.5);
}

/* TP 5, TN 2, FP 1, FN 2: MCC = (10 - 2) / sqrt(6 * 7 * 3 * 4) = 8 / sqrt(504);
 * F1 = 10 / 13; accuracy 7 / 10. */
Test(metrics, binary_unbalanced)
{
    int32_t gold[] = {1, 1, 1, 1, 1, 1, 1, 0, 0, 0};
    int32_t pred[] = {1, 1, 1, 1, 1, 0, 0, 0, 0, 1};
    CLOSE(metric_mcc(pred, gold, 10), 8.0 / sqrt(504.0));
    CLOSE(metric_f1(pred, gold, 10), 10.0 / 13.0);
    CLOSE(metric_accuracy(pred, gold, 10), 0.7);
}

/* Three classes: correct c = 5 of s = 6; true counts t = (2,2,2), predicted
 * p = (2,1,3): MCC = (5*6 - 12) / sqrt((36 - 14) * (36 - 12)) = 18 / sqrt(528). */
Test(metrics, mcc_multiclass)
{
    int32_t gold[] = {0, 0, 1, 1, 2, 2};
    int32_t pred[] = {0, 0, 1, 2, 2, 2};
    CLOSE(metric_mcc(pred, gold, 6), 18.0 / sqrt(528.0));
}

Test(metrics, degenerate_cases)
{
    int32_t gold[] = {1, 0, 1, 0, 1};
    int32_t ones[] = {1, 1, 1, 1, 1}, zeros[] = {0, 0, 0, 0, 0};
    CLOSE(metric_mcc(ones, gold, 5), 0.0);     /* one class predicted */
    CLOSE(metric_mcc(gold, ones, 5), 0.0);     /* one class present */
    CLOSE(metric_f1(zeros, zeros, 5), 0.0);    /* no positives anywhere */
    CLOSE(metric_f1(ones, zeros, 5), 0.0);     /* only false positives */
    CLOSE(metric_f1(zeros, gold, 5), 0.0);     /* only false negatives */
    CLOSE(metric_accuracy(gold, gold, 0), 0.0);
    CLOSE(metric_mcc(gold, gold, 0), 0.0);
    CLOSE(metric_mcc(gold, gold, 5), 1.0);
    int32_t inv[] = {0, 1, 0, 1, 0};
    CLOSE(metric_mcc(inv, gold, 5), -1.0);
    double c[] = {2, 2, 2}, x[] = {1, 2, 3};
    CLOSE(metric_pearson(c, x, 3), 0.0);       /* constant side */
    CLOSE(metric_spearman(x, c, 3), 0.0);
}

Test(metrics, unlabelled_rows_are_left_out)
{
    int32_t gold[] = {1, -1, 0, -1};
    int32_t pred[] = {1, 0, 1, 1};
    CLOSE(metric_accuracy(pred, gold, 4), 0.5);
    CLOSE(metric_f1(pred, gold, 4), 2.0 / 3.0);  /* TP 1, FP 1 */
}

/* mx = 3, my = 4; dx = (-2,-1,0,1,2), dy = (-2,0,1,0,1): sxy 6, sxx 10, syy 6:
 * r = 6 / sqrt(60).  Ranks of y with ties averaged: (1, 2.5, 4.5, 2.5, 4.5):
 * sxy 7, syy 9: rho = 7 / sqrt(90). */
Test(metrics, pearson_spearman_hand_computed)
{
    double x[] = {1, 2, 3, 4, 5}, y[] = {2, 4, 5, 4, 5};
    CLOSE(metric_pearson(x, y, 5), 6.0 / sqrt(60.0));
    CLOSE(metric_spearman(x, y, 5), 7.0 / sqrt(90.0));
    double r[4], v[] = {10, 20, 20, 5};
    cr_assert_eq(metric_rank(v, 4, r), 0);
    CLOSE(r[0], 2.0);
    CLOSE(r[1], 3.5);
    CLOSE(r[2], 3.5);
    CLOSE(r[3], 1.0);
}

Test(metrics, properties_on_random_data)
{
    srand(1234);
    enum { N = 500 };
    double x[N], y[N], ex[N], lin[N];
    for (int i = 0; i < N; i++) {
        x[i] = (double)rand() / RAND_MAX * 4 - 2;
        y[i] = x[i] + (double)rand() / RAND_MAX;
        ex[i] = exp(x[i]);
        lin[i] = 3 * x[i] - 7;
    }
    CLOSE(metric_pearson(x, lin, N), 1.0);
    double rho = metric_spearman(x, y, N);
    CLOSE(metric_spearman(ex, y, N), rho);      /* ranks ignore monotone maps */
    cr_expect(rho > 0.5 && rho < 1.0, "rho %f", rho);
    double r = metric_pearson(x, y, N);
    cr_expect(r > 0.5 && r < 1.0, "r %f", r);
    x[7] = NAN;
    cr_expect(isnan(metric_pearson(x, y, N)), "NaN must not give a number");
}

Test(metrics, main_metric_per_task)
{
    cr_expect_eq(metric_main(GLUE_COLA, false), METRIC_MCC);
    cr_expect_eq(metric_main(GLUE_SST2, false), METRIC_ACCURACY);
    cr_expect_eq(metric_main(GLUE_MRPC, false), METRIC_F1);
    cr_expect_eq(metric_main(GLUE_QQP, false), METRIC_F1);
    cr_expect_eq(metric_main(GLUE_STSB, true), METRIC_PEARSON);
    cr_expect_eq(metric_main(GLUE_RTE, false), METRIC_ACCURACY);
    cr_expect_eq(metric_main(GLUE_GENERIC, true), METRIC_PEARSON);
    cr_expect_str_eq(metric_name(METRIC_MCC), "mcc");
    MetricSet m;
    int32_t gold[] = {1, 1, 1, 0, 0, 0, 1, 0}, pred[] = {1, 0, 1, 0, 1, 0, 1, 0};
    metrics_classification(pred, gold, 8, METRIC_MCC, &m);
    CLOSE(m.v[m.main], 0.5);
    cr_expect(isnan(m.v[METRIC_PEARSON]));
}
