/* Hugging Face BERT directory loading and safetensors export with BertForSequenceClassification
 * names. Reference: transformers modeling_utils.py (_load_pretrained_model: the "bert." base-model
 * prefix is added or removed to match, LayerNorm gamma/beta renamed to weight/bias, unexpected keys of
 * the pre-training heads "cls.*" are reported and dropped, missing head parameters stay newly
 * initialised) and models/bert/modeling_bert.py (_keys_to_ignore_on_load_unexpected: position_ids). */
#include "export/hf_load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "export/safetensors.h"
#include "export/tf_h5.h"

static void shape_str(char *b, size_t n, int ndim, const int64_t *shape) {
    size_t k = (size_t)snprintf(b, n, "[");
    for (int i = 0; i < ndim && k < n; i++)
        k += (size_t)snprintf(b + k, n - k, "%s%lld", i ? ", " : "", (long long)shape[i]);
    if (k < n) snprintf(b + k, n - k, "]");
}

/* Growing string for the report. */
typedef struct Str {
    char *s;
    size_t n, cap;
} Str;

static void str_add(Str *s, const char *t) {
    size_t l = strlen(t);
    if (s->n + l + 1 > s->cap) {
        s->cap = (s->n + l + 1) * 2;
        s->s = bq_realloc(s->s, s->cap);
    }
    memcpy(s->s + s->n, t, l + 1);
    s->n += l;
}

/* Buffers ignored on load (not parameters). */
static int ignored_name(const char *name) {
    size_t l = strlen(name);
    return l >= 12 && strcmp(name + l - 12, "position_ids") == 0;
}

/* Pre-training heads of BertForPreTraining / BertForMaskedLM: not part of this model, dropped. */
static int unused_head(const char *name) {
    return strncmp(name, "cls.", 4) == 0 || strncmp(name, "bert.cls.", 9) == 0;
}

static int is_head(const char *pname) {
    return strncmp(pname, "bert.pooler.", 12) == 0 || strncmp(pname, "classifier.", 11) == 0 ||
           strncmp(pname, "qa_outputs.", 11) == 0;
}

/* Parameter index for a checkpoint name: with or without "bert.", legacy LayerNorm gamma/beta. */
static int param_index(const BqParamTable *t, const char *name) {
    int i = bq_params_find(t, name);
    if (i >= 0) return i;
    char buf[BQ_NAME_MAX + 16];
    size_t l = strlen(name);
    if (l + 2 >= sizeof buf) return -1;
    if (l > 6 && strcmp(name + l - 6, ".gamma") == 0) {
        snprintf(buf, sizeof buf, "%.*s.weight", (int)(l - 6), name);
        return bq_params_find(t, buf);
    }
    if (l > 5 && strcmp(name + l - 5, ".beta") == 0) {
        snprintf(buf, sizeof buf, "%.*s.bias", (int)(l - 5), name);
        return bq_params_find(t, buf);
    }
    return -1;
}


/* After loading: every parameter not loaded must be a head parameter; builds the report. */
static int finish(const BqBert *m, const char *path, const unsigned char *loaded, Str *unused, char **report) {
    const BqParamTable *t = &m->params;
    Str r = {0};
    for (int i = 0; i < t->n; i++) {
        if (loaded[i]) continue;
        if (!is_head(t->p[i].name)) {
            char a[64];
            shape_str(a, sizeof a, t->p[i].ndim, t->p[i].shape);
            free(r.s);
            return bq_err(BQ_EFORMAT, "%s: missing tensor \"%s\" (expected shape %s)", path, t->p[i].name, a);
        }
        str_add(&r, r.n ? ", "
                        : m->cfg.head == BQ_HEAD_QA
                              ? "Some weights of BertForQuestionAnswering were not initialized from the "
                                "checkpoint and are newly initialized: "
                              : "Some weights of BertForSequenceClassification were not initialized from the "
                                "checkpoint and are newly initialized: ");
        str_add(&r, t->p[i].name);
    }
    if (unused->n) {
        if (r.n) str_add(&r, "\n");
        str_add(&r, "Unused weights of the checkpoint (heads of other tasks): ");
        str_add(&r, unused->s);
    }
    if (report) *report = r.s;
    else free(r.s);
    return BQ_OK;
}

