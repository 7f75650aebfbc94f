/* Quantizer placement per scheme (docs/design.md §4) and the quantizer state's life cycle. A scheme's
 * table is the list of points BQ_QPOINTS (layers/quant.h) filtered by the scheme's bit, in list order,
 * repeated for every encoder layer. Names are the Hugging Face module path plus a role, so
 * checkpoints and exported graphs say which module a range belongs to:
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

#include "autograd/qgemm.h"
#include "layers/bert.h"
#include "layers/calib.h"
#include "layers/quant.h"

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
    q->enabled = 1;
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
    BQ_CHECK((unsigned)cfg->scheme < BQ_SCHEME_COUNT); /* set only through bq_scheme_parse */
    const unsigned bit = BQ_SCHEME_BIT(cfg->scheme);
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
    qs->q = bq_calloc((size_t)(L * BQ_QP_LAYER_COUNT + 1), sizeof(BqQuantizer));
    char name[sizeof qs->q[0].name];
    if (BQ_QP_EMB_SCHEMES & bit) {
        snprintf(name, sizeof name, "%s", BQ_QP_EMB_NAME);
        if (!is_excluded(cfg->exclude, name)) {
            quantizer_init(&qs->q[qs->n], name, BQ_QP_LAYER_EMB, -1, 0, 1, 8);
            qs->slot[nslots - 1] = qs->n++;
        }
    }
    for (int l = 0; l < L; l++) {
        /* the scheme's points in BQ_QPOINTS order, which is the order checkpoints list them in */
        for (int pt = 0; pt < BQ_QP_LAYER_COUNT; pt++) {
            const BqQPointDef *def = &bq_qpoint_defs[pt];
            if (!(def->schemes & bit)) continue;
            const int is_w = def->is_weight;
            snprintf(name, sizeof name, "bert.encoder.layer.%d.%s", l, def->role);
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
    if (cfg->learn_ranges) bq_quant_learn_enable(qs, cfg->range_lr); /* the scales live in one block */
    *out = qs;
    return BQ_OK;
}

void bq_quant_free(BqQuantState *qs) {
    if (!qs) return;
    for (int i = 0; i < qs->n; i++) {
        BqQuantizer *q = &qs->q[i];
        free(q->amax);
        if (!q->dscale) free(q->scale); /* learned scales live in qs->lsq */
        free(q->ch_min);
        free(q->ch_max);
        bq_qgemm_weights_free(q->qgemm);
        if (q->hist) {
            bq_hist_free(q->hist);
            free(q->hist);
        }
    }
    free(qs->lsq);
    free(qs->q);
    free(qs->slot);
    free(qs);
}
