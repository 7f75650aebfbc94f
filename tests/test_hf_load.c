/* Hugging Face directory loading (export/hf_load.c, export/tf_h5.c):
 *  - the tiny BertForSequenceClassification fixture (tests/fixtures/bert_tiny, written by transformers)
 *    loads completely; every parameter equals the bytes read independently from the file (own
 *    header parse and raw offsets);
 *  - a BertModel-style file made from it (no "bert." prefix, no pooler/classifier, an I64
 *    embeddings.position_ids buffer) loads, and the report lists the newly initialised head;
 *  - errors name the tensor: unknown tensor, missing encoder tensor (expected shape), shape mismatch
 *    (expected and found), num_labels override against a stored classifier; pytorch_model.bin alone
 *    asks for a conversion; a missing directory is BQ_EIO;
 *  - a tf_model.h5 in the Keras/HF TF layout (layer_names / weight_names attributes, kernels [in,out],
 *    LayerNorm gamma/beta, embeddings "weight"/"embeddings", written here with the HDF5 C API) loads to
 *    the same parameters bit for bit; the TF->PyTorch name mapping is checked on its own;
 *  - the real all-MiniLM-L6-v2 directory, when present, loads and a few tensors match raw reads.
 * Prints the max error against the independent reads. */
#include <ctype.h>
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "export/hf_load.h"
#include "export/safetensors.h"
#include "export/tf_h5.h"
#include "tests/test_util.h"

static char root[64];
static double maxerr = 0;

/* Independent read of tensor NAME (F32) from a safetensors file: own header parse, raw offsets.
 * Returns a malloc'ed array and the element count, or NULL. */
static float *raw_read(const char *path, const char *name, int64_t *numel) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char b8[8];
    uint64_t n = 0;
    float *out = NULL;
    if (fread(b8, 1, 8, f) != 8) goto done;
    for (int i = 7; i >= 0; i--) n = (n << 8) | b8[i];
    char *h = malloc(n + 1);
    if (fread(h, 1, n, f) != n) {
        free(h);
        goto done;
    }
    h[n] = 0;
    json_t *j = json_loads(h, 0, NULL);
    free(h);
    json_t *e = json_object_get(j, name);
    if (e && strcmp(json_string_value(json_object_get(e, "dtype")), "F32") == 0) {
        json_int_t b = json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 0));
        json_int_t end = json_integer_value(json_array_get(json_object_get(e, "data_offsets"), 1));
        *numel = (end - b) / 4;
        out = malloc((size_t)(end - b));
        fseek(f, (long)(8 + n + (uint64_t)b), SEEK_SET);
        if (fread(out, 4, (size_t)*numel, f) != (size_t)*numel) free(out), out = NULL;
    }
    json_decref(j);
done:
    fclose(f);
    return out;
}

/* Every parameter of m named in the file (with or without "bert.") equals the raw bytes. */
static void compare_raw(const BqBert *m, const char *file, int strip_prefix, int *checked) {
    for (int i = 0; i < m->params.n; i++) {
        const BqParam *p = &m->params.p[i];
        const char *name = p->name;
        if (strip_prefix && strncmp(name, "bert.", 5) == 0) name += 5;
        int64_t n = 0;
        float *v = raw_read(file, name, &n);
        if (!v) continue;
        EXPECT(n == p->numel, "%s: %lld elements in the file, %lld in the model", name, (long long)n,
               (long long)p->numel);
        if (n == p->numel) {
            for (int64_t k = 0; k < n; k++) maxerr = fmax(maxerr, fabs(v[k] - m->params.data[p->offset + k]));
            EXPECT(memcmp(v, m->params.data + p->offset, sizeof(float) * (size_t)n) == 0, "%s differs from raw read",
                   name);
        }
        (*checked)++;
        free(v);
    }
}

static void mkdir_p(const char *d) { mkdir(d, 0755); }

static void copy_config(const char *src_dir, const char *dst_dir) {
    char a[600], b[600], cmd[1400];
    snprintf(a, sizeof a, "%s/config.json", src_dir);
    snprintf(b, sizeof b, "%s/config.json", dst_dir);
    snprintf(cmd, sizeof cmd, "cp '%s' '%s'", a, b);
    BQ_CHECK(system(cmd) == 0);
}

