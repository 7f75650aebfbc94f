/* BERT → ONNX (export/onnx_bert.h). Graph shape follows torch.onnx.export of HF
 * BertForSequenceClassification (transformers models/bert/modeling_bert.py) as ONNX Runtime's
 * transformer optimizer expects it (onnxruntime/python/tools/transformers fusion_embedlayer,
 * fusion_attention, fusion_skiplayernorm, fusion_gelu, fusion_qordered_*; docs/design.md §7).
 * Node names are "/<HF module path with '/'>/<Op>" and outputs "<node>_output_0" like PyTorch's.
 *
 * CPU layout (ONNX Runtime CPU, onnxruntime/core/optimizer/qdq_transformer): on x86 the QDQ
 * selectors refuse int8 activations (QDQIsInt8Allowed() is false off ARM) and QDQS8ToU8Transformer
 * rewrites an int8 Q→DQ pair to uint8 only when the Q has a single consumer, so a quantized tensor
 * read by several nodes (Q/K/V and the residual) kept its fp32 MatMuls. The CPU layout writes
 * activation Q/DQ as uint8 with zero point 128 — the same values, clamp(rne(x/s), -128, 127) + 128 —
 * which every MatMul selector accepts whatever the fan-out (EnsureUniqueDQForNodeUnit gives each
 * consumer its DQ). Weights: 7-bit ones stay int8 (U8S8 kernels, exact for |w| <= 64); 8-bit ones
 * are written as uint8 w + 128 with zero point 128 so ORT picks its U8U8 kernels, since its x86 U8S8
 * kernels without VNNI add pairs of u8·s8 products into saturating int16. */
#include "export/onnx_bert.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "export/onnx_graph.h"

#define NM 512

/* snprintf into a fixed name buffer; names are built from HF paths far below NM, so overflow is a bug */
#define FMT(buf, ...) BQ_CHECK(snprintf(buf, sizeof buf, __VA_ARGS__) < (int)sizeof buf)

typedef struct QdqMemo {
    const char *src; /* tensor name (owned by the graph) */
    float scale;
    const char *dq;  /* shared DequantizeLinear output */
} QdqMemo;

typedef struct Ex {
    BqOnnxGraph *g;
    const BqBert *m;
    BqQuantState *qs; /* NULL: fp32 export */
    const BqOnnxOptions *opt;
    BqOnnxStats *st;
    QdqMemo *memo;
    int nmemo, cmemo;
    const char *zp;   /* shared activation zero point: int8 0, or uint8 128 in the CPU layout */
    int cpu;          /* CPU layout */
    unsigned char *placed; /* (qs->n) quantizers the graph has used, to check none was left out */
    int status;       /* first error */
} Ex;

/* one node with one output named "<name>_output_0"; returns that output */
static const char *op(Ex *e, const char *type, const char *name, int nin, const char *const *in) {
    char out[NM];
    FMT(out, "%s_output_0", name);
    Onnx__NodeProto *n = bq_onnx_node(e->g, type, name, nin, in, 1, (const char *const[]){out});
    return n->output[0];
}
static Onnx__NodeProto *opn(Ex *e, const char *type, const char *name, int nin, const char *const *in) {
    char out[NM];
    FMT(out, "%s_output_0", name);
    return bq_onnx_node(e->g, type, name, nin, in, 1, (const char *const[]){out});
}
static const char *op2(Ex *e, const char *type, const char *path, const char *a, const char *b) {
    char name[NM];
    FMT(name, "%s/%s", path, type);
    return op(e, type, name, 2, (const char *const[]){a, b});
}
static const char *cfloat(Ex *e, const char *path, const char *what, float v) {
    char name[NM];
    FMT(name, "%s/%s", path, what);
    return bq_onnx_init_scalar_float(e->g, name, v);
}
static const char *cints(Ex *e, const char *path, const char *what, int n, const int64_t *v) {
    char name[NM];
    FMT(name, "%s/%s", path, what);
    return bq_onnx_init_vec_int64(e->g, name, n, v);
}

static BqQuantizer *qat(Ex *e, int layer, int point) {
    if (!e->qs || !e->opt->qdq) return NULL;
    BqQuantizer *q = bq_quant_at(e->qs, layer, point);
    if (q) e->placed[q - e->qs->q] = 1;
    if (q && !q->initialized && !e->status)
        e->status = bq_err(BQ_EINVAL, "%s: quantizer has no range (calibrate or train the QAT model first)", q->name);
    return q;
}

