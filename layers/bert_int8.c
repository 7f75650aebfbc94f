/* Integer inference forward of a quantized BERT (layers/bert_int8.h).
 *
 * The forward is layers/bert.c's (bq_bert_forward_hooked, without a tape); this file supplies its
 * BqLinearHook, so only the Linears differ: one whose input and weight are both quantized becomes:
 *   codes = clamp(rne(x / sx), -128, 127)       (bq_qgemm_quantize_u8: the fake quantizer's rounding)
 *   y     = fl(fl(Σ codes·qw · fl(sx·sw[n])) + b[n])   (bq_qgemm_linear, exact integer sum)
 * with qw = clamp(rne(w / sw[n]), qmin, qmax), the weight quantizer's codes (so fl(qw·sw) is exactly
 * the fake-quantized weight). Query, key and value share one input quantizer in the cpu scheme
 * (attention.self.input_quantizer), and qdqbert's three have one scale unless learned apart: then they
 * run as one (3H, H) GEMM.
 *
 * Memory: the engine owns the packed codes, the scales and copies of the biases; a forward takes its
 * activations, codes and int32 accumulators from ctx->act, which the caller rewinds. Packed while a
 * checkpoint loads (bq_int8_load_step), it gives back the fp32 storage of each weight it packed, so the
 * model holds no fp32 copy of an integer Linear's weight and never holds all of them at once. */
#include "layers/bert_int8.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "autograd/infer_kernels.h"
#include "autograd/kernels.h"
#include "autograd/qgemm.h"
#include "layers/bert_fused.h"
#include "layers/quant.h"

/* A product of N columns in np column pieces of N/np each (bq_int8_set_piece_macs): piece c is nout runs
 * of N/(np·nout) columns, run r holding columns [r·N/nout + c·N/(np·nout), ...) of the product's natural
 * order, where nout is 3 for the fused query/key/value product (piece c: heads [c·NH/np, (c+1)·NH/np) of
 * the query, the key and the value) and 1 for the intermediate dense (columns [c·N/np, (c+1)·N/np)). */
#define PIECES_MAX 4

typedef struct Int8Linear {
    BqQGemmWeights *w[PIECES_MAX]; /* the np pieces' codes; w[0] NULL: the fake-quant fp32 Linear */
    int np;                        /* 1: one product (every Linear but the two above) */
    float sx;                      /* the input quantizer's scale */
    float *bias;                   /* (N) copy in piece order, concatenated for query/key/value */
    float *scale;                  /* (N) fl(sx·sw[n]) in piece order, autograd/qgemm.h's dequantization */
} Int8Linear;

typedef struct Int8Layer {
    int fused_qkv;       /* qkv[0] is the (3H, H) product of query, key and value */
    int whole;           /* the layer runs as one fused block (layers/bert_fused.h); see bq_int8_prepare */
    int with_fq;         /* whole, with the fake quantizers fq between the GEMMs (ort, qdqbert: fq_points) */
    BqFq fq[BQ_FQ_LAYER];
    BqGeluFq gelu;       /* with_fq: the intermediate dense's GELU pass (its table built once, at planning) */
    int ok[6];           /* Linear j (query … output.dense) runs on integers (plan_layer) */
    BqQuantizer *iq[6];  /* the grid of Linear j's input, where ok[j] */
    int groups;          /* groups of Linears packed so far (pack_group), 0..4: the layer is packed at 4 */
    int qkv_np, inter_np; /* pieces of the fused query/key/value product and of the intermediate dense */
    Int8Linear qkv[3], ao, inter, out;
} Int8Layer;

struct BqInt8Engine {
    int num_layers, hidden, inter, heads;
    Int8Layer *layers;
    int nlinear, ngemm, nwhole, npieces;
    int use_whole;       /* bq_int8_set_layer_fusion */
    int64_t step_rows;   /* bq_int8_set_step_rows; 0: the default, by thread count (bq_int8_step_rows) */
    int64_t pass_rows;   /* bq_int8_set_pass_rows */
    int next_layer;      /* bq_int8_load_step: the first layer not wholly packed yet */
};

/* ---- preparation ---- */

/* Where the scheme gives Linear j no input quantizer (ort quantizes op outputs), the per-tensor grid its
 * input already lies on, as layers/bert.c's forward reads it (grid_of): the output quantizer of the op
 * that makes the input, the embeddings' or the previous layer's LayerNorm output for query/key/value,
 * the attention context for the attention output, the attention LayerNorm output for the intermediate,
 * the GELU output for the output dense. NULL: none (the Linear stays the fp32 fake-quant Linear). */
static BqQuantizer *grid_quantizer(BqQuantState *qs, int l, int j) {
    if (qs->fp32_linear) return NULL;
    static const int made_by[6] = {BQ_QP_OUT_LN, BQ_QP_OUT_LN, BQ_QP_OUT_LN, BQ_QP_CONTEXT, BQ_QP_ATTN_LN,
                                   BQ_QP_GELU_OUT};
    BqQuantizer *q = j >= 3 ? bq_quant_at(qs, l, made_by[j])
                     : l > 0 ? bq_quant_at(qs, l - 1, made_by[j])
                             : bq_quant_at(qs, BQ_QP_LAYER_EMB, -1);
    return q && !q->is_weight && q->nch == 1 && q->bits == 8 && q->scale[0] > 0.0f ? q : NULL;
}

/* The quantizer whose grid the input of Linear j (0..2 query/key/value, 3 attention.output, 4
 * intermediate, 5 output) lies on: its own input quantizer, the shared query/key/value one (the cpu
 * scheme's attention.self.input_quantizer), or, where the scheme puts neither, grid_quantizer's. NULL,
 * and the Linear stays the fp32 fake-quant Linear, when there is none, when it is disabled (kept in
 * fp32) or when two quantizers are chained (no scheme does that). */
