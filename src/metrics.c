/* Confusion matrix and accuracy / precision / recall / F1 (sklearn.metrics semantics, see metrics.h). */
#include "src/metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"

void bq_confusion_init(BqConfusion *c, int nclass) {
    BQ_CHECK(nclass >= 1);
    c->nclass = nclass;
    c->cm = bq_calloc((size_t)nclass * nclass, sizeof(int64_t));
    c->n = 0;
    c->loss_sum = 0;
}

void bq_confusion_free(BqConfusion *c) {
    free(c->cm);
    memset(c, 0, sizeof *c);
}

void bq_confusion_reset(BqConfusion *c) {
    memset(c->cm, 0, sizeof(int64_t) * c->nclass * c->nclass);
    c->n = 0;
    c->loss_sum = 0;
}

void bq_confusion_add(BqConfusion *c, int truth, int pred) {
    BQ_CHECK(truth >= 0 && truth < c->nclass && pred >= 0 && pred < c->nclass);
    c->cm[(int64_t)truth * c->nclass + pred]++;
    c->n++;
}

int bq_argmax(const float *z, int n) {
    int k = 0;
    for (int j = 1; j < n; j++)
        if (z[j] > z[k]) k = j;
    return k;
}

void bq_confusion_add_logits(BqConfusion *c, const float *logits, const int32_t *labels, int64_t B) {
    int C = c->nclass;
    for (int64_t b = 0; b < B; b++) {
        if (labels[b] < 0) continue;
        const float *z = logits + b * C;
        int arg = bq_argmax(z, C);
        float mx = z[arg];
        double se = 0;
        for (int j = 0; j < C; j++) se += exp((double)z[j] - mx);
        c->loss_sum += log(se) - ((double)z[labels[b]] - mx);
        bq_confusion_add(c, labels[b], arg);
    }
}

static double safe_div(double a, double b) { return b > 0 ? a / b : 0.0; }

BqMetrics bq_metrics_compute(const BqConfusion *c) {
    BqMetrics r = {0};
    int C = c->nclass;
    r.n = c->n;
    int64_t correct = 0;
    for (int k = 0; k < C; k++) correct += c->cm[(int64_t)k * C + k];
    r.accuracy = safe_div((double)correct, (double)c->n);
    r.loss = safe_div(c->loss_sum, (double)c->n);
    double P = 0, R = 0, F = 0;
    int first = C == 2 ? 1 : 0; /* binary: positive class 1 only */
    int count = 0;
    for (int k = first; k < C; k++) {
        int64_t tp = c->cm[(int64_t)k * C + k], pred = 0, truth = 0;
        for (int j = 0; j < C; j++) {
            pred += c->cm[(int64_t)j * C + k];
            truth += c->cm[(int64_t)k * C + j];
        }
        double p = safe_div((double)tp, (double)pred), rc = safe_div((double)tp, (double)truth);
        P += p, R += rc, F += safe_div(2 * p * rc, p + rc);
        count++;
    }
    r.precision = P / count;
    r.recall = R / count;
    r.f1 = F / count;
    return r;
}
