/* The last layer of a classification forward on token 0 only (layers/bert.h, bq_bert_forward): on the
 * tiny model (tests/fixtures/bert_tiny: 2 layers, hidden 32, 2 heads, 3 labels), for the fp32 model
 * (op by op and the fused fp32 engine of layers/bert_fp32.h), the fake quantization of each scheme
 * (max-calibrated), and the int8 engine (cpu scheme fused and op by op, qdqbert), the logits with the
 * shortcut against in.all_rows = 1 (every token of the last layer) on random padded batches.
 *
 * The bound. Every op after the attention is row-wise and every activation quantizer has one fixed
 * scale, so the two forwards compute the same values on the same rows; only a product's summation order
 * may depend on its number of rows (sgemm may block M differently; the integer GEMMs sum exactly). The
 * layers before the last see the same rows in both forwards, so only the last layer's products whose
 * row count changes can differ: the query Linear (K = H terms per sum), Q·Kᵀ (K = d = H/heads), P·V
 * (K = T), attention.output.dense (K = H), intermediate.dense (K = H) and output.dense (K = I). Any order
 * of a sum of K products is within (K − 1)·u of the exact sum, relative to the sum of the terms'
 * magnitudes (u = 2^-24), so two orders differ by less than 2K·u of it. These sums do not cancel (their
 * terms' magnitudes sum to a small multiple of the result), and the row-wise ops after them (LayerNorm,
 * GELU, the pooler's tanh, the classifier) pass a relative change on at a gain of about 1, so the six
 * changes add up to at most ε = 2u·(3H + d + T + I)·max|logit| per logit (1.9e-5 of max|logit| for the
 * tiny model at T = 12). The fp32 model (op by op and the fused engine) must keep every logit within ε.
 * With quantizers a value may sit within those ulp of a quantizer's rounding boundary and get the
 * neighbouring code (one step, 1/127 of that quantizer's range, one of >= H inputs of the next Linear),
 * so the quantized paths are allowed ε + max|logit|/127 per logit, with at least 90 % of the logits
 * within ε: a wrong row, a skipped residual or a stale scale fails that at once.
 *
 * It also checks that the shortcut is taken (the forward's activation arena holds less), also when the
 * layers' outputs are asked for (the last is then token 0's row), and that it is not taken while
 * calibration statistics are collected (they need every token). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export/hf_load.h"
#include "layers/bert_fp32.h"
#include "layers/bert_int8.h"
#include "layers/quant.h"
#include "tests/test_util.h"

enum { B = 4, T = 12, NCAL = 4, NBATCH = 3 };

typedef struct Batch {
    int32_t ids[B * T], types[B * T];
    float mask[B * T];
} Batch;

static void make_batch(Batch *bt, BqRng *rng, int vocab) {
    bq_test_padded_batch(bt->ids, bt->types, bt->mask, B, T, rng, vocab, 3);
}

static BqBertInput input_of(const Batch *bt) {
    BqBertInput in = {.B = B, .T = T, .input_ids = bt->ids, .attention_mask = bt->mask, .token_type_ids = bt->types};
    return in;
}

typedef enum Path { FAKE, FP32_ENGINE, INT8_FUSED, INT8_OPS } Path;

/* One forward on path p; *used: the bytes of the activation arena it holds at the end. */
static int forward(BqBert *m, BqInt8Engine *e, Path p, BqArena *act, const BqBertInput *in, float *out, size_t *used) {
    bq_arena_rewind(act, 0);
    BqCtx ctx = {.act = act};
    BqTensor *logits = NULL;
    int rc;
    if (p == FP32_ENGINE) rc = bq_fp32_forward(m, &ctx, in, &logits);
    else if (p == INT8_FUSED || p == INT8_OPS) rc = bq_int8_forward(e, m, &ctx, in, &logits);
    else rc = bq_bert_forward(m, &ctx, in, &logits, NULL);
    if (rc) return rc;
    memcpy(out, logits->data, (size_t)(B * m->cfg.num_labels) * sizeof(float));
    *used = bq_arena_mark(act);
    return BQ_OK;
}

static int load_model(BqBert *m, const char *scheme, BqArena *act) {
    BqRng rng;
    bq_rng_seed(&rng, 5);
    char *report = NULL;
    int rc = bq_hf_load(m, "tests/fixtures/bert_tiny", 0, &rng, &report);
    free(report);
    if (rc || !scheme) return rc;
    BqQuantConfig qc;
    bq_quant_config_default(&qc);
    BQ_CHECK(bq_scheme_parse(&qc.scheme, scheme, "scheme") == BQ_OK);
    if ((rc = bq_quant_create(&m->quant, m, &qc))) return rc;
    bq_quant_calib_begin(m->quant, BQ_CALIBRATOR_MAX);
    for (int i = 0; i < NCAL && !rc; i++) {
        Batch bt;
        make_batch(&bt, &rng, m->cfg.vocab_size);
        BqBertInput in = input_of(&bt), full = in;
        full.all_rows = 1;
        float lg[B * 16];
        size_t u_short = 0, u_full = 0;
        BQ_CHECK(m->cfg.num_labels <= 16);
        /* collecting: both forwards must hold the same (every token reaches the histograms) */
        if (!(rc = forward(m, NULL, FAKE, act, &in, lg, &u_short))) rc = forward(m, NULL, FAKE, act, &full, lg, &u_full);
        EXPECT(rc || u_short == u_full, "%s: calibration forward used %zu bytes with the shortcut, %zu without: the "
               "shortcut must be off while collecting", scheme, u_short, u_full);
    }
    if (!rc) rc = bq_quant_calib_finish(m->quant, BQ_CALIBRATOR_MAX, 0.0);
    return rc;
}