/* QuantizeLinear → DequantizeLinear of x with q's per-tensor scale; shared per (x, scale). */
static const char *qdq(Ex *e, const char *x, BqQuantizer *q) {
    if (!q) return x;
    BQ_CHECK(!q->is_weight && q->nch == 1);
    float s = q->scale[0];
    for (int i = 0; i < e->nmemo; i++)
        if (!strcmp(e->memo[i].src, x) && e->memo[i].scale == s) return e->memo[i].dq;
    char name[NM];
    FMT(name, "%s.scale", q->name);
    /* several points can share one quantizer name only when fused; keep initializer names unique */
    char sname[NM];
    FMT(sname, "%s_%d", name, e->nmemo);
    const char *sc = bq_onnx_init_scalar_float(e->g, sname, s);
    FMT(name, "/%s/QuantizeLinear_%d", q->name, e->nmemo);
    const char *qo = op(e, "QuantizeLinear", name, 3, (const char *const[]){x, sc, e->zp});
    FMT(name, "/%s/DequantizeLinear_%d", q->name, e->nmemo);
    const char *dq = op(e, "DequantizeLinear", name, 3, (const char *const[]){qo, sc, e->zp});
    e->st->quantize_linear++;
    e->st->dequantize_linear++;
    if (e->nmemo == e->cmemo) {
        e->cmemo = e->cmemo ? 2 * e->cmemo : 64;
        e->memo = realloc(e->memo, sizeof *e->memo * (size_t)e->cmemo);
        BQ_CHECK(e->memo);
    }
    e->memo[e->nmemo++] = (QdqMemo){x, s, dq};
    return dq;
}

/* Linear: x (…, in) · W[in,out] + b. W is stored transposed from PyTorch's (out, in). With a weight
 * quantizer wq: int8 [in,out] → DequantizeLinear(axis 1, scale[out]) (per tensor: scalar scale). */
static const char *linear(Ex *e, const char *x, const char *path, const BqTensor *w, const BqTensor *b,
                          const char *wname, const char *bname, BqQuantizer *wq) {
    const int64_t N = w->shape[0], K = w->shape[1];
    const float *W = w->data;
    int64_t dims[2] = {K, N};
    char name[NM];
    const char *wi;
    if (!wq) {
        float *t = bq_malloc(sizeof(float) * (size_t)(K * N));
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) t[k * N + n] = W[n * K + k];
        wi = bq_onnx_init_float(e->g, wname, 2, dims, t);
        free(t);
    } else {
        BQ_CHECK(wq->is_weight && (wq->nch == 1 || wq->nch == N));
        const float qmin = (float)bq_quant_qmin(wq), qmax = (float)bq_quant_qmax(wq);
        /* CPU layout, 8-bit weights: uint8 w + 128, zero point 128 (ORT's exact U8U8 kernels) */
        const int u8 = e->cpu && wq->bits == 8;
        int8_t *t = bq_malloc((size_t)(K * N));
        for (int64_t n = 0; n < N; n++) {
            float s = wq->scale[wq->nch == 1 ? 0 : n];
            for (int64_t k = 0; k < K; k++) {
                /* the fake-quant kernel's arithmetic: clamp(nearbyint(w / s), qmin, qmax) */
                float q = fminf(fmaxf(nearbyintf(W[n * K + k] / s), qmin), qmax);
                t[k * N + n] = (int8_t)q;
            }
        }
        FMT(name, "%s_quantized", wname);
        if (u8) {
            uint8_t *tu = (uint8_t *)t;
            for (int64_t i = 0; i < K * N; i++) tu[i] = (uint8_t)(t[i] + 128);
        }
        const char *qi = u8 ? bq_onnx_init_uint8(e->g, name, 2, dims, (const uint8_t *)t)
                            : bq_onnx_init_int8(e->g, name, 2, dims, t);
        free(t);
        const char *sc, *zp;
        FMT(name, "%s_scale", wname);
        int64_t n1 = wq->nch;
        sc = wq->nch == 1 ? bq_onnx_init_scalar_float(e->g, name, wq->scale[0])
                          : bq_onnx_init_float(e->g, name, 1, &n1, wq->scale);
        FMT(name, "%s_zero_point", wname);
        uint8_t *z = bq_malloc((size_t)wq->nch);
        memset(z, u8 ? 128 : 0, (size_t)wq->nch);
        zp = u8 ? bq_onnx_init_uint8(e->g, name, wq->nch == 1 ? 0 : 1, &n1, z)
                : bq_onnx_init_int8(e->g, name, wq->nch == 1 ? 0 : 1, &n1, (const int8_t *)z);
        free(z);
        FMT(name, "%s/weight/DequantizeLinear", path);
        Onnx__NodeProto *n = opn(e, "DequantizeLinear", name, 3, (const char *const[]){qi, sc, zp});
        if (wq->nch != 1) bq_onnx_attr_int(e->g, n, "axis", 1);
        wi = n->output[0];
        e->st->dequantize_linear++;
        e->st->int8_weights++;
    }
    const char *mm = op2(e, "MatMul", path, x, wi);
    int64_t nb = N;
    const char *bi = bq_onnx_init_float(e->g, bname, 1, &nb, b->data);
    return op2(e, "Add", path, mm, bi);
}

