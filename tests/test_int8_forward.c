/* The int8 engine (layers/bert_int8.h) on the tiny model (tests/fixtures/bert_tiny: 2 layers, hidden
 * 32, intermediate 37, 2 heads, 3 labels), cpu scheme, max-calibrated on random padded batches:
 *  - every encoder Linear runs on integers (6 per layer, query/key/value as one GEMM);
 *  - logits against the fake-quant evaluation (bq_bert_forward without a tape), to the bound below;
 *  - batch 1 vs batch 4, each example unpadded (T = its length, as dynamic padding gives it when it is
 *    batched alone) vs padded to T = 12, 1 vs 2 threads, and at most T + 1 rows at once
 *    (bq_int8_set_pass_rows: the forward in passes of one example; bq_int8_set_step_rows, with every
 *    layer's output kept: the fused layers in blocks) vs the whole batch at once: bit-identical logits;
 *  - refusals: an fp32 model, an uncalibrated model. qdqbert is compared as cpu is; its 8-bit weights run
 *    as one GEMM with VNNI and as an exact sgemm on float codes without (autograd/qgemm.h). ort too: it has
 *    no Linear input quantizers, and its Linears run on the codes of the grids their inputs lie on (the
 *    output quantizers of the embeddings' and layers' LayerNorms, the context and the GELU);
 *  - ort and qdqbert: every layer runs fused with its fake quantizers between the GEMMs
 *    (autograd/infer_kernels.h) and every layer's output equals fake quant's bit for bit, fused and op by
 *    op, with the fastest kernels of the CPU (AVX-512 or AVX2), with the AVX2 ones on an AVX-512 CPU
 *    (BQ_INFER_AVX2=1) and with the portable ones (BQ_INFER_PORTABLE=1); qdqbert's
 *    query, key and value inputs (three quantizers of equal scale) run as one GEMM;
 *  - the same with quantizers changed after calibration: ort with three of layer 0's elementwise
 *    quantizers left in fp32 (still fused: those places pass values through), ort with layer 1's softmax
 *    quantizer in fp32 (layer 1 op by op: its context product multiplies floats), qdqbert with layer 0's
 *    key input on another scale (layer 0's query, key and value as three GEMMs, still fused).
 *
 * Since fake quant sums the codes of its quantized Linears exactly too (layers/quant.h, bq_quant_linear),
 * the first effect below is gone op by op; the bound is kept for the fused kernels' own rounding.
 *
 * The bound. Both forwards compute the same ops on the same values except inside the integer
 * Linears, where the fake-quant path sums fp32 products in sgemm's order and the engine sums the
 * codes exactly and rounds once: per output |Δy| <= (K + 6)·u·S, S = sx·sw·Σ|qx·qw| (u = 2^-24,
 * checked in tests/test_qgemm.c), i.e. about 1e-5 of the output's range for K <= 1536. Carried
 * through the rest of the network (LayerNorm, GELU, softmax, tanh: each a smooth map with gain of
 * order 1 on normalised values), this alone moves a logit by at most ε_sum = 1e-4·max|logit|.
 * A second effect: a value that lies within that |Δy| of a rounding boundary of a LATER quantizer
 * (the next Linear's input) gets the neighbouring code: it moves by exactly one step s = amax/127 of
 * that quantizer, 1/127 of the largest value it quantizes. One changed code is one of >= H inputs of a
 * Linear whose output is then renormalised by LayerNorm, so its effect on a logit is below one step
 * relative to the logit scale: ε_step = max|logit|/127 per changed rounding, and in practice far less
 * (one of >= H inputs). The chance of a changed rounding is about 2|Δy|/s per quantized value, about
 * 1e-4 for a typical |Δy| of a few ulp (3e-7 of the range, measured on MiniLM's first query Linear);
 * a batch here quantizes B·T·(3H + I)·L ≈ 1.3·10^4 values, so about one changed rounding per batch at
 * most, and the test allows |Δlogit| <= ε_sum + ε_step. (At MiniLM size, batch 32, thousands of roundings
 * change and cascade through the layers; the logits then differ as much as fake quant's own batch 1
 * vs batch 32 results do, which bench/bench_int8.c prints side by side.) Because changed roundings
 * are rare here, at least 90 % of the logits must also lie within
 * ε_sum alone: a systematic error (a scale off by 1e-3, a wrong bias) fails that at once. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/infer_kernels.h"
#include "autograd/qgemm.h"
#include "export/hf_load.h"
#include "layers/bert_int8.h"
#include "layers/quant.h"
#include "tests/test_util.h"


enum { B = 4, T = 12, NCAL = 6 };

typedef struct Batch {
    int32_t ids[B * T], types[B * T];
    float mask[B * T];
} Batch;

static void make_batch(Batch *bt, BqRng *rng, int vocab) {
    bq_test_padded_batch(bt->ids, bt->types, bt->mask, B, T, rng, vocab, 3);
}

static BqBertInput input_of(const Batch *bt, int b0, int nb) {
    BqBertInput in = {.B = nb, .T = T, .input_ids = bt->ids + b0 * T, .attention_mask = bt->mask + b0 * T,
                      .token_type_ids = bt->types + b0 * T, .labels = NULL};
    return in;
}

/* The tiny model with quantizers of `scheme`, max-calibrated on NCAL random batches. */
static int load_model(BqBert *m, const char *scheme, int calibrate) {
    BqRng rng;
    bq_rng_seed(&rng, 3);
    char *report = NULL;
    int rc = bq_hf_load(m, "tests/fixtures/bert_tiny", 0, &rng, &report);
    free(report);
    if (rc) return rc;
    if (!scheme) return BQ_OK;
    BqQuantConfig qc;
    bq_quant_config_default(&qc);
    BQ_CHECK(bq_scheme_parse(&qc.scheme, scheme, "scheme") == BQ_OK);
    if ((rc = bq_quant_create(&m->quant, m, &qc))) return rc;
    if (!calibrate) return BQ_OK;
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 26, "calib") == BQ_OK);
    bq_quant_calib_begin(m->quant, BQ_CALIBRATOR_MAX);
    for (int i = 0; i < NCAL && !rc; i++) {
        Batch bt;
        make_batch(&bt, &rng, m->cfg.vocab_size);
        BqBertInput in = input_of(&bt, 0, B);
        BqCtx ctx = {.act = &act};
        BqTensor *logits;
        rc = bq_bert_forward(m, &ctx, &in, &logits, NULL);
        bq_arena_rewind(&act, 0);
    }
    if (!rc) rc = bq_quant_calib_finish(m->quant, BQ_CALIBRATOR_MAX, 0.0);
    bq_arena_free(&act);
    return rc;
}

