/* bq_op_bias_gelu / bq_op_bias_gelu_sole (y = gelu(x + b), exact erf form):
 *  - gradient checks (dx, db) with a random-weighted loss against a double-precision reference, with
 *    and without the bias, and for the sole-consumer variant (output sharing the input's gradient);
 *  - equality with the unfused sequence bq_op_gelu(bq_op_add(x, b)): forward and backward (dx, db)
 *    bit for bit, since the fused kernel does the same float operations in the same order;
 *  - 1 against 2 threads on a size that runs in parallel: same bits.
 * C = 70 spans two column blocks of the bias-gradient reduction. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/gradcheck.h"

enum { B = 2, T = 3, C = 70, N = B * T * C };
static float x[N], gx[N], b[C], gb[C];
static float zero[N];
static int use_bias, sole;

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[3] = {B, T, C}, cs[1] = {C};
    BqTensor *X = bq_arena_alloc(ctx->act, 3 * sizeof(BqTensor));
    X[0] = bq_tensor_wrap(x, gx, 3, s);
    X[1] = bq_tensor_wrap(b, gb, 1, cs);
    X[2] = bq_tensor_wrap(zero, NULL, 3, s);
    if (sole) /* a fresh tensor (x + 0, exact) whose only consumer is the op under test */
        return bq_op_bias_gelu_sole(ctx, bq_op_add(ctx, &X[0], &X[2]), use_bias ? &X[1] : NULL);
    return bq_op_bias_gelu(ctx, &X[0], use_bias ? &X[1] : NULL);
}

static void ref(double *out, void *ud) {
    (void)ud;
    for (int i = 0; i < N; i++) {
        double v = (double)x[i] + (use_bias ? (double)b[i % C] : 0.0);
        out[i] = 0.5 * v * (1.0 + erf(v / sqrt(2.0)));
    }
}

/* One recorded pass at size (rows, cols) with `threads`: y, dx and db (prefilled with 0.5) after
 * backward of Σ y⊙R. mode 0: fused, 1: fused sole, 2: gelu(add(x, b)). */
static void run(int mode, int threads, const float *xin, const float *bin, const float *R, int64_t rows, int64_t cols,
                float *y, float *dx, float *db) {
    BqGcPass pass;
    bq_gc_pass_begin(&pass, threads, (size_t)1 << 28, 1, 0, 0);
    BqCtx *ctx = &pass.ctx;
    int64_t n = rows * cols, s[2] = {rows, cols}, cs[1] = {cols};
    for (int64_t i = 0; i < n; i++) dx[i] = 0.5f;
    for (int64_t i = 0; i < cols; i++) db[i] = 0.5f;
    BqTensor X = bq_tensor_wrap((float *)xin, dx, 2, s), Bt = bq_tensor_wrap((float *)bin, db, 1, cs);
    float *zz = bq_arena_alloc_zero(ctx->act, (size_t)n * sizeof(float));
    BqTensor Z = bq_tensor_wrap(zz, NULL, 2, s);
    BqTensor *out = mode == 0 ? bq_op_bias_gelu(ctx, &X, &Bt)
                  : mode == 1 ? bq_op_bias_gelu_sole(ctx, bq_op_add(ctx, &X, &Z), &Bt)
                              : bq_op_gelu(ctx, bq_op_add(ctx, &X, &Bt));
    bq_gc_pass_end(&pass, out, R, y);
}

int main(void) {
    bq_gc_fill_uniform(x, N, 91, -4, 4);
    bq_gc_fill_uniform(b, C, 92, -1, 1);
    double err = 0, e;
    int fails = 0;
    BqGcInput in[2] = {{"x", x, gx, N}, {"b", b, gb, C}};
    use_bias = 1, sole = 0;
    fails += bq_gradcheck_ref("bias_gelu", fwd, ref, NULL, in, 2, 1e-3, &e), err = fmax(err, e);
    use_bias = 0;
    fails += bq_gradcheck_ref("bias_gelu (no bias)", fwd, ref, NULL, in, 1, 1e-3, &e), err = fmax(err, e);
    use_bias = 1, sole = 1;
    fails += bq_gradcheck_ref("bias_gelu_sole", fwd, ref, NULL, in, 2, 1e-3, &e), err = fmax(err, e);

    /* fused against unfused, and threads, at (4096, 96): N·C above the kernels' parallel threshold */
    enum { R_ = 4096, C_ = 96, N_ = R_ * C_ };
    static float X[N_], Bv[C_], Rw[N_], y[3][2][N_], dx[3][2][N_], db[3][2][C_];
    bq_gc_fill_uniform(X, N_, 93, -5, 5);
    bq_gc_fill_uniform(Bv, C_, 94, -1, 1);
    bq_gc_fill_uniform(Rw, N_, 95, -1, 1);
    for (int mode = 0; mode < 3; mode++)
        for (int t = 0; t < 2; t++) run(mode, t + 1, X, Bv, Rw, R_, C_, y[mode][t], dx[mode][t], db[mode][t]);
    const char *names[3] = {"fused", "fused sole", "unfused gelu(add)"};
    for (int mode = 0; mode < 3; mode++) {
        int64_t d = bq_gc_ndiff(y[mode][0], y[mode][1], N_) + bq_gc_ndiff(dx[mode][0], dx[mode][1], N_) +
                    bq_gc_ndiff(db[mode][0], db[mode][1], C_);
        printf("%-18s 1 vs 2 threads: %lld values differ\n", names[mode], (long long)d);
        fails += d != 0;
    }
    for (int mode = 0; mode < 2; mode++) {
        int64_t dy = bq_gc_ndiff(y[mode][1], y[2][1], N_), ddx = bq_gc_ndiff(dx[mode][1], dx[2][1], N_),
                ddb = bq_gc_ndiff(db[mode][1], db[2][1], C_);
        printf("%-18s vs unfused: forward %lld, dx %lld, db %lld values differ (bit-equal expected)\n", names[mode],
               (long long)dy, (long long)ddx, (long long)ddb);
        fails += dy + ddx + ddb != 0;
    }
    printf("test_grad_bias_gelu: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
