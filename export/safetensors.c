/* safetensors reader (validating, mmap) and writer.
 * Reference: huggingface/safetensors README "Format" section: u64 little-endian header size N,
 * N bytes JSON header {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}},
 * then the byte buffer; offsets are relative to the buffer start; tensors are row-major little endian.
 * The reference writer pads the header with spaces to a multiple of 8 bytes. */
#include "export/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "autograd/bq.h"

static const struct {
    const char *name;
    BqStDtype d;
    int size;
} DTYPES[] = {
    {"F32", BQ_ST_F32, 4},   {"F16", BQ_ST_F16, 2},   {"BF16", BQ_ST_BF16, 2},
    {"F64", BQ_ST_F64, 8},   {"I64", BQ_ST_I64, 8},   {"I32", BQ_ST_I32, 4},
    {"I16", BQ_ST_I16, 2},   {"I8", BQ_ST_I8, 1},     {"U8", BQ_ST_U8, 1},
    {"BOOL", BQ_ST_BOOL, 1}, {"F8_E4M3", BQ_ST_F8_E4M3, 1}, {"F8_E5M2", BQ_ST_F8_E5M2, 1},
    {"U16", BQ_ST_U16, 2},   {"U32", BQ_ST_U32, 4},   {"U64", BQ_ST_U64, 8},
};
#define NDTYPES ((int)(sizeof DTYPES / sizeof DTYPES[0]))

const char *bq_st_dtype_name(BqStDtype d) {
    for (int i = 0; i < NDTYPES; i++)
        if (DTYPES[i].d == d) return DTYPES[i].name;
    return "?";
}

static int dtype_size(BqStDtype d) {
    for (int i = 0; i < NDTYPES; i++)
        if (DTYPES[i].d == d) return DTYPES[i].size;
    return 0;
}

static int cmp_name(const void *a, const void *b) {
    return strcmp(((const BqStTensor *)a)->name, ((const BqStTensor *)b)->name);
}

static int cmp_begin(const void *a, const void *b) {
    const BqStTensor *x = *(const BqStTensor *const *)a, *y = *(const BqStTensor *const *)b;
    return x->begin < y->begin ? -1 : x->begin > y->begin ? 1 : (x->end < y->end ? -1 : x->end > y->end);
}

/* Non-negative JSON integer. */
static int get_u64(json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return 0;
    *out = (uint64_t)json_integer_value(v);
    return 1;
}

static int parse_entry(BqSt *st, BqStTensor *t, const char *name, json_t *v, uint64_t data_size) {
    const char *p = st->path;
    t->name = bq_strdup(name);
    if (!json_is_object(v)) return bq_err(BQ_EFORMAT, "%s: tensor \"%s\": header entry is not an object", p, name);
    json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt)) return bq_err(BQ_EFORMAT, "%s: tensor \"%s\": missing dtype", p, name);
    int found = 0;
    for (int i = 0; i < NDTYPES; i++)
        if (strcmp(DTYPES[i].name, json_string_value(dt)) == 0) t->dtype = DTYPES[i].d, found = 1;
    if (!found)
        return bq_err(BQ_EFORMAT, "%s: tensor \"%s\": unknown dtype \"%s\"", p, name, json_string_value(dt));
    json_t *sh = json_object_get(v, "shape");
    if (!json_is_array(sh)) return bq_err(BQ_EFORMAT, "%s: tensor \"%s\": missing shape", p, name);
    if (json_array_size(sh) > BQ_ST_MAX_DIMS)
        return bq_err(BQ_EFORMAT, "%s: tensor \"%s\": %zu dimensions (at most %d)", p, name, json_array_size(sh),
                      BQ_ST_MAX_DIMS);
    t->ndim = (int)json_array_size(sh);
    uint64_t numel = 1;
    for (int i = 0; i < t->ndim; i++) {
        uint64_t d;
        if (!get_u64(json_array_get(sh, (size_t)i), &d))
            return bq_err(BQ_EFORMAT, "%s: tensor \"%s\": shape entries must be non-negative integers", p, name);
        if (d != 0 && numel > (UINT64_C(1) << 62) / d)
            return bq_err(BQ_EFORMAT, "%s: tensor \"%s\": shape too large", p, name);
        numel *= d;
        t->shape[i] = (int64_t)d;
    }
    t->numel = (int64_t)numel;
    json_t *off = json_object_get(v, "data_offsets");
    if (!json_is_array(off) || json_array_size(off) != 2 || !get_u64(json_array_get(off, 0), &t->begin) ||
        !get_u64(json_array_get(off, 1), &t->end))
        return bq_err(BQ_EFORMAT, "%s: tensor \"%s\": data_offsets must be [begin, end]", p, name);
    if (t->begin > t->end || t->end > data_size)
        return bq_err(BQ_EFORMAT, "%s: tensor \"%s\": data_offsets [%llu, %llu) outside the data (%llu bytes)", p,
                      name, (unsigned long long)t->begin, (unsigned long long)t->end,
                      (unsigned long long)data_size);
    uint64_t want = numel * (uint64_t)dtype_size(t->dtype);
    if (want != t->end - t->begin)
        return bq_err(BQ_EFORMAT, "%s: tensor \"%s\": shape needs %llu bytes of %s, data_offsets span %llu", p,
                      name, (unsigned long long)want, bq_st_dtype_name(t->dtype),
                      (unsigned long long)(t->end - t->begin));
    return BQ_OK;
}

