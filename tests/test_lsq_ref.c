/* Learned step size quantization (LSQ) against a PyTorch reference (tests/fixtures/quant/lsq.json, written
 * by tests/make_lsq_fixture.py with the paper's grad-scale and round-pass tricks, cross-checked there
 * against torch._fake_quantize_learnable_per_{tensor,channel}_affine): bq_op_fakequant_lsq forward
 * values, dx and dscale for a random upstream gradient, per tensor and per channel (axis 0 of a weight
 * and axis 1 of a (3,4,5) tensor), signed 8-bit, 7-bit and unsigned [0, 255] ranges, values across both
 * clamp edges; through the recorded op with its own gradient buffer and (per tensor) the sole-consumer
 * path that shares it. dx and dscale are pre-filled with a constant, so the test also proves the
 * backward accumulates.
 * Bounds: y bit-identical; dx within 1e-6·|dy| (the reference's dx is dy·s/s in float); dscale within
 * 1e-5 of g·Σ|dy·t| (float sums in PyTorch against double sums here). Prints the max errors. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/tensor.h"

static int failures = 0;
static double max_dx = 0.0, max_ds = 0.0, max_ds_rel = 0.0;

static float *floats(json_t *a, int64_t *n) {
    *n = (int64_t)json_array_size(a);
    float *v = bq_malloc((size_t)(*n > 0 ? *n : 1) * sizeof(float));
    for (int64_t i = 0; i < *n; i++) v[i] = (float)json_number_value(json_array_get(a, (size_t)i));
    return v;
}

#define PREFILL 0.25f

static void run_case(BqCtx *ctx, const char *name, json_t *c, int sole) {
    int64_t n, ns, n2;
    float *x = floats(json_object_get(c, "x"), &n);
    float *scale = floats(json_object_get(c, "scale"), &ns);
    float *dy = floats(json_object_get(c, "dy"), &n2);
    float *want_y = floats(json_object_get(c, "y"), &n2);
    float *want_dx = floats(json_object_get(c, "dx"), &n2);
    float *want_ds = floats(json_object_get(c, "dscale"), &n2);
    json_t *shp = json_object_get(c, "shape");
    int ndim = (int)json_array_size(shp);
    int64_t shape[BQ_MAX_DIMS];
    for (int d = 0; d < ndim; d++) shape[d] = json_integer_value(json_array_get(shp, (size_t)d));
    int axis = (int)json_integer_value(json_object_get(c, "axis"));
    int qmin = (int)json_integer_value(json_object_get(c, "qmin"));
    int qmax = (int)json_integer_value(json_object_get(c, "qmax"));
    float g = (float)json_number_value(json_object_get(c, "g"));
    int64_t inner = 1;
    for (int d = axis + 1; axis >= 0 && d < ndim; d++) inner *= shape[d];

    size_t mark = bq_arena_mark(ctx->act);
    BqTensor xt = bq_tensor_wrap(x, NULL, ndim, shape);
    xt.grad = bq_arena_alloc(ctx->act, (size_t)n * sizeof(float));
    float *dscale = bq_malloc((size_t)ns * sizeof(float));
    for (int64_t k = 0; k < ns; k++) dscale[k] = PREFILL;
    /* the sole path's output shares x's buffer, which then holds dy (nothing to pre-fill) */
    for (int64_t i = 0; i < n; i++) xt.grad[i] = sole ? 0.0f : PREFILL;
    BqTensor *y = bq_op_fakequant_lsq(ctx, &xt, scale, dscale, ns, axis, qmin, qmax, g, sole);
    if (sole && y->grad != xt.grad) {
        printf("FAIL %s: the sole-consumer op did not share the gradient buffer\n", name);
        failures++;
    }
    int bad_y = 0;
    for (int64_t i = 0; i < n; i++) /* bit-identical, except that −0 and +0 (rne(−0.3) = −0) are equal */
        if (memcmp(&y->data[i], &want_y[i], sizeof(float)) != 0 && !(y->data[i] == 0.0f && want_y[i] == 0.0f)) {
            if (bad_y++ < 5) printf("FAIL %s y[%lld]: got %.9g want %.9g\n", name, (long long)i, y->data[i], want_y[i]);
        }
    for (int64_t i = 0; i < n; i++) y->grad[i] = dy[i];
    float one = 0.0f, gone = 0.0f;
    int64_t sh1 = 1;
    BqTensor seed = bq_tensor_wrap(&one, &gone, 1, &sh1); /* not on the tape: only starts the walk */
    bq_backward(ctx, &seed);
    int bad_dx = 0;
    for (int64_t i = 0; i < n; i++) {
        double want = (double)want_dx[i] + (sole ? 0.0 : PREFILL);
        double e = fabs((double)xt.grad[i] - want);
        if (!(e <= 1e-6 * fabs((double)dy[i]) + 1e-7)) {
            if (bad_dx++ < 5)
                printf("FAIL %s dx[%lld]: got %.9g want %.9g\n", name, (long long)i, xt.grad[i], want);
        }
        max_dx = e > max_dx ? e : max_dx;
    }
    /* g·Σ|dy·t| per scale: the size of the terms the sum adds up */
    int bad_ds = 0;
    for (int64_t k = 0; k < ns; k++) {
        double mag = 0.0;
        for (int64_t i = 0; i < n; i++) {
            if ((ns > 1 ? (i / inner) % ns : 0) != k) continue;
            float v = x[i] / scale[k];
            float q = nearbyintf(v);
            double t = q < qmin ? qmin : q > qmax ? qmax : (double)q - (double)v;
            mag += fabs((double)dy[i] * t);
        }
        mag *= g;
        double want = (double)want_ds[k] + PREFILL;
        double e = fabs((double)dscale[k] - want);
        max_ds = e > max_ds ? e : max_ds;
        double rel = e / (mag + 1e-12);
        max_ds_rel = rel > max_ds_rel ? rel : max_ds_rel;
        if (!(e <= 1e-5 * mag + 1e-6)) {
            if (bad_ds++ < 5)
                printf("FAIL %s dscale[%lld]: got %.9g want %.9g (g·Σ|dy·t| %.4g)\n", name, (long long)k, dscale[k],
                       want, mag);
        }
    }
    printf("%-22s %s: %d y, %d dx, %d dscale mismatches (%lld elements, %lld scales)\n", name,
           sole ? "sole" : "own ", bad_y, bad_dx, bad_ds, (long long)n, (long long)ns);
    failures += bad_y + bad_dx + bad_ds;
    bq_tape_rewind(ctx->tape);
    bq_arena_rewind(ctx->act, mark);
    free(x), free(scale), free(dy), free(want_y), free(want_dx), free(want_ds), free(dscale);
}

