/* The attention products on integer codes (autograd/tensor.h bq_op_attn_scores_int, bq_op_attn_context_int),
 * which the QAT forward, fake quant and the int8 engine use where both inputs of Q·Kᵀ or P·V are on
 * 8-bit grids (`ort`, `qdqbert`; layers/bert.c):
 *   - forward equal bit for bit to fl(Σ ca·cb · fl(sa·sb)) with the integer sum computed in 64 bits, on
 *     random codes with the saturation codes −128 and 127 (and 0..255 for probabilities) in every row
 *     (the kernels' sgemm on fp32 codes), and on codes up to ±3000 (their int32 path);
 *   - within fp32 rounding of the fp32 products on the same values (bq_op_attn_scores / _context);
 *   - gradients equal bit for bit to the fp32 ops' (straight-through: the same backward);
 *   - the same bits on 1 and 2 threads;
 *   - a whole QAT step of a small model in the `ort` and `qdqbert` schemes with and without the integer
 *     products (qs->fp32_linear): gradients equal to within fp32 rounding of the forward difference.
 * Prints the largest differences. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/tensor.h"
#include "layers/bert.h"
#include "layers/quant.h"
#include "src/train.h"
#include "tests/test_util.h"

enum { B = 2, T = 13, NH = 3, D = 8, H = NH * D };

/* Codes in [lo, hi] with the ends present in every row of `cols` values; values = code·s. */
static void make_codes(int32_t *c, float *x, int64_t n, int64_t cols, int lo, int hi, float s, BqRng *r) {
    for (int64_t i = 0; i < n; i++) {
        int64_t col = i % cols;
        c[i] = col == 0 ? lo : col == 1 ? hi : lo + (int32_t)bq_rng_below(r, (uint64_t)(hi - lo + 1));
        x[i] = (float)c[i] * s;
    }
}

/* Runs the scores (which = 0) or context (1) product, int or fp32, recorded, with dout = g; copies the
 * output and both input gradients out. */
static void run(int which, int integer, const float *a, const float *b, float sa, float sb, const float *g,
                float *out, float *da, float *db) {
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 24, "t") == BQ_OK);
    BqTape tape;
    bq_tape_init(&tape, 8);
    BqCtx ctx = {.act = &act, .tape = &tape};
    int64_t sh3[3] = {B, T, H}, sh4[4] = {B, NH, T, T};
    int64_t na = which == 0 ? B * T * H : B * NH * T * T, nb = B * T * H;
    BqTensor *A = bq_tensor_new(&ctx, which == 0 ? 3 : 4, which == 0 ? sh3 : sh4);
    BqTensor *Bt = bq_tensor_new(&ctx, 3, sh3);
    memcpy(A->data, a, (size_t)na * sizeof(float));
    memcpy(Bt->data, b, (size_t)nb * sizeof(float));
    A->grad = bq_arena_alloc_zero(&act, (size_t)na * sizeof(float));
    Bt->grad = bq_arena_alloc_zero(&act, (size_t)nb * sizeof(float));
    BqTensor *y = which == 0 ? (integer ? bq_op_attn_scores_int(&ctx, A, Bt, sa, sb, NH) : bq_op_attn_scores(&ctx, A, Bt, NH))
                             : (integer ? bq_op_attn_context_int(&ctx, A, Bt, sa, sb, NH)
                                        : bq_op_attn_context(&ctx, A, Bt, NH));
    int64_t ny = bq_tensor_numel(y);
    y->grad = bq_arena_alloc(&act, (size_t)ny * sizeof(float));
    memcpy(y->grad, g, (size_t)ny * sizeof(float));
    memcpy(out, y->data, (size_t)ny * sizeof(float));
    float one = 0, gs = 0;
    int64_t sh1 = 1;
    BqTensor seed = bq_tensor_wrap(&one, &gs, 1, &sh1);
    bq_backward(&ctx, &seed);
    memcpy(da, A->grad, (size_t)na * sizeof(float));
    memcpy(db, Bt->grad, (size_t)nb * sizeof(float));
    bq_tape_free(&tape);
    bq_arena_free(&act);
}

/* wide: codes up to ±3000, so that the sums may exceed 2^24 and the kernel takes its int32 path instead
 * of the sgemm on fp32 codes (autograd/kernels.c); both must give the exact result. */
