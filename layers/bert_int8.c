/* Integer inference forward of a quantized BERT (layers/bert_int8.h).
 *
 * Reference: layers/bert.c (layer_forward, bq_bert_forward), which this file follows op for op with the
 * same quantization hooks (bq_quant_act / bq_quant_weight of layers/quant.h, here always without a
 * tape and without observers), except that a Linear whose input and weight are both quantized becomes:
 *   codes = clamp(rne(x / sx), -128, 127)       (bq_qgemm_quantize_u8: the fake quantizer's rounding)
 *   y     = fl(fl(Σ codes·qw · fl(sx·sw[n])) + b[n])   (bq_qgemm_linear, exact integer sum)
 * with qw = clamp(rne(w / sw[n]), qmin, qmax), the weight quantizer's codes (so fl(qw·sw) is exactly
 * the fake-quantized weight). Query, key and value share one input quantizer in the cpu scheme
 * (attention.self.input_quantizer) and run as one (3H, H) GEMM.
 *
 * Memory: the engine owns the packed codes, the scales and copies of the biases; a forward takes its
 * activations, codes and int32 accumulators from ctx->act, which the caller rewinds. */
#include "layers/bert_int8.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/qgemm.h"
#include "layers/quant.h"

typedef struct Int8Linear {
    BqQGemmWeights *w; /* NULL: this Linear runs as the fake-quant fp32 Linear */
    float sx;          /* the input quantizer's scale */
    float *bias;       /* (N) copy, concatenated for the fused query/key/value product */
} Int8Linear;

typedef struct Int8Layer {
    int fused_qkv;       /* qkv[0] is the (3H, H) product of query, key and value */
    Int8Linear qkv[3], ao, inter, out;
} Int8Layer;

struct BqInt8Engine {
    int num_layers, hidden, inter;
    Int8Layer *layers;
    int nlinear, ngemm;
};

/* ---- preparation ---- */

/* Input quantizer of Linear j (0..2 query/key/value, 3 attention.output, 4 intermediate, 5 output):
 * NULL when its input is not quantized or when two quantizers are chained (no scheme does that). */
static BqQuantizer *input_quantizer(BqQuantState *qs, int l, int j) {
    static const int own[6] = {BQ_QP_Q_IN, BQ_QP_K_IN, BQ_QP_V_IN, BQ_QP_AO_IN, BQ_QP_I_IN, BQ_QP_O_IN};
    BqQuantizer *a = bq_quant_at(qs, l, own[j]);
    BqQuantizer *shared = j < 3 ? bq_quant_at(qs, l, BQ_QP_QKV_IN) : NULL;
    if (a && shared) return NULL;
    return a ? a : shared;
}

static const int weight_point[6] = {BQ_QP_W_Q, BQ_QP_W_K, BQ_QP_W_V, BQ_QP_W_AO, BQ_QP_W_I, BQ_QP_W_O};

static const BqTensor *linear_weight(const BqBertLayer *L, int j) {
    const BqTensor *w[6] = {&L->q_w, &L->k_w, &L->v_w, &L->ao_w, &L->i_w, &L->o_w};
    return w[j];
}
static const BqTensor *linear_bias(const BqBertLayer *L, int j) {
    const BqTensor *b[6] = {&L->q_b, &L->k_b, &L->v_b, &L->ao_b, &L->i_b, &L->o_b};
    return b[j];
}

/* Codes of weight w (N,K) rows [0,N) into dst: clamp(rne(w / s[n]), qmin, qmax), the rounding of
 * bq_kernel_fakequant_forward. */
static void weight_codes(int8_t *dst, const float *w, int64_t N, int64_t K, const BqQuantizer *q) {
    const float lo = (float)bq_quant_qmin(q), hi = (float)bq_quant_qmax(q);
    const float magic = 12582912.0f; /* 1.5·2^23: (v + magic) − magic rounds to nearest even */
    for (int64_t n = 0; n < N; n++) {
        float s = q->scale[q->nch == 1 ? 0 : n];
        for (int64_t k = 0; k < K; k++) {
            float v = w[n * K + k] / s;
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
            v = v == v ? v : 0.0f;
            dst[n * K + k] = (int8_t)(int)((v + magic) - magic);
        }
    }
}

