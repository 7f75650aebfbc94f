/* Gradient check of bq_op_attn_context: ctx[b,i,h·d+e] = Σ_j p[b,h,i,j]·v[b,j,h·d+e], written
 * head-merged into (B,T,H); B=2, T=5, H=6, NH=2. */
#include <stdio.h>

#include "tests/gradcheck.h"

enum { B = 2, T = 5, H = 6, NH = 2, NV = B * T * H, NP = B * NH * T * T };
static float p[NP], gp[NP], v[NV], gv[NV];

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t vs[3] = {B, T, H}, ps[4] = {B, NH, T, T};
    BqTensor *X = bq_arena_alloc(ctx->act, 2 * sizeof(BqTensor));
    X[0] = bq_tensor_wrap(p, gp, 4, ps);
    X[1] = bq_tensor_wrap(v, gv, 3, vs);
    return bq_op_attn_context(ctx, &X[0], &X[1], NH);
}

int main(void) {
    bq_gc_fill_uniform(p, NP, 21, 0, 1);
    bq_gc_fill_uniform(v, NV, 22, -1, 1);
    BqGcInput in[2] = {{"probs", p, gp, NP}, {"v", v, gv, NV}};
    double err = 0;
    int fails = bq_gradcheck("attn_context", fwd, NULL, in, 2, 0.5, &err); /* bilinear: exact differences */
    printf("test_grad_attn_context: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