static const char *layernorm(Ex *e, const char *x, const char *path, const BqTensor *w, const BqTensor *b,
                             const char *wname, const char *bname) {
    int64_t H = w->shape[0];
    const char *wi = bq_onnx_init_float(e->g, wname, 1, &H, w->data);
    const char *bi = bq_onnx_init_float(e->g, bname, 1, &H, b->data);
    float eps = e->m->cfg.layer_norm_eps;
    char name[NM];
    if (e->opt->opset >= 17) {
        FMT(name, "%s/LayerNormalization", path);
        Onnx__NodeProto *n = opn(e, "LayerNormalization", name, 3, (const char *const[]){x, wi, bi});
        bq_onnx_attr_int(e->g, n, "axis", -1);
        bq_onnx_attr_float(e->g, n, "epsilon", eps);
        return n->output[0];
    }
    /* y = (x - mean) / sqrt(var + eps) * w + b, as torch exports layer_norm below opset 17 */
    const int64_t ax[1] = {-1};
    FMT(name, "%s/ReduceMean", path);
    Onnx__NodeProto *r1 = opn(e, "ReduceMean", name, 1, (const char *const[]){x});
    bq_onnx_attr_ints(e->g, r1, "axes", 1, ax);
    bq_onnx_attr_int(e->g, r1, "keepdims", 1);
    const char *sub = op2(e, "Sub", path, x, r1->output[0]);
    const char *pw = op2(e, "Pow", path, sub, cfloat(e, path, "Constant_pow", 2.0f));
    FMT(name, "%s/ReduceMean_1", path);
    Onnx__NodeProto *r2 = opn(e, "ReduceMean", name, 1, (const char *const[]){pw});
    bq_onnx_attr_ints(e->g, r2, "axes", 1, ax);
    bq_onnx_attr_int(e->g, r2, "keepdims", 1);
    const char *ad = op2(e, "Add", path, r2->output[0], cfloat(e, path, "Constant_eps", eps));
    FMT(name, "%s/Sqrt", path);
    const char *sq = op(e, "Sqrt", name, 1, (const char *const[]){ad});
    const char *dv = op2(e, "Div", path, sub, sq);
    const char *mu = op2(e, "Mul", path, dv, wi);
    FMT(name, "%s/Add_1", path);
    return op(e, "Add", name, 2, (const char *const[]){mu, bi});
}

/* exact GELU, HF's x * 0.5 * (1 + erf(x / sqrt(2))) in the form fusion_gelu matches */
static const char *gelu(Ex *e, const char *x, const char *path) {
    char name[NM];
    const char *dv = op2(e, "Div", path, x, cfloat(e, path, "Constant_sqrt2", 1.4142135381698608f));
    FMT(name, "%s/Erf", path);
    const char *er = op(e, "Erf", name, 1, (const char *const[]){dv});
    const char *ad = op2(e, "Add", path, er, cfloat(e, path, "Constant_one", 1.0f));
    const char *mu = op2(e, "Mul", path, x, ad);
    FMT(name, "%s/Mul_1", path);
    return op(e, "Mul", name, 2, (const char *const[]){mu, cfloat(e, path, "Constant_half", 0.5f)});
}

