/* bq_op_fakequant, exactly: forward values against the scalar formula q = clamp(rne(x/s), qmin, qmax),
 * y = q·s (true division, nearbyintf under the default rounding mode), including ties x/s = k + 0.5
 * (→ even) and saturation at -128/127; a value that rounds to the code 0 dequantizes to +0 (the integer
 * code has no sign, as in ONNX QuantizeLinear/DequantizeLinear and PyTorch's integer round trip). The
 * straight-through gradient adds exactly dy to the input's gradient where qmin <= rne(x/s) <= qmax (the
 * rounded value, as torch.fake_quantize_per_tensor_affine) and adds nothing elsewhere (checked on points
 * away from rounding and saturation edges, plus the edges: x/s = 127.4 and 127.5 (tie → 128), −128.4 and
 * −128.5 (tie → −128) and −128.6). The input's gradient buffer starts at a nonzero constant, so a backward
 * that overwrites instead of accumulating fails (gradient accumulation over micro-batches relies on +=);
 * where the op is the input's sole consumer the buffer is the output's gradient, which the mask edits in
 * place. Per tensor, per channel along axis 0 of a (OC,C) weight and along axis 1 of a (B,T,H) tensor;
 * each also as the sole consumer (shared gradient buffer) and as the sole consumer of a recorded op's
 * output (quantized in place with the mask kept as bits, per tensor; a length not a multiple of 32 and
 * the threaded path included). Central differences do not apply (the true derivative is 0 almost
 * everywhere), so this test is exact instead: every value is compared bit for bit (memcmp, so the sign
 * of a zero counts). Prints the max error. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "autograd/tensor.h"

static int fails = 0;
static double max_err = 0.0;

/* What every input gradient buffer holds before the backward: a backward must add to it. Any nonzero
 * value does; this one is exact in binary and not a possible dy. */
#define GRAD_PREFILL 0.375f

/* got and want must have the same bits. */
static void expect(const char *what, int64_t i, float got, float want) {
    double e = fabs((double)got - (double)want);
    if (e > max_err || isnan(e)) max_err = isnan(e) ? INFINITY : e;
    if (memcmp(&got, &want, sizeof got) != 0) {
        if (fails < 10) printf("  FAIL %s[%lld]: got %.9g want %.9g\n", what, (long long)i, got, want);
        fails++;
    }
}

/* Runs the op (recorded) on x with scales along axis, seeds out->grad = dy, backward; checks y and dx
 * against the scalar formula element by element. */
