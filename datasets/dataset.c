/* Dataset loading: split selection (ONNX Runtime bert_imdb_finetune_qat recipe: seeded shuffle, take N,
 * carve a validation fraction), label indexing, multi-threaded deterministic encoding with the BERT
 * tokenizer, and the versioned on-disk cache of encoded examples. See dataset.h for the contracts. */
#include "datasets/dataset.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "autograd/bq.h"
#include "datasets/cache.h"
#include "datasets/source.h"

#define CACHE_MAGIC "BQDSET\x01\n"
#define CACHE_VERSION 1u

void bq_data_spec_default(BqDataSpec *s) {
    memset(s, 0, sizeof *s);
    s->split = "train";
    s->max_seq_len = 128;
    s->truncation = BQ_TRUNC_HEAD;
    s->seed = 42;
}

const char *bq_data_default_cache_dir(void) {
    static __thread char buf[4096];
    const char *e = getenv("BERTQAT_CACHE");
    if (e && *e) return e;
    e = getenv("XDG_CACHE_HOME");
    if (e && *e) {
        snprintf(buf, sizeof buf, "%s/bertqat", e);
        return buf;
    }
    e = getenv("HOME");
    if (e && *e) {
        snprintf(buf, sizeof buf, "%s/.cache/bertqat", e);
        return buf;
    }
    return "./.cache/bertqat";
}

void bq_dataset_free(BqDataset *d) {
    if (!d) return;
    free(d->offsets);
    free(d->ids);
    free(d->types);
    free(d->labels);
    free(d->full_len);
    free(d->source_index);
    for (int i = 0; d->label_names && i < d->nlabels; i++) free(d->label_names[i]);
    free(d->label_names);
    free(d->cache_path);
    free(d);
}

/* ---------------------------------------------------------------- labels */

