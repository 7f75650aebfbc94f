/* Native checkpoint round trip (export/ckpt.c): a tiny random model with AdamW state, best parameters
 * and counters is saved, reloaded into a model built from the saved config.json, and compared bit for
 * bit; saving over an existing checkpoint leaves no DIR.tmp / DIR.old; the vocabulary is copied;
 * broken checkpoints (missing or truncated model.h5, missing training state) are errors naming the
 * file. Prints the max difference. */
#include <hdf5.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "export/ckpt.h"
#include "layers/quant.h"
#include "src/train_state.h"

static int fails = 0;
#define EXPECT(c, ...)                                    \
    do {                                                  \
        if (!(c)) {                                       \
            fprintf(stderr, "FAIL line %d: ", __LINE__);  \
            fprintf(stderr, __VA_ARGS__);                 \
            fprintf(stderr, "\n");                        \
            fails++;                                      \
        }                                                 \
    } while (0)

static void tiny_config(BqBertConfig *c) {
    memset(c, 0, sizeof *c);
    c->vocab_size = 40, c->hidden_size = 16, c->num_hidden_layers = 2, c->num_attention_heads = 2;
    c->intermediate_size = 24, c->max_position_embeddings = 32, c->type_vocab_size = 2;
    c->pad_token_id = 0, c->layer_norm_eps = 1e-12f, c->hidden_dropout_prob = 0.1f;
    c->attention_probs_dropout_prob = 0.1f, c->classifier_dropout = -1, c->initializer_range = 0.02f;
    c->num_labels = 3;
    c->id2label = bq_calloc(3, sizeof(char *));
    c->id2label[0] = bq_strdup("neg"), c->id2label[1] = bq_strdup("neu"), c->id2label[2] = bq_strdup("pos");
}

static int exists(const char *p) {
    struct stat sb;
    return stat(p, &sb) == 0;
}

/* Differing values over the table's parameters (the block may have alignment gaps between them,
 * which the checkpoint does not store). */
static const BqParamTable *g_table;
static int64_t bitdiff(const float *a, const float *b, int64_t n) {
    (void)n;
    int64_t d = 0;
    for (int k = 0; k < g_table->n; k++)
        for (int64_t i = g_table->p[k].offset; i < g_table->p[k].offset + g_table->p[k].numel; i++)
            d += memcmp(a + i, b + i, sizeof(float)) != 0;
    return d;
}

