/* Gradient check of bq_op_gelu (exact erf form): forward and central differences against
 * x·Φ(x) = 0.5·x·(1 + erf(x/√2)) in double. */
#include <math.h>
#include <stdio.h>

#include "tests/gradcheck.h"

enum { B = 2, T = 5, H = 6, N = B * T * H };
static float x[N], gx[N];

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[3] = {B, T, H};
    BqTensor *X = bq_arena_alloc(ctx->act, sizeof(BqTensor));
    X[0] = bq_tensor_wrap(x, gx, 3, s);
    return bq_op_gelu(ctx, &X[0]);
}

static void ref(double *out, void *ud) {
    (void)ud;
    for (int i = 0; i < N; i++) out[i] = 0.5 * x[i] * (1.0 + erf(x[i] / sqrt(2.0)));
}

int main(void) {
    bq_gc_fill_uniform(x, N, 81, -4, 4);
    double err = 0;
    BqGcInput in[1] = {{"x", x, gx, N}};
    int fails = bq_gradcheck_ref("gelu", fwd, ref, NULL, in, 1, 1e-3, &err);
    printf("test_grad_gelu: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