/* Writes m's parameters to DIR/model.safetensors with name transforms: drop "bert." when strip,
 * skip names containing skip_sub (NULL: none), rename one tensor, and optionally one shape change. */
static void write_variant(const BqBert *m, const char *dir, int strip, const char *skip1, const char *skip2,
                          const char *extra_name, const char *bad_shape_name) {
    const BqParamTable *t = &m->params;
    int n = 0;
    const char **names = calloc((size_t)t->n + 1, sizeof(char *));
    const float **data = calloc((size_t)t->n + 1, sizeof(float *));
    const int64_t **shapes = calloc((size_t)t->n + 1, sizeof(int64_t *));
    int *ndims = calloc((size_t)t->n + 1, sizeof(int));
    static int64_t flat[1];
    for (int i = 0; i < t->n; i++) {
        const char *nm = t->p[i].name;
        if ((skip1 && strstr(nm, skip1)) || (skip2 && strstr(nm, skip2))) continue;
        if (strip && strncmp(nm, "bert.", 5) == 0) nm += 5;
        names[n] = nm;
        data[n] = t->data + t->p[i].offset;
        shapes[n] = t->p[i].shape;
        ndims[n] = t->p[i].ndim;
        if (bad_shape_name && strcmp(t->p[i].name, bad_shape_name) == 0) {
            flat[0] = t->p[i].numel; /* same bytes, wrong shape */
            shapes[n] = flat;
            ndims[n] = 1;
        }
        n++;
    }
    if (extra_name) {
        names[n] = extra_name, data[n] = t->data, shapes[n] = t->p[0].shape, ndims[n] = 1;
        static int64_t one[1] = {1};
        shapes[n] = one;
        n++;
    }
    char p[600];
    snprintf(p, sizeof p, "%s/model.safetensors", dir);
    BQ_CHECK(bq_st_write(p, names, data, ndims, shapes, n, NULL) == BQ_OK);
    free(names), free(data), free(shapes), free(ndims);
}

