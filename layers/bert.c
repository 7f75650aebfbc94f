/* BertForSequenceClassification and BertForQuestionAnswering: the parameter table (HF state-dict
 * names and order), HF initialisation, and the forward pass recorded on the tape, with the
 * fake-quantization hooks of layers/quant.h at every placement point of docs/design.md §4.
 *
 * Reference: Hugging Face transformers 4.40 models/bert/modeling_bert.py (BertEmbeddings,
 * BertSelfAttention eager path, BertSelfOutput, BertIntermediate, BertOutput, BertPooler,
 * BertForSequenceClassification, BertForQuestionAnswering, BertPreTrainedModel._init_weights) and get_extended_attention_mask
 * (additive mask (1 − mask)·finfo(float32).min, added after the 1/√d scaling).
 *
 * Memory: parameters live in one block (each tensor starts on a 64-byte boundary), gradients, when a
 * trainer asks for them (bq_bert_grad_alloc), in a second block of the same layout. Both blocks are
 * anonymous mappings, so a page costs memory only once it is written, and bq_bert_param_release can
 * give back the pages of one tensor. Every activation of a forward comes from ctx->act
 * through the ops; the forward itself allocates only the position ids there, so a step does no
 * malloc. */
#include "layers/bert.h"

#include <float.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "layers/quant.h"

#define PARAM_ALIGN_FLOATS 16 /* 64 bytes */

/* ---- parameter table ---- */

int bq_params_find(const BqParamTable *t, const char *name) {
    if (!t || !name) return -1;
    const char *bare = strncmp(name, "bert.", 5) == 0 ? name + 5 : name;
    for (int i = 0; i < t->n; i++) {
        const char *pn = t->p[i].name;
        if (strcmp(pn, name) == 0) return i;
        const char *pbare = strncmp(pn, "bert.", 5) == 0 ? pn + 5 : pn;
        /* only the encoder parameters carry the prefix, so "bert.classifier.weight" does not match */
        if (pbare != pn && strcmp(pbare, bare) == 0) return i;
    }
    return -1;
}

/* Appends one entry; shapes are PyTorch's ((out, in) for Linear weights). */
static void table_add(BqParamTable *t, int cap, const char *name, int ndim, int64_t d0, int64_t d1, int decay,
                      BqInit init) {
    BQ_CHECK(t->n < cap);
    BqParam *p = &t->p[t->n++];
    memset(p, 0, sizeof *p);
    int w = snprintf(p->name, sizeof p->name, "%s", name);
    BQ_CHECK(w > 0 && w < (int)sizeof p->name);
    p->ndim = ndim;
    p->shape[0] = d0;
    p->shape[1] = ndim == 2 ? d1 : 0;
    p->numel = ndim == 2 ? d0 * d1 : d0;
    p->decay = decay;
    p->init = init;
    p->offset = t->total;
    t->total += (p->numel + PARAM_ALIGN_FLOATS - 1) / PARAM_ALIGN_FLOATS * PARAM_ALIGN_FLOATS;
}

/* A Linear "<prefix>.weight" (out,in) with decay and "<prefix>.bias" (out) without. */
static void table_add_linear(BqParamTable *t, int cap, const char *prefix, int64_t out, int64_t in) {
    char n[BQ_NAME_MAX + 16]; /* table_add checks the final length */
    snprintf(n, sizeof n, "%s.weight", prefix);
    table_add(t, cap, n, 2, out, in, 1, BQ_INIT_NORMAL);
    snprintf(n, sizeof n, "%s.bias", prefix);
    table_add(t, cap, n, 1, out, 0, 0, BQ_INIT_ZEROS);
}

/* LayerNorm "<prefix>.weight" (ones) and "<prefix>.bias" (zeros), neither decayed. */
static void table_add_ln(BqParamTable *t, int cap, const char *prefix, int64_t h) {
    char n[BQ_NAME_MAX + 16]; /* table_add checks the final length */
    snprintf(n, sizeof n, "%s.weight", prefix);
    table_add(t, cap, n, 1, h, 0, 0, BQ_INIT_ONES);
    snprintf(n, sizeof n, "%s.bias", prefix);
    table_add(t, cap, n, 1, h, 0, 0, BQ_INIT_ZEROS);
}

/* The table in the order of BertForSequenceClassification.state_dict() (pooler, classifier) or
 * BertForQuestionAnswering.state_dict() (qa_outputs, no pooler). */
static void table_build(BqParamTable *t, const BqBertConfig *c) {
    const int64_t H = c->hidden_size, I = c->intermediate_size;
    const int cap = 5 + 16 * c->num_hidden_layers + (c->head == BQ_HEAD_QA ? 2 : 4);
    t->p = bq_calloc((size_t)cap, sizeof *t->p);
    t->n = 0;
    t->total = 0;
    table_add(t, cap, "bert.embeddings.word_embeddings.weight", 2, c->vocab_size, H, 1, BQ_INIT_NORMAL);
    table_add(t, cap, "bert.embeddings.position_embeddings.weight", 2, c->max_position_embeddings, H, 1,
              BQ_INIT_NORMAL);
    table_add(t, cap, "bert.embeddings.token_type_embeddings.weight", 2, c->type_vocab_size, H, 1,
              BQ_INIT_NORMAL);
    table_add_ln(t, cap, "bert.embeddings.LayerNorm", H);
    char pre[BQ_NAME_MAX];
    for (int l = 0; l < c->num_hidden_layers; l++) {
        static const char *const qkv[3] = {"query", "key", "value"};
        for (int j = 0; j < 3; j++) {
            snprintf(pre, sizeof pre, "bert.encoder.layer.%d.attention.self.%s", l, qkv[j]);
            table_add_linear(t, cap, pre, H, H);
        }
        snprintf(pre, sizeof pre, "bert.encoder.layer.%d.attention.output.dense", l);
        table_add_linear(t, cap, pre, H, H);
        snprintf(pre, sizeof pre, "bert.encoder.layer.%d.attention.output.LayerNorm", l);
        table_add_ln(t, cap, pre, H);
        snprintf(pre, sizeof pre, "bert.encoder.layer.%d.intermediate.dense", l);
        table_add_linear(t, cap, pre, I, H);
        snprintf(pre, sizeof pre, "bert.encoder.layer.%d.output.dense", l);
        table_add_linear(t, cap, pre, H, I);
        snprintf(pre, sizeof pre, "bert.encoder.layer.%d.output.LayerNorm", l);
        table_add_ln(t, cap, pre, H);
    }
    if (c->head == BQ_HEAD_QA) {
        table_add_linear(t, cap, "qa_outputs", c->num_labels, H);
    } else {
        table_add_linear(t, cap, "bert.pooler.dense", H, H);
        table_add_linear(t, cap, "classifier", c->num_labels, H);
    }
    BQ_CHECK(t->n == cap);
}