/* check's ε relative to max|logit| for model m at T tokens (see the bound above). */
static double eps_rel(const BqBert *m) {
    const BqBertConfig *c = &m->cfg;
    const int H = c->hidden_size, d = H / c->num_attention_heads, I = c->intermediate_size;
    return 2.0 * 0x1p-24 * (double)(3 * H + d + T + I);
}

/* quantized: the model has quantizers (their codes may flip, see above); otherwise every logit within ε. */
static void check(const char *name, BqBert *m, BqInt8Engine *e, Path p, BqArena *act, int quantized) {
    const int C = m->cfg.num_labels;
    BqRng rng;
    bq_rng_seed(&rng, 11);
    double max_err = 0.0, max_logit = 0.0;
    int n = 0, near = 0, bad = 0;
    for (int k = 0; k < NBATCH; k++) {
        Batch bt;
        make_batch(&bt, &rng, m->cfg.vocab_size);
        BqBertInput in = input_of(&bt), full = in;
        full.all_rows = 1;
        float a[B * 16], f[B * 16];
        size_t ua = 0, uf = 0;
        int rc = forward(m, e, p, act, &in, a, &ua);
        if (!rc) rc = forward(m, e, p, act, &full, f, &uf);
        EXPECT(rc == BQ_OK, "%s: forward: %s", name, bq_errmsg());
        if (rc) return;
        EXPECT(ua < uf, "%s: the shortcut was not taken (%zu bytes of activations with it, %zu without)", name, ua, uf);
        if (p == FAKE) { /* hidden states asked for (sensitivity's prefix cache): same logits, last one (B,H) */
            BqTensor *hs[8] = {NULL};
            BQ_CHECK(m->cfg.num_hidden_layers <= 8);
            BqBertInput hin = in;
            hin.hidden = hs;
            float hl[B * 16];
            size_t uh = 0;
            EXPECT(forward(m, e, p, act, &hin, hl, &uh) == BQ_OK, "%s: forward with hidden states", name);
            const BqTensor *last = hs[m->cfg.num_hidden_layers - 1];
            EXPECT(last && last->ndim == 2 && last->shape[1] == m->cfg.hidden_size,
                   "%s: the last hidden state is not token 0's (B,H)", name);
            EXPECT(!memcmp(hl, a, (size_t)(B * C) * sizeof(float)), "%s: logits with hidden states differ", name);
        }
        double ml = 0.0;
        for (int i = 0; i < B * C; i++) ml = fmax(ml, fabs((double)f[i]));
        const double eps = eps_rel(m) * ml, step = quantized ? ml / 127.0 : 0.0;
        for (int i = 0; i < B * C; i++) {
            double d = fabs((double)a[i] - (double)f[i]);
            max_err = fmax(max_err, d);
            n++;
            near += d <= eps;
            bad += !(d <= eps + step);
        }
        max_logit = fmax(max_logit, ml);
    }
    printf("%-28s max |logit diff| %.3g (max |logit| %.3g), %d of %d logits within ε = %.3g relative\n", name,
           max_err, max_logit, near, n, eps_rel(m));
    EXPECT(bad == 0, "%s: %d logits differ by more than the bound", name, bad);
    EXPECT(near * 10 >= n * 9, "%s: only %d of %d logits within ε", name, near, n);
}

int main(void) {
    BqArena act;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 26, "test activations") == BQ_OK);
    BqBert m;
    BQ_CHECK(load_model(&m, NULL, &act) == BQ_OK);
    EXPECT(bq_fp32_fused_layer_count(&m) == m.cfg.num_hidden_layers, "fp32 engine: layers not fused");
    check("fp32, op by op", &m, NULL, FAKE, &act, 0);
    check("fp32, fused engine", &m, NULL, FP32_ENGINE, &act, 0);
    bq_bert_free(&m);

    const char *schemes[] = {"ort", "qdqbert", "cpu"};
    for (int s = 0; s < 3; s++) {
        int rc = load_model(&m, schemes[s], &act);
        EXPECT(rc == BQ_OK, "%s: load/calibrate: %s", schemes[s], bq_errmsg());
        if (rc) continue;
        char name[64];
        snprintf(name, sizeof name, "%s, fake quant", schemes[s]);
        check(name, &m, NULL, FAKE, &act, 1);
        m.quant->fp32_linear = 1;
        snprintf(name, sizeof name, "%s, fake quant, fp32 Linears", schemes[s]);
        check(name, &m, NULL, FAKE, &act, 1);
        m.quant->fp32_linear = 0;
        if (strcmp(schemes[s], "ort")) {
            BqInt8Engine *e = NULL;
            EXPECT(bq_int8_prepare(&e, &m) == BQ_OK, "%s: int8 prepare: %s", schemes[s], bq_errmsg());
            if (e) {
                snprintf(name, sizeof name, "%s, int8 engine, fused", schemes[s]);
                if (!strcmp(schemes[s], "cpu")) {
                    EXPECT(bq_int8_fused_layer_count(e) == m.cfg.num_hidden_layers, "cpu: layers not fused");
                    check(name, &m, e, INT8_FUSED, &act, 1);
                }
                bq_int8_set_layer_fusion(e, 0);
                snprintf(name, sizeof name, "%s, int8 engine, op by op", schemes[s]);
                check(name, &m, e, INT8_OPS, &act, 1);
                bq_int8_free(e);
            }
        }
        bq_quant_free(m.quant);
        m.quant = NULL;
        bq_bert_free(&m);
    }
    bq_arena_free(&act);
    if (fails) fprintf(stderr, "test_bert_cls_rows: %d failure(s)\n", fails);
    return fails != 0;
}