/* Appends an I64 position_ids tensor to a safetensors file by rewriting it (header + data). */
static void add_position_ids(const char *path, int n) {
    FILE *f = fopen(path, "rb");
    BQ_CHECK(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)size);
    BQ_CHECK(fread(buf, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | buf[i];
    char *h = malloc(hl + 1);
    memcpy(h, buf + 8, hl);
    h[hl] = 0;
    json_t *j = json_loads(h, 0, NULL);
    BQ_CHECK(j);
    uint64_t dsize = (uint64_t)size - 8 - hl;
    json_object_set_new(j, "embeddings.position_ids",
                        json_pack("{s:s,s:[i,i],s:[I,I]}", "dtype", "I64", "shape", 1, n, "data_offsets",
                                  (json_int_t)dsize, (json_int_t)(dsize + 8 * (uint64_t)n)));
    char *nh = json_dumps(j, JSON_COMPACT);
    uint64_t nl = strlen(nh);
    f = fopen(path, "wb");
    unsigned char l8[8];
    for (int i = 0; i < 8; i++) l8[i] = (unsigned char)(nl >> (8 * i));
    fwrite(l8, 1, 8, f);
    fwrite(nh, 1, nl, f);
    fwrite(buf + 8 + hl, 1, dsize, f);
    for (int64_t i = 0; i < n; i++) fwrite(&i, 8, 1, f);
    fclose(f);
    free(nh), free(h), free(buf);
    json_decref(j);
}

/* Renames tensor FROM to TO in a safetensors file's header (data untouched). */
static void rename_tensor(const char *path, const char *from, const char *to) {
    FILE *f = fopen(path, "rb");
    BQ_CHECK(f);
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *buf = malloc((size_t)size);
    BQ_CHECK(fread(buf, 1, (size_t)size, f) == (size_t)size);
    fclose(f);
    uint64_t hl = 0;
    for (int i = 7; i >= 0; i--) hl = (hl << 8) | buf[i];
    json_t *j = json_loadb((const char *)buf + 8, hl, 0, NULL);
    BQ_CHECK(j && json_object_get(j, from));
    json_object_set(j, to, json_object_get(j, from));
    json_object_del(j, from);
    char *nh = json_dumps(j, JSON_COMPACT);
    uint64_t nl = strlen(nh);
    f = fopen(path, "wb");
    unsigned char l8[8];
    for (int i = 0; i < 8; i++) l8[i] = (unsigned char)(nl >> (8 * i));
    fwrite(l8, 1, 8, f);
    fwrite(nh, 1, nl, f);
    fwrite(buf + 8 + hl, 1, (size_t)size - 8 - hl, f);
    fclose(f);
    free(nh), free(buf);
    json_decref(j);
}

static void expect_load_fails(const char *dir, int num_labels, int status, const char *n1, const char *n2,
                              const char *what) {
    BqBert m;
    BqRng rng;
    bq_rng_seed(&rng, 1);
    char *rep = NULL;
    bq_err_clear();
    int rc = bq_hf_load(&m, dir, num_labels, &rng, &rep);
    EXPECT(rc == status, "%s: status %d, expected %d (%s)", what, rc, status, bq_errmsg());
    EXPECT(n1 == NULL || strstr(bq_errmsg(), n1), "%s: message lacks \"%s\": %s", what, n1, bq_errmsg());
    EXPECT(n2 == NULL || strstr(bq_errmsg(), n2), "%s: message lacks \"%s\": %s", what, n2, bq_errmsg());
    EXPECT(m.params.data == NULL, "%s: model not freed on error", what);
    printf("  %-24s -> %s\n", what, bq_errmsg());
    if (rc == BQ_OK) bq_bert_free(&m);
    free(rep);
}

/* ---- TF h5 fixture (Keras save_weights layout as HF's TFBertForSequenceClassification writes) ---- */

static void h5_str_array_attr(hid_t obj, const char *name, char **v, int n) {
    size_t w = 1;
    for (int i = 0; i < n; i++) w = strlen(v[i]) > w ? strlen(v[i]) : w;
    char *buf = calloc((size_t)n, w);
    for (int i = 0; i < n; i++) memcpy(buf + (size_t)i * w, v[i], strlen(v[i]));
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, w);
    H5Tset_strpad(t, H5T_STR_NULLPAD);
    hsize_t d = (hsize_t)n;
    hid_t sp = H5Screate_simple(1, &d, NULL);
    hid_t a = H5Acreate2(obj, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    BQ_CHECK(a >= 0 && H5Awrite(a, t, buf) >= 0);
    H5Aclose(a), H5Sclose(sp), H5Tclose(t);
    free(buf);
}

/* HF PyTorch name -> TF variable name (the inverse mapping, written out for the fixture). */
static void tf_name_of(const char *pt, char *out, size_t n, int *kernel) {
    const char *model = "tf_bert_for_sequence_classification/";
    char tmp[256];
    snprintf(tmp, sizeof tmp, "%s", pt);
    /* "encoder.layer.N." -> "encoder/layer_._N/" */
    char body[256] = "";
    size_t k = 0;
    for (char *tok = strtok(tmp, "."); tok; tok = strtok(NULL, ".")) {
        if (k && strcmp(tok, "weight") && strcmp(tok, "bias") && isdigit((unsigned char)tok[0])) {
            k += (size_t)snprintf(body + k, sizeof body - k, "_._%s", tok);
            continue;
        }
        k += (size_t)snprintf(body + k, sizeof body - k, "%s%s", k ? "/" : "", tok);
    }
    *kernel = 0;
    size_t bl = strlen(body);
    int is_ln = strstr(body, "LayerNorm") != NULL;
    int is_emb = strstr(body, "_embeddings/weight") != NULL;
    if (bl > 7 && strcmp(body + bl - 7, "/weight") == 0) {
        body[bl - 7] = 0;
        const char *leaf;
        if (is_ln) leaf = "gamma";
        else if (is_emb) leaf = strstr(body, "word_embeddings") ? "weight" : "embeddings";
        else leaf = "kernel", *kernel = 1;
        snprintf(out, n, "%s%s/%s:0", model, body, leaf);
    } else if (bl > 5 && strcmp(body + bl - 5, "/bias") == 0) {
        body[bl - 5] = 0;
        snprintf(out, n, "%s%s/%s:0", model, body, is_ln ? "beta" : "bias");
    } else {
        snprintf(out, n, "%s%s:0", model, body);
    }
}

static void write_tf_h5(const BqBert *m, const char *path) {
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    BQ_CHECK(f >= 0);
    char *layers[] = {"bert", "dropout_37", "classifier"};
    h5_str_array_attr(f, "layer_names", layers, 3);
    char *bk[] = {"tensorflow"}, *kv[] = {"2.15.0"};
    h5_str_array_attr(f, "backend", bk, 1);
    h5_str_array_attr(f, "keras_version", kv, 1);
    for (int li = 0; li < 3; li++) {
        hid_t g = H5Gcreate2(f, layers[li], H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        char **wn = calloc((size_t)m->params.n, sizeof(char *));
        int nw = 0;
        hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
        H5Pset_create_intermediate_group(lcpl, 1);
        for (int i = 0; i < m->params.n; i++) {
            const BqParam *p = &m->params.p[i];
            int is_cls = strncmp(p->name, "classifier.", 11) == 0;
            if ((li == 2) != is_cls || li == 1) continue;
            char tfn[300];
            int kernel;
            tf_name_of(p->name, tfn, sizeof tfn, &kernel);
            wn[nw++] = strdup(tfn);
            hsize_t d[2];
            const float *src = m->params.data + p->offset;
            float *buf = malloc(sizeof(float) * (size_t)p->numel);
            if (kernel) { /* PyTorch [out, in] -> TF [in, out] */
                d[0] = (hsize_t)p->shape[1], d[1] = (hsize_t)p->shape[0];
                for (int64_t o = 0; o < p->shape[0]; o++)
                    for (int64_t in = 0; in < p->shape[1]; in++) buf[in * p->shape[0] + o] = src[o * p->shape[1] + in];
            } else {
                d[0] = (hsize_t)p->shape[0], d[1] = (hsize_t)p->shape[1];
                memcpy(buf, src, sizeof(float) * (size_t)p->numel);
            }
            hid_t sp = H5Screate_simple(p->ndim, d, NULL);
            hid_t ds = H5Dcreate2(g, tfn, H5T_IEEE_F32LE, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
            BQ_CHECK(ds >= 0 && H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf) >= 0);
            H5Dclose(ds), H5Sclose(sp);
            free(buf);
        }
        H5Pclose(lcpl);
        if (nw || li == 1) h5_str_array_attr(g, "weight_names", wn, nw);
        for (int i = 0; i < nw; i++) free(wn[i]);
        free(wn);
        H5Gclose(g);
    }
    H5Fclose(f);
}

int main(void) {
    bq_test_tmpdir(root, sizeof root, "hfl");
    const char *src = getenv("BQ_SOURCE_DIR");
    if (!src) src = BQ_SOURCE_DIR;
    char tiny[600], file[700], d[700];
    snprintf(tiny, sizeof tiny, "%s/tests/fixtures/bert_tiny", src);
    snprintf(file, sizeof file, "%s/model.safetensors", tiny);
    int checked = 0;

    /* name mapping */
    struct {
        const char *tf, *pt;
        int tr;
    } map[] = {
        {"tf_bert_for_sequence_classification/bert/encoder/layer_._11/attention/self/query/kernel:0",
         "bert.encoder.layer.11.attention.self.query.weight", 1},
        {"tf_bert_model/bert/embeddings/LayerNorm/gamma:0", "bert.embeddings.LayerNorm.weight", 0},
        {"tf_bert_model/bert/embeddings/LayerNorm/beta:0", "bert.embeddings.LayerNorm.bias", 0},
        {"tf_bert_model/bert/embeddings/position_embeddings/embeddings:0", "bert.embeddings.position_embeddings.weight", 0},
        {"tf_bert_model/bert/embeddings/word_embeddings/weight:0", "bert.embeddings.word_embeddings.weight", 0},
        {"tf_bert_for_sequence_classification/classifier/bias:0", "classifier.bias", 0},
        {"tf_bert_for_pre_training/mlm___cls/predictions/bias:0", "cls.predictions.bias", 0},
    };
    for (size_t i = 0; i < sizeof map / sizeof *map; i++) {
        int tr = -1;
        char *pt = bq_tf_name_to_pt(map[i].tf, &tr);
        EXPECT(strcmp(pt, map[i].pt) == 0 && tr == map[i].tr, "TF name %s -> %s (transpose %d), expected %s", map[i].tf,
               pt, tr, map[i].pt);
        free(pt);
    }

    /* 1. the tiny BertForSequenceClassification fixture */
    BqBert m;
    BqRng rng;
    bq_rng_seed(&rng, 1);
    char *rep = NULL;
    int rc = bq_hf_load(&m, tiny, 0, &rng, &rep);
    EXPECT(rc == BQ_OK, "tiny load: %s", bq_errmsg());
    if (rc) {
        printf("test_hf_load: cannot continue without the tiny fixture, %d fails\n", fails);
        return 1;
    }
    EXPECT(rep == NULL, "tiny: nothing should be newly initialised: %s", rep ? rep : "");
    free(rep);
    EXPECT(m.cfg.num_labels == 3 && strcmp(m.cfg.id2label[2], "pos") == 0, "tiny labels");
    compare_raw(&m, file, 0, &checked);
    EXPECT(checked == m.params.n, "compared %d of %d parameters", checked, m.params.n);

    /* 2. BertModel-style file: no prefix, no pooler/classifier, position_ids buffer */
    snprintf(d, sizeof d, "%s/base", root);
    mkdir_p(d);
    copy_config(tiny, d);
    write_variant(&m, d, 1, "pooler", "classifier", NULL, NULL);
    char f2[800];
    snprintf(f2, sizeof f2, "%s/model.safetensors", d);
    add_position_ids(f2, 64);
    BqBert b;
    rc = bq_hf_load(&b, d, 0, &rng, &rep);
    EXPECT(rc == BQ_OK, "base-style load: %s", bq_errmsg());
    if (!rc) {
        EXPECT(rep && strstr(rep, "newly initialized") && strstr(rep, "bert.pooler.dense.weight") &&
                   strstr(rep, "classifier.bias"),
               "report: %s", rep ? rep : "(none)");
        printf("  report: %s\n", rep ? rep : "");
        int c2 = 0;
        compare_raw(&b, f2, 1, &c2);
        EXPECT(c2 == m.params.n - 4, "base-style: compared %d parameters, expected %d", c2, m.params.n - 4);
        /* the head keeps the fresh HF init: LayerNorm-free head, biases zero */
        int bi = bq_params_find(&b.params, "classifier.bias");
        EXPECT(bi >= 0 && b.params.data[b.params.p[bi].offset] == 0.0f, "classifier.bias not zero-initialised");
        bq_bert_free(&b);
    }
    free(rep);
    rep = NULL;
    /* num_labels override on a base model: new head of 5 labels */
    rc = bq_hf_load(&b, d, 5, &rng, &rep);
    EXPECT(rc == BQ_OK && b.cfg.num_labels == 5 && b.params.p[bq_params_find(&b.params, "classifier.weight")].shape[0] == 5,
           "num_labels 5 on a base model: %s", bq_errmsg());
    if (!rc) bq_bert_free(&b);
    free(rep);

    /* pre-training heads (cls.*) are dropped and listed, as HF's "unused weights" warning */
    snprintf(d, sizeof d, "%s/pretrain", root);
    mkdir_p(d);
    copy_config(tiny, d);
    write_variant(&m, d, 0, NULL, NULL, "cls.predictions.bias", NULL);
    rc = bq_hf_load(&b, d, 0, &rng, &rep);
    EXPECT(rc == BQ_OK && rep && strstr(rep, "Unused") && strstr(rep, "cls.predictions.bias"), "cls.* head: %s / %s",
           bq_errmsg(), rep ? rep : "(no report)");
    if (!rc) bq_bert_free(&b);
    free(rep);
    rep = NULL;

    /* legacy LayerNorm names (gamma/beta) are renamed as HF's _fix_key does */
    snprintf(d, sizeof d, "%s/legacy", root);
    mkdir_p(d);
    copy_config(tiny, d);
    write_variant(&m, d, 1, NULL, NULL, NULL, NULL);
    snprintf(f2, sizeof f2, "%s/model.safetensors", d);
    rename_tensor(f2, "encoder.layer.1.output.LayerNorm.weight", "encoder.layer.1.output.LayerNorm.gamma");
    rename_tensor(f2, "embeddings.LayerNorm.bias", "embeddings.LayerNorm.beta");
    rc = bq_hf_load(&b, d, 0, &rng, &rep);
    EXPECT(rc == BQ_OK && rep == NULL, "legacy gamma/beta: %s", bq_errmsg());
    if (!rc) {
        EXPECT(memcmp(b.params.data, m.params.data, sizeof(float) * (size_t)m.params.total) == 0,
               "legacy gamma/beta: parameters differ");
        bq_bert_free(&b);
    }
    free(rep);
    rep = NULL;

    /* 3. errors */
    expect_load_fails(tiny, 5, BQ_EFORMAT, "classifier.bias", "expected shape [5], found [3]",
                      "num_labels vs classifier");
    snprintf(d, sizeof d, "%s/unknown", root);
    mkdir_p(d);
    copy_config(tiny, d);
    write_variant(&m, d, 0, NULL, NULL, "bert.encoder.layer.9.output.dense.weight", NULL);
    expect_load_fails(d, 0, BQ_EFORMAT, "unknown tensor \"bert.encoder.layer.9.output.dense.weight\"", NULL,
                      "unknown tensor");
    snprintf(d, sizeof d, "%s/missing", root);
    mkdir_p(d);
    copy_config(tiny, d);
    write_variant(&m, d, 1, "layer.1.intermediate.dense.weight", NULL, NULL, NULL);
    expect_load_fails(d, 0, BQ_EFORMAT, "missing tensor \"bert.encoder.layer.1.intermediate.dense.weight\"",
                      "expected shape [37, 32]", "missing encoder tensor");
    snprintf(d, sizeof d, "%s/shape", root);
    mkdir_p(d);
    copy_config(tiny, d);
    write_variant(&m, d, 0, NULL, NULL, NULL, "bert.encoder.layer.0.attention.output.dense.weight");
    expect_load_fails(d, 0, BQ_EFORMAT, "bert.encoder.layer.0.attention.output.dense.weight",
                      "expected shape [32, 32], found [1024]", "shape mismatch");
    snprintf(d, sizeof d, "%s/bin", root);
    mkdir_p(d);
    copy_config(tiny, d);
    snprintf(f2, sizeof f2, "%s/pytorch_model.bin", d);
    FILE *fb = fopen(f2, "wb");
    fputs("PK", fb);
    fclose(fb);
    expect_load_fails(d, 0, BQ_EFORMAT, "pytorch_model.bin", "convert", "pytorch_model.bin only");
    snprintf(d, sizeof d, "%s/nothing", root);
    expect_load_fails(d, 0, BQ_EIO, "config.json", NULL, "missing directory");
    snprintf(d, sizeof d, "%s/corrupt", root);
    mkdir_p(d);
    copy_config(tiny, d);
    snprintf(f2, sizeof f2, "%s/model.safetensors", d);
    fb = fopen(f2, "wb");
    fputs("\xff\xff\xff\xff\xff\xff\xff\x7f{}", fb);
    fclose(fb);
    expect_load_fails(d, 0, BQ_EFORMAT, "model.safetensors", "header length", "corrupt safetensors");

    /* 4. tf_model.h5 in the Keras layout */
    snprintf(d, sizeof d, "%s/tf", root);
    mkdir_p(d);
    copy_config(tiny, d);
    snprintf(f2, sizeof f2, "%s/tf_model.h5", d);
    write_tf_h5(&m, f2);
    rc = bq_hf_load(&b, d, 0, &rng, &rep);
    EXPECT(rc == BQ_OK, "tf_model.h5 load: %s", bq_errmsg());
    if (!rc) {
        EXPECT(rep == NULL, "tf: unexpected report %s", rep ? rep : "");
        EXPECT(b.params.total == m.params.total &&
                   memcmp(b.params.data, m.params.data, sizeof(float) * (size_t)m.params.total) == 0,
               "tf_model.h5 parameters differ from the safetensors ones");
        for (int64_t k = 0; k < m.params.total && b.params.total == m.params.total; k++)
            maxerr = fmax(maxerr, fabs(b.params.data[k] - m.params.data[k]));
        bq_bert_free(&b);
    }
    free(rep);
    rep = NULL;
    fb = fopen(f2, "r+b");
    fseek(fb, 0, SEEK_SET);
    fputs("garbage!", fb);
    fclose(fb);
    expect_load_fails(d, 0, BQ_EFORMAT, "tf_model.h5", NULL, "corrupt tf_model.h5");
    /* 4b. the committed tf_model.h5 fixture written with h5py (tests/make_ckptio_fixtures.py) */
    snprintf(d, sizeof d, "%s/tests/fixtures/ckptio/tf_tiny", src);
    rc = bq_hf_load(&b, d, 0, &rng, &rep);
    EXPECT(rc == BQ_OK, "committed tf_tiny: %s", bq_errmsg());
    if (!rc) {
        EXPECT(rep == NULL, "tf_tiny: unexpected report %s", rep ? rep : "");
        EXPECT(b.params.total == m.params.total &&
                   memcmp(b.params.data, m.params.data, sizeof(float) * (size_t)m.params.total) == 0,
               "tf_tiny parameters differ from bert_tiny/model.safetensors");
        bq_bert_free(&b);
    }
    free(rep);
    rep = NULL;
    bq_bert_free(&m);

    /* 5. the real all-MiniLM-L6-v2 directory, when present */
    char mini[700], mf[800];
    snprintf(mini, sizeof mini, "%s/data/models/all-MiniLM-L6-v2", src);
    snprintf(mf, sizeof mf, "%s/model.safetensors", mini);
    if (access(mf, R_OK) == 0) {
        rc = bq_hf_load(&m, mini, 2, &rng, &rep);
        EXPECT(rc == BQ_OK, "MiniLM: %s", bq_errmsg());
        if (!rc) {
            EXPECT(rep && strstr(rep, "classifier.weight") && !strstr(rep, "pooler"), "MiniLM report: %s",
                   rep ? rep : "(none)");
            const char *some[] = {"embeddings.word_embeddings.weight", "encoder.layer.5.output.LayerNorm.bias",
                                  "encoder.layer.3.attention.self.key.weight", "pooler.dense.bias"};
            for (int i = 0; i < 4; i++) {
                int64_t n = 0;
                float *v = raw_read(mf, some[i], &n);
                int pi = bq_params_find(&m.params, some[i]);
                EXPECT(v && pi >= 0 && n == m.params.p[pi].numel, "MiniLM %s", some[i]);
                if (v && pi >= 0 && n == m.params.p[pi].numel) {
                    for (int64_t k = 0; k < n; k++)
                        maxerr = fmax(maxerr, fabs(v[k] - m.params.data[m.params.p[pi].offset + k]));
                    EXPECT(memcmp(v, m.params.data + m.params.p[pi].offset, 4 * (size_t)n) == 0, "MiniLM %s differs",
                           some[i]);
                    printf("  MiniLM %s[0] = %.8g\n", some[i], v[0]);
                }
                free(v);
            }
            bq_bert_free(&m);
        }
        free(rep);
    } else {
        printf("  MiniLM not present at %s: that part was not run (the fixture parts above were)\n", mini);
    }

    bq_test_rmtree(root);
    printf("test_hf_load: max error %g, %d fails\n", maxerr, fails);
    return fails ? 1 : 0;
}
