/* Gradient check of bq_op_span_cross_entropy (BertForQuestionAnswering's loss) through the logits
 * (B=4, T=6, 2): the numerical side differentiates a double reference of (CE_start + CE_end) / 2
 * with HF's ignored index T (one start and two ends ignored here). Also checks the forward against
 * the reference when every example of one side is ignored (that side contributes 0) and with logits
 * ~1e4 (finite). */
#include <math.h>
#include <stdio.h>

#include "tests/gradcheck.h"

enum { B = 4, T = 6, N = B * T * 2 };
static float z[N], gz[N];
/* (start, end) per example; T = 6 is the ignored index */
static int32_t pos[2 * B] = {0, 3, 2, 6, 6, 5, 4, 6};

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[3] = {B, T, 2};
    BqTensor *X = bq_arena_alloc(ctx->act, sizeof(BqTensor));
    X[0] = bq_tensor_wrap(z, gz, 3, s);
    return bq_op_span_cross_entropy(ctx, &X[0], pos);
}

static void ref(double *out, void *ud) {
    (void)ud;
    double l = 0;
    for (int k = 0; k < 2; k++) {
        double side = 0;
        int n = 0;
        for (int b = 0; b < B; b++) {
            int y = pos[2 * b + k];
            if (y >= T) continue;
            double mx = -INFINITY, s = 0;
            for (int t = 0; t < T; t++) mx = fmax(mx, z[(b * T + t) * 2 + k]);
            for (int t = 0; t < T; t++) s += exp(z[(b * T + t) * 2 + k] - mx);
            side += mx + log(s) - z[(b * T + y) * 2 + k];
            n++;
        }
        if (n) l += side / n;
    }
    out[0] = l / 2;
}

/* Forward only, against the reference; returns 1 on mismatch. */
static int check_forward(const char *what) {
    BqArena act;
    bq_arena_init(&act, 1 << 20, "t");
    BqCtx ctx = {.act = &act};
    BqTensor *L = fwd(&ctx, NULL);
    double r;
    ref(&r, NULL);
    int bad = !isfinite(L->data[0]) || fabs(L->data[0] - r) > 1e-5 * fabs(r) + 1e-5;
    printf("span_cross_entropy %s: loss %.6g, reference %.6g%s\n", what, L->data[0], r, bad ? " FAIL" : "");
    bq_arena_free(&act);
    return bad;
}

int main(void) {
    bq_gc_fill_uniform(z, N, 977, -2, 2);
    double err = 0;
    BqGcInput in[1] = {{"logits", z, gz, N}};
    int fails = bq_gradcheck_ref("span_cross_entropy", fwd, ref, NULL, in, 1, 1e-3, &err);
    /* every end ignored: the loss is CE_start / 2 */
    for (int b = 0; b < B; b++) pos[2 * b + 1] = T;
    fails += check_forward("with every end ignored");
    double err2 = 0;
    fails += bq_gradcheck_ref("span_cross_entropy (ends ignored)", fwd, ref, NULL, in, 1, 1e-3, &err2);
    err = fmax(err, err2);
    for (int i = 0; i < N; i++) z[i] *= 5000.0f;
    fails += check_forward("with logits ~1e4");
    printf("test_grad_span_cross_entropy: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
