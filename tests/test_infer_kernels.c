/* The integer engine's fused kernels (autograd/infer_kernels.h) one by one, against references in double
 * precision, with inputs chosen so that every requantize saturates on both sides: the final uint8 codes
 * of each kernel, and every fake quantizer inside the fake-quant kernels (ort, qdqbert). Each kernel runs
 * with the fastest code of the CPU (AVX-512 or AVX2 + FMA), with its AVX2 code where the CPU has AVX-512
 * (BQ_INFER_AVX2=1) and with the portable code (BQ_INFER_PORTABLE=1); then the AVX-512 kernels against
 * the AVX2 ones bit for bit.
 *
 * How a reference code is judged. For a value v = x / s in code units (double), the kernel's code must be
 * clamp(rint(v), -128, 127) (+128 for uint8 codes), and where v lies beyond the range, the saturated end;
 * NaN gives the zero code. The kernels compute x in fp32 (and GELU, exp and LayerNorm with their own
 * approximations), so x differs from the double reference by a few units in the last place; a value
 * within MARGIN code units of a rounding boundary (a half-integer) may round either way and is skipped
 * (counted; the test requires that few are). MARGIN = 0.01 code units lies far above those errors (below
 * 1e-3 code units at the scales used) and far below one code, so a wrong scale, a missing clamp, a wrap of
 * an out-of-range value or a wrong rounding fails.
 *
 * Exact parts. Where a kernel's inputs are on power-of-two grids (dequantization scale 2^-k, biases and
 * residuals multiples of it, fake-quant scales powers of two) its values before GELU, exp or LayerNorm
 * are exact in fp32 and in double, and a fake quantizer on them is exact too: the reference then gives
 * the kernel's code exactly, ties to even included. The attention's products on codes are exact integer
 * sums, and a scaled sum is one fp32 rounding, replicated in the reference.
 *
 * The kernels without fake quantizers also run on random accumulators with random scales at MiniLM's
 * shapes, where nothing is exact: every code within one step of the reference code and at most 1% of
 * them off by one (values within fp32 rounding of a rounding boundary); LayerNorm outputs within 1e-5 of
 * the reference; attention with padding masks (T = 37 and 128, head sizes 16 and 32) giving the same
 * bytes for a sequence alone as inside a batch, and for 1 and 2 threads. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/fastmath.h"
#include "autograd/infer_kernels.h"
#include "tests/test_util.h"

#define MARGIN 0.01

/* Tally of one kernel's codes against the reference. */
typedef struct Tally {
    long checked, skipped, sat_hi, sat_lo, bad;
} Tally;

/* The expected signed code of v (code units) in [lo, hi], or INT32_MIN when v is within margin of a
 * rounding boundary; counts the saturated ends. Margin 0: v is the kernel's own fp32 value, and ties
 * round to even as in the kernel. */
static int ref_code_m(double v, double lo, double hi, double margin, Tally *t) {
    if (v != v) return 0;
    if (v > hi + 0.5 + margin) return t->sat_hi++, (int)hi;
    if (v < lo - 0.5 - margin) return t->sat_lo++, (int)lo;
    const double f = v - floor(v);
    if (margin > 0.0 && fabs(f - 0.5) < margin) return INT32_MIN;
    const double r = rint(v);
    return (int)(r < lo ? lo : r > hi ? hi : r);
}

static int ref_code(double v, double lo, double hi, Tally *t) { return ref_code_m(v, lo, hi, MARGIN, t); }

/* Checks one uint8 code against the reference value v (code units at the final scale), skipping it
 * within margin of a boundary. */
static void check_code_m(Tally *t, uint8_t got, double v, double margin) {
    const int want = ref_code_m(v, -128.0, 127.0, margin, t);
    if (want == INT32_MIN) {
        t->skipped++;
        return;
    }
    t->checked++;
    if ((int)got - 128 != want) {
        if (t->bad < 3) fprintf(stderr, "  code %d, expected %d (v = %.6f)\n", (int)got - 128, want, v);
        t->bad++;
    }
}

static void check_code(Tally *t, uint8_t got, double v) { check_code_m(t, got, v, MARGIN); }
/* v exactly the kernel's fp32 value: no code is skipped. */
static void check_code_exact(Tally *t, uint8_t got, float v) { check_code_m(t, got, v, 0.0); }

static void report(const char *what, int portable, const Tally *t) {
    printf("%-34s %s: %ld codes checked, %ld skipped near a boundary, saturated %ld high / %ld low, %ld wrong\n",
           what, bq_infer_isa(), t->checked, t->skipped, t->sat_hi, t->sat_lo, t->bad);
    EXPECT(t->bad == 0, "%s: %ld wrong codes", what, t->bad);
    EXPECT(t->sat_hi > 0 && t->sat_lo > 0, "%s: the inputs do not saturate both ends", what);
    EXPECT(t->skipped * 20 <= t->checked, "%s: %ld of %ld codes skipped", what, t->skipped, t->checked);
}

/* An exact fake quantizer in double: clamp(rint(x/s), lo, hi)·s, for x/s exact (power-of-two scales). */
static double fq_exact(double x, BqFq q) {
    if (!(q.s > 0.0f)) return x;
    double v = rint(x / q.s);
    return (v < q.lo ? q.lo : v > q.hi ? q.hi : v) * q.s;
}

/* The expected fake-quant code of a value that is not exact (after GELU or LayerNorm): INT32_MIN near a
 * boundary. */
static int fq_code_ref(double x, BqFq q, Tally *t) { return ref_code(x / q.s, q.lo, q.hi, t); }

static double gelu_ref(double x) { return 0.5 * x * erfc(-x / sqrt(2.0)); }

static float *floats(BqRng *r, int64_t n, double lo, double hi) {
    float *a = malloc((size_t)n * sizeof *a);
    for (int64_t i = 0; i < n; i++) a[i] = (float)(lo + (hi - lo) * bq_rng_uniform(r));
    return a;
}

/* Accumulators acc = comp[n] + r with r in [-range, range], comp in [-1000, 1000]: acc − comp = r. */
static void accumulators(BqRng *rng, int32_t *acc, int32_t *comp, int64_t M, int64_t N, int range) {
    for (int64_t n = 0; n < N; n++) comp[n] = (int32_t)bq_rng_below(rng, 2001) - 1000;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++)
            acc[m * N + n] = comp[n] + (int32_t)bq_rng_below(rng, (uint64_t)(2 * range + 1)) - range;
}

static const BqFq FQ_NONE = {0.0f, 0.0f, 0.0f};
static BqFq fq8(float s) { return (BqFq){s, -128.0f, 127.0f}; }

/* bq_infer_gelu_fq_quant with its pass prepared here (so the environment at the call decides its table). */
static void gelu_fq_quant(uint8_t *codes, const int32_t *acc, const int32_t *comp, const float *scale,
                          const float *bias, BqFq fin, BqFq fout, float sq, int64_t M, int64_t N) {
    BqGeluFq g;
    bq_infer_gelu_fq_prepare(&g, fin, fout, sq);
    bq_infer_gelu_fq_quant(codes, acc, comp, scale, bias, &g, M, N, N);
}

