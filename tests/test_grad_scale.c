/* Gradient check of bq_op_scale (y = s·x). */
#include <stdio.h>

#include "autograd/gradcheck.h"

enum { B = 2, T = 5, H = 6, N = B * T * H };
static float x[N], gx[N];

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[3] = {B, T, H};
    BqTensor *X = bq_arena_alloc(ctx->act, sizeof(BqTensor));
    X[0] = bq_tensor_wrap(x, gx, 3, s);
    return bq_op_scale(ctx, &X[0], -0.37f);
}

int main(void) {
    bq_gc_fill_uniform(x, N, 51, -1, 1);
    double err = 0;
    BqGcInput in[1] = {{"x", x, gx, N}};
    int fails = bq_gradcheck("scale", fwd, NULL, in, 1, 0.5, &err);
    printf("test_grad_scale: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