/* The view of parameter i (data and, when allocated, grad); data NULL once released. */
static BqTensor param_view(const BqParamTable *t, int i) {
    const BqParam *p = &t->p[i];
    float *d = t->released && t->released[i] ? NULL : t->data + p->offset;
    BqTensor v = bq_tensor_wrap(d, t->grad ? t->grad + p->offset : NULL, p->ndim, p->shape);
    v.name = p->name;
    return v;
}

/* Bytes of a parameter or gradient block: `total` floats rounded up to whole pages. */
static size_t block_bytes(const BqParamTable *t) {
    const size_t page = (size_t)sysconf(_SC_PAGESIZE), bytes = (size_t)t->total * sizeof(float);
    return (bytes + page - 1) / page * page;
}

/* A block of zeros as an anonymous private mapping (page aligned, so 64-byte aligned): no page is
 * resident before it is written. NULL when the mapping fails. */
static float *block_map(size_t bytes) {
    void *p = mmap(NULL, bytes ? bytes : 1, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Points every tensor view of m at the blocks (after a block is added or a tensor released). */
static void views_build(BqBert *m) {
    const BqParamTable *t = &m->params;
    const BqBertConfig *c = &m->cfg;
    int k = 0;
    m->word_emb = param_view(t, k++);
    m->pos_emb = param_view(t, k++);
    m->type_emb = param_view(t, k++);
    m->emb_ln_w = param_view(t, k++);
    m->emb_ln_b = param_view(t, k++);
    for (int l = 0; l < c->num_hidden_layers; l++) {
        BqBertLayer *L = &m->layers[l];
        BqTensor *order[16] = {&L->q_w,  &L->q_b,  &L->k_w, &L->k_b, &L->v_w, &L->v_b, &L->ao_w,  &L->ao_b,
                               &L->ln1_w, &L->ln1_b, &L->i_w, &L->i_b, &L->o_w, &L->o_b, &L->ln2_w, &L->ln2_b};
        for (int j = 0; j < 16; j++) *order[j] = param_view(t, k++);
    }
    if (c->head == BQ_HEAD_QA) {
        m->qa_w = param_view(t, k++);
        m->qa_b = param_view(t, k++);
    } else {
        m->pool_w = param_view(t, k++);
        m->pool_b = param_view(t, k++);
        m->cls_w = param_view(t, k++);
        m->cls_b = param_view(t, k++);
    }
    BQ_CHECK(k == t->n);
}

int bq_bert_create(BqBert *m, const BqBertConfig *cfg, int with_grad, BqRng *rng) {
    BQ_CHECK(m && cfg);
    memset(m, 0, sizeof *m);
    m->cfg = *cfg; /* takes ownership of id2label */
    int rc = bq_config_validate(&m->cfg);
    if (rc) goto cleanup;
    const BqBertConfig *c = &m->cfg;
    if (c->pad_token_id >= c->vocab_size) {
        rc = bq_err(BQ_EINVAL, "config: pad_token_id %d is not below vocab_size %d", c->pad_token_id,
                    c->vocab_size);
        goto cleanup;
    }

    BqParamTable *t = &m->params;
    table_build(t, c);
    const size_t bytes = block_bytes(t);
    t->data = block_map(bytes); /* zeros: the alignment padding stays zero */
    if (!t->data) {
        rc = bq_err(BQ_ENOMEM, "model: cannot allocate %zu bytes of parameters", bytes);
        goto cleanup;
    }
    m->layers = bq_calloc((size_t)c->num_hidden_layers, sizeof *m->layers);
    if (with_grad && (rc = bq_bert_grad_alloc(m))) goto cleanup;

    /* HF _init_weights: Linear and Embedding weights ~ N(0, initializer_range), biases 0, LayerNorm
     * weight 1 and bias 0; the padding_idx row of the word embeddings is zeroed. Drawn in table order
     * so a seed gives the same model on every machine. Without rng every parameter stays zero and no
     * page of the block is written. */
    for (int i = 0; i < t->n && rng; i++) {
        const BqParam *p = &t->p[i];
        float *d = t->data + p->offset;
        switch (p->init) {
        case BQ_INIT_NORMAL:
            for (int64_t k = 0; k < p->numel; k++) d[k] = c->initializer_range * bq_rng_normal(rng);
            break;
        case BQ_INIT_ONES:
            for (int64_t k = 0; k < p->numel; k++) d[k] = 1.0f;
            break;
        case BQ_INIT_ZEROS:
            break;
        }
    }
    if (c->pad_token_id >= 0 && rng) {
        float *row = t->data + t->p[0].offset + (int64_t)c->pad_token_id * c->hidden_size;
        memset(row, 0, (size_t)c->hidden_size * sizeof(float));
    }

    views_build(m);
    return BQ_OK;

cleanup:
    bq_bert_free(m);
    return rc;
}

void bq_bert_free(BqBert *m) {
    if (!m) return;
    const size_t bytes = block_bytes(&m->params);
    if (m->params.data) munmap(m->params.data, bytes); /* released ranges included: they stay reserved */
    if (m->params.grad) munmap(m->params.grad, bytes);
    bq_word_rows_free(m->word_rows);
    free(m->params.released);
    free(m->params.p);
    free(m->layers);
    bq_config_free(&m->cfg);
    /* m->quant belongs to whoever attached it (layers/quant.c) */
    memset(m, 0, sizeof *m);
}

int bq_bert_grad_alloc(BqBert *m) {
    BqParamTable *t = &m->params;
    BQ_CHECK(t->data);
    if (t->grad) return BQ_OK;
    const size_t bytes = block_bytes(t);
    t->grad = block_map(bytes); /* zeros */
    if (!t->grad) return bq_err(BQ_ENOMEM, "model: cannot allocate %zu bytes of gradients", bytes);
    views_build(m);
    return BQ_OK;
}

void bq_bert_param_release(BqBert *m, int i) {
    BqParamTable *t = &m->params;
    BQ_CHECK(i >= 0 && i < t->n && t->data);
    if (!t->released) t->released = bq_calloc((size_t)t->n, 1);
    if (t->released[i]) return;
    t->released[i] = 1;
    /* The whole pages inside the tensor; the partial pages at its ends may hold its neighbours. */
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = (uintptr_t)(t->data + t->p[i].offset), hi = lo + (uintptr_t)t->p[i].numel * sizeof(float);
    const uintptr_t a = (lo + page - 1) / page * page, b = hi / page * page;
    /* The pages are replaced by an inaccessible reservation rather than unmapped: their memory goes back
     * to the system all the same, but the addresses stay the model's, so no later mapping (an arena,
     * a thread's stack, a large malloc) can be placed in the hole and then be unmapped with the block by
     * bq_bert_free. */
    if (b > a)
        BQ_CHECK(mmap((void *)a, b - a, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0) ==
                 (void *)a);
    views_build(m);
}

void bq_bert_word_rows_attach(BqBert *m, BqRowFetch fetch, void (*close)(void *), void *user, int64_t rows) {
    BQ_CHECK(m && fetch && !m->word_rows);
    m->word_rows = bq_word_rows_new(fetch, close, user, m->cfg.vocab_size, m->cfg.hidden_size, rows);
    bq_bert_param_release(m, 0); /* the table's storage: parameter 0, bert.embeddings.word_embeddings.weight */
}

int64_t bq_bert_param_bytes(const BqBert *m) {
    const BqParamTable *t = &m->params;
    int64_t n = 0;
    for (int i = 0; i < t->n; i++)
        if (!t->released || !t->released[i]) n += t->p[i].numel * (int64_t)sizeof(float);
    return n;
}

/* The encoder parameters are the table's entries up to the head, in the same order for both heads. */
static int encoder_param_count(const BqBertConfig *c) { return 5 + 16 * c->num_hidden_layers; }

int bq_bert_set_head(BqBert *m, BqHead head, BqRng *rng) {
    BQ_CHECK(m && rng && m->params.data);
    if (m->cfg.head == head) return BQ_OK;
    BqBertConfig cfg = m->cfg;
    cfg.head = head;
    /* both heads of HF have num_labels outputs; the QA head's are start and end */
    cfg.num_labels = 2;
    cfg.id2label = bq_calloc(2, sizeof(char *));
    for (int i = 0; i < 2; i++) {
        char b[32];
        snprintf(b, sizeof b, "LABEL_%d", i);
        cfg.id2label[i] = bq_strdup(b);
    }
    BqBert n;
    int rc = bq_bert_create(&n, &cfg, m->params.grad != NULL, rng); /* takes cfg.id2label */
    if (rc) return rc;
    const int ne = encoder_param_count(&m->cfg);
    for (int i = 0; i < ne; i++) {
        const BqParam *p = &m->params.p[i];
        BQ_CHECK(strcmp(p->name, n.params.p[i].name) == 0 && p->numel == n.params.p[i].numel);
        memcpy(n.params.data + n.params.p[i].offset, m->params.data + p->offset, (size_t)p->numel * sizeof(float));
    }
    n.quant = m->quant;
    n.data = m->data;
    m->quant = NULL;
    bq_bert_free(m);
    *m = n;
    return BQ_OK;
}

/* ---- forward ---- */

/* Activation and weight hooks: nothing but a NULL test when the model is fp32. */
static inline BqTensor *qact(BqQuantState *qs, BqCtx *ctx, int layer, int point, BqTensor *x) {
    return qs ? bq_quant_act(qs, ctx, layer, point, x) : x;
}
static inline BqTensor *qweight(BqQuantState *qs, BqCtx *ctx, int layer, int point, BqTensor *w) {
    return qs ? bq_quant_weight(qs, ctx, layer, point, w) : w;
}

/* The per-tensor 8-bit grid an activation of layer l lies on after the quantizer at `point`, or, where the
 * scheme has none there, at `alt` (-1: none): the active quantizer, or NULL (no grid: fp32 products). The
 * integer attention products use it; --fp32-linear (qs->fp32_linear) turns them off with the integer
 * Linears. */
static const BqQuantizer *grid_of(BqQuantState *qs, int l, int point, int alt) {
    if (!qs || qs->fp32_linear) return NULL;
    int pt = bq_quant_at(qs, l, point) || alt < 0 ? point : alt;
    const BqQuantizer *q = bq_quant_active(qs, l, pt);
    return q && !q->is_weight && q->nch == 1 && q->bits <= 8 && q->scale[0] > 0.0f ? q : NULL;
}

/* 1 when a quantizer sits at (layer l, point): a fused op must not skip over it. */
static inline int has_q(BqQuantState *qs, int l, int point) { return qs && bq_quant_at(qs, l, point) != NULL; }

/* y = the Linear `id` of layer l on x: the hook's result when it computes it, else x through the input
 * quantizer at in_pt (xq: x already through a shared quantizer) times w through the weight quantizer
 * at w_pt, plus b, on integer codes where both are quantized (bq_quant_linear). Where the scheme has no
 * input quantizer, `grid` is the per-tensor grid x already lies on (the output quantizer of the op that
 * made it, grid_of; NULL: none), and the product runs on those codes. qs NULL: no quantizers (fp32
 * model, pooler, classifier). */
static int linear(BqCtx *ctx, const BqLinearHook *hk, BqQuantState *qs, int l, BqLinearId id, BqTensor *x,
                  BqTensor *xq, int in_pt, const BqQuantizer *grid, BqTensor *w, int w_pt, BqTensor *b,
                  BqTensor **y) {
    *y = NULL;
    if (hk) {
        int st = hk->run(hk->user, ctx, l, id, x, w, b, y);
        if (st || *y) return st;
    }
    if (!qs) {
        *y = bq_op_linear(ctx, xq, w, b);
        return BQ_OK;
    }
    BqTensor *xin = qact(qs, ctx, l, in_pt, xq), *wq = qweight(qs, ctx, l, w_pt, w);
    /* the input's grid: its own quantizer, or the shared query/key/value one that made xq (cpu scheme) */
    const BqQuantizer *iq = bq_quant_at(qs, l, in_pt) ? bq_quant_active(qs, l, in_pt)
                            : xq != x                 ? bq_quant_active(qs, l, BQ_QP_QKV_IN)
                                                      : grid;
    *y = bq_quant_linear(qs, ctx, iq, xin, bq_quant_active(qs, l, w_pt), wq, b);
    return BQ_OK;
}

/* The Linears a point's value feeds first, as masks of bits 1 << BqLinearId: FEEDS_<name> for each
 * name of the `feeds` column of BQ_QPOINTS (layers/quant.h). */
enum {
    FEEDS_Q = 1u << BQ_LIN_Q, FEEDS_K = 1u << BQ_LIN_K, FEEDS_V = 1u << BQ_LIN_V,
    FEEDS_QKV = FEEDS_Q | FEEDS_K | FEEDS_V, FEEDS_AO = 1u << BQ_LIN_AO, FEEDS_I = 1u << BQ_LIN_I,
    FEEDS_O = 1u << BQ_LIN_O, FEEDS_NONE = 0
};

/* 1 when the forward keeps the activations that only bf16 products read as bf16 words (autograd/tensor.h,
 * "bf16 storage"): a bf16 training step (tape) of the float model, with no engine hook and no Linear
 * outputs kept or reused for the caller, unless ctx->keep_fp32. Which tensors: the query, key and value,
 * the attention probabilities and context, and the intermediate dense's output (the GELU's input). */
static int store_bf16(const BqBert *m, const BqCtx *ctx, const BqLinearHook *hk, const BqBertReuse *ru) {
    return ctx->prec == BQ_PRECISION_BF16 && ctx->tape && !ctx->keep_fp32 && !m->quant && !hk && !ru;
}

/* The first Linears of each point of the layer, indexed by BqQPoint. */
static const unsigned point_feeds[BQ_QP_LAYER_COUNT] = {
#define FEEDS_ROW_(point, role, is_weight, sole, schemes, feeds) [BQ_QP_##point] = FEEDS_##feeds,
    BQ_QPOINTS(FEEDS_ROW_)
#undef FEEDS_ROW_
};

/* The layer's data flow between its Linears (layer_forward): the Linears that read the output of each
 * one, through the ops between them, as masks of bits 1 << BqLinearId. Query, key and value feed the
 * attention output dense, which feeds the intermediate dense, which feeds the output dense. Every
 * successor has a larger id than the Linear it follows. */
static const unsigned linear_next[BQ_LIN_ENCODER] = {
    [BQ_LIN_Q] = FEEDS_AO, [BQ_LIN_K] = FEEDS_AO, [BQ_LIN_V] = FEEDS_AO,
    [BQ_LIN_AO] = FEEDS_I, [BQ_LIN_I] = FEEDS_O, [BQ_LIN_O] = FEEDS_NONE,
};

unsigned bq_bert_linear_reach(int point) {
    /* the embeddings' point and any point outside the table feed the layer input: all three first */
    unsigned reach = point >= 0 && point < BQ_QP_LAYER_COUNT ? point_feeds[point] : FEEDS_QKV;
    /* in increasing id order each Linear's successors join the mask before they are visited */
    for (int id = 0; id < BQ_LIN_ENCODER; id++)
        if (reach & (1u << id)) reach |= linear_next[id];
    return reach;
}

/* The output of the Linear (l, id) handed in through r->lin_reuse, copied into ctx->act with x's shape
 * and out_features as its last dimension; NULL when the caller gives none (r may be NULL). */
static BqTensor *lin_reused(BqCtx *ctx, const BqBertReuse *r, int l, BqLinearId id, const BqTensor *x,
                            int64_t out_features) {
    const float *src = r && r->lin_reuse ? r->lin_reuse[l * BQ_LIN_ENCODER + id] : NULL;
    if (!src) return NULL;
    int64_t shape[4];
    BQ_CHECK(x->ndim >= 1 && x->ndim <= 4);
    for (int d = 0; d < x->ndim; d++) shape[d] = x->shape[d];
    shape[x->ndim - 1] = out_features;
    BqTensor *y = bq_tensor_new(ctx, x->ndim, shape);
    memcpy(y->data, src, (size_t)bq_tensor_numel(y) * sizeof(float));
    return y;
}

/* Copies the output y of the Linear (l, id) to r->lin_keep when the caller asks for it (r may be NULL). */
static void lin_kept(const BqBertReuse *r, int l, BqLinearId id, const BqTensor *y) {
    float *dst = r && r->lin_keep ? r->lin_keep[l * BQ_LIN_ENCODER + id] : NULL;
    if (dst) memcpy(dst, y->data, (size_t)bq_tensor_numel(y) * sizeof(float));
}

/* The (B,H) rows y as a (B,1,H) query block for the attention ops, a second header on the same data (no
 * tape: cls_only forwards only). */
static BqTensor *query_rows(BqCtx *ctx, BqTensor *y) {
    BQ_CHECK(!ctx->tape && y->ndim == 2);
    int64_t shape[3] = {y->shape[0], 1, y->shape[1]};
    BqTensor *t = bq_arena_alloc(ctx->act, sizeof *t);
    *t = bq_tensor_wrap(y->data, NULL, 3, shape);
    return t;
}

/* BertSelfAttention's three Linears of layer l on x (B,T,H): qkv[0..2] receive the query, key and value,
 * each through its output quantizer; cls_only: the query on token 0's rows only, as a (B,1,H) block
 * (query_rows). An engine hook may compute the three together (BQ_LIN_QKV) or each Linear; otherwise
 * xa, the query/key/value input quantized once by the cpu scheme, feeds them. ru (may be NULL): the
 * Linear outputs to keep or reuse. Returns BQ_OK, or the hook's error with qkv partly set. */
static int attention_qkv(BqBert *m, BqCtx *ctx, const BqLinearHook *hk, const BqBertReuse *ru, int l, BqTensor *x,
                         int cls_only, BqTensor *qkv[3]) {
    const BqBertConfig *c = &m->cfg;
    BqBertLayer *L = &m->layers[l];
    BqQuantState *qs = m->quant;
    int st;

    static const int in_pt[3] = {BQ_QP_Q_IN, BQ_QP_K_IN, BQ_QP_V_IN}, out_pt[3] = {BQ_QP_Q_OUT, BQ_QP_K_OUT, BQ_QP_V_OUT};
    static const int w_pt[3] = {BQ_QP_W_Q, BQ_QP_W_K, BQ_QP_W_V};
    BqTensor *W[3] = {&L->q_w, &L->k_w, &L->v_w}, *Bias[3] = {&L->q_b, &L->k_b, &L->v_b};
    if (hk && (st = hk->run(hk->user, ctx, l, BQ_LIN_QKV, x, NULL, NULL, qkv))) return st;
    if (store_bf16(m, ctx, hk, ru)) {
        for (int j = 0; j < 3; j++) qkv[j] = bq_op_linear_bf16(ctx, x, W[j], Bias[j]);
    } else if (qkv[0]) {
        for (int j = 0; j < 3; j++) qkv[j] = qact(qs, ctx, l, out_pt[j], qkv[j]);
        if (cls_only) qkv[0] = query_rows(ctx, bq_op_select_token(ctx, qkv[0], 0));
    } else {
        BqTensor *xa = qact(qs, ctx, l, BQ_QP_QKV_IN, x);
        /* ort: the layer input is the previous layer's output quantizer's output, or the embeddings'
         * (whose dropout takes it off the grid in training) */
        const BqQuantizer *gx = l > 0 ? grid_of(qs, l - 1, BQ_QP_OUT_LN, -1)
                                : ctx->training && c->hidden_dropout_prob > 0.0f ? NULL
                                                                                 : grid_of(qs, BQ_QP_LAYER_EMB, -1, -1);
        /* cls_only: the query Linear on token 0's rows (B,H) */
        BqTensor *x0 = cls_only ? bq_op_select_token(ctx, x, 0) : x;
        BqTensor *xa0 = !cls_only ? xa : xa == x ? x0 : bq_op_select_token(ctx, xa, 0);
        for (int j = 0; j < 3; j++) {
            const BqLinearId id = (BqLinearId)(BQ_LIN_Q + j);
            BqTensor *xj = j ? x : x0, *xaj = j ? xa : xa0;
            if (!(qkv[j] = lin_reused(ctx, ru, l, id, xj, W[j]->shape[0])) &&
                (st = linear(ctx, hk, qs, l, id, xj, xaj, in_pt[j], gx, W[j], w_pt[j], Bias[j], &qkv[j])))
                return st;
            lin_kept(ru, l, id, qkv[j]);
            qkv[j] = qact(qs, ctx, l, out_pt[j], qkv[j]);
        }
        if (cls_only) qkv[0] = query_rows(ctx, qkv[0]);
    }
    return BQ_OK;
}

/* The rest of BertSelfAttention of layer l: softmax(Q·Kᵀ/√d + mask) with attention dropout, times V, per
 * head, on the quantized query, key and value qkv (attention_qkv); returns the context through its
 * output quantizer, (B,T,H), or (B,1,H) when the query is token 0's block (cls_only). */
static BqTensor *attention_context(BqBert *m, BqCtx *ctx, int l, BqTensor *const qkv[3], const float *mask) {
    const BqBertConfig *c = &m->cfg;
    BqQuantState *qs = m->quant;
    const int nh = c->num_attention_heads;
    const float scale = 1.0f / sqrtf((float)(c->hidden_size / nh));

    if (qkv[0]->data16) /* bf16 storage (store_bf16): no quantizers, probabilities and context as bf16 words */
        return bq_op_attn_context_dropout_bf16(
            ctx, bq_op_attn_probs_bf16(ctx, qkv[0], qkv[1], nh, mask, scale, -FLT_MAX), c->attention_probs_dropout_prob,
            qkv[2], nh);
    /* Q·Kᵀ and P·V on integer codes where both inputs are on 8-bit grids (ort, qdqbert; layers/quant.h) */
    BqTensor *qm = qact(qs, ctx, l, BQ_QP_MM1_Q, qkv[0]), *km = qact(qs, ctx, l, BQ_QP_MM1_K, qkv[1]);
    const BqQuantizer *gq = grid_of(qs, l, BQ_QP_MM1_Q, BQ_QP_Q_OUT), *gk = grid_of(qs, l, BQ_QP_MM1_K, BQ_QP_K_OUT);
    BqTensor *s = gq && gk ? bq_op_attn_scores_int(ctx, qm, km, gq->scale[0], gk->scale[0], nh)
                           : bq_op_attn_scores(ctx, qm, km, nh);
    s = qact(qs, ctx, l, BQ_QP_SCORES, s);                                      /* (B,NH,T,T); cls_only (B,NH,1,T) */
    /* The scores (or their fake-quant output) feed only the softmax, and neither producer's backward
     * reads them, so the softmax runs in place; each probability tensor then feeds only the next op. */
    BqTensor *p = bq_op_softmax_mask_sole(ctx, s, mask, scale, -FLT_MAX);
    p = qact(qs, ctx, l, BQ_QP_PROBS, p);
    BqTensor *cx;
    /* (each grid is looked up after its quantizer ran: the first forward initializes the ranges) */
    if (!has_q(qs, l, BQ_QP_MM2_P)) { /* the dropout inside the context op's head loop: not stored */
        BqTensor *vm = qact(qs, ctx, l, BQ_QP_MM2_V, qkv[2]);
        const BqQuantizer *gv = grid_of(qs, l, BQ_QP_MM2_V, BQ_QP_V_OUT);
        /* ort: the probabilities are on the softmax output's grid unless dropout scales them (training) */
        const BqQuantizer *gp = ctx->training && c->attention_probs_dropout_prob > 0.0f ? NULL
                                                                                       : grid_of(qs, l, BQ_QP_PROBS, -1);
        cx = gp && gv ? bq_op_attn_context_int(ctx, p, vm, gp->scale[0], gv->scale[0], nh)
                      : bq_op_attn_context_dropout(ctx, p, c->attention_probs_dropout_prob, vm, nh);
    } else {
        p = bq_op_dropout_sole(ctx, p, c->attention_probs_dropout_prob);
        BqTensor *pm = qact(qs, ctx, l, BQ_QP_MM2_P, p), *vm = qact(qs, ctx, l, BQ_QP_MM2_V, qkv[2]);
        const BqQuantizer *gp = grid_of(qs, l, BQ_QP_MM2_P, -1), *gv = grid_of(qs, l, BQ_QP_MM2_V, BQ_QP_V_OUT);
        cx = gp && gv ? bq_op_attn_context_int(ctx, pm, vm, gp->scale[0], gv->scale[0], nh)
                      : bq_op_attn_context(ctx, pm, vm, nh);
    }
    return qact(qs, ctx, l, BQ_QP_CONTEXT, cx);                                 /* (B,T,H); cls_only (B,1,H) */
}

/* BertSelfOutput of layer l: *out = LayerNorm(dropout(dense(cx)) + x) through the attention LayerNorm's
 * output quantizer, where cx is the attention context and x the layer input (both token 0's rows (B,H)
 * on the cls_only path), one fused op where no quantizer sits between the dropout, the residual add and
 * the LayerNorm (fp32, the cpu scheme). Returns BQ_OK, or the hook's error with *out unset. */
static int attention_output(BqBert *m, BqCtx *ctx, const BqLinearHook *hk, const BqBertReuse *ru, int l, BqTensor *cx,
                            BqTensor *x, BqTensor **out) {
    const BqBertConfig *c = &m->cfg;
    BqBertLayer *L = &m->layers[l];
    BqQuantState *qs = m->quant;
    int st;

    BqTensor *a;
    if (!(a = lin_reused(ctx, ru, l, BQ_LIN_AO, cx, L->ao_w.shape[0])) &&
        (st = linear(ctx, hk, qs, l, BQ_LIN_AO, cx, cx, BQ_QP_AO_IN, grid_of(qs, l, BQ_QP_CONTEXT, -1), &L->ao_w,
                     BQ_QP_W_AO, &L->ao_b, &a)))
        return st;
    lin_kept(ru, l, BQ_LIN_AO, a);
    if (!has_q(qs, l, BQ_QP_ADD1_LOCAL) && !has_q(qs, l, BQ_QP_ADD1_RESID) && !has_q(qs, l, BQ_QP_ATTN_RESID)) {
        a = bq_op_residual_layernorm_sole(ctx, a, c->hidden_dropout_prob, x, &L->ln1_w, &L->ln1_b, c->layer_norm_eps);
    } else {
        a = bq_op_dropout_sole(ctx, a, c->hidden_dropout_prob);
        a = bq_op_add(ctx, qact(qs, ctx, l, BQ_QP_ADD1_LOCAL, a), qact(qs, ctx, l, BQ_QP_ADD1_RESID, x));
        a = qact(qs, ctx, l, BQ_QP_ATTN_RESID, a);
        a = bq_op_layernorm(ctx, a, &L->ln1_w, &L->ln1_b, c->layer_norm_eps);
    }
    *out = qact(qs, ctx, l, BQ_QP_ATTN_LN, a);
    return BQ_OK;
}

/* BertIntermediate and BertOutput of layer l on a, the attention block's output (B,T,H) or (B,H):
 * *y = LayerNorm(dropout(dense(gelu(dense(a)))) + a) through the layer's output quantizer. Returns
 * BQ_OK, or the hook's error with *y unset. */
static int feed_forward(BqBert *m, BqCtx *ctx, const BqLinearHook *hk, const BqBertReuse *ru, int l, BqTensor *a,
                        BqTensor **y) {
    const BqBertConfig *c = &m->cfg;
    BqBertLayer *L = &m->layers[l];
    BqQuantState *qs = m->quant;
    int st;

    /* BertIntermediate: gelu(dense(a)); the bias joins the GELU pass unless a quantizer sits between the
     * bias add and the GELU or an engine computes the Linear */
    BqTensor *h;
    int fuse_bias = !hk && !has_q(qs, l, BQ_QP_INTER_OUT);
    if (store_bf16(m, ctx, hk, ru)) /* the GELU's input as bf16 words, read by bq_op_gelu_linear below */
        h = bq_op_linear_bf16(ctx, a, &L->i_w, NULL);
    else if (!(h = lin_reused(ctx, ru, l, BQ_LIN_I, a, L->i_w.shape[0])) &&
             (st = linear(ctx, hk, qs, l, BQ_LIN_I, a, a, BQ_QP_I_IN, grid_of(qs, l, BQ_QP_ATTN_LN, -1), &L->i_w,
                          BQ_QP_W_I, fuse_bias ? NULL : &L->i_b, &h)))
        return st;
    lin_kept(ru, l, BQ_LIN_I, h);
    h = qact(qs, ctx, l, BQ_QP_INTER_OUT, h);                                   /* (B,T,I) */

    /* BertOutput: LayerNorm(dropout(dense(h)) + a), fused as in attention_output. Where nothing sits
     * between the GELU and the dense (no quantizer, no engine), the two are one op that never keeps the
     * GELU output. */
    BqTensor *o = lin_reused(ctx, ru, l, BQ_LIN_O, h, L->o_w.shape[0]);
    if (o) {
        /* reused: neither the GELU nor the dense runs */
    } else if (fuse_bias && !has_q(qs, l, BQ_QP_GELU_OUT) && !has_q(qs, l, BQ_QP_O_IN)) {
        o = bq_op_gelu_linear(ctx, h, &L->i_b, qweight(qs, ctx, l, BQ_QP_W_O, &L->o_w), &L->o_b);
    } else {
        h = bq_op_bias_gelu_sole(ctx, h, fuse_bias ? &L->i_b : NULL);
        h = qact(qs, ctx, l, BQ_QP_GELU_OUT, h);
        if ((st = linear(ctx, hk, qs, l, BQ_LIN_O, h, h, BQ_QP_O_IN, grid_of(qs, l, BQ_QP_GELU_OUT, -1), &L->o_w,
                         BQ_QP_W_O, &L->o_b, &o)))
            return st;
    }
    lin_kept(ru, l, BQ_LIN_O, o);
    if (!has_q(qs, l, BQ_QP_ADD2_LOCAL) && !has_q(qs, l, BQ_QP_ADD2_RESID) && !has_q(qs, l, BQ_QP_OUT_RESID)) {
        o = bq_op_residual_layernorm_sole(ctx, o, c->hidden_dropout_prob, a, &L->ln2_w, &L->ln2_b, c->layer_norm_eps);
    } else {
        o = bq_op_dropout_sole(ctx, o, c->hidden_dropout_prob);
        o = bq_op_add(ctx, qact(qs, ctx, l, BQ_QP_ADD2_LOCAL, o), qact(qs, ctx, l, BQ_QP_ADD2_RESID, a));
        o = qact(qs, ctx, l, BQ_QP_OUT_RESID, o);
        o = bq_op_layernorm(ctx, o, &L->ln2_w, &L->ln2_b, c->layer_norm_eps);
    }
    *y = qact(qs, ctx, l, BQ_QP_OUT_LN, o);
    return BQ_OK;
}

/* One BertLayer (attention, residual + LayerNorm, feed-forward, residual + LayerNorm) on x (B,T,H) →
 * (B,T,H); cls_only: the query, its attention row and everything after on token 0 only → (B,H)
 * (bq_bert_forward); key and value still on every token. ru (may be NULL): the Linear outputs to keep or
 * reuse (BqBertReuse.lin_keep, lin_reuse). The blocks run in this order, so the tape records the ops
 * exactly in the order of the model. */
static int layer_forward(BqBert *m, BqCtx *ctx, const BqLinearHook *hk, const BqBertReuse *ru, int l, BqTensor *x,
                         const float *mask, int cls_only, BqTensor **y) {
    BqTensor *qkv[3] = {NULL, NULL, NULL}, *a;
    int st;

    if ((st = attention_qkv(m, ctx, hk, ru, l, x, cls_only, qkv))) return st;
    BqTensor *cx = attention_context(m, ctx, l, qkv, mask);
    if (cls_only) { /* from here every op is row-wise: token 0 of the context and of the residual */
        cx = bq_op_select_token(ctx, cx, 0);                                    /* (B,H) */
        x = bq_op_select_token(ctx, x, 0);
    }
    if ((st = attention_output(m, ctx, hk, ru, l, cx, x, &a))) return st;
    return feed_forward(m, ctx, hk, ru, l, a, y);
}

int bq_bert_check_input(const BqBert *m, const BqBertInput *in, int *labelled) {
    const BqBertConfig *c = &m->cfg;
    const int64_t B = in->B, T = in->T;
    /* everything here is caused by data, so it is an error, not an abort */
    if (B <= 0 || T <= 0) return bq_err(BQ_EINVAL, "batch: empty batch (B=%lld, T=%lld)", (long long)B, (long long)T);
    if (T > c->max_position_embeddings)
        return bq_err(BQ_EINVAL, "batch: sequence length %lld exceeds max_position_embeddings %d", (long long)T,
                      c->max_position_embeddings);
    BQ_CHECK(in->input_ids);
    for (int64_t i = 0; i < B * T; i++) {
        if (in->input_ids[i] < 0 || in->input_ids[i] >= c->vocab_size)
            return bq_err(BQ_EFORMAT, "batch: token id %d at (%lld,%lld) is outside the vocabulary of %d",
                          in->input_ids[i], (long long)(i / T), (long long)(i % T), c->vocab_size);
        if (in->token_type_ids &&
            (in->token_type_ids[i] < 0 || in->token_type_ids[i] >= c->type_vocab_size))
            return bq_err(BQ_EFORMAT, "batch: token type %d at (%lld,%lld) is outside type_vocab_size %d",
                          in->token_type_ids[i], (long long)(i / T), (long long)(i % T), c->type_vocab_size);
    }
    if (c->head == BQ_HEAD_QA) {
        /* HF clamps positions to [0,T]; T is the ignored index, so only negative means unlabeled */
        *labelled = in->start_positions != NULL && in->end_positions != NULL;
        for (int64_t b = 0; *labelled && b < B; b++)
            if (in->start_positions[b] < 0 || in->end_positions[b] < 0) *labelled = 0;
        return BQ_OK;
    }
    *labelled = in->labels != NULL;
    for (int64_t b = 0; *labelled && b < B; b++) {
        if (in->labels[b] < 0) *labelled = 0;
        else if (in->labels[b] >= c->num_labels)
            return bq_err(BQ_EFORMAT, "batch: label %d of example %lld is not below num_labels %d", in->labels[b],
                          (long long)b, c->num_labels);
    }
    return BQ_OK;
}

/* BertEmbeddings of a checked batch: LayerNorm(word + token type + position), its quantizer when the
 * scheme has one, dropout when ctx->training → *x (B,T,H). Fails only where the word rows come from a
 * fetch (bq_bert_word_rows_attach) and it fails. */
static int embed(BqBert *m, BqCtx *ctx, const BqBertInput *in, BqTensor **x) {
    const BqBertConfig *c = &m->cfg;
    const int64_t B = in->B, T = in->T;
    BqTensor *word = &m->word_emb, table;
    const int32_t *ids = in->input_ids;
    if (m->word_rows) { /* the pool's rows and each token's row in it */
        BQ_CHECK(!ctx->tape);
        int32_t *local = bq_arena_alloc(ctx->act, (size_t)(B * T) * sizeof(int32_t));
        int st = bq_word_rows_map(m->word_rows, ids, B * T, local, &table);
        if (st) return st;
        word = &table, ids = local;
    }
    /* ids of positions and (when the input has none) token types, in the activation arena: the
     * embedding backward reads them after the forward returns */
    int32_t *pos_ids = bq_arena_alloc(ctx->act, (size_t)(B * T) * sizeof(int32_t));
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) pos_ids[b * T + t] = (int32_t)t;
    const int32_t *type_ids = in->token_type_ids;
    if (!type_ids) type_ids = bq_arena_alloc_zero(ctx->act, (size_t)(B * T) * sizeof(int32_t));

    /* LayerNorm(word + token_type + position), HF's summation order, one op that keeps no sum.
     * nn.Embedding(padding_idx=pad_token_id): the [PAD] row gets no gradient. Only the QA loss reaches
     * padding positions (it spans every token), so classification gradients are the same either way. */
    BqTensor *y = bq_op_embed_layernorm(ctx, word, &m->type_emb, &m->pos_emb, ids, type_ids, pos_ids, B, T,
                                        &m->emb_ln_w, &m->emb_ln_b, c->layer_norm_eps, c->pad_token_id);
    y = qact(m->quant, ctx, BQ_QP_LAYER_EMB, -1, y);
    *x = bq_op_dropout(ctx, y, c->hidden_dropout_prob);
    return BQ_OK;
}

/* 1 when the last layer may compute token 0 only (layers/bert.h, bq_bert_forward): a classification
 * head, no tape, no dropout, all_rows not asked for, and no quantizer that would see the other rows
 * (collecting calibration statistics, or taking its first range from this forward). */
static int cls_rows_only(const BqBert *m, const BqCtx *ctx, const BqBertInput *in) {
    if (m->cfg.head != BQ_HEAD_CLS || ctx->tape || ctx->training || in->all_rows) return 0;
    const BqQuantState *qs = m->quant;
    if (!qs) return 1;
    if (qs->calib == BQ_CALIB_COLLECT) return 0;
    for (int i = 0; i < qs->n; i++)
        if (qs->q[i].enabled && !qs->q[i].initialized) return 0;
    return 1;
}

/* The outputs of a forward's op-by-op layers without a tape (forward_run): each is copied into one of two
 * buffers, in turn, and the arena rewound to before the layer, so the forward holds one layer's
 * activations whatever the depth (an engine's fused layers do the same with their own buffers,
 * layers/bert_fused.h). Off (on = 0) with a tape or when every layer's output is kept (in->hidden). */
typedef struct Turns {
    int on;
    float *buf[2];  /* taken at the first op-by-op layer, n floats each */
    BqTensor *t[2]; /* their tensor headers */
    int64_t n;
} Turns;

/* Before an op-by-op layer on x: the buffers on first use; returns the arena mark to rewind to. */
static size_t turns_reserve(Turns *tn, BqCtx *ctx, const BqTensor *x) {
    if (tn->on && !tn->buf[0]) {
        tn->n = bq_tensor_numel(x);
        for (int k = 0; k < 2; k++) {
            tn->buf[k] = bq_arena_alloc(ctx->act, (size_t)tn->n * sizeof(float));
            tn->t[k] = bq_arena_alloc(ctx->act, sizeof(BqTensor));
        }
    }
    return bq_arena_mark(ctx->act);
}

/* Layer l's output y: with turns on, its copy in buffer l mod 2 (the other buffer holds the layer's
 * input when the previous layer ran op by op), the arena back at mark; else y itself. */
static BqTensor *turns_keep(Turns *tn, BqCtx *ctx, int l, BqTensor *y, size_t mark) {
    if (!tn->on) return y;
    float *dst = tn->buf[l & 1];
    BQ_CHECK(bq_tensor_numel(y) <= tn->n);
    memcpy(dst, y->data, (size_t)bq_tensor_numel(y) * sizeof(float));
    *tn->t[l & 1] = bq_tensor_wrap(dst, NULL, y->ndim, y->shape);
    bq_arena_rewind(ctx->act, mark);
    return tn->t[l & 1];
}

/* The forward of bq_bert_forward, bq_bert_forward_hooked and bq_bert_forward_reuse: hook (may be NULL) is
 * asked for every Linear, ru (may be NULL) names where to start and the Linear outputs to keep or reuse;
 * never both. */
static int forward_run(BqBert *m, BqCtx *ctx, const BqBertInput *in, const BqLinearHook *hook, const BqBertReuse *ru,
                       BqTensor **logits, BqTensor **loss) {
    BQ_CHECK(m && ctx && ctx->act && in && logits);
    BQ_CHECK(!hook || !ctx->tape); /* engines compute forward values only */
    BQ_CHECK(!hook || !ru);        /* an engine's Linears are its own */
    BQ_CHECK(!ru || !ctx->tape);   /* a reused output or a cached layer input has no tape node */
    const BqBertConfig *c = &m->cfg;
    *logits = NULL;
    if (loss) *loss = NULL;
    int labelled = 0;
    int st = bq_bert_check_input(m, in, &labelled);
    if (st) return st;
    const int start = ru ? ru->start_layer : 0;
    BQ_CHECK(start >= 0 && start < c->num_hidden_layers && (!start || ru->start_hidden));
    BqTensor *x = ru && start > 0 ? ru->start_hidden : NULL;
    if (!x && (st = embed(m, ctx, in, &x))) return st;
    const int cls_last = cls_rows_only(m, ctx, in);
    /* Without a tape a layer run op by op leaves its activations dead once its output exists (Turns) */
    Turns turns = {.on = !ctx->tape && !in->hidden};
    for (int l = start; l < c->num_hidden_layers; l++) {
        BqTensor *y = NULL;
        const int cls_only = cls_last && l == c->num_hidden_layers - 1;
        if (hook && hook->layer && (st = hook->layer(hook->user, ctx, l, x, in->attention_mask, cls_only, &y)))
            return st;
        if (!y) {
            const size_t mark = turns_reserve(&turns, ctx, x);
            if ((st = layer_forward(m, ctx, hook, ru, l, x, in->attention_mask, cls_only, &y))) return st;
            y = turns_keep(&turns, ctx, l, y, mark);
        }
        x = y;
        if (in->hidden) in->hidden[l] = x;
    }

    if (c->head == BQ_HEAD_QA) {
        /* qa_outputs on every token (no dropout in HF's head): (B,T,2), fp32 in every scheme */
        *logits = bq_op_linear(ctx, x, &m->qa_w, &m->qa_b);
        if (loss && labelled) {
            const int64_t B = in->B, T = in->T;
            int32_t *pos = bq_arena_alloc(ctx->act, (size_t)(2 * B) * sizeof(int32_t));
            for (int64_t b = 0; b < B; b++) {
                pos[2 * b] = in->start_positions[b] > T ? (int32_t)T : in->start_positions[b];
                pos[2 * b + 1] = in->end_positions[b] > T ? (int32_t)T : in->end_positions[b];
            }
            *loss = bq_op_span_cross_entropy(ctx, *logits, pos);
        }
        return BQ_OK;
    }

    /* BertPooler: tanh(dense(x[:, 0])); then dropout and the classifier */
    BqTensor *pooled, *cls = x->ndim == 2 ? x : bq_op_select_token(ctx, x, 0); /* (B,H) already: cls_only */
    if ((st = linear(ctx, hook, NULL, -1, BQ_LIN_POOLER, cls, cls, -1, NULL, &m->pool_w, -1, &m->pool_b, &pooled)))
        return st;
    pooled = bq_op_tanh(ctx, pooled);
    float cls_p = c->classifier_dropout >= 0 ? c->classifier_dropout : c->hidden_dropout_prob;
    pooled = bq_op_dropout(ctx, pooled, cls_p);
    /* (B, num_labels) */
    if ((st = linear(ctx, hook, NULL, -1, BQ_LIN_CLASSIFIER, pooled, pooled, -1, NULL, &m->cls_w, -1, &m->cls_b, logits)))
        return st;
    if (loss && labelled) *loss = bq_op_cross_entropy(ctx, *logits, in->labels);
    return BQ_OK;
}

int bq_bert_forward(BqBert *m, BqCtx *ctx, const BqBertInput *in, BqTensor **logits, BqTensor **loss) {
    return forward_run(m, ctx, in, NULL, NULL, logits, loss);
}

int bq_bert_forward_hooked(BqBert *m, BqCtx *ctx, const BqBertInput *in, const BqLinearHook *hook,
                           BqTensor **logits, BqTensor **loss) {
    return forward_run(m, ctx, in, hook, NULL, logits, loss);
}

int bq_bert_forward_reuse(BqBert *m, BqCtx *ctx, const BqBertInput *in, const BqBertReuse *r, BqTensor **logits) {
    BQ_CHECK(r);
    return forward_run(m, ctx, in, NULL, r, logits, NULL);
}