static void check_case(const char *name, float *x, int ndim, const int64_t *shape, const float *scale,
                       int64_t nscale, int axis, int qmin, int qmax, int sole) {
    BqArena act;
    bq_arena_init(&act, (size_t)1 << 28, "t");
    BqTape tape;
    bq_tape_init(&tape, 4);
    BqCtx ctx = {.act = &act, .tape = &tape};
    BqTensor X = bq_tensor_wrap(x, NULL, ndim, shape);
    int64_t n = bq_tensor_numel(&X);
    X.grad = bq_arena_alloc(&act, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) X.grad[i] = GRAD_PREFILL;
    /* sole == 2: the input is a recorded op's output (x + 0), which the sole-consumer op may quantize in
     * place with its mask as bits (per tensor); X's gradient is then the add's pass-through of dx */
    BqTensor *in = &X;
    if (sole == 2) {
        BqTensor *zero = bq_tensor_new(&ctx, ndim, shape);
        memset(zero->data, 0, (size_t)n * sizeof(float));
        in = bq_op_add(&ctx, &X, zero);
    }
    BqTensor *y = sole ? bq_op_fakequant_sole(&ctx, in, scale, nscale, axis, qmin, qmax)
                       : bq_op_fakequant(&ctx, in, scale, nscale, axis, qmin, qmax);
    if (sole && y->grad != in->grad) {
        printf("  FAIL %s: the sole-consumer op did not share the input's gradient buffer\n", name);
        fails++;
    }
    if (sole == 2 && (y == in) != (nscale == 1)) {
        printf("  FAIL %s: quantized %s, expected %s\n", name, y == in ? "in place" : "into a copy",
               nscale == 1 ? "in place (per tensor, input made by a recorded op)" : "into a copy (per channel)");
        fails++;
    }
    BqRng r;
    bq_rng_seed(&r, 5);
    float *dy = bq_arena_alloc(&act, (size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) y->grad[i] = dy[i] = 0.5f + (float)bq_rng_uniform(&r); /* nonzero dy */
    float one = 0, g = 0;
    int64_t sh1 = 1;
    BqTensor seed = bq_tensor_wrap(&one, &g, 1, &sh1);
    bq_backward(&ctx, &seed);
    int64_t inner = 1;
    if (nscale > 1)
        for (int k = axis + 1; k < ndim; k++) inner *= shape[k];
    int ok0 = fails;
    for (int64_t i = 0; i < n; i++) {
        float s = nscale > 1 ? scale[(i / inner) % nscale] : scale[0];
        float v = x[i] / s;
        float q = nearbyintf(v) + 0.0f; /* the code: −0 becomes +0 */
        if (q < (float)qmin) q = (float)qmin;
        if (q > (float)qmax) q = (float)qmax;
        expect(name, i, y->data[i], q * s);
        float pass = (nearbyintf(v) >= (float)qmin && nearbyintf(v) <= (float)qmax) ? dy[i] : 0.0f;
        /* sole == 1: X's buffer is y's (seeded with dy above), masked in place; otherwise dx accumulates */
        expect(name, i, X.grad[i], sole == 1 ? pass : GRAD_PREFILL + pass);
    }
    printf("fakequant %s%s: %lld elements %s\n", name,
           sole == 2 ? " (sole consumer of an op's output: in place, mask as bits, where per tensor)"
           : sole    ? " (sole consumer, shared gradient)"
                     : "",
           (long long)n, fails == ok0 ? "exact" : "MISMATCH");
    bq_tape_free(&tape);
    bq_arena_free(&act);
}

int main(void) {
    /* 1. named points, per tensor, s = 0.5 (power of two: x/s exact) */
    const float s = 0.5f;
    struct {
        float xs; /* x/s */
        float q;
        int grad;
    } pts[] = {
        {0.5f, 0, 1},      {1.5f, 2, 1},      {2.5f, 2, 1},      {-0.5f, 0.0f, 1},  {-1.5f, -2, 1},
        {-2.5f, -2, 1},    {3.2f, 3, 1},      {-3.7f, -4, 1},    {126.5f, 126, 1},  {-127.5f, -128, 1},
        {127.0f, 127, 1},  {-128.0f, -128, 1}, {127.4f, 127, 1}, {126.6f, 127, 1},  {-128.4f, -128, 1},
        {-127.6f, -128, 1}, {200.0f, 127, 0},  {-300.0f, -128, 0}, {0.0f, 0, 1},    {127.5f, 127, 0},
        {-128.5f, -128, 1}, {-128.6f, -128, 0}, {127.6f, 127, 0},
    };
    int np = (int)(sizeof pts / sizeof pts[0]);
    float xp[32], gx[32];
    for (int i = 0; i < np; i++) xp[i] = pts[i].xs * s, gx[i] = GRAD_PREFILL;
    {
        BqArena act;
        bq_arena_init(&act, 1 << 20, "t");
        BqTape tape;
        bq_tape_init(&tape, 4);
        BqCtx ctx = {.act = &act, .tape = &tape};
        int64_t sh = np;
        BqTensor X = bq_tensor_wrap(xp, gx, 1, &sh);
        BqTensor *y = bq_op_fakequant(&ctx, &X, &s, 1, 0, -128, 127);
        for (int i = 0; i < np; i++) y->grad[i] = 1.0f;
        float one = 0, g = 0;
        int64_t sh1 = 1;
        BqTensor seed = bq_tensor_wrap(&one, &g, 1, &sh1);
        bq_backward(&ctx, &seed);
        for (int i = 0; i < np; i++) {
            expect("named y", i, y->data[i], pts[i].q * s);
            expect("named dx", i, gx[i], GRAD_PREFILL + (pts[i].grad ? 1.0f : 0.0f));
        }
        printf("fakequant named points (ties to even, saturation -128/127, STE edges): %d points\n", np);
        bq_tape_free(&tape);
        bq_arena_free(&act);
    }

    /* 2. random points away from rounding boundaries (frac(x/s) in [0.1, 0.4] ∪ [0.6, 0.9]) and from
     * the saturation edges, per tensor and per channel */
    BqRng r;
    bq_rng_seed(&r, 99);
    enum { OC = 5, C = 7, B = 2, T = 3, H = 4 };
    float w[OC * C], sw[OC], a[B * T * H], sa[T], st = 0.037f;
    for (int c = 0; c < OC; c++) sw[c] = 0.01f + 0.02f * (float)bq_rng_uniform(&r);
    for (int c = 0; c < T; c++) sa[c] = 0.05f + 0.05f * (float)bq_rng_uniform(&r);
    for (int i = 0; i < OC * C; i++) {
        float k = (float)(int)(bq_rng_below(&r, 400)) - 200.0f; /* saturates beyond ±128 */
        float f = 0.1f + 0.3f * (float)bq_rng_uniform(&r) + (bq_rng_below(&r, 2) ? 0.5f : 0.0f);
        w[i] = (k + f) * sw[i / C];
    }
    for (int i = 0; i < B * T * H; i++) {
        float k = (float)(int)(bq_rng_below(&r, 300)) - 150.0f;
        float f = 0.1f + 0.3f * (float)bq_rng_uniform(&r) + (bq_rng_below(&r, 2) ? 0.5f : 0.0f);
        a[i] = (k + f) * sa[(i / H) % T];
    }
    int64_t wsh[2] = {OC, C}, ash[3] = {B, T, H};
    for (int sole = 0; sole <= 2; sole++) {
        check_case("per-tensor (OC,C)", w, 2, wsh, &st, 1, 0, -128, 127, sole);
        check_case("per-channel axis 0 (OC,C)", w, 2, wsh, sw, OC, 0, -128, 127, sole);
        check_case("per-channel axis 1 (B,T,H)", a, 3, ash, sa, T, 1, -128, 127, sole);
        check_case("per-tensor narrow -127..127", a, 3, ash, &st, 1, 0, -127, 127, sole);
    }

    /* 3. a large tensor, so the OpenMP and vector paths run: every element against the scalar formula,
     * with ties and saturation mixed in (x/s on a grid of quarters from -200 to 200). */
    enum { NBIG = 3 * 65536 + 37 };
    static float big[NBIG];
    for (int i = 0; i < NBIG; i++) big[i] = ((float)(i % 1601) * 0.25f - 200.0f) * st;
    int64_t bsh[1] = {NBIG};
    float sbig = st;
    for (int sole = 0; sole <= 2; sole++) check_case("large per-tensor", big, 1, bsh, &sbig, 1, 0, -128, 127, sole);
    printf("test_grad_fakequant: max error %.3e, %d mismatches, %s\n", max_err, fails, fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
