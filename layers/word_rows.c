/* The word-embedding rows of a model that does not hold its table (contract in layers/bert.h,
 * bq_bert_word_rows_attach): a pool of rows fetched on first use, indexed by word id, with the clock
 * algorithm (second chance) choosing which row a new word takes once the pool is full, so that the
 * frequent words of a corpus stay while the rare ones come and go. */
#include "layers/word_rows.h"

#include <stdlib.h>
#include <string.h>

/* slot[id] of a word that one bq_word_rows_map call needs and that is not in the pool yet */
#define PENDING (-2)

struct BqWordRows {
    BqRowFetch fetch;
    void (*close)(void *);
    void *user;
    int64_t vocab, H;
    int64_t cap, used;  /* pool rows, and how many hold a word (the rows [0, used)) */
    int32_t *slot;      /* (vocab) the pool row holding word id, -1 none */
    int32_t *owner;     /* (cap) the word a row holds, -1 none */
    uint32_t *stamp;    /* (cap) the map call that last used a row: such a row is not taken in that call */
    uint8_t *ref;       /* (cap) used since the clock hand last passed it */
    int64_t hand;       /* the clock hand: the next row the search for a free row looks at */
    uint32_t call;      /* map calls so far (stamps of 0 belong to none) */
    float *pool;        /* (cap, H) */
    int64_t fetched, evicted;
};

/* Gives the pool cap rows (cap ≥ its current rows); the rows held keep their places. */
static void pool_resize(BqWordRows *w, int64_t cap) {
    w->pool = bq_realloc(w->pool, (size_t)(cap * w->H) * sizeof(float));
    w->owner = bq_realloc(w->owner, (size_t)cap * sizeof(int32_t));
    w->stamp = bq_realloc(w->stamp, (size_t)cap * sizeof(uint32_t));
    w->ref = bq_realloc(w->ref, (size_t)cap);
    memset(w->stamp + w->cap, 0, (size_t)(cap - w->cap) * sizeof(uint32_t));
    memset(w->ref + w->cap, 0, (size_t)(cap - w->cap));
    w->cap = cap;
}

BqWordRows *bq_word_rows_new(BqRowFetch fetch, void (*close)(void *), void *user, int64_t vocab, int64_t H,
                             int64_t cap) {
    BQ_CHECK(fetch && vocab > 0 && H > 0 && cap > 0);
    BqWordRows *w = bq_calloc(1, sizeof *w);
    w->fetch = fetch, w->close = close, w->user = user;
    w->vocab = vocab, w->H = H;
    w->slot = bq_malloc((size_t)vocab * sizeof(int32_t));
    memset(w->slot, 0xff, (size_t)vocab * sizeof(int32_t));
    pool_resize(w, cap < vocab ? cap : vocab);
    return w;
}

void bq_word_rows_free(BqWordRows *w) {
    if (!w) return;
    if (w->close) w->close(w->user);
    free(w->slot);
    free(w->owner);
    free(w->stamp);
    free(w->ref);
    free(w->pool);
    free(w);
}

/* A row for a new word: a free one while there are, else the first row after the hand that this call has
 * not used and whose reference bit is clear (the bits of the rows passed on the way are cleared). The
 * caller has made sure that some row is not this call's, so the hand stops within two turns. */
static int64_t take_row(BqWordRows *w) {
    if (w->used < w->cap) return w->used++;
    for (;;) {
        const int64_t r = w->hand;
        w->hand = (w->hand + 1) % w->cap;
        if (w->stamp[r] == w->call) continue;
        if (w->ref[r]) {
            w->ref[r] = 0;
            continue;
        }
        if (w->owner[r] >= 0) { /* -1: a row left empty by a failed fetch */
            w->slot[w->owner[r]] = -1;
            w->evicted++;
        }
        return r;
    }
}

int bq_word_rows_map(BqWordRows *w, const int32_t *ids, int64_t n, int32_t *local, BqTensor *table) {
    if (++w->call == 0) { /* the counter wrapped: no stamp may equal a future call */
        memset(w->stamp, 0, (size_t)w->cap * sizeof(uint32_t));
        w->call = 1;
    }
    /* the rows this call uses: those held (stamped now, so that no new word takes them) and the missing
     * words (marked pending, each counted once) */
    int64_t need = 0;
    for (int64_t i = 0; i < n; i++) {
        const int32_t id = ids[i];
        BQ_CHECK(id >= 0 && id < w->vocab);
        const int32_t s = w->slot[id];
        if (s == PENDING || (s >= 0 && w->stamp[s] == w->call)) continue;
        need++;
        if (s >= 0) w->stamp[s] = w->call, w->ref[s] = 1;
        else w->slot[id] = PENDING;
    }
    /* a call needs all its rows at once: the pool grows to the largest call (an inference batch) */
    if (need > w->cap) pool_resize(w, need);
    int st = BQ_OK;
    for (int64_t i = 0; i < n; i++) {
        const int32_t id = ids[i];
        if (w->slot[id] != PENDING) continue;
        if (st) { /* after a failed fetch: the words still pending are simply not in the pool */
            w->slot[id] = -1;
            continue;
        }
        const int64_t r = take_row(w);
        if ((st = w->fetch(w->user, id, w->pool + r * w->H))) {
            w->slot[id] = -1, w->owner[r] = -1, w->stamp[r] = 0, w->ref[r] = 0;
            continue;
        }
        w->owner[r] = id, w->slot[id] = (int32_t)r, w->stamp[r] = w->call, w->ref[r] = 1;
        w->fetched++;
    }
    if (st) return st;
    for (int64_t i = 0; i < n; i++) local[i] = w->slot[ids[i]];
    const int64_t shape[2] = {w->cap, w->H};
    *table = bq_tensor_wrap(w->pool, NULL, 2, shape);
    return BQ_OK;
}

void bq_word_rows_stats(const BqWordRows *w, int64_t *fetched, int64_t *evicted, int64_t *cap) {
    if (fetched) *fetched = w->fetched;
    if (evicted) *evicted = w->evicted;
    if (cap) *cap = w->cap;
}
