/* Native checkpoint directory: save/load of config.json, vocabulary files and model.h5, plus the
 * caller's extra files (BqCkptExtra), with atomic directory replacement (layout in ckpt.h;
 * docs/design.md). HDF5 C API (H5Dcreate2/H5Dwrite, attributes on the root group). */
#include "export/ckpt.h"
#include "layers/config.h"
#include "layers/quant.h"

#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <errno.h>
#include <hdf5.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export/h5sum.h"
#include "export/hf_load.h"
#include "export/quant_io.h"

#define PATH_MAX_LEN 4400

int bq_ckpt_is_native(const char *dir) {
    char p[PATH_MAX_LEN];
    snprintf(p, sizeof p, "%s/model.h5", dir);
    return bq_is_file(p);
}

/* Removes a directory tree that this module created (regular files and one level of folders). */
static void remove_tree(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char p[PATH_MAX_LEN];
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (lstat(p, &sb) == 0 && S_ISDIR(sb.st_mode))
            remove_tree(p);
        else
            unlink(p);
    }
    closedir(d);
    rmdir(dir);
}

/* ---- HDF5 helpers ---- */

/* HDF5 1.10 file format: besides each tensor's Fletcher-32 checksum (export/h5sum.h), its metadata
 * (superblock, object headers with the attributes and each tensor's single-chunk index) carries
 * checksums, so a corrupted byte there is also an error rather than a silently different tensor.
 * Readers need HDF5 >= 1.10. */
static hid_t h5_create(const char *path) {
    hid_t fapl = H5Pcreate(H5P_FILE_ACCESS);
    H5Pset_libver_bounds(fapl, H5F_LIBVER_V110, H5F_LIBVER_V110);
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, fapl);
    H5Pclose(fapl);
    return f;
}

static int h5_write_f32(hid_t f, const char *file, const char *name, const float *data, int ndim,
                        const int64_t *shape) {
    hsize_t dims[4];
    for (int i = 0; i < ndim; i++) dims[i] = (hsize_t)shape[i];
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    /* chunked, Fletcher-32: corrupt data fails the read */
    int st = bq_h5sum_write_f32(f, file, name, name, lcpl, ndim, dims, data);
    H5Pclose(lcpl);
    return st;
}

static int h5_read_f32(hid_t f, const char *file, const char *name, float *data, int ndim, const int64_t *shape) {
    if (H5Lexists(f, name, H5P_DEFAULT) <= 0) {
        /* intermediate groups may be missing: H5Lexists fails on them, so test the parent first */
        return bq_err(BQ_EFORMAT, "%s: dataset %s is missing", file, name);
    }
    int st = BQ_OK;
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    if (ds < 0) return bq_err(BQ_EFORMAT, "%s: cannot open dataset %s", file, name);
    hid_t sp = H5Dget_space(ds);
    hsize_t dims[8];
    int nd = H5Sget_simple_extent_ndims(sp);
    if (nd != ndim || nd > 8) {
        st = bq_err(BQ_EFORMAT, "%s: dataset %s has %d dimensions, expected %d", file, name, nd, ndim);
        goto cleanup;
    }
    H5Sget_simple_extent_dims(sp, dims, NULL);
    for (int i = 0; i < nd; i++)
        if ((int64_t)dims[i] != shape[i]) {
            st = bq_err(BQ_EFORMAT, "%s: dataset %s dimension %d is %lld, expected %lld", file, name, i,
                        (long long)dims[i], (long long)shape[i]);
            goto cleanup;
        }
    st = bq_h5sum_read_f32(ds, file, name, data);
cleanup:
    H5Sclose(sp);
    H5Dclose(ds);
    return st;
}

static int h5_group_exists(hid_t f, const char *path) {
    /* checks each prefix, as H5Lexists requires */
    char buf[512];
    snprintf(buf, sizeof buf, "%s", path);
    for (char *s = buf + 1;; s++) {
        char c = *s;
        if (c == '/' || c == 0) {
            *s = 0;
            if (H5Lexists(f, buf, H5P_DEFAULT) <= 0) return 0;
            if (!c) return 1;
            *s = c;
        }
    }
}

/* n values of type (stored as type) as the attribute `name` of f (export/h5sum.h). */
static int h5_attr_write(hid_t f, const char *file, const char *name, hid_t type, const void *v, hsize_t n) {
    return bq_h5_attr_write(f, file, name, "", type, type, v, 1, n);
}

