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

#include "autograd/kernels.h"
#include "autograd/qgemm.h"
#include "layers/calib.h"

/* The rows of the point table and the scheme names (docs/design.md §4) live here, with the numerics
 * that read them, so that layers/qscheme.c (placement, which reads the model's configuration) depends
 * on this file and never the reverse. */
const BqQPointDef bq_qpoint_defs[BQ_QP_LAYER_COUNT] = {
#define BQ_QP_DEF_(point, role, is_weight, sole, schemes, feeds) [BQ_QP_##point] = {role, is_weight, sole, schemes},
    BQ_QPOINTS(BQ_QP_DEF_)
#undef BQ_QP_DEF_
};

const char *const bq_scheme_names[BQ_SCHEME_COUNT + 1] = {
    [BQ_SCHEME_ORT] = "ort", [BQ_SCHEME_QDQBERT] = "qdqbert", [BQ_SCHEME_CPU] = "cpu", [BQ_SCHEME_COUNT] = NULL};

int bq_scheme_parse(BqScheme *out, const char *s, const char *flag_or_key) {
    for (int i = 0; i < BQ_SCHEME_COUNT; i++)
        if (strcmp(s, bq_scheme_names[i]) == 0) {
            *out = (BqScheme)i;
            return BQ_OK;
        }
    return bq_err(BQ_EINVAL, "%s: '%s' is not one of ort, qdqbert, cpu", flag_or_key, s);
}

const char *bq_scheme_name(BqScheme s) {
    BQ_CHECK((unsigned)s < BQ_SCHEME_COUNT);
    return bq_scheme_names[s];
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
    bq_kernel_minmax_rows(w->data, out, in, mn, mx);
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

const char *const bq_calibrator_names[5] = {"max", "percentile", "mse", "entropy", NULL};

int bq_calibrator_parse(BqCalibrator *out, const char *s) {
    for (int i = 0; i < 4; i++)
        if (strcmp(s, bq_calibrator_names[i]) == 0) {
            *out = (BqCalibrator)i;
            return BQ_OK;
        }
    return bq_err(BQ_EINVAL, "--calibrator: '%s' is not one of max, percentile, mse, entropy", s);
}

const char *bq_calibrator_name(BqCalibrator c) { return (unsigned)c < 4 ? bq_calibrator_names[c] : "?"; }

/* ---- --ranges learn: the scale block (its state in training_state.h5: export/quant_io.c) ---- */

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
