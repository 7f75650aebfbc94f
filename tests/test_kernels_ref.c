/* The fast kernels of autograd/kernels.c (sgemm with leading dimensions, OpenMP loops, column-block
 * reductions) against plain reference loops in double, at shapes large enough that the parallel paths
 * run; and bit-identical results of the OpenMP kernels (dropout mask included) for 1 and 2 threads.
 * Every backward accumulates into its gradient arrays (autograd/kernels.h), so each gradient array starts
 * from random values and its reference from the same values: a backward that overwrites fails. The
 * LayerNorm forward (output, saved mean and rstd) is held to a per-element bound derived from fp32
 * rounding (check_layernorm_forward). Prints the max relative error. */
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

/* |got − want| <= 1e-4·(scale + |before| + |want − before|); scale is the typical magnitude of the terms
 * summed. before: what a gradient array held ahead of the backward that accumulated want − before into it
 * (NULL: zeros); both terms of that sum join the magnitude the error is measured against, so that an
 * accumulation that cancels to near 0 is held to the rounding of its terms. */
static void cmp_acc(const char *what, const float *got, const double *want, const float *before, int64_t n,
                    double scale) {
    double worst = 0;
    int bad = 0;
    for (int64_t i = 0; i < n; i++) {
        double b = before ? before[i] : 0.0;
        double e = fabs(got[i] - want[i]) / (scale + fabs(b) + fabs(want[i] - b));
        if (e > worst) worst = e;
        if (!(e <= 1e-4)) bad++;
    }
    printf("%-34s %8lld values, max rel err %.3e%s\n", what, (long long)n, worst, bad ? "  FAILED" : "");
    if (worst > max_err) max_err = worst;
    fails += bad;
}

/* cmp_acc for an output written from zeros. */
static void cmp(const char *what, const float *got, const double *want, int64_t n, double scale) {
    cmp_acc(what, got, want, NULL, n, scale);
}

/* A copy of n floats. */
static float *dup(const float *v, int64_t n) {
    float *c = bq_malloc((size_t)n * sizeof(float));
    memcpy(c, v, (size_t)n * sizeof(float));
    return c;
}

/* n doubles equal to v (a reference that starts from what a gradient array held before the backward). */
static double *widen(const float *v, int64_t n) {
    double *c = bq_malloc((size_t)n * sizeof(double));
    for (int64_t i = 0; i < n; i++) c[i] = v[i];
    return c;
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
    bq_kernel_linear_forward(y, x, w, b, N, C, OC, BQ_PRECISION_FP32);
    bq_kernel_linear_backward(dx, dw, db, dy, x, w, N, C, OC, BQ_PRECISION_FP32);
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
    bq_kernel_attn_scores_forward(s, q, k, B, T, T, NH, d, BQ_PRECISION_FP32);
    bq_kernel_attn_scores_backward(dq, dk, ds, q, k, B, T, NH, d, BQ_PRECISION_FP32);
    bq_kernel_attn_context_forward(c, p, v, B, T, T, NH, d, BQ_PRECISION_FP32);
    bq_kernel_attn_context_backward(dp, dv, dc, p, v, B, T, NH, d, BQ_PRECISION_FP32);
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
        bq_kernel_attn_scores_forward(s0, q0, k, B, 1, T, NH, d, BQ_PRECISION_FP32);
        bq_kernel_attn_context_forward(c0, p0, v, B, 1, T, NH, d, BQ_PRECISION_FP32);
        cmp("attn scores forward, 1 query row", s0, rs0, ns1, 4);
        cmp("attn context forward, 1 query row", c0, rc0, n1, 8);
        free(q0), free(p0), free(s0), free(c0), free(rs0), free(rc0);
    }
    free(q), free(k), free(v), free(p), free(ds), free(dc), free(s), free(c), free(dq), free(dk), free(dv), free(dp);
    free(rs), free(rc), free(rdq), free(rdk), free(rdv), free(rdp);
}

/* bq_kernel_layernorm_forward's output y, saved mean and rstd against the row statistics in double, per
 * element. The bound, first order in u = 2^-24 (the kernel's arithmetic, autograd/fastmath.h
 * ln_row_forward): the mean is a sum of H terms (each partial sum rounded once: within (H−1)·u·Σ|x|)
 * divided by H, so |m − μ| <= H·u·max|x| =: δm. The variance sums H squares of rounded differences, every
 * term nonnegative: relative error (H + 2)·u, then the division, + eps and the square root (which halves a
 * relative error) and the reciprocal add 4·u, so |r − ρ| <= (H/2 + 5)·u·ρ. (A wrong mean changes the
 * variance only in second order.) y = ((x − m)·r)·w + b rounds three more times and once on the sum, so
 * |y − ŷ| <= |w|·ρ·δm + (H/2 + 8)·u·|x̂·w| + u·|ŷ|, x̂ = (x − μ)·ρ. A dropped bias, weight or mean, or
 * a wrong row, misses that by orders of magnitude. */