static int h5_attr_read(hid_t f, const char *file, const char *name, hid_t type, void *v, hsize_t n) {
    if (H5Aexists(f, name) <= 0) return bq_err(BQ_EFORMAT, "%s: attribute %s is missing", file, name);
    hid_t a = H5Aopen(f, name, H5P_DEFAULT);
    hid_t sp = H5Aget_space(a);
    hssize_t np = H5Sget_simple_extent_npoints(sp);
    int st = BQ_OK;
    if (np != (hssize_t)n)
        st = bq_err(BQ_EFORMAT, "%s: attribute %s has %lld values, expected %lld", file, name, (long long)np,
                    (long long)n);
    else if (H5Aread(a, type, v) < 0)
        st = bq_err(BQ_EFORMAT, "%s: cannot read attribute %s", file, name);
    H5Sclose(sp);
    H5Aclose(a);
    return st;
}

#define ATTR_I64(f, file, name, v) h5_attr_write(f, file, name, H5T_NATIVE_INT64, &(int64_t){(v)}, 1)

/* ---- config.json ---- */

/* "bertqat"."data": how the examples were encoded (BqDataMeta, layers/bert.h); columns null when the
 * data loader chose them. */
static const char *const TRUNC_NAMES[] = {"head", "tail", "head_tail"};

static json_t *data_meta_to_json(const BqDataMeta *d) {
    json_t *o = json_object();
    json_object_set_new(o, "max_seq_len", json_integer(d->max_seq_len));
    json_object_set_new(o, "truncation", json_string(TRUNC_NAMES[d->truncation]));
    json_object_set_new(o, "text_column", d->text_column[0] ? json_string(d->text_column) : json_null());
    json_object_set_new(o, "text_pair_column", d->text_pair_column[0] ? json_string(d->text_pair_column) : json_null());
    json_object_set_new(o, "label_column", d->label_column[0] ? json_string(d->label_column) : json_null());
    if (d->doc_stride > 0) json_object_set_new(o, "doc_stride", json_integer(d->doc_stride));
    if (d->max_query_length > 0) json_object_set_new(o, "max_query_length", json_integer(d->max_query_length));
    return o;
}

static int data_column_from_json(json_t *o, const char *key, char *dst, const char *path) {
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) return BQ_OK;
    if (!json_is_string(v) || json_string_length(v) == 0 || json_string_length(v) >= BQ_COLUMN_MAX)
        return bq_err(BQ_EFORMAT, "%s: bertqat.data.%s must be null or a name of 1 to %d bytes", path, key,
                      BQ_COLUMN_MAX - 1);
    strcpy(dst, json_string_value(v));
    return BQ_OK;
}

static int data_meta_from_json(BqDataMeta *d, json_t *o, const char *path) {
    BqDataMeta r;
    memset(&r, 0, sizeof r);
    json_t *len = json_object_get(o, "max_seq_len"), *tr = json_object_get(o, "truncation");
    if (!json_is_object(o) || !json_is_integer(len) || json_integer_value(len) < 1 || json_integer_value(len) > 1 << 20)
        return bq_err(BQ_EFORMAT, "%s: bertqat.data needs an integer max_seq_len >= 1", path);
    r.max_seq_len = (int)json_integer_value(len);
    int k = 0;
    while (k < 3 && !(json_is_string(tr) && !strcmp(json_string_value(tr), TRUNC_NAMES[k]))) k++;
    if (k == 3) return bq_err(BQ_EFORMAT, "%s: bertqat.data.truncation is not head, tail or head_tail", path);
    r.truncation = (BqTruncation)k;
    int st;
    if ((st = data_column_from_json(o, "text_column", r.text_column, path)) ||
        (st = data_column_from_json(o, "text_pair_column", r.text_pair_column, path)) ||
        (st = data_column_from_json(o, "label_column", r.label_column, path)))
        return st;
    /* question answering windows, absent in classification checkpoints */
    static const char *const qa_keys[2] = {"doc_stride", "max_query_length"};
    int *qa_dst[2] = {&r.doc_stride, &r.max_query_length};
    for (int k = 0; k < 2; k++) {
        json_t *v = json_object_get(o, qa_keys[k]);
        if (!v) continue;
        if (!json_is_integer(v) || json_integer_value(v) < 1 || json_integer_value(v) > 1 << 20)
            return bq_err(BQ_EFORMAT, "%s: bertqat.data.%s must be a positive integer", path, qa_keys[k]);
        *qa_dst[k] = (int)json_integer_value(v);
    }
    *d = r;
    return BQ_OK;
}

