/* The sources of datasets/: the kinds of data a path may hold and how to probe it (public:
 * datasets/dataset.h includes this header), and the raw (unencoded) examples read from a source file
 * or folder (internal to datasets/). */
#ifndef BQ_DATASET_SOURCE_H
#define BQ_DATASET_SOURCE_H

#include <stddef.h>
#include <stdint.h>

typedef enum BqDataKind {
    BQ_DATA_IMDB_DIR = 1,
    BQ_DATA_IMDB_ARCHIVE = 2,
    BQ_DATA_CSV = 3,
    BQ_DATA_TSV = 4,
    BQ_DATA_JSONL = 5,
    BQ_DATA_SPLIT_DIR = 6, /* folder with train.<ext> / test.<ext> */
} BqDataKind;

/* Detects the kind of PATH; *has_test = 1 when it has a distinct test split (IMDB, split folder). */
int bq_data_probe(const char *path, BqDataKind *kind, int *has_test);
const char *bq_data_kind_name(BqDataKind kind);

typedef struct BqRawExample {
    char *text;      /* owned, NUL-terminated; len bytes. NULL in a lazy set (below), and so is pair */
    size_t len;
    char *pair;      /* NULL: single sequence */
    size_t pair_len;
    char *label;     /* NULL: unlabeled */
    int64_t line;    /* 1-based line (CSV/TSV/JSONL) or 0 */
} BqRawExample;

typedef struct BqRawSet {
    BqRawExample *ex;
    int64_t n, cap;
    int64_t skipped_empty;
    int fixed_imdb;  /* labels are "neg"/"pos" with fixed indices */
    char *file;      /* file the split was read from, for messages (lazy archive: the archive) */
    /* A lazy set (every set bq_source_read makes) holds no texts, only each example's lengths and label:
     * bq_source_texts reads the texts asked for. aclImdb: ids[i] is review i's id ((label, id) order);
     * paths[i] its file (folder; NULL for an archive); split the split read. CSV, TSV, JSONL (fmt, the
     * file's BqDataKind): example i's record is spans[i] bytes at offs[i] of file, parsed again for its
     * text (column cols[0] or key keys[0]; NULL: the first of the default names present) and pair
     * (cols[1], keys[1]; -1 / NULL: none). */
    int lazy;
    long long *ids;
    char **paths;
    char *split;
    int fmt;
    int64_t *offs, *spans;
    int cols[2];
    char *keys[2];
} BqRawSet;

typedef struct BqSourceOptions {
    const char *text_column, *text_pair_column, *label_column;
} BqSourceOptions;

/* Reads split "train" or "test" of the source at path (kind from bq_data_probe). */
int bq_source_read(BqRawSet *out, const char *path, BqDataKind kind, const char *split, const BqSourceOptions *o);
/* Receives cnt texts asked of bq_source_texts: ex[k] (text filled in) is the example at position at[k]
 * of the caller's idx. The texts are freed when it returns; nonzero stops the reading. */
typedef int (*BqTextFn)(void *user, const int64_t *at, const BqRawExample *ex, int64_t cnt);
/* Hands the texts of examples idx[0..n) of r (ascending, distinct) to fn, at most chunk at a time, in
 * the order the source stores them; a lazy set's texts are read again from the source and held one chunk
 * at a time. Errors: a file that cannot be read, a review whose length changed since bq_source_read
 * (BQ_EIO / BQ_EFORMAT naming the file), or fn's status. */
int bq_source_texts(const BqRawSet *r, const int64_t *idx, int64_t n, int64_t chunk, BqTextFn fn, void *user);
/* Reads every text of a lazy set into it (r->lazy becomes 0), for tools and tests that walk all the texts;
 * a set that holds its texts is left as it is. Errors: those of bq_source_texts. */
int bq_source_hold_texts(BqRawSet *r);
/* Identity of the data a split is read from: hash of canonical path(s), sizes and mtimes. */
int bq_source_identity(const char *path, BqDataKind kind, const char *split, uint64_t *id);
/* For BQ_DATA_SPLIT_DIR: the file of a split ("train"/"test"), malloc'd; NULL if absent. */
char *bq_source_split_file(const char *dir, const char *split, BqDataKind *file_kind);
void bq_raw_free(BqRawSet *r);

uint64_t bq_fnv1a(uint64_t h, const void *data, size_t n);
#define BQ_FNV_OFFSET 1469598103934665603ULL

#endif
