/* Source readers for datasets/: aclImdb folder and archive (libarchive, read in place), CSV (RFC 4180),
 * TSV and JSONL (jansson). They list a split's examples (labels, lengths, where each text lies) in a
 * deterministic order, and read the texts asked for again, a chunk at a time (bq_source_texts), so no
 * split's texts are ever held at once; encoding, label indexing, selection and caching live in dataset.c.
 * References: Maas et al. 2011 aclImdb README (layout <id>_<rating>.txt), RFC 4180 (CSV). */
#include "datasets/source.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "autograd/bq.h"

uint64_t bq_fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

void bq_raw_free(BqRawSet *r) {
    if (!r) return;
    for (int64_t i = 0; i < r->n; i++) {
        free(r->ex[i].text);
        free(r->ex[i].pair);
        free(r->ex[i].label);
        if (r->paths) free(r->paths[i]);
    }
    free(r->ex);
    free(r->file);
    free(r->split);
    free(r->ids);
    free(r->paths);
    free(r->offs);
    free(r->spans);
    free(r->keys[0]);
    free(r->keys[1]);
    memset(r, 0, sizeof *r);
}

static int is_blank(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!(s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f' || s[i] == '\v')) return 0;
    return 1;
}

static char *dup_n(const char *s, size_t n) {
    char *d = bq_malloc(n + 1);
    if (n) memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* Lists a CSV/TSV/JSONL record as an example of a lazy set: its text's and pair's lengths, its label (owned)
 * and line, and where the record lies (span bytes at off), which bq_source_texts reads again (file_texts);
 * a blank text is counted and skipped. */
static void raw_push(BqRawSet *r, const char *text, size_t len, size_t plen, char *label, int64_t line, size_t off,
                     size_t span) {
    if (is_blank(text, len)) {
        r->skipped_empty++;
        free(label);
        return;
    }
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 1024;
        r->ex = bq_realloc(r->ex, (size_t)r->cap * sizeof *r->ex);
        r->offs = bq_realloc(r->offs, (size_t)r->cap * sizeof *r->offs);
        r->spans = bq_realloc(r->spans, (size_t)r->cap * sizeof *r->spans);
    }
    r->offs[r->n] = (int64_t)off;
    r->spans[r->n] = (int64_t)span;
    r->ex[r->n++] = (BqRawExample){NULL, len, NULL, plen, label, line};
}

static int ends_with(const char *s, const char *suf) {
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && strcasecmp(s + a - b, suf) == 0;
}

static char *path_join(const char *a, const char *b) {
    size_t n = strlen(a) + strlen(b) + 2;
    char *p = bq_malloc(n);
    snprintf(p, n, "%s/%s", a, b);
    return p;
}

static BqDataKind kind_of_file(const char *p) {
    if (ends_with(p, ".tar.gz") || ends_with(p, ".tgz") || ends_with(p, ".tar")) return BQ_DATA_IMDB_ARCHIVE;
    if (ends_with(p, ".csv")) return BQ_DATA_CSV;
    if (ends_with(p, ".tsv")) return BQ_DATA_TSV;
    if (ends_with(p, ".jsonl") || ends_with(p, ".json")) return BQ_DATA_JSONL;
    return 0;
}

char *bq_source_split_file(const char *dir, const char *split, BqDataKind *file_kind) {
    static const char *exts[] = {"csv", "tsv", "jsonl"};
    static const BqDataKind kinds[] = {BQ_DATA_CSV, BQ_DATA_TSV, BQ_DATA_JSONL};
    for (int i = 0; i < 3; i++) {
        char name[64];
        snprintf(name, sizeof name, "%s.%s", split, exts[i]);
        char *p = path_join(dir, name);
        if (bq_is_file(p)) {
            if (file_kind) *file_kind = kinds[i];
            return p;
        }
        free(p);
    }
    return NULL;
}

/* aclImdb root of a folder: PATH itself when it has train/ or test/, else PATH/aclImdb. */
static char *imdb_root(const char *path) {
    char *t = path_join(path, "train"), *s = path_join(path, "test");
    int here = bq_is_dir(t) || bq_is_dir(s);
    free(t);
    free(s);
    if (here) return bq_strdup(path);
    char *a = path_join(path, "aclImdb");
    if (bq_is_dir(a)) return a;
    free(a);
    return NULL;
}

const char *bq_data_kind_name(BqDataKind kind) {
    switch (kind) {
    case BQ_DATA_IMDB_DIR: return "aclImdb folder";
    case BQ_DATA_IMDB_ARCHIVE: return "aclImdb archive";
    case BQ_DATA_CSV: return "CSV";
    case BQ_DATA_TSV: return "TSV";
    case BQ_DATA_JSONL: return "JSONL";
    case BQ_DATA_SPLIT_DIR: return "split folder";
    }
    return "?";
}

int bq_data_probe(const char *path, BqDataKind *kind, int *has_test) {
    if (!path || !*path) return bq_err(BQ_EINVAL, "--data: empty path");
    struct stat st;
    if (stat(path, &st) != 0) return bq_err(BQ_EIO, "%s: %s", path, strerror(errno));
    int ht = 0;
    BqDataKind k = 0;
    if (S_ISDIR(st.st_mode)) {
        char *root = imdb_root(path);
        if (root) {
            k = BQ_DATA_IMDB_DIR;
            char *t = path_join(root, "test");
            ht = bq_is_dir(t);
            free(t);
            free(root);
        } else {
            char *tr = bq_source_split_file(path, "train", NULL), *te = bq_source_split_file(path, "test", NULL);
            if (!tr && !te) {
                free(tr);
                free(te);
                return bq_err(BQ_EFORMAT,
                              "%s: folder has neither the aclImdb layout (train/pos, train/neg) nor train.csv/.tsv/.jsonl",
                              path);
            }
            k = BQ_DATA_SPLIT_DIR;
            ht = te != NULL;
            free(tr);
            free(te);
        }
    } else if (S_ISREG(st.st_mode)) {
        k = kind_of_file(path);
        if (!k) return bq_err(BQ_EFORMAT, "%s: unknown data file type (expected .tar.gz, .csv, .tsv or .jsonl)", path);
        if (st.st_size == 0) return bq_err(BQ_EFORMAT, "%s: empty file", path);
        ht = (k == BQ_DATA_IMDB_ARCHIVE);
    } else {
        return bq_err(BQ_EIO, "%s: not a file or folder", path);
    }
    if (kind) *kind = k;
    if (has_test) *has_test = ht;
    return BQ_OK;
}

/* ---------------------------------------------------------------- aclImdb */

/* An aclImdb split is read twice: bq_source_read lists its reviews (label, id, length; each text is read
 * once to skip the blank ones, and dropped), and bq_source_texts reads again only the texts asked for, a
 * chunk at a time. The 25,000 texts of a split (31 MiB) are thus never held together: a loader holds the
 * texts of one chunk besides what it keeps of them. */

typedef struct ImdbItem {
    int label;  /* 0 neg, 1 pos */
    long long id;
    size_t len; /* text bytes */
    char *path; /* folder: the review's file (owned); archive: NULL */
} ImdbItem;

typedef struct ImdbList {
    ImdbItem *v;
    int64_t n, cap;
} ImdbList;

static void imdb_push(ImdbList *l, int label, long long id, size_t len, char *path) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 1024;
        l->v = bq_realloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    l->v[l->n++] = (ImdbItem){label, id, len, path};
}

