/* Gradient check of bq_op_dropout (p = 0.3, training): the mask is the same for every evaluation with
 * the same key and counter, so the op is linear in x and the differences are exact. Also checks: the
 * kept fraction is near 1−p, kept values are x/(1−p), the counter advances per call (two calls give
 * different masks), identity (same tensor) when not training or p = 0. */
#include <math.h>
#include <stdio.h>

#include "tests/gradcheck.h"

enum { B = 2, T = 5, H = 6, N = B * T * H, NBIG = 20000 };
static float x[N], gx[N];
static const float P = 0.3f;

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[3] = {B, T, H};
    BqTensor *X = bq_arena_alloc(ctx->act, sizeof(BqTensor));
    X[0] = bq_tensor_wrap(x, gx, 3, s);
    return bq_op_dropout(ctx, &X[0], P);
}

int main(void) {
    bq_gc_fill_uniform(x, N, 111, 0.5f, 1.5f); /* nonzero, so a dropped element is recognisable */
    double err = 0;
    BqGcInput in[1] = {{"x", x, gx, N}};
    int fails = bq_gradcheck("dropout", fwd, NULL, in, 1, 0.25, &err);

    static float big[NBIG];
    for (int i = 0; i < NBIG; i++) big[i] = 1.0f;
    BqArena act;
    bq_arena_init(&act, 1 << 24, "t");
    BqCtx ctx = {.act = &act, .training = 1, .rng_key = 77};
    int64_t nb = NBIG;
    BqTensor X = bq_tensor_wrap(big, NULL, 1, &nb);
    BqTensor *y1 = bq_op_dropout(&ctx, &X, P), *y2 = bq_op_dropout(&ctx, &X, P);
    int kept = 0, same = 0, badval = 0;
    for (int i = 0; i < NBIG; i++) {
        kept += y1->data[i] != 0;
        same += (y1->data[i] != 0) == (y2->data[i] != 0);
        if (y1->data[i] != 0 && y1->data[i] != 1.0f / (1.0f - P)) badval++;
    }
    double frac = (double)kept / NBIG;
    printf("dropout: kept fraction %.4f (expect %.2f), masks of 2 calls agree on %.3f, bad values %d\n", frac,
           1 - P, (double)same / NBIG, badval);
    if (fabs(frac - (1 - P)) > 0.02 || same > NBIG * 0.7 || badval || ctx.rng_count != 2) fails++;
    ctx.training = 0;
    if (bq_op_dropout(&ctx, &X, P) != &X) fails++;
    ctx.training = 1;
    if (bq_op_dropout(&ctx, &X, 0.0f) != &X) fails++;
    bq_arena_free(&act);
    printf("test_grad_dropout: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
