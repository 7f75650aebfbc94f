/* Gradient check of bq_op_embedding with repeated ids (scatter-add must accumulate) and unused rows
 * (gradient must stay untouched). */
#include <stdio.h>

#include "tests/gradcheck.h"

enum { V = 7, H = 6, B = 2, T = 5 };
static float tab[V * H], gtab[V * H];
static const int32_t ids[B * T] = {3, 0, 3, 6, 1, 3, 3, 0, 5, 6};

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[2] = {V, H};
    BqTensor *X = bq_arena_alloc(ctx->act, sizeof(BqTensor));
    X[0] = bq_tensor_wrap(tab, gtab, 2, s);
    return bq_op_embedding(ctx, &X[0], ids, B, T);
}

int main(void) {
    bq_gc_fill_uniform(tab, V * H, 61, -1, 1);
    double err = 0;
    BqGcInput in[1] = {{"table", tab, gtab, V * H}};
    int fails = bq_gradcheck("embedding", fwd, NULL, in, 1, 0.5, &err);
    printf("test_grad_embedding: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
