/* Fake-quantization hooks, observers and calibration of a QAT/PTQ BERT (layers/quant.h).
 *
 * Convention: symmetric int8, zero point 0, scale = amax/127, q = clamp(rne(x/scale), -128, 127),
 * i.e. ONNX QuantizeLinear with an int8 zero point of 0 (7-bit weights of the cpu scheme: amax/63,
 * [-64, 63]; layers/quant.h says why).
 * Observers follow the QConfig of ONNX Runtime's bert_imdb_finetune_qat example, which uses PyTorch's
 * default_weight_fake_quant for activations (MovingAverageMinMaxObserver, per tensor, symmetric) and
 * default_per_channel_weight_fake_quant for weights (MovingAveragePerChannelMinMaxObserver, axis 0):
 * the first batch sets min/max, later batches move them by c·(batch − running) with c = 0.01, and
 * the observer runs BEFORE the batch is quantized (torch.ao.quantization.FakeQuantize.forward).
 * Differences from PyTorch, on purpose: scale = amax/127 (PyTorch's symmetric qint8 uses amax/127.5)
 * so the range maps onto ONNX's [-127, 127]·scale grid, and we divide by scale where PyTorch
 * multiplies by 1/scale (identical for power-of-two scales). */
#include "layers/quant.h"

#include <float.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <hdf5.h>
#include <jansson.h>

#include "autograd/kernels.h"
#include "autograd/qgemm.h"
#include "layers/calib.h"
#include "layers/h5sum.h"

/* The rows of the point table and the scheme names (docs/design.md §4) live here, with the numerics
 * that read them, so that layers/qscheme.c (placement, which reads the model's configuration) depends
 * on this file and never the reverse. */
const BqQPointDef bq_qpoint_defs[BQ_QP_LAYER_COUNT] = {
#define BQ_QP_DEF_(point, role, is_weight, sole, schemes) [BQ_QP_##point] = {role, is_weight, sole, schemes},
    BQ_QPOINTS(BQ_QP_DEF_)
#undef BQ_QP_DEF_
};

static const char *const scheme_names[BQ_SCHEME_COUNT] = {
    [BQ_SCHEME_ORT] = "ort", [BQ_SCHEME_QDQBERT] = "qdqbert", [BQ_SCHEME_CPU] = "cpu"};

int bq_scheme_parse(BqScheme *out, const char *s, const char *flag_or_key) {
    for (int i = 0; i < BQ_SCHEME_COUNT; i++)
        if (strcmp(s, scheme_names[i]) == 0) {
            *out = (BqScheme)i;
            return BQ_OK;
        }
    return bq_err(BQ_EINVAL, "%s: '%s' is not one of ort, qdqbert, cpu", flag_or_key, s);
}

const char *bq_scheme_name(BqScheme s) {
    BQ_CHECK((unsigned)s < BQ_SCHEME_COUNT);
    return scheme_names[s];
}

int bq_quant_scheme_weight_bits(BqScheme s) { return s == BQ_SCHEME_CPU ? 7 : 8; }

#define BQ_SCALE_FLOOR BQ_QUANT_SCALE_FLOOR

BqQuantizer *bq_quant_at(BqQuantState *qs, int layer, int point) {
    if (!qs || !qs->slot) return NULL;
    int idx;
    if (layer == BQ_QP_LAYER_EMB) {
        idx = qs->num_layers * BQ_QP_LAYER_COUNT;
    } else {
        BQ_CHECK(layer >= 0 && layer < qs->num_layers && point >= 0 && point < BQ_QP_LAYER_COUNT);
        idx = layer * BQ_QP_LAYER_COUNT + point;
    }
    int s = qs->slot[idx];
    return s < 0 ? NULL : &qs->q[s];
}

void bq_quant_update_scale(BqQuantState *qs, BqQuantizer *q) {
    for (int64_t c = 0; c < q->nch; c++) {
        float a = q->amax[c];
        if (!(a >= 0.0f)) a = 0.0f; /* NaN guard: a NaN range would poison every later step */
        if (qs && qs->cfg.clip_gelu > 0.0f && !q->is_weight && q->point == BQ_QP_GELU_OUT && a > qs->cfg.clip_gelu)
            a = qs->cfg.clip_gelu;
        q->amax[c] = a;
        float s = a / (float)bq_quant_qmax(q);
        q->scale[c] = s > BQ_SCALE_FLOOR ? s : BQ_SCALE_FLOOR;
    }
}

