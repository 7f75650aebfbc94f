/* Persistence of the quantizer state (export/quant_io.h): config JSON, /quant ranges in model.h5 and
 * the /lsq optimizer state in training_state.h5, each tensor checksummed (export/h5sum.h). */
#include "export/quant_io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <hdf5.h>
#include <jansson.h>

#include "autograd/bq.h"
#include "export/h5sum.h"

/* ---- config <-> the checkpoint's config.json "bertqat" block ---- */

json_t *bq_quant_config_to_json(const BqQuantConfig *cfg) {
    json_t *j = json_object();
    json_object_set_new(j, "scheme", json_string(bq_scheme_name(cfg->scheme)));
    json_object_set_new(j, "bits", json_integer(8));
    json_object_set_new(j, "weight_bits", json_integer(bq_quant_scheme_weight_bits(cfg->scheme)));
    json_object_set_new(j, "symmetric", json_true());
    json_object_set_new(j, "per_tensor_weights", json_boolean(cfg->per_tensor_weights));
    json_object_set_new(j, "fuse_qkv", json_boolean(cfg->fuse_qkv));
    /* floats through "%.7g" so the JSON shows 0.01, not 0.009999999776 */
    char buf[32];
    snprintf(buf, sizeof buf, "%.7g", cfg->clip_gelu);
    json_object_set_new(j, "clip_gelu", json_real(strtod(buf, NULL)));
    snprintf(buf, sizeof buf, "%.7g", cfg->averaging_constant);
    json_object_set_new(j, "averaging_constant", json_real(strtod(buf, NULL)));
    json_object_set_new(j, "exclude", json_string(cfg->exclude));
    json_object_set_new(j, "freeze_after", json_integer(cfg->freeze_after));
    if (cfg->learn_ranges) { /* only then, so other checkpoints' config.json stay as they were */
        json_object_set_new(j, "ranges", json_string("learn"));
        snprintf(buf, sizeof buf, "%.7g", cfg->range_lr);
        json_object_set_new(j, "range_lr", json_real(strtod(buf, NULL)));
    }
    return j;
}

static int json_get_str(json_t *j, const char *key, char *dst, size_t cap) {
    json_t *v = json_object_get(j, key);
    if (!v) return BQ_OK;
    if (!json_is_string(v)) return bq_err(BQ_EFORMAT, "quant config: \"%s\" is not a string", key);
    if (strlen(json_string_value(v)) >= cap) return bq_err(BQ_EFORMAT, "quant config: \"%s\" is too long", key);
    strcpy(dst, json_string_value(v));
    return BQ_OK;
}

static int json_get_num(json_t *j, const char *key, double *dst) {
    json_t *v = json_object_get(j, key);
    if (!v) return BQ_OK;
    if (json_is_boolean(v)) *dst = json_is_true(v);
    else if (json_is_number(v)) *dst = json_number_value(v);
    else return bq_err(BQ_EFORMAT, "quant config: \"%s\" is not a number", key);
    return BQ_OK;
}