/* Packs Linears js[0..cnt) of layer l (same K, same input quantizer) as one product of their
 * stacked rows. */
static int pack_linear(Int8Linear *il, const BqBert *m, int l, const int *js, int cnt, BqQuantizer *iq) {
    BqQuantState *qs = m->quant;
    const BqBertLayer *L = &m->layers[l];
    const int64_t K = linear_weight(L, js[0])->shape[1];
    int64_t N = 0;
    for (int i = 0; i < cnt; i++) N += linear_weight(L, js[i])->shape[0];
    int8_t *codes = bq_malloc((size_t)(N * K));
    float *sw = bq_malloc((size_t)N * sizeof(float));
    il->bias = bq_malloc((size_t)N * sizeof(float));
    int bits = 0, rc = BQ_OK;
    int64_t row = 0;
    for (int i = 0; i < cnt; i++) {
        const BqTensor *w = linear_weight(L, js[i]), *b = linear_bias(L, js[i]);
        const BqQuantizer *wq = bq_quant_at(qs, l, weight_point[js[i]]);
        const int64_t n = w->shape[0];
        BQ_CHECK(w->shape[1] == K && (wq->nch == 1 || wq->nch == n));
        if (i > 0 && wq->bits != bits) {
            rc = bq_err(BQ_EINVAL, "int8 engine: %s has %d bits, unlike its fused neighbours", wq->name, wq->bits);
            goto cleanup;
        }
        bits = wq->bits;
        weight_codes(codes + row * K, w->data, n, K, wq);
        for (int64_t r = 0; r < n; r++) sw[row + r] = wq->scale[wq->nch == 1 ? 0 : r];
        memcpy(il->bias + row, b->data, (size_t)n * sizeof(float));
        row += n;
    }
    il->sx = iq->scale[0];
    rc = bq_qgemm_weights_create(&il->w, codes, sw, N, N, K, bits,
                                 bq_quant_at(qs, l, weight_point[js[0]])->name);

cleanup:
    free(codes);
    free(sw);
    return rc;
}

void bq_int8_free(BqInt8Engine *e) {
    if (!e) return;
    for (int l = 0; l < e->num_layers && e->layers; l++) {
        Int8Layer *IL = &e->layers[l];
        Int8Linear *all[6] = {&IL->qkv[0], &IL->qkv[1], &IL->qkv[2], &IL->ao, &IL->inter, &IL->out};
        for (int j = 0; j < 6; j++) {
            bq_qgemm_weights_free(all[j]->w);
            free(all[j]->bias);
        }
    }
    free(e->layers);
    free(e);
}

