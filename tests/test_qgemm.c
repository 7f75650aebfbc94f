/* The integer GEMM of autograd/qgemm.h:
 *  - activation codes: bq_qgemm_quantize_u8 gives the codes whose dequantized values are bit-identical
 *    to bq_kernel_fakequant_forward, on random data, exact ties (k + 0.5)·s and values beyond the range;
 *  - the integer part: acc equals an int64 reference exactly, on random codes and on the extremes
 *    (activations −128 and 127 in whole rows, 7-bit weights at −64 and 63 in whole rows — +64 is not a
 *    7-bit code — and, when oneDNN has VNNI/AMX, 8-bit weights at −128 and 127);
 *  - without VNNI, 8-bit weights are refused with BQ_EINVAL naming the bits; codes outside a
 *    quantizer's bits are refused everywhere;
 *  - the float part: bq_qgemm_linear equals fl(fl((float)acc·fl(sx·sw[n])) + b[n]) bit for bit, and
 *    lies within the fp32 dot-product error bound of the fake-quant Linear (sgemm on fake-quantized
 *    values): |F − I| <= (K + 6)·u·S + 2u·(|F| + |I|), S = sx·sw[n]·Σ_k |qx·qw| (u = 2^-24; F carries
 *    γ_K·S from the summation and the rounding of each fake-quantized value, I one rounding of the
 *    scale, the product and the bias);
 *  - rows do not depend on M (M = 1 vs M = 67) nor on the thread count (1 vs 2), and primitives are
 *    cached per (M,N,K).
 * The fused inference kernels that finish these sums are tested in tests/test_infer_kernels.c. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


#include "autograd/kernels.h"
#include "autograd/qgemm.h"
#include "tests/test_util.h"


/* Codes: 0 random, 1 row m = 0 all qmin / row 1 all qmax, the rest random. */
static void fill_codes(int8_t *q, int64_t rows, int64_t cols, int qmin, int qmax, BqRng *rng) {
    for (int64_t i = 0; i < rows * cols; i++) q[i] = (int8_t)(qmin + (int)bq_rng_below(rng, (uint64_t)(qmax - qmin + 1)));
    for (int64_t c = 0; c < cols && rows > 0; c++) q[c] = (int8_t)qmin;
    for (int64_t c = 0; c < cols && rows > 1; c++) q[cols + c] = (int8_t)qmax;
    for (int64_t c = 0; c < cols && rows > 2; c++) q[2 * cols + c] = (int8_t)(c % 2 ? qmin : qmax);
}

/* Exact integer and float checks for one shape. */
static void check_shape(int64_t M, int64_t N, int64_t K, int bits, BqRng *rng) {
    const int wmin = -(1 << (bits - 1)), wmax = (1 << (bits - 1)) - 1;
    int8_t *qx = malloc((size_t)(M * K)), *qw = malloc((size_t)(N * K));
    uint8_t *xu8 = malloc((size_t)(M * K));
    int32_t *acc = malloc(sizeof(int32_t) * (size_t)(M * N));
    float *sw = malloc(sizeof(float) * (size_t)N), *b = malloc(sizeof(float) * (size_t)N);
    float *y = malloc(sizeof(float) * (size_t)(M * N)), *yf = malloc(sizeof(float) * (size_t)(M * N));
    float *xf = malloc(sizeof(float) * (size_t)(M * K)), *wf = malloc(sizeof(float) * (size_t)(N * K));
    fill_codes(qx, M, K, -128, 127, rng);
    fill_codes(qw, N, K, wmin, wmax, rng);
    for (int64_t i = 0; i < M * K; i++) xu8[i] = (uint8_t)(qx[i] + 128);
    const float sx = 0.0173f;
    for (int64_t n = 0; n < N; n++) {
        sw[n] = 1e-3f * (float)(1.0 + bq_rng_uniform(rng));
        b[n] = (float)(bq_rng_uniform(rng) - 0.5);
    }
    BqQGemmWeights *w = NULL;
    int rc = bq_qgemm_weights_create(&w, qw, sw, N, N, K, bits, "test.weight");
    EXPECT(rc == BQ_OK, "create %lldx%lld %d-bit: %s", (long long)N, (long long)K, bits, bq_errmsg());
    if (rc) goto cleanup;

    rc = bq_qgemm_s32(w, xu8, M, acc);
    EXPECT(rc == BQ_OK, "s32: %s", bq_errmsg());
    int64_t bad = 0;
    for (int64_t m = 0; m < M && !rc; m++)
        for (int64_t n = 0; n < N; n++) {
            int64_t r = 0;
            for (int64_t k = 0; k < K; k++) r += (int64_t)qx[m * K + k] * qw[n * K + k];
            bad += r != acc[m * N + n];
        }
    printf("M=%lld N=%lld K=%lld %d-bit: %lld of %lld integer sums differ from the int64 reference\n",
           (long long)M, (long long)N, (long long)K, bits, (long long)bad, (long long)(M * N));
    EXPECT(bad == 0, "integer GEMM not exact");

    float *outs[1] = {y};
    rc = bq_qgemm_linear(w, xu8, M, sx, b, 1, outs, acc);
    EXPECT(rc == BQ_OK, "linear: %s", bq_errmsg());
    int64_t nbits = 0;
    double maxrel = 0.0; /* |F − I| as a fraction of its bound */
    for (int64_t i = 0; i < M * K; i++) xf[i] = (float)qx[i] * sx;
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < K; k++) wf[n * K + k] = (float)qw[n * K + k] * sw[n];
    bq_kernel_linear_forward(yf, xf, wf, b, M, K, N, BQ_PRECISION_FP32);
    const double u = ldexp(1.0, -24);
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            int64_t r = 0, a = 0;
            for (int64_t k = 0; k < K; k++) {
                r += (int64_t)qx[m * K + k] * qw[n * K + k];
                a += llabs((int64_t)qx[m * K + k] * qw[n * K + k]);
            }
            float s = sx * sw[n];
            float ref = (float)(int32_t)r * s + b[n];
            float got = y[m * N + n];
            nbits += memcmp(&ref, &got, sizeof ref) != 0;
            double S = (double)sx * sw[n] * (double)a;
            double bound = (double)(K + 6) * u * S + 2.0 * u * (fabs(yf[m * N + n]) + fabs(got)) + 1e-30;
            double e = fabs((double)yf[m * N + n] - got) / bound;
            if (e > maxrel) maxrel = e;
        }
    printf("  float part: %lld values differ from fl(fl(acc*fl(sx*sw)) + b); |fake quant - int8| at %.3f of "
           "its bound\n", (long long)nbits, maxrel);
    EXPECT(nbits == 0, "epilogue is not the stated fp32 expression");
    EXPECT(maxrel <= 1.0, "int8 Linear outside the fp32 error bound of the fake-quant Linear");

