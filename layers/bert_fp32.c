/* Fused fp32 evaluation forward (layers/bert_fp32.h): a BqLinearHook (layers/bert.h) whose whole-layer
 * callback computes each encoder layer of a model without quantizers as 6 GEMMs (bq_gemm in ctx->prec,
 * threaded inside each call; query, key and value write one interleaved (B·T, 3H) block; in bf16 the
 * attention products stay fp32 inside the fused attention kernel) and the fused passes of autograd/infer_kernels.h; the embeddings, pooler and
 * classifier stay layers/bert.c's ops. The ops and their order are layer_forward's of layers/bert.c in
 * evaluation (no dropout).
 *
 * Memory: the layer's output comes from ctx->act first; everything else it needs (the query/key/value
 * biases, the GEMM outputs, the attention scratch) is taken after it and given back
 * when the layer ends, so a forward holds one layer's temporaries at a time. */
#include "layers/bert_fp32.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "autograd/gemm.h"
#include "autograd/infer_kernels.h"
#include "autograd/kernels.h"

static int layer_fusable(const BqBertConfig *c) {
    return c->num_attention_heads > 0 && c->hidden_size % c->num_attention_heads == 0 &&
           (c->hidden_size / c->num_attention_heads) % 8 == 0;
}

int bq_fp32_fused_layer_count(const BqBert *m) {
    return m->quant || !layer_fusable(&m->cfg) ? 0 : m->cfg.num_hidden_layers;
}

/* out (M,N), rows ldo apart, = x (M,K)·Wᵀ, W (N,K) row-major (PyTorch's Linear layout); no bias; in the
 * forward's precision. */
static void gemm_nt_ld(BqPrecision p, float *out, int64_t ldo, const float *x, const float *w, int64_t M, int64_t N,
                       int64_t K) {
    bq_gemm(p, BQ_NOTRANS, BQ_TRANS, M, N, K, x, K, w, K, 0.0f, out, ldo);
}
static void gemm_nt(BqPrecision p, float *out, const float *x, const float *w, int64_t M, int64_t N, int64_t K) {
    gemm_nt_ld(p, out, N, x, w, M, N, K);
}

/* The whole encoder layer l on x (B,T,H) → *y (B,T,H); cls_only: after the attention token 0 only,
 * *y (B,H). Leaves *y NULL when the layer cannot be fused. */
static int layer_run(void *user, BqCtx *ctx, int l, BqTensor *x, const float *mask, int cls_only, BqTensor **y) {
    const BqBert *m = user;
    const BqBertConfig *c = &m->cfg;
    if (!layer_fusable(c) || x->ndim != 3 || !bq_tensor_is_contiguous(x) || x->shape[2] != c->hidden_size)
        return BQ_OK;
    const BqBertLayer *L = &m->layers[l];
    const int64_t B = x->shape[0], T = x->shape[1], H = c->hidden_size, NI = c->intermediate_size;
    const int64_t NH = c->num_attention_heads, d = H / NH, M = B * T;
    const float scale = 1.0f / sqrtf((float)d), eps = c->layer_norm_eps;

    /* rows after the attention: every token, or token 0 of each example (cls_only) */
    const int64_t R = cls_only ? B : M;
    int64_t shape[3] = {B, cls_only ? H : T, H};
    BqTensor *o = bq_tensor_new(ctx, cls_only ? 2 : 3, shape); /* the layer's output: kept */
    size_t mark = bq_arena_mark(ctx->act);

    /* qkv (M, 3H): row m is query | key | value of token m, written by three GEMMs with row stride 3H
     * straight from the parameters (no per-forward copy of the weights); their biases as one (3H) vector */
    float *bqkv = bq_arena_alloc(ctx->act, (size_t)(3 * H) * sizeof(float));
    const BqTensor *W[3] = {&L->q_w, &L->k_w, &L->v_w}, *Bs[3] = {&L->q_b, &L->k_b, &L->v_b};
    float *qkv = bq_arena_alloc(ctx->act, (size_t)(M * 3 * H) * sizeof(float));
    for (int j = 0; j < 3; j++) {
        memcpy(bqkv + j * H, Bs[j]->data, (size_t)H * sizeof(float));
        gemm_nt_ld(ctx->prec, qkv + j * H, 3 * H, x->data, W[j]->data, M, H, H);
    }

    const int64_t nthr = omp_get_max_threads();
    float *scratch = bq_arena_alloc(ctx->act, (size_t)(nthr * bq_infer_attention_scratch(T, d)) * sizeof(float));
    float *cx = bq_arena_alloc(ctx->act, (size_t)(M * H) * sizeof(float));
    bq_infer_attention_f32(cx, qkv, bqkv, mask, scratch, nthr, scale, B, T, NH, d);

    const float *xr = x->data;
    if (cls_only) { /* token 0's row of the context and of x, per example */
        float *c0 = bq_arena_alloc(ctx->act, (size_t)(2 * B * H) * sizeof(float)), *x0 = c0 + B * H;
        bq_kernel_select_token_forward(c0, cx, B, T, H, 0);
        bq_kernel_select_token_forward(x0, x->data, B, T, H, 0);
        cx = c0, xr = x0;
    }

    /* BertSelfOutput: LayerNorm(dense(ctx) + x) */
    float *a = bq_arena_alloc(ctx->act, (size_t)(R * H) * sizeof(float));
    gemm_nt(ctx->prec, a, cx, L->ao_w.data, R, H, H);
    bq_infer_bias_residual_layernorm_f32(a, a, L->ao_b.data, xr, L->ln1_w.data, L->ln1_b.data, eps, R, H);

    /* BertIntermediate: gelu(dense(a)), the GELU in place on the GEMM output */
    float *h = bq_arena_alloc(ctx->act, (size_t)(R * NI) * sizeof(float));
    gemm_nt(ctx->prec, h, a, L->i_w.data, R, NI, H);
    bq_infer_bias_gelu_f32(h, L->i_b.data, R, NI);

    /* BertOutput: LayerNorm(dense(h) + a) */
    gemm_nt(ctx->prec, o->data, h, L->o_w.data, R, H, NI);
    bq_infer_bias_residual_layernorm_f32(o->data, o->data, L->o_b.data, a, L->ln2_w.data, L->ln2_b.data, eps, R, H);

    bq_arena_rewind(ctx->act, mark);
    *y = o;
    return BQ_OK;
}

/* Every Linear the fused layers do not cover (pooler, classifier, QA outputs, unfused layers) is left to
 * the forward's own op. */
static int linear_run(void *user, BqCtx *ctx, int layer, BqLinearId id, BqTensor *x, const BqTensor *w,
                      const BqTensor *b, BqTensor **out) {
    (void)user, (void)ctx, (void)layer, (void)id, (void)x, (void)w, (void)b, (void)out;
    return BQ_OK;
}

int bq_fp32_forward(BqBert *m, BqCtx *ctx, const BqBertInput *in, BqTensor **logits) {
    BQ_CHECK(m && ctx && ctx->act && in && logits);
    BQ_CHECK(ctx->tape == NULL && !ctx->training); /* inference only */
    if (!bq_fp32_fused_layer_count(m)) return bq_bert_forward(m, ctx, in, logits, NULL);
    BqLinearHook hook = {.user = m, .run = linear_run, .layer = layer_run};
    return bq_bert_forward_hooked(m, ctx, in, &hook, logits, NULL);
}
