/* The word-embedding rows of a model that does not hold its table (contract in layers/bert.h,
 * bq_bert_word_rows_attach): a pool of rows fetched on first use, indexed by word id. */
#include "layers/word_rows.h"

#include <stdlib.h>
#include <string.h>

struct BqWordRows {
    BqRowFetch fetch;
    void (*close)(void *);
    void *user;
    int64_t vocab, H;
    int64_t cap, used; /* pool rows, and how many hold a word */
    int32_t *slot;     /* (vocab) the pool row holding word id, -1 none */
    float *pool;       /* (cap, H) */
    int64_t fetched, flushes;
};

BqWordRows *bq_word_rows_new(BqRowFetch fetch, void (*close)(void *), void *user, int64_t vocab, int64_t H,
                             int64_t cap) {
    BQ_CHECK(fetch && vocab > 0 && H > 0 && cap > 0);
    BqWordRows *w = bq_calloc(1, sizeof *w);
    w->fetch = fetch, w->close = close, w->user = user;
    w->vocab = vocab, w->H = H, w->cap = cap < vocab ? cap : vocab;
    w->slot = bq_malloc((size_t)vocab * sizeof(int32_t));
    memset(w->slot, 0xff, (size_t)vocab * sizeof(int32_t));
    w->pool = bq_malloc((size_t)(w->cap * H) * sizeof(float));
    return w;
}

void bq_word_rows_free(BqWordRows *w) {
    if (!w) return;
    if (w->close) w->close(w->user);
    free(w->slot);
    free(w->pool);
    free(w);
}

/* Empties the pool: every word is fetched again when next used. */
static void flush(BqWordRows *w) {
    memset(w->slot, 0xff, (size_t)w->vocab * sizeof(int32_t));
    w->used = 0;
    w->flushes++;
}

int bq_word_rows_map(BqWordRows *w, const int32_t *ids, int64_t n, int32_t *local, BqTensor *table) {
    /* a pass needs at most n rows at once: the pool grows to the largest pass (an inference batch) */
    if (n > w->cap && w->cap < w->vocab) {
        w->cap = n < w->vocab ? n : w->vocab;
        w->pool = bq_realloc(w->pool, (size_t)(w->cap * w->H) * sizeof(float));
        flush(w);
    }
    for (int64_t i = 0; i < n; i++) {
        const int32_t id = ids[i];
        BQ_CHECK(id >= 0 && id < w->vocab);
        if (w->slot[id] >= 0) continue;
        if (w->used == w->cap) { /* full: start over with an empty pool; the pass fits in it */
            flush(w);
            i = -1;
            continue;
        }
        int st = w->fetch(w->user, id, w->pool + w->used * w->H);
        if (st) return st;
        w->slot[id] = (int32_t)w->used++;
        w->fetched++;
    }
    for (int64_t i = 0; i < n; i++) local[i] = w->slot[ids[i]];
    const int64_t shape[2] = {w->cap, w->H};
    *table = bq_tensor_wrap(w->pool, NULL, 2, shape);
    return BQ_OK;
}

void bq_word_rows_stats(const BqWordRows *w, int64_t *fetched, int64_t *flushes, int64_t *cap) {
    if (fetched) *fetched = w->fetched;
    if (flushes) *flushes = w->flushes;
    if (cap) *cap = w->cap;
}