static void check_layernorm_forward(const float *y, const float *mean, const float *rstd, const float *x,
                                    const float *w, const float *b, int64_t N, int64_t H) {
    const double u = 0x1p-24;
    double worst = 0.0, max_abs = 0.0;
    int bad = 0;
    for (int64_t r = 0; r < N; r++) {
        const float *xr = x + r * H;
        double mu = 0.0, var = 0.0, xmax = 0.0;
        for (int64_t i = 0; i < H; i++) mu += xr[i], xmax = fmax(xmax, fabs((double)xr[i]));
        mu /= (double)H;
        for (int64_t i = 0; i < H; i++) var += ((double)xr[i] - mu) * ((double)xr[i] - mu);
        const double rho = 1.0 / sqrt(var / (double)H + 1e-12), dm = (double)H * u * xmax;
        const double bounds[2] = {dm, ((double)H / 2 + 5) * u * rho};
        const double got[2] = {mean[r], rstd[r]}, want[2] = {mu, rho};
        for (int k = 0; k < 2; k++) {
            double e = fabs(got[k] - want[k]);
            worst = fmax(worst, e / bounds[k]);
            bad += !(e <= bounds[k]);
        }
        for (int64_t i = 0; i < H; i++) {
            const double xw = ((double)xr[i] - mu) * rho * w[i], want_y = xw + b[i];
            const double bound = fabs((double)w[i]) * rho * dm + ((double)H / 2 + 8) * u * fabs(xw) + u * fabs(want_y);
            const double e = fabs((double)y[r * H + i] - want_y);
            max_abs = fmax(max_abs, e);
            worst = fmax(worst, e / bound);
            if (!(e <= bound)) {
                if (bad < 5) printf("  layernorm y[%lld, %lld]: got %.9g want %.9g (bound %.3g)\n", (long long)r,
                                    (long long)i, y[r * H + i], want_y, bound);
                bad++;
            }
        }
    }
    printf("%-34s %8lld values, max abs err %.3e, max err/bound %.3f%s\n", "layernorm forward (y, mean, rstd)",
           (long long)(N * (H + 2)), max_abs, worst, bad ? "  FAILED" : "");
    fails += bad;
}