int main(void) {
    const char *dir = getenv("BQ_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/quant/lsq.json", dir ? dir : ".");
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        printf("FAIL cannot read %s: %s\n", path, jerr.text);
        return 1;
    }
    json_t *cases = json_object_get(root, "cases");
    BqArena act;
    BqTape tape;
    if (bq_arena_init(&act, (size_t)1 << 26, "act") || bq_tape_init(&tape, 16)) {
        printf("FAIL arena\n");
        return 1;
    }
    BqCtx ctx = {.act = &act, .tape = &tape, .training = 1};
    const char *names[] = {"per_tensor_signed", "per_tensor_unsigned", "per_channel_w7", "per_channel_mid",
                           "per_channel_unsigned"};
    for (int i = 0; i < 5; i++) {
        json_t *c = json_object_get(cases, names[i]);
        if (!c) {
            printf("FAIL fixture lacks %s\n", names[i]);
            return 1;
        }
        run_case(&ctx, names[i], c, 0);
        if (json_integer_value(json_object_get(c, "axis")) < 0) run_case(&ctx, names[i], c, 1);
    }
    bq_tape_free(&tape);
    bq_arena_free(&act);
    json_decref(root);
    printf("test_lsq_ref: %d mismatches; max |dx error| %.3g, max |dscale error| %.3g (relative to g·Σ|dy·t| "
           "%.3g)\n", failures, max_dx, max_ds, max_ds_rel);
    return failures ? 1 : 0;
}
