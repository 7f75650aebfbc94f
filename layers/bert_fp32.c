/* The fp32 and bf16 engine of the fused evaluation forward (layers/bert_fp32.h): the Linear of
 * layers/bert_fused.h's shared encoder layer as a GEMM in ctx->prec (bq_gemm: OpenBLAS in fp32, bf16
 * operands with fp32 sums in bf16; threaded inside each call) followed by one fused fp32 pass of
 * autograd/infer_kernels.h; in bf16 the attention products stay fp32 inside the fused attention kernel,
 * the query/key/value product is one GEMM on the stacked weights, and the intermediate dense's GELU is
 * written as the bf16 words the output dense reads. The embeddings, pooler and classifier stay
 * layers/bert.c's ops. */
#include "layers/bert_fp32.h"

#include <math.h>
#include <omp.h>
#include <string.h>

#include "autograd/gemm.h"
#include "autograd/infer_kernels.h"
#include "autograd/kernels.h"
#include "layers/bert_fused.h"

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

/* The fp32/bf16 engine's Linear (layers/bert_fused.h): the GEMM in ctx->prec on floats, then the
 * epilogue's fp32 kernel. Query, key and value write one interleaved (rows, 3H) block by three GEMMs
 * with row stride 3H straight from the parameters (no per-forward copy of the weights), their biases
 * concatenated into one (3H) vector, a block of whole sequences at a time. */
static int linear_step(void *user, BqCtx *ctx, int l, const BqFusedAct *in, const BqFusedStep *s, BqFusedAct *out) {
    const BqBert *m = user;
    const BqBertLayer *L = &m->layers[l];
    const int64_t R = s->rows, N = s->N;
    switch (s->id) {
    case BQ_LIN_QKV: {
        /* blocks of whole sequences, at most bq_fused_block_rows rows (at least one sequence): the products
         * of one block at a time, as the integer engine holds its sums */
        const int64_t H = N, T = s->T, d = s->d, units = R / T;
        const int64_t per = bq_fused_block_rows(m->cfg.intermediate_size) / T, ub = per > 1 ? per : 1;
        const int64_t brows = (ub < units ? ub : units) * T;
        BQ_CHECK(units * T == R);
        float *bqkv = bq_arena_alloc(ctx->act, (size_t)(3 * H) * sizeof(float));
        float *qkv = bq_arena_alloc(ctx->act, (size_t)(brows * 3 * H) * sizeof(float));
        const BqTensor *W[3] = {&L->q_w, &L->k_w, &L->v_w}, *Bs[3] = {&L->q_b, &L->k_b, &L->v_b};
        for (int j = 0; j < 3; j++) memcpy(bqkv + j * H, Bs[j]->data, (size_t)H * sizeof(float));
        uint16_t *w3 = NULL;
        if (ctx->prec == BQ_PRECISION_BF16) {
            /* one (rows,3H) product on the three weights' bf16 words stacked as (3H,H): the input is
             * converted once per block, and the destination is dense */
            w3 = bq_arena_alloc(ctx->act, (size_t)(3 * H * H) * sizeof(uint16_t));
            for (int j = 0; j < 3; j++) bq_bf16_words(w3 + j * H * H, W[j]->data, H * H);
        }
        const int64_t nthr = omp_get_max_threads();
        float *scratch = bq_arena_alloc(ctx->act, (size_t)(nthr * bq_infer_attention_scratch(T, d)) * sizeof(float));
        for (int64_t u0 = 0; u0 < units; u0 += ub) {
            const int64_t nb = units - u0 < ub ? units - u0 : ub, r0 = u0 * T, rb = nb * T;
            const float *x = in->f + r0 * H;
            if (w3)
                bq_gemm_mat(ctx->prec, BQ_NOTRANS, BQ_TRANS, rb, 3 * H, H, bq_mat_f32(x), H,
                            (BqMat){.f = NULL, .h = w3}, H, 0.0f, qkv, 3 * H);
            else
                for (int j = 0; j < 3; j++) gemm_nt_ld(ctx->prec, qkv + j * H, 3 * H, x, W[j]->data, rb, H, H);
            const double t0 = bq_section_start();
            bq_infer_attention_f32(out->f + u0 * s->Q * H, qkv, bqkv, s->mask ? s->mask + r0 : NULL, scratch, nthr,
                                   s->scale, nb, T, s->Q, s->NH, d);
            bq_section_end(BQ_SEC_ATTENTION, t0);
        }
        return BQ_OK;
    }
    case BQ_LIN_AO: {
        gemm_nt(ctx->prec, out->f, in->f, L->ao_w.data, R, N, L->ao_w.shape[1]);
        const double t0 = bq_section_start();
        bq_infer_bias_residual_layernorm_f32(out->f, out->f, L->ao_b.data, s->resid, s->lnw, s->lnb, s->eps, R, N);
        bq_section_end(BQ_SEC_EPILOGUE, t0);
        return BQ_OK;
    }
    case BQ_LIN_I: {
        gemm_nt(ctx->prec, out->f, in->f, L->i_w.data, R, N, L->i_w.shape[1]);
        if (ctx->prec == BQ_PRECISION_BF16) return BQ_OK; /* bias and GELU in the output dense's step */
        const double t0 = bq_section_start();
        bq_infer_bias_gelu_f32(out->f, L->i_b.data, R, N);
        bq_section_end(BQ_SEC_EPILOGUE, t0);
        return BQ_OK;
    }
    case BQ_LIN_O: {
        const int64_t K = L->o_w.shape[1];
        if (ctx->prec == BQ_PRECISION_BF16) {
            /* the intermediate dense's bias and GELU, written straight as the bf16 words this product
             * reads (one pass instead of GELU in place and a conversion) */
            uint16_t *h = bq_arena_alloc(ctx->act, (size_t)(R * K) * sizeof(uint16_t));
            double t0 = bq_section_start();
            bq_infer_bias_gelu_bf16(h, in->f, L->i_b.data, R, K);
            bq_section_end(BQ_SEC_EPILOGUE, t0);
            bq_gemm_mat(ctx->prec, BQ_NOTRANS, BQ_TRANS, R, N, K, (BqMat){.f = NULL, .h = h}, K, bq_mat_f32(L->o_w.data),
                        K, 0.0f, out->f, N);
        } else {
            gemm_nt(ctx->prec, out->f, in->f, L->o_w.data, R, N, K);
        }
        const double t0 = bq_section_start();
        bq_infer_bias_residual_layernorm_f32(out->f, out->f, L->o_b.data, s->resid, s->lnw, s->lnb, s->eps, R, N);
        bq_section_end(BQ_SEC_EPILOGUE, t0);
        return BQ_OK;
    }
    default: BQ_CHECK(!"a fused layer has no such Linear");
    }
    return BQ_OK;
}

static int layer_ok(void *user, int l) {
    (void)l;
    return layer_fusable(&((const BqBert *)user)->cfg);
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
    BqFusedEngine e = {.user = m, .codes = 0, .mlp_rows = bq_fused_block_rows(m->cfg.intermediate_size),
                       .layer_ok = layer_ok, .linear = linear_step};
    BqFusedRun run = {.e = &e, .m = m, .keep = in->hidden != NULL};
    BqLinearHook hook = {.user = &run, .run = linear_run, .layer = bq_fused_layer};
    return bq_bert_forward_hooked(m, ctx, in, &hook, logits, NULL);
}
