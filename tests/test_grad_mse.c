/* Gradient check of bq_op_mse (mean over every element of (x − y)², shapes (B,T,H) = (2,3,5)) through
 * both inputs, and of bq_op_scale (y = a·x) through its input. Both are quadratic or linear in each
 * element, so a large eps leaves no truncation error worth the name. */
#include <stdio.h>

#include "tests/gradcheck.h"

enum { B = 2, T = 3, H = 5, N = B * T * H };
static float x[N], gx[N], y[N], gy[N];

static BqTensor *fwd_mse(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t sh[3] = {B, T, H};
    BqTensor *X = bq_arena_alloc(ctx->act, 2 * sizeof(BqTensor));
    X[0] = bq_tensor_wrap(x, gx, 3, sh);
    X[1] = bq_tensor_wrap(y, gy, 3, sh);
    return bq_op_mse(ctx, &X[0], &X[1]);
}

static void ref_mse(double *out, void *ud) {
    (void)ud;
    double s = 0;
    for (int i = 0; i < N; i++) s += ((double)x[i] - y[i]) * ((double)x[i] - y[i]);
    out[0] = s / N;
}

static BqTensor *fwd_scale(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t sh[3] = {B, T, H};
    BqTensor *X = bq_arena_alloc(ctx->act, sizeof(BqTensor));
    X[0] = bq_tensor_wrap(x, gx, 3, sh);
    return bq_op_scale(ctx, &X[0], -0.37f);
}

int main(void) {
    bq_gc_fill_uniform(x, N, 41, -2, 2);
    bq_gc_fill_uniform(y, N, 42, -2, 2);
    double e1 = 0, e2 = 0;
    BqGcInput in[2] = {{"x", x, gx, N}, {"y", y, gy, N}};
    int fails = bq_gradcheck_ref("mse", fwd_mse, ref_mse, NULL, in, 2, 1e-2, &e1);
    BqGcInput in1[1] = {{"x", x, gx, N}};
    fails += bq_gradcheck("scale", fwd_scale, NULL, in1, 1, 0.5, &e2);
    printf("test_grad_mse: max error %.3e, %s\n", e1 > e2 ? e1 : e2, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
