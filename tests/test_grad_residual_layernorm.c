/* bq_op_residual_layernorm (y = LayerNorm(dropout_p(a) + b)·w + beta, eps 1e-12 as in BERT):
 *  - gradient checks (da, db, dw, dbeta) with a random-weighted loss against a double-precision
 *    reference, without dropout and with p = 0.25 in training (the mask is the counter hash's for the
 *    context's key, drawn again by the reference);
 *  - equality with the unfused sequence layernorm(add(dropout(a), b)) of the same context: forward and
 *    every gradient bit for bit (same float operations in the same order, same dropout key), and the
 *    op advances the dropout counter exactly as the unfused dropout does;
 *  - the sole-consumer variant (sum written over a's data; a = x + 0, exact) gives the same bits too;
 *  - 1 against 2 threads on a size that runs in parallel: same bits. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/gradcheck.h"

enum { B = 2, T = 5, H = 70, N = B * T * H };
static float a[N], ga[N], bb[N], gbb[N], w[H], gw[H], be[H], gbe[H];
static const float EPS = 1e-12f;
static float P;

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[3] = {B, T, H}, hs[1] = {H};
    BqTensor *X = bq_arena_alloc(ctx->act, 4 * sizeof(BqTensor));
    X[0] = bq_tensor_wrap(a, ga, 3, s);
    X[1] = bq_tensor_wrap(bb, gbb, 3, s);
    X[2] = bq_tensor_wrap(w, gw, 1, hs);
    X[3] = bq_tensor_wrap(be, gbe, 1, hs);
    return bq_op_residual_layernorm(ctx, &X[0], P, &X[1], &X[2], &X[3], EPS);
}

/* gradcheck's context: key 0x5eed, counter 0 at each evaluation */
static void ref(double *out, void *ud) {
    (void)ud;
    double inv = P > 0 ? (double)(1.0f / (1.0f - P)) : 1.0;
    for (int r = 0; r < B * T; r++) {
        double s[H], m = 0, v = 0;
        for (int i = 0; i < H; i++) {
            int k = r * H + i;
            double keep = P > 0 ? (bq_hash_uniform(0x5eedULL, (uint64_t)k) >= P ? inv : 0.0) : 1.0;
            s[i] = a[k] * keep + bb[k];
            m += s[i];
        }
        m /= H;
        for (int i = 0; i < H; i++) v += (s[i] - m) * (s[i] - m);
        v /= H;
        for (int i = 0; i < H; i++) out[r * H + i] = (s[i] - m) / sqrt(v + (double)EPS) * w[i] + be[i];
    }
}

/* One recorded pass at (rows, Hc) with `threads`; gradients prefilled with 0.5; fused or unfused. */
static void run(int fused, int threads, const float *ain, const float *bin, const float *win, const float *bein,
                const float *R, int64_t rows, int64_t Hc, float p, float *y, float *g[4], uint64_t *count) {
    BqGcPass pass;
    bq_gc_pass_begin(&pass, threads, (size_t)1 << 28, 1, 0xfeedULL, 3);
    BqCtx *ctx = &pass.ctx;
    int64_t n = rows * Hc, s[2] = {rows, Hc}, hs[1] = {Hc};
    for (int64_t i = 0; i < n; i++) g[0][i] = g[1][i] = 0.5f;
    for (int64_t i = 0; i < Hc; i++) g[2][i] = g[3][i] = 0.5f;
    BqTensor A = bq_tensor_wrap((float *)ain, g[0], 2, s), Bt = bq_tensor_wrap((float *)bin, g[1], 2, s);
    BqTensor W = bq_tensor_wrap((float *)win, g[2], 1, hs), Be = bq_tensor_wrap((float *)bein, g[3], 1, hs);
    float *zz = bq_arena_alloc_zero(ctx->act, (size_t)n * sizeof(float));
    BqTensor Z = bq_tensor_wrap(zz, NULL, 2, s);
    BqTensor *out = fused == 2 ? bq_op_residual_layernorm_sole(ctx, bq_op_add(ctx, &A, &Z), p, &Bt, &W, &Be, EPS)
                  : fused    ? bq_op_residual_layernorm(ctx, &A, p, &Bt, &W, &Be, EPS)
                             : bq_op_layernorm(ctx, bq_op_add(ctx, bq_op_dropout(ctx, &A, p), &Bt), &W, &Be, EPS);
    *count = bq_gc_pass_end(&pass, out, R, y);
}

