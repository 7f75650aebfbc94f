/* Reference test of layers/bert.c against PyTorch: the fixture tests/fixtures/bert_tiny (made by
 * tests/make_bert_fixture.py with transformers 4.40.2) holds a random BertForSequenceClassification
 * (2 layers, hidden 32, 2 heads, intermediate 37, 3 labels), a padded batch (B=3, T=11), and
 * PyTorch's logits, mean cross-entropy loss and the gradient of that loss for every parameter.
 *
 * Requires logits and loss within 1e-5 (absolute) and each gradient within 1e-4 of that tensor's
 * largest magnitude (floored at 1% of the model's largest gradient, for the key biases whose true
 * gradient is zero); prints the max error per tensor and exits non-zero on any failure. Also checks
 * that an evaluation pass (no tape) gives the same logits and that every fixture tensor maps onto
 * one table entry.
 *
 * The fixture files are read with the minimal safetensors reader of tests/test_util.h, so this test
 * depends only on the model code and the ops. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "autograd/tensor.h"
#include "layers/bert.h"
#include "src/train.h"
#include "tests/test_util.h"

/* max |a-b| over n elements; *ref_max = max |b| */
static double max_abs_diff(const float *a, const float *b, int64_t n, double *ref_max) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= d)) d = e; /* NaN propagates as a failure */
        if (fabs((double)b[i]) > r) r = fabs((double)b[i]);
    }
    if (ref_max) *ref_max = r;
    return d;
}

