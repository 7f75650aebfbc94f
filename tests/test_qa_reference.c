/* Reference test of BertForQuestionAnswering (layers/bert.c, BQ_HEAD_QA) against PyTorch: the fixture
 * tests/fixtures/qa_tiny (made by tests/make_qa_fixture.py) holds a random HF BertForQuestionAnswering
 * (2 layers, hidden 32), a padded batch (B=4, T=13) with start/end positions (one end beyond T, which
 * HF clamps to the ignored index), and PyTorch's start/end logits, loss and every parameter gradient.
 *
 * The model is loaded through bq_hf_load, so the test also covers the head chosen from config.json's
 * "architectures" and the qa_outputs names. Requires logits and loss within 1e-5 and each gradient
 * within 1e-4 of its tensor's largest magnitude (floored at 1% of the model's largest gradient, as
 * tests/test_bert_reference.c). Then: a native checkpoint round trip keeps the head and the logits
 * bit for bit, and bq_bert_set_head turns a classification model into a QA one that keeps every
 * encoder parameter and gives the same encoder output (hence the same logits with the same head). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "autograd/bq.h"
#include "autograd/tensor.h"
#include "export/ckpt.h"
#include "export/hf_load.h"
#include "layers/bert.h"
#include "tests/test_util.h"

static double max_abs_diff(const float *a, const float *b, int64_t n, double *ref_max) {
    double d = 0, r = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]);
        if (!(e <= d)) d = e;
        if (fabs((double)b[i]) > r) r = fabs((double)b[i]);
    }
    if (ref_max) *ref_max = r;
    return d;
}

/* Inference logits (B,T,2) of m on in, copied to out. */
static int infer(BqBert *m, BqArena *act, const BqBertInput *in, float *out) {
    bq_arena_rewind(act, 0);
    BqCtx ctx = {.act = act};
    BqTensor *lg = NULL;
    if (bq_bert_forward(m, &ctx, in, &lg, NULL) != BQ_OK) return 1;
    memcpy(out, lg->data, sizeof(float) * (size_t)bq_tensor_numel(lg));
    return 0;
}