/* ---- GELU epilogues ---- */

static void check_gelu(BqRng *rng, int portable) {
    enum { M = 33, N = 48 };
    int32_t acc[M * N], comp[N];
    uint8_t codes[M * N];
    accumulators(rng, acc, comp, M, N, 2000);
    float scale[N], *bias = floats(rng, N, -1.0, 1.0);
    for (int n = 0; n < N; n++) scale[n] = 1.0f / 64.0f;
    bias[5] = NAN; /* a NaN column: code 0 */
    const float sq = 0.001f;
    bq_infer_gelu_quant(codes, acc, comp, scale, bias, sq, M, N, N);
    Tally t = {0};
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            const double x = (double)(acc[m * N + n] - comp[n]) / 64.0 + bias[n];
            check_code(&t, codes[m * N + n], gelu_ref(x) / sq);
        }
    report("gelu_quant", portable, &t);

    /* with the fake quantizers of the dense and GELU outputs (ort), then the GELU's alone: inputs on the
     * 2^-6 grid, fin 2^-4 (clamps at -8 and 7.9375), fout 2^-6 */
    for (int withfin = 1; withfin >= 0; withfin--) {
        for (int n = 0; n < N; n++) bias[n] = (float)((int)bq_rng_below(rng, 129) - 64) / 64.0f;
        const BqFq fin = withfin ? fq8(1.0f / 16.0f) : FQ_NONE, fout = fq8(1.0f / 64.0f);
        gelu_fq_quant(codes, acc, comp, scale, bias, fin, fout, sq, M, N);
        Tally tf = {0}, tin = {0}, tout = {0};
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                const double x = fq_exact((double)(acc[m * N + n] - comp[n]) / 64.0 + bias[n], fin);
                if (withfin) ref_code(((double)(acc[m * N + n] - comp[n]) / 64.0 + bias[n]) / fin.s, -128, 127, &tin);
                const int c = fq_code_ref(gelu_ref(x), fout, &tout);
                if (c == INT32_MIN) {
                    tf.skipped++;
                    continue;
                }
                /* the code of fout's value c·2^-6 at sq: one fp32 division, replicated */
                check_code_exact(&tf, codes[m * N + n], (float)((double)c * fout.s / sq));
            }
        report(withfin ? "gelu_fq_quant (fin, fout)" : "gelu_fq_quant (fout)", portable, &tf);
        printf("  fin saturated %ld high / %ld low, fout %ld high\n", tin.sat_hi, tin.sat_lo, tout.sat_hi);
        EXPECT(tout.sat_hi > 0, "gelu_fq_quant: fout does not saturate");
        if (withfin) EXPECT(tin.sat_hi > 0 && tin.sat_lo > 0, "gelu_fq_quant: fin does not saturate both ends");
    }
    free(bias);
}

/* ---- residual + LayerNorm epilogues ---- */

/* LayerNorm of one row in double (biased variance, as bq_kernel_layernorm_forward). */
static void ln_ref(double *y, const double *x, const float *w, const float *b, double eps, int N) {
    double mean = 0.0, var = 0.0;
    for (int n = 0; n < N; n++) mean += x[n];
    mean /= N;
    for (int n = 0; n < N; n++) var += (x[n] - mean) * (x[n] - mean);
    var /= N;
    for (int n = 0; n < N; n++) y[n] = (x[n] - mean) / sqrt(var + eps) * w[n] + b[n];
}

static void check_residual_layernorm(BqRng *rng, int portable) {
    enum { M = 21, N = 40 };
    int32_t acc[M * N], comp[N];
    uint8_t codes[M * N];
    float out[M * N], scale[N], resid[M * N];
    accumulators(rng, acc, comp, M, N, 1000);
    float *bias = floats(rng, N, -1.0, 1.0), *lnw = floats(rng, N, 1.0, 6.0), *lnb = floats(rng, N, -1.0, 1.0);
    for (int n = 0; n < N; n++) scale[n] = 1.0f / 64.0f;
    for (int i = 0; i < M * N; i++) resid[i] = 2.0f * bq_rng_normal(rng);
    const float eps = 1e-12f, sq = 0.02f;
    bq_infer_residual_layernorm(out, codes, acc, comp, scale, bias, resid, lnw, lnb, eps, sq, M, N);
    Tally t = {0};
    double maxd = 0.0;
    for (int m = 0; m < M; m++) {
        double x[N], y[N];
        for (int n = 0; n < N; n++) x[n] = (double)(acc[m * N + n] - comp[n]) / 64.0 + bias[n] + resid[m * N + n];
        ln_ref(y, x, lnw, lnb, eps, N);
        for (int n = 0; n < N; n++) {
            maxd = fmax(maxd, fabs(out[m * N + n] - y[n]) / fmax(1.0, fabs(y[n])));
            check_code(&t, codes[m * N + n], y[n] / sq);
        }
    }
    report("residual_layernorm", portable, &t);
    printf("  max relative |out - reference| %.3g\n", maxd);
    EXPECT(maxd < 1e-5, "residual_layernorm: outputs off by %.3g", maxd);
    /* written over its residual (the int8 engine's layers, layers/bert_fused.h): the same bits */
    float io[M * N];
    uint8_t codes_io[M * N];
    memcpy(io, resid, sizeof io);
    bq_infer_residual_layernorm(io, codes_io, acc, comp, scale, bias, io, lnw, lnb, eps, sq, M, N);
    const int inplace_bad = memcmp(io, out, sizeof io) != 0 || memcmp(codes_io, codes, sizeof codes) != 0;
    printf("  written over its residual: %s\n", inplace_bad ? "DIFFERS" : "same bits");
    EXPECT(!inplace_bad, "residual_layernorm written over its residual differs");

    /* with fake quantizers, on power-of-two grids: dense output 2^-4, skip input 2^-3 (resid j/32), sum
     * 2^-3, LayerNorm output 2^-3 (ort: sum and LayerNorm; qdqbert: dense output and skip input; all four) */
    static const int on[3][4] = {{0, 0, 1, 1}, {1, 1, 0, 0}, {1, 1, 1, 1}};
    static const char *const names[3] = {"residual_layernorm_fq (ort)", "residual_layernorm_fq (qdqbert)",
                                         "residual_layernorm_fq (all four)"};
    for (int n = 0; n < N; n++) bias[n] = (float)((int)bq_rng_below(rng, 129) - 64) / 64.0f;
    for (int i = 0; i < M * N; i++) resid[i] = (float)((int)bq_rng_below(rng, 801) - 400) / 32.0f;
    const float sq2 = 0.05f;
    for (int v = 0; v < 3; v++) {
        const float s[4] = {1.0f / 16.0f, 0.125f, 0.125f, 0.125f};
        BqFq f[4];
        for (int k = 0; k < 4; k++) f[k] = on[v][k] ? fq8(s[k]) : FQ_NONE;
        bq_infer_residual_layernorm_fq(out, codes, acc, comp, scale, bias, resid, f, lnw, lnb, eps, sq2, M, N);
        Tally tf = {0}, tsum = {0}, tln = {0};
        int outbad = 0;
        for (int m = 0; m < M; m++) {
            double x[N], y[N];
            for (int n = 0; n < N; n++) {
                const double loc = fq_exact((double)(acc[m * N + n] - comp[n]) / 64.0 + bias[n], f[BQ_FQ_LOCAL]);
                const double sum = loc + fq_exact(resid[m * N + n], f[BQ_FQ_SKIP]);
                if (on[v][BQ_FQ_SUM]) ref_code(sum / f[BQ_FQ_SUM].s, -128, 127, &tsum);
                x[n] = fq_exact(sum, f[BQ_FQ_SUM]);
            }
            ln_ref(y, x, lnw, lnb, eps, N);
            for (int n = 0; n < N; n++) {
                if (on[v][BQ_FQ_LN]) {
                    const int c = fq_code_ref(y[n], f[BQ_FQ_LN], &tln);
                    if (c == INT32_MIN) {
                        tf.skipped++;
                        continue;
                    }
                    const double val = c * (double)f[BQ_FQ_LN].s;
                    outbad += out[m * N + n] != (float)val; /* the fake-quantized value exactly */
                    check_code_exact(&tf, codes[m * N + n], (float)(val / sq2));
                } else {
                    outbad += fabs(out[m * N + n] - y[n]) > 1e-5 * fmax(1.0, fabs(y[n]));
                    check_code(&tf, codes[m * N + n], y[n] / sq2);
                }
            }
        }
        report(names[v], portable, &tf);
        EXPECT(outbad == 0, "%s: %d outputs differ from the reference", names[v], outbad);
        printf("  sum saturated %ld high / %ld low, LayerNorm output %ld / %ld\n", tsum.sat_hi, tsum.sat_lo, tln.sat_hi,
               tln.sat_lo);
        if (on[v][BQ_FQ_SUM]) EXPECT(tsum.sat_hi > 0 && tsum.sat_lo > 0, "%s: the sum does not saturate", names[v]);
    }
    free(bias);
    free(lnw);
    free(lnb);
}