static BqQuantizer *input_grid(BqQuantState *qs, int l, int j) {
    static const int own[6] = {BQ_QP_Q_IN, BQ_QP_K_IN, BQ_QP_V_IN, BQ_QP_AO_IN, BQ_QP_I_IN, BQ_QP_O_IN};
    BqQuantizer *a = bq_quant_at(qs, l, own[j]), *shared = j < 3 ? bq_quant_at(qs, l, BQ_QP_QKV_IN) : NULL;
    BqQuantizer *q = a && shared ? NULL : a ? a : shared ? shared : grid_quantizer(qs, l, j);
    return q && q->enabled ? q : NULL;
}

/* 1 when the only quantizers of layer l are the Linears' inputs and weights (the cpu scheme): then
 * everything between two GEMMs is fp32 and the layer can run as one fused block. */
static int linear_points_only(BqQuantState *qs, int l) {
    for (int pt = 0; pt < BQ_QP_LAYER_COUNT; pt++) {
        if (!bq_quant_at(qs, l, pt)) continue;
        switch (pt) {
        case BQ_QP_W_Q: case BQ_QP_W_K: case BQ_QP_W_V: case BQ_QP_W_AO: case BQ_QP_W_I: case BQ_QP_W_O:
        case BQ_QP_QKV_IN: case BQ_QP_AO_IN: case BQ_QP_I_IN: case BQ_QP_O_IN: break;
        default: return 0;
        }
    }
    return 1;
}

static const int weight_point[6] = {BQ_QP_W_Q, BQ_QP_W_K, BQ_QP_W_V, BQ_QP_W_AO, BQ_QP_W_I, BQ_QP_W_O};

/* The place (autograd/infer_kernels.h, BQ_FQ_*) of each quantizer that sits between a layer's GEMMs: the
 * ort scheme's op outputs and qdqbert's inputs of the attention products and residual adds. The two
 * attention products read their inputs' grids (layers/bert.c attention_context, grid_of): the query's,
 * key's and value's output quantizers (ort) or the products' input quantizers (qdqbert); the
 * probabilities' output quantizer (ort) or the context product's (qdqbert). -1: a Linear's weight or
 * input quantizer, which the Linears take. */
static int fq_place(int pt) {
    switch (pt) {
    case BQ_QP_Q_OUT: case BQ_QP_MM1_Q: return BQ_FQ_Q;
    case BQ_QP_K_OUT: case BQ_QP_MM1_K: return BQ_FQ_K;
    case BQ_QP_V_OUT: case BQ_QP_MM2_V: return BQ_FQ_V;
    case BQ_QP_SCORES: return BQ_FQ_SCORES;
    case BQ_QP_PROBS: case BQ_QP_MM2_P: return BQ_FQ_PROBS;
    case BQ_QP_CONTEXT: return BQ_FQ_CONTEXT;
    case BQ_QP_ADD1_LOCAL: return BQ_FQ_ATTN_LOCAL;
    case BQ_QP_ADD1_RESID: return BQ_FQ_ATTN_SKIP;
    case BQ_QP_ATTN_RESID: return BQ_FQ_ATTN_SUM;
    case BQ_QP_ATTN_LN: return BQ_FQ_ATTN_LN;
    case BQ_QP_INTER_OUT: return BQ_FQ_INTER;
    case BQ_QP_GELU_OUT: return BQ_FQ_GELU;
    case BQ_QP_ADD2_LOCAL: return BQ_FQ_OUT_LOCAL;
    case BQ_QP_ADD2_RESID: return BQ_FQ_OUT_SKIP;
    case BQ_QP_OUT_RESID: return BQ_FQ_OUT_SUM;
    case BQ_QP_OUT_LN: return BQ_FQ_OUT_LN;
    default: return -1;
    }
}

/* 1 when layer l's quantizers between the GEMMs let it run as one fused block whose kernels apply them
 * (autograd/infer_kernels.h, "the fused layers with fake quantizers"): both attention products on codes
 * (the query's, key's, value's and probabilities' grids enabled), every other place holding at most one
 * quantizer, each enabled one per tensor with a range of at most 8 bits; a place whose quantizer is left
 * in fp32 (--keep-fp32) is empty. The fake quantizers go to fq (s = 0 where a place is empty). The ort
 * and qdqbert schemes' layers qualify; a layer kept in fp32 where the attention products read their
 * grids stays op by op (layers/bert.c then multiplies floats). */
static int fq_points(BqQuantState *qs, int l, BqFq fq[BQ_FQ_LAYER]) {
    int taken[BQ_FQ_LAYER] = {0};
    memset(fq, 0, BQ_FQ_LAYER * sizeof *fq);
    for (int pt = 0; pt < BQ_QP_LAYER_COUNT; pt++) {
        const BqQuantizer *q = bq_quant_at(qs, l, pt);
        const int place = fq_place(pt);
        if (!q || place < 0) continue;
        if (taken[place]++) return 0; /* two chained quantizers: no scheme places them */
        if (!q->enabled) continue;
        if (!q->initialized || q->nch != 1 || q->bits > 8 || !(q->scale[0] > 0.0f)) return 0;
        fq[place] = (BqFq){q->scale[0], (float)bq_quant_qmin(q), (float)bq_quant_qmax(q)};
    }
    return fq[BQ_FQ_Q].s > 0.0f && fq[BQ_FQ_K].s > 0.0f && fq[BQ_FQ_V].s > 0.0f && fq[BQ_FQ_PROBS].s > 0.0f;
}

/* 1 when a and b put a Linear's input on the same codes: the same quantizer, or two 8-bit per-tensor ones
 * with equal scales (qdqbert's query, key and value input quantizers, calibrated on one tensor). */
static int same_grid(const BqQuantizer *a, const BqQuantizer *b) {
    return a == b || (a->nch == 1 && b->nch == 1 && a->bits == b->bits && a->scale[0] == b->scale[0]);
}

static const BqTensor *linear_weight(const BqBertLayer *L, int j) {
    const BqTensor *w[6] = {&L->q_w, &L->k_w, &L->v_w, &L->ao_w, &L->i_w, &L->o_w};
    return w[j];
}
static const BqTensor *linear_bias(const BqBertLayer *L, int j) {
    const BqTensor *b[6] = {&L->q_b, &L->k_b, &L->v_b, &L->ao_b, &L->i_b, &L->o_b};
    return b[j];
}

