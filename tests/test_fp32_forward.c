/* The fused fp32 evaluation forward (layers/bert_fp32.h) against the op-by-op forward of layers/bert.c
 * without a tape, on random models (2 layers, hidden 64, 4 heads of 16, intermediate 96) with padded
 * batches:
 *  - every encoder layer runs fused (bq_fp32_fused_layer_count), classification and QA heads, T = 24
 *    (the vector softmax) and T = 13 (the scalar tail);
 *  - each layer's output and the logits within the bound below of the reference, also with the intermediate
 *    and output dense in blocks of 7 rows (bq_fused_set_block_rows: blocks that split sequences);
 *  - the fused kernels (attention, bias + GELU, bias + residual + LayerNorm) give the same bits on 1 and 2
 *    threads. (The whole forward inherits the thread behaviour of OpenBLAS's sgemm, which the op-by-op
 *    forward shares: on small shapes like these its 1- and 2-thread results already differ there.)
 *  - a head size that is not a multiple of 8 (hidden 60, 4 heads of 15): no layer fused, the logits are
 *    bq_bert_forward's bit for bit;
 *  - the same comparisons in bf16 (ctx.prec; on the CPU's bf16 units where it has them, else emulated),
 *    with the bf16 bound below.
 *
 * The bound. Both forwards compute the same ops in the same order on the same values; they differ only
 * in rounding: the query/key/value GEMM is one call instead of three (OpenBLAS sums each output in
 * the same k order either way), the attention products sum d = 16 and T terms in 8 lanes instead of
 * sgemm's order, LayerNorm's mean and variance sum H terms in 8 lanes instead of one, and the softmax,
 * GELU and products use fused multiply-adds where the CPU has AVX2 and FMA. Each such value differs by
 * at most γ_K·Σ|terms| with γ_K = K·u/(1 − K·u), u = 2^-24, K <= 96 here: below 6·10^-6 of the term
 * magnitudes. The layers in between (LayerNorm, softmax, GELU: smooth maps of gain of order 1 on
 * normalised values) carry such a difference along without growing it by more than a small factor
 * per op; 2 layers of about 8 ops each give well under 10^-4 of the values' scale. The test allows
 * max|Δ| <= 1e-4·max(1, max|reference|) for every layer output and the logits; a wrong bias, a
 * missing residual or a transposed head block moves values by their own size (order 1) and fails.
 *
 * The bf16 bound. Both bf16 forwards round every Linear's operands to bf16 (unit roundoff u_b = 2^-9) the
 * same way, the fused one by stacking the query/key/value weights into one product and writing the GELU
 * output straight as bf16 words, which are the values the op-by-op product rounds it to. They differ
 * where the fused forward keeps the attention in fp32: the op-by-op products round Q, K, P and V to
 * bf16, moving each score and context value by at most 2·u_b of its terms' magnitudes; a Linear's input
 * that moved by a fraction e of its scale may then round to the neighbouring bf16 value, one more u_b.
 * With at most 8 such roundings on a layer's path (Q, K, P, V, and the inputs of the four dense
 * products) and gains of order 1 between them, each layer adds at most 8·u_b relative to the values'
 * scale: the test allows 8·L·u_b·max(1, max|reference|), 0.031 of the scale for 2 layers. A wrong bias or
 * a transposed head block still moves values by their own size and fails. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "autograd/gemm.h"
#include "autograd/infer_kernels.h"
#include "autograd/tensor.h"
#include "layers/bert.h"
#include "layers/bert_fp32.h"
#include "layers/bert_fused.h"
#include "tests/test_util.h"


enum { B = 3, L = 2, MAXT = 24 };

static void make_model(BqBert *m, int hidden, int heads, int inter, uint64_t seed) {
    BqBertConfig c = bq_test_config(97, hidden, L, heads, inter, 64, 3, 0.1f, 0.02f);
    BqRng rng;
    bq_rng_seed(&rng, seed);
    BQ_CHECK(bq_bert_create(m, &c, 0, &rng) == BQ_OK);
    /* Larger weights than HF's initialisation (0.02), so attention is far from uniform and the GELU
     * sees both tails; biases and LayerNorm parameters random too (they are zeros and ones at init). */
    for (int i = 0; i < m->params.n; i++) {
        const BqParam *p = &m->params.p[i];
        float *d = m->params.data + p->offset;
        int ln = strstr(p->name, "LayerNorm") != NULL, w = strstr(p->name, ".weight") != NULL;
        for (int64_t k = 0; k < p->numel; k++) {
            float r = (float)bq_rng_normal(&rng);
            d[k] = ln && w ? 1.0f + 0.1f * r : ln || !w ? 0.1f * r : 0.15f * r;
        }
    }
}