/* ---- attention ---- */

enum { AB = 2, NH = 2, HD = 16, AH = NH * HD };

/* The attention's inputs: query/key/value accumulators (AB·T, 3H) with acc − comp = r in [-range, range],
 * dequantization scale 2^-4 and biases k/16, so Q, K, V = (r + k)/16 exactly; the last 3 keys of
 * sequence 1 masked. */
typedef struct AttnCase {
    int T;
    int32_t *acc, comp[3 * AH];
    float qscale[3 * AH], bias[3 * AH], *mask;
} AttnCase;

static void attn_case(AttnCase *c, BqRng *rng, int T, int range) {
    c->T = T;
    c->acc = malloc((size_t)(AB * T * 3 * AH) * sizeof *c->acc);
    c->mask = malloc((size_t)(AB * T) * sizeof *c->mask);
    accumulators(rng, c->acc, c->comp, AB * T, 3 * AH, range);
    for (int n = 0; n < 3 * AH; n++) {
        c->qscale[n] = 1.0f / 16.0f;
        c->bias[n] = (float)((int)bq_rng_below(rng, 9) - 4) / 16.0f;
    }
    for (int b = 0; b < AB; b++)
        for (int t = 0; t < T; t++) c->mask[b * T + t] = b == 1 && t >= T - 3 ? 0.0f : 1.0f;
}

/* Q, K or V (part 0, 1, 2) of token t of sequence b, head h, element e: exact. */
static double attn_in(const AttnCase *c, int part, int b, int t, int h, int e) {
    const int col = part * AH + h * HD + e;
    return (double)(c->acc[(b * c->T + t) * 3 * AH + col] - c->comp[col]) / 16.0 + c->bias[col];
}

static float *attn_scratch(int T) {
    const size_t n = (size_t)omp_get_max_threads() * (size_t)bq_infer_attention_scratch(T, HD);
    return aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
}

/* Softmax of scale·s over T keys whose mask mrow (0/1) is 1 (masked keys weight 0), in double. */
static void softmax_ref(double *p, const double *s, const float *mrow, int64_t T, double scale) {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < T; j++)
        if (mrow[j] != 0.0f) mx = fmax(mx, scale * s[j]);
    for (int64_t j = 0; j < T; j++) sum += p[j] = mrow[j] != 0.0f ? exp(scale * s[j] - mx) : 0.0;
    for (int64_t j = 0; j < T; j++) p[j] /= sum;
}

static void check_attention(BqRng *rng, int portable) {
    const float scale = 0.25f, sq = 0.004f;
    for (int T = 12; T <= 16; T += 4) { /* 16: the AVX2 softmax (T a multiple of 8); 12: its other branch */
        AttnCase c;
        attn_case(&c, rng, T, 20);
        uint8_t *codes = malloc((size_t)(AB * T * AH));
        float *scratch = attn_scratch(T);
        const BqQkvSums sums = bq_qkv_sums_fused(c.acc, c.comp, c.qscale, c.bias, AH);
        bq_infer_attention(codes, &sums, c.mask, scratch, omp_get_max_threads(), scale, sq, AB, T, T, NH, HD, NH * HD);
        Tally t = {0};
        for (int b = 0; b < AB; b++)
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < T; i++) {
                    double s[16], p[16];
                    for (int j = 0; j < T; j++) {
                        s[j] = 0.0;
                        for (int e = 0; e < HD; e++) s[j] += attn_in(&c, 0, b, i, h, e) * attn_in(&c, 1, b, j, h, e);
                    }
                    softmax_ref(p, s, c.mask + b * T, T, scale);
                    for (int e = 0; e < HD; e++) {
                        double ctx = 0.0;
                        for (int j = 0; j < T; j++) ctx += p[j] * attn_in(&c, 2, b, j, h, e);
                        check_code(&t, codes[(b * T + i) * AH + h * HD + e], ctx / sq);
                    }
                }
        char what[64];
        snprintf(what, sizeof what, "attention (T %d)", T);
        report(what, portable, &t);
        free(codes);
        free(scratch);
        free(c.acc);
        free(c.mask);
    }
}

/* The fake-quant attention: Q, K, V codes on 2^-4 (r up to ±200: they saturate), scores on 2^-2 (their
 * sums reach ±1024, far beyond ±32), probabilities on fl(1/127), context on 2^-5 (ort: every quantizer;
 * qdqbert: no scores or context quantizer), final codes at 2^-6 or 2^-5. */