static int claim(const BqBert *m, const char *path, const char *name, int idx, unsigned char *loaded, int ndim,
                 const int64_t *shape) {
    const BqParam *p = &m->params.p[idx];
    if (loaded[idx]) return bq_err(BQ_EFORMAT, "%s: tensor \"%s\" stored twice (as \"%s\")", path, p->name, name);
    int ok = ndim == p->ndim;
    for (int d = 0; ok && d < ndim; d++) ok = shape[d] == p->shape[d];
    if (!ok) {
        char a[64], b[64];
        shape_str(a, sizeof a, p->ndim, p->shape);
        shape_str(b, sizeof b, ndim, shape);
        return bq_err(BQ_EFORMAT, "%s: tensor \"%s\": expected shape %s, found %s", path, name, a, b);
    }
    loaded[idx] = 1;
    return BQ_OK;
}

/* One tensor of a checkpoint as the loader sees it: its PyTorch state-dict name, the name the file stores
 * it under (the same in safetensors; the TF2 weight name in tf_model.h5), its shape, and whether the file
 * marks it as a pre-training head of its own (tf_model.h5's mlm / nsp). */
typedef struct Entry {
    const char *pt, *stored;
    int ndim;
    const int64_t *shape;
    int pretraining;
} Entry;

static Entry entry_at(const BqSt *st, const BqTfModel *tf, int i) {
    if (st) return (Entry){st->t[i].name, st->t[i].name, st->t[i].ndim, st->t[i].shape, 0};
    const BqTfTensor *t = &tf->t[i];
    const int pre = strncmp(t->pt_name, "mlm.", 4) == 0 || strncmp(t->pt_name, "nsp.", 4) == 0;
    return (Entry){t->pt_name, t->tf_name, t->ndim, t->shape, pre};
}

/* Loads every tensor of one checkpoint, a safetensors file (st) or a TF2 HDF5 file (tf; the other one
 * NULL), into m's parameters as HF's loader does: buffers it ignores are passed over, the heads of
 * other tasks are listed in the report as unused, any other tensor the model lacks is an error, and so
 * is a parameter stored twice or with another shape; then finish checks what is missing. */
static int load_tensors(BqBert *m, const char *path, const BqSt *st, const BqTfModel *tf, char **report) {
    unsigned char *loaded = bq_calloc((size_t)m->params.n, 1);
    Str unused = {0};
    const int n = st ? st->n : tf->n;
    int rc = BQ_OK;
    for (int i = 0; i < n && !rc; i++) {
        const Entry t = entry_at(st, tf, i);
        if (ignored_name(t.pt)) continue;
        const int head = t.pretraining || unused_head(t.pt);
        const int idx = head ? -1 : param_index(&m->params, t.pt);
        if (idx < 0 && (head || is_head(t.pt))) { /* as HF drops them, this task's other head included */
            if (unused.n) str_add(&unused, ", ");
            str_add(&unused, t.stored);
            continue;
        }
        if (idx < 0) {
            char b[64];
            shape_str(b, sizeof b, t.ndim, t.shape);
            rc = st ? bq_err(BQ_EFORMAT,
                             "%s: unknown tensor \"%s\" (shape %s) is not a BertForSequenceClassification parameter",
                             path, t.stored, b)
                    : bq_err(BQ_EFORMAT,
                             "%s: unknown weight \"%s\" (as \"%s\") is not a BertForSequenceClassification parameter",
                             path, t.stored, t.pt);
            break;
        }
        if ((rc = claim(m, path, t.stored, idx, loaded, t.ndim, t.shape))) break;
        const BqParam *p = &m->params.p[idx];
        if (st) rc = bq_st_read_f32(st, t.pt, m->params.data + p->offset, p->ndim, p->shape);
        else memcpy(m->params.data + p->offset, tf->t[i].data, sizeof(float) * (size_t)p->numel);
    }
    if (!rc) rc = finish(m, path, loaded, &unused, report);
    free(unused.s);
    free(loaded);
    return rc;
}