/* min and max of n floats (vectorized, parallel, exact) */
static void minmax(const float *x, int64_t n, float *mn, float *mx) { bq_kernel_minmax(x, n, mn, mx); }

/* Whether the forward (layers/bert.c) consumes the tensor quantized at `point` only through its
 * quantizer: the `sole` column of BQ_QPOINTS (layers/quant.h), BQ_QP_EMB_SOLE for point -1. Such
 * points use bq_op_fakequant_sole (shared gradient buffer). */
static int point_is_sole_consumer(int point) {
    if (point == -1) return BQ_QP_EMB_SOLE;
    BQ_CHECK(point >= 0 && point < BQ_QP_LAYER_COUNT);
    return bq_qpoint_defs[point].sole;
}

/* Moving-average min/max observer step for an activation (PyTorch MovingAverageMinMaxObserver). */
static void observe_act(BqQuantState *qs, BqQuantizer *q, const BqTensor *x, int training) {
    float mn, mx;
    BQ_CHECK(bq_tensor_is_contiguous(x));
    minmax(x->data, bq_tensor_numel(x), &mn, &mx);
    if (training && qs->reduce_minmax) qs->reduce_minmax(&mn, &mx);
    if (!q->initialized) {
        q->run_min = mn;
        q->run_max = mx;
        q->initialized = 1;
    } else {
        float c = qs->cfg.averaging_constant;
        q->run_min = q->run_min + c * (mn - q->run_min);
        q->run_max = q->run_max + c * (mx - q->run_max);
    }
    /* symmetric: PyTorch takes max(-min(min,0), max(max,0)) */
    float a = fmaxf(-fminf(q->run_min, 0.0f), fmaxf(q->run_max, 0.0f));
    q->amax[0] = a;
    bq_quant_update_scale(qs, q);
}

/* Per-channel (axis 0 of (out,in)) min/max of a weight, or of the whole tensor when per tensor. */
static void weight_minmax(const BqQuantizer *q, const BqTensor *w, float *mn, float *mx) {
    BQ_CHECK(w->ndim == 2 && bq_tensor_is_contiguous(w));
    int64_t out = w->shape[0], in = w->shape[1];
    if (q->nch == 1) {
        minmax(w->data, out * in, &mn[0], &mx[0]);
        return;
    }
    BQ_CHECK(q->nch == out);
    for (int64_t o = 0; o < out; o++) minmax(w->data + o * in, in, &mn[o], &mx[o]);
}

/* Moving-average per-channel observer step for a weight (MovingAveragePerChannelMinMaxObserver);
 * reset = 1 sets the range to the current weight (the calibrators' per-channel max). */
static void observe_weight(BqQuantState *qs, BqQuantizer *q, const BqTensor *w, int reset) {
    float *mn = q->ch_min, *mx = q->ch_max;
    BQ_CHECK(mn && mx);
    if (reset || !q->initialized) {
        weight_minmax(q, w, mn, mx);
        q->initialized = 1;
    } else {
        /* new values into amax/scale as scratch, then blend (no allocation in the step) */
        float *bmn = q->scale, *bmx = q->amax;
        weight_minmax(q, w, bmn, bmx);
        float c = qs->cfg.averaging_constant;
        for (int64_t k = 0; k < q->nch; k++) {
            mn[k] = mn[k] + c * (bmn[k] - mn[k]);
            mx[k] = mx[k] + c * (bmx[k] - mx[k]);
        }
    }
    for (int64_t k = 0; k < q->nch; k++) q->amax[k] = fmaxf(-fminf(mn[k], 0.0f), fmaxf(mx[k], 0.0f));
    bq_quant_update_scale(qs, q);
}

/* LSQ's gradient scale g = 1/√(N·qmax) for a quantizer whose scale sees n elements. */
static float lsq_grad_factor(const BqQuantizer *q, int64_t n) {
    return (float)(1.0 / sqrt((double)(n > 0 ? n : 1) * (double)bq_quant_qmax(q)));
}

