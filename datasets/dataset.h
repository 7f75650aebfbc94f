/* Datasets: reading labelled text from the supported sources, encoding it with the BERT tokenizer
 * (multi-threaded, deterministic), caching the encoded set on disk, and batching it (seeded
 * shuffling, dynamic padding, optional length bucketing) into BqBatch for the trainer/evaluator.
 *
 * Reference recipe: ONNX Runtime's bert_imdb_finetune_qat example (shuffle the train split with a
 * seed, take N samples, carve a validation fraction; shuffle the test split, take M samples).
 *
 * Sources (--data PATH, kind auto-detected):
 *   - aclImdb folder: PATH/{train,test}/{pos,neg}/<id>_<rating>.txt (or PATH/aclImdb/...); pos=1,
 *     neg=0; train/unsup and everything else ignored. Examples ordered by split, label (neg, pos),
 *     numeric id, so the folder and the archive give identical data.
 *   - aclImdb archive (.tar.gz/.tgz/.tar) read in place through libarchive, never extracted: the
 *     original aclImdb_v1.tar.gz and aclImdb_train_test.tar.gz; same layout rules as the folder.
 *   - CSV (RFC 4180 quoting, header row, columns by name; e.g. Kaggle `review,sentiment`), TSV (header
 *     row, tab separated, no quoting), JSONL (one object per line, e.g. {"text": ..., "label": ...}).
 *     A single file serves every split; a folder holding train.<ext> and test.<ext> gives each split
 *     its file (label names then come from the train file; a test label outside them is an error).
 * Labels: IMDB neg=0 pos=1. Generic: if every label is an integer >= 0, the integer itself (names
 * "0".."max"); otherwise the sorted unique strings (so negative=0, positive=1). No label column
 * (and none named): unlabeled, label -1.
 * Empty texts (nothing but ASCII whitespace) are skipped and counted (BqDataset.skipped_empty).
 * Invalid UTF-8 is passed through to the tokenizer (which maps it to U+FFFD, then drops it).
 *
 * Split selection (bq_dataset_load):
 *   train/val: permute the train source with the seed (Fisher-Yates, bq_rng), keep the first
 *              train_samples (0 = all), then the last ceil(val_fraction * kept) of those are "val"
 *              and the rest "train" (HF train_test_split rounds the test side up the same way).
 *   test:      permute the test source with the seed, keep the first eval_samples (0 = all).
 * Examples come out in that permuted order; BqDataset.source_index gives each one's position in the
 * source (deterministic order described above).
 *
 * Cache: the encoded selection is stored in <cache_dir>/<key>.bqds, key = hash of the source identity
 * (canonical path + size + mtime of the file, or of every file read from a folder), source split,
 * columns, vocabulary hash (bq_tokenizer_hash), max_seq_len, truncation and the sample selection.
 * The file carries a magic, a format version, the full key and an FNV-1a checksum of its payload; a
 * stale, truncated or corrupt file is ignored and rebuilt, never trusted. Written to <file>.<pid>.tmp
 * then bq_rename_durable (concurrent runs cannot interleave). cache_dir NULL: $BERTQAT_CACHE, else $XDG_CACHE_HOME/bertqat, else
 * $HOME/.cache/bertqat, else ./.cache/bertqat; "" disables the cache. A cache failure to write is not
 * an error (the data was encoded; a warning line goes to stderr). */
#ifndef BQ_DATASET_H
#define BQ_DATASET_H

#include <stdint.h>

#include "datasets/batch.h"
#include "datasets/source.h"
#include "tokenizer/tokenizer.h"

typedef struct BqDataSpec {
    const char *path;
    const char *split;            /* "train", "val" or "test" */
    int64_t max_seq_len;          /* tokens including [CLS]/[SEP]; <= 0: no truncation */
    BqTruncation truncation;
    double val_fraction;          /* [0, 1): fraction of the kept train samples used for "val" */
    uint64_t seed;
    int64_t train_samples;        /* 0 = all */
    int64_t eval_samples;         /* 0 = all */
    const char *text_column;      /* NULL: first of text, review, sentence, content */
    const char *text_pair_column; /* NULL: single sequence */
    const char *label_column;     /* NULL: first of label, sentiment, labels (absent: unlabeled) */
    const char *cache_dir;        /* NULL: default (see above); "": no cache */
    int threads;                  /* encoding threads; <= 0: bq_runtime_threads() */
} BqDataSpec;

/* Defaults: split "train", max_seq_len 128, head truncation, val_fraction 0, seed 42, all samples,
 * auto columns, default cache, runtime threads. */
