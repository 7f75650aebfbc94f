/* bq_op_embed_layernorm (BertEmbeddings before dropout: LayerNorm(word[ids] + type[tids] + pos[pids])):
 *  - gradient check of the three tables and the LayerNorm weight and bias with a random-weighted loss
 *    against a double-precision reference (repeated ids, so rows accumulate);
 *  - equality with the unfused ops (embedding ×3, add, add, layernorm in HF's order): forward and every
 *    gradient bit for bit, and 1 against 2 threads on a size that runs in parallel: same bits. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/gradcheck.h"

enum { B = 2, T = 4, H = 70, V = 5, VT = 2, VP = 6, N = B * T };
static float wt[V * H], gwt[V * H], tt[VT * H], gtt[VT * H], pt[VP * H], gpt[VP * H], lw[H], glw[H], lb[H], glb[H];
static int32_t ids[N] = {1, 3, 3, 0, 4, 1, 1, 2}, tids[N] = {0, 0, 1, 1, 0, 1, 0, 0}, pids[N] = {0, 1, 2, 3, 0, 1, 2, 3};
static const float EPS = 1e-12f;

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t ws[2] = {V, H}, ts[2] = {VT, H}, ps[2] = {VP, H}, hs[1] = {H};
    BqTensor *X = bq_arena_alloc(ctx->act, 5 * sizeof(BqTensor));
    X[0] = bq_tensor_wrap(wt, gwt, 2, ws);
    X[1] = bq_tensor_wrap(tt, gtt, 2, ts);
    X[2] = bq_tensor_wrap(pt, gpt, 2, ps);
    X[3] = bq_tensor_wrap(lw, glw, 1, hs);
    X[4] = bq_tensor_wrap(lb, glb, 1, hs);
    return bq_op_embed_layernorm(ctx, &X[0], &X[1], &X[2], ids, tids, pids, B, T, &X[3], &X[4], EPS, -1);
}

static void ref(double *out, void *ud) {
    (void)ud;
    for (int n = 0; n < N; n++) {
        double s[H], m = 0, v = 0;
        for (int i = 0; i < H; i++) {
            s[i] = (double)wt[ids[n] * H + i] + tt[tids[n] * H + i] + pt[pids[n] * H + i];
            m += s[i];
        }
        m /= H;
        for (int i = 0; i < H; i++) v += (s[i] - m) * (s[i] - m);
        v /= H;
        for (int i = 0; i < H; i++) out[n * H + i] = (s[i] - m) / sqrt(v + (double)EPS) * lw[i] + lb[i];
    }
}

enum { B2 = 16, T2 = 64, H2 = 96, V2 = 50, N2 = B2 * T2 };
static float W2[V2 * H2], T2t[2 * H2], P2[T2 * H2], LW[H2], LB[H2], R[N2 * H2];
static int32_t I2[N2], TI2[N2], PI2[N2];

static void run(int fused, int threads, float *y, float *g[5]) {
    BqGcPass pass;
    bq_gc_pass_begin(&pass, threads, (size_t)1 << 27, 1, 0, 0);
    BqCtx *ctx = &pass.ctx;
    int64_t ws[2] = {V2, H2}, ts[2] = {2, H2}, ps[2] = {T2, H2}, hs[1] = {H2};
    const int64_t sz[5] = {V2 * H2, 2 * H2, T2 * H2, H2, H2};
    for (int k = 0; k < 5; k++)
        for (int64_t i = 0; i < sz[k]; i++) g[k][i] = 0.5f;
    BqTensor Wt = bq_tensor_wrap(W2, g[0], 2, ws), Tt = bq_tensor_wrap(T2t, g[1], 2, ts);
    BqTensor Pt = bq_tensor_wrap(P2, g[2], 2, ps), Lw = bq_tensor_wrap(LW, g[3], 1, hs), Lb = bq_tensor_wrap(LB, g[4], 1, hs);
    BqTensor *out;
    if (fused) {
        out = bq_op_embed_layernorm(ctx, &Wt, &Tt, &Pt, I2, TI2, PI2, B2, T2, &Lw, &Lb, EPS, -1);
    } else {
        out = bq_op_embedding(ctx, &Wt, I2, B2, T2);
        out = bq_op_add(ctx, out, bq_op_embedding(ctx, &Tt, TI2, B2, T2));
        out = bq_op_add(ctx, out, bq_op_embedding(ctx, &Pt, PI2, B2, T2));
        out = bq_op_layernorm(ctx, out, &Lw, &Lb, EPS);
    }
    bq_gc_pass_end(&pass, out, R, y);
}

int main(void) {
    bq_gc_fill_uniform(wt, V * H, 161, -1, 1);
    bq_gc_fill_uniform(tt, VT * H, 162, -0.5f, 0.5f);
    bq_gc_fill_uniform(pt, VP * H, 163, -0.5f, 0.5f);
    bq_gc_fill_uniform(lw, H, 164, 0.5f, 1.5f);
    bq_gc_fill_uniform(lb, H, 165, -1, 1);
    double err = 0;
    BqGcInput in[5] = {{"word", wt, gwt, V * H}, {"type", tt, gtt, VT * H}, {"pos", pt, gpt, VP * H},
                       {"ln_w", lw, glw, H}, {"ln_b", lb, glb, H}};
    int fails = bq_gradcheck_ref("embed_layernorm", fwd, ref, NULL, in, 5, 1e-3, &err);

    bq_gc_fill_uniform(W2, V2 * H2, 166, -1, 1);
    bq_gc_fill_uniform(T2t, 2 * H2, 167, -0.5f, 0.5f);
    bq_gc_fill_uniform(P2, T2 * H2, 168, -0.5f, 0.5f);
    bq_gc_fill_uniform(LW, H2, 169, 0.5f, 1.5f);
    bq_gc_fill_uniform(LB, H2, 170, -1, 1);
    bq_gc_fill_uniform(R, N2 * H2, 171, -1, 1);
    BqRng rng;
    bq_rng_seed(&rng, 172);
    for (int i = 0; i < N2; i++)
        I2[i] = (int32_t)bq_rng_below(&rng, V2), TI2[i] = (int32_t)bq_rng_below(&rng, 2), PI2[i] = i % T2;
    static float y[2][2][N2 * H2], gs[2][2][5][V2 * H2 > T2 * H2 ? V2 * H2 : T2 * H2];
    const int64_t sz[5] = {V2 * H2, 2 * H2, T2 * H2, H2, H2};
    for (int f = 0; f < 2; f++)
        for (int t = 0; t < 2; t++) {
            float *g[5] = {gs[f][t][0], gs[f][t][1], gs[f][t][2], gs[f][t][3], gs[f][t][4]};
            run(f, t + 1, y[f][t], g);
        }
    for (int f = 0; f < 2; f++) {
        int64_t d = bq_gc_ndiff(y[f][0], y[f][1], N2 * H2);
        for (int k = 0; k < 5; k++) d += bq_gc_ndiff(gs[f][0][k], gs[f][1][k], sz[k]);
        printf("%-8s 1 vs 2 threads: %lld values differ\n", f ? "fused" : "unfused", (long long)d);
        fails += d != 0;
    }
    int64_t dy = bq_gc_ndiff(y[1][1], y[0][1], N2 * H2), dg = 0;
    for (int k = 0; k < 5; k++) dg += bq_gc_ndiff(gs[1][1][k], gs[0][1][k], sz[k]);
    printf("fused vs unfused: forward %lld, gradients %lld values differ (bit-equal expected)\n", (long long)dy,
           (long long)dg);
    fails += dy + dg != 0;
    printf("test_grad_embed_layernorm: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