/* Codes of rows [n0, n0 + N) of weight w (rows of K) into dst (N,K): clamp(rne(w / s[n]), qmin, qmax), the
 * rounding of bq_kernel_fakequant_forward. */
static void weight_codes(int8_t *dst, const float *w, int64_t n0, int64_t N, int64_t K, const BqQuantizer *q) {
    const float lo = (float)bq_quant_qmin(q), hi = (float)bq_quant_qmax(q);
    const float magic = 12582912.0f; /* 1.5·2^23: (v + magic) − magic rounds to nearest even */
    w += n0 * K;
    for (int64_t n = 0; n < N; n++) {
        float s = q->scale[q->nch == 1 ? 0 : n0 + n];
        for (int64_t k = 0; k < K; k++) {
            float v = w[n * K + k] / s;
            v = v < lo ? lo : v;
            v = v > hi ? hi : v;
            v = v == v ? v : 0.0f;
            dst[n * K + k] = (int8_t)(int)((v + magic) - magic);
        }
    }
}

/* Packs Linears js[0..cnt) of layer l (same K, same input quantizer) as one product of their stacked
 * rows, in np pieces (Int8Linear) of cnt runs: Linear i's rows [c·n/np, (c+1)·n/np) are run i of piece c,
 * and each piece is its own weights. */
static int pack_linear(Int8Linear *il, const BqBert *m, int l, const int *js, int cnt, BqQuantizer *iq, int np) {
    BqQuantState *qs = m->quant;
    const BqBertLayer *L = &m->layers[l];
    const int64_t K = linear_weight(L, js[0])->shape[1];
    int64_t N = 0;
    for (int i = 0; i < cnt; i++) N += linear_weight(L, js[i])->shape[0];
    const int64_t pn = N / np;
    BQ_CHECK(np >= 1 && np <= PIECES_MAX && pn * np == N);
    int8_t *codes = bq_malloc((size_t)(N * K));
    float *sw = bq_malloc((size_t)N * sizeof(float));
    il->bias = bq_malloc((size_t)N * sizeof(float));
    il->scale = bq_malloc((size_t)N * sizeof(float));
    il->np = np;
    il->sx = iq->scale[0];
    int bits = 0, rc = BQ_OK;
    int64_t row = 0; /* the rows of the Linears before i */
    for (int i = 0; i < cnt; i++) {
        const BqTensor *w = linear_weight(L, js[i]), *bt = linear_bias(L, js[i]);
        const BqQuantizer *wq = bq_quant_at(qs, l, weight_point[js[i]]);
        const int64_t n = w->shape[0], rw = n / np;
        BQ_CHECK(w->shape[1] == K && (wq->nch == 1 || wq->nch == n) && rw * np == n && (np == 1 || n * cnt == N));
        if (i > 0 && wq->bits != bits) {
            rc = bq_err(BQ_EINVAL, "int8 engine: %s has %d bits, unlike its fused neighbours", wq->name, wq->bits);
            goto cleanup;
        }
        bits = wq->bits;
        for (int c = 0; c < np; c++) {
            const int64_t dst = c * pn + row / np, n0 = c * rw;
            weight_codes(codes + dst * K, w->data, n0, rw, K, wq);
            for (int64_t r = 0; r < rw; r++) sw[dst + r] = wq->scale[wq->nch == 1 ? 0 : n0 + r];
            memcpy(il->bias + dst, bt->data + n0, (size_t)rw * sizeof(float));
        }
        row += n;
    }
    for (int64_t r = 0; r < N; r++) il->scale[r] = il->sx * sw[r];
    const char *name = bq_quant_at(qs, l, weight_point[js[0]])->name;
    for (int c = 0; c < np && !rc; c++) {
        const int8_t *qc = codes + c * pn * K;
        const float *qsw = sw + c * pn;
        if (bits <= 7 || bq_qgemm_exact_8bit()) {
            rc = bq_qgemm_weights_create(&il->w[c], qc, qsw, pn, pn, K, bits, name);
            continue;
        }
        /* 8-bit codes where oneDNN's int8 kernels sum u8·s8 pairs in saturating int16: the weights object
         * of the QAT forward, which sums the codes exactly with sgemm on floats (autograd/qgemm.h). It takes
         * the fake-quantized values fl(q·s), from which it recovers q exactly. */
        float *wf = bq_malloc((size_t)(pn * K) * sizeof(float));
        for (int64_t r = 0; r < pn; r++)
            for (int64_t k = 0; k < K; k++) wf[r * K + k] = (float)qc[r * K + k] * qsw[r];
        rc = bq_qgemm_weights_create_empty(&il->w[c], pn, K, bits, name);
        if (!rc) {
            bq_qgemm_weights_set(il->w[c], wf, qsw, pn);
            bq_qgemm_weights_freeze(il->w[c]); /* 4 bytes per weight, not 5 */
        }
        free(wf);
    }

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
            for (int c = 0; c < PIECES_MAX; c++) bq_qgemm_weights_free(all[j]->w[c]);
            free(all[j]->bias);
            free(all[j]->scale);
        }
    }
    free(e->layers);
    free(e);
}

static int64_t g_piece_macs; /* bq_int8_set_piece_macs; 0: BQ_INT8_PIECE_MACS */

void bq_int8_set_piece_macs(int64_t macs) { g_piece_macs = macs > 0 ? macs : 0; }

/* The pieces of a fused layer's product of N columns over K inputs whose columns come in `units` equal
 * groups that a piece must not split (heads, or 16 columns: the epilogues' kernels are chosen by the
 * width's multiples of 16, so pieces keep the whole product's kernels and bits): the most, up to
 * PIECES_MAX, that divide the groups and leave each piece at least the multiply-adds per row that
 * bq_int8_set_piece_macs sets; 1 where none does. */
static int piece_count(int64_t N, int64_t K, int64_t units) {
    const int64_t macs = g_piece_macs ? g_piece_macs : BQ_INT8_PIECE_MACS;
    for (int np = PIECES_MAX; np > 1; np--)
        if (units % np == 0 && N / np * K >= macs) return np;
    return 1;
}

