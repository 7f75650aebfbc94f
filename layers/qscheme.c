/* Quantizer placement tables per scheme (../shared/DESIGN.md §4) and the quantizer state's life
 * cycle. Names are the Hugging Face module path plus a role, so checkpoints and exported graphs say
 * which module a range belongs to:
 *   ort (ONNX Runtime bert_imdb_finetune_qat): 6 per-channel weights and 12 per-tensor activations per
 *     encoder layer, plus bert.embeddings.LayerNorm.output_quantizer;
 *   qdqbert (HF QDQBERT / pytorch-quantization, TensorRT): input + weight quantizer of each of the 6
 *     Linears, matmul_{q,k,a,v}_input_quantizer of the two attention matmuls, and
 *     add_{local,residual}_input_quantizer of the two residual adds;
 *   cpu (aimed at ONNX Runtime's CPU integer kernels, README "Quantization"): only what ORT CPU turns
 *     into integer GEMMs — the input of each Linear (query/key/value read one tensor, so one
 *     attention.self.input_quantizer) and the 6 weights at 7 bits (layers/quant.h says why); the
 *     attention matmuls, residual adds, LayerNorm and GELU stay fp32 (int8 versions measured no
 *     faster on ORT CPU, bench/bench_onnx.py). */
#include <stdlib.h>
#include <string.h>
#include <stdio.h>

#include "layers/bert.h"
#include "layers/calib.h"
#include "layers/quant.h"

typedef struct PointDef {
    int point;
    const char *suffix; /* after "bert.encoder.layer.<L>." */
} PointDef;

/* Every scheme quantizes the weights of the 6 encoder Linears. */
#define WEIGHT_POINTS \
    {BQ_QP_W_Q, "attention.self.query.weight_quantizer"}, \
    {BQ_QP_W_K, "attention.self.key.weight_quantizer"}, \
    {BQ_QP_W_V, "attention.self.value.weight_quantizer"}, \
    {BQ_QP_W_AO, "attention.output.dense.weight_quantizer"}, \
    {BQ_QP_W_I, "intermediate.dense.weight_quantizer"}, \
    {BQ_QP_W_O, "output.dense.weight_quantizer"},

static const PointDef ort_points[] = {
    WEIGHT_POINTS
    {BQ_QP_Q_OUT, "attention.self.query.output_quantizer"},
    {BQ_QP_K_OUT, "attention.self.key.output_quantizer"},
    {BQ_QP_V_OUT, "attention.self.value.output_quantizer"},
    {BQ_QP_SCORES, "attention.self.matmul_qk.output_quantizer"},
    {BQ_QP_PROBS, "attention.self.softmax.output_quantizer"},
    {BQ_QP_CONTEXT, "attention.self.matmul_av.output_quantizer"},
    {BQ_QP_ATTN_RESID, "attention.output.residual_add.output_quantizer"},
    {BQ_QP_ATTN_LN, "attention.output.LayerNorm.output_quantizer"},
    {BQ_QP_INTER_OUT, "intermediate.dense.output_quantizer"},
    {BQ_QP_GELU_OUT, "intermediate.intermediate_act_fn.output_quantizer"},
    {BQ_QP_OUT_RESID, "output.residual_add.output_quantizer"},
    {BQ_QP_OUT_LN, "output.LayerNorm.output_quantizer"},
};

static const PointDef qdq_points[] = {
    WEIGHT_POINTS
    {BQ_QP_Q_IN, "attention.self.query.input_quantizer"},
    {BQ_QP_K_IN, "attention.self.key.input_quantizer"},
    {BQ_QP_V_IN, "attention.self.value.input_quantizer"},
    {BQ_QP_AO_IN, "attention.output.dense.input_quantizer"},
    {BQ_QP_I_IN, "intermediate.dense.input_quantizer"},
    {BQ_QP_O_IN, "output.dense.input_quantizer"},
    {BQ_QP_MM1_Q, "attention.self.matmul_q_input_quantizer"},
    {BQ_QP_MM1_K, "attention.self.matmul_k_input_quantizer"},
    {BQ_QP_MM2_P, "attention.self.matmul_a_input_quantizer"},
    {BQ_QP_MM2_V, "attention.self.matmul_v_input_quantizer"},
    {BQ_QP_ADD1_LOCAL, "attention.output.add_local_input_quantizer"},
    {BQ_QP_ADD1_RESID, "attention.output.add_residual_input_quantizer"},
    {BQ_QP_ADD2_LOCAL, "output.add_local_input_quantizer"},
    {BQ_QP_ADD2_RESID, "output.add_residual_input_quantizer"},
};

static const PointDef cpu_points[] = {
    WEIGHT_POINTS
    {BQ_QP_QKV_IN, "attention.self.input_quantizer"},
    {BQ_QP_AO_IN, "attention.output.dense.input_quantizer"},
    {BQ_QP_I_IN, "intermediate.dense.input_quantizer"},
    {BQ_QP_O_IN, "output.dense.input_quantizer"},
};

int bq_quant_scheme_weight_bits(const char *scheme) { return strcmp(scheme, "cpu") == 0 ? 7 : 8; }

int bq_quant_scheme_check(const char *scheme, const char *flag_or_key) {
    if (!strcmp(scheme, "ort") || !strcmp(scheme, "qdqbert") || !strcmp(scheme, "cpu")) return BQ_OK;
    return bq_err(BQ_EINVAL, "%s: '%s' is not one of ort, qdqbert, cpu", flag_or_key, scheme);
}

/* 1 when name is excluded: some comma-separated entry e of `exclude` equals a dotted prefix of
 * name, with or without name's leading "bert." ("encoder.layer.1" keeps layer 1, not layer 10). */