static int imdb_cmp(const void *a, const void *b) {
    const ImdbItem *x = a, *y = b;
    if (x->label != y->label) return x->label - y->label;
    return (x->id > y->id) - (x->id < y->id);
}

static void imdb_list_free(ImdbList *l) {
    for (int64_t i = 0; i < l->n; i++) free(l->v[i].path);
    free(l->v);
    memset(l, 0, sizeof *l);
}

/* "<id>_<rating>.txt" → id; -1 if the name does not match. */
static long long imdb_file_id(const char *name) {
    const char *p = name;
    long long id = 0;
    int digits = 0;
    while (*p >= '0' && *p <= '9') {
        if (id > LLONG_MAX / 10 - 10) return -1;
        id = id * 10 + (*p++ - '0');
        digits++;
    }
    if (!digits || *p++ != '_') return -1;
    digits = 0;
    while (*p >= '0' && *p <= '9') p++, digits++;
    if (!digits || strcmp(p, ".txt") != 0) return -1;
    return id;
}

/* Matches ".../<split>/<pos|neg>/<id>_<r>.txt" in an archive path; returns label or -1. */
static int imdb_match_path(const char *path, const char *split, long long *id) {
    const char *c[3] = {0};
    size_t cl[3] = {0};
    /* last three components */
    const char *end = path + strlen(path);
    for (int k = 2; k >= 0; k--) {
        const char *s = end;
        while (s > path && s[-1] != '/') s--;
        c[k] = s;
        cl[k] = (size_t)(end - s);
        if (s == path) {
            if (k) return -1;
            break;
        }
        end = s - 1;
    }
    if (cl[0] != strlen(split) || strncmp(c[0], split, cl[0]) != 0) return -1;
    int label;
    if (cl[1] == 3 && !strncmp(c[1], "pos", 3)) label = 1;
    else if (cl[1] == 3 && !strncmp(c[1], "neg", 3)) label = 0;
    else return -1;
    char name[256];
    if (cl[2] >= sizeof name) return -1;
    memcpy(name, c[2], cl[2]);
    name[cl[2]] = 0;
    *id = imdb_file_id(name);
    return *id < 0 ? -1 : label;
}