BqTensor *bq_quant_act(BqQuantState *qs, BqCtx *ctx, int layer, int point, BqTensor *x) {
    BqQuantizer *q = bq_quant_at(qs, layer, point);
    if (!q) return x;
    BQ_CHECK(!q->is_weight);
    if (!q->enabled) return x;
    if (qs->calib == BQ_CALIB_COLLECT) {
        if (q->hist) {
            BQ_CHECK(bq_tensor_is_contiguous(x));
            bq_hist_collect(q->hist, x->data, bq_tensor_numel(x));
        }
        return x; /* calibration sees the unquantized network */
    }
    /* observers run in training forwards only (evaluation during QAT must not move the ranges) */
    if ((qs->observe && ctx->training && !q->frozen) || !q->initialized) observe_act(qs, q, x, ctx->training);
    if (q->dscale && ctx->tape) /* --ranges learn: N = elements per example (the paper's feature count) */
        return bq_op_fakequant_lsq(ctx, x, q->scale, q->dscale, 1, -1, bq_quant_qmin(q), bq_quant_qmax(q),
                                   lsq_grad_factor(q, bq_tensor_numel(x) / (x->ndim > 1 ? x->shape[0] : 1)),
                                   !qs->plain_fakequant && point_is_sole_consumer(point));
    if (!qs->plain_fakequant && point_is_sole_consumer(point))
        return bq_op_fakequant_sole(ctx, x, q->scale, 1, -1, bq_quant_qmin(q), bq_quant_qmax(q));
    return bq_op_fakequant(ctx, x, q->scale, 1, -1, bq_quant_qmin(q), bq_quant_qmax(q));
}

BqTensor *bq_quant_weight(BqQuantState *qs, BqCtx *ctx, int layer, int point, BqTensor *w) {
    BqQuantizer *q = bq_quant_at(qs, layer, point);
    if (!q) return w;
    BQ_CHECK(q->is_weight);
    if (!q->enabled) return w;
    if (qs->calib == BQ_CALIB_COLLECT) { /* weights are calibrated by their per-channel max */
        observe_weight(qs, q, w, 1);
        return w;
    }
    if ((qs->observe && ctx->training && !q->frozen) || !q->initialized) observe_weight(qs, q, w, 0);
    if (q->dscale && ctx->tape) /* --ranges learn: N = elements per scale */
        return bq_op_fakequant_lsq(ctx, w, q->scale, q->dscale, q->nch, q->nch == 1 ? -1 : 0, bq_quant_qmin(q),
                                   bq_quant_qmax(q), lsq_grad_factor(q, bq_tensor_numel(w) / q->nch), 0);
    return bq_op_fakequant(ctx, w, q->scale, q->nch, q->nch == 1 ? -1 : 0, bq_quant_qmin(q), bq_quant_qmax(q));
}

BqQuantizer *bq_quant_active(BqQuantState *qs, int layer, int point) {
    BqQuantizer *q = bq_quant_at(qs, layer, point);
    return q && q->enabled && q->initialized && qs->calib == BQ_CALIB_OFF ? q : NULL;
}

BqTensor *bq_quant_linear(BqQuantState *qs, BqCtx *ctx, const BqQuantizer *iq, BqTensor *x, BqQuantizer *wq,
                          BqTensor *w, BqTensor *b) {
    if (!qs || qs->fp32_linear || !iq || !wq || iq->is_weight || !wq->is_weight || iq->bits != 8 || iq->nch != 1 ||
        wq->bits > 8 || w->ndim != 2 || (wq->nch != 1 && wq->nch != w->shape[0]))
        return bq_op_linear(ctx, x, w, b);
    /* first forward only: codes, sums and scales of this weight (reused, refilled every forward) */
    if (!wq->qgemm && bq_qgemm_weights_create_empty(&wq->qgemm, w->shape[0], w->shape[1], wq->bits, wq->name)) {
        fprintf(stderr, "bertqat: %s\n", bq_errmsg()); /* oneDNN could not start: no status path here */
        BQ_CHECK(wq->qgemm != NULL);
    }
    BQ_CHECK(bq_tensor_is_contiguous(w));
    bq_qgemm_weights_set(wq->qgemm, w->data, wq->scale, wq->nch);
    return bq_op_linear_qgemm(ctx, x, iq->scale[0], w, wq->qgemm, b);
}

