/* The integer engine's widest products in column pieces (layers/bert_int8.h, bq_int8_set_piece_macs):
 *  - the default rule: BERT-base's widths (hidden 768, 12 heads, intermediate 3072) cut the fused
 *    query/key/value product in 3 pieces and the intermediate dense in 4 (9 GEMM calls per layer for its 4
 *    products); MiniLM's (384, 12 heads, 1536) keep one GEMM per product (read from the plan alone:
 *    bq_int8_begin packs nothing);
 *  - on a small random model (2 layers, hidden 64, 4 heads of 16, intermediate 256) with every piece its
 *    shapes allow (4 of one head each, 4 of 64 columns), the logits and every layer's output equal, bit
 *    for bit, those of the same engine without pieces, for the cpu, ort and qdqbert schemes (max-calibrated
 *    on random padded batches), with the layers fused and op by op (where the pieces' columns are put back
 *    in order), in blocks of one sequence, on 1 and 2 threads, and with the CPU's fastest fused kernels, the
 *    AVX2 ones (BQ_INFER_AVX2=1) and the portable ones (BQ_INFER_PORTABLE=1); the number of GEMM calls is
 *    the pieces'. Prints the largest difference found (0 when the check holds). */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/tensor.h"
#include "layers/bert_int8.h"
#include "layers/quant.h"
#include "tests/test_util.h"

enum { B = 3, T = 16, L = 2, H = 64, NH = 4, I = 256, VOCAB = 300, NCAL = 3 };

typedef struct Batch {
    int32_t ids[B * T], types[B * T];
    float mask[B * T];
} Batch;

static BqBertInput input_of(const Batch *bt) {
    return (BqBertInput){.B = B, .T = T, .input_ids = bt->ids, .attention_mask = bt->mask, .token_type_ids = bt->types};
}

/* A random model of the given widths with `scheme`'s quantizers, max-calibrated on NCAL random batches
 * (calib 0: one example of 8 tokens, enough for a plan). */
static void make_model(BqBert *m, int layers, int hidden, int heads, int inter, const char *scheme, int calib) {
    BqRng rng;
    bq_rng_seed(&rng, 5);
    BqBertConfig c = bq_test_config(VOCAB, hidden, layers, heads, inter, 64, 2, 0.0f, 0.05f);
    BQ_CHECK(bq_bert_create(m, &c, 0, &rng) == BQ_OK);
    if (calib) bq_test_calibrate(m, scheme, &rng, NCAL, B, T, VOCAB);
    else bq_test_calibrate(m, scheme, &rng, 1, 1, 8, VOCAB);
}

static void free_model(BqBert *m) {
    bq_quant_free(m->quant);
    m->quant = NULL;
    bq_bert_free(m);
}

/* The default rule on one layer of the given widths: want GEMM calls for its 4 products. */
static void check_rule(const char *name, int hidden, int inter, int want) {
    BqBert m;
    make_model(&m, 1, hidden, 12, inter, "cpu", 0);
    bq_int8_set_piece_macs(0);
    BqInt8Engine *e = NULL;
    BQ_CHECK(bq_int8_begin(&e, &m) == BQ_OK);
    printf("%s widths: %d GEMM calls per layer for %d products\n", name, bq_int8_piece_count(e),
           bq_int8_gemm_count(e));
    EXPECT(bq_int8_gemm_count(e) == 4 && bq_int8_piece_count(e) == want, "%s: %d products in %d calls, expected 4 in %d",
           name, bq_int8_gemm_count(e), bq_int8_piece_count(e), want);
    bq_int8_free(e);
    free_model(&m);
}

/* Logits (B·2) and every layer's output (L·B·T·H) of one forward into out; pieces: every piece the shapes
 * allow, else none. */