static void check_attention_fq(BqRng *rng, int portable) {
    const float scale = 0.25f;
    for (int v = 0; v < 2; v++) {
        const int T = 16, all = v == 0;
        const float sq = all ? 1.0f / 64.0f : 1.0f / 32.0f;
        AttnCase c;
        attn_case(&c, rng, T, 200);
        BqFq fq[BQ_FQ_ATTN];
        fq[BQ_FQ_Q] = fq[BQ_FQ_K] = fq[BQ_FQ_V] = fq8(1.0f / 16.0f);
        fq[BQ_FQ_SCORES] = all ? fq8(0.25f) : FQ_NONE;
        fq[BQ_FQ_PROBS] = fq8(1.0f / 127.0f);
        fq[BQ_FQ_CONTEXT] = all ? fq8(1.0f / 32.0f) : FQ_NONE;
        uint8_t *codes = malloc((size_t)(AB * T * AH));
        float *scratch = attn_scratch(T);
        BqQkvSums sums = bq_qkv_sums_fused(c.acc, c.comp, c.qscale, c.bias, AH);
        if (!all) { /* qdqbert: the sums of three GEMMs, three arrays of (AB·T, H) (layers/bert_int8.c) */
            for (int p = 0; p < 3; p++) {
                int32_t *a = malloc((size_t)(AB * T * AH) * sizeof *a);
                for (int r = 0; r < AB * T; r++) memcpy(a + r * AH, c.acc + r * 3 * AH + p * AH, AH * sizeof *a);
                sums.acc[p] = a;
            }
            sums.ld = AH;
        }
        bq_infer_attention_fq(codes, &sums, c.mask, scratch, omp_get_max_threads(), scale, fq, sq, AB, T, T, NH, HD, NH * HD);
        for (int p = 0; p < 3 && !all; p++) free((void *)sums.acc[p]);
        Tally t = {0}, tin = {0}, ts = {0}, tc = {0};
        long rows_skipped = 0;
        const float fqk = fq[BQ_FQ_Q].s * fq[BQ_FQ_K].s, fpv = fq[BQ_FQ_PROBS].s * fq[BQ_FQ_V].s;
        for (int b = 0; b < AB; b++)
            for (int h = 0; h < NH; h++)
                for (int i = 0; i < T; i++) {
                    double s[16], p[16];
                    int pc[16], amb = 0;
                    for (int j = 0; j < T; j++) {
                        long sum = 0;
                        for (int e = 0; e < HD; e++)
                            sum += (long)ref_code(attn_in(&c, 0, b, i, h, e) * 16.0, -128, 127, &tin) *
                                   ref_code(attn_in(&c, 1, b, j, h, e) * 16.0, -128, 127, &tin);
                        s[j] = (double)sum * fqk; /* exact: a sum of at most 2^18 times 2^-8 */
                        if (all) {
                            ref_code(s[j] / fq[BQ_FQ_SCORES].s, -128, 127, &ts);
                            s[j] = fq_exact(s[j], fq[BQ_FQ_SCORES]);
                        }
                    }
                    softmax_ref(p, s, c.mask + b * T, T, scale);
                    Tally tp = {0};
                    /* margin 1e-3 code units: the fp32 softmax is within 1e-6 of the double one, 1.3e-4 codes */
                    for (int j = 0; j < T; j++)
                        amb |= (pc[j] = ref_code_m(p[j] / fq[BQ_FQ_PROBS].s, -128, 127, 1e-3, &tp)) == INT32_MIN;
                    if (amb) { /* a probability near a boundary: the whole row may move */
                        rows_skipped++;
                        t.skipped += HD;
                        continue;
                    }
                    for (int e = 0; e < HD; e++) {
                        long sum = 0;
                        for (int j = 0; j < T; j++)
                            sum += (long)pc[j] * ref_code(attn_in(&c, 2, b, j, h, e) * 16.0, -128, 127, &tin);
                        double cx = (double)(float)((double)sum * fpv); /* one fp32 rounding, as the kernel */
                        if (all) {
                            ref_code(cx / fq[BQ_FQ_CONTEXT].s, -128, 127, &tc);
                            cx = fq_exact(cx, fq[BQ_FQ_CONTEXT]);
                        }
                        check_code_exact(&t, codes[(b * T + i) * AH + h * HD + e], (float)(cx / sq));
                    }
                }
        const char *what = all ? "attention_fq (ort)" : "attention_fq (qdqbert, three GEMMs' sums)";
        report(what, portable, &t);
        printf("  %ld rows skipped; query/key/value codes saturated %ld high / %ld low", rows_skipped, tin.sat_hi,
               tin.sat_lo);
        if (all) printf(", scores %ld / %ld, context %ld / %ld", ts.sat_hi, ts.sat_lo, tc.sat_hi, tc.sat_lo);
        printf("\n");
        EXPECT(tin.sat_hi > 0 && tin.sat_lo > 0, "%s: the query/key/value quantizers do not saturate", what);
        if (all) EXPECT(ts.sat_hi > 0 && ts.sat_lo > 0 && tc.sat_hi > 0 && tc.sat_lo > 0,
                        "%s: the scores or context quantizers do not saturate both ends", what);
        free(codes);
        free(scratch);
        free(c.acc);
        free(c.mask);
    }
}

/* ---- random scales, within one code: the kernels at MiniLM's shapes ---- */

/* The uint8 code of v at scale s, ties to even (the default rounding mode). */
static int near_code(double v, double s) {
    double q = nearbyint(fmin(fmax(v / s, -128.0), 127.0));
    return (int)q + 128;
}