cleanup:
    bq_qgemm_weights_free(w);
    free(qx), free(qw), free(xu8), free(acc), free(sw), free(b), free(y), free(yf), free(xf), free(wf);
}

/* Codes against the fake quantizer, including ties and saturation. */
static void check_quantize(BqRng *rng) {
    enum { N = 4096 };
    const float s = 0.03125f; /* a power of two: (k + 0.5)·s and its quotient are exact */
    static float x[N], fq[N];
    static uint8_t c[N];
    for (int i = 0; i < N; i++) {
        switch (i % 4) {
        case 0: x[i] = (float)(bq_rng_uniform(rng) * 10.0 - 5.0); break;
        case 1: x[i] = ((float)((int)bq_rng_below(rng, 300) - 150) + 0.5f) * s; break; /* ties, some beyond */
        case 2: x[i] = (float)(bq_rng_uniform(rng) * 40.0 - 20.0); break;             /* saturating */
        default: x[i] = (float)((int)bq_rng_below(rng, 256) - 128) * s; break;        /* on the grid */
        }
    }
    x[0] = 127.5f * s, x[1] = -128.5f * s, x[2] = 126.5f * s, x[3] = -127.5f * s, x[5] = 0.5f * s, x[6] = -0.5f * s;
    bq_qgemm_quantize_u8(c, x, N, s);
    bq_kernel_fakequant_forward(fq, x, &s, 1, 1, N, -128, 127);
    int bad = 0;
    for (int i = 0; i < N; i++) {
        float d = (float)((int)c[i] - 128) * s;
        bad += memcmp(&d, &fq[i], sizeof d) != 0;
    }
    printf("quantize: %d of %d codes differ from the fake quantizer (ties and saturation included)\n", bad, N);
    EXPECT(bad == 0, "activation codes differ from bq_kernel_fakequant_forward");
    EXPECT(c[0] == 255 && c[1] == 0 && c[2] == 126 + 128 && c[3] == 128 - 128 && c[5] == 128 && c[6] == 128,
           "ties: %d %d %d %d %d %d", c[0], c[1], c[2], c[3], c[5], c[6]);
}

