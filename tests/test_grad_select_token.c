/* Gradient check of bq_op_select_token: (B,T,H) → (B,H) at token t (t = 0 and t = T−1). */
#include <stdio.h>

#include "tests/gradcheck.h"

enum { B = 2, T = 5, H = 6, N = B * T * H };
static float x[N], gx[N];
static int64_t tok;

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[3] = {B, T, H};
    BqTensor *X = bq_arena_alloc(ctx->act, sizeof(BqTensor));
    X[0] = bq_tensor_wrap(x, gx, 3, s);
    return bq_op_select_token(ctx, &X[0], tok);
}

int main(void) {
    bq_gc_fill_uniform(x, N, 121, -1, 1);
    double e1 = 0, e2 = 0;
    BqGcInput in[1] = {{"x", x, gx, N}};
    int fails = bq_gradcheck("select_token(t=0)", fwd, NULL, in, 1, 0.5, &e1);
    tok = T - 1;
    fails += bq_gradcheck("select_token(t=T-1)", fwd, NULL, in, 1, 0.5, &e2);
    printf("test_grad_select_token: max error %.3e, %s\n", e1 > e2 ? e1 : e2, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
