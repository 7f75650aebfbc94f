/* The in-place (sole-consumer) variants of softmax and dropout, bq_op_softmax_mask_sole and
 * bq_op_dropout_sole:
 *  - gradient checks with a random-weighted loss on an input whose only consumer is the op (x + 0,
 *    exact), the softmax against a double-precision reference (scale 0.35, a key mask with zeros),
 *    the dropout (p = 0.3) by central differences (linear in x, large eps);
 *  - equality with bq_op_softmax_mask / bq_op_dropout: forward and input gradient bit for bit;
 *  - the softmax returns its input tensor (computed in place), the dropout's output shares the input's
 *    gradient buffer, and neither dropout variant saves anything on the tape (the mask is drawn again). */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "tests/gradcheck.h"

enum { B = 2, NH = 2, T = 5, N = B * NH * T * T };
static float x[N], gx[N], zero[N], mask[B * T];
static const float SCALE = 0.35f, P = 0.3f;
static int which; /* 0 softmax, 1 dropout */

static BqTensor *fwd(BqCtx *ctx, void *ud) {
    (void)ud;
    int64_t s[4] = {B, NH, T, T};
    BqTensor *X = bq_arena_alloc(ctx->act, 2 * sizeof(BqTensor));
    X[0] = bq_tensor_wrap(x, gx, 4, s);
    X[1] = bq_tensor_wrap(zero, NULL, 4, s);
    BqTensor *u = bq_op_add(ctx, &X[0], &X[1]); /* fresh, consumed only by the op under test */
    return which ? bq_op_dropout_sole(ctx, u, P) : bq_op_softmax_mask_sole(ctx, u, mask, SCALE, -FLT_MAX);
}

static void ref(double *out, void *ud) {
    (void)ud;
    for (int r = 0; r < B * NH * T; r++) {
        const float *mr = mask + (r / (NH * T)) * T;
        double mx = -INFINITY, sum = 0, v[T];
        for (int j = 0; j < T; j++) {
            v[j] = mr[j] > 0 ? SCALE * (double)x[r * T + j] : -INFINITY;
            if (v[j] > mx) mx = v[j];
        }
        for (int j = 0; j < T; j++) sum += v[j] == -INFINITY ? 0 : exp(v[j] - mx);
        for (int j = 0; j < T; j++) out[r * T + j] = v[j] == -INFINITY ? 0 : exp(v[j] - mx) / sum;
    }
}

/* Recorded pass of the plain (sole 0) or in-place (sole 1) op on x + 0; y and dx (prefilled 0.5). */
static void run(int op, int sole, const float *R, float *y, float *dx, int *shares, int *saved) {
    BqGcPass pass;
    bq_gc_pass_begin(&pass, 0, (size_t)1 << 24, 1, 99, 0);
    BqCtx *ctx = &pass.ctx;
    int64_t s[4] = {B, NH, T, T};
    for (int i = 0; i < N; i++) dx[i] = 0.5f;
    BqTensor X = bq_tensor_wrap(x, dx, 4, s), Z = bq_tensor_wrap(zero, NULL, 4, s);
    BqTensor *u = bq_op_add(ctx, &X, &Z), *out;
    if (op == 0)
        out = sole ? bq_op_softmax_mask_sole(ctx, u, mask, SCALE, -FLT_MAX) : bq_op_softmax_mask(ctx, u, mask, SCALE, -FLT_MAX);
    else
        out = sole ? bq_op_dropout_sole(ctx, u, P) : bq_op_dropout(ctx, u, P);
    *shares = op == 0 ? out == u : out->grad == u->grad;
    *saved = pass.tape.nodes[pass.tape.n - 1].saved != NULL;
    bq_gc_pass_end(&pass, out, R, y);
}

int main(void) {
    bq_gc_fill_uniform(x, N, 121, -3, 3);
    for (int i = 0; i < B * T; i++) mask[i] = (i % T) < T - 1 - i / T ? 1.0f : 0.0f; /* padded keys at the end */
    double err = 0, e;
    int fails = 0;
    BqGcInput in[1] = {{"x", x, gx, N}};
    which = 0;
    fails += bq_gradcheck_ref("softmax_mask_sole", fwd, ref, NULL, in, 1, 1e-3, &e), err = fmax(err, e);
    which = 1;
    fails += bq_gradcheck("dropout_sole", fwd, NULL, in, 1, 0.25, &e), err = fmax(err, e);

    static float R[N], y0[N], y1[N], d0[N], d1[N];
    bq_gc_fill_uniform(R, N, 122, -1, 1);
    const char *names[2] = {"softmax_mask", "dropout"};
    for (int op = 0; op < 2; op++) {
        int sh0, sh1, sv0, sv1;
        run(op, 0, R, y0, d0, &sh0, &sv0);
        run(op, 1, R, y1, d1, &sh1, &sv1);
        int dy = memcmp(y0, y1, sizeof y0) != 0, dd = memcmp(d0, d1, sizeof d0) != 0;
        printf("%s: in-place vs plain: forward %s, dx %s; %s; tape saves %s (plain) / %s (in place)\n", names[op],
               dy ? "DIFFER" : "bit-equal", dd ? "DIFFER" : "bit-equal",
               sh1 ? (op ? "output shares the input's gradient" : "output is the input tensor") : "NOT SHARED",
               sv0 ? "state" : "nothing", sv1 ? "state" : "nothing");
        fails += dy + dd + !sh1 + (op == 1 && (sv0 || sv1));
    }
    printf("test_grad_sole_ops: max error %.3e, %s\n", err, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
