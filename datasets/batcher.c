/* Batcher: seeded per-epoch shuffling, dynamic padding to the longest sequence of each batch, optional
 * length bucketing (sort by length inside chunks of BQ_BUCKET_CHUNK batches, then shuffle the batch
 * order, as in tensor2tensor/fairseq-style bucketing), resumable at (epoch, cursor). Buffers are
 * allocated once at init; next() never allocates. */
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "datasets/dataset.h"
#include "datasets/source.h"


typedef struct LenIdx {
    int64_t len, pos, idx;
} LenIdx;

static int cmp_len(const void *a, const void *b) {
    const LenIdx *x = a, *y = b;
    if (x->len != y->len) return (x->len > y->len) - (x->len < y->len);
    return (x->pos > y->pos) - (x->pos < y->pos); /* stable */
}

/* Fisher-Yates over int64 with a bq_rng. */
static void shuffle_i64(BqRng *r, int64_t *v, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = (int64_t)bq_rng_below(r, (uint64_t)i + 1);
        int64_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

static void build_epoch(BqBatcher *b) {
    const BqDataset *ds = b->ds;
    int64_t n = ds->n, bs = b->batch_size;
    BqRng r;
    bq_rng_seed(&r, bq_hash64(b->seed, (uint64_t)b->epoch));
    for (int64_t i = 0; i < n; i++) b->order[i] = i;
    if (b->shuffle) shuffle_i64(&r, b->order, n);
    for (int64_t k = 0; k <= b->nbatches; k++) b->batch_start[k] = k * bs < n ? k * bs : n;
    if (b->bucket) {
        int64_t chunk = bs * BQ_BUCKET_CHUNK;
        LenIdx *tmp = b->scratch;
        for (int64_t c0 = 0; c0 < n; c0 += chunk) {
            int64_t m = n - c0 < chunk ? n - c0 : chunk;
            for (int64_t i = 0; i < m; i++) tmp[i] = (LenIdx){bq_dataset_len(ds, b->order[c0 + i]), i, b->order[c0 + i]};
            qsort(tmp, (size_t)m, sizeof *tmp, cmp_len);
            for (int64_t i = 0; i < m; i++) b->order[c0 + i] = tmp[i].idx;
        }
    }
    for (int64_t k = 0; k < b->nbatches; k++) b->batch_perm[k] = k;
    if (b->shuffle && b->bucket) shuffle_i64(&r, b->batch_perm, b->nbatches);
    b->real_tokens = b->padded_tokens = 0;
}

int bq_batcher_init(BqBatcher *b, const BqDataset *ds, int batch_size, int shuffle, uint64_t seed, int bucket) {
    memset(b, 0, sizeof *b);
    if (batch_size < 1) return bq_err(BQ_EINVAL, "--batch-size: must be >= 1, got %d", batch_size);
    BQ_CHECK(ds && ds->n > 0);
    b->ds = ds;
    b->batch_size = batch_size;
    b->shuffle = shuffle;
    b->seed = seed;
    b->bucket = bucket;
    b->nbatches = (ds->n + batch_size - 1) / batch_size;
    b->order = bq_malloc((size_t)ds->n * sizeof(int64_t));
    b->batch_start = bq_malloc((size_t)(b->nbatches + 1) * sizeof(int64_t));
    b->batch_perm = bq_malloc((size_t)b->nbatches * sizeof(int64_t));
    size_t cap = (size_t)batch_size * (size_t)(ds->max_len > 0 ? ds->max_len : 1);
    b->buf.input_ids = bq_malloc(cap * sizeof(int32_t));
    b->buf.attention_mask = bq_malloc(cap * sizeof(float));
    b->buf.token_type_ids = bq_malloc(cap * sizeof(int32_t));
    b->buf.labels = bq_malloc((size_t)batch_size * sizeof(int32_t));
    b->buf.example_index = bq_malloc((size_t)batch_size * sizeof(int64_t));
    if (bucket) {
        int64_t chunk = (int64_t)batch_size * BQ_BUCKET_CHUNK;
        b->scratch = bq_malloc((size_t)(chunk < ds->n ? chunk : ds->n) * sizeof(LenIdx));
    }
    build_epoch(b);
    return BQ_OK;
}

void bq_batcher_free(BqBatcher *b) {
    free(b->order);
    free(b->batch_start);
    free(b->batch_perm);
    free(b->buf.input_ids);
    free(b->buf.attention_mask);
    free(b->buf.token_type_ids);
    free(b->buf.labels);
    free(b->buf.example_index);
    free(b->scratch);
    memset(b, 0, sizeof *b);
}

void bq_batcher_seek(BqBatcher *b, int64_t epoch, int64_t cursor) {
    BQ_CHECK(epoch >= 0 && cursor >= 0 && cursor <= b->nbatches);
    b->epoch = epoch;
    build_epoch(b);
    b->cursor = cursor;
}

int bq_batcher_next(BqBatcher *b, BqBatch *out) {
    if (b->cursor >= b->nbatches) {
        b->epoch++;
        b->cursor = 0;
        build_epoch(b);
        return 0;
    }
    const BqDataset *ds = b->ds;
    int64_t k = b->batch_perm[b->cursor++];
    int64_t s = b->batch_start[k], e = b->batch_start[k + 1], B = e - s, T = 0;
    for (int64_t i = s; i < e; i++) {
        int64_t l = bq_dataset_len(ds, b->order[i]);
        if (l > T) T = l;
    }
    BqBatch *o = &b->buf;
    o->B = B;
    o->T = T;
    int64_t real = 0;
    for (int64_t r = 0; r < B; r++) {
        int64_t x = b->order[s + r], l = bq_dataset_len(ds, x), off = ds->offsets[x];
        int32_t *ids = o->input_ids + r * T, *tt = o->token_type_ids + r * T;
        float *m = o->attention_mask + r * T;
        for (int64_t t = 0; t < l; t++) {
            ids[t] = ds->ids[off + t];
            tt[t] = ds->types[off + t];
            m[t] = 1.0f;
        }
        for (int64_t t = l; t < T; t++) {
            ids[t] = ds->pad_id;
            tt[t] = 0;
            m[t] = 0.0f;
        }
        o->labels[r] = ds->labels[x];
        o->example_index[r] = x;
        real += l;
    }
    b->real_tokens += real;
    b->padded_tokens += B * T;
    *out = *o;
    return 1;
}

double bq_batcher_padding(const BqBatcher *b, int64_t *real, int64_t *padded) {
    if (real) *real = b->real_tokens;
    if (padded) *padded = b->padded_tokens;
    return b->real_tokens ? (double)b->padded_tokens / (double)b->real_tokens : 1.0;
}

uint64_t bq_batch_checksum(const BqBatch *x) {
    uint64_t h = BQ_FNV_OFFSET;
    h = bq_fnv1a(h, &x->B, sizeof x->B);
    h = bq_fnv1a(h, &x->T, sizeof x->T);
    size_t n = (size_t)(x->B * x->T);
    h = bq_fnv1a(h, x->input_ids, n * sizeof(int32_t));
    h = bq_fnv1a(h, x->attention_mask, n * sizeof(float));
    h = bq_fnv1a(h, x->token_type_ids, n * sizeof(int32_t));
    h = bq_fnv1a(h, x->labels, (size_t)x->B * sizeof(int32_t));
    return h;
}