/* (B,T,H) → (B,NH,T,d) with perm; Reshape [0,0,NH,d] then Transpose */
static const char *split_heads(Ex *e, const char *x, const char *path, const int64_t *perm) {
    const BqBertConfig *c = &e->m->cfg;
    int64_t shp[4] = {0, 0, c->num_attention_heads, c->hidden_size / c->num_attention_heads};
    char name[NM];
    const char *r = op2(e, "Reshape", path, x, cints(e, path, "Constant_shape", 4, shp));
    FMT(name, "%s/Transpose", path);
    Onnx__NodeProto *t = opn(e, "Transpose", name, 1, (const char *const[]){r});
    bq_onnx_attr_ints(e->g, t, "perm", 4, perm);
    return t->output[0];
}

/* A module path with '/' written as the state-dict name's '.' (in place). */
static void dotted(char *s) {
    for (; *s; s++)
        if (*s == '/') *s = '.';
}

/* The end of BertSelfOutput (sub "attention/output") and of BertOutput (sub "output") of layer l:
 * LayerNorm(local + resid), local the dense output and resid the block's input; qp names the quantizer
 * points of the Add's two inputs (qdqbert), of the sum and of the LayerNorm output (ort), in that order. */
static const char *add_layernorm(Ex *e, int l, const char *sub, const char *local, const char *resid,
                                 const BqTensor *w, const BqTensor *b, const int qp[4]) {
    char p[NM], wn[NM], bn[NM];
    FMT(p, "/bert/encoder/layer.%d/%s", l, sub);
    const char *y = op2(e, "Add", p, qdq(e, local, qat(e, l, qp[0])), qdq(e, resid, qat(e, l, qp[1])));
    y = qdq(e, y, qat(e, l, qp[2]));
    FMT(p, "/bert/encoder/layer.%d/%s/LayerNorm", l, sub);
    FMT(wn, "bert.encoder.layer.%d.%s.LayerNorm.weight", l, sub);
    FMT(bn, "bert.encoder.layer.%d.%s.LayerNorm.bias", l, sub);
    dotted(wn);
    dotted(bn);
    y = layernorm(e, y, p, w, b, wn, bn);
    return qdq(e, y, qat(e, l, qp[3]));
}

