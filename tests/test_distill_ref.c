/* The distillation loss of `qat --teacher` against PyTorch (tests/fixtures/distill/distill.json, written by
 * tests/make_distill_fixture.py): bq_train_distill_loss (src/train.c) on top of bq_op_cross_entropy, for
 * five (alpha, temperature, hidden weight) cases, compared in its value, its three terms and its gradient
 * with respect to the student's logits and per-layer hidden states (the teacher's are constants).
 * Bound: 2e-5 relative to the largest reference magnitude (float32 forward, float64 reference). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "src/train.h"

static double max_err = 0.0;
static int failures = 0;

static float *floats(json_t *c, const char *key, int64_t want) {
    json_t *a = json_object_get(c, key);
    BQ_CHECK(a && (int64_t)json_array_size(a) == want);
    float *v = bq_malloc((size_t)want * sizeof(float));
    for (int64_t i = 0; i < want; i++) v[i] = (float)json_number_value(json_array_get(a, (size_t)i));
    return v;
}

static void check(int k, const char *what, const float *got, json_t *c, const char *key, int64_t n) {
    json_t *a = json_object_get(c, key);
    BQ_CHECK(a && (int64_t)json_array_size(a) == n);
    double scale = 1e-3, worst = 0.0;
    for (int64_t i = 0; i < n; i++) scale = fmax(scale, fabs(json_number_value(json_array_get(a, (size_t)i))));
    for (int64_t i = 0; i < n; i++) worst = fmax(worst, fabs(got[i] - json_number_value(json_array_get(a, (size_t)i))));
    double rel = worst / scale;
    if (rel > max_err) max_err = rel;
    if (rel > 2e-5) {
        printf("FAIL case %d %s: max abs err %.3g (relative %.3g)\n", k, what, worst, rel);
        failures++;
    }
}

static void check1(int k, const char *what, double got, json_t *c, const char *key) {
    float g = (float)got;
    json_t *a = json_pack("[f]", json_number_value(json_object_get(c, key)));
    json_t *w = json_pack("{s:o}", key, a);
    check(k, what, &g, w, key, 1);
    json_decref(w);
}

int main(void) {
    json_error_t je;
    json_t *root = json_load_file("tests/fixtures/distill/distill.json", 0, &je);
    if (!root) {
        printf("test_distill_ref: cannot read tests/fixtures/distill/distill.json: %s\nFAIL\n", je.text);
        return 1;
    }
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 24, "test") == BQ_OK);
    BqTape tape = {0};
    BQ_CHECK(bq_tape_init(&tape, 64) == BQ_OK);
    size_t k;
    json_t *c;
    json_array_foreach(json_object_get(root, "cases"), k, c) {
        int64_t B = json_integer_value(json_object_get(c, "B")), C = json_integer_value(json_object_get(c, "C"));
        int64_t L = json_integer_value(json_object_get(c, "layers")), T = json_integer_value(json_object_get(c, "T"));
        int64_t H = json_integer_value(json_object_get(c, "H")), nh = B * T * H;
        BqDistill d = {.alpha = json_number_value(json_object_get(c, "alpha")),
                       .temperature = json_number_value(json_object_get(c, "temperature")),
                       .hidden_weight = json_number_value(json_object_get(c, "hidden_weight"))};
        float *s = floats(c, "student", B * C), *t = floats(c, "teacher", B * C);
        float *hs = floats(c, "student_hidden", L * nh), *ht = floats(c, "teacher_hidden", L * nh);
        float *gs = calloc((size_t)(B * C), sizeof(float)), *ghs = calloc((size_t)(L * nh), sizeof(float));
        int32_t labels[64];
        BQ_CHECK(B <= 64);
        json_t *lj = json_object_get(c, "labels");
        for (int64_t b = 0; b < B; b++) labels[b] = (int32_t)json_integer_value(json_array_get(lj, (size_t)b));
        bq_tape_rewind(&tape);
        BqCtx ctx = {.act = &act, .tape = &tape};
        int64_t ls[2] = {B, C}, hsh[3] = {B, T, H};
        BqTensor S = bq_tensor_wrap(s, gs, 2, ls), Tt = bq_tensor_wrap(t, NULL, 2, ls);
        BqTensor HS[8], HT[8], *phs[8], *pht[8];
        BQ_CHECK(L <= 8);
        for (int64_t l = 0; l < L; l++) {
            HS[l] = bq_tensor_wrap(hs + l * nh, ghs + l * nh, 3, hsh);
            HT[l] = bq_tensor_wrap(ht + l * nh, NULL, 3, hsh);
            phs[l] = &HS[l], pht[l] = &HT[l];
        }
        BqTensor *ce = bq_op_cross_entropy(&ctx, &S, labels);
        double terms[3];
        BqTensor *loss = bq_train_distill_loss(&ctx, &d, (int)L, ce, &S, &Tt, d.hidden_weight > 0 ? phs : NULL,
                                               d.hidden_weight > 0 ? pht : NULL, terms);
        bq_backward(&ctx, loss);
        check1((int)k, "loss", loss->data[0], c, "loss");
        check1((int)k, "ce", terms[0], c, "ce");
        check1((int)k, "kl", terms[1], c, "kl");
        if (d.hidden_weight > 0) check1((int)k, "hidden", terms[2], c, "hidden");
        check((int)k, "dstudent", gs, c, "dstudent", B * C);
        check((int)k, "dstudent_hidden", ghs, c, "dstudent_hidden", L * nh);
        printf("case %zu: alpha %g, T %g, W %g: loss %.6f (ce %.6f, kl %.6f, hidden %.6f)\n", k, d.alpha,
               d.temperature, d.hidden_weight, loss->data[0], terms[0], terms[1], terms[2]);
        free(s), free(t), free(hs), free(ht), free(gs), free(ghs);
        bq_arena_rewind(&act, 0);
    }
    bq_tape_free(&tape);
    bq_arena_free(&act);
    json_decref(root);
    printf("test_distill_ref: max relative error %.3e, %s\n", max_err, failures ? "FAIL" : "ok");
    return failures ? 1 : 0;
}
