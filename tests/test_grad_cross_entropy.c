/* Gradient check of bq_op_cross_entropy through the logits (B=3, C=5): loss = mean_b −log softmax.
 * Numerical side on a double log-sum-exp reference; also a stability check with logits ~1e4. */
#include <math.h>
#include <stdio.h>

#include "tests/gradcheck.h"

enum { B = 3, C = 5, N = B * C };
static float z[N], gz[N];
static const int32_t labels[B] = {4, 0, 2};

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[2] = {B, C};
    BqTensor *X = bq_arena_alloc(ctx->act, sizeof(BqTensor));
    X[0] = bq_tensor_wrap(z, gz, 2, s);
    return bq_op_cross_entropy(ctx, &X[0], labels);
}

static void ref(double *out, void *ud) {
    (void)ud;
    double total = 0;
    for (int b = 0; b < B; b++) {
        double mx = z[b * C];
        for (int c = 1; c < C; c++) mx = fmax(mx, z[b * C + c]);
        double s = 0;
        for (int c = 0; c < C; c++) s += exp(z[b * C + c] - mx);
        total += mx + log(s) - z[b * C + labels[b]];
    }
    out[0] = total / B;
}

int main(void) {
    bq_gc_fill_uniform(z, N, 131, -2, 2);
    double err = 0;
    BqGcInput in[1] = {{"logits", z, gz, N}};
    int fails = bq_gradcheck_ref("cross_entropy", fwd, ref, NULL, in, 1, 1e-3, &err);
    /* stability: huge logits must give a finite loss equal to the reference */
    for (int i = 0; i < N; i++) z[i] = z[i] * 5000.0f;
    BqArena act;
    bq_arena_init(&act, 1 << 20, "t");
    BqCtx ctx = {.act = &act};
    BqTensor *L = fwd(&ctx, NULL);
    double r;
    ref(&r, NULL);
    printf("cross_entropy with logits ~1e4: loss %.6g, reference %.6g\n", L->data[0], r);
    if (!isfinite(L->data[0]) || fabs(L->data[0] - r) > 1e-5 * fabs(r) + 1e-5) fails++;
    bq_arena_free(&act);
    printf("test_grad_cross_entropy: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