static int read_whole(const char *path, char **buf, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return bq_err(BQ_EIO, "%s: %s", path, strerror(errno));
    int st = BQ_OK;
    size_t cap = 1 << 16, n = 0;
    char *b = bq_malloc(cap);
    for (;;) {
        if (n + 1 >= cap) b = bq_realloc(b, cap *= 2);
        size_t r = fread(b + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) {
        st = bq_err(BQ_EIO, "%s: read error", path);
        free(b);
        b = NULL;
    } else {
        b[n] = 0;
    }
    fclose(f);
    *buf = b;
    *len = n;
    return st;
}

/* The listed reviews in (label, id) order as out's examples, without texts. Errors: a split without
 * pos or neg reviews, a (label, id) listed twice (BQ_EFORMAT naming where). Frees l either way. */
static int imdb_finish(BqRawSet *out, ImdbList *l, const char *where, const char *split) {
    int have[2] = {0, 0}, st = BQ_OK;
    for (int64_t i = 0; i < l->n; i++) have[l->v[i].label] = 1;
    if (!have[0] || !have[1]) {
        st = bq_err(BQ_EFORMAT, "%s: no %s/%s/<id>_<rating>.txt reviews found", where, split, have[0] ? "pos" : "neg");
        goto cleanup;
    }
    qsort(l->v, (size_t)l->n, sizeof *l->v, imdb_cmp);
    for (int64_t i = 1; i < l->n; i++)
        if (!imdb_cmp(&l->v[i - 1], &l->v[i])) {
            st = bq_err(BQ_EFORMAT, "%s: review %s/%s/%lld_*.txt appears twice", where, split,
                        l->v[i].label ? "pos" : "neg", l->v[i].id);
            goto cleanup;
        }
    out->ex = bq_calloc((size_t)l->n, sizeof *out->ex);
    out->ids = bq_malloc((size_t)l->n * sizeof *out->ids);
    out->paths = l->v[0].path ? bq_calloc((size_t)l->n, sizeof *out->paths) : NULL;
    for (int64_t i = 0; i < l->n; i++) {
        out->ex[i] = (BqRawExample){.len = l->v[i].len, .label = bq_strdup(l->v[i].label ? "pos" : "neg")};
        out->ids[i] = l->v[i].id;
        if (out->paths) out->paths[i] = l->v[i].path, l->v[i].path = NULL;
    }
    out->n = out->cap = l->n;
    out->split = bq_strdup(split);
    out->fixed_imdb = 1;
    out->lazy = 1;
cleanup:
    imdb_list_free(l);
    return st;
}

/* The files root/split/{neg,pos}/<id>_<rating>.txt with their labels and ids (nothing read). */
static int imdb_dir_list(const char *root, const char *split, char ***names, int **labels, long long **ids, int64_t *n) {
    char *sd = path_join(root, split);
    int st = BQ_OK;
    int64_t cap = 0;
    *names = NULL;
    *labels = NULL;
    *ids = NULL;
    *n = 0;
    for (int lab = 0; lab < 2; lab++) {
        char *d = path_join(sd, lab ? "pos" : "neg");
        DIR *dir = opendir(d);
        if (!dir) {
            st = bq_err(BQ_EFORMAT, "%s: folder without %s/ (aclImdb layout needs %s/pos and %s/neg)", sd,
                        lab ? "pos" : "neg", split, split);
            free(d);
            goto cleanup;
        }
        struct dirent *e;
        while ((e = readdir(dir))) {
            long long id = imdb_file_id(e->d_name);
            if (id < 0) continue;
            if (*n == cap) {
                cap = cap ? 2 * cap : 1024;
                *names = bq_realloc(*names, (size_t)cap * sizeof **names);
                *labels = bq_realloc(*labels, (size_t)cap * sizeof **labels);
                *ids = bq_realloc(*ids, (size_t)cap * sizeof **ids);
            }
            (*names)[*n] = path_join(d, e->d_name);
            (*labels)[*n] = lab;
            (*ids)[*n] = id;
            (*n)++;
        }
        closedir(dir);
        free(d);
    }
cleanup:
    free(sd);
    return st;
}

/* The folder's reviews, each file read once for its length and blankness (the blank ones skipped). */
static int imdb_read_dir(BqRawSet *out, const char *path, const char *split) {
    char *root = imdb_root(path);
    if (!root) return bq_err(BQ_EFORMAT, "%s: not an aclImdb folder (no train/ or test/)", path);
    char **names = NULL;
    int *labels = NULL;
    long long *ids = NULL;
    int64_t n = 0;
    ImdbList l = {0};
    int st = imdb_dir_list(root, split, &names, &labels, &ids, &n);
    for (int64_t i = 0; i < n && !st; i++) {
        char *buf = NULL;
        size_t len = 0;
        if ((st = read_whole(names[i], &buf, &len))) break;
        if (is_blank(buf, len)) out->skipped_empty++;
        else imdb_push(&l, labels[i], ids[i], len, names[i]), names[i] = NULL;
        free(buf);
    }
    out->file = path_join(root, split);
    if (st) imdb_list_free(&l);
    else st = imdb_finish(out, &l, out->file, split);
    for (int64_t i = 0; i < n; i++) free(names[i]);
    free(names);
    free(labels);
    free(ids);
    free(root);
    return st;
}

/* The next entry of archive a that is a review of split: its label and id, or -1 at the end. Errors: a
 * damaged header (BQ_EFORMAT naming path). */
static int archive_next_review(struct archive *a, const char *path, const char *split, int *label, long long *id,
                               const char **name) {
    struct archive_entry *e;
    for (;;) {
        int r = archive_read_next_header(a, &e);
        if (r == ARCHIVE_EOF) {
            *label = -1;
            return BQ_OK;
        }
        if (r != ARCHIVE_OK && r != ARCHIVE_WARN) /* RETRY: damaged header; FAILED/FATAL */
            return bq_err(BQ_EFORMAT, "%s: corrupt or truncated archive: %s", path, archive_error_string(a));
        if (archive_entry_filetype(e) != AE_IFREG) continue;
        *name = archive_entry_pathname(e);
        if (*name && (*label = imdb_match_path(*name, split, id)) >= 0) return BQ_OK;
        /* not a review: its data is skipped, which libarchive does lazily */
    }
}

/* The current entry's data into *buf (grown as needed, NUL-terminated), its length in *len. */
static int archive_entry_text(struct archive *a, const char *path, const char *name, char **buf, size_t *cap,
                              size_t *len) {
    size_t n = 0;
    for (;;) {
        if (n + 1 >= *cap) *buf = bq_realloc(*buf, *cap = *cap ? 2 * *cap : 4096);
        la_ssize_t got = archive_read_data(a, *buf + n, *cap - n - 1);
        if (got < 0)
            return bq_err(BQ_EFORMAT, "%s: corrupt or truncated archive at %s: %s", path, name, archive_error_string(a));
        if (got == 0) break;
        n += (size_t)got;
    }
    (*buf)[n] = 0;
    *len = n;
    return BQ_OK;
}

static struct archive *archive_open(const char *path) {
    struct archive *a = archive_read_new();
    archive_read_support_filter_all(a);
    archive_read_support_format_all(a);
    if (archive_read_open_filename(a, path, 1 << 16) != ARCHIVE_OK) {
        bq_err(BQ_EFORMAT, "%s: cannot open archive: %s", path, archive_error_string(a));
        archive_read_free(a);
        return NULL;
    }
    return a;
}

static int imdb_read_archive(BqRawSet *out, const char *path, const char *split) {
    ImdbList l = {0};
    char *buf = NULL;
    size_t cap = 0, len = 0;
    int st = BQ_OK, label;
    long long id;
    const char *name = NULL;
    struct archive *a = archive_open(path);
    if (!a) return BQ_EFORMAT;
    while (!(st = archive_next_review(a, path, split, &label, &id, &name)) && label >= 0) {
        if ((st = archive_entry_text(a, path, name, &buf, &cap, &len))) break;
        if (is_blank(buf, len)) out->skipped_empty++;
        else imdb_push(&l, label, id, len, NULL);
    }
    if (!st && l.n == 0)
        st = bq_err(BQ_EFORMAT, "%s: archive has no aclImdb %s/{pos,neg}/<id>_<rating>.txt reviews", path, split);
    out->file = bq_strdup(path);
    if (st) imdb_list_free(&l);
    else st = imdb_finish(out, &l, path, split);
    free(buf);
    archive_read_free(a);
    return st;
}

/* ---- texts on demand ---- */

/* A chunk of texts being gathered for bq_source_texts' callback. */
typedef struct TextChunk {
    int64_t *at;
    BqRawExample *ex;
    int64_t cnt, max;
    int own; /* the texts were read for the chunk (a lazy set's) and are freed with it */
    BqTextFn fn;
    void *user;
} TextChunk;

/* Frees the texts (and pairs) gathered so far where the chunk owns them. */
static void chunk_drop(TextChunk *c) {
    for (int64_t k = 0; c->own && k < c->cnt; k++) {
        free(c->ex[k].text);
        free(c->ex[k].pair);
    }
    c->cnt = 0;
}

/* Hands the gathered texts to the callback, then frees those the chunk owns. */
static int chunk_flush(TextChunk *c) {
    int st = c->cnt ? c->fn(c->user, c->at, c->ex, c->cnt) : BQ_OK;
    chunk_drop(c);
    return st;
}

/* Example x with its text (and pair: a lazy CSV/TSV/JSONL set's, else x's own) as example at of the chunk. */
static int chunk_add(TextChunk *c, int64_t at, const BqRawExample *x, char *text, size_t len, char *pair,
                     size_t plen) {
    c->at[c->cnt] = at;
    c->ex[c->cnt] = *x;
    c->ex[c->cnt].text = text;
    c->ex[c->cnt].len = len;
    c->ex[c->cnt].pair = pair;
    c->ex[c->cnt].pair_len = plen;
    return ++c->cnt == c->max ? chunk_flush(c) : BQ_OK;
}

/* Position of (label, id) among r's examples ((label, id) order), or -1. */
static int64_t imdb_find(const BqRawSet *r, int label, long long id) {
    int64_t lo = 0, hi = r->n;
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        int ml = r->ex[mid].label[0] == 'p';
        if (ml < label || (ml == label && r->ids[mid] < id)) lo = mid + 1;
        else hi = mid;
    }
    return lo < r->n && (r->ex[lo].label[0] == 'p') == label && r->ids[lo] == id ? lo : -1;
}