static void unload(BqBert *m) {
    bq_quant_free(m->quant);
    m->quant = NULL;
    bq_bert_free(m);
}

/* Changes to the calibrated quantizers before the engine is prepared (see the file comment). */
typedef enum Variant { AS_CALIBRATED, KEEP_ELEMENTWISE, KEEP_PROBS, SPLIT_QKV } Variant;
static const char *const variant_names[] = {"", " (layer 0: residual sum, scores and dense output in fp32)",
                                            " (layer 1: probabilities in fp32)", " (layer 0: key input scale x1.25)"};

static void apply_variant(BqBert *m, Variant v) {
    BqQuantState *qs = m->quant;
    if (v == KEEP_ELEMENTWISE) {
        static const int pts[3] = {BQ_QP_ATTN_RESID, BQ_QP_SCORES, BQ_QP_INTER_OUT};
        for (int i = 0; i < 3; i++) bq_quant_at(qs, 0, pts[i])->enabled = 0;
    } else if (v == KEEP_PROBS) {
        bq_quant_at(qs, 1, BQ_QP_PROBS)->enabled = 0;
    } else if (v == SPLIT_QKV) {
        BqQuantizer *k = bq_quant_at(qs, 0, BQ_QP_K_IN);
        k->amax[0] *= 1.25f;
        k->scale[0] *= 1.25f;
    }
}

/* Compares the engine with fake quant on fresh batches and checks batch and thread invariance; fusion
 * 0 runs every layer op by op (bq_int8_set_layer_fusion), 1 lets the layers run fused where they can. */
