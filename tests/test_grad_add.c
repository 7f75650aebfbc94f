/* Gradient check of bq_op_add: same shapes, and a bias of shape (H) broadcast over (B,T,H). */
#include <stdio.h>

#include "tests/gradcheck.h"

enum { B = 2, T = 5, H = 6, N = B * T * H };
static float a[N], ga[N], b[N], gb[N];
static int bcast;

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[3] = {B, T, H}, hs[1] = {H};
    BqTensor *X = bq_arena_alloc(ctx->act, 2 * sizeof(BqTensor));
    X[0] = bq_tensor_wrap(a, ga, 3, s);
    X[1] = bcast ? bq_tensor_wrap(b, gb, 1, hs) : bq_tensor_wrap(b, gb, 3, s);
    return bq_op_add(ctx, &X[0], &X[1]);
}

int main(void) {
    bq_gc_fill_uniform(a, N, 31, -1, 1);
    bq_gc_fill_uniform(b, N, 32, -1, 1);
    double e1 = 0, e2 = 0;
    BqGcInput in[2] = {{"a", a, ga, N}, {"b", b, gb, N}};
    int fails = bq_gradcheck("add", fwd, NULL, in, 2, 0.5, &e1);
    bcast = 1;
    BqGcInput in2[2] = {{"a", a, ga, N}, {"bias", b, gb, H}};
    fails += bq_gradcheck("add(broadcast bias)", fwd, NULL, in2, 2, 0.5, &e2);
    printf("test_grad_add: max error %.3e, %s\n", e1 > e2 ? e1 : e2, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