typedef struct Batch {
    int32_t ids[B * MAXT], types[B * MAXT];
    float mask[B * MAXT];
} Batch;

static void make_batch(Batch *bt, int T, BqRng *rng) {
    for (int b = 0; b < B; b++) {
        int len = T - 4 * b; /* padded rows: keys masked */
        for (int t = 0; t < T; t++) {
            bt->ids[b * T + t] = t < len ? 1 + (int32_t)bq_rng_below(rng, 96) : 0;
            bt->types[b * T + t] = t >= len / 2 && t < len;
            bt->mask[b * T + t] = t < len ? 1.0f : 0.0f;
        }
    }
}

/* max|a − r| and max|r| over n values. */
static void diff(const float *a, const float *r, int64_t n, double *md, double *mr) {
    *md = *mr = 0.0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)r[i]);
        if (!(d <= *md)) *md = d; /* NaN propagates as a failure */
        if (fabs((double)r[i]) > *mr) *mr = fabs((double)r[i]);
    }
}

/* One comparison of the fused forward with the reference on a batch of length T, in precision prec. */
static void compare(BqBert *m, BqArena *act, int T, const char *what, BqPrecision prec) {
    BqRng rng;
    bq_rng_seed(&rng, 7 + (uint64_t)T);
    Batch bt;
    make_batch(&bt, T, &rng);
    BqTensor *hr[L], *hf[L];
    /* every token of every layer (the [CLS]-only last layer is tests/test_bert_cls_rows.c's) */
    BqBertInput in = {.B = B, .T = T, .input_ids = bt.ids, .token_type_ids = bt.types, .attention_mask = bt.mask,
                      .all_rows = 1};
    BqCtx ctx = {.act = act, .tape = NULL, .training = 0, .prec = prec};
    BqTensor *lr = NULL, *lf = NULL;
    const double rel = prec == BQ_PRECISION_BF16 ? 8.0 * L * ldexp(1.0, -9) : 1e-4;
    const char *pn = bq_precision_name(prec);
    in.hidden = hr;
    BQ_CHECK(bq_bert_forward(m, &ctx, &in, &lr, NULL) == BQ_OK);
    in.hidden = hf;
    EXPECT(bq_fp32_forward(m, &ctx, &in, &lf) == BQ_OK, "%s: fused forward failed: %s", what, bq_errmsg());
    if (!lf) return;

    double worst = 0.0;
    for (int l = 0; l < L; l++) {
        double md, mr;
        diff(hf[l]->data, hr[l]->data, bq_tensor_numel(hr[l]), &md, &mr);
        double tol = rel * (mr > 1.0 ? mr : 1.0);
        EXPECT(md <= tol, "%s %s T=%d: layer %d output differs by %.3g (bound %.3g)", pn, what, T, l, md, tol);
        if (md > worst) worst = md;
    }
    double md, mr;
    int64_t n = bq_tensor_numel(lr);
    diff(lf->data, lr->data, n, &md, &mr);
    double tol = rel * (mr > 1.0 ? mr : 1.0);
    EXPECT(md <= tol, "%s %s T=%d: logits differ by %.3g (bound %.3g)", pn, what, T, md, tol);
    printf("%s %s T=%d: max |fused - op by op| %.3g over layer outputs, %.3g over logits (max |logit| %.3g, bound "
           "%.3g)\n", pn, what, T, worst, md, mr, tol);
}

static void fill(float *v, int64_t n, BqRng *r, float s) {
    for (int64_t i = 0; i < n; i++) v[i] = s * (float)bq_rng_normal(r);
}

