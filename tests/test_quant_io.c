/* Quantizer ranges in HDF5 (export/quant_io.c bq_quant_save_hdf5 / bq_quant_load_hdf5): a round trip
 * restores amax, scale, observer state, frozen/initialized bit for bit (ort and cpu schemes); loading
 * into a table built with a different granularity (per-tensor vs per-channel), with a quantizer
 * missing or with other weight bits (7-bit cpu weights into an 8-bit table) is a format error naming
 * the quantizer; quant config JSON round trip, weight_bits checked against the scheme. */
#include <hdf5.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "export/quant_io.h"
#include "layers/bert.h"
#include "layers/quant.h"

/* fills qs with distinct ranges and observer state */
static void fill(BqQuantState *qs) {
    for (int i = 0; i < qs->n; i++) {
        BqQuantizer *q = &qs->q[i];
        for (int64_t k = 0; k < q->nch; k++) q->amax[k] = 0.5f + (float)i + 0.25f * (float)k;
        q->initialized = 1;
        q->frozen = i % 2;
        q->run_min = -1.0f * (float)i;
        q->run_max = 2.0f * (float)i;
        for (int64_t k = 0; q->is_weight && k < q->nch; k++) q->ch_min[k] = -0.1f * (float)k, q->ch_max[k] = 0.3f * (float)k;
        bq_quant_update_scale(qs, q);
    }
}

/* save qs, load into a fresh table of the same config, compare; returns mismatches */
static int round_trip(BqBert *m, BqQuantState *qs, const char *path) {
    BqQuantState *q2 = NULL;
    if (bq_quant_create(&q2, m, &qs->cfg)) return 1;
    hid_t f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    if (f < 0 || bq_quant_save_hdf5(qs, f, path)) {
        printf("FAIL save: %s\n", bq_errmsg());
        return 1;
    }
    H5Fclose(f);
    m->quant = q2;
    f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    int bad = 0;
    if (bq_quant_load_hdf5(m->quant, f, path)) {
        printf("FAIL load (%s): %s\n", bq_scheme_name(qs->cfg.scheme), bq_errmsg());
        bad++;
    }
    H5Fclose(f);
    for (int i = 0; i < qs->n && !bad; i++) {
        BqQuantizer *a = &qs->q[i], *b = &q2->q[i];
        for (int64_t k = 0; k < a->nch; k++) {
            bad += a->amax[k] != b->amax[k] || a->scale[k] != b->scale[k];
            if (a->is_weight) bad += a->ch_min[k] != b->ch_min[k] || a->ch_max[k] != b->ch_max[k];
        }
        bad += a->frozen != b->frozen || a->initialized != b->initialized || a->bits != b->bits;
        if (!a->is_weight) bad += a->run_min != b->run_min || a->run_max != b->run_max;
    }
    if (bad) printf("FAIL round trip (%s): %d mismatches\n", bq_scheme_name(qs->cfg.scheme), bad);
    m->quant = NULL;
    bq_quant_free(q2);
    return bad;
}