int main(void) {
    const char *src = getenv("BQ_SOURCE_DIR");
    if (!src) src = BQ_SOURCE_DIR;
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s/tests/fixtures/qa_tiny", src);
    StFile ef = {0};
    BqBert m, m2, mc;
    memset(&m, 0, sizeof m), memset(&m2, 0, sizeof m2), memset(&mc, 0, sizeof mc);
    BqArena act = {0};
    BqTape tape = {0};
    BqRng rng;
    bq_rng_seed(&rng, 1);
    char *report = NULL;
    if (bq_hf_load(&m, dir, 0, &rng, &report) != BQ_OK) {
        fprintf(stderr, "FAIL hf_load: %s\n", bq_errmsg());
        return 1;
    }
    EXPECT(report == NULL, "every parameter comes from the file (report: %s)", report ? report : "");
    EXPECT(m.params.grad == NULL && bq_bert_grad_alloc(&m) == BQ_OK && m.params.grad && m.word_emb.grad == m.params.grad,
           "gradients: none after loading, added by bq_bert_grad_alloc");
    free(report);
    EXPECT(m.cfg.head == BQ_HEAD_QA, "config.json architectures BertForQuestionAnswering gives the QA head");
    const BqParamTable *pt = &m.params;
    EXPECT(pt->n == 5 + 16 * 2 + 2, "table has %d entries (no pooler, qa_outputs)", pt->n);
    EXPECT(bq_params_find(pt, "qa_outputs.weight") == pt->n - 2 && bq_params_find(pt, "qa_outputs.bias") == pt->n - 1 &&
               bq_params_find(pt, "bert.pooler.dense.weight") == -1,
           "qa_outputs names");

    snprintf(path, sizeof path, "%s/expected.safetensors", dir);
    if (st_open(&ef, path)) return 1;
    int64_t sh[BQ_MAX_DIMS], ish[BQ_MAX_DIMS] = {0}, numel;
    int nd;
    const int32_t *ids = st_get(&ef, "input_ids", "I32", ish, &nd, &numel);
    const float *mask = st_get(&ef, "attention_mask", "F32", sh, &nd, &numel);
    const int32_t *types = st_get(&ef, "token_type_ids", "I32", sh, &nd, &numel);
    const int32_t *sp = st_get(&ef, "start_positions", "I32", sh, &nd, &numel);
    const int32_t *ep = st_get(&ef, "end_positions", "I32", sh, &nd, &numel);
    const float *es = st_get(&ef, "start_logits", "F32", sh, &nd, &numel);
    const float *ee = st_get(&ef, "end_logits", "F32", sh, &nd, &numel);
    const float *eloss = st_get(&ef, "loss", "F32", sh, &nd, &numel);
    if (!ids || !mask || !types || !sp || !ep || !es || !ee || !eloss) {
        fprintf(stderr, "FAIL expected.safetensors lacks the batch or outputs\n");
        return 1;
    }
    const int64_t B = ish[0], T = ish[1];
    BqBertInput in = {.B = B, .T = T, .input_ids = ids, .attention_mask = mask, .token_type_ids = types,
                      .start_positions = sp, .end_positions = ep};

    BQ_CHECK(bq_arena_init(&act, (size_t)1 << 28, "act") == BQ_OK);
    BQ_CHECK(bq_tape_init(&tape, 4096) == BQ_OK);
    BqCtx ctx = {.act = &act, .tape = &tape, .training = 1, .rng_key = 42};
    BqTensor *logits = NULL, *loss = NULL;
    if (bq_bert_forward(&m, &ctx, &in, &logits, &loss) != BQ_OK || !logits || !loss) {
        fprintf(stderr, "FAIL forward: %s\n", bq_errmsg());
        return 1;
    }
    EXPECT(logits->ndim == 3 && logits->shape[0] == B && logits->shape[1] == T && logits->shape[2] == 2,
           "logits shape (B,T,2)");
    float *s = bq_malloc(sizeof(float) * (size_t)(B * T)), *e = bq_malloc(sizeof(float) * (size_t)(B * T));
    for (int64_t i = 0; i < B * T; i++) s[i] = logits->data[2 * i], e[i] = logits->data[2 * i + 1];
    double e_s = max_abs_diff(s, es, B * T, NULL), e_e = max_abs_diff(e, ee, B * T, NULL);
    double e_loss = fabs((double)loss->data[0] - eloss[0]);
    printf("start_logits max abs err %.3g, end_logits %.3g\nloss %.7f (torch %.7f) err %.3g\n", e_s, e_e,
           loss->data[0], eloss[0], e_loss);
    EXPECT(e_s <= 1e-5 && e_e <= 1e-5, "logits");
    EXPECT(e_loss <= 1e-5, "loss");

    bq_backward(&ctx, loss);
    double global_ref = 0, worst = 0;
    for (int i = 0; i < pt->n; i++) {
        char gname[BQ_NAME_MAX + 8];
        snprintf(gname, sizeof gname, "grad.%s", pt->p[i].name);
        const float *g = st_get(&ef, gname, "F32", sh, &nd, &numel);
        for (int64_t k = 0; g && k < numel; k++) global_ref = fmax(global_ref, fabs(g[k]));
    }
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
        double ref, err = max_abs_diff(pt->grad + p->offset, g, p->numel, &ref);
        double rel = err / fmax(ref, 1e-2 * global_ref);
        if (!(rel <= worst)) worst = rel;
        int bad = !(rel <= 1e-4);
        printf("%-60s max|g| %.3e  err %.3e  rel %.3e%s\n", p->name, ref, err, rel, bad ? "  FAIL" : "");
        fails += bad;
    }
    printf("gradients: worst relative error %.3e\n", worst);

    /* evaluation pass, then a native checkpoint round trip: same head, same logits bit for bit */
    float *l1 = bq_malloc(sizeof(float) * (size_t)(B * T * 2)), *l2 = bq_malloc(sizeof(float) * (size_t)(B * T * 2));
    EXPECT(infer(&m, &act, &in, l1) == 0, "eval forward");
    double e_eval = 0;
    for (int64_t i = 0; i < B * T; i++) e_eval = fmax(e_eval, fmax(fabs(l1[2 * i] - es[i]), fabs(l1[2 * i + 1] - ee[i])));
    printf("eval logits max abs err %.3g\n", e_eval);
    EXPECT(e_eval <= 1e-5, "eval logits");
    char tmp[256], ck[300];
    bq_test_tmpdir(tmp, sizeof tmp, "qa_ref");
    snprintf(ck, sizeof ck, "%s/ckpt", tmp);
    EXPECT(bq_ckpt_save(&m, ck, NULL, NULL) == BQ_OK, "save: %s", bq_errmsg());
    EXPECT(bq_ckpt_load(&m2, ck) == BQ_OK, "load: %s", bq_errmsg());
    EXPECT(m2.cfg.head == BQ_HEAD_QA && m2.params.n == pt->n, "checkpoint keeps the QA head");
    EXPECT(infer(&m2, &act, &in, l2) == 0 && memcmp(l1, l2, sizeof(float) * (size_t)(B * T * 2)) == 0,
           "checkpoint logits identical");

    /* classification model with the same encoder → set_head(QA) → copy qa_outputs: same logits */
    BqBertConfig cc = m.cfg;
    cc.head = BQ_HEAD_CLS;
    cc.num_labels = 3;
    cc.id2label = bq_calloc(3, sizeof(char *));
    for (int i = 0; i < 3; i++) cc.id2label[i] = bq_strdup("x");
    EXPECT(bq_bert_create(&mc, &cc, 1, &rng) == BQ_OK, "create cls");
    for (int i = 0; i < pt->n - 2; i++)
        memcpy(mc.params.data + mc.params.p[i].offset, pt->data + pt->p[i].offset, sizeof(float) * (size_t)pt->p[i].numel);
    EXPECT(bq_bert_set_head(&mc, BQ_HEAD_QA, &rng) == BQ_OK, "set_head: %s", bq_errmsg());
    EXPECT(mc.cfg.head == BQ_HEAD_QA && mc.cfg.num_labels == 2 && mc.params.n == pt->n && mc.params.grad,
           "converted model has the QA table and gradients");
    memcpy(mc.qa_w.data, m.qa_w.data, sizeof(float) * 2 * (size_t)m.cfg.hidden_size);
    memcpy(mc.qa_b.data, m.qa_b.data, sizeof(float) * 2);
    EXPECT(infer(&mc, &act, &in, l2) == 0 && memcmp(l1, l2, sizeof(float) * (size_t)(B * T * 2)) == 0,
           "set_head keeps the encoder");

    free(s), free(e), free(l1), free(l2);
    bq_test_rmtree(tmp);
    bq_tape_free(&tape);
    bq_arena_free(&act);
    st_close(&ef);
    bq_bert_free(&m), bq_bert_free(&m2), bq_bert_free(&mc);
    if (fails) {
        fprintf(stderr, "test_qa_reference: %d failure(s)\n", fails);
        return 1;
    }
    printf("test_qa_reference: OK\n");
    return 0;
}
