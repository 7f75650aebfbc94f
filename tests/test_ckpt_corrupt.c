/* Checkpoint integrity (export/ckpt.c, layers/h5sum.c): a tiny quantized model is saved, then
 * model.h5 is corrupted 150 times (one byte, or a run of 2 to 16 bytes, changed in the stored data of
 * a random tensor; every third trial anywhere in the file) and loaded again. A corruption inside a
 * tensor's data must be a BQ_EFORMAT error naming model.h5, the tensor and the checksum; anywhere else
 * the load must fail with a one-line error naming model.h5 or give parameters, quantizer ranges and
 * observer states (the moving-average min/max QAT resumes from) bit-identical to the saved ones. Never
 * different values without an error. Also checked: every tensor carries the Fletcher-32 filter, and a
 * checkpoint written without it (contiguous datasets, as before the filter) still loads bit for bit.
 * Prints the max difference of the loads that succeeded. */
#include <hdf5.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "export/ckpt.h"
#include "export/h5sum.h"
#include "layers/quant.h"

#ifndef TRIALS
#define TRIALS 150
#endif

static int fails = 0;
#define EXPECT(c, ...)                                    \
    do {                                                  \
        if (!(c)) {                                       \
            fprintf(stderr, "FAIL line %d: ", __LINE__);  \
            fprintf(stderr, __VA_ARGS__);                 \
            fprintf(stderr, "\n");                        \
            fails++;                                      \
        }                                                 \
    } while (0)

static void tiny_config(BqBertConfig *c) {
    memset(c, 0, sizeof *c);
    c->vocab_size = 40, c->hidden_size = 16, c->num_hidden_layers = 2, c->num_attention_heads = 2;
    c->intermediate_size = 24, c->max_position_embeddings = 32, c->type_vocab_size = 2;
    c->pad_token_id = 0, c->layer_norm_eps = 1e-12f, c->hidden_dropout_prob = 0.1f;
    c->attention_probs_dropout_prob = 0.1f, c->classifier_dropout = -1, c->initializer_range = 0.02f;
    c->num_labels = 2;
}

/* One stored tensor: its dataset path and the byte range of its data in model.h5. */
typedef struct Region {
    char name[256];
    int64_t off, len;
} Region;

typedef struct Regions {
    Region *r;
    int n, cap;
    int unfiltered; /* datasets without the Fletcher-32 filter */
} Regions;

/* Records the stored bytes of dataset NAME: the chunks of a chunked dataset, or the contiguous
 * block of one written without chunks. */
static void add_region(Regions *rs, hid_t f, const char *name) {
    hid_t ds = H5Dopen2(f, name, H5P_DEFAULT);
    BQ_CHECK(ds >= 0);
    hid_t dcpl = H5Dget_create_plist(ds);
    unsigned flags = 0, cd[4];
    size_t ncd = 4;
    int filtered = 0;
    for (int i = 0; i < H5Pget_nfilters(dcpl); i++)
        filtered |= H5Pget_filter2(dcpl, (unsigned)i, &flags, &ncd, cd, 0, NULL, NULL) == H5Z_FILTER_FLETCHER32;
    rs->unfiltered += !filtered;
    hsize_t nchunks = 0;
    int chunked = H5Pget_layout(dcpl) == H5D_CHUNKED;
    hid_t space = H5Dget_space(ds); /* HDF5 1.10 rejects H5S_ALL in the chunk queries */
    if (chunked) BQ_CHECK(H5Dget_num_chunks(ds, space, &nchunks) >= 0);
    for (hsize_t k = 0; k < (chunked ? nchunks : 1); k++) {
        if (rs->n == rs->cap) {
            rs->cap = rs->cap ? 2 * rs->cap : 64;
            rs->r = bq_realloc(rs->r, (size_t)rs->cap * sizeof(Region));
        }
        Region *r = &rs->r[rs->n++];
        snprintf(r->name, sizeof r->name, "%s", name);
        if (chunked) {
            hsize_t coord[H5S_MAX_RANK], size = 0;
            haddr_t addr = 0;
            unsigned mask = 0;
            BQ_CHECK(H5Dget_chunk_info(ds, space, k, coord, &mask, &addr, &size) >= 0);
            r->off = (int64_t)addr, r->len = (int64_t)size;
        } else {
            r->off = (int64_t)H5Dget_offset(ds), r->len = (int64_t)H5Dget_storage_size(ds);
        }
        BQ_CHECK(r->len > 0);
    }
    H5Sclose(space);
    H5Pclose(dcpl);
    H5Dclose(ds);
}