static int changed(const char *where) {
    return bq_err(BQ_EFORMAT, "%s: changed while being read (a text's length differs from the first read)", where);
}

/* The archive read again, up to the last text asked for; want[i] is example i's position in idx or -1. */
static int archive_texts(const BqRawSet *r, const int64_t *want, int64_t n, TextChunk *c) {
    struct archive *a = archive_open(r->file);
    if (!a) return BQ_EFORMAT;
    int st = BQ_OK, label;
    long long id;
    const char *name = NULL;
    int64_t found = 0;
    char *buf = NULL;
    while (found < n && !(st = archive_next_review(a, r->file, r->split, &label, &id, &name)) && label >= 0) {
        const int64_t i = imdb_find(r, label, id);
        if (i < 0 || want[i] < 0) continue; /* blank, or not asked for */
        size_t cap = r->ex[i].len + 2, len = 0; /* the text, its NUL, and room for the read that ends it */
        buf = bq_malloc(cap);
        if ((st = archive_entry_text(a, r->file, name, &buf, &cap, &len))) break;
        if (len != r->ex[i].len) {
            st = changed(r->file);
            break;
        }
        found++;
        st = chunk_add(c, want[i], &r->ex[i], buf, len, NULL, 0);
        buf = NULL;
        if (st) break;
    }
    if (!st && found < n) st = changed(r->file);
    free(buf);
    archive_read_free(a);
    return st;
}

static int file_texts(const BqRawSet *r, const int64_t *idx, int64_t n, TextChunk *c);

int bq_source_texts(const BqRawSet *r, const int64_t *idx, int64_t n, int64_t chunk, BqTextFn fn, void *user) {
    BQ_CHECK(chunk > 0 && n >= 0);
    TextChunk c = {.at = bq_malloc((size_t)chunk * sizeof(int64_t)), .ex = bq_malloc((size_t)chunk * sizeof(BqRawExample)),
                   .max = chunk, .own = r->lazy, .fn = fn, .user = user};
    int64_t *want = NULL;
    int st = BQ_OK;
    for (int64_t k = 0; k < n; k++) BQ_CHECK(idx[k] >= 0 && idx[k] < r->n && (k == 0 || idx[k] > idx[k - 1]));
    if (!r->lazy) { /* texts held since bq_source_read */
        for (int64_t k = 0; k < n && !st; k++) {
            const BqRawExample *x = &r->ex[idx[k]];
            st = chunk_add(&c, k, x, x->text, x->len, x->pair, x->pair_len);
        }
    } else if (r->offs) { /* CSV, TSV, JSONL: each record read again */
        st = file_texts(r, idx, n, &c);
    } else if (r->paths) { /* aclImdb folder: each review's file */
        for (int64_t k = 0; k < n && !st; k++) {
            const int64_t i = idx[k];
            char *buf = NULL;
            size_t len = 0;
            if ((st = read_whole(r->paths[i], &buf, &len))) break;
            if (len != r->ex[i].len) {
                free(buf);
                st = changed(r->paths[i]);
                break;
            }
            st = chunk_add(&c, k, &r->ex[i], buf, len, NULL, 0);
        }
    } else { /* aclImdb archive: in archive order */
        want = bq_malloc((size_t)(r->n ? r->n : 1) * sizeof *want);
        for (int64_t i = 0; i < r->n; i++) want[i] = -1;
        for (int64_t k = 0; k < n; k++) want[idx[k]] = k;
        st = archive_texts(r, want, n, &c);
    }
    if (!st) st = chunk_flush(&c);
    chunk_drop(&c); /* what an error left gathered */
    free(want);
    free(c.at);
    free(c.ex);
    return st;
}