void bq_st_close(BqSt *st) {
    if (!st) return;
    for (int i = 0; i < st->n; i++) free(st->t[i].name);
    free(st->t);
    if (st->map) munmap((void *)st->map, st->size);
    if (st->fd >= 0) close(st->fd);
    free(st->path);
    free(st);
}

int bq_st_open(BqSt **out, const char *path) {
    *out = NULL;
    BqSt *st = bq_calloc(1, sizeof *st);
    st->fd = -1;
    st->path = bq_strdup(path);
    json_t *h = NULL;
    BqStTensor **order = NULL;
    int rc = BQ_OK;
    st->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (st->fd < 0) {
        rc = bq_err(BQ_EIO, "%s: cannot open: %s", path, strerror(errno));
        goto cleanup;
    }
    struct stat sb;
    if (fstat(st->fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        rc = bq_err(BQ_EIO, "%s: not a regular file", path);
        goto cleanup;
    }
    st->size = (uint64_t)sb.st_size;
    if (st->size < 8) {
        rc = bq_err(BQ_EFORMAT, "%s: truncated: %llu bytes, the header length alone needs 8", path,
                    (unsigned long long)st->size);
        goto cleanup;
    }
    st->map = mmap(NULL, st->size, PROT_READ, MAP_PRIVATE, st->fd, 0);
    if (st->map == MAP_FAILED) {
        st->map = NULL;
        rc = bq_err(BQ_EIO, "%s: cannot map: %s", path, strerror(errno));
        goto cleanup;
    }
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | st->map[i];
    if (hlen > st->size - 8) {
        rc = bq_err(BQ_EFORMAT, "%s: header length %llu runs past the end of the file (%llu bytes; truncated?)",
                    path, (unsigned long long)hlen, (unsigned long long)st->size);
        goto cleanup;
    }
    st->data_off = 8 + hlen;
    uint64_t data_size = st->size - st->data_off;
    json_error_t e;
    h = json_loadb((const char *)st->map + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &e);
    if (!h) {
        rc = bq_err(BQ_EFORMAT, "%s: header is not valid JSON: %s (at byte %d)", path, e.text, e.position);
        goto cleanup;
    }
    if (!json_is_object(h)) {
        rc = bq_err(BQ_EFORMAT, "%s: header is not a JSON object", path);
        goto cleanup;
    }
    size_t cap = json_object_size(h);
    st->t = bq_calloc(cap ? cap : 1, sizeof *st->t);
    const char *key;
    json_t *v;
    json_object_foreach(h, key, v) {
        if (strcmp(key, "__metadata__") == 0) continue;
        rc = parse_entry(st, &st->t[st->n], key, v, data_size);
        st->n++;
        if (rc) goto cleanup;
    }
    /* Overlap check: sorted by begin, each non-empty tensor must start at or after the previous end. */
    order = bq_malloc(sizeof *order * (size_t)(st->n ? st->n : 1));
    for (int i = 0; i < st->n; i++) order[i] = &st->t[i];
    qsort(order, (size_t)st->n, sizeof *order, cmp_begin);
    uint64_t prev_end = 0;
    const char *prev = NULL;
    for (int i = 0; i < st->n; i++) {
        if (order[i]->begin == order[i]->end) continue;
        if (prev && order[i]->begin < prev_end) {
            rc = bq_err(BQ_EFORMAT, "%s: tensors \"%s\" and \"%s\" overlap in the data", path, prev, order[i]->name);
            goto cleanup;
        }
        prev_end = order[i]->end;
        prev = order[i]->name;
    }
    qsort(st->t, (size_t)st->n, sizeof *st->t, cmp_name);
cleanup:
    free(order);
    json_decref(h);
    if (rc) bq_st_close(st);
    else *out = st;
    return rc;
}

const BqStTensor *bq_st_find(const BqSt *st, const char *name) {
    BqStTensor key;
    key.name = (char *)name;
    return bsearch(&key, st->t, (size_t)st->n, sizeof *st->t, cmp_name);
}

static void shape_str(char *b, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(b, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(b + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(b + k, n - k, "]");
}

static int check_shape(const BqSt *st, const BqStTensor *t, const char *name, int ndim, const int64_t *shape) {
    if (!t) return bq_err(BQ_EFORMAT, "%s: no tensor \"%s\"", st->path, name);
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == shape[i];
    if (!ok) {
        char a[128], b[128];
        shape_str(a, sizeof a, ndim, shape);
        shape_str(b, sizeof b, t->ndim, t->shape);
        return bq_err(BQ_EFORMAT, "%s: tensor \"%s\": expected shape %s, found %s", st->path, name, a, b);
    }
    return BQ_OK;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ffu, bits;
    if (exp == 0) {
        if (man == 0) {
            bits = sign;
        } else { /* subnormal: renormalise */
            int e = -1;
            do { e++, man <<= 1; } while (!(man & 0x400u));
            bits = sign | ((uint32_t)(127 - 15 - e) << 23) | ((man & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (man << 13);
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

int bq_st_read_f32(const BqSt *st, const char *name, float *dst, int ndim, const int64_t *shape) {
    const BqStTensor *t = bq_st_find(st, name);
    int rc = check_shape(st, t, name, ndim, shape);
    if (rc) return rc;
    const unsigned char *src = st->map + st->data_off + t->begin;
    switch (t->dtype) {
    case BQ_ST_F32: memcpy(dst, src, (size_t)t->numel * 4); break;
    case BQ_ST_F16:
        for (int64_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            dst[i] = half_to_float(h);
        }
        break;
    case BQ_ST_BF16:
        for (int64_t i = 0; i < t->numel; i++) {
            uint16_t h;
            memcpy(&h, src + 2 * i, 2);
            uint32_t bits = (uint32_t)h << 16;
            memcpy(&dst[i], &bits, 4);
        }
        break;
    case BQ_ST_F64:
        for (int64_t i = 0; i < t->numel; i++) {
            double d;
            memcpy(&d, src + 8 * i, 8);
            dst[i] = (float)d;
        }
        break;
    default:
        return bq_err(BQ_EFORMAT, "%s: tensor \"%s\" has dtype %s, expected a float type (F32, F16, BF16)", st->path,
                      name, bq_st_dtype_name(t->dtype));
    }
    return BQ_OK;
}

int bq_st_read_i64(const BqSt *st, const char *name, int64_t *dst, int ndim, const int64_t *shape) {
    const BqStTensor *t = bq_st_find(st, name);
    int rc = check_shape(st, t, name, ndim, shape);
    if (rc) return rc;
    if (t->dtype != BQ_ST_I64)
        return bq_err(BQ_EFORMAT, "%s: tensor \"%s\" has dtype %s, expected I64", st->path, name,
                      bq_st_dtype_name(t->dtype));
    memcpy(dst, st->map + st->data_off + t->begin, (size_t)t->numel * 8);
    return BQ_OK;
}

/* ---- writer ---- */

typedef struct WItem {
    const char *name;
    int idx;
} WItem;

static int cmp_witem(const void *a, const void *b) { return strcmp(((const WItem *)a)->name, ((const WItem *)b)->name); }

int bq_st_write(const char *path, const char *const names[], const float *const data[], const int ndims[],
                const int64_t *const shapes[], int n, json_t *metadata) {
    char *tmp = NULL, *hdr = NULL;
    FILE *f = NULL;
    json_t *h = json_object();
    WItem *items = bq_malloc(sizeof *items * (size_t)(n ? n : 1));
    int rc = BQ_OK;
    for (int i = 0; i < n; i++) items[i].name = names[i], items[i].idx = i;
    qsort(items, (size_t)n, sizeof *items, cmp_witem);
    for (int i = 1; i < n; i++)
        if (strcmp(items[i].name, items[i - 1].name) == 0) {
            rc = bq_err(BQ_EINVAL, "%s: tensor \"%s\" given twice", path, items[i].name);
            goto cleanup;
        }
    if (metadata) {
        const char *k;
        json_t *v;
        json_object_foreach(metadata, k, v) if (!json_is_string(v)) {
            rc = bq_err(BQ_EINVAL, "%s: __metadata__ value for \"%s\" must be a string", path, k);
            goto cleanup;
        }
        json_object_set(h, "__metadata__", metadata);
    }
    uint64_t off = 0;
    for (int i = 0; i < n; i++) {
        int k = items[i].idx;
        if (ndims[k] < 0 || ndims[k] > BQ_ST_MAX_DIMS) {
            rc = bq_err(BQ_EINVAL, "%s: tensor \"%s\": bad rank %d", path, names[k], ndims[k]);
            goto cleanup;
        }
        json_t *sh = json_array();
        uint64_t numel = 1;
        for (int d = 0; d < ndims[k]; d++) {
            json_array_append_new(sh, json_integer(shapes[k][d]));
            numel *= (uint64_t)shapes[k][d];
        }
        json_t *e = json_object();
        json_object_set_new(e, "dtype", json_string("F32"));
        json_object_set_new(e, "shape", sh);
        json_object_set_new(e, "data_offsets", json_pack("[II]", (json_int_t)off, (json_int_t)(off + 4 * numel)));
        json_object_set_new(h, names[k], e);
        off += 4 * numel;
    }
    hdr = json_dumps(h, JSON_COMPACT | JSON_SORT_KEYS);
    size_t hl = strlen(hdr), padded = (hl + 7) / 8 * 8;
    size_t tl = strlen(path) + 5;
    tmp = bq_malloc(tl);
    snprintf(tmp, tl, "%s.tmp", path);
    f = fopen(tmp, "wb");
    if (!f) {
        rc = bq_err(BQ_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        goto cleanup;
    }
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(((uint64_t)padded >> (8 * i)) & 0xff);
    int ok = fwrite(len8, 1, 8, f) == 8 && fwrite(hdr, 1, hl, f) == hl;
    for (size_t i = hl; ok && i < padded; i++) ok = fputc(' ', f) != EOF;
    for (int i = 0; ok && i < n; i++) {
        int k = items[i].idx;
        size_t numel = 1;
        for (int d = 0; d < ndims[k]; d++) numel *= (size_t)shapes[k][d];
        ok = numel == 0 || fwrite(data[k], sizeof(float), numel, f) == numel;
    }
    if (fclose(f) != 0) ok = 0;
    f = NULL;
    if (!ok) {
        rc = bq_err(BQ_EIO, "%s: write failed: %s", tmp, strerror(errno));
        remove(tmp);
        goto cleanup;
    }
    rc = bq_rename_durable(tmp, path);
    if (rc) remove(tmp);
cleanup:
    if (f) fclose(f), remove(tmp);
    free(tmp);
    free(hdr);
    free(items);
    json_decref(h);
    return rc;
}
