/* Classification metrics from a confusion matrix: accuracy, precision, recall, F1 (binary: positive
 * class 1, as sklearn's average="binary"; multi-class: unweighted macro average over classes, as
 * sklearn's average="macro", with 0 for a class with no predictions or no examples). */
#ifndef BQ_METRICS_H
#define BQ_METRICS_H

#include <stdint.h>

typedef struct BqConfusion {
    int nclass;
    int64_t *cm;  /* (nclass, nclass): cm[true * nclass + pred] */
    int64_t n;    /* examples counted */
    double loss_sum; /* sum of per-example cross-entropy, for the mean eval loss */
} BqConfusion;

typedef struct BqMetrics {
    double accuracy, precision, recall, f1, loss;
    int64_t n;
} BqMetrics;

void bq_confusion_init(BqConfusion *c, int nclass);
void bq_confusion_free(BqConfusion *c);
void bq_confusion_reset(BqConfusion *c);
/* Index of the largest of z[0..n) (the first one on ties); n >= 1. */
int bq_argmax(const float *z, int n);
/* Adds B rows of logits (B, nclass) with labels (B) in [0, nclass): argmax prediction (first maximum
 * on ties) and the example's cross-entropy. Rows with label < 0 are skipped. */
void bq_confusion_add_logits(BqConfusion *c, const float *logits, const int32_t *labels, int64_t B);
void bq_confusion_add(BqConfusion *c, int truth, int pred);
BqMetrics bq_metrics_compute(const BqConfusion *c);

#endif
