/* The pool behind bq_bert_word_rows_attach (layers/bert.h): word-embedding rows fetched on first use and
 * kept while the pool has room; once it is full, a new word takes the row of one not used lately (the
 * clock algorithm), so a corpus's frequent words stay. */
#ifndef BQ_WORD_ROWS_H
#define BQ_WORD_ROWS_H

#include "autograd/tensor.h"

/* Writes row `row` of a table (its hidden_size floats) to dst; an int status with a message on failure. */
typedef int (*BqRowFetch)(void *user, int64_t row, float *dst);
typedef struct BqWordRows BqWordRows;

/* A pool of cap rows (at most vocab) of H floats, fetched by fetch(user, id, dst); close(user) at free. */
BqWordRows *bq_word_rows_new(BqRowFetch fetch, void (*close)(void *), void *user, int64_t vocab, int64_t H,
                             int64_t cap);
void bq_word_rows_free(BqWordRows *w);

/* The rows of the n word ids (each in [0, vocab)) as a table and row indices into it: table (cap, H)
 * views the pool, local[i] is the row of ids[i], so table[local[i]] is row ids[i] of the model's table
 * (the same floats). Valid until the next call. Missing rows are fetched (the pool grows first when the
 * call's distinct ids exceed it, so every row of a pass is in it at once); a fetch error is returned as
 * it came, and the pool stays usable (the word is fetched again when next asked for). */
int bq_word_rows_map(BqWordRows *w, const int32_t *ids, int64_t n, int32_t *local, BqTensor *table);

/* Rows fetched and rows given to another word so far, and the pool's rows (any pointer may be NULL). */
void bq_word_rows_stats(const BqWordRows *w, int64_t *fetched, int64_t *evicted, int64_t *cap);

#endif