static void check_product(int which, int wide) {
    const char *name = which == 0 ? (wide ? "Q·Kᵀ (wide codes, int32 path)" : "Q·Kᵀ (sgemm path)")
                                  : (wide ? "P·V (wide codes, int32 path)" : "P·V (sgemm path)");
    BqRng r;
    bq_rng_seed(&r, 11 + (uint64_t)which);
    const int64_t na = which == 0 ? B * T * H : B * NH * T * T, nb = B * T * H, ny = which == 0 ? B * NH * T * T : B * T * H;
    int32_t *ca = malloc(sizeof(int32_t) * (size_t)na), *cb = malloc(sizeof(int32_t) * (size_t)nb);
    float *a = malloc(sizeof(float) * (size_t)na), *b = malloc(sizeof(float) * (size_t)nb);
    float *g = malloc(sizeof(float) * (size_t)ny);
    float *y[3], *da[3], *db[3];
    for (int k = 0; k < 3; k++) {
        y[k] = malloc(sizeof(float) * (size_t)ny);
        da[k] = malloc(sizeof(float) * (size_t)na);
        db[k] = malloc(sizeof(float) * (size_t)nb);
    }
    const float sa = which == 0 ? 0.0371f : 1.0f / 255.0f, sb = 0.0213f;
    /* scores: both signed; context: probabilities as unsigned codes 0..255, rows of T keys */
    const int w = wide ? 3000 : 0;
    make_codes(ca, a, na, which == 0 ? D : T, which == 0 ? -128 - w : 0, which == 0 ? 127 + w : 255 + w, sa, &r);
    make_codes(cb, b, nb, D, -128 - w, 127 + w, sb, &r);
    for (int64_t i = 0; i < ny; i++) g[i] = (float)bq_rng_uniform(&r) - 0.5f;

    omp_set_num_threads(2);
    run(which, 1, a, b, sa, sb, g, y[0], da[0], db[0]);
    omp_set_num_threads(1);
    run(which, 1, a, b, sa, sb, g, y[1], da[1], db[1]);
    omp_set_num_threads(2);
    run(which, 0, a, b, sa, sb, g, y[2], da[2], db[2]);

    /* exact reference */
    const float f = sa * sb;
    int64_t exact_bad = 0, thread_bad = 0, grad_bad = 0;
    double max_fp32 = 0.0, bound = 0.0;
    for (int64_t bb = 0; bb < B; bb++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < T; i++) {
                int64_t ncol = which == 0 ? T : D;
                for (int64_t j = 0; j < ncol; j++) {
                    int64_t sum = 0, abs_sum = 0;
                    if (which == 0)
                        for (int64_t c = 0; c < D; c++) {
                            int64_t p = (int64_t)ca[(bb * T + i) * H + h * D + c] * cb[(bb * T + j) * H + h * D + c];
                            sum += p, abs_sum += p < 0 ? -p : p;
                        }
                    else
                        for (int64_t t = 0; t < T; t++) {
                            int64_t p = (int64_t)ca[((bb * NH + h) * T + i) * T + t] * cb[(bb * T + t) * H + h * D + j];
                            sum += p, abs_sum += p < 0 ? -p : p;
                        }
                    int64_t at = which == 0 ? ((bb * NH + h) * T + i) * T + j : (bb * T + i) * H + h * D + j;
                    float want = (float)sum * f;
                    exact_bad += memcmp(&y[0][at], &want, sizeof(float)) != 0;
                    /* fp32 products of the same values: each term and partial sum rounded */
                    double err = fabs((double)y[0][at] - (double)y[2][at]);
                    double tol = 4.0 * (double)(which == 0 ? D : T) * 6e-8 * (double)abs_sum * (double)f + 1e-30;
                    if (err > max_fp32) max_fp32 = err;
                    if (err > tol) {
                        if (exact_bad + 1 < 5) printf("  %s[%lld]: int %.9g fp32 %.9g tol %.3g\n", name, (long long)at,
                                                      y[0][at], y[2][at], tol);
                        bound += 1;
                    }
                }
            }
    thread_bad += memcmp(y[0], y[1], sizeof(float) * (size_t)ny) != 0;
    thread_bad += memcmp(da[0], da[1], sizeof(float) * (size_t)na) != 0;
    thread_bad += memcmp(db[0], db[1], sizeof(float) * (size_t)nb) != 0;
    grad_bad += memcmp(da[0], da[2], sizeof(float) * (size_t)na) != 0;
    grad_bad += memcmp(db[0], db[2], sizeof(float) * (size_t)nb) != 0;
    printf("%s on codes: %lld outputs, %lld differ from the exact integer result, max |int − fp32| %.3g "
           "(%g beyond the rounding bound); 1 vs 2 threads %s; gradients %s the fp32 op's\n",
           name, (long long)ny, (long long)exact_bad, max_fp32, bound, thread_bad ? "DIFFER" : "identical",
           grad_bad ? "DIFFER from" : "equal to");
    EXPECT(exact_bad == 0, " %s", name);
    EXPECT(bound == 0, " %s", name);
    EXPECT(thread_bad == 0, " %s", name);
    EXPECT(grad_bad == 0, " %s", name);
    for (int k = 0; k < 3; k++) free(y[k]), free(da[k]), free(db[k]);
    free(ca), free(cb), free(a), free(b), free(g);
}