/* Rows of one product at M = 1 and M = 67, at 1 and 2 threads, are bit-identical. */
static void check_invariance(BqRng *rng) {
    enum { M = 67, N = 96, K = 200 };
    static int8_t qw[N * K];
    static uint8_t x[M * K];
    static float sw[N], b[N], y1[M * N], y2[M * N], yr[N];
    static int32_t scr[M * N];
    fill_codes(qw, N, K, -64, 63, rng);
    for (int i = 0; i < M * K; i++) x[i] = (uint8_t)bq_rng_below(rng, 256);
    for (int n = 0; n < N; n++) sw[n] = 0.01f * (float)bq_rng_uniform(rng) + 1e-4f, b[n] = (float)bq_rng_normal(rng);
    BqQGemmWeights *w = NULL;
    BQ_CHECK(bq_qgemm_weights_create(&w, qw, sw, N, N, K, 7, "inv.weight") == BQ_OK);
    int prev = bq_runtime_threads();
    bq_runtime_set_threads(1);
    float *o1[1] = {y1}, *o2[1] = {y2};
    BQ_CHECK(bq_qgemm_linear(w, x, M, 0.02f, b, 1, o1, scr) == BQ_OK);
    bq_runtime_set_threads(2);
    BQ_CHECK(bq_qgemm_linear(w, x, M, 0.02f, b, 1, o2, scr) == BQ_OK);
    EXPECT(memcmp(y1, y2, sizeof y1) == 0, "1 vs 2 threads differ");
    int bad = 0;
    for (int m = 0; m < M; m++) {
        float *o[1] = {yr};
        BQ_CHECK(bq_qgemm_linear(w, x + m * K, 1, 0.02f, b, 1, o, scr) == BQ_OK);
        bad += memcmp(yr, y2 + m * N, sizeof yr) != 0;
    }
    printf("invariance: %d of %d rows differ between M=1 and M=%d; threads 1 vs 2 %s\n", bad, M, M,
           memcmp(y1, y2, sizeof y1) ? "differ" : "identical");
    EXPECT(bad == 0, "rows depend on M");
    /* the cache: the same shapes again create no primitive */
    int64_t before = bq_qgemm_primitives_created();
    BQ_CHECK(bq_qgemm_linear(w, x, M, 0.02f, b, 1, o2, scr) == BQ_OK);
    BQ_CHECK(bq_qgemm_linear(w, x, 1, 0.02f, b, 1, o2, scr) == BQ_OK);
    EXPECT(bq_qgemm_primitives_created() == before, "cached shapes created %lld primitives",
           (long long)(bq_qgemm_primitives_created() - before));
    /* split output: the three blocks of a fused query/key/value product */
    static float ya[M * N / 3], yb[M * N / 3], yc[M * N / 3];
    float *o3[3] = {ya, yb, yc};
    BQ_CHECK(bq_qgemm_linear(w, x, M, 0.02f, b, 3, o3, scr) == BQ_OK);
    int sbad = 0;
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) sbad += o3[n / (N / 3)][m * (N / 3) + n % (N / 3)] != y2[m * N + n];
    EXPECT(sbad == 0, "split output differs in %d values", sbad);
    bq_runtime_set_threads(prev);
    bq_qgemm_weights_free(w);
}

static void check_refusals(void) {
    int8_t qw[4 * 8];
    float sw = 0.01f;
    memset(qw, 0, sizeof qw);
    BqQGemmWeights *w = NULL;
    qw[5] = 64; /* not a 7-bit code */
    int rc = bq_qgemm_weights_create(&w, qw, &sw, 1, 4, 8, 7, "layer.0.query.weight_quantizer");
    EXPECT(rc == BQ_EINVAL && strstr(bq_errmsg(), "7-bit") && strstr(bq_errmsg(), "query"),
           "a 7-bit code 64 is refused: rc %d '%s'", rc, bq_errmsg());
    bq_qgemm_weights_free(w);
    w = NULL;
    qw[5] = -128;
    rc = bq_qgemm_weights_create(&w, qw, &sw, 1, 4, 8, 8, "layer.0.query.weight_quantizer");
    if (bq_qgemm_exact_8bit()) {
        EXPECT(rc == BQ_OK, "8-bit weights on a VNNI ISA: %s", bq_errmsg());
    } else {
        printf("8-bit weights without VNNI: %s\n", bq_errmsg());
        EXPECT(rc == BQ_EINVAL && strstr(bq_errmsg(), "8-bit") && strstr(bq_errmsg(), "VNNI"),
               "8-bit weights without VNNI are refused: rc %d '%s'", rc, bq_errmsg());
    }
    bq_qgemm_weights_free(w);
}

int main(void) {
    bq_runtime_set_threads(2);
    printf("%s\n", bq_dnnl_describe());
    BqRng rng;
    bq_rng_seed(&rng, 15);
    check_quantize(&rng);
    static const int64_t shapes[][3] = {{1, 1, 1}, {3, 5, 37}, {67, 96, 384}, {128, 1536, 384}, {5, 384, 1536},
                                        {257, 40, 1536}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        check_shape(shapes[i][0], shapes[i][1], shapes[i][2], 7, &rng);
    if (bq_qgemm_exact_8bit()) {
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
            check_shape(shapes[i][0], shapes[i][1], shapes[i][2], 8, &rng);
    } else {
        printf("8-bit weights: not run (oneDNN ISA without VNNI/AMX; refusal checked instead)\n");
    }
    check_invariance(&rng);
    check_refusals();
    bq_qgemm_cache_clear();
    if (fails) printf("%d check(s) FAILED\n", fails);
    else printf("all qgemm checks passed\n");
    return fails ? 1 : 0;
}