int bq_quant_config_from_json(BqQuantConfig *cfg, json_t *j) {
    bq_quant_config_default(cfg);
    if (!json_is_object(j)) return bq_err(BQ_EFORMAT, "quant config: not a JSON object");
    double pt = cfg->per_tensor_weights, fq = cfg->fuse_qkv, cg = cfg->clip_gelu, ac = cfg->averaging_constant;
    double fa = (double)cfg->freeze_after, bits = 8, wbits = -1, rlr = 0.0;
    int rc;
    char scheme[16], ranges[16] = "";
    snprintf(scheme, sizeof scheme, "%s", bq_scheme_name(cfg->scheme));
    if ((rc = json_get_str(j, "scheme", scheme, sizeof scheme)) ||
        (rc = json_get_str(j, "exclude", cfg->exclude, sizeof cfg->exclude)) ||
        (rc = json_get_num(j, "per_tensor_weights", &pt)) || (rc = json_get_num(j, "fuse_qkv", &fq)) ||
        (rc = json_get_num(j, "clip_gelu", &cg)) || (rc = json_get_num(j, "averaging_constant", &ac)) ||
        (rc = json_get_num(j, "freeze_after", &fa)) || (rc = json_get_num(j, "bits", &bits)) ||
        (rc = json_get_num(j, "weight_bits", &wbits)) || (rc = json_get_str(j, "ranges", ranges, sizeof ranges)) ||
        (rc = json_get_num(j, "range_lr", &rlr)))
        return rc;
    if (ranges[0] && strcmp(ranges, "learn"))
        return bq_err(BQ_EFORMAT, "quant config: ranges \"%s\" is not \"learn\"", ranges);
    if (ranges[0] && !(rlr > 0.0 && rlr <= 1.0))
        return bq_err(BQ_EFORMAT, "quant config: range_lr %g is not in (0, 1]", rlr);
    cfg->learn_ranges = ranges[0] != 0;
    cfg->range_lr = cfg->learn_ranges ? rlr : 0.0;
    if (bits != 8) return bq_err(BQ_EFORMAT, "quant config: bits %g is not supported (int8 only)", bits);
    if (bq_scheme_parse(&cfg->scheme, scheme, "quant config: scheme")) return BQ_EFORMAT;
    if (wbits != -1 && wbits != bq_quant_scheme_weight_bits(cfg->scheme))
        return bq_err(BQ_EFORMAT, "quant config: weight_bits %g, but scheme %s quantizes weights to %d bits", wbits,
                      bq_scheme_name(cfg->scheme), bq_quant_scheme_weight_bits(cfg->scheme));
    if (!(ac > 0.0 && ac <= 1.0)) return bq_err(BQ_EFORMAT, "quant config: averaging_constant %g not in (0,1]", ac);
    cfg->per_tensor_weights = pt != 0.0;
    cfg->fuse_qkv = fq != 0.0;
    cfg->clip_gelu = (float)cg;
    cfg->averaging_constant = (float)ac;
    cfg->freeze_after = (int64_t)fa;
    return BQ_OK;
}

/* ---- ranges in model.h5: /quant/<name>/{amax, scale, observer_min, observer_max} + attributes ---- */

_Static_assert(sizeof(hid_t) == sizeof(int64_t), "hid_t is passed as int64_t");

/* One checksummed float vector ds_name of n values in group g; group is the group's path as the messages
 * show it ("/quant/<quantizer>", "/lsq"). */
static int h5_write_vec(hid_t g, const char *path, const char *group, const char *ds_name, const float *v,
                        int64_t n) {
    hsize_t dim = (hsize_t)n;
    char shown[256];
    snprintf(shown, sizeof shown, "%s/%s", group, ds_name);
    /* chunked, Fletcher-32: corrupt ranges fail the read */
    return bq_h5sum_write_f32(g, path, ds_name, shown, H5P_DEFAULT, 1, &dim, v);
}

static int h5_read_vec(hid_t g, const char *path, const char *group, const char *ds_name, float *v, int64_t n) {
    if (H5Lexists(g, ds_name, H5P_DEFAULT) <= 0)
        return bq_err(BQ_EFORMAT, "%s: %s/%s is missing", path, group, ds_name);
    hid_t ds = H5Dopen2(g, ds_name, H5P_DEFAULT);
    if (ds < 0) return bq_err(BQ_EFORMAT, "%s: cannot open %s/%s", path, group, ds_name);
    hid_t sp = H5Dget_space(ds);
    int st = BQ_OK;
    hsize_t dim = 0;
    if (H5Sget_simple_extent_ndims(sp) != 1 || H5Sget_simple_extent_dims(sp, &dim, NULL) < 0 || (int64_t)dim != n)
        st = bq_err(BQ_EFORMAT, "%s: %s/%s has %lld values, expected %lld", path, group, ds_name,
                    (long long)dim, (long long)n);
    else {
        char tensor[256];
        snprintf(tensor, sizeof tensor, "%s/%s", group, ds_name);
        st = bq_h5sum_read_f32(ds, path, tensor, v);
    }
    H5Sclose(sp);
    H5Dclose(ds);
    return st;
}

/* A scalar int64 attribute `name` of the group of quantizer qname ("" for /quant itself). */
static int h5_attr_i64(hid_t g, const char *path, const char *qname, const char *name, int64_t v) {
    char of[sizeof ((BqQuantizer *)0)->name + 16];
    snprintf(of, sizeof of, " of /quant/%s", qname);
    return bq_h5_attr_write(g, path, name, of, H5T_STD_I64LE, H5T_NATIVE_INT64, &v, 0, 0);
}

