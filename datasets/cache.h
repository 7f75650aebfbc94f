/* Internal to datasets/: versioned, hashed cache files shared by the encoded-set cache
 * (datasets/dataset.c, *.bqds) and the SQuAD word-piece cache (datasets/squad.c, *.bqsq).
 *
 * Layout (native byte order): magic (8 bytes), version (uint32), key (uint64), payload size in bytes
 * (uint64), FNV-1a 64 hash of the payload (uint64, bq_fnv1a from BQ_FNV_OFFSET), then the payload.
 * A writer fills a per-process temp file next to the target and renames it into place only after
 * the header is complete and the data is fsynced, so a reader never sees a half-written file. */
#ifndef BQ_DATASET_CACHE_H
#define BQ_DATASET_CACHE_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

typedef struct BqCacheWriter {
    FILE *f;
    char *tmp, *path;
    uint64_t key, hash, bytes;
    int err;
} BqCacheWriter;

/* Creates "<path>.<pid>.tmp" and writes the header with size and hash still zero. magic is exactly
 * 8 bytes. Returns BQ_OK, or BQ_EIO with a message naming the temp file (w then holds nothing). */
int bq_cache_writer_open(BqCacheWriter *w, const char *path, const char *magic, uint32_t version, uint64_t key);

/* Appends n bytes of payload and folds them into the hash; a write error is remembered for commit. */
void bq_cache_append(BqCacheWriter *w, const void *p, size_t n);

/* Writes the final size and hash into the header, flushes, fsyncs and renames the temp file to the
 * target. Always releases w; on failure removes the temp file and returns BQ_EIO naming it. */
int bq_cache_writer_commit(BqCacheWriter *w);

/* The validated payload of a cache file, read with a cursor. */
typedef struct BqCacheReader {
    char *buf;
    const char *p, *end;
} BqCacheReader;

/* Opens path and checks magic, version, key, the payload size (and that nothing follows it) and
 * the hash. Returns 1 with the payload in r, 0 when the file is absent, -1 when it is present but
 * stale or corrupt (r then holds nothing). Sets no error message: a rejected file is rebuilt. */
int bq_cache_reader_open(BqCacheReader *r, const char *path, const char *magic, uint32_t version, uint64_t key);

/* Copies the next n payload bytes to dst; returns 1, or 0 (copying nothing) when fewer are left. */
int bq_cache_take(BqCacheReader *r, void *dst, size_t n);

/* Payload bytes not yet taken. */
uint64_t bq_cache_left(const BqCacheReader *r);

void bq_cache_reader_close(BqCacheReader *r);

#endif