static int hold_text(void *user, const int64_t *at, const BqRawExample *ex, int64_t cnt) {
    BqRawSet *r = user;
    for (int64_t k = 0; k < cnt; k++) {
        r->ex[at[k]].text = dup_n(ex[k].text, ex[k].len);
        if (ex[k].pair) r->ex[at[k]].pair = dup_n(ex[k].pair, ex[k].pair_len);
    }
    return BQ_OK;
}

int bq_source_hold_texts(BqRawSet *r) {
    if (!r->lazy) return BQ_OK;
    int64_t *idx = bq_malloc((size_t)(r->n ? r->n : 1) * sizeof *idx);
    for (int64_t i = 0; i < r->n; i++) idx[i] = i;
    int st = bq_source_texts(r, idx, r->n, 4096, hold_text, r);
    free(idx);
    if (!st) r->lazy = 0;
    return st;
}

/* ---------------------------------------------------------------- CSV / TSV / JSONL listing */

/* A data file read for its listing through a window: the bytes from the record being parsed on, STREAM_BLOCK
 * more read whenever a record runs past the window's end, so a listing holds about a block of the file
 * rather than all of it (and a file that shrinks meanwhile is an end of file, not a fault). p holds bytes
 * [base, base + n) of the file. */
#define STREAM_BLOCK ((size_t)1 << 20)
typedef struct Stream {
    FILE *f;
    const char *path;
    char *p;
    size_t n, cap, base;
    int eof;
} Stream;

/* Drops the bytes before *pos (parsed; pos NULL: none, else *pos becomes 0) and reads up to STREAM_BLOCK more,
 * setting eof at the end of the file. */
static int stream_more(Stream *s, size_t *pos) {
    if (pos && *pos) {
        memmove(s->p, s->p + *pos, s->n - *pos);
        s->base += *pos;
        s->n -= *pos;
        *pos = 0;
    }
    if (s->n + STREAM_BLOCK > s->cap) s->p = bq_realloc(s->p, s->cap = s->n + STREAM_BLOCK);
    size_t want = STREAM_BLOCK;
    while (want > 0 && !s->eof) {
        const size_t got = fread(s->p + s->n, 1, want, s->f);
        s->n += got, want -= got;
        if (got == 0) {
            if (ferror(s->f)) return bq_err(BQ_EIO, "%s: read error", s->path);
            s->eof = 1;
        }
    }
    return BQ_OK;
}

static int stream_open(const char *path, Stream *s) {
    memset(s, 0, sizeof *s);
    s->path = path;
    s->f = fopen(path, "rb");
    if (!s->f) return bq_err(BQ_EIO, "%s: %s", path, strerror(errno));
    return stream_more(s, NULL);
}

static void stream_close(Stream *s) {
    if (s->f) fclose(s->f);
    free(s->p);
    memset(s, 0, sizeof *s);
}

/* ---------------------------------------------------------------- CSV / TSV */

typedef struct Record {
    char **f;
    size_t *len;
    int n, cap;
    int cut; /* next_record's error: the input ended inside a quoted field */
} Record;

static void rec_add(Record *r, char *s, size_t len) {
    if (r->n == r->cap) {
        r->cap = r->cap ? 2 * r->cap : 8;
        r->f = bq_realloc(r->f, (size_t)r->cap * sizeof *r->f);
        r->len = bq_realloc(r->len, (size_t)r->cap * sizeof *r->len);
    }
    r->f[r->n] = s;
    r->len[r->n++] = len;
}

static void rec_clear(Record *r) {
    for (int i = 0; i < r->n; i++) free(r->f[i]);
    r->n = 0;
}

/* Reads one record starting at *pos; advances *pos and *line. quoting: RFC 4180 (CSV) or none (TSV).
 * Returns 1 with a record, 0 at end of input, or an error status (negated) on an unterminated quote. */
static int next_record(const char *buf, size_t n, size_t *pos, int64_t *line, char delim, int quoting, Record *r,
                       const char *file) {
    size_t i = *pos;
    if (i >= n) return 0;
    rec_clear(r);
    size_t fcap = 256, fl = 0;
    char *fbuf = bq_malloc(fcap);
    int64_t start_line = *line;
    r->cut = 0;
    for (;;) {
        /* one field */
        fl = 0;
        int quoted = quoting && i < n && buf[i] == '"';
        if (quoted) {
            int64_t qline = *line;
            i++;
            for (;;) {
                if (i >= n) {
                    free(fbuf);
                    r->cut = 1;
                    return -bq_err(BQ_EFORMAT, "%s:%lld: unterminated quoted field", file, (long long)qline);
                }
                char c = buf[i];
                if (c == '"') {
                    if (i + 1 < n && buf[i + 1] == '"') {
                        c = '"';
                        i += 2;
                    } else {
                        i++;
                        break;
                    }
                } else {
                    if (c == '\n') (*line)++;
                    i++;
                }
                if (fl + 1 >= fcap) fbuf = bq_realloc(fbuf, fcap *= 2);
                fbuf[fl++] = c;
            }
            /* after the closing quote only a delimiter or end of line may follow */
            if (i < n && buf[i] != delim && buf[i] != '\n' && !(buf[i] == '\r' && (i + 1 >= n || buf[i + 1] == '\n'))) {
                free(fbuf);
                return -bq_err(BQ_EFORMAT, "%s:%lld: unexpected character after closing quote", file, (long long)*line);
            }
        } else {
            while (i < n && buf[i] != delim && buf[i] != '\n') {
                if (fl + 1 >= fcap) fbuf = bq_realloc(fbuf, fcap *= 2);
                fbuf[fl++] = buf[i++];
            }
            if (fl && fbuf[fl - 1] == '\r' && (i >= n || buf[i] == '\n')) fl--;
        }
        if (i < n && buf[i] == '\r' && i + 1 < n && buf[i + 1] == '\n') i++;
        rec_add(r, dup_n(fbuf, fl), fl);
        if (i < n && buf[i] == delim) {
            i++;
            continue;
        }
        if (i < n && buf[i] == '\n') i++;
        (*line)++;
        break;
    }
    (void)start_line;
    free(fbuf);
    *pos = i;
    return 1;
}

