/* Batcher (datasets/batcher.c) on a synthetic encoded dataset: every example exactly once per epoch,
 * dynamic padding (T = longest in batch, [PAD]/mask 0/type 0 after), same seed -> same batches, epochs
 * differ, exact resume through bq_batcher_seek, bucketing cuts padding, buffers never reallocated. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "datasets/dataset.h"
#include "tests/test_util.h"

static BqDataset *synth(int64_t n) {
    BqDataset *d = bq_calloc(1, sizeof *d);
    d->n = n;
    d->pad_id = 0;
    d->offsets = bq_malloc((size_t)(n + 1) * sizeof(int64_t));
    d->labels = bq_malloc((size_t)n * sizeof(int32_t));
    d->offsets[0] = 0;
    for (int64_t i = 0; i < n; i++) {
        int64_t len = 3 + (int64_t)(bq_hash64(7, (uint64_t)i) % 120);
        d->offsets[i + 1] = d->offsets[i] + len;
        if (len > d->max_len) d->max_len = len;
        d->labels[i] = (int32_t)(i % 3);
    }
    d->ids = bq_malloc((size_t)d->offsets[n] * sizeof(int32_t));
    d->types = bq_malloc((size_t)d->offsets[n]);
    for (int64_t i = 0; i < n; i++)
        for (int64_t t = 0; t < bq_dataset_len(d, i); t++) {
            d->ids[d->offsets[i] + t] = (int32_t)(1 + i * 1000 + t);
            d->types[d->offsets[i] + t] = (uint8_t)(t > 5);
        }
    return d;
}

/* Runs one epoch, validating every batch; returns the combined checksum and the padding ratio. */
static uint64_t check_epoch(BqBatcher *b, const BqDataset *d, double *ratio) {
    int *seen = bq_calloc((size_t)d->n, sizeof(int));
    uint64_t all = 1469598103934665603ULL;
    int64_t nb = 0, rows = 0, padded = 0, real = 0;
    int64_t epoch = b->epoch;
    const int32_t *buf0 = b->buf.input_ids;
    BqBatch x;
    while (bq_batcher_next(b, &x)) {
        EXPECT(x.input_ids == buf0); /* buffers allocated once */
        EXPECT(x.B >= 1 && x.B <= b->batch_size);
        int64_t T = 0;
        for (int64_t r = 0; r < x.B; r++) {
            int64_t i = x.example_index[r];
            EXPECT(i >= 0 && i < d->n);
            if (i < 0 || i >= d->n) continue;
            seen[i]++;
            int64_t len = bq_dataset_len(d, i);
            if (len > T) T = len;
            EXPECT(x.labels[r] == d->labels[i]);
            for (int64_t t = 0; t < x.T; t++) {
                int64_t o = r * x.T + t;
                if (t < len) {
                    EXPECT(x.input_ids[o] == d->ids[d->offsets[i] + t] && x.attention_mask[o] == 1.0f &&
                           x.token_type_ids[o] == d->types[d->offsets[i] + t]);
                } else {
                    EXPECT(x.input_ids[o] == d->pad_id && x.attention_mask[o] == 0.0f && x.token_type_ids[o] == 0);
                }
            }
            real += len;
        }
        EXPECT(x.T == T);
        padded += x.B * x.T;
        rows += x.B;
        all = (all ^ bq_batch_checksum(&x)) * 1099511628211ULL;
        nb++;
        int64_t r2, p2;
        bq_batcher_padding(b, &r2, &p2);
        EXPECT(r2 == real && p2 == padded);
    }
    EXPECT(nb == (d->n + b->batch_size - 1) / b->batch_size);
    EXPECT(rows == d->n);
    for (int64_t i = 0; i < d->n; i++) EXPECT(seen[i] == 1);
    EXPECT(b->epoch == epoch + 1 && b->cursor == 0);
    *ratio = (double)padded / (double)real;
    free(seen);
    return all;
}

int main(void) {
    BqDataset *d = synth(1000);
    int sizes[3] = {1, 7, 32};
    double worst = 0;
    for (int si = 0; si < 3; si++)
        for (int sh = 0; sh < 2; sh++)
            for (int bu = 0; bu < 2; bu++) {
                BqBatcher a, b;
                EXPECT(bq_batcher_init(&a, d, sizes[si], sh, 1234, bu) == 0);
                EXPECT(bq_batcher_init(&b, d, sizes[si], sh, 1234, bu) == 0);
                double ra, rb, ra1;
                uint64_t e0 = check_epoch(&a, d, &ra), e0b = check_epoch(&b, d, &rb);
                EXPECT(e0 == e0b); /* same seed, same batches */
                uint64_t e1 = check_epoch(&a, d, &ra1);
                if (sh) EXPECT(e1 != e0); /* epoch mixed into the seed */
                else EXPECT(e1 == e0);
                /* resume: position b at (epoch 2, batch 5) and compare with a continuing */
                BqBatch x, y;
                for (int k = 0; k < 5; k++) EXPECT(bq_batcher_next(&a, &x));
                bq_batcher_seek(&b, a.epoch, a.cursor);
                EXPECT(bq_batcher_next(&a, &x) && bq_batcher_next(&b, &y));
                EXPECT(bq_batch_checksum(&x) == bq_batch_checksum(&y));
                if (!sh && !bu) EXPECT(a.order[0] == 0 && a.order[999] == 999);
                printf("batch %2d shuffle %d bucket %d: padding %.3fx\n", sizes[si], sh, bu, ra);
                if (si == 2 && bu == 0 && ra > worst) worst = ra;
                if (si == 2 && bu == 1) EXPECT(ra < 1.1 && ra < worst);
                bq_batcher_free(&a);
                bq_batcher_free(&b);
            }
    /* different seeds give different epochs */
    BqBatcher a, b;
    double r;
    bq_batcher_init(&a, d, 16, 1, 1, 1);
    bq_batcher_init(&b, d, 16, 1, 2, 1);
    EXPECT(check_epoch(&a, d, &r) != check_epoch(&b, d, &r));
    bq_batcher_free(&a);
    bq_batcher_free(&b);
    EXPECT(bq_batcher_init(&a, d, 0, 1, 1, 0) == BQ_EINVAL);
    free(d->offsets), free(d->labels), free(d->ids), free(d->types), free(d);
    printf("test_dataset_batcher: %d failure(s) (max error %d)\n", fails, fails);
    return fails ? 1 : 0;
}