static unsigned char *slurp(const char *path, int64_t *n) {
    FILE *f = fopen(path, "rb");
    BQ_CHECK(f != NULL);
    fseek(f, 0, SEEK_END);
    *n = ftell(f);
    fseek(f, 0, SEEK_SET);
    unsigned char *b = bq_malloc((size_t)*n);
    BQ_CHECK(fread(b, 1, (size_t)*n, f) == (size_t)*n);
    fclose(f);
    return b;
}

static void spit(const char *path, const unsigned char *b, int64_t n) {
    FILE *f = fopen(path, "wb");
    BQ_CHECK(f != NULL && fwrite(b, 1, (size_t)n, f) == (size_t)n && fclose(f) == 0);
}

/* Counts x and y as different when their bits differ; a NaN counts as infinitely far. */
static void compare(float x, float y, int64_t *ndiff, double *maxdiff) {
    if (!memcmp(&x, &y, sizeof x)) return;
    double d = x == x && y == y ? fabs((double)x - (double)y) : INFINITY;
    (*ndiff)++;
    if (d > *maxdiff) *maxdiff = d;
}

/* Loads DIR into a fresh model. Returns the status; on success *maxdiff is the largest |difference|
 * from the reference and *ndiff the number of values whose bits differ, over every parameter and every
 * quantizer's amax, scale and observer min/max (per channel for weights). */
static int load_compare(const char *dir, const BqBert *ref, int64_t *ndiff, double *maxdiff) {
    BqBert m;
    memset(&m, 0, sizeof m);
    int st = bq_ckpt_load(&m, dir);
    *ndiff = 0;
    *maxdiff = 0;
    if (!st) {
        const BqParamTable *a = &ref->params, *b = &m.params;
        BQ_CHECK(a->n == b->n);
        for (int k = 0; k < a->n; k++)
            for (int64_t i = 0; i < a->p[k].numel; i++)
                compare(a->data[a->p[k].offset + i], b->data[b->p[k].offset + i], ndiff, maxdiff);
        BQ_CHECK(m.quant && m.quant->n == ref->quant->n);
        for (int i = 0; i < ref->quant->n; i++) {
            const BqQuantizer *qa = &ref->quant->q[i], *qb = &m.quant->q[i];
            for (int64_t c = 0; c < qa->nch; c++) {
                compare(qa->amax[c], qb->amax[c], ndiff, maxdiff);
                compare(qa->scale[c], qb->scale[c], ndiff, maxdiff);
                if (qa->is_weight) {
                    compare(qa->ch_min[c], qb->ch_min[c], ndiff, maxdiff);
                    compare(qa->ch_max[c], qb->ch_max[c], ndiff, maxdiff);
                }
            }
            if (!qa->is_weight) {
                compare(qa->run_min, qb->run_min, ndiff, maxdiff);
                compare(qa->run_max, qb->run_max, ndiff, maxdiff);
            }
        }
    }
    if (m.quant) bq_quant_free(m.quant);
    m.quant = NULL;
    bq_bert_free(&m);
    return st;
}

/* Rewrites DIR/model.h5 as checkpoints were written before the checksum: the same tensors and
 * attributes in contiguous datasets without any filter. */
static void write_unfiltered(const char *path, const BqBert *m) {
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    BQ_CHECK(f >= 0);
    hsize_t one = 1;
    int64_t fv = BQ_CKPT_FORMAT_VERSION;
    hid_t sp1 = H5Screate_simple(1, &one, NULL);
    hid_t a = H5Acreate2(f, "format_version", H5T_NATIVE_INT64, sp1, H5P_DEFAULT, H5P_DEFAULT);
    BQ_CHECK(a >= 0 && H5Awrite(a, H5T_NATIVE_INT64, &fv) >= 0);
    H5Aclose(a);
    H5Sclose(sp1);
    hid_t lcpl = H5Pcreate(H5P_LINK_CREATE);
    H5Pset_create_intermediate_group(lcpl, 1);
    char name[512];
    for (int k = 0; k < m->params.n; k++) {
        const BqParam *p = &m->params.p[k];
        hsize_t dims[2] = {(hsize_t)p->shape[0], (hsize_t)p->shape[1]};
        snprintf(name, sizeof name, "/params/%s", p->name);
        hid_t sp = H5Screate_simple(p->ndim, dims, NULL);
        hid_t ds = H5Dcreate2(f, name, H5T_IEEE_F32LE, sp, lcpl, H5P_DEFAULT, H5P_DEFAULT);
        BQ_CHECK(ds >= 0 &&
                 H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, m->params.data + p->offset) >= 0);
        H5Dclose(ds);
        H5Sclose(sp);
    }
    H5Pclose(lcpl);
    BQ_CHECK(H5Fclose(f) >= 0);
}