static int is_uint_label(const char *s, long long *v) {
    if (!*s) return 0;
    long long x = 0;
    for (const char *p = s; *p; p++) {
        if (*p < '0' || *p > '9' || x > 100000000LL) return 0;
        x = x * 10 + (*p - '0');
    }
    *v = x;
    return 1;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Label names from a raw set: IMDB fixed, integers as is, else sorted unique strings. */
static int label_names_from(const BqRawSet *r, char ***names, int *nlabels) {
    *names = NULL;
    *nlabels = 0;
    if (r->fixed_imdb) {
        *names = bq_malloc(2 * sizeof(char *));
        (*names)[0] = bq_strdup("neg");
        (*names)[1] = bq_strdup("pos");
        *nlabels = 2;
        return BQ_OK;
    }
    int64_t with = 0;
    for (int64_t i = 0; i < r->n; i++) with += r->ex[i].label != NULL;
    if (with == 0) return BQ_OK;
    if (with != r->n) {
        for (int64_t i = 0; i < r->n; i++)
            if (!r->ex[i].label)
                return bq_err(BQ_EFORMAT, "%s:%lld: missing label", r->file, (long long)r->ex[i].line);
    }
    int all_int = 1;
    long long mx = -1, v;
    int64_t at = 0;
    for (int64_t i = 0; i < r->n && all_int; i++) {
        if (!is_uint_label(r->ex[i].label, &v)) all_int = 0;
        else if (v > mx) mx = v, at = i;
    }
    /* Integer labels are class indices 0..max, so one stray large value would make a head of that many
     * classes (and, near 10^5, seconds of label bookkeeping): refused above 1000 classes. */
    if (all_int && mx >= 1000)
        return bq_err(BQ_EFORMAT, "%s:%lld: label %lld: integer labels are class indices 0..N-1 and N may be at most "
                      "1000 (is the label column right?)", r->file, (long long)r->ex[at].line, mx);
    if (all_int) {
        *nlabels = (int)mx + 1;
        *names = bq_malloc((size_t)*nlabels * sizeof(char *));
        for (int k = 0; k < *nlabels; k++) {
            char t[24];
            snprintf(t, sizeof t, "%d", k);
            (*names)[k] = bq_strdup(t);
        }
        return BQ_OK;
    }
    char **all = bq_malloc((size_t)r->n * sizeof(char *));
    for (int64_t i = 0; i < r->n; i++) all[i] = r->ex[i].label;
    qsort(all, (size_t)r->n, sizeof *all, cmp_str);
    int64_t u = 0;
    for (int64_t i = 0; i < r->n; i++)
        if (i == 0 || strcmp(all[i], all[i - 1])) all[u++] = all[i];
    if (u > 100000) {
        free(all);
        return bq_err(BQ_EFORMAT, "%s: %lld distinct labels; is the label column right?", r->file, (long long)u);
    }
    *names = bq_malloc((size_t)u * sizeof(char *));
    for (int64_t i = 0; i < u; i++) (*names)[i] = bq_strdup(all[i]);
    *nlabels = (int)u;
    free(all);
    return BQ_OK;
}

static int label_index(const BqRawSet *r, int64_t i, char **names, int nlabels, int32_t *out) {
    const char *l = r->ex[i].label;
    if (nlabels == 0) {
        if (l) return bq_err(BQ_EFORMAT, "%s:%lld: labelled example in an unlabeled dataset", r->file, (long long)r->ex[i].line);
        *out = -1;
        return BQ_OK;
    }
    if (!l) return bq_err(BQ_EFORMAT, "%s:%lld: missing label", r->file, (long long)r->ex[i].line);
    char **hit = bsearch(&l, names, (size_t)nlabels, sizeof *names, cmp_str);
    if (!hit) /* integer names "0".."10" are not in strcmp order */
        for (int k = 0; k < nlabels; k++)
            if (!strcmp(names[k], l)) hit = &names[k];
    if (!hit) {
        char known[256] = "";
        for (int k = 0; k < nlabels && strlen(known) < 200; k++) {
            strcat(known, k ? ", " : "");
            strncat(known, names[k], 40);
        }
        return bq_err(BQ_EFORMAT, "%s:%lld: unknown label '%.60s' (known: %s)", r->file, (long long)r->ex[i].line, l, known);
    }
    *out = (int32_t)(hit - names);
    return BQ_OK;
}

/* ---------------------------------------------------------------- encoding */

/* The encoded selection in ascending source order (what the cache stores). */
typedef struct Encoded {
    int64_t n, source_count, skipped_empty;
    int64_t *source_index, *offsets;
    int32_t *labels, *full_len, *ids;
    uint8_t *types;
    int nlabels;
    char **label_names;
    int32_t pad_id;
} Encoded;

static void encoded_free(Encoded *e) {
    free(e->source_index);
    free(e->offsets);
    free(e->labels);
    free(e->full_len);
    free(e->ids);
    free(e->types);
    for (int i = 0; i < e->nlabels; i++) free(e->label_names[i]);
    free(e->label_names);
    memset(e, 0, sizeof *e);
}

typedef struct EncOne {
    int32_t *ids;
    uint8_t *types;
    int64_t len, full;
} EncOne;

static void encode_one(const BqTokenizer *tok, const BqRawExample *x, int64_t max_len, BqTruncation trunc, EncOne *o) {
    int32_t *wa = NULL, *wb = NULL;
    int64_t na = 0, ca = 0, nb = 0, cb = 0;
    bq_tokenizer_tokenize(tok, x->text, x->len, &wa, &na, &ca);
    if (x->pair) bq_tokenizer_tokenize(tok, x->pair, x->pair_len, &wb, &nb, &cb);
    int64_t full = na + 2 + (x->pair ? nb + 1 : 0);
    int32_t cls = bq_tokenizer_cls_id(tok), sep = bq_tokenizer_sep_id(tok);
    o->full = full;
    if (max_len <= 0 || full <= max_len || (!x->pair && trunc != BQ_TRUNC_HEAD_TAIL)) {
        /* no truncation, or single-sequence head/tail: [CLS] slice [SEP] */
        int64_t keep = na, from = 0;
        if (max_len > 0 && full > max_len) {
            keep = max_len - 2;
            from = trunc == BQ_TRUNC_TAIL ? na - keep : 0;
        }
        int64_t len = keep + 2 + (x->pair ? nb + 1 : 0);
        o->ids = bq_malloc((size_t)len * sizeof(int32_t));
        o->types = bq_calloc((size_t)len, 1);
        o->ids[0] = cls;
        /* a text whose characters all normalise away has no pieces (wa or wb NULL): nothing to copy */
        if (keep) memcpy(o->ids + 1, wa + from, (size_t)keep * sizeof(int32_t));
        o->ids[keep + 1] = sep;
        if (x->pair) {
            if (nb) memcpy(o->ids + keep + 2, wb, (size_t)nb * sizeof(int32_t));
            o->ids[len - 1] = sep;
            memset(o->types + keep + 2, 1, (size_t)nb + 1);
        }
        o->len = len;
    } else {
        int32_t *tt = bq_malloc((size_t)max_len * sizeof(int32_t));
        o->ids = bq_malloc((size_t)max_len * sizeof(int32_t));
        o->types = bq_malloc((size_t)max_len);
        o->len = bq_tokenizer_encode(tok, x->text, x->len, x->pair, x->pair_len, max_len, trunc, o->ids, tt, max_len);
        BQ_CHECK(o->len > 0 && o->len <= max_len);
        for (int64_t t = 0; t < o->len; t++) o->types[t] = (uint8_t)tt[t];
        free(tt);
    }
    free(wa);
    free(wb);
}

/* Texts encoded a chunk at a time (bq_source_texts): an aclImdb split's texts are read again per chunk,
 * so a load holds ENCODE_CHUNK texts (about 1.3 MiB of reviews) besides the encoded examples. */
#define ENCODE_CHUNK 1024

typedef struct EncodeRun {
    EncOne *one;
    const BqTokenizer *tok;
    int64_t max_len;
    BqTruncation trunc;
    int nt;
} EncodeRun;

static int encode_chunk(void *user, const int64_t *at, const BqRawExample *ex, int64_t cnt) {
    const EncodeRun *er = user;
#pragma omp parallel for num_threads(er->nt) schedule(dynamic, 8)
    for (int64_t k = 0; k < cnt; k++) encode_one(er->tok, &ex[k], er->max_len, er->trunc, &er->one[at[k]]);
    return BQ_OK;
}

/* Encodes the selected examples e->source_index[0..e->n) of r. Errors: reading their texts. */
static int encode_selection(Encoded *e, const BqRawSet *r, const int32_t *sel_labels, const BqTokenizer *tok,
                            int64_t max_len, BqTruncation trunc, int threads) {
    int64_t n = e->n;
    EncodeRun er = {bq_calloc((size_t)(n ? n : 1), sizeof *er.one), tok, max_len, trunc, threads > 0 ? threads : bq_runtime_threads()};
    if (er.nt < 1) er.nt = 1;
    int st = bq_source_texts(r, e->source_index, n, ENCODE_CHUNK, encode_chunk, &er);
    EncOne *one = er.one;
    if (st) goto cleanup;
    e->offsets = bq_malloc((size_t)(n + 1) * sizeof(int64_t));
    e->offsets[0] = 0;
    for (int64_t i = 0; i < n; i++) e->offsets[i + 1] = e->offsets[i] + one[i].len;
    int64_t tot = e->offsets[n];
    e->ids = bq_malloc((size_t)(tot ? tot : 1) * sizeof(int32_t));
    e->types = bq_malloc((size_t)(tot ? tot : 1));
    e->labels = bq_malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    e->full_len = bq_malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) {
        memcpy(e->ids + e->offsets[i], one[i].ids, (size_t)one[i].len * sizeof(int32_t));
        memcpy(e->types + e->offsets[i], one[i].types, (size_t)one[i].len);
        e->labels[i] = sel_labels[i];
        e->full_len[i] = (int32_t)(one[i].full > INT32_MAX ? INT32_MAX : one[i].full);
    }
cleanup:
    for (int64_t i = 0; i < n; i++) {
        free(one[i].ids);
        free(one[i].types);
    }
    free(one);
    return st;
}