static const char *encoder_layer(Ex *e, int l, const char *x, const char *mask_add) {
    const BqBertConfig *c = &e->m->cfg;
    const BqBertLayer *L = &e->m->layers[l];
    char p[NM], pp[NM], wn[NM], bn[NM], name[NM];
    const int64_t perm_qv[4] = {0, 2, 1, 3}, perm_k[4] = {0, 2, 3, 1};
    const int d = c->hidden_size / c->num_attention_heads;

#define LIN(dst, in, sub, W, B, WP)                                                                \
    do {                                                                                            \
        FMT(pp, "/bert/encoder/layer.%d/%s", l, sub);                              \
        FMT(wn, "bert.encoder.layer.%d.%s.weight", l, sub);                        \
        FMT(bn, "bert.encoder.layer.%d.%s.bias", l, sub);                          \
        dotted(wn);                                                                                \
        dotted(bn);                                                                                \
        dst = linear(e, in, pp, W, B, wn, bn, qat(e, l, WP));                                      \
    } while (0)

    /* BertSelfAttention; xa: the query/key/value input (quantized once by the cpu scheme) */
    const char *q, *k, *v, *xa = qdq(e, x, qat(e, l, BQ_QP_QKV_IN));
    LIN(q, qdq(e, xa, qat(e, l, BQ_QP_Q_IN)), "attention/self/query", &L->q_w, &L->q_b, BQ_QP_W_Q);
    q = qdq(e, q, qat(e, l, BQ_QP_Q_OUT));
    LIN(k, qdq(e, xa, qat(e, l, BQ_QP_K_IN)), "attention/self/key", &L->k_w, &L->k_b, BQ_QP_W_K);
    k = qdq(e, k, qat(e, l, BQ_QP_K_OUT));
    LIN(v, qdq(e, xa, qat(e, l, BQ_QP_V_IN)), "attention/self/value", &L->v_w, &L->v_b, BQ_QP_W_V);
    v = qdq(e, v, qat(e, l, BQ_QP_V_OUT));
    FMT(p, "/bert/encoder/layer.%d/attention/self/query", l);
    const char *qh = qdq(e, split_heads(e, q, p, perm_qv), qat(e, l, BQ_QP_MM1_Q));  /* (B,NH,T,d) */
    FMT(p, "/bert/encoder/layer.%d/attention/self/key", l);
    const char *kh = qdq(e, split_heads(e, k, p, perm_k), qat(e, l, BQ_QP_MM1_K));   /* (B,NH,d,T) */
    FMT(p, "/bert/encoder/layer.%d/attention/self/value", l);
    const char *vh = split_heads(e, v, p, perm_qv);
    FMT(p, "/bert/encoder/layer.%d/attention/self", l);
    const char *s = op2(e, "MatMul", p, qh, kh);                                     /* (B,NH,T,T) */
    s = qdq(e, s, qat(e, l, BQ_QP_SCORES));
    s = op2(e, "Div", p, s, cfloat(e, p, "Constant_sqrt_d", sqrtf((float)d)));
    s = op2(e, "Add", p, s, mask_add);
    FMT(name, "%s/Softmax", p);
    Onnx__NodeProto *sm = opn(e, "Softmax", name, 1, (const char *const[]){s});
    bq_onnx_attr_int(e->g, sm, "axis", -1);
    const char *pr = qdq(e, sm->output[0], qat(e, l, BQ_QP_PROBS));
    pr = qdq(e, pr, qat(e, l, BQ_QP_MM2_P));
    vh = qdq(e, vh, qat(e, l, BQ_QP_MM2_V));
    FMT(name, "%s/MatMul_1", p);
    const char *cx = op(e, "MatMul", name, 2, (const char *const[]){pr, vh});         /* (B,NH,T,d) */
    cx = qdq(e, cx, qat(e, l, BQ_QP_CONTEXT));
    FMT(name, "%s/Transpose", p);
    Onnx__NodeProto *t = opn(e, "Transpose", name, 1, (const char *const[]){cx});
    bq_onnx_attr_ints(e->g, t, "perm", 4, perm_qv);
    int64_t shp[3] = {0, 0, c->hidden_size};
    cx = op2(e, "Reshape", p, t->output[0], cints(e, p, "Constant_merge_shape", 3, shp)); /* (B,T,H) */

    /* BertSelfOutput: LayerNorm(dense(ctx) + x) */
    const char *a;
    LIN(a, qdq(e, cx, qat(e, l, BQ_QP_AO_IN)), "attention/output/dense", &L->ao_w, &L->ao_b, BQ_QP_W_AO);
    a = add_layernorm(e, l, "attention/output", a, x, &L->ln1_w, &L->ln1_b,
                      (const int[4]){BQ_QP_ADD1_LOCAL, BQ_QP_ADD1_RESID, BQ_QP_ATTN_RESID, BQ_QP_ATTN_LN});

    /* BertIntermediate: gelu(dense(a)) */
    const char *h;
    LIN(h, qdq(e, a, qat(e, l, BQ_QP_I_IN)), "intermediate/dense", &L->i_w, &L->i_b, BQ_QP_W_I);
    h = qdq(e, h, qat(e, l, BQ_QP_INTER_OUT));
    FMT(p, "/bert/encoder/layer.%d/intermediate/intermediate_act_fn", l);
    h = gelu(e, h, p);
    h = qdq(e, h, qat(e, l, BQ_QP_GELU_OUT));

    /* BertOutput: LayerNorm(dense(h) + a) */
    const char *o;
    LIN(o, qdq(e, h, qat(e, l, BQ_QP_O_IN)), "output/dense", &L->o_w, &L->o_b, BQ_QP_W_O);
    return add_layernorm(e, l, "output", o, a, &L->ln2_w, &L->ln2_b,
                         (const int[4]){BQ_QP_ADD2_LOCAL, BQ_QP_ADD2_RESID, BQ_QP_OUT_RESID, BQ_QP_OUT_LN});
#undef LIN
}

/* BertForQuestionAnswering's head on the encoder output x (B,T,H), as torch.onnx.export writes
 * logits = qa_outputs(x); start, end = logits.split(1, dim=-1); squeeze(-1): MatMul + Add (fp32 in
 * every scheme) → Split (axis -1, sizes 1, 1) → Squeeze(axes -1) into the graph outputs
 * "start_logits" and "end_logits" (batch, sequence). */