/* A scalar string attribute `name` of the group of quantizer qname ("" for /quant itself). */
static int h5_attr_str(hid_t g, const char *path, const char *qname, const char *name, const char *v) {
    char of[sizeof ((BqQuantizer *)0)->name + 16];
    snprintf(of, sizeof of, " of /quant/%s", qname);
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(v) + 1);
    int st = bq_h5_attr_write(g, path, name, of, t, t, v, 0, 0);
    H5Tclose(t);
    return st;
}

static int h5_attr_get_i64(hid_t g, const char *name, int64_t *v) {
    if (H5Aexists(g, name) <= 0) return -1;
    hid_t a = H5Aopen(g, name, H5P_DEFAULT);
    if (a < 0) return -1;
    int rc = H5Aread(a, H5T_NATIVE_INT64, v) < 0 ? -1 : 0;
    H5Aclose(a);
    return rc;
}

int bq_quant_save_hdf5(const BqQuantState *qs, int64_t file_id, const char *path) {
    hid_t f = (hid_t)file_id;
    int st = BQ_OK;
    hid_t root = H5Gcreate2(f, "/quant", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (root < 0) return bq_err(BQ_EIO, "%s: cannot create group /quant%s", path, bq_h5_io_reason());
    if ((st = h5_attr_str(root, path, "", "scheme", bq_scheme_name(qs->cfg.scheme)))) goto cleanup;
    for (int i = 0; i < qs->n && !st; i++) {
        const BqQuantizer *q = &qs->q[i];
        hid_t g = H5Gcreate2(root, q->name, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
        if (g < 0) {
            st = bq_err(BQ_EIO, "%s: cannot create group /quant/%s%s", path, q->name, bq_h5_io_reason());
            break;
        }
        float omin = q->run_min, omax = q->run_max;
        char qpath[sizeof q->name + 8];
        snprintf(qpath, sizeof qpath, "/quant/%s", q->name);
        st = h5_write_vec(g, path, qpath, "amax", q->amax, q->nch);
        if (!st) st = h5_write_vec(g, path, qpath, "scale", q->scale, q->nch);
        if (!st) st = h5_write_vec(g, path, qpath, "observer_min", q->is_weight ? q->ch_min : &omin, q->is_weight ? q->nch : 1);
        if (!st) st = h5_write_vec(g, path, qpath, "observer_max", q->is_weight ? q->ch_max : &omax, q->is_weight ? q->nch : 1);
        if (!st) st = h5_attr_i64(g, path, q->name, "axis", q->axis);
        if (!st) st = h5_attr_i64(g, path, q->name, "bits", q->bits);
        if (!st) st = h5_attr_i64(g, path, q->name, "frozen", q->frozen);
        if (!st) st = h5_attr_i64(g, path, q->name, "initialized", q->initialized);
        if (!st) st = h5_attr_str(g, path, q->name, "scheme", bq_scheme_name(qs->cfg.scheme));
        H5Gclose(g);
    }
cleanup:
    H5Gclose(root);
    return st;
}

int bq_quant_load_hdf5(BqQuantState *qs, int64_t file_id, const char *path) {
    hid_t f = (hid_t)file_id;
    if (!qs) return bq_err(BQ_EFORMAT, "%s: quantizer ranges without a quantization config", path);
    if (H5Lexists(f, "/quant", H5P_DEFAULT) <= 0) return bq_err(BQ_EFORMAT, "%s: group /quant is missing", path);
    hid_t root = H5Gopen2(f, "/quant", H5P_DEFAULT);
    if (root < 0) return bq_err(BQ_EFORMAT, "%s: cannot open group /quant", path);
    int st = BQ_OK;
    for (int i = 0; i < qs->n && !st; i++) {
        BqQuantizer *q = &qs->q[i];
        if (H5Lexists(root, q->name, H5P_DEFAULT) <= 0) {
            st = bq_err(BQ_EFORMAT, "%s: /quant/%s is missing (scheme %s)", path, q->name, bq_scheme_name(qs->cfg.scheme));
            break;
        }
        hid_t g = H5Gopen2(root, q->name, H5P_DEFAULT);
        int64_t axis = -2, bits = 8, frozen = 1, init = 1;
        if (h5_attr_get_i64(g, "axis", &axis) || axis != q->axis)
            st = bq_err(BQ_EFORMAT, "%s: /quant/%s: axis %lld, the config expects %d", path, q->name, (long long)axis,
                        q->axis);
        else if (h5_attr_get_i64(g, "bits", &bits) == 0 && bits != q->bits)
            st = bq_err(BQ_EFORMAT, "%s: /quant/%s: %lld bits, the scheme %s expects %d", path, q->name, (long long)bits,
                        bq_scheme_name(qs->cfg.scheme), q->bits);
        char qpath[sizeof q->name + 8];
        snprintf(qpath, sizeof qpath, "/quant/%s", q->name);
        if (!st) st = h5_read_vec(g, path, qpath, "amax", q->amax, q->nch);
        if (!st) st = h5_read_vec(g, path, qpath, "scale", q->scale, q->nch);
        if (!st && H5Lexists(g, "observer_min", H5P_DEFAULT) > 0) {
            float omin = 0, omax = 0;
            st = h5_read_vec(g, path, qpath, "observer_min", q->is_weight ? q->ch_min : &omin, q->is_weight ? q->nch : 1);
            if (!st) st = h5_read_vec(g, path, qpath, "observer_max", q->is_weight ? q->ch_max : &omax, q->is_weight ? q->nch : 1);
            if (!q->is_weight) q->run_min = omin, q->run_max = omax;
        } else if (!st) { /* ranges only: the observer restarts from ±amax */
            q->run_min = -q->amax[0], q->run_max = q->amax[0];
            for (int64_t k = 0; q->is_weight && k < q->nch; k++) q->ch_min[k] = -q->amax[k], q->ch_max[k] = q->amax[k];
        }
        h5_attr_get_i64(g, "frozen", &frozen);
        h5_attr_get_i64(g, "initialized", &init);
        q->frozen = frozen != 0;
        q->initialized = init != 0;
        for (int64_t k = 0; !st && k < q->nch; k++)
            if (!(q->amax[k] >= 0.0f) || !(q->scale[k] > 0.0f) || !isfinite(q->amax[k]))
                st = bq_err(BQ_EFORMAT, "%s: /quant/%s: invalid range (amax %g, scale %g)", path, q->name, q->amax[k],
                            q->scale[k]);
        H5Gclose(g);
    }
    H5Gclose(root);
    return st;
}

int bq_quant_learn_save_hdf5(const BqQuantState *qs, int64_t file_id, const char *path, int with_best) {
    if (!qs || !qs->lsq) return BQ_OK;
    hid_t g = H5Gcreate2((hid_t)file_id, "/lsq", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    if (g < 0) return bq_err(BQ_EIO, "%s: cannot create group /lsq%s", path, bq_h5_io_reason());
    int st = h5_write_vec(g, path, "/lsq", "m", qs->lsq_m, qs->nscales);
    if (!st) st = h5_write_vec(g, path, "/lsq", "v", qs->lsq_v, qs->nscales);
    if (!st && with_best) st = h5_write_vec(g, path, "/lsq", "best", qs->lsq_best, qs->nscales);
    H5Gclose(g);
    return st;
}

int bq_quant_learn_load_hdf5(BqQuantState *qs, int64_t file_id, const char *path, int *has_best) {
    hid_t f = (hid_t)file_id;
    *has_best = 0;
    int in_file = H5Lexists(f, "/lsq", H5P_DEFAULT) > 0;
    int learning = qs && qs->lsq;
    if (!in_file && !learning) return BQ_OK;
    if (in_file != learning)
        return bq_err(BQ_EFORMAT, "%s: %s; resume with the --ranges of the interrupted run", path,
                      in_file ? "the run learned its ranges (--ranges learn)" : "the run did not learn its ranges, "
                                                                                "--ranges learn asks to");
    hid_t g = H5Gopen2(f, "/lsq", H5P_DEFAULT);
    if (g < 0) return bq_err(BQ_EFORMAT, "%s: cannot open group /lsq", path);
    int st = h5_read_vec(g, path, "/lsq", "m", qs->lsq_m, qs->nscales);
    if (!st) st = h5_read_vec(g, path, "/lsq", "v", qs->lsq_v, qs->nscales);
    if (!st && H5Lexists(g, "best", H5P_DEFAULT) > 0) {
        st = h5_read_vec(g, path, "/lsq", "best", qs->lsq_best, qs->nscales);
        *has_best = !st;
    }
    H5Gclose(g);
    return st;
}
