/* Fake quantization against PyTorch 1.13 (tests/fixtures/quant/fakequant.json, written by
 * tests/make_fakequant_fixture.py): bq_op_fakequant forward values and straight-through gradient mask
 * vs torch.fake_quantize_per_tensor_affine / fake_quantize_per_channel_affine (zero point 0, -128..127)
 * on ties (power-of-two scales, so PyTorch's x·(1/s) equals our x/s exactly), saturation and the
 * rounding edge (127, 127.5]·s, [-128.5, -128)·s; and the moving-average observers of layers/quant.c
 * (through bq_quant_act / bq_quant_weight) vs MovingAverageMinMaxObserver and
 * MovingAveragePerChannelMinMaxObserver, then the fake-quantized last batch with scale amax/127.
 * Everything must match bit for bit (memcmp: the sign of a zero counts). The op's input gradient starts
 * at a nonzero constant, so the straight-through gradient must be that constant plus the mask: a backward
 * that overwrites the buffer instead of adding to it fails. The max absolute error is printed. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/tensor.h"
#include "layers/bert.h"
#include "layers/quant.h"

static int failures = 0;
static double max_err = 0.0;

/* The input gradient before the backward (exact in binary, so prefill + mask is exact too). */
#define GRAD_PREFILL 0.375f

static float *floats(json_t *a, int64_t *n) {
    *n = (int64_t)json_array_size(a);
    float *v = bq_malloc((size_t)(*n > 0 ? *n : 1) * sizeof(float));
    for (int64_t i = 0; i < *n; i++) v[i] = (float)json_number_value(json_array_get(a, (size_t)i));
    return v;
}

static void compare(const char *cse, const char *what, const float *got, const float *want, int64_t n,
                    const float *x, const float *scale, int per_row) {
    int shown = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        if (e > max_err) max_err = e;
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            if (shown++ < 8) {
                float s = scale ? scale[per_row > 0 ? i / per_row : 0] : 1.0f;
                printf("FAIL %s %s[%lld]: got %.9g want %.9g (x/s = %.6g)\n", cse, what, (long long)i, got[i],
                       want[i], x ? x[i] / s : 0.0);
            }
            failures++;
        }
    }
}

/* The op directly: forward, then dx with dy = 1 added to GRAD_PREFILL (prefill + the mask). */
static void case_op(BqCtx *ctx, const char *name, json_t *c) {
    int64_t n, ns, nw, nm;
    float *x = floats(json_object_get(c, "x"), &n);
    float *scale = floats(json_object_get(c, "scale"), &ns);
    float *want = floats(json_object_get(c, "y"), &nw);
    float *mask = floats(json_object_get(c, "mask"), &nm);
    json_t *shp = json_object_get(c, "shape");
    int ndim = (int)json_array_size(shp);
    int64_t shape[BQ_MAX_DIMS];
    for (int d = 0; d < ndim; d++) shape[d] = json_integer_value(json_array_get(shp, (size_t)d));
    int axis = (int)json_integer_value(json_object_get(c, "axis"));
    float *grad = bq_malloc((size_t)n * sizeof(float));
    for (int64_t i = 0; i < n; i++) grad[i] = GRAD_PREFILL;
    BqTensor xt = bq_tensor_wrap(x, grad, ndim, shape);
    size_t mark = bq_arena_mark(ctx->act);
    BqTensor *y = bq_op_fakequant(ctx, &xt, scale, ns, axis, -128, 127);
    compare(name, "y", y->data, want, n, x, scale, axis == 0 ? (int)(n / ns) : 0);
    for (int64_t i = 0; i < n; i++) y->grad[i] = 1.0f;
    bq_backward(ctx, y); /* sets y->grad[0] = 1 (already 1) and runs the fake-quant backward */
    for (int64_t i = 0; i < n; i++) mask[i] += GRAD_PREFILL;
    compare(name, "prefill + mask", grad, mask, n, x, scale, axis == 0 ? (int)(n / ns) : 0);
    bq_tape_rewind(ctx->tape);
    bq_arena_rewind(ctx->act, mark);
    free(x), free(scale), free(want), free(mask), free(grad);
}

static void model_shape(BqBert *m) {
    memset(m, 0, sizeof *m);
    m->cfg.num_hidden_layers = 1;
    m->cfg.hidden_size = 8;
    m->cfg.intermediate_size = 6;
    m->cfg.num_attention_heads = 2;
}

