/* Gradient check of bq_op_attn_scores: scores[b,h,i,j] = Σ_e q[b,i,h·d+e]·k[b,j,h·d+e] with heads as
 * strided views of (B,T,H); B=2, T=5, H=6, NH=2 (d=3). */
#include <stdio.h>

#include "tests/gradcheck.h"

enum { B = 2, T = 5, H = 6, NH = 2, N = B * T * H };
static float q[N], gq[N], k[N], gk[N];

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[3] = {B, T, H};
    BqTensor *X = bq_arena_alloc(ctx->act, 2 * sizeof(BqTensor));
    X[0] = bq_tensor_wrap(q, gq, 3, s);
    X[1] = bq_tensor_wrap(k, gk, 3, s);
    return bq_op_attn_scores(ctx, &X[0], &X[1], NH);
}

int main(void) {
    bq_gc_fill_uniform(q, N, 11, -1, 1);
    bq_gc_fill_uniform(k, N, 12, -1, 1);
    BqGcInput in[2] = {{"q", q, gq, N}, {"k", k, gk, N}};
    double err = 0;
    int fails = bq_gradcheck("attn_scores", fwd, NULL, in, 2, 0.5, &err); /* bilinear: exact differences */
    printf("test_grad_attn_scores: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