/* ---------------------------------------------------------------- cache file */

static int cache_write(const char *path, uint64_t key, const Encoded *e) {
    BqCacheWriter w;
    int st = bq_cache_writer_open(&w, path, CACHE_MAGIC, CACHE_VERSION, key);
    if (st) return st;
    int64_t tot = e->offsets[e->n];
    int64_t head[4] = {e->source_count, e->skipped_empty, e->n, tot};
    int32_t h2[2] = {e->nlabels, e->pad_id};
    bq_cache_append(&w, head, sizeof head);
    bq_cache_append(&w, h2, sizeof h2);
    for (int i = 0; i < e->nlabels; i++) {
        uint32_t l = (uint32_t)strlen(e->label_names[i]);
        bq_cache_append(&w, &l, 4);
        bq_cache_append(&w, e->label_names[i], l);
    }
    bq_cache_append(&w, e->source_index, (size_t)e->n * 8);
    bq_cache_append(&w, e->labels, (size_t)e->n * 4);
    bq_cache_append(&w, e->full_len, (size_t)e->n * 4);
    bq_cache_append(&w, e->offsets, (size_t)(e->n + 1) * 8);
    bq_cache_append(&w, e->ids, (size_t)tot * 4);
    bq_cache_append(&w, e->types, (size_t)tot);
    return bq_cache_writer_commit(&w);
}

