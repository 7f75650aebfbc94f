/* Gradient check of bq_op_softmax_mask: y = softmax(scale·x + (1−mask)·mask_value) over the key axis,
 * with a mask containing zeros and mask_value = −FLT_MAX (HF BERT). Masked keys must get exactly 0
 * probability and 0 gradient; numerical side on a double reference. */
#include <float.h>
#include <math.h>
#include <stdio.h>

#include "tests/gradcheck.h"

enum { B = 2, NH = 2, T = 5, N = B * NH * T * T };
static float x[N], gx[N];
static const float mask[B * T] = {1, 1, 1, 0, 0, 1, 0, 1, 1, 1};
static const float SCALE = 0.57735f;

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[4] = {B, NH, T, T};
    BqTensor *X = bq_arena_alloc(ctx->act, sizeof(BqTensor));
    X[0] = bq_tensor_wrap(x, gx, 4, s);
    return bq_op_softmax_mask(ctx, &X[0], mask, SCALE, -FLT_MAX);
}

static void ref(double *out, void *ud) {
    (void)ud;
    for (int r = 0; r < B * NH * T; r++) {
        const float *m = mask + (r / (NH * T)) * T;
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < T; j++)
            if (m[j] != 0 && SCALE * (double)x[r * T + j] > mx) mx = SCALE * (double)x[r * T + j];
        for (int j = 0; j < T; j++) {
            out[r * T + j] = m[j] != 0 ? exp(SCALE * (double)x[r * T + j] - mx) : 0.0;
            s += out[r * T + j];
        }
        for (int j = 0; j < T; j++) out[r * T + j] /= s;
    }
}

int main(void) {
    bq_gc_fill_uniform(x, N, 101, -3, 3);
    double err = 0;
    BqGcInput in[1] = {{"x", x, gx, N}};
    int fails = bq_gradcheck_ref("softmax_mask", fwd, ref, NULL, in, 1, 1e-3, &err);
    /* masked keys: analytic gradient exactly the pre-filled value (nothing added) */
    for (int r = 0; r < B * NH * T; r++)
        for (int j = 0; j < T; j++)
            if (mask[(r / (NH * T)) * T + j] == 0 && gx[r * T + j] != 0.25f) {
                printf("  FAIL masked key got gradient at row %d key %d\n", r, j);
                fails++;
            }
    printf("test_grad_softmax_mask: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
