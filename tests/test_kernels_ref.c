/* The fast kernels of autograd/kernels.c (sgemm with leading dimensions, OpenMP loops, column-block
 * reductions) against plain reference loops in double, at shapes large enough that the parallel paths
 * run; and bit-identical results of the OpenMP kernels (dropout mask included) for 1 and 2 threads.
 * Prints the max relative error. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "autograd/kernels.h"

static int fails = 0;
static double max_err = 0.0;

static float *rnd(int64_t n, uint64_t seed, float lo, float hi) {
    float *v = bq_malloc((size_t)n * sizeof(float));
    BqRng r;
    bq_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * (float)bq_rng_uniform(&r);
    return v;
}

/* |got − want| <= 1e-4·(scale + |want|); scale is the typical magnitude of the terms summed. */
static void cmp(const char *what, const float *got, const double *want, int64_t n, double scale) {
    double worst = 0;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]) / (scale + fabs(want[i]));
        if (e > worst) worst = e;
        if (!(e <= 1e-4)) bad++;
    }
    printf("%-34s %8lld values, max rel err %.3e%s\n", what, (long long)n, worst, bad ? "  FAILED" : "");
    if (worst > max_err) max_err = worst;
    fails += bad;
}

static void same_bits(const char *what, const void *a, const void *b, size_t bytes) {
    int ok = memcmp(a, b, bytes) == 0;
    printf("%-34s 1 vs 2 threads: %s\n", what, ok ? "bit-identical" : "DIFFERENT");
    if (!ok) fails++;
}

static void test_linear(void) {
    const int64_t N = 301, C = 70, OC = 93;
    float *x = rnd(N * C, 1, -1, 1), *w = rnd(OC * C, 2, -1, 1), *b = rnd(OC, 3, -1, 1), *dy = rnd(N * OC, 4, -1, 1);
    float *y = bq_malloc((size_t)(N * OC) * sizeof(float));
    float *dx = rnd(N * C, 5, -1, 1), *dw = rnd(OC * C, 6, -1, 1), *db = rnd(OC, 7, -1, 1);
    double *ry = bq_malloc((size_t)(N * OC) * sizeof(double)), *rdx = bq_malloc((size_t)(N * C) * sizeof(double));
    double *rdw = bq_malloc((size_t)(OC * C) * sizeof(double)), *rdb = bq_malloc((size_t)OC * sizeof(double));
    for (int64_t i = 0; i < N * C; i++) rdx[i] = dx[i];
    for (int64_t i = 0; i < OC * C; i++) rdw[i] = dw[i];
    for (int64_t i = 0; i < OC; i++) rdb[i] = db[i];
    for (int64_t n = 0; n < N; n++)
        for (int64_t o = 0; o < OC; o++) {
            double s = b[o];
            for (int64_t c = 0; c < C; c++) s += (double)x[n * C + c] * w[o * C + c];
            ry[n * OC + o] = s;
            for (int64_t c = 0; c < C; c++) {
                rdx[n * C + c] += (double)dy[n * OC + o] * w[o * C + c];
                rdw[o * C + c] += (double)dy[n * OC + o] * x[n * C + c];
            }
            rdb[o] += dy[n * OC + o];
        }
    bq_kernel_linear_forward(y, x, w, b, N, C, OC);
    bq_kernel_linear_backward(dx, dw, db, dy, x, w, N, C, OC);
    cmp("linear forward", y, ry, N * OC, 8);
    cmp("linear dx (+=)", dx, rdx, N * C, 8);
    cmp("linear dW (+=)", dw, rdw, OC * C, 100);
    cmp("linear db (+=)", db, rdb, OC, 100);
    free(x), free(w), free(b), free(dy), free(y), free(dx), free(dw), free(db), free(ry), free(rdx), free(rdw), free(rdb);
}