static int config_write(const BqBert *m, const char *path) {
    const BqBertConfig *c = &m->cfg;
    json_t *j = bq_config_to_json(c); /* HF keys, id2label/label2id (layers/config.c) */
    json_t *labels = json_array();
    char def[32];
    for (int i = 0; i < c->num_labels; i++) {
        snprintf(def, sizeof def, "LABEL_%d", i);
        json_array_append_new(labels, json_string(c->id2label && c->id2label[i] ? c->id2label[i] : def));
    }
    json_t *bq = json_object();
    json_object_set_new(bq, "format_version", json_integer(BQ_CKPT_FORMAT_VERSION));
    json_object_set_new(bq, "num_labels", json_integer(c->num_labels));
    json_object_set_new(bq, "id2label", labels);
    json_object_set_new(bq, "quantized", json_boolean(m->quant != NULL));
    if (m->quant) json_object_set_new(bq, "quant", bq_quant_config_to_json(&m->quant->cfg));
    if (m->data.max_seq_len > 0) json_object_set_new(bq, "data", data_meta_to_json(&m->data));
    json_object_set_new(j, "bertqat", bq);
    int st = BQ_OK;
    errno = 0;
    if (json_dump_file(j, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0)
        st = bq_err(BQ_EIO, "%s: cannot write: %s", path, errno ? strerror(errno) : "I/O error");
    json_decref(j);
    if (!st) st = bq_fsync_path(path);
    return st;
}

/* ---- save ---- */

static int write_model_h5(const BqBert *m, const char *path) {
    hid_t f = h5_create(path);
    if (f < 0) return bq_err(BQ_EIO, "%s: cannot create%s", path, bq_h5_io_reason());
    int st = ATTR_I64(f, path, "format_version", BQ_CKPT_FORMAT_VERSION);
    const BqParamTable *t = &m->params;
    char name[BQ_NAME_MAX + 16];
    for (int i = 0; i < t->n && !st; i++) {
        snprintf(name, sizeof name, "/params/%s", t->p[i].name);
        st = h5_write_f32(f, path, name, t->data + t->p[i].offset, t->p[i].ndim, t->p[i].shape);
    }
    if (!st && m->quant) st = bq_quant_save_hdf5(m->quant, (int64_t)f, path);
    /* the metadata (and any chunk still cached) is written here: a full disk may only show now */
    if (H5Fclose(f) < 0 && !st) st = bq_err(BQ_EIO, "%s: cannot write%s", path, bq_h5_io_reason());
    if (!st) st = bq_fsync_path(path);
    return st;
}

static int write_params_group(hid_t f, const char *path, const char *group, const BqParamTable *t,
                              const float *block) {
    char name[BQ_NAME_MAX + 32];
    for (int i = 0; i < t->n; i++) {
        snprintf(name, sizeof name, "/%s/%s", group, t->p[i].name);
        int st = h5_write_f32(f, path, name, block + t->p[i].offset, t->p[i].ndim, t->p[i].shape);
        if (st) return st;
    }
    return BQ_OK;
}

static const char *const VOCAB_FILES[] = {"vocab.txt", "tokenizer_config.json", "special_tokens_map.json",
                                          "tokenizer.json"};

/* DIR may be replaced only when it is absent, a checkpoint (model.h5), or holds nothing but a training
 * log: never delete a folder of unrelated files. */
static int replaceable(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 1;
    struct dirent *e;
    int ok = 1;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") && strcmp(e->d_name, "training_log.jsonl")) ok = 0;
    closedir(d);
    return ok || bq_ckpt_is_native(dir);
}

int bq_ckpt_save(const BqBert *m, const char *dir, const char *vocab_dir, const BqCkptExtra *extra) {
    char tmp[4096], old[4096], p[PATH_MAX_LEN], q[PATH_MAX_LEN];
    if (!replaceable(dir))
        return bq_err(BQ_EINVAL, "%s: exists and is not a bertqat checkpoint; refusing to replace it", dir);
    for (int i = 0; m->params.released && i < m->params.n; i++)
        if (m->params.released[i])
            return bq_err(BQ_EINVAL, "%s: the model's %s was given to the integer engine; it cannot be saved", dir,
                          m->params.p[i].name);
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    snprintf(old, sizeof old, "%s.old", dir);
    int st, had_ckpt = bq_ckpt_is_native(dir);
    remove_tree(tmp);
    if (mkdir(tmp, 0755) != 0) {
        st = bq_err(BQ_EIO, "%s: cannot create: %s", tmp, strerror(errno));
        goto cleanup;
    }
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL); /* failures are reported through bq_err, not HDF5's stack dump */
    snprintf(p, sizeof p, "%s/config.json", tmp);
    if ((st = config_write(m, p))) goto cleanup;
    for (size_t i = 0; i < sizeof VOCAB_FILES / sizeof *VOCAB_FILES; i++) {
        if (!vocab_dir) break;
        snprintf(q, sizeof q, "%s/%s", vocab_dir, VOCAB_FILES[i]);
        if (!bq_is_file(q)) {
            if (i == 0) {
                st = bq_err(BQ_EIO, "%s: missing (the vocabulary is copied into every checkpoint)", q);
                goto cleanup;
            }
            continue;
        }
        snprintf(p, sizeof p, "%s/%s", tmp, VOCAB_FILES[i]);
        if ((st = bq_copy_file(q, p))) goto cleanup;
    }
    snprintf(p, sizeof p, "%s/model.h5", tmp);
    if ((st = write_model_h5(m, p))) goto cleanup;
    if (extra && (st = extra->write(extra->user, tmp))) goto cleanup;
    /* The trainer's log lives in DIR; carry it into the new directory. */
    snprintf(q, sizeof q, "%s/training_log.jsonl", dir);
    if (bq_is_file(q)) {
        snprintf(p, sizeof p, "%s/training_log.jsonl", tmp);
        if ((st = bq_copy_file(q, p))) goto cleanup;
    }
    if ((st = bq_fsync_path(tmp))) goto cleanup;
    remove_tree(old); /* leftover of an interrupted save on a filesystem that cannot swap folders */
    const char *leftover;
    if ((st = bq_replace_dir(tmp, dir, old, &leftover))) goto cleanup;
    if (leftover) remove_tree(leftover);
    return BQ_OK;
cleanup:
    remove_tree(tmp);
    return bq_err_ctx(st, "%s: not saved (%s)", dir,
                      had_ckpt ? "the checkpoint there is unchanged" : "nothing written");
}