int bq_int8_prepare(BqInt8Engine **out, const BqBert *m) {
    BQ_CHECK(out && m);
    *out = NULL;
    BqQuantState *qs = m->quant;
    if (!qs) return bq_err(BQ_EINVAL, "int8 engine: the model has no quantizers (an fp32 checkpoint)");
    if (qs->cfg.scheme == BQ_SCHEME_ORT)
        return bq_err(BQ_EINVAL, "int8 engine: scheme 'ort' quantizes Linear outputs, not their inputs, so no "
                                 "Linear runs on integer codes; use fake quant, or the cpu scheme");
    if (qs->calib != BQ_CALIB_OFF) return bq_err(BQ_EINVAL, "int8 engine: the quantizers are still calibrating");
    for (int i = 0; i < qs->n; i++)
        if (!qs->q[i].initialized)
            return bq_err(BQ_EINVAL, "int8 engine: quantizer %s has no range (calibrate or train first)",
                          qs->q[i].name);
    const BqBertConfig *c = &m->cfg;
    BqInt8Engine *e = bq_calloc(1, sizeof *e);
    e->num_layers = c->num_hidden_layers;
    e->hidden = c->hidden_size;
    e->inter = c->intermediate_size;
    e->layers = bq_calloc((size_t)e->num_layers, sizeof *e->layers);
    int rc = BQ_OK;
    for (int l = 0; l < e->num_layers; l++) {
        Int8Layer *IL = &e->layers[l];
        BqQuantizer *iq[6];
        int ok[6];
        for (int j = 0; j < 6; j++) {
            iq[j] = input_quantizer(qs, l, j);
            ok[j] = iq[j] && bq_quant_at(qs, l, weight_point[j]) != NULL;
            if (ok[j] && (iq[j]->bits != 8 || iq[j]->nch != 1)) {
                rc = bq_err(BQ_EINVAL, "int8 engine: %s must be a per-tensor 8-bit quantizer (has %d bits, %lld "
                                       "scales)", iq[j]->name, iq[j]->bits, (long long)iq[j]->nch);
                goto cleanup;
            }
        }
        if (ok[0] && ok[1] && ok[2] && iq[0] == iq[1] && iq[1] == iq[2]) {
            static const int qkv[3] = {0, 1, 2};
            IL->fused_qkv = 1;
            if ((rc = pack_linear(&IL->qkv[0], m, l, qkv, 3, iq[0]))) goto cleanup;
            e->nlinear += 3, e->ngemm++;
        } else {
            for (int j = 0; j < 3; j++)
                if (ok[j]) {
                    if ((rc = pack_linear(&IL->qkv[j], m, l, &j, 1, iq[j]))) goto cleanup;
                    e->nlinear++, e->ngemm++;
                }
        }
        Int8Linear *rest[3] = {&IL->ao, &IL->inter, &IL->out};
        for (int j = 3; j < 6; j++)
            if (ok[j]) {
                if ((rc = pack_linear(rest[j - 3], m, l, &j, 1, iq[j]))) goto cleanup;
                e->nlinear++, e->ngemm++;
            }
    }
    if (e->nlinear == 0) {
        rc = bq_err(BQ_EINVAL, "int8 engine: scheme '%s' leaves no Linear with both input and weight quantized",
                    bq_scheme_name(qs->cfg.scheme));
        goto cleanup;
    }
    *out = e;
    return BQ_OK;

cleanup:
    bq_int8_free(e);
    return rc;
}

int bq_int8_linear_count(const BqInt8Engine *e) { return e->nlinear; }
int bq_int8_gemm_count(const BqInt8Engine *e) { return e->ngemm; }

/* ---- forward ---- */

static inline BqTensor *qact(BqQuantState *qs, BqCtx *ctx, int layer, int point, BqTensor *x) {
    return bq_quant_act(qs, ctx, layer, point, x);
}

/* y (B,N) = x (B,K)·Wᵀ + b with a fixed summation order per output (8 interleaved partial sums
 * added pairwise, then the bias), so a row's result depends neither on B nor on the thread count.
 * The pooler and the classifier use it: OpenBLAS's sgemm gives a row different roundings for
 * different M (its M = 1 path is a gemv; measured on Zen 3 with OpenBLAS 0.3.21 for B = 1 vs 4). */
static BqTensor *row_linear(BqCtx *ctx, const BqTensor *x, const BqTensor *w, const BqTensor *b) {
    BQ_CHECK(x->ndim == 2 && bq_tensor_is_contiguous(x) && w->shape[1] == x->shape[1]);
    const int64_t B = x->shape[0], K = x->shape[1], N = w->shape[0];
    int64_t shape[2] = {B, N};
    BqTensor *y = bq_tensor_new(ctx, 2, shape);
    const float *X = x->data, *W = w->data, *bias = b ? b->data : NULL;
    float *Y = y->data;
#pragma omp parallel for collapse(2) if (B * N * K > 65536) schedule(static)
    for (int64_t r = 0; r < B; r++)
        for (int64_t n = 0; n < N; n++) {
            const float *xr = X + r * K, *wn = W + n * K;
            float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            int64_t k = 0;
            for (; k + 8 <= K; k += 8)
                for (int j = 0; j < 8; j++) acc[j] += xr[k + j] * wn[k + j];
            for (int j = 0; k < K; k++, j++) acc[j] += xr[k] * wn[k];
            float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
            Y[r * N + n] = bias ? s + bias[n] : s;
        }
    return y;
}