/* Reads and validates a cache file; returns 1 on success, 0 when absent, -1 when present but
 * stale/corrupt (never partially trusted). */
static int cache_read(const char *path, uint64_t key, int32_t vocab, Encoded *e) {
    memset(e, 0, sizeof *e);
    BqCacheReader r;
    int ok = bq_cache_reader_open(&r, path, CACHE_MAGIC, CACHE_VERSION, key);
    if (ok != 1) return ok;
    ok = -1;
    int64_t head[4];
    int32_t h2[2];
    if (!bq_cache_take(&r, head, sizeof head) || !bq_cache_take(&r, h2, sizeof h2)) goto cleanup;
    e->source_count = head[0];
    e->skipped_empty = head[1];
    int64_t n = head[2], tot = head[3];
    if (n < 0 || tot < 0 || n > head[0] || h2[0] < 0 || h2[0] > 100000 || (uint64_t)tot > bq_cache_left(&r))
        goto cleanup;
    e->pad_id = h2[1];
    e->label_names = bq_calloc((size_t)h2[0] + 1, sizeof(char *));
    for (int i = 0; i < h2[0]; i++) {
        uint32_t l;
        if (!bq_cache_take(&r, &l, 4) || bq_cache_left(&r) < l) goto cleanup;
        e->label_names[i] = bq_malloc(l + 1);
        bq_cache_take(&r, e->label_names[i], l);
        e->label_names[i][l] = 0;
        e->nlabels = i + 1;
    }
    if (bq_cache_left(&r) != (uint64_t)n * 24 + 8 + (uint64_t)tot * 5) goto cleanup;
    e->n = n;
    e->source_index = bq_malloc((size_t)(n ? n : 1) * 8);
    e->labels = bq_malloc((size_t)(n ? n : 1) * 4);
    e->full_len = bq_malloc((size_t)(n ? n : 1) * 4);
    e->offsets = bq_malloc((size_t)(n + 1) * 8);
    e->ids = bq_malloc((size_t)(tot ? tot : 1) * 4);
    e->types = bq_malloc((size_t)(tot ? tot : 1));
    /* the exact remaining size was checked above, so every take succeeds */
    bq_cache_take(&r, e->source_index, (size_t)n * 8);
    bq_cache_take(&r, e->labels, (size_t)n * 4);
    bq_cache_take(&r, e->full_len, (size_t)n * 4);
    bq_cache_take(&r, e->offsets, (size_t)(n + 1) * 8);
    bq_cache_take(&r, e->ids, (size_t)tot * 4);
    bq_cache_take(&r, e->types, (size_t)tot);
    if (e->offsets[0] != 0 || e->offsets[n] != tot) goto cleanup;
    for (int64_t i = 0; i < n; i++) {
        if (e->offsets[i + 1] <= e->offsets[i] || e->source_index[i] < 0 || e->source_index[i] >= e->source_count ||
            (i && e->source_index[i] <= e->source_index[i - 1]) || e->labels[i] < -1 || e->labels[i] >= e->nlabels)
            goto cleanup;
    }
    for (int64_t t = 0; t < tot; t++)
        if (e->ids[t] < 0 || e->ids[t] >= vocab || e->types[t] > 1) goto cleanup;
    ok = 1;
cleanup:
    bq_cache_reader_close(&r);
    if (ok != 1) encoded_free(e);
    return ok;
}