static int find_col(const Record *h, const char *name) {
    for (int i = 0; i < h->n; i++)
        if (strcmp(h->f[i], name) == 0) return i;
    return -1;
}

static int pick_col(const Record *h, const char *given, const char *const *autos, const char *file,
                    const char *what, int required, int *col) {
    if (given) {
        *col = find_col(h, given);
        if (*col < 0) return bq_err(BQ_EFORMAT, "%s:1: missing %s column '%s'", file, what, given);
        return BQ_OK;
    }
    for (int k = 0; autos && autos[k]; k++)
        if ((*col = find_col(h, autos[k])) >= 0) return BQ_OK;
    *col = -1;
    if (required) return bq_err(BQ_EFORMAT, "%s:1: no %s column (looked for %s, %s, ...; name one with --%s-column)", file, what, autos[0], autos[1], what);
    return BQ_OK;
}

static const char *const TEXT_AUTO[] = {"text", "review", "sentence", "content", NULL};
static const char *const LABEL_AUTO[] = {"label", "sentiment", "labels", NULL};

/* next_record on s's window from *pos: a record that may go on past the window's end (one that ends there, or
 * input that ends inside a quoted field) is parsed again once more of the file is read. *off: the record's
 * file offset. */
static int stream_record(Stream *s, size_t *pos, int64_t *line, char delim, int quoting, Record *r, size_t *off) {
    for (;;) {
        const size_t p0 = *pos;
        const int64_t l0 = *line;
        const int got = next_record(s->p, s->n, pos, line, delim, quoting, r, s->path);
        *off = s->base + p0;
        if (s->eof || (got > 0 && *pos < s->n) || (got < 0 && !r->cut)) return got;
        *pos = p0, *line = l0;
        bq_err_clear();
        const int st = stream_more(s, pos);
        if (st) return -st;
    }
}

/* The field delimiter and quoting (RFC 4180 for CSV, none for TSV) of a delimited set's format. */
static char fmt_delim(int fmt) { return fmt == BQ_DATA_CSV ? ',' : '\t'; }

/* Lists the records of out->fmt's CSV or TSV file (lazy: each kept example's record offset and span, its
 * label and lengths; its texts are read again by bq_source_texts). */
static int read_delimited(BqRawSet *out, const char *file, const BqSourceOptions *o) {
    const char delim = fmt_delim(out->fmt);
    const int quoting = out->fmt == BQ_DATA_CSV;
    Stream sf;
    size_t pos = 0, off;
    int64_t line = 1;
    Record h = {0}, r = {0};
    int st = stream_open(file, &sf);
    if (st) goto cleanup;
    if (sf.n == 0) {
        st = bq_err(BQ_EFORMAT, "%s: empty file", file);
        goto cleanup;
    }
    const unsigned char *u = (const unsigned char *)sf.p;
    if (sf.n >= 3 && u[0] == 0xEF && u[1] == 0xBB && u[2] == 0xBF) pos = 3;
    int got = stream_record(&sf, &pos, &line, delim, quoting, &h, &off);
    if (got < 0) {
        st = -got;
        goto cleanup;
    }
    int tc, pc = -1, lc;
    if ((st = pick_col(&h, o->text_column, TEXT_AUTO, file, "text", 1, &tc))) goto cleanup;
    if (o->text_pair_column && (st = pick_col(&h, o->text_pair_column, NULL, file, "text-pair", 1, &pc))) goto cleanup;
    if ((st = pick_col(&h, o->label_column, LABEL_AUTO, file, "label", 0, &lc))) goto cleanup;
    out->cols[0] = tc, out->cols[1] = pc;
    for (;;) {
        const int64_t rline = line;
        got = stream_record(&sf, &pos, &line, delim, quoting, &r, &off);
        if (got == 0) break;
        if (got < 0) {
            st = -got;
            goto cleanup;
        }
        if (r.n == 1 && r.len[0] == 0) continue; /* blank line */
        if (r.n != h.n) {
            st = bq_err(BQ_EFORMAT, "%s:%lld: expected %d fields (as in the header), got %d", file, (long long)rline, h.n, r.n);
            goto cleanup;
        }
        char *label = NULL;
        if (lc >= 0) {
            if (is_blank(r.f[lc], r.len[lc])) {
                st = bq_err(BQ_EFORMAT, "%s:%lld: empty label", file, (long long)rline);
                goto cleanup;
            }
            label = r.f[lc];
            r.f[lc] = NULL;
        }
        raw_push(out, r.f[tc], r.len[tc], pc >= 0 ? r.len[pc] : 0, label, rline, off, sf.base + pos - off);
    }
    out->file = bq_strdup(file);
    out->lazy = 1;
cleanup:
    rec_clear(&h);
    rec_clear(&r);
    free(h.f);
    free(h.len);
    free(r.f);
    free(r.len);
    stream_close(&sf);
    return st;
}

/* ---------------------------------------------------------------- JSONL */

static int json_label(json_t *v, char **out) {
    char tmp[32];
    if (json_is_string(v)) {
        *out = bq_strdup(json_string_value(v));
        return 0;
    }
    if (json_is_integer(v)) {
        snprintf(tmp, sizeof tmp, "%lld", (long long)json_integer_value(v));
        *out = bq_strdup(tmp);
        return 0;
    }
    if (json_is_boolean(v)) {
        *out = bq_strdup(json_is_true(v) ? "1" : "0");
        return 0;
    }
    return -1;
}