void bq_quant_freeze(BqQuantState *qs, int frozen) {
    for (int i = 0; i < qs->n; i++) qs->q[i].frozen = frozen;
}

void bq_quant_step(BqQuantState *qs) {
    if (!qs) return;
    qs->steps_seen++;
    if (qs->cfg.freeze_after > 0 && qs->steps_seen >= qs->cfg.freeze_after) bq_quant_freeze(qs, 1);
}

int bq_quant_count_initialized(const BqQuantState *qs) {
    int k = 0;
    for (int i = 0; i < qs->n; i++) k += qs->q[i].initialized != 0;
    return k;
}

void bq_quant_calib_begin(BqQuantState *qs, BqCalibrator method) {
    for (int i = 0; i < qs->n; i++) {
        BqQuantizer *q = &qs->q[i];
        if (q->is_weight) continue;
        if (q->hist) {
            bq_hist_free(q->hist);
            free(q->hist);
        }
        q->hist = bq_malloc(sizeof *q->hist);
        bq_hist_init(q->hist, 2048, method != BQ_CALIBRATOR_MAX);
    }
    qs->calib = BQ_CALIB_COLLECT;
}

int bq_quant_calib_finish(BqQuantState *qs, BqCalibrator method, double percentile) {
    if (method == BQ_CALIBRATOR_PERCENTILE && !(percentile > 0.0 && percentile <= 100.0))
        return bq_err(BQ_EINVAL, "--percentile: %g is not in (0, 100]", percentile);
    for (int i = 0; i < qs->n; i++) {
        BqQuantizer *q = &qs->q[i];
        if (q->is_weight || !q->hist) continue;
        double a = 0.0;
        switch (method) {
        case BQ_CALIBRATOR_MAX: a = q->hist->maxv; break;
        case BQ_CALIBRATOR_PERCENTILE: a = bq_calib_amax_percentile(q->hist, percentile); break;
        case BQ_CALIBRATOR_MSE: a = bq_calib_amax_mse(q->hist, 128); break;
        case BQ_CALIBRATOR_ENTROPY: a = bq_calib_amax_entropy(q->hist, 128, 128); break;
        }
        int seen = q->hist->maxv > 0.0 || q->hist->nbins > 0 || q->hist->pending_zeros > 0;
        bq_hist_free(q->hist);
        free(q->hist);
        q->hist = NULL;
        if (!seen) return bq_err(BQ_EINVAL, "calibration: quantizer %s saw no data", q->name);
        q->amax[0] = (float)a;
        q->run_min = -(float)a;
        q->run_max = (float)a;
        q->initialized = 1;
        bq_quant_update_scale(qs, q);
    }
    qs->calib = BQ_CALIB_OFF;
    bq_quant_freeze(qs, 1);
    return BQ_OK;
}

void bq_quant_config_default(BqQuantConfig *cfg) {
    memset(cfg, 0, sizeof *cfg);
    cfg->scheme = BQ_SCHEME_ORT;
    cfg->averaging_constant = 0.01f;
    strcpy(cfg->exclude, "classifier,pooler");
}

static const char *const calib_names[] = {"max", "percentile", "mse", "entropy"};

int bq_calibrator_parse(BqCalibrator *out, const char *s) {
    for (int i = 0; i < 4; i++)
        if (strcmp(s, calib_names[i]) == 0) {
            *out = (BqCalibrator)i;
            return BQ_OK;
        }
    return bq_err(BQ_EINVAL, "--calibrator: '%s' is not one of max, percentile, mse, entropy", s);
}

const char *bq_calibrator_name(BqCalibrator c) { return (unsigned)c < 4 ? calib_names[c] : "?"; }

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