void bq_data_spec_default(BqDataSpec *s);

typedef struct BqDataset {
    int64_t n;              /* examples */
    int64_t *offsets;       /* (n+1) start of example i in ids/types */
    int32_t *ids;           /* (offsets[n]) token ids, [CLS] ... [SEP] */
    uint8_t *types;         /* (offsets[n]) token type ids */
    int32_t *labels;        /* (n) class index, -1 unlabeled */
    int32_t *full_len;      /* (n) encoded length before truncation */
    int64_t *source_index;  /* (n) position in the source split (deterministic source order) */
    int nlabels;            /* 0 when unlabeled */
    char **label_names;     /* (nlabels) */
    int64_t max_len;        /* longest encoded example */
    int32_t pad_id;
    int64_t source_count;   /* examples in the source split (after skipping empty ones) */
    int64_t skipped_empty;  /* empty texts skipped in the source split */
    BqDataKind kind;
    int from_cache;         /* 1 when loaded from a valid cache file */
    int cache_rejected;     /* 1 when a cache file existed but was stale/corrupt and was rebuilt */
    char *cache_path;       /* cache file used (NULL: cache disabled) */
    int cache_write_failed; /* 1 when the cache could not be written (data is still valid) */
    double encode_seconds;  /* wall time of reading + encoding (0 when cached) */
    double read_seconds;    /* of which listing the source (bq_source_read: an aclImdb split's texts are read
                             * again while encoding) */
} BqDataset;

/* Loads (from cache or source) and encodes the requested split; tok must be the tokenizer used for
 * training. On error *out is NULL and the message names the file (and line). */
int bq_dataset_load(BqDataset **out, const BqDataSpec *spec, const BqTokenizer *tok);
void bq_dataset_free(BqDataset *d);
static inline int64_t bq_dataset_len(const BqDataset *d, int64_t i) { return d->offsets[i + 1] - d->offsets[i]; }
/* Resolved default cache folder (see above); never NULL. */
const char *bq_data_default_cache_dir(void);

/* Batcher over one dataset. Buffers are allocated once at init for batch_size x max_len, so next()
 * never allocates. Epoch e's order is a Fisher-Yates permutation seeded with bq_hash64(seed, e) (no
 * shuffle: dataset order). With bucket, the (shuffled) order is cut into chunks of
 * BQ_BUCKET_CHUNK batches, each chunk is sorted by length (stable) and cut into batches, then the
 * order of all batches is shuffled (when shuffle). The last batch may be smaller. The sequence of
 * batches depends only on (dataset, batch_size, shuffle, seed, bucket, epoch), never on threads, so
 * a trainer can save (epoch, cursor) and resume exactly with bq_batcher_seek. */
#define BQ_BUCKET_CHUNK 50

typedef struct BqBatcher {
    const BqDataset *ds;
    int batch_size, shuffle, bucket;
    uint64_t seed;
    int64_t epoch;          /* current epoch (0-based) */
    int64_t cursor;         /* batches already returned in this epoch */
    int64_t nbatches;       /* batches per epoch */
    int64_t *order;         /* (n) example order of this epoch */
    int64_t *batch_start;   /* (nbatches+1) batch b = order[batch_start[b] .. batch_start[b+1]) */
    int64_t *batch_perm;    /* (nbatches) batch visiting order */
    int64_t real_tokens;    /* non-padding tokens returned this epoch */
    int64_t padded_tokens;  /* B*T summed over batches returned this epoch */
    BqBatch buf;            /* the buffers handed out by next() */
    void *scratch;          /* bucketing sort space, allocated at init */
} BqBatcher;

int bq_batcher_init(BqBatcher *b, const BqDataset *ds, int batch_size, int shuffle, uint64_t seed, int bucket);
/* Fills *out (pointing into the batcher's buffers, valid until the next call) and returns 1; returns
 * 0 at the end of the epoch, after which the batcher has moved to the next epoch. */
int bq_batcher_next(BqBatcher *b, BqBatch *out);
/* Positions the batcher at batch `cursor` of epoch `epoch` (as saved from b->epoch, b->cursor). */
void bq_batcher_seek(BqBatcher *b, int64_t epoch, int64_t cursor);
/* Padding of the batches returned so far this epoch: real tokens and B*T tokens; returns
 * padded/real (1.0 = no padding). */
double bq_batcher_padding(const BqBatcher *b, int64_t *real, int64_t *padded);
void bq_batcher_free(BqBatcher *b);

/* FNV-1a 64 over a batch's shape and contents (for reproducibility checks). */
uint64_t bq_batch_checksum(const BqBatch *batch);

#endif