int main(void) {
    char root[] = "/tmp/bq_test_ckpt_XXXXXX";
    BQ_CHECK(mkdtemp(root));
    char vocab[256], dir[256], p[512];
    snprintf(vocab, sizeof vocab, "%s/vocab", root);
    snprintf(dir, sizeof dir, "%s/ckpt", root);
    mkdir(vocab, 0755);
    snprintf(p, sizeof p, "%s/vocab.txt", vocab);
    FILE *f = fopen(p, "w");
    for (int i = 0; i < 40; i++) fprintf(f, "tok%d\n", i);
    fclose(f);

    BqBertConfig cfg;
    tiny_config(&cfg);
    BqRng rng;
    bq_rng_seed(&rng, 3);
    BqBert m;
    memset(&m, 0, sizeof m);
    BQ_CHECK(bq_bert_create(&m, &cfg, 1, &rng) == BQ_OK);
    int64_t n = m.params.total;
    g_table = &m.params;
    BqAdamW opt;
    bq_adamw_init(&opt, n, 0.01f);
    for (int64_t i = 0; i < n; i++) opt.m[i] = bq_rng_normal(&rng), opt.v[i] = (float)bq_rng_uniform(&rng);
    opt.step = 17;
    BqTrainState ts = {.opt = &opt, .step = 17, .epoch = 2, .batch_cursor = 5, .total_steps = 40, .warmup_steps = 4,
                       .lr = 3e-5, .seed = 1234567890123ULL, .best_accuracy = 0.75, .best_step = 12};
    bq_rng_seed(&ts.rng, 99);
    ts.best_params = bq_malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) ts.best_params[i] = bq_rng_normal(&rng);

    int st = bq_train_state_save(&m, dir, vocab, &ts);
    EXPECT(st == BQ_OK, "save: %s", bq_errmsg());
    /* save again over the existing directory: the replace path */
    st = bq_train_state_save(&m, dir, vocab, &ts);
    EXPECT(st == BQ_OK, "second save: %s", bq_errmsg());
    snprintf(p, sizeof p, "%s.tmp", dir);
    EXPECT(!exists(p), "%s left behind", p);
    snprintf(p, sizeof p, "%s.old", dir);
    EXPECT(!exists(p), "%s left behind", p);
    const char *files[] = {"config.json", "vocab.txt", "model.h5", "training_state.h5"};
    for (int i = 0; i < 4; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        EXPECT(exists(p), "%s missing", p);
    }
    EXPECT(bq_ckpt_is_native(dir), "not detected as native");

    BqBert m2;
    memset(&m2, 0, sizeof m2);
    BqAdamW opt2;
    bq_adamw_init(&opt2, n, 0.0f);
    BqTrainState ts2 = {.opt = &opt2};
    st = bq_train_state_load(&m2, dir, &ts2);
    EXPECT(st == BQ_OK, "load: %s", bq_errmsg());
    int64_t d = 0;
    if (!st) {
        EXPECT(m2.params.total == n, "total %lld vs %lld", (long long)m2.params.total, (long long)n);
        EXPECT(m2.cfg.num_labels == 3 && m2.cfg.id2label && !strcmp(m2.cfg.id2label[2], "pos"), "labels lost");
        EXPECT(m2.cfg.hidden_size == 16 && m2.cfg.num_hidden_layers == 2, "config lost");
        d += bitdiff(m.params.data, m2.params.data, n);
        d += bitdiff(opt.m, opt2.m, n) + bitdiff(opt.v, opt2.v, n);
        EXPECT(ts2.best_params != NULL, "best params lost");
        if (ts2.best_params) d += bitdiff(ts.best_params, ts2.best_params, n);
        EXPECT(d == 0, "%lld values differ", (long long)d);
        EXPECT(ts2.step == 17 && ts2.epoch == 2 && ts2.batch_cursor == 5 && ts2.total_steps == 40 &&
                   ts2.warmup_steps == 4 && opt2.step == 17 && ts2.best_step == 12,
               "counters differ");
        EXPECT(ts2.lr == 3e-5 && ts2.best_accuracy == 0.75 && ts2.seed == ts.seed && opt2.weight_decay == 0.01f,
               "scalars differ");
        EXPECT(!memcmp(ts2.rng.s, ts.rng.s, sizeof ts.rng.s), "rng differs");
    }
    free(ts2.best_params);

    /* bq_model_load_any takes the native path */
    BqBert m3;
    memset(&m3, 0, sizeof m3);
    st = bq_model_load_any(&m3, dir, 3, &rng, NULL);
    EXPECT(st == BQ_OK, "load_any: %s", bq_errmsg());
    if (!st) EXPECT(bitdiff(m.params.data, m3.params.data, n) == 0, "load_any params differ");
    bq_bert_free(&m3);
    memset(&m3, 0, sizeof m3);
    st = bq_model_load_any(&m3, dir, 2, &rng, NULL);
    EXPECT(st == BQ_EINVAL, "label count mismatch accepted");
    bq_bert_free(&m3);

    /* save without training state, then asking for it is an error naming the file */
    char dir2[300];
    snprintf(dir2, sizeof dir2, "%s/nostate", root);
    EXPECT(bq_ckpt_save(&m, dir2, vocab, NULL) == BQ_OK, "save w/o state: %s", bq_errmsg());
    memset(&m3, 0, sizeof m3);
    st = bq_train_state_load(&m3, dir2, &ts2);
    EXPECT(st != BQ_OK && strstr(bq_errmsg(), "training_state.h5"), "missing state: %d %s", st, bq_errmsg());
    bq_bert_free(&m3);

    /* truncated model.h5 */
    snprintf(p, sizeof p, "%s/model.h5", dir2);
    EXPECT(truncate(p, 100) == 0, "truncate");
    memset(&m3, 0, sizeof m3);
    st = bq_ckpt_load(&m3, dir2);
    EXPECT(st != BQ_OK && strstr(bq_errmsg(), "model.h5"), "truncated model.h5: %d %s", st, bq_errmsg());
    bq_bert_free(&m3);

    /* missing vocabulary is an error and leaves the old checkpoint in place */
    st = bq_train_state_save(&m, dir, "/nonexistent/vocab", &ts);
    EXPECT(st == BQ_EIO, "missing vocab: %d", st);
    EXPECT(bq_ckpt_is_native(dir), "old checkpoint destroyed by a failed save");

    /* Quantized model: the quant config goes to config.json, the ranges to model.h5; loading into an
     * empty model rebuilds the quantizer table and restores every range. */
    char dir3[300];
    snprintf(dir3, sizeof dir3, "%s/qat", root);
    BqQuantConfig qc;
    bq_quant_config_default(&qc);
    BQ_CHECK(bq_quant_create(&m.quant, &m, &qc) == BQ_OK);
    for (int i = 0; i < m.quant->n; i++) {
        BqQuantizer *q = &m.quant->q[i];
        for (int64_t c = 0; c < q->nch; c++) q->amax[c] = 0.5f + 0.01f * (float)(i + c);
        q->initialized = 1;
        q->frozen = i % 2;
        bq_quant_update_scale(m.quant, q);
    }
    st = bq_ckpt_save(&m, dir3, vocab, NULL);
    EXPECT(st == BQ_OK, "quant save: %s", bq_errmsg());
    BqBert mq;
    memset(&mq, 0, sizeof mq);
    st = bq_ckpt_load(&mq, dir3);
    EXPECT(st == BQ_OK && mq.quant, "quant load: %s", bq_errmsg());
    /* HDF5's own free lists of arrays and blocks are empty once a load returns (the load collects them:
     * without it this load leaves 4.5 KB and 870 KB there) */
    size_t fl[4] = {1, 1, 1, 1};
    EXPECT(H5get_free_list_sizes(&fl[0], &fl[1], &fl[2], &fl[3]) >= 0 && fl[1] == 0 && fl[2] == 0,
           "HDF5 free lists hold %zu/%zu/%zu/%zu bytes (regular/array/block/factory) after a load", fl[0], fl[1],
           fl[2], fl[3]);
    int64_t qd = 0;
    if (!st && mq.quant) {
        EXPECT(mq.quant->n == m.quant->n && mq.quant->cfg.scheme == m.quant->cfg.scheme, "quant table differs");
        for (int i = 0; i < m.quant->n && i < mq.quant->n; i++) {
            const BqQuantizer *a = &m.quant->q[i], *b = &mq.quant->q[i];
            for (int64_t c = 0; c < a->nch; c++)
                qd += memcmp(&a->amax[c], &b->amax[c], 4) != 0 || memcmp(&a->scale[c], &b->scale[c], 4) != 0;
            qd += a->frozen != b->frozen || a->initialized != b->initialized;
        }
        EXPECT(qd == 0, "%lld quantizer values differ", (long long)qd);
        d += qd;
    }
    if (mq.quant) bq_quant_free(mq.quant);
    mq.quant = NULL;
    bq_bert_free(&mq);
    bq_quant_free(m.quant);
    m.quant = NULL;

    char cmd[400];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    if (system(cmd) != 0) fprintf(stderr, "warning: could not remove %s\n", root);
    free(ts.best_params);
    bq_adamw_free(&opt);
    bq_adamw_free(&opt2);
    bq_bert_free(&m);
    bq_bert_free(&m2);
    printf("test_ckpt: %lld differing values (max difference 0 required), %s\n", (long long)d,
           fails ? "FAILED" : "ok");
    return fails ? 1 : 0;
}