static int h5_attr_i64(hid_t g, const char *path, const char *qname, const char *name, int64_t v) {
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(g, name, H5T_STD_I64LE, sp, H5P_DEFAULT, H5P_DEFAULT);
    int st = BQ_OK;
    if (a < 0 || H5Awrite(a, H5T_NATIVE_INT64, &v) < 0)
        st = bq_err(BQ_EIO, "%s: cannot write attribute %s of /quant/%s%s", path, name, qname, bq_h5_io_reason());
    if (a >= 0 && H5Aclose(a) < 0 && !st)
        st = bq_err(BQ_EIO, "%s: cannot write attribute %s of /quant/%s%s", path, name, qname, bq_h5_io_reason());
    H5Sclose(sp);
    return st;
}

static int h5_attr_str(hid_t g, const char *path, const char *qname, const char *name, const char *v) {
    hid_t t = H5Tcopy(H5T_C_S1);
    H5Tset_size(t, strlen(v) + 1);
    hid_t sp = H5Screate(H5S_SCALAR);
    hid_t a = H5Acreate2(g, name, t, sp, H5P_DEFAULT, H5P_DEFAULT);
    int st = BQ_OK;
    if (a < 0 || H5Awrite(a, t, v) < 0)
        st = bq_err(BQ_EIO, "%s: cannot write attribute %s of /quant/%s%s", path, name, qname, bq_h5_io_reason());
    if (a >= 0 && H5Aclose(a) < 0 && !st)
        st = bq_err(BQ_EIO, "%s: cannot write attribute %s of /quant/%s%s", path, name, qname, bq_h5_io_reason());
    H5Sclose(sp);
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

/* ---- --ranges learn: the scale block and its state in training_state.h5 ---- */

void bq_quant_learn_enable(BqQuantState *qs, double range_lr) {
    qs->cfg.learn_ranges = 1;
    qs->cfg.range_lr = range_lr;
    bq_quant_freeze(qs, 1);
    qs->observe = 0;
    if (qs->lsq) return;
    int64_t n = 0;
    for (int i = 0; i < qs->n; i++) n += qs->q[i].nch;
    qs->nscales = n;
    qs->lsq = bq_calloc((size_t)(5 * (n > 0 ? n : 1)), sizeof(float));
    qs->lsq_grad = qs->lsq + n, qs->lsq_m = qs->lsq + 2 * n, qs->lsq_v = qs->lsq + 3 * n;
    qs->lsq_best = qs->lsq + 4 * n;
    int64_t off = 0;
    for (int i = 0; i < qs->n; i++) {
        BqQuantizer *q = &qs->q[i];
        memcpy(qs->lsq + off, q->scale, (size_t)q->nch * sizeof(float));
        free(q->scale);
        q->scale = qs->lsq + off;
        q->dscale = qs->lsq_grad + off;
        off += q->nch;
    }
    memcpy(qs->lsq_best, qs->lsq, (size_t)n * sizeof(float));
}

void bq_quant_learn_disable(BqQuantState *qs) {
    qs->cfg.learn_ranges = 0;
    qs->cfg.range_lr = 0.0;
    if (!qs->lsq) return;
    for (int i = 0; i < qs->n; i++) {
        BqQuantizer *q = &qs->q[i];
        float *own = bq_malloc((size_t)q->nch * sizeof(float));
        memcpy(own, q->scale, (size_t)q->nch * sizeof(float));
        q->scale = own;
        q->dscale = NULL;
    }
    free(qs->lsq);
    qs->lsq = qs->lsq_grad = qs->lsq_m = qs->lsq_v = qs->lsq_best = NULL;
    qs->nscales = 0;
}

void bq_quant_learn_sync_amax(BqQuantState *qs) {
    for (int i = 0; qs->lsq && i < qs->n; i++) {
        BqQuantizer *q = &qs->q[i];
        for (int64_t c = 0; c < q->nch; c++) q->amax[c] = q->scale[c] * (float)bq_quant_qmax(q);
    }
}

void bq_quant_learn_keep_best(BqQuantState *qs) {
    if (qs->lsq) memcpy(qs->lsq_best, qs->lsq, (size_t)qs->nscales * sizeof(float));
}

void bq_quant_learn_restore_best(BqQuantState *qs) {
    if (!qs->lsq) return;
    memcpy(qs->lsq, qs->lsq_best, (size_t)qs->nscales * sizeof(float));
    bq_quant_learn_sync_amax(qs);
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