static void check_scheme(const char *scheme, int fusion, Variant variant) {
    BqBert m;
    BQ_CHECK(load_model(&m, scheme, 1) == BQ_OK);
    apply_variant(&m, variant);
    BqInt8Engine *e = NULL;
    int rc = bq_int8_prepare(&e, &m);
    if (!strcmp(scheme, "qdqbert"))
        printf("qdqbert: 8-bit weights as %s\n", bq_qgemm_exact_8bit() ? "one GEMM (VNNI/AMX)"
                                                                       : "exact sgemm on float codes (no VNNI)");
    EXPECT(rc == BQ_OK, "%s: prepare: %s", scheme, bq_errmsg());
    if (rc) {
        unload(&m);
        return;
    }
    const int L = m.cfg.num_hidden_layers, C = m.cfg.num_labels;
    EXPECT(bq_int8_linear_count(e) == 6 * L, "%s: %d integer Linears, expected %d", scheme, bq_int8_linear_count(e),
           6 * L);
    /* query, key and value as one GEMM in every layer but the one whose key input has its own scale */
    const int want_gemms = 4 * L + (variant == SPLIT_QKV ? 2 : 0);
    EXPECT(bq_int8_gemm_count(e) == want_gemms, "%s: %d GEMMs, expected %d", scheme, bq_int8_gemm_count(e), want_gemms);
    bq_int8_set_layer_fusion(e, fusion);
    /* exact: the schemes with fake quantizers between the GEMMs, whose layers give fake quant's bits */
    const int exact = !strcmp(scheme, "ort") || !strcmp(scheme, "qdqbert");
    const int want_fused = !fusion ? 0 : variant == KEEP_PROBS ? L - 1 : L;
    printf("%s%s, fusion %d: %d of %d layers fused\n", scheme, variant_names[variant], fusion,
           bq_int8_fused_layer_count(e), L);
    EXPECT(bq_int8_fused_layer_count(e) == want_fused, "%s: %d fused layers, expected %d", scheme,
           bq_int8_fused_layer_count(e), want_fused);

    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 26, "act") == BQ_OK);
    BqRng rng;
    bq_rng_seed(&rng, 99);
    double maxd = 0.0, maxl = 0.0, maxh = 0.0;
    int over_sum = 0, n = 0, nbatch_bad = 0, nthread_bad = 0, npad_bad = 0, nblock_bad = 0, nhidden_bad = 0;
    for (int it = 0; it < 4; it++) {
        Batch bt;
        make_batch(&bt, &rng, m.cfg.vocab_size);
        BqBertInput in = input_of(&bt, 0, B);
        BqCtx ctx = {.act = &act};
        float fq[B * 8], i8[B * 8], i8t1[B * 8], row[8];
        BQ_CHECK(C <= 8);
        BqTensor *lg;
        BQ_CHECK(bq_bert_forward(&m, &ctx, &in, &lg, NULL) == BQ_OK);
        memcpy(fq, lg->data, sizeof(float) * (size_t)(B * C));
        bq_arena_rewind(&act, 0);
        rc = bq_int8_forward(e, &m, &ctx, &in, &lg);
        EXPECT(rc == BQ_OK, "forward: %s", bq_errmsg());
        if (rc) break;
        memcpy(i8, lg->data, sizeof(float) * (size_t)(B * C));
        bq_arena_rewind(&act, 0);
        /* ort, qdqbert: every layer's output equals fake quant's bit for bit (the same ops on the same values
         * in the same order, fused or not: autograd/infer_kernels.h); only the pooler's and classifier's
         * summation orders differ */
        if (exact) {
            BqTensor *hf[8], *hi[8];
            BQ_CHECK(L <= 8);
            BqBertInput hin = in;
            hin.hidden = hf;
            BQ_CHECK(bq_bert_forward(&m, &ctx, &hin, &lg, NULL) == BQ_OK);
            hin.hidden = hi;
            BQ_CHECK(bq_int8_forward(e, &m, &ctx, &hin, &lg) == BQ_OK);
            for (int l = 0; l < L; l++) {
                const int64_t nh = bq_tensor_numel(hf[l]);
                BQ_CHECK(nh == bq_tensor_numel(hi[l]));
                for (int64_t i = 0; i < nh; i++) maxh = fmax(maxh, fabs((double)hf[l]->data[i] - hi[l]->data[i]));
                nhidden_bad += memcmp(hf[l]->data, hi[l]->data, sizeof(float) * (size_t)nh) != 0;
            }
            bq_arena_rewind(&act, 0);
        }
        /* batch 1, each example alone */
        for (int b = 0; b < B; b++) {
            BqBertInput one = input_of(&bt, b, 1);
            BQ_CHECK(bq_int8_forward(e, &m, &ctx, &one, &lg) == BQ_OK);
            memcpy(row, lg->data, sizeof(float) * (size_t)C);
            bq_arena_rewind(&act, 0);
            nbatch_bad += memcmp(row, i8 + b * C, sizeof(float) * (size_t)C) != 0;
        }
        /* each example alone and unpadded (T = its length), as dynamic padding batches it alone */
        for (int b = 0; b < B; b++) {
            int len = T - 3 * b;
            BqBertInput one = input_of(&bt, b, 1);
            one.T = len;
            int32_t ids1[T], types1[T];
            float mask1[T];
            memcpy(ids1, bt.ids + b * T, sizeof(int32_t) * (size_t)len);
            memcpy(types1, bt.types + b * T, sizeof(int32_t) * (size_t)len);
            memcpy(mask1, bt.mask + b * T, sizeof(float) * (size_t)len);
            one.input_ids = ids1, one.token_type_ids = types1, one.attention_mask = mask1;
            BQ_CHECK(bq_int8_forward(e, &m, &ctx, &one, &lg) == BQ_OK);
            memcpy(row, lg->data, sizeof(float) * (size_t)C);
            bq_arena_rewind(&act, 0);
            npad_bad += memcmp(row, i8 + b * C, sizeof(float) * (size_t)C) != 0;
        }
        /* one thread */
        int prev = bq_runtime_threads();
        bq_runtime_set_threads(1);
        BQ_CHECK(bq_int8_forward(e, &m, &ctx, &in, &lg) == BQ_OK);
        memcpy(i8t1, lg->data, sizeof(float) * (size_t)(B * C));
        bq_arena_rewind(&act, 0);
        bq_runtime_set_threads(prev);
        nthread_bad += memcmp(i8t1, i8, sizeof(float) * (size_t)(B * C)) != 0;
        /* at most T + 1 rows at once (bq_int8_set_pass_rows, bq_int8_set_step_rows): the forward in passes
         * of one example; and,
         * keeping every layer's output (one pass), the fused layers in blocks of one sequence for the
         * attention and of T + 1 rows, with a remainder, elsewhere: the same bits either way */
        bq_int8_set_step_rows(e, T + 1);
        bq_int8_set_pass_rows(e, T + 1);
        BQ_CHECK(bq_int8_forward(e, &m, &ctx, &in, &lg) == BQ_OK);
        nblock_bad += memcmp(lg->data, i8, sizeof(float) * (size_t)(B * C)) != 0;
        bq_arena_rewind(&act, 0);
        BqTensor *kept[8];
        BQ_CHECK(L <= 8);
        BqBertInput kin = in;
        kin.hidden = kept;
        BQ_CHECK(bq_int8_forward(e, &m, &ctx, &kin, &lg) == BQ_OK);
        nblock_bad += memcmp(lg->data, i8, sizeof(float) * (size_t)(B * C)) != 0;
        bq_arena_rewind(&act, 0);
        bq_int8_set_step_rows(e, 0);
        bq_int8_set_pass_rows(e, 0);
        for (int i = 0; i < B * C; i++) maxl = fmax(maxl, fabs(fq[i]));
        for (int i = 0; i < B * C; i++) {
            double d = fabs((double)fq[i] - i8[i]);
            maxd = fmax(maxd, d);
            n++;
        }
        for (int i = 0; i < B * C; i++) over_sum += fabs((double)fq[i] - i8[i]) > 1e-4 * fmax(maxl, 1e-30);
    }
    const double eps_sum = 1e-4 * maxl, eps_step = maxl / 127.0;
    printf("%s: max |int8 - fake quant| logit %.3g (bound %.3g = %.3g + %.3g, max |logit| %.3g); %d of %d logits "
           "beyond the summation-order part alone\n",
           scheme, maxd, eps_sum + eps_step, eps_sum, eps_step, maxl, over_sum, n);
    printf("%s: batch 1 vs %d: %d examples differ; unpadded vs padded: %d differ; 1 vs 2 threads: %d batches "
           "differ; at most %d rows at once (passes, blocks) vs the batch: %d of 2 forwards per batch differ\n", scheme, B, nbatch_bad, npad_bad, nthread_bad,
           T + 1, nblock_bad);
    if (exact) {
        printf("%s: layer outputs against fake quant: %d of %d differ, max |d| %.3g\n", scheme, nhidden_bad, 4 * L,
               maxh);
        EXPECT(nhidden_bad == 0, "%s: %d layer outputs differ from fake quant (max |d| %.3g)", scheme, nhidden_bad,
               maxh);
    }
    EXPECT(maxl > 0.0, "logits are all zero");
    EXPECT(maxd <= eps_sum + eps_step, "%s: int8 logits outside the bound", scheme);
    EXPECT(over_sum * 10 <= n, "%s: %d of %d logits beyond the summation-order bound", scheme, over_sum, n);
    EXPECT(nbatch_bad == 0, "%s: logits depend on the batch size", scheme);
    EXPECT(nthread_bad == 0, "%s: logits depend on the thread count", scheme);
    EXPECT(npad_bad == 0, "%s: logits depend on the padded length", scheme);
    EXPECT(nblock_bad == 0, "%s: logits depend on the fused layers' row blocks", scheme);
    bq_arena_free(&act);
    bq_int8_free(e);
    unload(&m);
}