static void qa_head(Ex *e, const char *x) {
    const char *lg = linear(e, x, "/qa_outputs", &e->m->qa_w, &e->m->qa_b, "qa_outputs.weight", "qa_outputs.bias", NULL);
    int64_t two = 2, ones[2] = {1, 1}, last = -1;
    const char *sizes = bq_onnx_init_int64(e->g, "/Constant_split", 1, &two, ones);
    Onnx__NodeProto *sp = bq_onnx_node(e->g, "Split", "/Split", 2, (const char *const[]){lg, sizes}, 2,
                                       (const char *const[]){"/Split_output_0", "/Split_output_1"});
    bq_onnx_attr_int(e->g, sp, "axis", -1);
    int64_t one = 1;
    const char *ax = bq_onnx_init_int64(e->g, "/Constant_squeeze_axes", 1, &one, &last);
    bq_onnx_node(e->g, "Squeeze", "/Squeeze", 2, (const char *const[]){sp->output[0], ax}, 1,
                 (const char *const[]){"start_logits"});
    bq_onnx_node(e->g, "Squeeze", "/Squeeze_1", 2, (const char *const[]){sp->output[1], ax}, 1,
                 (const char *const[]){"end_logits"});
    const int64_t dyn[2] = {-1, -1};
    const char *dp[2] = {"batch", "sequence"};
    bq_onnx_output(e->g, "start_logits", BQ_ONNX_FLOAT, 2, dyn, dp);
    bq_onnx_output(e->g, "end_logits", BQ_ONNX_FLOAT, 2, dyn, dp);
}

/* Position embeddings added to emb: Slice(position_ids[1, max_pos], 0, Shape(input_ids)[1], axis 1),
 * a Gather of the position table, an Add; returns the sum's name. */
static const char *position_embeddings(Ex *e, const char *emb) {
    const BqBert *m = e->m;
    const BqBertConfig *c = &m->cfg;
    const char *P = "/bert/embeddings";
    const int64_t H = c->hidden_size;
    int64_t mp = c->max_position_embeddings;
    int64_t *pos = bq_malloc(sizeof(int64_t) * (size_t)mp);
    for (int64_t i = 0; i < mp; i++) pos[i] = i;
    int64_t dpos[2] = {1, mp};
    const char *posc = bq_onnx_init_int64(e->g, "bert.embeddings.position_ids", 2, dpos, pos);
    free(pos);
    const char *shp = op(e, "Shape", "/bert/embeddings/Shape", 1, (const char *const[]){"input_ids"});
    int64_t one = 1, zero = 0;
    const char *idx1 = bq_onnx_init_int64(e->g, "/bert/embeddings/Constant_1", 0, NULL, &one);
    Onnx__NodeProto *g1 = opn(e, "Gather", "/bert/embeddings/Gather", 2, (const char *const[]){shp, idx1});
    bq_onnx_attr_int(e->g, g1, "axis", 0);
    const char *un = op(e, "Unsqueeze", "/bert/embeddings/Unsqueeze", 2,
                        (const char *const[]){g1->output[0], cints(e, P, "Constant_axes0", 1, &zero)});
    const char *sl = op(e, "Slice", "/bert/embeddings/Slice", 5,
                        (const char *const[]){posc, cints(e, P, "Constant_starts", 1, &zero), un,
                                              cints(e, P, "Constant_axes1", 1, &one),
                                              cints(e, P, "Constant_steps", 1, &one)});
    int64_t dp2[2] = {mp, H};
    const char *pemb = bq_onnx_init_float(e->g, "bert.embeddings.position_embeddings.weight", 2, dp2, m->pos_emb.data);
    const char *pg = op(e, "Gather", "/bert/embeddings/position_embeddings/Gather", 2,
                        (const char *const[]){pemb, sl});
    emb = op(e, "Add", "/bert/embeddings/Add_1", 2, (const char *const[]){emb, pg});
    return emb;
}

/* BertEmbeddings: LayerNorm(word[ids] + type[types] + position[0..T)), then the embeddings' output
 * quantizer; returns its output. Without a token_type_ids input the type-0 row is folded into the
 * word table, *wordfold (freed by the caller after the graph is saved). */
