/* Gradient check of bq_op_layernorm over the last axis (dx, dw, db), eps = 1e-12 as in BERT, with the
 * numerical side on a double-precision two-pass reference, plus a forward check with a large offset. */
#include <math.h>
#include <stdio.h>

#include "tests/gradcheck.h"

enum { B = 2, T = 5, H = 6, N = B * T * H };
static float x[N], gx[N], w[H], gw[H], b[H], gb[H];
static const float EPS = 1e-12f;

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[3] = {B, T, H}, hs[1] = {H};
    BqTensor *X = bq_arena_alloc(ctx->act, 3 * sizeof(BqTensor));
    X[0] = bq_tensor_wrap(x, gx, 3, s);
    X[1] = bq_tensor_wrap(w, gw, 1, hs);
    X[2] = bq_tensor_wrap(b, gb, 1, hs);
    return bq_op_layernorm(ctx, &X[0], &X[1], &X[2], EPS);
}

static void ref(double *out, void *ud) {
    (void)ud;
    for (int r = 0; r < B * T; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < H; i++) m += x[r * H + i];
        m /= H;
        for (int i = 0; i < H; i++) v += (x[r * H + i] - m) * (x[r * H + i] - m);
        v /= H;
        for (int i = 0; i < H; i++) out[r * H + i] = (x[r * H + i] - m) / sqrt(v + (double)EPS) * w[i] + b[i];
    }
}

int main(void) {
    bq_gc_fill_uniform(x, N, 71, -2, 2);
    bq_gc_fill_uniform(w, H, 72, 0.5f, 1.5f);
    bq_gc_fill_uniform(b, H, 73, -1, 1);
    /* forward vs double reference; a large offset exercises the two-pass variance */
    for (int i = 0; i < H; i++) x[i] += 1000.0f;
    BqArena act;
    bq_arena_init(&act, 1 << 20, "t");
    BqCtx ctx = {.act = &act};
    BqTensor *y = fwd(&ctx, NULL);
    double ferr = 0;
    for (int r = 0; r < B * T; r++) {
        double m = 0, v = 0;
        for (int i = 0; i < H; i++) m += x[r * H + i];
        m /= H;
        for (int i = 0; i < H; i++) v += (x[r * H + i] - m) * (x[r * H + i] - m);
        v /= H;
        for (int i = 0; i < H; i++) {
            double ref = (x[r * H + i] - m) / sqrt(v + EPS) * w[i] + b[i];
            double e = fabs(ref - y->data[r * H + i]);
            if (e > ferr) ferr = e;
        }
    }
    bq_arena_free(&act);
    for (int i = 0; i < H; i++) x[i] -= 1000.0f;
    int fails = ferr > 2e-4;
    printf("layernorm forward vs double reference: max abs err %.3e\n", ferr);
    double err = 0;
    BqGcInput in[3] = {{"x", x, gx, N}, {"w", w, gw, H}, {"b", b, gb, H}};
    fails += bq_gradcheck_ref("layernorm", fwd, ref, NULL, in, 3, 1e-3, &err);
    printf("test_grad_layernorm: max error %.3e, %s\n", err > ferr ? err : ferr, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