/* Compares n codes with reference values ref at scale s: counts codes off by one, fails on more. */
static void compare_codes(const char *what, const uint8_t *got, const double *ref, int64_t n, double s) {
    int64_t off1 = 0, worse = 0;
    for (int64_t i = 0; i < n; i++) {
        int d = abs((int)got[i] - near_code(ref[i], s));
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
    bq_infer_gelu_quant(codes, acc, comp, scale, bias, sg, M, I, I);
    for (int64_t i = 0; i < (int64_t)M * I; i++) {
        double x = ref_dequant(acc, comp, scale, bias, i, i % I);
        ref[i] = gelu_ref(x);
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
        double x[H];
        for (int n = 0; n < H; n++) x[n] = ref_dequant(acc, comp, scale, bias, m * H + n, n) + resid[m * H + n];
        ln_ref(ref + m * H, x, lnw, lnb, 1e-12, H);
        for (int n = 0; n < H; n++) maxe = fmax(maxe, fabs(ref[m * H + n] - out[m * H + n]));
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
    bq_infer_attention(codes, &sums, mask, scratch, nthr, sc, sq, B, T, T, NH, d, NH * d);
    double *ref = bq_malloc(sizeof(double) * (size_t)(M * H)), *p = bq_malloc(sizeof(double) * (size_t)T),
           *s = bq_malloc(sizeof(double) * (size_t)T);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < T; i++) {
                for (int64_t j = 0; j < T; j++) {
                    s[j] = 0.0;
                    for (int64_t e = 0; e < d; e++) {
                        int64_t cq = h * d + e, ck = H + h * d + e;
                        s[j] += ref_dequant(acc, comp, scale, bias, (b * T + i) * N + cq, cq) *
                                ref_dequant(acc, comp, scale, bias, (b * T + j) * N + ck, ck);
                    }
                }
                softmax_ref(p, s, mask + b * T, T, sc);
                for (int64_t e = 0; e < d; e++) {
                    double c = 0.0;
                    const int64_t cv = 2 * H + h * d + e;
                    for (int64_t j = 0; j < T; j++)
                        c += p[j] * ref_dequant(acc, comp, scale, bias, (b * T + j) * N + cv, cv);
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
        bq_infer_attention(one, &sb, mask + b * T, scratch, nthr, sc, sq, 1, T, T, NH, d, NH * d);
        alone_bad += memcmp(one, codes + b * T * H, (size_t)(T * H)) != 0;
    }
    /* the first block of query rows only (the [CLS]-only last layer): the same bits as those rows among all */
    const int64_t QB = BQ_INFER_QUERY_BLOCK;
    uint8_t *blk = bq_malloc((size_t)(B * QB * H));
    bq_infer_attention(blk, &sums, mask, scratch, nthr, sc, sq, B, T, QB, NH, d, NH * d);
    int block_bad = 0;
    for (int64_t b = 0; b < B; b++) block_bad += memcmp(blk + b * QB * H, codes + b * T * H, (size_t)(QB * H)) != 0;
    printf("%s: the first %lld query rows alone: %d sequences differ\n", what, (long long)QB, block_bad);
    EXPECT(block_bad == 0, "%s: the first query rows alone differ from those among all", what);
    free(blk);
    /* sequence 0 (every key kept) padded with 3 masked keys, in the fp32 attention (whose outputs show a
     * last-bit change that codes would hide): its rows must not change. The padded length may be a
     * multiple of 8 where T is not, which once sent the two through different softmax code. */
    const int64_t Tq = T + 3;
    float *qkv = bq_malloc(sizeof(float) * (size_t)(Tq * N)), *maskp = bq_malloc(sizeof(float) * (size_t)Tq);
    float *ca = bq_malloc(sizeof(float) * (size_t)(T * H)), *cp = bq_malloc(sizeof(float) * (size_t)(Tq * H));
    float *scratchp = NULL;
    for (int64_t i = 0; i < Tq * N; i++) qkv[i] = (float)(acc[i % (T * N)] - comp[i % N]) * scale[i % N];
    for (int64_t t = 0; t < Tq; t++) maskp[t] = t < T ? 1.0f : 0.0f;
    const size_t per_q = sizeof(float) * (size_t)bq_infer_attention_scratch(Tq, d);
    BQ_CHECK(posix_memalign((void **)&scratchp, 64, per_q * (size_t)nthr) == 0);
    bq_infer_attention_f32(ca, qkv, bias, maskp, scratchp, nthr, sc, 1, T, T, NH, d);
    bq_infer_attention_f32(cp, qkv, bias, maskp, scratchp, nthr, sc, 1, Tq, Tq, NH, d);
    const int pad_bad = memcmp(ca, cp, sizeof(float) * (size_t)(T * H)) != 0;
    printf("%s: sequence 0 in fp32, padded to %lld keys: %s\n", what, (long long)Tq, pad_bad ? "DIFFERS" : "same bits");
    EXPECT(pad_bad == 0, "%s depends on the padded length", what);
    bq_infer_attention_f32(cp, qkv, bias, maskp, scratchp, nthr, sc, 1, T, QB, NH, d);
    const int fblock_bad = memcmp(ca, cp, sizeof(float) * (size_t)(QB * H)) != 0;
    printf("%s: sequence 0 in fp32, its first %lld query rows alone: %s\n", what, (long long)QB,
           fblock_bad ? "DIFFER" : "same bits");
    EXPECT(fblock_bad == 0, "%s: the fp32 attention's first query rows alone differ", what);
    free(qkv), free(maskp), free(ca), free(cp), free(scratchp);
    int prev = bq_runtime_threads();
    bq_runtime_set_threads(1);
    uint8_t *t1 = bq_malloc((size_t)(M * H));
    bq_infer_attention(t1, &sums, mask, scratch, nthr, sc, sq, B, T, T, NH, d, NH * d);
    bq_runtime_set_threads(prev);
    const int thr_bad = memcmp(t1, codes, (size_t)(M * H)) != 0;
    printf("%s: %d sequences differ alone, 1 vs %d threads differ: %d\n", what, alone_bad, prev, thr_bad);
    EXPECT(alone_bad == 0 && thr_bad == 0, "%s depends on the batch or the thread count", what);
    free(acc), free(comp), free(scale), free(bias), free(mask), free(scratch), free(codes), free(one), free(ref);
    free(p), free(s), free(t1);
}

/* Runs f with the fastest kernels and with the AVX2 ones (BQ_INFER_AVX2=1) into a and b. */
#define BOTH_WAYS(a, b, call_into)                                                                                    \
    do {                                                                                                              \
        call_into(a);                                                                                                 \
        setenv("BQ_INFER_AVX2", "1", 1);                                                                              \
        call_into(b);                                                                                                 \
        unsetenv("BQ_INFER_AVX2");                                                                                    \
    } while (0)

/* Fake quant's GELU in fp32 (autograd/kernels.c, the portable kernels): erfc_pos and exp_fast of
 * autograd/fastmath.h in this file's arithmetic (-std=c11: no contraction). */
static float gelu_portable(float x) {
    const float h = 0.5f * erfc_pos(fabsf(x) * (float)M_SQRT1_2);
    return x * (x >= 0.0f ? 1.0f - h : h);
}

/* The largest float x in [0, 4] whose gelu_portable lies below b, by bisection over the float bits: the
 * input just below the code boundary b (the next float is at or above it). */
static float below_boundary(float b) {
    const float four = 4.0f;
    uint32_t lo = 0, hi;
    memcpy(&hi, &four, sizeof hi);
    while (hi - lo > 1) {
        const uint32_t mid = lo + (hi - lo) / 2;
        float x;
        memcpy(&x, &mid, sizeof x);
        if (gelu_portable(x) < b) lo = mid;
        else hi = mid;
    }
    float x;
    memcpy(&x, &lo, sizeof x);
    return x;
}

/* The fake-quant GELU kernel on inputs at code boundaries: column n's input is the last float whose GELU
 * lies below the boundary between codes k and k+1 (k = 1 + n mod 120, scale 1/64) or the first at or
 * above it (often on it: a tie, rounded to even), so a GELU one unit in the last place off gives the
 * other code. The kernel must give the code of gelu_portable exactly; the AVX-512 kernel must give the
 * AVX2 (portable) kernel's bytes. */
static int gelu_fq_boundaries(void) {
    const int64_t M = 2, N = 1536;
    const float sq = 1.0f / 64.0f;
    int32_t *acc = bq_calloc((size_t)(M * N), sizeof(int32_t)), *comp = bq_calloc((size_t)N, sizeof(int32_t));
    float *scale = bq_malloc(sizeof(float) * (size_t)N), *bias = bq_malloc(sizeof(float) * (size_t)N);
    uint8_t *ca = bq_malloc((size_t)(M * N)), *cb = bq_malloc((size_t)(M * N));
    for (int64_t n = 0; n < N; n++) {
        const float x = below_boundary(((float)(1 + n % 120) + 0.5f) * sq);
        scale[n] = 1.0f;
        bias[n] = n % 2 ? nextafterf(x, INFINITY) : x; /* the input is (0 - 0)·1 + bias */
    }
#define GELU_B(c) gelu_fq_quant(c, acc, comp, scale, bias, FQ_NONE, FQ_NONE, sq, M, N)
    BOTH_WAYS(ca, cb, GELU_B);
    int wrong = 0;
    for (int64_t i = 0; i < M * N; i++) wrong += cb[i] != 128 + (int)nearbyintf(gelu_portable(bias[i % N]) / sq);
    const int differ = memcmp(ca, cb, (size_t)(M * N)) != 0;
    printf("fake-quant GELU at %lld code boundaries: %d wrong codes (AVX2/portable), AVX-512 vs AVX2 %s\n",
           (long long)(M * N), wrong, differ ? "DIFFER" : "same bytes");
    EXPECT(wrong == 0, "the fake-quant GELU kernel misses %d code boundaries", wrong);
    free(acc), free(comp), free(scale), free(bias), free(ca), free(cb);
    return differ;
}

/* The GELU codes of the integer engine (bq_infer_gelu_quant) at code boundaries: 97 windows of 16
 * consecutive floats around the inputs whose GELU crosses (k + 1/2)·sq, k = 1..97, sq = 1/64, so that
 * within a window the code changes by one (1,552 columns: the AVX-512 kernel's blocks of 64 and one of
 * 16). The AVX-512 and AVX2 kernels answer most inputs by the fast erf and fall back to the exact GELU
 * near a boundary; both must give the bytes of the exact kernel (BQ_INFER_GELU_EXACT=1), and the fast
 * path's error bound must hold for every float input, in each kernel the CPU has
 * (bq_infer_gelu_fast_check, all 2³² of them). */
static int gelu_quant_boundaries(void) {
    const int64_t M = 1, N = 1552;
    const float sq = 1.0f / 64.0f;
    int32_t *acc = bq_calloc((size_t)(M * N), sizeof(int32_t)), *comp = bq_calloc((size_t)N, sizeof(int32_t));
    float *scale = bq_malloc(sizeof(float) * (size_t)N), *bias = bq_malloc(sizeof(float) * (size_t)N);
    uint8_t *ca = bq_malloc((size_t)(M * N)), *cb = bq_malloc((size_t)(M * N)), *cx = bq_malloc((size_t)(M * N));
    for (int64_t w = 0; w < N / 16; w++) {
        float x = below_boundary(((float)(1 + w) + 0.5f) * sq);
        for (int i = 0; i < 8; i++) x = nextafterf(x, -INFINITY);
        for (int i = 0; i < 16; i++, x = nextafterf(x, INFINITY)) scale[16 * w + i] = 1.0f, bias[16 * w + i] = x;
    }
#define GELU_QB(c) bq_infer_gelu_quant(c, acc, comp, scale, bias, sq, M, N, N)
    BOTH_WAYS(ca, cb, GELU_QB);
    setenv("BQ_INFER_GELU_EXACT", "1", 1); /* the exact codes, by the AVX2 kernel (AVX-512's are its bytes) */
    setenv("BQ_INFER_AVX2", "1", 1);
    GELU_QB(cx);
    unsetenv("BQ_INFER_AVX2");
    unsetenv("BQ_INFER_GELU_EXACT");
    int crossed = 0;
    for (int64_t w = 0; w < N / 16; w++) crossed += cx[16 * w] != cx[16 * w + 15];
    const int differ = memcmp(ca, cx, (size_t)(M * N)) != 0 || memcmp(cb, cx, (size_t)(M * N)) != 0;
    double worst = bq_infer_gelu_fast_check(BQ_GELU_FAST_ABS, BQ_GELU_FAST_REL);
    if (strcmp(bq_infer_isa(), "AVX-512") == 0) { /* the AVX2 kernel's fast path too */
        setenv("BQ_INFER_AVX2", "1", 1);
        const double w2 = bq_infer_gelu_fast_check(BQ_GELU_FAST_ABS, BQ_GELU_FAST_REL);
        unsetenv("BQ_INFER_AVX2");
        worst = w2 > worst ? w2 : worst;
    }
    printf("GELU codes at %d of %lld windows that cross a code boundary: fast paths (%s, AVX2) vs exact %s; "
           "their bound over all 2^32 floats: %s %.3f of it\n",
           crossed, (long long)(N / 16), bq_infer_isa(), differ ? "DIFFER" : "same bytes",
           worst < 0 ? "not checked (no AVX2)," : "at most", worst < 0 ? 0.0 : worst);
    EXPECT(crossed >= 90, "only %d of 97 GELU windows cross a code boundary", crossed);
    EXPECT(worst <= 1.0, "the fast GELU exceeds its error bound (%.3f of it)", worst);
    free(acc), free(comp), free(scale), free(bias), free(ca), free(cb), free(cx);
    return differ;
}

/* The fake-quant GELU codes by their shortcuts against the direct computation (BQ_INFER_GELU_EXACT=1): with
 * an input quantizer (the ort scheme), whose codes the kernels look up in a table of fin's codes, on inputs
 * that take every code of fin and saturate it at both ends, fout saturating; and without quantizers
 * (qdqbert), where the AVX-512 kernel decides most codes by the fast GELU; a NaN column in both; in each
 * kernel set the CPU has. */
static int gelu_fq_table_bytes(void) {
    const int64_t M = 64, N = 1536;
    int32_t *acc = bq_malloc(sizeof(int32_t) * (size_t)(M * N)), *comp = bq_calloc((size_t)N, sizeof(int32_t));
    float *scale = bq_malloc(sizeof(float) * (size_t)N), *bias = bq_calloc((size_t)N, sizeof(float));
    uint8_t *ct = bq_malloc((size_t)(M * N)), *cx = bq_malloc((size_t)(M * N));
    for (int64_t i = 0; i < M * N; i++) acc[i] = (int32_t)(i % 18001) - 9000; /* x in [-8.79, 8.79] */
    for (int64_t n = 0; n < N; n++) scale[n] = 1.0f / 1024.0f;
    scale[5] = NAN;
    int differ = 0;
    for (int withfq = 1; withfq >= 0; withfq--) {
        const BqFq fin = withfq ? fq8(1.0f / 16.0f) : FQ_NONE, fout = withfq ? fq8(1.0f / 48.0f) : FQ_NONE;
        const float sq = withfq ? 0.02f : 0.004f;
        int d = 0;
        for (int isa = 0; isa < 3; isa++) { /* this CPU's fastest kernels, AVX2, portable */
            if (isa == 1) setenv("BQ_INFER_AVX2", "1", 1);
            if (isa == 2) setenv("BQ_INFER_PORTABLE", "1", 1);
            gelu_fq_quant(ct, acc, comp, scale, bias, fin, fout, sq, M, N);
            setenv("BQ_INFER_GELU_EXACT", "1", 1);
            gelu_fq_quant(cx, acc, comp, scale, bias, fin, fout, sq, M, N);
            unsetenv("BQ_INFER_GELU_EXACT");
            unsetenv("BQ_INFER_AVX2");
            unsetenv("BQ_INFER_PORTABLE");
            d += memcmp(ct, cx, (size_t)(M * N)) != 0;
        }
        int lo = 255, hi = 0;
        for (int64_t i = 0; i < M * N; i++) lo = ct[i] < lo ? ct[i] : lo, hi = ct[i] > hi ? ct[i] : hi;
        printf("fake-quant GELU codes %s vs computed (%lld values, codes %d..%d, 3 kernel sets): %s\n",
               withfq ? "by fin's table" : "without quantizers, fast path", (long long)(M * N), lo, hi,
               d ? "DIFFER" : "same bytes");
        EXPECT(ct[5] == 128 && hi == 255, "the GELU shortcut test misses NaN (%d) or saturation (%d)", ct[5], hi);
        differ += d;
    }
    free(acc), free(comp), free(scale), free(bias), free(ct), free(cx);
    return differ;
}

/* The AVX-512 kernels against the AVX2 ones, bit for bit (autograd/infer_kernels.h): GELU with its codes
 * and in fp32 on accumulators from the most negative to the most positive GELU inputs (NaN included), the
 * attention as codes, in fp32 and with fake quantizers, at head sizes 32 and 64, with padding masks and
 * sequence lengths that are and are not multiples of 16. On a CPU without AVX-512 both runs are the AVX2
 * kernels, which the test says. */
static void check_avx512_bits(BqRng *rng) {
    printf("fused kernels on this CPU: %s\n", bq_infer_isa());
    int bad = gelu_fq_boundaries() + gelu_quant_boundaries() + gelu_fq_table_bytes();
    if (strcmp(bq_infer_isa(), "AVX-512") != 0) {
        printf("AVX-512 vs AVX2: not compared (no AVX-512 on this CPU; the AVX2 and portable kernels ran above)\n");
        return;
    }
    const int64_t M = 96, N = 1536;
    int32_t *acc = bq_malloc(sizeof(int32_t) * (size_t)(M * N)), *comp = bq_malloc(sizeof(int32_t) * (size_t)N);
    float *scale = bq_malloc(sizeof(float) * (size_t)N), *bias = bq_malloc(sizeof(float) * (size_t)N);
    fill_acc(acc, comp, scale, bias, M, N, 12.0f, rng);
    scale[5] = NAN;                                   /* a NaN column */
    bias[7] = 200.0f, bias[9] = -200.0f, bias[11] = -30.0f; /* GELU's saturated ends and exp's underflow */
    uint8_t *ca = bq_malloc((size_t)(M * N)), *cb = bq_malloc((size_t)(M * N));
    float *fa = bq_malloc(sizeof(float) * (size_t)(M * N)), *fb = bq_malloc(sizeof(float) * (size_t)(M * N));
#define GELU_Q(c) bq_infer_gelu_quant(c, acc, comp, scale, bias, 4.0f / 127.0f, M, N, N)
    BOTH_WAYS(ca, cb, GELU_Q);
    bad += memcmp(ca, cb, (size_t)(M * N)) != 0;
    for (int64_t i = 0; i < M * N; i++) fa[i] = (float)(acc[i] - comp[i % N]) * scale[i % N];
    memcpy(fb, fa, sizeof(float) * (size_t)(M * N));
#define GELU_F(x) bq_infer_bias_gelu_f32(x, bias, M, N)
    BOTH_WAYS(fa, fb, GELU_F);
    bad += memcmp(fa, fb, sizeof(float) * (size_t)(M * N)) != 0;
    for (int k = 0; k < 2; k++) { /* with and without an input quantizer */
        const BqFq fin = k ? fq8(1.0f / 8.0f) : FQ_NONE, fout = fq8(1.0f / 32.0f);
#define GELU_FQ(c) gelu_fq_quant(c, acc, comp, scale, bias, fin, fout, 4.0f / 127.0f, M, N)
        BOTH_WAYS(ca, cb, GELU_FQ);
        bad += memcmp(ca, cb, (size_t)(M * N)) != 0;
    }
    printf("AVX-512 vs AVX2, GELU codes, fp32 GELU and fake-quant GELU codes (%lld values each): %s\n",
           (long long)(M * N), bad ? "DIFFER" : "same bits");
    EXPECT(bad == 0, "the AVX-512 GELU kernels differ from the AVX2 ones");
    {
        const int64_t LN = 384, LM = M * N / LN - 1; /* 383 rows: groups of four and a tail of three */
        scale[5] = scale[4], bias[7] = bias[9] = bias[11] = 0.0f; /* no NaN row; LayerNorm saturates anyway */
        float *resid = bq_malloc(sizeof(float) * (size_t)(LM * LN)), *w = bq_malloc(sizeof(float) * (size_t)LN);
        float *lb = bq_malloc(sizeof(float) * (size_t)LN);
        for (int64_t i = 0; i < LM * LN; i++) resid[i] = 0.5f * bq_rng_normal(rng);
        for (int64_t i = 0; i < LN; i++) w[i] = 1.0f + 0.2f * bq_rng_normal(rng), lb[i] = 0.1f * bq_rng_normal(rng);
#define LN_Q(c) bq_infer_residual_layernorm(c == ca ? fa : fb, c, acc, comp, scale, bias, resid, w, lb, 1e-12f, \
                                            3.0f / 127.0f, LM, LN)
        BOTH_WAYS(ca, cb, LN_Q);
        int lbad = memcmp(ca, cb, (size_t)(LM * LN)) != 0 || memcmp(fa, fb, sizeof(float) * (size_t)(LM * LN));
        int fbad = 0;
        for (int k = 0; k < 3; k++) { /* every place quantized, none, and the ort scheme's three */
            BqFq f[4];
            for (int i = 0; i < 4; i++) f[i] = k == 1 || (k == 2 && i == BQ_FQ_SKIP) ? FQ_NONE : fq8(1.0f / (8 << i));
#define LN_FQ(c) bq_infer_residual_layernorm_fq(c == ca ? fa : fb, c, acc, comp, scale, bias, resid, f, w, lb, 1e-12f, \
                                                3.0f / 127.0f, LM, LN)
            BOTH_WAYS(ca, cb, LN_FQ);
            fbad += memcmp(ca, cb, (size_t)(LM * LN)) != 0 || memcmp(fa, fb, sizeof(float) * (size_t)(LM * LN));
        }
        lbad += fbad;
        printf("AVX-512 vs AVX2, residual + LayerNorm + codes, plain and with fake quantizers (%lld rows): %s\n",
               (long long)LM, lbad ? "DIFFER" : "same bits");
        EXPECT(lbad == 0, "the AVX-512 residual LayerNorm differs from the AVX2 one");
        /* the AVX-512 kernels written over their residual (the int8 engine's layers): the same bits; fa, ca
         * hold the last call's (every place quantized but the skip input) */
        BqFq f[4];
        for (int i = 0; i < 4; i++) f[i] = i == BQ_FQ_SKIP ? FQ_NONE : fq8(1.0f / (8 << i));
        memcpy(fb, resid, sizeof(float) * (size_t)(LM * LN));
        bq_infer_residual_layernorm_fq(fb, cb, acc, comp, scale, bias, fb, f, w, lb, 1e-12f, 3.0f / 127.0f, LM, LN);
        int ibad = memcmp(ca, cb, (size_t)(LM * LN)) != 0 || memcmp(fa, fb, sizeof(float) * (size_t)(LM * LN));
        LN_Q(ca);
        memcpy(fb, resid, sizeof(float) * (size_t)(LM * LN));
        bq_infer_residual_layernorm(fb, cb, acc, comp, scale, bias, fb, w, lb, 1e-12f, 3.0f / 127.0f, LM, LN);
        ibad += memcmp(ca, cb, (size_t)(LM * LN)) != 0 || memcmp(fa, fb, sizeof(float) * (size_t)(LM * LN));
        printf("AVX-512 residual + LayerNorm written over its residual, plain and with fake quantizers: %s\n",
               ibad ? "DIFFER" : "same bits");
        EXPECT(ibad == 0, "the AVX-512 residual LayerNorm written over its residual differs");
        free(resid), free(w), free(lb);
    }
    static const int64_t shapes[][4] = {{2, 128, 12, 32}, {2, 64, 4, 64}, {3, 40, 2, 32}};
    for (int k = 0; k < 3; k++) {
        const int64_t B = shapes[k][0], T = shapes[k][1], NH = shapes[k][2], d = shapes[k][3], H = NH * d;
        const int64_t nthr = omp_get_max_threads(), per = bq_infer_attention_scratch(T, d);
        int32_t *qa = bq_malloc(sizeof(int32_t) * (size_t)(B * T * 3 * H));
        int32_t *qc = bq_malloc(sizeof(int32_t) * (size_t)(3 * H));
        float *qs = bq_malloc(sizeof(float) * (size_t)(3 * H)), *qb = bq_malloc(sizeof(float) * (size_t)(3 * H));
        float *mask = bq_malloc(sizeof(float) * (size_t)(B * T)), *scratch = NULL;
        BQ_CHECK(posix_memalign((void **)&scratch, 64, sizeof(float) * (size_t)(nthr * per)) == 0);
        fill_acc(qa, qc, qs, qb, B * T, 3 * H, 3.0f, rng);
        for (int64_t i = 0; i < B * T; i++) mask[i] = i % T < T - 7 * (i / T) ? 1.0f : 0.0f;
        const BqQkvSums sums = bq_qkv_sums_fused(qa, qc, qs, qb, H);
        const float sc = 1.0f / sqrtf((float)d), sq = 1.5f / 127.0f;
        BqFq fq[BQ_FQ_ATTN];
        fq[BQ_FQ_Q] = fq[BQ_FQ_K] = fq[BQ_FQ_V] = fq8(1.0f / 16.0f);
        fq[BQ_FQ_SCORES] = fq8(0.25f);
        fq[BQ_FQ_PROBS] = fq8(1.0f / 127.0f);
        fq[BQ_FQ_CONTEXT] = fq8(1.0f / 32.0f);
        float *qkv = bq_malloc(sizeof(float) * (size_t)(B * T * 3 * H));
        for (int64_t i = 0; i < B * T * 3 * H; i++) qkv[i] = (float)(qa[i] - qc[i % (3 * H)]) * qs[i % (3 * H)];
#define ATT_Q(c) bq_infer_attention(c, &sums, mask, scratch, nthr, sc, sq, B, T, T, NH, d, NH * d)
#define ATT_FQ(c) bq_infer_attention_fq(c, &sums, mask, scratch, nthr, sc, fq, sq, B, T, T, NH, d, NH * d)
#define ATT_F(f) bq_infer_attention_f32(f, qkv, qb, mask, scratch, nthr, sc, B, T, T, NH, d)
        BOTH_WAYS(ca, cb, ATT_Q);
        int qbad = memcmp(ca, cb, (size_t)(B * T * H)) != 0;
        BOTH_WAYS(ca, cb, ATT_FQ);
        int fqbad = memcmp(ca, cb, (size_t)(B * T * H)) != 0;
        /* the first block of query rows alone, both ways (VNNI products on the fastest where T % 16 == 0):
         * the same bits as those rows among all */
        const int64_t QB = BQ_INFER_QUERY_BLOCK;
        uint8_t *ba = (uint8_t *)fa, *bb = (uint8_t *)fb;
#define ATT_FQ_BLOCK(c) bq_infer_attention_fq(c, &sums, mask, scratch, nthr, sc, fq, sq, B, T, QB, NH, d, NH * d)
        BOTH_WAYS(ba, bb, ATT_FQ_BLOCK);
        int blockbad = 0;
        for (int64_t b = 0; b < B; b++)
            blockbad += memcmp(ba + b * QB * H, ca + b * T * H, (size_t)(QB * H)) != 0 ||
                        memcmp(bb + b * QB * H, cb + b * T * H, (size_t)(QB * H)) != 0;
        printf("fake-quant attention B=%lld T=%lld: the first %lld query rows alone: %d sequences differ\n", (long long)B,
               (long long)T, (long long)QB, blockbad);
        EXPECT(blockbad == 0, "the fake-quant attention's first query rows alone differ from those among all");
        BOTH_WAYS(fa, fb, ATT_F);
        int fbad = memcmp(fa, fb, sizeof(float) * (size_t)(B * T * H)) != 0;
        printf("AVX-512 vs AVX2, attention B=%lld T=%lld NH=%lld d=%lld: codes %s, fake quant %s%s, fp32 %s\n",
               (long long)B, (long long)T, (long long)NH, (long long)d, qbad ? "DIFFER" : "same",
               fqbad ? "DIFFER" : "same", bq_infer_vnni() && T % 16 == 0 ? " (VNNI products)" : "",
               fbad ? "DIFFER" : "same");
        EXPECT(qbad + fqbad + fbad == 0, "the AVX-512 attention differs from the AVX2 one");
        free(qa), free(qc), free(qs), free(qb), free(mask), free(scratch), free(qkv);
    }
    free(acc), free(comp), free(scale), free(bias), free(ca), free(cb), free(fa), free(fb);
}