/* The integer Linear on x (B,T,K): outputs (B,T,N/nout) each, in ctx->act. */
static int int8_linear(BqCtx *ctx, const Int8Linear *il, const BqTensor *x, int nout, BqTensor **outs) {
    BQ_CHECK(bq_tensor_is_contiguous(x) && x->ndim == 3);
    const int64_t B = x->shape[0], T = x->shape[1], K = x->shape[2], M = B * T;
    const int64_t N = bq_qgemm_weights_n(il->w);
    BQ_CHECK(bq_qgemm_weights_k(il->w) == K);
    uint8_t *codes = bq_arena_alloc(ctx->act, (size_t)(M * K));
    int32_t *acc = bq_arena_alloc(ctx->act, (size_t)(M * N) * sizeof(int32_t));
    bq_qgemm_quantize_u8(codes, x->data, M * K, il->sx);
    float *dst[3];
    for (int j = 0; j < nout; j++) {
        int64_t shape[3] = {B, T, N / nout};
        outs[j] = bq_tensor_new(ctx, 3, shape);
        dst[j] = outs[j]->data;
    }
    return bq_qgemm_linear(il->w, codes, M, il->sx, il->bias, nout, dst, acc);
}

/* One BertLayer as layers/bert.c's layer_forward, with the integer Linears of IL. */
static int layer_forward(const Int8Layer *IL, BqBert *m, BqCtx *ctx, int l, BqTensor *x, const float *mask,
                         BqTensor **y) {
    const BqBertConfig *c = &m->cfg;
    BqBertLayer *L = &m->layers[l];
    BqQuantState *qs = m->quant;
    const int nh = c->num_attention_heads;
    const float scale = 1.0f / sqrtf((float)(c->hidden_size / nh));
    int rc;

    /* BertSelfAttention */
    BqTensor *qkv[3] = {NULL, NULL, NULL};
    if (IL->fused_qkv) {
        if ((rc = int8_linear(ctx, &IL->qkv[0], x, 3, qkv))) return rc;
    } else {
        static const int in_pt[3] = {BQ_QP_Q_IN, BQ_QP_K_IN, BQ_QP_V_IN};
        BqTensor *W[3] = {&L->q_w, &L->k_w, &L->v_w}, *bias[3] = {&L->q_b, &L->k_b, &L->v_b};
        BqTensor *xa = NULL;
        for (int j = 0; j < 3; j++) {
            if (IL->qkv[j].w) {
                if ((rc = int8_linear(ctx, &IL->qkv[j], x, 1, &qkv[j]))) return rc;
            } else {
                if (!xa) xa = qact(qs, ctx, l, BQ_QP_QKV_IN, x);
                qkv[j] = bq_op_linear(ctx, qact(qs, ctx, l, in_pt[j], xa),
                                      bq_quant_weight(qs, ctx, l, weight_point[j], W[j]), bias[j]);
            }
        }
    }
    BqTensor *q = qact(qs, ctx, l, BQ_QP_Q_OUT, qkv[0]);
    BqTensor *k = qact(qs, ctx, l, BQ_QP_K_OUT, qkv[1]);
    BqTensor *v = qact(qs, ctx, l, BQ_QP_V_OUT, qkv[2]);
    BqTensor *s = bq_op_attn_scores(ctx, qact(qs, ctx, l, BQ_QP_MM1_Q, q), qact(qs, ctx, l, BQ_QP_MM1_K, k), nh);
    s = qact(qs, ctx, l, BQ_QP_SCORES, s);
    BqTensor *p = bq_op_softmax_mask(ctx, s, mask, scale, -FLT_MAX);
    p = qact(qs, ctx, l, BQ_QP_PROBS, p);
    p = bq_op_dropout(ctx, p, c->attention_probs_dropout_prob);
    BqTensor *cx = bq_op_attn_context(ctx, qact(qs, ctx, l, BQ_QP_MM2_P, p), qact(qs, ctx, l, BQ_QP_MM2_V, v), nh);
    cx = qact(qs, ctx, l, BQ_QP_CONTEXT, cx);

    /* BertSelfOutput */
    BqTensor *a;
    if (IL->ao.w) {
        if ((rc = int8_linear(ctx, &IL->ao, cx, 1, &a))) return rc;
    } else {
        a = bq_op_linear(ctx, qact(qs, ctx, l, BQ_QP_AO_IN, cx), bq_quant_weight(qs, ctx, l, BQ_QP_W_AO, &L->ao_w),
                         &L->ao_b);
    }
    a = bq_op_dropout(ctx, a, c->hidden_dropout_prob);
    a = bq_op_add(ctx, qact(qs, ctx, l, BQ_QP_ADD1_LOCAL, a), qact(qs, ctx, l, BQ_QP_ADD1_RESID, x));
    a = qact(qs, ctx, l, BQ_QP_ATTN_RESID, a);
    a = bq_op_layernorm(ctx, a, &L->ln1_w, &L->ln1_b, c->layer_norm_eps);
    a = qact(qs, ctx, l, BQ_QP_ATTN_LN, a);

    /* BertIntermediate */
    BqTensor *h;
    if (IL->inter.w) {
        if ((rc = int8_linear(ctx, &IL->inter, a, 1, &h))) return rc;
    } else {
        h = bq_op_linear(ctx, qact(qs, ctx, l, BQ_QP_I_IN, a), bq_quant_weight(qs, ctx, l, BQ_QP_W_I, &L->i_w),
                         &L->i_b);
    }
    h = qact(qs, ctx, l, BQ_QP_INTER_OUT, h);
    h = bq_op_gelu(ctx, h);
    h = qact(qs, ctx, l, BQ_QP_GELU_OUT, h);

    /* BertOutput */
    BqTensor *o;
    if (IL->out.w) {
        if ((rc = int8_linear(ctx, &IL->out, h, 1, &o))) return rc;
    } else {
        o = bq_op_linear(ctx, qact(qs, ctx, l, BQ_QP_O_IN, h), bq_quant_weight(qs, ctx, l, BQ_QP_W_O, &L->o_w),
                         &L->o_b);
    }
    o = bq_op_dropout(ctx, o, c->hidden_dropout_prob);
    o = bq_op_add(ctx, qact(qs, ctx, l, BQ_QP_ADD2_LOCAL, o), qact(qs, ctx, l, BQ_QP_ADD2_RESID, a));
    o = qact(qs, ctx, l, BQ_QP_OUT_RESID, o);
    o = bq_op_layernorm(ctx, o, &L->ln2_w, &L->ln2_b, c->layer_norm_eps);
    *y = qact(qs, ctx, l, BQ_QP_OUT_LN, o);
    return BQ_OK;
}