/* OpenMP kernels: reference loops, then the same call under 1 and 2 threads must agree bit for bit. */
static void test_omp_kernels(void) {
    const int64_t N = 611, H = 97, n = N * H, V = 40, B = 4, NH = 3, T = 29;
    float *x = rnd(n, 31, -2, 2), *w = rnd(H, 32, 0.5f, 1.5f), *bb = rnd(H, 33, -1, 1), *dy = rnd(n, 34, -1, 1);
    float *y1 = bq_malloc((size_t)n * sizeof(float)), *y2 = bq_malloc((size_t)n * sizeof(float));
    float *m1 = bq_malloc((size_t)N * sizeof(float)), *r1 = bq_malloc((size_t)N * sizeof(float));
    float *m2 = bq_malloc((size_t)N * sizeof(float)), *r2 = bq_malloc((size_t)N * sizeof(float));
    /* what the LayerNorm gradient arrays hold before its backward */
    float *pdx = rnd(n, 35, -1, 1), *pdw = rnd(H, 36, -1, 1), *pdb = rnd(H, 37, -1, 1);
    double *ref = bq_malloc((size_t)n * sizeof(double)), *refw = widen(pdw, H), *refb = widen(pdb, H);

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
            ref[r * H + i] = pdx[r * H + i] + rs * ((double)dy[r * H + i] * w[i] - sg / H - xh * sgx / H);
        }
    }
    omp_set_num_threads(1);
    bq_kernel_layernorm_forward(y1, m1, r1, x, w, bb, N, H, 1e-12f);
    float *dx1 = dup(pdx, n), *dw1 = dup(pdw, H), *db1 = dup(pdb, H);
    bq_kernel_layernorm_backward(dx1, dw1, db1, dy, x, w, m1, r1, N, H);
    omp_set_num_threads(2);
    bq_kernel_layernorm_forward(y2, m2, r2, x, w, bb, N, H, 1e-12f);
    float *dx2 = dup(pdx, n), *dw2 = dup(pdw, H), *db2 = dup(pdb, H);
    bq_kernel_layernorm_backward(dx2, dw2, db2, dy, x, w, m2, r2, N, H);
    check_layernorm_forward(y2, m2, r2, x, w, bb, N, H);
    cmp_acc("layernorm dx (+=)", dx2, ref, pdx, n, 1);
    cmp_acc("layernorm dw (+=)", dw2, refw, pdw, H, 30);
    cmp_acc("layernorm db (+=)", db2, refb, pdb, H, 30);
    same_bits("layernorm forward", y1, y2, (size_t)n * 4);
    same_bits("layernorm dx", dx1, dx2, (size_t)n * 4);
    same_bits("layernorm dw, db", dw1, dw2, (size_t)H * 4);
    same_bits("", db1, db2, (size_t)H * 4);

    /* column sums (bias gradients) */
    double *rcs = widen(pdb, H);
    for (int64_t r = 0; r < N; r++)
        for (int64_t i = 0; i < H; i++) rcs[i] += dy[r * H + i];
    memcpy(db1, pdb, (size_t)H * 4), memcpy(db2, pdb, (size_t)H * 4);
    omp_set_num_threads(1);
    bq_kernel_colsum_acc(db1, dy, N, H);
    omp_set_num_threads(2);
    bq_kernel_colsum_acc(db2, dy, N, H);
    cmp_acc("colsum (+=)", db2, rcs, pdb, H, 30);
    same_bits("colsum", db1, db2, (size_t)H * 4);

    /* embedding backward with many repeated ids */
    int32_t *ids = bq_malloc((size_t)N * sizeof(int32_t));
    BqRng rg;
    bq_rng_seed(&rg, 9);
    for (int64_t i = 0; i < N; i++) ids[i] = (int32_t)bq_rng_below(&rg, (uint64_t)V);
    float *pemb = rnd(V * H, 38, -1, 1), *e1 = dup(pemb, V * H), *e2 = dup(pemb, V * H);
    double *remb = widen(pemb, V * H);
    for (int64_t i = 0; i < N; i++)
        for (int64_t c = 0; c < H; c++) remb[ids[i] * H + c] += dy[i * H + c];
    omp_set_num_threads(1);
    bq_kernel_embedding_backward(e1, dy, ids, N, H);
    omp_set_num_threads(2);
    bq_kernel_embedding_backward(e2, dy, ids, N, H);
    cmp_acc("embedding backward (scatter-add, +=)", e2, remb, pemb, V * H, 10);
    same_bits("embedding backward", e1, e2, (size_t)(V * H) * 4);

    /* softmax with mask, forward + backward */
    int64_t rows = B * NH * T, ns = rows * T;
    float *sx = rnd(ns, 41, -4, 4), *sdy = rnd(ns, 42, -1, 1), *mask = rnd(B * T, 43, 0, 1);
    for (int64_t i = 0; i < B * T; i++) mask[i] = mask[i] < 0.3f ? 0.0f : 1.0f;
    for (int64_t j = 0; j < T; j++) mask[2 * T + j] = 0.0f; /* sequence 2 fully masked */
    float *sy1 = bq_malloc((size_t)ns * 4), *sy2 = bq_malloc((size_t)ns * 4);
    float *psd = rnd(ns, 44, -1, 1), *sd1 = dup(psd, ns), *sd2 = dup(psd, ns);
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
        for (int64_t j = 0; j < T; j++) rsd[r * T + j] = psd[r * T + j] + sc * rsy[r * T + j] * (sdy[r * T + j] - dot);
    }
    omp_set_num_threads(1);
    bq_kernel_softmax_mask_forward(sy1, sx, mask, sc, -3.4028235e38f, B, NH, T, T);
    bq_kernel_softmax_mask_backward(sd1, sdy, sy1, sc, rows, T);
    omp_set_num_threads(2);
    bq_kernel_softmax_mask_forward(sy2, sx, mask, sc, -3.4028235e38f, B, NH, T, T);
    bq_kernel_softmax_mask_backward(sd2, sdy, sy2, sc, rows, T);
    cmp("softmax_mask forward", sy2, rsy, ns, 0.01);
    cmp_acc("softmax_mask backward (+=)", sd2, rsd, psd, ns, 0.01);
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
    memcpy(dx1, pdx, (size_t)n * 4), memcpy(dx2, pdx, (size_t)n * 4);
    omp_set_num_threads(1);
    bq_kernel_gelu_backward(dx1, dy, x, n);
    omp_set_num_threads(2);
    bq_kernel_gelu_backward(dx2, dy, x, n);
    for (int64_t i = 0; i < n; i++) {
        double xi = x[i];
        ref[i] = pdx[i] + dy[i] * (0.5 * (1 + erf(xi / sqrt(2.0))) + xi * exp(-0.5 * xi * xi) / sqrt(2 * M_PI));
    }
    cmp_acc("gelu backward (+=)", dx2, ref, pdx, n, 1e-3);
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
    free(pdx), free(pdw), free(pdb), free(pemb), free(psd);
}

int main(void) {
    test_linear();
    test_attention();
    test_omp_kernels();
    printf("test_kernels_ref: max rel error %.3e, %s\n", max_err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
