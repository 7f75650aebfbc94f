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
 *    cached per (M,N,K);
 *  - the fused inference kernels of autograd/infer_kernels.h against double-precision references on
 *    random accumulators: every code within one step of the reference code, and at most 1% of them off
 *    by one (values within float rounding of a rounding boundary); LayerNorm outputs within 1e-5 of the
 *    reference; attention with padding masks (T = 37 and 128, head sizes 16 and 32) giving the same
 *    bytes for a sequence alone as inside a batch, and for 1 and 2 threads. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <omp.h>

#include "autograd/infer_kernels.h"
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

/* ---- fused inference kernels ---- */

static int ref_code(double v, double s) {
    double q = nearbyint(fmin(fmax(v / s, -128.0), 127.0)); /* default rounding mode: ties to even */
    return (int)q + 128;
}

/* Compares n codes with reference values ref at scale s: counts codes off by one, fails on more. */
static void compare_codes(const char *what, const uint8_t *got, const double *ref, int64_t n, double s) {
    int64_t off1 = 0, worse = 0;
    for (int64_t i = 0; i < n; i++) {
        int d = abs((int)got[i] - ref_code(ref[i], s));
        off1 += d == 1;
        worse += d > 1;
    }
    printf("%s: %lld codes, %lld off by one, %lld further\n", what, (long long)n, (long long)off1, (long long)worse);
    EXPECT(worse == 0, "%s: %lld codes more than one step from the reference", what, (long long)worse);
    EXPECT(off1 * 100 <= n, "%s: %lld of %lld codes off by one", what, (long long)off1, (long long)n);
}

static void fill_acc(int32_t *acc, int32_t *comp, float *scale, float *bias, int64_t M, int64_t N, float amp,
                     BqRng *rng) {
    for (int64_t n = 0; n < N; n++) {
        comp[n] = (int32_t)bq_rng_below(rng, 2001) - 1000;
        scale[n] = amp * (0.5f + bq_rng_uniform(rng)) / 20000.0f;
        bias[n] = 0.2f * (bq_rng_uniform(rng) - 0.5f);
    }
    for (int64_t i = 0; i < M * N; i++) acc[i] = (int32_t)bq_rng_below(rng, 40001) - 20000 + comp[i % N];
}

static double ref_dequant(const int32_t *acc, const int32_t *comp, const float *scale, const float *bias, int64_t i,
                          int64_t n) {
    return (double)(acc[i] - comp[n]) * scale[n] + bias[n];
}

static void check_infer_epilogues(BqRng *rng) {
    enum { M = 70, H = 384, I = 1536 };
    int32_t *acc = bq_malloc(sizeof(int32_t) * M * I), comp[I];
    float scale[I], bias[I], lnw[H], lnb[H];
    float *resid = bq_malloc(sizeof(float) * M * H), *out = bq_malloc(sizeof(float) * M * H);
    uint8_t *codes = bq_malloc((size_t)M * I);
    double *ref = bq_malloc(sizeof(double) * M * I);
    /* GELU: pre-activations over about ±6 */
    fill_acc(acc, comp, scale, bias, M, I, 6.0f, rng);
    const float sg = 4.0f / 127.0f;
    bq_infer_gelu_quant(codes, acc, comp, scale, bias, sg, M, I);
    for (int64_t i = 0; i < (int64_t)M * I; i++) {
        double x = ref_dequant(acc, comp, scale, bias, i, i % I);
        ref[i] = 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    }
    compare_codes("gelu + quantize", codes, ref, (int64_t)M * I, sg);
    /* residual + LayerNorm */
    fill_acc(acc, comp, scale, bias, M, H, 3.0f, rng);
    for (int64_t i = 0; i < (int64_t)M * H; i++) resid[i] = 2.0f * (bq_rng_uniform(rng) - 0.5f);
    for (int n = 0; n < H; n++) lnw[n] = 0.5f + bq_rng_uniform(rng), lnb[n] = 0.1f * (bq_rng_uniform(rng) - 0.5f);
    const float sl = 6.0f / 127.0f;
    bq_infer_residual_layernorm(out, codes, acc, comp, scale, bias, resid, lnw, lnb, 1e-12f, sl, M, H);
    double maxe = 0.0;
    for (int64_t m = 0; m < M; m++) {
        double y[H], mean = 0.0, var = 0.0;
        for (int n = 0; n < H; n++) y[n] = ref_dequant(acc, comp, scale, bias, m * H + n, n) + resid[m * H + n];
        for (int n = 0; n < H; n++) mean += y[n] / H;
        for (int n = 0; n < H; n++) var += (y[n] - mean) * (y[n] - mean) / H;
        for (int n = 0; n < H; n++) {
            ref[m * H + n] = (y[n] - mean) / sqrt(var + 1e-12) * lnw[n] + lnb[n];
            maxe = fmax(maxe, fabs(ref[m * H + n] - out[m * H + n]));
        }
    }
    printf("residual + LayerNorm: max |out - reference| %.3g\n", maxe);
    EXPECT(maxe <= 1e-5, "residual + LayerNorm: max error %.3g", maxe);
    compare_codes("residual + LayerNorm + quantize", codes, ref, (int64_t)M * H, sl);
    free(acc);
    free(resid);
    free(out);
    free(codes);
    free(ref);
}