static void check_refusals(void) {
    BqBert m;
    BqInt8Engine *e = NULL;
    BQ_CHECK(load_model(&m, NULL, 0) == BQ_OK);
    int rc = bq_int8_prepare(&e, &m);
    EXPECT(rc == BQ_EINVAL && strstr(bq_errmsg(), "no quantizers"), "fp32 model: rc %d '%s'", rc, bq_errmsg());
    bq_bert_free(&m);
    BQ_CHECK(load_model(&m, "cpu", 0) == BQ_OK);
    rc = bq_int8_prepare(&e, &m);
    EXPECT(rc == BQ_EINVAL && strstr(bq_errmsg(), "no range"), "uncalibrated: rc %d '%s'", rc, bq_errmsg());
    unload(&m);
    EXPECT(e == NULL, "a refused prepare leaves no engine");
}

int main(void) {
    bq_runtime_set_threads(2);
    printf("%s\n", bq_dnnl_describe());
    check_scheme("cpu", 1, AS_CALIBRATED);
    check_scheme("cpu", 0, AS_CALIBRATED);
    check_scheme("qdqbert", 1, AS_CALIBRATED);
    check_scheme("qdqbert", 0, AS_CALIBRATED);
    check_scheme("qdqbert", 1, SPLIT_QKV);
    check_scheme("ort", 1, AS_CALIBRATED);
    check_scheme("ort", 0, AS_CALIBRATED);
    check_scheme("ort", 1, KEEP_ELEMENTWISE);
    check_scheme("ort", 1, KEEP_PROBS);
    /* the fused blocks' AVX2 kernels where the CPU has AVX-512 (its kernels ran above), then the portable
     * ones: the same bits */
    printf("fused inference kernels: %s\n", bq_infer_isa());
    if (strcmp(bq_infer_isa(), "AVX-512") == 0) {
        setenv("BQ_INFER_AVX2", "1", 1);
        printf("with BQ_INFER_AVX2=1:\n");
        check_scheme("ort", 1, AS_CALIBRATED);
        check_scheme("qdqbert", 1, AS_CALIBRATED);
        unsetenv("BQ_INFER_AVX2");
    }
    setenv("BQ_INFER_PORTABLE", "1", 1);
    printf("with BQ_INFER_PORTABLE=1:\n");
    check_scheme("ort", 1, AS_CALIBRATED);
    check_scheme("qdqbert", 1, AS_CALIBRATED);
    unsetenv("BQ_INFER_PORTABLE");
    check_refusals();
    bq_qgemm_cache_clear();
    if (fails) printf("%d check(s) FAILED\n", fails);
    else printf("all int8 forward checks passed\n");
    return fails ? 1 : 0;
}