int main(void) {
    char root[] = "/tmp/bq_test_ckpt_corrupt_XXXXXX";
    BQ_CHECK(mkdtemp(root));
    char dir[256], h5[300], cmd[300];
    snprintf(dir, sizeof dir, "%s/ckpt", root);
    snprintf(h5, sizeof h5, "%s/model.h5", dir);

    BqBertConfig cfg;
    tiny_config(&cfg);
    BqRng rng;
    bq_rng_seed(&rng, 11);
    BqBert m;
    memset(&m, 0, sizeof m);
    BQ_CHECK(bq_bert_create(&m, &cfg, 1, &rng) == BQ_OK);
    BqQuantConfig qc;
    bq_quant_config_default(&qc);
    BQ_CHECK(bq_quant_create(&m.quant, &m, &qc) == BQ_OK);
    /* observer states inside ±amax, so that they differ from a fresh table's zeros and from the ±amax a
     * load without observer datasets restarts from (their own generator: the trials below draw from rng) */
    BqRng orng;
    bq_rng_seed(&orng, 12);
    for (int i = 0; i < m.quant->n; i++) {
        BqQuantizer *q = &m.quant->q[i];
        for (int64_t c = 0; c < q->nch; c++) {
            q->amax[c] = 0.3f + 0.7f * (float)bq_rng_uniform(&rng);
            if (q->is_weight) {
                q->ch_min[c] = -q->amax[c] * (0.25f + 0.5f * (float)bq_rng_uniform(&orng));
                q->ch_max[c] = q->amax[c] * (0.25f + 0.5f * (float)bq_rng_uniform(&orng));
            }
        }
        if (!q->is_weight) {
            q->run_min = -q->amax[0] * (0.25f + 0.5f * (float)bq_rng_uniform(&orng));
            q->run_max = q->amax[0] * (0.25f + 0.5f * (float)bq_rng_uniform(&orng));
        }
        q->initialized = 1;
        bq_quant_update_scale(m.quant, q);
    }
    int st = bq_ckpt_save(&m, dir, NULL, NULL);
    BQ_CHECK(st == BQ_OK);

    /* every tensor of /params and /quant is chunked with the Fletcher-32 filter */
    Regions rs = {0};
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);
    hid_t f = H5Fopen(h5, H5F_ACC_RDONLY, H5P_DEFAULT);
    BQ_CHECK(f >= 0);
    char name[512];
    for (int k = 0; k < m.params.n; k++) {
        snprintf(name, sizeof name, "/params/%s", m.params.p[k].name);
        add_region(&rs, f, name);
    }
    static const char *const QDS[] = {"amax", "scale", "observer_min", "observer_max"};
    for (int i = 0; i < m.quant->n; i++)
        for (int j = 0; j < 4; j++) {
            snprintf(name, sizeof name, "/quant/%s/%s", m.quant->q[i].name, QDS[j]);
            add_region(&rs, f, name);
        }
    H5Fclose(f);
    EXPECT(rs.unfiltered == 0, "%d of %d tensors are stored without the Fletcher-32 checksum", rs.unfiltered, rs.n);

    int64_t nbytes = 0;
    unsigned char *orig = slurp(h5, &nbytes), *buf = bq_malloc((size_t)nbytes);
    int64_t ndiff = 0;
    double maxdiff = 0, worst = 0;
    st = load_compare(dir, &m, &ndiff, &maxdiff);
    EXPECT(st == BQ_OK && ndiff == 0, "intact checkpoint: status %d (%s), %lld values differ", st, bq_errmsg(),
           (long long)ndiff);

    int errors = 0, identical = 0, silent = 0;
    char example[512] = "";
    for (int t = 0; t < TRIALS; t++) {
        memcpy(buf, orig, (size_t)nbytes);
        int anywhere = t % 3 == 2;
        int64_t len = bq_rng_below(&rng, 2) ? 1 : 2 + (int64_t)bq_rng_below(&rng, 15);
        const Region *r = anywhere ? NULL : &rs.r[bq_rng_below(&rng, (uint64_t)rs.n)];
        int64_t lo = r ? r->off : 0, span = r ? r->len : nbytes;
        if (len > span) len = span;
        int64_t at = lo + (int64_t)bq_rng_below(&rng, (uint64_t)(span - len + 1));
        for (int64_t i = 0; i < len; i++) buf[at + i] ^= (unsigned char)(1 + bq_rng_below(&rng, 255));
        spit(h5, buf, nbytes);
        bq_err_clear();
        st = load_compare(dir, &m, &ndiff, &maxdiff);
        const char *msg = bq_errmsg();
        if (st) {
            errors++;
            EXPECT(strstr(msg, "model.h5") && !strchr(msg, '\n'),
                   "trial %d (%lld bytes at %lld): the error does not name model.h5 on one line: %s", t,
                   (long long)len, (long long)at, msg);
            if (r) {
                char want[300];
                snprintf(want, sizeof want, "tensor %s: checksum mismatch (file corrupt)", r->name);
                EXPECT(st == BQ_EFORMAT && strstr(msg, want), "trial %d (%lld bytes at %lld in %s): got \"%s\"", t,
                       (long long)len, (long long)at, r->name, msg);
                if (!example[0]) snprintf(example, sizeof example, "%s", msg);
            }
        } else if (ndiff == 0) {
            identical++;
            EXPECT(!r, "trial %d: %lld bytes changed at %lld inside %s load without an error", t, (long long)len,
                   (long long)at, r ? r->name : "");
        } else {
            silent++;
            if (maxdiff > worst) worst = maxdiff;
            EXPECT(0, "trial %d: %lld bytes changed at %lld (%s) load without an error and change %lld values "
                   "(max difference %g)", t, (long long)len, (long long)at, r ? r->name : "outside the data",
                   (long long)ndiff, maxdiff);
        }
    }
    printf("  %d corruptions: %d clean errors, %d bit-identical loads, %d silently different loads\n", TRIALS, errors,
           identical, silent);
    printf("  e.g. %s\n", example);

    /* a tensor over HDF5's 4 GiB chunk limit is split along its leading dimension (no data needed) */
    hsize_t big[2] = {400000, 4096}, chunk[2] = {0, 0};
    hid_t dcpl = bq_h5sum_dcpl(2, big);
    int nd = H5Pget_chunk(dcpl, 2, chunk);
    unsigned long long cbytes = chunk[0] * chunk[1] * sizeof(float);
    EXPECT(nd == 2 && chunk[1] == 4096 && chunk[0] > 0 && cbytes <= 0xffffffffull && 2 * cbytes > 0xffffffffull,
           "chunk of a (400000, 4096) tensor: (%llu, %llu)", (unsigned long long)chunk[0],
           (unsigned long long)chunk[1]);
    H5Pclose(dcpl);

    /* a checkpoint written before the checksum (contiguous datasets, no filter; here without /quant)
     * still loads its parameters bit for bit */
    write_unfiltered(h5, &m);
    BqBert mo;
    memset(&mo, 0, sizeof mo);
    tiny_config(&cfg);
    bq_rng_seed(&rng, 99);
    BQ_CHECK(bq_bert_create(&mo, &cfg, 1, &rng) == BQ_OK);
    st = bq_ckpt_load(&mo, dir);
    EXPECT(st == BQ_OK, "checkpoint without checksums: %s", bq_errmsg());
    int64_t od = 0;
    for (int k = 0; !st && k < m.params.n; k++)
        od += memcmp(m.params.data + m.params.p[k].offset, mo.params.data + mo.params.p[k].offset,
                     sizeof(float) * (size_t)m.params.p[k].numel) != 0;
    EXPECT(od == 0, "checkpoint without checksums: %lld tensors differ", (long long)od);
    if (mo.quant) bq_quant_free(mo.quant);
    mo.quant = NULL;
    bq_bert_free(&mo);

    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", root);
    free(orig);
    free(buf);
    free(rs.r);
    bq_quant_free(m.quant);
    m.quant = NULL;
    bq_bert_free(&m);
    printf("test_ckpt_corrupt: max difference of a successful load %g (0 required), %s\n", worst,
           fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