/* Decides, from the quantizers alone, which Linears of layer l run on integers (IL->iq, IL->ok,
 * IL->fused_qkv, IL->whole) and counts them; reads no weight. */
static int plan_layer(BqInt8Engine *e, const BqBert *m, int l) {
    BqQuantState *qs = m->quant;
    const BqBertConfig *c = &m->cfg;
    Int8Layer *IL = &e->layers[l];
    for (int j = 0; j < 6; j++) {
        const BqQuantizer *wq = bq_quant_at(qs, l, weight_point[j]);
        IL->iq[j] = input_grid(qs, l, j);
        IL->ok[j] = IL->iq[j] && wq && wq->enabled;
        if (IL->ok[j] && (IL->iq[j]->bits != 8 || IL->iq[j]->nch != 1))
            return bq_err(BQ_EINVAL, "int8 engine: %s must be a per-tensor 8-bit quantizer (has %d bits, %lld scales)",
                          IL->iq[j]->name, IL->iq[j]->bits, (long long)IL->iq[j]->nch);
    }
    const int *ok = IL->ok;
    IL->fused_qkv = ok[0] && ok[1] && ok[2] && same_grid(IL->iq[0], IL->iq[1]) && same_grid(IL->iq[1], IL->iq[2]);
    for (int j = 0; j < 6; j++) e->nlinear += ok[j];
    e->ngemm += IL->fused_qkv ? 1 + ok[3] + ok[4] + ok[5] : ok[0] + ok[1] + ok[2] + ok[3] + ok[4] + ok[5];
    const int d = c->hidden_size / c->num_attention_heads,
              linears = ok[0] && ok[1] && ok[2] && ok[3] && ok[4] && ok[5];
    /* the fake-quant block's attention products sum codes of at most 8 bits in fp32: exact while d·128² and
     * T·128² stay within 2^24 (autograd/infer_kernels.h) */
    const int exact = (int64_t)d * 128 * 128 <= (1 << 24) && (int64_t)c->max_position_embeddings * 128 * 128 <= (1 << 24);
    const int plain = linear_points_only(qs, l);
    IL->with_fq = linears && d % 8 == 0 && exact && !plain && fq_points(qs, l, IL->fq);
    if (IL->with_fq) bq_infer_gelu_fq_prepare(&IL->gelu, IL->fq[BQ_FQ_INTER], IL->fq[BQ_FQ_GELU], IL->iq[5]->scale[0]);
    IL->whole = linears && d % 8 == 0 && (plain || IL->with_fq);
    e->nwhole += IL->whole;
    /* a fused layer's two widest products in column pieces, so that a block's int32 sums take one piece's
     * room (linear_step); the op-by-op path puts their columns back in order (int8_linear) */
    const int64_t H = c->hidden_size, NI = c->intermediate_size;
    IL->qkv_np = IL->whole && IL->fused_qkv ? piece_count(3 * H, H, c->num_attention_heads) : 1;
    IL->inter_np = IL->whole && NI % 16 == 0 ? piece_count(NI, H, NI / 16) : 1;
    e->npieces += (IL->fused_qkv ? IL->qkv_np : ok[0] + ok[1] + ok[2]) + ok[3] + ok[4] * IL->inter_np + ok[5];
    return BQ_OK;
}

int bq_int8_begin(BqInt8Engine **out, const BqBert *m) {
    BQ_CHECK(out && m);
    *out = NULL;
    BqQuantState *qs = m->quant;
    if (!qs) return bq_err(BQ_EINVAL, "int8 engine: the model has no quantizers (an fp32 checkpoint)");
    if (qs->calib != BQ_CALIB_OFF) return bq_err(BQ_EINVAL, "int8 engine: the quantizers are still calibrating");
    for (int i = 0; i < qs->n; i++)
        if (qs->q[i].enabled && !qs->q[i].initialized)
            return bq_err(BQ_EINVAL, "int8 engine: quantizer %s has no range (calibrate or train first)",
                          qs->q[i].name);
    const BqBertConfig *c = &m->cfg;
    BqInt8Engine *e = bq_calloc(1, sizeof *e);
    e->num_layers = c->num_hidden_layers;
    e->hidden = c->hidden_size;
    e->inter = c->intermediate_size;
    e->heads = c->num_attention_heads;
    e->use_whole = 1;
    bq_int8_set_step_rows(e, 0);
    bq_int8_set_pass_rows(e, 0);
    e->layers = bq_calloc((size_t)e->num_layers, sizeof *e->layers);
    int rc = BQ_OK;
    for (int l = 0; l < e->num_layers && !rc; l++) rc = plan_layer(e, m, l);
    if (!rc && e->nlinear == 0)
        rc = bq_err(BQ_EINVAL, "int8 engine: scheme '%s' leaves no Linear with both input and weight quantized",
                    bq_scheme_name(qs->cfg.scheme));
    if (rc) {
        bq_int8_free(e);
        return rc;
    }
    *out = e;
    return BQ_OK;
}

/* The table index of the weight of Linear j (0..5: query … output.dense) of layer l. */
static int weight_param(const BqBert *m, int l, int j) {
    static const char *const names[6] = {"attention.self.query", "attention.self.key", "attention.self.value",
                                         "attention.output.dense", "intermediate.dense", "output.dense"};
    char n[BQ_NAME_MAX];
    snprintf(n, sizeof n, "bert.encoder.layer.%d.%s.weight", l, names[j]);
    const int i = bq_params_find(&m->params, n);
    BQ_CHECK(i >= 0);
    return i;
}

/* A layer's Linears are packed in four groups, each once its weights and biases are read: query, key
 * and value (one product or three), attention.output, intermediate, output. The last parameter of
 * group g in table order (layers/bert.h: each weight is followed by its bias). */
static const char *const group_last[4] = {"attention.self.value.bias", "attention.output.dense.bias",
                                          "intermediate.dense.bias", "output.dense.bias"};