static const char *embeddings(Ex *e, float **wordfold_out) {
    const BqBert *m = e->m;
    const BqBertConfig *c = &m->cfg;
    const BqOnnxOptions *opt = e->opt;
    float *wordfold = NULL;
    const int64_t H = c->hidden_size;
    int64_t d2[2] = {c->vocab_size, H};
    const char *wemb;
    if (opt->token_type_ids) {
        wemb = bq_onnx_init_float(e->g, "bert.embeddings.word_embeddings.weight", 2, d2, m->word_emb.data);
    } else {
        /* no token_type_ids input: every token has type 0; word + type[0] in HF's summation order
         * gives the same floats as the two-Gather graph */
        wordfold = bq_malloc(sizeof(float) * (size_t)(c->vocab_size * H));
        for (int64_t i = 0; i < c->vocab_size; i++)
            for (int64_t j = 0; j < H; j++) wordfold[i * H + j] = m->word_emb.data[i * H + j] + m->type_emb.data[j];
        wemb = bq_onnx_init_float(e->g, "bert.embeddings.word_embeddings.weight", 2, d2, wordfold);
    }
    const char *emb = op(e, "Gather", "/bert/embeddings/word_embeddings/Gather", 2,
                         (const char *const[]){wemb, "input_ids"});
    if (opt->token_type_ids) {
        int64_t dt[2] = {c->type_vocab_size, H};
        const char *temb = bq_onnx_init_float(e->g, "bert.embeddings.token_type_embeddings.weight", 2, dt,
                                              m->type_emb.data);
        const char *tg = op(e, "Gather", "/bert/embeddings/token_type_embeddings/Gather", 2,
                            (const char *const[]){temb, "token_type_ids"});
        emb = op(e, "Add", "/bert/embeddings/Add", 2, (const char *const[]){emb, tg});
    }
    emb = position_embeddings(e, emb);
    const char *x = layernorm(e, emb, "/bert/embeddings/LayerNorm", &m->emb_ln_w, &m->emb_ln_b,
                              "bert.embeddings.LayerNorm.weight", "bert.embeddings.LayerNorm.bias");
    x = qdq(e, x, qat(e, BQ_QP_LAYER_EMB, -1));
    *wordfold_out = wordfold;
    return x;
}

/* The extended attention mask (B,1,1,T), (1 - mask) * float32 min, shared by every layer; returns its
 * name. */
static const char *attention_mask_add(Ex *e) {
    const char *Pm = "/bert";
    int64_t one = 1, two = 2;
    const char *u1 = op(e, "Unsqueeze", "/bert/Unsqueeze", 2,
                        (const char *const[]){"attention_mask", cints(e, Pm, "Constant_axes_1", 1, &one)});
    const char *u2 = op(e, "Unsqueeze", "/bert/Unsqueeze_1", 2,
                        (const char *const[]){u1, cints(e, Pm, "Constant_axes_2", 1, &two)});
    Onnx__NodeProto *cst = opn(e, "Cast", "/bert/Cast", 1, (const char *const[]){u2});
    bq_onnx_attr_int(e->g, cst, "to", BQ_ONNX_FLOAT);
    const char *sb = op(e, "Sub", "/bert/Sub", 2,
                        (const char *const[]){cfloat(e, Pm, "Constant_one", 1.0f), cst->output[0]});
    const char *mask_add = op(e, "Mul", "/bert/Mul", 2, (const char *const[]){sb, cfloat(e, Pm, "Constant_min", -FLT_MAX)});
    return mask_add;
}

/* The classification head on the last layer's output x: BertPooler tanh(dense(x[:, 0])) and the
 * classifier (dropout is the identity at inference), whose Add is the graph output "logits", and the
 * metadata num_labels and id2label.<i>. */
static void cls_head(Ex *e, const char *x) {
    const BqBert *m = e->m;
    const BqBertConfig *c = &m->cfg;
    char name[NM];
    int64_t zero = 0;
    const char *i0 = bq_onnx_init_int64(e->g, "/bert/pooler/Constant_index0", 0, NULL, &zero);
    Onnx__NodeProto *g0 = opn(e, "Gather", "/bert/pooler/Gather", 2, (const char *const[]){x, i0});
    bq_onnx_attr_int(e->g, g0, "axis", 1);
    const char *pl = linear(e, g0->output[0], "/bert/pooler/dense", &m->pool_w, &m->pool_b,
                            "bert.pooler.dense.weight", "bert.pooler.dense.bias", NULL);
    pl = op(e, "Tanh", "/bert/pooler/activation/Tanh", 1, (const char *const[]){pl});
    /* classifier: MatMul + Add whose output is the graph output "logits" */
    {
        const BqTensor *w = &m->cls_w;
        int64_t N = w->shape[0], K = w->shape[1];
        float *t = bq_malloc(sizeof(float) * (size_t)(K * N));
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) t[k * N + n] = w->data[n * K + k];
        int64_t dims[2] = {K, N};
        const char *wi = bq_onnx_init_float(e->g, "classifier.weight", 2, dims, t);
        free(t);
        const char *mm = op(e, "MatMul", "/classifier/MatMul", 2, (const char *const[]){pl, wi});
        const char *bi = bq_onnx_init_float(e->g, "classifier.bias", 1, &N, m->cls_b.data);
        bq_onnx_node(e->g, "Add", "/classifier/Add", 2, (const char *const[]){mm, bi}, 1,
                     (const char *const[]){"logits"});
        int64_t od[2] = {-1, c->num_labels};
        bq_onnx_output(e->g, "logits", BQ_ONNX_FLOAT, 2, od, (const char *const[]){"batch", ""});
    }
    FMT(name, "%d", c->num_labels);
    bq_onnx_metadata(e->g, "num_labels", name);
    for (int i = 0; i < c->num_labels && c->id2label; i++) {
        FMT(name, "id2label.%d", i);
        bq_onnx_metadata(e->g, name, c->id2label[i]);
    }
}