int bq_int8_forward(BqInt8Engine *e, BqBert *m, BqCtx *ctx, const BqBertInput *in, BqTensor **logits) {
    BQ_CHECK(e && m && ctx && ctx->act && in && logits);
    BQ_CHECK(ctx->tape == NULL && !ctx->training); /* inference only */
    *logits = NULL;
    const BqBertConfig *c = &m->cfg;
    if (!m->quant || e->num_layers != c->num_hidden_layers || e->hidden != c->hidden_size ||
        e->inter != c->intermediate_size)
        return bq_err(BQ_EINVAL, "int8 engine: the model is not the one the engine was prepared from");
    int labelled = 0;
    int st = bq_bert_check_input(m, in, &labelled);
    if (st) return st;
    BqTensor *x = bq_bert_embed(m, ctx, in);

    for (int l = 0; l < c->num_hidden_layers; l++) {
        int rc = layer_forward(&e->layers[l], m, ctx, l, x, in->attention_mask, &x);
        if (rc) return rc;
    }

    /* BertPooler and the classifier, one example at a time (row_linear) */
    BqTensor *pooled = bq_op_tanh(ctx, row_linear(ctx, bq_op_select_token(ctx, x, 0), &m->pool_w, &m->pool_b));
    float cls_p = c->classifier_dropout >= 0 ? c->classifier_dropout : c->hidden_dropout_prob;
    pooled = bq_op_dropout(ctx, pooled, cls_p);
    *logits = row_linear(ctx, pooled, &m->cls_w, &m->cls_b);
    return BQ_OK;
}