/* Packs the next group of layer l's integer Linears (IL->groups) as plan_layer chose them, from m's weights
 * as they are now. */
static int pack_group(BqInt8Engine *e, const BqBert *m, int l) {
    BQ_CHECK(e && m && l >= 0 && l < e->num_layers && e->layers[l].groups < 4);
    Int8Layer *IL = &e->layers[l];
    const int g = IL->groups;
    static const int qkv[3] = {0, 1, 2};
    Int8Linear *rest[3] = {&IL->ao, &IL->inter, &IL->out};
    int rc = BQ_OK;
    if (g == 0 && IL->fused_qkv) rc = pack_linear(&IL->qkv[0], m, l, qkv, 3, IL->iq[0], IL->qkv_np);
    for (int j = 0; g == 0 && !IL->fused_qkv && j < 3 && !rc; j++)
        if (IL->ok[j]) rc = pack_linear(&IL->qkv[j], m, l, &qkv[j], 1, IL->iq[j], 1);
    if (g > 0 && IL->ok[g + 2])
        rc = pack_linear(rest[g - 1], m, l, (const int[]){g + 2}, 1, IL->iq[g + 2], g == 2 ? IL->inter_np : 1);
    if (!rc) IL->groups++;
    return rc;
}

/* Gives back the fp32 storage of the weights of group g of layer l that run on integers, and their
 * quantizers' per-channel observer state (QAT's moving minima and maxima, which no forward reads: a model
 * whose weights are given back is never trained or saved; layers/bert.h). */
static void release_group(const BqInt8Engine *e, BqBert *m, int l, int g) {
    for (int j = g ? g + 2 : 0; j <= g + 2; j++) {
        if (!e->layers[l].ok[j]) continue;
        bq_bert_param_release(m, weight_param(m, l, j));
        BqQuantizer *wq = bq_quant_at(m->quant, l, weight_point[j]);
        free(wq->ch_min);
        free(wq->ch_max);
        wq->ch_min = wq->ch_max = NULL;
    }
}

int bq_int8_load_step(BqInt8Engine *e, BqBert *m, int i) {
    /* each group as soon as its last parameter is read, its fp32 weights given back at once: the load
     * holds at most one group's fp32 weights besides the packed ones */
    while (e->next_layer < e->num_layers) {
        const int l = e->next_layer, g = e->layers[l].groups;
        char n[BQ_NAME_MAX];
        snprintf(n, sizeof n, "bert.encoder.layer.%d.%s", l, group_last[g]);
        if (bq_params_find(&m->params, n) > i) break;
        int rc = pack_group(e, m, l);
        if (rc) return rc;
        release_group(e, m, l, g);
        if (e->layers[l].groups == 4) e->next_layer++;
    }
    return BQ_OK;
}

int bq_int8_prepare(BqInt8Engine **out, const BqBert *m) {
    int rc = bq_int8_begin(out, m);
    for (int l = 0; l < m->cfg.num_hidden_layers && !rc; l++)
        while (!rc && (*out)->layers[l].groups < 4) rc = pack_group(*out, m, l);
    if (rc && *out) {
        bq_int8_free(*out);
        *out = NULL;
    }
    return rc;
}

int64_t bq_int8_bytes(const BqInt8Engine *e) {
    int64_t n = sizeof *e + (int64_t)e->num_layers * (int64_t)sizeof *e->layers;
    for (int l = 0; l < e->num_layers; l++) {
        const Int8Layer *IL = &e->layers[l];
        const Int8Linear *all[6] = {&IL->qkv[0], &IL->qkv[1], &IL->qkv[2], &IL->ao, &IL->inter, &IL->out};
        for (int j = 0; j < 6; j++)
            for (int c = 0; c < all[j]->np; c++)
                n += bq_qgemm_weights_bytes(all[j]->w[c]) + 2 * bq_qgemm_weights_n(all[j]->w[c]) * (int64_t)sizeof(float);
    }
    return n;
}

int bq_int8_linear_count(const BqInt8Engine *e) { return e->nlinear; }
int bq_int8_fused_layer_count(const BqInt8Engine *e) { return e->use_whole ? e->nwhole : 0; }
void bq_int8_set_layer_fusion(BqInt8Engine *e, int on) { e->use_whole = on != 0; }
int64_t bq_int8_step_rows(const BqInt8Engine *e) {
    if (e->step_rows > 0) return e->step_rows;
    const int64_t cap = bq_fused_block_rows(e->inter); /* e->inter > 0: a validated config */
    const int64_t by_threads = (int64_t)omp_get_max_threads() * BQ_INT8_BLOCK_BYTES_PER_THREAD / (4 * e->inter);
    return by_threads < 1 ? 1 : by_threads < cap ? by_threads : cap;
}

void bq_int8_set_pass_rows(BqInt8Engine *e, int64_t rows) {
    const int64_t by_bytes = BQ_INT8_PASS_BYTES / (4 * e->hidden); /* e->hidden > 0: a validated config */
    e->pass_rows = rows > 0 ? rows : by_bytes > 1 ? by_bytes : 1;
}
int64_t bq_int8_pass_rows(const BqInt8Engine *e) { return e->pass_rows; }
void bq_int8_set_step_rows(BqInt8Engine *e, int64_t rows) { e->step_rows = rows > 0 ? rows : 0; }
int bq_int8_gemm_count(const BqInt8Engine *e) { return e->ngemm; }
int bq_int8_piece_count(const BqInt8Engine *e) { return e->npieces; }

const char *bq_int8_fp32_linears(const BqInt8Engine *e, char *buf, size_t n) {
    static const char *names[6] = {"query", "key", "value", "attention.output", "intermediate", "output"};
    size_t len = 0;
    buf[0] = 0;
    for (int l = 0; l < e->num_layers; l++) {
        const Int8Layer *IL = &e->layers[l];
        const Int8Linear *lin[6] = {&IL->qkv[0], &IL->qkv[1], &IL->qkv[2], &IL->ao, &IL->inter, &IL->out};
        int first = 1;
        for (int j = 0; j < 6; j++) {
            if (lin[j]->w[0] || (j < 3 && IL->fused_qkv)) continue;
            if (first)
                snprintf(buf + len, n - len, "%slayer %d: %s", len ? "; " : "", l, names[j]);
            else
                snprintf(buf + len, n - len, " %s", names[j]);
            first = 0;
            len = strlen(buf);
            if (len + 4 >= n) {
                snprintf(buf + (n > 4 ? n - 4 : 0), 4, "...");
                return buf;
            }
        }
    }
    return buf;
}

