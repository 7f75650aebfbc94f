/* Gradient check of bq_op_linear (y = x·Wᵀ + b) by central differences: dx, dW, db, with and without
 * bias, and with a frozen weight (NULL grad) which must be skipped. */
#include <stdio.h>

#include "tests/gradcheck.h"

enum { N = 2 * 5, C = 6, OC = 7 };
static float x[N * C], gx[N * C], w[OC * C], gw[OC * C], b[OC], gb[OC];
static int use_bias = 1, frozen_w = 0;

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t xs[3] = {2, 5, C}, ws[2] = {OC, C}, bs[1] = {OC};
    BqTensor *X = bq_arena_alloc(ctx->act, 3 * sizeof(BqTensor));
    X[0] = bq_tensor_wrap(x, gx, 3, xs);
    X[1] = bq_tensor_wrap(w, frozen_w ? NULL : gw, 2, ws);
    X[2] = bq_tensor_wrap(b, gb, 1, bs);
    return bq_op_linear(ctx, &X[0], &X[1], use_bias ? &X[2] : NULL);
}

int main(void) {
    bq_gc_fill_uniform(x, N * C, 1, -1, 1);
    bq_gc_fill_uniform(w, OC * C, 2, -1, 1);
    bq_gc_fill_uniform(b, OC, 3, -1, 1);
    double e1 = 0, e2 = 0, e3 = 0;
    BqGcInput in[3] = {{"x", x, gx, N * C}, {"W", w, gw, OC * C}, {"b", b, gb, OC}};
    /* linear in each element: exact central differences, so a large eps avoids float rounding noise */
    int fails = bq_gradcheck("linear", fwd, NULL, in, 3, 0.5, &e1);
    use_bias = 0;
    fails += bq_gradcheck("linear(no bias)", fwd, NULL, in, 2, 0.5, &e2);
    use_bias = 1, frozen_w = 1;
    BqGcInput in2[2] = {{"x", x, gx, N * C}, {"b", b, gb, OC}};
    fails += bq_gradcheck("linear(frozen W)", fwd, NULL, in2, 2, 0.5, &e3);
    double m = e1 > e2 ? e1 : e2;
    m = m > e3 ? m : e3;
    printf("test_grad_linear: max error %.3e, %s\n", m, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