static void test_attention(void) {
    const int64_t B = 3, T = 33, NH = 4, d = 16, H = NH * d, nq = B * T * H, ns = B * NH * T * T;
    float *q = rnd(nq, 11, -1, 1), *k = rnd(nq, 12, -1, 1), *v = rnd(nq, 13, -1, 1), *p = rnd(ns, 14, 0, 1);
    float *ds = rnd(ns, 15, -1, 1), *dc = rnd(nq, 16, -1, 1);
    float *s = bq_malloc((size_t)ns * sizeof(float)), *c = bq_malloc((size_t)nq * sizeof(float));
    float *dq = rnd(nq, 17, -1, 1), *dk = rnd(nq, 18, -1, 1), *dv = rnd(nq, 19, -1, 1), *dp = rnd(ns, 20, -1, 1);
    double *rs = bq_calloc((size_t)ns, sizeof(double)), *rc = bq_calloc((size_t)nq, sizeof(double));
    double *rdq = bq_malloc((size_t)nq * sizeof(double)), *rdk = bq_malloc((size_t)nq * sizeof(double));
    double *rdv = bq_malloc((size_t)nq * sizeof(double)), *rdp = bq_malloc((size_t)ns * sizeof(double));
    for (int64_t i = 0; i < nq; i++) rdq[i] = dq[i], rdk[i] = dk[i], rdv[i] = dv[i];
    for (int64_t i = 0; i < ns; i++) rdp[i] = dp[i];
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < NH; h++)
            for (int64_t i = 0; i < T; i++)
                for (int64_t j = 0; j < T; j++) {
                    int64_t si = ((b * NH + h) * T + i) * T + j;
                    for (int64_t e = 0; e < d; e++) {
                        int64_t qi = (b * T + i) * H + h * d + e, kj = (b * T + j) * H + h * d + e;
                        rs[si] += (double)q[qi] * k[kj];
                        rdq[qi] += (double)ds[si] * k[kj];
                        rdk[kj] += (double)ds[si] * q[qi];
                        rc[qi] += (double)p[si] * v[kj];
                        rdp[si] += (double)dc[qi] * v[kj];
                        rdv[kj] += (double)p[si] * dc[qi];
                    }
                }
    bq_kernel_attn_scores_forward(s, q, k, B, T, T, NH, d);
    bq_kernel_attn_scores_backward(dq, dk, ds, q, k, B, T, NH, d);
    bq_kernel_attn_context_forward(c, p, v, B, T, T, NH, d);
    bq_kernel_attn_context_backward(dp, dv, dc, p, v, B, T, NH, d);
    cmp("attn scores forward", s, rs, ns, 4);
    cmp("attn scores dq, dk (+=)", dq, rdq, nq, 8);
    cmp("", dk, rdk, nq, 8);
    cmp("attn context forward", c, rc, nq, 8);
    cmp("attn context dprobs, dv (+=)", dp, rdp, ns, 4);
    cmp("", dv, rdv, nq, 8);
    /* one query row (Tq = 1, the last layer's [CLS] query): token 0 of q and row 0 of each (b, h) block of
     * probs against the same rows of the references */
    {
        const int64_t n1 = B * H, ns1 = B * NH * T;
        float *q0 = bq_malloc((size_t)n1 * sizeof(float)), *p0 = bq_malloc((size_t)ns1 * sizeof(float));
        float *s0 = bq_malloc((size_t)ns1 * sizeof(float)), *c0 = bq_malloc((size_t)n1 * sizeof(float));
        double *rs0 = bq_malloc((size_t)ns1 * sizeof(double)), *rc0 = bq_malloc((size_t)n1 * sizeof(double));
        for (int64_t b = 0; b < B; b++) {
            memcpy(q0 + b * H, q + b * T * H, (size_t)H * sizeof(float));
            for (int64_t e = 0; e < H; e++) rc0[b * H + e] = rc[b * T * H + e];
            for (int64_t h = 0; h < NH; h++) {
                memcpy(p0 + (b * NH + h) * T, p + (b * NH + h) * T * T, (size_t)T * sizeof(float));
                for (int64_t j = 0; j < T; j++) rs0[(b * NH + h) * T + j] = rs[(b * NH + h) * T * T + j];
            }
        }
        bq_kernel_attn_scores_forward(s0, q0, k, B, 1, T, NH, d);
        bq_kernel_attn_context_forward(c0, p0, v, B, 1, T, NH, d);
        cmp("attn scores forward, 1 query row", s0, rs0, ns1, 4);
        cmp("attn context forward, 1 query row", c0, rc0, n1, 8);
        free(q0), free(p0), free(s0), free(c0), free(rs0), free(rc0);
    }
    free(q), free(k), free(v), free(p), free(ds), free(dc), free(s), free(c), free(dq), free(dk), free(dv), free(dp);
    free(rs), free(rc), free(rdq), free(rdk), free(rdv), free(rdp);
}