int main(void) {
    int bad = 0;
    BqBert m;
    memset(&m, 0, sizeof m);
    m.cfg.num_hidden_layers = 2;
    m.cfg.hidden_size = 8;
    m.cfg.intermediate_size = 6;
    BqQuantConfig c;
    bq_quant_config_default(&c);
    BqQuantState *qs = NULL, *q3 = NULL;
    char path[64];
    snprintf(path, sizeof path, "/tmp/bq_test_quant_io_%d.h5", (int)getpid());
    H5Eset_auto2(H5E_DEFAULT, NULL, NULL);

    /* cpu scheme (7-bit weights): round trip, then its file into an ort-shaped table must fail */
    BqQuantConfig cc = c;
    cc.scheme = BQ_SCHEME_CPU;
    if (bq_quant_create(&q3, &m, &cc)) return 1;
    fill(q3);
    bad += round_trip(&m, q3, path);
    bq_quant_free(q3);
    q3 = NULL;

    if (bq_quant_create(&qs, &m, &c)) return 1;
    fill(qs);
    bad += round_trip(&m, qs, path); /* leaves the ort file at path */
    hid_t f;
    int st;

    BqQuantConfig c3 = c;
    c3.per_tensor_weights = 1;
    bq_quant_create(&q3, &m, &c3);
    m.quant = q3;
    f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    st = bq_quant_load_hdf5(m.quant, f, path);
    H5Fclose(f);
    if (st != BQ_EFORMAT || !strstr(bq_errmsg(), "weight_quantizer")) {
        printf("FAIL per-tensor table accepted per-channel ranges: %d %s\n", st, bq_errmsg());
        bad++;
    }
    bq_quant_free(q3);
    /* qdqbert table: its quantizers are missing from an ort file */
    c3.scheme = BQ_SCHEME_QDQBERT;
    c3.per_tensor_weights = 0;
    bq_quant_create(&q3, &m, &c3);
    m.quant = q3;
    f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    st = bq_quant_load_hdf5(m.quant, f, path);
    H5Fclose(f);
    if (st != BQ_EFORMAT || !strstr(bq_errmsg(), "missing")) {
        printf("FAIL missing quantizer not reported: %d %s\n", st, bq_errmsg());
        bad++;
    }
    /* a 7-bit weight range loaded into an 8-bit table (a hand-edited config): error naming bits */
    BqQuantState *q4 = NULL, *q5 = NULL;
    bq_quant_create(&q4, &m, &cc);
    bq_quant_create(&q5, &m, &cc);
    fill(q4);
    f = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    bq_quant_save_hdf5(q4, f, path);
    H5Fclose(f);
    for (int i = 0; i < q5->n; i++) q5->q[i].bits = 8;
    m.quant = q5;
    f = H5Fopen(path, H5F_ACC_RDONLY, H5P_DEFAULT);
    st = bq_quant_load_hdf5(m.quant, f, path);
    H5Fclose(f);
    if (st != BQ_EFORMAT || !strstr(bq_errmsg(), "7 bits")) {
        printf("FAIL bits mismatch not reported: %d %s\n", st, bq_errmsg());
        bad++;
    }
    m.quant = NULL;
    bq_quant_free(q4);
    bq_quant_free(q5);
    unlink(path);

    /* config JSON round trip */
    BqQuantConfig cj, back;
    bq_quant_config_default(&cj);
    cj.scheme = BQ_SCHEME_QDQBERT;
    cj.fuse_qkv = 1;
    cj.per_tensor_weights = 1;
    cj.clip_gelu = 10.0f;
    cj.freeze_after = 123;
    strcpy(cj.exclude, "classifier,pooler,encoder.layer.0");
    json_t *j = bq_quant_config_to_json(&cj);
    if (bq_quant_config_from_json(&back, j) || memcmp(&cj, &back, sizeof cj) != 0) {
        printf("FAIL config JSON round trip: %s\n", bq_errmsg());
        bad++;
    }
    if (json_integer_value(json_object_get(j, "weight_bits")) != 8) {
        printf("FAIL weight_bits of qdqbert\n");
        bad++;
    }
    json_object_set_new(j, "weight_bits", json_integer(7)); /* qdqbert with 7-bit weights: inconsistent */
    if (bq_quant_config_from_json(&back, j) != BQ_EFORMAT || !strstr(bq_errmsg(), "weight_bits")) {
        printf("FAIL weight_bits 7 accepted for qdqbert: %s\n", bq_errmsg());
        bad++;
    }
    json_object_del(j, "weight_bits");
    cj.scheme = BQ_SCHEME_CPU;
    json_t *jc = bq_quant_config_to_json(&cj);
    if (json_integer_value(json_object_get(jc, "weight_bits")) != 7 || bq_quant_config_from_json(&back, jc) ||
        back.scheme != BQ_SCHEME_CPU) {
        printf("FAIL cpu config JSON: %s\n", bq_errmsg());
        bad++;
    }
    json_decref(jc);
    json_object_set_new(j, "scheme", json_integer(3));
    if (bq_quant_config_from_json(&back, j) != BQ_EFORMAT || !strstr(bq_errmsg(), "scheme")) {
        printf("FAIL bad scheme type accepted\n");
        bad++;
    }
    json_decref(j);
    bq_quant_free(qs);
    bq_quant_free(q3);
    printf("test_quant_io: %d failures (max error 0)\n", bad);
    return bad ? 1 : 0;
}