static int is_excluded(const char *exclude, const char *name) {
    const char *p = exclude;
    while (*p) {
        const char *e = strchr(p, ',');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        while (len > 0 && *p == ' ') p++, len--;
        while (len > 0 && p[len - 1] == ' ') len--;
        if (len > 0) {
            for (int k = 0; k < 2; k++) {
                const char *n = k == 0 ? name : (strncmp(name, "bert.", 5) == 0 ? name + 5 : NULL);
                if (n && strncmp(n, p, len) == 0 && (n[len] == '.' || n[len] == '\0')) return 1;
            }
        }
        if (!e) break;
        p = e + 1;
    }
    return 0;
}

static void quantizer_init(BqQuantizer *q, const char *name, int layer, int point, int is_weight, int64_t nch,
                           int bits) {
    memset(q, 0, sizeof *q);
    snprintf(q->name, sizeof q->name, "%s", name);
    q->layer = layer;
    q->point = point;
    q->is_weight = is_weight;
    q->bits = bits;
    q->axis = nch > 1 ? 0 : -1;
    q->nch = nch;
    q->amax = bq_calloc((size_t)nch, sizeof(float));
    q->scale = bq_calloc((size_t)nch, sizeof(float));
    if (is_weight) {
        q->ch_min = bq_calloc((size_t)nch, sizeof(float));
        q->ch_max = bq_calloc((size_t)nch, sizeof(float));
    }
    bq_quant_update_scale(NULL, q);
}

/* Output channels of a weight point. */
static int64_t weight_rows(const BqBertConfig *c, int point) {
    switch (point) {
    case BQ_QP_W_I: return c->intermediate_size;
    default: return c->hidden_size;
    }
}

int bq_quant_create(BqQuantState **out, const BqBert *m, const BqQuantConfig *cfg) {
    *out = NULL;
    const PointDef *defs;
    int ndefs, emb;
    if (strcmp(cfg->scheme, "ort") == 0) {
        defs = ort_points;
        ndefs = (int)(sizeof ort_points / sizeof ort_points[0]);
        emb = 1;
    } else if (strcmp(cfg->scheme, "qdqbert") == 0) {
        defs = qdq_points;
        ndefs = (int)(sizeof qdq_points / sizeof qdq_points[0]);
        emb = 0;
    } else if (strcmp(cfg->scheme, "cpu") == 0) {
        defs = cpu_points;
        ndefs = (int)(sizeof cpu_points / sizeof cpu_points[0]);
        emb = 0;
    } else {
        return bq_quant_scheme_check(cfg->scheme, "--scheme");
    }
    const int wbits = bq_quant_scheme_weight_bits(cfg->scheme);
    if (!(cfg->averaging_constant > 0.0f && cfg->averaging_constant <= 1.0f))
        return bq_err(BQ_EINVAL, "averaging_constant: %g is not in (0, 1]", cfg->averaging_constant);
    int L = m->cfg.num_hidden_layers;
    BqQuantState *qs = bq_calloc(1, sizeof *qs);
    qs->cfg = *cfg;
    qs->num_layers = L;
    int nslots = L * BQ_QP_LAYER_COUNT + 1;
    qs->slot = bq_malloc((size_t)nslots * sizeof(int));
    for (int i = 0; i < nslots; i++) qs->slot[i] = -1;
    qs->q = bq_calloc((size_t)(L * ndefs + 1), sizeof(BqQuantizer));
    char name[sizeof qs->q[0].name];
    if (emb) {
        snprintf(name, sizeof name, "bert.embeddings.LayerNorm.output_quantizer");
        if (!is_excluded(cfg->exclude, name)) {
            quantizer_init(&qs->q[qs->n], name, BQ_QP_LAYER_EMB, -1, 0, 1, 8);
            qs->slot[nslots - 1] = qs->n++;
        }
    }
    for (int l = 0; l < L; l++) {
        for (int d = 0; d < ndefs; d++) {
            int pt = defs[d].point, is_w = pt >= BQ_QP_W_Q;
            snprintf(name, sizeof name, "bert.encoder.layer.%d.%s", l, defs[d].suffix);
            if (is_excluded(cfg->exclude, name)) continue;
            /* --fuse-qkv: key and value share the query's quantizer (one range over Q, K, V) */
            if (cfg->fuse_qkv && (pt == BQ_QP_K_OUT || pt == BQ_QP_V_OUT || pt == BQ_QP_K_IN || pt == BQ_QP_V_IN)) {
                int qpt = (pt == BQ_QP_K_OUT || pt == BQ_QP_V_OUT) ? BQ_QP_Q_OUT : BQ_QP_Q_IN;
                int s = qs->slot[l * BQ_QP_LAYER_COUNT + qpt];
                if (s >= 0) {
                    qs->slot[l * BQ_QP_LAYER_COUNT + pt] = s;
                    continue;
                }
            }
            int64_t nch = is_w && !cfg->per_tensor_weights ? weight_rows(&m->cfg, pt) : 1;
            quantizer_init(&qs->q[qs->n], name, l, pt, is_w, nch, is_w ? wbits : 8);
            qs->slot[l * BQ_QP_LAYER_COUNT + pt] = qs->n++;
        }
    }
    *out = qs;
    return BQ_OK;
}

void bq_quant_free(BqQuantState *qs) {
    if (!qs) return;
    for (int i = 0; i < qs->n; i++) {
        BqQuantizer *q = &qs->q[i];
        free(q->amax);
        free(q->scale);
        free(q->ch_min);
        free(q->ch_max);
        if (q->hist) {
            bq_hist_free(q->hist);
            free(q->hist);
        }
    }
    free(qs->q);
    free(qs->slot);
    free(qs);
}