static void forward_of(BqBert *m, int pieces, int fusion, int64_t step, const Batch *bt, float *out) {
    bq_int8_set_piece_macs(pieces ? 1 : INT64_MAX);
    BqInt8Engine *e = NULL;
    BQ_CHECK(bq_int8_prepare(&e, m) == BQ_OK);
    bq_int8_set_piece_macs(0);
    const int want = pieces ? L * (NH + 1 + 4 + 1) : 4 * L;
    EXPECT(bq_int8_piece_count(e) == want && bq_int8_fused_layer_count(e) == L, "%d GEMM calls (expected %d), %d fused layers",
           bq_int8_piece_count(e), want, bq_int8_fused_layer_count(e));
    bq_int8_set_layer_fusion(e, fusion);
    bq_int8_set_step_rows(e, step);
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 26, "act") == BQ_OK);
    BqCtx ctx = {.act = &act};
    BqBertInput in = input_of(bt);
    BqTensor *hs[L], *logits;
    in.hidden = hs;
    BQ_CHECK(bq_int8_forward(e, m, &ctx, &in, &logits) == BQ_OK);
    memcpy(out, logits->data, sizeof(float) * B * 2);
    /* every layer's output: (B,T,H), the last one's rows of token 0 alone where only they are read */
    memset(out + B * 2, 0, sizeof(float) * L * B * T * H);
    for (int l = 0; l < L; l++) {
        BQ_CHECK(bq_tensor_numel(hs[l]) <= B * T * H);
        memcpy(out + B * 2 + l * B * T * H, hs[l]->data, sizeof(float) * (size_t)bq_tensor_numel(hs[l]));
    }
    bq_arena_free(&act);
    bq_int8_free(e);
}

static double max_diff(const float *a, const float *b, int64_t n) {
    double d = 0.0;
    for (int64_t i = 0; i < n; i++) d = fmax(d, a[i] == b[i] ? 0.0 : fabs((double)a[i] - b[i]) + 1e-30);
    return d;
}

static void check_scheme(const char *scheme) {
    BqBert m;
    make_model(&m, L, H, NH, I, scheme, 1);
    Batch bt;
    BqRng rng;
    bq_rng_seed(&rng, 17);
    bq_test_padded_batch(bt.ids, bt.types, bt.mask, B, T, &rng, VOCAB, 3);
    enum { N = B * 2 + L * B * T * H };
    float *ref = bq_malloc(sizeof(float) * N), *got = bq_malloc(sizeof(float) * N);
    const int saved = omp_get_max_threads();
    double worst = 0.0;
    static const char *const kernels[3] = {"the CPU's fastest", "AVX2", "portable"};
    for (int isa = 0; isa < 3; isa++) {
        if (isa == 1) setenv("BQ_INFER_AVX2", "1", 1);
        if (isa == 2) setenv("BQ_INFER_PORTABLE", "1", 1);
        for (int fusion = 0; fusion < 2; fusion++)
            for (int threads = 1; threads <= 2; threads++)
                for (int blocks = 0; blocks < 2; blocks++) {
                    omp_set_num_threads(threads);
                    const int64_t step = blocks ? T : 0;
                    forward_of(&m, 0, fusion, step, &bt, ref);
                    forward_of(&m, 1, fusion, step, &bt, got);
                    const double d = max_diff(ref, got, N);
                    worst = fmax(worst, d);
                    EXPECT(d == 0.0, "%s, %s kernels, fusion %d, %d threads, %s: pieces change the outputs by up to %.3g",
                           scheme, kernels[isa], fusion, threads, blocks ? "blocks of one sequence" : "default blocks", d);
                }
        unsetenv("BQ_INFER_AVX2");
        unsetenv("BQ_INFER_PORTABLE");
    }
    omp_set_num_threads(saved);
    printf("%s: pieces against one GEMM per product, fused and op by op, 1 and 2 threads, two block sizes, the "
           "fastest, AVX2 and portable kernels: max |difference| %.3g\n",
           scheme, worst);
    free(ref);
    free(got);
    free_model(&m);
}

int main(void) {
    check_rule("BERT-base", 768, 3072, 3 + 1 + 4 + 1);
    check_rule("MiniLM", 384, 1536, 4);
    static const char *const schemes[3] = {"cpu", "ort", "qdqbert"};
    for (int s = 0; s < 3; s++) check_scheme(schemes[s]);
    if (!fails) printf("ok\n");
    return fails ? 1 : 0;
}
