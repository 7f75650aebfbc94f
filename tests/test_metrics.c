/* Metrics (src/metrics.c) against hand-computed sklearn values: binary (positive class 1) and 3-class
 * macro precision/recall/F1, argmax from logits, mean cross-entropy. */
#include <math.h>
#include <stdio.h>

#include "src/metrics.h"

static double maxerr = 0;
static int fails = 0;
static void expect(const char *what, double got, double want) {
    double e = fabs(got - want);
    if (e > maxerr) maxerr = e;
    if (!(e <= 1e-12)) {
        printf("FAIL %s: got %.12g want %.12g\n", what, got, want);
        fails++;
    }
}

int main(void) {
    /* Binary: truth 1,1,1,0,0 pred 1,0,1,1,0 → tp 2 fp 1 fn 1 → P = R = F1 = 2/3, acc 3/5. */
    BqConfusion c;
    bq_confusion_init(&c, 2);
    int t[5] = {1, 1, 1, 0, 0}, p[5] = {1, 0, 1, 1, 0};
    for (int i = 0; i < 5; i++) bq_confusion_add(&c, t[i], p[i]);
    BqMetrics m = bq_metrics_compute(&c);
    expect("bin acc", m.accuracy, 0.6);
    expect("bin P", m.precision, 2.0 / 3);
    expect("bin R", m.recall, 2.0 / 3);
    expect("bin F1", m.f1, 2.0 / 3);
    bq_confusion_free(&c);

    /* 3-class: truth 0,0,1,1,2,2 pred 0,1,1,1,0,2.
     * class 0: tp1 pred2 true2 → P .5 R .5 F .5; class 1: tp2 pred3 true2 → P 2/3 R 1 F .8;
     * class 2: tp1 pred1 true2 → P 1 R .5 F 2/3. */
    bq_confusion_init(&c, 3);
    int t3[6] = {0, 0, 1, 1, 2, 2}, p3[6] = {0, 1, 1, 1, 0, 2};
    for (int i = 0; i < 6; i++) bq_confusion_add(&c, t3[i], p3[i]);
    m = bq_metrics_compute(&c);
    expect("3 acc", m.accuracy, 4.0 / 6);
    expect("3 P", m.precision, (0.5 + 2.0 / 3 + 1) / 3);
    expect("3 R", m.recall, (0.5 + 1 + 0.5) / 3);
    expect("3 F1", m.f1, (0.5 + 0.8 + 2.0 / 3) / 3);
    bq_confusion_free(&c);

    /* Logits: argmax and CE; row 2 has label -1 and is skipped. */
    bq_confusion_init(&c, 2);
    float z[6] = {2.0f, 0.0f, -1.0f, 1.0f, 5.0f, 5.0f};
    int32_t lab[3] = {0, 0, -1};
    bq_confusion_add_logits(&c, z, lab, 3);
    m = bq_metrics_compute(&c);
    expect("logits n", (double)m.n, 2);
    expect("logits acc", m.accuracy, 0.5);
    double ce = (log(1 + exp(-2.0)) + (log(exp(-1.0) + exp(1.0)) + 1.0)) / 2;
    if (fabs(m.loss - ce) > 1e-6) printf("FAIL loss %.9g want %.9g\n", m.loss, ce), fails++;
    expect("binary no positives P", m.precision, 0.0);
    bq_confusion_free(&c);

    printf("test_metrics: max error %.3g, %s\n", maxerr, fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