/* The string field of a JSONL record holding its text: key, or the first of TEXT_AUTO present; NULL where
 * there is none. *used: the key looked for (for messages). */
static json_t *json_text(json_t *obj, const char *key, const char **used) {
    for (int k = 0; !key && TEXT_AUTO[k]; k++)
        if (json_object_get(obj, TEXT_AUTO[k])) key = TEXT_AUTO[k];
    if (used) *used = key ? key : "text";
    json_t *v = key ? json_object_get(obj, key) : NULL;
    return v && json_is_string(v) ? v : NULL;
}

/* Lists the records of a JSONL file, lazily as read_delimited does. */
static int read_jsonl(BqRawSet *out, const char *file, const BqSourceOptions *o) {
    Stream sf;
    size_t pos = 0;
    int st = stream_open(file, &sf);
    int64_t line = 0;
    if (st) goto cleanup;
    if (sf.n == 0) {
        st = bq_err(BQ_EFORMAT, "%s: empty file", file);
        goto cleanup;
    }
    out->keys[0] = o->text_column ? bq_strdup(o->text_column) : NULL;
    out->keys[1] = o->text_pair_column ? bq_strdup(o->text_pair_column) : NULL;
    for (;;) {
        const char *nl = pos < sf.n ? memchr(sf.p + pos, '\n', sf.n - pos) : NULL;
        if (!nl && !sf.eof) { /* the line may go on past the window */
            if ((st = stream_more(&sf, &pos))) goto cleanup;
            continue;
        }
        if (pos >= sf.n) break;
        line++;
        const size_t e = nl ? (size_t)(nl - sf.p) : sf.n, len = e - pos, rpos = sf.base + pos;
        const char *s = sf.p + pos;
        pos = e + 1;
        if (is_blank(s, len)) continue;
        json_error_t jerr;
        json_t *obj = json_loadb(s, len, JSON_ALLOW_NUL, &jerr);
        if (!obj) {
            st = bq_err(BQ_EFORMAT, "%s:%lld: invalid JSON: %s", file, (long long)line, jerr.text);
            goto cleanup;
        }
        if (!json_is_object(obj)) {
            json_decref(obj);
            st = bq_err(BQ_EFORMAT, "%s:%lld: expected a JSON object", file, (long long)line);
            goto cleanup;
        }
        const char *tk, *lk = o->label_column;
        json_t *tv = json_text(obj, o->text_column, &tk);
        for (int k = 0; !lk && LABEL_AUTO[k]; k++)
            if (json_object_get(obj, LABEL_AUTO[k])) lk = LABEL_AUTO[k];
        if (!tv) {
            json_decref(obj);
            st = bq_err(BQ_EFORMAT, "%s:%lld: missing string field '%s'", file, (long long)line, tk);
            goto cleanup;
        }
        size_t plen = 0;
        if (o->text_pair_column) {
            json_t *pv = json_object_get(obj, o->text_pair_column);
            if (!pv || !json_is_string(pv)) {
                json_decref(obj);
                st = bq_err(BQ_EFORMAT, "%s:%lld: missing string field '%s'", file, (long long)line, o->text_pair_column);
                goto cleanup;
            }
            plen = json_string_length(pv);
        }
        char *label = NULL;
        json_t *lv = lk ? json_object_get(obj, lk) : NULL;
        if (o->label_column && !lv) {
            json_decref(obj);
            st = bq_err(BQ_EFORMAT, "%s:%lld: missing label field '%s'", file, (long long)line, o->label_column);
            goto cleanup;
        }
        if (lv && json_label(lv, &label) != 0) {
            json_decref(obj);
            st = bq_err(BQ_EFORMAT, "%s:%lld: label must be a string or an integer", file, (long long)line);
            goto cleanup;
        }
        raw_push(out, json_string_value(tv), json_string_length(tv), plen, label, line, rpos, len);
        json_decref(obj);
    }
    out->file = bq_strdup(file);
    out->lazy = 1;
cleanup:
    stream_close(&sf);
    return st;
}

/* ---------------------------------------------------------------- CSV / TSV / JSONL texts */

/* All n bytes at off of fd into buf; 0, or -1 where the file ends first or cannot be read. */
static int pread_all(int fd, char *buf, size_t n, off_t off) {
    while (n > 0) {
        const ssize_t got = pread(fd, buf, n, off);
        if (got <= 0) {
            if (got < 0 && errno == EINTR) continue;
            return -1;
        }
        buf += got, n -= (size_t)got, off += got;
    }
    return 0;
}

/* The text and pair of example i of a lazy CSV/TSV/JSONL set from its record's bytes buf (span long): owned
 * copies, NULL pair where it has none. Errors: a record that no longer parses as listed, or whose text or
 * pair length differs ("changed while being read"). */
static int record_texts(const BqRawSet *r, int64_t i, const char *buf, size_t span, char **text, size_t *len,
                        char **pair, size_t *plen) {
    const BqRawExample *x = &r->ex[i];
    *text = *pair = NULL;
    *len = *plen = 0;
    if (r->fmt == BQ_DATA_JSONL) {
        json_t *obj = json_loadb(buf, span, JSON_ALLOW_NUL, NULL), *tv = obj ? json_text(obj, r->keys[0], NULL) : NULL;
        json_t *pv = tv && r->keys[1] ? json_object_get(obj, r->keys[1]) : NULL;
        if (tv && (!r->keys[1] || (pv && json_is_string(pv)))) {
            *len = json_string_length(tv);
            *text = dup_n(json_string_value(tv), *len);
            if (pv) {
                *plen = json_string_length(pv);
                *pair = dup_n(json_string_value(pv), *plen);
            }
        }
        json_decref(obj);
    } else {
        Record rec = {0};
        size_t pos = 0;
        int64_t line = x->line;
        const int tc = r->cols[0], pc = r->cols[1];
        const int got = next_record(buf, span, &pos, &line, fmt_delim(r->fmt), r->fmt == BQ_DATA_CSV, &rec, r->file);
        if (got == 1 && tc < rec.n && pc < rec.n) {
            *text = rec.f[tc], *len = rec.len[tc], rec.f[tc] = NULL;
            if (pc >= 0) *pair = rec.f[pc], *plen = rec.len[pc], rec.f[pc] = NULL;
        }
        bq_err_clear();
        rec_clear(&rec);
        free(rec.f);
        free(rec.len);
    }
    const int want_pair = r->fmt == BQ_DATA_JSONL ? r->keys[1] != NULL : r->cols[1] >= 0;
    if (*text && *len == x->len && (*pair != NULL) == want_pair && *plen == x->pair_len) return BQ_OK;
    free(*text);
    free(*pair);
    *text = *pair = NULL;
    return changed(r->file);
}

