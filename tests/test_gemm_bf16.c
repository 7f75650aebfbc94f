/* The GEMM entry point (autograd/gemm.h) in bf16 and fp32.
 *
 * 1. bq_bf16_round: ties to even, carries into the exponent, ±0, subnormals, Inf, NaN, overflow to Inf;
 *    bq_bf16_words (the vectorized conversion of the bf16 products and forwards) gives bq_bf16_bits's
 *    word for those values, for NaNs with payloads in either half, and for 2^20 random bit patterns.
 * 2. Every transpose pair, beta 0 and 1, leading dimensions wider than the operands (the attention's head
 *    views), at the shapes of a training step (the Linears' forward (N,C)·(OC,C)ᵀ, their two backward
 *    GEMMs, the attention's four products) scaled down: each element of the bf16 result against a double
 *    reference of the bf16-rounded operands, within the bound of K exact products summed in fp32 in any
 *    order, |err| <= γ(K+1)·(Σ|a·b| + |c0|) with γ(n) = n·u/(1 − n·u), u = 2^-24 (a bf16·bf16 product
 *    has at most 16 significant bits, so it is exact in fp32; only the sums round). The bf16 result must
 *    also differ from the fp32 GEMM beyond that bound somewhere (the operands really were rounded), and
 *    the fp32 result must meet the same bound against a double reference of the unrounded operands.
 * 3. 1 and 2 threads give identical bits for the attention's per-head products (run on one thread per
 *    call, whatever the count); the Linears' GEMMs are threaded inside the call and, as in fp32, their
 *    last bits follow OpenBLAS's (or oneDNN's) split by the thread count: printed, not required.
 * 4. On a CPU with bf16 units the oneDNN path runs too, within the same bound of the same reference,
 *    so the two paths agree up to the order of their fp32 sums.
 * Prints the path(s) exercised and the worst error as a fraction of its bound. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "autograd/gemm.h"
#include "tests/test_util.h"

static double worst_ratio;

static void check_round(void) {
    struct {
        uint32_t in, out;
    } cases[] = {
        {0x3f800000u, 0x3f800000u}, /* 1 */
        {0x3f808000u, 0x3f800000u}, /* 1 + 2^-8: a tie, to even (down) */
        {0x3f818000u, 0x3f820000u}, /* 1 + 3·2^-8: a tie, to even (up) */
        {0x3f808001u, 0x3f810000u}, /* just above the tie: up */
        {0x3f807fffu, 0x3f800000u}, /* just below: down */
        {0xbf818000u, 0xbf820000u}, /* negative tie, up in magnitude */
        {0x3fffffffu, 0x40000000u}, /* carries into the exponent */
        {0x00000000u, 0x00000000u}, /* +0 */
        {0x80000000u, 0x80000000u}, /* -0 */
        {0x00008000u, 0x00000000u}, /* subnormal tie to even (0) */
        {0x00018000u, 0x00020000u}, /* subnormal tie to even (up) */
        {0x7f800000u, 0x7f800000u}, /* +Inf */
        {0xff800000u, 0xff800000u}, /* -Inf */
        {0x7f7fffffu, 0x7f800000u}, /* FLT_MAX rounds past the largest bf16: Inf */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        union {
            float f;
            uint32_t u;
        } a = {.u = cases[i].in}, r;
        r.f = bq_bf16_round(a.f);
        EXPECT(r.u == cases[i].out, "bf16 round of 0x%08x: 0x%08x, want 0x%08x", cases[i].in, r.u, cases[i].out);
    }
    union {
        float f;
        uint32_t u;
    } nan = {.u = 0x7f800001u}, r; /* a NaN whose payload is all in the low half */
    r.f = bq_bf16_round(nan.f);
    EXPECT(isnan(r.f) && (r.u & 0xffffu) == 0, "NaN stays NaN: 0x%08x", r.u);

    /* bq_bf16_words against bq_bf16_bits, element by element */
    enum { NR = 1 << 20, NC = sizeof cases / sizeof cases[0] };
    static const uint32_t nans[4] = {0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fa00000u};
    uint32_t *in = bq_malloc(sizeof(uint32_t) * (NR + NC + 4));
    uint16_t *out = bq_malloc(sizeof(uint16_t) * (NR + NC + 4));
    BqRng rng;
    bq_rng_seed(&rng, 9);
    for (int i = 0; i < NC; i++) in[i] = cases[i].in;
    for (int i = 0; i < 4; i++) in[NC + i] = nans[i];
    for (int i = 0; i < NR; i++) in[NC + 4 + i] = (uint32_t)bq_rng_u64(&rng);
    bq_bf16_words(out, (const float *)in, NR + NC + 4);
    int64_t bad = 0;
    for (int i = 0; i < NR + NC + 4; i++) {
        float f;
        memcpy(&f, &in[i], sizeof f);
        if (out[i] != bq_bf16_bits(f) && bad++ < 5)
            printf("bq_bf16_words of 0x%08x: 0x%04x, bq_bf16_bits 0x%04x\n", in[i], out[i], bq_bf16_bits(f));
    }
    EXPECT(bad == 0, "bq_bf16_words differs from bq_bf16_bits on %lld of %d values", (long long)bad, NR + NC + 4);
    printf("bq_bf16_words: %d values (specials, NaNs, random bit patterns), %lld differ from bq_bf16_bits\n",
           NR + NC + 4, (long long)bad);
    free(in);
    free(out);
}