int main(void) {
    const char *src = getenv("BQ_SOURCE_DIR");
    if (!src) src = BQ_SOURCE_DIR;
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/bert_tiny", src);
    StFile wf = {0}, ef = {0};
    BqBert m;
    memset(&m, 0, sizeof m);
    BqArena act = {0};
    BqTape tape = {0};

    BqBertConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (bq_config_load(&cfg, path) != BQ_OK) {
        fprintf(stderr, "FAIL config: %s\n", bq_errmsg());
        return 1;
    }
    BqRng rng;
    bq_rng_seed(&rng, 1);
    if (bq_bert_create(&m, &cfg, 1, &rng) != BQ_OK) {
        fprintf(stderr, "FAIL create: %s\n", bq_errmsg());
        return 1;
    }
    const BqParamTable *pt = &m.params;
    if (pt->n != 5 + 16 * 2 + 4) {
        fprintf(stderr, "FAIL table has %d entries\n", pt->n);
        fails++;
    }

    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st_open(&wf, path)) return 1;
    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    if (st_open(&ef, path)) return 1;

    /* weights: every table entry from the file, shapes must agree; every file tensor is in the table */
    for (int i = 0; i < pt->n; i++) {
        const BqParam *p = &pt->p[i];
        int64_t shape[BQ_MAX_DIMS];
        int nd;
        int64_t numel;
        const float *src_w = st_get(&wf, p->name, "F32", shape, &nd, &numel);
        if (!src_w || nd != p->ndim || shape[0] != p->shape[0] || (nd == 2 && shape[1] != p->shape[1])) {
            fprintf(stderr, "FAIL weight %s missing or of the wrong shape\n", p->name);
            fails++;
            continue;
        }
        memcpy(pt->data + p->offset, src_w, (size_t)numel * sizeof(float));
    }
    if ((int)json_object_size(wf.header) - (json_object_get(wf.header, "__metadata__") ? 1 : 0) != pt->n) {
        fprintf(stderr, "FAIL model.safetensors has %zu entries, table %d\n", json_object_size(wf.header), pt->n);
        fails++;
    }
    /* name lookup with and without the "bert." prefix */
    if (bq_params_find(pt, "bert.pooler.dense.weight") != pt->n - 4 || bq_params_find(pt, "pooler.dense.weight") != pt->n - 4 ||
        bq_params_find(pt, "classifier.bias") != pt->n - 1 || bq_params_find(pt, "bert.classifier.bias") != -1 ||
        bq_params_find(pt, "embeddings.word_embeddings.weight") != 0 || bq_params_find(pt, "nope") != -1) {
        fprintf(stderr, "FAIL bq_params_find\n");
        fails++;
    }

    /* batch */
    int64_t sh[BQ_MAX_DIMS];
    int nd;
    int64_t numel;
    BqBatch batch;
    memset(&batch, 0, sizeof batch);
    int64_t ish[BQ_MAX_DIMS] = {0};
    const int32_t *ids = st_get(&ef, "input_ids", "I32", ish, &nd, &numel);
    const float *mask = st_get(&ef, "attention_mask", "F32", sh, &nd, &numel);
    const int32_t *types = st_get(&ef, "token_type_ids", "I32", sh, &nd, &numel);
    const int32_t *labels = st_get(&ef, "labels", "I32", sh, &nd, &numel);
    const float *exp_logits = st_get(&ef, "logits", "F32", sh, &nd, &numel);
    const float *exp_loss = st_get(&ef, "loss", "F32", sh, &nd, &numel);
    if (!ids || !mask || !types || !labels || !exp_logits || !exp_loss) {
        fprintf(stderr, "FAIL expected.safetensors lacks the batch or outputs\n");
        return 1;
    }
    batch.B = ish[0];
    batch.T = ish[1];
    /* copies: the batch arrays are non-const and must stay alive until backward */
    size_t bt = (size_t)(batch.B * batch.T);
    batch.input_ids = bq_malloc(bt * sizeof(int32_t));
    batch.token_type_ids = bq_malloc(bt * sizeof(int32_t));
    batch.attention_mask = bq_malloc(bt * sizeof(float));
    batch.labels = bq_malloc((size_t)batch.B * sizeof(int32_t));
    memcpy(batch.input_ids, ids, bt * sizeof(int32_t));
    memcpy(batch.token_type_ids, types, bt * sizeof(int32_t));
    memcpy(batch.attention_mask, mask, bt * sizeof(float));
    memcpy(batch.labels, labels, (size_t)batch.B * sizeof(int32_t));
    BqBertInput in = bq_batch_input(&batch);

    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 28, "act") == BQ_OK);
    BQ_CHECK(bq_tape_init(&tape, 4096) == BQ_OK);
    BqCtx ctx = {.act = &act, .tape = &tape, .training = 1, .rng_key = 42, .rng_count = 0};

    BqTensor *logits = NULL, *loss = NULL;
    if (bq_bert_forward(&m, &ctx, &in, &logits, &loss) != BQ_OK || !logits || !loss) {
        fprintf(stderr, "FAIL forward: %s\n", bq_errmsg());
        return 1;
    }
    int C = m.cfg.num_labels;
    if (logits->ndim != 2 || logits->shape[0] != batch.B || logits->shape[1] != C) {
        fprintf(stderr, "FAIL logits shape\n");
        return 1;
    }
    double e_logits = max_abs_diff(logits->data, exp_logits, batch.B * C, NULL);
    double e_loss = fabs((double)loss->data[0] - exp_loss[0]);
    printf("logits max abs err %.3g\nloss %.7f (torch %.7f) err %.3g\n", e_logits, loss->data[0], exp_loss[0], e_loss);
    if (!(e_logits <= 1e-5)) fails++, fprintf(stderr, "FAIL logits\n");
    if (!(e_loss <= 1e-5)) fails++, fprintf(stderr, "FAIL loss\n");

    bq_backward(&ctx, loss);
    /* The key biases have an analytically zero gradient (softmax is invariant to a shift along the
     * key axis, and q·b_k shifts a whole row), so both sides hold rounding noise ~1e-8; each tensor's
     * error is therefore measured against max(its max |grad|, 1% of the largest |grad| in the model). */
    double global_ref = 0;
    for (int i = 0; i < pt->n; i++) {
        char gname[BQ_NAME_MAX + 8];
        snprintf(gname, sizeof gname, "grad.%s", pt->p[i].name);
        const float *g = st_get(&ef, gname, "F32", sh, &nd, &numel);
        for (int64_t k = 0; g && k < numel; k++) global_ref = fmax(global_ref, fabs(g[k]));
    }
    double floor_ref = 1e-2 * global_ref;
    double worst = 0;
    for (int i = 0; i < pt->n; i++) {
        const BqParam *p = &pt->p[i];
        char gname[BQ_NAME_MAX + 8];
        snprintf(gname, sizeof gname, "grad.%s", p->name);
        const float *g = st_get(&ef, gname, "F32", sh, &nd, &numel);
        if (!g || numel != p->numel) {
            fprintf(stderr, "FAIL %s missing in expected.safetensors\n", gname);
            fails++;
            continue;
        }
        double ref;
        double e = max_abs_diff(pt->grad + p->offset, g, p->numel, &ref);
        double rel = e / fmax(ref, floor_ref > 0 ? floor_ref : 1.0);
        if (!(rel <= worst)) worst = rel;
        int bad = !(rel <= 1e-4);
        printf("%-60s max|g| %.3e  err %.3e  rel %.3e%s\n", p->name, ref, e, rel, bad ? "  FAIL" : "");
        fails += bad;
    }
    printf("gradients: worst relative error %.3e\n", worst);

    /* evaluation pass: no tape, same numbers */
    bq_arena_rewind(&act, 0);
    bq_tape_rewind(&tape);
    BqCtx ectx = {.act = &act, .tape = NULL, .training = 0};
    BqTensor *elog = NULL, *eloss = NULL;
    if (bq_bert_forward(&m, &ectx, &in, &elog, &eloss) != BQ_OK || !elog) {
        fprintf(stderr, "FAIL eval forward: %s\n", bq_errmsg());
        fails++;
    } else {
        double e = max_abs_diff(elog->data, exp_logits, batch.B * C, NULL);
        printf("eval logits max abs err %.3g\n", e);
        if (!(e <= 1e-5)) fails++, fprintf(stderr, "FAIL eval logits\n");
    }

    free(batch.input_ids);
    free(batch.token_type_ids);
    free(batch.attention_mask);
    free(batch.labels);
    bq_tape_free(&tape);
    bq_arena_free(&act);
    st_close(&wf);
    st_close(&ef);
    bq_bert_free(&m);
    if (fails) {
        fprintf(stderr, "test_bert_reference: %d failure(s)\n", fails);
        return 1;
    }
    printf("test_bert_reference: OK\n");
    return 0;
}