/* ---- load ---- */

/* The model's word embeddings (parameter 0, shape (vocab, H)) served from the file by rows
 * (BqCkptLoadHook.word_rows): *done = 1 when attached, 0 when the layout asks for a whole read. */
static int word_rows_attach(hid_t f, const char *path, const char *name, const BqParam *p, BqBert *m, int64_t rows,
                            int *done) {
    *done = 0;
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    if (ds < 0) return bq_err(BQ_EFORMAT, "%s: cannot open dataset %s", path, name);
    hid_t sp = H5Dget_space(ds);
    hsize_t dims[2] = {0, 0};
    int st = BQ_OK;
    if (H5Sget_simple_extent_ndims(sp) != 2 || H5Sget_simple_extent_dims(sp, dims, NULL) < 0 ||
        (int64_t)dims[0] != p->shape[0] || (int64_t)dims[1] != p->shape[1])
        goto cleanup; /* the whole read gives the message */
    BqH5Rows *r = NULL;
    if ((st = bq_h5rows_open(&r, ds, path, name, p->shape[0], p->shape[1])) || !r) goto cleanup;
    bq_bert_word_rows_attach(m, bq_h5rows_read, bq_h5rows_close, r, rows);
    *done = 1;
cleanup:
    H5Sclose(sp);
    H5Dclose(ds);
    return st;
}

/* Reads GROUP/<name> of every parameter of t, in table order, into block; with a hook (the model's own
 * parameters only), tells it after each tensor, and serves the word embeddings by rows where it asks. */
static int read_params_group(hid_t f, const char *path, const char *group, const BqParamTable *t, float *block,
                             const BqCkptLoadHook *hook, BqBert *m) {
    char name[BQ_NAME_MAX + 32];
    for (int i = 0; i < t->n; i++) {
        snprintf(name, sizeof name, "/%s/%s", group, t->p[i].name);
        if (!h5_group_exists(f, name)) return bq_err(BQ_EFORMAT, "%s: dataset %s is missing", path, name);
        int st = BQ_OK, done = 0;
        if (i == 0 && hook && hook->word_rows > 0 && m && t == &m->params)
            st = word_rows_attach(f, path, name, &t->p[0], m, hook->word_rows, &done);
        if (!st && !done) st = h5_read_f32(f, path, name, block + t->p[i].offset, t->p[i].ndim, t->p[i].shape);
        if (!st && hook) st = hook->param_read(hook->user, m, i);
        if (st) return st;
    }
    return BQ_OK;
}

/* ---- HDF5 access for files added through BqCkptExtra ---- */

int bq_ckpt_h5_write_params(int64_t f, const char *file, const char *group, const BqParamTable *t,
                            const float *block) {
    return write_params_group((hid_t)f, file, group, t, block);
}

int bq_ckpt_h5_read_params(int64_t f, const char *file, const char *group, const BqParamTable *t, float *block) {
    return read_params_group((hid_t)f, file, group, t, block, NULL, NULL);
}