/* The texts of examples idx[0..n) of a lazy CSV/TSV/JSONL set, each record read again at its offset (in file
 * order: idx ascends). */
static int file_texts(const BqRawSet *r, const int64_t *idx, int64_t n, TextChunk *c) {
    const int fd = open(r->file, O_RDONLY);
    if (fd < 0) return bq_err(BQ_EIO, "%s: %s", r->file, strerror(errno));
    int st = BQ_OK;
    size_t cap = 0;
    char *buf = NULL;
    for (int64_t k = 0; k < n && !st; k++) {
        const int64_t i = idx[k];
        const size_t span = (size_t)r->spans[i];
        if (span + 1 > cap) buf = bq_realloc(buf, cap = span + 1);
        if (pread_all(fd, buf, span, (off_t)r->offs[i])) {
            st = changed(r->file);
            break;
        }
        char *text, *pair;
        size_t len, plen;
        if ((st = record_texts(r, i, buf, span, &text, &len, &pair, &plen))) break;
        st = chunk_add(c, k, &r->ex[i], text, len, pair, plen);
    }
    free(buf);
    close(fd);
    return st;
}

/* ---------------------------------------------------------------- dispatch */

static int read_file_kind(BqRawSet *out, const char *file, BqDataKind k, const BqSourceOptions *o) {
    switch (k) {
    case BQ_DATA_CSV:
    case BQ_DATA_TSV: out->fmt = k; return read_delimited(out, file, o);
    case BQ_DATA_JSONL: out->fmt = k; return read_jsonl(out, file, o);
    default: return bq_err(BQ_EFORMAT, "%s: unsupported data file", file);
    }
}

int bq_source_read(BqRawSet *out, const char *path, BqDataKind kind, const char *split, const BqSourceOptions *o) {
    memset(out, 0, sizeof *out);
    int st;
    switch (kind) {
    case BQ_DATA_IMDB_DIR: st = imdb_read_dir(out, path, split); break;
    case BQ_DATA_IMDB_ARCHIVE: st = imdb_read_archive(out, path, split); break;
    case BQ_DATA_SPLIT_DIR: {
        BqDataKind fk = 0;
        char *f = bq_source_split_file(path, split, &fk);
        if (!f) return bq_err(BQ_EIO, "%s: no %s.csv, %s.tsv or %s.jsonl", path, split, split, split);
        st = read_file_kind(out, f, fk, o);
        free(f);
        break;
    }
    default: st = read_file_kind(out, path, kind, o); break;
    }
    if (st) {
        bq_raw_free(out);
        return st;
    }
    if (out->n == 0) {
        st = bq_err(BQ_EFORMAT, "%s: no examples (%lld empty skipped)", out->file ? out->file : path, (long long)out->skipped_empty);
        bq_raw_free(out);
    }
    return st;
}

static uint64_t hash_stat(uint64_t h, const char *p, const struct stat *st) {
    h = bq_fnv1a(h, p, strlen(p) + 1);
    int64_t v[3] = {(int64_t)st->st_size, (int64_t)st->st_mtim.tv_sec, (int64_t)st->st_mtim.tv_nsec};
    return bq_fnv1a(h, v, sizeof v);
}

int bq_source_identity(const char *path, BqDataKind kind, const char *split, uint64_t *id) {
    uint64_t h = BQ_FNV_OFFSET;
    struct stat st;
    int rc = BQ_OK;
    if (kind == BQ_DATA_IMDB_DIR) {
        char *root = imdb_root(path);
        if (!root) return bq_err(BQ_EFORMAT, "%s: not an aclImdb folder", path);
        char **names;
        int *labels;
        long long *ids;
        int64_t n;
        char real[PATH_MAX];
        rc = imdb_dir_list(root, split, &names, &labels, &ids, &n);
        if (!rc) {
            h = bq_fnv1a(h, realpath(root, real) ? real : root, strlen(realpath(root, real) ? real : root));
            /* readdir order is arbitrary: combine per-file hashes with a commutative sum */
            uint64_t sum = 0;
            for (int64_t i = 0; i < n; i++) {
                if (stat(names[i], &st) != 0) {
                    rc = bq_err(BQ_EIO, "%s: %s", names[i], strerror(errno));
                    break;
                }
                sum += hash_stat(BQ_FNV_OFFSET, names[i] + strlen(root), &st);
            }
            h = bq_fnv1a(h, &sum, sizeof sum);
            h = bq_fnv1a(h, &n, sizeof n);
        }
        for (int64_t i = 0; i < n; i++) free(names[i]);
        free(names);
        free(labels);
        free(ids);
        free(root);
    } else {
        char *f = kind == BQ_DATA_SPLIT_DIR ? bq_source_split_file(path, split, NULL) : bq_strdup(path);
        if (!f) return bq_err(BQ_EIO, "%s: no %s.csv, %s.tsv or %s.jsonl", path, split, split, split);
        char real[PATH_MAX];
        if (stat(f, &st) != 0) rc = bq_err(BQ_EIO, "%s: %s", f, strerror(errno));
        else h = hash_stat(h, realpath(f, real) ? real : f, &st);
        free(f);
    }
    *id = h;
    return rc;
}