/* The fused kernels on 1 and on 2 threads (B·NH = 24 pairs, 96 rows: both threads get work). */
static void kernels_thread_invariant(void) {
    enum { KB = 4, KT = 24, KNH = 6, KD = 16, KH = KNH * KD, KI = 128, KM = KB * KT };
    BqRng r;
    bq_rng_seed(&r, 11);
    float *qkv = bq_malloc(sizeof(float) * KM * 3 * KH), *bias = bq_malloc(sizeof(float) * 3 * KH);
    float *mask = bq_malloc(sizeof(float) * KM), *h = bq_malloc(sizeof(float) * KM * KI);
    float *out[2], *g[2], *ln[2];
    fill(qkv, KM * 3 * KH, &r, 1.0f);
    fill(bias, 3 * KH, &r, 0.3f);
    fill(h, KM * KI, &r, 2.0f);
    for (int i = 0; i < KM; i++) mask[i] = (i % KT) < KT - (i / KT) * 3 ? 1.0f : 0.0f;
    int64_t per = bq_infer_attention_scratch(KT, KD);
    float *scratch = bq_malloc(sizeof(float) * (size_t)(4 * per + 16));
    float *sa = (float *)(((uintptr_t)scratch + 63) & ~(uintptr_t)63);
    int prev = bq_runtime_threads();
    for (int k = 0; k < 2; k++) {
        bq_runtime_set_threads(k + 1);
        out[k] = bq_malloc(sizeof(float) * KM * KH);
        g[k] = bq_malloc(sizeof(float) * KM * KI);
        ln[k] = bq_malloc(sizeof(float) * KM * KH);
        bq_infer_attention_f32(out[k], qkv, bias, mask, sa, 3, 0.25f, KB, KT, KT, KNH, KD);
        memcpy(g[k], h, sizeof(float) * KM * KI);
        bq_infer_bias_gelu_f32(g[k], bias, KM, KI);
        bq_infer_bias_residual_layernorm_f32(ln[k], out[k], bias, qkv, bias + KH, bias + 2 * KH, 1e-12f, KM, KH);
    }
    bq_runtime_set_threads(prev);
    EXPECT(!memcmp(out[0], out[1], sizeof(float) * KM * KH), "attention: 1 vs 2 threads differ");
    EXPECT(!memcmp(g[0], g[1], sizeof(float) * KM * KI), "bias + GELU: 1 vs 2 threads differ");
    EXPECT(!memcmp(ln[0], ln[1], sizeof(float) * KM * KH), "bias + residual + LayerNorm: 1 vs 2 threads differ");
    for (int k = 0; k < 2; k++) free(out[k]), free(g[k]), free(ln[k]);
    free(qkv), free(bias), free(mask), free(h), free(scratch);
}

int main(void) {
    if (bq_runtime_boot(0, NULL) != BQ_OK) {
        printf("FAIL runtime: %s\n", bq_errmsg());
        return 1;
    }
    kernels_thread_invariant();
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 30, "act") == BQ_OK);

    BqBert m;
    make_model(&m, 64, 4, 96, 1);
    EXPECT(bq_fp32_fused_layer_count(&m) == L, "fused layers: %d of %d", bq_fp32_fused_layer_count(&m), L);
    printf("%s\n", bq_gemm_bf16_describe());
    for (int p = 0; p < 2; p++) {
        const BqPrecision prec = p ? BQ_PRECISION_BF16 : BQ_PRECISION_FP32;
        compare(&m, &act, 24, "classification", prec);
        compare(&m, &act, 13, "classification", prec);
        bq_fused_set_block_rows(7);
        compare(&m, &act, 24, "classification, blocks of 7 rows", prec);
        compare(&m, &act, 13, "classification, blocks of 7 rows", prec);
        bq_fused_set_block_rows(0);
    }
    BqRng hr;
    bq_rng_seed(&hr, 3);
    BQ_CHECK(bq_bert_set_head(&m, BQ_HEAD_QA, &hr) == BQ_OK);
    compare(&m, &act, 24, "question answering", BQ_PRECISION_FP32);
    compare(&m, &act, 24, "question answering", BQ_PRECISION_BF16);
    bq_bert_free(&m);

    /* head size 15: nothing fused, the reference's bits */
    make_model(&m, 60, 4, 96, 2);
    EXPECT(bq_fp32_fused_layer_count(&m) == 0, "head size 15: %d layers fused", bq_fp32_fused_layer_count(&m));
    {
        BqRng rng;
        bq_rng_seed(&rng, 5);
        Batch bt;
        make_batch(&bt, 16, &rng);
        BqBertInput in = {.B = B, .T = 16, .input_ids = bt.ids, .token_type_ids = bt.types, .attention_mask = bt.mask};
        BqCtx ctx = {.act = &act, .tape = NULL, .training = 0};
        BqTensor *lr = NULL, *lf = NULL;
        BQ_CHECK(bq_bert_forward(&m, &ctx, &in, &lr, NULL) == BQ_OK);
        BQ_CHECK(bq_fp32_forward(&m, &ctx, &in, &lf) == BQ_OK);
        EXPECT(memcmp(lr->data, lf->data, (size_t)bq_tensor_numel(lr) * sizeof(float)) == 0,
               "head size 15: logits differ from bq_bert_forward");
    }
    bq_bert_free(&m);
    bq_arena_free(&act);
    if (fails) {
        printf("%d failure(s)\n", fails);
        return 1;
    }
    printf("all fused fp32 forward checks passed\n");
    return 0;
}