/* OpenMP kernels: reference loops, then the same call under 1 and 2 threads must agree bit for bit. */
static void test_omp_kernels(void) {
    const int64_t N = 611, H = 97, n = N * H, V = 40, B = 4, NH = 3, T = 29;
    float *x = rnd(n, 31, -2, 2), *w = rnd(H, 32, 0.5f, 1.5f), *bb = rnd(H, 33, -1, 1), *dy = rnd(n, 34, -1, 1);
    float *y1 = bq_malloc((size_t)n * sizeof(float)), *y2 = bq_malloc((size_t)n * sizeof(float));
    float *m1 = bq_malloc((size_t)N * sizeof(float)), *r1 = bq_malloc((size_t)N * sizeof(float));
    float *m2 = bq_malloc((size_t)N * sizeof(float)), *r2 = bq_malloc((size_t)N * sizeof(float));
    double *ref = bq_malloc((size_t)n * sizeof(double)), *refw = bq_calloc((size_t)H, sizeof(double)),
           *refb = bq_calloc((size_t)H, sizeof(double));

    /* layernorm forward + backward */
    for (int64_t r = 0; r < N; r++) {
        double m = 0, var = 0, sg = 0, sgx = 0;
        for (int64_t i = 0; i < H; i++) m += x[r * H + i];
        m /= H;
        for (int64_t i = 0; i < H; i++) var += (x[r * H + i] - m) * (x[r * H + i] - m);
        var /= H;
        double rs = 1.0 / sqrt(var + 1e-12);
        for (int64_t i = 0; i < H; i++) {
            double xh = (x[r * H + i] - m) * rs, g = (double)dy[r * H + i] * w[i];
            sg += g, sgx += g * xh;
            refw[i] += dy[r * H + i] * xh;
            refb[i] += dy[r * H + i];
        }
        for (int64_t i = 0; i < H; i++) {
            double xh = (x[r * H + i] - m) * rs;
            ref[r * H + i] = rs * ((double)dy[r * H + i] * w[i] - sg / H - xh * sgx / H);
        }
    }
    omp_set_num_threads(1);
    bq_kernel_layernorm_forward(y1, m1, r1, x, w, bb, N, H, 1e-12f);
    float *dx1 = bq_calloc((size_t)n, sizeof(float)), *dw1 = bq_calloc((size_t)H, sizeof(float)),
          *db1 = bq_calloc((size_t)H, sizeof(float));
    bq_kernel_layernorm_backward(dx1, dw1, db1, dy, x, w, m1, r1, N, H);
    omp_set_num_threads(2);
    bq_kernel_layernorm_forward(y2, m2, r2, x, w, bb, N, H, 1e-12f);
    float *dx2 = bq_calloc((size_t)n, sizeof(float)), *dw2 = bq_calloc((size_t)H, sizeof(float)),
          *db2 = bq_calloc((size_t)H, sizeof(float));
    bq_kernel_layernorm_backward(dx2, dw2, db2, dy, x, w, m2, r2, N, H);
    cmp("layernorm dx", dx2, ref, n, 1);
    cmp("layernorm dw", dw2, refw, H, 30);
    cmp("layernorm db", db2, refb, H, 30);
    same_bits("layernorm forward", y1, y2, (size_t)n * 4);
    same_bits("layernorm dx", dx1, dx2, (size_t)n * 4);
    same_bits("layernorm dw, db", dw1, dw2, (size_t)H * 4);
    same_bits("", db1, db2, (size_t)H * 4);

    /* column sums (bias gradients) */
    double *rcs = bq_calloc((size_t)H, sizeof(double));
    for (int64_t r = 0; r < N; r++)
        for (int64_t i = 0; i < H; i++) rcs[i] += dy[r * H + i];
    memset(db1, 0, (size_t)H * 4), memset(db2, 0, (size_t)H * 4);
    omp_set_num_threads(1);
    bq_kernel_colsum_acc(db1, dy, N, H);
    omp_set_num_threads(2);
    bq_kernel_colsum_acc(db2, dy, N, H);
    cmp("colsum", db2, rcs, H, 30);
    same_bits("colsum", db1, db2, (size_t)H * 4);

    /* embedding backward with many repeated ids */
    int32_t *ids = bq_malloc((size_t)N * sizeof(int32_t));
    BqRng rg;
    bq_rng_seed(&rg, 9);
    for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)bq_rng_below(&rg, (uint64_t)V);
    double *remb = bq_calloc((size_t)(V * H), sizeof(double));
    for (int64_t i = 0; i < N; i++)
        for (int64_t c = 0; c < H; c++) remb[ids[i] * H + c] += dy[i * H + c];
    float *e1 = bq_calloc((size_t)(V * H), sizeof(float)), *e2 = bq_calloc((size_t)(V * H), sizeof(float));
    omp_set_num_threads(1);
    bq_kernel_embedding_backward(e1, dy, ids, N, H);
    omp_set_num_threads(2);
    bq_kernel_embedding_backward(e2, dy, ids, N, H);
    cmp("embedding backward (scatter-add)", e2, remb, V * H, 10);
    same_bits("embedding backward", e1, e2, (size_t)(V * H) * 4);

    /* softmax with mask, forward + backward */
    int64_t rows = B * NH * T, ns = rows * T;
    float *sx = rnd(ns, 41, -4, 4), *sdy = rnd(ns, 42, -1, 1), *mask = rnd(B * T, 43, 0, 1);
    for (int64_t i = 0; i < B * T; i++) mask[i] = mask[i] < 0.3f ? 0.0f : 1.0f;
    for (int64_t j = 0; j < T; j++) mask[2 * T + j] = 0.0f; /* sequence 2 fully masked */
    float *sy1 = bq_malloc((size_t)ns * 4), *sy2 = bq_malloc((size_t)ns * 4);
    float *sd1 = bq_calloc((size_t)ns, 4), *sd2 = bq_calloc((size_t)ns, 4);
    double *rsy = bq_malloc((size_t)ns * 8), *rsd = bq_malloc((size_t)ns * 8);
    const float sc = 0.125f;
    for (int64_t r = 0; r < rows; r++) {
        const float *m = mask + (r / (NH * T)) * T;
        double mx = -INFINITY, s = 0, dot = 0;
        int any = 0;
        for (int64_t j = 0; j < T; j++) any |= m[j] != 0;
        /* a fully masked row: every logit is ≈ −FLT_MAX, so the kernel (like HF) gives a uniform row */
        for (int64_t j = 0; j < T; j++)
            if (m[j] != 0 && sc * (double)sx[r * T + j] > mx) mx = sc * (double)sx[r * T + j];
        for (int64_t j = 0; j < T; j++)
            s += rsy[r * T + j] = !any ? 1.0 : m[j] != 0 ? exp(sc * (double)sx[r * T + j] - mx) : 0;
        for (int64_t j = 0; j < T; j++) rsy[r * T + j] /= s, dot += rsy[r * T + j] * sdy[r * T + j];
        for (int64_t j = 0; j < T; j++) rsd[r * T + j] = sc * rsy[r * T + j] * (sdy[r * T + j] - dot);
    }
    omp_set_num_threads(1);
    bq_kernel_softmax_mask_forward(sy1, sx, mask, sc, -3.4028235e38f, B, NH, T, T);
    bq_kernel_softmax_mask_backward(sd1, sdy, sy1, sc, rows, T);
    omp_set_num_threads(2);
    bq_kernel_softmax_mask_forward(sy2, sx, mask, sc, -3.4028235e38f, B, NH, T, T);
    bq_kernel_softmax_mask_backward(sd2, sdy, sy2, sc, rows, T);
    cmp("softmax_mask forward", sy2, rsy, ns, 0.01);
    cmp("softmax_mask backward", sd2, rsd, ns, 0.01);
    /* one query row per (b, h) block (Tq = 1): row 0 of each block, masked by its batch's mask */
    {
        float *x0 = bq_malloc((size_t)(B * NH * T) * sizeof(float)), *y0 = bq_malloc((size_t)(B * NH * T) * sizeof(float));
        double *r0 = bq_malloc((size_t)(B * NH * T) * sizeof(double));
        for (int64_t bh = 0; bh < B * NH; bh++)
            for (int64_t j = 0; j < T; j++) x0[bh * T + j] = sx[bh * T * T + j], r0[bh * T + j] = rsy[bh * T * T + j];
        bq_kernel_softmax_mask_forward(y0, x0, mask, sc, -3.4028235e38f, B, NH, 1, T);
        cmp("softmax_mask forward, 1 query row", y0, r0, B * NH * T, 0.01);
        free(x0), free(y0), free(r0);
    }
    same_bits("softmax_mask forward", sy1, sy2, (size_t)ns * 4);
    same_bits("softmax_mask backward", sd1, sd2, (size_t)ns * 4);

    /* gelu, dropout: thread-count independence */
    omp_set_num_threads(1);
    bq_kernel_gelu_forward(y1, x, n);
    bq_kernel_dropout_forward(dx1, x, 0.1f, 0xabcdefULL, n);
    omp_set_num_threads(2);
    bq_kernel_gelu_forward(y2, x, n);
    bq_kernel_dropout_forward(dx2, x, 0.1f, 0xabcdefULL, n);
    for (int64_t i = 0; i < n; i++) ref[i] = 0.5 * x[i] * (1 + erf(x[i] / sqrt(2.0)));
    cmp("gelu forward", y2, ref, n, 1e-3);
    same_bits("gelu forward", y1, y2, (size_t)n * 4);
    same_bits("dropout output", dx1, dx2, (size_t)n * 4);
    /* the mask is the counter hash's, drawn again from (key, i): kept elements are x/(1-p), dropped 0 */
    int64_t kept = 0, dbad = 0;
    for (int64_t i = 0; i < n; i++) {
        int k = bq_hash_uniform(0xabcdefULL, (uint64_t)i) >= 0.1f;
        kept += k;
        dbad += dx2[i] != (k ? x[i] * (1.0f / 0.9f) : x[i] * 0.0f);
    }
    printf("dropout p=0.1 kept fraction %.4f, %lld outputs off the hash mask\n", (double)kept / n, (long long)dbad);
    if (fabs((double)kept / n - 0.9) > 0.01 || dbad) fails++;
    /* gelu backward: Φ(x) + x·φ(x) against erf/exp in double, and thread-count independence */
    memset(dx1, 0, (size_t)n * 4), memset(dx2, 0, (size_t)n * 4);
    omp_set_num_threads(1);
    bq_kernel_gelu_backward(dx1, dy, x, n);
    omp_set_num_threads(2);
    bq_kernel_gelu_backward(dx2, dy, x, n);
    for (int64_t i = 0; i < n; i++) {
        double xi = x[i];
        ref[i] = dy[i] * (0.5 * (1 + erf(xi / sqrt(2.0))) + xi * exp(-0.5 * xi * xi) / sqrt(2 * M_PI));
    }
    cmp("gelu backward", dx2, ref, n, 1e-3);
    same_bits("gelu backward", dx1, dx2, (size_t)n * 4);
    /* gelu over the whole float range that matters, including the tails (x in [-12, 12]) */
    for (int64_t i = 0; i < n; i++) {
        y1[i] = -12.0f + 24.0f * (float)i / (float)n;
        ref[i] = 0.5 * y1[i] * (1 + erf(y1[i] / sqrt(2.0)));
    }
    bq_kernel_gelu_forward(y2, y1, n);
    cmp("gelu forward on [-12, 12]", y2, ref, n, 1e-6);

    /* min/max of the observers: exact, NaN ignored, any thread count */
    float lo1, hi1, lo2, hi2;
    x[n / 3] = NAN;
    omp_set_num_threads(1);
    bq_kernel_minmax(x, n, &lo1, &hi1);
    omp_set_num_threads(2);
    bq_kernel_minmax(x, n, &lo2, &hi2);
    float rlo = INFINITY, rhi = -INFINITY;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(x[i])) rlo = fminf(rlo, x[i]), rhi = fmaxf(rhi, x[i]);
    int mm_ok = lo1 == rlo && hi1 == rhi && lo2 == rlo && hi2 == rhi;
    printf("%-34s %8lld values, %s\n", "minmax", (long long)n, mm_ok ? "exact, 1 and 2 threads" : "FAILED");
    fails += !mm_ok;

    free(x), free(w), free(bb), free(dy), free(y1), free(y2), free(m1), free(r1), free(m2), free(r2), free(ref), free(refw);
    free(refb), free(dx1), free(dw1), free(db1), free(dx2), free(dw2), free(db2), free(rcs), free(ids), free(remb);
    free(e1), free(e2), free(sx), free(sdy), free(mask), free(sy1), free(sy2), free(sd1), free(sd2), free(rsy), free(rsd);
}

int main(void) {
    test_linear();
    test_attention();
    test_omp_kernels();
    printf("test_kernels_ref: max rel error %.3e, %s\n", max_err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