/* One QAT step (bq_train_step) of a small model; fp32_products = 1 runs the attention products (and the
 * Linears) in fp32 on the fake-quantized values. Returns the loss; copies the gradients. */
static float qat_step(const char *scheme, int fp32_products, int training, float *grad, int64_t *np,
                      float *logits) {
    BqBertConfig cfg = bq_test_config(50, 24, 2, 3, 40, 16, 2, 0.1f, 0.2f);
    BqRng rng;
    bq_rng_seed(&rng, 3);
    BqBert m;
    BQ_CHECK(bq_bert_create(&m, &cfg, 1, &rng) == BQ_OK);
    BqQuantConfig qc;
    bq_quant_config_default(&qc);
    BQ_CHECK(bq_scheme_parse(&qc.scheme, scheme, "scheme") == BQ_OK);
    BQ_CHECK(bq_quant_create(&m.quant, &m, &qc) == BQ_OK);
    m.quant->observe = 1;
    m.quant->fp32_linear = fp32_products;
    enum { SB = 3, ST = 9 };
    int32_t ids[SB * ST], types[SB * ST] = {0}, labels[SB] = {0, 1, 1};
    float mask[SB * ST];
    for (int i = 0; i < SB * ST; i++) {
        ids[i] = 1 + (int32_t)bq_rng_below(&rng, 49);
        mask[i] = (i % ST) < ST - (i / ST) ? 1.0f : 0.0f;
    }
    BqBatch bt = {.B = SB, .T = ST, .input_ids = ids, .attention_mask = mask, .token_type_ids = types, .labels = labels};
    BqArena act;
    BqTape tape;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 26, "act") == BQ_OK);
    BQ_CHECK(bq_tape_init(&tape, 64) == BQ_OK);
    BqTrainState ts = {0};
    float loss = 0;
    memset(m.params.grad, 0, sizeof(float) * (size_t)m.params.total);
    BqCtx ctx = {.act = &act, .tape = &tape, .training = training, .rng_key = 99};
    BQ_CHECK(bq_train_step(&m, &ctx, &bt, &ts, &loss, logits) == BQ_OK);
    *np = m.params.total;
    memcpy(grad, m.params.grad, sizeof(float) * (size_t)m.params.total);
    bq_arena_free(&act);
    bq_tape_free(&tape);
    bq_quant_free(m.quant);
    m.quant = NULL;
    bq_bert_free(&m);
    return loss;
}

int main(void) {
    check_product(0, 0);
    check_product(1, 0);
    check_product(0, 1);
    check_product(1, 1);
    /* the model with and without the integer products: the forward differs only by fp32 rounding of the
     * products (and of the integer Linears), so loss, logits and gradients agree closely; training mode
     * (dropout on: ort keeps P·V in fp32 there) and evaluation mode (no dropout: every product integer) */
    const char *schemes[2] = {"ort", "qdqbert"};
    static float g0[20000], g1[20000];
    for (int s = 0; s < 2; s++)
        for (int training = 0; training <= 1; training++) {
            int64_t n0 = 0, n1 = 0;
            float lg0[6], lg1[6];
            float l0 = qat_step(schemes[s], 0, training, g0, &n0, lg0);
            float l1 = qat_step(schemes[s], 1, training, g1, &n1, lg1);
            BQ_CHECK(n0 == n1 && n0 <= 20000);
            double dl = fabs((double)l0 - l1), dg = 0, gmax = 0, dlog = 0;
            for (int64_t i = 0; i < n0; i++) {
                dg = fmax(dg, fabs((double)g0[i] - g1[i]));
                gmax = fmax(gmax, fabs((double)g1[i]));
            }
            for (int i = 0; i < 6; i++) dlog = fmax(dlog, fabs((double)lg0[i] - lg1[i]));
            printf("%-8s %s step, integer vs fp32 products: loss %.7f vs %.7f, max |Δlogit| %.3g, max |Δgrad| %.3g "
                   "(largest gradient %.3g)\n",
                   schemes[s], training ? "training" : "evaluation-mode", l0, l1, dlog, dg, gmax);
            EXPECT(dl < 1e-3, " %s", schemes[s]);
            /* ort's Linears have no input quantizer, so in evaluation mode only the integer products can make
             * the two runs differ: a difference shows that they ran */
            if (s == 0 && !training) EXPECT(dl > 0 || dlog > 0 || dg > 0, " ort: the integer attention products did not run");
            EXPECT(dlog < 1e-2, " %s", schemes[s]);
            EXPECT(dg <= 0.05 * gmax, " %s", schemes[s]);
        }
    printf("test_qat_int_attention: %s\n", fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
