/* Versioned, hashed cache files: temp-file writer with durable rename, and a validating reader.
 * Layout and contracts in datasets/cache.h; the checkpoint writers follow the same temp, fsync,
 * rename pattern (autograd/core.c bq_rename_durable). */
#include "datasets/cache.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "autograd/bq.h"
#include "datasets/source.h"

/* Offset of the key/size/hash triple: after the 8-byte magic and the uint32 version. */
#define HDR_AT 12
/* Largest payload a reader accepts (1 TiB): a corrupt size must not drive the allocation. */
#define MAX_PAYLOAD ((uint64_t)1 << 40)

int bq_cache_writer_open(BqCacheWriter *w, const char *path, const char *magic, uint32_t version, uint64_t key) {
    memset(w, 0, sizeof *w);
    /* per-process temp name: two runs filling the same cache entry never interleave their writes */
    size_t pl = strlen(path) + 32;
    w->tmp = bq_malloc(pl);
    snprintf(w->tmp, pl, "%s.%ld.tmp", path, (long)getpid());
    w->f = fopen(w->tmp, "wb");
    if (!w->f) {
        int st = bq_err(BQ_EIO, "%s: %s", w->tmp, strerror(errno));
        free(w->tmp);
        w->tmp = NULL;
        return st;
    }
    w->path = bq_strdup(path);
    w->key = key;
    w->hash = BQ_FNV_OFFSET;
    uint64_t hdr[3] = {key, 0, 0};
    if (fwrite(magic, 1, 8, w->f) != 8 || fwrite(&version, 4, 1, w->f) != 1 || fwrite(hdr, 8, 3, w->f) != 3) w->err = 1;
    return BQ_OK;
}

void bq_cache_append(BqCacheWriter *w, const void *p, size_t n) {
    if (!n) return;
    w->hash = bq_fnv1a(w->hash, p, n);
    w->bytes += n;
    if (fwrite(p, 1, n, w->f) != n) w->err = 1;
}

int bq_cache_writer_commit(BqCacheWriter *w) {
    int st = BQ_OK;
    uint64_t hdr[3] = {w->key, w->bytes, w->hash};
    if (!w->err && fseek(w->f, HDR_AT, SEEK_SET) == 0 && fwrite(hdr, 8, 3, w->f) == 3 && fflush(w->f) == 0 &&
        !ferror(w->f)) {
        if (fclose(w->f) != 0) st = bq_err(BQ_EIO, "%s: write failed", w->tmp);
        w->f = NULL;
        if (!st) st = bq_rename_durable(w->tmp, w->path);
    } else {
        st = bq_err(BQ_EIO, "%s: write failed", w->tmp);
    }
    if (w->f) fclose(w->f);
    if (st) remove(w->tmp);
    free(w->tmp);
    free(w->path);
    memset(w, 0, sizeof *w);
    return st;
}

int bq_cache_reader_open(BqCacheReader *r, const char *path, const char *magic, uint32_t version, uint64_t key) {
    memset(r, 0, sizeof *r);
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    int ok = -1;
    char m[8];
    uint32_t ver;
    uint64_t hdr[3];
    if (fread(m, 1, 8, f) != 8 || memcmp(m, magic, 8) || fread(&ver, 4, 1, f) != 1 || ver != version ||
        fread(hdr, 8, 3, f) != 3 || hdr[0] != key || hdr[1] > MAX_PAYLOAD)
        goto cleanup;
    r->buf = malloc(hdr[1] + 1);
    if (!r->buf || fread(r->buf, 1, hdr[1], f) != hdr[1] || fgetc(f) != EOF) goto cleanup;
    if (bq_fnv1a(BQ_FNV_OFFSET, r->buf, hdr[1]) != hdr[2]) goto cleanup;
    r->p = r->buf;
    r->end = r->buf + hdr[1];
    ok = 1;
cleanup:
    fclose(f);
    if (ok != 1) bq_cache_reader_close(r);
    return ok;
}

int bq_cache_take(BqCacheReader *r, void *dst, size_t n) {
    if (bq_cache_left(r) < (uint64_t)n) return 0;
    if (n) memcpy(dst, r->p, n);
    r->p += n;
    return 1;
}

uint64_t bq_cache_left(const BqCacheReader *r) { return (uint64_t)(r->end - r->p); }

void bq_cache_reader_close(BqCacheReader *r) {
    free(r->buf);
    memset(r, 0, sizeof *r);
}