/* ---- forward ---- */

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

/* The integer Linear on x (B,T,K), or (B,K) (the last layer's token-0 rows, layers/bert.h): outputs of
 * x's shape with N/nout features each, in ctx->act. A product in pieces runs piece by piece, each piece's
 * runs copied to their columns (the fused layers read the pieces where they are instead). */
static int int8_linear(BqCtx *ctx, const Int8Linear *il, const BqTensor *x, int nout, BqTensor **outs) {
    BQ_CHECK(bq_tensor_is_contiguous(x) && (x->ndim == 3 || x->ndim == 2));
    const int nd = x->ndim, np = il->np;
    const int64_t K = x->shape[nd - 1], M = bq_tensor_numel(x) / K;
    const int64_t pn = bq_qgemm_weights_n(il->w[0]), N = np * pn, rw = pn / nout, ld = N / nout;
    BQ_CHECK(bq_qgemm_weights_k(il->w[0]) == K && (np == 1 || rw * nout == pn));
    uint8_t *codes = bq_arena_alloc(ctx->act, (size_t)(M * K));
    int32_t *acc = bq_arena_alloc(ctx->act, (size_t)(M * pn) * sizeof(int32_t));
    bq_qgemm_quantize_u8(codes, x->data, M * K, il->sx);
    float *dst[3];
    for (int j = 0; j < nout; j++) {
        int64_t shape[3] = {x->shape[0], x->shape[1], x->shape[nd - 1]};
        shape[nd - 1] = ld;
        outs[j] = bq_tensor_new(ctx, nd, shape);
        dst[j] = outs[j]->data;
    }
    if (np == 1) return bq_qgemm_linear(il->w[0], codes, M, il->sx, il->bias, nout, dst, acc);
    float *y = bq_arena_alloc(ctx->act, (size_t)(M * pn) * sizeof(float));
    for (int c = 0; c < np; c++) {
        int rc = bq_qgemm_linear(il->w[c], codes, M, il->sx, il->bias + c * pn, 1, &y, acc);
        if (rc) return rc;
        for (int r = 0; r < nout; r++)
            for (int64_t m = 0; m < M; m++)
                memcpy(dst[r] + m * ld + c * rw, y + m * pn + r * rw, (size_t)rw * sizeof(float));
    }
    return BQ_OK;
}

/* The query/key/value GEMMs of layer IL on rows [r0, r0 + rb) of its input into acc (rb·3H int32, or
 * one piece's rb·3H/np), and in *sums where the attention reads them: one GEMM on in->codes, of piece c
 * (the query, key and value of its heads); or, where the three input quantizers' scales differ
 * (!IL->fused_qkv, one piece), three, with the key's and value's inputs quantized from in->f into xc[p]
 * where xc[p] is set (their scale differs from the query's, whose codes in->codes holds). */
static int qkv_gemms(const Int8Layer *IL, const BqFusedAct *in, uint8_t *const xc[3], int c, int64_t r0,
                     int64_t rb, int32_t *acc, BqQkvSums *sums) {
    const Int8Linear *lq = &IL->qkv[0];
    const int64_t K = bq_qgemm_weights_k(lq->w[c]), N = bq_qgemm_weights_n(lq->w[c]);
    if (IL->fused_qkv) {
        *sums = bq_qkv_sums_fused(acc, bq_qgemm_weights_comp(lq->w[c]), lq->scale + c * N, lq->bias + c * N, N / 3);
        return bq_qgemm_raw(lq->w[c], in->codes + r0 * K, rb, acc);
    }
    *sums = (BqQkvSums){.ld = N};
    for (int p = 0; p < 3; p++) {
        const Int8Linear *lp = &IL->qkv[p];
        const uint8_t *xp = in->codes + r0 * K;
        if (xc[p]) {
            bq_qgemm_quantize_u8(xc[p], in->f + r0 * K, rb * K, lp->sx);
            xp = xc[p];
        }
        sums->acc[p] = acc + p * rb * N;
        sums->comp[p] = bq_qgemm_weights_comp(lp->w[0]);
        sums->scale[p] = lp->scale;
        sums->bias[p] = lp->bias;
        int rc = bq_qgemm_raw(lp->w[0], xp, rb, acc + p * rb * N);
        if (rc) return rc;
    }
    return BQ_OK;
}

/* The epilogue of linear_step's piece c on one block (nb units, rb rows) of sums acc: the attention of the
 * piece's heads into their columns of the context codes oc, or the row-wise pass into of and oc (the
 * GELU codes: the piece's columns). */
