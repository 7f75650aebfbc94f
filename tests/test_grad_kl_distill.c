/* Gradient check of bq_op_kl_distill through the student logits (B=4, C=3) at temperatures 1, 2 and 4,
 * on a double-precision reference of T²·(1/B)·Σ_b KL(softmax(t/T) ‖ softmax(s/T)); the teacher logits are
 * a constant (no gradient). Also: equal logits give a loss of 0, and logits ~1e4 stay finite. */
#include <math.h>
#include <stdio.h>

#include "tests/gradcheck.h"

enum { B = 4, C = 3, N = B * C };
static float s[N], gs[N], t[N];
static float temp;

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t sh[2] = {B, C};
    BqTensor *X = bq_arena_alloc(ctx->act, 2 * sizeof(BqTensor));
    X[0] = bq_tensor_wrap(s, gs, 2, sh);
    X[1] = bq_tensor_wrap(t, NULL, 2, sh);
    return bq_op_kl_distill(ctx, &X[0], &X[1], temp);
}

static double log_softmax_ref(const float *z, int c, double T) {
    double mx = z[0] / T, sum = 0;
    for (int k = 1; k < C; k++) mx = fmax(mx, z[k] / T);
    for (int k = 0; k < C; k++) sum += exp(z[k] / T - mx);
    return z[c] / T - mx - log(sum);
}

static void ref(double *out, void *ud) {
    (void)ud;
    double total = 0, T = temp;
    for (int b = 0; b < B; b++)
        for (int c = 0; c < C; c++) {
            double lpt = log_softmax_ref(t + b * C, c, T), lps = log_softmax_ref(s + b * C, c, T);
            total += exp(lpt) * (lpt - lps);
        }
    out[0] = T * T * total / B;
}

int main(void) {
    int fails = 0;
    double err = 0;
    const float temps[3] = {1.0f, 2.0f, 4.0f};
    for (int k = 0; k < 3; k++) {
        temp = temps[k];
        bq_gc_fill_uniform(s, N, 71 + k, -3, 3);
        bq_gc_fill_uniform(t, N, 91 + k, -3, 3);
        double e = 0;
        char name[48];
        snprintf(name, sizeof name, "kl_distill(T=%g)", temp);
        BqGcInput in[1] = {{"student", s, gs, N}};
        fails += bq_gradcheck_ref(name, fwd, ref, NULL, in, 1, 1e-3, &e);
        if (e > err) err = e;
    }
    BqArena act;
    bq_arena_init(&act, 1 << 20, "t");
    BqCtx ctx = {.act = &act};
    /* identical distributions: KL is 0 */
    for (int i = 0; i < N; i++) t[i] = s[i];
    BqTensor *L = fwd(&ctx, NULL);
    printf("kl_distill with student == teacher: %.3g\n", L->data[0]);
    if (fabsf(L->data[0]) > 1e-6f) fails++;
    /* stability: huge logits */
    bq_gc_fill_uniform(t, N, 5, -1, 1);
    for (int i = 0; i < N; i++) s[i] *= 5000.0f, t[i] *= 5000.0f;
    temp = 2.0f;
    L = fwd(&ctx, NULL);
    double r;
    ref(&r, NULL);
    printf("kl_distill with logits ~1e4: %.6g, reference %.6g\n", L->data[0], r);
    if (!isfinite(L->data[0]) || fabs(L->data[0] - r) > 1e-5 * fabs(r) + 1e-5) fails++;
    bq_arena_free(&act);
    printf("test_grad_kl_distill: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