/* Observers through the forward hooks, with the state in training mode (observe = 1). */
static void case_observers(BqCtx *ctx, json_t *cases) {
    BqBert m;
    model_shape(&m);
    BqQuantConfig cfg;
    bq_quant_config_default(&cfg);
    BqQuantState *qs = NULL;
    if (bq_quant_create(&qs, &m, &cfg) != BQ_OK) {
        printf("FAIL create: %s\n", bq_errmsg());
        failures++;
        return;
    }
    qs->observe = 1;
    json_t *c = json_object_get(cases, "observer_act");
    int64_t shape[3] = {2, 3, 5}, n;
    BqQuantizer *q = bq_quant_at(qs, 0, BQ_QP_PROBS);
    size_t b;
    json_t *bj;
    json_array_foreach(json_object_get(c, "batches"), b, bj) {
        float *x = floats(bj, &n);
        BqTensor xt = bq_tensor_wrap(x, NULL, 3, shape);
        size_t mark = bq_arena_mark(ctx->act);
        BqTensor *y = bq_quant_act(qs, ctx, 0, BQ_QP_PROBS, &xt);
        float got[2] = {q->run_min, q->run_max};
        float want[2] = {(float)json_number_value(json_array_get(json_object_get(c, "min"), b)),
                         (float)json_number_value(json_array_get(json_object_get(c, "max"), b))};
        compare("observer_act", "min/max", got, want, 2, NULL, NULL, 0);
        if (b == 2) {
            int64_t ns, ny;
            float *sc = floats(json_object_get(c, "scale"), &ns);
            float *wy = floats(json_object_get(c, "y_last"), &ny);
            compare("observer_act", "scale", q->scale, sc, 1, NULL, NULL, 0);
            compare("observer_act", "y", y->data, wy, n, x, sc, 0);
            free(sc), free(wy);
        }
        bq_tape_rewind(ctx->tape);
        bq_arena_rewind(ctx->act, mark);
        free(x);
    }
    c = json_object_get(cases, "observer_weight");
    int64_t wshape[2] = {6, 8};
    q = bq_quant_at(qs, 0, BQ_QP_W_I);
    json_array_foreach(json_object_get(c, "weights"), b, bj) {
        float *w = floats(bj, &n);
        BqTensor wt = bq_tensor_wrap(w, NULL, 2, wshape);
        size_t mark = bq_arena_mark(ctx->act);
        BqTensor *y = bq_quant_weight(qs, ctx, 0, BQ_QP_W_I, &wt);
        int64_t k;
        float *wmin = floats(json_array_get(json_object_get(c, "min"), b), &k);
        float *wmax = floats(json_array_get(json_object_get(c, "max"), b), &k);
        compare("observer_weight", "min", q->ch_min, wmin, 6, NULL, NULL, 0);
        compare("observer_weight", "max", q->ch_max, wmax, 6, NULL, NULL, 0);
        if (b == 2) {
            int64_t ns, ny;
            float *sc = floats(json_object_get(c, "scale"), &ns);
            float *wy = floats(json_object_get(c, "y_last"), &ny);
            compare("observer_weight", "scale", q->scale, sc, 6, NULL, NULL, 0);
            compare("observer_weight", "y", y->data, wy, n, w, sc, 8);
            free(sc), free(wy);
        }
        bq_tape_rewind(ctx->tape);
        bq_arena_rewind(ctx->act, mark);
        free(w), free(wmin), free(wmax);
    }
    /* frozen: a new batch leaves the range alone */
    float before = bq_quant_at(qs, 0, BQ_QP_PROBS)->amax[0];
    bq_quant_freeze(qs, 1);
    float big[30];
    for (int i = 0; i < 30; i++) big[i] = 100.0f + (float)i;
    BqTensor bt = bq_tensor_wrap(big, NULL, 3, shape);
    size_t mark = bq_arena_mark(ctx->act);
    bq_quant_act(qs, ctx, 0, BQ_QP_PROBS, &bt);
    bq_tape_rewind(ctx->tape);
    bq_arena_rewind(ctx->act, mark);
    if (bq_quant_at(qs, 0, BQ_QP_PROBS)->amax[0] != before) {
        printf("FAIL frozen quantizer moved\n");
        failures++;
    }
    bq_quant_free(qs);
}

int main(void) {
    const char *dir = getenv("BQ_SOURCE_DIR");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/quant/fakequant.json", dir ? dir : ".");
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        printf("FAIL cannot read %s: %s\n", path, jerr.text);
        return 1;
    }
    json_t *cases = json_object_get(root, "cases");
    BqArena act;
    BqTape tape;
    if (bq_arena_init(&act, (size_t)1 << 26, "act") || bq_tape_init(&tape, 1024)) {
        printf("FAIL arena\n");
        return 1;
    }
    BqCtx ctx = {.act = &act, .tape = &tape, .training = 1, .rng_key = 1};
    const char *ops[] = {"per_tensor_ties", "per_channel", "random"};
    for (int i = 0; i < 3; i++) {
        json_t *c = json_object_get(cases, ops[i]);
        if (!c) {
            printf("FAIL fixture lacks %s\n", ops[i]);
            return 1;
        }
        case_op(&ctx, ops[i], c);
    }
    case_observers(&ctx, cases);
    bq_tape_free(&tape);
    bq_arena_free(&act);
    json_decref(root);
    printf("test_fakequant_ref: %d mismatches, max abs error %.3g\n", failures, max_err);
    return failures ? 1 : 0;
}
