/* Gradient check of bq_op_tanh (backward from the saved output) against tanh in double. */
#include <math.h>
#include <stdio.h>

#include "tests/gradcheck.h"

enum { B = 2, H = 7, N = B * H };
static float x[N], gx[N];

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[2] = {B, H};
    BqTensor *X = bq_arena_alloc(ctx->act, sizeof(BqTensor));
    X[0] = bq_tensor_wrap(x, gx, 2, s);
    return bq_op_tanh(ctx, &X[0]);
}

static void ref(double *out, void *ud) {
    (void)ud;
    for (int i = 0; i < N; i++) out[i] = tanh((double)x[i]);
}

int main(void) {
    bq_gc_fill_uniform(x, N, 91, -2, 2);
    double err = 0;
    BqGcInput in[1] = {{"x", x, gx, N}};
    int fails = bq_gradcheck_ref("tanh", fwd, ref, NULL, in, 1, 1e-3, &err);
    printf("test_grad_tanh: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