static void fill(float *x, int64_t n, BqRng *rng) {
    for (int64_t i = 0; i < n; i++) x[i] = (float)(bq_rng_uniform(rng) * 2.0 - 1.0) * (i % 7 == 0 ? 8.0f : 1.0f);
}

/* op(X)[i][j] for X stored with leading dimension ld. */
static double at(const float *X, int trans, int64_t ld, int64_t i, int64_t j, int round) {
    float v = trans ? X[j * ld + i] : X[i * ld + j];
    return round ? (double)bq_bf16_round(v) : (double)v;
}

/* Compares C (after bq_gemm) against the reference of A, B, C0 with operands rounded (bf16) or not.
 * Returns the number of elements beyond the bound; *beyond_fp32 counts elements of C farther from fp32
 * reference than its bound (used to show bf16 rounding happened). */
static int64_t compare(const char *what, const float *C, const float *C0, const float *A, const float *B, int ta,
                       int tb, int64_t M, int64_t N, int64_t K, int64_t lda, int64_t ldb, int64_t ldc, float beta,
                       int round, int64_t *beyond_other) {
    const double u = ldexp(1.0, -24), g = (double)(K + 1) * u / (1.0 - (double)(K + 1) * u);
    int64_t bad = 0, other = 0;
    for (int64_t i = 0; i < M; i++)
        for (int64_t j = 0; j < N; j++) {
            double ref = beta ? C0[i * ldc + j] : 0.0, mag = fabs(ref), ref2 = ref, mag2 = mag;
            for (int64_t k = 0; k < K; k++) {
                double p = at(A, ta, lda, i, k, round) * at(B, tb, ldb, k, j, round);
                double p2 = at(A, ta, lda, i, k, !round) * at(B, tb, ldb, k, j, !round);
                ref += p, mag += fabs(p), ref2 += p2, mag2 += fabs(p2);
            }
            double err = fabs((double)C[i * ldc + j] - ref), bound = g * mag;
            if (bound > 0 && err / bound > worst_ratio) worst_ratio = err / bound;
            if (err > bound) {
                if (bad < 3)
                    fprintf(stderr, "  %s (%lld,%lld): %.9g vs %.9g, err %.3g > bound %.3g\n", what, (long long)i,
                            (long long)j, C[i * ldc + j], ref, err, bound);
                bad++;
            }
            other += fabs((double)C[i * ldc + j] - ref2) > g * mag2;
        }
    if (beyond_other) *beyond_other = other;
    return bad;
}

typedef struct Shape {
    const char *name;
    int ta, tb;
    int64_t M, N, K, lda_pad, ldb_pad, ldc_pad;
} Shape;