int main(void) {
    bq_runtime_set_threads(2);
    /* mode 0: the fastest kernels of this CPU, 1: AVX2 (where it has AVX-512), 2: portable */
    for (int mode = 0; mode < 3; mode++) {
        const int portable = mode == 2;
        if (mode == 1 && strcmp(bq_infer_isa(), "AVX-512") != 0) continue;
        if (mode == 1) setenv("BQ_INFER_AVX2", "1", 1);
        if (portable) setenv("BQ_INFER_PORTABLE", "1", 1);
        printf("-- kernels: %s\n", bq_infer_isa());
        BqRng rng;
        bq_rng_seed(&rng, 11);
        check_gelu(&rng, portable);
        check_residual_layernorm(&rng, portable);
        check_attention(&rng, portable);
        check_attention_fq(&rng, portable);
        check_infer_epilogues(&rng);
        check_infer_attention(3, 37, 2, 16, &rng);
        check_infer_attention(2, 128, 12, 32, &rng);
        unsetenv("BQ_INFER_AVX2");
    }
    unsetenv("BQ_INFER_PORTABLE");
    BqRng rng;
    bq_rng_seed(&rng, 12);
    check_avx512_bits(&rng);
    if (fails) printf("%d check(s) FAILED\n", fails);
    else printf("all fused-kernel checks passed\n");
    return fails ? 1 : 0;
}