int bq_onnx_export_bert(const BqBert *m, BqQuantState *qs, const BqOnnxOptions *opt, const char *path,
                        BqOnnxStats *stats) {
    BqOnnxStats st_local;
    if (!stats) stats = &st_local;
    memset(stats, 0, sizeof *stats);
    if (opt->opset < 13 || opt->opset > 21)
        return bq_err(BQ_EINVAL, "--opset: %d is outside 13..21 (per-channel DequantizeLinear needs 13)", opt->opset);
    if (opt->qdq && !qs) return bq_err(BQ_EINVAL, "--qdq on: the model has no quantizers (an fp32 checkpoint)");
    const BqBertConfig *c = &m->cfg;
    Ex e = {.m = m, .qs = qs, .opt = opt, .st = stats};
    /* the cpu scheme exists for ORT CPU: its only layout is the CPU layout */
    e.cpu = opt->qdq && (opt->cpu_layout || qs->cfg.scheme == BQ_SCHEME_CPU);
    if (opt->qdq) e.placed = bq_calloc((size_t)qs->n + 1, 1);
    e.g = bq_onnx_graph_new(c->head == BQ_HEAD_QA ? "bertqat_bert_for_question_answering"
                                                   : "bertqat_bert_for_sequence_classification");
    int st = BQ_OK;
    float *wordfold = NULL;
    const int itype = opt->input_int32 ? BQ_ONNX_INT32 : BQ_ONNX_INT64;
    const int64_t dyn[2] = {-1, -1};
    const char *dp[2] = {"batch", "sequence"};

    bq_onnx_input(e.g, "input_ids", itype, 2, dyn, dp);
    bq_onnx_input(e.g, "attention_mask", itype, 2, dyn, dp);
    if (opt->token_type_ids) bq_onnx_input(e.g, "token_type_ids", itype, 2, dyn, dp);
    if (opt->qdq)
        e.zp = e.cpu ? bq_onnx_init_scalar_uint8(e.g, "zero_point_uint8", 128)
                     : bq_onnx_init_scalar_int8(e.g, "zero_point_int8", 0);

    const char *x = embeddings(&e, &wordfold);
    const char *mask_add = attention_mask_add(&e);

    for (int l = 0; l < c->num_hidden_layers; l++) x = encoder_layer(&e, l, x, mask_add);
    /* every quantizer of the table (BQ_QPOINTS filtered by the scheme) must have its place in the
     * graph, else the export would silently differ from the model that was trained */
    for (int i = 0; opt->qdq && i < qs->n; i++) BQ_CHECK(e.placed[i] && "a quantizer has no place in the ONNX graph");
    if (e.status) {
        st = e.status;
        goto cleanup;
    }

    if (c->head == BQ_HEAD_QA) qa_head(&e, x);
    else cls_head(&e, x);
    bq_onnx_metadata(e.g, "task", c->head == BQ_HEAD_QA ? "question-answering" : "text-classification");
    bq_onnx_metadata(e.g, "quantization", opt->qdq ? bq_scheme_name(qs->cfg.scheme) : "none");
    if (opt->qdq) bq_onnx_metadata(e.g, "qdq_layout", e.cpu ? "cpu" : "default");
    stats->cpu_layout = e.cpu;
    stats->nodes = bq_onnx_graph_node_count(e.g);
    st = bq_onnx_save(e.g, opt->opset, path);

cleanup:
    free(wordfold);
    free(e.placed);
    free(e.memo);
    bq_onnx_graph_free(e.g);
    return st;
}