/* One shape in one precision and beta; the C buffer starts from c0 (beta 1 accumulates into it). */
static void run_shape(const Shape *s, BqPrecision prec, float beta, BqRng *rng, const char *path) {
    const int64_t ar = s->ta ? s->K : s->M, ac = s->ta ? s->M : s->K, br = s->tb ? s->N : s->K,
                  bc = s->tb ? s->K : s->N;
    const int64_t lda = ac + s->lda_pad, ldb = bc + s->ldb_pad, ldc = s->N + s->ldc_pad;
    float *A = bq_malloc(sizeof(float) * (size_t)(ar * lda)), *B = bq_malloc(sizeof(float) * (size_t)(br * ldb));
    float *C0 = bq_malloc(sizeof(float) * (size_t)(s->M * ldc)), *C = bq_malloc(sizeof(float) * (size_t)(s->M * ldc));
    fill(A, ar * lda, rng), fill(B, br * ldb, rng), fill(C0, s->M * ldc, rng);
    memcpy(C, C0, sizeof(float) * (size_t)(s->M * ldc));
    bq_gemm(prec, s->ta, s->tb, s->M, s->N, s->K, A, lda, B, ldb, beta, C, ldc);
    char what[160];
    snprintf(what, sizeof what, "%s %s %s beta %g", s->name, bq_precision_name(prec), path, beta);
    int64_t other = 0;
    int round = prec == BQ_PRECISION_BF16;
    int64_t bad = compare(what, C, C0, A, B, s->ta, s->tb, s->M, s->N, s->K, lda, ldb, ldc, beta, round, &other);
    EXPECT(bad == 0, "%s: %lld of %lld elements beyond the bound", what, (long long)bad, (long long)(s->M * s->N));
    if (round) /* bf16 really rounded: some elements are farther from the unrounded product than fp32 allows */
        EXPECT(other > 0, "%s: equals the fp32 GEMM everywhere (operands not rounded?)", what);
    /* the padding columns of C are untouched */
    for (int64_t i = 0; i < s->M; i++)
        for (int64_t j = s->N; j < ldc; j++)
            EXPECT(C[i * ldc + j] == C0[i * ldc + j], "%s: wrote C[%lld][%lld] past N", what, (long long)i, (long long)j);
    /* 1 and 2 threads: the same bits for the attention's products, printed for the Linears' */
    float *C1 = bq_malloc(sizeof(float) * (size_t)(s->M * ldc));
    bq_runtime_set_threads(1);
    memcpy(C1, C0, sizeof(float) * (size_t)(s->M * ldc));
    bq_gemm(prec, s->ta, s->tb, s->M, s->N, s->K, A, lda, B, ldb, beta, C1, ldc);
    bq_runtime_set_threads(2);
    int same = !memcmp(C, C1, sizeof(float) * (size_t)(s->M * ldc));
    if (!strncmp(s->name, "attn", 4))
        EXPECT(same, "%s: 1 and 2 threads differ", what);
    else if (!same && beta == 0.0f)
        printf("  %s: 1 and 2 threads differ in the last bits (the library's split by thread count)\n", what);
    free(A), free(B), free(C0), free(C), free(C1);
}

int main(void) {
    bq_runtime_set_threads(2);
    check_round();
    /* The step's products at reduced sizes: Linear forward x·Wᵀ, backward dY·W and dYᵀ·X; the attention's
     * Q·Kᵀ, P·V, dS·K, dSᵀ·Q, dC·Vᵀ, Pᵀ·dC on head views (rows H apart: padded leading dimensions). */
    const Shape shapes[] = {
        {"linear fwd x.W^T", 0, 1, 96, 40, 72, 0, 0, 0},
        {"linear bwd dY.W", 0, 0, 96, 72, 40, 0, 0, 0},
        {"linear bwd dY^T.X", 1, 0, 40, 72, 96, 0, 0, 0},
        {"linear K=1536", 0, 1, 8, 24, 1536, 0, 0, 0},
        {"attn Q.K^T (heads)", 0, 1, 17, 17, 16, 32, 32, 0},
        {"attn P.V", 0, 0, 17, 16, 17, 0, 32, 32},
        {"attn dS.K", 0, 0, 17, 16, 17, 0, 32, 32},
        {"attn dS^T.Q", 1, 0, 17, 16, 17, 0, 32, 32},
        {"attn dC.V^T", 0, 1, 17, 17, 16, 32, 32, 0},
        {"attn P^T.dC", 1, 0, 17, 16, 17, 0, 32, 32},
        {"both transposed", 1, 1, 33, 29, 31, 3, 5, 7},
    };
    const int ns = (int)(sizeof shapes / sizeof shapes[0]);
    const BqBf16Path native = bq_gemm_bf16_path();
    printf("%s\n", bq_gemm_bf16_describe());
    BqRng rng;
    bq_rng_seed(&rng, 11);
    for (int pass = 0; pass < (native == BQ_BF16_ONEDNN ? 2 : 1); pass++) {
        BqBf16Path path = pass == 0 ? BQ_BF16_EMULATED : BQ_BF16_ONEDNN;
        EXPECT(bq_gemm_bf16_force(path) == BQ_OK, "force path %d", (int)path);
        const char *name = path == BQ_BF16_ONEDNN ? "oneDNN" : "emulated";
        worst_ratio = 0;
        for (int i = 0; i < ns; i++)
            for (int b = 0; b < 2; b++) run_shape(&shapes[i], BQ_PRECISION_BF16, (float)b, &rng, name);
        printf("bf16 %-8s: %d shapes x beta 0/1, worst error %.3f of its bound\n", name, ns, worst_ratio);
    }
    EXPECT(bq_gemm_bf16_force(native) == BQ_OK, "restore path");
    if (native != BQ_BF16_ONEDNN)
        printf("oneDNN bf16 path not exercised: this CPU has neither AVX512-BF16 nor AMX-BF16\n");
    worst_ratio = 0;
    for (int i = 0; i < ns; i++)
        for (int b = 0; b < 2; b++) run_shape(&shapes[i], BQ_PRECISION_FP32, (float)b, &rng, "OpenBLAS");
    printf("fp32 OpenBLAS: worst error %.3f of its bound\n", worst_ratio);
    printf("test_gemm_bf16: %s\n", fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