int main(void) {
    bq_gc_fill_uniform(a, N, 101, -2, 2);
    bq_gc_fill_uniform(bb, N, 102, -2, 2);
    bq_gc_fill_uniform(w, H, 103, 0.5f, 1.5f);
    bq_gc_fill_uniform(be, H, 104, -1, 1);
    double err = 0, e;
    int fails = 0;
    BqGcInput in[4] = {{"a", a, ga, N}, {"b", bb, gbb, N}, {"w", w, gw, H}, {"beta", be, gbe, H}};
    P = 0.0f;
    fails += bq_gradcheck_ref("residual_layernorm", fwd, ref, NULL, in, 4, 1e-3, &e), err = fmax(err, e);
    P = 0.25f;
    fails += bq_gradcheck_ref("residual_layernorm p=0.25", fwd, ref, NULL, in, 4, 1e-3, &e), err = fmax(err, e);

    enum { R_ = 2048, H_ = 96, N_ = R_ * H_ };
    static float A[N_], Bv[N_], W[H_], Be[H_], Rw[N_], y[3][2][N_], gd[3][2][4][N_];
    bq_gc_fill_uniform(A, N_, 105, -3, 3);
    bq_gc_fill_uniform(Bv, N_, 106, -3, 3);
    bq_gc_fill_uniform(W, H_, 107, 0.5f, 1.5f);
    bq_gc_fill_uniform(Be, H_, 108, -1, 1);
    bq_gc_fill_uniform(Rw, N_, 109, -1, 1);
    for (int pi = 0; pi < 2; pi++) {
        float p = pi ? 0.1f : 0.0f;
        uint64_t cnt[3][2];
        for (int fused = 0; fused < 3; fused++)
            for (int t = 0; t < 2; t++) {
                float *g[4] = {gd[fused][t][0], gd[fused][t][1], gd[fused][t][2], gd[fused][t][3]};
                run(fused, t + 1, A, Bv, W, Be, Rw, R_, H_, p, y[fused][t], g, &cnt[fused][t]);
            }
        for (int fused = 0; fused < 3; fused++) {
            int64_t d = bq_gc_ndiff(y[fused][0], y[fused][1], N_);
            for (int k = 0; k < 4; k++) d += bq_gc_ndiff(gd[fused][0][k], gd[fused][1][k], k < 2 ? N_ : H_);
            printf("p=%.1f %-10s 1 vs 2 threads: %lld values differ\n", p,
                   fused == 2 ? "fused sole" : fused ? "fused" : "unfused", (long long)d);
            fails += d != 0;
        }
        int64_t dy = bq_gc_ndiff(y[1][1], y[0][1], N_), dg = 0;
        for (int k = 0; k < 4; k++) dg += bq_gc_ndiff(gd[1][1][k], gd[0][1][k], k < 2 ? N_ : H_);
        printf("p=%.1f fused vs unfused: forward %lld, gradients %lld values differ (bit-equal expected); dropout "
               "counter %llu vs %llu\n", p, (long long)dy, (long long)dg, (unsigned long long)cnt[1][1],
               (unsigned long long)cnt[0][1]);
        fails += dy + dg != 0 || cnt[1][1] != cnt[0][1];
        int64_t sy = bq_gc_ndiff(y[2][1], y[0][1], N_), sg = 0;
        for (int k = 0; k < 4; k++) sg += bq_gc_ndiff(gd[2][1][k], gd[0][1][k], k < 2 ? N_ : H_);
        printf("p=%.1f fused sole vs unfused: forward %lld, gradients %lld values differ\n", p, (long long)sy,
               (long long)sg);
        fails += sy + sg != 0 || cnt[2][1] != cnt[0][1];
    }
    printf("test_grad_residual_layernorm: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