static void step_epilogue(const BqInt8Engine *e, int l, const BqFusedStep *s, int c, const int32_t *acc,
                          const BqQkvSums *sums, float *scratch, int64_t nthr, float *of, uint8_t *oc,
                          const float *res, const float *mask, int64_t nb, int64_t rb) {
    const Int8Layer *IL = &e->layers[l];
    const Int8Linear *la = &IL->ao, *li = &IL->inter, *lo = &IL->out;
    const int64_t W = s->N;
    const BqFq *fq = IL->fq;
    switch (s->id) {
    case BQ_LIN_QKV: {
        const int64_t nh = s->NH / IL->qkv[0].np, col = c * nh * s->d;
        if (IL->with_fq)
            bq_infer_attention_fq(oc + col, sums, mask, scratch, nthr, s->scale, fq, la->sx, nb, s->T, s->Q, nh, s->d,
                                  W);
        else
            bq_infer_attention(oc + col, sums, mask, scratch, nthr, s->scale, la->sx, nb, s->T, s->Q, nh, s->d, W);
        break;
    }
    case BQ_LIN_AO:
        if (IL->with_fq)
            bq_infer_residual_layernorm_fq(of, oc, acc, bq_qgemm_weights_comp(la->w[0]), la->scale, la->bias, res,
                                           fq + BQ_FQ_ATTN_LOCAL, s->lnw, s->lnb, s->eps, li->sx, rb, W);
        else
            bq_infer_residual_layernorm(of, oc, acc, bq_qgemm_weights_comp(la->w[0]), la->scale, la->bias, res, s->lnw,
                                        s->lnb, s->eps, li->sx, rb, W);
        break;
    case BQ_LIN_I: {
        const int64_t pn = W / li->np, col = c * pn;
        const int32_t *comp = bq_qgemm_weights_comp(li->w[c]);
        if (IL->with_fq)
            bq_infer_gelu_fq_quant(oc + col, acc, comp, li->scale + col, li->bias + col, &IL->gelu, rb, pn, W);
        else
            bq_infer_gelu_quant(oc + col, acc, comp, li->scale + col, li->bias + col, lo->sx, rb, pn, W);
        break;
    }
    default: {
        /* the output dense's codes are the next layer's query/key/value input (the other brackets' out->codes
         * are this layer's) */
        const float next_sx = oc ? e->layers[l + 1].qkv[0].sx : 1.0f;
        if (IL->with_fq)
            bq_infer_residual_layernorm_fq(of, oc, acc, bq_qgemm_weights_comp(lo->w[0]), lo->scale, lo->bias, res,
                                           fq + BQ_FQ_OUT_LOCAL, s->lnw, s->lnb, s->eps, next_sx, rb, W);
        else
            bq_infer_residual_layernorm(of, oc, acc, bq_qgemm_weights_comp(lo->w[0]), lo->scale, lo->bias, res, s->lnw,
                                        s->lnb, s->eps, next_sx, rb, W);
        break;
    }
    }
}

/* The int8 engine's Linear (layers/bert_fused.h): the integer GEMM on in->codes, then the epilogue
 * kernel of autograd/infer_kernels.h that dequantizes the int32 sums and ends in the next Linear's
 * codes:
 *   QKV → +bias → attention → codes(context) at the AO input scale;
 *   AO → +bias +x → LayerNorm = a, codes(a) at the I input scale;
 *   I → +bias → GELU → codes at the O input scale;
 *   O → +bias +a → LayerNorm = y, and (out->codes set) codes(y) at layer l+1's query/key/value scale.
 * Both run block by block over at most bq_int8_step_rows rows, whole sequences for the attention, and
 * piece by piece (Int8Linear: a piece's heads, or its columns of the GELU codes), so the int32 sums take
 * one block's and one piece's room. */
static int linear_step(void *user, BqCtx *ctx, int l, const BqFusedAct *in, const BqFusedStep *s, BqFusedAct *out) {
    const BqInt8Engine *e = user;
    const Int8Layer *IL = &e->layers[l];
    const Int8Linear *lq = &IL->qkv[0], *la = &IL->ao, *li = &IL->inter, *lo = &IL->out;
    const Int8Linear *il = s->id == BQ_LIN_QKV ? lq : s->id == BQ_LIN_AO ? la : s->id == BQ_LIN_I ? li : lo;
    BQ_CHECK(s->id == BQ_LIN_QKV || s->id == BQ_LIN_AO || s->id == BQ_LIN_I || s->id == BQ_LIN_O);
    const int np = il->np;
    const int64_t R = s->rows, K = bq_qgemm_weights_k(il->w[0]), W = s->N;
    /* a piece's columns (query | key | value of its heads, as three GEMMs where !IL->fused_qkv) */
    const int64_t pn = s->id == BQ_LIN_QKV ? 3 * W / np : bq_qgemm_weights_n(il->w[0]);
    /* blocks of whole units: sequences of T rows for the attention, single rows elsewhere */
    const int64_t per = s->id == BQ_LIN_QKV ? s->T : 1, units = R / per;
    const int64_t step = bq_int8_step_rows(e), ub = step / per > 1 ? step / per : 1;
    const int64_t brows = (ub < units ? ub : units) * per;
    BQ_CHECK(units * per == R && pn * np == (s->id == BQ_LIN_QKV ? 3 * W : W));
    int32_t *acc = bq_arena_alloc(ctx->act, (size_t)(brows * pn) * sizeof(int32_t));
    float *scratch = NULL;
    const int64_t nthr = omp_get_max_threads();
    if (s->id == BQ_LIN_QKV)
        scratch = bq_arena_alloc(ctx->act, (size_t)(nthr * bq_infer_attention_scratch(s->T, s->d)) * sizeof(float));
    /* three query/key/value GEMMs: room for the key's and value's codes where their scales differ from the
     * query's */
    uint8_t *xc[3] = {NULL, NULL, NULL};
    for (int p = 1; p < 3 && s->id == BQ_LIN_QKV && !IL->fused_qkv; p++)
        if (IL->qkv[p].sx != lq->sx) xc[p] = bq_arena_alloc(ctx->act, (size_t)(brows * K));
    BQ_CHECK((!xc[1] && !xc[2]) || in->f);
    BqQkvSums sums;
    for (int64_t u0 = 0; u0 < units; u0 += ub) {
        const int64_t nb = units - u0 < ub ? units - u0 : ub, r0 = u0 * per, rb = nb * per;
        /* this block's rows of the outputs (W features each; the attention's: Q rows per sequence) and of
         * the residual */
        const int64_t o0 = s->id == BQ_LIN_QKV ? u0 * s->Q : r0;
        float *of = out->f ? out->f + o0 * W : NULL;
        uint8_t *oc = out->codes ? out->codes + o0 * W : NULL;
        const float *res = s->resid ? s->resid + r0 * W : NULL;
        const float *mask = s->mask ? s->mask + u0 * s->T : NULL;
        for (int c = 0; c < np; c++) {
            int rc = s->id == BQ_LIN_QKV ? qkv_gemms(IL, in, xc, c, r0, rb, acc, &sums)
                                         : bq_qgemm_raw(il->w[c], in->codes + r0 * K, rb, acc);
            if (rc) return rc;
            const double t0 = bq_section_start();
            step_epilogue(e, l, s, c, acc, &sums, scratch, nthr, of, oc, res, mask, nb, rb);
            bq_section_end(s->id == BQ_LIN_QKV ? BQ_SEC_ATTENTION : BQ_SEC_EPILOGUE, t0);
        }
    }
    return BQ_OK;
}

