/* A QAT training step of a small random BERT (2 layers, hidden 24, 3 heads, intermediate 40, 3 labels,
 * dropout on, a padded batch) for every scheme (ort, qdqbert, cpu), run twice from the same state: once with every
 * activation quantizer as a plain fake-quant op (its own gradient buffer, accumulating backward) and
 * once with the sole-consumer op where the forward allows it (layers/quant.c: shared gradient buffer,
 * in-place mask; an activation that nothing reads again quantized in place with its mask kept as bits;
 * in place without a tape). Loss, training and inference logits, every parameter gradient and every
 * observer range must be bit-identical, and the shared path must use much less activation memory. Prints the peaks and the max difference. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/tensor.h"
#include "layers/bert.h"
#include "layers/quant.h"
#include "src/train.h"
#include "tests/test_util.h"


typedef struct Out {
    float loss;
    float logits[12];
    float eval_logits[12]; /* inference forward (no tape) after the steps */
    float *grad;    /* copy of the parameter gradients */
    int64_t nparams;
    float *amax;    /* every quantizer's amax, concatenated */
    int64_t namax;
    size_t peak;    /* activation arena peak */
} Out;

/* Two training steps (bq_train_step: forward with tape and backward; observers move on the second)
 * from a fresh model seeded identically; the gradients of the second are kept. */
static void run(const char *scheme, int plain, Out *o) {
    BqBertConfig cfg = bq_test_config(50, 24, 2, 3, 40, 16, 3, 0.1f, 0.2f);
    BqRng rng;
    bq_rng_seed(&rng, 7);
    BqBert m;
    BQ_CHECK(bq_bert_create(&m, &cfg, 1, &rng) == BQ_OK);
    BqQuantConfig qc;
    bq_quant_config_default(&qc);
    BQ_CHECK(bq_scheme_parse(&qc.scheme, scheme, "scheme") == BQ_OK);
    BQ_CHECK(bq_quant_create(&m.quant, &m, &qc) == BQ_OK);
    m.quant->observe = 1;
    m.quant->plain_fakequant = plain;

    enum { B = 4, T = 9 };
    int32_t ids[B * T], types[B * T], labels[B] = {0, 2, 1, 2};
    float mask[B * T];
    bq_test_padded_batch(ids, types, mask, B, T, &rng, 50, 2);
    BqBatch bt = {.B = B, .T = T, .input_ids = ids, .attention_mask = mask, .token_type_ids = types, .labels = labels};
    BqArena act;
    BqTape tape;
    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 26, "act") == BQ_OK);
    BQ_CHECK(bq_tape_init(&tape, 64) == BQ_OK);
    BqTrainState ts = {0};
    for (int step = 0; step < 2; step++) {
        memset(m.params.grad, 0, sizeof(float) * (size_t)m.params.total);
        BqCtx ctx = {.act = &act, .tape = &tape, .training = 1, .rng_key = 1234 + (uint64_t)step};
        BQ_CHECK(bq_train_step(&m, &ctx, &bt, &ts, &o->loss, o->logits) == BQ_OK);
    }
    o->peak = act.peak;
    {
        BqCtx ctx = {.act = &act, .tape = NULL, .training = 0};
        BqTensor *logits = NULL;
        BqBertInput in = bq_batch_input(&bt);
        BQ_CHECK(bq_bert_forward(&m, &ctx, &in, &logits, NULL) == BQ_OK);
        memcpy(o->eval_logits, logits->data, sizeof(float) * B * 3);
        bq_arena_rewind(&act, 0);
    }
    o->nparams = m.params.total;
    o->grad = bq_malloc(sizeof(float) * (size_t)m.params.total);
    memcpy(o->grad, m.params.grad, sizeof(float) * (size_t)m.params.total);
    int64_t na = 0;
    for (int i = 0; i < m.quant->n; i++) na += m.quant->q[i].nch;
    o->amax = bq_malloc(sizeof(float) * (size_t)na);
    na = 0;
    for (int i = 0; i < m.quant->n; i++) {
        memcpy(o->amax + na, m.quant->q[i].amax, sizeof(float) * (size_t)m.quant->q[i].nch);
        na += m.quant->q[i].nch;
    }
    o->namax = na;
    bq_arena_free(&act);
    bq_tape_free(&tape);
    bq_quant_free(m.quant);
    m.quant = NULL;
    bq_bert_free(&m);
}

int main(void) {
    const char *schemes[] = {"ort", "qdqbert", "cpu"};
    for (int s = 0; s < 3; s++) {
        Out a, b;
        run(schemes[s], 1, &a);
        run(schemes[s], 0, &b);
        int64_t np = a.nparams;
        double maxd = fabs((double)a.loss - b.loss);
        int64_t bad = a.loss != b.loss;
        for (int i = 0; i < 12; i++) {
            maxd = fmax(maxd, fabs((double)a.logits[i] - b.logits[i]));
            maxd = fmax(maxd, fabs((double)a.eval_logits[i] - b.eval_logits[i]));
            bad += a.logits[i] != b.logits[i];
            bad += a.eval_logits[i] != b.eval_logits[i];
        }
        for (int64_t i = 0; i < a.namax && a.namax == b.namax; i++) bad += a.amax[i] != b.amax[i];
        bad += a.namax != b.namax;
        int64_t nz = 0;
        for (int64_t i = 0; i < np; i++) {
            maxd = fmax(maxd, fabs((double)a.grad[i] - b.grad[i]));
            bad += memcmp(&a.grad[i], &b.grad[i], sizeof(float)) != 0;
            nz += a.grad[i] != 0.0f;
        }
        printf("%-8s plain vs shared-gradient fake quant: loss %.6f, %lld of %lld gradients non-zero, "
               "max difference %.3e, %lld values differ; activation peak %zu vs %zu bytes\n",
               schemes[s], a.loss, (long long)nz, (long long)np, maxd, (long long)bad, a.peak, b.peak);
        if (bad) fails++;
        if (nz < np / 2) {
            printf("FAIL %s: too few non-zero gradients (the step did not train)\n", schemes[s]);
            fails++;
        }
        /* Shared gradient buffers alone gave 0.80 (ort), 0.88 (qdqbert) and 0.94 (cpu) of the plain peak;
         * quantizing sole-consumer activations in place with bit masks brings them to 0.62, 0.76 and 0.89. */
        const double max_ratio[3] = {0.70, 0.82, 0.92};
        if (!((double)b.peak <= max_ratio[s] * (double)a.peak)) {
            printf("FAIL %s: activation peak %.3f of the plain path's, above %.2f (in-place quantization lost?)\n",
                   schemes[s], (double)b.peak / (double)a.peak, max_ratio[s]);
            fails++;
        }
        free(a.grad), free(b.grad), free(a.amax), free(b.amax);
    }
    printf("test_qat_step: %s\n", fails ? "FAIL" : "ok");
    return fails ? 1 : 0;
}