/* Attention of B sequences of T tokens (lengths T, T−5, ...: padding masked) against a double
 * reference, and batch/thread invariance. */
static void check_infer_attention(int64_t B, int64_t T, int64_t NH, int64_t d, BqRng *rng) {
    const int64_t H = NH * d, N = 3 * H, M = B * T;
    int32_t *acc = bq_malloc(sizeof(int32_t) * (size_t)(M * N)), *comp = bq_malloc(sizeof(int32_t) * (size_t)N);
    float *scale = bq_malloc(sizeof(float) * (size_t)N), *bias = bq_malloc(sizeof(float) * (size_t)N);
    float *mask = bq_malloc(sizeof(float) * (size_t)M);
    fill_acc(acc, comp, scale, bias, M, N, 3.0f, rng);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) mask[b * T + t] = t < T - 5 * b ? 1.0f : 0.0f;
    const int64_t nthr = omp_get_max_threads(), per = bq_infer_attention_scratch(T, d);
    float *scratch = NULL;
    BQ_CHECK(posix_memalign((void **)&scratch, 64, sizeof(float) * (size_t)(nthr * per)) == 0);
    uint8_t *codes = bq_malloc((size_t)(M * H)), *one = bq_malloc((size_t)(T * H));
    const float sc = 1.0f / sqrtf((float)d), sq = 1.5f / 127.0f;
    const BqQkvSums sums = bq_qkv_sums_fused(acc, comp, scale, bias, H);
    bq_infer_attention(codes, &sums, mask, scratch, nthr, sc, sq, B, T, NH, d);
    double *ref = bq_malloc(sizeof(double) * (size_t)(M * H)), *p = bq_malloc(sizeof(double) * (size_t)T);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < T; i++) {
                double mx = -INFINITY, sum = 0.0;
                for (int64_t j = 0; j < T; j++) {
                    double s = 0.0;
                    for (int64_t e = 0; e < d; e++) {
                        int64_t cq = h * d + e, ck = H + h * d + e;
                        s += ref_dequant(acc, comp, scale, bias, (b * T + i) * N + cq, cq) *
                             ref_dequant(acc, comp, scale, bias, (b * T + j) * N + ck, ck);
                    }
                    p[j] = mask[b * T + j] > 0.0f ? s * sc : -INFINITY;
                    mx = fmax(mx, p[j]);
                }
                for (int64_t j = 0; j < T; j++) sum += (p[j] = exp(p[j] - mx));
                for (int64_t e = 0; e < d; e++) {
                    double c = 0.0;
                    const int64_t cv = 2 * H + h * d + e;
                    for (int64_t j = 0; j < T; j++) c += p[j] / sum * ref_dequant(acc, comp, scale, bias, (b * T + j) * N + cv, cv);
                    ref[(b * T + i) * H + h * d + e] = c;
                }
            }
    char what[96];
    snprintf(what, sizeof what, "attention B=%lld T=%lld NH=%lld d=%lld", (long long)B, (long long)T, (long long)NH,
             (long long)d);
    compare_codes(what, codes, ref, M * H, sq);
    int alone_bad = 0;
    for (int64_t b = 0; b < B; b++) {
        const BqQkvSums sb = bq_qkv_sums_fused(acc + b * T * N, comp, scale, bias, H);
        bq_infer_attention(one, &sb, mask + b * T, scratch, nthr, sc, sq, 1, T, NH, d);
        alone_bad += memcmp(one, codes + b * T * H, (size_t)(T * H)) != 0;
    }
    int prev = bq_runtime_threads();
    bq_runtime_set_threads(1);
    uint8_t *t1 = bq_malloc((size_t)(M * H));
    bq_infer_attention(t1, &sums, mask, scratch, nthr, sc, sq, B, T, NH, d);
    bq_runtime_set_threads(prev);
    const int thr_bad = memcmp(t1, codes, (size_t)(M * H)) != 0;
    printf("%s: %d sequences differ alone, 1 vs %d threads differ: %d\n", what, alone_bad, prev, thr_bad);
    EXPECT(alone_bad == 0 && thr_bad == 0, "%s depends on the batch or the thread count", what);
    free(acc), free(comp), free(scale), free(bias), free(mask), free(scratch), free(codes), free(one), free(ref);
    free(p), free(t1);
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
    for (int portable = 0; portable < 2; portable++) {
        /* the AVX2+FMA kernels where the CPU has them, then the portable ones (autograd/infer_kernels.c) */
        if (portable) setenv("BQ_INFER_PORTABLE", "1", 1);
        printf("fused inference kernels, %s:\n", portable ? "portable" : "as dispatched on this CPU");
        check_infer_epilogues(&rng);
        check_infer_attention(3, 37, 2, 16, &rng);
        check_infer_attention(2, 128, 12, 32, &rng);
    }
    unsetenv("BQ_INFER_PORTABLE");
    bq_qgemm_cache_clear();
    if (fails) printf("%d check(s) FAILED\n", fails);
    else printf("all qgemm checks passed\n");
    return fails ? 1 : 0;
}