/* Layer l runs as one fused block (the cpu scheme's layers: bq_int8_prepare). */
static int layer_ok(void *user, int l) {
    const BqInt8Engine *e = user;
    return e->use_whole && e->layers[l].whole;
}

static void quantize_input(void *user, int l, const float *x, int64_t n, uint8_t *dst) {
    const BqInt8Engine *e = user;
    bq_qgemm_quantize_u8(dst, x, n, e->layers[l].qkv[0].sx);
}

/* The engine's BqLinearHook (layers/bert.h): the integer Linears of the layer, and the pooler and
 * classifier in row_linear's fixed summation order; every other Linear is left to the forward. */
static int hook_run(void *user, BqCtx *ctx, int l, BqLinearId id, BqTensor *x, const BqTensor *w,
                    const BqTensor *b, BqTensor **out) {
    const BqInt8Engine *e = ((const BqFusedRun *)user)->e->user;
    if (id == BQ_LIN_POOLER || id == BQ_LIN_CLASSIFIER) {
        out[0] = row_linear(ctx, x, w, b);
        return BQ_OK;
    }
    const Int8Layer *IL = &e->layers[l];
    const Int8Linear *il = NULL;
    int nout = 1;
    switch (id) {
    case BQ_LIN_QKV: il = IL->fused_qkv ? &IL->qkv[0] : NULL, nout = 3; break;
    case BQ_LIN_Q: case BQ_LIN_K: case BQ_LIN_V: il = IL->fused_qkv ? NULL : &IL->qkv[id - BQ_LIN_Q]; break;
    case BQ_LIN_AO: il = &IL->ao; break;
    case BQ_LIN_I: il = &IL->inter; break;
    case BQ_LIN_O: il = &IL->out; break;
    default: break;
    }
    if (!il || !il->w[0]) return BQ_OK; /* the fake-quant fp32 Linear */
    return int8_linear(ctx, il, x, nout, out);
}

/* One forward of the whole model on the batch in. */
static int forward_pass(BqInt8Engine *e, BqBert *m, BqCtx *ctx, const BqBertInput *in, BqTensor **logits) {
    BqFusedEngine fe = {.user = e, .codes = 1, .mlp_rows = bq_int8_step_rows(e), .resid_in_place = 1, .layer_ok = layer_ok,
                        .linear = linear_step, .quantize_input = quantize_input};
    BqFusedRun run = {.e = &fe, .m = m, .keep = in->hidden != NULL};
    BqLinearHook hook = {.user = &run, .run = hook_run, .layer = bq_fused_layer};
    return bq_bert_forward_hooked(m, ctx, in, &hook, logits, NULL);
}

/* Examples b0 .. b0+nb-1 of in, as a batch of their own (the same T). */
static BqBertInput input_slice(const BqBertInput *in, int64_t b0, int64_t nb) {
    BqBertInput s = *in;
    const int64_t T = in->T;
    s.B = nb;
    s.input_ids = in->input_ids + b0 * T;
    if (in->attention_mask) s.attention_mask = in->attention_mask + b0 * T;
    if (in->token_type_ids) s.token_type_ids = in->token_type_ids + b0 * T;
    if (in->labels) s.labels = in->labels + b0;
    if (in->start_positions) s.start_positions = in->start_positions + b0;
    if (in->end_positions) s.end_positions = in->end_positions + b0;
    return s;
}

int bq_int8_forward(BqInt8Engine *e, BqBert *m, BqCtx *ctx, const BqBertInput *in, BqTensor **logits) {
    BQ_CHECK(e && m && ctx && ctx->act && in && logits);
    BQ_CHECK(ctx->tape == NULL && !ctx->training); /* inference only */
    for (int l = 0; l < e->num_layers; l++) BQ_CHECK(e->layers[l].groups == 4); /* bq_int8_begin, not all packed */
    *logits = NULL;
    const BqBertConfig *c = &m->cfg;
    if (!m->quant || e->num_layers != c->num_hidden_layers || e->hidden != c->hidden_size ||
        e->inter != c->intermediate_size)
        return bq_err(BQ_EINVAL, "int8 engine: the model is not the one the engine was prepared from");
    /* passes of at most pass_rows rows of whole examples; one pass when every layer's output is kept */
    const int64_t per = in->T > 0 && e->pass_rows / in->T > 1 ? e->pass_rows / in->T : 1;
    if (in->hidden || in->B <= per) return forward_pass(e, m, ctx, in, logits);
    int labelled, st = bq_bert_check_input(m, in, &labelled);
    if (st) return st;
    const int qa = c->head == BQ_HEAD_QA;
    const int64_t shape[3] = {in->B, qa ? in->T : c->num_labels, 2}, row = qa ? in->T * 2 : c->num_labels;
    BqTensor *out = bq_tensor_new(ctx, qa ? 3 : 2, shape);
    for (int64_t b0 = 0; b0 < in->B; b0 += per) {
        const int64_t nb = in->B - b0 < per ? in->B - b0 : per;
        const BqBertInput sub = input_slice(in, b0, nb);
        const size_t mark = bq_arena_mark(ctx->act);
        BqTensor *y = NULL;
        if ((st = forward_pass(e, m, ctx, &sub, &y))) return st;
        BQ_CHECK(bq_tensor_numel(y) == nb * row && bq_tensor_is_contiguous(y));
        memcpy(out->data + b0 * row, y->data, (size_t)(nb * row) * sizeof(float));
        bq_arena_rewind(ctx->act, mark);
    }
    *logits = out;
    return BQ_OK;
}