static int load_safetensors(BqBert *m, const char *path, char **report) {
    BqSt *st = NULL;
    int rc = bq_st_open(&st, path);
    if (rc) return rc;
    rc = load_tensors(m, path, st, NULL, report);
    bq_st_close(st);
    return rc;
}

static int load_tf(BqBert *m, const char *path, char **report) {
    BqTfModel tf;
    int rc = bq_tf_h5_read(&tf, path);
    if (rc) return rc;
    rc = load_tensors(m, path, NULL, &tf, report);
    bq_tf_h5_free(&tf);
    return rc;
}

int bq_hf_load_weights(BqBert *m, const char *path, char **report) {
    if (report) *report = NULL;
    size_t l = strlen(path);
    if (l >= 3 && strcmp(path + l - 3, ".h5") == 0) return load_tf(m, path, report);
    return load_safetensors(m, path, report);
}

int bq_hf_load(BqBert *m, const char *dir, int num_labels, BqRng *rng, char **report) {
    if (report) *report = NULL;
    memset(m, 0, sizeof *m);
    char p[4096], w[4096];
    BqBertConfig cfg;
    snprintf(p, sizeof p, "%s/config.json", dir);
    int rc = bq_config_load(&cfg, p);
    if (rc) return rc;
    if (num_labels > 0 && num_labels != cfg.num_labels) {
        bq_config_free(&cfg);
        cfg.num_labels = num_labels;
        cfg.id2label = bq_calloc((size_t)num_labels, sizeof(char *));
        for (int i = 0; i < num_labels; i++) {
            char b[32];
            snprintf(b, sizeof b, "LABEL_%d", i);
            cfg.id2label[i] = bq_strdup(b);
        }
    }
    snprintf(w, sizeof w, "%s/model.safetensors", dir);
    if (!bq_is_file(w)) {
        snprintf(w, sizeof w, "%s/tf_model.h5", dir);
        if (!bq_is_file(w)) {
            snprintf(w, sizeof w, "%s/pytorch_model.bin", dir);
            rc = bq_is_file(w)
                     ? bq_err(BQ_EFORMAT,
                              "%s: only pytorch_model.bin (pickle) is present; convert it to model.safetensors "
                              "(e.g. transformers: model.save_pretrained(dir, safe_serialization=True))",
                              dir)
                     : bq_err(BQ_EIO, "%s: no model.safetensors or tf_model.h5", dir);
            bq_config_free(&cfg);
            return rc;
        }
    }
    if ((rc = bq_bert_create(m, &cfg, 0, rng))) { /* create took cfg's allocations and freed them */
        memset(m, 0, sizeof *m);
        return rc;
    }
    rc = bq_hf_load_weights(m, w, report);
    if (rc) {
        bq_bert_free(m);
        memset(m, 0, sizeof *m);
    }
    return rc;
}

int bq_hf_save_safetensors(const BqBert *m, const char *path) {
    const BqParamTable *t = &m->params;
    const char **names = bq_malloc(sizeof(char *) * (size_t)t->n);
    const float **data = bq_malloc(sizeof(float *) * (size_t)t->n);
    const int64_t **shapes = bq_malloc(sizeof(int64_t *) * (size_t)t->n);
    int *ndims = bq_malloc(sizeof(int) * (size_t)t->n);
    for (int i = 0; i < t->n; i++) {
        names[i] = t->p[i].name;
        data[i] = t->data + t->p[i].offset;
        shapes[i] = t->p[i].shape;
        ndims[i] = t->p[i].ndim;
    }
    json_t *meta = json_pack("{s:s}", "format", "pt");
    int rc = bq_st_write(path, names, data, ndims, shapes, t->n, meta);
    json_decref(meta);
    free(names), free(data), free(shapes), free(ndims);
    return rc;
}