/* ---------------------------------------------------------------- load */

static int32_t *permutation(int64_t n, uint64_t seed) {
    int32_t *p = bq_malloc((size_t)(n ? n : 1) * sizeof(int32_t));
    for (int64_t i = 0; i < n; i++) p[i] = (int32_t)i;
    BqRng r;
    bq_rng_seed(&r, seed);
    bq_rng_shuffle_i32(&r, p, n);
    return p;
}

static int cmp_i32(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

static uint64_t hash_str(uint64_t h, const char *s) {
    if (!s) s = "\x01(null)";
    return bq_fnv1a(h, s, strlen(s) + 1);
}

/* Reads the source split, indexes labels, selects and encodes into e (ascending source order). */
static int build_encoded(Encoded *e, const BqDataSpec *s, BqDataKind kind, const char *read_split, int64_t nsamples,
                         const BqTokenizer *tok, double *read_seconds) {
    double t0 = bq_now();
    BqRawSet r = {0}, names_src = {0};
    BqSourceOptions o = {s->text_column, s->text_pair_column, s->label_column};
    int32_t *perm = NULL, *sel_labels = NULL;
    memset(e, 0, sizeof *e);
    int st = bq_source_read(&r, s->path, kind, read_split, &o);
    if (st) return st;
    *read_seconds = bq_now() - t0;
    /* label names: from this split, or from the train file of a split folder */
    const BqRawSet *ns = &r;
    if (kind == BQ_DATA_SPLIT_DIR && strcmp(read_split, "train") != 0) {
        char *tf = bq_source_split_file(s->path, "train", NULL);
        if (tf) {
            free(tf);
            if ((st = bq_source_read(&names_src, s->path, kind, "train", &o))) goto cleanup;
            ns = &names_src;
        }
    }
    if ((st = label_names_from(ns, &e->label_names, &e->nlabels))) goto cleanup;
    e->source_count = r.n;
    e->skipped_empty = r.skipped_empty;
    e->pad_id = bq_tokenizer_pad_id(tok);
    perm = permutation(r.n, s->seed);
    e->n = (nsamples > 0 && nsamples < r.n) ? nsamples : r.n;
    qsort(perm, (size_t)e->n, sizeof *perm, cmp_i32);
    e->source_index = bq_malloc((size_t)e->n * sizeof(int64_t));
    sel_labels = bq_malloc((size_t)e->n * sizeof(int32_t));
    for (int64_t i = 0; i < e->n; i++) {
        e->source_index[i] = perm[i];
        if ((st = label_index(&r, perm[i], e->label_names, e->nlabels, &sel_labels[i]))) goto cleanup;
    }
    st = encode_selection(e, &r, sel_labels, tok, s->max_seq_len, s->truncation, s->threads);
cleanup:
    if (st) encoded_free(e);
    free(perm);
    free(sel_labels);
    bq_raw_free(&r);
    bq_raw_free(&names_src);
    return st;
}

/* The checks of a data spec before anything is read: split train, val or test; val_fraction in
 * [0, 1); max_seq_len 0 or >= 3; sample counts >= 0; val only with val_fraction > 0. Errors:
 * BQ_EINVAL naming the flag. */
static int spec_check(const BqDataSpec *s) {
    if (!s->split || (strcmp(s->split, "train") && strcmp(s->split, "val") && strcmp(s->split, "test")))
        return bq_err(BQ_EINVAL, "--split: expected train, val or test, got '%s'", s->split ? s->split : "");
    if (!(s->val_fraction >= 0.0 && s->val_fraction < 1.0))
        return bq_err(BQ_EINVAL, "--val-fraction: must be in [0, 1), got %g", s->val_fraction);
    if (s->max_seq_len > 0 && s->max_seq_len < 3)
        return bq_err(BQ_EINVAL, "--max-seq-len: must be >= 3 (or 0 for no truncation), got %lld", (long long)s->max_seq_len);
    if (s->train_samples < 0 || s->eval_samples < 0) return bq_err(BQ_EINVAL, "--train-samples/--eval-samples: negative");
    if (!strcmp(s->split, "val") && s->val_fraction <= 0.0)
        return bq_err(BQ_EINVAL, "%s: split val needs --val-fraction > 0", s->path ? s->path : "--data");
    return BQ_OK;
}

/* The cache key of an encoded selection: the cache format version, the source identity, the split's
 * role and the source split read, the columns, the vocabulary hash, max_seq_len, truncation and the
 * sample selection (datasets/dataset.h, "Cache"). */
static uint64_t cache_key(const BqDataSpec *s, uint64_t ident, const char *role, const char *read_split,
                          int64_t nsamples, const BqTokenizer *tok) {
    uint64_t key = BQ_FNV_OFFSET, vh = bq_tokenizer_hash(tok), v = CACHE_VERSION;
    int64_t kv[4] = {s->max_seq_len > 0 ? s->max_seq_len : 0, s->truncation, nsamples, nsamples > 0 ? (int64_t)s->seed : 0};
    key = bq_fnv1a(key, &v, sizeof v);
    key = bq_fnv1a(key, &ident, sizeof ident);
    key = hash_str(key, role);
    key = hash_str(key, read_split);
    key = hash_str(key, s->text_column);
    key = hash_str(key, s->text_pair_column);
    key = hash_str(key, s->label_column);
    key = bq_fnv1a(key, &vh, sizeof vh);
    key = bq_fnv1a(key, kv, sizeof kv);
    return key;
}

/* Fills d (n, offsets, ids, types, labels, full_len, source_index, max_len, labels' names taken from e,
 * pad id, counts) with the examples of split s->split from the encoded selection e: the seeded
 * permutation restricted to the selection, then the train/val carve (the last ceil(val_fraction·n)
 * are val). Errors: an empty split (BQ_EINVAL naming the data). */
static int select_examples(BqDataset *d, Encoded *e, const BqDataSpec *s, int is_test) {
    int st = BQ_OK;
    int32_t *perm = permutation(e->source_count, s->seed);
    int64_t *pos_of = bq_malloc((size_t)(e->source_count ? e->source_count : 1) * sizeof(int64_t));
    for (int64_t i = 0; i < e->source_count; i++) pos_of[i] = -1;
    for (int64_t i = 0; i < e->n; i++) pos_of[e->source_index[i]] = i;
    int64_t lo = 0, hi = e->n;
    if (!is_test) {
        int64_t nval = (int64_t)ceil(s->val_fraction * (double)e->n - 1e-9);
        if (nval > e->n) nval = e->n;
        if (!strcmp(s->split, "val")) lo = e->n - nval;
        else hi = e->n - nval;
    }
    int64_t n = hi - lo;
    if (n <= 0) {
        st = bq_err(BQ_EINVAL, "%s: split %s is empty (%lld source examples, val fraction %g)", s->path, s->split,
                    (long long)e->source_count, s->val_fraction);
        goto cleanup;
    }
    d->n = n;
    d->offsets = bq_malloc((size_t)(n + 1) * sizeof(int64_t));
    d->labels = bq_malloc((size_t)n * sizeof(int32_t));
    d->full_len = bq_malloc((size_t)n * sizeof(int32_t));
    d->source_index = bq_malloc((size_t)n * sizeof(int64_t));
    int64_t k = 0, tot = 0, *src = bq_malloc((size_t)n * sizeof(int64_t));
    /* walk the permutation; the j-th selected example (in permuted order) is the j-th hit */
    for (int64_t i = 0, j = 0; i < e->source_count && j < hi; i++) {
        int64_t p = pos_of[perm[i]];
        if (p < 0) continue;
        if (j >= lo) {
            src[k] = p;
            d->offsets[k] = tot;
            tot += e->offsets[p + 1] - e->offsets[p];
            k++;
        }
        j++;
    }
    BQ_CHECK(k == n);
    d->offsets[n] = tot;
    d->ids = bq_malloc((size_t)(tot ? tot : 1) * sizeof(int32_t));
    d->types = bq_malloc((size_t)(tot ? tot : 1));
    for (int64_t i = 0; i < n; i++) {
        int64_t p = src[i], len = e->offsets[p + 1] - e->offsets[p];
        memcpy(d->ids + d->offsets[i], e->ids + e->offsets[p], (size_t)len * sizeof(int32_t));
        memcpy(d->types + d->offsets[i], e->types + e->offsets[p], (size_t)len);
        d->labels[i] = e->labels[p];
        d->full_len[i] = e->full_len[p];
        d->source_index[i] = e->source_index[p];
        if (len > d->max_len) d->max_len = len;
    }
    free(src);
    d->nlabels = e->nlabels;
    d->label_names = e->label_names;
    e->label_names = NULL;
    e->nlabels = 0;
    d->pad_id = e->pad_id;
    d->source_count = e->source_count;
    d->skipped_empty = e->skipped_empty;
cleanup:
    free(perm);
    free(pos_of);
    return st;
}

int bq_dataset_load(BqDataset **out, const BqDataSpec *s, const BqTokenizer *tok) {
    *out = NULL;
    int st = BQ_OK;
    Encoded e = {0};
    BqDataset *d = NULL;
    if ((st = spec_check(s))) return st;
    BqDataKind kind;
    int has_test;
    if ((st = bq_data_probe(s->path, &kind, &has_test))) return st;
    int is_test = !strcmp(s->split, "test");
    const char *role = is_test ? "test" : "train";
    const char *read_split = (is_test && has_test) ? "test" : "train";
    int64_t nsamples = is_test ? s->eval_samples : s->train_samples;

    d = bq_calloc(1, sizeof *d);
    d->kind = kind;
    double t0 = bq_now();
    uint64_t ident;
    if ((st = bq_source_identity(s->path, kind, read_split, &ident))) goto cleanup;
    uint64_t key = cache_key(s, ident, role, read_split, nsamples, tok);
    const char *cdir = s->cache_dir ? s->cache_dir : bq_data_default_cache_dir();
    int hit = 0;
    if (*cdir) {
        size_t n = strlen(cdir) + 40;
        d->cache_path = bq_malloc(n);
        snprintf(d->cache_path, n, "%s/%016llx.bqds", cdir, (unsigned long long)key);
        int r = cache_read(d->cache_path, key, bq_tokenizer_vocab_size(tok), &e);
        if (r == 1) hit = 1;
        if (r < 0) d->cache_rejected = 1;
    }
    if (!hit) {
        if ((st = build_encoded(&e, s, kind, read_split, nsamples, tok, &d->read_seconds))) goto cleanup;
        d->encode_seconds = bq_now() - t0;
        if (d->cache_path) {
            if (bq_mkdir_p(cdir) != BQ_OK || cache_write(d->cache_path, key, &e) != BQ_OK) d->cache_write_failed = 1;
            bq_err_clear();
        }
    }
    d->from_cache = hit;

    st = select_examples(d, &e, s, is_test);
cleanup:
    encoded_free(&e);
    if (st) {
        bq_dataset_free(d);
        d = NULL;
    }
    *out = d;
    return st;
}