int bq_ckpt_h5_attr_write(int64_t f, const char *file, const char *name, int64_t type, const void *v, int64_t n) {
    return h5_attr_write((hid_t)f, file, name, (hid_t)type, v, (hsize_t)n);
}

int bq_ckpt_h5_attr_read(int64_t f, const char *file, const char *name, int64_t type, void *v, int64_t n) {
    return h5_attr_read((hid_t)f, file, name, (hid_t)type, v, (hsize_t)n);
}

int bq_ckpt_h5_exists(int64_t f, const char *path) { return h5_group_exists((hid_t)f, path); }

/* The "bertqat" block of config.json: the quantizer table (unless the caller attached one) and the
 * data record (unless the caller set one, as a resuming trainer has). */
static int bertqat_from_config(BqBert *m, const char *dir) {
    char p[PATH_MAX_LEN];
    snprintf(p, sizeof p, "%s/config.json", dir);
    json_error_t e;
    json_t *j = json_load_file(p, 0, &e);
    if (!j) return bq_err(BQ_EFORMAT, "%s: line %d: %s", p, e.line, e.text);
    int st = BQ_OK;
    json_t *data = json_object_get(json_object_get(j, "bertqat"), "data");
    if (data && m->data.max_seq_len == 0) st = data_meta_from_json(&m->data, data, p);
    json_t *q = json_object_get(json_object_get(j, "bertqat"), "quant");
    if (q && !st && !m->quant) {
        BqQuantConfig qc;
        bq_quant_config_default(&qc);
        if ((st = bq_quant_config_from_json(&qc, q))) bq_err_ctx(st, "%s", p);
        else st = bq_quant_create(&m->quant, m, &qc);
    }
    json_decref(j);
    return st;
}

int bq_ckpt_load(BqBert *m, const char *dir) { return bq_ckpt_load_with(m, dir, NULL); }

int bq_ckpt_load_with(BqBert *m, const char *dir, const BqCkptLoadHook *hook) {
    char p[PATH_MAX_LEN];
    int st = BQ_OK;
    if (!m->params.data) {
        BqBertConfig cfg;
        memset(&cfg, 0, sizeof cfg);
        snprintf(p, sizeof p, "%s/config.json", dir);
        if ((st = bq_config_load(&cfg, p))) return st;
        /* no initialisation: every parameter is read below, and a page is resident once it is */
        if ((st = bq_bert_create(m, &cfg, 0, NULL))) return st;
    }
    snprintf(p, sizeof p, "%s/model.h5", dir);
    H5E_auto2_t fn;
    void *data;
    H5Eget_auto2(H5E_DEFAULT, &fn, &data);
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(p, H5F_ACC_RDONLY, H5P_DEFAULT);
    if (f < 0) {
        H5Eset_auto2(H5E_DEFAULT, fn, data);
        return bq_err(BQ_EIO, "%s: cannot open (not an HDF5 file?)", p);
    }
    int64_t fv = 0;
    st = h5_attr_read(f, p, "format_version", H5T_NATIVE_INT64, &fv, 1);
    if (!st && fv != BQ_CKPT_FORMAT_VERSION)
        st = bq_err(BQ_EFORMAT, "%s: format version %lld, this build reads %d", p, (long long)fv,
                    BQ_CKPT_FORMAT_VERSION);
    /* Quantized checkpoint: build the quantizer table from config.json's bertqat.quant block (unless
     * the caller attached one), then the ranges from /quant; before the parameters, so that a hook
     * sees the quantizers. */
    if (!st) st = bertqat_from_config(m, dir);
    if (!st && m->quant && h5_group_exists(f, "/quant")) st = bq_quant_load_hdf5(m->quant, (int64_t)f, p);
    if (!st) st = read_params_group(f, p, "params", &m->params, m->params.data, hook, m);
    H5Fclose(f);
    /* HDF5 keeps the blocks it frees on free lists of its own; a quantized checkpoint's many small objects
     * leave 1.6 MiB there (BERT-base), memory malloc can give to what the run allocates next */
    H5garbage_collect();
    H5Eset_auto2(H5E_DEFAULT, fn, data);
    return st;
}

int bq_model_load_any(BqBert *m, const char *dir, int num_labels, BqRng *rng, char **report) {
    if (bq_ckpt_is_native(dir)) {
        if (report) *report = NULL;
        int st = bq_ckpt_load(m, dir);
        if (!st && num_labels > 0 && num_labels != m->cfg.num_labels)
            st = bq_err(BQ_EINVAL, "%s: checkpoint has %d labels, the data has %d", dir, m->cfg.num_labels,
                        num_labels);
        return st;
    }
    return bq_hf_load(m, dir, num_labels, rng, report);
}
